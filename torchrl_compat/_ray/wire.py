"""What travels between a sharded buffer's client and its shards: a batch as flat numpy arrays.

Ray hands numpy arrays through its object store without copying them (the receiver reads the
sender's buffer, read-only), while a tensordict or a torch tensor is pickled object by object.
:func:`pack` turns a tensordict (or a tensor) into one tuple of arrays, one per leaf;
:func:`unpack` builds it back around the received arrays without copying; :func:`scatter`
assembles the shards' parts of a batch into fresh, writable arrays in draw order, the one copy
a sample makes on the client. Data of any other kind (lists, non-tensor leaves) travels as the
object itself.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

__all__ = ["concatenate", "copy", "from_arguments", "num_rows", "pack", "rows", "scatter", "to_arguments", "unpack"]

TD, TENSOR, OBJECT = "td", "tensor", "object"
# Ray passes an argument under 100 KiB inside the call itself and a larger one through its
# object store; the second path costs more than a round trip of its own for the batches a
# collector writes (1,000 rows of 64 floats: 2.4 ms against 1.1 ms as four inline pieces, on
# a 2-core machine). A batch up to INLINE_LIMIT bytes is cut into pieces under PIECE_BYTES.
PIECE_BYTES = 90 * 1024
INLINE_LIMIT = 4 * 1024 * 1024


def pack(data) -> tuple:
    """``(kind, keys, arrays, batch_size)`` of ``data``: a ``TensorDict`` or a tensor on CPU
    as numpy views of its leaves, anything else as ``(OBJECT, None, data, None)``."""
    if isinstance(data, torch.Tensor) and not data.requires_grad and data.dtype != torch.bfloat16:
        return (TENSOR, None, (data.detach().cpu().contiguous().numpy(),), tuple(data.shape[:1]))
    if type(data) is TensorDict:
        keys, arrays = [], []
        for key, value in data.items(include_nested=True, leaves_only=True):
            if type(value) is not torch.Tensor or value.dtype == torch.bfloat16:
                return (OBJECT, None, data, None)
            keys.append(key if isinstance(key, tuple) else (key,))
            arrays.append(value.detach().cpu().contiguous().numpy())
        return (TD, tuple(keys), tuple(arrays), tuple(data.batch_size))
    return (OBJECT, None, data, None)


def num_rows(packed: tuple) -> int:
    kind, _, arrays, batch_size = packed
    if kind == OBJECT:
        return len(arrays)
    return int(batch_size[0])


def rows(packed: tuple, start: int, stop: int) -> tuple:
    """Rows ``[start, stop)`` of a packed batch (views, nothing copied)."""
    kind, keys, arrays, batch_size = packed
    if kind == OBJECT:
        return (kind, keys, arrays[start:stop], None)
    return (kind, keys, tuple(array[start:stop] for array in arrays), (stop - start, *batch_size[1:]))


def copy(packed: tuple) -> tuple:
    """A packed batch of tensors in arrays of its own (what the caller's tensors become
    after the call does not change it)."""
    kind, keys, arrays, batch_size = packed
    if kind == OBJECT:
        raise TypeError("copy() takes a batch of tensors, not one of Python objects")
    return (kind, keys, tuple(np.array(array, copy=True) for array in arrays), batch_size)


def to_arguments(packed: tuple) -> tuple:
    """``(header, *pieces)``: the arrays of a packed batch cut along their rows into pieces
    Ray passes inline (see ``PIECE_BYTES``), for a call's positional arguments."""
    kind, keys, arrays, batch_size = packed
    if kind == OBJECT:
        return ((kind, keys, None, batch_size), arrays)
    total = sum(array.nbytes for array in arrays)
    layout, pieces = [], []
    for array in arrays:
        row_bytes = max(1, array[:1].nbytes)
        if total > INLINE_LIMIT or row_bytes > PIECE_BYTES or array.nbytes <= PIECE_BYTES:
            layout.append(1)
            pieces.append(array)
            continue
        step = PIECE_BYTES // row_bytes
        parts = [array[start:start + step] for start in range(0, len(array), step)]
        layout.append(len(parts))
        pieces.extend(parts)
    return ((kind, keys, tuple(layout), batch_size), *pieces)


def from_arguments(header: tuple, *pieces) -> tuple:
    """The packed batch :func:`to_arguments` cut (pieces joined with one copy)."""
    kind, keys, layout, batch_size = header
    if kind == OBJECT:
        return (kind, keys, pieces[0], batch_size)
    arrays, at = [], 0
    for count in layout:
        part = pieces[at:at + count]
        arrays.append(part[0] if count == 1 else np.concatenate(part))
        at += count
    return (kind, keys, tuple(arrays), batch_size)


def _tensor(array: np.ndarray) -> torch.Tensor:
    # Arrays received from Ray's object store are read-only views of it; the storages copy
    # them in, and nothing writes to them.
    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def unpack(packed: tuple):
    """The tensordict, tensor or object of a packed batch, around its arrays (no copy)."""
    kind, keys, arrays, batch_size = packed
    if kind == OBJECT:
        return arrays
    if kind == TENSOR:
        return _tensor(arrays[0])
    source: dict = {}
    for key, array in zip(keys, arrays):
        node = source
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = _tensor(array)
    return TensorDict(source, batch_size=batch_size)


def scatter(parts, positions, batch_size: int) -> tuple:
    """One packed batch of ``batch_size`` rows from the shards' packed ``parts``: row ``i`` of
    part ``k`` goes to row ``positions[k][i]``, into new (writable) arrays."""
    parts = [(part, where) for part, where in zip(parts, positions) if part is not None]
    first = parts[0][0]
    kind, keys = first[0], first[1]
    if kind == OBJECT:
        out = [None] * batch_size
        for part, where in parts:
            for row, value in zip(where.tolist(), part[2]):
                out[row] = value
        return (OBJECT, None, out, None)
    arrays = []
    for leaf, template in enumerate(first[2]):
        array = np.empty((batch_size, *template.shape[1:]), dtype=template.dtype)
        for part, where in parts:
            array[where] = part[2][leaf]
        arrays.append(array)
    return (kind, keys, tuple(arrays), (batch_size, *first[3][1:]))


def concatenate(parts) -> tuple:
    """The shards' packed parts one after the other, into new arrays."""
    parts = [part for part in parts if part is not None]
    first = parts[0]
    kind, keys = first[0], first[1]
    if kind == OBJECT:
        out = []
        for part in parts:
            out.extend(_as_list(part[2]))
        return (OBJECT, None, out, None)
    arrays = tuple(np.concatenate([part[2][leaf] for part in parts]) for leaf in range(len(first[2])))
    return (kind, keys, arrays, (len(arrays[0]) if arrays else 0, *first[3][1:]))


def _as_list(data):
    if isinstance(data, TensorDictBase) or isinstance(data, torch.Tensor):
        return list(data.unbind(0))
    return list(data)
