""":class:`PrioritizedSliceSampler`: slices of trajectories, their starts drawn by priority."""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict.utils import NestedKey

import replay
from .._torch_ops import slices as torch_slices
from ._storage_reads import ravel
from .._releases import keywords_since, since
from .._torchrl_lookup import torchrl_twin
from ..storages import Storage
from ..utils import unravel_index
from ._common import _as_long
from .prioritized import PrioritizedSampler
from .slice import SliceSampler


class PrioritizedSliceSampler(SliceSampler, PrioritizedSampler, *torchrl_twin("samplers", "PrioritizedSliceSampler")):
    r"""Samples slices of data along the first dimension, given start and stop signals, using prioritized sampling.

    Slice starts are drawn with :class:`PrioritizedSampler`'s rule among the positions
    that can start a slice of the requested length (with ``span`` and
    ``strict_length=False`` allowing shorter slices at the end of a trajectory), and every
    step of a slice carries its start's importance weight.

    Args:
        max_capacity (int): maximum capacity of the buffer.
        alpha (:obj:`float`): exponent :math:`\alpha` determines how much prioritization is used.
        beta (:obj:`float`): importance sampling negative exponent :math:`\beta`.
        eps (:obj:`float`, optional): small constant added to priorities to ensure
            no transition has zero priority. Defaults to 1e-8.
        dtype (torch.dtype, optional): the precision of the priority trees.
            Defaults to ``torch.float``.
        reduction (str, optional): the reduction method for multidimensional
            tensordicts (i.e., stored trajectory). Can be one of "max", "min",
            "median" or "mean". Defaults to ``"max"``.

    Keyword Args:
        num_slices (int): the number of slices to be sampled. Exclusive with ``slice_len``.
        slice_len (int): the length of the slices to be sampled. Exclusive with ``num_slices``.
        end_key (NestedKey, optional): the key indicating the end of a
            trajectory (or episode). Defaults to ``("next", "done")``.
        end_keys (sequence of NestedKey, optional): several end-of-trajectory keys, OR-ed
            together (missing ones skipped). Exclusive with ``end_key``. From torchrl 0.14.
        traj_key (NestedKey, optional): the key indicating the trajectories.
            Defaults to ``"episode"``.
        ends (torch.Tensor, optional): a 1d boolean tensor containing the end of run signals.
            Must be used with ``cache_values=True``.
        trajectories (torch.Tensor, optional): a 1d integer tensor containing the run ids.
            Must be used with ``cache_values=True``.
        cache_values (bool, optional): to be used with static datasets: caches the
            trajectory starts and stops (erased by :meth:`extend`). Defaults to ``False``.
        truncated_key (NestedKey, optional): where a truncated signal is written in the
            output. Defaults to ``("next", "truncated")``.
        init_key (NestedKey, optional): where the slice-start signal is written in the
            output. Defaults to ``"is_init"``. From torchrl 0.14.
        strict_length (bool, optional): if ``False``, slices shorter than required may be
            returned. Defaults to ``True``.
        compile (bool or dict of kwargs, optional): accepted for compatibility.
            Defaults to ``False``.
        span (bool, int, Tuple[bool | int, bool | int], optional): right span of the
            slices (left spanning is disabled, as in torchrl). Defaults to ``False``.
        max_priority_within_buffer (bool, optional): if ``True``, the max-priority
            is tracked within the buffer. Defaults to ``False``.

    .. note:: torchrl writes zeros at the sum-tree leaves that cannot start a slice, draws,
        then writes them back, which races with a concurrent :meth:`update_priority` (and,
        when the draw fails, leaves them zeroed), and needs an ``[M, N, ndim]`` tensor to find
        each slice's stop. Here the trees are never written while sampling. On CPU,
        ``replay``'s ``sample_prioritized_zeroed`` reads the zeroed tree in place: the
        entries of the excluded leaves' ancestors are computed once, as a write of zeros
        would store them, and read in place of the tree's, so the sum of the allowed
        priorities, the masses (numpy's global RNG without a generator, else
        ``torch.rand`` with it, as torchrl draws them), the leaves they land on and the
        weights (relative to the smallest priority of all the leaves, excluded ones
        included, as torchrl leaves its min tree as it is) are torchrl's bit for bit. On an
        accelerator the leaves are zeroed in a masked copy of the priorities. The stops are
        found by binary search. A draw with no allowed positive priority raises "non-positive
        p_sum" before it takes any random number, as torchrl's does.

    .. note:: On an accelerator, :meth:`update_priority` and the default priorities of new
        items go through :class:`PrioritizedSampler`'s device path (no host
        synchronisation; bad indices and priorities masked on the device and raised at a
        later call), but a draw, which excludes the positions that cannot start a slice,
        keeps the checked torch-op path: it synchronises with the host once per call.

    .. note:: Where torchrl fails or errs, this sampler differs on purpose:

        - one-step slices (``slice_len=1``, ``batch_size == num_slices``, or
          ``span[1] == slice_len - 1``): a one-step slice may start at any step, so none is
          excluded and every step is drawn in proportion to its priority. torchrl's mask of
          the steps that cannot start a slice, ``pad[:, -seq_length + 1:]``, is
          ``pad[:, 0:]`` (every step) when ``seq_length == 1``: with
          ``strict_length=True`` it raises "non-positive p_sum", with
          ``strict_length=False`` (which puts the trajectory starts back) it draws only
          trajectory starts;
        - a slice whose right span runs past its trajectory's end is cut there (torchrl
          fails on an integer ``seq_length``);
        - for a start in the part of a trajectory that wraps around the end of the storage,
          the trajectory's own stop bounds the slice (torchrl picks the next stop of any
          trajectory, too far);
        - an empty (or emptied) storage raises ``RuntimeError: Cannot sample from an empty
          storage.``, as the other samplers do (torchrl fails with an ``IndexError``);
        - with ``cache_values=True``, a call whose slice length differs from the first
          call's (``num_slices`` and another batch size): torchrl keeps the positions it
          excluded for the first length, so its slices then run past trajectory ends (or
          starts that fit are never drawn); here they are listed again for the new length
          (the trajectory bounds stay cached), and the draws are those torchrl makes without
          the cache;
        - a mass of exactly 0 (a draw of probability 2**-53, or 2**-24 with a generator)
          when the first leaf cannot start a slice or has no priority: torchrl steps left
          from leaf 0, fails with "Failed to find a suitable index" and leaves the excluded
          leaves zeroed; here the draw lands on the first leaf on the right that can start
          a slice.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data.replay_buffers import LazyTensorStorage
        >>> storage = LazyTensorStorage(9)
        >>> episode = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
        >>> storage.set(torch.arange(9), TensorDict({"episode": episode}, [9]))
        >>> sampler = PrioritizedSliceSampler(9, alpha=0.7, beta=0.9, num_slices=3, traj_key="episode")
        >>> sampler.update_priority(torch.arange(9), torch.ones(9))
        >>> (index,), info = sampler.sample(storage, 6)
        >>> [len(set(episode[index[k:k + 2]].tolist())) for k in range(0, 6, 2)]
        [1, 1, 1]
        >>> info["priority_weight"].tolist()
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """

    def _init_prioritized_slices(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        end_key: NestedKey | None = None,
        end_keys: Sequence[NestedKey] | None = None,
        traj_key: NestedKey | None = None,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        cache_values: bool = False,
        truncated_key: NestedKey | None = ("next", "truncated"),
        init_key: NestedKey | None = "is_init",
        strict_length: bool = True,
        compile: bool | dict = False,
        span: bool | int | tuple[bool | int, bool | int] = False,
        max_priority_within_buffer: bool = False,
    ):
        SliceSampler._init_slices(
            self,
            num_slices=num_slices,
            slice_len=slice_len,
            end_key=end_key,
            end_keys=end_keys,
            traj_key=traj_key,
            cache_values=cache_values,
            truncated_key=truncated_key,
            init_key=init_key,
            strict_length=strict_length,
            ends=ends,
            trajectories=trajectories,
            compile=compile,
            span=span,
        )
        PrioritizedSampler.__init__(
            self,
            max_capacity=max_capacity,
            alpha=alpha,
            beta=beta,
            eps=eps,
            dtype=dtype,
            reduction=reduction,
            max_priority_within_buffer=max_priority_within_buffer,
        )
        if self.span[0]:
            # Starts are drawn by the prioritized rule, which knows nothing of
            # trajectories, so 'negative' starts (left spanning) cannot be drawn.
            warnings.warn(
                f"Left spanning is disabled for {type(self).__name__} and will be automatically turned off. "
                f"If this feature is required, please file an issue on torchrl GitHub repo."
            )
            self.span = (0, self.span[1])

    # The constructor takes the keywords of the torchrl release followed.
    __init__ = keywords_since(
        _init_prioritized_slices,
        {"end_keys": "slice_end_keys_fragmented", "init_key": "slice_end_keys_fragmented"},
        name="__init__",
    )

    def __repr__(self):
        # torchrl's, closing parenthesis missing included
        return f"{self._repr_head()},alpha={self._alpha}, beta={self._beta}, eps={self._eps}"

    def __getstate__(self):
        state = SliceSampler.__getstate__(self)
        state.update(PrioritizedSampler.__getstate__(self))
        state["_cache"] = {}
        return state

    def mark_update(
        self, index: int | torch.Tensor, *, storage: Storage | None = None
    ) -> None:
        return PrioritizedSampler.mark_update(self, index, storage=storage)

    def _padded_indices(self, shapes, arange) -> torch.Tensor:
        """A left-padded table: row ``g`` ends with the ``shapes[g]`` next values of ``arange``,
        after ``-1`` padding. One masked assignment, where torchrl loops over the rows.
        ``shapes`` may be a column (``[G, 1]``), as torchrl passes the lengths."""
        shapes = shapes.reshape(-1)
        max_len = int(shapes.max())
        pad = torch.full((shapes.shape[0], max_len), -1, dtype=arange.dtype, device=arange.device)
        columns = torch.arange(max_len, device=shapes.device)
        valid = columns.unsqueeze(0) >= (max_len - shapes).unsqueeze(1)
        pad[valid.to(pad.device)] = arange[: int(shapes.sum())]
        return pad

    def _preceding_stop_idx(self, storage, lengths, seq_length, start_idx):
        """Flat storage positions that cannot start a slice of ``seq_length`` (cached with ``cache_values``)."""
        key = (seq_length, self.strict_length, self.span[1])
        cached = self._cache.get("preceding_stop_idx")
        if cached is not None and cached[0] == key:
            return cached[1]
        # Without cache_values, the bounds of a storage that journals its writes come back
        # as the same tensors while no trajectory changed: so do the excluded positions.
        full = storage._is_full
        last = self.__dict__.get("_preceding_of")
        if (
            last is not None
            and last[0] is lengths
            and last[1] is start_idx
            and last[2] == (key, full)
        ):
            return last[3]
        numel = storage.shape.numel()
        if int(lengths.sum()) != numel:
            raise RuntimeError("Wrong shapes / arange configuration")
        if storage.ndim == 1 and self._kernel_slices(lengths):
            # One C pass, sorted (the exclusion kernel then takes them as they are); the torch
            # ops below take two repeat_interleave and a modulo (0.4 ms at 2^20 steps).
            offset = int(start_idx[0, 0]) if full else 0
            preceding_stop_idx = torch.from_numpy(
                replay.excluded_starts(
                    lengths,
                    torch_slices.excluded_tail(seq_length, self.span[1]),
                    keep_first=not self.strict_length,
                    offset=offset,
                    total=numel,
                )
            )
        else:
            preceding_stop_idx = self._excluded_with_torch(storage, lengths, seq_length, start_idx, full)
        if self.cache_values:
            self._cache["preceding_stop_idx"] = (key, preceding_stop_idx)
        else:
            self.__dict__["_preceding_of"] = (lengths, start_idx, (key, full), preceding_stop_idx)
        return preceding_stop_idx

    def _excluded_with_torch(self, storage, lengths, seq_length, start_idx, full):
        """The excluded start positions in torch ops (any device, any ndim)."""
        preceding_stop_idx = torch_slices.excluded_start_positions(
            lengths, seq_length, self.span[1], self.strict_length
        )
        if full:
            # At capacity the first trajectory starts at start_idx[0], not at 0.
            total_shape = storage._total_shape
            offset = ravel(start_idx[0].tolist(), total_shape)
            preceding_stop_idx = (preceding_stop_idx + offset) % total_shape.numel()
        return preceding_stop_idx

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        start_idx, stop_idx, lengths = self._trajectory_bounds(storage)
        seq_length, num_slices = self._adjusted_batch_size(batch_size)

        preceding_stop_idx = self._preceding_stop_idx(
            storage, lengths, seq_length, start_idx
        )
        if storage.ndim > 1:
            # The positions follow the trajectory order (trailing dims first): map them to
            # positions of the flat (not permuted) storage.
            shape = storage.shape
            coords = unravel_index(preceding_stop_idx, (shape[-1], *shape[:-1]))
            coords = (coords[-1], *coords[:-1])
            preceding_stop_idx = ravel(coords, shape)

        starts, info = self._prioritized_sample(
            storage, batch_size // seq_length, exclude=preceding_stop_idx
        )
        # The slices are cut at the end of their trajectory with span[1] or strict_length=False.
        if self.span[1] or not self.strict_length:
            if not isinstance(starts, torch.Tensor):
                starts_tensor = torch.stack(list(starts), dim=-1).to(stop_idx.device)
            else:
                starts_tensor = starts.unsqueeze(1).to(stop_idx.device)
            stops = torch_slices.stops_after_starts(
                starts_tensor, start_idx, stop_idx, storage._len_along_dim0
            )
            seq_length = (stops - starts_tensor[:, 0] + 1).clamp_max(seq_length)
            if (seq_length <= 0).any():
                raise RuntimeError(
                    "failed to compute seq_length, please report this bug"
                )

        if isinstance(starts, tuple):
            starts = torch.stack(starts, -1)
        info["priority_weight"] = torch.as_tensor(
            info["priority_weight"], device=lengths.device
        )
        if (
            isinstance(seq_length, int)
            and starts.ndim == 1
            and self._kernel_slices(starts)
        ):
            return self._expand_with_kernel(storage, starts, seq_length, info)
        # every step of a slice, from its start
        index = self._tensor_slices_from_startend(
            seq_length, starts, storage_length=storage.shape[0]
        )
        # every step of a slice carries the weight of its start
        if isinstance(seq_length, torch.Tensor):
            seq_length = seq_length.to(lengths.device)
        info["priority_weight"] = torch.repeat_interleave(
            info["priority_weight"], seq_length
        )

        truncated = None
        if self.truncated_key is not None:
            truncated = self._truncated(index.shape[0], seq_length, num_slices, index.device)
        index = _as_long(index).unbind(-1)
        if truncated is not None:
            info.update(self._truncation_info(storage, index, truncated))
        return index, info

    def _expand_with_kernel(self, storage, starts, seq_length: int, info):
        """The slices of ``seq_length`` steps from ``starts`` (1-D CPU storage), their truncation
        flags and ``done`` / ``terminated`` columns in one ``replay.sample_slice_index`` call:
        each start is a trajectory of its own, entered at its first step."""
        n = starts.shape[0]
        flags = self._kernel_flags(storage)
        out = replay.sample_slice_index(
            starts.reshape(n, 1),
            np.full(n, seq_length, dtype=np.int64),
            np.arange(n, dtype=np.int64),
            np.zeros(n, dtype=np.float32),
            seq_length,
            storage.shape[0],
            flags=flags,
        )
        index, truncated = out[0], out[1]
        info["priority_weight"] = info["priority_weight"].repeat_interleave(seq_length)
        index = (index.reshape(-1),)
        if self.truncated_key is not None:
            info.update(self._truncation_info(storage, index, truncated, out[2] if flags is not None else None))
        return index, info

    def _empty(self):
        PrioritizedSampler._empty(self)

    def dumps(self, path):
        PrioritizedSampler.dumps(self, path)

    def loads(self, path):
        return PrioritizedSampler.loads(self, path)

    # The priorities are the state on disk, as torchrl's dumps / loads take them.
    _read_checkpoint = PrioritizedSampler._read_checkpoint
    _apply_checkpoint = PrioritizedSampler._apply_checkpoint

    def state_dict(self):
        return PrioritizedSampler.state_dict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # torchrl 0.11-0.12 inherit the slice sampler's, which loads nothing.
        if since("prioritized_slice_loads_state_dict"):
            return PrioritizedSampler.load_state_dict(self, state_dict)
        return SliceSampler.load_state_dict(self, state_dict)

    def add(self, index: torch.Tensor) -> None:
        PrioritizedSampler.add(self, index)
        return SliceSampler.add(self, index)

    def extend(self, index: torch.Tensor) -> None:
        PrioritizedSampler.extend(self, index)
        return SliceSampler.extend(self, index)
