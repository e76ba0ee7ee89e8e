"""Removing the temporary memory-mapped files of storages at exit and on SIGINT / SIGTERM.

Storages that own temporary files register here (:func:`register`). The registry holds weak
references, so it never keeps a storage alive, and calls each entry's ``cleanup()`` at
interpreter exit (``atexit``) and when a SIGINT or SIGTERM stops the process; the previous
signal handler then runs as it would have.

When torchrl is importable (and ``TORCHRL_COMPAT_STANDALONE`` is not ``"1"``), the registry is
torchrl's own ``torchrl.data.replay_buffers.storages._MEMMAP_STORAGE_REGISTRY``: the exit and
signal cleanup of either library then sees every storage of both. Our storages' ``cleanup()``
only removes files in the process that created them, so torchrl's handler running in a forked
child leaves the parent's files alone.

Both the storages (their ``shared_init`` directories) and the checkpointers (the live home a
storage's files move to) register here, so it belongs to neither family.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import threading
import weakref

from torchrl_compat._torchrl_lookup import torchrl_module

__all__ = ["InitDirectoryCleanup", "register", "registry", "remove_tree"]

# torchrl's logger: a user who configures logging.getLogger("torchrl") configures ours too
logger = logging.getLogger("torchrl")


def _torchrl_registry():
    found = getattr(torchrl_module("storages"), "_MEMMAP_STORAGE_REGISTRY", None)
    return found if isinstance(found, weakref.WeakSet) else None


_REGISTRY: weakref.WeakSet = _torchrl_registry()
if _REGISTRY is None:  # (not `or`: an empty WeakSet is false)
    _REGISTRY = weakref.WeakSet()


def registry() -> weakref.WeakSet:
    """The set of registered storages (torchrl's when torchrl is importable)."""
    return _REGISTRY


class _Handlers:
    """Our atexit hook and SIGINT / SIGTERM handlers, installed once per process."""

    installed = False
    done = False  # set once the cleanup ran, so an atexit after a signal does not redo it
    previous = {}  # signal number -> the handler in place before ours


def _cleanup_all():
    """Calls ``cleanup()`` on every registered object, but those of ours that another
    process created (a forked child inherits its parent's registry and handlers).

    torchrl's storages record no owner and are cleaned as torchrl's own handler does.
    """
    if _Handlers.done:
        return
    _Handlers.done = True
    pid = os.getpid()
    for entry in list(_REGISTRY):
        if getattr(entry, "_owner_pid", pid) != pid:
            continue
        try:
            entry.cleanup()
        except Exception:
            # the storage may be half-destroyed at exit; the others still need cleaning
            pass


def _on_signal(signum, frame):
    """Cleans the registered storages, then re-raises the signal with the previous handler."""
    try:
        _cleanup_all()
    except Exception:
        # whatever happens, the signal must still stop the process
        pass
    previous = _Handlers.previous.get(signum)
    signal.signal(signum, previous if previous else signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers():
    if _Handlers.installed:
        return
    _Handlers.installed = True
    atexit.register(_cleanup_all)
    # signal.signal only works from the main thread
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            _Handlers.previous[signum] = signal.signal(signum, _on_signal)
    except (ValueError, RuntimeError):
        pass


def register(entry) -> None:
    """Adds ``entry`` (an object with ``cleanup()`` and ``_owner_pid``) to the registry and
    makes sure the handlers are installed."""
    _install_handlers()
    _REGISTRY.add(entry)


def remove_tree(path) -> bool:
    """Removes the directory ``path``; ``True`` if it existed and was removed."""
    path = str(path).rstrip("/")
    if not os.path.isdir(path):
        return False
    try:
        shutil.rmtree(path)
        logger.debug(f"Cleaned up memmap directory: {path}")
        return True
    except Exception as err:
        logger.warning(f"Failed to clean up memmap directory: {err}")
        return False


class InitDirectoryCleanup:
    """The temporary directory a ``shared_init`` storage is initialized through, removed at
    exit by the process that created it.

    The storage holds this object; the registry holds it weakly, so it leaves the registry
    with its storage.

    Args:
        path (str): the directory.
    """

    __slots__ = ("path", "_owner_pid", "_done", "__weakref__")

    def __init__(self, path: str):
        self.path = path
        self._owner_pid = os.getpid()
        self._done = False

    def cleanup(self) -> bool:
        """Removes the directory (once, and only in the creating process)."""
        if self._done or self._owner_pid != os.getpid():
            return False
        self._done = True
        return remove_tree(self.path)

    def __getstate__(self):
        return (self.path, self._done)

    def __setstate__(self, state):
        # a copy (another process, or a deep copy) leaves the directory to the original
        self.path, self._done = state
        self._owner_pid = None
