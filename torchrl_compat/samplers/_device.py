"""The prioritized samplers' steady state on an accelerator, with no host synchronisation.

:func:`update_priority_nonblocking` and :func:`draw_nonblocking` are what
``PrioritizedSampler.update_priority`` and ``sample`` compute, by torchrl 0.11's rules (see
:mod:`torchrl_compat.samplers._priorities`), for a flat index and priorities on the trees' device:

* what can be checked from shapes, dtypes and devices is checked at once;
* what needs the device's data (an index past the trees, a priority that is NaN, negative,
  infinite or whose stored value ``(priority + eps) ** alpha`` is not finite in the trees'
  dtype, a draw with no positive priority) is checked on the device: a bad update is masked
  there (neither tree nor the largest priority changes) and the error is raised by a later
  non-blocking call on the same trees, once the status has reached the host (usually the
  next call), or by ``sum_tree.check_errors()``;
* indices below 0 (``-1`` marks items a writer skipped) are dropped, as torchrl drops them.

The largest priority is kept as a pair of 0-d device tensors ``(priority, index)``; before
any update the priority is NaN, which :func:`default_priority` reads as torchrl reads
``None`` (a default of ``(1 + eps) ** alpha``).
"""
from __future__ import annotations

import numpy as np
import torch

from torchrl_compat._torch_ops.sumtree import _ZERO_MINIMUM, _TorchMinSegmentTree, _TorchSumSegmentTree

__all__ = [
    "default_priority",
    "device_uniforms",
    "draw_nonblocking",
    "initial_max_priority",
    "sampleable_status",
    "update_priority_nonblocking",
]


def initial_max_priority(device, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The largest-priority pair before any update: ``(nan, -1)`` on ``device`` (the
    priority of ``dtype``, by default torch's default dtype)."""
    return (
        torch.full((), float("nan"), dtype=dtype or torch.get_default_dtype(), device=device),
        torch.full((), -1, dtype=torch.long, device=device),
    )


def default_priority(max_priority: tuple[torch.Tensor, torch.Tensor], eps, alpha, *, raw: bool = False) -> torch.Tensor:
    """torchrl's ``default_priority`` as a 0-d tensor on the device: ``(max + eps) ** alpha``
    (torchrl 0.11, 0.12) or, with ``raw``, the largest priority itself (0.13 on); ``max`` is 1
    before any update."""
    highest = max_priority[0]
    highest = torch.where(torch.isnan(highest), torch.ones_like(highest), highest)
    return highest if raw else (highest + eps) ** alpha


def device_uniforms(batch_size: int, device: torch.device, generator) -> torch.Tensor:
    """``batch_size`` draws in ``[0, 1)`` on ``device``, from the RNG torchrl's prioritized
    sampler takes them from there, with no host synchronisation: the generator when one is
    given (drawn on its device, then copied without waiting); else numpy's global RNG on CPU
    (the stream of torchrl's ``np.random.uniform(0.0, p_sum, batch_size)``) and the device's
    default torch generator on an accelerator (torchrl 0.14's
    ``torch.rand(batch_size, device=tree_device)``)."""
    if generator is not None:
        uniform = torch.rand(batch_size, generator=generator, device=generator.device)
        return uniform if uniform.device == device else uniform.to(device, non_blocking=True)
    if device.type == "cpu":
        return torch.from_numpy(np.random.random_sample(batch_size))
    return torch.rand(batch_size, device=device)


def sampleable_status(sum_tree: _TorchSumSegmentTree, min_tree: _TorchMinSegmentTree, num_valid: int) -> torch.Tensor:
    """A 0-d bool tensor on the trees' device: whether a draw among the first ``num_valid``
    items has a positive ``p_sum`` and ``p_min`` (what :func:`draw_nonblocking` checks after
    drawing, for callers that can read it for free before taking random numbers)."""
    end = sum_tree.capacity if num_valid >= sum_tree.size else num_valid
    p_sum = sum_tree._range_reduce(0, min(num_valid, end))
    p_min = min_tree._range_reduce(0, end)
    return (p_sum > 0) & (p_min > 0)


def update_priority_nonblocking(
    sum_tree: _TorchSumSegmentTree,
    min_tree: _TorchMinSegmentTree,
    index: torch.Tensor,
    priority: torch.Tensor,
    max_priority: tuple[torch.Tensor, torch.Tensor],
    *,
    eps: float,
    alpha: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stores ``(priority + eps) ** alpha`` at ``index`` in both trees; returns the new
    largest-priority pair. One sort serves both trees. No host synchronisation.

    Args:
        sum_tree, min_tree: the sampler's torch-op trees (one device, one capacity).
        index (torch.Tensor): 1-D int64 flat storage positions, on the trees' device.
        priority (torch.Tensor): one floating priority, or one per index, on that device.
        max_priority (tuple): the current largest-priority pair (see the module docstring).

    Keyword Args:
        eps (float): added to every priority before the power.
        alpha (float): the power.
    """
    sum_tree._checks.raise_ready()
    if index.ndim != 1:
        raise ValueError(f"index must be 1-D here, got shape {tuple(index.shape)}")
    if not priority.is_floating_point():
        priority = priority.to(torch.get_default_dtype())
    idx, _ = sum_tree._nonblocking_operands(index, priority)  # shapes, dtypes, devices
    if not idx.numel():
        return max_priority
    # The stored value in the priority's dtype, as torchrl computes it (then cast by the trees).
    priority = priority.detach().reshape(-1)
    if priority.numel() == 1:
        priority = priority.expand(idx.shape)
    keep = idx >= 0
    value = torch.pow(priority + eps, alpha)
    # Dropped entries are neither checked nor written (torchrl filters them out first). A
    # priority that is NaN, negative or infinite is refused whatever alpha makes of it
    # (alpha == 0 maps every priority to 1): the tree's value check sees the priority then.
    good_priority = torch.isfinite(priority) & (priority >= 0)
    checked_index = torch.where(keep, idx, 0)
    stored = value.to(sum_tree.dtype).double()  # what the trees would hold
    checked_value = torch.where(keep, torch.where(good_priority, stored, priority.double()), 0)
    accept = sum_tree._record_checks(checked_index, checked_value)
    plan = sum_tree._plan(idx, accept, keep)
    sum_tree._apply(plan, value)
    min_tree._apply(plan, value)
    candidates = torch.where(keep, priority, float("-inf"))
    highest, position = candidates.max(0)
    current, current_index = max_priority
    # The dtype torchrl keeps is that of whichever priority wins, which only the device
    # knows: the incoming priorities' (the same as the current one's in a steady loop).
    dtype = highest.dtype
    higher = accept & keep.any() & ((highest > current) | torch.isnan(current))
    return (
        torch.where(higher, highest.to(dtype), current.to(dtype)),
        torch.where(higher, idx[position.reshape(1)].squeeze(0), current_index),
    )


def draw_nonblocking(
    sum_tree: _TorchSumSegmentTree,
    min_tree: _TorchMinSegmentTree,
    num_valid: int,
    beta: float,
    uniform: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index, weight)`` of prioritized draws among the first ``num_valid`` items, with
    the importance weights ``(p_i / p_min) ** -beta``. No host synchronisation: a draw with
    no positive priority (or a zero ``p_min``) raises at a later non-blocking call."""
    index, priority, _ = sum_tree.draw_nonblocking(uniform, num_valid)
    # torchrl's p_min: query(0, num_valid), every leaf below the capacity once it reaches size
    end = sum_tree.capacity if num_valid >= sum_tree.size else num_valid
    p_min = min_tree._range_reduce(0, end)
    code = torch.where(p_min > 0, 0, _ZERO_MINIMUM).double()
    status = torch.stack([code, torch.full_like(code, float(min(num_valid, end))), p_min.double()])
    sum_tree._checks.record(status, sum_tree._deferred_error)
    return index, torch.pow(priority / p_min, -beta)
