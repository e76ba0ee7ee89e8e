"""Sampler checkpoints on disk: published whole, read back checked.

The files are torchrl 0.11's (``PrioritizedSampler``: ``sumtree.memmap``, ``mintree.memmap``
and ``sampler_metadata.json``; ``SamplerWithoutReplacement``: its state dict saved by
``TensorDict.memmap``), so a checkpoint written by one library loads in the other. Two things
differ from torchrl, on purpose:

- a checkpoint is written into a sibling directory, then published at its path in one rename
  (an atomic exchange when a previous checkpoint is there): a ``dumps`` killed at any moment
  leaves the previous checkpoint or the new one, whole, never a mix;
- ``loads`` reads every file read-only and checks all of it (present, of the right size, of
  the right types, with storable values) before the sampler changes; each error names the
  file and what is wrong with it.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
import sys
import uuid
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "MetadataError",
    "publish_directory",
    "read_float64_leaves",
    "read_json_object",
    "read_memmapped_state",
    "real_number",
]

_PARTIAL_TAG = ".partial-"


class MetadataError(ValueError):
    """A checkpoint file that exists but cannot be what it should be."""


# ---------------------------------------------------------------------------------- writing


def _exchange(a: Path, b: Path) -> bool:
    """Swaps two directories in one step (Linux ``renameat2(RENAME_EXCHANGE)``); ``False``
    where the system or the file system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a libc without it (glibc < 2.28, musl)
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    errno = ctypes.get_errno()
    if errno in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not supported here
        return False
    raise OSError(errno, os.strerror(errno), str(b))


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _remove_stale_partials(path: Path) -> None:
    """Removes the sibling directories that interrupted ``dumps`` of this path left (those of
    processes that are gone; a live one may still be writing its own)."""
    prefix = f".{path.name}{_PARTIAL_TAG}"
    try:
        siblings = [p for p in path.parent.iterdir() if p.name.startswith(prefix)]
    except FileNotFoundError:
        return
    for sibling in siblings:
        pid = sibling.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _is_alive(int(pid)):
            shutil.rmtree(sibling, ignore_errors=True)


def publish_directory(path, write) -> None:
    """Runs ``write(directory)`` into a fresh sibling directory, then publishes it at ``path``.

    A new ``path`` is one rename. Over a previous checkpoint, the two directories are exchanged
    in one step and the previous one is then removed; where the file system cannot exchange,
    the previous checkpoint is renamed aside first (a kill between the two renames then leaves
    it beside ``path``, as ``.<name>.partial-...``). Leftovers of interrupted calls are
    removed by the next one.
    """
    path = Path(path).absolute()
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"Cannot write a sampler checkpoint at {path}: it is not a directory.")
    if not path.parent.is_dir():
        raise FileNotFoundError(
            f"Cannot write a sampler checkpoint at {path}: the parent directory {path.parent} does not exist."
        )
    _remove_stale_partials(path)
    tmp = path.parent / f".{path.name}{_PARTIAL_TAG}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    os.mkdir(tmp)
    try:
        write(tmp)
        if not path.exists():
            os.rename(tmp, path)
            return
        if not _exchange(tmp, path):
            aside = tmp.parent / f"{tmp.name}-previous"
            os.rename(path, aside)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(aside, path)
                raise
            os.rename(aside, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)  # the previous checkpoint


# ---------------------------------------------------------------------------------- reading


def _missing(file: Path, what: str) -> FileNotFoundError:
    return FileNotFoundError(f"{file}: {what} (no sampler checkpoint there, or an incomplete one)")


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
    try:
        size = os.path.getsize(file)
    except FileNotFoundError:
        raise _missing(file, "the file is missing") from None
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


# The dtypes a tensordict memmap names in its meta.json, for the entries read back here.
_TORCH_DTYPES = {
    f"torch.{name}": getattr(torch, name)
    for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")
}


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
    dtype = _TORCH_DTYPES.get(entry.get("dtype"))
    shape = entry.get("shape")
    if dtype is None or not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise MetadataError(f"{meta}: the entry of {key!r} is not a tensor description: {entry!r}")
    file = path / f"{key}.memmap"
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = math.prod(shape)
    try:
        size = os.path.getsize(file)
    except FileNotFoundError:
        raise _missing(file, "the file is missing") from None
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
