"""The write lock of a buffer shared between processes, which refuses writes that could not
reach the other processes.

A buffer made with ``shared=True`` and handed to spawned processes is pickled, and pickling
refuses what cannot be shared: a storage not initialized yet (unless ``shared_init=True``),
a prioritized sampler. A forked child is not pickled: it inherits the buffer as it is, and
torchrl's child then writes into what only it can see (a storage it initializes itself, the
private copy of a storage in ordinary memory, its own copy of the priority trees), exits 0,
and the rows or priorities are lost while the shared length counts the rows. Here the
buffer's write lock, taken by every write, refuses such a write in a forked child with the
error spawning gives, or one that says what stays behind.
"""
from __future__ import annotations

import multiprocessing
import os

import torch
from tensordict import is_tensor_collection
from tensordict.memmap import MemoryMappedTensor
from torch.utils._pytree import tree_leaves

from torchrl_compat.samplers.prioritized import PRIORITIZED_SAMPLERS
from torchrl_compat.storages import TensorStorage

__all__ = ["SharedWriteLock"]


def _in_shared_memory(tensor) -> bool:
    return not isinstance(tensor, torch.Tensor) or isinstance(tensor, MemoryMappedTensor) or tensor.is_shared() or (
        tensor.device.type != "cpu"
    )


def _check_write_from(buffer, owner_pid: int) -> None:
    """Raises if a write to ``buffer`` in this process (not ``owner_pid``, which made it
    shared) would stay in this process."""
    pid = os.getpid()
    storage, sampler = buffer._storage, buffer._sampler
    if isinstance(sampler, PRIORITIZED_SAMPLERS):
        raise RuntimeError(
            f"Samplers of type {type(sampler)} cannot be shared between processes: this buffer "
            f"(shared=True) comes from process {owner_pid}, and the priorities written in process "
            f"{pid} would stay in this process's copy of the sampler. Write from process "
            f"{owner_pid}, or make the buffer with sync=False (torchrl 0.13+: each process then "
            "samples by the priorities it keeps itself)."
        )
    if not isinstance(storage, TensorStorage):
        return
    if not storage.initialized:
        if not getattr(storage, "shared_init", False):
            raise RuntimeError(
                f"Cowardly refusing to write, in process {pid}, to a storage of type {type(storage)} "
                f"shared with process {owner_pid} that has not been initialized yet: this process "
                "would initialize a storage of its own, and its rows would never reach the others "
                "(whose length counts them). You can either:\n"
                "- Populate the buffer with some data in the main process before passing it to the "
                "other processes (or create the buffer explicitly with a TensorStorage).\n"
                "- set shared_init=True when creating the storage such that it can be initialized by "
                "the remote processes."
            )
        return
    content = storage._storage
    leaves = content.values(True, True) if is_tensor_collection(content) else tree_leaves(content)
    if not all(_in_shared_memory(leaf) for leaf in leaves):
        raise RuntimeError(
            f"Cowardly refusing to write, in process {pid}, to a storage of type {type(storage)} "
            f"shared with process {owner_pid}: its tensors are in the private memory of each "
            "process (a forked child has a copy), so the rows written here would never reach the "
            "others, whose length counts them. Move them to shared memory before starting the "
            "other processes (storage._storage.share_memory_()), or use a LazyMemmapStorage."
        )


class SharedWriteLock:
    """A ``multiprocessing.Lock`` for a buffer shared between processes: before it is taken
    in a process other than the one that made it, it checks that the buffer's writes from
    there reach the others (once per process).

    Args:
        buffer (ReplayBuffer): the buffer whose writes the lock guards.
    """

    def __init__(self, buffer):
        self._lock = multiprocessing.Lock()
        self._buffer = buffer
        self._owner_pid = os.getpid()
        self._checked_pid = self._owner_pid

    def __enter__(self):
        pid = os.getpid()
        if pid != self._checked_pid:
            _check_write_from(self._buffer, self._owner_pid)
            # (a storage is initialized once; what is shared stays so)
            if self._buffer._storage is None or getattr(self._buffer._storage, "initialized", True):
                self._checked_pid = pid
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)

    def acquire(self, *args, **kwargs):
        return self._lock.acquire(*args, **kwargs)

    def release(self):
        return self._lock.release()
