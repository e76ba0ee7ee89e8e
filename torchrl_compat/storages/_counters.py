"""Counters a tensor storage shares with other processes: its length and its write count.

Each is an int64 ``multiprocessing.Value``, so that writes made in forked or spawned processes
are seen everywhere. The storage also keeps the Value's raw ctypes int64 and reads it without
the lock on its hot paths: an aligned 64-bit load is atomic. Every read-modify-write takes the
Value's lock. Compilable storages are never shared and keep 0-d int64 tensors instead,
updated in place: torch.compile cannot trace a ``multiprocessing.Value``, and it would guard
on a plain int's value and compile again each time it changed.
"""
from __future__ import annotations

import functools
import multiprocessing as mp

from torchrl_compat._compile import compile_disable, dynamo_active, is_compiling

__all__ = ["compile_disable", "is_compiling", "outside_graph", "restore_counter", "shared_counter"]

# int64: torchrl's mp.Value("i") silently wraps past 2**31 - 1 elements
_TYPECODE = "q"


def shared_counter(value: int, beside=None):
    """An int64 ``mp.Value`` holding ``value``.

    Args:
        value (int): the initial value.
        beside (mp.Value, optional): another counter of the same storage, whose lock the new
            one shares (one lock and one semaphore for both).
    """
    lock = beside.get_lock() if hasattr(beside, "get_lock") else True
    return mp.Value(_TYPECODE, value, lock=lock)


def restore_counter(state: dict, context_key: str, value_key: str, raw_key: str, beside=None):
    """Puts back in a storage's unpickled ``state`` a counter that plain pickling carried as a
    number (``context_key``): a shared counter, or a plain int for a compilable storage; and
    the raw ctypes int64 that the hot paths read (``raw_key``)."""
    value = state.pop(context_key, None)
    if value is not None:
        state[value_key] = value if state["_compilable"] else shared_counter(value, beside)
    shared = state.get(value_key)
    if shared is not None and hasattr(shared, "get_obj"):
        state[raw_key] = shared.get_obj()


def _never_a_root_frame(function) -> None:
    """Tells dynamo not to compile ``function`` as a frame of its own (where its caller runs
    eagerly, so that the wrapper's own dispatch applies) while still inlining it into the
    graphs of the compiled functions that call it."""
    try:
        from torch._dynamo.eval_frame import skip_code
    except ImportError:  # pragma: no cover - older torch: compiled as its own frame
        return
    skip_code(function.__code__)


def outside_graph(method):
    """Where a counter-updating ``method`` of a storage runs under torch.compile.

    A compilable storage's counters are tensors updated in place, which a graph traces
    without guarding on their values: while its caller is traced, the method is traced into
    the same graph (so that ``set`` compiles whole, ``fullgraph=True`` included, as
    torchrl 0.14's). Where dynamo runs the caller eagerly (after a graph break), the method
    runs dynamo-disabled rather than being compiled as a frame of its own. Shared counters
    cannot be traced at all: a shared storage's method runs dynamo-disabled while traced.
    Otherwise (plain eager code, or inside a buffer call kept out of the graph) the method is
    called directly: the disabled wrapper's frame switch costs a few microseconds.
    """
    disabled = compile_disable()(method)

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self._compilable:
            if is_compiling():
                # traced into the graph, as torchrl's compilable storages are
                return method(self, *args, **kwargs)
            if dynamo_active():
                return disabled(self, *args, **kwargs)
        elif is_compiling():
            return disabled(self, *args, **kwargs)
        return method(self, *args, **kwargs)

    _never_a_root_frame(wrapper)
    return wrapper
