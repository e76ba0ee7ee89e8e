"""What the tensor storages' constructors accept and refuse, compared with torchrl's: a
storage given with its matching ``max_size``, and the errors for a missing storage, a
mismatching ``max_size`` and a compilable storage shared between processes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import torchrl.data.replay_buffers.storages as T

import torchrl_compat.storages as O

from storage_support import refusals


def test_storage_given_with_its_own_max_size_is_accepted_as_torchrl():
    made = []
    for family in (O, T):
        store = family.TensorStorage(torch.arange(8.0).reshape(4, 2), max_size=4)
        made.append((len(store), store.max_size, store.initialized, store.get(torch.tensor([3])).tolist()))
    assert made[0] == made[1] == (4, 4, True, [[6.0, 7.0]])


def test_missing_storage_raises_torchrls_error():
    ours, theirs = refusals(ValueError, lambda family: family.TensorStorage(None))
    assert ours == theirs == "Expected storage to be non-null."


def test_max_size_other_than_the_storage_length_raises_torchrls_error():
    ours, theirs = refusals(ValueError, lambda family: family.TensorStorage(torch.zeros(4, 2), max_size=5))
    assert ours == theirs == (
        "The max-size and the storage shape mismatch: got max_size=5 for a storage of shape torch.Size([4, 2])."
    )


def test_device_auto_takes_the_given_storage_device_as_torchrl():
    devices = [family.TensorStorage(torch.zeros(4, 2), device="auto").device for family in (O, T)]
    assert devices[0] == devices[1] == torch.device("cpu")


def test_list_of_items_that_do_not_stack_raises_torchrls_error():
    def write(family):
        store = family.LazyTensorStorage(4)
        store.set(torch.arange(2), [{"a": torch.zeros(2)}, {"b": torch.zeros(3)}])

    ours, theirs = refusals(RuntimeError, write)
    strip = lambda message: message.replace(O.LazyTensorStorage.__module__, "M").replace(T.LazyTensorStorage.__module__, "M")
    assert strip(ours) == strip(theirs)
    assert ours.startswith("Stacking the elements of the list resulted in an error.")


def test_compilable_storage_with_shared_init_raises_torchrls_error():
    ours, theirs = refusals(
        RuntimeError, lambda family: family.LazyTensorStorage(4, compilable=True, shared_init=True)
    )
    assert ours == theirs == "Cannot share a compilable storage between processes."


def test_read_from_a_storage_made_without_data_raises_torchrls_error():
    ours, theirs = refusals(RuntimeError, lambda family: family.TensorStorage(None, max_size=4).get(0))
    assert ours == theirs == "Cannot get elements out of a non-initialized storage."


@pytest.mark.parametrize("row", [np.array([1.0, 2.0]), (3.0, 4.0)], ids=["numpy array", "tuple"])
def test_row_that_is_not_a_tensor_is_refused_and_changes_nothing(row):
    """torchrl refuses these too (with an AttributeError from deeper in its write); here the
    refusal comes before anything is written, and the stored rows and length stay."""
    store = O.LazyTensorStorage(4)
    store.set(torch.arange(2), torch.zeros(2, 2))
    with pytest.raises((TypeError, ValueError)):
        store.set(1, row)
    assert torch.equal(store.get(torch.arange(2)), torch.zeros(2, 2)) and len(store) == 2
    with pytest.raises(AttributeError):
        reference = T.LazyTensorStorage(4)
        reference.set(torch.arange(2), torch.zeros(2, 2))
        reference.set(1, row)
