"""Conditional updates: patch the stored records whose slot still holds what was sampled.

A round-robin writer recycles storage slots, so an index captured at sampling time may name
another record by the time an asynchronous computation writes back. With a writer that
tracks slot generations (``track_generations=True``), the pair ``(index, generation)``
names one record: :meth:`ReplayBuffer.update_if_present` patches only the pairs whose
generation is still the slot's, and, given a version field, only the records whose stored
version the incoming one beats.

This module holds the result class and the steps of that method (checking the inputs,
choosing the records, writing them), and the queue of updates submitted to run in the
background (:meth:`ReplayBuffer.submit_update_if_present`).
"""
from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from tensordict import TensorClass, TensorDictBase, unravel_key

from torchrl_compat.storages._journal import ALL_ITEMS
from torchrl_compat._torchrl_lookup import torchrl_twin

__all__ = ["ConditionalUpdateResult", "UpdateQueue", "storage_changed", "update_if_present"]


# torchrl's class, when it has one, is the base: results pass its isinstance checks
class ConditionalUpdateResult(*(torchrl_twin("replay_buffers", "ConditionalUpdateResult") or (TensorClass["nocast"],))):
    """Result of :meth:`~torchrl_compat.ReplayBuffer.update_if_present`.

    Attributes:
        updated (torch.Tensor): boolean mask aligned with the order of the indices passed
            to the update. ``True`` marks records that were still live and received the
            patch; ``False`` marks records left untouched, because their slot had been
            reused or emptied (stale) or because the version comparison rejected them.
        version_rejected (torch.Tensor, optional): boolean mask aligned like ``updated``,
            present only when the update was given a ``version_key``: ``True`` marks
            records that were live but lost the version comparison (including the
            duplicates of a slot that did not carry its highest incoming version). Every
            record lands in exactly one of updated / version_rejected / stale.

    ``stale_count`` counts generation-stale records only: with a version comparison, the
    records it rejected are counted by ``version_rejected_count``.

    Examples:
        >>> import torch
        >>> result = ConditionalUpdateResult(updated=torch.tensor([True, False, True]), batch_size=[3])
        >>> result.updated_count, result.stale_count, result.version_rejected_count
        (2, 1, 0)
    """

    updated: torch.Tensor
    version_rejected: torch.Tensor | None = None

    @property
    def updated_count(self) -> int:
        """Number of records that were live and patched."""
        return int(self.updated.sum().item())

    @property
    def version_rejected_count(self) -> int:
        """Number of records that were live but rejected by version comparison."""
        if self.version_rejected is None:
            return 0
        return int(self.version_rejected.sum().item())

    @property
    def stale_count(self) -> int:
        """Number of records that were stale and skipped."""
        stale = int(self.updated.numel()) - self.updated_count
        return stale - self.version_rejected_count


def storage_changed(storage, cursor=ALL_ITEMS) -> None:
    """Tells ``storage`` that the items at ``cursor`` changed outside its ``set``, so that
    what readers derived from them (trajectory ends) is read again."""
    note = getattr(storage, "_note_write", None)
    if note is not None:
        note(cursor)
        return
    bump = getattr(storage, "_bump_mutation_revision", None)  # torchrl's storages
    if bump is not None:
        bump()


def _coords(index: torch.Tensor) -> tuple:
    # rows of coordinates (ndim > 1 storages) address cells, not dim-0 slots
    return tuple(index.unbind(-1)) if index.ndim > 1 else (index,)


def _version_entry(storage, version_key, version, index, dim0, patch):
    """Checks ``version_key`` / ``version`` and adds the incoming versions to ``patch``;
    returns the stored version field."""
    if isinstance(version_key, str) and "." in version_key:
        raise ValueError(
            f"Dotted-string version keys are not supported: got {version_key!r}. Pass the "
            f"nested key in tuple form, e.g. {tuple(version_key.split('.'))!r}."
        )
    version_key = unravel_key(version_key)
    if version_key in patch:
        raise ValueError(f"version_key {version_key!r} may not appear in patch.")
    leaf = storage._conditional_patch_leaf(version_key)  # KeyError when missing
    n_coords = index.shape[-1] if index.ndim > 1 else 1
    feature_shape = leaf.shape[n_coords:]
    if any(dim != 1 for dim in feature_shape):
        raise ValueError(
            f"version_key {version_key!r} must reference a per-record scalar field; the "
            f"storage holds feature shape {tuple(feature_shape)}."
        )
    incoming = torch.as_tensor(version)
    while incoming.ndim > 1 and incoming.shape[-1] == 1:
        incoming = incoming.squeeze(-1)
    if incoming.ndim == 0:
        incoming = incoming.expand(dim0.shape)
    elif incoming.ndim != 1 or incoming.numel() != dim0.numel():
        raise ValueError(
            f"version must be a scalar or hold one entry per record, got shape "
            f"{tuple(torch.as_tensor(version).shape)} for {dim0.numel()} records."
        )
    patch[version_key] = incoming.reshape((dim0.numel(), *feature_shape))
    return version_key, leaf


def _highest_version_rows(records: torch.Tensor, incoming: torch.Tensor) -> torch.Tensor | None:
    """For records addressed more than once, the mask of the one row each that carries
    the highest incoming version (the last such row on ties); ``None`` when no record
    repeats. Without it the scatter would keep whichever duplicate came last."""
    if records.ndim > 1:
        slots, slot_ids = torch.unique(records, dim=0, return_inverse=True)
        n_slots = slots.shape[0]
    else:
        slots, slot_ids = torch.unique(records, return_inverse=True)
        n_slots = slots.numel()
    if n_slots == slot_ids.numel():
        return None
    info = torch.finfo if incoming.is_floating_point() else torch.iinfo
    device = incoming.device
    highest = torch.full((n_slots,), info(incoming.dtype).min, dtype=incoming.dtype, device=device)
    highest = highest.scatter_reduce(0, slot_ids, incoming, "amax")
    row = torch.arange(slot_ids.numel(), device=device)
    candidate = torch.where(incoming == highest[slot_ids], row, torch.full_like(row, -1))
    best = torch.full((n_slots,), -1, dtype=torch.int64, device=device).scatter_reduce(0, slot_ids, candidate, "amax")
    return row == best[slot_ids]


def update_if_present(
    buffer, index, generation, patch, version_key=None, version=None, require_newer=False
) -> ConditionalUpdateResult:
    """:meth:`ReplayBuffer.update_if_present` (see there): checks everything, then, under
    the buffer's locks, compares generations (and versions) and writes the winners."""
    storage, writer = buffer._storage, buffer._writer
    if not getattr(storage, "supports_conditional_update", False) or not getattr(
        writer, "tracks_generations", False
    ):
        raise RuntimeError(
            f"Conditional updates are not supported by {type(storage).__name__} with "
            f"{type(writer).__name__}: the storage must support conditional updates and the "
            "writer must track slot generations."
        )
    index = torch.as_tensor(index, dtype=torch.long)
    dim0 = index[..., 0] if index.ndim > 1 else index.reshape(-1)
    generation = torch.as_tensor(generation, dtype=torch.long).reshape(-1)
    if generation.numel() != dim0.numel():
        raise ValueError(
            f"index and generation must address the same number of records, got "
            f"{dim0.numel()} indices and {generation.numel()} generations."
        )
    if (version_key is None) != (version is None):
        raise ValueError("version_key and version must be provided together.")
    if isinstance(patch, TensorDictBase):
        patch = dict(patch.items(include_nested=True, leaves_only=True))
    else:
        patch = dict(patch)
    # one spelling per key, so that ("v",) and "v" cannot name one field twice
    patch = {unravel_key(key): value for key, value in patch.items()}
    version_leaf = None
    if version_key is not None:
        version_key, version_leaf = _version_entry(storage, version_key, version, index, dim0, patch)
    normalized = storage._validate_conditional_patch(index, patch)
    version_rejected = None
    with buffer._replay_lock, buffer._write_lock:
        current = writer.generations_of(dim0)
        captured = generation.to(current.device)
        live = (current >= 0) & (captured >= 0) & (current == captured)
        if version_key is not None:
            version_rejected = torch.zeros_like(live)
        if live.any() and version_key is not None:
            live_mask = live.to(version_leaf.device)
            records = index.to(version_leaf.device)[live_mask]
            stored = version_leaf[_coords(records)].reshape(-1)
            incoming = normalized[version_key][live_mask].reshape(-1)
            accepted = incoming > stored if require_newer else incoming >= stored
            highest = _highest_version_rows(records, incoming)
            if highest is not None:
                accepted = accepted & highest
            accepted = accepted.to(live.device)
            version_rejected[live] = ~accepted
            kept = torch.zeros_like(live)
            kept[live] = accepted
            live = kept
        if live.any():
            records = index[live.to(index.device)]
            storage._apply_conditional_patch(
                records, {key: value[live.to(value.device)] for key, value in normalized.items()}
            )
    return ConditionalUpdateResult(updated=live, version_rejected=version_rejected, batch_size=live.shape)


def _run_after(dependencies: tuple, operation: Callable):
    for dependency in dependencies:
        dependency.result()
    return operation()


class UpdateQueue:
    """The updates a buffer runs in the background, one at a time in submission order.

    Each update waits for the samples already prefetched when it was submitted; samples
    taken after it wait for it (:meth:`sample_dependency`). The executor starts at the
    first submission. A queue does not travel with a pickled buffer: the copy gets an
    empty one.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._pending = collections.deque()
        self._executor = None

    def submit(self, operation: Callable, prefetched: tuple = ()) -> Future:
        with self._lock:
            # finished updates leave the queue; their errors surface here, as in torchrl
            while self._pending and self._pending[0].done():
                self._pending.popleft().result()
            dependencies = tuple(prefetched)
            if self._pending:
                dependencies += (self._pending[-1],)
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1)
            future = self._executor.submit(_run_after, dependencies, operation)
            self._pending.append(future)
            return future

    def sample_dependency(self) -> Future | None:
        """The last update submitted, while it is pending (what a new sample waits for)."""
        with self._lock:
            return self._pending[-1] if self._pending else None

    def wait(self) -> None:
        """Waits for every update submitted; re-raises the first error met."""
        with self._lock:
            pending, self._pending = tuple(self._pending), collections.deque()
        error = None
        for future in pending:
            try:
                future.result()
            except BaseException as err:  # noqa: B036 - re-raised below
                error = error or err
        if error is not None:
            raise error

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()


def stage_on_host(target, index, generation, patch, version):
    """Copies CUDA inputs of a submitted update bound for a CPU storage (``target``)
    without blocking, on the caller's stream: the update thread then waits only for those
    copies, not for the work queued on the stream after submission. Returns the inputs
    and the events to wait for."""
    if target is None or target.type != "cpu":
        return index, generation, patch, version, ()
    streams = {}

    def stage(value):
        if isinstance(value, TensorDictBase):
            devices = {
                leaf.device
                for leaf in value.values(include_nested=True, leaves_only=True)
                if leaf.device.type == "cuda"
            }
        elif isinstance(value, torch.Tensor) and value.device.type == "cuda":
            devices = {value.device}
        else:
            return value
        for device in devices:
            streams.setdefault(device, torch.cuda.current_stream(device))
        return value.to(target, non_blocking=True) if devices else value

    index, generation, version = stage(index), stage(generation), stage(version)
    if isinstance(patch, TensorDictBase):
        patch = stage(patch)
    elif isinstance(patch, Mapping):
        patch = {key: stage(value) for key, value in patch.items()}
    events = []
    for stream in streams.values():
        event = torch.cuda.Event()
        event.record(stream)
        events.append(event)
    return index, generation, patch, version, tuple(events)


def after_events(events: tuple, operation: Callable) -> Callable:
    """``operation``, run once the CUDA ``events`` completed."""
    if not events:
        return operation
    return functools.partial(_run_after_events, events, operation)


def _run_after_events(events: tuple, operation: Callable):
    for event in events:
        event.synchronize()
    return operation()
