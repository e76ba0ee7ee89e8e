"""``sample_prioritized_zeroed`` of replay's sum trees against the tree itself with the leaves
written to zero: what torchrl's ``PrioritizedSliceSampler`` does (zero, ``query``,
``scan_lower_bound``, clamp, step left off zero leaves, write back)."""
import numpy as np
import pytest
import torch

import replay

CLASSES = [(replay.SumSegmentTreeFp32, np.float32), (replay.SumSegmentTreeFp64, np.float64)]


def build(cls, size, values, grown=()):
    tree = cls(size)
    tree.update(np.arange(len(values)), values)
    for index in grown:  # leaves past ``size`` (below the capacity) grow the layout
        tree[index] = 1.5
    return tree


def torchrl_draws(zeroed, num_valid, masses):
    """torchrl's steps on a tree whose excluded leaves were written to zero."""
    index = np.minimum(np.asarray(zeroed.scan_lower_bound(masses)), num_valid - 1)
    for k in range(index.shape[0]):
        while zeroed[int(index[k])] == 0:
            index[k] -= 1
            assert index[k] >= 0  # torchrl raises here; ours goes right (not drawn below)
    return index


@pytest.mark.parametrize("cls,dtype", CLASSES)
@pytest.mark.parametrize("size", [1, 2, 15, 16, 17, 300, 5000, 70_000])
def test_matches_the_zeroed_tree(cls, dtype, size):
    rng = np.random.default_rng(size)
    for trial in range(5):
        # 14 orders of magnitude: the zeroed tree's rounded sums differ from the tree's
        values = (rng.random(size) * 10.0 ** rng.integers(-7, 7, size)).astype(dtype)
        values[rng.random(size) < 0.1] = 0
        grown = [size + 1] if trial == 4 and size > 2 and (size + 1) < (1 << int(size).bit_length()) else []
        num_valid = size if trial % 2 else int(rng.integers(1, size + 1))
        exclude = rng.integers(0, size, int(rng.integers(0, size + 1)))
        if trial == 3:
            exclude = np.concatenate([exclude, [-0, size + 5]])  # repeats and values past the leaves
        tree = build(cls, size, values, grown)
        zeroed = build(cls, size, values, grown)
        kept = np.unique(exclude[exclude < size])
        if kept.size:
            zeroed[kept] = 0.0
        p_sum = zeroed.query(0, num_valid)
        if not p_sum > 0 or not (np.asarray(zeroed[np.arange(num_valid)]) > 0).any():
            continue
        masses = np.concatenate([[p_sum, p_sum * (1 - 1e-12)], rng.uniform(0.0, p_sum, 300)])
        before = tree._py_buffer()
        seen = []

        def draw(total):
            seen.append(total)
            return masses

        index, priority = tree.sample_prioritized_zeroed(num_valid, exclude, draw)
        assert seen == [p_sum]  # the same float, to the bit
        expected = torchrl_draws(zeroed, num_valid, masses)
        np.testing.assert_array_equal(index, expected)
        np.testing.assert_array_equal(priority, np.asarray(tree[expected]))
        assert priority.dtype == dtype
        np.testing.assert_array_equal(tree._py_buffer(), before)  # never written
        # fp32 masses (torch.rand(...) * p_sum, with a generator)
        masses32 = torch.rand(64, generator=torch.Generator().manual_seed(trial)) * p_sum
        index, _ = tree.sample_prioritized_zeroed(num_valid, exclude, lambda total: masses32)
        np.testing.assert_array_equal(index, torchrl_draws(zeroed, num_valid, masses32.numpy()))


@pytest.mark.parametrize("cls,dtype", CLASSES)
def test_relative_to_refusals_and_empty(cls, dtype):
    tree = build(cls, 40, np.arange(40, dtype=dtype) % 5)
    index, priority = tree.sample_prioritized_zeroed(40, [1, 2], lambda total: [total / 2], relative_to=4.0)
    assert priority.dtype == dtype and priority[0] == tree[int(index[0])] / dtype(4.0)
    # the callback refuses: nothing drawn, the lock released
    with pytest.raises(RuntimeError, match="refused"):
        tree.sample_prioritized_zeroed(40, [1], lambda total: (_ for _ in ()).throw(RuntimeError("refused")))
    index, _ = tree.sample_prioritized_zeroed(40, np.zeros(0, dtype=np.int64), lambda total: np.zeros(0))
    assert index.shape == (0,)
    with pytest.raises(ValueError, match="NaN"):
        tree.sample_prioritized_zeroed(40, [3], lambda total: [float("nan")])
    with pytest.raises(IndexError, match="negative"):
        tree.sample_prioritized_zeroed(40, [-1, 3], lambda total: [1.0])
    with pytest.raises(IndexError, match="num_valid"):
        tree.sample_prioritized_zeroed(0, [3], lambda total: [1.0])
    # every leaf below num_valid excluded: the sum given is 0
    totals = []
    tree.sample_prioritized_zeroed(3, [0, 1, 2], lambda total: totals.append(total) or np.zeros(0))
    assert totals == [0.0]
    # a draw of exactly 0 with leaf 0 excluded: torchrl fails ("Failed to find a suitable
    # index"), this lands on the first positive leaf on the right
    index, _ = tree.sample_prioritized_zeroed(40, [0, 1], lambda total: [0.0])
    assert index.tolist() == [2]
