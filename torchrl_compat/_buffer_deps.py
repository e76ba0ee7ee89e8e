"""What the buffers and writers take from torchrl, when it is installed.

Our buffers and writers run without torchrl. When it is importable (and the
``TORCHRL_COMPAT_STANDALONE`` environment variable is not ``"1"``), each class lists its
torchrl twin as its last base, as the storages and samplers do, and the buffers accept
torchrl's own storages, samplers and writers wherever they accept ours (except while
:func:`~torchrl_compat.install` is in force, see :func:`accepted_classes`): the
``isinstance`` checks take tuples holding both.
"""
from __future__ import annotations

import importlib
import os

from torchrl_compat import samplers as _samplers

__all__ = [
    "PRIORITIZED_SAMPLERS",
    "accepted_classes",
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


def accepted_classes(ours: type, module: str) -> tuple:
    """The classes whose instances a buffer takes where it takes ``ours`` (a base class of
    ``torchrl_compat.<module>``): ``ours``, and the class of that name torchrl's module
    exposes at the time of the call.

    Read at each call: while :func:`~torchrl_compat.install` is in force torchrl's module
    exposes ours, so objects of torchrl's own classes built earlier are refused, as
    torchrl's buffers would refuse them then (their ``isinstance`` checks name ours).
    """
    theirs = torchrl_twin(module, ours.__name__)
    if theirs and issubclass(ours, theirs[0]):
        return theirs  # ours derive from it: that class covers both
    return (ours, *theirs)


PRIORITIZED_SAMPLERS = accepted_classes(_samplers.PrioritizedSampler, "samplers")
