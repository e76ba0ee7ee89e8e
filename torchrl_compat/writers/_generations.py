"""Slot generations: a counter per storage slot that advances at each write to it.

A consumer that sampled index ``i`` when slot ``i`` was at generation ``g`` can tell, later,
whether the slot still holds what it sampled: it does while ``generations_of(i) == g``.
The counters are an ``int64`` tensor kept on the storage (``storage._slot_generations``),
not on the writer, so that two buffers sharing one storage see each other's writes; ``-1``
marks a slot never written. A writer constructed with ``track_generations=True`` creates
the tensor at its first write; any round-robin writer keeps an existing one up to date.

The functions here are :class:`~torchrl_compat.RoundRobinWriter`'s generation methods
(assigned in its class body), kept apart from its write paths: a writer that does not track
generations, on a storage without counters, pays one attribute test per write.
"""
from __future__ import annotations

from typing import Any

import torch

from torchrl_compat.utils import _is_int, _make_ordinal_device

# Storages up to this many slots get all their counters at once, so that the tensor keeps
# one shape (no recompilation under torch.compile); larger ones (an unbounded ListStorage
# reports 2**63 - 1) grow geometrically, from at least _GENERATION_MIN_ALLOC slots.
_GENERATION_EAGER_ALLOC_LIMIT = 2**20
_GENERATION_MIN_ALLOC = 1024

# The storage attribute holding the counters, as torchrl names it.
_SLOT_GENERATIONS_ATTR = "_slot_generations"

# the checkpoint entries (state_dict key, dumps file and metadata keys)
GENERATION_STATE_KEY = "_generation"
GENERATION_FILE = "generation.memmap"


def tracks_generations(self) -> bool:
    """Whether this writer stamps storage slots with their write generation."""
    return self._track_generations


def _get_generation(self) -> torch.Tensor | None:
    if self._storage is None:
        return self._pending_generation
    return getattr(self._storage, _SLOT_GENERATIONS_ATTR, None)


def _set_generation(self, value: torch.Tensor | None) -> None:
    # a writer without storage (being loaded) holds the counters until it gets one
    if self._storage is None:
        self._pending_generation = value
    else:
        setattr(self._storage, _SLOT_GENERATIONS_ATTR, value)


def register_storage(self, storage) -> None:
    """Registers ``storage``; counters loaded before it came go onto it, unless the storage
    (shared with another buffer) already has live ones, which win."""
    self._storage = storage
    pending, self._pending_generation = self._pending_generation, None
    if pending is not None and self._generation is None:
        self._generation = pending
    self._align_generation_device()


def _generation_device(self, index) -> torch.device:
    # the counters live on the storage's device, where sampled indices are made
    device = getattr(self._storage, "device", None)
    if device is None or device == "auto":
        if isinstance(index, torch.Tensor):
            return _make_ordinal_device(index.device)
        return torch.device("cpu")
    return _make_ordinal_device(torch.device(device))


def _align_generation_device(self) -> None:
    generation = self._generation
    if generation is None:
        return
    device = self._generation_device(generation)
    if generation.device != device:
        self._generation = generation.to(device)


def _ensure_generation(self, capacity: int, min_size: int, device: torch.device) -> None:
    """Makes the counters cover at least ``min_size`` slots (new ones at ``-1``)."""
    generation = self._generation
    if generation is not None and generation.device != device:
        generation = self._generation = generation.to(device)
    current = 0 if generation is None else generation.numel()
    if current >= min_size:
        return
    if capacity <= _GENERATION_EAGER_ALLOC_LIMIT:
        size = capacity
    else:
        size = min(capacity, max(min_size, 2 * current, _GENERATION_MIN_ALLOC))
    grown = torch.full((size,), -1, dtype=torch.int64, device=device)
    if generation is not None:
        grown[:current] = generation
    # a new tensor, not shared between processes: growing replaces it, which a shared
    # mapping would not follow
    self._generation = grown


def _bump_generation(self, index, data: Any, *, run: tuple | None = None) -> None:
    """Advances the counter of each slot of ``index`` once per write to it (a slot written
    twice by one wrapping ``extend`` advances twice).

    ``run=(first_row, capacity)`` says that ``index`` is ``(first_row + arange(n)) % capacity``
    (a round-robin write): the counters then advance by one or two slices, not a scatter.
    """
    storage = self._storage
    # a writer not tracking generations still keeps counters another writer put on the
    # storage, but creates none
    if not self._track_generations and getattr(storage, _SLOT_GENERATIONS_ATTR, None) is None:
        return
    if run is not None and _bump_run(self, *run, index):
        return
    device = self._generation_device(index)
    if _is_int(index):
        capacity = storage._max_size_along_dim0(single_data=data)
        self._ensure_generation(capacity, int(index) + 1, device)
        self._generation[int(index)] += 1
        return
    index = torch.as_tensor(index, dtype=torch.long, device=device).reshape(-1)
    if index.numel() == 0:
        return
    capacity = storage._max_size_along_dim0(batched_data=data)
    # .max() synchronises a device: only for the storages too large to allocate at once
    min_size = capacity if capacity <= _GENERATION_EAGER_ALLOC_LIMIT else int(index.max()) + 1
    self._ensure_generation(capacity, min_size, device)
    self._generation.index_put_((index.to(device),), torch.ones_like(index), accumulate=True)


def _bump_run(self, first_row: int, capacity: int, index: torch.Tensor) -> bool:
    """The slice form of :func:`_bump_generation` for a round-robin write from row
    ``first_row`` of ``capacity``, when the counters already cover every slot on the right
    device and the write does not wrap more than once; ``False`` (nothing done) otherwise."""
    generation = self._generation
    numel = index.numel()
    if generation is None or index.device != generation.device:
        return False
    size = generation.numel()
    if size != capacity or numel > size or first_row >= size:
        return False
    stop = first_row + numel
    generation[first_row : min(stop, size)] += 1
    if stop > size:
        generation[: stop - size] += 1
    return True


def _empty_generation(self) -> None:
    # emptying invalidates every handle: written slots advance (a reset would make old
    # handles look live again), never-written ones stay at -1
    generation = self._generation
    if generation is not None:
        generation[generation >= 0] += 1


def generations_of(self, index) -> torch.Tensor:
    """Returns the generation stamp for each physical slot in ``index``.

    A slot's stamp advances once per write it receives, so a single ``extend`` that wraps
    the storage advances a reused slot once per write. Comparing a stamp captured at
    sampling time with the current one tells whether the slot still holds the data
    sampled. Writers constructed with ``track_generations=False`` (the default) report
    ``-1`` everywhere; never-written slots, and indices outside the counters, report
    ``-1`` too: ``-1`` means "no usable stamp".

    Args:
        index (int or torch.Tensor): dim-0 slot indices. A 1-D tensor is a batch of slot
            indices; for a storage with ``ndim > 1``, a ``tuple`` of per-dimension indices
            (as :meth:`~torchrl_compat.ReplayBuffer.extend` returns), or a tensor of
            coordinate rows with at least 2 dimensions, names cells: only their dim-0
            component counts, a generation stamping a whole dim-0 slot.

    Returns:
        torch.Tensor: ``int64`` stamps shaped like the dim-0 component of ``index``, on
        ``index``'s device.
    """
    if not self._track_generations:
        return untracked_generations_of(self, index)
    if isinstance(index, tuple):
        index = index[0]
    elif (
        isinstance(index, torch.Tensor)
        # a 1-D tensor of storage.ndim entries is read as that many slots, not one cell
        and index.ndim >= 2
        and self._storage is not None
        and self._storage.ndim > 1
        and index.shape[-1] == self._storage.ndim
    ):
        index = index[..., 0]
    index = torch.as_tensor(index, dtype=torch.long, device=getattr(index, "device", "cpu"))
    generation = self._generation
    if generation is None or not generation.numel():
        return torch.full(index.shape, -1, dtype=torch.int64, device=index.device)
    slots = index.to(generation.device)
    n = generation.numel()
    stamps = generation[slots.clamp(min=0, max=n - 1)]
    inside = (slots >= 0) & (slots < n)
    stamps = torch.where(inside, stamps, torch.full_like(stamps, -1))
    return stamps.to(index.device)


def untracked_generations_of(self, index) -> torch.Tensor:
    """Returns the generation stamp for each physical slot in ``index``: ``-1`` everywhere,
    this writer tracking none (see :meth:`RoundRobinWriter.generations_of`).

    Args:
        index (int or torch.Tensor): dim-0 slot indices.

    Returns:
        torch.Tensor: ``int64`` ``-1``s shaped like ``index``, on its device.
    """
    index = torch.as_tensor(index)
    return torch.full(index.shape, -1, dtype=torch.int64, device=index.device)


def update_storage_len_for_write_at(self, index) -> None:
    """Grows the storage's length to cover the rows ``index`` wrote, up to its capacity."""
    storage = self._storage
    if not hasattr(storage, "_len"):
        return
    if _is_int(index):
        max_index = int(index)
    else:
        index = torch.as_tensor(index)
        if index.numel() == 0:
            return
        max_index = int(index.max())
    storage._len = min(max(len(storage), max_index + 1), storage.max_size)


def generation_for_checkpoint(self) -> torch.Tensor | None:
    """The counters a checkpoint saves: those of a tracking writer, when it has any."""
    if not self._track_generations:
        return None
    return self._generation


def routed_generations(writers, index) -> torch.Tensor:
    """The stamps of the rows of a routed index (a tensordict of ``"buffer_ids"``, one
    member id per row, and ``"index"``, the row's index in that member's storage), each
    from its member's writer in ``writers``."""
    from tensordict import TensorDictBase

    if not isinstance(index, TensorDictBase):
        raise TypeError("WriterEnsemble generations require routed index metadata.")
    buffer_ids = index.get("buffer_ids")
    local_indices = index.get("index")
    if buffer_ids.ndim != 1 or local_indices.shape[0] != buffer_ids.shape[0]:
        raise ValueError("WriterEnsemble expects one member id per leading local-index row.")
    if buffer_ids.dtype == torch.bool or buffer_ids.is_floating_point():
        raise TypeError("Replay-buffer member ids must be integers.")
    if buffer_ids.numel() and ((buffer_ids < 0).any() or (buffer_ids >= len(writers)).any()):
        raise ValueError(f"Replay-buffer member ids must lie in [0, {len(writers) - 1}].")
    stamps = [None] * buffer_ids.numel()
    for member in buffer_ids.unique(sorted=True).tolist():
        positions = (buffer_ids == member).nonzero().flatten()
        member_stamps = writers[member].generations_of(local_indices[positions.to(local_indices.device)])
        if member_stamps.shape[0] != positions.numel():
            raise RuntimeError(f"Writer {member} returned incompatible generation stamps.")
        for position, stamp in zip(positions.tolist(), member_stamps.unbind(0)):
            stamps[position] = stamp
    if not stamps:
        return torch.empty(buffer_ids.shape, dtype=torch.int64, device=buffer_ids.device)
    if all(stamp.shape == stamps[0].shape for stamp in stamps[1:]):
        return torch.stack(stamps)
    return torch.nested.nested_tensor(stamps)
