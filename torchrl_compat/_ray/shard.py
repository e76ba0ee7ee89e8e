"""One shard of a :class:`~torchrl_compat.RayReplayBuffer`: a replay buffer of ours inside a Ray
actor, holding its share of the rows (and, when prioritized, its own sum and min trees).

The class is plain Python; the client makes it a Ray actor. Every method that changes or reads
the shard returns the shard's totals (:meth:`ReplayShard.totals`) with its result, so that the
client always knows the latest sums, minima and counts without asking for them.

Recovery: when the shard is given a ``recovery_dir``, it keeps there a pointer to its part of
the last committed checkpoint (``shard-<k>.json``) and, with ``write_ahead``, a journal of every
write and priority update made since (``shard-<k>.wal/<segment>.log``). A shard actor that Ray
restarts after a crash runs its constructor again: it loads that checkpoint, replays the
journal, and says so in :meth:`ReplayShard.describe` (``restored``).
"""
from __future__ import annotations

import functools
import json
import pickle
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchrl_compat._ray import wire
from torchrl_compat._ray.routing import true_runs
from torchrl_compat._ray.writes import LAPSED
from torchrl_compat._torchrl_lookup import accepted_classes
from torchrl_compat.checkpointers._publish import publish_file
from torchrl_compat.samplers._trees import is_replay_tree, tree_dtype
from torchrl_compat.replay_buffers import TensorDictReplayBuffer
from torchrl_compat.storages import TensorStorage
from torchrl_compat.writers import RoundRobinWriter
from torchrl_compat.samplers import (
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    SamplerWithoutReplacement,
    SliceSampler,
)

__all__ = ["ReplayShard", "SHARD_METADATA", "shard_directory"]

SHARD_METADATA = "shard.json"
# What a shard without a bounded storage reports as its room.
UNBOUNDED_ROOM = 2**62


def _locked(method):
    """Runs ``method`` under the shard's lock: a compiled graph calls the actor from a thread
    of its own, beside the one that runs ordinary calls."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return run


def shard_directory(root, shard: int, version: str) -> Path:
    """Where shard ``shard`` writes its part of the checkpoint ``version`` under ``root``."""
    return Path(root) / f"shard_{shard:03d}" / version


def sampler_kind(sampler) -> str:
    """How a sharded buffer splits a batch for ``sampler``: ``"prioritized"`` (exact, by the
    shards' priority sums), ``"uniform"`` (by their counts), ``"without_replacement"`` (by the
    rows left in their epochs), ``"slice"`` (whole slices, by counts) or ``"unsupported"``."""
    if isinstance(sampler, accepted_classes(PrioritizedSliceSampler, "samplers")):
        return "unsupported"
    if isinstance(sampler, accepted_classes(SliceSampler, "samplers")):
        return "slice"
    if isinstance(sampler, accepted_classes(PrioritizedSampler, "samplers")):
        return "prioritized"
    if isinstance(sampler, accepted_classes(SamplerWithoutReplacement, "samplers")):
        return "without_replacement"
    if isinstance(sampler, accepted_classes(RandomSampler, "samplers")):
        return "uniform"
    return "unsupported"


class ReplayShard:
    """A replay buffer holding one shard's rows, driven by a sharded buffer's client.

    Args:
        shard (int): this shard's number.
        replay_buffer_cls (type): the buffer class (ours).
        buffer_kwargs (dict): its keyword arguments, the storage and sampler sized for the shard.
        recovery_dir (str, optional): where the pointer to the last checkpoint (and the journal)
            live, so that a restarted actor finds them.
        write_ahead (bool): whether to journal every write and priority update.
    """

    def __init__(self, shard: int, replay_buffer_cls, buffer_kwargs: dict, recovery_dir=None,
                 write_ahead: bool = False) -> None:
        self._shard = shard
        self._lock = threading.RLock()
        _limit_threads()
        self._generator = torch.Generator()
        self._buffer = replay_buffer_cls(**buffer_kwargs)
        self._buffer.set_rng(self._generator)
        self._kind = sampler_kind(self._buffer._sampler)
        self._incarnation = uuid.uuid4().hex
        self._rows_written = 0
        self._recovery_dir = None if recovery_dir is None else Path(recovery_dir)
        self._write_ahead = bool(write_ahead) and self._recovery_dir is not None
        self._journal = None
        self._segment = 0
        self._dumped = {}  # version -> (segment that follows it, rows written), until committed
        self._epoch = 0
        self._reservable = _reservable(self._buffer, self._kind)
        self._reset_rows()
        self._restored = self._recover() if self._recovery_dir is not None else None
        self._new_epoch()
        if self._write_ahead:
            self._open_segment(self._segment + 1)

    # ------------------------------------------------------------------ state
    def _count(self) -> int:
        """Rows stored: the storage's length less the rows reserved below it and not written
        yet (clients write their reserved rows in any order)."""
        if self._filled is None:
            return len(self._buffer._storage)
        return self._filled_count

    def _room(self) -> int:
        """Rows never written that no client holds."""
        if self._reservable:
            ahead = self._fill_end - self._frontier if self._frontier < self._fill_end else 0
            return ahead + sum(stop - start for start, stop in self._returned)
        max_size = getattr(self._buffer._storage, "max_size", None)
        if max_size is None:
            return UNBOUNDED_ROOM
        return max(0, int(max_size) - len(self._buffer._storage))

    @_locked
    def totals(self) -> tuple:
        """``(count, sum, min, max_priority, rows_written, remaining, room, frontier,
        incarnation)`` (see :class:`~torchrl_compat._ray.routing.ShardTotals`)."""
        buffer = self._buffer
        length = len(buffer._storage)
        count = self._count()
        psum = pmin = 0.0
        pmax = None
        remaining = count
        sampler = buffer._sampler
        if self._kind == "prioritized":
            if length:
                psum = float(sampler._sum_tree.query(0, length))
                pmin = float(sampler._min_tree.query(0, length))
            maximum = sampler._max_priority[0]
            pmax = None if maximum is None else float(maximum)
        elif self._kind == "without_replacement" and sampler._has_sample_list():
            remaining = sampler._remaining_in_epoch()
        frontier = self._frontier if self._reservable else self._rows_written
        return (count, psum, pmin, pmax, self._rows_written, remaining, self._room(), frontier,
                self._incarnation)

    @_locked
    def describe(self) -> dict:
        """What the client needs to know once: the sampler, the storage, the recovery."""
        sampler = self._buffer._sampler
        storage = self._buffer._storage
        description = {
            "kind": self._kind,
            "sampler": type(sampler).__name__,
            "max_size": storage.max_size,
            "tensordict": isinstance(self._buffer, TensorDictReplayBuffer),
            "priority_key": getattr(self._buffer, "priority_key", None),
            "batch_size": self._buffer._batch_size,
            "restored": self._restored,
            "totals": self.totals(),
            "reservable": self._reservable,
            "node": _node_id(),
        }
        if self._kind == "prioritized":
            description.update(beta=float(sampler.beta), fp64=sampler.dtype == torch.float64,
                               reduction=sampler.reduction, alpha=float(sampler._alpha), eps=float(sampler._eps),
                               tree_dtype=str(tree_dtype(sampler.dtype)).replace("torch.", ""))
        if self._kind == "slice":
            description.update(num_slices=sampler.num_slices, slice_len=sampler.slice_len,
                               trajectory_keys=_trajectory_keys(sampler))
        return description

    @_locked
    def ping(self, updates=None) -> tuple:
        self._apply_updates(updates)
        return self.totals()

    @_locked
    def trajectories(self, seq_length: int, updates=None):
        """``(trajectories, totals)``: how many trajectories a slice of ``seq_length`` steps
        can be drawn from (all of them with ``strict_length=False``), the weight of this
        shard in a batch of slices."""
        self._apply_updates(updates)
        storage, sampler = self._buffer._storage, self._buffer._sampler
        if not len(storage):
            return 0, self.totals()
        lengths = sampler._get_stop_and_length(storage)[2]
        eligible = int((lengths >= seq_length).sum()) if sampler.strict_length else int(lengths.numel())
        return eligible, self.totals()

    # ------------------------------------------------------------------ writes
    def _journal_record(self, record) -> None:
        if self._journal is not None:
            pickle.dump(record, self._journal, protocol=5)
            self._journal.flush()  # to the OS: a killed actor's records survive it

    def _apply_extend(self, packed: tuple, max_priority) -> np.ndarray:
        data = wire.unpack(packed)
        sampler = self._buffer._sampler
        largest = None
        if self._kind == "prioritized" and not sampler._max_priority_within_buffer:
            largest = sampler._max_priority
            if max_priority is not None and (largest[0] is None or max_priority > float(largest[0])):
                # New rows get the largest priority of the whole buffer, as in one buffer.
                largest = (torch.tensor(max_priority, dtype=torch.float64), None)
            sampler._max_priority = largest
        index = self._buffer.extend(data)
        if largest is not None and largest[0] is not None:
            # and the write leaves it as it was: torchrl 0.11-0.12 add eps to it at each write
            # (0.13 on do not), which shards counting their own writes would each do apart (a
            # first write sets it, as in one buffer)
            sampler._max_priority = largest
        self._rows_written += wire.num_rows(packed)
        return index.numpy() if isinstance(index, torch.Tensor) else np.asarray(index)

    def _apply_updates(self, updates) -> None:
        if updates is None:
            return
        index, priority = updates
        self._journal_record(("update", index, priority))
        self._buffer.update_priority(torch.from_numpy(index), torch.from_numpy(priority))

    @_locked
    def extend(self, max_priority, fill: bool, header: tuple, *pieces):
        """Writes a batch (:func:`torchrl_compat._ray.wire.to_arguments`'s header and pieces) through the
        shard's own writer: ``(local index, totals)``. With ``fill``, only as many rows as the
        shard has room for are written (the client sends the rest elsewhere): a write meant
        to fill a shard never overwrites a row there."""
        packed = wire.from_arguments(header, *pieces)
        if fill:
            room = self._room()
            if room < wire.num_rows(packed):
                if room == 0:
                    return np.zeros(0, dtype=np.int64), self.totals()
                packed = wire.rows(packed, 0, room)
        self._journal_record(("extend", packed, max_priority))
        index = self._apply_extend(packed, max_priority)
        return index, self.totals()

    # ------------------------------------------------------------------ reserved writes
    def _reset_rows(self, gaps=()) -> None:
        """Which rows hold data, for a reservable shard: the storage's first ``len`` rows but
        the ``gaps`` (``[start, stop)`` runs reserved by clients and never written, as a
        checkpoint recorded them). Dropped once every row holds data."""
        self._filled = None
        if not self._reservable:
            return
        storage = self._buffer._storage
        capacity, length = int(storage.max_size), len(storage)
        if length >= capacity and not gaps:
            return
        filled = np.zeros(capacity, dtype=bool)
        filled[:length] = True
        for start, stop in gaps:
            filled[start:stop] = False
        self._filled = filled
        self._filled_count = int(filled.sum())

    def _mark_written(self, slot: int, rows: int) -> None:
        filled = self._filled
        if filled is None:
            return
        capacity = len(filled)
        for start, stop in ((slot, min(capacity, slot + rows)), (0, max(0, slot + rows - capacity))):
            part = filled[start:stop]
            self._filled_count += (stop - start) - int(np.count_nonzero(part))
            part[:] = True
        if self._filled_count >= capacity:
            self._filled = None

    def _gaps(self) -> list[list[int]]:
        """``[start, stop)`` runs of rows below the storage's length that hold no data."""
        if self._filled is None:
            return []
        return true_runs(~self._filled[: len(self._buffer._storage)])

    def _new_epoch(self) -> None:
        """Every earlier reservation lapses: the write sequence starts again at the cursor.
        The sequence numbers up to the storage's capacity fill it (and the gaps below its
        length are handed out first); every one after them overwrites a row."""
        self._epoch += 1
        self._returned = []
        if not self._reservable:
            self._frontier = self._written_end = self._fill_end = self._seq_base = self._len_base = 0
            return
        storage = self._buffer._storage
        capacity = int(storage.max_size)
        cursor = int(self._buffer._writer._cursor)
        # the sequence goes on from the rows written so far (the number congruent to the
        # cursor): a client continues the write ring where a checkpoint left it
        laps = max(0, self._rows_written - cursor) // capacity
        self._seq_base = self._frontier = self._written_end = cursor + laps * capacity
        self._len_base = len(storage)
        self._fill_end = self._frontier + max(0, capacity - len(storage))
        self._returned = [[start + self._seq_base - cursor, stop + self._seq_base - cursor]
                          for start, stop in self._gaps()]

    def _token(self) -> tuple:
        return (self._incarnation, self._epoch)

    @_locked
    def reserve(self, rows: int):
        """Hands out sequence numbers to one client: ``((token, start, stop, fills), totals)``;
        its writes at ``start`` .. ``stop - 1`` carry ``token``. A range fills the shard
        (``fills``: rows never written, given back gaps first) or laps it, never both: it is
        cut at the last row that fills, so it may hold fewer than ``rows`` rows."""
        rows = int(rows)
        if self._returned:
            start, stop = self._returned[0]
            if stop - start > rows:
                self._returned[0] = [start + rows, stop]
                stop = start + rows
            else:
                self._returned.pop(0)
            return (self._token(), start, stop, True), self.totals()
        start = self._frontier
        fills = start < self._fill_end
        stop = min(start + rows, self._fill_end) if fills else start + rows
        self._frontier = stop
        return (self._token(), start, stop, fills), self.totals()

    @_locked
    def release(self, token: tuple, start: int, stop: int):
        """A client gives back the unused range ``[start, stop)``: taken back when nothing was
        reserved after it, handed out again first when it fills the shard (otherwise its rows
        keep their data until the next lap)."""
        if token == self._token():
            if self._frontier == stop and start >= self._written_end:
                self._frontier = start
            elif start < self._fill_end:
                self._returned.append([start, stop])
                self._returned.sort()
        return self.totals()

    def _write_at(self, slot: int, packed: tuple, max_priority, cursor: int, length: int) -> None:
        """Writes ``packed`` from row ``slot`` on through the buffer (its sampler and writer
        see an ordinary write), then sets the writer's cursor and the storage's length."""
        self._buffer._writer._cursor = slot
        self._apply_extend(packed, max_priority)
        self._buffer._writer._cursor = cursor
        self._buffer._storage._len = length
        self._mark_written(slot, wire.num_rows(packed))

    @_locked
    def write_at(self, token: tuple, start: int, max_priority, header: tuple, *pieces):
        """Writes a batch at the sequence numbers ``start`` on, reserved under ``token``:
        ``(None, totals)``, or ``(reason, totals)`` when the write is refused (the reservation
        lapsed, or the range was never handed out).

        The writer's cursor is left after the furthest row written (where the next range
        starts after a checkpoint), and the length at the furthest row of the first lap. Rows
        below it that another client reserved and has not written yet hold no data: they are
        not counted, a uniform draw passes over them and a prioritized one never reaches them
        (their priority is 0).
        """
        packed = wire.from_arguments(header, *pieces)
        rows = wire.num_rows(packed)
        if token != self._token():
            return (LAPSED, self.totals())
        if start < 0 or start + rows > self._frontier:
            return (f"sequence numbers [{start}, {start + rows}) were not reserved (frontier "
                    f"{self._frontier})", self.totals())
        storage = self._buffer._storage
        capacity = storage.max_size
        before = (int(self._buffer._writer._cursor), len(storage))
        written_end = max(self._written_end, start + rows)
        cursor = written_end % capacity
        length = (capacity if before[1] >= capacity
                  else min(capacity, max(before[1], self._len_base + written_end - self._seq_base)))
        slot = start % capacity
        try:
            self._write_at(slot, packed, max_priority, cursor, length)
        except BaseException:
            self._buffer._writer._cursor = before[0]
            raise
        self._written_end = written_end
        # journalled once stored (a refused batch would fail again when replayed), before the
        # reply acknowledges it
        self._journal_record(("extend_at", slot, packed, max_priority, cursor, length))
        return None, self.totals()

    @_locked
    def update_priority(self, index: np.ndarray, priority: np.ndarray):
        self._apply_updates((index, priority))
        return self.totals()

    @_locked
    def empty(self):
        self._journal_record(("empty",))
        self._buffer.empty()
        self._rows_written = 0
        self._reset_rows()
        self._new_epoch()
        return self.totals()

    # ------------------------------------------------------------------ reads
    def _gather(self, index: np.ndarray) -> tuple:
        return wire.pack(self._buffer._storage[torch.from_numpy(index)])

    @_locked
    def sample_prioritized(self, fraction: np.ndarray, updates=None):
        """Draws ``len(fraction)`` leaves: draw ``i`` descends the sum tree with the mass
        ``fraction[i] * total``. ``(packed rows, local index, priority, totals)``, or
        ``(None, None, None, totals)`` when the shard holds no row of positive priority (the
        client split the batch by totals from before an update set them all to 0: it draws
        again with the new ones)."""
        self._apply_updates(updates)
        totals = self.totals()
        length = len(self._buffer._storage)
        if totals[0] == 0 or not totals[1] > 0:
            return None, None, None, totals
        tree = self._buffer._sampler._sum_tree
        if is_replay_tree(tree):
            index, priority, _ = tree.sample_prioritized(length, fraction)
        else:
            index, priority, _ = tree.sample_prioritized(torch.from_numpy(fraction), length)
            index, priority = index.cpu().numpy(), priority.cpu().numpy()
        return self._gather(index), index, priority, totals

    @_locked
    def sample_uniform(self, fraction: np.ndarray, updates=None):
        """The ``floor(fraction[i] * count)``-th row holding data for each draw: ``(packed
        rows, local index, totals)``."""
        self._apply_updates(updates)
        count = self._count()
        if count == 0:
            return None, None, self.totals()
        index = np.minimum((fraction * count).astype(np.int64), count - 1)
        if count < len(self._buffer._storage):  # rows reserved and not written yet
            index = np.flatnonzero(self._filled[: len(self._buffer._storage)])[index]
        return self._gather(index), index, self.totals()

    @_locked
    def learner_step(self, request):
        """One step of a learner's compiled graph: ``request[k]`` is ``(method, draws,
        updates)`` for shard ``k`` (``draws`` ``None`` when the batch has none here); the reply
        is the draw's (``sample_prioritized`` or ``sample_uniform``), or the totals alone."""
        method, draws, updates = request[self._shard]
        if draws is None:
            return self.ping(updates)
        return getattr(self, method)(draws, updates)

    @_locked
    def sample_sampler(self, batch_size: int, seed: int, slice_len=None, updates=None):
        """``batch_size`` rows from the shard's own sampler, seeded with ``seed`` (slices of
        ``slice_len`` rows for a slice sampler): ``(packed batch, local index, totals)``. The
        batch is the buffer's own (its info entries included)."""
        self._apply_updates(updates)
        if len(self._buffer._storage) == 0:
            return None, None, self.totals()
        self._generator.manual_seed(seed)
        sampler = self._buffer._sampler
        saved = None
        if slice_len is not None and sampler.num_slices is not None:
            # the client splits the slices over the shards: each draws its share of them
            saved = sampler.num_slices, sampler.slice_len
            sampler.num_slices, sampler.slice_len = None, slice_len
        try:
            data, info = self._buffer.sample(batch_size, return_info=True)
        finally:
            if saved is not None:
                sampler.num_slices, sampler.slice_len = saved
        index = info["index"]
        if isinstance(index, tuple):
            index = torch.stack(index, -1)
        return wire.pack(data), np.asarray(index), self.totals()

    @_locked
    def get(self, index: np.ndarray):
        return self._gather(index), self.totals()

    @_locked
    def set(self, index: np.ndarray, header: tuple, *pieces):
        packed = wire.from_arguments(header, *pieces)
        self._journal_record(("set", index, packed))
        self._buffer[torch.from_numpy(index)] = wire.unpack(packed)
        return self.totals()

    # ------------------------------------------------------------------ checkpoints
    @_locked
    def state_dict(self) -> dict:
        return {"buffer": self._buffer.state_dict(), "rows_written": self._rows_written, "gaps": self._gaps()}

    def _load_state(self, state_dict: dict) -> None:
        self._buffer.load_state_dict(state_dict["buffer"])
        self._rows_written = int(state_dict["rows_written"])
        self._reset_rows(state_dict.get("gaps", ()))

    @_locked
    def load_state_dict(self, state_dict: dict):
        self._load_state(state_dict)
        self._journal_record(("load_state_dict", state_dict))
        self._new_epoch()
        return self.totals()

    @_locked
    def dumps(self, root, version: str):
        """Writes this shard's part of checkpoint ``version`` under ``root`` (the buffer's
        checkpoint, published whole, then ``shard.json`` beside it); the journal starts a new
        segment for what follows."""
        directory = shard_directory(root, self._shard, version)
        directory.mkdir(parents=True, exist_ok=True)
        metadata = {"shard": self._shard, "version": version, "rows_written": self._rows_written,
                    "rows": self._count(), "gaps": self._gaps()}
        self._buffer.dumps(directory / "buffer")

        def write(file):
            with open(file, "w") as handle:
                json.dump(metadata, handle)

        publish_file(directory / SHARD_METADATA, write)
        if self._write_ahead:
            self._open_segment(self._segment + 1)
        self._dumped[version] = (self._segment, self._rows_written)
        return metadata, self.totals()

    @_locked
    def check(self, root, version: str) -> dict:
        """Reads ``shard.json`` of checkpoint ``version`` and checks that it is this shard's."""
        directory = shard_directory(root, self._shard, version)
        try:
            with open(directory / SHARD_METADATA) as handle:
                metadata = json.load(handle)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"shard {self._shard}: checkpoint version {version} has no {SHARD_METADATA} in "
                f"{directory} (the manifest names a shard checkpoint that is not there)"
            ) from None
        if metadata.get("version") != version or metadata.get("shard") != self._shard:
            raise ValueError(
                f"shard {self._shard}: {directory / SHARD_METADATA} holds shard "
                f"{metadata.get('shard')} version {metadata.get('version')}, the manifest names "
                f"shard {self._shard} version {version}"
            )
        if not (directory / "buffer").is_dir():
            raise FileNotFoundError(f"shard {self._shard}: {directory / 'buffer'} is missing")
        return metadata

    def _load_part(self, root, version: str) -> dict:
        metadata = self.check(root, version)
        self._buffer.loads(shard_directory(root, self._shard, version) / "buffer")
        self._rows_written = int(metadata["rows_written"])
        self._reset_rows(metadata.get("gaps", ()))
        return metadata

    @_locked
    def loads(self, root, version: str):
        self._load_part(root, version)
        if self._write_ahead:
            self._open_segment(self._segment + 1)
        self._point_to(root, version, self._segment)
        self._new_epoch()
        return self.totals()

    @_locked
    def commit(self, root, version: str, keep=()):
        """Checkpoint ``version`` is complete (its manifest is published): point recovery at it,
        drop the journal before it and this shard's older checkpoints under ``root``."""
        segment, _ = self._dumped.pop(version, (self._segment, None))
        self._point_to(root, version, segment)
        parent = shard_directory(root, self._shard, version).parent
        for entry in parent.iterdir():
            name = entry.name
            if name != version and name not in keep and not name.startswith("."):
                _remove_tree(entry)
        return self.totals()

    # ------------------------------------------------------------------ recovery
    def _pointer(self) -> Path:
        return self._recovery_dir / f"shard-{self._shard}.json"

    def _journal_dir(self) -> Path:
        return self._recovery_dir / f"shard-{self._shard}.wal"

    def _point_to(self, root, version: str, segment: int) -> None:
        if self._recovery_dir is None:
            return
        self._recovery_dir.mkdir(parents=True, exist_ok=True)
        pointer = {"root": str(Path(root).absolute()), "version": version, "segment": segment}

        def write(file):
            with open(file, "w") as handle:
                json.dump(pointer, handle)

        publish_file(self._pointer(), write)
        if self._write_ahead:
            for path in self._journal_dir().glob("*.log"):
                if int(path.stem) < segment:
                    path.unlink(missing_ok=True)

    def _open_segment(self, segment: int) -> None:
        if self._journal is not None:
            self._journal.close()
        self._journal_dir().mkdir(parents=True, exist_ok=True)
        self._segment = segment
        self._journal = open(self._journal_dir() / f"{segment:010d}.log", "ab")

    def _recover(self) -> dict | None:
        """Loads the last committed checkpoint and replays the journal after it; what was
        restored, or ``None`` for a shard that starts empty."""
        restored = {"version": None, "rows_written_at_checkpoint": 0, "replayed_records": 0}
        segment = 0
        try:
            with open(self._pointer()) as handle:
                pointer = json.load(handle)
        except FileNotFoundError:
            pointer = None
        if pointer is not None:
            self._load_part(pointer["root"], pointer["version"])
            restored.update(version=pointer["version"], rows_written_at_checkpoint=self._rows_written)
            segment = int(pointer["segment"])
        found = sorted(self._journal_dir().glob("*.log")) if self._journal_dir().is_dir() else []
        for path in found:
            if int(path.stem) >= segment:
                restored["replayed_records"] += self._replay(path)
        self._segment = max([segment] + [int(path.stem) for path in found])
        if pointer is None and not restored["replayed_records"]:
            return None
        restored["rows_written"] = self._rows_written
        return restored

    def _replay(self, path: Path) -> int:
        replayed = 0
        with open(path, "rb") as handle:
            while True:
                try:
                    record = pickle.load(handle)
                except (EOFError, pickle.UnpicklingError, ValueError):
                    break  # the end, or a record cut short by the crash: never acknowledged
                kind = record[0]
                if kind == "extend":
                    self._apply_extend(record[1], record[2])
                elif kind == "extend_at":
                    self._write_at(*record[1:])
                elif kind == "update":
                    self._buffer.update_priority(torch.from_numpy(record[1]), torch.from_numpy(record[2]))
                elif kind == "set":
                    self._buffer[torch.from_numpy(record[1])] = wire.unpack(record[2])
                elif kind == "empty":
                    self._buffer.empty()
                    self._rows_written = 0
                    self._reset_rows()
                elif kind == "load_state_dict":
                    self._load_state(record[1])
                replayed += 1
        return replayed

    @_locked
    def time_parts(self, packed: tuple, fraction: np.ndarray, rounds: int) -> dict:
        """Median seconds of the shard's own work per call (for the benchmarks): unpacking and
        writing a batch, drawing and gathering one. Writes ``rounds`` batches."""
        import time

        def median(fn):
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return float(np.median(times)) * 1e6

        return {
            "shard_unpack_us": median(lambda: wire.unpack(packed)),
            "shard_extend_us": median(lambda: self._apply_extend(packed, None)),
            "shard_sample_us": median(lambda: self.sample_prioritized(fraction)),
            "shard_totals_us": median(self.totals),
        }

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None


def _limit_threads() -> None:
    """Gives torch in the shard's process as many intra-op threads as CPUs Ray reserved for the
    actor, at least one (none by default). A shard's calls are small: on a busy machine a
    second thread only waits for a core (gathering 256 rows of a 100,000-row tensor took
    20 ms with 2 threads on a loaded 2-core machine, 13 us with one)."""
    try:
        import ray

        if not ray.is_initialized():
            return
        context = ray.get_runtime_context()
        if context.worker.mode != ray.WORKER_MODE:
            return  # not an actor's process (a shard built in the driver, in tests)
        cpus = float(context.get_assigned_resources().get("CPU", 0.0))
    except Exception:  # noqa: BLE001 - outside Ray: leave torch as it is
        return
    torch.set_num_threads(max(1, int(cpus)))


def _node_id() -> str | None:
    """The Ray node this shard runs on (``None`` outside an actor)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 - outside Ray
        return None


def _reservable(buffer, kind: str) -> bool:
    """Whether the shard can write where a client says: a round-robin writer over a 1-D
    tensor storage (the row of a write is then its cursor's), drawn by row (prioritized or
    uniform: the shard maps each draw itself, so rows reserved and not written yet are never
    drawn; a without-replacement or slice sampler would draw them)."""
    storage, writer = buffer._storage, buffer._writer
    return (kind in ("prioritized", "uniform") and isinstance(writer, RoundRobinWriter)
            and isinstance(storage, TensorStorage) and getattr(storage, "ndim", 1) == 1
            and getattr(storage, "max_size", None) is not None)


def _trajectory_keys(sampler) -> list[tuple[str, Any]]:
    """The keys a client reads a write's trajectory ends from, in the order ``sampler`` looks
    for them: ``("traj", key)`` (ids) or ``("end", key)`` (done flags)."""
    traj = [("traj", key) for key in
            ([sampler.traj_key] if sampler.traj_key is not None else [("collector", "traj_ids"), "episode"])]
    end_keys = getattr(sampler, "end_keys", None)
    ends = [("end", key) for key in (end_keys if end_keys else [sampler.end_key]) if key is not None]
    return traj + ends if sampler._fetch_traj else ends + traj


def _remove_tree(path: Path) -> None:
    import shutil

    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
