"""Checkpoints of samplers, writers and buffers read back, checked before anything changes.

The files are torchrl 0.11's (``PrioritizedSampler``: ``sumtree.memmap``, ``mintree.memmap``
and ``sampler_metadata.json``; ``SamplerWithoutReplacement``: its state dict saved by
``TensorDict.memmap``; a writer's ``metadata.json``; a buffer's ``rng_state/``,
``transform.t`` and ``buffer_metadata.json``), so a checkpoint written by one library loads
in the other. Unlike torchrl, ``loads`` reads every file read-only and checks all of it
(present, of the right size, of the right types, with storable values) before anything
changes; each error names the file and what is wrong with it. (``dumps`` publishes a
checkpoint whole, see :mod:`torchrl_compat.checkpointers._publish`.)

Components load in two steps, so that a checkpoint made of several (an ensemble's, a
buffer's) is checked whole before any part changes: ``_read_checkpoint(path)`` reads and
checks, changing nothing, and ``_apply_checkpoint(state)`` takes what was read
(:func:`read_for_loading`).
"""
from __future__ import annotations

import copy
import functools
import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from torchrl_compat.utils import _dtype_named

__all__ = [
    "MetadataError",
    "load_module_states",
    "read_checkpoint_state",
    "read_count",
    "check_float64_leaves_file",
    "read_float64_leaves",
    "read_for_loading",
    "read_json_object",
    "read_memmapped_state",
    "read_tensor_file",
    "read_torch_file",
    "real_number",
]


class MetadataError(ValueError):
    """A checkpoint file that exists but cannot be what it should be."""


# The dtypes a sampler's state is read back as (raw bytes viewed as the dtype named).
_READABLE_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
})


def _missing(file: Path, what: str) -> FileNotFoundError:
    return FileNotFoundError(f"{file}: {what} (no checkpoint there, or an incomplete one)")


def _size_of(file: Path) -> int:
    """The byte size of ``file``; FileNotFoundError naming it when it is missing."""
    try:
        return os.path.getsize(file)
    except FileNotFoundError:
        raise _missing(file, "the file is missing") from None


def read_json_object(file: Path) -> dict:
    """The JSON object in ``file``: FileNotFoundError when absent, MetadataError when the file
    does not hold one."""
    try:
        raw = Path(file).read_bytes()
    except FileNotFoundError:
        raise _missing(file, "the file is missing") from None
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise MetadataError(f"{file}: not a JSON file ({err})") from None
    if not isinstance(value, dict):
        raise MetadataError(f"{file}: expected a JSON object, got {type(value).__name__}")
    return value


def check_float64_leaves_file(file: Path, count: int, *, what: str) -> None:
    """Checks that ``file`` holds ``count`` float64 values (its size), naming ``what`` needs them."""
    size = _size_of(file)
    if size != 8 * count:
        raise MetadataError(f"{file}: holds {size} bytes, {what} needs {8 * count} ({count} float64)")


def read_float64_leaves(file: Path, stop: int, *, start: int = 0) -> np.ndarray:
    """The float64 values ``[start, stop)`` of ``file`` (read-only; its size checked by
    :func:`check_float64_leaves_file` first)."""
    return np.fromfile(file, dtype=np.float64, count=stop - start, offset=8 * start)


def real_number(file: Path, key: str, value, *, allow_none: bool = False, at_least=None):
    """``value`` (an entry of ``file``) as a finite float, MetadataError naming it otherwise."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MetadataError(f"{file}: {key} must be a finite number, got {value!r}")
    if at_least is not None and value < at_least:
        raise MetadataError(f"{file}: {key} must be at least {at_least}, got {value!r}")
    return value


def read_count(file: Path, key: str, value) -> int:
    """``value`` (entry ``key`` of ``file``) as an integer >= 0, MetadataError naming it
    otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MetadataError(f"{file}: {key} must be an integer >= 0, got {value!r}")
    return value


def read_tensor_file(file: Path, dtype: torch.dtype, shape) -> torch.Tensor:
    """The tensor of ``dtype`` and ``shape`` whose raw bytes ``file`` holds (a file of
    ``MemoryMappedTensor``), read without writing to it: the size is checked first. An empty
    tensor needs no file (``MemoryMappedTensor`` writes none for it)."""
    numel = math.prod(shape)
    if numel == 0 and not os.path.exists(file):
        return torch.empty(shape, dtype=dtype)
    size = _size_of(file)
    if size != numel * dtype.itemsize:
        raise MetadataError(
            f"{file}: holds {size} bytes, a {dtype} tensor of shape {list(shape)} needs {numel * dtype.itemsize}"
        )
    raw = np.fromfile(file, dtype=np.uint8, count=size)
    return torch.from_numpy(raw).view(dtype).reshape(shape).clone()


def _memmapped_entry(path: Path, key: str, entry):
    """One entry of a tensordict saved by ``TensorDict.memmap``: a tensor read from
    ``<key>.memmap``, or ``None`` for a non-tensor ``None``."""
    meta = path / "meta.json"
    if not isinstance(entry, dict):
        raise MetadataError(f"{meta}: the entry of {key!r} is not an object: {entry!r}")
    if entry.get("type") == "NonTensorData":
        inner = read_json_object(path / key / "meta.json")
        if inner.get("data", ...) is not None:
            raise MetadataError(f"{path / key / 'meta.json'}: expected None, got {inner.get('data', '(nothing)')!r}")
        return None
    dtype = _dtype_named(entry.get("dtype"))
    shape = entry.get("shape")
    if dtype not in _READABLE_DTYPES or not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise MetadataError(f"{meta}: the entry of {key!r} is not a tensor description: {entry!r}")
    return read_tensor_file(path / f"{key}.memmap", dtype, shape)


def read_memmapped_state(path: Path, keys) -> dict:
    """The entries ``keys`` of a state dict saved by ``TensorDict.memmap`` at ``path``, read
    read-only: ``TensorDict.load_memmap`` would extend a truncated file and skip a missing one."""
    path = Path(path)
    if not path.is_dir():
        raise _missing(path, "the directory is missing")
    meta = read_json_object(path / "meta.json")
    out = {}
    for key in keys:
        if key not in meta:
            raise MetadataError(f"{path / 'meta.json'}: no entry for {key!r}")
        out[key] = _memmapped_entry(path, key, meta[key])
    return out


def read_for_loading(component, path) -> Callable[[], None]:
    """Reads and checks the checkpoint of ``component`` (a storage, sampler or writer) at
    ``path`` without changing anything; returns the function that loads what was read.

    A component without the two steps (torchrl's own) is loaded, unchecked, only when the
    function is called.
    """
    read = getattr(component, "_read_checkpoint", None)
    if read is None:
        return functools.partial(component.loads, path)
    return functools.partial(component._apply_checkpoint, read(path))


def read_checkpoint_state(component, path):
    """Reads and checks the checkpoint of ``component`` at ``path`` without changing anything:
    ``(state, load)``, what was read (``None`` for a component without the two steps) and
    the function that loads it."""
    read = getattr(component, "_read_checkpoint", None)
    if read is None:
        return None, functools.partial(component.loads, path)
    state = read(path)
    return state, functools.partial(component._apply_checkpoint, state)


def read_torch_file(file: Path):
    """What ``torch.load`` reads from ``file``, with an error naming the file when it cannot."""
    try:
        return torch.load(file)
    except FileNotFoundError:
        raise _missing(file, "the file is missing") from None
    except Exception as err:
        raise MetadataError(f"{file}: torch.load cannot read it ({type(err).__name__}: {err})") from None


def load_module_states(loads) -> Callable[[], None]:
    """Runs ``module.load_state_dict(state)`` for each ``(module, state, file)`` of ``loads``,
    all or none; returns the function that puts the previous states back.

    ``load_state_dict`` copies the entries that fit before it raises for those that do not,
    so on failure every module loaded so far gets its previous state back, and the error
    names the ``file`` the refused state was read from.
    """
    previous = []

    def restore():
        for module, state in reversed(previous):
            module.load_state_dict(state)

    try:
        for module, state, file in loads:
            previous.append((module, copy.deepcopy(module.state_dict())))
            try:
                module.load_state_dict(state)
            except Exception as err:
                raise RuntimeError(f"{file}: the state it holds does not fit {type(module).__name__}: {err}") from None
    except BaseException:
        restore()
        raise
    return restore
