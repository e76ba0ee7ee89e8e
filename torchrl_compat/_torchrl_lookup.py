"""What the package takes from torchrl, when it is installed.

``torchrl_compat`` runs without torchrl. When torchrl is importable (and the
``TORCHRL_COMPAT_STANDALONE`` environment variable is not ``"1"``):

- each public class lists its torchrl twin (the class of the same name in the torchrl module
  it mirrors) as its *last* base, after all of ours. torchrl's code tests objects with
  ``isinstance`` against its own classes; ours define every method torchrl's do, so the twin
  only answers those checks and no torchrl code runs on our objects;
- the buffers accept torchrl's own storages, samplers and writers wherever they accept ours
  (:func:`accepted_classes`), and the fast paths that recognise a plain tensor storage
  recognise torchrl's too (:func:`with_torchrl_namesakes`).
"""
from __future__ import annotations

import importlib
import os

__all__ = ["accepted_classes", "torchrl_module", "torchrl_twin", "with_torchrl_namesakes"]


def torchrl_module(name: str):
    """``torchrl.data.replay_buffers.<name>`` when torchrl is importable, else ``None`` (also
    when ``TORCHRL_COMPAT_STANDALONE`` is ``"1"``)."""
    if os.environ.get("TORCHRL_COMPAT_STANDALONE", "0") == "1":
        return None
    try:
        return importlib.import_module(f"torchrl.data.replay_buffers.{name}")
    except Exception:  # torchrl absent, or broken in this environment
        return None


def torchrl_twin(module: str, name: str) -> tuple:
    """``(torchrl's class <name> of torchrl.data.replay_buffers.<module>,)``, or ``()``: the
    bases to list last in a class definition (``class X(Ours, *torchrl_twin(...))``)."""
    twin = getattr(torchrl_module(module), name, None)
    return (twin,) if isinstance(twin, type) else ()


def accepted_classes(ours: type, module: str) -> tuple:
    """The classes whose instances are taken where ``ours`` (a class of
    ``torchrl_compat.<module>``) is: ``ours``, and the class of that name torchrl's module
    exposes at the time of the call.

    Read at each call: while :func:`~torchrl_compat.install` is in force torchrl's module
    exposes ours, so objects of torchrl's own classes built earlier are refused, as
    torchrl's buffers would refuse them then (their ``isinstance`` checks name ours).
    """
    theirs = torchrl_twin(module, ours.__name__)
    if theirs and issubclass(ours, theirs[0]):
        return theirs  # ours derive from it: that class covers both
    return (ours, *theirs)


def with_torchrl_namesakes(*classes: type) -> list:
    """``classes`` (of ``torchrl_compat``'s modules) followed by the classes of the same
    names in the torchrl modules they mirror, those that exist."""
    found = list(classes)
    for cls in classes:
        theirs = getattr(torchrl_module(cls.__module__.rpartition(".")[2]), cls.__name__, None)
        if isinstance(theirs, type):
            found.append(theirs)
    return found
