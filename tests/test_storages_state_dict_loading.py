"""``load_state_dict`` into a storage that holds nothing yet, compared with torchrl's own
storages: whether the loaded rows share memory with the caller's saved tensors (torchrl 0.11
and 0.12 keep them, 0.13 on copies them), where a memory-mapped storage puts the loaded
rows, what it warns, and what ``state_dict`` refuses."""
from __future__ import annotations

import os
import warnings

import pytest
import torch
from tensordict import MemoryMappedTensor, TensorDict

import torchrl.data.replay_buffers.storages as T

import torchrl_compat.storages as O

from storage_support import FAMILIES, refusals


def saved_state(family, data):
    store = family.LazyTensorStorage(6)
    store.set(torch.arange(len(data)), data)
    return store.state_dict()


def first_leaf(state):
    saved = state["_storage"]
    return saved if isinstance(saved, torch.Tensor) else saved["obs"]


def tensor_rows():
    return torch.arange(12.0).reshape(6, 2)


def tensordict_rows():
    return TensorDict({"obs": torch.arange(12.0).reshape(6, 2)}, batch_size=[6])


def loaded_rows(store):
    rows = store.get(torch.arange(len(store)))
    return rows if isinstance(rows, torch.Tensor) else rows["obs"]


@pytest.mark.parametrize("rows", [tensor_rows, tensordict_rows])
@pytest.mark.parametrize("kind", ["LazyTensorStorage", "TensorStorage"])
def test_load_into_an_empty_storage_shares_the_saved_rows_as_torchrl(kind, rows):
    """A change to the saved tensors after the load shows in the storage exactly when it
    shows in torchrl's."""
    seen = []
    for family in (O, T):
        state = saved_state(family, rows())
        store = getattr(family, kind)(None, max_size=6) if kind == "TensorStorage" else family.LazyTensorStorage(6)
        store.load_state_dict(state)
        assert torch.equal(loaded_rows(store), tensor_rows())
        first_leaf(state).mul_(-1)
        seen.append(torch.equal(loaded_rows(store), -tensor_rows()))
        assert len(store) == 6 and store.initialized
    assert seen[0] == seen[1]


def test_memmap_load_of_saved_tensor_maps_it_into_the_scratch_dir_as_torchrl(tmp_path):
    files = []
    for name, family in (("ours", O), ("torchrl", T)):
        scratch = tmp_path / name
        scratch.mkdir()  # (neither creates it here: both raise torch's "unable to open file")
        store = family.LazyMemmapStorage(6, scratch_dir=scratch)
        state = saved_state(family, tensor_rows())
        store.load_state_dict(state)
        first_leaf(state).mul_(-1)
        # a copy, mapped to a file of the scratch dir
        assert torch.equal(loaded_rows(store), tensor_rows())
        assert os.path.samefile(store._storage.filename, scratch / "tensor.memmap")
        files.append(sorted(os.listdir(scratch)))
    assert files[0] == files[1] == ["tensor.memmap"]


def test_memmap_load_without_a_scratch_dir_maps_anonymous_memory_as_torchrl():
    for family in (O, T):
        store = family.LazyMemmapStorage(6)
        state = saved_state(family, tensor_rows())
        store.load_state_dict(state)
        first_leaf(state).mul_(-1)
        assert isinstance(store._storage, MemoryMappedTensor) and torch.equal(loaded_rows(store), tensor_rows())
        with pytest.raises(RuntimeError, match="no file associated"):
            store._storage.filename


def test_memmap_load_of_a_saved_tensordict_warns_as_torchrl(tmp_path):
    caught = []
    for family in (O, T):
        store = family.LazyMemmapStorage(6)
        state = saved_state(family, tensordict_rows())
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            store.load_state_dict(state)
        caught.append([(w.category, str(w.message)) for w in got if "uninitialized" in str(w.message)])
        assert store._storage.is_memmap()
        assert torch.equal(loaded_rows(store), tensor_rows())
    assert caught[0] == caught[1] and len(caught[0]) == 1


@pytest.mark.parametrize("kind", ["TensorStorage", "LazyMemmapStorage"])
def test_state_dict_of_a_pytree_storage_raises_torchrls_error(kind, tmp_path):
    def state_dict_of_a_pytree_storage(family):
        if kind == "TensorStorage":
            store = family.TensorStorage({"a": torch.zeros(4), "b": torch.ones(4, 2)})
        else:
            store = family.LazyMemmapStorage(4, scratch_dir=tmp_path / family.__name__)
            store.set(torch.arange(2), {"a": torch.zeros(2), "b": torch.ones(2, 2)})
        store.state_dict()

    raised = [
        message.replace(family.__name__, "M")
        for family, message in zip(FAMILIES, refusals(TypeError, state_dict_of_a_pytree_storage))
    ]
    assert raised[0] == raised[1]
    assert "dict" in raised[0]


@pytest.mark.parametrize(
    "maker,args",
    [("_make_memmap", (torch.arange(6.0).reshape(3, 2),)), ("_make_empty_memmap", ((3, 2), torch.float32))],
)
def test_memmap_helpers_write_the_file_named_as_torchrls(maker, args, tmp_path):
    made = []
    for family in (O, T):
        path = tmp_path / f"{family.__name__}.memmap"
        tensor = getattr(family, maker)(*args, path=str(path))
        assert tensor.filename == str(path) and os.path.exists(path)
        made.append((tensor.shape, tensor.dtype, os.path.getsize(path)))
    assert made[0] == made[1]
