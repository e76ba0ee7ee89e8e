"""Sample units: what each anchor a sampler draws expands into (stand-in for torchrl 0.14's
``torchrl.data.replay_buffers.sample_units``).

:class:`Transition` keeps the anchors as they are; :class:`Sequence` expands each into a
window of records around it, bounded by episode ends, with burn-in, bootstrap and dilation.
The windows come from one C pass over the end flags around the anchors
(:func:`replay.sequence_windows`), with torchrl 0.14.1's indices, masks and info entries.

The module follows the release rules of the package (:mod:`torchrl_compat._releases`,
``"sample_units"``): from torchrl 0.14, and without torchrl, ``torchrl_compat`` exports the
three classes and :func:`~torchrl_compat.install` stands them in for torchrl's. Following
torchrl 0.11-0.13, which have no sample units, the package does not export them and the
buffers take no ``sample_unit``; this module still imports and its classes still expand
anchors over a storage.
"""
from __future__ import annotations

import abc
import threading
import weakref
from typing import Any, Literal, TYPE_CHECKING

import numpy as np
import torch
from tensordict import is_tensor_collection
from tensordict.utils import NestedKey

import replay
from torchrl_compat._torchrl_lookup import accepted_classes, torchrl_twin
from torchrl_compat.storages import TensorStorage

if TYPE_CHECKING:
    from torchrl_compat.storages import Storage

__all__ = ["SampleUnit", "Transition", "Sequence"]

_EPISODE_BOUNDARIES = ("pad", "stop", "include_reset")

# storage -> (key, lane stops or None): the ends of a storage with lanes, listed once a storage
# is queried twice at the same mutation revision (see Sequence._lane_stops).
_LANE_STOPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LANE_STOPS_LOCK = threading.Lock()


class SampleUnit(*(torchrl_twin("sample_units", "SampleUnit") or (abc.ABC,))):
    """Expands sampled anchors into the records a batch is made of.

    A sampler decides which anchors are drawn; a sample unit decides what each anchor
    expands into (one transition, a window of records around it). The buffer calls
    :meth:`expand` while it samples, after the sampler drew the anchors and before the
    storage is read, so the indices it returns are the ones the batch is read from and the
    ones reported in the sample's info.

    An implementation receives the anchors (a tensor, or a tuple of coordinate tensors for
    a storage with ``ndim > 1``), the sampler's info and the storage, and returns the
    expanded index and info without changing the storage. Info entries aligned with the
    anchors (priority weights) must be expanded with them; what the expansion adds
    (validity masks, the anchor of each record) goes into new info entries.

    .. seealso:: :class:`Transition`, the identity unit.
    """

    @abc.abstractmethod
    def expand(
        self,
        index: torch.Tensor | tuple,
        info: dict[str, Any],
        storage: Storage,
    ) -> tuple[torch.Tensor | tuple, dict[str, Any]]:
        """Expands anchor indices into the record indices of the batch.

        Args:
            index (torch.Tensor or tuple of torch.Tensor): the anchors the sampler drew.
            info (dict): the sampler's info dictionary.
            storage (Storage): the storage the batch is read from.

        Returns:
            ``(index, info)``: the expanded indices and the (possibly extended) info.
        """
        ...


class Transition(SampleUnit, *torchrl_twin("sample_units", "Transition")):
    """The identity sample unit: every anchor is one transition.

    What a buffer does without a ``sample_unit``: the anchors are the records of the batch
    and the info is returned as it is.

    Examples:
        >>> import torch
        >>> from torchrl_compat import LazyTensorStorage, ReplayBuffer
        >>> from torchrl_compat.sample_units import Transition
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4, sample_unit=Transition())
        >>> rb.extend(torch.arange(10))
        tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
        >>> rb.sample().shape
        torch.Size([4])
    """

    def expand(
        self,
        index: torch.Tensor | tuple,
        info: dict[str, Any],
        storage: Storage,
    ) -> tuple[torch.Tensor | tuple, dict[str, Any]]:
        return index, info


class Sequence(SampleUnit, *torchrl_twin("sample_units", "Sequence")):
    """Expands each anchor into a window of records around it.

    Each anchor expands into ``burn_in + length + bootstrap`` records: ``burn_in`` records
    before the anchor, the learning region of ``length`` records starting at the anchor,
    then ``bootstrap`` records after it, ``dilation`` storage rows apart. ``B`` anchors give
    a flat batch of ``B * (burn_in + length + bootstrap)`` records. A recurrent learner can
    replay the burn-in to rebuild its hidden state, learn on the learning region and use the
    bootstrap records as future context; the unit only selects records and reports masks.

    Episode ends are read from the stored ``done_key`` entry, so the storage must be a
    :class:`~torchrl_compat.storages.TensorStorage` holding a TensorDict.

    Args:
        length (int): the length of the learning region.
        episode_boundary (str, optional): what a window does at an episode's end:

            - ``"pad"``: records past the episode's first or last record repeat it and are
              marked invalid in ``info["validity_mask"]``;
            - ``"stop"``: the window moves back so that it ends at the episode's end (padding
              as ``"pad"`` does when the episode is too short);
            - ``"include_reset"``: windows cross episode ends, but never the write seam (the
              newest and oldest records of a circular storage) nor unwritten rows: records
              past them are clamped and marked invalid.

            Defaults to ``"pad"``.
        done_key (NestedKey, optional): the end-of-episode entry. ``None`` treats the
            written rows as one episode, bounded by the write seam only. Defaults to
            ``("next", "done")``.
        burn_in (int, optional): records before the anchor, ``False`` in
            ``info["learning_mask"]``. They never move the anchor: those before its
            episode's start (or the oldest record) are invalid and clamp to it. Defaults
            to 0.
        bootstrap (int, optional): records after the learning region, ``False`` in
            ``info["learning_mask"]`` and bounded by ``episode_boundary``. Defaults to 0.
        dilation (int, optional): storage rows between consecutive records of a window.
            Defaults to 1.

    ``info["index"]`` then holds the records' storage indices, and ``info["anchor_index"]``
    each record's anchor (its coordinates for a storage with ``ndim > 1``, whose first
    dimension is time and the others lanes), so that priorities are updated per anchor.
    ``info`` also gets ``"sequence_id"``, ``"step_in_sequence"``, ``"learning_mask"`` and
    ``"validity_mask"``.

    .. note:: ``"anchor_index"`` is the anchor the sampler drew, also where
        ``episode_boundary="stop"`` moved the window back.

    .. note:: torchrl 0.14 lists every trajectory of the storage at the first query after a
        write and caches the list until the next one. Here the windows are read from the end
        flags within ``dilation * (burn_in + length + bootstrap)`` rows of each anchor, in one
        C pass with the GIL released (:func:`replay.sequence_windows`): the cost does not grow
        with the storage and a write costs no rebuild. With lanes (``ndim > 1``), whose rows
        lie a cache line apart, the ends are listed once the storage is queried a second time
        at the same mutation revision, and searched from then on. The results are torchrl
        0.14.1's, bit for bit. Anchors outside the storage raise an ``IndexError`` naming them
        (torchrl returns wrapped-around indices for them); storages on another device are read
        on the CPU.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyTensorStorage, ReplayBuffer
        >>> from torchrl_compat.sample_units import Sequence
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=2, sample_unit=Sequence(length=3))
        >>> done = torch.zeros(10, 1, dtype=torch.bool)
        >>> done[4] = done[9] = True
        >>> rb.extend(TensorDict({"obs": torch.arange(10.0), ("next", "done"): done}, batch_size=[10]))
        tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
        >>> sample, info = rb.sample(return_info=True)
        >>> sample["obs"].shape
        torch.Size([6])
        >>> unit = Sequence(length=2, burn_in=1, bootstrap=1)
        >>> index, info = unit.expand(torch.tensor([5]), {}, rb.storage)
        >>> index.tolist()
        [5, 5, 6, 7]
        >>> info["learning_mask"].tolist(), info["validity_mask"].tolist()
        ([False, True, True, False], [False, True, True, True])
    """

    def __init__(
        self,
        length: int,
        episode_boundary: Literal["pad", "stop", "include_reset"] = "pad",
        done_key: NestedKey | None = ("next", "done"),
        burn_in: int = 0,
        bootstrap: int = 0,
        dilation: int = 1,
    ):
        # torchrl's messages, so that code matching them keeps working
        if length <= 0:
            raise ValueError(f"length must be strictly positive, got {length}.")
        if episode_boundary not in _EPISODE_BOUNDARIES:
            raise ValueError(f"Unknown episode_boundary {episode_boundary}")
        if burn_in < 0:
            raise ValueError(f"burn_in must be non-negative, got {burn_in}.")
        if bootstrap < 0:
            raise ValueError(f"bootstrap must be non-negative, got {bootstrap}.")
        if dilation < 1:
            raise ValueError(f"dilation must be strictly positive, got {dilation}.")
        if done_key is not None and not isinstance(done_key, str):
            # lists (Hydra configs) become the tuple nested keys are
            done_key = tuple(done_key)
        self.length = length
        self.episode_boundary = episode_boundary
        self.done_key = done_key
        self.burn_in = burn_in
        self.bootstrap = bootstrap
        self.dilation = dilation

    @staticmethod
    def _newest_index(storage: Storage, written: int) -> int:
        """Row of the most recently written record."""
        cursor = getattr(storage, "_last_cursor_index", None)
        if cursor is not None:
            return cursor % written
        cursor = getattr(storage, "_last_cursor", None)
        if isinstance(cursor, torch.Tensor):
            cursor = cursor.reshape(-1)
            if cursor.numel():
                return int(cursor[-1].item()) % written
        elif isinstance(cursor, range):
            if len(cursor):
                return int(cursor[-1]) % written
        elif isinstance(cursor, int):
            return cursor % written
        return written - 1

    def _check_storage(self, storage: Storage) -> None:
        # ours first: accepted_classes looks torchrl's class up at each call
        if not isinstance(storage, TensorStorage) and not isinstance(
            storage, accepted_classes(TensorStorage, "storages")
        ):
            raise TypeError(
                f"{type(self).__name__} requires a TensorDict-backed TensorStorage "
                f"(e.g. LazyTensorStorage or LazyMemmapStorage written with "
                f"TensorDict data) to recover episode boundaries and the write "
                f"cursor; got {type(storage).__name__}."
            )
        contents = getattr(storage, "_storage", None)
        if contents is not None and not is_tensor_collection(contents):
            raise TypeError(
                f"{type(self).__name__} requires the TensorStorage to hold a "
                f"TensorDict (or other tensor collection) so that the "
                f"'{self.done_key}' entry can be read; the storage holds "
                f"{type(contents).__name__} instead."
            )

    def expand(
        self,
        index: torch.Tensor | tuple,
        info: dict[str, Any],
        storage: Storage,
    ) -> tuple[torch.Tensor | tuple, dict[str, Any]]:
        self._check_storage(storage)
        ndim = storage.ndim
        anchor = torch.stack(index, -1) if isinstance(index, tuple) else index
        if ndim > 1 and (anchor.ndim != 2 or anchor.shape[-1] != ndim):
            raise RuntimeError(f"Sequence expected multidimensional anchors with shape [batch, {ndim}].")
        if anchor.is_floating_point() or anchor.is_complex() or anchor.dtype == torch.bool:
            raise TypeError(f"Sequence expands integer anchors, got anchors of dtype {anchor.dtype}")
        batch = anchor.shape[0]
        device = anchor.device
        total = self.burn_in + self.length + self.bootstrap

        expanded_info = {}
        for key, value in info.items():
            tensor = torch.as_tensor(value)
            # scalar metadata is not per anchor: kept as it is
            expanded_info[key] = value if tensor.ndim == 0 else _repeat_rows(tensor, total)

        host_anchor = anchor if device.type == "cpu" else anchor.cpu()
        anchor_time = host_anchor[:, 0] if ndim > 1 else host_anchor
        lane = None
        if self.episode_boundary == "include_reset":
            shape = storage.shape  # None before the first write
            written = shape[0] if shape is not None and len(shape) else 0
            if written == 0:
                raise RuntimeError(f"{type(self).__name__} cannot expand anchors over an empty storage.")
            newest = self._newest_index(storage, written)
            oldest = (newest + 1) % written if storage._is_full else 0
            end, arguments = None, {"length": written, "newest": newest, "oldest": oldest}
        else:
            listed = self._listed_stops(storage) if ndim > 1 else None
            if listed is not None:  # the storage did not change since its ends were listed
                key, stops = listed
                end, arguments = None, {"length": key[2][0], "stops": stops}
                lane = self._flat_lanes(host_anchor, key[2][1:])
            else:
                end, arguments = self._end_flags(storage, ndim)
                if ndim > 1:
                    lane = self._flat_lanes(host_anchor, end.shape[1:])
                    arguments["stops"] = self._lane_stops(storage, end, arguments)
        block = _WindowBlock(batch * total, anchor, ndim)
        index_rows, validity, sequence_id, step, learning = (
            torch.from_numpy(a)
            for a in replay.sequence_windows(
                end, anchor_time, lane, self.burn_in, self.length, self.bootstrap, self.dilation,
                self.episode_boundary, out=block.window, anchor_out=block.anchor_rows(ndim), **arguments,
            )
        )
        anchor_index = block.anchor_index(host_anchor, total)
        if device.type != "cpu":
            index_rows, validity, sequence_id, step, learning, anchor_index = (
                t.to(device) for t in (index_rows, validity, sequence_id, step, learning, anchor_index)
            )
        expanded_info["sequence_id"] = sequence_id
        expanded_info["step_in_sequence"] = step
        expanded_info["learning_mask"] = learning
        expanded_info["anchor_index"] = anchor_index
        expanded_info["validity_mask"] = validity
        if ndim > 1:
            lanes = block.lanes(host_anchor, total)
            if device.type != "cpu":
                lanes = [t.to(device) for t in lanes]
            return (index_rows, *lanes), expanded_info
        return index_rows, expanded_info

    def _end_flags(self, storage: Storage, ndim: int):
        """The storage's end flags (time first, one column per lane) and the forced ends
        torchrl adds to them: the last row of a storage not full, the last written row of a
        full one."""
        if self.done_key is None:
            shape = tuple(storage.shape)
            if not shape or shape[0] == 0:
                raise RuntimeError("Cannot recover trajectory boundaries from an empty (T=0) input.")
            end = np.zeros(shape, dtype=np.bool_)
        else:
            end = storage.get(self.done_key)
            while end.ndim > ndim and end.shape[-1] == 1:
                end = end.squeeze(-1)
            if end.ndim == 0:
                raise RuntimeError("Expected the end-of-trajectory signal to be at least 1-dimensional.")
            if end.shape[0] == 0:
                raise RuntimeError("Cannot recover trajectory boundaries from an empty (T=0) input.")
            if end.ndim != ndim:
                # torchrl reads the extra dimensions as lanes the anchors lack
                raise RuntimeError("Multidimensional anchors must have shape [batch, storage.ndim].")
            if end.device.type != "cpu":
                end = end.cpu()
        length = end.shape[0]
        if not storage._is_full:
            return end, {"length": length, "close_last": True}
        return end, {"length": length, "cursor": _cursor_row(getattr(storage, "_last_cursor_index", None), length)}

    def _lane_stops(self, storage: Storage, end, arguments: dict):
        """The ends of each lane of a storage with lanes, listed (``(rows, offsets)``, see
        :func:`replay.sequence_windows`), when the storage was queried before at the same
        mutation revision; ``None`` otherwise (the ends are then read around each anchor).

        One lane's rows lie ``lanes`` bytes apart: reading them around each anchor touches a
        cache line a row, where a listed lane costs a binary search. Listing them reads the
        whole storage once, which a second query at the same revision pays for; a query after
        each write never lists them. Like torchrl's boundary cache, a write that does not move
        the revision (into the stored tensors directly) is not seen.
        """
        key = self._stops_key(storage, tuple(end.shape), arguments.get("close_last", False), arguments.get("cursor"))
        if key is None:
            return None
        try:
            with _LANE_STOPS_LOCK:
                known = _LANE_STOPS.get(storage)
                if known is None or known[0] != key:
                    _LANE_STOPS[storage] = (key, None)
                    return None
        except TypeError:  # a storage that cannot be weakly referenced
            return None
        if known[1] is not None:
            return known[1]
        _, stop, _ = replay.find_start_stop_traj(
            end=end, at_capacity=not arguments.get("close_last", False), cursor=arguments.get("cursor")
        )
        stop = stop.numpy() if isinstance(stop, torch.Tensor) else stop
        lane_shape = tuple(end.shape[1:])
        lane = np.ravel_multi_index(tuple(stop[:, 1:].T), lane_shape)
        order = np.lexsort((stop[:, 0], lane))
        rows = np.ascontiguousarray(stop[order, 0], dtype=np.int64)
        offsets = np.searchsorted(lane[order], np.arange(int(np.prod(lane_shape)) + 1)).astype(np.int64)
        with _LANE_STOPS_LOCK:
            _LANE_STOPS[storage] = (key, (rows, offsets))
        return rows, offsets

    def _stops_key(self, storage: Storage, shape: tuple, close_last: bool, cursor):
        """What the listed ends of ``storage`` depend on, ``None`` without a revision."""
        revision = getattr(storage, "_mutation_revision", None)
        if revision is None:
            return None
        return (self.done_key, revision, shape, close_last, cursor)

    def _listed_stops(self, storage: Storage):
        """``(key, stops)`` when the ends of ``storage`` were listed at its present state, else
        ``None``; reads the storage's counters only, not its end flags."""
        try:
            with _LANE_STOPS_LOCK:
                known = _LANE_STOPS.get(storage)
        except TypeError:  # a storage that cannot be weakly referenced
            return None
        if known is None or known[1] is None:
            return None
        shape = tuple(storage.shape)
        if storage._is_full:
            key = self._stops_key(storage, shape, False, _cursor_row(getattr(storage, "_last_cursor_index", None), shape[0]))
        else:
            key = self._stops_key(storage, shape, True, None)
        return known if key == known[0] else None

    @staticmethod
    def _flat_lanes(anchor: torch.Tensor, lane_shape) -> np.ndarray:
        """Each anchor's lane coordinates as one row-major lane number, checked."""
        coordinates = anchor.numpy()[:, 1:]
        try:
            return np.ravel_multi_index(tuple(coordinates.T), tuple(lane_shape))
        except ValueError:  # a coordinate outside its lane dimension
            outside = (coordinates < 0) | (coordinates >= np.asarray(tuple(lane_shape)))
            position = int(np.flatnonzero(outside.any(1))[0])
            raise IndexError(
                f"anchor {anchor[position].tolist()} at position {position} is outside the storage's "
                f"lanes {tuple(lane_shape)}"
            ) from None


class _WindowBlock:
    """Every per-record output of one ``expand`` as views of one numpy block: separate arrays
    of a few hundred kB each make glibc hand memory back to the system and fault it in again
    at every call, which costs more than computing them."""

    def __init__(self, size: int, anchor: torch.Tensor, ndim: int):
        self.size = size
        # int64 columns: index, sequence_id, step, anchor_index (int64 anchors: ndim), lanes
        own_anchor = anchor.dtype == torch.long
        columns = 3 + (ndim if own_anchor else 0) + (ndim - 1)
        self.block = np.empty(size * (8 * columns + 2), dtype=np.uint8)
        ints = self.block[: 8 * size * columns].view(np.int64)
        bools = self.block[8 * size * columns:].view(np.bool_)
        self.window = (ints[:size], bools[:size], ints[size:2 * size], ints[2 * size:3 * size], bools[size:])
        rest = ints[3 * size:]
        self._anchor = None
        if own_anchor:
            self._anchor = rest[: ndim * size].reshape(size, ndim) if ndim > 1 else rest[:size]
            rest = rest[ndim * size:]
        self._lanes = [rest[j * size:(j + 1) * size] for j in range(ndim - 1)]

    def anchor_rows(self, ndim: int):
        """Where the kernel writes each record's anchor row (int64 anchors without lanes)."""
        return self._anchor if ndim == 1 else None

    def anchor_index(self, anchor: torch.Tensor, times: int) -> torch.Tensor:
        """``anchor.repeat_interleave(times, dim=0)`` (anchor on the CPU)."""
        if self._anchor is None:
            return _repeat_rows(anchor, times)
        if anchor.ndim == 1:  # written by the kernel
            return torch.from_numpy(self._anchor)
        replay.repeat_rows(anchor.numpy(), times, out=self._anchor)
        return torch.from_numpy(self._anchor)

    def lanes(self, anchor: torch.Tensor, times: int) -> list:
        """Each lane coordinate of the anchors, repeated ``times`` times, as int64."""
        coordinates = anchor.numpy()
        out = []
        for j, lane in enumerate(self._lanes):
            replay.repeat_rows(coordinates[:, 1 + j], times, out=lane)
            out.append(torch.from_numpy(lane))
        return out


def _repeat_rows(tensor: torch.Tensor, times: int) -> torch.Tensor:
    """``tensor.repeat_interleave(times, dim=0)``: numpy's repeat on the CPU (torch's builds an
    index tensor and gathers, ~8x slower on a [256, 2] tensor), torch's elsewhere."""
    if tensor.device.type == "cpu" and not tensor.requires_grad:
        try:
            return torch.from_numpy(np.repeat(tensor.numpy(), times, axis=0))
        except (RuntimeError, TypeError):  # no numpy dtype (bfloat16), conjugate bit
            pass
    return tensor.repeat_interleave(times, dim=0)


def _cursor_row(cursor, length: int) -> int | None:
    """The row a full storage's cursor forces to end every episode (torchrl's reading of
    ``_last_cursor_index``: an int, or the last entry of a tensor or range)."""
    if cursor is None:
        return None
    if isinstance(cursor, torch.Tensor):
        cursor = cursor.reshape(-1)
        if not cursor.numel():
            raise RuntimeError("cursor must not be an empty tensor.")
        cursor = cursor[-1].item()
    elif isinstance(cursor, range):
        if not len(cursor):
            raise RuntimeError("cursor must not be an empty range.")
        cursor = cursor[-1]
    if isinstance(cursor, bool) or not isinstance(cursor, (int, np.integer)):
        raise RuntimeError("cursor should be an integer or a 1d tensor or a range.")
    if not -length <= cursor < length:
        raise IndexError(f"cursor {cursor} is out of range for a storage of {length} rows")
    return int(cursor) % length
