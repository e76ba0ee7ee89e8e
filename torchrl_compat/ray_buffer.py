"""A replay buffer served by Ray actors, sharded, with exact prioritized sampling (stand-in for
``torchrl.data.replay_buffers.ray_buffer``).

torchrl's ``RayReplayBuffer`` is one actor owning the whole buffer, each call a blocking round
trip. Ours spreads the rows over ``num_shards`` actors (:mod:`torchrl_compat._ray.shard`), each owning its
share of the storage and, for a prioritized buffer, its own sum and min trees; the client
routes writes, draws and updates (:mod:`torchrl_compat._ray.routing`) and moves batches as numpy arrays
through Ray's object store (:mod:`torchrl_compat._ray.wire`).
"""
from __future__ import annotations

import collections
import copy
import json
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from torchrl_compat._ray import routing, wire
from torchrl_compat._ray.writes import LAPSED, Reservations, describe_rows
from torchrl_compat.checkpointers._publish import publish_file
from torchrl_compat.replay_buffers import ReplayBuffer
from torchrl_compat.replay_buffers._transforms import check_transform_arguments, make_transform
from torchrl_compat.replay_buffers.base import SERVICE_BACKENDS
from torchrl_compat.samplers._priorities import stored_values
from torchrl_compat.utils import _reduce

__all__ = ["RayReplayBuffer", "ShardRestartedError", "ShardUnavailableError", "ShardWriteError"]

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "torchrl_compat.RayReplayBuffer/1"
_EMPTY_STORAGE_ERROR = "Cannot sample from an empty storage."
RAY_MISSING = (
    'RayReplayBuffer needs ray, which is not installed: pip install "replay-torchrl-compat[ray]" '
    "(or pip install ray)."
)
# What ReplayBuffer(service_backend="ray", service_backend_options=...) passes on.
SERVICE_OPTIONS = ("ray_init_config", "remote_config", "num_shards", "recovery_dir", "write_ahead",
                   "sample_timeout", "chunk_rows", "compiled_graph")
# The shard actors' defaults: no CPU reserved (a shard mostly waits), restarted after a crash,
# and calls never retried behind the caller's back (a lost write must be reported).
DEFAULT_SHARD_OPTIONS = {"num_cpus": 0, "max_restarts": 4, "max_task_retries": 0}
# Writes a client keeps in flight before it waits for the oldest (so that a fast writer
# cannot pile calls up in a shard's queue).
MAX_WRITES_IN_FLIGHT = 16
# Rows of a shard's chunks a client holds while its earlier writes to that shard are in flight,
# to send them as one call (a call costs the shard far more than the rows it carries).
MAX_HELD_ROWS = 8192
# What a placement group bundle reserves for a shard asking for no CPU (Ray refuses a bundle
# of zeros): a hundredth of a CPU, so that any node with a CPU can take one.
BUNDLE_MIN_CPU = 0.01
# Compiled learner graphs a buffer builds again after one broke (a shard restarted).
GRAPH_REBUILDS = 2


def _import_ray():
    try:
        import ray
    except ImportError as err:
        raise ImportError(RAY_MISSING) from err
    return ray


class ShardRestartedError(RuntimeError):
    """A shard actor died and Ray restarted it from its last checkpoint (or several did: one
    error names every shard found restarted by the call).

    Attributes:
        shard (int): the (first) shard.
        shards (tuple[int, ...]): every shard found restarted by the call, in order.
        rows_lost (int): rows those shards had written (as this client last saw them) that
            the restarted shards do not hold.
        lost (dict[int, int]): the same, shard by shard.
        restored (dict): what the (first) shard restored (checkpoint version, rows, journal
            records).
        index (torch.Tensor or None): the global indices, returned by earlier :meth:`extend`
            calls of this client, of the rows that were not stored (writes in flight when the
            shards died, or refused by the restarted shards), on every shard.
        errors (list[Exception]): every error the call met (this one and those of the other
            shards).
    """

    def __init__(self, message: str, *, shard: int, rows_lost: int, restored, index=None):
        super().__init__(message)
        self.shard = shard
        self.shards = (shard,)
        self.rows_lost = rows_lost
        self.lost = {shard: rows_lost}
        self.restored = restored
        self.index = index
        self.errors = [self]


class ShardWriteError(RuntimeError):
    """A write that :meth:`RayReplayBuffer.extend` returned the indices of was not stored: raised
    by the client's next call.

    Attributes:
        shard (int): the shard of the first failed write.
        index (torch.Tensor): the global indices of every row not stored (all failed writes).
        failures (list): ``(shard, index, reason)`` of each failed write.
    """

    def __init__(self, message: str, *, failures):
        super().__init__(message)
        self.failures = failures
        self.shard = failures[0][0]
        self.index = torch.from_numpy(np.concatenate([index for _, index, _ in failures]))


class ShardUnavailableError(RuntimeError):
    """A shard actor did not answer within the buffer's ``sample_timeout`` (or several did).

    Attributes:
        shard (int): the (first) shard.
        shards (tuple[int, ...]): every shard that did not answer, in order.
        index (torch.Tensor or None): the global indices of rows of this client's writes in
            flight to those shards, which may not be stored.
        errors (list[Exception]): every error the call met.
    """

    def __init__(self, message: str, *, shard: int):
        super().__init__(message)
        self.shard = shard
        self.shards = (shard,)
        self.index = None
        self.errors = [self]


def _combined(errors: list) -> Exception:
    """One exception for every error one call met, so that none goes unnamed: the first
    restart (else the first shard down, else the first error), its message followed by the
    others', its ``errors`` all of them, and for restarts and shards down, ``shards``,
    ``index`` (and ``lost``, ``rows_lost``) over every shard."""
    unique = []
    for err in errors:
        if not any(err is seen for seen in unique):
            unique.append(err)
    if len(unique) == 1:
        return unique[0]
    head = next((e for e in unique if isinstance(e, ShardRestartedError)), None)
    head = head or next((e for e in unique if isinstance(e, ShardUnavailableError)), unique[0])
    others = [e for e in unique if e is not head]
    kind = type(head)
    same = [e for e in unique if type(e) is kind]
    if kind in (ShardRestartedError, ShardUnavailableError):
        head.shards = tuple(sorted({shard for e in same for shard in e.shards}))
        named = list({id(e.index): e.index for e in same if e.index is not None}.values())
        head.index = torch.cat([torch.as_tensor(i) for i in named]) if named else None
    if kind is ShardRestartedError:
        head.lost = {shard: rows for e in same for shard, rows in e.lost.items()}
        head.rows_lost = sum(head.lost.values())
    head.errors = unique
    head.args = ("; ".join([str(head)] + [str(e) for e in others]),)
    return head


class _Write:
    """A write in flight: its call, the global indices it returned, its reserved range."""

    __slots__ = ("shard", "seq", "ref", "index", "token", "start", "fills")

    def __init__(self, shard, seq, ref, index, token, start, fills):
        self.shard, self.seq, self.ref, self.index = shard, seq, ref, index
        self.token, self.start, self.fills = token, start, fills


class _WriteRows:
    """The rows one :meth:`RayReplayBuffer.extend` takes on each shard, so that no two of its
    rows share one (a client's reserved ranges of a shard may be a lap or more apart when
    other clients write to it in between)."""

    __slots__ = ("capacities", "windows", "rows")

    def __init__(self, capacities):
        self.capacities = capacities
        self.windows = {}  # shard -> (first, end) of the sequence numbers taken, while contiguous
        self.rows = {}  # shard -> the rows taken, once they are not

    def full(self, shard: int) -> bool:
        """Whether this write has taken every row of ``shard``."""
        if shard in self.rows:
            return len(self.rows[shard]) >= self.capacities[shard]
        window = self.windows.get(shard)
        return window is not None and window[1] - window[0] >= self.capacities[shard]

    def admit(self, shard: int, run: tuple) -> list[tuple]:
        """The parts of ``run`` (``(token, start, count, fills)``) whose rows this write has
        not taken yet (all of it, unless the shard was lapped between this write's ranges)."""
        token, start, count, fills = run
        capacity = self.capacities[shard]
        window = self.windows.get(shard)
        if shard not in self.rows:
            if window is None:
                self.windows[shard] = (start, start + count)
                return [run]
            first, end = window
            if start == end and start + count - first <= capacity:
                self.windows[shard] = (first, start + count)
                return [run]
            self.rows[shard] = np.arange(first, end, dtype=np.int64) % capacity
        taken = self.rows[shard]
        rows = np.arange(start, start + count, dtype=np.int64) % capacity
        free = ~np.isin(rows, taken)
        self.rows[shard] = np.concatenate([taken, rows[free]])
        return [(token, start + a, b - a, fills) for a, b in routing.true_runs(free)]


class _Held:
    """A chunk written to reserved rows that the client has not sent yet: its rows (copied:
    the caller may reuse its tensors once ``extend`` returns), global indices and range."""

    __slots__ = ("packed", "index", "token", "start", "fills")

    def __init__(self, packed, index, token, start, fills):
        self.packed, self.index, self.token, self.start, self.fills = packed, index, token, start, fills

    def follows(self, other: "_Held") -> bool:
        """Whether this chunk continues ``other`` (same reservation, next rows, same leaves):
        the two then go as one write."""
        mine, theirs = self.packed, other.packed
        if (
            self.token != other.token
            or self.fills != other.fills
            or self.start != other.start + len(other.index)
            or mine[0] != theirs[0]
            or mine[1] != theirs[1]
            or len(mine[2]) != len(theirs[2])
        ):
            return False
        return all(a.dtype == b.dtype and a.shape[1:] == b.shape[1:] for a, b in zip(mine[2], theirs[2]))


class _Faults:
    """The shards one call found restarted or down, and its deadline: a call waits at most
    ``sample_timeout`` for all its replies together, however many it has in flight."""

    __slots__ = ("deadline", "down")

    def __init__(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.down = {}

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def record(self, shard: int, err: Exception) -> Exception:
        self.down.setdefault(shard, err)
        return self.down[shard]


class _Pending:
    """A sample whose shard calls are in flight (or its step of the compiled graph)."""

    __slots__ = ("batch_size", "kind", "positions", "calls", "step", "updates")

    def __init__(self, batch_size, kind, positions, calls, step=None, updates=()):
        self.batch_size = batch_size
        self.kind = kind
        self.positions = positions
        self.calls = calls  # [(shard, seq, ref)]
        self.step = step  # _GraphStep, when the compiled graph draws it
        self.updates = updates  # the calls of updates to shards without draws, read with it


class _GraphFailed(Exception):
    """A step of the compiled learner graph failed: the call is made again on the task path."""


class _GraphStep:
    """One execution of the compiled learner graph in flight: its reference, the calls'
    sequence numbers (one per shard) and the priority updates it carries (sent again if it
    fails: setting a priority twice changes nothing)."""

    __slots__ = ("ref", "seqs", "updates")

    def __init__(self, ref, seqs, updates):
        self.ref, self.seqs, self.updates = ref, seqs, updates


class RayReplayBuffer(ReplayBuffer):
    """A replay buffer served by ``num_shards`` Ray actors, with exact prioritized sampling.

    Each shard actor holds a replay buffer of ``replay_buffer_cls`` with its share of the
    capacity: ``storage=partial(LazyTensorStorage, 1_000_000)`` over 4 shards holds 1,000,000
    rows in all, 250,000 in each (a sampler factory's ``max_capacity`` is split the same way).
    Indices are global: shard ``k`` holds ``k * stride + local`` where ``stride`` is the largest
    shard capacity; :meth:`extend` returns them, :meth:`update_priority`, :meth:`__getitem__` and
    :meth:`update_tensordict_priority` route them back, and an index no shard holds raises
    ``IndexError`` naming it. With one shard the indices are the buffer's own.

    Keyword Args:
        replay_buffer_cls (type[ReplayBuffer], optional): the class of each shard's buffer (one
            of ours). Defaults to :class:`~torchrl_compat.ReplayBuffer`.
        ray_init_config (dict[str, Any], optional): keyword arguments to pass to ``ray.init()``
            when Ray is not initialized yet.
        remote_config (dict[str, Any], optional): options of the shard actors
            (``ray.remote`` / ``.options``), over the defaults ``num_cpus=0``,
            ``max_restarts=4`` and ``max_task_retries=0``. Unless it names a
            ``scheduling_strategy``, shards on a cluster of several nodes go one per node: a
            placement group of one bundle per shard, ``STRICT_SPREAD`` while the cluster has
            more nodes than shards (a shard whose node is lost restarts on a node holding
            none), ``SPREAD`` otherwise (shards share nodes only when they must).
        num_shards (int, optional): the number of shard actors. Defaults to ``1``.
        recovery_dir (str or Path, optional): a directory every shard can reach, where each keeps
            the pointer to its part of the last checkpoint (and its journal), so that a shard Ray
            restarts reloads it. Defaults to a new temporary directory (on the client's machine:
            give a shared one when the shards run elsewhere).
        write_ahead (bool, optional): whether each shard journals every write and priority update
            into ``recovery_dir`` (a restarted shard then loses nothing). Defaults to ``False``.
        sample_timeout (float, optional): how long a call waits for a shard that is down before
            raising :class:`ShardUnavailableError`. Defaults to ``60`` seconds.
        chunk_rows (int, optional): the largest number of rows of a write that go to one shard
            in one piece, and the width of the runs the write ring deals to each shard in
            turn (see "Writes and evictions" below). Defaults to ``4096``.
        compiled_graph (bool, optional): whether the client that builds the buffer samples
            (without ``prefetch``) through a Ray Compiled Graph (``ray.dag``) over the shards,
            whose channels cost a fraction of a task's call; its priority updates travel the
            same way. Prioritized and uniform samplers only; other calls, other clients and a
            graph that fails (a shard restarted) take Ray's task path. Defaults to ``True``.
        **kwargs: keyword arguments of ``replay_buffer_cls`` (``storage``, ``sampler`` and
            ``writer`` as factories, ``batch_size``, ``alpha`` / ``beta``, ``priority_key``...).
            ``prefetch`` keeps that many samples in flight on the client; ``generator`` draws
            the client's routing (torch's global RNG when omitted).

    Sampling:
        - Prioritized (``TensorDictPrioritizedReplayBuffer`` or a ``PrioritizedSampler``
          factory): a batch of ``B`` is exact, each draw following
          :math:`P(i) = p_i / \\sum_{\\text{all shards}} p_j`. The client draws ``B`` masses
          uniformly in ``[0, total)`` as one tree holding every leaf would, routes each to the
          shard whose prefix-sum interval holds it, and the shards descend their trees in
          parallel, each with its masses minus its offset. Importance weights
          ``(p_i / p_min) ** -beta`` use the minimum over all shards; they equal those of one
          :class:`~torchrl_compat.PrioritizedSampler` holding the same priorities. New rows get
          the largest priority given so far on any shard (this client's updates still in
          flight included), and a write leaves that largest priority as it is, as torchrl 0.13
          on does (0.11-0.12 add ``eps`` to it at each write).
        - Uniform: draws split by the shards' row counts; without replacement: by the rows left
          in each shard's epoch (a multivariate hypergeometric split); slices: whole slices, split
          by the number of trajectories each shard can draw one from (so each slice's trajectory
          is drawn uniformly over all shards, as in one buffer; a trajectory is never cut between
          shards, see below).

    Writes and evictions:
        Rows are written along one ring of the whole capacity, striped over the shards in runs
        of ``chunk_rows`` rows (rows ``[0, chunk_rows)`` of shard 0, the same rows of shard 1,
        and so on, then the next ``chunk_rows`` rows of each shard). A write continues the ring
        where the shards stand, in pieces of at most ``chunk_rows`` rows, none larger than what
        its shard can take.

        - While the buffer has room, a write never overwrites a row: each shard hands out the
          rows it has never held before any it holds, and a piece meant for a shard that has
          no room left goes to one that has. ``len()`` is ``min(rows written, capacity)``.
        - Once the buffer is full, a write overwrites its oldest rows: with one writing client,
          exactly the rows one :class:`~torchrl_compat.TensorDictReplayBuffer` of the same
          capacity would overwrite (the ring is that buffer's round-robin order); with several,
          each continues the ring from where it last saw the shards, and overwrites the oldest
          rows of the shards it writes to.
        - The indices a write returns are distinct (but for a write of more rows than the
          capacity, whose last rows overwrite its first ones, as in one buffer), and each names
          the row written there until a later write overwrites it.
        - With a slice sampler, writes go by whole trajectories (read from the batch's
          ``traj_key`` or ``end_key``, as the sampler reads them): each trajectory to one shard,
          the part of one that a write leaves open to the same shard with the next write, to
          the shard with the most room while any has some, else to the one holding the least
          of its capacity.

    .. note:: Staleness. Every reply of a shard carries its totals after the call (priority sum
        and minimum, rows, rows written): the client never asks for them separately. A sample
        splits its batch by the last totals the client received, so writes and updates made by
        *other* clients since (or a prefetched sample's own predecessors) are not in the split.
        Inside a shard, a draw's mass is handed over as the fraction ``(mass - offset) / sum``
        of the total the client knew and applied to the shard's current total: with no change
        in between this is the mass itself (to one rounding), and after a change the draw still
        follows the shard's current priorities, only the shard's share of the batch being the
        earlier one. A shard asked for draws that has no row anymore makes the client refresh
        the totals and draw the batch again. The importance weights use the minimum from the
        sample's own replies. With one client and no prefetch, sampling is exact: the split
        waits for the replies of the client's own writes and updates (with one shard there is
        no split, and a sample reaches the shard after them without waiting).

    .. note:: Writes do not wait for the shards. Each shard hands a client ranges of its write
        sequence (a few chunks at a time, asked for ahead of need, so only a client's first
        write to a shard waits for one); the client writes each chunk at rows of its ranges,
        so :meth:`extend` returns the global indices at once and the call travels on without
        being waited for. Ranges are disjoint: clients in any number of processes get distinct
        rows of a lap. While a shard has not answered a client's earlier writes, the client
        holds its next chunks for that shard (copied) and sends them as one write (a call
        costs a shard far more than the rows it carries) once those are answered (as seen by
        its next :meth:`extend`), past 8,192 rows, or before any other call it makes. A
        write that fails is reported by the client's next call
        (:class:`ShardWriteError` or :class:`ShardRestartedError`, naming the shard and the
        global indices of the rows not stored); a client's calls reach a shard in the order it
        makes them, so its reads, samples and priority updates come after its writes. A
        writer process calls :meth:`sync` (or :meth:`close`) before it exits or idles: the
        chunks it holds go out with its next call. What this
        trades: rows reserved by one client and not yet written are passed over by the
        others' writes (with several writing clients a lap evicts in reservation order, not
        write order); until written they hold no data, are not counted in ``len()`` and are
        never drawn, and the rows a client lets go of unwritten (:meth:`close`) are handed out
        again first. A reservation lapses when its shard restarts, is emptied or loaded: a
        write under it is refused and reported. Writes to shards whose sampler is not
        prioritized or uniform (a without-replacement or slice sampler would draw reserved
        rows), whose writer is not round-robin or whose storage is not a 1-D tensor storage
        wait for their indices until each chunk is stored.

    .. note:: Priority updates are checked on the client (indices held by a shard, finite and
        non-negative priorities). Without ``prefetch`` they are sent at once, without waiting,
        and the next :meth:`sample` sees them: calls from one client reach a shard in order,
        and with several shards it waits for their replies so that its split includes them.
        With ``prefetch``, samples are drawn ahead, as in torchrl, before the updates of the
        batches just returned: the updates then travel with the next sample's calls to each
        shard (one call per shard and step), and a batch does not reflect the updates of the
        ``prefetch`` batches before it (torchrl's prefetching threads trade the same).

    .. note:: Faults. A shard actor that dies is restarted by Ray (``max_restarts``) and reloads
        its part of the last checkpoint (:meth:`dumps` or :meth:`loads`), then replays its journal
        with ``write_ahead=True``. The first call that meets the restarted shard raises
        :class:`ShardRestartedError` naming it and the number of rows it lost (none with the
        journal); the other shards keep serving, and the calls after it use the restored shard.
        A call to a shard that is down waits for it up to ``sample_timeout`` seconds, then raises
        :class:`ShardUnavailableError`: a sample never draws from the other shards alone.

    .. note:: Checkpoints. :meth:`dumps` has each shard publish its part whole (under
        ``path/shard_<k>/<version>/``, as our buffers publish theirs), then publishes
        ``path/manifest.json`` naming every shard's version in one rename; only then are the
        older parts removed. :meth:`loads` reads the manifest and checks every part before any
        shard loads, so a restore never mixes shards from two checkpoints. Each shard takes its
        part when the call reaches it: writes from other clients meanwhile may fall in some
        parts and not others.

    .. note:: ``transform`` / ``transform_factory`` run on the client, as torchrl's actor runs
        them: the inverse on each batch before it is written, the transform on each batch
        received, before ``"index"`` and ``"priority_weight"`` are set. A client made for
        another process carries a copy. ``PrioritizedSliceSampler`` is not supported sharded.

    Examples:
        >>> from functools import partial
        >>> import ray, torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyTensorStorage, RayReplayBuffer, TensorDictPrioritizedReplayBuffer
        >>> rb = RayReplayBuffer(
        ...     replay_buffer_cls=TensorDictPrioritizedReplayBuffer,
        ...     ray_init_config={"num_cpus": 2},
        ...     num_shards=2, alpha=0.7, beta=0.5,
        ...     storage=partial(LazyTensorStorage, 1000), batch_size=16)
        >>> index = rb.extend(TensorDict({"obs": torch.randn(100, 4)}, [100]))
        >>> sample = rb.sample()
        >>> rb.update_tensordict_priority(sample.set("td_error", torch.rand(16)))
        >>> len(rb), sample["priority_weight"].shape
        (100, torch.Size([16]))
        >>> rb.close()
    """

    def __init__(
        self,
        *args,
        replay_buffer_cls: type[ReplayBuffer] | None = ReplayBuffer,
        ray_init_config: dict[str, Any] | None = None,
        remote_config: dict[str, Any] | None = None,
        delayed_init: bool = False,
        num_shards: int = 1,
        recovery_dir=None,
        write_ahead: bool = False,
        sample_timeout: float = 60.0,
        chunk_rows: int = 4096,
        compiled_graph: bool = True,
        **kwargs,
    ) -> None:
        if "_actors" in self.__dict__:
            return  # built by ReplayBuffer(service_backend="ray"), whose __init__ call follows
        ray = _import_ray()
        if args:
            raise TypeError(f"RayReplayBuffer takes keyword arguments only, got positional {args}")
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"num_shards must be a positive integer, got num_shards={num_shards!r}")
        _check_chunk_rows(chunk_rows)
        transform, transform_factory = kwargs.pop("transform", None), kwargs.pop("transform_factory", None)
        check_transform_arguments(transform, transform_factory)
        # applied by the client (the inverse before a write is sent, the transform to each
        # batch received): what torchrl's actor does with them, without a round trip for them
        self._transform = make_transform(transform, transform_factory)
        if replay_buffer_cls is None:
            replay_buffer_cls = ReplayBuffer
        if not ray.is_initialized():
            ray.init(**(ray_init_config or {}))
        self._ray = ray
        self._num_shards = num_shards
        self._sample_timeout = float(sample_timeout)
        self._chunk_rows = chunk_rows
        self._generator = kwargs.pop("generator", None)
        self._prefetch_cap = int(kwargs.pop("prefetch", None) or 0)
        self._pin_memory = kwargs.pop("pin_memory", False)
        self._batch_size = kwargs.get("batch_size")
        if self._prefetch_cap and self._batch_size is None:
            raise ValueError("When using prefetch, the batch-size must be specified in advance.")
        self._owned_recovery_dir = None
        if recovery_dir is None:
            recovery_dir = self._owned_recovery_dir = tempfile.mkdtemp(prefix="replay-ray-")
        self._recovery_dir = str(recovery_dir)

        per_shard = self._per_shard_kwargs(kwargs, num_shards)
        options = {**DEFAULT_SHARD_OPTIONS, **(remote_config or {})}
        from torchrl_compat._ray.shard import ReplayShard

        self._placement_group = None
        if "scheduling_strategy" not in options:
            self._placement_group = _spread_group(ray, options, num_shards, self._sample_timeout)
        actor_cls = ray.remote(ReplayShard)
        self._actors = [
            actor_cls.options(**options, **_bundle(self._placement_group, k)).remote(
                k, replay_buffer_cls, per_shard[k], self._recovery_dir, write_ahead)
            for k in range(num_shards)
        ]
        try:
            descriptions = ray.get([actor.describe.remote() for actor in self._actors])
        except Exception:
            for actor in self._actors:
                ray.kill(actor, no_restart=True)
            self._remove_placement_group()
            raise
        self._setup(descriptions)
        self._owner = True
        self._graph_wanted = bool(compiled_graph) and self._kind in ("prioritized", "uniform")

    # ------------------------------------------------------------------ setup
    @staticmethod
    def _per_shard_kwargs(kwargs: dict, num_shards: int) -> list[dict]:
        storage_capacity = routing.capacity_of_factory(kwargs.get("storage"), "storage")
        sampler_capacity = routing.capacity_of_factory(kwargs.get("sampler"), "sampler")
        storage_shares = (
            routing.shard_capacities(storage_capacity, num_shards) if storage_capacity else [None] * num_shards
        )
        sampler_shares = (
            routing.shard_capacities(sampler_capacity, num_shards) if sampler_capacity else [None] * num_shards
        )
        shards = []
        for k in range(num_shards):
            shard_kwargs = dict(kwargs)
            if "storage" in kwargs:
                shard_kwargs["storage"] = routing.shard_factory(kwargs["storage"], "storage", storage_shares[k])
            if "sampler" in kwargs:
                shard_kwargs["sampler"] = routing.shard_factory(kwargs["sampler"], "sampler", sampler_shares[k])
            shards.append(shard_kwargs)
        return shards

    def _setup(self, descriptions: list[dict]) -> None:
        first = descriptions[0]
        self._kind = first["kind"]
        if self._kind == "unsupported":
            self.close()
            raise NotImplementedError(
                f"RayReplayBuffer does not shard a {first['sampler']}: use a RandomSampler, "
                "SamplerWithoutReplacement, SliceSampler or PrioritizedSampler."
            )
        self._description = first
        self._capacities = [int(d["max_size"]) for d in descriptions]
        self._stride = max(self._capacities)
        self._is_tensordict = first["tensordict"]
        self._priority_key = first["priority_key"]
        self._totals = routing.ShardTotals(self._num_shards)
        for shard, description in enumerate(descriptions):
            self._totals.update(shard, description["totals"])
        self._reservable = all(d.get("reservable", False) for d in descriptions)
        self._reserve_rows = _reserve_rows(self._chunk_rows, self._capacities)
        if self._kind == "slice":
            self._trajectory_keys = first["trajectory_keys"]
        self._init_client_state()

    def _init_client_state(self) -> None:
        """What each client holds for itself: calls submitted, writes and updates in flight,
        reservations, prefetched samples."""
        n = self._num_shards
        self._seq = [0] * n  # calls submitted to each shard
        self._seen = [0] * n  # the latest call whose totals are in self._totals
        self._update_calls = []
        self._pending_updates = [[] for _ in range(n)]
        self._prefetch_queue = collections.deque()
        self._writes = collections.deque()  # _Write, oldest first
        self._in_flight = [0] * n  # writes in flight, per shard
        self._held = [[] for _ in range(n)]  # _Held chunks not sent yet, per shard
        self._reservations = Reservations(n, self._reserve_rows)
        self._reserve_calls = [None] * n  # a reservation asked for ahead, per shard
        self._ring = routing.WriteRing(self._capacities, self._chunk_rows)
        # each shard's next sequence number as this client writes them: their sum is where
        # it continues the write ring
        self._next_sequence = np.array(self._totals.frontier, dtype=np.int64)
        self._lapped = np.zeros(n, dtype=bool)  # shards that handed this client a lap
        self._max_sent = None  # the largest priority this client's updates gave
        self._known_leaves = None  # (global index, stored priority) of the last batch's rows
        self._graph = None  # the compiled learner graph, once built
        self._graph_wanted = False  # whether this client samples through one
        self._graph_builds = 0
        self._graph_broken = False  # a graph broke: the task path samples until it succeeds
        self._graph_steps = collections.deque()  # _GraphStep in flight, oldest first
        self._open_shard = None  # the shard of a trajectory a slice buffer's last write left open
        self._slice_weights = {}  # seq_length -> (rows_written, incarnations, eligible trajectories)

    # ------------------------------------------------------------------ plumbing
    def _submit(self, shard: int, method: str, *args):
        if self._graph_steps:
            self._settle_graph()  # a task call may overtake a graph step: it goes after them
        self._seq[shard] += 1
        return (shard, self._seq[shard], getattr(self._actors[shard], method).remote(*args))

    # ------------------------------------------------------------------ compiled graph
    def _uses_graph(self) -> bool:
        """Whether this sample goes through the compiled learner graph (built on first use,
        and again once the task path has served a sample after one broke)."""
        if not self._graph_wanted or self._prefetch_cap or self._graph_broken:
            return False
        if self._graph is None:
            if self._graph_builds > GRAPH_REBUILDS:
                return False
            self._graph_builds += 1
            try:
                from ray.dag import InputNode, MultiOutputNode

                with InputNode() as request:
                    dag = MultiOutputNode([actor.learner_step.bind(request) for actor in self._actors])
                self._graph = dag.experimental_compile(_submit_timeout=self._sample_timeout)
            except Exception as err:  # noqa: BLE001 - the task path serves instead
                self._graph_error = err
                return False
        return True

    def _graph_execute(self, request: list) -> _GraphStep:
        """Executes one step of the graph (``request[k]``: ``(method, draws, updates)`` of shard
        ``k``), without waiting for it. A step may overtake task calls in flight: this
        client's writes and updates sent that way are waited for first."""
        if self._writes or any(self._held):
            self._wait_for_writes()
        if self._update_calls:
            self._finish(self._drain_update_calls())
        seqs = []
        for k in range(self._num_shards):
            self._seq[k] += 1
            seqs.append(self._seq[k])
        try:
            ref = self._graph.execute(request)
        except Exception as err:  # noqa: BLE001 - see _graph_failed
            raise self._graph_failed(err, [entry[2] for entry in request])
        step = _GraphStep(ref, seqs, [entry[2] for entry in request])
        self._graph_steps.append(step)
        return step

    def _graph_replies(self, step: _GraphStep) -> list:
        """The replies of ``step`` (and of the steps before it), their totals noted."""
        while self._graph_steps:
            oldest = self._graph_steps.popleft()
            try:
                replies = self._ray.get(oldest.ref, timeout=self._sample_timeout)
            except Exception as err:  # noqa: BLE001 - see _graph_failed
                updates = [u for s in [oldest, *self._graph_steps] for u in s.updates]
                self._graph_steps.clear()
                raise self._graph_failed(err, updates)
            for k, reply in enumerate(replies):
                self._note(k, oldest.seqs[k], reply if _is_totals(reply) else reply[-1])
            if oldest is step:
                return replies
        raise AssertionError("a graph step read twice")  # pragma: no cover

    def _settle_graph(self) -> None:
        """Reads every graph step in flight; a failed one hands its updates to the task path."""
        try:
            if self._graph_steps:
                self._graph_replies(self._graph_steps[-1])
        except _GraphFailed:
            pass

    def _graph_failed(self, err: Exception, updates: list) -> _GraphFailed:
        """Lets go of a broken graph (its actors are torn down in the background: a dead
        shard's loop is waited for) and puts the updates it carried back in front of the
        pending ones; the caller goes on through the task path (which finds the restart)."""
        graph, self._graph = self._graph, None
        self._graph_error = err
        self._graph_broken = True
        self._known_leaves = None  # the updates handed back are sent, and waited for, first
        if graph is not None:
            threading.Thread(target=_teardown, args=(graph,), daemon=True).start()
        for k, update in enumerate(updates if len(updates) == self._num_shards else []):
            if update is not None:
                self._pending_updates[k].insert(0, update)
        return _GraphFailed(str(err))

    def _note(self, shard: int, seq: int, totals: tuple) -> None:
        """Takes a reply's totals (the newest per shard win); a new incarnation means the shard
        restarted: raises :class:`ShardRestartedError`."""
        known = self._totals.incarnation[shard]
        if seq >= self._seen[shard]:
            previous_rows = int(self._totals.rows_written[shard])
            self._seen[shard] = seq
            self._totals.update(shard, totals)
            if known is not None and totals[-1] != known:
                self._restarted(shard, previous_rows)

    def _restarted(self, shard: int, previous_rows: int):
        description = self._ray.get(self._actors[shard].describe.remote())
        restored = description["restored"]
        kept = 0 if restored is None else int(restored["rows_written"])
        lost = max(0, previous_rows - kept)
        self._totals.update(shard, description["totals"])
        self._pending_updates[shard] = []  # they name rows of the shard as it was
        self._reservations.drop(shard)  # they lapsed with the old incarnation
        self._reserve_calls[shard] = None
        self._next_sequence[shard] = self._totals.frontier[shard]
        self._lapped[shard] = False
        self._known_leaves = None
        if restored is None:
            origin = "empty (it had no checkpoint)"
        else:
            origin = (
                f"from checkpoint version {restored['version']} "
                f"({restored['rows_written_at_checkpoint']} rows written then, "
                f"{restored['replayed_records']} journal records replayed)"
            )
        raise ShardRestartedError(
            f"shard {shard} of {self._num_shards} was restarted {origin}: it lost {lost} of the "
            f"{previous_rows} rows written to it (the other shards kept theirs)",
            shard=shard, rows_lost=lost, restored=restored,
        )

    def _result(self, shard: int, seq: int, ref, faults: "_Faults | None" = None):
        """The reply of one call, its totals noted. A shard that does not answer is waited
        for until the call's deadline (``sample_timeout`` from its start, one for all its
        replies: ``faults``), then reported as restarted or unavailable; a shard found so
        earlier in the same call is reported again at once."""
        ray = self._ray
        faults = faults or _Faults(self._sample_timeout)
        known = faults.down.get(shard)
        if isinstance(known, ShardUnavailableError):
            raise known
        try:
            reply = ray.get(ref, timeout=faults.left())
        except ray.exceptions.GetTimeoutError:
            raise faults.record(shard, self._unavailable(shard)) from None
        except ray.exceptions.RayActorError:
            if known is not None:
                raise known from None  # a call to the incarnation that died
            raise faults.record(shard, self._await_restart(shard, faults)) from None
        try:
            self._note(shard, seq, reply if _is_totals(reply) else reply[-1])
        except ShardRestartedError as err:
            raise faults.record(shard, err) from None
        return reply

    def _unavailable(self, shard: int) -> ShardUnavailableError:
        return ShardUnavailableError(
            f"shard {shard} of {self._num_shards} is down and did not come back within "
            f"sample_timeout={self._sample_timeout} s",
            shard=shard,
        )

    def _await_restart(self, shard: int, faults: "_Faults") -> Exception:
        """Waits (until the call's deadline) for a shard whose actor died: the error to raise,
        :class:`ShardRestartedError` once Ray restarted it, else :class:`ShardUnavailableError`."""
        ray = self._ray
        previous_rows = int(self._totals.rows_written[shard])
        while True:
            left = faults.left()
            if left <= 0:
                return self._unavailable(shard)
            try:
                ray.get(self._actors[shard].ping.remote(), timeout=left)
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                time.sleep(min(0.05, max(left, 0)))
        try:
            self._restarted(shard, previous_rows)
        except ShardRestartedError as err:
            return err
        raise AssertionError("_restarted returns only by raising")  # pragma: no cover

    def _results(self, calls, faults: "_Faults | None" = None) -> tuple[dict, list]:
        """Every call's reply by shard, and the errors met (raised once all are read)."""
        faults = faults or _Faults(self._sample_timeout)
        replies, errors = {}, []
        for shard, seq, ref in calls:
            try:
                replies[shard] = self._result(shard, seq, ref, faults)
            except Exception as err:  # noqa: BLE001 - re-raised below, after the other shards
                errors.append(err)
        return replies, errors

    def _take_updates(self, shard: int):
        """The priority updates waiting for ``shard`` (prefetching clients send them with the
        next sample), as one ``(index, priority)`` pair, or ``None``."""
        pending = self._pending_updates[shard]
        if not pending:
            return None
        self._pending_updates[shard] = []
        if len(pending) == 1:
            return pending[0]
        return np.concatenate([p[0] for p in pending]), np.concatenate([p[1] for p in pending])

    def _send_updates(self) -> None:
        for k in range(self._num_shards):
            update = self._take_updates(k)
            if update is not None:
                self._update_calls.append(self._submit(k, "update_priority", *update))

    def _drain_update_calls(self):
        calls, self._update_calls = self._update_calls, []
        return calls

    def _harvest_updates(self) -> None:
        """Reads the replies of the priority updates that have arrived, without waiting."""
        if not self._update_calls:
            return
        refs = [ref for _, _, ref in self._update_calls]
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        if ready:
            ready = set(ready)
            done = [call for call in self._update_calls if call[2] in ready]
            self._update_calls = [call for call in self._update_calls if call[2] not in ready]
            self._finish(done)

    def _wait_for_updates(self) -> None:
        """Waits for the priority updates in flight: the totals then include them."""
        self._send_updates()
        if self._update_calls:
            self._finish(self._drain_update_calls())

    def _finish(self, calls) -> dict:
        replies, errors = self._results(calls)
        if errors:
            raise _combined(errors)
        return replies

    def _refresh_totals(self) -> None:
        """Asks every shard for its totals (carrying the pending priority updates)."""
        calls = [self._submit(k, "ping", self._take_updates(k)) for k in range(self._num_shards)]
        self._finish(calls + self._drain_update_calls())

    def _global_index(self, shard: int, local) -> np.ndarray:
        return np.asarray(local, dtype=np.int64) + shard * self._stride

    # ------------------------------------------------------------------ writes
    def extend(self, data, *, update_priority: bool | None = None) -> torch.Tensor:
        """Writes ``data`` (rows along the first dimension) along the write ring, in pieces of
        at most ``chunk_rows`` rows (see "Writes and evictions" in the class docstring).

        The indices come from the rows this client has reserved on each shard: the calls are
        sent without waiting for them, or held to go with the next chunks while the shard
        has not answered the last ones (see the class docstring), and a write that fails is
        reported by this client's next call.

        Returns:
            the global indices of the rows (int64): distinct, unless the write holds more rows
            than the buffer (its first rows are then overwritten by its last ones, as in one
            buffer).

        Raises:
            ShardWriteError: an earlier write was not stored (its shard and rows named).
            ShardRestartedError: a shard restarted; its ``index`` holds the global indices of
                the rows of earlier writes that were not stored.
        """
        if self._writes:
            self._harvest_writes()  # the chunks held for later stay held (see _send_held)
        if self._has_transforms():
            data = self._apply_inverse_transform(data)
            if data is None:
                return torch.zeros((0,), dtype=torch.long)
        self._known_leaves = None  # the write may overwrite the last batch's rows
        if any(self._pending_updates):
            self._send_updates()  # the updates waiting for a sample reach the rows before the write
        if not self._reservable:
            self._send_held()
            return self._extend_blocking(data)
        packed = wire.pack(data)
        num_rows = wire.num_rows(packed)
        if num_rows == 0:
            return torch.zeros((0,), dtype=torch.long)
        max_priority = self._max_priority()
        index = np.empty(num_rows, dtype=np.int64)
        taken = _WriteRows(self._capacities) if num_rows <= self._ring.capacity else None
        position = self._ring.position(self._next_sequence)
        start = 0
        full, spent = set(), set()  # shards found without room / without a row left, this write
        while start < num_rows:
            room = self._known_room()
            if room is not None:
                room[list(full)] = 0
                room = room if room.any() else None
            for shard, count in routing.plan_write(self._ring, position, num_rows - start, room, spent):
                runs = self._reserved(shard, count, room is not None, taken)
                for token, first, rows, fills in runs:
                    self._write_chunk(shard, packed, start, token, first, rows, fills, index, max_priority)
                    start += rows
                written = sum(run[2] for run in runs)
                position += written
                if written < count:
                    # the shard had less room than this client knew (or, overwriting, no row
                    # this write has not taken): the rest goes elsewhere
                    (full if room is not None else spent).add(shard)
                    break
        for shard in range(self._num_shards):
            if self._held[shard] and not self._in_flight[shard]:
                self._send_held(shard, max_priority)
        if len(self._writes) > MAX_WRITES_IN_FLIGHT:
            self._harvest_writes(at_least=len(self._writes) - MAX_WRITES_IN_FLIGHT)
        return torch.from_numpy(index)

    def _write_chunk(self, shard, packed, start, token, first, rows, fills, index, max_priority) -> None:
        """Sends (or holds) rows ``start`` .. ``start + rows - 1`` of a write, reserved on
        ``shard`` from sequence number ``first`` on, and records their global indices."""
        capacity = self._capacities[shard]
        local = np.arange(first, first + rows, dtype=np.int64) % capacity
        global_index = local + shard * self._stride
        index[start:start + rows] = global_index
        chunk = wire.rows(packed, start, start + rows)
        if chunk[0] != wire.OBJECT and (self._in_flight[shard] or self._held[shard]):
            # the shard is busy with this client's writes: sent with the next chunks
            self._hold(shard, _Held(wire.copy(chunk), global_index, token, first, fills), max_priority)
        else:
            self._send_held(shard, max_priority)
            self._submit_write(shard, chunk, global_index, token, first, max_priority, fills)

    def _max_priority(self) -> float | None:
        """The priority new rows get (prioritized buffers): the largest given so far, from the
        shards' replies and from this client's updates, those in flight included."""
        if self._kind != "prioritized":
            return None
        known = self._totals.global_max_priority()
        sent = self._max_sent
        return sent if known is None or (sent is not None and sent > known) else known

    def _known_room(self) -> np.ndarray | None:
        """The rows each shard can still take before a write there overwrites one, as far as
        this client knows (the rows it holds that fill the shard, the rows no client holds
        yet, and a reservation asked for ahead from a shard not seen full), or ``None`` when
        every shard is known to be full. :meth:`_reserved` finds out the rest."""
        reservations = self._reservations
        room = np.array([reservations.held(k, fills=True) for k in range(self._num_shards)], dtype=np.int64)
        room += self._totals.room
        for k, call in enumerate(self._reserve_calls):
            if call is not None and not self._lapped[k]:
                room[k] += reservations.block
        return room if room.any() else None

    def _submit_write(self, shard: int, packed, rows: np.ndarray, token, first: int, max_priority, fills) -> None:
        call = self._submit(shard, "write_at", token, first, max_priority, *wire.to_arguments(packed))
        self._writes.append(_Write(shard, call[1], call[2], rows, token, first, fills))
        self._in_flight[shard] += 1

    def _hold(self, shard: int, chunk: _Held, max_priority) -> None:
        """Keeps ``chunk`` for one write with the chunks held before it; what cannot join
        them (another range, other leaves) or passes ``MAX_HELD_ROWS`` sends them first."""
        held = self._held[shard]
        if held and (
            not chunk.follows(held[-1]) or sum(len(h.index) for h in held) + len(chunk.index) > MAX_HELD_ROWS
        ):
            self._send_held(shard, max_priority)
        self._held[shard].append(chunk)

    def _send_held(self, shard: int | None = None, max_priority=None) -> None:
        """Sends the chunks held for ``shard`` (every shard by default) as one write. Every
        call other than :meth:`extend` sends them first, so that it reaches the shard after
        them."""
        shards = range(self._num_shards) if shard is None else (shard,)
        for k in shards:
            held = self._held[k]
            if not held:
                continue
            self._held[k] = []
            if max_priority is None:
                max_priority = self._max_priority()
            packed = held[0].packed if len(held) == 1 else wire.concatenate([h.packed for h in held])
            rows = held[0].index if len(held) == 1 else np.concatenate([h.index for h in held])
            self._submit_write(k, packed, rows, held[0].token, held[0].start, max_priority, held[0].fills)

    def _reserved(self, shard: int, rows: int, fills: bool, taken: _WriteRows | None) -> list[tuple]:
        """``(token, start, count, fills)`` runs of up to ``rows`` rows reserved on ``shard``
        (with ``fills``, only rows that fill it: fewer when it turns out full); waits for a
        reservation only when this client holds too few, and asks for the next one ahead.
        ``taken`` passes over rows the same write already took."""
        reservations = self._reservations
        runs = []
        while rows and not (taken is not None and taken.full(shard)):
            got = reservations.take(shard, rows, fills=fills)
            if not got:
                if reservations.held(shard):
                    break  # what is held overwrites: the shard is full
                self._receive_reservation(shard, rows)
                continue
            if taken is not None:
                got = [part for run in got for part in taken.admit(shard, run)]
            if got:
                runs += got
                rows -= sum(run[2] for run in got)
                self._next_sequence[shard] = max(self._next_sequence[shard], got[-1][1] + got[-1][2])
        if reservations.held(shard) < reservations.block // 2 and self._reserve_calls[shard] is None:
            self._reserve_calls[shard] = self._submit(shard, "reserve", reservations.block)
        return runs

    def _receive_reservation(self, shard: int, rows: int = 0) -> None:
        """Waits for a reservation on ``shard`` (the one asked for ahead, else a new one of at
        least ``rows`` rows) and keeps it; the ranges other clients' writes lapped since are
        dropped."""
        call = self._reserve_calls[shard]
        if call is None:
            call = self._submit(shard, "reserve", max(rows, self._reservations.block))
        self._reserve_calls[shard] = None
        (token, start, stop, fills), _ = self._finish([call])[shard]
        self._lapped[shard] |= not fills
        self._reservations.trim(shard, stop - self._capacities[shard])
        self._reservations.add(shard, token, start, stop, fills)

    def _check_writes(self) -> None:
        """Sends the chunks held, reads the replies of the writes that have arrived, without
        waiting; raises what failed."""
        self._send_held()
        if self._writes:
            self._harvest_writes()

    def _wait_for_writes(self) -> None:
        self._send_held()
        if self._writes:
            self._harvest_writes(at_least=len(self._writes))

    def _harvest_writes(self, at_least: int = 0) -> None:
        """Reads the replies of the writes in flight that have arrived (waiting for at least
        ``at_least`` of them, oldest first); raises :class:`ShardWriteError` (or
        :class:`ShardRestartedError`) naming the shards and rows of those not stored: once
        one failed, of all the writes in flight, waited for."""
        writes = self._writes
        if at_least >= len(writes):
            done, self._writes = list(writes), collections.deque()
        else:
            refs = [write.ref for write in writes]
            ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=0)
            if len(ready) < at_least:
                ready, _ = self._ray.wait(refs[:at_least], num_returns=at_least)
                ready += self._ray.wait(refs[at_least:], num_returns=len(refs) - at_least, timeout=0)[0]
            if not ready:
                return
            ready = set(ready)
            done = [write for write in writes if write.ref in ready]
            self._writes = collections.deque(write for write in writes if write.ref not in ready)
        faults = _Faults(self._sample_timeout)
        failures = self._read_writes(done, faults)
        if failures and self._writes:
            # one error for every write in flight: the others are waited for (one deadline
            # for all of them), so what it names does not depend on which replies were in
            rest, self._writes = list(self._writes), collections.deque()
            failures += self._read_writes(rest, faults)
        if failures:
            raise self._write_failure(failures)

    def _read_writes(self, done, faults: "_Faults") -> list:
        """``(shard, index, reason)`` of the writes in ``done`` that stored nothing (waiting
        for the replies not in yet, until ``faults``' deadline); the rows of a write its
        shard refused go back to the reservations."""
        failures = []
        for write in done:
            self._in_flight[write.shard] -= 1
            try:
                reason, _ = self._result(write.shard, write.seq, write.ref, faults)
            except self._ray.exceptions.RayTaskError as err:
                # the shard refused the batch and wrote nothing: its rows serve the next write
                self._reservations.restore(write.shard, write.token, write.start, write.start + len(write.index),
                                           write.fills)
                reason = err
            except Exception as err:  # noqa: BLE001 - reported below with the rows
                reason = err
            if reason == LAPSED:
                # the shard's epoch changed under this client: every range it holds there
                # lapsed with this one
                self._reservations.drop(write.shard)
                self._lapped[write.shard] = False
            if reason is not None:
                failures.append((write.shard, write.index, reason))
        return failures

    def _write_failure(self, failures) -> Exception:
        """One error naming every row of ``failures`` (``(shard, index, reason)``): a shard
        restarted or down heads it (all of them named, see :func:`_combined`), else
        :class:`ShardWriteError`."""
        lines = [f"shard {shard}: global indices {describe_rows(index)}: {_reason(reason)}"
                 for shard, index, reason in failures]
        faults = []
        for _, _, reason in failures:
            if isinstance(reason, (ShardRestartedError, ShardUnavailableError)) and all(reason is not f for f in faults):
                faults.append(reason)
        if faults:
            err = _combined(faults)
            err.index = torch.from_numpy(np.concatenate([index for _, index, _ in failures]))
            err.args = (f"{err.args[0]}; rows of writes in flight not stored: " + "; ".join(lines),)
            return err
        return ShardWriteError(
            f"{sum(len(index) for _, index, _ in failures)} row(s) an earlier extend returned the "
            "indices of were not stored: " + "; ".join(lines),
            failures=failures,
        )

    def _drop_reservations(self) -> None:
        """After the shards' epoch changed (empty, load): every reservation lapsed; the write
        ring continues from the shards' cursors."""
        self._reservations.drop()
        self._reserve_calls = [None] * self._num_shards

    def _restart_ring(self) -> None:
        """After the shards' epoch changed: the write ring continues from their cursors."""
        self._next_sequence = np.array(self._totals.frontier, dtype=np.int64)
        self._lapped[:] = False
        self._max_sent = None
        self._known_leaves = None
        self._open_shard = None

    def sync(self) -> None:
        """Waits for this client's writes and priority updates in flight; raises what failed
        (a writer process calls it before it exits, or any blocking call such as
        :meth:`sample` or ``len()``)."""
        self._wait_for_writes()
        self._wait_for_updates()

    def _extend_blocking(self, data) -> torch.Tensor:
        """The write of a shard that cannot write where the client says (a sampler that draws
        by other means than rows, a writer other than round-robin, a storage other than a 1-D
        tensor storage): sends every chunk, then waits for the indices. A chunk meant to fill
        a shard that another client filled meanwhile comes back partly written: its other
        rows are planned again."""
        packed = wire.pack(data)
        num_rows = wire.num_rows(packed)
        if num_rows == 0:
            return torch.zeros((0,), dtype=torch.long)
        max_priority = self._max_priority()
        index = np.full(num_rows, -1, dtype=np.int64)
        ends = routing.trajectory_ends(data, self._trajectory_keys) if self._kind == "slice" else None
        left = [(0, num_rows)]
        while left:
            room = np.array(self._totals.room, dtype=np.int64)
            fill = room.any()
            calls, spans, errors = [], {}, []
            for first, stop in left:
                for shard, start, end in self._blocking_chunks(first, stop, ends, room):
                    call = self._submit(shard, "extend", max_priority, bool(fill),
                                        *wire.to_arguments(wire.rows(packed, start, end)))
                    calls.append(call)
                    spans[call[2]] = (start, end)
            left = []
            faults = _Faults(self._sample_timeout)
            for shard, seq, ref in calls:
                start, end = spans[ref]
                try:
                    local, _ = self._result(shard, seq, ref, faults)
                except Exception as err:  # noqa: BLE001 - raised below with what was stored
                    errors.append(err)
                    continue
                index[start:start + len(local)] = self._global_index(shard, local)
                if start + len(local) < end:
                    left.append((start + len(local), end))
            if errors:
                err = _combined(errors)
                if isinstance(err, (ShardRestartedError, ShardUnavailableError)):
                    err.index = torch.from_numpy(index)  # -1 where a row was not stored
                raise err
        return torch.from_numpy(index)

    def _blocking_chunks(self, first: int, stop: int, ends, room) -> list[tuple[int, int, int]]:
        """``(shard, start, stop)`` chunks of rows ``first`` .. ``stop - 1`` of a blocking write:
        along the write ring, or whole trajectories to a shard for a slice sampler (see
        :func:`~torchrl_compat._ray.routing.plan_trajectories`). ``room`` is used up as
        chunks are planned."""
        if ends is not None:
            load = self._totals.rows_written / np.asarray(self._capacities, dtype=np.float64)
            chunks, self._open_shard = routing.plan_trajectories(
                ends[first:stop], self._chunk_rows, room, load, self._capacities,
                open_shard=self._open_shard if first == 0 else None)
            for shard, start, end in chunks:
                room[shard] = max(0, room[shard] - (end - start))
            return [(shard, start + first, end + first) for shard, start, end in chunks]
        position = self._ring.position(self._totals.frontier)
        chunks = []
        for shard, rows in routing.plan_write(self._ring, position, stop - first, room if room.any() else None):
            chunks.append((shard, first, first + rows))
            room[shard] = max(0, room[shard] - rows)
            first += rows
        return chunks

    def add(self, data) -> int:
        """Writes one item; returns its global index."""
        if isinstance(data, TensorDictBase):
            batch = data.unsqueeze(0)
        elif isinstance(data, torch.Tensor):
            batch = data.unsqueeze(0)
        else:
            batch = [data]
        return int(self.extend(batch)[0])

    def update_priority(self, index, priority) -> None:
        """Gives the rows at the global ``index`` new priorities. Checked here (indices held by a
        shard, priorities finite and non-negative), sent with the next call to each shard.
        Negative indices (``-1``: rows a writer skipped) are ignored, as in torchrl."""
        if isinstance(index, tuple):
            raise ValueError("RayReplayBuffer holds 1-D storages: index must be a 1-D tensor, not a tuple")
        self._check_writes()
        index = _numpy(index, "index").reshape(-1)
        priority = _numpy(priority, "priority")
        if priority.ndim == 0 or priority.size == 1:
            priority = np.broadcast_to(priority.reshape(()), index.shape)
        priority = priority.reshape(-1)
        if priority.shape != index.shape:
            raise RuntimeError(
                "priority should be a number or an iterable of the same length as index. Got "
                f"priority of shape {tuple(priority.shape)} and index {tuple(index.shape)}."
            )
        keep = index >= 0
        if not keep.all():
            index, priority = index[keep], priority[keep]
        if index.size == 0:
            return
        bad = ~np.isfinite(priority) | (priority < 0)
        if bad.any():
            position = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"priority {priority[position]} at position {position} is not a finite, "
                "non-negative number"
            )
        shard, local = routing.route_global_index(index, self._stride, self._capacities)
        largest = float(priority.max())
        if self._max_sent is None or largest > self._max_sent:
            self._max_sent = largest
        # one shard, a graph step or prefetching carry the updates with the next sample; with
        # several shards so do the other paths when the new sums are known here (the rows of
        # the last batch drawn)
        carried = (self._prefetch_cap or (self._num_shards == 1 and self._graph is not None)
                   or (self._num_shards > 1 and not self._pending_uncarried() and self._predict_sums(index, priority)))
        for k, where in enumerate(routing.groups(shard, self._num_shards)):
            if not where.size:
                continue
            update = (local[where], np.ascontiguousarray(priority[where]))
            if carried or self._graph is not None:
                self._pending_updates[k].append(update)  # sent with the next sample's calls
            else:
                self._update_calls.append(self._submit(k, "update_priority", *update))
        if not carried and self._graph is not None:
            self._graph_send_updates()  # now, not waited for: the next split waits for it
        self._harvest_updates()

    def _pending_uncarried(self) -> bool:
        """Whether updates wait to be sent whose new sums this client did not compute (a
        broken graph handed them back): they are sent, and waited for, before a split."""
        return self._num_shards > 1 and not self._prefetch_cap and any(self._pending_updates) and \
            self._known_leaves is None

    def _remember_leaves(self, index: np.ndarray, priority: np.ndarray) -> None:
        """Keeps the stored priorities (leaves) of a prioritized batch's rows, by global index."""
        if self._num_shards > 1 and not self._prefetch_cap:
            keys, first = np.unique(index, return_index=True)
            self._known_leaves = (keys, priority[first].astype(np.float64))

    def _predict_sums(self, index: np.ndarray, priority: np.ndarray) -> bool:
        """The shards' priority sums after this update, into the totals a split uses, when
        every row it names is one of the last batch's (whose stored priorities this client
        knows and nothing has written since): the update can then travel with the next
        sample's calls, one round trip for both, the split still exact (to the rounding of
        the trees' sums). ``False`` when it cannot tell."""
        known = self._known_leaves
        if known is None or self._kind != "prioritized":
            return False
        keys, leaves = known
        at = np.minimum(np.searchsorted(keys, index), len(keys) - 1)
        if not (keys[at] == index).all():
            return False
        description = self._description
        new = stored_values(torch.from_numpy(np.array(priority, copy=True)), description["eps"],
                            description["alpha"], getattr(torch, description["tree_dtype"]))
        new = new.to(getattr(torch, description["tree_dtype"])).to(torch.float64).numpy()
        # the last value given to a row is the one its leaf keeps (the trees write in order)
        rows, last = np.unique(index[::-1], return_index=True)
        last = len(index) - 1 - last
        at = np.searchsorted(keys, rows)
        change = new[last] - leaves[at]
        leaves[at] = new[last]
        sums = self._totals.sum + np.bincount(rows // self._stride, weights=change, minlength=self._num_shards)
        self._totals.sum[:] = np.maximum(sums, 0.0)
        return True

    def _graph_send_updates(self) -> None:
        """Sends the pending priority updates as one step of the compiled graph."""
        updates = [self._take_updates(k) for k in range(self._num_shards)]
        if any(update is not None for update in updates):
            try:
                self._graph_execute([("ping", None, update) for update in updates])
            except _GraphFailed:
                pass  # back among the pending updates: the task path sends them

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Updates the priorities of a sampled batch from its ``"index"`` and priority entries."""
        if self._kind != "prioritized":
            return
        priority = data.get(self._priority_key)
        if priority.ndim > 1:
            priority = _reduce(priority.flatten(1), self._description["reduction"], dim=1)
        self.update_priority(data.get("index"), priority)

    # ------------------------------------------------------------------ reads
    def _route_draws(self, batch_size: int):
        """The shard and the fraction of its mass (or rows) of each draw of a prioritized or
        uniform batch, from the totals (refreshed first when they hold nothing)."""
        totals = self._totals
        if self._kind == "prioritized":
            if not totals.sum.sum() > 0:
                self._refresh_totals()
                if not totals.count.sum():
                    raise RuntimeError(_EMPTY_STORAGE_ERROR)
            return routing.route_masses(totals.sum, batch_size, self._generator)
        if not totals.count.sum():
            self._refresh_totals()
        return routing.route_uniform(totals.count, batch_size, self._generator)

    def _submit_sample(self, batch_size: int, graph: bool = False) -> _Pending:
        totals = self._totals
        kind = self._kind
        n = self._num_shards
        calls, positions = [], None
        if graph:
            shard, fraction = self._route_draws(batch_size)
            positions = routing.groups(shard, n)
            method = f"sample_{kind}"
            request = [(method, fraction[where] if where.size else None, self._take_updates(k))
                       for k, where in enumerate(positions)]
            return _Pending(batch_size, kind, positions, None, self._graph_execute(request))
        if kind in ("prioritized", "uniform"):
            shard, fraction = self._route_draws(batch_size)
            positions = routing.groups(shard, n)
            for k, where in enumerate(positions):
                if where.size:
                    calls.append(self._submit(k, f"sample_{kind}", fraction[where], self._take_updates(k)))
        else:
            if not totals.count.sum():
                self._refresh_totals()
                if not totals.count.sum():
                    raise RuntimeError(_EMPTY_STORAGE_ERROR)
            if kind == "without_replacement":
                left = totals.remaining if totals.remaining.sum() else totals.count
                take = routing.split_by_counts(left, min(batch_size, int(left.sum())), self._generator,
                                               without_replacement=True)
                slice_len = None
            else:  # slices: whole slices per shard, by the trajectories each can draw one from
                num_slices, slice_len = self._slices(batch_size)
                take = routing.split_by_counts(self._trajectory_weights(slice_len), num_slices,
                                               self._generator) * slice_len
            for k in range(n):
                if take[k]:
                    seed = int(torch.randint(0, 2**62, (), generator=self._generator))
                    calls.append(self._submit(k, "sample_sampler", int(take[k]), seed, slice_len,
                                              self._take_updates(k)))
        # the updates of shards without draws in this batch: waited for with it (without
        # prefetch), so that its weights use the smallest priority after every update
        updates = [self._submit(k, "update_priority", *update)
                   for k, update in enumerate(self._take_updates(k) for k in range(n)) if update is not None]
        if self._prefetch_cap:
            self._update_calls += updates
            updates = []
        return _Pending(batch_size, kind, positions, calls, updates=updates)

    def _trajectory_weights(self, seq_length: int) -> np.ndarray:
        """How many trajectories each shard can draw a slice of ``seq_length`` steps from (a
        shard's share of a batch of slices: each slice then comes from a trajectory drawn
        uniformly over all shards, as in one buffer). Asked for again once a shard's rows or
        incarnation changed since."""
        def state():
            return tuple(self._totals.rows_written.tolist()), tuple(self._totals.incarnation)

        cached = self._slice_weights.get(seq_length)
        if cached is None or cached[0] != state():
            replies = self._finish([self._submit(k, "trajectories", seq_length, self._take_updates(k))
                                    for k in range(self._num_shards)])
            weights = np.array([replies[k][0] for k in range(self._num_shards)], dtype=np.int64)
            self._slice_weights = {seq_length: (state(), weights)}
            cached = self._slice_weights[seq_length]
        weights = cached[1]
        if not weights.sum():
            raise RuntimeError(
                f"Did not find a single trajectory with sufficient length (required={seq_length}) "
                f"on any of the {self._num_shards} shard(s)."
            )
        return weights

    def _slices(self, batch_size: int) -> tuple[int, int]:
        num_slices, slice_len = self._description["num_slices"], self._description["slice_len"]
        if num_slices is not None:
            if batch_size % num_slices:
                raise RuntimeError(
                    f"The batch-size must be divisible by the number of slices, got "
                    f"batch_size={batch_size} and num_slices={num_slices}."
                )
            return num_slices, batch_size // num_slices
        if batch_size % slice_len:
            raise RuntimeError(
                f"The batch-size must be divisible by the slice length, got "
                f"batch_size={batch_size} and slice_len={slice_len}."
            )
        return batch_size // slice_len, slice_len

    def _collect(self, pending: _Pending):
        """``(data, info)`` of a sample in flight; ``None`` when a shard had no row left (the
        caller draws again with the refreshed totals)."""
        if pending.step is not None:
            step_replies = self._graph_replies(pending.step)
            replies = {k: step_replies[k] for k, where in enumerate(pending.positions) if where.size}
        else:
            replies, errors = self._results(pending.calls)
            errors += self._results(pending.updates)[1]
            if errors:
                raise _combined(errors)
        if any(reply[0] is None for reply in replies.values()):
            return None
        batch_size = pending.batch_size
        info = {}
        if pending.kind in ("prioritized", "uniform"):
            shards = sorted(replies)
            positions = [pending.positions[k] for k in shards]
            packed = wire.scatter([replies[k][0] for k in shards], positions, batch_size)
            index = np.empty(batch_size, dtype=np.int64)
            for k, where in zip(shards, positions):
                index[where] = self._global_index(k, replies[k][1])
            if pending.kind == "prioritized":
                template = replies[shards[0]][2]
                priority = np.empty(batch_size, dtype=template.dtype)
                for k, where in zip(shards, positions):
                    priority[where] = replies[k][2]
                info["priority_weight"] = self._weights(priority)
                self._remember_leaves(index, priority)
        else:
            shards = sorted(replies)
            packed = wire.concatenate([replies[k][0] for k in shards])
            index = np.concatenate([self._global_index(k, replies[k][1]) for k in shards])
            if pending.kind == "without_replacement" and len(shards) > 1:
                # the shards' parts one after the other would not be a shuffled batch
                order = torch.randperm(len(index), generator=self._generator).numpy()
                packed = wire.scatter([packed], [np.argsort(order)], len(index))
                index = index[order]
        info["index"] = torch.from_numpy(index)
        data = wire.unpack(packed)
        if self._has_transforms():  # before the info is set, as in one buffer
            data = self._apply_transform(data)
        if self._is_tensordict and isinstance(data, TensorDictBase):
            for key, value in info.items():
                data.set(key, value)
        if self._pin_memory:
            data = data.pin_memory()
        return data, info

    def _weights(self, priority: np.ndarray) -> torch.Tensor:
        """``(p_i / p_min) ** -beta`` with the smallest priority of all shards, computed as one
        ``PrioritizedSampler`` computes it for its tree dtype."""
        p_min = self._totals.global_min()
        beta = self._description["beta"]
        if priority.dtype == np.float64:
            return torch.from_numpy(np.power(priority / p_min, -beta))
        return (torch.from_numpy(priority) / p_min).pow_(-beta)

    def _sample(self, batch_size: int):
        self._check_writes()
        for _ in range(8):
            if self._prefetch_cap:
                queue = self._prefetch_queue
                if queue and queue[0].batch_size != batch_size:
                    self._discard_prefetched()
                pending = queue.popleft() if queue else self._submit_sample(batch_size)
                while len(queue) < self._prefetch_cap:
                    queue.append(self._submit_sample(batch_size))
            elif self._uses_graph():
                # the split waits for this client's writes; the pending updates go with the
                # step (one shard) or ahead of it, waited for before the split (several)
                self._wait_for_writes()
                try:
                    if self._num_shards > 1:
                        if self._pending_uncarried():
                            self._graph_send_updates()
                        self._settle_graph()
                    pending = self._submit_sample(batch_size, graph=True)
                    result = self._collect(pending)
                except _GraphFailed:
                    continue
                if result is not None:
                    return result
                self._refresh_totals()
                continue
            else:
                if self._num_shards > 1:
                    # exact: the split uses totals that include every write and update made so
                    # far (those of updates carried by the sample computed here; one shard
                    # needs no split: the sample reaches it after them)
                    self._wait_for_writes()
                    if self._pending_uncarried():
                        self._wait_for_updates()
                    elif self._update_calls:
                        self._finish(self._drain_update_calls())
                pending = self._submit_sample(batch_size)
            self._harvest_updates()
            result = self._collect(pending)
            if not self._prefetch_cap:
                # done before the sample on its shard: their failures are reported now
                self._wait_for_writes()
                self._wait_for_updates()
            if result is not None:
                self._graph_broken = False  # every shard answered: a graph may be built again
                return result
            self._discard_prefetched()
            self._refresh_totals()
        raise RuntimeError(f"{_EMPTY_STORAGE_ERROR} (the shards kept emptying while sampling)")

    def _discard_prefetched(self) -> None:
        while self._prefetch_queue:
            pending = self._prefetch_queue.popleft()
            self._results(pending.calls)

    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """Samples a batch from all shards (see the class docstring for how it is split).

        With a tensordict buffer the batch holds ``"index"`` (global indices) and, when
        prioritized, ``"priority_weight"``.
        """
        if batch_size is None:
            batch_size = self._batch_size
            if batch_size is None:
                raise RuntimeError(
                    "batch_size not specified. You can specify the batch_size when "
                    "constructing the replay buffer, or pass it to the sample method."
                )
        data, info = self._sample(batch_size)
        return (data, info) if return_info else data

    def _local_calls(self, index, method: str, *extra):
        index = _numpy(index, "index")
        shard, local = routing.route_global_index(index, self._stride, self._capacities)
        positions = routing.groups(shard, self._num_shards)
        # no index at all: shard 0 is asked for none (the reply is an empty batch of its rows)
        calls = [
            (where, self._submit(k, method, local[where], *[a for e in extra for a in e(where)]))
            for k, where in enumerate(positions) if where.size or (k == 0 and not index.size)
        ]
        return index, calls

    def __getitem__(self, index):
        """The rows at the global ``index`` (an int, or a 1-D sequence / array / tensor)."""
        scalar = isinstance(index, (int, np.integer)) or (isinstance(index, torch.Tensor) and index.ndim == 0)
        self._check_writes()
        flat, calls = self._local_calls(np.asarray(index).reshape(-1) if scalar else index, "get")
        replies = self._finish([call for _, call in calls])
        held = len(np.asarray(flat).reshape(-1))
        packed = wire.scatter([replies[call[0]][0] for _, call in calls], [w for w, _ in calls], held)
        data = wire.unpack(packed)
        if self._is_tensordict and isinstance(data, TensorDictBase) and "index" in data.keys():
            data.set("index", torch.from_numpy(np.asarray(flat, dtype=np.int64).reshape(-1)))
        if scalar:
            data = data[0]
        return self._apply_transform(data) if self._has_transforms() else data

    def __setitem__(self, index, value) -> None:
        self._known_leaves = None
        self._send_updates()
        self._check_writes()
        packed = wire.pack(self._apply_inverse_transform(value) if self._has_transforms() else value)
        _, calls = self._local_calls(np.asarray(index).reshape(-1), "set",
                                     lambda where: wire.to_arguments(_take_rows(packed, where)))
        self._finish([call for _, call in calls])

    def __len__(self) -> int:
        self._check_writes()
        self._refresh_totals()
        return int(self._totals.count.sum())

    @property
    def write_count(self) -> int:
        self._check_writes()
        self._refresh_totals()
        return int(self._totals.rows_written.sum())

    @property
    def batch_size(self):
        return self._batch_size

    @property
    def num_shards(self) -> int:
        return self._num_shards

    @property
    def actors(self) -> list:
        """The shard actors (their handles), shard by shard."""
        return list(self._actors)

    def shard_totals(self) -> dict[str, np.ndarray]:
        """The totals the client last received from each shard (no call is made)."""
        return {name: np.array(getattr(self._totals, name)) for name in routing.ShardTotals.FIELDS}

    def empty(self, empty_write_count: bool = True) -> None:
        self._settle()
        self._drop_reservations()
        self._finish([self._submit(k, "empty") for k in range(self._num_shards)])
        self._restart_ring()

    # ------------------------------------------------------------------ checkpoints
    def _settle(self) -> None:
        """Before a checkpoint: prefetched samples dropped, writes and updates applied."""
        self._discard_prefetched()
        self._wait_for_writes()
        self._wait_for_updates()

    def state_dict(self) -> dict[str, Any]:
        self._settle()
        states = self._ray.get([actor.state_dict.remote() for actor in self._actors])
        return {"num_shards": self._num_shards, "capacities": list(self._capacities), "shards": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._check_layout(state_dict.get("num_shards"), state_dict.get("capacities"), "state_dict")
        self._settle()
        self._drop_reservations()
        self._finish([self._submit(k, "load_state_dict", state) for k, state in enumerate(state_dict["shards"])])
        self._restart_ring()

    def _check_layout(self, num_shards, capacities, source: str) -> None:
        if num_shards != self._num_shards or list(capacities or []) != list(self._capacities):
            raise ValueError(
                f"The {source} holds {num_shards} shard(s) of capacities {capacities}; this buffer "
                f"has {self._num_shards} of capacities {self._capacities}."
            )

    def dumps(self, path) -> None:
        """Saves every shard under ``path`` and publishes ``path/manifest.json`` naming them.

        Each shard publishes its part whole under ``path/shard_<k>/<version>/``; the manifest is
        published (one rename) only once every part is complete, and the parts of earlier
        versions are removed after it. A dump interrupted at any point leaves the previous
        manifest naming complete parts.
        """
        path = Path(path).absolute()
        path.mkdir(parents=True, exist_ok=True)
        self._settle()
        version = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        replies = self._finish([self._submit(k, "dumps", str(path), version) for k in range(self._num_shards)])
        manifest = {
            "format": MANIFEST_FORMAT,
            "version": version,
            "num_shards": self._num_shards,
            "capacities": list(self._capacities),
            "stride": self._stride,
            "sampler": self._description["sampler"],
            "shards": [
                {"shard": k, "version": version, "directory": f"shard_{k:03d}/{version}",
                 "rows": replies[k][0]["rows"], "rows_written": replies[k][0]["rows_written"]}
                for k in range(self._num_shards)
            ],
        }

        def write(file):
            with open(file, "w") as handle:
                json.dump(manifest, handle, indent=1)

        publish_file(path / MANIFEST_FILE, write)
        self._finish([self._submit(k, "commit", str(path), version) for k in range(self._num_shards)])

    def loads(self, path) -> None:
        """Loads the checkpoint whose manifest is ``path/manifest.json``: every shard's part is
        checked before any shard loads."""
        path = Path(path).absolute()
        try:
            with open(path / MANIFEST_FILE) as handle:
                manifest = json.load(handle)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path / MANIFEST_FILE} does not exist: no RayReplayBuffer checkpoint at {path}") from None
        if manifest.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"{path / MANIFEST_FILE} is not a {MANIFEST_FORMAT} manifest: {manifest.get('format')!r}")
        self._check_layout(manifest["num_shards"], manifest["capacities"], str(path / MANIFEST_FILE))
        versions = [entry["version"] for entry in manifest["shards"]]
        self._settle()
        self._drop_reservations()
        self._ray.get([actor.check.remote(str(path), v) for actor, v in zip(self._actors, versions)])
        self._finish([self._submit(k, "loads", str(path), v) for k, v in enumerate(versions)])
        self._restart_ring()

    save = dump = dumps
    load = loads

    # ------------------------------------------------------------------ lifecycle
    @property
    def service_backend(self) -> str:
        """The deployment backend of this buffer: ``"ray"``."""
        return "ray"

    @property
    def is_alive(self) -> bool:
        """Whether the shard actors are still this buffer's (not closed)."""
        return "_actors" in self.__dict__

    def start(self) -> "RayReplayBuffer":
        """Returns this buffer (its shards start with it)."""
        if not self.is_alive:
            raise RuntimeError("A closed RayReplayBuffer cannot be restarted.")
        return self

    def client(self, *, chunk_rows: int | None = None, prefetch: int | None = None,
               batch_size: int | None = None, sample_timeout: float | None = None) -> "RayReplayBuffer":
        """A client of the same shards (what a pickled copy gives another process), without
        this buffer's prefetched samples or reservations, and on Ray's task path.

        Keyword Args:
            chunk_rows (int, optional): the client's ``chunk_rows``. Defaults to this one's.
            prefetch (int, optional): the samples it keeps in flight. Defaults to this one's.
            batch_size (int, optional): its default batch size. Defaults to this one's.
            sample_timeout (float, optional): how long its calls wait for a shard that is down.
                Defaults to this one's.
        """
        if not self.is_alive:
            raise RuntimeError("RayReplayBuffer is closed.")
        state = self.__getstate__()
        state["_totals"] = copy.deepcopy(state["_totals"])
        if chunk_rows is not None:
            _check_chunk_rows(chunk_rows)
            state["_chunk_rows"] = chunk_rows
            state["_reserve_rows"] = _reserve_rows(chunk_rows, state["_capacities"])
        if prefetch is not None:
            state["_prefetch_cap"] = int(prefetch)
        if batch_size is not None:
            state["_batch_size"] = batch_size
        if sample_timeout is not None:
            state["_sample_timeout"] = float(sample_timeout)
        if state["_prefetch_cap"] and state["_batch_size"] is None:
            raise ValueError("When using prefetch, the batch-size must be specified in advance.")
        twin = object.__new__(type(self))
        twin.__setstate__(state)
        return twin

    def shutdown(self, timeout: float | None = None) -> None:
        """Terminates the shard actors (:meth:`close`)."""
        self.close()

    def close(self) -> None:
        """Terminates the shard actors (and removes the recovery directory this buffer made).
        A client (:meth:`client`, or a copy unpickled in another process) only lets go of
        them."""
        if "_actors" in self.__dict__ and not self.__dict__.get("_owner", False):
            try:
                self._close_client()
            finally:
                self.__dict__.pop("_actors", None)  # let go even when a last write failed
            return
        actors = self.__dict__.get("_actors")
        if actors is None or not self.__dict__.get("_owner", False):
            return
        graph, self._graph = self.__dict__.get("_graph"), None
        if graph is not None:
            self._settle_graph()
            _teardown(graph)
        del self.__dict__["_actors"]
        for actor in actors:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone (ray.shutdown ran)
                pass
        self._remove_placement_group()
        if self._owned_recovery_dir is not None:
            shutil.rmtree(self._owned_recovery_dir, ignore_errors=True)

    def _remove_placement_group(self) -> None:
        group, self._placement_group = self.__dict__.get("_placement_group"), None
        if group is not None:
            try:
                self._ray.util.remove_placement_group(group)
            except Exception:  # noqa: BLE001 - already gone (ray.shutdown ran)
                pass

    def _close_client(self) -> None:
        """A client lets go: its writes and updates land, and the rows it reserved and did not
        write go back to their shards (when nothing was reserved after them)."""
        self.sync()
        for shard, call in enumerate(self._reserve_calls):
            if call is not None:
                self._receive_reservation(shard)
        for shard, token, start, stop in self._reservations.drop():
            self._actors[shard].release.remote(token, start, stop)
        self._reserve_calls = [None] * self._num_shards

    def __getstate__(self) -> dict:
        """A client for another process: the same shard actors, the totals known now, nothing
        pending."""
        names = ("_num_shards", "_sample_timeout", "_chunk_rows", "_prefetch_cap", "_pin_memory",
                 "_batch_size", "_recovery_dir", "_actors", "_description", "_kind", "_capacities",
                 "_stride", "_is_tensordict", "_priority_key", "_totals", "_reservable", "_reserve_rows",
                 "_transform", "_trajectory_keys")
        return {name: self.__dict__[name] for name in names if name in self.__dict__}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._owner = False
        self._ray = _import_ray()
        self._generator = None
        self._owned_recovery_dir = None
        self._placement_group = None
        self._init_client_state()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_shards={self._num_shards}, sampler={self._description['sampler']}, "
                f"capacities={self._capacities})")


def _check_chunk_rows(chunk_rows) -> None:
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, int) or chunk_rows < 1:
        raise ValueError(f"chunk_rows must be a positive integer, got chunk_rows={chunk_rows!r}")


def _reserve_rows(chunk_rows: int, capacities) -> int:
    """The rows of one reservation: four chunks, at most an eighth of a shard (rows a client
    reserved and has not written are passed over by the other clients' writes)."""
    return max(1, min(4 * chunk_rows, min(capacities) // 8))


def _spread_group(ray, options: dict, num_shards: int, timeout: float):
    """A placement group spreading ``num_shards`` shards over the cluster's nodes (one bundle
    each): ``STRICT_SPREAD`` while there are more nodes than shards (so that a lost node's
    shard has a node of its own to restart on), ``SPREAD`` otherwise; ``None`` on one node,
    or when the group cannot be placed within ``timeout`` seconds."""
    from ray.util.placement_group import placement_group

    bundle = {"CPU": max(float(options.get("num_cpus") or 0), BUNDLE_MIN_CPU)}
    if options.get("num_gpus"):
        bundle["GPU"] = float(options["num_gpus"])
    bundle.update(options.get("resources") or {})
    nodes = [node for node in ray.nodes() if node.get("Alive")
             and all(node.get("Resources", {}).get(name, 0) >= amount for name, amount in bundle.items())]
    if len(nodes) < 2 or num_shards < 2:
        return None
    strategy = "STRICT_SPREAD" if len(nodes) > num_shards else "SPREAD"
    group = placement_group([dict(bundle) for _ in range(num_shards)], strategy=strategy)
    if not group.wait(timeout):
        ray.util.remove_placement_group(group)
        return None
    return group


def _bundle(group, shard: int) -> dict:
    """The actor options placing ``shard`` in its bundle of ``group`` (none without one)."""
    if group is None:
        return {}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=shard)}


def _teardown(graph) -> None:
    try:
        graph.teardown()
    except Exception:  # noqa: BLE001 - its actors are gone
        pass


def _reason(reason) -> str:
    """Why a write was not stored: the shard's refusal, or the error it raised (without Ray's
    wrapping)."""
    if isinstance(reason, str):
        return reason
    if isinstance(reason, ShardRestartedError):
        return "not stored by the restarted shard"
    cause = getattr(reason, "cause", None)
    if isinstance(cause, BaseException):
        reason = cause
    return f"{type(reason).__name__}: {reason}"


def _is_totals(reply) -> bool:
    return len(reply) == len(routing.ShardTotals.FIELDS) and isinstance(reply[-1], str)


def _numpy(value, name: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if name == "index" and array.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
    if name == "priority" and array.dtype.kind not in "fiub":
        raise TypeError(f"{name} must hold real numbers, got dtype {array.dtype}")
    return array


def _take_rows(packed: tuple, where: np.ndarray) -> tuple:
    kind, keys, arrays, batch_size = packed
    if kind == wire.OBJECT:
        return (kind, keys, [arrays[i] for i in where.tolist()], None)
    return (kind, keys, tuple(array[where] for array in arrays), (len(where), *batch_size[1:]))


def serve_buffer_class(replay_buffer_cls, *args, service_backend_options=None, **kwargs) -> RayReplayBuffer:
    """What ``ReplayBuffer(..., service_backend="ray")`` builds: a :class:`RayReplayBuffer`
    whose shards hold buffers of ``replay_buffer_cls`` built with ``args`` and ``kwargs``.

    ``service_backend_options`` takes torchrl's ``ray_init_config`` and ``remote_config``,
    and the :class:`RayReplayBuffer` keywords (``num_shards``, ``recovery_dir``,
    ``write_ahead``, ``sample_timeout``, ``chunk_rows``, ``compiled_graph``).
    """
    options = dict(service_backend_options or {})
    unknown = sorted(set(options) - set(SERVICE_OPTIONS))
    if unknown:
        raise TypeError(f"Unexpected Ray replay-buffer service options: {unknown}")
    transport = kwargs.pop("transport", "auto")
    if transport not in ("auto", "ray"):
        raise NotImplementedError(
            f"RayReplayBuffer moves batches through Ray itself: transport={transport!r} is not "
            "available (use 'auto' or 'ray')."
        )
    if kwargs.pop("transport_options", None):
        raise ValueError("transport_options are not used by the Ray replay transport.")
    return RayReplayBuffer(*args, replay_buffer_cls=replay_buffer_cls, **options, **kwargs)


SERVICE_BACKENDS["ray"] = serve_buffer_class
