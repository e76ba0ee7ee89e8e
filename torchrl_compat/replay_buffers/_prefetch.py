"""The prefetch queue's state, as torchrl 0.14 saves it with a buffer: ``{"version": 1,
"capacity": <prefetch>, "queue": (<(batch, info)>, ...)}``, the batches sampled ahead and not
handed out yet, in order. A buffer restored from it hands out the same batches next."""
from __future__ import annotations

from concurrent.futures import Future
from copy import deepcopy
from typing import Any

import torch
from tensordict import is_tensor_collection
from torch.utils._pytree import tree_map

from torchrl_compat.utils import INT_CLASSES

__all__ = ["PREFETCH_STATE_VERSION", "clone_result", "completed_futures", "check_prefetch_state"]

PREFETCH_STATE_VERSION = 1


def clone_result(result: Any) -> Any:
    """A copy of a sampled ``(batch, info)`` that shares no tensor with it (tensors detached
    and cloned, keeping ``requires_grad``; objects seen twice copied once)."""
    memo = {}

    def clone_leaf(value):
        key = id(value)
        if key in memo:
            return memo[key]
        if isinstance(value, torch.Tensor):
            cloned = value.detach().clone()
            if value.requires_grad:
                cloned.requires_grad_()
        elif is_tensor_collection(value):
            cloned = value.apply(clone_leaf)
        else:
            cloned = deepcopy(value, memo)
        memo[key] = cloned
        return cloned

    return tree_map(clone_leaf, result)


def completed_futures(queue, *, clone: bool = True) -> list:
    """The saved ``queue`` as futures already done, to put in a buffer's prefetch queue."""
    futures = []
    for result in queue:
        future = Future()
        future.set_result(clone_result(result) if clone else result)
        futures.append(future)
    return futures


def check_prefetch_state(state, prefetch_cap: int, prefetching: bool) -> None:
    """Checks a saved prefetch state against a buffer prefetching ``prefetch_cap`` batches.

    Raises:
        TypeError: ``state`` is not a dict, or its queue not a list or tuple.
        RuntimeError: an unknown version, another capacity, or a non-empty queue for a
            buffer that does not prefetch.
        ValueError: a capacity that is not a non-negative int, or more batches than it.
    """
    if state is None:
        return
    if not isinstance(state, dict):
        raise TypeError("The prefetch state must be a dictionary.")
    if state.get("version") != PREFETCH_STATE_VERSION:
        raise RuntimeError(f"Unsupported prefetch state version: {state.get('version')}.")
    capacity = state.get("capacity")
    if isinstance(capacity, bool) or not isinstance(capacity, INT_CLASSES) or capacity < 0:
        raise ValueError("The saved prefetch capacity must be a non-negative integer.")
    capacity = int(capacity)
    if capacity != int(prefetch_cap):
        raise RuntimeError(
            f"Cannot restore a prefetch queue with capacity {capacity} into a "
            f"replay buffer with capacity {prefetch_cap}."
        )
    queue = state.get("queue")
    if not isinstance(queue, (list, tuple)):
        raise TypeError("The saved prefetch queue must be a list or tuple.")
    if len(queue) > capacity:
        raise ValueError(
            f"The saved prefetch queue contains {len(queue)} entries but its capacity is {capacity}."
        )
    if queue and not prefetching:
        raise RuntimeError("Cannot restore a non-empty prefetch queue when prefetching is disabled.")
