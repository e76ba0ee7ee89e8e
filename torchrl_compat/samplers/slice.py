""":class:`SliceSampler`: slices of trajectories, read from the trajectory ends."""
from __future__ import annotations

from collections.abc import Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any

import torch
from tensordict import is_tensor_collection
from tensordict.utils import NestedKey, unravel_key

import replay
from .._torch_ops import slices as torch_slices
from .._torch_ops.checks import DeferredChecks
from ._storage_reads import flag_columns, gather_fields, snapshot, storage_device
from .._releases import keywords_since, since
from .._torchrl_lookup import torchrl_twin
from ._fragmented_runs import fragmented_runs
from ._trajectory_ends import TrajectoryEnds
from ..storages import Storage, logger
from ..utils import _auto_device, _checked_trajectory_signal, _trajectory_bounds
from ._common import (
    _CPU,
    _EMPTY_STORAGE_ERROR,
    _TENSOR_STORAGES,
    _as_long,
    _on_cpu,
    _rand,
    _randint,
    _replace_last,
)
from .base import Sampler


# The methods SliceSampler.sample's general path goes through, which _sample_from_ends
# replaces: a subclass (or an instance) overriding one of them takes the general path.
_SLICE_SAMPLING_STEPS = frozenset({
    "_get_stop_and_length", "_trajectory_bounds", "_tracked_bounds", "_find_start_stop_traj", "_end_to_start_stop",
    "_check_signal_ndim", "_sample_slices", "_has_shorter", "_get_index", "_kernel_slices",
    "_slices_with_torch",
})


_PLAIN_SLICE_SAMPLING: dict = {}


def _rand_on(num: int, device: torch.device, generator) -> torch.Tensor:
    """``num`` draws in ``[0, 1)`` on ``device`` from ``generator`` (drawn on its device and
    copied without waiting) or the device's default torch generator."""
    if generator is None:
        return torch.rand(num, device=device)
    uniform = torch.rand(num, generator=generator, device=generator.device)
    return uniform if uniform.device == device else uniform.to(device, non_blocking=True)


def _no_slice_error(code: int, seq_length: int, value: float) -> RuntimeError:
    return RuntimeError(
        f"Did not find a single trajectory with sufficient length (required={seq_length}) at "
        f"an earlier slice draw on the device: its slices were meaningless"
    )


def _plain_slice_sampling(cls) -> bool:
    """Whether ``cls`` samples as :class:`SliceSampler` does, step by step (worked out once
    per class)."""
    plain = _PLAIN_SLICE_SAMPLING.get(cls)
    if plain is None:
        plain = _PLAIN_SLICE_SAMPLING[cls] = all(
            getattr(cls, name) is getattr(SliceSampler, name) for name in _SLICE_SAMPLING_STEPS
        )
    return plain


_MISSING = object()


def _revision_key(storage):
    """What ``cache_values`` checks the kept trajectory bounds against, from torchrl 0.14 on:
    the storage, its mutation revision and length (``None`` before 0.14, or for a storage
    without a revision: the bounds are then kept until the next ``extend``)."""
    if not since("slice_mutation_revision"):
        return None
    revision = _own_attribute(storage, "_mutation_revision")
    if revision is _MISSING or revision is None:
        return None
    return (id(storage), int(revision), len(storage))


def _last_cursor(storage):
    """The storage's last written position, as the followed release reads it."""
    if since("slice_mutation_revision"):
        cursor = _own_attribute(storage, "_last_cursor_index")
        if cursor is not _MISSING:
            return cursor
    return getattr(storage, "_last_cursor", None)


def _own_attribute(storage, name):
    """``storage.<name>``, or ``_MISSING`` where a storage of ours would only reach it through
    the torchrl class it stands in for (torchrl's property, which our writes never update)."""
    if name in getattr(storage, "__dict__", {}):
        return storage.__dict__[name]
    ours = type(storage).__module__.startswith("torchrl_compat")
    for klass in type(storage).__mro__:
        if name in vars(klass):
            if ours and not klass.__module__.startswith("torchrl_compat"):
                return _MISSING
            return getattr(storage, name)
    return _MISSING


def _check_fragmented(cls, step_key, ends, trajectories, span, compile) -> None:
    """The constructor errors of ``fragmented=True``."""
    if cls.sample is not SliceSampler.sample:
        raise NotImplementedError(
            "fragmented=True currently supports SliceSampler with replacement only."
        )
    if step_key is None:
        raise ValueError("step_key must be provided when fragmented=True.")
    if ends is not None:
        raise ValueError(
            "fragmented=True requires trajectory and step identifiers; "
            "the static ends argument cannot reconstruct interleaved "
            "trajectories."
        )
    if trajectories is not None:
        raise ValueError(
            "The static trajectories argument is not supported with "
            "fragmented=True; provide traj_key and step_key."
        )
    if any(span):
        raise NotImplementedError("span is not supported with fragmented=True.")
    if compile:
        raise NotImplementedError("compile is not supported with fragmented=True.")


class SliceSampler(Sampler, *torchrl_twin("samplers", "SliceSampler")):
    """Samples slices of data along the first dimension, given start and stop signals.

    This class samples sub-trajectories with replacement. For a version without
    replacement, see :class:`~torchrl_compat.samplers.SliceSamplerWithoutReplacement`.

    Keyword Args:
        num_slices (int): the number of slices to be sampled. The batch-size
            must be greater or equal to the ``num_slices`` argument. Exclusive
            with ``slice_len``.
        slice_len (int): the length of the slices to be sampled. The batch-size
            must be greater or equal to the ``slice_len`` argument and divisible
            by it. Exclusive with ``num_slices``.
        end_key (NestedKey, optional): the key indicating the end of a
            trajectory (or episode). Defaults to ``("next", "done")``.
        traj_key (NestedKey, optional): the key indicating the trajectories.
            Defaults to ``"episode"`` (commonly used across datasets in TorchRL).
        ends (torch.Tensor, optional): a 1d boolean tensor containing the end of run signals.
            Must be used with ``cache_values=True`` and cannot be used in conjunction with
            ``end_key`` or ``traj_key``. If provided, it is assumed that the storage is at
            capacity and that if the last element of the ``ends`` tensor is ``False``,
            the same trajectory spans across end and beginning.
        trajectories (torch.Tensor, optional): a 1d integer tensor containing the run ids.
            Must be used with ``cache_values=True`` and cannot be used in conjunction with
            ``end_key`` or ``traj_key``. If provided, it is assumed that the storage is at
            capacity and that if the last element of the trajectory tensor is identical to
            the first, the same trajectory spans across end and beginning.
        cache_values (bool, optional): to be used with static datasets.
            Will cache the start and end signal of the trajectory. This can be safely used even
            if the trajectory indices change during calls to :meth:`extend`
            as this operation will erase the cache. Defaults to ``False``.
        truncated_key (NestedKey, optional): If not ``None``, this argument
            indicates where a truncated signal should be written in the output
            data. Defaults to ``("next", "truncated")``.
        strict_length (bool, optional): if ``False``, trajectories of length
            shorter than `slice_len` (or `batch_size // num_slices`) will be
            allowed to appear in the batch. If ``True``, trajectories shorted
            than required will be filtered out. Defaults to ``True``.
        compile (bool or dict of kwargs, optional): if ``True``, the bottleneck of
            the :meth:`~sample` method will be compiled with :func:`~torch.compile`.
            Keyword arguments can also be passed to torch.compile with this arg.
            Defaults to ``False``.
        span (bool, int, Tuple[bool | int, bool | int], optional): if provided, the sampled
            trajectory will span across the left and/or the right. A boolean value means
            that at least one element will be sampled per trajectory. An integer `i` means
            that at least `slice_len - i` samples will be gathered for each sampled trajectory.
            Using tuples allows a fine grained control over the span on the left and on
            the right. Defaults to ``False``.
        use_gpu (bool or torch.device): if ``True`` (or is a device is passed), an accelerator
            will be used to retrieve the indices of the trajectory starts.
            Defaults to ``False``.

    .. note:: To recover the trajectory splits in the storage, the sampler first
        attempts to find the ``traj_key`` entry in the storage. If it cannot be
        found, the ``end_key`` is used to reconstruct the episodes.

    .. note:: On CPU, trajectory starts and stops and the slice indices come from
        ``replay``'s C kernels (GIL released): the draws become storage indices and
        truncation flags in one pass (``replay.sample_slice_index``). On an accelerator
        (the end signal's device, or ``use_gpu``) they are computed with a few vectorised
        torch ops there; only the checks that can raise synchronise with the host.

    .. note:: On a 1-D tensor storage on an accelerator, the common case (``strict_length``,
        no ``span``, one ``end_key`` or a ``traj_key``, no ``cache_values`` or ``compile``)
        makes no host synchronisation: the trajectories are never listed (that needs
        ``nonzero``); each slice's trajectory is drawn by rank among those long enough,
        ``floor(u * count)`` with ``u`` from ``torch.rand`` (the buffer's generator, else
        the device's), instead of torchrl's ``torch.randint(count)``, whose bound only the
        device knows (same distribution, another stream), then its start as torchrl draws
        it. A draw where no trajectory is long enough has meaningless slices, and its
        ``RuntimeError`` is raised at the next call once the device's status has reached the
        host. On CPU tensors with the torch ops forced, the same code runs with the count
        read from host memory: torchrl's ``randint`` draws (the CPU kernels' slices, to the
        index), and a call without any long enough trajectory gets the general path's error
        before taking random numbers. Left to the
        general path (which synchronises): ``strict_length=False``, ``span``, ``end_keys``,
        ``cache_values``, ``compile``, ``fragmented``, N-D storages and non-tensor storages.

    .. note:: Without ``cache_values``, torchrl reads the whole end signal (or the
        trajectory ids) at every call: O(capacity), milliseconds at a million steps. On
        ``torchrl_compat``'s tensor storages, which journal their writes, the trajectory
        ends are instead kept up to date by reading only the rows written since the last
        call (O(trajectories + rows written)), with the same results, and while no
        trajectory is shorter than a slice only the drawn trajectories' bounds are read
        from them (the start, stop and length of every trajectory are not listed). Other
        storages, and writes made in another process, are read whole as torchrl does, from
        a copy (the scan reads twice, and another process may write in between). Editing
        the end signal in place behind the storage's back is not seen until the next whole
        read.

    .. note:: With ``strict_length=False`` and an integer ``span``, torchrl fails
        ("Boolean value of Tensor with more than one value is ambiguous"); here the span is
        checked against the requested slice length and the slices are drawn.

    .. note:: An empty (or emptied) storage raises ``RuntimeError: Cannot sample from an
        empty storage.``, as the other samplers do, before anything is drawn from the
        generator (torchrl fails with "random_ expects 'from' to be less than 'to'" on an
        emptied storage, or with an error about a non-initialized one).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data.replay_buffers import LazyTensorStorage
        >>> storage = LazyTensorStorage(12)
        >>> episode = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
        >>> storage.set(torch.arange(12), TensorDict({"episode": episode}, [12]))
        >>> sampler = SliceSampler(num_slices=3, traj_key="episode", truncated_key=None)
        >>> (index,), info = sampler.sample(storage, 6)
        >>> [len(set(episode[index[k:k + 2]].tolist())) for k in range(0, 6, 2)]
        [1, 1, 1]
    """

    # We use this whenever we need to sample N times too many transitions to then select only a 1/N fraction of them
    _batch_size_multiplier: int | None = 1

    # Class-level defaults: samplers pickled under an earlier release (whose __dict__ lacks
    # these attributes) keep working.
    end_keys: tuple | None = None
    init_key: NestedKey | None = "is_init"
    pad_output: bool = False
    fragmented: bool = False
    step_key: NestedKey | None = "step_count"
    _traj_key_auto: bool = False
    # torchrl 0.14's index of fragmented runs; ours are read from the storage when its
    # revision changes (_fragmented_runs), so this stays None
    _fragmented_index = None

    def _init_slices(
        self,
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        end_key: NestedKey | None = None,
        end_keys: Sequence[NestedKey] | None = None,
        traj_key: NestedKey | None = None,
        step_key: NestedKey | None = "step_count",
        fragmented: bool = False,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        cache_values: bool = False,
        truncated_key: NestedKey | None = ("next", "truncated"),
        init_key: NestedKey | None = "is_init",
        strict_length: bool = True,
        pad_output: bool = False,
        compile: bool | dict = False,
        span: bool | int | tuple[bool | int, bool | int] = False,
        use_gpu: torch.device | bool = False,
    ):
        if isinstance(span, (bool, int)):
            span = (span, span)
        if fragmented:
            _check_fragmented(type(self), step_key, ends, trajectories, span, compile)
        if end_keys is not None and end_key is not None:
            raise RuntimeError(
                "`end_key` and `end_keys` are exclusive arguments: pass the "
                "single boundary key through `end_key`, or the sequence of "
                "keys to be OR-ed together through `end_keys`."
            )
        if pad_output and strict_length:
            raise ValueError(
                "pad_output=True is incompatible with strict_length=True: "
                "padding only happens when short trajectories are kept, which "
                "requires strict_length=False."
            )
        self.num_slices = num_slices
        self.slice_len = slice_len
        self.end_key = end_key
        if since("slice_end_keys_fragmented"):
            self.step_key = step_key
            self.fragmented = fragmented
            self.end_keys = None if end_keys is None else tuple(unravel_key(key) for key in end_keys)
            self.init_key = init_key
        if since("slice_pad_output"):
            self.pad_output = pad_output
        self.traj_key = traj_key
        self.truncated_key = truncated_key
        self.cache_values = cache_values
        self._fetch_traj = True
        self.strict_length = strict_length
        self._cache = {}
        self.use_gpu = bool(use_gpu)
        if not self.use_gpu:
            self._gpu_device = None
        elif isinstance(use_gpu, bool):
            self._gpu_device = _auto_device()
        else:
            self._gpu_device = torch.device(use_gpu)
        self.span = span

        if trajectories is not None or ends is not None:
            # A static signal given up front (trajectory ids first): its bounds are cached.
            given = "trajectories" if trajectories is not None else "ends"
            if since("slice_end_keys_fragmented"):
                if traj_key is not None or end_key or end_keys:
                    raise RuntimeError(
                        f"`{given}` and `end_key`, `end_keys` or `traj_key` are exclusive arguments."
                    )
            elif traj_key is not None or end_key:
                raise RuntimeError(
                    f"`{given}` and `end_key` or `traj_key` are exclusive arguments."
                )
            if trajectories is not None and ends is not None:
                raise RuntimeError("trajectories and ends are exclusive arguments.")
            if not cache_values:
                raise RuntimeError(
                    f"To be used, {given} requires `cache_values` to be set to `True`."
                )
            self._cache[self._static_cache_key] = self._find_start_stop_traj(
                trajectory=trajectories, end=ends, at_capacity=True
            )

        else:
            if traj_key is not None:
                self._fetch_traj = True
            elif end_key is not None or end_keys is not None:
                self._fetch_traj = False
            elif since("slice_traj_key_auto"):
                # Neither given: the storage is asked at the first sample call.
                self._traj_key_auto = True
            if end_key is None and end_keys is None:
                end_key = ("next", "done")
            if traj_key is None and not since("slice_traj_key_auto"):
                traj_key = "episode"
            self.end_key = end_key
            self.traj_key = traj_key

        if not ((num_slices is None) ^ (slice_len is None)):
            raise TypeError(
                "Either num_slices or slice_len must be not None, and not both. "
                f"Got num_slices={num_slices} and slice_len={slice_len}."
            )
        self.compile = bool(compile)
        if self.compile:
            kwargs = compile if isinstance(compile, dict) else {}
            self._get_index = torch.compile(self._get_index, **kwargs)

    # The constructor takes the keywords of the torchrl release followed.
    __init__ = keywords_since(
        _init_slices,
        {
            "end_keys": "slice_end_keys_fragmented",
            "step_key": "slice_end_keys_fragmented",
            "fragmented": "slice_end_keys_fragmented",
            "init_key": "slice_end_keys_fragmented",
            "pad_output": "slice_pad_output",
        },
        name="__init__",
    )

    @property
    def _static_cache_key(self) -> str:
        return "static-stop-and-length" if since("slice_mutation_revision") else "stop-and-length"

    def __getstate__(self):
        if get_spawning_popen() is not None and self.cache_values:
            logger.warning(
                f"It seems you are sharing a {type(self).__name__} across processes with "
                f"cache_values=True. "
                f"While this isn't forbidden and could perfectly work if your dataset "
                f"is unaltered on both processes, remember that calling extend/add on "
                f"one process will NOT erase the cache on another process's sampler, "
                f"which will cause synchronization issues."
            )
        state = super().__getstate__()
        state["_cache"] = {}
        return state

    def extend(self, index: torch.Tensor) -> None:
        if self.fragmented:
            return
        super().extend(index)
        if self.cache_values:
            self._cache.clear()

    def add(self, index: torch.Tensor) -> None:
        if self.fragmented:
            return
        super().add(index)
        if self.cache_values:
            self._cache.clear()

    def mark_update(
        self, index: int | torch.Tensor, *, storage: Storage | None = None
    ) -> None:
        # The fragmented runs are read again from the storage when its revision changes:
        # nothing to record here. Cooperative, for samplers mixing this class with another.
        super().mark_update(index, storage=storage)

    def _end_stream(self, index: torch.Tensor, *, storage: Storage) -> None:
        # A boundary patch changes no slot identity and must not look like a write.
        self._cache.clear()

    def __repr__(self):
        if since("slice_end_keys_fragmented"):
            return (
                f"{self.__class__.__name__}(num_slices={self.num_slices}, "
                f"slice_len={self.slice_len}, "
                f"end_key={self.end_key}, "
                f"end_keys={self.end_keys}, "
                f"traj_key={self.traj_key}, "
                f"step_key={self.step_key}, "
                f"fragmented={self.fragmented}, "
                f"truncated_key={self.truncated_key}, "
                f"strict_length={self.strict_length}, "
                f"pad_output={self.pad_output})"
            )
        if since("slice_pad_output"):
            return f"{self._repr_head()}, pad_output={self.pad_output})"
        return f"{self._repr_head()})"

    def _repr_head(self) -> str:
        """The part of torchrl's slice-sampler reprs they all share (each adds its tail)."""
        return (
            f"{self.__class__.__name__}(num_slices={self.num_slices}, "
            f"slice_len={self.slice_len}, "
            f"end_key={self.end_key}, "
            f"traj_key={self.traj_key}, "
            f"truncated_key={self.truncated_key}, "
            f"strict_length={self.strict_length}"
        )

    # ------------------------------------------------------------------ trajectories
    def _find_start_stop_traj(
        self, *, trajectory=None, end=None, at_capacity: bool, cursor=None, storage=None, source=None
    ):
        signal = trajectory if trajectory is not None else end
        device = None
        if self.use_gpu and signal is not None and signal.device != self._gpu_device:
            device = signal.device
            if trajectory is not None:
                trajectory = trajectory.to(self._gpu_device)
            else:
                end = end.to(self._gpu_device)
        if type(self)._end_to_start_stop is not SliceSampler._end_to_start_stop:
            # a subclass's conversion from end flags to bounds is used, as in torchrl
            if since("find_start_stop_traj_public"):
                trajectory, end, cursor = _checked_trajectory_signal(trajectory, end, cursor, at_capacity)
            flags = torch_slices.end_flags(trajectory=trajectory, end=end, at_capacity=at_capacity, cursor=cursor)
            start_idx, stop_idx, lengths = self._end_to_start_stop(end=flags, length=flags.shape[0])
        elif since("find_start_stop_traj_public"):
            start_idx, stop_idx, lengths = _trajectory_bounds(
                trajectory=trajectory, end=end, at_capacity=at_capacity, cursor=cursor,
                on_cpu=self._use_cpu_kernels,
            )
        elif device is None and self._use_cpu_kernels and _on_cpu(signal):
            # One C pass over the signal, GIL released (the torch ops below take several).
            return replay.find_start_stop_traj(
                trajectory=trajectory, end=end, at_capacity=at_capacity, cursor=cursor
            )
        else:
            start_idx, stop_idx, lengths = torch_slices.find_start_stop_traj(
                trajectory=trajectory, end=end, at_capacity=at_capacity, cursor=cursor
            )
        if device is not None:
            return start_idx.to(device), stop_idx.to(device), lengths.to(device)
        return start_idx, stop_idx, lengths

    def _start_to_end(self, st: torch.Tensor, length: int) -> torch.Tensor:
        """The ``length`` indices of a slice starting at ``st`` (time on the first column)."""
        width = st.shape[-1] if st.ndim else 1
        offsets = torch.zeros((length, width), dtype=st.dtype, device=st.device)
        offsets[:, 0] = torch.arange(length, dtype=st.dtype, device=st.device)
        return offsets + st

    def _end_to_start_stop(self, end, length):
        device = None
        if self.use_gpu and end.device != self._gpu_device:
            device = end.device
            end = end.to(self._gpu_device)
        start_idx, stop_idx, lengths = torch_slices.end_to_start_stop(end, length)
        if device is not None:
            return start_idx.to(device), stop_idx.to(device), lengths.to(device)
        return start_idx, stop_idx, lengths

    def _tensor_slices_from_startend(self, seq_length, start, storage_length):
        if (
            self._use_cpu_kernels
            and _on_cpu(start)
            and (not isinstance(seq_length, torch.Tensor) or _on_cpu(seq_length))
        ):
            index = replay.slice_indices(start, seq_length, storage_length)
        else:
            index = torch_slices.slice_indices(start, seq_length, storage_length)
        return index if index.dtype == start.dtype else index.to(start.dtype)

    def _trajectory_bounds(self, storage):
        """``(start_idx, stop_idx, lengths)`` of the trajectories in ``storage``, where every
        slice sampler's ``sample`` starts.

        An empty storage is refused first, before any draw: the trajectory bookkeeping has
        nothing to work on there, and torchrl fails in it ("random_ expects 'from' to be
        less than 'to'", "IndexError: index -1 is out of bounds", or a complaint about a
        non-initialized storage).
        """
        if len(storage) == 0:
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        return self._get_stop_and_length(storage)

    def _sampleable_count(self, storage, batch_size: int) -> int | torch.Tensor:
        """How many slices of ``batch_size`` can be drawn from ``storage`` (0: none), for
        ``can_sample``."""
        if len(storage) == 0:
            return 0
        seq_length, _ = self._adjusted_batch_size(batch_size)
        if self.fragmented:
            if self._traj_key_auto:
                self._resolve_traj_key(storage)
            if not self._fetch_traj or self.traj_key is None:
                return 0
            _, _, lengths = self._fragmented_runs(storage)
        else:
            try:
                _, _, lengths = self._get_stop_and_length(storage)
            except (KeyError, RuntimeError):
                return 0
        windows = lengths - seq_length + 1
        if self.strict_length:
            windows = windows.clamp_min(0)
        else:
            windows = torch.where(lengths > 0, windows.clamp_min(1), 0)
        return windows.sum()

    @staticmethod
    def _check_signal_ndim(start_idx: torch.Tensor, storage) -> None:
        # The start / stop rows index the storage, so they need its number of dims.
        if start_idx.shape[1] != storage.ndim:
            raise RuntimeError(
                f"Expected the end-of-trajectory signal to be "
                f"{storage.ndim}-dimensional. Got a tensor with shape[1]={start_idx.shape[1]} "
                "instead."
            )

    def _get_stop_and_length(self, storage, fallback=True):
        if self.cache_values:
            cached = self._cache.get(self._static_cache_key)
            if cached is not None:
                return cached
            kept = self._cache.get("storage-stop-and-length")
            if kept is not None and kept[0] == _revision_key(storage):
                return kept[1]

        if self._traj_key_auto:
            self._resolve_traj_key(storage)

        if self._fetch_traj:
            # We first try with the traj_key
            try:
                vals = self._tracked_bounds(storage, self._used_traj_key, from_ids=True)
                if vals is not None:
                    return self._keep_bounds(vals, storage)
                if isinstance(storage, _TENSOR_STORAGES):
                    trajectory = storage[:][self._used_traj_key]
                else:
                    try:
                        trajectory = storage[:][self.traj_key]
                    except Exception:
                        raise RuntimeError(
                            "Could not get a tensordict out of the storage, which is required for SliceSampler to compute the trajectories."
                        )
                vals = self._find_start_stop_traj(
                    trajectory=snapshot(trajectory),
                    at_capacity=storage._is_full,
                    cursor=_last_cursor(storage),
                )
                return self._keep_bounds(vals, storage)
            except KeyError:
                if fallback:
                    self._fetch_traj = False
                    return self._get_stop_and_length(storage, fallback=False)
                raise

        else:
            if self.end_keys is None:
                vals = self._tracked_bounds(storage, self.end_key, from_ids=False)
                if vals is not None:
                    return self._keep_bounds(vals, storage)
            try:
                if self.end_keys is not None:
                    done = self._end_signal_from_keys(storage)
                else:
                    try:
                        done = storage[:][self.end_key]
                    except Exception:
                        raise RuntimeError(
                            "Could not get a tensordict out of the storage, which is required for SliceSampler to compute the trajectories."
                        )
                    done = done.squeeze()
                vals = self._find_start_stop_traj(
                    end=snapshot(done[: len(storage)]),
                    at_capacity=storage._is_full,
                    cursor=_last_cursor(storage),
                )
                return self._keep_bounds(vals, storage)
            except KeyError:
                if fallback:
                    self._fetch_traj = True
                    if self.traj_key is None:
                        # No trajectory key either: the storage is asked for one on the retry.
                        self._traj_key_auto = True
                    return self._get_stop_and_length(storage, fallback=False)
                raise

    def _resolve_traj_key(self, storage) -> None:
        """Finds the trajectory key in ``storage`` (once per sampler): ``("collector",
        "traj_ids")`` (written by collectors), then ``"episode"``; without either, the
        trajectories are read from the end key. The keys are read from the storage's
        tensordict when it has one (no data read), else from its first row."""
        self._traj_key_auto = False
        keys = None
        underlying = getattr(storage, "_storage", None)
        if is_tensor_collection(underlying):
            try:
                keys = set(underlying.keys(include_nested=True))
            except (RuntimeError, AttributeError, TypeError):
                keys = None
        if keys is None:
            try:
                first = storage[0:1]
            except (IndexError, KeyError, RuntimeError):
                first = None
            if first is not None and hasattr(first, "keys"):
                try:
                    keys = set(first.keys(include_nested=True))
                except (RuntimeError, AttributeError, TypeError):
                    keys = None
        for key in (("collector", "traj_ids"), "episode"):
            if keys is not None and key in keys:
                self.traj_key = key
                self._fetch_traj = True
                return
        self._fetch_traj = False

    def _end_signal_from_keys(self, storage) -> torch.Tensor:
        """The ``end_keys`` entries of ``storage`` OR-ed together (missing ones skipped).

        Raises:
            KeyError: if none of them is in the storage (the caller then tries the
                trajectory key).
        """
        try:
            data = storage[:]
        except Exception:
            raise RuntimeError(
                "Could not get a tensordict out of the storage, which is required for SliceSampler to compute the trajectories."
            )
        done = None
        for key in self.end_keys:
            value = data.get(key, default=None)
            if value is None:
                continue
            value = value.squeeze()
            done = value if done is None else done | value
        if done is None:
            raise KeyError(f"None of the end_keys {self.end_keys} could be found in the storage.")
        return done

    def _keep_bounds(self, vals, storage=None):
        """``vals`` (start, stop, lengths), cached first with ``cache_values`` (until the next
        ``extend``, or, from torchrl 0.14 on, until the storage's revision changes)."""
        if self.cache_values:
            revision = _revision_key(storage) if storage is not None else None
            if revision is None:
                self._cache[self._static_cache_key] = vals
            else:
                self._cache["storage-stop-and-length"] = (revision, vals)
        return vals

    def _tracked_bounds(self, storage, key, *, from_ids: bool):
        """``(start_idx, stop_idx, lengths)`` from trajectory ends kept up to date with the
        storage's writes (:class:`torchrl_compat.samplers._trajectory_ends.TrajectoryEnds`): O(trajectories + rows
        written) instead of a read of the whole signal. ``None`` for storages that do not
        journal their writes (torchrl's own, N-D ones...) or a missing key: the caller then
        reads the whole signal, which also raises its errors."""
        if not self._use_cpu_kernels or not TrajectoryEnds.supports(storage) or self._bounds_overridden():
            return None
        try:
            return self._tracker(key, from_ids).bounds(storage)
        except KeyError:
            return None

    def _bounds_overridden(self) -> bool:
        """Whether a subclass computes trajectory bounds its own way (``_find_start_stop_traj``
        or ``_end_to_start_stop``): its methods then see every read, as in torchrl."""
        cls = type(self)
        return (
            cls._find_start_stop_traj is not SliceSampler._find_start_stop_traj
            or cls._end_to_start_stop is not SliceSampler._end_to_start_stop
        )

    def _tracker(self, key, from_ids: bool) -> TrajectoryEnds:
        """The :class:`torchrl_compat.samplers._trajectory_ends.TrajectoryEnds` following ``key`` (one per key)."""
        trackers = self.__dict__.setdefault("_trajectory_ends", {})
        tracker = trackers.get((key, from_ids))
        if tracker is None:
            tracker = trackers[(key, from_ids)] = TrajectoryEnds(key, from_ids=from_ids)
        return tracker

    def _adjusted_batch_size(self, batch_size):
        if self.num_slices is not None:
            if batch_size % self.num_slices != 0:
                raise RuntimeError(
                    f"The batch-size must be divisible by the number of slices, got "
                    f"batch_size={batch_size} and num_slices={self.num_slices}."
                )
            seq_length = batch_size // self.num_slices
            num_slices = self.num_slices
        else:
            if batch_size % self.slice_len != 0:
                raise RuntimeError(
                    f"The batch-size must be divisible by the slice length, got "
                    f"batch_size={batch_size} and slice_len={self.slice_len}."
                )
            seq_length = self.slice_len
            num_slices = batch_size // self.slice_len
        return seq_length, num_slices

    # ------------------------------------------------------------------ sampling
    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        if self._batch_size_multiplier is not None:
            batch_size = batch_size * self._batch_size_multiplier
        if self.fragmented:
            return self._sample_fragmented(storage, batch_size)
        if _plain_slice_sampling(type(self)) and _SLICE_SAMPLING_STEPS.isdisjoint(self.__dict__):
            sampled = self._sample_on_device(storage, batch_size)
            if sampled is None:
                sampled = self._sample_from_ends(storage, batch_size)
            if sampled is not None:
                return sampled
        start_idx, stop_idx, lengths = self._trajectory_bounds(storage)
        self._check_signal_ndim(start_idx, storage)
        seq_length, num_slices = self._adjusted_batch_size(batch_size)
        storage_length = storage.shape[0]
        return self._sample_slices(
            lengths,
            start_idx,
            stop_idx,
            seq_length,
            num_slices,
            storage_length=storage_length,
            storage=storage,
        )

    def _fragmented_runs(self, storage):
        """``(ordered_slots, run_offsets, run_lengths)`` of the storage's logical runs
        (:func:`torchrl_compat.samplers._fragmented_runs.fragmented_runs`), kept while the storage's revision and
        length stay the same (read again at every call for a storage without a revision)."""
        key = (self.traj_key, self.step_key, _revision_key(storage))
        kept = self._cache.get("fragmented-runs")
        if kept is not None and key[2] is not None and kept[0] == key:
            return kept[1]
        runs = fragmented_runs(storage, self.traj_key, self.step_key)
        self._cache["fragmented-runs"] = (key, runs)
        return runs

    def _sample_fragmented(self, storage, batch_size: int):
        """:meth:`sample` with ``fragmented=True``: slices along runs of consecutive steps
        of one trajectory, wherever they lie in the storage."""
        if len(storage) == 0:
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        if self._traj_key_auto:
            self._resolve_traj_key(storage)
        if not self._fetch_traj or self.traj_key is None:
            raise RuntimeError(
                "fragmented=True requires a trajectory identifier under traj_key; "
                "end-of-trajectory flags alone cannot reconstruct interleaved data."
            )
        ordered_slots, run_offsets, lengths = self._fragmented_runs(storage)
        if not lengths.numel():
            raise RuntimeError("No logical trajectory runs are available for sampling.")
        seq_length, num_slices = self._adjusted_batch_size(batch_size)
        target = None
        if self.strict_length:
            eligible = lengths >= seq_length
            if not eligible.any():
                raise RuntimeError(
                    "Did not find a single fragmented trajectory run with "
                    f"sufficient length (length range: {lengths.min()} - "
                    f"{lengths.max()} / required={seq_length})."
                )
            run_offsets, lengths = run_offsets[eligible], lengths[eligible]
            run_idx = _randint(lengths.shape[0], num_slices, lengths.device, self._rng)
            slice_lengths = torch.full((num_slices,), seq_length, dtype=torch.long, device=lengths.device)
        else:
            run_idx = _randint(lengths.shape[0], num_slices, lengths.device, self._rng)
            slice_lengths = lengths[run_idx].clamp_max(seq_length)
            target = seq_length if self.pad_output else None
        available = lengths[run_idx] - slice_lengths + 1
        relative = (_rand(num_slices, lengths.device, self._rng) * available).floor().to(torch.long)
        packed_starts = run_offsets[run_idx] + relative
        if target is not None:
            steps = torch.arange(target, device=lengths.device)
            mask = steps.unsqueeze(0) < slice_lengths.unsqueeze(1)
            steps = torch.minimum(steps.unsqueeze(0), (slice_lengths - 1).unsqueeze(1))
            index = ordered_slots[packed_starts.unsqueeze(1) + steps].reshape(-1, 1)
            return self._padded_index_and_info(storage, index, slice_lengths, target, mask.reshape(-1))
        packed = torch.repeat_interleave(packed_starts - (slice_lengths.cumsum(0) - slice_lengths), slice_lengths)
        packed = packed + torch.arange(packed.shape[0], device=packed.device)
        index = ordered_slots[packed].reshape(-1, 1)
        truncated = torch.zeros((index.shape[0], 1), dtype=torch.bool, device=index.device)
        truncated[slice_lengths.cumsum(0) - 1] = True
        return self._index_and_info(storage, index, truncated)

    def _sample_from_ends(self, storage, batch_size: int):
        """:meth:`sample`'s result in the common case, read from the trajectory ends kept by a
        :class:`torchrl_compat.samplers._trajectory_ends.TrajectoryEnds`; ``None`` (nothing drawn) for any other case,
        which the general path then handles.

        The common case: a 1-D storage of ours followed through its write journal, CPU
        kernels, no ``cache_values``, ``compile`` or ``use_gpu``, a span the kernel takes, and
        every trajectory at least one slice long, or the shorter ones left out
        (``strict_length``: they are found in one pass over the ends, and the draws skip them)
        where no slice is shortened.
        The same draws are made in the same order (the trajectories, then the starts), and
        only the drawn trajectories' bounds are read (``replay.sample_slice_index_from_ends``),
        where the general path lists the start, stop and length of every trajectory (three
        arrays as long as the number of trajectories, at every write).
        """
        if (
            self.cache_values
            or self.compile
            or self.use_gpu
            or not self._use_cpu_kernels
            or not len(storage)  # the general path raises the empty-storage error first
            or not TrajectoryEnds.supports(storage)
        ):
            return None
        if self._traj_key_auto:
            self._resolve_traj_key(storage)
        if self._fetch_traj:
            tracker = self._tracker(self._used_traj_key, True)
        elif self.end_keys is None:
            tracker = self._tracker(self.end_key, False)
        else:
            return None  # several end signals OR-ed: read whole by the general path
        try:
            stops = tracker.stops(storage)
        except KeyError:
            return None  # the general path falls back to the other key, or raises
        if stops is None:
            return None
        seq_length, num_slices = self._adjusted_batch_size(batch_size)
        if not num_slices or not self._kernel_span(seq_length):
            return None
        ends, limit, length, forced = stops
        count, shortest = replay.bounds_summary(ends, limit, length, forced)
        short = None
        if shortest < seq_length:
            if not self.strict_length:
                return None  # slices to shorten
            # the trajectories strict_length leaves out (in a full storage, typically the
            # one the last write cut short): drawn among the others, as the general path
            # draws among the trajectories it keeps
            short = replay.short_trajectories(ends, limit, length, forced, seq_length)
            count -= short.size
            if not count:
                return None  # the general path raises its error
        traj_idx = _randint(count, num_slices, _CPU, self._rng)
        uniform = _rand(num_slices, _CPU, self._rng)
        if short is not None:
            # the k-th trajectory kept is the k + j-th listed, j the number of trajectories
            # left out before it: those whose kept predecessors number at most k
            kept_before = torch.from_numpy(short) - torch.arange(short.size)
            traj_idx = traj_idx + torch.searchsorted(kept_before, traj_idx, right=True)
        flags = self._kernel_flags(storage)
        storage_length = storage.shape[0]
        try:
            out = replay.sample_slice_index_from_ends(
                ends, limit, length, forced, traj_idx, uniform, seq_length, storage_length,
                span=self.span, flags=flags,
            )
        except ValueError:
            # a degenerate span: the torch ops go on (or fail) as torchrl's do, same draws
            start_idx, _, lengths = (
                torch.from_numpy(array) for array in replay.bounds_from_ends(ends, limit, length, forced)
            )
            return self._index_with_torch(
                lengths, start_idx, seq_length, num_slices, storage_length, traj_idx, uniform, storage
            )
        return self._index_and_info(storage, out[0], out[1], out[2] if flags is not None else None)

    def _sample_on_device(self, storage, batch_size: int):
        """:meth:`sample`'s result on a storage on an accelerator (or with the torch ops forced
        on CPU) with no host synchronisation; ``None`` (nothing drawn) for the cases the
        general path handles (see the class's note).

        The trajectories are never listed (that needs ``nonzero``): each slice's trajectory
        is drawn by rank among those long enough, ``floor(u * count)``, from the end table
        of :func:`torchrl_compat._torch_ops.slices.end_flags`, then its start as the general path draws it.
        """
        if (
            self.cache_values
            or self.compile
            or not self.strict_length
            or self.span[0] is not False and self.span[0] != 0
            or self.span[1] is not False and self.span[1] != 0
            or self.end_keys is not None
            or getattr(storage, "ndim", None) != 1
            or not len(storage)  # the general path raises the empty-storage error
        ):
            return None
        device = storage_device(storage)
        if device is None or (device.type == "cpu" and self._use_cpu_kernels):
            return None
        if self.use_gpu and device != self._gpu_device:
            return None
        seq_length, num_slices = self._adjusted_batch_size(batch_size)
        if not num_slices or not isinstance(seq_length, int):
            return None
        if self._traj_key_auto:
            self._resolve_traj_key(storage)
        try:
            data = storage[:]
            if self._fetch_traj:
                signal = {"trajectory": data[self._used_traj_key]}
            else:
                signal = {"end": data[self.end_key].squeeze()[: len(storage)]}
        except (KeyError, AttributeError, TypeError, IndexError):
            return None  # the general path falls back to the other key, or raises
        (value,) = signal.values()
        if not isinstance(value, torch.Tensor) or value.ndim != 1 or value.device != device:
            return None
        cursor = getattr(storage, "_last_cursor", None)
        if not (isinstance(cursor, torch.Tensor) and cursor.ndim == 1 and cursor.numel()):
            cursor = _last_cursor(storage)
        # else the written index itself (its last entry is the cursor): read by end_flags
        # on its device, or from host memory, where the storage's int() would be a torch op
        flags = torch_slices.end_flags(at_capacity=storage._is_full, cursor=cursor, **signal)
        table = torch_slices.slice_start_table(flags, seq_length)
        checks = self.__dict__.get("_device_checks")
        if checks is None or checks._device != device:
            checks = self.__dict__["_device_checks"] = DeferredChecks(device)
        checks.raise_ready()
        if checks._on_host:
            # The count is in host memory: read for free. None long enough: refused before
            # any draw, with the general path's error; else torchrl's own draws.
            count = int(table[3].numpy())
            if not count:
                return None
            traj_draw = _randint(count, num_slices, device, self._rng)
        else:
            traj_draw = _rand_on(num_slices, device, self._rng)
        start_uniform = _rand_on(num_slices, device, self._rng)
        index, _, found = torch_slices.draw_slices(table, traj_draw, start_uniform)
        code = torch.where(found, 0, 1).double()
        checks.record(torch.stack([code, code.new_tensor(float(seq_length)), code.new_tensor(0.0)]), _no_slice_error)
        truncated = None
        if self.truncated_key is not None or self._init_marker_key() is not None:
            truncated = self._truncated(index.shape[0], seq_length, num_slices, device)
        return self._index_and_info(storage, index.unsqueeze(1), truncated)

    def _kernel_span(self, seq_length: int) -> bool:
        """Whether ``span`` is one the index kernel takes and :meth:`_get_index` accepts for
        slices of ``seq_length`` (no error to raise)."""
        left, right = self.span
        for span in (left, right):
            if type(span) not in (bool, int) or span < 0:
                return False
            if span is not True and span and span >= seq_length:
                return False
        return True

    def _sample_slices(
        self,
        lengths: torch.Tensor,
        start_idx: torch.Tensor,
        stop_idx: torch.Tensor,
        seq_length: int,
        num_slices: int,
        storage_length: int,
        traj_idx: torch.Tensor | None = None,
        *,
        storage,
    ) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
        # start_idx and stop_idx are 2d tensors organized like a non-zero
        target_seq_length = None

        def get_traj_idx(maxval):
            return _randint(maxval, num_slices, lengths.device, self._rng)

        if self._has_shorter(lengths, seq_length):
            if self.strict_length:
                idx = lengths >= seq_length
                if not idx.any():
                    raise RuntimeError(
                        f"Did not find a single trajectory with sufficient length (length range: {lengths.min()} - {lengths.max()} / required={seq_length}))."
                    )
                if (
                    isinstance(seq_length, torch.Tensor)
                    and seq_length.shape == lengths.shape
                ):
                    seq_length = seq_length[idx]
                lengths_idx = lengths[idx]
                start_idx = start_idx[idx]
                stop_idx = stop_idx[idx]

                if traj_idx is None:
                    traj_idx = get_traj_idx(lengths_idx.shape[0])
                else:
                    # traj_idx points into the unfiltered trajectories: map it to the kept
                    # ones through a mask (which may leave nothing to sample).
                    idx_mask = torch.zeros_like(idx)
                    idx_mask[traj_idx] = True
                    traj_idx = idx_mask[idx].nonzero().squeeze(-1)
                    if not traj_idx.numel():
                        raise RuntimeError(
                            "None of the provided indices pointed to a trajectory of "
                            "sufficient length. Consider using strict_length=False for the "
                            "sampler instead."
                        )
                    num_slices = traj_idx.shape[0]

                del idx
                lengths = lengths_idx
            else:
                if traj_idx is None:
                    traj_idx = get_traj_idx(lengths.shape[0])
                else:
                    num_slices = traj_idx.shape[0]

                # make seq_length a tensor with values clamped by lengths
                if self.pad_output:
                    target_seq_length = seq_length
                seq_length = lengths[traj_idx].clamp_max(seq_length)
        else:
            if traj_idx is None:
                traj_idx = get_traj_idx(lengths.shape[0])
            else:
                num_slices = traj_idx.shape[0]
        return self._get_index(
            lengths=lengths,
            start_idx=start_idx,
            stop_idx=stop_idx,
            num_slices=num_slices,
            seq_length=seq_length,
            storage_length=storage_length,
            traj_idx=traj_idx,
            storage=storage,
            **({"target_seq_length": target_seq_length} if target_seq_length is not None else {}),
        )

    def _has_shorter(self, lengths: torch.Tensor, seq_length) -> bool:
        """Whether a trajectory is shorter than ``seq_length`` (the shortest length is kept for
        as long as the same ``lengths`` tensor comes back, as it does from the cache)."""
        if isinstance(seq_length, torch.Tensor):
            return bool((lengths < seq_length).any())
        cached = self.__dict__.get("_shortest")
        if cached is None or cached[0] is not lengths:
            shortest = int(lengths.min()) if lengths.numel() else None
            cached = self.__dict__["_shortest"] = (lengths, shortest)
        return cached[1] is not None and cached[1] < seq_length

    def _get_index(
        self,
        lengths: torch.Tensor,
        start_idx: torch.Tensor,
        stop_idx: torch.Tensor,
        seq_length: int,
        num_slices: int,
        storage_length: int,
        traj_idx: torch.Tensor | None = None,
        *,
        target_seq_length: int | None = None,
        storage,
    ) -> tuple[torch.Tensor, dict]:
        # With strict_length=False seq_length is a tensor clamped by the trajectory lengths,
        # where torchrl fails on an integer span: check the span against the requested length.
        requested = seq_length if isinstance(seq_length, int) else int(seq_length.max())
        for span in self.span:
            if span is not True and span and span >= requested:
                raise ValueError(
                    "The right and left span must be strictly lower than the sequence length"
                )
        uniform = _rand(num_slices, lengths.device, self._rng)
        index = truncated = gathered = None
        if num_slices and self._kernel_slices(start_idx):
            # The done / terminated (/ is_init) columns are read at the sampled rows in the
            # same call, but for padded slices, which read them at the padded rows.
            flags = (
                self._kernel_flags(storage)
                if start_idx.shape[1] == 1 and target_seq_length is None
                else None
            )
            try:
                out = replay.sample_slice_index(
                    start_idx, lengths, traj_idx, uniform, seq_length, storage_length,
                    span=self.span, flags=flags,
                )
            except ValueError:
                pass  # a degenerate span: the torch ops below fail as torchrl's do
            else:
                index, truncated = out[0], out[1]
                gathered = out[2] if flags is not None else None
        if index is None:
            if target_seq_length is not None:
                index, seq_length = self._slices_with_torch(
                    lengths, start_idx, seq_length, storage_length, traj_idx, uniform
                )
                truncated = self._truncated(index.shape[0], seq_length, num_slices, index.device)
            else:
                return self._index_with_torch(
                    lengths, start_idx, seq_length, num_slices, storage_length, traj_idx, uniform, storage
                )
        if target_seq_length is not None:
            return self._pad_slices(storage, index, truncated, target_seq_length)
        return self._index_and_info(storage, index, truncated, gathered)

    def _pad_slices(self, storage, index, truncated, target_seq_length: int):
        """``pad_output=True``: every slice (rows of ``index``, its last one flagged in
        ``truncated``) padded to ``target_seq_length`` rows by repeating its last row."""
        stops = truncated.reshape(-1).nonzero().reshape(-1)
        slice_lengths = torch.diff(stops, prepend=stops.new_full((1,), -1))
        steps = torch.arange(target_seq_length, device=index.device)
        mask = steps.unsqueeze(0) < slice_lengths.unsqueeze(1)
        steps = torch.minimum(steps.unsqueeze(0), (slice_lengths - 1).clamp_min(0).unsqueeze(1))
        rows = (stops - slice_lengths + 1).unsqueeze(1) + steps
        return self._padded_index_and_info(
            storage, index[rows.reshape(-1)], slice_lengths, target_seq_length, mask.reshape(-1)
        )

    def _padded_index_and_info(self, storage, index, slice_lengths, target_seq_length, mask):
        """``(index, info)`` of padded slices: ``truncated`` on the last real row of each,
        ``("collector", "mask")`` flagging the real rows, ``is_init`` on each first row."""
        num_slices = slice_lengths.shape[0]
        first_rows = torch.arange(num_slices, device=index.device) * target_seq_length
        truncated = torch.zeros((index.shape[0], 1), dtype=torch.bool, device=index.device)
        truncated[first_rows + (slice_lengths - 1).clamp_min(0)] = True
        starts = torch.zeros(index.shape[0], dtype=torch.bool, device=index.device)
        starts[first_rows] = True
        return self._index_and_info(storage, index, truncated, mask=mask, starts=starts)

    def _index_with_torch(
        self, lengths, start_idx, seq_length, num_slices, storage_length, traj_idx, uniform, storage
    ):
        """:meth:`_get_index`'s result computed with torch ops from its draws."""
        index, seq_length = self._slices_with_torch(
            lengths, start_idx, seq_length, storage_length, traj_idx, uniform
        )
        truncated = None
        if self.truncated_key is not None or self._init_marker_key() is not None:
            truncated = self._truncated(index.shape[0], seq_length, num_slices, index.device)
        return self._index_and_info(storage, index, truncated)

    def _index_and_info(self, storage, index, truncated, gathered=None, *, mask=None, starts=None):
        """``(index, info)`` as :meth:`sample` returns them, from the ``[rows, ndim]`` slice
        indices and their truncation flags (and the done / terminated / is_init columns read
        there by the index kernel). ``mask`` (padded slices) goes to
        ``("collector", "mask")``; ``starts`` flags the first row of every slice (by default
        the rows after a truncated one)."""
        index = _as_long(index).unbind(-1)
        init_key = self._init_marker_key()
        if self.truncated_key is None and mask is None and init_key is None:
            return index, {}
        info = {}
        if gathered is None:
            gathered = self._gather_flags(storage, index, init_key)
        if self.truncated_key is not None:
            info.update(self._truncation_info(storage, index, truncated, gathered))
        if mask is not None:
            info[("collector", "mask")] = mask
        stored_init = gathered[2]
        if init_key is not None and stored_init is not None:
            if starts is None:
                starts = torch.ones(truncated.shape[0], dtype=torch.bool, device=truncated.device)
                starts[1:] = truncated.reshape(-1)[:-1]
            marker = stored_init  # a fresh tensor, read at the sampled rows
            # A mask the shape of the rows (no boolean indexing: no host synchronisation).
            starts = starts.to(marker.device).reshape(starts.shape[0], *(1,) * (marker.ndim - 1))
            marker.masked_fill_(starts, True)
            info[init_key] = marker
        return index, info

    def _init_marker_key(self):
        """The key under which each slice's first step is marked (``None``: not marked)."""
        if not since("slice_init_marker"):
            return None
        return self.init_key if since("slice_end_keys_fragmented") else "is_init"

    def _gather_flags(self, storage, index, init_key) -> list:
        """``[done, terminated, is_init]`` read from ``storage`` at ``index`` (``None`` for
        missing or unwanted entries, and for a storage that gives no tensordict)."""
        keys = [None, None, init_key]
        if self.truncated_key is not None:
            keys[:2] = self._info_keys()[1:]
        wanted = [key for key in keys if key is not None]
        if not wanted:
            return [None, None, None]
        try:
            values = iter(gather_fields(storage, index, wanted))
        except AttributeError:  # storage[index] gives no tensordict (.get)
            if self.truncated_key is not None:
                raise
            return [None, None, None]
        return [None if key is None else next(values) for key in keys]

    def _truncation_info(self, storage, index, truncated, gathered=None) -> dict:
        """The ``truncated`` / ``done`` / ``terminated`` entries of the info dictionary: the
        storage's done (or-ed with the truncation flags) and terminated at ``index``, from
        ``gathered`` when they were read already (fresh tensors)."""
        truncated_key, done_key, terminated_key = self._info_keys()
        if gathered is None:
            gathered = self._gather_flags(storage, index, None)
        done, terminated = gathered[0], gathered[1]
        if done is None:
            done = truncated.clone()
        elif done.dtype is torch.bool and done.shape == truncated.shape:
            done.logical_or_(truncated)
        else:
            done = done | truncated
        if terminated is None:
            terminated = torch.zeros_like(truncated)
        return {truncated_key: truncated, done_key: done, terminated_key: terminated}

    def _kernel_flags(self, storage):
        """The done / terminated / is_init columns ``replay.sample_slice_index`` reads for the
        info dictionary (``None`` entries for those not wanted), or ``None`` (nothing wanted,
        or a column it cannot read)."""
        init_key = self._init_marker_key()
        keys = [None, None, init_key]
        if self.truncated_key is not None:
            keys[:2] = self._info_keys()[1:]
        if all(key is None for key in keys):
            return None
        columns = flag_columns(storage, [key for key in keys if key is not None])
        if columns is None:
            return None
        columns = iter(columns)
        return [None if key is None else next(columns) for key in keys]

    def _info_keys(self) -> tuple:
        """``(truncated_key, done_key, terminated_key)`` of the info dictionary."""
        keys = self.__dict__.get("_info_keys_of")
        if keys is None or keys[0] != self.truncated_key:
            truncated_key = self.truncated_key
            keys = (
                truncated_key,
                _replace_last(truncated_key, "done"),
                _replace_last(truncated_key, "terminated"),
            )
            self.__dict__["_info_keys_of"] = keys
        return keys

    def _kernel_slices(self, start_idx: torch.Tensor) -> bool:
        """Whether the slice indices come from ``replay``'s fused kernel (CPU, not compiled)."""
        if not self._use_cpu_kernels or self.compile or not _on_cpu(start_idx):
            return False
        left, right = self.span
        return type(left) in (bool, int) and type(right) in (bool, int) and left >= 0 and right >= 0

    def _slices_with_torch(self, lengths, start_idx, seq_length, storage_length, traj_idx, uniform):
        """``(index, seq_length)`` of the slices in torch ops (the accelerator path)."""
        traj_lengths = lengths[traj_idx]
        # end_point is one past the last possible start of a slice
        if not self.span[1]:
            end_point = traj_lengths - seq_length + 1
        elif self.span[1] is True:
            end_point = traj_lengths + 1
        else:
            end_point = traj_lengths - self.span[1]

        if not self.span[0]:
            start_point = 0
        elif self.span[0] is True:
            start_point = -seq_length + 1
        else:
            start_point = -self.span[0]

        relative_starts = (uniform * (end_point - start_point)).floor().to(
            start_idx.dtype
        ) + start_point
        # float32 rounding can reach end_point itself for very long trajectories
        relative_starts = torch.minimum(
            relative_starts, torch.as_tensor(end_point - 1).clamp_min(start_point)
        )

        if self.span[0]:
            out_of_traj = relative_starts < 0
            if out_of_traj.any():
                # a negative start means sampling fewer elements
                seq_length = torch.where(
                    ~out_of_traj, seq_length, seq_length + relative_starts
                )
                relative_starts = torch.where(~out_of_traj, relative_starts, 0)
        if self.span[1]:
            out_of_traj = relative_starts + seq_length > traj_lengths
            if out_of_traj.any():
                # a slice running past the trajectory's end is cut there (torchrl fails
                # here with an int seq_length)
                seq_length = torch.minimum(
                    torch.as_tensor(seq_length, device=traj_lengths.device),
                    traj_lengths - relative_starts,
                )

        starts = torch.cat(
            [
                (start_idx[traj_idx, 0] + relative_starts).unsqueeze(1),
                start_idx[traj_idx, 1:],
            ],
            1,
        )
        return self._tensor_slices_from_startend(seq_length, starts, storage_length), seq_length

    @staticmethod
    def _truncated(numel: int, seq_length, num_slices: int, device) -> torch.Tensor:
        # The last step of every slice is marked truncated.
        truncated = torch.zeros((numel, 1), dtype=torch.bool, device=device)
        if isinstance(seq_length, int):
            truncated.view(num_slices, -1)[:, -1] = 1
        else:
            truncated[seq_length.cumsum(0) - 1] = 1
        return truncated

    @property
    def _used_traj_key(self):
        return self.__dict__.get("__used_traj_key", self.traj_key)

    @_used_traj_key.setter
    def _used_traj_key(self, value):
        self.__dict__["__used_traj_key"] = value

    @property
    def _used_end_key(self):
        return self.__dict__.get("__used_end_key", self.end_key)

    @_used_end_key.setter
    def _used_end_key(self, value):
        self.__dict__["__used_end_key"] = value

    def _empty(self):
        self._cache.pop("fragmented-runs", None)

    def dumps(self, path):
        # Nothing to save: the cache is rebuilt from the storage.
        ...

    def loads(self, path):
        ...

    # Nothing on disk (a SliceSamplerWithoutReplacement's epoch included, as in torchrl).
    _read_checkpoint = Sampler._read_checkpoint
    _apply_checkpoint = Sampler._apply_checkpoint

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._cache.pop("fragmented-runs", None)

    # torchrl 0.14's hooks for the samplers built on a SliceSampler (its StreamingSliceSampler
    # finishes the slices it queued with _finalize_index), answered by our index-and-info path.
    def _finalize_index(self, *, index, num_slices, seq_length, target_seq_length, mask_flat, storage):
        """``(index, info)`` of ``num_slices`` slices laid one after the other in the
        ``[rows, ndim]`` ``index``: ``seq_length`` rows each (or a tensor of lengths), or,
        with ``target_seq_length``, padded to that many rows with ``mask_flat`` flagging
        the real ones."""
        if target_seq_length is not None and isinstance(seq_length, torch.Tensor):
            return self._padded_index_and_info(storage, index, seq_length, target_seq_length, mask_flat)
        truncated = self._truncated(index.shape[0], seq_length, num_slices, index.device)
        return self._index_and_info(storage, index, truncated, mask=mask_flat)

    def _maybe_emit_init_marker(self, info, st_index, num_slices, seq_length, target_seq_length) -> None:
        """Marks the first step of every slice under the init key of ``info``, or-ed with the
        stored flags read in ``st_index`` (nothing when the storage has none)."""
        init_key = self._init_marker_key()
        stored = st_index.get(init_key, default=None) if init_key is not None and hasattr(st_index, "get") else None
        if stored is None:
            return
        if target_seq_length is not None:
            lengths = torch.full((num_slices,), target_seq_length, dtype=torch.long)
        elif isinstance(seq_length, int):
            lengths = torch.full((num_slices,), seq_length, dtype=torch.long)
        else:
            lengths = seq_length.to(torch.long).cpu()
        starts = (lengths.cumsum(0) - lengths).to(stored.device)
        marker = torch.zeros_like(stored)
        marker[starts] = True
        info[init_key] = marker | stored
