"""A sharded buffer's client-side bookkeeping of writes that do not wait for their shard.

Each shard hands a client ranges of its write sequence (``ReplayShard.reserve``); the client
takes the rows of a write from the ranges it holds, so that it knows their indices (row
``s % capacity`` of the shard for sequence number ``s``) before the shard has written them.
Pure Python and numpy, no Ray: :class:`~torchrl_compat.RayReplayBuffer` makes the calls.
"""
from __future__ import annotations

import collections

import numpy as np

__all__ = ["Reservations", "describe_rows"]


class Reservations:
    """The ranges of each shard's write sequence a client holds and has not written yet.

    Args:
        num_shards (int): the number of shards.
        block (int): the rows one reservation asks for.
    """

    def __init__(self, num_shards: int, block: int) -> None:
        self.block = block
        self._ranges = [collections.deque() for _ in range(num_shards)]

    def held(self, shard: int) -> int:
        """Rows reserved on ``shard`` and not written yet."""
        return sum(stop - start for _, start, stop in self._ranges[shard])

    def add(self, shard: int, token, start: int) -> None:
        self._ranges[shard].append((token, start, start + self.block))

    def take(self, shard: int, rows: int) -> list[tuple]:
        """``(token, start, rows)`` runs covering the next ``rows`` rows of ``shard`` (from the
        ranges held, oldest first; fewer rows when not enough are held)."""
        ranges = self._ranges[shard]
        runs = []
        while rows and ranges:
            token, start, stop = ranges[0]
            count = min(rows, stop - start)
            runs.append((token, start, count))
            rows -= count
            if start + count == stop:
                ranges.popleft()
            else:
                ranges[0] = (token, start + count, stop)
        return runs

    def restore(self, shard: int, token, start: int, stop: int) -> None:
        """Takes back the range ``[start, stop)`` of a write the shard refused to store (the
        next write takes its rows again)."""
        ranges = self._ranges[shard]
        at = 0
        while at < len(ranges) and ranges[at][1] < start:
            at += 1
        ranges.insert(at, (token, start, stop))

    def drop(self, shard: int | None = None) -> list[tuple]:
        """Forgets the ranges of ``shard`` (every shard when ``None``); returns them as
        ``(shard, token, start, stop)``, the furthest first."""
        shards = range(len(self._ranges)) if shard is None else [shard]
        dropped = []
        for k in shards:
            dropped.extend((k, *entry) for entry in reversed(self._ranges[k]))
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
