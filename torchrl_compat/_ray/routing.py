"""Where rows and draws go in a sharded buffer: global indices, shard capacities, write chunks
and the split of a batch over the shards.

Pure numpy and torch, no Ray: :class:`~torchrl_compat.RayReplayBuffer` calls these on the
client, and tests check them directly.

A sharded buffer is the concatenation of its shards: shard ``k`` holds its rows at the global
indices ``k * stride + local`` (``stride`` is the largest shard capacity), so that one shard
gives back its own indices and ``index // stride`` names the shard of any index. Rows are
written in the order of a :class:`WriteRing`: one ring of the buffer's whole capacity, striped
over the shards.
"""
from __future__ import annotations

import functools
import inspect

import numpy as np
import torch

__all__ = [
    "ShardTotals",
    "WriteRing",
    "capacity_of_factory",
    "plan_trajectories",
    "plan_write",
    "route_global_index",
    "route_masses",
    "route_uniform",
    "shard_capacities",
    "shard_factory",
    "split_by_counts",
    "trajectory_ends",
    "true_runs",
]

# The argument that sizes each kind of component (storages, priority trees).
CAPACITY_ARGUMENT = {"storage": "max_size", "sampler": "max_capacity"}


def shard_capacities(capacity: int, num_shards: int) -> list[int]:
    """The capacities of ``num_shards`` shards holding ``capacity`` rows in all: equal shares,
    the first ``capacity % num_shards`` shards one row more."""
    if capacity < num_shards:
        raise ValueError(
            f"Cannot split a capacity of {capacity} rows over num_shards={num_shards} shards: "
            "each shard needs at least one row."
        )
    base, extra = divmod(capacity, num_shards)
    return [base + (shard < extra) for shard in range(num_shards)]


def _capacity_parameter(func, name: str):
    """``(position, present)`` of ``name`` among ``func``'s parameters."""
    try:
        parameters = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return None
    return parameters.index(name) if name in parameters else None


def capacity_of_factory(factory, kind: str) -> int | None:
    """The global capacity a ``functools.partial`` factory gives (its ``max_size`` or
    ``max_capacity``), or ``None`` when it gives none."""
    name = CAPACITY_ARGUMENT[kind]
    if not isinstance(factory, functools.partial):
        return None
    if name in factory.keywords:
        return int(factory.keywords[name])
    position = _capacity_parameter(factory.func, name)
    if position is not None and position < len(factory.args):
        return int(factory.args[position])
    return None


def shard_factory(factory, kind: str, capacity: int | None):
    """``factory`` with its capacity argument replaced by ``capacity`` (one shard's share).

    A ``functools.partial`` holding the argument (positionally or by keyword) is rebuilt with
    the shard's share; any other factory is returned as it is (a component without a capacity,
    or one the caller sized per shard). An instance holding a capacity cannot be split and
    raises ``ValueError``.
    """
    name = CAPACITY_ARGUMENT[kind]
    if factory is None or capacity is None:
        return factory
    if isinstance(factory, functools.partial):
        if name in factory.keywords:
            return functools.partial(factory.func, *factory.args, **{**factory.keywords, name: capacity})
        position = _capacity_parameter(factory.func, name)
        if position is not None and position < len(factory.args):
            args = list(factory.args)
            args[position] = capacity
            return functools.partial(factory.func, *args, **factory.keywords)
        return factory
    if _holds_capacity(factory):
        raise ValueError(
            f"A sharded buffer builds one {kind} per shard: pass the {kind} as a factory "
            f"(e.g. functools.partial({type(factory).__name__}, ...)), not as the instance "
            f"{factory!r}, so that each shard gets its share of the capacity."
        )
    return factory


def _holds_capacity(component) -> bool:
    """Whether ``component`` is an instance sized by a capacity (a storage or priority trees)."""
    if isinstance(component, type) or isinstance(component, functools.partial):
        return False
    return any(hasattr(component, name) for name in ("max_size", "_max_capacity", "_storage"))


def route_global_index(index, stride: int, capacities) -> tuple[np.ndarray, np.ndarray]:
    """``(shard, local)`` of each global index (a 1-D int64 array).

    Raises:
        IndexError: naming the first index that no shard can hold.
    """
    index = np.asarray(index)
    if index.dtype.kind not in "iu":
        raise TypeError(f"global indices must be integers, got dtype {index.dtype}")
    index = index.astype(np.int64, copy=False).reshape(-1)
    shard, local = np.divmod(index, stride)
    limits = np.asarray(capacities, dtype=np.int64)
    bad = (index < 0) | (shard >= len(limits))
    if not bad.any():
        bad = local >= limits[shard]
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        raise IndexError(
            f"global index {int(index[position])} at position {position} is held by no shard: "
            f"{len(limits)} shard(s) hold the indices k * {stride} + [0, capacity_k) with "
            f"capacities {list(map(int, limits))}"
        )
    return shard, local


class ShardTotals:
    """The client's last known state of each shard, from the replies it got.

    Every reply of a shard carries its totals as they are after the call: ``count`` (rows
    stored), ``sum`` and ``min`` (of the priority leaves over the rows a draw covers),
    ``max_priority`` (the largest priority given, ``nan`` when none), ``rows_written`` (rows
    written since the shard's data began, checkpoints included), ``remaining`` (rows left in
    a without-replacement epoch), ``room`` (rows never written that no client holds: what the
    shard can still take before a write overwrites a row), ``frontier`` (the next sequence
    number the shard hands out) and ``incarnation`` (a token that changes when the shard
    actor restarts).
    """

    FIELDS = ("count", "sum", "min", "max_priority", "rows_written", "remaining", "room", "frontier",
              "incarnation")

    def __init__(self, num_shards: int) -> None:
        self.count = np.zeros(num_shards, dtype=np.int64)
        self.sum = np.zeros(num_shards, dtype=np.float64)
        self.min = np.full(num_shards, np.inf, dtype=np.float64)
        self.max_priority = np.full(num_shards, np.nan, dtype=np.float64)
        self.rows_written = np.zeros(num_shards, dtype=np.int64)
        self.remaining = np.zeros(num_shards, dtype=np.int64)
        self.room = np.zeros(num_shards, dtype=np.int64)
        self.frontier = np.zeros(num_shards, dtype=np.int64)
        self.incarnation = [None] * num_shards
        self.known = np.zeros(num_shards, dtype=bool)

    def __setstate__(self, state: dict) -> None:
        # arrays unpickled by Ray are read-only views of its object store
        self.__dict__.update({k: np.array(v) if isinstance(v, np.ndarray) else list(v) if isinstance(v, list) else v
                              for k, v in state.items()})

    def update(self, shard: int, totals: tuple) -> None:
        count, psum, pmin, pmax, rows_written, remaining, room, frontier, incarnation = totals
        self.count[shard] = count
        self.sum[shard] = psum
        self.min[shard] = pmin
        self.max_priority[shard] = np.nan if pmax is None else pmax
        self.rows_written[shard] = rows_written
        self.remaining[shard] = remaining
        self.room[shard] = room
        self.frontier[shard] = frontier
        self.incarnation[shard] = incarnation
        self.known[shard] = True

    def global_min(self) -> float:
        """The smallest priority leaf over the shards holding rows."""
        held = self.count > 0
        return float(self.min[held].min()) if held.any() else float("inf")

    def global_max_priority(self) -> float | None:
        values = self.max_priority[~np.isnan(self.max_priority)]
        return float(values.max()) if values.size else None


def _rand(batch_size: int, generator) -> np.ndarray:
    """``batch_size`` float64 draws in ``[0, 1)`` from ``generator`` (torch's global RNG
    when ``None``), so that ``torch.manual_seed`` decides the batches."""
    return torch.rand(batch_size, dtype=torch.float64, generator=generator).numpy()


def route_masses(sums: np.ndarray, batch_size: int, generator=None):
    """Exact prioritized draws over the concatenation of the shards' sum trees.

    Draws ``batch_size`` masses uniformly in ``[0, total)`` as one tree holding every leaf
    would, then routes each mass to the shard whose prefix-sum interval
    ``[offset_k, offset_k + sum_k)`` holds it; the shard descends its own tree with
    ``mass - offset_k``, given as the fraction ``(mass - offset_k) / sum_k`` of its total (see
    :class:`~torchrl_compat.RayReplayBuffer` for a total that changed in between).

    Returns:
        ``(shard, fraction)``: the shard of each draw and its fraction (float64 in ``[0, 1]``).
    """
    sums = np.asarray(sums, dtype=np.float64)
    total = float(sums.sum())
    if not total > 0:
        raise RuntimeError(f"Cannot draw from shards whose priorities sum to {total}.")
    masses = _rand(batch_size, generator) * total
    ends = np.cumsum(sums)
    shard = np.searchsorted(ends, masses, side="right")
    # A mass rounded up to the very end belongs to the last shard holding any mass.
    last = int(np.flatnonzero(sums > 0)[-1])
    np.minimum(shard, last, out=shard)
    shard = _off_empty(shard, sums)
    fraction = (masses - (ends - sums)[shard]) / sums[shard]
    np.clip(fraction, 0.0, 1.0, out=fraction)
    return shard, fraction


def _off_empty(shard: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Moves draws that rounding put on a shard of zero weight to the next one that has some
    (the previous one at the end)."""
    empty = weights[shard] <= 0
    if empty.any():
        positive = np.flatnonzero(weights > 0)
        after = np.searchsorted(positive, shard[empty], side="left")
        after = np.minimum(after, len(positive) - 1)
        shard = shard.copy()
        shard[empty] = positive[after]
    return shard


def route_uniform(counts: np.ndarray, batch_size: int, generator=None):
    """Uniform draws over every row of every shard: ``(shard, fraction)``, the row of a draw
    being ``floor(fraction * count_k)`` in its shard."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        raise RuntimeError("Cannot sample from an empty storage.")
    rows = np.floor(_rand(batch_size, generator) * total)
    np.minimum(rows, total - 1, out=rows)
    ends = np.cumsum(counts)
    shard = np.searchsorted(ends, rows, side="right")
    # the middle of the row: floor(fraction * count) gives it back whatever the rounding
    fraction = (rows - (ends - counts)[shard] + 0.5) / counts[shard]
    return shard, fraction


def split_by_counts(weights, total: int, generator=None, *, without_replacement=False) -> np.ndarray:
    """How many of ``total`` draws each shard takes: multinomial in proportion to ``weights``,
    or multivariate hypergeometric (draws without replacement from a pool of ``weights[k]``
    rows per shard) with ``without_replacement``."""
    weights = np.asarray(weights, dtype=np.int64)
    seed = int(torch.randint(0, 2**62, (), generator=generator))
    rng = np.random.default_rng(seed)
    if without_replacement:
        return rng.multivariate_hypergeometric(weights, total)
    return rng.multinomial(total, weights / weights.sum())


def true_runs(mask: np.ndarray) -> list[list[int]]:
    """``[start, stop)`` of each run of ``True`` in the 1-D boolean ``mask``."""
    padded = np.concatenate([[False], np.asarray(mask, dtype=bool), [False]])
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return edges.reshape(-1, 2).tolist()


def groups(shard: np.ndarray, num_shards: int) -> list[np.ndarray]:
    """The positions of each shard's draws, in draw order (one stable sort)."""
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[order], np.arange(num_shards + 1))
    return [order[bounds[k]:bounds[k + 1]] for k in range(num_shards)]


class WriteRing:
    """The order in which a sharded buffer writes its rows: one ring of ``sum(capacities)``
    rows, striped over the shards in runs of ``width`` rows.

    Round ``r`` of the ring holds rows ``[r * width, (r + 1) * width)`` of shard 0, then the
    same rows of shard 1, and so on (a shard with fewer rows left gives what it has, a shard
    with none is passed over). Each shard's rows come in its own order, so a client writing
    the ring from position ``sum(next_k)`` (``next_k``: the next sequence number of shard
    ``k``) writes every shard in turn from its cursor on: the buffer is then one round-robin
    buffer of the whole capacity, and a write overwrites the oldest rows of the buffer, as one
    buffer's would.

    Args:
        capacities (list[int]): the shards' capacities.
        width (int): the rows of a run (``chunk_rows``).

    Examples:
        >>> ring = WriteRing([4, 4], 3)
        >>> [ring.stripe(p) for p in (0, 2, 3, 6, 7)]
        [(0, 0, 3), (0, 2, 1), (1, 0, 3), (0, 3, 1), (1, 3, 1)]
    """

    def __init__(self, capacities, width: int) -> None:
        capacities = np.asarray(capacities, dtype=np.int64)
        if width < 1:
            raise ValueError(f"A WriteRing needs runs of at least one row, got width={width}")
        if capacities.size == 0 or (capacities < 1).any():
            raise ValueError(f"A WriteRing needs shards of at least one row, got capacities={capacities.tolist()}")
        num_shards = len(capacities)
        self.num_shards = num_shards
        self.capacity = int(capacities.sum())
        self.width = int(width)
        self.num_shards = num_shards
        # the rounds every shard fills whole, then the stripes of the rounds after them
        self._full_rounds = int(capacities.min() // width)
        self._head = self._full_rounds * num_shards * width
        last_round = -(-int(capacities.max()) // width)
        first_row = np.arange(self._full_rounds, last_round, dtype=np.int64)[:, None] * width
        lengths = np.clip(capacities[None, :] - first_row, 0, width)
        held = lengths > 0
        self._tail_shard = np.broadcast_to(np.arange(num_shards), lengths.shape)[held]
        self._tail_local = np.broadcast_to(first_row, lengths.shape)[held]
        self._tail_length = lengths[held]
        self._tail_start = np.cumsum(self._tail_length) - self._tail_length

    def stripe(self, position: int) -> tuple[int, int, int]:
        """``(shard, local row, rows left in its run)`` of ring position ``position`` (taken
        modulo the capacity)."""
        position = int(position) % self.capacity
        width = self.width
        if position < self._head:
            round_, rest = divmod(position, self.num_shards * width)
            shard, offset = divmod(rest, width)
            return shard, round_ * width + offset, width - offset
        rest = position - self._head
        at = int(np.searchsorted(self._tail_start, rest, side="right")) - 1
        offset = rest - int(self._tail_start[at])
        return (int(self._tail_shard[at]), int(self._tail_local[at]) + offset,
                int(self._tail_length[at]) - offset)

    def position(self, next_sequence) -> int:
        """The ring position a client continues from, given each shard's next sequence
        number (the rows written to it, laps included)."""
        return int(np.asarray(next_sequence, dtype=np.int64).sum() % self.capacity)


def plan_write(ring: WriteRing, position: int, num_rows: int, room=None, avoid=()) -> list[tuple[int, int]]:
    """``(shard, rows)`` pieces of a write of ``num_rows`` rows from ring ``position`` on, each
    inside one run of the ring.

    ``room`` (each shard's rows never written that this client may take) keeps the write from
    overwriting any row while some shard has room: a piece is cut to its shard's room, and a
    piece whose shard has none goes to the shard with the most room. Without room anywhere
    (or ``room=None``) the ring alone decides, each piece overwriting its shard's oldest rows;
    a piece for a shard in ``avoid`` then goes to the next shard of the ring that is not.
    """
    room = None if room is None else np.array(room, dtype=np.int64)
    num_shards = ring.num_shards
    if len(set(avoid)) >= num_shards:
        raise ValueError(f"plan_write: every shard is avoided ({sorted(avoid)}), none can take the write")
    pieces, filling = [], []
    while num_rows > 0:
        shard, _, left = ring.stripe(position)
        count = min(left, num_rows)
        fills = room is not None and room.sum() > 0
        if fills:
            if room[shard] <= 0:
                shard = int(np.argmax(room))
            count = min(count, int(room[shard]))
            room[shard] -= count
        else:
            while shard in avoid:
                shard = (shard + 1) % num_shards
        if pieces and pieces[-1][0] == shard and filling[-1] == fills:
            pieces[-1] = (shard, pieces[-1][1] + count)
        else:
            pieces.append((shard, count))
            filling.append(fills)
        position += count
        num_rows -= count
    return pieces


def trajectory_ends(data, keys) -> np.ndarray | None:
    """Whether each row of ``data`` ends a trajectory, read from the first of ``keys`` the
    batch holds: ``("end", key)`` (a done flag: the row ends one) or ``("traj", key)`` (a
    trajectory id: the row ends one where the next row's id differs). The last row never
    ends one by its id alone (the next write may continue it). ``None`` when the batch holds
    none of the keys."""
    from tensordict import TensorDictBase

    if not isinstance(data, TensorDictBase):
        return None
    present = data.keys(include_nested=True, leaves_only=True)
    for kind, key in keys:
        if key not in present:
            continue
        value = data.get(key).detach().cpu().reshape(data.shape[0], -1)
        if kind == "end":
            return value.any(-1).numpy()
        ends = np.zeros(data.shape[0], dtype=bool)
        ends[:-1] = (value[1:] != value[:-1]).any(-1).numpy()
        return ends
    return None


def plan_trajectories(ends: np.ndarray, chunk_rows: int, room, load, capacities, open_shard=None):
    """``(shard, start, stop)`` chunks of a write whose rows end trajectories where ``ends``
    says, so that no trajectory is cut between shards: each chunk holds whole trajectories
    (up to ``chunk_rows`` rows; a longer one goes in pieces to one shard, one after the
    other), and goes to the shard with room for all of it (the most room first), else to the
    one written the least relative to its capacity (``load``). The write's first trajectory
    continues on ``open_shard`` when the previous write left one open there.

    Returns:
        ``(chunks, open_shard)``: the chunks, and the shard of the write's last trajectory when
        the write does not end it (else ``None``).
    """
    room = np.array(room, dtype=np.int64)
    load = np.array(load, dtype=np.float64)
    capacities = np.asarray(capacities, dtype=np.float64)
    num_rows = len(ends)
    cuts = np.flatnonzero(ends) + 1
    bounds = np.concatenate([[0], cuts[cuts < num_rows], [num_rows]]).tolist()
    chunks = []
    shard = open_shard
    group_start = 0
    at = 0
    while group_start < num_rows:
        # whole trajectories up to chunk_rows rows (at least one, cut in pieces if longer)
        stop = bounds[at + 1]
        while at + 2 < len(bounds) and bounds[at + 2] - group_start <= chunk_rows:
            at += 1
            stop = bounds[at + 1]
        if shard is None:
            rows = stop - group_start
            fits = room >= rows
            if fits.any():
                shard = int(np.argmax(np.where(fits, room, -1)))
            elif room.sum() > 0:
                shard = int(np.argmax(room))
            else:
                shard = int(np.argmin(load))
        for start in range(group_start, stop, chunk_rows):
            end = min(stop, start + chunk_rows)
            chunks.append((shard, start, end))
            room[shard] = max(0, room[shard] - (end - start))
            load[shard] += (end - start) / capacities[shard]
        group_start = stop
        at += 1
        shard = None
    last_open = not (num_rows and ends[-1])
    return chunks, (chunks[-1][0] if chunks and last_open else None)
