"""``sample_prioritized_excluding`` of replay's sum trees against a numpy model."""
import numpy as np
import pytest
import torch

import replay

CLASSES = [(replay.SumSegmentTreeFp32, np.float32), (replay.SumSegmentTreeFp64, np.float64)]


def model(leaves, num_valid, exclude, uniform, size=None):
    """torchrl's sampling rule over a masked float64 copy: the mass spans ``query(0, num_valid)``
    (every leaf below the capacity once ``num_valid`` reaches the tree's ``size``), searchsorted,
    clamp to ``num_valid - 1``, step off zero leaves (left, then right)."""
    size = len(leaves) if size is None else size
    capacity = 1 << int(size).bit_length()
    padded = np.zeros(capacity)
    padded[: len(leaves)] = leaves
    mass_end = capacity if num_valid >= size else num_valid
    masked = padded[:mass_end]
    exclude = np.asarray(exclude, dtype=np.int64)
    masked[exclude[(exclude >= 0) & (exclude < mass_end)]] = 0
    prefix = np.cumsum(masked)
    limit = min(num_valid, capacity)
    index = np.minimum(np.searchsorted(prefix, uniform * prefix[-1], side="left"), limit - 1)
    positive = np.flatnonzero(masked[:limit] > 0)
    for k, i in enumerate(index):
        if masked[i] == 0:
            left = positive[positive <= i]
            index[k] = left[-1] if left.size else positive[positive >= i][0]
    return index


def make_tree(cls, values, size=None):
    tree = cls(len(values) if size is None else size)
    tree.update(np.arange(len(values)), values)
    return tree


@pytest.mark.parametrize("cls,dtype", CLASSES)
@pytest.mark.parametrize("size", [1, 2, 15, 16, 17, 300, 5000])
def test_matches_model(cls, dtype, size):
    rng = np.random.default_rng(size)
    for trial in range(6):
        # small integers: every sum is exact in fp32 too, so the model is exact
        values = rng.integers(0, 5, size).astype(dtype)
        values[rng.integers(0, size)] = 3
        num_valid = size if trial % 2 else int(rng.integers(1, size + 1))
        exclude = rng.integers(-2, size + 2, int(rng.integers(0, size + 1)))
        masked = values[:num_valid].copy()
        kept = exclude[(exclude >= 0) & (exclude < num_valid)]
        masked[kept] = 0
        if not (masked > 0).any():
            continue
        tree = make_tree(cls, values)
        before = tree.values()
        uniform = np.concatenate([[0.0, 1.0], rng.random(200)])
        index, priority, weight = tree.sample_prioritized_excluding(num_valid, exclude, uniform)
        np.testing.assert_array_equal(index, model(values, num_valid, exclude, uniform))
        np.testing.assert_array_equal(priority, values[index])
        assert priority.dtype == dtype and weight is None
        assert not np.isin(index, kept).any() and (priority > 0).all()
        np.testing.assert_array_equal(tree.values(), before)  # never modified


@pytest.mark.parametrize("cls,dtype", CLASSES)
def test_no_exclusion_is_sample_prioritized(cls, dtype):
    rng = np.random.default_rng(1)
    tree = make_tree(cls, rng.uniform(0, 2, 1000).astype(dtype))
    uniform = rng.random(300)
    a = tree.sample_prioritized(900, uniform, p_min=0.5, beta=0.4)
    b = tree.sample_prioritized_excluding(900, np.zeros(0, dtype=np.int64), uniform, p_min=0.5, beta=0.4)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    c = tree.sample_prioritized(900, batch_size=64, seed=7)
    d = tree.sample_prioritized_excluding(900, [950, -1], batch_size=64, seed=7)
    np.testing.assert_array_equal(c[0], d[0])


@pytest.mark.parametrize("cls,dtype", CLASSES)
def test_weights_tensors_and_nd_exclude(cls, dtype):
    rng = np.random.default_rng(2)
    values = rng.uniform(0.1, 2, 64).astype(dtype)
    tree = make_tree(cls, values)
    exclude = torch.tensor([[5, 3], [3, 60]])  # any shape, order and repeats
    uniform = torch.rand(50, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    index, priority, weight = tree.sample_prioritized_excluding(64, exclude, uniform, p_min=0.1, beta=0.7)
    assert isinstance(index, torch.Tensor) and index.dtype == torch.int64
    np.testing.assert_array_equal(index.numpy(), model(values, 64, exclude.numpy().ravel(), uniform.numpy()))
    np.testing.assert_allclose(weight.numpy(), (values[index.numpy()].astype(np.float64) / 0.1) ** -0.7)
    empty = tree.sample_prioritized_excluding(64, exclude, np.zeros(0))
    assert empty[0].shape == (0,) and empty[1].shape == (0,)


def test_frequencies():
    rng = np.random.default_rng(3)
    values = np.arange(1, 41, dtype=np.float64)
    tree = make_tree(replay.SumSegmentTreeFp64, values)
    exclude = np.array([0, 7, 8, 9, 39, 20])
    draws = 200_000
    index, _, _ = tree.sample_prioritized_excluding(40, exclude, rng.random(draws))
    masked = values.copy()
    masked[exclude] = 0
    expected = masked / masked.sum() * draws
    counts = np.bincount(index, minlength=40)
    assert counts[exclude].sum() == 0
    keep = expected > 0
    chi2 = float((((counts - expected)[keep]) ** 2 / expected[keep]).sum())
    assert chi2 < 62.5  # chi-square, 33 degrees of freedom, p = 0.999


@pytest.mark.parametrize("cls,dtype", CLASSES)
def test_errors_leave_tree_usable(cls, dtype):
    tree = make_tree(cls, np.array([0.0, 1.0, 2.0, 0.0], dtype=dtype))
    with pytest.raises(IndexError, match=r"num_valid=0 must be at least 1"):
        tree.sample_prioritized_excluding(0, [1], [0.5])
    with pytest.raises(ValueError, match="uniform draw 1.5 at position 1 is not in"):
        tree.sample_prioritized_excluding(4, [1], [0.5, 1.5])
    with pytest.raises(RuntimeError, match="no positive priority among the first 4 leaves outside the 2 excluded"):
        tree.sample_prioritized_excluding(4, [2, 1], [0.5])
    with pytest.raises(RuntimeError, match="no positive priority among the first 2 leaves"):
        tree.sample_prioritized_excluding(2, [1], [0.5])
    with pytest.raises(TypeError, match="exclude must hold integers"):
        tree.sample_prioritized_excluding(4, [1.0], [0.5])
    with pytest.raises(ValueError, match="p_min must be positive"):
        tree.sample_prioritized_excluding(4, [1], [0.5], p_min=0.0, beta=1.0)
    index, priority, _ = tree.sample_prioritized_excluding(4, [1], [0.0, 0.3, 1.0])
    assert index.tolist() == [2, 2, 2] and priority.tolist() == [2.0, 2.0, 2.0]
    assert tree.values().tolist() == [0.0, 1.0, 2.0, 0.0]


@pytest.mark.parametrize("cls,dtype", CLASSES)
@pytest.mark.parametrize("block", [1, 3, 16, 31])
def test_runs_of_excluded_leaves_match_model(cls, dtype, block):
    """Excluded leaves in runs, as PrioritizedSliceSampler passes them (the last steps of every
    trajectory, one run cut in two by the wrap-around)."""
    rng = np.random.default_rng(block)
    size = 4099
    values = rng.integers(0, 7, size).astype(dtype)
    for num_valid in (size, 3000):
        ends = np.cumsum(rng.integers(block + 1, 4 * block + 40, 400))
        ends = ends[ends <= num_valid]
        exclude = np.concatenate([np.arange(0, block // 2 + 1)] + [np.arange(e - block, e) for e in ends])
        exclude = np.unique(exclude[exclude < num_valid])
        tree = make_tree(cls, values)
        uniform = np.concatenate([[0.0, 1.0], rng.random(500)])
        index, priority, _ = tree.sample_prioritized_excluding(num_valid, torch.as_tensor(exclude), uniform)
        np.testing.assert_array_equal(index, model(values, num_valid, exclude, uniform))
        assert not np.isin(index, exclude).any()


@pytest.mark.parametrize("cls,dtype", CLASSES)
@pytest.mark.parametrize("size", [1, 3, 5, 16, 17, 149])
def test_leaves_past_size_match_torchrls_rule(cls, dtype, size):
    """A storage longer than the tree: leaves past ``size`` (below the capacity) written, and
    ``num_valid`` below, at and past the capacity. With and without excluded leaves."""
    rng = np.random.default_rng(size)
    capacity = 1 << size.bit_length()
    for trial in range(12):
        written = int(rng.integers(size, capacity + 1))
        values = rng.integers(0, 5, written).astype(dtype)
        values[int(rng.integers(0, min(size, written)))] = 3
        num_valid = int(rng.integers(1, 2 * capacity + 2))
        exclude = rng.integers(-2, capacity + 2, int(rng.integers(0, 4))) if trial % 2 else []
        mass_end = capacity if num_valid >= size else num_valid
        masked = np.zeros(capacity)
        masked[:written] = values
        kept = np.asarray(exclude, dtype=np.int64)
        masked[kept[(kept >= 0) & (kept < mass_end)]] = 0
        if not (masked[: min(num_valid, capacity)] > 0).any():
            continue
        tree = make_tree(cls, values, size)
        uniform = np.concatenate([[0.0, 1.0], rng.random(300)])
        expected = model(values, num_valid, exclude, uniform, size=size)
        index, priority, _ = tree.sample_prioritized_excluding(num_valid, exclude, uniform)
        np.testing.assert_array_equal(index, expected)
        np.testing.assert_array_equal(priority, masked[index].astype(dtype))
        if not len(exclude):
            index, priority, _ = tree.sample_prioritized(num_valid, uniform)
            np.testing.assert_array_equal(index, expected)
