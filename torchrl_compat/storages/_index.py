"""Checking an index against the filled part of a storage, with errors that name it.

torchrl reads a partially filled tensor storage by slicing the filled rows first, then
indexing the slice, and lets torch raise a bare "index out of bounds" for a bad index. Here
the index is checked against the filled length and mapped onto the whole buffer, so that the
read indexes the buffer once, and an error names the index, its position and the length.
"""
from __future__ import annotations

import numpy as np
import torch

from torchrl_compat.storages._counters import compile_disable
from torchrl_compat.utils import INT_CLASSES

__all__ = ["filled_index", "index_error"]

_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def index_error(index, position, length) -> IndexError:
    """``IndexError("index 12 at position 3 is out of range for a storage of length 10")``."""
    where = "" if position is None else f" at position {position}"
    return IndexError(f"index {index}{where} is out of range for a storage of length {length}")


# Kept out of torch.compile's graph even where dynamo runs the caller eagerly: traced, the
# check reads the index values and guards on the length (a recompile per write).
@compile_disable()
def filled_index(index, length: int):
    """Maps ``index`` on the filled part (``length`` items along dim 0) to the full buffer.

    Args:
        index: an index along the first dimension (int, slice, list, range, array, tensor, or
            a tuple whose first entry is one of those).
        length (int): the number of filled items along the first dimension.

    Returns:
        the index to apply to the whole buffer, or ``None`` when the index kind is not handled
        here (masks, ellipsis, indices on an accelerator...): the caller then slices the
        storage first, as torchrl does.

    Raises:
        IndexError: for an index outside ``[-length, length)``, naming it and its position.
    """
    return _filled_index(index, length)


def _filled_index(index, length: int):
    if isinstance(index, INT_CLASSES) and not isinstance(index, bool):
        if index < 0:
            if index < -length:
                raise index_error(index, None, length)
            return index + length
        if index >= length:
            raise index_error(index, None, length)
        return index
    if isinstance(index, slice):
        if index.step is not None and index.step <= 0:
            return None
        return slice(*index.indices(length))
    if isinstance(index, tuple):
        if not index:
            return None
        first = _filled_index(index[0], length)
        if first is None:
            return None
        return (first, *index[1:])
    if isinstance(index, (list, range, np.ndarray)):
        if isinstance(index, np.ndarray) and index.dtype.kind not in "iu":
            return None
        try:
            index = torch.as_tensor(index)
        except Exception:
            return None
        if index.dtype not in _INDEX_DTYPES:
            return None
    if isinstance(index, torch.Tensor):
        if index.device.type != "cpu" or index.dtype not in _INDEX_DTYPES:
            # keep accelerator indices on their device: checking them would sync
            return None
        if index.ndim == 0:
            return _filled_index(int(index), length)
        if not index.numel():
            return index
        if index.dtype == torch.uint8:
            return None  # legacy mask semantics
        lo, hi = torch.aminmax(index)
        lo = int(lo)
        if lo < -length or int(hi) >= length:
            flat = index.reshape(-1)
            bad = int(((flat < -length) | (flat >= length)).nonzero()[0])
            raise index_error(int(flat[bad]), bad, length)
        if lo < 0:
            index = torch.where(index < 0, index + length, index)
        return index
    return None
