""":class:`SliceSamplerWithoutReplacement`: slices of trajectories, each trajectory once per epoch."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict.utils import NestedKey

from .._releases import keywords_since
from .._releases import since
from .._torchrl_lookup import torchrl_twin
from ..storages import Storage
from .random import SamplerWithoutReplacement
from .slice import SliceSampler


class SliceSamplerWithoutReplacement(SliceSampler, SamplerWithoutReplacement, *torchrl_twin("samplers", "SliceSamplerWithoutReplacement")):
    """Samples slices of data along the first dimension, given start and stop signals, without replacement.

    In this context, ``without replacement`` means that the same element (NOT trajectory) will not be sampled twice
    before the counter is automatically reset. Within a single sample, however, only one slice of a given trajectory
    will appear. Each epoch draws every trajectory once.

    This class is to be used with static replay buffers or in between two
    replay buffer extensions. Extending the replay buffer will reset the
    the sampler, and continuous sampling without replacement is currently not
    allowed.

    Keyword Args:
        drop_last (bool, optional): if ``True``, the last incomplete sample (if any) will be dropped.
            If ``False``, this last sample will be kept. Defaults to ``False``.
        num_slices (int): the number of slices to be sampled. The batch-size
            must be greater or equal to the ``num_slices`` argument. Exclusive
            with ``slice_len``.
        slice_len (int): the length of the slices to be sampled. The batch-size
            must be greater or equal to the ``slice_len`` argument and divisible
            by it. Exclusive with ``num_slices``.
        end_key (NestedKey, optional): the key indicating the end of a
            trajectory (or episode). Defaults to ``("next", "done")``.
        traj_key (NestedKey, optional): the key indicating the trajectories.
            Defaults to ``"episode"``.
        ends (torch.Tensor, optional): a 1d boolean tensor containing the end of run signals.
            Cannot be used in conjunction with ``end_key`` or ``traj_key``.
        trajectories (torch.Tensor, optional): a 1d integer tensor containing the run ids.
            Cannot be used in conjunction with ``end_key`` or ``traj_key``.
        truncated_key (NestedKey, optional): If not ``None``, this argument
            indicates where a truncated signal should be written in the output
            data. Defaults to ``("next", "truncated")``.
        strict_length (bool, optional): if ``False``, trajectories of length
            shorter than `slice_len` (or `batch_size // num_slices`) will be
            allowed to appear in the batch. If ``True``, trajectories shorted
            than required will be filtered out. Defaults to ``True``.
        shuffle (bool, optional): if ``False``, the order of the trajectories
            is not shuffled. Defaults to ``True``.
        compile (bool or dict of kwargs, optional): if ``True``, the bottleneck of
            the :meth:`~sample` method will be compiled with :func:`~torch.compile`.
            Defaults to ``False``.
        use_gpu (bool or torch.device): if ``True`` (or is a device is passed), an accelerator
            will be used to retrieve the indices of the trajectory starts.
            Defaults to ``False``.

    .. note:: An empty (or uninitialized) storage raises ``RuntimeError: Cannot sample from
        an empty storage.``, as an emptied one does in torchrl, before anything is drawn
        from the generator (torchrl complains about a non-initialized storage).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data.replay_buffers import LazyTensorStorage
        >>> storage = LazyTensorStorage(12)
        >>> episode = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
        >>> storage.set(torch.arange(12), TensorDict({"episode": episode}, [12]))
        >>> sampler = SliceSamplerWithoutReplacement(num_slices=3, traj_key="episode")
        >>> (index,), _ = sampler.sample(storage, 6)
        >>> sorted(set(episode[index].tolist())), sampler.ran_out
        ([0, 1, 2], True)
    """

    def _init_slices(
        self,
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        drop_last: bool = False,
        end_key: NestedKey | None = None,
        end_keys: Sequence[NestedKey] | None = None,
        traj_key: NestedKey | None = None,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        truncated_key: NestedKey | None = ("next", "truncated"),
        init_key: NestedKey | None = "is_init",
        strict_length: bool = True,
        shuffle: bool = True,
        compile: bool | dict = False,
        use_gpu: bool | torch.device = False,
    ):
        SliceSampler._init_slices(
            self,
            num_slices=num_slices,
            slice_len=slice_len,
            end_key=end_key,
            end_keys=end_keys,
            traj_key=traj_key,
            cache_values=True,
            truncated_key=truncated_key,
            init_key=init_key,
            strict_length=strict_length,
            ends=ends,
            trajectories=trajectories,
            compile=compile,
            use_gpu=use_gpu,
        )
        SamplerWithoutReplacement.__init__(self, drop_last=drop_last, shuffle=shuffle)

    # The constructor takes the keywords of the torchrl release followed.
    __init__ = keywords_since(
        _init_slices,
        {"end_keys": "slice_end_keys_fragmented", "init_key": "slice_end_keys_fragmented"},
        name="__init__",
    )

    def __repr__(self):
        return f"{self._repr_head()},{self._percent_left(0)}% sampled)"

    def _empty(self):
        self._cache = {}
        SamplerWithoutReplacement._empty(self)

    def _storage_len(self, storage):
        return self._storage_len_buffer

    def sample(
        self, storage: Storage, batch_size: int
    ) -> tuple[tuple[torch.Tensor, ...], dict]:
        if self._batch_size_multiplier is not None:
            batch_size = batch_size * self._batch_size_multiplier
        start_idx, stop_idx, lengths = self._trajectory_bounds(storage)
        self._check_signal_ndim(start_idx, storage)
        # The permutation runs over trajectories, not items.
        self._storage_len_buffer = len(start_idx)
        seq_length, num_slices = self._adjusted_batch_size(batch_size)
        indices, _ = SamplerWithoutReplacement.sample(self, storage, num_slices)
        storage_length = storage.shape[0]

        # For a storage with ndim > 1 the trajectory ids come back unravelled: ravel them.
        if isinstance(indices, tuple):
            indices = torch.arange(len(storage), device=lengths.device).view(
                storage.shape
            )[indices]

        return self._sample_slices(
            lengths,
            start_idx,
            stop_idx,
            seq_length,
            num_slices,
            storage_length,
            traj_idx=indices,
            storage=storage,
        )

    def state_dict(self) -> dict[str, Any]:
        return SamplerWithoutReplacement.state_dict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return SamplerWithoutReplacement.load_state_dict(self, state_dict)

    if since("slice_without_replacement_dumps"):
        # The permutation state goes to disk as SamplerWithoutReplacement's does.
        def dumps(self, path):
            return SamplerWithoutReplacement.dumps(self, path)

        def loads(self, path):
            return SamplerWithoutReplacement.loads(self, path)

        _read_checkpoint = SamplerWithoutReplacement._read_checkpoint
        _apply_checkpoint = SamplerWithoutReplacement._apply_checkpoint
