"""Round-robin writes as row slices: the common case of a writer's ``extend``.

A round-robin writer fills the rows ``cursor, cursor + 1, ...`` modulo the capacity: one
contiguous range, or two when it wraps. torchrl hands that range to the storage as an
index tensor, and a tensordict storage then scatters the batch through ``index_put`` with
its generic key-by-key machinery (device moves, lock and key checks, about 70 us for a
batch of 1000 transitions of five keys). Here each leaf of the batch is copied into at
most two row slices of the matching storage tensor (about 2 us a leaf), and the storage
books the write as :meth:`~torchrl_compat.TensorStorage.set` would.

Only the plain case takes this path: one of our initialized 1-D tensor storages whose
``set`` is not overridden, and a batch (a tensor, or a :class:`~tensordict.TensorDict`
of tensors with the storage's keys at every level) whose leaves have the dtype and
device of the stored ones; ``copy_`` into the row slice then broadcasts, and raises, as
the indexed assignment of ``storage.set`` does. Anything else is left to
``storage.set``, which then sees exactly what torchrl's writer would pass it.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict

from torchrl_compat.storages import TensorStorage

try:
    from torch.compiler import is_compiling
except ImportError:  # pragma: no cover - torch < 2.3
    from torch._dynamo import is_compiling

__all__ = ["write_rows"]

_PLAIN_SET = TensorStorage.set


def write_rows(storage, start: int, index: torch.Tensor, data) -> bool:
    """Writes the batch ``data`` at rows ``start, start + 1, ...`` (wrapping once) of ``storage``.

    Args:
        storage (Storage): the storage to write to.
        start (int): the first row, in ``[0, capacity)``.
        index (torch.Tensor): the rows written, ``(start + arange(len(data))) % capacity``;
            booked as the storage's ``_last_cursor``, as ``storage.set(index, data)`` does.
        data (torch.Tensor or TensorDict): a batch of at most ``capacity`` items.

    Returns:
        ``True`` once written; ``False``, having written nothing, when the storage or the
        data is not of the kind handled here.
    """
    if (
        type(storage).set is not _PLAIN_SET
        or not storage.initialized
        or storage.ndim != 1
        or is_compiling()
    ):
        return False
    dest = storage._storage
    if type(dest) is TensorDict and type(data) is TensorDict:
        pairs = []
        if not _match_leaves(dest, data, pairs):
            return False
    elif _fits(dest, data):
        pairs = ((dest, data),)
    else:
        return False
    numel = index.shape[0]
    capacity = dest.shape[0]
    if numel > capacity or not 0 <= start < capacity:
        return False
    # every leaf holds numel rows (a tensordict's leaves start with its batch size)
    first = min(numel, capacity - start)
    try:
        if first == numel:
            # the same values, casts, broadcasts and errors as storage[index] = data
            stop = start + numel
            for leaf, value in pairs:
                leaf[start:stop].copy_(value)
        else:
            rest = numel - first
            for leaf, value in pairs:
                leaf[start:].copy_(value[:first])
                leaf[:rest].copy_(value[first:])
    except BaseException:
        storage._note_rows_written(index, numel, complete=False)
        raise
    storage._note_rows_written(index, numel)
    return True


def _match_leaves(dest: TensorDict, data: TensorDict, pairs: list) -> bool:
    """Pairs each tensor of ``data`` with ``dest``'s tensor at the same key (into ``pairs``).

    ``False`` unless both hold the same keys at every level, the nested levels are plain
    tensordicts with matching trailing batch dimensions, and every leaf of ``data``
    passes :func:`_fits`.
    """
    if data._batch_size[1:] != dest._batch_size[1:] or len(data._batch_size) != len(dest._batch_size):
        return False
    stored = dest._tensordict
    given = data._tensordict
    if stored.keys() != given.keys():
        return False
    for key, value in given.items():
        leaf = stored[key]
        if type(value) is TensorDict:
            if type(leaf) is not TensorDict or not _match_leaves(leaf, value, pairs):
                return False
        elif _fits(leaf, value):
            pairs.append((leaf, value))
        else:
            return False
    return True


def _fits(leaf, value) -> bool:
    """Whether the plain tensor ``value`` copies into ``leaf``'s rows as ``storage.set``'s
    indexed assignment would write them: same dtype (that assignment does not cast) and
    device; ``copy_`` broadcasts, and raises on mismatched shapes, as it does."""
    return (
        type(value) is torch.Tensor
        and isinstance(leaf, torch.Tensor)
        and value.dtype is leaf.dtype
        and value.device == leaf.device
    )
