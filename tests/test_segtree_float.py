"""Segment trees with non-integer leaves against a numpy model of their layout, bit for bit.

With integer leaves (test_segtree.py) every sum is exact and the order of the additions never
shows. Here the leaves are random fp32 / fp64 fractions (and zeros), so every rounding does:
the model rebuilds the tree the way segtree.h documents it, in numpy, and the tests compare
the whole buffer, every query and every prefix search with it, bit for bit.

The model, from segtree.h / segtree_impl.h:

- 16-ary levels in one buffer: level 0 the leaves, entry j of level t + 1 the reduction of
  entries 16j .. 16j + 15 of level t; each level padded with the identity to a multiple of 16,
  the top level one node. A sum tree also stores, after the levels, the binary mini-heap of
  every node of the levels from 2 up: 16 slots, slot 0 = 0, slot 1 the node's total, 2..3 its
  octets, 4..7 its quads, 8..15 its pairs (p_i = e_2i + e_2i+1, then each slot k the sum of
  slots 2k and 2k + 1), all in the tree's dtype.
- A parent of a sum tree is node_sum: torchrl's binary additions over its 16 children in the
  tree's dtype, ((e0 + e1) + (e2 + e3)) + ((e4 + e5) + (e6 + e7)), the same for e8..e15, the
  two added last (slot 1 of the mini-heap). A min tree's parent is the min of its children.
- query(l, r) and scan_lower_bound(v) of a sum tree are torchrl's (tests/torchrl_heap.py) over
  the laid-out leaves: capacity the power of two above them, the whole tree its root.
- The buffer holds ``size`` leaves until a leaf in [size, capacity) is written; it is then
  laid out again for ``capacity`` leaves (the parents rebuilt).
- A batch update writes its leaves in order (a repeated index keeps its last value), and
  parents are a pure function of their children, whatever the history of updates.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import replay
from torchrl_heap import BinaryHeapSumTree

FANOUT = 16
PREFIX_FROM = 2  # the lowest level that keeps its mini-heaps (RP_SEGTREE_PREFIX_FROM)
ALL_CLASSES = [
    replay.SumSegmentTreeFp32,
    replay.SumSegmentTreeFp64,
    replay.MinSegmentTreeFp32,
    replay.MinSegmentTreeFp64,
]
SUM_CLASSES = ALL_CLASSES[:2]
# sizes around the 16-ary level boundaries and powers of two, and any up to a few thousand
SIZES = st.one_of(
    st.integers(1, 40),
    st.sampled_from([15, 16, 17, 31, 32, 255, 256, 257, 1000, 4095, 4096, 4097]),
    st.integers(1, 5000),
)


def _dtype(cls):
    return np.dtype(np.float64 if cls.__name__.endswith("Fp64") else np.float32)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint64 if a.dtype == np.float64 else np.uint32)


def _ceil16(n):
    return -(-n // FANOUT) * FANOUT


def node_heap(nodes):
    """The binary mini-heap of every row of ``nodes`` (shape (n, 16)), in their dtype."""
    heap = np.zeros_like(nodes)
    heap[:, 8:] = nodes[:, 0::2] + nodes[:, 1::2]
    for k in range(7, 0, -1):
        heap[:, k] = heap[:, 2 * k] + heap[:, 2 * k + 1]
    return heap


def node_sum(nodes, dtype):
    """node_sum of every row of ``nodes`` (shape (n, 16)), in ``dtype``."""
    return node_heap(nodes.astype(dtype))[:, 1]


class LayoutModel:
    """The tree of one class and size, as segtree.h lays it out, kept as numpy leaves."""

    def __init__(self, cls, size):
        self.dtype = _dtype(cls)
        self.is_sum = cls.__name__.startswith("Sum")
        self.size = size
        self.capacity = 1 << int(size).bit_length()
        self.identity = self.dtype.type(0 if self.is_sum else np.finfo(self.dtype).max)
        self.leaves = np.full(self.capacity, self.identity, dtype=self.dtype)
        self.allocated = size  # leaves laid out: size, or capacity once a leaf past size is written

    # --- writes ------------------------------------------------------------------------
    def update(self, index, value):
        index = np.atleast_1d(np.asarray(index, dtype=np.int64))
        value = np.broadcast_to(np.asarray(value, dtype=self.dtype), index.shape)
        if index.size and index.max() >= self.size:
            self.allocated = self.capacity
        for i, v in zip(index, value):  # in order: a repeated index keeps its last value
            self.leaves[i] = v

    # --- the buffer ----------------------------------------------------------------------
    def levels(self):
        lengths, entries = [], max(self.allocated, 1)
        while True:
            lengths.append(_ceil16(entries))
            if lengths[-1] == FANOUT:
                break
            entries = lengths[-1] // FANOUT
        levels = [np.full(lengths[0], self.identity, dtype=self.dtype)]
        levels[0][: self.allocated] = self.leaves[: self.allocated]
        for length in lengths[1:]:
            nodes = levels[-1].reshape(-1, FANOUT)
            level = np.full(length, self.identity, dtype=self.dtype)
            level[: nodes.shape[0]] = node_sum(nodes, self.dtype) if self.is_sum else nodes.min(axis=1)
            levels.append(level)
        return levels

    def buffer(self):
        levels = self.levels()
        parts = list(levels)
        if self.is_sum:
            parts += [node_heap(lvl.reshape(-1, FANOUT)).ravel() for lvl in levels[PREFIX_FROM:]]
        return np.concatenate(parts)

    # --- reads ---------------------------------------------------------------------------
    def heap(self):
        """torchrl's binary heap over the laid-out leaves (the padding past them is 0)."""
        return BinaryHeapSumTree(self.leaves[: self.allocated], size=self.allocated, dtype=self.dtype)

    def total(self):
        """The whole-tree sum: torchrl's root."""
        return float(self.heap().root)

    def query(self, l, r):
        """query(l, r) with int bounds: a float (double), as the tree returns it."""
        if l <= 0 and r >= self.size:
            l, r = 0, self.allocated
        if not self.is_sum:
            l, r = max(l, 0), min(r, self.allocated)
            return float(self.leaves[l:r].min()) if l < r else float(self.identity)
        return float(self.heap().query(l, r))

    def scan(self, masses):
        """scan_lower_bound of every mass (given in the tree's dtype)."""
        out = self.heap().scan_lower_bound(np.asarray(masses, dtype=self.dtype))
        out[out == self.allocated] = self.size  # past the total: ``size``, grown or not
        return out


def random_priorities(n, dtype, rng):
    """Non-integer priorities over several magnitudes, with zeros and repeats among them."""
    kind = rng.randint(0, 4)
    if kind == 0:
        values = rng.uniform(0.0, 1.0, n)
    elif kind == 1:
        values = rng.lognormal(0.0, 3.0, n)  # 1e-4 .. 1e4 side by side
    elif kind == 2:
        values = rng.uniform(0.0, 1.0, n) ** 8  # many tiny ones
    else:
        values = np.round(rng.uniform(0.0, 10.0, n), 1)  # 0.1 steps: not exact in binary
    values[rng.random(n) < 0.15] = 0.0
    return values.astype(dtype)


def assert_same_tree(tree, model):
    expected = model.buffer()
    got = tree._py_buffer()
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got.shape, expected.shape)
    bad = np.flatnonzero(_bits(got) != _bits(expected))
    assert bad.size == 0, (
        f"{bad.size} entries differ, first at {bad[0]}: tree {got[bad[0]]!r}, model {expected[bad[0]]!r}"
    )
    np.testing.assert_array_equal(_bits(tree.values()), _bits(model.leaves[: model.size]))


@pytest.mark.parametrize("cls", ALL_CLASSES)
@settings(max_examples=25, deadline=None)
@given(size=SIZES, seed=st.integers(0, 2**32 - 1), data=st.data())
def test_updates_build_the_model_tree(cls, size, seed, data):
    """Single, batched (repeated indices: the last write wins) and broadcast updates, some past
    size (the tree then grows to capacity): every entry of the buffer as the model's."""
    np.random.seed(seed)
    rng = np.random
    dtype = _dtype(cls)
    tree, model = cls(size), LayoutModel(cls, size)
    grow = data.draw(st.booleans())
    reach = model.capacity if grow else size
    for op in data.draw(st.lists(st.sampled_from(["dense", "batch", "repeat", "single", "broadcast"]), min_size=1, max_size=6)):
        if op == "dense":
            index = np.arange(reach, dtype=np.int64)
        elif op == "batch":
            index = rng.randint(0, reach, rng.randint(1, min(reach, 300) + 1)).astype(np.int64)
        elif op == "repeat":
            index = rng.choice(np.arange(min(reach, 5)), 12).astype(np.int64)
        else:
            index = np.array([rng.randint(0, reach)], dtype=np.int64)
        if op == "broadcast":
            index = rng.randint(0, reach, 7).astype(np.int64)
            value = random_priorities(1, dtype, rng)[0]
            tree.update(index, value)
        elif op == "single":
            value = random_priorities(1, dtype, rng)
            tree[int(index[0])] = float(value[0])
        else:
            value = random_priorities(index.size, dtype, rng)
            tree[index] = value
        model.update(index, value)
        assert_same_tree(tree, model)


def filled_tree_and_model(cls, size, grow, rng, some_positive=False):
    """A tree of ``size`` leaves and its model, every leaf written with random priorities (up to
    the capacity when ``grow``: the buffer is laid out again past ``size``); with
    ``some_positive``, at least one leaf is positive. Returns ``(tree, model, leaves written)``."""
    tree, model = cls(size), LayoutModel(cls, size)
    reach = model.capacity if grow else size
    index = np.arange(reach, dtype=np.int64)
    values = random_priorities(reach, _dtype(cls), rng)
    if some_positive and not values.any():
        values[rng.randint(0, reach)] = _dtype(cls).type(0.7)
    tree[index] = values
    model.update(index, values)
    return tree, model, reach


@pytest.mark.parametrize("cls", ALL_CLASSES)
@settings(max_examples=25, deadline=None)
@given(size=SIZES, seed=st.integers(0, 2**32 - 1), grow=st.booleans())
def test_queries_match_the_model(cls, size, seed, grow):
    np.random.seed(seed)
    rng = np.random
    tree, model, reach = filled_tree_and_model(cls, size, grow, rng)
    assert_same_tree(tree, model)
    bounds = [(0, size), (-3, size + 5), (0, reach), (0, 1), (size - 1, size), (0, 0)]
    bounds += [tuple(sorted(rng.randint(-2, reach + 3, 2))) for _ in range(40)]
    # ranges ending on 16-ary node boundaries, and one short of / past them
    bounds += [(max(0, b - 17 * rng.randint(0, 4)), b + d) for b in (16, 256, 4096) if b <= reach for d in (-1, 0, 1)]
    for l, r in bounds:
        got, expected = tree.query(int(l), int(r)), model.query(int(l), int(r))
        assert _bits(np.float64(got)) == _bits(np.float64(expected)), (l, r, got, expected)
    lo = np.array([l for l, _ in bounds], dtype=np.int64)
    hi = np.array([r for _, r in bounds], dtype=np.int64)
    out = tree.query(lo, hi)
    assert out.dtype == _dtype(cls)
    expected = np.array([model.query(int(l), int(r)) for l, r in bounds]).astype(_dtype(cls))
    np.testing.assert_array_equal(_bits(out), _bits(expected))


def boundary_masses(model, rng, limit=400):
    """Masses at every (or ``limit`` random) prefix-sum boundary and one dtype step either side:
    the prefix sums as the tree sees them (its queries from 0) and the exact ones."""
    reach = model.allocated
    ends = np.arange(1, reach + 1) if reach <= limit else np.unique(rng.randint(1, reach + 1, limit))
    exact = np.cumsum(model.leaves[:reach].astype(np.float64))
    marks = np.concatenate([[model.query(0, int(e)) for e in ends], exact[ends - 1], [model.total()]])
    marks = marks.astype(model.dtype)
    up = np.nextafter(marks, model.dtype.type(np.inf))
    down = np.nextafter(marks, model.dtype.type(-np.inf))
    special = np.array([0.0, -1.0, np.finfo(model.dtype).tiny, np.inf], dtype=model.dtype)
    uniform = (rng.uniform(0, 1.0, 200) * model.total()).astype(model.dtype)
    return np.concatenate([marks, up, down, special, uniform])


@pytest.mark.parametrize("cls", SUM_CLASSES)
@settings(max_examples=30, deadline=None)
@given(size=SIZES, seed=st.integers(0, 2**32 - 1), grow=st.booleans())
def test_scan_lower_bound_at_and_next_to_prefix_sums(cls, size, seed, grow):
    np.random.seed(seed)
    rng = np.random
    tree, model, reach = filled_tree_and_model(cls, size, grow, rng, some_positive=True)
    masses = boundary_masses(model, rng)
    got = tree.scan_lower_bound(masses)
    expected = model.scan(masses)
    bad = np.flatnonzero(got != expected)
    assert bad.size == 0, (
        f"{bad.size} masses differ, first {masses[bad[0]]!r}: tree {got[bad[0]]}, model {expected[bad[0]]}"
    )
    assert [tree.scan_lower_bound(float(m)) for m in masses[:20]] == list(expected[:20])
    # the documented promises, independent of the layout: 0 for a mass <= 0, size past the
    # total, else a leaf below the capacity (torchrl's descent can end on a zero-valued one),
    # non-decreasing with the mass
    x = masses.astype(np.float64)
    total = model.total()
    assert np.all(got[x <= 0] == 0) and np.all(got[x > total] == size)
    inside = (x > 0) & (x <= total)
    assert np.all(got[inside] < model.capacity)
    order = np.argsort(x[inside], kind="stable")
    assert np.all(np.diff(got[inside][order]) >= 0)
    # away from every prefix-sum boundary (more than the rounding of a sum could move it), the
    # leaf is the one exact arithmetic gives
    exact = np.cumsum(model.leaves[:reach].astype(np.float64))
    slack = 64 * np.finfo(_dtype(cls)).eps * total
    y = x[inside]
    at = np.searchsorted(exact, y, side="left")
    nearest = np.minimum(np.abs(y - exact[np.minimum(at, reach - 1)]), np.abs(y - exact[np.maximum(at - 1, 0)]))
    clear = nearest > slack
    np.testing.assert_array_equal(got[inside][clear], at[clear])
