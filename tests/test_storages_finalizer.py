"""What a memory-mapped storage's finalizer does when the storage is collected: its files
removed when it cleans up after itself (``auto_cleanup``), kept otherwise, and nothing raised
for a storage whose constructor refused its arguments; compared with torchrl's."""
from __future__ import annotations

import gc
import sys

import pytest
import torch

import torchrl.data.replay_buffers.storages as T

import torchrl_compat.storages as O


@pytest.mark.parametrize("auto_cleanup", [True, False])
def test_collected_storage_removes_its_files_only_with_auto_cleanup_as_torchrl(auto_cleanup, tmp_path):
    left = []
    for family in (O, T):
        scratch = tmp_path / family.__name__
        store = family.LazyMemmapStorage(4, scratch_dir=scratch, auto_cleanup=auto_cleanup)
        store.set(torch.arange(2), torch.ones(2, 3))
        assert scratch.is_dir()
        del store
        gc.collect()
        left.append(scratch.exists())
    assert left == [not auto_cleanup, not auto_cleanup]


@pytest.fixture
def unraisable(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: seen.append(report))
    return seen


@pytest.mark.parametrize("scratch", [False, True])
def test_storage_refused_by_its_constructor_is_collected_silently_as_torchrl(unraisable, scratch, tmp_path):
    kept = []
    for family in (O, T):
        kwargs = {}
        if scratch:  # a directory of the user's, holding data already
            kwargs["scratch_dir"] = tmp_path / family.__name__
            kwargs["scratch_dir"].mkdir()
            (kwargs["scratch_dir"] / "data").write_text("kept")
        with pytest.raises(ValueError, match="Memory map device other than CPU"):
            family.LazyMemmapStorage(4, device="meta", **kwargs)
        gc.collect()
        if scratch:
            kept.append((kwargs["scratch_dir"] / "data").read_text())
    assert [(type(r.exc_value).__name__, str(r.exc_value)) for r in unraisable] == []
    assert kept == (["kept", "kept"] if scratch else [])
