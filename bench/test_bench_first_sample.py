"""The first ``sample`` after a buffer is filled, at the sizes offline RL reaches: torchrl vs
torchrl_compat.

TD-MPC2's buffer: ``TensorDictReplayBuffer(storage=LazyTensorStorage(rows) or
LazyMemmapStorage(rows), sampler=SliceSampler(num_slices=256, traj_key="episode",
strict_length=True), batch_size=1024)`` (slices of 4), filled by extends of 2^16 rows of
episodes of 500 steps (4 uint8 of observation, a float action and reward, an int64 episode id).
The first sample reads the whole episode column to find the trajectories (ours then follows the
writes; torchrl reads the column again at every sample). The ``end_key`` variant keeps a
``("next", "done")`` column instead of ids. Each round fills a fresh buffer, outside the timing.

    BENCH_FIRST_SAMPLE_ROWS=67108864 python -m pytest bench/test_bench_first_sample.py -q \
        --benchmark-group-by=group --benchmark-columns=min,median,mean,rounds

``BENCH_FIRST_SAMPLE_ROWS`` defaults to 2^26 (about 1.3 GiB per buffer, one buffer alive at a time).
"""
import gc
import os
import sys

import pytest
import torch
import torchrl.data as trd
from tensordict import TensorDict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torchrl_compat as ours  # noqa: E402

ROWS = int(os.environ.get("BENCH_FIRST_SAMPLE_ROWS", 2**26))
CHUNK = 2**16
EPISODE = 500
SIDES = [pytest.param(trd, id="torchrl"), pytest.param(ours, id="ours")]
STORAGES = {
    "LazyTensorStorage": lambda lib, tmp: lib.LazyTensorStorage(ROWS),
    "LazyMemmapStorage": lambda lib, tmp: lib.LazyMemmapStorage(ROWS, scratch_dir=tmp),
}
SAMPLERS = {
    "traj_key": lambda lib: lib.SliceSampler(num_slices=256, traj_key="episode", strict_length=True),
    "end_key": lambda lib: lib.SliceSampler(num_slices=256, end_key=("next", "done"), strict_length=True),
}


def _chunk(start):
    step = torch.arange(start, start + CHUNK)
    return TensorDict(
        {
            "obs": torch.zeros(CHUNK, 4, dtype=torch.uint8),
            "action": torch.zeros(CHUNK, 1),
            "reward": torch.zeros(CHUNK, 1),
            "episode": step // EPISODE,
            ("next", "done"): (step % EPISODE == EPISODE - 1).unsqueeze(-1),
        },
        [CHUNK],
    )


def _filled(lib, storage, sampler, tmp_path):
    torch.manual_seed(0)
    rb = lib.TensorDictReplayBuffer(
        storage=STORAGES[storage](lib, tmp_path), sampler=SAMPLERS[sampler](lib), batch_size=1024
    )
    for start in range(0, ROWS, CHUNK):
        rb.extend(_chunk(start))
    return rb


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("storage", list(STORAGES))
@pytest.mark.parametrize("lib", SIDES)
def test_first_sample_after_a_fill(benchmark, lib, storage, sampler, tmp_path):
    benchmark.group = f"first sample after filling {storage}({ROWS}), SliceSampler({sampler}, 256 slices of 4)"
    held = {}
    rounds = iter(range(10**6))

    def setup():
        held.clear()  # the previous round's buffer goes before the next is filled
        gc.collect()
        held["rb"] = _filled(lib, storage, sampler, tmp_path / str(next(rounds)))
        return (), {}

    benchmark.pedantic(lambda: held["rb"].sample(), setup=setup, rounds=3, warmup_rounds=0)
    assert held["rb"].sample().batch_size == torch.Size([1024])
    held.clear()


@pytest.mark.parametrize("lib", SIDES)
def test_steady_sample_of_a_filled_buffer(benchmark, lib, tmp_path):
    benchmark.group = f"sample of a filled LazyTensorStorage({ROWS}), SliceSampler(traj_key, 256 slices of 4)"
    rb = _filled(lib, "LazyTensorStorage", "traj_key", tmp_path)
    rb.sample()  # the first sample, timed above
    sample = benchmark.pedantic(rb.sample, rounds=20, warmup_rounds=1)
    assert sample.batch_size == torch.Size([1024])
