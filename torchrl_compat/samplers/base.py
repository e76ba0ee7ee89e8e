""":class:`Sampler`, the base of every sampler."""
from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from copy import copy
from typing import Any

import torch

from .._torchrl_lookup import torchrl_twin
from ..storages import Storage


class Sampler(*(torchrl_twin("samplers", "Sampler") or (ABC,))):
    """A generic sampler base class for composable Replay Buffers."""

    # Some samplers - mainly those without replacement -
    # need to keep track of the number of remaining batches
    _remaining_batches = int(torch.iinfo(torch.int64).max)

    # The RNG is set by the replay buffer
    _rng: torch.Generator | None = None

    # Private switch: ``False`` sends CPU samplers through the torch-op paths (those used on
    # accelerators) so that tests can compare them with the ``replay`` kernels.
    _use_cpu_kernels = True

    @abstractmethod
    def sample(self, storage: Storage, batch_size: int) -> tuple[Any, dict]:
        ...

    def add(self, index: int) -> None:
        return

    def extend(self, index: torch.Tensor) -> None:
        return

    def update_priority(
        self,
        index: int | torch.Tensor,
        priority: float | torch.Tensor,
        *,
        storage: Storage | None = None,
    ) -> dict | None:
        warnings.warn(
            f"Calling update_priority() on a sampler {type(self).__name__} that is not prioritized. Make sure this is the indented behavior."
        )
        return

    def mark_update(
        self, index: int | torch.Tensor, *, storage: Storage | None = None
    ) -> None:
        return

    @property
    def default_priority(self) -> float:
        return 1.0

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        ...

    @abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ...

    @property
    def ran_out(self) -> bool:
        # by default, samplers never run out
        return False

    @abstractmethod
    def _empty(self):
        ...

    @abstractmethod
    def dumps(self, path):
        ...

    @abstractmethod
    def loads(self, path):
        ...

    # ``loads`` in two steps, so that a sampler ensemble checks every member's checkpoint
    # before any member changes. Samplers with state on disk read and check it in
    # ``_read_checkpoint`` (changing nothing) and take it in ``_apply_checkpoint``.
    def _read_checkpoint(self, path):
        return path

    def _apply_checkpoint(self, state) -> None:
        self.loads(state)

    def __repr__(self):
        return f"{self.__class__.__name__}()"

    def __getstate__(self):
        # A generator cannot be pickled; the buffer sets it again after loading.
        state = copy(self.__dict__)
        state["_rng"] = None
        # Per-call caches, rebuilt on first use (they may hold a storage's tensors).
        for name in ("_shortest", "_trajectory_ends", "_preceding_of", "_info_keys_of", "_max_priority_record"):
            state.pop(name, None)
        return state
