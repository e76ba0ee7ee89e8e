""":class:`PrioritizedReplayBuffer`: a replay buffer with a prioritized sampler."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchrl_compat._torchrl_lookup import torchrl_twin
from torchrl_compat.samplers import PrioritizedSampler
from torchrl_compat.storages import ListStorage
from .base import ReplayBuffer


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
        collate_fn: Callable | None = None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        transform: Any | None = None,  # noqa-F821
        batch_size: int | None = None,
        dim_extend: int | None = None,
        delayed_init: bool = False,
    ) -> None:
        if storage is None:
            storage = ListStorage(max_size=1_000)
        if sampler is None:
            sampler = PrioritizedSampler(storage.max_size, alpha, beta, eps, dtype)
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
        )
