"""Reading the files of a storage checkpoint, and checking them before anything is loaded.

``loads`` checks a checkpoint completely before it changes the storage: a missing directory
or file raises :class:`FileNotFoundError`, an unreadable json file, a truncated memory-mapped
file or content that does not fit the storage raises :class:`ValueError`. Each message names
the file and what is wrong with it.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from torchrl_compat.checkpointers._publish import partial_siblings
from torchrl_compat.utils import _str2dtype

__all__ = [
    "StorageCheckpoint",
    "TENSORDICT_METADATA_FILE",
    "check_memmap_file",
    "check_tensordict_layout",
    "format_keys",
    "leaf_specs",
    "missing_checkpoint_error",
    "read_json",
]

# the metadata file ``TensorDict.memmap`` writes in each directory
TENSORDICT_METADATA_FILE = "meta.json"


class StorageCheckpoint:
    """A storage checkpoint read and checked, not loaded yet: calling it loads it.

    Args:
        load (callable): loads what was read into the storage.

    Keyword Args:
        length (int): the storage length it holds.
        rows (torch.Size or None): the shape of its data along the storage's ``ndim`` first
            dimensions (``None`` if it holds no tensor).
        file (Path): its metadata file, named in the errors about it.
    """

    __slots__ = ("_load", "length", "rows", "file")

    def __init__(self, load, *, length: int, rows, file):
        self._load, self.length, self.rows, self.file = load, length, rows, file

    def __call__(self) -> None:
        self._load()


def missing_checkpoint_error(path: Path, what: str) -> FileNotFoundError:
    """The error for a checkpoint that is not there; it names the partial directory an
    interrupted dump left beside it, if any."""
    msg = f"No storage checkpoint found at {path}: {what}."
    partial = partial_siblings(path)
    if partial:
        msg += (
            f" An interrupted dumps left the incomplete directory {partial[-1]}, "
            "which is not loaded."
        )
    return FileNotFoundError(msg)


def read_json(file: Path, what: str = "checkpoint file"):
    """The content of json ``file``; ``what`` names it in the errors."""
    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"The {what} {file} does not exist.")
    try:
        with open(file) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"The {what} {file} is truncated or corrupted and cannot be parsed as json: {err}."
        ) from None


# -----------------------------------------------------------------------------
# Checks of a memory-mapped layout
# -----------------------------------------------------------------------------
def check_memmap_file(file: Path, shape, dtype: torch.dtype, meta_file) -> None:
    """Checks that ``file`` exists with the byte size that ``meta_file`` gives it."""
    numel = math.prod(int(s) for s in shape)
    expected = numel * dtype.itemsize
    if expected == 0:
        return
    if not file.is_file():
        raise FileNotFoundError(
            f"The memory-mapped file {file} listed in {meta_file} does not exist."
        )
    actual = file.stat().st_size
    if actual < expected:
        raise ValueError(
            f"The memory-mapped file {file} is truncated: it has {actual} bytes, expected "
            f"{expected} for shape {list(shape)} and dtype {dtype} (from {meta_file})."
        )
    if actual > expected:
        raise ValueError(
            f"The memory-mapped file {file} does not match its metadata: it has {actual} bytes, "
            f"expected {expected} for shape {list(shape)} and dtype {dtype} (from {meta_file})."
        )


def check_tensordict_layout(path: Path) -> None:
    """Checks a ``TensorDict.memmap`` directory: every ``meta.json`` parses and every listed
    tensor file exists with the byte size its shape and dtype require."""
    meta_file = path / TENSORDICT_METADATA_FILE
    meta = read_json(meta_file, "tensordict metadata file")
    if not isinstance(meta, dict):
        raise ValueError(f"The tensordict metadata file {meta_file} does not hold a json object.")
    if meta.get("_is_non_tensor"):
        return
    for key, entry in meta.items():
        if not isinstance(entry, dict):
            continue
        if "type" in entry:
            sub = path / key
            if not (sub / TENSORDICT_METADATA_FILE).is_file():
                raise FileNotFoundError(
                    f"The entry {key!r} listed in {meta_file} has no metadata file "
                    f"{sub / TENSORDICT_METADATA_FILE}."
                )
            check_tensordict_layout(sub)
        elif "shape" in entry and "dtype" in entry:
            file = path / f"{key}.memmap"
            if entry.get("is_nested"):
                if not file.is_file():
                    raise FileNotFoundError(
                        f"The memory-mapped file {file} listed in {meta_file} does not exist."
                    )
                continue
            check_memmap_file(file, entry["shape"], _str2dtype(entry["dtype"], meta_file), meta_file)
    # tensorclasses and lazy stacks keep their content in sub-directories listed implicitly.
    if "_tensordict" in os.listdir(path) and (path / "_tensordict").is_dir():
        check_tensordict_layout(path / "_tensordict")
    if "stack_dim" in meta:
        index = 0
        while (path / str(index)).is_dir():
            check_tensordict_layout(path / str(index))
            index += 1


def leaf_specs(data):
    """Maps each leaf key of a tensor collection to ``(shape, dtype)``."""
    return {
        key: (tuple(value.shape), value.dtype)
        for key, value in data.items(include_nested=True, leaves_only=True)
        if isinstance(value, torch.Tensor)
    }


def format_keys(keys) -> str:
    """``keys`` sorted and printed as a list."""
    return "[" + ", ".join(repr(k) for k in sorted(keys, key=str)) + "]"
