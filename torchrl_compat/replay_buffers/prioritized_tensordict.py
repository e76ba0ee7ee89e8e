""":class:`TensorDictPrioritizedReplayBuffer`: a prioritized replay buffer of TensorDicts."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchrl_compat._torchrl_lookup import torchrl_twin
from torchrl_compat.samplers import PrioritizedSampler
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
    ) -> None:
        storage = self._maybe_make_storage(storage, compilable=compilable)
        sampler = PrioritizedSampler(storage.max_size, alpha, beta, eps, reduction=reduction)
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
        )
