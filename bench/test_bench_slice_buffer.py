"""``SliceSampler`` through a buffer on 10,000 rows: ``rb.sample()``, torchrl vs torchrl_compat.

The workload of torchrl's own replay-buffer benchmark for slice samplers: a
``TensorDictReplayBuffer(storage=LazyMemmapStorage(10_000) or LazyTensorStorage(10_000),
sampler=SliceSampler(num_slices=8, traj_key="traj"), batch_size=256)`` filled with 10,000 rows
whose ``"traj"`` is ``arange(10_000) // 123`` beside a 5-float leaf and a nested 3x32x32 uint8
leaf; each side a buffer of its own library on its own classes. At this size the fixed costs
of a sample (the sampler's bookkeeping, the gather of the leaves, the info entries and the
tensordict) matter more than the trajectory scan.

Two modes: ``static``, torchrl's benchmark as it is (nothing is written between samples, so ours
answers from the trajectory ends it keeps for the storage while torchrl rescans them: not like
for like), and ``after-write``, where 256 new rows (trajectories continuing the same way) are
written before each sample, outside the timing, so both sides find the ends again.

    python -m pytest bench/test_bench_slice_buffer.py -q --benchmark-group-by=group \
        --benchmark-columns=min,median,mean,rounds
"""
import os
import sys

import pytest
import torch
import torchrl.data as trd
from tensordict import TensorDict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torchrl_compat as ours  # noqa: E402

ITEMS = 10_000
BATCH = 256
SIDES = [pytest.param(trd, id="torchrl"), pytest.param(ours, id="ours")]
STORAGES = {
    "LazyMemmapStorage": lambda lib, tmp: lib.LazyMemmapStorage(ITEMS, scratch_dir=tmp),
    "LazyTensorStorage": lambda lib, tmp: lib.LazyTensorStorage(ITEMS),
}


def _rows(start, count, gen):
    return TensorDict(
        {
            "traj": torch.arange(start, start + count) // 123,
            "a": torch.randn(count, 5, generator=gen),
            "b": {"c": torch.randint(0, 255, (count, 3, 32, 32), generator=gen, dtype=torch.uint8)},
        },
        [count],
    )


@pytest.mark.parametrize("mode", ["static", "after-write"])
@pytest.mark.parametrize("storage", list(STORAGES))
@pytest.mark.parametrize("lib", SIDES)
def test_slice_sampler_buffer_sample(benchmark, lib, storage, mode, tmp_path):
    benchmark.group = (
        f"TensorDictReplayBuffer {storage}(10_000), SliceSampler(num_slices=8, traj_key), sample 256, {mode}"
    )
    torch.manual_seed(0)
    rb = lib.TensorDictReplayBuffer(
        storage=STORAGES[storage](lib, tmp_path),
        sampler=lib.SliceSampler(num_slices=8, traj_key="traj"),
        batch_size=BATCH,
    )
    gen = torch.Generator().manual_seed(0)
    rb.extend(_rows(0, ITEMS, gen))
    setup = None
    if mode == "after-write":
        # a pool of writes built before timing; each round writes the next one, untimed
        pool = [_rows(ITEMS + k * BATCH, BATCH, gen) for k in range(8)]
        writes = iter(range(10**9))

        def setup():
            rb.extend(pool[next(writes) % len(pool)])
            return (), {}

    sample = benchmark.pedantic(rb.sample, setup=setup, rounds=100, warmup_rounds=5)
    assert sample.batch_size == torch.Size([BATCH])
