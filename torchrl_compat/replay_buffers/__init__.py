"""Replay buffers (stand-in for ``torchrl.data.replay_buffers.replay_buffers``).

A replay buffer composes a storage (where items live), a writer (where new items go), a
sampler (which items a batch holds) and a transform chain. The classes have the
followed torchrl release's names, signatures, defaults, ``state_dict`` / ``dumps`` / ``loads`` layouts,
return values and errors, and work with our storages, samplers and writers as with
torchrl's; checkpoints cross between torchrl's buffers and ours in both directions.

What a user calls in a training loop runs on short paths (see the ``.. note::`` blocks of
:class:`ReplayBuffer` and :class:`TensorDictReplayBuffer`): round-robin writes copy each
leaf into at most two row slices, samples are gathered leaf by leaf with the info
entries already in place, and nothing the constructor knows is recomputed per call.

.. note:: When torchrl is importable (and ``TORCHRL_COMPAT_STANDALONE`` is not ``"1"``)
    every buffer class also lists its torchrl twin as its last base, and the transform
    chain is torchrl's ``Compose``, so that torchrl transforms behave as in torchrl's
    buffers. Without torchrl, transforms are callables on the sampled data (see
    :meth:`ReplayBuffer.append_transform`). ``RemoteTensorDictReplayBuffer`` (torch RPC) is
    not provided; ``RayReplayBuffer`` is :mod:`torchrl_compat.ray_buffer`'s (sharded), which
    ``service_backend="ray"`` builds when the followed release has that argument (0.14).
"""
from __future__ import annotations

from .base import (
    _RL_WARNINGS as _RL_WARNINGS,
    _NO_LOCK as _NO_LOCK,
    _COMPOSE_LEN as _COMPOSE_LEN,
    _EMPTY_STORAGE_ERROR as _EMPTY_STORAGE_ERROR,
    _PLAIN_RAND_GIVEN_NDIM as _PLAIN_RAND_GIVEN_NDIM,
    PRIORITIZED_SAMPLERS,
    _identity_collates as _identity_collates,
    _IDENTITY_COLLATES as _IDENTITY_COLLATES,
    _IN_RANGE_SAMPLERS as _IN_RANGE_SAMPLERS,
    _ReadPlan as _ReadPlan,
    _default_collate as _default_collate,
    _component as _component,
    _maybe_delay_init as _maybe_delay_init,
    _on_cpu as _on_cpu,
    _stacked as _stacked,
    _info_to as _info_to,
    ReplayBuffer,
)
from .prioritized import (
    PrioritizedReplayBuffer,
)
from .tensordict import (
    TensorDictReplayBuffer,
)
from .prioritized_tensordict import (
    TensorDictPrioritizedReplayBuffer,
)
from .deprecated import (
    InPlaceSampler,
    stack_tensors,
)
from .ensemble import (
    ReplayBufferEnsemble,
)

__all__ = [
    "InPlaceSampler",
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
    "ReplayBufferEnsemble",
    "TensorDictPrioritizedReplayBuffer",
    "TensorDictReplayBuffer",
    "stack_tensors",
]

# the result of ReplayBuffer.update_if_present, exported from the release that has it
from ._conditional_update import ConditionalUpdateResult  # noqa: E402
from .._releases import since  # noqa: E402

if since("buffer_conditional_update"):
    __all__.append("ConditionalUpdateResult")

# Classes and functions keep the module path they had before the split, so pickles and
# torchrl-style ``__module__`` lookups find them here.
for _export in (
    _RL_WARNINGS,
    _NO_LOCK,
    _COMPOSE_LEN,
    _EMPTY_STORAGE_ERROR,
    _PLAIN_RAND_GIVEN_NDIM,
    PRIORITIZED_SAMPLERS,
    _identity_collates,
    _IDENTITY_COLLATES,
    _IN_RANGE_SAMPLERS,
    _ReadPlan,
    _default_collate,
    _component,
    _maybe_delay_init,
    _on_cpu,
    _stacked,
    _info_to,
    ReplayBuffer,
    PrioritizedReplayBuffer,
    TensorDictReplayBuffer,
    TensorDictPrioritizedReplayBuffer,
    InPlaceSampler,
    stack_tensors,
    ReplayBufferEnsemble,
):
    if getattr(_export, "__module__", "").startswith(__name__ + "."):
        _export.__module__ = __name__
del _export
