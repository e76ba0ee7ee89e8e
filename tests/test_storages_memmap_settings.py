"""A memory-mapped storage's settings as made by its constructor, and what its
``cleanup()`` removes and answers (in this process), compared with torchrl's own
``LazyMemmapStorage``."""
from __future__ import annotations

import os
import pickle

import pytest
import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers.storages as T

import torchrl_compat.storages as O
import torchrl_compat.storages.tensor as storage_tensor

from storage_support import refusals

SETTINGS = (
    "initialized", "scratch_dir", "_scratch_dir_is_temp", "existsok", "ndim", "_compilable",
    "shared_init", "cleanup_memmap", "device", "_auto_cleanup", "_cleaned_up", "max_size",
)


def settings(store):
    return {name: getattr(store, name) for name in SETTINGS} | {"len": len(store)}


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"device": "auto"},
        {"device": "cpu", "ndim": 2, "existsok": True, "compilable": True},
        {"shared_init": True},
        {"auto_cleanup": False},
        {"auto_cleanup": True, "ndim": 3},
        {"scratch_dir": "SCRATCH"},
        {"scratch_dir": "SCRATCH/"},
        {"scratch_dir": "SCRATCH", "auto_cleanup": True},
    ],
)
def test_constructor_settings_match_torchrl(kwargs, tmp_path):
    if "scratch_dir" in kwargs:
        kwargs = kwargs | {"scratch_dir": kwargs["scratch_dir"].replace("SCRATCH", str(tmp_path / "maps"))}
    ours, ref = O.LazyMemmapStorage(12, **kwargs), T.LazyMemmapStorage(12, **kwargs)
    got, want = settings(ours), settings(ref)
    if kwargs.get("shared_init"):
        # each makes a directory of its own for the processes that initialize it
        assert os.path.basename(got.pop("scratch_dir")).startswith("torchrl_storage_init_")
        assert os.path.basename(want.pop("scratch_dir")).startswith("torchrl_storage_init_")
        ours._cleanup_init_directory()
        ref._cleanup_init_directory() if hasattr(ref, "_cleanup_init_directory") else None
    assert got == want
    assert ours.device == torch.device("cpu") and got["len"] == 0 and got["initialized"] is False
    if "scratch_dir" in kwargs:
        assert got["scratch_dir"] == str(tmp_path / "maps") + "/"
    # torchrl keeps the storages it cleans up at exit in a registry (ours uses the same)
    assert (ours in storage_tensor._MEMMAP_STORAGE_REGISTRY) == (ref in T._MEMMAP_STORAGE_REGISTRY) == want["_auto_cleanup"]


@pytest.mark.parametrize("device", ["meta", torch.device("meta")])
def test_memmap_on_another_device_is_refused_as_torchrl(device):
    messages = refusals(ValueError, lambda family: family.LazyMemmapStorage(4, device=device))
    assert messages[0] == messages[1]
    assert messages[0].startswith("Memory map device other than CPU isn't supported.")


def written(ns, tmp_path, name, **kwargs):
    store = ns.LazyMemmapStorage(4, scratch_dir=tmp_path / name, **kwargs)
    store.set(range(2), TensorDict({"a": torch.arange(2.0)}, [2]))
    return store


def test_cleanup_removes_the_scratch_dir_once_as_torchrl(tmp_path):
    for ns, name in ((O, "ours"), (T, "ref")):
        store = written(ns, tmp_path, name)
        assert (tmp_path / name).is_dir()
        assert store.cleanup() is True
        assert not (tmp_path / name).exists()
        # a directory made again at that path (by the user) is not removed a second time
        (tmp_path / name).mkdir()
        (tmp_path / name / "kept").write_text("x")
        assert store.cleanup() is False
        assert (tmp_path / name / "kept").exists()


def test_cleanup_without_a_scratch_dir_removes_nothing():
    store = O.LazyMemmapStorage(4)
    store.set(range(2), TensorDict({"a": torch.arange(2.0)}, [2]))
    assert store.cleanup() is False
    assert store.cleanup() is False


def test_cleanup_of_a_copy_leaves_the_files_to_the_storage_that_made_them(tmp_path):
    store = written(O, tmp_path, "ours")
    copy = pickle.loads(pickle.dumps(store))
    assert copy.cleanup() is False
    assert (tmp_path / "ours").is_dir()
    assert store.cleanup() is True
    assert not (tmp_path / "ours").exists()


def test_storage_pickled_before_the_cleanup_settings_cleans_its_files(tmp_path):
    # a storage pickled by a release that had no cleanup settings (no owner, not cleaned
    # up) is taken as the owner of its files, as torchrl takes any storage
    store = written(O, tmp_path, "ours")
    state = store.__getstate__()
    for name in ("_owner_pid", "_cleaned_up"):
        state.pop(name)
    old = O.LazyMemmapStorage.__new__(O.LazyMemmapStorage)
    old.__setstate__(state)
    assert old.cleanup() is True
    assert not (tmp_path / "ours").exists()
    assert old.cleanup() is False


def test_cleanup_by_the_owner_pid_only(tmp_path, monkeypatch):
    store = written(O, tmp_path, "ours")
    pid = os.getpid()
    monkeypatch.setattr(storage_tensor.os, "getpid", lambda: pid + 1)  # as in a forked child
    assert store.cleanup() is False
    assert (tmp_path / "ours").is_dir()
    monkeypatch.setattr(storage_tensor.os, "getpid", lambda: pid)
    assert store.cleanup() is True
