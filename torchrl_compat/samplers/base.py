""":class:`Sampler`, the base of every sampler."""
from __future__ import annotations

import warnings
from abc import ABC, ABCMeta, abstractmethod
from copy import copy
from typing import Any

import torch

from .._releases import since
from .._torchrl_lookup import torchrl_twin
from ..storages import Storage

_TWIN = torchrl_twin("samplers", "Sampler")

# A sampler class -> its without-replacement counterpart, read by :class:`_SamplerMeta`
# (filled in by the package's ``__init__`` once both are defined).
_REPLACEMENT_DISPATCH: dict[type, type] = {}


class _SamplerMeta(type(_TWIN[0]) if _TWIN else ABCMeta):
    """Metaclass that sends ``Cls(replacement=False, ...)`` to ``Cls``'s without-replacement
    counterpart (:data:`_REPLACEMENT_DISPATCH`), from the release that has the argument.

    ``replacement=True`` builds ``Cls`` itself; ``replacement=False`` on a class with no such
    counterpart raises a :class:`TypeError`, unless the class is itself one. It derives from
    torchrl's metaclass when torchrl has one, whose dispatch table only knows torchrl's classes.
    """

    # before 0.13 no __call__ of its own: ``inspect.signature`` then reads ``__init__``, as on
    # torchrl's classes of that release
    if since("sampler_replacement_argument"):

        def __call__(cls, *args, **kwargs):
            return _dispatch_replacement(cls, super(), args, kwargs)


def _dispatch_replacement(cls, meta_super, args, kwargs):
    """:class:`_SamplerMeta`'s call: ``replacement=`` popped and acted on."""
    if "replacement" in kwargs:
        replacement = kwargs.pop("replacement")
        if not replacement:
            counterpart = _REPLACEMENT_DISPATCH.get(cls)
            if counterpart is not None:
                return counterpart(*args, **kwargs)
            if cls not in _REPLACEMENT_DISPATCH.values():
                raise TypeError(
                    f"{cls.__name__} has no without-replacement variant; "
                    "cannot be instantiated with replacement=False."
                )
    return meta_super.__call__(*args, **kwargs)


class Sampler(*(_TWIN or (ABC,)), metaclass=_SamplerMeta):
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

    def _sampleable_count(self, storage: Storage, batch_size: int) -> int | torch.Tensor:
        # how many items a batch can be drawn from now
        return len(storage)

    def can_sample(self, storage: Storage, batch_size: int) -> bool:
        """Returns whether the sampler can draw the requested batch."""
        count = self._sampleable_count(storage, batch_size)
        if isinstance(count, torch.Tensor):
            return bool(count.gt(0).item())
        return count > 0

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

# Before 0.14 samplers have no can_sample.
if not since("sampler_can_sample"):
    del Sampler.can_sample
