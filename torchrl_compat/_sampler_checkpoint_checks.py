"""Sampler checkpoints read back, checked before the sampler changes.

The files are torchrl 0.11's (``PrioritizedSampler``: ``sumtree.memmap``, ``mintree.memmap``
and ``sampler_metadata.json``; ``SamplerWithoutReplacement``: its state dict saved by
``TensorDict.memmap``), so a checkpoint written by one library loads in the other. Unlike
torchrl, ``loads`` reads every file read-only and checks all of it (present, of the right
size, of the right types, with storable values) before the sampler changes; each error
names the file and what is wrong with it. (``dumps`` publishes a checkpoint whole, see
:mod:`torchrl_compat._checkpoint_publish`.)
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch

from torchrl_compat.utils import _dtype_named

__all__ = [
    "MetadataError",
    "read_float64_leaves",
    "read_json_object",
    "read_memmapped_state",
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
    return FileNotFoundError(f"{file}: {what} (no sampler checkpoint there, or an incomplete one)")


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


def read_float64_leaves(file: Path, count: int, *, what: str) -> np.ndarray:
    """``count`` float64 values from ``file`` (read-only, the size checked first)."""
    size = _size_of(file)
    if size != 8 * count:
        raise MetadataError(f"{file}: holds {size} bytes, {what} needs {8 * count} ({count} float64)")
    return np.fromfile(file, dtype=np.float64, count=count)


def real_number(file: Path, key: str, value, *, allow_none: bool = False, at_least=None):
    """``value`` (an entry of ``file``) as a finite float, MetadataError naming it otherwise."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MetadataError(f"{file}: {key} must be a finite number, got {value!r}")
    if at_least is not None and value < at_least:
        raise MetadataError(f"{file}: {key} must be at least {at_least}, got {value!r}")
    return value


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
    file = path / f"{key}.memmap"
    itemsize = dtype.itemsize
    numel = math.prod(shape)
    size = _size_of(file)
    if size != numel * itemsize:
        raise MetadataError(f"{file}: holds {size} bytes, a {dtype} tensor of shape {shape} needs {numel * itemsize}")
    raw = np.fromfile(file, dtype=np.uint8, count=size)
    return torch.from_numpy(raw).view(dtype).reshape(shape).clone()


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
