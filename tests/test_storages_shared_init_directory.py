"""Where a ``shared_init`` storage keeps the files its first write makes, and who removes
them, compared with torchrl's own storages."""
from __future__ import annotations

import os
import shutil

import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers.storages as T

import torchrl_compat.storages as O


def batch(n):
    return TensorDict({"obs": torch.arange(n * 2.0).reshape(n, 2)}, batch_size=[n])


def test_memmap_shared_init_keeps_the_users_scratch_dir_as_torchrl(tmp_path):
    made = []
    for family in (O, T):
        scratch = tmp_path / family.__name__
        store = family.LazyMemmapStorage(8, scratch_dir=scratch, shared_init=True)
        # the other processes load the first write from the user's directory, not a temporary one
        assert store.scratch_dir == str(scratch) + "/" and store._init_directory == store.scratch_dir
        store.set(torch.arange(3), batch(3))
        assert torch.equal(store.get(torch.arange(3))["obs"], batch(3)["obs"])
        made.append(sorted(os.listdir(scratch)))
    assert made[0] == made[1] and "obs.memmap" in made[0]


def test_lazy_tensor_shared_init_directory_kept_without_cleanup_memmap():
    """``cleanup_memmap=False``: the init directory is left where torchrl leaves it (torchrl
    removes it in no case)."""
    kept = []
    for family in (O, T):
        store = family.LazyTensorStorage(4, shared_init=True, cleanup_memmap=False)
        init_dir = store._init_directory
        assert os.path.basename(init_dir).startswith("torchrl_storage_init_")
        store.set(torch.arange(2), batch(2))
        # the process that made the first write holds the rows: it does not wait again
        assert len(store) == 2 and store.initialized is True
        if family is O:
            assert store._cleanup_init_directory() is False
            assert getattr(store, "_init_cleanup", None) is None
        kept.append(os.path.isdir(init_dir))
        shutil.rmtree(init_dir)
    assert kept == [True, True]


def test_lazy_tensor_shared_init_directory_removed_with_cleanup_memmap():
    store = O.LazyTensorStorage(4, shared_init=True, cleanup_memmap=True)
    init_dir = store._init_directory
    store.set(torch.arange(2), batch(2))
    assert os.path.isdir(init_dir)
    assert store._cleanup_init_directory() is True and not os.path.exists(init_dir)
    assert store._cleanup_init_directory() is False
