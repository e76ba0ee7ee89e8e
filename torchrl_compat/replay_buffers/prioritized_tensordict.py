""":class:`TensorDictPrioritizedReplayBuffer`: a prioritized replay buffer of TensorDicts."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tensordict import is_tensor_collection, TensorDictBase
from tensordict.nn.utils import _set_dispatch_td_nn_modules

from .._compile import opaque_to_compile
from .._releases import keywords_since, since
from .._torchrl_lookup import torchrl_twin
from ..samplers import PrioritizedSampler
from ..utils import _reduce
from . import _prioritized_sync as _sync
from .prioritized import _given, PRIORITIZED_BUFFER_KEYWORDS, PrioritizedReplayBuffer
from .tensordict import TensorDictReplayBuffer


class TensorDictPrioritizedReplayBuffer(
    TensorDictReplayBuffer, *torchrl_twin("replay_buffers", "TensorDictPrioritizedReplayBuffer")
):
    """TensorDict-specific wrapper around the :class:`~torchrl_compat.PrioritizedReplayBuffer` class.

    This class returns tensordicts with a new key ``"index"`` that represents
    the index of each element in the replay buffer, and ``"priority_weight"``, the
    importance weight of each element. It also provides the
    :meth:`~.update_tensordict_priority` method that only requires for the
    tensordict to be passed to it with its new priority value.

    Keyword Args:
        alpha (:obj:`float`): exponent α determines how much prioritization is used,
            with α = 0 corresponding to the uniform case.
        beta (:obj:`float`): importance sampling negative exponent.
        priority_key (str, optional): the key at which priority is assumed to
            be stored within TensorDicts added to this ReplayBuffer.
            Defaults to ``"td_error"``.
        eps (:obj:`float`): delta added to the priorities to ensure that the buffer
            does not contain null priorities.
        storage (Storage, Callable[[], Storage], optional): the storage to be used.
            If none is provided a default :class:`~torchrl_compat.ListStorage` with
            ``max_size`` of ``1_000`` will be created.
        sample_unit (SampleUnit, optional): what one sampled element is (torchrl 0.14+).
            Defaults to ``None``.
        sampler_device (torch.device or str, optional): the device of the priority trees
            (torchrl 0.13+). Defaults to ``None`` (the trees follow a CUDA storage).
        sync (bool, optional): whether the priority sampler is the buffer's (torchrl 0.13+);
            see :class:`~torchrl_compat.PrioritizedReplayBuffer`. With ``False``, writes do
            not set priorities (the learner's sampler gives new items the default priority
            when it catches up). Defaults to ``True``.
        collate_fn (callable, optional): merges a list of samples to form a
            mini-batch of Tensor(s)/outputs.
        pin_memory (bool): whether pin_memory() should be called on the rb
            samples.
        prefetch (int, optional): number of next batches to be prefetched
            using multithreading. Defaults to None (no prefetching).
        transform (Transform or Callable[[Any], Any], optional): Transform to be executed when
            :meth:`sample` is called.
        reduction (str, optional): the reduction method for multidimensional
            tensordicts (ie stored trajectories). Can be one of "max", "min",
            "median" or "mean".
        batch_size (int, optional): the batch size to be used when sample() is
            called.
        dim_extend (int, optional): indicates the dim to consider for
            extension when calling :meth:`~.extend`. Defaults to ``storage.ndim-1``.
        generator (torch.Generator, optional): a generator to use for sampling.
            Defaults to ``None`` (global default generator).
        shared (bool, optional): whether the buffer will be shared using multiprocessing or not.
            Defaults to ``False``.
        compilable (bool, optional): whether the writer is compilable.
            If ``True``, the writer cannot be shared between multiple processes.
            Defaults to ``False``.
        transport (str, optional): the transport of a remote buffer owner (torchrl 0.14+).
            Defaults to ``"auto"``.
        transport_options (dict, optional): its options (torchrl 0.14+). Defaults to ``None``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
        >>> rb = TensorDictPrioritizedReplayBuffer(
        ...     alpha=0.7, beta=1.1, storage=LazyTensorStorage(10), batch_size=5)
        >>> data = TensorDict({"a": torch.ones(10, 3), ("b", "c"): torch.zeros(10, 3, 1)}, [10])
        >>> _ = rb.extend(data)
        >>> sample = rb.sample()
        >>> sorted(sample.keys())
        ['a', 'b', 'index', 'priority_weight']
        >>> # give a high priority to these samples...
        >>> _ = sample.set("td_error", 100 * torch.ones(sample.shape))
        >>> rb.update_tensordict_priority(sample)
        >>> # ...which the next batch is mostly made of
        >>> bool(torch.isin(rb.sample()["index"], sample["index"]).any())
        True
    """

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        priority_key: str = "td_error",
        eps: float = 1e-8,
        storage: Any | None = None,
        sample_unit: Any | None = None,
        sampler_device: Any | None = None,
        sync: bool = True,
        collate_fn: Callable | None = None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        transform: Any | None = None,  # noqa-F821
        reduction: str = "max",
        batch_size: int | None = None,
        dim_extend: int | None = None,
        generator: torch.Generator | None = None,
        shared: bool = False,
        compilable: bool = False,
        transport: str = "auto",
        transport_options: dict[str, Any] | None = None,
    ) -> None:
        storage = self._maybe_make_storage(storage, compilable=compilable)
        device = {} if sampler_device is None else {"device": sampler_device}
        sampler = PrioritizedSampler(storage.max_size, alpha, beta, eps, reduction=reduction, **device)
        self._sync = sync
        self._prioritized_sampler_write_count = 0
        sampler, self._prioritized_sampler = _sync.prioritized_sampler_for(storage, sampler, sync, type(self).__name__)
        super().__init__(
            priority_key=priority_key,
            storage=storage,
            sampler=sampler,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            prefetch=prefetch,
            transform=transform,
            batch_size=batch_size,
            dim_extend=dim_extend,
            generator=generator,
            shared=shared,
            compilable=compilable,
            **_given(sample_unit=(sample_unit, None), transport=(transport, "auto"),
                     transport_options=(transport_options, None)),
        )

    __init__ = keywords_since(__init__, PRIORITIZED_BUFFER_KEYWORDS)

    # ---- sync=False (torchrl 0.13+): a local prioritized sampler catching up with writes
    prioritized_sampler = PrioritizedReplayBuffer.prioritized_sampler

    def _catch_up_prioritized_sampler(self) -> None:
        _sync.catch_up(self)

    def _sample(self, batch_size: int):
        if self.__dict__.get("_sync", True):
            return super()._sample(batch_size)
        return _sync.sample_local(self, batch_size)

    def empty(self, empty_write_count: bool = True):
        super().empty(empty_write_count=empty_write_count)
        if not self.__dict__.get("_sync", True):
            _sync.local_sampler(self)._empty()
            self._prioritized_sampler_write_count = 0

    def set_rng(self, generator) -> None:
        super().set_rng(generator)
        if not self.__dict__.get("_sync", True) and self.__dict__.get("_prioritized_sampler") is not None:
            self._prioritized_sampler._rng = generator

    def __getstate__(self):
        return _sync.state_for_pickling(self, super().__getstate__())

    @opaque_to_compile
    def add(self, data: TensorDictBase) -> int:
        if self.__dict__.get("_sync", True):
            return super().add(data)
        # A writer sets no priority: the learner's sampler catches up with the write.
        if self._delayed_init and not self._initialized:
            self._init()
        with _set_dispatch_td_nn_modules(is_tensor_collection(data)):
            data = self._inverse(data)
        if data is None:
            return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        index = self._add(data)
        if index is not None and is_tensor_collection(data):
            self._set_index_in_td(data, index)
        return index

    @opaque_to_compile
    def extend(self, tensordicts: TensorDictBase, *, update_priority: bool | None = None) -> torch.Tensor:
        if self.__dict__.get("_sync", True):
            return super().extend(tensordicts, update_priority=update_priority)
        if update_priority:
            raise RuntimeError(
                f"{type(self).__name__}.extend does not support updating priorities from writer "
                "processes. Call update_tensordict_priority from the learner process instead."
            )
        return super().extend(tensordicts, update_priority=False)

    if since("prioritized_device_argument"):
        # (from torchrl 0.13, as PrioritizedReplayBuffer's) with sync=False, into the
        # learner's prioritized sampler, not the writers' uniform one
        def update_priority(self, index, priority) -> None:
            if self.__dict__.get("_sync", True):
                return super().update_priority(index, priority)
            _sync.update_local(self, index, priority)

        update_priority._replay_buffer_s_when_synced = True

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        if self.__dict__.get("_sync", True):
            return super().update_tensordict_priority(data)
        # The learner's sampler takes the priorities (the buffer's sampler is uniform).
        # update_priority and the priority readers are not overridden for this: the buffer's
        # fast update path is kept only for the classes' own methods.
        sampler = self.prioritized_sampler
        priority = data.get(self.priority_key, None)
        if priority is None:
            priority = torch.as_tensor(sampler.default_priority, dtype=torch.float)
            priority = priority.expand(data.shape[0]) if data.ndim else priority
        elif data.ndim:
            priority = _reduce(priority.reshape(priority.shape[0], -1), sampler.reduction, dim=1)
        elif priority.numel() > 1:
            priority = torch.as_tensor(_reduce(priority, sampler.reduction))
        if data.ndim:
            # a Sequence sample's windows: each anchor gets its valid records' largest priority
            anchored = self._anchor_reduced_priority(data, priority)
            if anchored is not None:
                return _sync.update_local(self, *anchored)
        index = data.get("index")
        while index.shape != priority.shape:
            index = index[..., 0]
        _sync.update_local(self, index, priority)
