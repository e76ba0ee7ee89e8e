"""Set / get of 256-row batches into a 2**20 storage, and ``len()``: torchrl 0.11 vs torchrl_compat.

Also: reads of a half-filled storage (ours checks the indices against the length), and writes
while a reader follows the write journal (as a slice sampler does; ours then keeps a copy of
each index written).

Each group holds the torchrl reference and ours, measured in the same run. Indices and batches come
from fixed-seed pools that rotate, so neither side replays one cached input.

    python -m pytest bench/test_bench_storages.py -q --benchmark-group-by=group \
        --benchmark-columns=min,median,mean,rounds
"""
import itertools

import pytest
import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers.storages as trl

import torchrl_compat.storages as ours

CAPACITY = 2**20
BATCH = 256
POOL = 64
ROUNDS = 300
LIBS = {"torchrl": trl, "ours": ours}


def make_batch(generator, n):
    return TensorDict(
        {
            "obs": torch.randn(n, 4, generator=generator),
            "action": torch.randint(0, 4, (n, 1), generator=generator),
            "reward": torch.randn(n, 1, generator=generator),
            ("next", "obs"): torch.randn(n, 4, generator=generator),
            ("next", "done"): torch.zeros(n, 1, dtype=torch.bool),
        },
        batch_size=[n],
    )


@pytest.fixture(scope="module")
def pools():
    generator = torch.Generator().manual_seed(0)
    index = [torch.randint(0, CAPACITY, (BATCH,), generator=generator) for _ in range(POOL)]
    data = [make_batch(generator, BATCH) for _ in range(POOL)]
    return index, data


_STORAGES = {}


def full_storage(lib, cls_name, tmp_path_factory):
    key = (lib, cls_name)
    if key not in _STORAGES:
        cls = getattr(LIBS[lib], cls_name)
        if cls_name == "LazyMemmapStorage":
            storage = cls(CAPACITY, scratch_dir=tmp_path_factory.mktemp(f"{lib}-mm"))
        else:
            storage = cls(CAPACITY)
        storage.set(torch.arange(CAPACITY), make_batch(torch.Generator().manual_seed(1), CAPACITY))
        _STORAGES[key] = storage
    return _STORAGES[key]


def bench_sets(benchmark, storage, pools):
    cycle = itertools.cycle(zip(*pools))

    def run():
        index, data = next(cycle)
        storage.set(index, data)

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=20)
    assert len(storage) == CAPACITY


def bench_gets(benchmark, storage, indices):
    cycle = itertools.cycle(indices)

    def run():
        return storage.get(next(cycle))

    out = benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=20)
    assert out.batch_size == torch.Size([BATCH])


@pytest.mark.parametrize("cls_name", ["LazyTensorStorage", "LazyMemmapStorage"])
@pytest.mark.parametrize("lib", ["torchrl", "ours"])
def test_set(benchmark, tmp_path_factory, pools, lib, cls_name):
    benchmark.group = f"set-{cls_name}-256"
    bench_sets(benchmark, full_storage(lib, cls_name, tmp_path_factory), pools)


@pytest.mark.parametrize("cls_name", ["LazyTensorStorage", "LazyMemmapStorage"])
@pytest.mark.parametrize("lib", ["torchrl", "ours"])
def test_get(benchmark, tmp_path_factory, pools, lib, cls_name):
    benchmark.group = f"get-{cls_name}-256"
    bench_gets(benchmark, full_storage(lib, cls_name, tmp_path_factory), pools[0])


@pytest.mark.parametrize("cls_name", ["LazyTensorStorage", "LazyMemmapStorage"])
@pytest.mark.parametrize("lib", ["torchrl", "ours"])
def test_len(benchmark, tmp_path_factory, lib, cls_name):
    benchmark.group = f"len-{cls_name}"
    storage = full_storage(lib, cls_name, tmp_path_factory)
    assert benchmark.pedantic(len, args=(storage,), rounds=ROUNDS, iterations=100) == CAPACITY


_HALF = {}


def half_storage(lib):
    if lib not in _HALF:
        storage = LIBS[lib].LazyTensorStorage(CAPACITY)
        storage.set(torch.arange(CAPACITY // 2), make_batch(torch.Generator().manual_seed(1), CAPACITY // 2))
        _HALF[lib] = storage
    return _HALF[lib]


@pytest.mark.parametrize("lib", ["torchrl", "ours"])
def test_get_half_filled(benchmark, pools, lib):
    benchmark.group = "get-LazyTensorStorage-half-filled-256"
    bench_gets(benchmark, half_storage(lib), [index % (CAPACITY // 2) for index in pools[0]])


@pytest.mark.parametrize("lib", ["torchrl", "ours"])
def test_set_followed(benchmark, tmp_path_factory, pools, lib):
    benchmark.group = "set-LazyTensorStorage-256-journal-followed"
    storage = full_storage(lib, "LazyTensorStorage", tmp_path_factory)
    if lib == "ours":
        storage._writes_since(None)  # a reader follows the writes from now on
    bench_sets(benchmark, storage, pools)
