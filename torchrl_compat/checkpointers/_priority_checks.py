"""Checks of what a prioritized sampler's checkpoint holds, alone and against its buffer.

A prioritized sampler keeps each item's priority twice, in its sum tree and in its min tree
(``sumtree.memmap`` and ``mintree.memmap``, float64, torchrl 0.11's layout). An item never
written has 0 in the sum tree and the min tree's identity (the largest value of the trees'
dtype, or ``inf``). A checkpoint whose two files disagree, or whose smallest priority is 0
once stored in the trees' dtype, loads into a sampler whose every ``sample`` fails ("non-
positive p_min") or draws by priorities that are not the item's. These checks refuse it at
``loads`` instead, naming the file, the leaf and its value; they are vectorised over blocks
of leaves (O(capacity) once per ``loads``, temporaries the size of a block).

Within a buffer checkpoint the parts must also agree with each other: the writer's cursor
lies within the storage's capacity and, while the storage is not full, at its length (the
round-robin writer fills rows ``0, 1, ...`` in order); the sampler holds no priority past the
storage's length.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from torchrl_compat.checkpointers._checks import MetadataError

__all__ = [
    "check_cursor_fits_length",
    "check_max_priority_index",
    "check_no_priority_past",
    "check_priority_leaves",
]

SUM_TREE_FILE, MIN_TREE_FILE = "sumtree.memmap", "mintree.memmap"


def _empty_leaves(sum_leaves: np.ndarray, min_leaves: np.ndarray, tree_dtype: torch.dtype) -> np.ndarray:
    """Where the leaves hold no item: 0 in the sum tree, the identity in the min tree."""
    largest = torch.finfo(tree_dtype).max
    return (sum_leaves == 0) & (min_leaves >= largest)


def check_priority_leaves(path, sum_leaves: np.ndarray, min_leaves: np.ndarray, tree_dtype: torch.dtype,
                          *, start: int = 0) -> None:
    """Checks that the leaves read from ``path``'s two tree files describe the same items
    with priorities the ``tree_dtype`` trees can draw from (> 0 once stored).

    Args:
        path (Path): the sampler's checkpoint directory (named in the errors).
        sum_leaves (np.ndarray): the float64 leaves of ``sumtree.memmap``, already checked
            finite and >= 0.
        min_leaves (np.ndarray): those of ``mintree.memmap``, already checked >= 0.
        tree_dtype (torch.dtype): the dtype of the trees they will be stored in.

    Keyword Args:
        start (int, optional): the leaf the arrays start at (a block of the files). Defaults to 0.

    Raises:
        MetadataError: naming the file, the leaf and its value.
    """
    path = Path(path)
    empty = _empty_leaves(sum_leaves, min_leaves, tree_dtype)
    mismatch = ~empty & (sum_leaves != min_leaves)
    if mismatch.any():
        pos = int(np.argmax(mismatch))
        leaf = start + pos
        raise MetadataError(
            f"{path / MIN_TREE_FILE}: leaf {leaf} holds {float(min_leaves[pos])!r}, but leaf {leaf} of "
            f"{path / SUM_TREE_FILE} holds {float(sum_leaves[pos])!r}: an item's priority is the same in "
            "both trees (an empty leaf holds 0 in the sum tree and no priority in the min tree)"
        )
    stored = min_leaves.astype(torch.empty((), dtype=tree_dtype).numpy().dtype)
    unusable = ~empty & ~(stored > 0)
    if unusable.any():
        pos = int(np.argmax(unusable))
        raise MetadataError(
            f"{path / MIN_TREE_FILE}: leaf {start + pos} holds the priority {float(min_leaves[pos])!r}, which "
            f"is 0 in the sampler's {tree_dtype} trees: every sample would fail (non-positive p_min)"
        )


def check_max_priority_index(file, index, max_capacity: int) -> None:
    """Checks that the index of ``_max_priority`` (``None`` or a number) is a leaf of the trees."""
    if index is not None and not (float(index).is_integer() and 0 <= index < max_capacity):
        raise MetadataError(
            f"{file}: _max_priority[1]={index!r} is not the index of an item: expected an integer "
            f"in [0, {max_capacity}) (max_capacity={max_capacity})"
        )


def check_no_priority_past(path, sum_leaves: np.ndarray, min_leaves: np.ndarray, tree_dtype: torch.dtype,
                           length: int, storage_file, *, start: int = 0) -> None:
    """Checks that no leaf from ``length`` on (the storage's length, read from
    ``storage_file``) holds a priority; the arrays hold the leaves from ``start`` on."""
    skip = min(max(length - start, 0), len(sum_leaves))
    held = ~_empty_leaves(sum_leaves[skip:], min_leaves[skip:], tree_dtype)
    if held.any():
        pos = skip + int(np.argmax(held))
        raise MetadataError(
            f"{Path(path) / SUM_TREE_FILE}: leaf {start + pos} holds the priority {float(sum_leaves[pos])!r}, past "
            f"the storage's length {length} ({storage_file}): the sampler and the storage are not "
            "from the same buffer"
        )


def check_cursor_fits_length(writer_file, cursor: int, length: int, rows, storage_file) -> None:
    """Checks a round-robin writer's ``cursor`` (along the first dimension) against a storage
    holding ``length`` items in data of shape ``rows`` (its first ``ndim`` dimensions)."""
    capacity = int(rows[0]) if len(rows) else 0
    per_row = math.prod(int(n) for n in rows[1:]) or 1
    filled = -(length // -per_row)
    if cursor >= max(capacity, 1):
        raise MetadataError(
            f"{writer_file}: cursor={cursor} is past the storage's capacity: the storage "
            f"({storage_file}) has {capacity} rows, so the cursor is in [0, {capacity})"
        )
    if filled < capacity and cursor != filled:
        raise MetadataError(
            f"{writer_file}: cursor={cursor}, but the storage ({storage_file}) holds {length} items "
            f"({filled} of its {capacity} rows): until it is full, the storage is written up to the "
            "cursor, which is then at its length"
        )
