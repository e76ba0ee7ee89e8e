"""Sum and min "segment trees" made of torch ops, for priorities that live on any device.

These classes follow the segment-tree API of ``torchrl._torchrl`` (``tree[i]``,
``tree[i] = v``, ``query(l, r)``, ``scan_lower_bound(v)``, ``size``, ``capacity``,
``identity_element``, pickling) so that :class:`~torchrl_compat.samplers.PrioritizedSampler`
can keep its priorities on the storage's device (typically CUDA) and sample there.

Layout: a 16-ary tree kept up to date at every write. The leaves are one flat tensor of the
tree's dtype (leaf ``i`` at position ``i``, followed by one scratch slot that masked writes go
to); level ``j >= 1`` holds the reductions of 16 nodes of level ``j - 1``, in float64 for sum
trees (so their sums cannot drift: every parent is recomputed from its children) and in the
tree's dtype for min trees::

    level 2:  [ 0 ]                                   root
    level 1:  [ 0 ][ 1 ] ...                          node n reduces level-0 nodes 16n .. 16n+15
    level 0:  [ 0 ][ 1 ] ... [15][16] ... [cap-1] [scratch]

* a write of ``k`` leaves sorts them (the last write of a duplicated index wins, as in
  torchrl's trees on CPU), writes the winners and recomputes their ancestors, level by level:
  O(k log N) node reads, never a pass over the leaves (a level with fewer than ``16 k``
  children is recomputed whole, which costs less);
* a draw descends from the root, 16 children per level: O(batch log N);
* range queries from 0 (``p_sum``, ``p_min``) read at most 16 nodes per level.

Batched ``query`` and ``scan_lower_bound`` read lazily built caches (a float64 prefix sum, a
binary level table), rebuilt in O(size) at the first such read after a write: they serve the
torchrl tree API, not the samplers' steady state.

Two ways to write and draw:

* the torchrl tree API (``tree[i] = v``, ``query``, ``sample_prioritized``) checks its input
  at once, which costs a host synchronisation per call when the tree lives on an accelerator;
* :meth:`~_TorchSegmentTree.update_nonblocking` and
  :meth:`~_TorchSumSegmentTree.draw_nonblocking` never synchronise with the host: a bad batch
  is masked on the device (it changes nothing) and its error is raised by a later call, from
  a status copied to the host asynchronously (see :class:`.DeferredChecks`).

As torchrl's trees do, a tree keeps ``capacity`` leaves (the smallest power of two above
``size``): every index below it can be written and read, and a query from 0 that reaches
``size`` covers them all (torchrl's ``PrioritizedSampler`` relies on it when its storage is
longer than the sampler). Unlike torchrl's trees, every index is checked
(``0 <= i < capacity``) and values are validated (NaN always rejected; sum trees also reject
negative and infinite values, and, in the checked API, a write after which their total would
not be finite in the tree's dtype). A batch with one bad entry is rejected whole, leaving the
tree unchanged.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from torchrl_compat._torch_ops.checks import DeferredChecks

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


FANOUT = 16  # children per node
_SHIFT = 4  # log2(FANOUT)
# Status codes of the non-blocking calls (see DeferredChecks).
_BAD_INDEX, _BAD_VALUE, _NOTHING_TO_DRAW, _ZERO_MINIMUM = 1, 2, 3, 4


def _padded(count: int) -> int:
    """``count`` rounded up to a whole number of rows of FANOUT nodes."""
    return -(-count // FANOUT) * FANOUT


def _level_sizes(capacity: int) -> list[int]:
    """Node counts per level, leaves first, root (1 node) last."""
    sizes = [capacity]
    while sizes[-1] > 1:
        sizes.append(-(-sizes[-1] // FANOUT))
    return sizes


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
        self._allocate(device)

    def _allocate(self, device: torch.device) -> None:
        """Fresh levels, every node at the identity (see the module docstring's layout)."""
        self._sizes = _level_sizes(self._capacity)
        self._scratch = _padded(self._capacity)
        # every leaf below the capacity, as torchrl's trees keep them, then the scratch slot
        self._leaf_store = torch.full(
            (self._scratch + 1,), self.identity_element, dtype=self._dtype, device=device
        )
        self._leaves = self._leaf_store[: self._capacity]
        node_dtype = torch.float64 if self._is_sum else self._dtype
        self._nodes = [None] + [
            torch.full((_padded(n),), self.identity_element, dtype=node_dtype, device=device)
            for n in self._sizes[1:]
        ]
        self._fanout = torch.arange(FANOUT, device=device)
        self._checks = DeferredChecks(device)
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

    # ----------------------------------------------------------------- levels
    def _rows(self, level: int) -> torch.Tensor:
        """Level ``level`` as ``[nodes of level + 1, FANOUT]`` rows of siblings."""
        store = self._leaf_store if level == 0 else self._nodes[level]
        return store[: _padded(self._sizes[level])].view(-1, FANOUT)

    def _reduce(self, rows: torch.Tensor) -> torch.Tensor:
        if self._is_sum:
            return rows.sum(-1, dtype=torch.float64)
        return rows.amin(-1)

    def _combine(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b if self._is_sum else torch.minimum(a, b)

    def _root(self) -> torch.Tensor:
        return self._nodes[-1][0]

    def _refresh(self, keys: torch.Tensor) -> None:
        """Recomputes the ancestors of the leaves ``keys`` (int64, in ``[0, capacity)``), level
        by level from their children. Duplicated ancestors get the same value from the same
        children, so the order of the writes does not matter. O(len(keys) log capacity)."""
        node = keys
        count = keys.numel()
        for level in range(len(self._sizes) - 1):
            rows = self._rows(level)
            parents = self._nodes[level + 1]
            if count * FANOUT >= self._sizes[level]:
                # as many reads as the batch would need: the whole level, without a gather
                parents[: self._sizes[level + 1]] = self._reduce(rows)
            else:
                node = node >> _SHIFT
                parents.index_put_((node,), self._reduce(rows[node]))

    def _rebuild(self) -> None:
        """Recomputes every level from the leaves, in O(capacity) (bulk loads only)."""
        for level in range(len(self._sizes) - 1):
            self._nodes[level + 1][: self._sizes[level + 1]] = self._reduce(self._rows(level))
        self._invalidate()

    def _write(self, index: torch.Tensor, values: torch.Tensor, accept=None) -> None:
        """Writes ``values`` at the flat leaf positions ``index`` (same length, on the tree's
        device) and refreshes their ancestors; the last write of a duplicated index wins.
        ``accept`` (a 0-d bool tensor, optional) masks the whole batch on the device, in which
        case ``index`` may hold bad entries (they are clamped, and nothing is written).
        No host synchronisation. O(k log k + k log capacity)."""
        if index.numel():
            self._apply(self._plan(index, accept), values)

    def _plan(self, index: torch.Tensor, accept=None, keep=None):
        """``(keys, order, target)`` of a write at ``index`` (see :meth:`_write`): the sorted
        clamped leaves, the sort's permutation and where each sorted value goes (its leaf for
        the last write of each leaf, the scratch slot for the others). ``keep`` (a bool tensor
        like ``index``, optional) drops entries one by one. Trees of one capacity share plans."""
        keys = index if accept is None and keep is None else index.clamp(0, self._capacity - 1)
        keys, order = torch.sort(keys, stable=True)
        winner = torch.ones_like(keys, dtype=torch.bool)
        if keep is None:
            winner[:-1] = keys[1:] != keys[:-1]
        else:
            # the last kept write of each leaf: a dropped entry never hides an earlier one
            kept = keep[order]
            position = torch.where(kept, torch.arange(keys.numel(), device=keys.device), -1)
            # runs of equal keys are contiguous: the largest kept position of each run
            run_start = torch.ones_like(winner)
            run_start[1:] = keys[1:] != keys[:-1]
            run_id = run_start.long().cumsum(0) - 1
            last_kept = torch.full_like(position, -1).scatter_reduce_(0, run_id, position, "amax")
            winner = kept & (position == last_kept[run_id])
        if accept is not None:
            winner &= accept
        # Losers and masked writes all go to the scratch slot, outside every row.
        return keys, order, torch.where(winner, keys, self._scratch)

    def _apply(self, plan, values: torch.Tensor) -> None:
        keys, order, target = plan
        self._leaf_store.index_put_((target,), values[order].to(self._dtype))
        self._refresh(keys)
        self._invalidate()

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
                f"value must be a scalar or hold as many elements as index, got value of "
                f"shape {tuple(np.shape(value))} and index of shape {tuple(np.shape(index))}"
            )
        self._check_index(idx)
        self._check_values(values)
        if not idx.numel():
            return
        if values.numel() == 1:
            values = values.expand(idx.shape)
        previous = self._leaves[idx] if self._is_sum else None
        self._write(idx, values)
        if self._is_sum:
            # Each value is finite; their sum must stay so in the tree's dtype, or sampling
            # from the total breaks: put the old leaves back and refuse the write.
            total = self._root()
            if not bool(total <= torch.finfo(self._dtype).max):
                self._write(idx, previous)
                raise self._total_error(values, float(total))

    def update_nonblocking(self, index: torch.Tensor, value: torch.Tensor) -> None:
        """Sets leaves ``index`` to ``value`` without any host synchronisation.

        Args:
            index (torch.Tensor): int64 leaf positions on the tree's device (any shape).
            value (torch.Tensor): one value, or one per index, on the tree's device.

        The checks of ``tree[index] = value`` (indices in ``[0, capacity)``, values finite and
        non-negative for sum trees, not NaN for min trees) run on the device: a batch that
        fails them is masked there, changing nothing, and the error (naming the first bad
        entry) is raised by a later non-blocking call of this tree once the device has
        finished the check (usually the next call), or by :meth:`check_errors`. The total's
        overflow check of the blocking API is not made: float64 sums do not overflow.
        Shapes, dtypes and devices are checked at once (they need no device data).
        O(k log k + k log capacity), about ``8 + 4 log16(capacity)`` kernels.
        """
        self._checks.raise_ready()
        idx, values = self._nonblocking_operands(index, value)
        if not idx.numel():
            return
        self._write(idx, values, self._record_checks(idx, values))

    def check_errors(self) -> None:
        """Waits for the device checks of earlier non-blocking calls and raises the first
        failed one (a host synchronisation: for explicit checks, not for the hot path)."""
        self._checks.wait()

    def _nonblocking_operands(self, index, value):
        if not isinstance(index, torch.Tensor) or not _is_integer_dtype(index.dtype):
            raise TypeError(f"index must be an integer tensor, got {type(index).__name__} "
                            f"of dtype {getattr(index, 'dtype', None)}")
        if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point:
            raise TypeError(f"value must be a floating-point tensor, got {type(value).__name__} "
                            f"of dtype {getattr(value, 'dtype', None)}")
        for name, tensor in (("index", index), ("value", value)):
            if tensor.device != self.device:
                raise ValueError(f"{name} must be on the tree's device {self.device}, got {tensor.device}")
        idx = index.reshape(-1).long()
        values = value.detach().reshape(-1).to(self._dtype)
        if values.numel() == 1:
            values = values.expand(idx.shape)
        elif values.numel() != idx.numel():
            raise ValueError(
                f"value must be a scalar or hold as many elements as index, got value of "
                f"shape {tuple(value.shape)} and index of shape {tuple(index.shape)}"
            )
        return idx, values

    def _record_checks(self, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Queues the device-side checks of a write; returns whether it may be applied (a 0-d
        bool tensor on the device)."""
        bad_index = (idx < 0) | (idx >= self._capacity)
        if self._is_sum:
            bad_value = ~torch.isfinite(values) | (values < 0)
        else:
            bad_value = torch.isnan(values)
        any_index, any_value = bad_index.any(), bad_value.any()
        # The first bad index, else the first bad value (argmax: the first maximum).
        bad = torch.where(any_index, bad_index, bad_value)
        position = bad.to(torch.uint8).argmax()
        code = torch.where(any_index, _BAD_INDEX, torch.where(any_value, _BAD_VALUE, 0))
        culprit = torch.where(any_index, idx[position.reshape(1)].double(), values[position.reshape(1)].double())
        status = torch.cat([code.double().reshape(1), position.double().reshape(1), culprit])
        self._checks.record(status, self._deferred_error)
        return ~(any_index | any_value)

    def _deferred_error(self, code: int, position: int, value: float) -> Exception:
        later = " (found on the device after an earlier non-blocking update, which changed nothing)"
        if code == _BAD_INDEX:
            error = self._index_error(int(value), position)
            return IndexError(str(error) + later)
        if code == _BAD_VALUE:
            limit = "finite and non-negative" if self._is_sum else "not NaN"
            return ValueError(
                f"value {value} at position {position} is invalid: values must be {limit}{later}"
            )
        if code == _ZERO_MINIMUM:
            return RuntimeError(
                f"non-positive p_min: the smallest priority of the {position} sampleable items "
                f"was {value} at an earlier non-blocking draw (its weights were meaningless)"
            )
        return RuntimeError(
            "non-positive p_sum: an earlier non-blocking draw found no positive leaf among "
            f"the {position} sampleable ones (its results were meaningless)"
        )

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
        self._rebuild()

    # ----------------------------------------------------------------- queries
    def _range_reduce(self, left: int, right: int) -> torch.Tensor:
        """The reduction of leaves ``[left, right)`` (``0 <= left < right <= capacity``) as a
        0-d tensor on the device (float64 for sums): at most two partial rows per level, no
        host synchronisation. O(16 log16 capacity)."""
        result = None
        level = 0
        while left < right:
            store = self._leaf_store if level == 0 else self._nodes[level]
            head_end = min(_padded(left), right)
            tail_start = max(right // FANOUT * FANOUT, head_end)
            for lo, hi in ((left, head_end), (tail_start, right)):
                if lo < hi:
                    part = self._reduce(store[lo:hi])
                    result = part if result is None else self._combine(result, part)
            left, right = head_end // FANOUT, tail_start // FANOUT
            level += 1
        return result

    def _scalar_query(self, left: int, right: int) -> float:
        left, right = self._query_range(left, right)
        if right <= left:
            return self.identity_element
        # Round through the tree's dtype, as a tree of that dtype reports its sums.
        return float(self._range_reduce(left, right).to(self._dtype))

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
        self._capacity = _capacity_for(self._size)
        self._allocate(torch.device(state.get("device", "cpu")))
        self._leaves[: self._size] = leaves
        self._rebuild()

    def to(self, device) -> _TorchSegmentTree:
        """A copy of this tree with its leaves on ``device``."""
        out = type(self)(self._size, device=device)
        out._leaves.copy_(self._leaves)
        out._rebuild()
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
        if exclude is None:
            uniform = uniform.to(device=self.device, dtype=torch.float64).reshape(-1)
            index, priority, total, reachable = self._draw(uniform, num_valid)
            if not bool(reachable > 0):
                raise RuntimeError(
                    f"non-positive p_sum: the priorities of the {min(num_valid, mass_end)} "
                    f"sampleable items sum to {float(reachable)}"
                )
            return index, priority, total
        return sample_prioritized_leaves(
            self._leaves[:mass_end],
            uniform,
            prefix=self._prefix_sums()[1 : mass_end + 1],
            exclude=exclude,
            num_valid=min(num_valid, mass_end),
        )


    def draw_nonblocking(self, uniform: torch.Tensor, num_valid: int):
        """:meth:`sample_prioritized` without ``exclude`` and without any host
        synchronisation.

        Args:
            uniform (torch.Tensor): float draws in ``[0, 1)`` on the tree's device.
            num_valid (int): leaves ``[0, num_valid)`` may be drawn (``len(storage)``).

        Returns:
            ``(index, priority, total)`` as :meth:`sample_prioritized` gives them.

        When no leaf below ``num_valid`` is positive the results are meaningless, and the
        ``RuntimeError`` ("non-positive p_sum") is raised by a later non-blocking call of this
        tree (usually the next), or by :meth:`check_errors`. ``num_valid < 1`` raises at once.
        O(batch log16 capacity), about ``3 + 9 log16(capacity)`` kernels (twice that when
        ``size <= num_valid < capacity``, whose clamped draws need a second descent).
        """
        self._checks.raise_ready()
        num_valid = int(num_valid)
        if num_valid <= 0:
            raise RuntimeError("non-positive p_sum: there is no item to sample from")
        if uniform.device != self.device:
            raise ValueError(f"uniform must be on the tree's device {self.device}, got {uniform.device}")
        uniform = uniform.reshape(-1).to(torch.float64)
        index, priority, total, reachable = self._draw(uniform, num_valid)
        sampleable = min(num_valid, self._capacity)
        code = torch.where(reachable > 0, 0, _NOTHING_TO_DRAW).double()
        # full_like, not new_tensor: a fill on the device rather than a copy from host memory,
        # which a CUDA graph could not replay (see samplers/_cuda_graphs.py)
        status = torch.stack([code, torch.full_like(code, float(sampleable)), reachable.double()])
        self._checks.record(status, self._deferred_error)
        return index, priority, total

    def _draw(self, uniform: torch.Tensor, num_valid: int):
        """``(index, priority, total, reachable)`` of the draws ``uniform`` (float64, on the
        device) by torchrl's rule (see :meth:`sample_prioritized`); ``reachable`` is the mass
        of the leaves the draws may end on (not positive: the results are meaningless).
        No host synchronisation."""
        mass_end = self._capacity if num_valid >= self._size else num_valid
        bounds = self._restriction(mass_end)
        total = self._restricted_root(bounds)
        index = self._descend(uniform * total, bounds)
        reachable = total
        if num_valid < mass_end:
            # A storage longer than the sampler: draws past it are clamped to its last item,
            # then moved left off a zero leaf, i.e. onto the last positive leaf below
            # num_valid (the descent of an infinite mass in the leaves below num_valid).
            below = self._restriction(num_valid)
            last_positive = self._descend(uniform.new_full((1,), math.inf), below)
            index = torch.where(index >= num_valid, last_positive, index)
            reachable = self._restricted_root(below)
        return index, self._leaves[index], total, reachable

    def _restriction(self, end: int):
        """What the descent needs to see only the leaves ``[0, end)``: per level, the node that
        straddles ``end`` and its sum over leaves below ``end`` (``None`` for every leaf)."""
        if end >= self._capacity:
            return None
        bounds = []
        last = end - 1
        partial = self._leaves[last].double()
        for level in range(len(self._sizes)):
            node = last >> (_SHIFT * level)
            if level:
                children = self._rows(level - 1)[node]
                below = children[: (last >> (_SHIFT * (level - 1))) - node * FANOUT]
                partial = partial + below.sum(dtype=torch.float64)
            bounds.append((node, partial))
        return bounds

    def _restricted_root(self, bounds) -> torch.Tensor:
        return self._root() if bounds is None else bounds[-1][1]

    def _descend(self, mass: torch.Tensor, bounds) -> torch.Tensor:
        """The leaf of each mass: the first whose inclusive prefix sum reaches it, never a
        zero-valued one (a mass at or below 0 gives the first positive leaf, one past the
        total the last positive leaf, whatever the rounding). O(batch * 16 log16 capacity)."""
        # Strictly positive masses: the first child whose running sum reaches one is positive.
        mass = mass.clamp_min(torch.finfo(torch.float64).tiny)
        node = torch.zeros(mass.shape, dtype=torch.long, device=self.device)
        for level in range(len(self._sizes) - 1, 0, -1):
            rows = self._rows(level - 1)[node]
            if rows.dtype != torch.float64:
                rows = rows.double()
            if bounds is not None:
                straddling, partial = bounds[level - 1]
                ids = (node * FANOUT).unsqueeze(1) + self._fanout
                rows = torch.where(ids < straddling, rows, torch.where(ids == straddling, partial, 0.0))
            running = rows.cumsum(1)
            # Past the row's sum (rounding, or an infinite mass): its last positive child.
            mass = torch.minimum(mass, running[:, -1])
            child = (running < mass.unsqueeze(1)).sum(1)
            before = F.pad(running, (1, 0)).gather(1, child.unsqueeze(1)).squeeze(1)
            mass = mass - before
            node = node * FANOUT + child
        return node


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
