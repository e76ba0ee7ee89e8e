"""Round-robin writes as row slices: the common case of a writer's ``extend``.

A round-robin writer fills the rows ``cursor, cursor + 1, ...`` modulo the capacity: one
contiguous range, or two when it wraps. torchrl hands that range to the storage as an
index tensor, and a tensordict storage then scatters the batch through ``index_put`` with
its generic key-by-key machinery (device moves, lock and key checks, about 70 us for a
batch of 1000 transitions of five keys). Here each leaf of the batch is copied into at
most two row slices of the matching storage tensor (about 2 us a leaf), and the storage
books the write as :meth:`~torchrl_compat.TensorStorage.set` would. When every leaf and
its storage tensor are contiguous CPU tensors of one dtype and row shape (the common case),
``replay.copy_rows`` copies all of them in one call, one or two ``memcpy`` a leaf; otherwise
CPU leaves are written through cached numpy views of the storage's tensors, which copy rows
into a large array in about half the time torch's ``copy_`` takes.

A lazy storage not initialized yet is created from the batch and filled by its
``_first_write`` (see :mod:`~torchrl_compat.storages._first_write`), when it takes the batch.

Only the plain case takes this path: one of our 1-D tensor storages whose
``set`` is not overridden, and a batch (a tensor, or a :class:`~tensordict.TensorDict`
of tensors with the storage's keys at every level) whose leaves have the dtype and
device of the stored ones; ``copy_`` into the row slice then broadcasts, and raises, as
the indexed assignment of ``storage.set`` does. Anything else is left to
``storage.set``, which then sees exactly what torchrl's writer would pass it.
"""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

import replay

from torchrl_compat.storages._rows import array_of
from torchrl_compat.storages import TensorStorage

try:
    from torch.compiler import is_compiling
except ImportError:  # pragma: no cover - torch < 2.3
    from torch._dynamo import is_compiling

__all__ = ["shallow_copy", "write_rows"]

_PLAIN_SET = TensorStorage.set


def write_rows(
    storage, start: int, index: torch.Tensor, data, arrays: dict | None = None, extra: dict | None = None,
    check=None,
) -> bool:
    """Writes the batch ``data`` at rows ``start, start + 1, ...`` (wrapping once) of ``storage``.

    Args:
        storage (Storage): the storage to write to.
        start (int): the first row, in ``[0, capacity)``.
        index (torch.Tensor): the rows written, ``(start + arange(len(data))) % capacity``;
            booked as the storage's ``_last_cursor``, as ``storage.set(index, data)`` does.
        data (torch.Tensor or TensorDict): a batch of at most ``capacity`` items.
        arrays (dict, optional): numpy views of the storage's leaves already made (see
            :func:`~torchrl_compat.storages._rows.array_of`), filled in as leaves are met.
        extra (dict, optional): top-level entries written as if ``data`` held them too
            (a tensordict's ``"index"``, left out of the caller's data).
        check (callable, optional): called before leaves are copied one by one (a copy that
            can stop part-way, on a leaf whose shape does not broadcast): it raises to refuse
            the batch while nothing is written. ``replay.copy_rows`` checks every leaf
            itself before it copies any.

    Returns:
        ``True`` once written; ``False``, having written nothing, when the storage or the
        data is not of the kind handled here.
    """
    if type(storage).set is not _PLAIN_SET or storage.ndim != 1 or is_compiling():
        return False
    if not storage.initialized:
        return _first_write(storage, start, index, data, extra)
    dest = storage._storage
    if type(dest) is TensorDict and type(data) is TensorDict:
        pairs = []
        if not _match_leaves(dest, data, pairs, extra):
            return False
    elif extra is None and _fits(dest, data):
        pairs = ((dest, data),)
    else:
        return False
    numel = index.shape[0]
    capacity = dest.shape[0]
    if numel > capacity or not 0 <= start < capacity:
        return False
    if replay.copy_rows([leaf for leaf, _ in pairs], [value for _, value in pairs], start, numel):
        # every leaf a contiguous CPU tensor of its row shape: copied byte for byte
        storage._note_rows_written(index, numel, first_row=start)
        return True
    if check is not None:
        check()
    copies = [_as_arrays(leaf, value, {} if arrays is None else arrays) for leaf, value in pairs]
    # every leaf holds numel rows (a tensordict's leaves start with its batch size)
    first = min(numel, capacity - start)
    try:
        if first == numel:
            # the same values, broadcasts and errors as storage[index] = data
            stop = start + numel
            for leaf, value in copies:
                _copy(leaf, start, stop, value)
        else:
            rest = numel - first
            for leaf, value in copies:
                _copy(leaf, start, capacity, value[:first])
                _copy(leaf, 0, rest, value[first:])
    except BaseException:
        storage._note_rows_written(index, numel, complete=False)
        raise
    storage._note_rows_written(index, numel, first_row=start)
    return True


def _first_write(storage, start: int, index: torch.Tensor, data, extra: dict | None) -> bool:
    """The write into a lazy storage not initialized yet: created from the batch and filled
    by the storage itself (see :mod:`~torchrl_compat.storages._first_write`)."""
    first_write = getattr(storage, "_first_write", None)
    numel = index.shape[0]
    if first_write is None or not 0 <= start < storage.max_size or numel > storage.max_size:
        return False
    try:
        if not first_write(data, extra, start, numel):
            return False
    except BaseException:
        if storage.initialized:
            storage._note_rows_written(index, numel, complete=False)
        raise
    storage._note_rows_written(index, numel, first_row=start)
    return True


def _as_arrays(leaf: torch.Tensor, value: torch.Tensor, arrays: dict) -> tuple:
    """``(leaf, value)`` as numpy arrays when both are CPU tensors of one numpy dtype and
    the same trailing shape (numpy writes rows into a large array in about half torch's
    time: the copy waits on memory); as they are otherwise (torch then broadcasts)."""
    if value.is_cpu and value.shape[1:] == leaf.shape[1:]:
        array = array_of(leaf, arrays)
        if array is not None:
            try:
                return array, value.numpy()
            except (TypeError, RuntimeError):  # grad, conjugate or negative views
                pass
    return leaf, value


def _copy(leaf, start: int, stop: int, value) -> None:
    if type(leaf) is np.ndarray:
        leaf[start:stop] = value
    else:
        leaf[start:stop].copy_(value)


def _match_leaves(dest: TensorDict, data: TensorDict, pairs: list, extra: dict | None = None) -> bool:
    """Pairs each tensor of ``data`` (and of ``extra``, entries at its top level) with
    ``dest``'s tensor at the same key (into ``pairs``).

    ``False`` unless both hold the same keys at every level, the nested levels are plain
    tensordicts with matching trailing batch dimensions, and every leaf of ``data``
    passes :func:`_fits`.
    """
    if data._batch_size[1:] != dest._batch_size[1:] or len(data._batch_size) != len(dest._batch_size):
        return False
    stored = dest._tensordict
    given = data._tensordict if extra is None else {**data._tensordict, **extra}
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


def shallow_copy(tensordict: TensorDict) -> TensorDict:
    """``tensordict.clone(recurse=False)`` for a plain tensordict, without the generic
    machinery: new (unlocked) tensordicts at every level, holding the same leaves."""
    entries = {
        key: shallow_copy(value) if type(value) is TensorDict else value
        for key, value in tensordict._tensordict.items()
    }
    return TensorDict._new_unsafe(
        entries,
        batch_size=tensordict._batch_size,
        device=tensordict._device,
        names=tensordict._td_dim_names,
        nested=False,
    )
