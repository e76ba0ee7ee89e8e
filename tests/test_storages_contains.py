"""``TensorStorage.contains`` and the errors of a storage that cannot take an item,
compared with torchrl's own storages."""
from __future__ import annotations

import pytest
import torch

import torchrl.data.replay_buffers.storages as T

import torchrl_compat.storages as O

from storage_support import refusals


def filled(family, shape=(5, 3), length=3):
    store = family.LazyTensorStorage(shape[0], ndim=len(shape) - 1 or 1)
    store.set(torch.arange(length), torch.zeros(length, *shape[1:]))
    return store


@pytest.mark.parametrize(
    "item",
    [
        2, -1, 7, -9,
        torch.tensor(2), torch.tensor(11), torch.tensor(-5),
        torch.tensor([0, 4, 5, -5, -6]),
        torch.tensor([[0, 1], [2, 3]]),
    ],
    ids=repr,
)
def test_contains_matches_torchrl(item):
    got, want = filled(O).contains(item), filled(T).contains(item)
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert (got.dtype, got.device, got.shape) == (want.dtype, want.device, want.shape)
        assert torch.equal(got, want)
    else:
        assert got == want


def test_contains_of_a_storage_too_large_to_allocate_matches_torchrl():
    """Indices are checked against the storage's shape without allocating it (16 TiB here)."""
    rows = 2**30  # (torchrl's length is a 32-bit counter)
    answers = []
    for family in (O, T):
        store = family.TensorStorage(torch.zeros(()).expand(rows, 2**12))
        answers.append((store.contains(torch.tensor(rows - 1)), store.contains(torch.tensor([rows, 0]))))
    for got, want in zip(*answers):
        assert torch.equal(got, want)
    assert answers[0][0].item() and answers[0][1].tolist() == [False, True]


def test_contains_of_an_unsupported_item_raises_torchrls_error():
    raised = refusals(NotImplementedError, lambda family: filled(family).contains([1, 2]))
    assert raised[0] == raised[1] == "type <class 'list'> is not supported yet."


def test_storage_made_without_data_cannot_be_initialized_as_torchrl():
    raised = []
    for family in (O, T):
        store = family.TensorStorage(None, max_size=4)
        # a write calls _init(data), which this class does not take, in torchrl as here
        with pytest.raises(TypeError, match="positional argument"):
            store.set(torch.arange(2), torch.zeros(2, 3))
        # (torchrl counts the failed write's rows into its length; nothing is counted here)
        assert not store.initialized and len(store) == (0 if family is O else 2)
        with pytest.raises(NotImplementedError) as info:
            store._init()
        raised.append(str(info.value).replace(family.TensorStorage.__module__, "M"))
    assert raised[0] == raised[1] == "<class 'M.TensorStorage'> must be initialized during construction."
