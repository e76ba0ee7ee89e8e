"""What the buffers and writers take from torchrl, when it is installed.

Our buffers and writers run without torchrl. When it is importable (and the
``TORCHRL_COMPAT_STANDALONE`` environment variable is not ``"1"``), each class lists its
torchrl twin as its last base, as the storages and samplers do, and the buffers accept
torchrl's own storages, samplers and writers wherever they accept ours: the ``isinstance``
checks below take tuples holding both.
"""
from __future__ import annotations

import importlib
import os

from torchrl_compat import samplers as _samplers, storages as _storages

__all__ = [
    "PRIORITIZED_SAMPLERS",
    "SAMPLERS",
    "STORAGES",
    "TENSOR_STORAGES",
    "torchrl_module",
    "torchrl_twin",
]


def torchrl_module(name: str):
    """``torchrl.data.replay_buffers.<name>`` when torchrl is importable, else ``None``."""
    if os.environ.get("TORCHRL_COMPAT_STANDALONE", "0") == "1":
        return None
    try:
        return importlib.import_module(f"torchrl.data.replay_buffers.{name}")
    except Exception:  # torchrl absent, or broken in this environment
        return None


def torchrl_twin(module: str, name: str) -> tuple:
    """``(torchrl's class <name> of torchrl.data.replay_buffers.<module>,)``, or ``()``.

    The twin only answers ``isinstance`` checks made by torchrl's code: our classes define
    every method torchrl's do, so no torchrl code runs on them.
    """
    twin = getattr(torchrl_module(module), name, None)
    return (twin,) if isinstance(twin, type) else ()


def _ours_and_theirs(ours: type, module: str, name: str) -> tuple:
    theirs = torchrl_twin(module, name)
    if theirs and issubclass(ours, theirs[0]):
        return theirs  # ours derive from it: torchrl's class covers both
    return (ours, *theirs)


STORAGES = _ours_and_theirs(_storages.Storage, "storages", "Storage")
TENSOR_STORAGES = _ours_and_theirs(_storages.TensorStorage, "storages", "TensorStorage")
SAMPLERS = _ours_and_theirs(_samplers.Sampler, "samplers", "Sampler")
PRIORITIZED_SAMPLERS = _ours_and_theirs(
    _samplers.PrioritizedSampler, "samplers", "PrioritizedSampler"
)
