"""Priority updates and prioritized draws, for :class:`PrioritizedSampler` and its slice variant.

The rules are torchrl's (``PrioritizedSampler.update_priority`` and ``sample``): a leaf
stores ``(priority + eps) ** alpha`` computed in torch, a draw takes a mass uniformly in
``query(0, len(storage))`` from the RNG torchrl takes it from, finds its leaf, clamps it to the storage and steps off zero
leaves, and the importance weight is ``(p_i / p_min) ** -beta``. Everything a call could
reject is checked before anything changes, and the trees refuse whole batches, so a rejected
call leaves the sampler as it was.
"""
from __future__ import annotations

import contextlib
import math
import threading

import numpy as np
import torch

import replay

from torchrl_compat.samplers._storage_reads import ravel
from torchrl_compat.samplers._trees import is_replay_tree, read_leaves
from torchrl_compat.samplers._trees import tree_dtype as trees_dtype_for
from torchrl_compat._torch_ops.sumtree import _TorchSumSegmentTree

__all__ = [
    "EpsOperand",
    "MaxPriorityRecord",
    "check_new_priorities",
    "check_sampleable",
    "check_update",
    "draw_with_kernel",
    "draw_with_torch",
    "draw_zeroed_with_kernel",
    "first_bad_priority",
    "generator_kept_on_failure",
    "kernel_seed",
    "largest_leaf",
    "ravel_rows",
    "stored_values",
    "torchrl_masses",
]

_UINT64_MASK = (1 << 64) - 1


_INT64_LOW, _INT64_HIGH = -(2**63), 2**63 - 1
# One 0-d int64 tensor per thread that kernel_seed fills: torch.randint(low, high, ()) fills a
# new one with the same random_ call (the same numbers), at twice the cost.
_SEED_BUFFERS = threading.local()


def kernel_seed(generator) -> int:
    """64 random bits from ``generator`` or, when it is ``None``, torch's global RNG: those of
    ``torch.randint(-2**63, 2**63 - 1, (), dtype=torch.int64)``.

    The kernels draw from their own xoshiro256** stream; seeding it from torch keeps
    ``torch.manual_seed`` (and the buffer's generator) in control of the samples.
    """
    buffer = getattr(_SEED_BUFFERS, "value", None)
    if buffer is None:
        buffer = _SEED_BUFFERS.value = torch.empty((), dtype=torch.int64)
    return buffer.random_(_INT64_LOW, _INT64_HIGH, generator=generator).item() & _UINT64_MASK


class EpsOperand:
    """``eps`` as ``priority.add`` should take it: for fp32 and fp64 priorities a cached 0-d
    tensor of their dtype (the same sum to the bit, as the Python float is cast to that dtype
    too; torch wraps a Python float into a tensor at every call, about 2 us), the Python float
    for other dtypes (half precision adds in float)."""

    __slots__ = ("_eps", "_tensors")

    def __init__(self) -> None:
        self._eps = None
        self._tensors = {}

    def __call__(self, eps, dtype):
        if dtype is not torch.float32 and dtype is not torch.float64:
            return eps
        if self._eps != eps:
            self._tensors = {kind: torch.tensor(float(eps), dtype=kind) for kind in (torch.float32, torch.float64)}
            self._eps = eps
        return self._tensors[dtype]


def _version_of(value):
    """What changes when ``value`` does: a tensor's version counter (bumped by every in-place
    op), ``None`` for a number. An inference tensor keeps no counter: a fresh object then,
    equal to no stored one, so that whatever depends on the value is derived again."""
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return value._version
    except RuntimeError:
        return object()


class MaxPriorityRecord:
    """A sampler's largest priority as its hot paths read it, derived once per value.

    ``highest`` is the largest priority as a Python float (``None`` before any update), which
    every update compares with its own largest. :meth:`default_write` gives what marking new
    items writes: torchrl's ``default_priority`` (``(max + eps) ** alpha``, or ``(1 + eps) **
    alpha`` without a max) and the value an update with that priority stores in the trees,
    ``(default + eps) ** alpha``, computed by the same torch ops as any update (so that the
    trees hold the same bits), once rather than at every write.

    A record describes one ``_max_priority`` state (the very tuple, its priority's version
    counter) under one ``alpha``, ``eps`` and torch default dtype (in which a float default
    becomes a tensor); :meth:`describes` says whether that still holds.
    """

    __slots__ = ("state", "version", "alpha", "eps", "default_dtype", "highest", "_default")

    def __init__(self, state, alpha, eps) -> None:
        self.state = state
        self.version = None if state is None else _version_of(state[0])
        self.alpha = alpha
        self.eps = eps
        self.default_dtype = torch.get_default_dtype()
        self.highest = None if state is None or state[0] is None else float(state[0])
        self._default = None

    def describes(self, state, alpha, eps) -> bool:
        return (
            state is self.state
            and alpha == self.alpha
            and eps == self.eps
            and (state is None or _version_of(state[0]) == self.version)
            and torch.get_default_dtype() is self.default_dtype
        )

    def default_write(self, default_priority, eps_operand: EpsOperand):
        """``(priority, as_float, stored)``: the default priority as the update path takes
        it (a 0-d CPU float tensor), as a float, and the value stored for it (a float, to be
        cast to the trees' dtype); ``None`` when the update path would not take it (then
        the general path writes it, and raises what torchrl raises).

        Args:
            default_priority (callable): returns the sampler's ``default_priority`` (called
                once per record).
            eps_operand (EpsOperand): the sampler's ``eps`` operand.
        """
        if self._default is None:
            self._default = self._derive(default_priority(), eps_operand) or False
        return self._default or None

    def _derive(self, priority, eps_operand: EpsOperand):
        if not isinstance(priority, torch.Tensor):
            if type(priority) is not float:
                return None  # an int priority keeps its dtype in the largest priority
            priority = torch.tensor(priority)
        priority = priority.detach()
        if not priority.is_cpu or not priority.is_floating_point() or priority.numel() != 1:
            return None
        priority = priority.reshape(())
        as_float = float(priority)
        if not (math.isfinite(as_float) and as_float >= 0):
            return None  # refused by the update, whose error names it
        stored = priority.add(eps_operand(self.eps, priority.dtype)).pow_(self.alpha)
        return priority, as_float, float(stored)


def stored_values(priority: torch.Tensor, eps, alpha, tree_dtype: torch.dtype) -> torch.Tensor:
    """``(priority + eps) ** alpha`` computed as torchrl computes it, checked to fit the trees:
    ValueError naming the priority when the value is not finite in ``tree_dtype`` (torchrl
    stores the inf, and every later ``default_priority`` and sample is then inf or NaN)."""
    value = torch.pow(priority + eps, alpha)
    if value.dtype.is_floating_point:
        bad = ~torch.isfinite(value.to(tree_dtype))
        if bool(bad.any()):
            flat = bad.reshape(-1)
            pos = int(flat.nonzero()[0, 0]) if flat.numel() > 1 else 0
            raise ValueError(
                f"priority={float(priority.reshape(-1)[pos])} at position {pos} cannot be stored: "
                f"(priority + eps) ** alpha with eps={eps}, alpha={alpha} is "
                f"{float(value.reshape(-1)[pos])}, which a {tree_dtype} tree cannot hold"
            )
    return value


def first_bad_priority(flat: torch.Tensor) -> int | None:
    """The position of the first priority of ``flat`` (1-D, real) that is not finite or is
    negative; ``None`` when all are good."""
    bad = (~torch.isfinite(flat) | (flat < 0)) if flat.is_floating_point() else flat < 0
    if not bool(bad.any()):
        return None
    return int(bad.nonzero()[0, 0])


def check_update(index: torch.Tensor, priority: torch.Tensor, capacity: int, max_capacity: int) -> None:
    """The checks of a priority update (``index`` holds only the kept, flat indices).

    Leaves ``[0, capacity)`` of torchrl's trees can be written (``capacity`` is the power of
    two above ``max_capacity``); past it torchrl writes outside its trees.
    """
    flat_index = index.reshape(-1)
    outside = (flat_index >= capacity) | (flat_index < 0)
    if bool(outside.any()):
        pos = int(outside.nonzero()[0, 0])
        raise IndexError(
            f"index {int(flat_index[pos])} at position {pos} is out of range for "
            f"max_capacity={max_capacity}: the priority trees hold {capacity} leaves"
        )
    if priority.is_complex():
        raise TypeError(f"priority must hold real numbers, got dtype {priority.dtype}")
    flat = priority.reshape(-1)
    if flat.dtype == torch.bool:
        return
    pos = first_bad_priority(flat)
    if pos is not None:
        raise ValueError(
            f"priority must be finite and non-negative, got priority={float(flat[pos])} "
            f"at position {pos}"
        )


def check_new_priorities(priority, sampler, entry) -> None:
    """Checks, before a batch is written, the priorities it carries (its ``entry``) as the
    prioritized ``sampler`` will take them once the batch is in: finite, non-negative, and
    ``(priority + eps) ** alpha`` within the trees' dtype. O(batch), vectorised. Not where
    the sampler's trees are on a device, which check there without waiting for it.

    Raises:
        ValueError: naming the priority, its position in the batch and the entry.
    """
    if not isinstance(priority, torch.Tensor) or priority.is_complex() or priority.dtype == torch.bool:
        return
    sum_tree = getattr(sampler, "_sum_tree", None)
    if (sum_tree is not None and not is_replay_tree(sum_tree)) or (
        sum_tree is None and priority.device.type != "cpu"
    ):
        # Trees on a device check priorities there, without waiting for the device: a bad
        # one is masked and raised at the next call (see PrioritizedSampler's note).
        return
    flat = priority.detach().reshape(-1)
    pos = first_bad_priority(flat)
    if pos is not None:
        raise ValueError(
            f"priority must be finite and non-negative, got priority={float(flat[pos])} at "
            f"position {pos} of the batch's {entry!r} entry"
        )
    try:
        stored_values(flat, sampler._eps, sampler._alpha, trees_dtype_for(sampler.dtype))
    except ValueError as err:
        raise ValueError(f"{err} (the batch's {entry!r} entry)") from None


def ravel_rows(index: torch.Tensor, shape) -> torch.Tensor:
    """Flat storage positions of the ``[N, ndim]`` coordinate rows ``index`` (torchrl's
    ``np.ravel_multi_index``); ValueError, as numpy raises there, for a row outside ``shape``."""
    if index.shape[-1] != len(shape):
        raise ValueError(
            f"index rows must have {len(shape)} coordinates for a storage of shape "
            f"{tuple(shape)}, got an index of shape {tuple(index.shape)}"
        )
    sizes = torch.as_tensor(tuple(shape), device=index.device)
    outside = ((index < 0) | (index >= sizes)).any(-1).reshape(-1)
    if bool(outside.any()):
        pos = int(outside.nonzero()[0, 0])
        raise ValueError(
            f"index {index.reshape(-1, len(shape))[pos].tolist()} at position {pos} is out of "
            f"range for a storage of shape {tuple(shape)}"
        )
    return ravel(index.unbind(-1), shape)


def largest_leaf(sum_tree, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(value, index)`` of the largest of the ``size`` leaves, as torchrl's rebuild of the
    max priority gives them, with one reduction instead of torchrl's Python loop over the
    capacity: a value of ``dtype`` (the trees' from torchrl 0.14 on), else of the default
    dtype (torchrl 0.11-0.13 build a tensor from Python floats)."""
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if is_replay_tree(sum_tree):
        leaves = sum_tree.values()
        maxidx = int(leaves.argmax())
        return torch.tensor(float(leaves[maxidx]), dtype=dtype), torch.tensor(maxidx)
    leaves = read_leaves(sum_tree, sum_tree.size)
    return leaves.to(dtype).max(0)


def check_sampleable(sum_tree, min_tree, num_valid: int) -> tuple[float, float]:
    """``(p_sum, p_min)`` of a draw among ``num_valid`` items, after torchrl's checks (made
    before any random draw, so a refused call consumes none)."""
    p_sum = sum_tree.query(0, num_valid)
    if not p_sum > 0:
        raise RuntimeError(
            f"non-positive p_sum: the priorities of the {num_valid} sampleable items sum to {p_sum}"
        )
    p_min = min_tree.query(0, num_valid)
    if not p_min > 0:
        raise RuntimeError(
            f"non-positive p_min: the smallest priority of the {num_valid} sampled items is {p_min}"
        )
    return p_sum, p_min


def torchrl_masses(batch_size: int, p_sum: float, generator) -> np.ndarray:
    """The prefix masses of ``batch_size`` prioritized draws, from the RNG torchrl's
    ``PrioritizedSampler.sample`` draws them from, with its arithmetic: numpy's global RNG
    (``np.random.uniform(0.0, p_sum, batch_size)``, float64) without a generator, else
    ``torch.rand(batch_size, generator=generator) * p_sum`` (float32)."""
    if generator is None:
        return np.random.uniform(0.0, p_sum, size=batch_size)
    return _cpu_rand(batch_size, generator).mul_(p_sum).numpy()


def _cpu_rand(batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """``torch.rand(batch_size, generator=generator)`` on the CPU (drawn on the generator's
    device, as the generator must)."""
    if generator.device.type == "cpu":
        return torch.rand(batch_size, generator=generator)
    return torch.rand(batch_size, generator=generator, device=generator.device).cpu()


@contextlib.contextmanager
def generator_kept_on_failure(generator):
    """Restores ``generator`` (torch's and numpy's global RNGs when ``None``) if the block
    raises: a draw that fails after taking its random numbers gives them back."""
    if generator is not None:
        state = generator.get_state()
    else:
        state = torch.random.get_rng_state(), np.random.get_state()
    try:
        yield
    except BaseException:
        if generator is not None:
            generator.set_state(state)
        else:
            torch.random.set_rng_state(state[0])
            np.random.set_state(state[1])
        raise


def draw_with_kernel(sum_tree, num_valid: int, p_min: float, beta: float, *, mass=None, uniform=None,
                     seed=None, batch_size=None):
    """``(index, weight)`` from one fused ``replay`` kernel call: descend, gather, divide.

    Reads O(batch * log(size)) tree nodes: no pass over the leaves. The draws land at the
    prefix masses ``mass`` or, without them, at ``uniform`` times the sum, or else at
    ``batch_size`` draws of the kernel's stream seeded with ``seed``. (Draws with excluded
    leaves: :func:`draw_zeroed_with_kernel`.)
    """
    # The kernel divides the priorities by p_min in the trees' precision (IEEE division:
    # what torch's div gives) and torch raises them to -beta, as torchrl does: the two
    # libraries then return the same weights to the bit (torch's vectorised pow and C's pow
    # can differ by one ulp).
    options = {
        "batch_size": None if uniform is not None else batch_size,
        "seed": seed,
        "relative_to": p_min,
    }
    try:
        index, priority, _ = sum_tree.sample_prioritized(num_valid, uniform, mass=mass, **options)
    except RuntimeError:
        raise RuntimeError(
            f"non-positive p_sum: no positive priority among the {num_valid} sampleable items"
        ) from None
    return torch.from_numpy(index), torch.from_numpy(priority).pow_(-beta)


def draw_zeroed_with_kernel(sum_tree, min_tree, num_valid: int, beta: float, batch_size: int,
                            exclude, generator):
    """``(index, weight)`` of ``batch_size`` draws with the leaves ``exclude`` counted as zero:
    those of torchrl's ``PrioritizedSliceSampler``, which writes zeros there, checks and draws
    as :class:`PrioritizedSampler` does, and writes the leaves back. One ``replay`` call reads
    the zeroed tree's sums and descents without writing the tree
    (``sample_prioritized_zeroed``): the checks, in torchrl's order (the sum of the zeroed
    tree, then the smallest priority of the min tree, which torchrl leaves as it is), come
    before any random number is taken, so a refused call takes none."""
    p_min = min_tree.query(0, num_valid)

    def masses(p_sum):
        if not p_sum > 0:
            raise RuntimeError(
                f"non-positive p_sum: the priorities of the {num_valid} sampleable items "
                f"outside the excluded ones sum to {p_sum}"
            )
        if not p_min > 0:
            raise RuntimeError(
                f"non-positive p_min: the smallest priority of the {num_valid} sampled items is {p_min}"
            )
        return torchrl_masses(batch_size, p_sum, generator)

    if isinstance(exclude, torch.Tensor):
        exclude = exclude.detach().cpu().numpy()
    relative_to = p_min if p_min > 0 else None
    index, priority = sum_tree.sample_prioritized_zeroed(num_valid, exclude, masses, relative_to=relative_to)
    return torch.from_numpy(index), torch.from_numpy(priority).pow_(-beta)


def draw_with_torch(sum_tree: _TorchSumSegmentTree, num_valid: int, p_min: float, beta: float,
                    uniform: torch.Tensor, exclude=None):
    """``(index, weight)`` in torch ops on the tree's device (the accelerator path)."""
    index, priority, _ = sum_tree.sample_prioritized(uniform, num_valid, exclude=exclude)
    # Importance sampling weight, normalised by the largest weight (that of p_min):
    #   w_i = (N * P(i)) ** -beta / (N * P_min) ** -beta = (p_i / p_min) ** -beta
    return index, torch.pow(priority / p_min, -beta)
