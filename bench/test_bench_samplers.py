"""Sampler benchmarks: torchrl_compat (CPU kernel paths) against torchrl 0.11, side by side.

Run in the torch 2.9.1 reference environment, where torchrl's compiled trees load:
``/opt/ref291/bin/python -m pytest bench/test_bench_samplers.py --benchmark-group-by=group``.
Elsewhere the torchrl prioritized references are skipped. Workloads: a full
``LazyTensorStorage`` of 2^20 transitions, episodes of 1000 steps with a
``("next", "done")`` key, batch 256, slices of 32. Unless a test id says ``own-storage``,
both sides sample torchrl's storage class; ``own-storage`` is ours on
``torchrl_compat.LazyTensorStorage`` with the same data, which is how the drop-in is used
(and where the slice samplers follow the storage's writes instead of reading the whole
end signal at every call).
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
import torchrl_compat.storages as our_storages  # noqa: E402

N = 1 << 20
N_LARGE = 1 << 23
N_PRIORITIZED_SLICES = 100_000
EPISODE = 1000
BATCH = 256
SLICE = 32
HAS_TORCHRL_TREES = trl.SumSegmentTreeFp32 is not None
IMPLS = [
    pytest.param(trl, id="torchrl", marks=pytest.mark.skipif(not HAS_TORCHRL_TREES, reason="torchrl trees not loaded")),
    pytest.param(ours, id="ours"),
]
ALL_IMPLS = [pytest.param(trl, id="torchrl"), pytest.param(ours, id="ours")]


def _episode_data(start, n):
    step = torch.arange(start, start + n)
    return TensorDict(
        {"obs": step, ("next", "done"): (step % EPISODE == EPISODE - 1).unsqueeze(-1), "episode": step // EPISODE},
        [n],
    )


def _episodes(n, storage_cls=LazyTensorStorage):
    torch.manual_seed(0)
    st = storage_cls(n)
    st.set(torch.arange(n), _episode_data(0, n))
    return st


@pytest.fixture(scope="module")
def storage():
    return _episodes(N)


@pytest.fixture(scope="module")
def own_storage():
    return _episodes(N, our_storages.LazyTensorStorage)


@pytest.fixture(scope="module")
def large_storage():
    return _episodes(N_LARGE)


@pytest.fixture(scope="module")
def large_own_storage():
    return _episodes(N_LARGE, our_storages.LazyTensorStorage)


@pytest.fixture(scope="module")
def small_storage():
    return _episodes(N_PRIORITIZED_SLICES)


@pytest.fixture(scope="module")
def small_own_storage():
    return _episodes(N_PRIORITIZED_SLICES, our_storages.LazyTensorStorage)


# (module, which storage): torchrl on its storage; ours on torchrl's and on its own
SIDES = [
    pytest.param(trl, "torchrl", id="torchrl"),
    pytest.param(ours, "torchrl", id="ours"),
    pytest.param(ours, "own", id="ours-own-storage"),
]


def _prioritized(module):
    torch.manual_seed(1)
    sampler = module.PrioritizedSampler(N, 0.7, 0.5)
    sampler.update_priority(torch.arange(N), torch.rand(N))
    return sampler


@pytest.mark.parametrize("module", IMPLS)
def test_prioritized_sample(benchmark, storage, module):
    benchmark.group = "PrioritizedSampler.sample"
    sampler = _prioritized(module)
    benchmark.pedantic(sampler.sample, args=(storage, BATCH), rounds=200, warmup_rounds=5)


@pytest.mark.parametrize("module", IMPLS)
def test_prioritized_update(benchmark, module):
    benchmark.group = "PrioritizedSampler.update_priority"
    sampler = _prioritized(module)
    gen = torch.Generator().manual_seed(2)
    pool = [(torch.randint(N, (BATCH,), generator=gen), torch.rand(BATCH, generator=gen)) for _ in range(64)]
    it = iter(range(10**9))

    def setup():
        return pool[next(it) % len(pool)], {}

    benchmark.pedantic(sampler.update_priority, setup=setup, rounds=200, warmup_rounds=5)


@pytest.mark.parametrize("module,which", SIDES)
def test_random_sample(benchmark, storage, own_storage, module, which):
    benchmark.group = "RandomSampler.sample"
    st = own_storage if which == "own" else storage
    benchmark.pedantic(module.RandomSampler().sample, args=(st, BATCH), rounds=300, warmup_rounds=5)


@pytest.mark.parametrize("module", ALL_IMPLS)
def test_without_replacement_first_batch(benchmark, storage, module):
    # The same torch.randperm of 2^20 on both sides (ours draws torchrl's epochs): parity.
    benchmark.group = "SamplerWithoutReplacement first batch"

    def setup():
        return (module.SamplerWithoutReplacement(), storage, BATCH), {}

    benchmark.pedantic(lambda s, st, b: s.sample(st, b), setup=setup, rounds=10)


@pytest.mark.parametrize("module,which", SIDES)
def test_without_replacement_steady(benchmark, storage, own_storage, module, which):
    benchmark.group = "SamplerWithoutReplacement steady state"
    torch.manual_seed(3)
    st = own_storage if which == "own" else storage
    sampler = module.SamplerWithoutReplacement()
    sampler.sample(st, BATCH)
    benchmark.pedantic(sampler.sample, args=(st, BATCH), rounds=300, warmup_rounds=5)


@pytest.mark.parametrize("module", ALL_IMPLS)
def test_without_replacement_epoch(benchmark, storage, module):
    # Every batch of one epoch: both sides draw torchrl's torch.randperm up front; ours then
    # hands batches out by moving a position (torchrl slices off the remainder each time).
    benchmark.group = "SamplerWithoutReplacement full epoch (4096 batches)"

    def setup():
        return (module.SamplerWithoutReplacement(),), {}

    def epoch(sampler):
        for _ in range(N // BATCH):
            sampler.sample(storage, BATCH)

    benchmark.pedantic(epoch, setup=setup, rounds=3)


@pytest.mark.parametrize("module,which", SIDES)
@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param(dict(end_key=("next", "done")), id="end_key"),
        pytest.param(dict(traj_key="episode"), id="traj_key"),
        pytest.param(dict(end_key=("next", "done"), cache_values=True), id="cache_values"),
    ],
)
def test_slice_sample(benchmark, storage, own_storage, module, which, kwargs):
    benchmark.group = f"SliceSampler.sample 2^20 {'-'.join(f'{k}={v}' for k, v in kwargs.items())}"
    torch.manual_seed(4)
    sampler = module.SliceSampler(slice_len=SLICE, **kwargs)
    st = own_storage if which == "own" else storage
    benchmark.pedantic(sampler.sample, args=(st, BATCH), rounds=100, warmup_rounds=1)


@pytest.mark.parametrize("module,which", SIDES)
def test_slice_sample_large(benchmark, large_storage, large_own_storage, module, which):
    benchmark.group = "SliceSampler.sample 2^23 end_key"
    torch.manual_seed(5)
    sampler = module.SliceSampler(slice_len=SLICE, end_key=("next", "done"))
    st = large_own_storage if which == "own" else large_storage
    benchmark.pedantic(sampler.sample, args=(st, BATCH), rounds=50, warmup_rounds=1)


@pytest.mark.parametrize("module,which", [SIDES[0], SIDES[2]])
@pytest.mark.parametrize("kwargs", [dict(end_key=("next", "done")), dict(traj_key="episode")], ids=["end_key", "traj_key"])
def test_slice_sample_after_each_write(benchmark, module, which, kwargs):
    """A training loop: 256 new steps written (not timed), then one sample, on a full 2^20
    storage that wraps around. Each side samples its own storage class."""
    benchmark.group = f"SliceSampler.sample 2^20 after each write of 256 steps {'-'.join(kwargs)}"
    st = _episodes(N, our_storages.LazyTensorStorage if which == "own" else LazyTensorStorage)
    torch.manual_seed(7)
    sampler = module.SliceSampler(slice_len=SLICE, **kwargs)
    written = iter(range(N, 10**12, BATCH))

    def write():
        start = next(written)
        st.set(torch.arange(start, start + BATCH) % N, _episode_data(start, BATCH))
        return (st, BATCH), {}

    benchmark.pedantic(sampler.sample, setup=write, rounds=200, warmup_rounds=1)


@pytest.mark.parametrize("module,which", [pytest.param(trl, "torchrl", id="torchrl", marks=IMPLS[0].marks), SIDES[2]])
def test_prioritized_slice_sample_after_each_write(benchmark, module, which):
    """A prioritized training loop: 256 new steps written and added to the sampler (not
    timed), then one sample, on a full 2^20 storage that wraps around; each side its own
    storage class. The excluded starts change at every write."""
    benchmark.group = "PrioritizedSliceSampler.sample 2^20 after each write of 256 steps"
    st = _episodes(N, our_storages.LazyTensorStorage if which == "own" else LazyTensorStorage)
    torch.manual_seed(8)
    sampler = module.PrioritizedSliceSampler(N, 0.7, 0.5, slice_len=SLICE, end_key=("next", "done"))
    sampler.update_priority(torch.arange(N), torch.rand(N))
    written = iter(range(N, 10**12, BATCH))

    def write():
        start = next(written)
        index = torch.arange(start, start + BATCH) % N
        st.set(index, _episode_data(start, BATCH))
        sampler.extend(index)
        return (st, BATCH), {}

    benchmark.pedantic(sampler.sample, setup=write, rounds=100, warmup_rounds=1)


@pytest.mark.parametrize("module,which", [pytest.param(trl, "torchrl", id="torchrl", marks=IMPLS[0].marks), SIDES[1], SIDES[2]])
@pytest.mark.parametrize("cache_values", [True, False], ids=["cached", "uncached"])
def test_prioritized_slice_sample(benchmark, small_storage, small_own_storage, module, which, cache_values):
    benchmark.group = f"PrioritizedSliceSampler.sample 1e5 {'cached' if cache_values else 'uncached'}"
    torch.manual_seed(6)
    sampler = module.PrioritizedSliceSampler(
        N_PRIORITIZED_SLICES, 0.7, 0.5, slice_len=SLICE, end_key=("next", "done"), cache_values=cache_values
    )
    sampler.update_priority(torch.arange(N_PRIORITIZED_SLICES), torch.rand(N_PRIORITIZED_SLICES))
    rounds = 100 if cache_values else 20
    st = small_own_storage if which == "own" else small_storage
    benchmark.pedantic(sampler.sample, args=(st, BATCH), rounds=rounds, warmup_rounds=2)
