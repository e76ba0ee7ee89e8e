"""Buffers on a ``ListStorage`` of TensorDicts: sample and iterate, torchrl vs torchrl_compat.

The workload of torchrl's own replay-buffer benchmark for list storages: 4,000 items, each a
TensorDict of a 5-float leaf and a nested 3x32x32 uint8 leaf, batches of 256, with a uniform,
a without-replacement and a prioritized sampler. Each side is a buffer of its own library on
its own classes. torchrl's prioritized side needs its compiled trees: on a torch where they do
not load (anything but 2.9 for torchrl 0.11) it runs on ``install_segment_trees()``, as a user
there must; in the torch 2.9.1 reference environment it runs on torchrl's own trees.

    python -m pytest bench/test_bench_list_storage.py -q --benchmark-group-by=group \
        --benchmark-columns=min,median,mean,rounds
"""
import os
import sys

import pytest
import torch
import torchrl.data as trd
import torchrl.data.replay_buffers.samplers as trl_samplers
from tensordict import TensorDict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torchrl_compat as ours  # noqa: E402

if trl_samplers.SumSegmentTreeFp32 is None:
    ours.install_segment_trees()

ITEMS = 4000
BATCH = 256
SIDES = [pytest.param(trd, id="torchrl"), pytest.param(ours, id="ours")]
SAMPLERS = {
    "uniform": lambda lib: lib.RandomSampler(),
    "without-replacement": lambda lib: lib.SamplerWithoutReplacement(),
    "prioritized": lambda lib: lib.PrioritizedSampler(ITEMS, alpha=0.7, beta=0.9),
}


def filled_buffer(lib, sampler):
    gen = torch.Generator().manual_seed(0)
    data = TensorDict(
        {
            "a": torch.randn(ITEMS, 5, generator=gen),
            "b": {"c": torch.randint(0, 255, (ITEMS, 3, 32, 32), generator=gen, dtype=torch.uint8)},
        },
        [ITEMS],
    )
    rb = lib.ReplayBuffer(storage=lib.ListStorage(ITEMS), sampler=SAMPLERS[sampler](lib), batch_size=BATCH)
    rb.extend(data)
    return rb


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("lib", SIDES)
def test_list_storage_sample(benchmark, lib, sampler):
    benchmark.group = f"ListStorage sample, {sampler}"
    torch.manual_seed(0)
    rb = filled_buffer(lib, sampler)
    benchmark.pedantic(rb.sample, rounds=200, warmup_rounds=5)


@pytest.mark.parametrize("sampler", ["uniform", "without-replacement"])
@pytest.mark.parametrize("lib", SIDES)
def test_list_storage_iterate(benchmark, lib, sampler):
    benchmark.group = f"ListStorage iterate, {sampler}"
    torch.manual_seed(0)
    rb = filled_buffer(lib, sampler)
    iterator = iter(rb)

    def step():
        nonlocal iterator
        try:
            return next(iterator)
        except StopIteration:
            iterator = iter(rb)
            return next(iterator)

    benchmark.pedantic(step, rounds=200, warmup_rounds=5)
