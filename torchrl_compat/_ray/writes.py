"""A sharded buffer's client-side bookkeeping of writes that do not wait for their shard.

Each shard hands a client ranges of its write sequence (``ReplayShard.reserve``); the client
takes the rows of a write from the ranges it holds, so that it knows their indices (row
``s % capacity`` of the shard for sequence number ``s``) before the shard has written them.
Pure Python and numpy, no Ray: :class:`~torchrl_compat.RayReplayBuffer` makes the calls.
"""
from __future__ import annotations

import collections

import numpy as np

__all__ = ["LAPSED", "Reservations", "describe_rows"]

# Why a shard refuses a write under a reservation it handed out before it was restarted,
# emptied or loaded (the client then drops the other ranges it holds there).
LAPSED = "the shard was restarted, emptied or loaded after the rows were reserved"


class Reservations:
    """The ranges of each shard's write sequence a client holds and has not written yet.

    A range either fills the shard (its rows were never written in the shard's current
    epoch) or laps it (each of its rows overwrites the oldest row there): a shard never hands
    out one range that does both, so that a client can fill every shard before it overwrites
    any row.

    Args:
        num_shards (int): the number of shards.
        block (int): the rows one reservation asks for.
    """

    def __init__(self, num_shards: int, block: int) -> None:
        self.block = block
        self._ranges = [collections.deque() for _ in range(num_shards)]

    def held(self, shard: int, *, fills: bool = False) -> int:
        """Rows reserved on ``shard`` and not written yet (``fills``: only those that fill it)."""
        return sum(stop - start for _, start, stop, filling in self._ranges[shard] if filling or not fills)

    def next_start(self, shard: int) -> int | None:
        """The sequence number of the next row this client would write on ``shard``."""
        ranges = self._ranges[shard]
        return ranges[0][1] if ranges else None

    def add(self, shard: int, token, start: int, stop: int, fills: bool) -> None:
        self._ranges[shard].append((token, start, stop, fills))

    def take(self, shard: int, rows: int, *, fills: bool = False) -> list[tuple]:
        """``(token, start, rows, fills)`` runs covering the next ``rows`` rows of ``shard``
        (from the ranges held, oldest first; fewer rows when not enough are held). ``fills``
        takes only rows that fill the shard."""
        ranges = self._ranges[shard]
        runs = []
        while rows and ranges:
            token, start, stop, filling = ranges[0]
            if fills and not filling:
                break
            count = min(rows, stop - start)
            runs.append((token, start, count, filling))
            rows -= count
            if start + count == stop:
                ranges.popleft()
            else:
                ranges[0] = (token, start + count, stop, filling)
        return runs

    def trim(self, shard: int, below: int) -> None:
        """Forgets the sequence numbers of ``shard`` under ``below``: other clients' writes have
        lapped them (writing there would overwrite a newer row)."""
        ranges = self._ranges[shard]
        while ranges and ranges[0][1] < below:
            token, start, stop, filling = ranges.popleft()
            if stop > below:
                ranges.appendleft((token, below, stop, filling))
                break

    def restore(self, shard: int, token, start: int, stop: int, fills: bool) -> None:
        """Takes back the range ``[start, stop)`` of a write the shard refused to store (the
        next write takes its rows again)."""
        ranges = self._ranges[shard]
        at = 0
        while at < len(ranges) and ranges[at][1] < start:
            at += 1
        ranges.insert(at, (token, start, stop, fills))

    def drop(self, shard: int | None = None) -> list[tuple]:
        """Forgets the ranges of ``shard`` (every shard when ``None``); returns them as
        ``(shard, token, start, stop)``, the furthest first."""
        shards = range(len(self._ranges)) if shard is None else [shard]
        dropped = []
        for k in shards:
            dropped.extend((k, token, start, stop) for token, start, stop, _ in reversed(self._ranges[k]))
            self._ranges[k].clear()
        return dropped


def describe_rows(index: np.ndarray, limit: int = 4) -> str:
    """``index`` as runs of consecutive values (``"100..159, 300..309 (70 rows)"``), the first
    ``limit`` runs named."""
    index = np.asarray(index, dtype=np.int64).reshape(-1)
    if not index.size:
        return "no rows"
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [index.size]])
    runs = [f"{index[a]}" if b - a == 1 else f"{index[a]}..{index[b - 1]}" for a, b in zip(starts, stops)]
    text = ", ".join(runs[:limit]) + (f", ... ({len(runs) - limit} more runs)" if len(runs) > limit else "")
    return f"{text} ({index.size} rows)"
