"""``replay.fill_priority_pair`` (the range fill of a default priority) against a numpy model and
against ``replay.update_priority_pair`` with the same scalar value, for fp32 and fp64 trees.

The whole buffer of each tree (every level, and a sum tree's prefix sums) is compared, not
only its leaves: a tree is a pure function of its leaves, so a fill must leave the very bits a
fresh tree holding the same leaves has.
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import replay

PAIRS = [
    (replay.SumSegmentTreeFp32, replay.MinSegmentTreeFp32),
    (replay.SumSegmentTreeFp64, replay.MinSegmentTreeFp64),
]
INT64_MAX = 2**63 - 1


def _dtype(cls):
    return np.float64 if cls.__name__.endswith("Fp64") else np.float32


def _filled_pair(sum_cls, min_cls, size, rng, grown=False):
    """A pair of trees with random leaves (all ``capacity`` of them when ``grown``)."""
    sum_tree, min_tree = sum_cls(size), min_cls(size)
    count = sum_tree.capacity if grown else size
    values = rng.random(count) * 4
    values[rng.random(count) < 0.2] = 0.0
    replay.update_priority_pair(sum_tree, min_tree, np.arange(count), values, values)
    return sum_tree, min_tree


def _leaves(tree):
    return np.asarray(tree[np.arange(tree.capacity)], dtype=np.float64)


def _fresh_buffer(tree_cls, size, leaves, grown):
    """The buffer of a new tree holding ``leaves`` (laid out for ``capacity`` leaves when
    ``grown``): what any tree holding them must hold, bit for bit."""
    tree = tree_cls(size)
    count = leaves.shape[0] if grown else size
    tree[np.arange(count)] = leaves[:count]
    return tree._py_buffer()


def _copy_pair(sum_tree, min_tree, size, grown):
    pair = tuple(type(tree)(size) for tree in (sum_tree, min_tree))
    count = sum_tree.capacity if grown else size
    for new, old in zip(pair, (sum_tree, min_tree)):
        new[np.arange(count)] = _leaves(old)[:count]
    return pair


def _runs_index(rng, size, capacity, kind):
    """An index of the kind a writer marks: one run, two runs (a write that wraps), or a run
    followed by an overlapping one; within ``[0, size)`` or reaching past it (``capacity``)."""
    limit = capacity if rng.random() < 0.25 else size
    if kind == "one":
        start = int(rng.integers(0, limit))
        return np.arange(start, int(rng.integers(start, limit + 1)))
    if kind == "wrap":
        n = int(rng.integers(1, limit + 1))
        start = int(rng.integers(0, limit))
        return (start + np.arange(n)) % limit
    start = int(rng.integers(0, limit))
    first = np.arange(start, int(rng.integers(start + 1, limit + 1)))
    return np.concatenate([first, first[: int(rng.integers(1, first.shape[0] + 1))]])


@pytest.mark.parametrize("sum_cls,min_cls", PAIRS)
@settings(max_examples=120, deadline=None)
@given(
    size=st.integers(1, 300),
    kind=st.sampled_from(["one", "wrap", "overlap"]),
    as_tensor=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_fill_matches_model_and_update(sum_cls, min_cls, size, kind, as_tensor, seed):
    rng = np.random.default_rng(seed)
    grown = seed % 5 == 0
    sum_tree, min_tree = _filled_pair(sum_cls, min_cls, size, rng, grown)
    twin_sum, twin_min = _copy_pair(sum_tree, min_tree, size, grown)
    sum_model, min_model = _leaves(sum_tree), _leaves(min_tree)  # past size: each identity
    for _ in range(3):
        index = _runs_index(rng, size, sum_tree.capacity, kind)
        value = float(rng.random() * 3) if rng.random() < 0.9 else 0.0
        given_index = torch.as_tensor(index) if as_tensor else index
        assert replay.fill_priority_pair(sum_tree, min_tree, given_index, value) is True
        if index.size:
            replay.update_priority_pair(twin_sum, twin_min, index, value, value)
        sum_model[index] = min_model[index] = _dtype(sum_cls)(value)
        grown = grown or bool(index.size and index.max() >= size)
        np.testing.assert_array_equal(_leaves(sum_tree), sum_model)
        np.testing.assert_array_equal(_leaves(min_tree), min_model)
        np.testing.assert_array_equal(sum_tree._py_buffer(), twin_sum._py_buffer())
        np.testing.assert_array_equal(min_tree._py_buffer(), twin_min._py_buffer())
        np.testing.assert_array_equal(sum_tree._py_buffer(), _fresh_buffer(sum_cls, size, sum_model, grown))
        np.testing.assert_array_equal(min_tree._py_buffer(), _fresh_buffer(min_cls, size, min_model, grown))
        np.testing.assert_allclose(sum_tree.query(0, size), sum_model.sum(), rtol=1e-5)
        assert min_tree.query(0, size) == min_model.min()


@pytest.mark.parametrize("sum_cls,min_cls", PAIRS)
def test_fill_of_a_large_tree_refreshes_only_its_ranges(sum_cls, min_cls):
    """A 2^16-leaf tree (five levels): runs across node boundaries at every level, the write
    that wraps at the end, a single leaf, and the whole tree."""
    size = 1 << 16
    rng = np.random.default_rng(0)
    sum_tree, min_tree = _filled_pair(sum_cls, min_cls, size, rng)
    model = _leaves(sum_tree)[:size]
    for index in (
        np.arange(4095, 4097 + 300),
        (size - 700 + np.arange(1000)) % size,
        np.arange(17, 18),
        np.arange(size),
        np.arange(255, 257),
    ):
        value = float(rng.random())
        assert replay.fill_priority_pair(sum_tree, min_tree, index, value)
        model[index] = _dtype(sum_cls)(value)
        np.testing.assert_array_equal(sum_tree._py_buffer(), _fresh_buffer(sum_cls, size, model, False))
        np.testing.assert_array_equal(min_tree._py_buffer(), _fresh_buffer(min_cls, size, model, False))


@pytest.mark.parametrize("sum_cls,min_cls", PAIRS)
def test_more_than_two_runs_are_left_to_the_update(sum_cls, min_cls):
    sum_tree, min_tree = _filled_pair(sum_cls, min_cls, 50, np.random.default_rng(1))
    before = sum_tree._py_buffer(), min_tree._py_buffer()
    for index in ([1, 3, 5], [4, 5, 9, 10, 0], [7, 6, 5], [INT64_MAX]):
        assert replay.fill_priority_pair(sum_tree, min_tree, np.array(index), 1.0) is False
        np.testing.assert_array_equal(sum_tree._py_buffer(), before[0])
        np.testing.assert_array_equal(min_tree._py_buffer(), before[1])
    # empty: nothing to write, done
    assert replay.fill_priority_pair(sum_tree, min_tree, np.array([], dtype=np.int64), 1.0) is True
    np.testing.assert_array_equal(sum_tree._py_buffer(), before[0])


@pytest.mark.parametrize("sum_cls,min_cls", PAIRS)
def test_rejected_fill_changes_nothing(sum_cls, min_cls):
    sum_tree, min_tree = sum_cls(8), min_cls(8)
    replay.update_priority_pair(sum_tree, min_tree, np.arange(8), np.arange(1.0, 9.0), np.arange(1.0, 9.0))
    big = float(np.finfo(_dtype(sum_cls)).max) * 0.6
    cases = [
        (IndexError, r"index -1 at position 0 is out of range for size 8: .* \[0, 16\)", np.arange(-1, 3), 1.0),
        (IndexError, r"index 16 at position 3 is out of range for size 8", np.arange(13, 18), 1.0),
        # the second run (the wrap) is past the capacity: the first one is not written either
        (IndexError, r"index 16 at position 4 is out of range for size 8", np.array([6, 7, 14, 15, 16]), 1.0),
        (ValueError, "value nan at position 0 cannot be stored in a sum segment tree", np.arange(2), float("nan")),
        (ValueError, "value -1.0 at position 0 cannot be stored", np.arange(2), -1.0),
        (ValueError, "value inf at position 0 cannot be stored", np.arange(2), float("inf")),
        (ValueError, "would make the sum of the tree's leaves", np.arange(2), big),
        (TypeError, "index must hold integers", np.arange(2.0), 1.0),
        (TypeError, "value must be a real number, got ndarray", np.arange(2), np.ones(2)),
    ]
    if _dtype(sum_cls) == np.float32:
        # inf once cast, as update_priority_pair casts it (which names the cast, inf)
        cases.append((ValueError, r"value 1e\+39 at position 0 cannot be stored", np.arange(2), 1e39))
    before = sum_tree._py_buffer(), min_tree._py_buffer()
    for error, message, index, value in cases:
        with pytest.raises(error, match=message):
            replay.fill_priority_pair(sum_tree, min_tree, index, value)
        np.testing.assert_array_equal(sum_tree._py_buffer(), before[0])
        np.testing.assert_array_equal(min_tree._py_buffer(), before[1])
        if error is ValueError and value != 1e39:
            # update_priority_pair refuses the same value with the same message
            with pytest.raises(error, match=message):
                replay.update_priority_pair(sum_tree, min_tree, index, value, 1.0)
    with pytest.raises(TypeError, match="fill_priority_pair takes a sum tree, then a min tree"):
        replay.fill_priority_pair(sum_tree, sum_cls(8), np.arange(2), 1.0)
    with pytest.raises(TypeError, match="share a size and dtype"):
        replay.fill_priority_pair(sum_tree, min_cls(9), np.arange(2), 1.0)
    # a missing tree is refused by name (it crashed the process)
    for name, pair in (("sum_tree", (None, min_tree)), ("min_tree", (sum_tree, None))):
        with pytest.raises(TypeError, match=f"Argument '{name}' has incorrect type .*got NoneType"):
            replay.fill_priority_pair(*pair, np.arange(2), 1.0)
        with pytest.raises(TypeError, match=f"Argument '{name}' has incorrect type .*got NoneType"):
            replay.update_priority_pair(*pair, np.arange(2), np.ones(2), np.ones(2))
    np.testing.assert_array_equal(sum_tree._py_buffer(), before[0])


@pytest.mark.parametrize("sum_cls,min_cls", PAIRS)
def test_near_the_limit_the_exact_total_decides(sum_cls, min_cls):
    """A value above the fast bound whose fill keeps the total finite is written (the old
    leaves saved, the total checked after the write); one that does not is undone."""
    top = float(np.finfo(_dtype(sum_cls)).max)
    sum_tree, min_tree = sum_cls(4), min_cls(4)
    replay.update_priority_pair(sum_tree, min_tree, np.arange(4), top * 0.2, top * 0.2)
    assert replay.fill_priority_pair(sum_tree, min_tree, np.arange(1, 3), top * 0.25)
    assert np.isfinite(sum_tree.query(0, 4))
    before = sum_tree._py_buffer()
    with pytest.raises(ValueError, match="would make the sum"):
        replay.fill_priority_pair(sum_tree, min_tree, np.array([3, 0]), top * 0.4)
    np.testing.assert_array_equal(sum_tree._py_buffer(), before)


def test_index_runs_hook_matches_python():
    """The run split the fill relies on, against a Python loop (through the fill's result)."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(0, 12))
        index = np.cumsum(rng.integers(-1, 3, n)) + 5
        runs = 0
        for k in range(n):
            if k == 0 or index[k] != index[k - 1] + 1:
                runs += 1
        sum_tree, min_tree = replay.SumSegmentTreeFp32(64), replay.MinSegmentTreeFp32(64)
        handled = replay.fill_priority_pair(sum_tree, min_tree, index, 1.0)
        assert handled is (runs <= 2)
        if handled:
            expected = np.zeros(64)
            expected[index] = 1.0
            np.testing.assert_array_equal(sum_tree.values(), expected)


def test_docstring_example_runs():
    import doctest

    test = doctest.DocTestParser().get_doctest(replay.fill_priority_pair.__doc__, {}, "fill_priority_pair", None, 0)
    runner = doctest.DocTestRunner()
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0 and test.examples
