"""Which first writes a lazy storage builds directly (``_first_write`` answers ``True``,
having created the storage and written the rows) and which it leaves to the generic path
(``False``, having done nothing); what it builds, compared with torchrl's storages."""
from __future__ import annotations

import logging

import pytest
import torch
from tensordict import TensorDict

import torchrl.data as trd

import torchrl_compat as ours
import torchrl_compat.storages.tensor as storage_tensor


def plain_batch(n=3):
    return TensorDict({"obs": torch.arange(n * 2.0).reshape(n, 2), ("next", "r"): torch.arange(n)}, [n])


@pytest.mark.parametrize("storage", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_plain_tensordict_first_write_is_built_directly(storage):
    store = getattr(ours, storage)(5)
    data = plain_batch()
    assert store._first_write(data, None, 1, 3) is True
    assert store.initialized and store._storage.batch_size == torch.Size([5])
    for key in data.keys(True, True):
        assert torch.equal(store._storage[key][1:4], data[key])


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.uint8, torch.bool])
def test_plain_tensor_first_write_is_built_directly_as_torchrl_builds_it(dtype):
    data = (torch.arange(12).reshape(6, 2) % 3).to(dtype)
    store = ours.LazyTensorStorage(4)
    assert store._first_write(data[:3], None, 0, 3) is True
    assert store.initialized and torch.equal(store._storage[:3], data[:3])
    theirs = trd.ReplayBuffer(storage=trd.LazyTensorStorage(4), batch_size=3)
    mine = ours.ReplayBuffer(storage=ours.LazyTensorStorage(4), batch_size=3)
    assert torch.equal(theirs.extend(data), mine.extend(data))
    a, b = mine._storage._storage, theirs._storage._storage
    assert (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device) == (torch.Size([4, 2]), dtype, torch.device("cpu"))
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "data, extra",
    [
        (torch.ones(3, 2, requires_grad=True), None),
        (torch.tensor(1.0), None),
        (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), None),
        (torch.ones(3, 2, device="meta"), None),
        (torch.ones(3, 2), {"x": torch.ones(3)}),
        ({"a": torch.ones(3, 2), "b": (torch.zeros(3),)}, None),
        ((torch.ones(3, 2), torch.zeros(3)), None),
    ],
    ids=["requires-grad", "0-d", "nested", "other-device", "tensor-with-extra", "dict-pytree", "tuple-pytree"],
)
def test_other_tensor_and_pytree_first_writes_take_the_generic_path(data, extra):
    store = ours.LazyTensorStorage(5)
    assert store._first_write(data, extra, 0, 3) is False
    assert not store.initialized and store._storage is None


def test_memmap_first_write_of_a_tensor_takes_the_generic_path():
    store = ours.LazyMemmapStorage(5)
    assert store._first_write(torch.ones(3, 2), None, 0, 3) is False
    assert not store.initialized and store._storage is None


@pytest.mark.parametrize("kwargs", [{}, {"shared_init": True}, {"consolidated": True}])
def test_storage_already_written_or_shared_takes_the_generic_path(kwargs):
    store = ours.LazyTensorStorage(5, **kwargs)
    if not kwargs:
        store.set(range(3), plain_batch())
    before = store._storage
    assert store._first_write(plain_batch(), None, 0, 3) is False
    assert store._storage is before
    if kwargs.get("shared_init"):
        store._cleanup_init_directory()


def test_memmap_first_write_logs_as_torchrl(caplog):
    messages = []
    for lib in (ours, trd):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=storage_tensor.logger.name):
            lib.TensorDictReplayBuffer(storage=lib.LazyMemmapStorage(5), batch_size=2).extend(plain_batch())
        messages.append([r.getMessage() for r in caplog.records if "Initialized" in r.getMessage()])
    assert messages[0] == messages[1] == ["Initialized LazyMemmapStorage with torch.Size([5]) shape"]
