"""Trajectory starts / stops on 2^20 steps: torchrl 0.11's SliceSampler code vs replay.

Episodes last about 1000 steps; the storage is at capacity with a cursor, as in a full
replay buffer. A pool of fresh signals rotates between rounds so caches flatter no side.
"""
import itertools

import pytest
import torch
from torchrl.data.replay_buffers.samplers import SliceSampler

import replay
from torchrl_compat._torch_ops import slices as torch_slices

SIZE = 2**20
EPISODE = 1000
POOL = 8
ROUNDS = 60

IMPLEMENTATIONS = {
    "torchrl": SliceSampler(num_slices=1)._find_start_stop_traj,
    "replay": replay.find_start_stop_traj,
    "torch-ops": torch_slices.find_start_stop_traj,
}


def _signals(shape, from_ids):
    gen = torch.Generator().manual_seed(0)
    pool = []
    for _ in range(POOL):
        end = torch.rand(shape, generator=gen) < 1.0 / EPISODE
        signal = end.long().cumsum(0) if from_ids else end
        cursor = int(torch.randint(0, shape[0], (1,), generator=gen))
        pool.append({"trajectory" if from_ids else "end": signal, "at_capacity": True,
                     "cursor": cursor})
    return itertools.cycle(pool)


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
@pytest.mark.parametrize(
    "shape, from_ids",
    [((SIZE,), False), ((SIZE,), True), ((SIZE // 4, 4), False)],
    ids=["end-1d", "traj-1d", "end-2d"],
)
def test_find_start_stop_traj(benchmark, impl, shape, from_ids):
    benchmark.group = f"find_start_stop_traj {'traj' if from_ids else 'end'} {shape}"
    fn = IMPLEMENTATIONS[impl]
    pool = _signals(shape, from_ids)
    result = benchmark.pedantic(fn, setup=lambda: ((), next(pool)), rounds=ROUNDS,
                                warmup_rounds=2)
    assert result[2].sum() == shape[0] * (shape[1] if len(shape) > 1 else 1)
