"""The names ``torchrl_compat.samplers`` takes from the rest of the package, and from torchrl.

The samplers work with ``torchrl_compat``'s storages and with torchrl 0.11's own (duck typing,
as torchrl's samplers do): the storage classes used in ``isinstance`` checks are therefore
tuples holding ours and, when torchrl is installed, torchrl's. Each sampler class also lists
its torchrl twin as a base (:func:`_torchrl_twin`).
"""
import os

from torchrl_compat.storages import (
    Storage as _Storage,
    StorageEnsemble as _StorageEnsemble,
    TensorStorage as _TensorStorage,
    logger,
)
from torchrl_compat.utils import _auto_device, _is_int, unravel_index

try:  # torchrl's storages, when torchrl is installed
    from torchrl.data.replay_buffers import storages as _torchrl_storages
except ImportError:  # pragma: no cover - torchrl is a test requirement
    _torchrl_storages = None


def _with_torchrl(ours, name):
    theirs = getattr(_torchrl_storages, name, None) if _torchrl_storages is not None else None
    if theirs is None:
        return ours
    # Ours derive from torchrl's when torchrl is installed: its class then covers both.
    return theirs if issubclass(ours, theirs) else (ours, theirs)


Storage = _with_torchrl(_Storage, "Storage")
StorageEnsemble = _with_torchrl(_StorageEnsemble, "StorageEnsemble")
TensorStorage = _with_torchrl(_TensorStorage, "TensorStorage")


def _torchrl_twin(name: str) -> tuple:
    """``(torchrl's sampler class of that name,)`` when torchrl is importable, else ``()``.

    torchrl's replay buffers accept only instances of its own ``Sampler`` (and branch on
    ``PrioritizedSampler`` and friends), so each sampler class lists its torchrl twin as its
    *last* base, as ``torchrl_compat.storages`` does: the twin only answers those
    ``isinstance`` checks, every attribute resolves to our code (a test checks it).
    ``TORCHRL_COMPAT_STANDALONE=1`` drops the twins.
    """
    if os.environ.get("TORCHRL_COMPAT_STANDALONE", "0") == "1":
        return ()
    try:
        from torchrl.data.replay_buffers import samplers as _torchrl_samplers
    except Exception:  # torchrl absent, or broken in this environment
        return ()
    twin = getattr(_torchrl_samplers, name, None)
    return (twin,) if isinstance(twin, type) else ()


def _replace_last(key, new_ending):
    """``key`` with its last element replaced (a string key is replaced whole)."""
    if isinstance(key, str):
        return new_ending
    return key[:-1] + (new_ending,)


__all__ = [
    "Storage",
    "StorageEnsemble",
    "TensorStorage",
    "_auto_device",
    "_is_int",
    "_replace_last",
    "_torchrl_twin",
    "logger",
    "unravel_index",
]
