"""Where a memory-mapped storage that lives in a checkpoint directory goes on writing.

A ``LazyMemmapStorage`` whose ``scratch_dir`` is a checkpoint's directory (its own ``dumps``
path, or a replay buffer checkpoint's ``storage/``) is dumped without copying its data: its
files are hard-linked into the checkpoint. From then on those files belong to a published
checkpoint, which must never change; the storage is moved out first: its data is copied
into a directory of its own, a :class:`LiveHome`, and its tensors are mapped from there
(:func:`move_out`). The next ``dumps`` links the files of that home into the new checkpoint
and moves the storage out again, so each dump costs one copy of the storage, made once the
checkpoint is written (a dump into another directory costs the same copy), and a published
checkpoint keeps its bytes whatever the storage writes next.

A home is a sibling ``.<name>.live-<id>`` of the outermost checkpoint being written or read
(the buffer's directory for a buffer's storage): on the same file system, for the links, and
outside every directory a publish replaces. Its process holds an exclusive ``flock`` on it;
the next ``dumps`` to that checkpoint removes the homes nobody holds (those of processes that
were killed), and a home is removed with its storage, at exit or when it is collected.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from tensordict import is_tensor_collection
from tensordict.memmap import MemoryMappedTensor
from torch.utils._pytree import tree_leaves, tree_map

from torchrl_compat import _directory_cleanup
from torchrl_compat.checkpointers._publish import LIVE_TAG, make_locked_sibling

__all__ = ["LiveHome", "files_home", "memmap_files", "move_out"]


def memmap_files(obj) -> list[str]:
    """The absolute file names of the memory-mapped leaves of a storage's content."""
    if obj is None:
        return []
    if is_tensor_collection(obj):
        leaves = obj.values(include_nested=True, leaves_only=True)
    elif isinstance(obj, torch.Tensor):
        leaves = [obj]
    else:
        try:
            leaves = tree_leaves(obj)
        except Exception:
            return []
    files = []
    for leaf in leaves:
        if not isinstance(leaf, MemoryMappedTensor):
            continue
        try:
            filename = leaf.filename
        except RuntimeError:
            # anonymous memory map (LazyMemmapStorage without scratch_dir): no file to protect
            continue
        if filename:
            files.append(os.path.abspath(filename))
    return files


class LiveHome:
    """A locked directory holding the files a storage writes to, removed with it.

    Args:
        root (Path): the checkpoint the home is made beside.
    """

    __slots__ = ("path", "_fd", "_owner_pid", "_done", "__weakref__")

    def __init__(self, root: Path):
        path, self._fd = make_locked_sibling(Path(root).absolute(), LIVE_TAG)
        self.path = str(path)
        self._owner_pid = os.getpid()
        self._done = False
        _directory_cleanup.register(self)

    def cleanup(self) -> bool:
        """Removes the directory (once, and only in the process that made it)."""
        if self._done or self._owner_pid != os.getpid():
            return False
        self._done = True
        shutil.rmtree(self.path, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        return True

    def __del__(self):
        try:
            self.cleanup()
        except Exception:  # at interpreter exit the modules may be gone
            pass

    def __getstate__(self):
        return self.path

    def __setstate__(self, path):
        # a copy (another process, or a deep copy) leaves the directory to the original
        self.path, self._fd, self._owner_pid, self._done = path, None, None, True


def files_home(storage) -> Path:
    """The directory the files of ``storage`` (a ``LazyMemmapStorage`` with a
    ``scratch_dir``) are in: its live home once moved out, its ``scratch_dir`` before."""
    home = storage.__dict__.get("_live_home")
    return Path(home.path if home is not None else storage.scratch_dir).absolute()


def _remap_leaf(leaf, source: Path, dest: Path):
    if not isinstance(leaf, MemoryMappedTensor):
        return leaf
    relative = os.path.relpath(os.path.abspath(leaf.filename), source)
    target = dest / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    return MemoryMappedTensor.from_tensor(leaf, filename=target, copy_existing=True)


def move_out(storage, root) -> None:
    """Copies the memory-mapped files of ``storage`` into a new :class:`LiveHome` beside
    ``root`` and maps its tensors from there: what it writes next leaves the files it had
    (now a checkpoint's) as they are.

    Readers of the storage (samplers following its writes) are told that every item may
    have changed: they read the new tensors again. The previous home, if any, is removed
    (its files live on in the checkpoints that link them).
    """
    previous = storage.__dict__.get("_live_home")
    source = files_home(storage)
    home = LiveHome(root)
    dest = Path(home.path)
    try:
        content = storage._storage
        if is_tensor_collection(content):
            moved = content.memmap(prefix=dest, copy_existing=True)
        else:
            moved = tree_map(lambda leaf: _remap_leaf(leaf, source, dest), content)
    except BaseException:
        home.cleanup()
        raise
    storage._storage = moved
    storage._live_home = home
    note_all_written = getattr(storage, "_note_all_written", None)
    if note_all_written is not None:
        note_all_written()
    if previous is not None:
        previous.cleanup()
