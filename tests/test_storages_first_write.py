"""The first write into a lazy storage, built leaf by leaf, against the generic path and torchrl.

A round-robin writer's first batch into a ``LazyTensorStorage`` or an anonymous
``LazyMemmapStorage`` creates the storage from the batch directly
(``torchrl_compat.storages._first_write``). The storage it builds must be the one
``storage.set`` builds through tensordict's generic machinery (the path torchrl takes), attribute
for attribute, and a buffer written that way must read, sample and save as torchrl's buffer does.
"""
from __future__ import annotations

import pytest
import torch
import torchrl.data as trd
from tensordict import TensorDict
from tensordict.memmap import MemoryMappedTensor

import torchrl_compat as ours
import torchrl_compat.storages._first_write as first_write
import torchrl_compat.storages.tensor as storage_tensor

STORAGES = ["LazyTensorStorage", "LazyMemmapStorage"]
# what tensordict's caches and op tracker leave on the generic path's result
INCIDENTAL = {"_tensordict", "_has_mps_val", "_last_op", "_cache"}


def make_batch(n, seed=0, *, batch=(), nested=True):
    g = torch.Generator().manual_seed(seed)
    entries = {
        "obs": torch.randn(n, *batch, 3, generator=g),
        "done": torch.rand(n, *batch, 1, generator=g) > 0.5,
        "half": torch.randn(n, *batch, 2, generator=g).to(torch.bfloat16),
    }
    if nested:
        entries[("next", "pixels")] = torch.randint(0, 255, (n, *batch, 3, 4, 4), generator=g, dtype=torch.uint8)
        entries[("next", "deep", "reward")] = torch.randn(n, *batch, generator=g, dtype=torch.float64)
    return TensorDict(entries, batch_size=[n, *batch])


def assert_same_structure(fast, generic, path=()):
    """Same classes, attributes, key order, leaf layouts and memory-map attributes."""
    assert type(fast) is type(generic), path
    if isinstance(generic, TensorDict):
        attrs = {k: v for k, v in vars(generic).items() if k not in INCIDENTAL}
        assert {k: v for k, v in vars(fast).items() if k not in INCIDENTAL} == attrs, path
        assert list(fast._tensordict) == list(generic._tensordict), path
        for key in generic._tensordict:
            assert_same_structure(fast._tensordict[key], generic._tensordict[key], path + (key,))
        return
    assert (fast.shape, fast.stride(), fast.dtype, fast.device) == (
        generic.shape, generic.stride(), generic.dtype, generic.device
    ), path
    if isinstance(generic, MemoryMappedTensor):
        assert (fast._filename, fast.index, fast.parent_shape) == (generic._filename, generic.index, generic.parent_shape)
        assert type(fast._handler) is type(generic._handler), path


def assert_rows_equal(a, b):
    keys = list(a.keys(include_nested=True, leaves_only=True))
    assert keys == list(b.keys(include_nested=True, leaves_only=True))
    for key in keys:
        assert torch.equal(a[key], b[key]), key


def buffer(lib, storage, capacity, **kwargs):
    return lib.TensorDictReplayBuffer(storage=getattr(lib, storage)(capacity, **kwargs), batch_size=5)


@pytest.mark.parametrize("batch", [(), (2,)])
@pytest.mark.parametrize("storage", STORAGES)
def test_first_write_builds_what_set_builds(storage, batch):
    data = make_batch(7, batch=batch)
    rb = buffer(ours, storage, 10)
    index = rb.extend(data)
    assert rb._storage._storage is not None
    # the generic path: storage.set on a storage not initialized (data[0], then index_put)
    generic = getattr(ours, storage)(10)
    expected = data.clone()
    expected["index"] = index if not batch else index.unsqueeze(-1).expand(7, *batch)
    generic.set(index, expected)
    assert_same_structure(rb._storage._storage, generic._storage)
    assert_rows_equal(rb._storage._storage[:7], generic._storage[:7])
    assert len(rb._storage) == len(generic) == 7
    assert torch.equal(rb._storage._last_cursor, generic._last_cursor)
    assert rb._storage._last_cursor_index == generic._last_cursor_index == 6
    # the caller's batch stays without "index", as torchrl's (written through a copy)
    assert "index" not in data.keys()


@pytest.mark.parametrize("storage", STORAGES)
def test_first_write_with_index_in_data(storage):
    data = make_batch(4, nested=False)
    data["index"] = torch.full((4,), -1)
    rb = buffer(ours, storage, 6)
    rb.extend(data)
    generic = getattr(ours, storage)(6)
    expected = data.clone()
    expected["index"] = torch.arange(4)
    generic.set(torch.arange(4), expected)
    assert_same_structure(rb._storage._storage, generic._storage)
    assert_rows_equal(rb._storage._storage[:4], generic._storage[:4])


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("cursor, n", [(0, 10), (7, 3), (7, 6), (0, 25), (9, 1)])
def test_first_write_against_torchrl(storage, cursor, n):
    """Wrap-around (the writer's cursor moved before the first write), at capacity and past
    it: items, length, sampled batches and the storage's state_dict as torchrl's."""
    data = make_batch(n, seed=n)
    theirs, mine = buffer(trd, storage, 10), buffer(ours, storage, 10)
    theirs._writer._cursor = mine._writer._cursor = cursor
    assert torch.equal(theirs.extend(data.clone()), mine.extend(data.clone()))
    assert len(theirs) == len(mine)
    assert theirs._writer._cursor == mine._writer._cursor
    written = torch.arange(cursor, cursor + min(n, 10)) % 10
    # (torchrl's storage.get reads the first len(storage) rows only)
    assert_rows_equal(theirs._storage._storage[written], mine._storage._storage[written])
    # a sample reads rows [0, len): only all written ones from cursor 0 or past capacity
    for seed in range(3 if cursor == 0 or n >= 10 else 0):
        torch.manual_seed(seed)
        expected = theirs.sample()
        torch.manual_seed(seed)
        assert_rows_equal(expected, mine.sample())
    assert_same_state(theirs._storage.state_dict(), mine._storage.state_dict(), written)


def assert_same_state(expected, actual, rows):
    """Same nested keys in the same order; tensors alike, equal on the written ``rows``
    (the others hold whatever the allocation held)."""
    if isinstance(expected, dict):
        assert list(expected) == list(actual)
        for key in expected:
            assert_same_state(expected[key], actual[key], rows)
    elif isinstance(expected, torch.Tensor):
        assert (expected.shape, expected.dtype) == (actual.shape, actual.dtype)
        if expected.ndim and expected.shape[0] == 10:
            assert torch.equal(expected[rows], actual[rows])
        else:
            assert torch.equal(expected, actual)
    else:
        assert expected == actual


@pytest.mark.parametrize("storage", STORAGES)
def test_first_write_then_more_writes_and_dumps(storage, tmp_path):
    theirs, mine = buffer(trd, storage, 12), buffer(ours, storage, 12)
    for seed, n in enumerate([5, 4, 9]):
        data = make_batch(n, seed=seed)
        assert torch.equal(theirs.extend(data.clone()), mine.extend(data.clone()))
    assert_rows_equal(theirs._storage[torch.arange(12)], mine._storage[torch.arange(12)])
    theirs.dumps(tmp_path / "theirs")
    mine.dumps(tmp_path / "mine")
    names = sorted(p.relative_to(tmp_path / "theirs") for p in (tmp_path / "theirs").rglob("*"))
    assert sorted(p.relative_to(tmp_path / "mine") for p in (tmp_path / "mine").rglob("*")) == names
    # loaded back as torchrl loads its own checkpoint (key order included)
    loaded, reference = buffer(ours, storage, 12), buffer(trd, storage, 12)
    loaded.loads(tmp_path / "mine")
    reference.loads(tmp_path / "theirs")
    assert_rows_equal(reference._storage[torch.arange(12)], loaded._storage[torch.arange(12)])


def test_plain_tensor_first_write():
    data = torch.randn(6, 2, 3)
    theirs = trd.ReplayBuffer(storage=trd.LazyTensorStorage(4), batch_size=3)
    mine = ours.ReplayBuffer(storage=ours.LazyTensorStorage(4), batch_size=3)
    assert torch.equal(theirs.extend(data), mine.extend(data))
    stored = mine._storage._storage
    assert (stored.shape, stored.stride(), stored.dtype) == (theirs._storage._storage.shape, theirs._storage._storage.stride(), theirs._storage._storage.dtype)
    assert torch.equal(stored, theirs._storage._storage)


@pytest.mark.parametrize(
    "kwargs, data",
    [
        ({"ndim": 2}, make_batch(3, batch=(2,))),
        ({"consolidated": True}, make_batch(3)),
        ({"device": "auto"}, make_batch(3)),
        ({}, make_batch(3).refine_names("t")),
        ({}, make_batch(3).apply(lambda x: x.float().requires_grad_())),
    ],
    ids=["ndim2", "consolidated", "auto-device", "names", "requires-grad"],
)
def test_other_storages_and_batches_take_the_generic_path(kwargs, data):
    storage = ours.LazyTensorStorage(5, **kwargs)
    assert not storage._first_write(data, None, 0, 3)
    assert not storage.initialized and storage._storage is None
    rb = ours.TensorDictReplayBuffer(storage=storage, batch_size=2)
    rb.extend(data)
    theirs = trd.TensorDictReplayBuffer(storage=trd.LazyTensorStorage(5, **kwargs), batch_size=2)
    theirs.extend(data)
    assert len(rb) == len(theirs)


def test_memmap_with_scratch_dir_takes_the_generic_path(tmp_path):
    storage = ours.LazyMemmapStorage(5, scratch_dir=tmp_path / "rb")
    assert not storage._first_write(make_batch(3), None, 0, 3)
    rb = ours.TensorDictReplayBuffer(storage=storage, batch_size=2)
    rb.extend(make_batch(3))
    assert (tmp_path / "rb" / "meta.json").exists()


def test_memmap_rows_written_through_the_file():
    """The rows written with pwrite are read back through the mapping, wrapping included."""
    data = make_batch(9, seed=3)
    rb = buffer(ours, "LazyMemmapStorage", 10)
    rb._writer._cursor = 4
    rb.extend(data)
    stored = rb._storage._storage
    order = (torch.arange(9) + 4) % 10
    for key in data.keys(include_nested=True, leaves_only=True):
        assert isinstance(stored[key], MemoryMappedTensor)
        assert torch.equal(stored[key][order], data[key]), key
    assert first_write._fd_of(stored["obs"]) is not None


def test_storage_subclass_with_own_init_takes_the_generic_path():
    calls = []

    class Counting(ours.LazyTensorStorage):
        def _init_standard(self, data):
            calls.append(data.batch_size)
            return super()._init_standard(data)

    rb = ours.TensorDictReplayBuffer(storage=Counting(5), batch_size=2)
    rb.extend(make_batch(3))
    assert calls == [torch.Size([])]


def test_logs_the_initialization(caplog):
    with caplog.at_level("INFO", logger=storage_tensor.logger.name):
        buffer(ours, "LazyTensorStorage", 5).extend(make_batch(2))
    assert "Initialized LazyTensorStorage with torch.Size([5]) shape" in caplog.text
