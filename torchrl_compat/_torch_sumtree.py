"""Sum and min "segment trees" made of torch ops, for priorities that live on any device.

These classes follow the segment-tree API of ``torchrl._torchrl`` (``tree[i]``,
``tree[i] = v``, ``query(l, r)``, ``scan_lower_bound(v)``, ``size``, ``capacity``,
``identity_element``, pickling) so that :class:`~torchrl_compat.samplers.PrioritizedSampler`
can keep its priorities on the storage's device (typically CUDA) and sample there.

Layout: the leaves are one flat tensor of the tree's dtype. Instead of maintaining internal
nodes on every write (a dozen tiny kernels per tree level on a GPU), the reductions are
rebuilt lazily, in one pass, the first time they are needed after a write:

* sum trees keep a float64 inclusive prefix sum of the leaves; ``query`` is a difference of
  two prefix sums and ``scan_lower_bound`` is a ``torch.searchsorted`` over it. Summing in
  float64 means that the prefix sums cannot drift below the true sums of fp32 leaves, and
  a mass drawn in ``[0, total)`` never lands on a zero-valued leaf;
* min trees answer scalar queries with one reduction over the leaf range and batched
  queries with a level table (a classic bottom-up segment tree over ``capacity`` leaves).

A write costs O(batch) (plus a sort to make duplicate indices deterministic: the last write
wins, as it does in torchrl's trees on CPU); the first read after a write costs O(size).
That trade suits replay buffers, where every sampling step follows at most one update.

As torchrl's trees do, a tree keeps ``capacity`` leaves (the smallest power of two above
``size``): every index below it can be written and read, and a query from 0 that reaches
``size`` covers them all (torchrl's ``PrioritizedSampler`` relies on it when its storage is
longer than the sampler). Unlike torchrl's trees, every index is checked
(``0 <= i < capacity``) and values are validated (NaN always rejected; sum trees also reject
negative and infinite values, and a write after which their total would not be finite in
the tree's dtype). A batch with one bad entry is rejected whole, leaving the tree unchanged.
Validation needs one host synchronisation per write when the tree lives on an accelerator.
"""
from __future__ import annotations

import math

import numpy as np
import torch

__all__ = [
    "sample_prioritized_leaves",
    "TorchMinSegmentTreeFp32",
    "TorchMinSegmentTreeFp64",
    "TorchSumSegmentTreeFp32",
    "TorchSumSegmentTreeFp64",
]


def _capacity_for(size: int) -> int:
    # Smallest power of two strictly greater than size, as torchrl's trees compute it.
    capacity = 1
    while capacity <= size:
        capacity <<= 1
    return capacity


def _is_integer_dtype(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


class _TorchSegmentTree:
    """Common part of the sum and min trees (see the module docstring)."""

    _dtype: torch.dtype
    _is_sum: bool

    def __init__(self, size: int, *, device: torch.device | str | None = None) -> None:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"size must be an int, got {type(size).__name__}")
        size = int(size)
        if size <= 0:
            raise ValueError(f"size must be positive, got size={size}")
        self._size = size
        self._capacity = _capacity_for(size)
        device = torch.device("cpu") if device is None else torch.device(device)
        # every leaf below the capacity, as torchrl's trees keep them
        self._leaves = torch.full(
            (self._capacity,), self.identity_element, dtype=self._dtype, device=device
        )
        self._invalidate()

    # ----------------------------------------------------------------- properties
    @property
    def size(self) -> int:
        return self._size

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def device(self) -> torch.device:
        return self._leaves.device

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def identity_element(self) -> float:
        if self._is_sum:
            return 0.0
        return float(torch.finfo(self._dtype).max)

    @property
    def leaves(self) -> torch.Tensor:
        """The ``size`` leaf values (a view: read it, do not write it)."""
        return self._leaves[: self._size]

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self._size}, device={self.device})"

    # ----------------------------------------------------------------- caches
    def _invalidate(self) -> None:
        self._prefix = None  # float64 [capacity + 1], prefix[k] = sum(leaves[:k]) (sum trees)
        self._levels = None  # list of [capacity >> k] tensors (min trees, batched query)

    def _prefix_sums(self) -> torch.Tensor:
        prefix = self._prefix
        if prefix is None:
            prefix = torch.zeros(self._capacity + 1, dtype=torch.float64, device=self.device)
            torch.cumsum(self._leaves, 0, dtype=torch.float64, out=prefix[1:])
            self._prefix = prefix
        return prefix

    def _query_range(self, left, right):
        """``(left, right)`` clamped to ``[0, capacity]``, torchrl's way: a range from 0 (or
        below) that reaches ``size`` is the whole tree, every leaf below the capacity."""
        whole = (left <= 0) & (right >= self._size)
        if isinstance(whole, torch.Tensor):
            right = torch.where(whole, self._capacity, right)
            return left.clamp(0, self._capacity), right.clamp(0, self._capacity)
        if whole:
            return 0, self._capacity
        return min(max(left, 0), self._capacity), min(max(right, 0), self._capacity)

    def _level_table(self) -> list[torch.Tensor]:
        levels = self._levels
        if levels is None:
            level = self._leaves
            levels = [level]
            while level.shape[0] > 1:
                pairs = level.view(-1, 2)
                level = pairs.sum(1) if self._is_sum else pairs.amin(1)
                levels.append(level)
            self._levels = levels
        return levels

    # ----------------------------------------------------------------- conversion
    def _as_index(self, index, name: str = "index") -> torch.Tensor:
        """Index as an int64 tensor on the tree's device (any shape)."""
        if isinstance(index, torch.Tensor):
            if not _is_integer_dtype(index.dtype):
                raise TypeError(
                    f"{name} must hold integers, got a tensor of dtype {index.dtype}"
                )
            return index.detach().to(device=self.device, dtype=torch.long)
        array = np.asarray(index)
        if array.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got an array of dtype {array.dtype}")
        if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
            raise IndexError(f"{name} value {int(array.max())} does not fit in int64")
        return torch.as_tensor(array.astype(np.int64, copy=False), device=self.device)

    def _as_values(self, value, name: str = "value") -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            if value.dtype.is_complex:
                raise TypeError(f"{name} must hold real numbers, got dtype {value.dtype}")
            return value.detach().to(device=self.device, dtype=self._dtype)
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"{name} must hold real numbers, got an array of dtype {array.dtype}")
        return torch.as_tensor(array, dtype=self._dtype, device=self.device)

    def _index_error(self, value: int, position: int | None = None) -> IndexError:
        where = "" if position is None else f" at position {position}"
        return IndexError(
            f"index {value}{where} is out of range for size {self._size}: a tree of that size "
            f"holds leaves [0, {self._capacity})"
        )

    def _check_index(self, index: torch.Tensor) -> None:
        flat = index.reshape(-1)
        if not flat.numel():
            return
        bad = (flat < 0) | (flat >= self._capacity)
        if bool(bad.any()):
            pos = int(bad.nonzero()[0, 0])
            raise self._index_error(int(flat[pos]), pos)

    def _check_values(self, values: torch.Tensor) -> None:
        flat = values.reshape(-1)
        if not flat.numel():
            return
        if self._is_sum:
            bad = ~torch.isfinite(flat) | (flat < 0)
        else:
            bad = torch.isnan(flat)
        if bool(bad.any()):
            pos = int(bad.nonzero()[0, 0])
            limit = "finite and non-negative" if self._is_sum else "not NaN"
            raise ValueError(
                f"value {float(flat[pos])} at position {pos} is invalid: values must be {limit}"
            )

    @staticmethod
    def _like(result: torch.Tensor, like):
        """``result`` shaped and typed like the caller's input (int, ndarray or tensor)."""
        if isinstance(like, torch.Tensor):
            return result.to(like.device)
        return result.cpu().numpy()

    # ----------------------------------------------------------------- leaves
    def at(self, index):
        return self[index]

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            index = int(index)
            if not 0 <= index < self._capacity:
                raise self._index_error(index)
            return float(self._leaves[index])
        idx = self._as_index(index)
        self._check_index(idx)
        return self._like(self._leaves[idx], index)

    def update(self, index, value) -> None:
        self[index] = value

    def __setitem__(self, index, value) -> None:
        idx = self._as_index(index).reshape(-1)
        values = self._as_values(value).reshape(-1)
        if values.numel() != 1 and values.numel() != idx.numel():
            raise ValueError(
                f"value must be a scalar or have as many elements as index, got value of "
                f"shape {tuple(np.shape(value))} and index of shape {tuple(np.shape(index))}"
            )
        self._check_index(idx)
        self._check_values(values)
        if not idx.numel():
            return
        if values.numel() == 1:
            values = values.expand(idx.shape)
        if idx.numel() > 1:
            # Duplicate indices: keep the last write, deterministically on every device
            # (index_put_ leaves the winner unspecified on CUDA).
            unique, inverse = torch.unique(idx, sorted=True, return_inverse=True)
            if unique.numel() != idx.numel():
                last = torch.full_like(unique, -1)
                last.scatter_reduce_(
                    0, inverse, torch.arange(idx.numel(), device=idx.device), "amax"
                )
                idx, values = unique, values[last]
        previous = self._leaves[idx]
        self._leaves[idx] = values
        if self._is_sum:
            # Each value is finite; their sum must stay so in the tree's dtype, or sampling
            # from the total breaks: put the old leaves back and refuse the write.
            total = self._leaves.sum(dtype=torch.float64)
            if not bool(total <= torch.finfo(self._dtype).max):
                self._leaves[idx] = previous
                raise self._total_error(values, float(total))
        self._invalidate()

    def _total_error(self, values: torch.Tensor, total: float) -> ValueError:
        largest = int(values.argmax())
        return ValueError(
            f"value {float(values[largest])} at position {largest} would make the sum of the "
            f"tree's leaves {total}, past the largest finite {self._dtype} "
            f"({torch.finfo(self._dtype).max}): the update was refused, the tree is unchanged"
        )

    def _set_all(self, values: torch.Tensor) -> None:
        """Set the ``size`` leaves from a tensor of ``size`` values (checked), in O(size); the
        leaves past them go back to the identity."""
        values = self._as_values(values).reshape(-1)
        if values.numel() != self._size:
            raise ValueError(
                f"expected {self._size} leaf values, got a tensor of shape {tuple(values.shape)}"
            )
        self._check_values(values)
        if self._is_sum:
            total = values.sum(dtype=torch.float64)
            if not bool(total <= torch.finfo(self._dtype).max):
                raise self._total_error(values, float(total))
        self._leaves[: self._size] = values
        self._leaves[self._size :] = self.identity_element
        self._invalidate()

    # ----------------------------------------------------------------- queries
    def _scalar_query(self, left: int, right: int) -> float:
        left, right = self._query_range(left, right)
        if right <= left:
            return self.identity_element
        if self._is_sum:
            prefix = self._prefix_sums()
            total = prefix[right] - prefix[left]
            # Round through the tree's dtype, as a tree of that dtype reports its sums.
            return float(total.to(self._dtype))
        return float(self._leaves[left:right].amin())

    def query(self, left, right):
        scalar = (int, np.integer)
        if isinstance(left, scalar) and isinstance(right, scalar):
            return self._scalar_query(int(left), int(right))
        lo = self._as_index(left, "left")
        hi = self._as_index(right, "right")
        if lo.shape != hi.shape:
            raise ValueError(
                f"left and right must have the same shape, got {tuple(lo.shape)} and "
                f"{tuple(hi.shape)}"
            )
        lo, hi = self._query_range(lo, hi)
        if self._is_sum:
            prefix = self._prefix_sums()
            result = (prefix[hi] - prefix[lo]).clamp_min(0).to(self._dtype)
        else:
            result = self._batched_min(lo.reshape(-1), hi.reshape(-1)).reshape(lo.shape)
        result = torch.where(hi > lo, result, torch.full_like(result, self.identity_element))
        return self._like(result, left if isinstance(left, torch.Tensor) else right)

    def _batched_min(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        # Bottom-up segment-tree query over the level table, vectorised over the batch.
        levels = self._level_table()
        result = torch.full(
            lo.shape, self.identity_element, dtype=self._dtype, device=self.device
        )
        lo = lo.clone()
        hi = hi.clone()
        for level in levels:
            active = lo < hi
            if not bool(active.any()):
                break
            n = level.shape[0]
            take_lo = active & (lo % 2 == 1)
            result = torch.where(take_lo, torch.minimum(result, level[lo.clamp_max(n - 1)]), result)
            lo = lo + take_lo.long()
            take_hi = active & (hi % 2 == 1)
            hi = hi - take_hi.long()
            result = torch.where(take_hi, torch.minimum(result, level[hi.clamp_max(n - 1)]), result)
            lo = lo // 2
            hi = hi // 2
        return result

    def values(self) -> np.ndarray:
        """A numpy copy of the ``size`` leaf values (as ``replay``'s trees give them)."""
        return self.leaves.detach().cpu().numpy().copy()

    # ----------------------------------------------------------------- pickling
    def __reduce__(self):
        # The ``size`` leaves only, as torchrl's trees pickle theirs.
        state = {
            "leaves": self.leaves.detach().cpu().clone(),
            "device": str(self.device),
        }
        return (type(self), (self._size,), state)

    def __setstate__(self, state) -> None:
        leaves = state["leaves"]
        if not isinstance(leaves, torch.Tensor) or leaves.dtype != self._dtype:
            raise TypeError(
                f"expected the leaves as a {self._dtype} tensor, got {type(leaves).__name__}"
                f" of dtype {getattr(leaves, 'dtype', None)}"
            )
        if tuple(leaves.shape) != (self._size,):
            raise ValueError(
                f"expected leaves of shape ({self._size},), got {tuple(leaves.shape)}"
            )
        self._leaves = torch.full(
            (self._capacity,), self.identity_element, dtype=self._dtype, device=state.get("device", "cpu")
        )
        self._leaves[: self._size] = leaves
        self._invalidate()

    def to(self, device) -> _TorchSegmentTree:
        """A copy of this tree with its leaves on ``device``."""
        out = type(self)(self._size, device=device)
        out._leaves.copy_(self._leaves)
        return out


class _TorchSumSegmentTree(_TorchSegmentTree):
    _is_sum = True

    def scan_lower_bound(self, value):
        """The first leaf whose inclusive prefix sum is ``>= value`` (``size`` past the total,
        as in torchrl)."""
        prefix = self._prefix_sums()[1:]
        if isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(
            value, bool
        ):
            value = float(value)
            if math.isnan(value):
                raise ValueError("value nan at position 0 is invalid: values must not be NaN")
            target = torch.tensor([value], dtype=torch.float64, device=self.device)
            found = int(torch.searchsorted(prefix, target, side="left")[0])
            return self._size if found == self._capacity else found
        target = self._as_values(value).to(torch.float64)
        flat = target.reshape(-1)
        nan = torch.isnan(flat)
        if flat.numel() and bool(nan.any()):
            pos = int(nan.nonzero()[0, 0])
            raise ValueError(f"value nan at position {pos} is invalid: values must not be NaN")
        result = torch.searchsorted(prefix, flat.contiguous(), side="left").reshape(
            target.shape
        )
        result = torch.where(result == self._capacity, self._size, result)
        return self._like(result, value)

    def sample_prioritized(
        self,
        uniform: torch.Tensor,
        num_valid: int,
        *,
        exclude: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draws leaves with probability proportional to their value, by the rule of torchrl's
        ``PrioritizedSampler`` (``num_valid`` is ``len(storage)``): the mass spans
        ``query(0, num_valid)``, every leaf below the capacity once ``num_valid`` reaches
        ``size``, and the draws are clamped to ``num_valid - 1``.

        See :func:`sample_prioritized_leaves`; the tree is never modified, even with
        ``exclude``.
        """
        num_valid = int(num_valid)
        if num_valid <= 0:
            raise RuntimeError("non-positive p_sum: there is no item to sample from")
        mass_end = self._capacity if num_valid >= self._size else num_valid
        return sample_prioritized_leaves(
            self._leaves[:mass_end],
            uniform,
            prefix=self._prefix_sums()[1 : mass_end + 1],
            exclude=exclude,
            num_valid=min(num_valid, mass_end),
        )


def sample_prioritized_leaves(
    leaves: torch.Tensor,
    uniform: torch.Tensor,
    *,
    prefix: torch.Tensor | None = None,
    exclude: torch.Tensor | None = None,
    num_valid: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draws positions of ``leaves`` with probability proportional to their value.

    Args:
        leaves (torch.Tensor): the non-negative values of the leaves that carry the mass
            (1-D).
        uniform (torch.Tensor): draws in ``[0, 1)``, one per sample.

    Keyword Args:
        prefix (torch.Tensor, optional): the float64 inclusive prefix sums of ``leaves``
            when already known (ignored with ``exclude``). Defaults to ``None``.
        exclude (torch.Tensor, optional): positions treated as zero for this draw only
            (``leaves`` is not modified). Defaults to ``None``.
        num_valid (int, optional): the draws are clamped to ``[0, num_valid)``, at most
            ``len(leaves)``. Defaults to every leaf.

    Returns:
        ``(index, priority, total)``: int64 positions on the leaves' device, their values
        (leaves' dtype) and the float64 mass the draws were scaled by (a 0-d tensor).

    Each draw ``u`` selects the first leaf whose inclusive prefix sum reaches
    ``u * total``, clamped to ``num_valid - 1``; a zero-valued leaf steps left to the nearest
    positive one (right when there is none on its left, where torchrl raises). Raises
    ``RuntimeError`` when no leaf below ``num_valid`` is positive. Costs O(len(leaves) +
    batch) and one host synchronisation (the positivity check) on an accelerator, two when a
    zero leaf is hit.
    """
    mass_end = leaves.shape[0]
    num_valid = mass_end if num_valid is None else min(int(num_valid), mass_end)
    if num_valid <= 0:
        raise RuntimeError("non-positive p_sum: there is no item to sample from")
    device = leaves.device
    if exclude is not None:
        leaves = leaves.clone()
        exclude = exclude.to(device=device, dtype=torch.long).reshape(-1)
        leaves[exclude[(exclude >= 0) & (exclude < mass_end)]] = 0
        prefix = None
    if prefix is None:
        prefix = torch.cumsum(leaves, 0, dtype=torch.float64)
    total = prefix[-1]
    # Past num_valid only (a storage shorter than the leaves that carry the mass), a draw
    # could not be moved onto a positive leaf.
    reachable = total if num_valid == mass_end else prefix[num_valid - 1]
    if not bool(reachable > 0):
        raise RuntimeError(
            f"non-positive p_sum: the priorities of the {num_valid} sampleable items "
            f"sum to {float(reachable)}"
        )
    mass = uniform.to(device=device, dtype=torch.float64).reshape(-1) * total
    index = torch.searchsorted(prefix, mass, side="left").clamp_max_(num_valid - 1)
    leaves = leaves[:num_valid]
    priority = leaves[index]
    zero = priority == 0
    if bool(zero.any()):
        positions = torch.arange(num_valid, device=device)
        positive = leaves > 0
        # The nearest positive leaf at or before each position (-1 when none) ...
        left = torch.cummax(torch.where(positive, positions, -1), 0).values
        # ... and at or after it (num_valid when none).
        right = torch.where(positive, positions, num_valid).flip(0)
        right = torch.cummin(right, 0).values.flip(0)
        stepped = torch.where(left[index] >= 0, left[index], right[index])
        index = torch.where(zero, stepped, index)
        priority = leaves[index]
    return index, priority, total


class _TorchMinSegmentTree(_TorchSegmentTree):
    _is_sum = False


class TorchSumSegmentTreeFp32(_TorchSumSegmentTree):
    """A float32 sum tree in torch ops: the API of ``torchrl._torchrl.SumSegmentTreeFp32``."""

    _dtype = torch.float32


class TorchSumSegmentTreeFp64(_TorchSumSegmentTree):
    """A float64 sum tree in torch ops: the API of ``torchrl._torchrl.SumSegmentTreeFp64``."""

    _dtype = torch.float64


class TorchMinSegmentTreeFp32(_TorchMinSegmentTree):
    """A float32 min tree in torch ops: the API of ``torchrl._torchrl.MinSegmentTreeFp32``."""

    _dtype = torch.float32


class TorchMinSegmentTreeFp64(_TorchMinSegmentTree):
    """A float64 min tree in torch ops: the API of ``torchrl._torchrl.MinSegmentTreeFp64``."""

    _dtype = torch.float64
