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

import json
import pickle
import uuid
from pathlib import Path

import numpy as np
import torch

from torchrl_compat import _ray_wire as wire
from torchrl_compat._checkpoint_publish import publish_file
from torchrl_compat._sampler_trees import is_replay_tree
from torchrl_compat._torchrl_lookup import accepted_classes
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
        self._reservable = _reservable(self._buffer)
        self._restored = self._recover() if self._recovery_dir is not None else None
        self._new_epoch()
        if self._write_ahead:
            self._open_segment(self._segment + 1)

    # ------------------------------------------------------------------ state
    def totals(self) -> tuple:
        """``(count, sum, min, max_priority, rows_written, remaining, incarnation)``."""
        buffer = self._buffer
        count = len(buffer._storage)
        psum = pmin = 0.0
        pmax = None
        remaining = count
        sampler = buffer._sampler
        if self._kind == "prioritized":
            if count:
                psum = float(sampler._sum_tree.query(0, count))
                pmin = float(sampler._min_tree.query(0, count))
            maximum = sampler._max_priority[0]
            pmax = None if maximum is None else float(maximum)
        elif self._kind == "without_replacement" and sampler._has_sample_list():
            remaining = sampler._remaining_in_epoch()
        return (count, psum, pmin, pmax, self._rows_written, remaining, self._incarnation)

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
        }
        if self._kind == "prioritized":
            description.update(beta=float(sampler.beta), fp64=sampler.dtype == torch.float64,
                               reduction=sampler.reduction)
        if self._kind == "slice":
            description.update(num_slices=sampler.num_slices, slice_len=sampler.slice_len)
        return description

    def ping(self, updates=None) -> tuple:
        self._apply_updates(updates)
        return self.totals()

    # ------------------------------------------------------------------ writes
    def _journal_record(self, record) -> None:
        if self._journal is not None:
            pickle.dump(record, self._journal, protocol=5)
            self._journal.flush()  # to the OS: a killed actor's records survive it

    def _apply_extend(self, packed: tuple, max_priority) -> np.ndarray:
        data = wire.unpack(packed)
        sampler = self._buffer._sampler
        if (
            self._kind == "prioritized"
            and max_priority is not None
            and not sampler._max_priority_within_buffer
            and (sampler._max_priority[0] is None or max_priority > float(sampler._max_priority[0]))
        ):
            # New rows get the largest priority of the whole buffer, as in one buffer.
            sampler._max_priority = (torch.tensor(max_priority), None)
        index = self._buffer.extend(data)
        self._rows_written += wire.num_rows(packed)
        return index.numpy() if isinstance(index, torch.Tensor) else np.asarray(index)

    def _apply_updates(self, updates) -> None:
        if updates is None:
            return
        index, priority = updates
        self._journal_record(("update", index, priority))
        self._buffer.update_priority(torch.from_numpy(index), torch.from_numpy(priority))

    def extend(self, max_priority, header: tuple, *pieces):
        """Writes a batch (:func:`._ray_wire.to_arguments`'s header and pieces); ``(local index,
        totals)``."""
        packed = wire.from_arguments(header, *pieces)
        self._journal_record(("extend", packed, max_priority))
        index = self._apply_extend(packed, max_priority)
        return index, self.totals()

    # ------------------------------------------------------------------ reserved writes
    def _new_epoch(self) -> None:
        """Every earlier reservation lapses: the write sequence starts again at the cursor."""
        self._epoch += 1
        cursor = int(self._buffer._writer._cursor) if self._reservable else 0
        self._frontier = self._written_end = cursor

    def _token(self) -> tuple:
        return (self._incarnation, self._epoch)

    def reserve(self, rows: int):
        """Hands out the next ``rows`` sequence numbers to one client: ``((token, start),
        totals)``; its writes at ``start`` .. ``start + rows - 1`` carry ``token``."""
        start = self._frontier
        self._frontier += int(rows)
        return (self._token(), start), self.totals()

    def release(self, token: tuple, start: int, stop: int):
        """A client gives back the unused range ``[start, stop)``: taken back when nothing was
        reserved after it (otherwise its rows stay unwritten until the next lap)."""
        if token == self._token() and self._frontier == stop and start >= self._written_end:
            self._frontier = start
        return self.totals()

    def _write_at(self, slot: int, packed: tuple, max_priority, cursor: int, length: int) -> None:
        """Writes ``packed`` from row ``slot`` on through the buffer (its sampler and writer
        see an ordinary write), then sets the writer's cursor and the storage's length."""
        self._buffer._writer._cursor = slot
        self._apply_extend(packed, max_priority)
        self._buffer._writer._cursor = cursor
        self._buffer._storage._len = length

    def write_at(self, token: tuple, start: int, max_priority, header: tuple, *pieces):
        """Writes a batch at the sequence numbers ``start`` on, reserved under ``token``:
        ``(None, totals)``, or ``(reason, totals)`` when the write is refused (the reservation
        lapsed, or the range was never handed out).

        The writer's cursor is left after the furthest row written (where the next range
        starts after a checkpoint), and the length at the furthest row of the first lap: rows
        reserved by another client and not written yet read as the storage's initial rows
        until it writes them (a prioritized sampler never draws them: their priority is 0).
        """
        packed = wire.from_arguments(header, *pieces)
        rows = wire.num_rows(packed)
        if token != self._token():
            return ("the shard was restarted, emptied or loaded after the rows were reserved",
                    self.totals())
        if start < 0 or start + rows > self._frontier:
            return (f"sequence numbers [{start}, {start + rows}) were not reserved (frontier "
                    f"{self._frontier})", self.totals())
        storage = self._buffer._storage
        capacity = storage.max_size
        before = (int(self._buffer._writer._cursor), len(storage))
        written_end = max(self._written_end, start + rows)
        cursor = written_end % capacity
        length = capacity if before[1] >= capacity else min(capacity, max(written_end, before[1]))
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

    def update_priority(self, index: np.ndarray, priority: np.ndarray):
        self._apply_updates((index, priority))
        return self.totals()

    def empty(self):
        self._journal_record(("empty",))
        self._buffer.empty()
        self._new_epoch()
        return self.totals()

    # ------------------------------------------------------------------ reads
    def _gather(self, index: np.ndarray) -> tuple:
        return wire.pack(self._buffer._storage[torch.from_numpy(index)])

    def sample_prioritized(self, fraction: np.ndarray, updates=None):
        """Draws ``len(fraction)`` leaves: draw ``i`` descends the sum tree with the mass
        ``fraction[i] * total``. ``(packed rows, local index, priority, totals)``, or
        ``(None, None, None, totals)`` when the shard holds no row of positive priority (the
        client split the batch by totals from before an update set them all to 0: it draws
        again with the new ones)."""
        self._apply_updates(updates)
        totals = self.totals()
        count = totals[0]
        if count == 0 or not totals[1] > 0:
            return None, None, None, totals
        tree = self._buffer._sampler._sum_tree
        if is_replay_tree(tree):
            index, priority, _ = tree.sample_prioritized(count, fraction)
        else:
            index, priority, _ = tree.sample_prioritized(torch.from_numpy(fraction), count)
            index, priority = index.cpu().numpy(), priority.cpu().numpy()
        return self._gather(index), index, priority, totals

    def sample_uniform(self, fraction: np.ndarray, updates=None):
        """Row ``floor(fraction[i] * count)`` for each draw: ``(packed rows, local index, totals)``."""
        self._apply_updates(updates)
        count = len(self._buffer._storage)
        if count == 0:
            return None, None, self.totals()
        index = np.minimum((fraction * count).astype(np.int64), count - 1)
        return self._gather(index), index, self.totals()

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

    def get(self, index: np.ndarray):
        return self._gather(index), self.totals()

    def set(self, index: np.ndarray, header: tuple, *pieces):
        packed = wire.from_arguments(header, *pieces)
        self._journal_record(("set", index, packed))
        self._buffer[torch.from_numpy(index)] = wire.unpack(packed)
        return self.totals()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"buffer": self._buffer.state_dict(), "rows_written": self._rows_written}

    def load_state_dict(self, state_dict: dict):
        self._buffer.load_state_dict(state_dict["buffer"])
        self._rows_written = int(state_dict["rows_written"])
        self._journal_record(("load_state_dict", state_dict))
        self._new_epoch()
        return self.totals()

    def dumps(self, root, version: str):
        """Writes this shard's part of checkpoint ``version`` under ``root`` (the buffer's
        checkpoint, published whole, then ``shard.json`` beside it); the journal starts a new
        segment for what follows."""
        directory = shard_directory(root, self._shard, version)
        directory.mkdir(parents=True, exist_ok=True)
        metadata = {"shard": self._shard, "version": version, "rows_written": self._rows_written,
                    "rows": len(self._buffer._storage)}
        self._buffer.dumps(directory / "buffer")

        def write(file):
            with open(file, "w") as handle:
                json.dump(metadata, handle)

        publish_file(directory / SHARD_METADATA, write)
        if self._write_ahead:
            self._open_segment(self._segment + 1)
        self._dumped[version] = (self._segment, self._rows_written)
        return metadata, self.totals()

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

    def loads(self, root, version: str):
        metadata = self.check(root, version)
        self._buffer.loads(shard_directory(root, self._shard, version) / "buffer")
        self._rows_written = int(metadata["rows_written"])
        if self._write_ahead:
            self._open_segment(self._segment + 1)
        self._point_to(root, version, self._segment)
        self._new_epoch()
        return self.totals()

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
            metadata = self.check(pointer["root"], pointer["version"])
            self._buffer.loads(shard_directory(pointer["root"], self._shard, pointer["version"]) / "buffer")
            self._rows_written = int(metadata["rows_written"])
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
                elif kind == "load_state_dict":
                    self._buffer.load_state_dict(record[1]["buffer"])
                    self._rows_written = int(record[1]["rows_written"])
                replayed += 1
        return replayed

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


def _reservable(buffer) -> bool:
    """Whether the shard can write where a client says: a round-robin writer over a 1-D
    tensor storage (the row of a write is then its cursor's)."""
    storage, writer = buffer._storage, buffer._writer
    return (isinstance(writer, RoundRobinWriter) and isinstance(storage, TensorStorage)
            and getattr(storage, "ndim", 1) == 1 and getattr(storage, "max_size", None) is not None)


def _remove_tree(path: Path) -> None:
    import shutil

    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
