""":class:`PrioritizedReplayBuffer`: a replay buffer with a prioritized sampler."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._releases import keywords_since, since
from .._torchrl_lookup import torchrl_twin
from ..samplers import PrioritizedSampler
from ..storages import ListStorage
from . import _prioritized_sync as _sync
from .base import ReplayBuffer


# The prioritized buffers' keywords that only some torchrl releases take, and the behaviour
# that brings each.
PRIORITIZED_BUFFER_KEYWORDS = {
    "sampler_device": "prioritized_device_argument",
    "sync": "prioritized_device_argument",
    "sample_unit": "prioritized_buffer_transport",
    "transport": "prioritized_buffer_transport",
    "transport_options": "prioritized_buffer_transport",
}


class PrioritizedReplayBuffer(ReplayBuffer, *torchrl_twin("replay_buffers", "PrioritizedReplayBuffer")):
    """Prioritized replay buffer.

    All arguments are keyword-only arguments.

    Presented in "Schaul, T.; Quan, J.; Antonoglou, I.; and Silver, D. 2015.
    Prioritized experience replay." (https://arxiv.org/abs/1511.05952)

    Args:
        alpha (:obj:`float`): exponent α determines how much prioritization is used,
            with α = 0 corresponding to the uniform case.
        beta (:obj:`float`): importance sampling negative exponent.
        eps (:obj:`float`): delta added to the priorities to ensure that the buffer
            does not contain null priorities.
        dtype (torch.dtype): the precision of the priority trees. Defaults to ``torch.float``.
        storage (Storage, optional): the storage to be used. If none is provided
            a default :class:`~torchrl_compat.ListStorage` with
            ``max_size`` of ``1_000`` will be created.
        sampler (Sampler, optional): the sampler to be used. If none is provided,
            a default :class:`~torchrl_compat.PrioritizedSampler` with
            ``alpha``, ``beta``, and ``eps`` will be created.
        sample_unit (SampleUnit, optional): what one sampled element is (torchrl 0.14+),
            passed to the buffer. Defaults to ``None``.
        sampler_device (torch.device or str, optional): the device of the priority trees
            (torchrl 0.13+). Defaults to ``None``: a CUDA storage selects CUDA sampling, a
            CPU storage CPU sampling. Cannot be used together with ``sampler``.
        sync (bool, optional): whether the priority sampler is the buffer's (torchrl 0.13+).
            With ``False``, writers use a shareable :class:`~torchrl_compat.RandomSampler`
            and the learner owns a local prioritized sampler that gives the items written
            since its last sample the default priority before sampling (1-D storages only).
            Defaults to ``True``.
        collate_fn (callable, optional): merges a list of samples to form a
            mini-batch of Tensor(s)/outputs. The default value will be decided
            based on the storage type.
        pin_memory (bool): whether pin_memory() should be called on the rb
            samples.
        prefetch (int, optional): number of next batches to be prefetched
            using multithreading. Defaults to None (no prefetching).
        transform (Transform, optional): Transform to be executed when
            sample() is called.
        batch_size (int, optional): the batch size to be used when sample() is
            called.
        dim_extend (int, optional): indicates the dim to consider for
            extension when calling :meth:`extend`. Defaults to ``storage.ndim-1``.
        delayed_init (bool, optional): whether to initialize storage, writer, sampler and transform
            the first time the buffer is used rather than during construction.
            Defaults to ``False``.
        transport (str, optional): the transport of a remote buffer owner (torchrl 0.14+),
            passed to the buffer. Defaults to ``"auto"``.
        transport_options (dict, optional): its options (torchrl 0.14+). Defaults to ``None``.

    .. note::
        Generic prioritized replay buffers (ie. non-tensordict backed) require
        calling :meth:`~.sample` with the ``return_info`` argument set to
        ``True`` to have access to the indices, and hence update the priority.

    Examples:
        >>> import torch
        >>> from torchrl_compat import ListStorage, PrioritizedReplayBuffer
        >>> rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.9, storage=ListStorage(10))
        >>> _ = rb.extend(torch.arange(10))
        >>> sample, info = rb.sample(5, return_info=True)
        >>> sorted(info)
        ['index', 'priority_weight']
        >>> rb.update_priority(info["index"], torch.full((5,), 5.0))
    """

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        storage: Any | None = None,
        sampler: Any | None = None,
        sample_unit: Any | None = None,
        sampler_device: Any | None = None,
        sync: bool = True,
        collate_fn: Callable | None = None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        transform: Any | None = None,  # noqa-F821
        batch_size: int | None = None,
        dim_extend: int | None = None,
        delayed_init: bool = False,
        transport: str = "auto",
        transport_options: dict[str, Any] | None = None,
    ) -> None:
        if storage is None:
            storage = ListStorage(max_size=1_000)
        if sampler is None:
            device = {} if sampler_device is None else {"device": sampler_device}
            sampler = PrioritizedSampler(storage.max_size, alpha, beta, eps, dtype, **device)
        elif sampler_device is not None:
            raise TypeError("sampler_device cannot be passed when sampler is provided.")
        self._sync = sync
        self._prioritized_sampler_write_count = 0
        sampler, self._prioritized_sampler = _sync.prioritized_sampler_for(storage, sampler, sync, type(self).__name__)
        super().__init__(
            storage=storage,
            sampler=sampler,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            prefetch=prefetch,
            transform=transform,
            batch_size=batch_size,
            dim_extend=dim_extend,
            delayed_init=delayed_init,
            # The buffer's own 0.14 arguments, passed only when set (their defaults are its).
            **_given(sample_unit=(sample_unit, None), transport=(transport, "auto"),
                     transport_options=(transport_options, None)),
        )

    __init__ = keywords_since(__init__, PRIORITIZED_BUFFER_KEYWORDS)

    # ---- sync=False (torchrl 0.13+): a local prioritized sampler catching up with writes
    @property
    def prioritized_sampler(self):
        """The sampler that owns the priority trees."""
        return _sync.local_sampler(self)

    def _catch_up_prioritized_sampler(self) -> None:
        _sync.catch_up(self)

    def _sample(self, batch_size: int):
        if self.__dict__.get("_sync", True):
            return super()._sample(batch_size)
        return _sync.sample_local(self, batch_size)

    if since("prioritized_device_argument"):
        # (from torchrl 0.13, with sync=False: before, ReplayBuffer's, as its errors say)
        def update_priority(self, index, priority) -> None:
            if self.__dict__.get("_sync", True):
                return super().update_priority(index, priority)
            _sync.update_local(self, index, priority)

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


def _given(**value_and_default) -> dict[str, Any]:
    """The keyword arguments whose value is not their default."""
    return {name: value for name, (value, default) in value_and_default.items() if value != default}
