"""Sampler benchmarks: torchrl_compat against torchrl 0.11, side by side in one run.

Run in the torch 2.9.1 reference environment, where torchrl's compiled trees load:
``/opt/ref291/bin/python -m pytest bench/test_bench_samplers.py --benchmark-group-by=group``.
Elsewhere the torchrl prioritized references are skipped.
"""
import os
import sys

import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl
from tensordict import TensorDict
from torchrl.data.replay_buffers import LazyTensorStorage

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torchrl_compat.samplers as ours  # noqa: E402

N = 1 << 20
EPISODE = 1000
BATCH = 256
SLICE = 32
HAS_TORCHRL_TREES = trl.SumSegmentTreeFp32 is not None
IMPLS = [
    pytest.param(trl, id="torchrl", marks=pytest.mark.skipif(not HAS_TORCHRL_TREES, reason="torchrl trees not loaded")),
    pytest.param(ours, id="ours"),
]
ALL_IMPLS = [pytest.param(trl, id="torchrl"), pytest.param(ours, id="ours")]


@pytest.fixture(scope="module")
def storage():
    torch.manual_seed(0)
    done = torch.zeros(N, 1, dtype=torch.bool)
    done[EPISODE - 1 :: EPISODE] = True
    data = TensorDict({"obs": torch.arange(N), ("next", "done"): done, "episode": torch.arange(N) // EPISODE}, [N])
    st = LazyTensorStorage(N)
    st.set(torch.arange(N), data)
    return st


def _prioritized(module):
    sampler = module.PrioritizedSampler(N, 0.7, 0.5)
    sampler.update_priority(torch.arange(N), torch.rand(N))
    return sampler


@pytest.mark.parametrize("module", IMPLS)
def test_prioritized_sample(benchmark, storage, module):
    benchmark.group = "PrioritizedSampler.sample"
    sampler = _prioritized(module)
    benchmark.pedantic(sampler.sample, args=(storage, BATCH), rounds=50, warmup_rounds=2)


@pytest.mark.parametrize("module", IMPLS)
def test_prioritized_update(benchmark, module):
    benchmark.group = "PrioritizedSampler.update_priority"
    sampler = _prioritized(module)
    pool = [(torch.randint(N, (BATCH,)), torch.rand(BATCH)) for _ in range(64)]
    it = iter(range(10**9))

    def setup():
        return pool[next(it) % len(pool)], {}

    benchmark.pedantic(sampler.update_priority, setup=setup, rounds=50, warmup_rounds=2)


@pytest.mark.parametrize("module", ALL_IMPLS)
def test_random_sample(benchmark, storage, module):
    benchmark.group = "RandomSampler.sample"
    benchmark.pedantic(module.RandomSampler().sample, args=(storage, BATCH), rounds=100)


@pytest.mark.parametrize("module", ALL_IMPLS)
def test_without_replacement_first_batch(benchmark, storage, module):
    benchmark.group = "SamplerWithoutReplacement first batch"

    def setup():
        return (module.SamplerWithoutReplacement(), storage, BATCH), {}

    benchmark.pedantic(lambda s, st, b: s.sample(st, b), setup=setup, rounds=5)


@pytest.mark.parametrize("module", ALL_IMPLS)
@pytest.mark.parametrize("cache_values", [False, True])
def test_slice_sample(benchmark, storage, module, cache_values):
    benchmark.group = f"SliceSampler.sample cache_values={cache_values}"
    sampler = module.SliceSampler(slice_len=SLICE, end_key=("next", "done"), cache_values=cache_values)
    benchmark.pedantic(sampler.sample, args=(storage, BATCH), rounds=10, warmup_rounds=1)
