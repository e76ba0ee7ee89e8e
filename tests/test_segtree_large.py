"""The trees' paths for large trees: blocks of consecutive leaves written in one pass, and min
trees whose leaves are written when first reached (2^16 leaves and more).

Both must leave the trees bit for bit as the general paths do: a block written through a
shuffled index (the scatter path), a min tree whose every leaf was written first.
"""
import pickle

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import replay

SUM_CLASSES = [replay.SumSegmentTreeFp32, replay.SumSegmentTreeFp64]
MIN_CLASSES = [replay.MinSegmentTreeFp32, replay.MinSegmentTreeFp64]
LAZY = 2**16  # the size from which a min tree writes its leaves when first reached


def _dtype(cls):
    return np.float64 if cls.__name__.endswith("Fp64") else np.float32


def _identity(cls):
    return 0.0 if cls.__name__.startswith("Sum") else float(np.finfo(_dtype(cls)).max)


def _scattered(size, rng):
    """A write of leaves ``[first, first + n)`` as the scatter path takes it: shuffled."""
    def write(tree, first, values):
        order = rng.permutation(values.shape[0])
        if values.shape[0] > 1 and (order == np.arange(values.shape[0])).all():
            order = order[::-1].copy()
        tree[first + order] = values[order]
    return write


@pytest.mark.parametrize("cls", SUM_CLASSES + MIN_CLASSES)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_blocks_match_scattered_writes(cls, data):
    """Blocks of consecutive leaves at any offset (whole nodes or not, crossing nodes of every
    level), non-integer values: every level of the buffer (and a sum tree's mini-heaps) equals
    the one the same writes give through the scatter path, to the bit."""
    size = data.draw(st.sampled_from([1, 17, 300, 4099, LAZY + 5]), label="size")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    dtype = _dtype(cls)
    block, scattered = cls(size), cls(size)
    write = _scattered(size, rng)
    for _ in range(data.draw(st.integers(1, 6), label="writes")):
        first = data.draw(st.integers(0, size - 1), label="first")
        n = data.draw(st.integers(1, size - first), label="n")
        values = (rng.random(n) * rng.choice([1e-3, 1.0, 1e6])).astype(dtype)
        block[np.arange(first, first + n)] = values
        write(scattered, first, values)
        lo, hi = rng.integers(0, size, 16), rng.integers(0, size + 1, 16)
        np.testing.assert_array_equal(block.query(lo, hi), scattered.query(lo, hi))
    np.testing.assert_array_equal(block._py_buffer(), scattered._py_buffer())
    if cls in SUM_CLASSES:
        total = block.query(0, size)
        if total > 0:
            mass = (rng.random(64) * total).astype(dtype)
            np.testing.assert_array_equal(block.scan_lower_bound(mass), scattered.scan_lower_bound(mass))


@pytest.mark.parametrize("cls", SUM_CLASSES)
def test_block_refused_for_its_total_leaves_the_tree(cls):
    """A block whose sum would overflow is refused whole and the tree keeps its bits."""
    size = LAZY + 3
    tree = cls(size)
    tree[np.arange(size)] = np.full(size, 0.5, dtype=_dtype(cls))
    before = tree._py_buffer()
    big = np.full(10, np.finfo(_dtype(cls)).max / 4, dtype=_dtype(cls))
    with pytest.raises(ValueError, match="would make the sum"):
        tree[np.arange(100, 110)] = big
    np.testing.assert_array_equal(tree._py_buffer(), before)


@pytest.mark.parametrize("cls", SUM_CLASSES + MIN_CLASSES)
def test_a_large_tree_reads_its_identity_before_any_write(cls):
    """Built, never written: every leaf, query and the pickled state read the identity."""
    size = LAZY * 2 + 7
    tree = cls(size)
    identity = _identity(cls)
    assert tree.query(0, size) == identity
    assert tree.query(5, size - 3) == identity
    assert tree.at(size - 1) == identity
    np.testing.assert_array_equal(tree.at(np.array([0, 7, size - 1])), np.full(3, identity, _dtype(cls)))
    assert (tree.values() == identity).all()
    again = pickle.loads(pickle.dumps(tree))
    assert again.query(0, size) == identity and (again.values() == identity).all()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("block"), st.floats(0, 1), st.integers(1, 9000)),
        st.tuples(st.just("points"), st.lists(st.floats(0, 1), min_size=1, max_size=40)),
        st.tuples(st.just("fill"), st.floats(0, 1), st.integers(1, 3000)),
        st.tuples(st.just("read"), st.lists(st.floats(0, 1), min_size=2, max_size=8)),
        st.tuples(st.just("past"), st.floats(0, 1)),
    ),
    min_size=1, max_size=8)


@pytest.mark.parametrize("pair", list(zip(SUM_CLASSES, MIN_CLASSES)))
@settings(max_examples=40, deadline=None)
@given(ops=OPS, seed=st.integers(0, 2**32 - 1))
def test_lazy_min_tree_matches_one_written_whole(pair, ops, seed):
    """A large min tree (its leaves written when first reached) against one whose every leaf
    was written with the identity first, and a numpy model: updates anywhere (ahead of the
    leaves written so far, behind them, past ``size`` where the trees grow), blocks, fills as
    ranges, reads of leaves not reached yet; every read the same, the buffers equal at the end."""
    sum_cls, min_cls = pair
    dtype = _dtype(min_cls)
    identity = _identity(min_cls)
    size = LAZY + 1234
    capacity = 1 << size.bit_length()
    rng = np.random.default_rng(seed)
    lazy, whole, sums = min_cls(size), min_cls(size), sum_cls(size)
    whole[np.arange(size)] = np.full(size, identity, dtype=dtype)
    model = np.full(capacity, identity)
    for op in ops:
        kind = op[0]
        if kind == "block":
            first = int(op[1] * (size - 1))
            n = min(op[2], size - first)
            values = (rng.random(n) + 0.01).astype(dtype)
            index = np.arange(first, first + n)
            lazy[index] = values
            whole[index] = values
            model[index] = values
        elif kind == "points":
            index = np.array([int(x * (size - 1)) for x in op[1]])
            values = (rng.random(index.shape[0]) + 0.01).astype(dtype)
            replay.update_priority_pair(sums, lazy, index, values, values)
            whole[index] = values
            for i, v in zip(index, values):
                model[i] = v
        elif kind == "fill":
            first = int(op[1] * (size - 1))
            n = min(op[2], size - first)
            index = np.arange(first, first + n)
            value = float(rng.random() + 0.01)
            assert replay.fill_priority_pair(sums, lazy, index, value)
            whole[index] = np.full(n, value, dtype=dtype)
            model[index] = np.float64(dtype(value))
        elif kind == "past":  # a leaf in [size, capacity): both trees grow
            i = size + int(op[1] * (capacity - size - 1))
            value = dtype(rng.random() + 0.01)
            lazy[i] = value
            whole[i] = value
            model[i] = value
        else:
            bounds = sorted(int(x * capacity) for x in op[1])
            lo, hi = np.array(bounds[:-1]), np.array(bounds[1:])
            np.testing.assert_array_equal(lazy.query(lo, hi), whole.query(lo, hi))
            for a, b in zip(lo, hi):
                expected = model[a:min(b, capacity)].min() if b > a else identity
                if a <= 0 and b >= size:
                    expected = model.min()
                assert lazy.query(int(a), int(b)) == whole.query(int(a), int(b)) == np.float64(dtype(expected))
            points = np.clip(lo, 0, capacity - 1)
            np.testing.assert_array_equal(lazy.at(points), whole.at(points))
            assert lazy.at(int(points[-1])) == whole.at(int(points[-1]))
    assert lazy.query(0, size) == whole.query(0, size)
    np.testing.assert_array_equal(lazy.values(), whole.values())
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(lazy)).values(), whole.values())
    np.testing.assert_array_equal(lazy._py_buffer(), whole._py_buffer())


@pytest.mark.parametrize("cls", MIN_CLASSES)
def test_lazy_min_tree_refused_write_leaves_it_as_it_was(cls):
    """A refused batch (a NaN after a leaf far ahead of the leaves written) changes no read."""
    size = LAZY * 4
    tree = cls(size)
    tree[np.arange(10)] = np.arange(1, 11, dtype=_dtype(cls))
    with pytest.raises(ValueError, match="value nan at position 1"):
        tree[np.array([size - 1, 3])] = np.array([0.5, np.nan], dtype=_dtype(cls))
    assert tree.query(0, size) == 1.0
    assert tree.query(10, size) == _identity(cls)
    assert tree.at(size - 1) == _identity(cls)
    for outside in (4 * size, 2**63 - 1):  # (the largest int64 too: no overflow reaching it)
        with pytest.raises(IndexError):
            tree[np.array([outside])] = np.array([0.5], dtype=_dtype(cls))
        assert tree.query(0, size) == 1.0 and tree.at(size - 1) == _identity(cls)


@pytest.mark.parametrize("cls", SUM_CLASSES + MIN_CLASSES)
def test_state_loaded_into_a_large_tree(cls):
    """``__setstate__`` of a large tree (every leaf written at once) reads as the state."""
    size = LAZY + 99
    rng = np.random.default_rng(3)
    state = (rng.random(size) + 0.1).astype(_dtype(cls))
    tree = cls(size)
    tree.__setstate__(state)
    np.testing.assert_array_equal(tree.values(), state)
    expected = state.min() if cls in MIN_CLASSES else None
    if expected is not None:
        assert tree.query(0, size) == np.float64(expected)
        assert tree.query(size // 2, size) == np.float64(state[size // 2:].min())
