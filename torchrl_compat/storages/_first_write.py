"""The first write of a batch into a lazy tensor storage, leaf by leaf.

torchrl creates a lazy storage from the batch's first item (``data[0]``) with tensordict's
generic machinery at every level (``to``, ``expand`` and ``empty_like``; for memory maps
``clone``, ``to``, ``expand`` and ``memmap_like``), then scatters the batch into it with an
indexed assignment (``index_put`` on every leaf). For a batch of 400 items of 1.2 MB that
takes 0.8 ms in memory and 1.5 ms memory-mapped, where allocating the leaves and copying
the rows take 25 us (in memory) and 0.35 ms (memory-mapped: the pages of a new shared-memory
file are allocated and zeroed by the kernel as they are first written).

Here the storage's tensordicts are built directly, with the batch size, device, names and
flags the generic path gives them and their keys in its order; each leaf is allocated as
that path allocates it (``torch.empty_like`` of the leaf's first item expanded to the
capacity, or a ``MemoryMappedTensor`` made from it), and the batch's rows are then copied
leaf by leaf. Only plain batches take this path: a :class:`~tensordict.TensorDict` (nested
ones plain too, no dimension names) of plain tensors on the storage's device, not requiring
grad. Anything else is left to ``storage.set``, which does what torchrl does.
"""
from __future__ import annotations

import os

import torch
from tensordict import TensorDict
from tensordict.memmap import _FileHandler, MemoryMappedTensor

import replay

__all__ = ["plain_leaves", "build_storage", "write_leaf_rows"]


def plain_leaves(data: TensorDict, extra: dict | None, device: torch.device) -> list | None:
    """The tree of ``data`` (plus ``extra``, entries at its top level) as nested
    ``[(key, value)]`` lists, leaves as tensors and sub-tensordicts as ``(batch_size,
    entries)`` pairs; ``None`` unless every level is a plain :class:`~tensordict.TensorDict`
    without dimension names and every leaf a plain tensor on ``device`` not requiring grad."""
    if data._td_dim_names is not None or not data._batch_size:
        return None
    if extra is None:
        items = data._tensordict
    elif all(type(value) is torch.Tensor and value.shape == data._batch_size for value in extra.values()):
        items = {**data._tensordict, **extra}
    else:
        return None  # set() would expand the entry to the batch's dims first
    entries = []
    for key, value in items.items():
        kind = type(value)
        if kind is torch.Tensor:
            if value.device != device or value.requires_grad or value.is_nested:
                return None
            entries.append((key, value))
        elif kind is TensorDict:
            nested = plain_leaves(value, None, device)
            if nested is None:
                return None
            entries.append((key, (value._batch_size, nested)))
        else:
            return None
    return entries


def build_storage(entries: list, batch_size: torch.Size, capacity: int, device, make_leaf, pairs: list, *, memmap: bool = False) -> TensorDict:
    """The storage tensordict for the tree ``entries`` (see :func:`plain_leaves`) of a batch
    of ``batch_size``: ``capacity`` rows, leaves made by ``make_leaf(value, shape)``; each
    ``(storage leaf, batch leaf)`` pair is appended to ``pairs``. ``memmap=True`` gives the
    tensordicts the flags ``memmap_like`` leaves on them (memory-mapped, locked)."""
    built = {}
    for key, value in entries:
        if type(value) is tuple:
            nested_batch, nested = value
            built[key] = build_storage(nested, nested_batch, capacity, device, make_leaf, pairs, memmap=memmap)
        else:
            leaf = make_leaf(value, torch.Size((capacity, *value.shape[1:])))
            pairs.append((leaf, value))
            built[key] = leaf
    result = TensorDict._new_unsafe(
        built, batch_size=torch.Size((capacity, *batch_size[1:])), device=device, names=None, nested=False
    )
    if memmap:
        result._is_memmap = True
        result._is_shared = False
        result._is_locked = True
        result._memmap_prefix = None
    return result


def empty_leaf(value: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """What ``torch.empty_like`` of ``value``'s first item expanded to ``shape`` gives
    (the layout torchrl's lazy storage allocates)."""
    return torch.empty_like(value[0].expand(shape))


def memmap_leaf(existsok: bool):
    """A ``make_leaf`` for :func:`build_storage` giving anonymous memory maps, as
    ``memmap_like`` without a prefix makes them from the expanded first item."""

    def make(value: torch.Tensor, shape: torch.Size) -> MemoryMappedTensor:
        if value.dtype.is_complex or not shape.numel():
            # refused or failing there: the same error
            return MemoryMappedTensor.from_tensor(value[0].expand(shape), copy_data=False, existsok=existsok)
        return _anonymous_memmap(shape, value.dtype)

    return make


def _anonymous_memmap(shape: torch.Size, dtype: torch.dtype) -> MemoryMappedTensor:
    """``MemoryMappedTensor.from_tensor(t, copy_data=False)`` for a tensor ``t`` of ``shape``
    and ``dtype`` (not complex), without its checks: a shared-memory file handler of the
    tensor's bytes, viewed whole, with the attributes ``from_tensor`` sets."""
    handler = _FileHandler(shape.numel() * _itemsize(dtype))
    result = MemoryMappedTensor(torch.frombuffer(memoryview(handler.buffer), dtype=dtype).view(shape))
    result._handler = handler
    result.index = None
    result.parent_shape = shape
    return result


def _itemsize(dtype: torch.dtype) -> int:
    # the sizes from_tensor computes (from finfo / iinfo bits; a byte for bool)
    if dtype is torch.bool:
        return 1
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.bits // 8


def write_leaf_rows(pairs: list, start: int, numel: int) -> None:
    """Copies the ``numel`` rows of each batch leaf into rows ``start, start + 1, ...`` of its
    storage leaf, wrapping at the capacity (``numel`` is at most the capacity).

    A leaf memory-mapped on a file of its own is written with ``os.pwrite``: the kernel then
    fills the file's new pages directly, where a copy through the mapping takes a page fault
    on each of them (about a third more time for a fresh shared-memory file)."""
    if all(_fd_of(leaf) is None for leaf, _ in pairs) and replay.copy_rows([p[0] for p in pairs], [p[1] for p in pairs], start, numel):
        return  # contiguous CPU leaves: one or two memcpy each
    for leaf, value in pairs:
        capacity = leaf.shape[0]
        first = min(numel, capacity - start)
        fd = _fd_of(leaf)
        if fd is not None and value.is_contiguous() and not (value.is_neg() or value.is_conj()):
            row_bytes = leaf.element_size() * (leaf.numel() // capacity) if capacity else 0
            if value.numel():
                # bytes of any dtype, numpy's or not (bfloat16, bool)
                data = memoryview(value.reshape(-1).view(torch.uint8).numpy())
                _pwrite_all(fd, data[: first * row_bytes], start * row_bytes)
                if first < numel:
                    _pwrite_all(fd, data[first * row_bytes:], 0)
            continue
        leaf[start:start + first].copy_(value[:first])
        if first < numel:
            leaf[: numel - first].copy_(value[first:])


def _fd_of(leaf) -> int | None:
    """The descriptor of the shared-memory file a :class:`MemoryMappedTensor` maps from its
    start (an anonymous one), or ``None``."""
    handler = getattr(leaf, "_handler", None)
    fd = getattr(handler, "fd", -1)
    if type(fd) is not int or fd < 0 or leaf.storage_offset() or not leaf.is_contiguous():
        return None
    return fd


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
