"""Trajectory ends of a storage, kept up to date as the storage is written.

A ``SliceSampler`` without ``cache_values`` needs the start, stop and length of every
trajectory at each ``sample`` call. Reading the whole end-of-trajectory signal for that
costs O(capacity) per call; :class:`TrajectoryEnds` instead follows the writes made
through :meth:`~torchrl_compat.storages.TensorStorage.set` (see
``TensorStorage._writes_since``) and reads the signal only at the rows written since its
last call, so a call costs O(number of trajectories + rows written).
"""
from __future__ import annotations

import math
import threading
import weakref

import numpy as np
import torch
from tensordict import is_tensor_collection

import replay

from torchrl_compat._releases import since
from torchrl_compat.samplers._storage_reads import entry
from torchrl_compat.storages._journal import RowRun

__all__ = ["TrajectoryEnds"]

_NO_ENDS = np.empty(0, dtype=np.int64)
# Up to this many runs of rows written since the last call are merged one by one (each merge
# copies the ends); past it, the rows are listed and merged at once.
_MAX_RUNS = 4


class TrajectoryEnds:
    """The trajectory ends of a storage, followed through its writes.

    Keeps the sorted rows where the ``end_key`` entry of a storage is nonzero. Each call
    asks the storage which cursors were written since the previous one and reads the
    end signal at those rows only; it reads the whole signal (its rows below the
    storage's length, in one pass of ``replay.scan_ends`` over the column in place) on
    first use, after a write made in another process, when more writes were made than
    the storage's journal holds, after the storage was initialized, emptied or loaded,
    when the end tensor was replaced, and when the length decreased. Rows the length
    grows over are read when it does.

    Only 1-D storages of ``torchrl_compat`` (:class:`~torchrl_compat.TensorStorage` and
    its subclasses) holding a tensordict are followed, with an end entry on the CPU
    holding one value per step (shape ``[max_size]`` or ``[max_size, 1, ...]``) of a
    dtype numpy knows; :meth:`bounds` returns ``None`` for anything else, and the caller
    then reads the whole signal as before.

    The object holds a weak reference to the storage it follows: keep one per storage.
    Passing another storage starts over with a full read.

    Args:
        end_key (NestedKey): the key of the end-of-trajectory signal in the storage, e.g.
            ``("next", "done")``, or of the trajectory ids with ``from_ids=True``.

    Keyword Args:
        from_ids (bool, optional): if ``True``, ``end_key`` holds trajectory ids and an end is
            wherever the id changes from one step to the next (the last filled step of a full
            storage ends when its id differs from the first step's), as
            ``replay.find_start_stop_traj(trajectory=...)`` reads them. Defaults to ``False``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyTensorStorage
        >>> from torchrl_compat.samplers._trajectory_ends import TrajectoryEnds
        >>> storage = LazyTensorStorage(6)
        >>> done = torch.tensor([False, True, False, False, True, False]).unsqueeze(-1)
        >>> storage.set(torch.arange(4), TensorDict({("next", "done"): done[:4]}, [4]))
        >>> ends = TrajectoryEnds(("next", "done"))
        >>> start, stop, lengths = ends.bounds(storage)
        >>> start.flatten().tolist(), stop.flatten().tolist(), lengths.tolist()
        ([0, 2], [1, 3], [2, 2])
        >>> storage.set(torch.arange(4, 6), TensorDict({("next", "done"): done[4:]}, [2]))
        >>> start, stop, lengths = ends.bounds(storage)  # reads rows 4 and 5 only
        >>> start.flatten().tolist(), stop.flatten().tolist(), lengths.tolist()
        ([0, 2, 5], [1, 4, 5], [2, 3, 1])

    .. note:: :meth:`bounds` returns the same tensors again for as long as no end changes
        (as ``SliceSampler``'s cache does): read them, do not modify them in place.

    .. note:: Only writes made through :meth:`~torchrl_compat.TensorStorage.set` (or
        ``storage[index] = data``) are seen. Editing in place a tensor read from the
        storage (``storage[:]["done"][3] = True``), or an index tensor after passing it
        to ``set``, goes unnoticed until the next full read.
    """

    def __init__(self, end_key, *, from_ids: bool = False):
        self.end_key = end_key
        self.from_ids = from_ids
        # a sampler may be used from several threads (prefetching buffers)
        self._lock = threading.Lock()
        self._forget()

    def _forget(self) -> None:
        self._storage_ref = None  # weak reference to the storage followed
        self._signal_ref = None  # weak reference to its end tensor at the last read
        self._signal_layout = None  # (data_ptr, shape) of that tensor
        self._count = None  # the storage's write count at the last read
        self._length = 0  # len(storage) at the last read
        self._scanned = 0  # the rows [0, _scanned) of the signal were read (and followed since)
        # sorted rows (over the whole capacity) where end != 0; with ids, the rows t whose id
        # differs from row t + 1's
        self._signal = None  # the numpy view of that tensor's rows
        self._ends = _NO_ENDS
        self._last_differs = False  # with ids: the last filled row's id differs from row 0's
        self._result = None  # (ends, what else the result depends on, the result)

    def __getstate__(self):
        # weak references do not pickle; a copy starts with a full read
        return {"end_key": self.end_key, "from_ids": self.from_ids}

    def __setstate__(self, state):
        self.__init__(state["end_key"], from_ids=state.get("from_ids", False))

    def __repr__(self):
        return f"{type(self).__name__}(end_key={self.end_key!r}, num_ends={self._ends.size})"

    # ------------------------------------------------------------------ public
    @staticmethod
    def supports(storage) -> bool:
        """Whether ``storage`` can be followed: a 1-D ``torchrl_compat`` tensor storage
        holding an initialized tensordict (the end entry is checked by :meth:`bounds`)."""
        return (
            callable(getattr(storage, "_writes_since", None))
            and getattr(storage, "ndim", None) == 1
            and bool(getattr(storage, "initialized", False))
            and is_tensor_collection(getattr(storage, "_storage", None))
        )

    def update(self, storage) -> bool:
        """Brings the ends up to date with the writes made to ``storage``.

        Args:
            storage (Storage): the storage to follow.

        Returns:
            ``True`` if the storage is followed, ``False`` if it is not supported (see
            the class description).

        Raises:
            KeyError: if the storage holds no ``end_key`` entry.
        """
        with self._lock:
            return self._update(storage) is not None

    def stops(self, storage):
        """What the trajectories of ``storage`` are derived from: the arguments of
        ``replay.bounds_from_ends`` that give :meth:`bounds`.

        Updates the ends (see :meth:`update`) without deriving anything from them, for a
        caller that needs a few trajectories only (``replay.bounds_summary``,
        ``replay.sample_slice_index_from_ends``).

        Args:
            storage (Storage): the storage to read.

        Returns:
            ``(ends, limit, length, forced)``: the sorted end rows (an int64 array, read only),
            the row below which they count, the number of rows of the signal and a tuple of
            rows forced to end a trajectory; ``None`` where :meth:`bounds` returns ``None``.

        Raises:
            KeyError: if the storage holds no ``end_key`` entry.
        """
        with self._lock:
            length = self._update(storage)
            ends = self._ends
            last_differs = self._last_differs
        if length is None:
            return None
        full = length == storage.max_size
        # the filled rows (a length past the capacity, only set by hand, reads them all)
        length = min(length, storage.max_size)
        if length < 2:
            return None
        forced = ()
        if full:
            cursor = _written_last(storage)
            if cursor is not None:
                row = _last_row(storage, cursor, length)
                if row is None:
                    return None
                forced = (row,)
        # Rows past the length hold stale or uninitialized data: not part of the signal (with
        # ids, the pair of rows length - 1 and length is not either).
        if not full or (self.from_ids and last_differs):
            forced += (length - 1,)
        limit = length - 1 if self.from_ids else length
        return ends, limit, length, forced

    def bounds(self, storage):
        """Start, stop and length of every trajectory in ``storage``.

        Updates the ends (see :meth:`update`), then derives the result from them in
        O(number of trajectories).

        Args:
            storage (Storage): the storage to read.

        Returns:
            ``(start_idx, stop_idx, lengths)``: CPU int64 tensors of shapes
            ``[num_traj, 1]``, ``[num_traj, 1]`` and ``[num_traj]``, equal to
            ``replay.find_start_stop_traj(end=storage[:][end_key].squeeze()[:len(storage)],
            at_capacity=storage._is_full, cursor=storage._last_cursor)``; or ``None``
            when the storage is not supported, or when that call would not give a
            result this one reproduces: a storage of length 0 or 1 (the squeezed signal
            is not 1-D and the call raises), or a full storage whose ``_last_cursor`` is
            neither an int, a non-empty range nor a non-empty 1-D integer or bool
            tensor, or is out of range. On ``None`` the caller computes the result from
            the whole signal, which gives the same values or the same error as before.

        Raises:
            KeyError: if the storage holds no ``end_key`` entry.
        """
        stops = self.stops(storage)
        if stops is None:
            return None
        ends, limit, length, forced = stops
        # Nothing written since the last call: the same tensors (as a cache would give).
        depends_on = (limit, length, forced)
        cached = self._result
        if cached is not None and cached[0] is ends and cached[1] == depends_on:
            return cached[2]
        # One C pass over the ends.
        result = tuple(
            torch.from_numpy(array) for array in replay.bounds_from_ends(ends, limit, length, forced)
        )
        with self._lock:
            if self._ends is ends:
                self._result = (ends, depends_on, result)
        return result

    # ---------------------------------------------------------------- internals
    def _update(self, storage) -> int | None:
        """Syncs with ``storage``; returns the length read, ``None`` if unsupported."""
        if not self.supports(storage):
            self._forget()
            return None
        same_storage = self._storage_ref is not None and self._storage_ref() is storage
        # The count is read before any item: a write finishing meanwhile is counted
        # after this call's count, so the next call reads its rows again.
        count, cursors = storage._writes_since(self._count if same_storage else None)
        tensor = entry(storage._storage, self.end_key)  # KeyError if missing, as storage[:]
        layout = (tensor.data_ptr(), tuple(tensor.shape)) if isinstance(tensor, torch.Tensor) else None
        same_signal = (
            self._signal_ref is not None
            and self._signal_ref() is tensor
            and self._signal_layout == layout
        )
        if same_signal:
            signal = self._signal  # the numpy view made from this very tensor
        else:
            signal = _signal_view(tensor, storage.max_size)
            if self.from_ids and isinstance(tensor, torch.Tensor) and tensor.ndim != 1:
                signal = None  # ids of shape [N, 1] read as a 2-D signal by the full path
        if signal is None:
            self._forget()
            return None
        length = len(storage)
        # rows past the length hold stale or uninitialized data that no result reads: the
        # scan stops at the length (a storage of 2^30 rows filled to 2^20 reads 2^20), and the
        # rows the length grows over are read when it does
        filled = min(length, signal.shape[0])
        ends = None
        if cursors is not None and same_signal and length >= self._length:
            ends = self._follow(signal, cursors, self._scanned) if cursors else self._ends
            if ends is not None and filled > self._scanned:
                ends = self._read_grown(signal, ends, self._scanned, filled)
        if ends is None:
            ends = self._scan(signal[:filled])
            self._scanned = filled
        else:
            self._scanned = max(self._scanned, filled)
        if self.from_ids:
            last = filled - 1
            self._last_differs = last > 0 and bool(signal[last] != signal[0])
        if not same_storage:
            self._storage_ref = weakref.ref(storage)
        if not same_signal:
            self._signal_ref = weakref.ref(tensor)
            self._signal_layout = layout
            self._signal = signal
        self._count = count
        self._length = length
        self._ends = ends
        return length

    def _follow(self, signal: np.ndarray, cursors: list, scanned: int) -> np.ndarray | None:
        """The ends after the writes at ``cursors``, read at the rows they touched only;
        ``None`` when they cannot be followed (the caller then reads everything).

        Only rows below ``scanned`` are read: the ends hold nothing past it, and the rows
        past it are read when the length grows over them (:meth:`_read_grown`).
        Round-robin writes (:class:`~torchrl_compat.storages._journal.RowRun`) are read
        again run by run, each merged in one C call (no row list, sort or gather); other
        cursors (or more than a few runs) become one sorted list of the rows written."""
        size = signal.shape[0]
        # the rows (ids: the pairs of rows, named by their first) the ends cover
        covered = max(scanned - 1, 0) if self.from_ids else scanned
        if len(cursors) <= _MAX_RUNS and all(type(cursor) is RowRun for cursor in cursors):
            ends = self._ends
            for run in cursors:
                if not (0 <= run.start < size and 0 <= run.numel <= size):
                    return None
                for lo, hi in run.pieces(size):
                    if self.from_ids:
                        # the pairs (t, t + 1) of rows a write of [lo, hi) may change
                        lo = max(lo - 1, 0)
                    hi = min(hi, covered)
                    if lo < hi:
                        ends = replay.patch_ends_run(ends, lo, hi, self._read_run(signal, lo, hi))
            return ends
        rows = _written_rows(cursors, size)
        if rows is None:
            return None
        if self.from_ids:
            rows = _pairs_touched(rows, size)
        return self._patch(signal, rows[: np.searchsorted(rows, covered)])

    def _read_grown(self, signal: np.ndarray, ends: np.ndarray, scanned: int, filled: int) -> np.ndarray:
        """The ends with the rows ``[scanned, filled)`` the length has grown over read (ids:
        the pairs of rows they take part in). O(filled - scanned)."""
        lo, hi = (max(scanned - 1, 0), filled - 1) if self.from_ids else (scanned, filled)
        if lo >= hi:
            return ends
        return replay.patch_ends_run(ends, lo, hi, self._read_run(signal, lo, hi))

    def _read_run(self, signal: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Whether ``signal`` is nonzero (ids: differs from the next row) at rows ``lo`` to
        ``hi - 1``: a view of the signal itself when it is a bool one. O(hi - lo)."""
        if self.from_ids:
            return signal[lo:hi] != signal[lo + 1 : hi + 1]
        part = signal[lo:hi]
        return part if part.dtype == np.uint8 else part != 0

    def _scan(self, signal: np.ndarray) -> np.ndarray:
        """All the rows where ``signal`` (the filled rows of the end entry) is nonzero (ids:
        differs from the next row). O(rows).

        One pass of ``replay.scan_ends`` over the signal itself: no copy of the column nor
        temporary of its size (a first sample after filling 2^26 rows otherwise spent most of
        its time writing fresh memory), and each element read once, so another process writing
        the storage meanwhile cannot make it fail. Dtypes the kernel does not read (complex,
        float ids) are scanned by numpy in blocks.
        """
        try:
            return replay.scan_ends(signal, from_ids=self.from_ids)
        except TypeError:
            return _scan_in_blocks(signal, self.from_ids)

    def _read(self, signal: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Whether ``signal`` is nonzero (ids: differs from the next row) at each of ``rows``.
        O(len(rows))."""
        if self.from_ids:
            return signal[rows] != signal[rows + 1]
        return signal[rows] != 0

    def _patch(self, signal: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The ends with ``rows`` (sorted, distinct) read again: the same array when none
        changed. O(len(rows) + num_ends), one C merge."""
        if not rows.size:
            return self._ends
        return replay.patch_ends(self._ends, rows, self._read(signal, rows))


# Rows numpy reads at a time where replay.scan_ends cannot: the temporaries stay this small.
_SCAN_BLOCK = 1 << 20


def _scan_in_blocks(signal: np.ndarray, from_ids: bool) -> np.ndarray:
    """``replay.scan_ends`` by numpy, a block of rows at a time (each block copied first:
    numpy's nonzero counts, then fills, and another process writing the storage between the
    two raises "number of non-zero array elements changed")."""
    size = signal.shape[0]
    stop = size - 1 if from_ids else size
    parts = [_NO_ENDS]
    for lo in range(0, max(stop, 0), _SCAN_BLOCK):
        hi = min(lo + _SCAN_BLOCK, stop)
        if from_ids:
            block = signal[lo : hi + 1].copy()
            rows = np.flatnonzero(block[:-1] != block[1:])
        else:
            rows = np.flatnonzero(signal[lo:hi].copy())
        parts.append(rows.astype(np.int64, copy=False) + lo)
    return np.concatenate(parts)


def _written_last(storage):
    """The cursor of the storage's last write as the followed release reads it: from torchrl
    0.14 on, the time coordinate taken at the write (``_last_cursor_index``: the caller may
    have reused its index object since), before, the cursor object itself."""
    if since("slice_mutation_revision"):
        index = getattr(storage, "_last_cursor_index", _NO_INDEX)
        if index is not _NO_INDEX:
            return index
    return storage._last_cursor


_NO_INDEX = object()


def _last_row(storage, cursor, length: int) -> int | None:
    """:func:`_cursor_row` of ``cursor``, from what the storage remembers of its last
    round-robin write when it can (no tensor read)."""
    remembered = getattr(storage, "_last_cursor_row", None)
    row = remembered(cursor) if remembered is not None else None
    if row is not None and 0 <= row < length:
        return row
    return _cursor_row(cursor, length)


def _signal_view(tensor, max_size: int) -> np.ndarray | None:
    """A 1-D numpy view over all the rows of the end entry, or ``None`` if unsupported."""
    if (
        not isinstance(tensor, torch.Tensor)
        or tensor.ndim == 0
        or tensor.shape[0] != max_size
        or math.prod(tensor.shape[1:]) != 1
        or tensor.device.type != "cpu"
    ):
        return None
    try:
        array = tensor.numpy()
    except (TypeError, RuntimeError):  # no numpy dtype (bfloat16...), conj / neg bits
        return None
    # basic indexing drops the unit dimensions without ever copying
    signal = array[(slice(None),) + (0,) * (array.ndim - 1)]
    if signal.dtype == np.bool_:
        # uninitialized storage rows may hold bool bytes other than 0 and 1: compare
        # the bytes, as replay.find_start_stop_traj does
        signal = signal.view(np.uint8)
    return signal


def _written_rows(cursors: list, size: int) -> np.ndarray | None:
    """The sorted distinct rows in ``[0, size)`` written through ``cursors``.

    Returns ``None`` when a cursor is of a kind not handled here (the caller then reads
    everything). O(rows log rows).
    """
    parts = []
    for cursor in cursors:
        rows = _cursor_rows(cursor, size)
        if rows is None:
            return None
        parts.append(rows)
    if not parts:
        return _NO_ENDS
    rows = np.sort(np.concatenate(parts) if len(parts) > 1 else parts[0])
    if rows.size:
        # index arrays are checked here, on the sorted rows: two reads, not two reductions
        if rows[0] < -size or rows[-1] >= size:
            return None
        if rows[0] < 0:
            rows = np.sort(np.where(rows < 0, rows + size, rows))
    if rows.size > 1:
        distinct = rows[1:] != rows[:-1]
        if not distinct.all():
            rows = rows[np.concatenate(([True], distinct))]
    return rows


def _pairs_touched(rows: np.ndarray, size: int) -> np.ndarray:
    """The pairs ``(t, t + 1)`` of rows, named by ``t``, that a write of the sorted distinct
    ``rows`` may change: ``rows`` and ``rows - 1``, within ``[0, size - 1)``.

    ``rows[k] - 1, rows[k], rows[k + 1] - 1, ...`` is already sorted (``rows[k] <=
    rows[k + 1] - 1``), so interleaving and dropping repeats replaces a sort (np.unique
    hashes, about 25 us for a 256-row write)."""
    both = np.empty(2 * rows.size, dtype=np.int64)
    both[0::2] = rows - 1
    both[1::2] = rows
    if both.size > 1:
        keep = np.empty(both.size, dtype=bool)
        keep[0] = True
        np.not_equal(both[1:], both[:-1], out=keep[1:])
        both = both[keep]
    return both[(both >= 0) & (both < size - 1)]


def _cursor_rows(cursor, size: int) -> np.ndarray | None:
    """The rows a write at ``cursor`` touches (repeats allowed): in ``[0, size)``, except
    for index arrays, whose rows are returned as given (possibly negative or out of range)
    for :func:`_written_rows` to check and wrap once sorted."""
    if type(cursor) is RowRun:
        if not (0 <= cursor.start < size and 0 <= cursor.numel <= size):
            return None
        return (np.arange(cursor.start, cursor.start + cursor.numel, dtype=np.int64)) % size
    if isinstance(cursor, bool):
        return None  # indexing with True adds a dimension
    if isinstance(cursor, (int, np.integer)):
        cursor = int(cursor)
        if not -size <= cursor < size:
            return None
        return np.array([cursor % size], dtype=np.int64)
    if isinstance(cursor, slice):
        try:
            return np.arange(*cursor.indices(size), dtype=np.int64)
        except (TypeError, ValueError):
            return None
    if isinstance(cursor, range):
        rows = np.arange(cursor.start, cursor.stop, cursor.step, dtype=np.int64)
    elif isinstance(cursor, torch.Tensor):
        if cursor.device.type != "cpu" or cursor.requires_grad:
            cursor = cursor.detach().cpu()
        if cursor.dtype == torch.bool:
            return _mask_rows(cursor.numpy(), size)
        if cursor.is_floating_point() or cursor.is_complex() or cursor.dtype == torch.uint8:
            return None  # uint8 tensors index as masks (deprecated)
        rows = cursor.numpy()
    elif isinstance(cursor, (np.ndarray, list)):
        rows = np.asarray(cursor)
        if rows.ndim != 1:
            return None
        if rows.dtype == np.bool_:
            return _mask_rows(rows, size)
        if rows.dtype.kind not in "iu" or rows.dtype == np.uint8:
            return None
    else:
        return None  # tuples (several dimensions), ellipsis...
    return rows.reshape(-1).astype(np.int64, copy=False)


def _mask_rows(mask: np.ndarray, size: int) -> np.ndarray | None:
    if mask.shape != (size,):
        return None
    return np.flatnonzero(mask).astype(np.int64, copy=False)


def _cursor_row(cursor, length: int) -> int | None:
    """The row a full storage's last cursor closes, read as ``replay.find_start_stop_traj``
    reads it: an int, or the last element of a range or of a 1-D integer or bool tensor.

    Returns ``None`` for any other cursor and for a row outside ``[-length, length)``:
    ``replay`` raises for most of them, and reading the whole signal reproduces that.
    """
    if isinstance(cursor, torch.Tensor):
        if (
            cursor.ndim != 1
            or not cursor.numel()
            or cursor.is_floating_point()
            or cursor.is_complex()
        ):
            return None
        row = int(cursor[-1])  # a mask's last flag, as replay reads it, for bool
    elif isinstance(cursor, range):
        if not len(cursor):
            return None
        row = cursor[-1]
    elif isinstance(cursor, (int, np.integer)):
        row = int(cursor)
    else:
        return None
    if not -length <= row < length:
        return None
    return row % length
