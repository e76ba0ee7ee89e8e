"""The write journal of a tensor storage: which items its writes touched, in order.

Readers that derive something from the stored items (the trajectory ends of a slice sampler)
follow the writes instead of reading the whole storage each time. The storage counts its
writes in a counter that other processes see (see ``TensorStorage._note_write``); this module
keeps, local to the process, what the latest of those writes touched.

An entry holds a snapshot of the index a write used, never the caller's object: a caller that
edits its index tensor in place after the write (``index += n``, a reused buffer) does not
change what the journal says was written. A round-robin write, whose rows are one run modulo
the capacity, is journaled as that run (:class:`RowRun`): two ints instead of a copy of its
index, and readers re-read the run as one block instead of sorting and checking its rows.
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np
import torch

__all__ = ["ALL_ITEMS", "JOURNAL_LENGTH", "RowRun", "WriteJournal"]

# How many of its own writes a process remembers. A reader further behind reads the whole
# storage again.
JOURNAL_LENGTH = 64

# The cursor of a change that may have touched every item (initialization, emptying,
# loading, a write that failed half-way).
ALL_ITEMS = object()


class RowRun(NamedTuple):
    """The rows ``(start + k) % capacity`` for ``k < numel`` of a storage of ``capacity`` rows
    (``0 <= start < capacity``, ``0 <= numel <= capacity``): what a round-robin write of
    ``numel`` items from row ``start`` touches.

    Examples:
        >>> RowRun(start=8, numel=4).pieces(10)
        [(8, 10), (0, 2)]
    """

    start: int
    numel: int

    def pieces(self, capacity: int) -> list:
        """The run as one or two ``(lo, hi)`` row ranges within ``[0, capacity)``, in order."""
        stop = self.start + self.numel
        if stop <= capacity:
            return [(self.start, stop)]
        return [(self.start, capacity), (0, stop - capacity)]


def _snapshot(cursor):
    """What ``cursor`` indexes now, in an object the caller cannot change afterwards.

    Ints, slices, ranges and row runs are immutable and kept as they are; index tensors,
    arrays and lists are copied (1-D CPU tensors and lists become arrays: readers interpret them alike). Tuples (several
    dimensions) and other kinds are kept: readers do not interpret them and read everything.
    """
    if isinstance(cursor, torch.Tensor):
        if cursor.ndim == 1 and cursor.device.type == "cpu" and not cursor.requires_grad:
            try:
                # a tenth of a tensor clone's cost; readers take 1-D arrays as tensors
                return cursor.numpy().copy()
            except (TypeError, RuntimeError):  # no numpy dtype, conj / neg bits
                pass
        return cursor.detach().clone()
    if isinstance(cursor, np.ndarray):
        return cursor.copy()
    if isinstance(cursor, list):
        try:
            return np.array(cursor)
        except (ValueError, TypeError):  # ragged or mixed: no row list to keep
            return ALL_ITEMS
    return cursor


def _cursor_size(cursor) -> int:
    """The number of indices a journal entry holds for ``cursor``."""
    if isinstance(cursor, torch.Tensor):
        return cursor.numel()
    if isinstance(cursor, np.ndarray):
        return cursor.size
    return 1  # ints, slices, ranges and row runs are O(1)


class WriteJournal:
    """The latest writes of one process to one storage, as ``(count, cursor)`` entries.

    Nothing is recorded until a reader starts following (:meth:`follow`): until then no
    reader holds a count that the entries could answer, and writes cost nothing extra.

    Args:
        max_rows (int): the storage capacity. The indices held add up to at most about that
            many (a reader that far behind would read as much as a full rescan anyway).

    Examples:
        >>> import torch
        >>> journal = WriteJournal(max_rows=10)
        >>> journal.follow()
        >>> index = torch.arange(3)
        >>> journal.append(1, index)
        >>> index += 5  # the caller reuses its buffer
        >>> journal.since(0, 1)
        [array([0, 1, 2])]
    """

    __slots__ = ("max_rows", "followed", "_entries", "_rows")

    def __init__(self, max_rows: int):
        self.max_rows = max_rows
        self.followed = False
        self._entries = deque()
        self._rows = 0

    @property
    def rows(self) -> int:
        """The number of indices the entries hold."""
        return self._rows

    def follow(self) -> None:
        """Starts recording the writes (the first reader is about to read the counter)."""
        self.followed = True

    def append(self, count: int, cursor) -> None:
        """Records write number ``count`` at ``cursor`` (:data:`ALL_ITEMS`: anywhere). O(1)
        plus the copy of an index tensor, and only once a reader follows."""
        if not self.followed:
            return
        entries = self._entries
        if cursor is not ALL_ITEMS:
            cursor = _snapshot(cursor)
        if cursor is ALL_ITEMS:
            entries.clear()
            self._rows = 0
            return
        rows = _cursor_size(cursor)
        entries.append((count, cursor, rows))
        held = self._rows + rows
        while len(entries) > JOURNAL_LENGTH or (held > self.max_rows and entries):
            held -= entries.popleft()[2]
        self._rows = held

    def since(self, count: int, now: int) -> list | None:
        """The cursors of writes ``count + 1`` to ``now``, in the order they were made.

        Returns ``None`` when they are not all recorded here (writes made in another process,
        more writes than the journal holds, or a change that may have touched every item).
        O(journal length).
        """
        missed = now - count
        if missed == 0:
            return []
        # one C-level copy under the GIL: a writer thread cannot change it halfway
        entries = list(self._entries)
        if missed < 0 or missed > len(entries):
            return None
        entries = entries[len(entries) - missed :]
        # counts are distinct, but threads may journal them out of order
        for expected, entry in enumerate(entries, count + 1):
            if entry[0] != expected:
                return None
        return [entry[1] for entry in entries]
