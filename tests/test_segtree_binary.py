"""replay's sum trees against a numpy model of torchrl's binary heap (tests/torchrl_heap.py), bit
for bit: the sums (``query``), the descents (``scan_lower_bound``), the fused draws
(``sample_prioritized`` with masses or uniforms) and the zeroed draws
(``sample_prioritized_zeroed``), on non-integer leaves, at sizes around every power of 2 and 16,
with masses on and next to the prefix sums the descents compare with."""
import numpy as np
import pytest
import torch

import replay
from torchrl_heap import BinaryHeapSumTree

CLASSES = [(replay.SumSegmentTreeFp32, np.float32), (replay.SumSegmentTreeFp64, np.float64)]
SIZES = [1, 2, 3, 5, 15, 16, 17, 31, 32, 33, 100, 255, 256, 257, 1000, 1023, 1024, 4095, 4096, 4097, 5000]


def _leaves(rng, size, dtype, zeros=0.1):
    """Non-integer leaves over several orders of magnitude, some of them 0."""
    values = (rng.random(size) * 10.0 ** rng.integers(-3, 4, size)).astype(dtype)
    values[rng.random(size) < zeros] = 0
    return values


def _tree(cls, values, size=None):
    tree = cls(len(values) if size is None else size)
    tree.update(np.arange(len(values)), values)
    return tree


def _boundary_masses(rng, model, dtype, n=400):
    """Uniform masses, and masses on and one or two units either side of the prefix sums the
    descent meets: each leaf's running sum (float64, rounded) and the binary nodes' left sums."""
    root = model.root
    cumsum = np.cumsum(model.values[model.capacity:model.capacity + model.size].astype(np.float64)).astype(dtype)
    picks = cumsum[rng.integers(0, cumsum.size, min(cumsum.size, 200))]
    inner = model.values[1:model.capacity][rng.integers(0, model.capacity - 1, min(model.capacity - 1, 100))]
    near = np.concatenate([picks, inner, [root]])
    masses = [rng.uniform(0.0, float(root), n).astype(dtype), near]
    for _ in range(2):
        near_up = np.nextafter(near, dtype(np.inf))
        near_down = np.nextafter(near, dtype(-np.inf))
        masses += [near_up, near_down]
        near = np.concatenate([near_up, near_down])
    masses.append(np.array([0, -1, np.finfo(dtype).tiny, root * dtype(2)], dtype=dtype))
    return np.concatenate(masses).astype(dtype)


def _bits(x, dtype):
    return np.asarray(x, dtype=dtype).view(np.uint32 if dtype == np.float32 else np.uint64)


@pytest.mark.parametrize("cls,dtype", CLASSES)
@pytest.mark.parametrize("size", SIZES)
def test_sums_and_descents_are_torchrls(cls, dtype, size):
    rng = np.random.default_rng(size)
    for trial in range(3):
        values = _leaves(rng, size, dtype, zeros=[0.0, 0.1, 0.7][trial])
        tree = _tree(cls, values)
        model = BinaryHeapSumTree(values, dtype=dtype)
        # the root, and query(l, r) over random ranges (every length, both ends anywhere)
        assert _bits(tree.query(0, size), dtype) == _bits(model.root, dtype)
        lo = rng.integers(0, size + 1, 200)
        hi = rng.integers(0, model.capacity + 1, 200)
        got = [tree.query(int(a), int(b)) for a, b in zip(lo, hi)]
        np.testing.assert_array_equal(_bits(got, dtype), _bits([model.query(int(a), int(b)) for a, b in zip(lo, hi)], dtype))
        np.testing.assert_array_equal(_bits(tree.query(lo, hi), dtype), _bits(got, dtype))
        # the descents, on and next to every kind of boundary
        masses = _boundary_masses(rng, model, dtype)
        np.testing.assert_array_equal(tree.scan_lower_bound(masses), model.scan_lower_bound(masses))


@pytest.mark.parametrize("cls,dtype", CLASSES)
@pytest.mark.parametrize("size", [16, 256, 4096, 1000, 70_000])
def test_every_write_path_gives_torchrls_nodes(cls, dtype, size):
    """Scattered updates, repeated indices, broadcast values, in-order rewrites and range fills
    leave the tree's nodes those of torchrl's tree over the same leaves: checked through the
    sums and descents that read them."""
    rng = np.random.default_rng(size + 1)
    values = _leaves(rng, size, dtype)
    tree = _tree(cls, values)
    for step in range(6):
        if step == 0:
            index = rng.integers(0, size, 50)
            new = _leaves(rng, 50, dtype)
        elif step == 1:
            index = rng.integers(0, size, size // 2)
            new = _leaves(rng, index.size, dtype)
        elif step == 2:
            index = np.arange(size)
            new = _leaves(rng, size, dtype)
        elif step == 3:
            index = rng.integers(0, size, 40)
            new = np.full(40, dtype(0.3))
        elif step == 4:
            start = int(rng.integers(0, size))
            index = np.arange(start, min(size, start + 300))
            new = np.full(index.size, dtype(1.7))
        else:
            index = np.arange(size // 3)
            new = _leaves(rng, index.size, dtype)
        if step == 4:
            replay.fill_priority_pair(tree, replay.MinSegmentTreeFp32(size) if dtype == np.float32
                                      else replay.MinSegmentTreeFp64(size), index, float(new[0]))
        else:
            tree[index] = new
        for i, v in zip(index, new):
            values[i] = v
        model = BinaryHeapSumTree(values, dtype=dtype)
        assert _bits(tree.query(0, size), dtype) == _bits(model.root, dtype)
        lo = rng.integers(0, size, 50)
        hi = lo + rng.integers(1, size, 50)
        np.testing.assert_array_equal(_bits(tree.query(lo, hi), dtype),
                                      _bits([model.query(int(a), int(b)) for a, b in zip(lo, hi)], dtype))
        masses = _boundary_masses(rng, model, dtype, n=200)
        np.testing.assert_array_equal(tree.scan_lower_bound(masses), model.scan_lower_bound(masses))


@pytest.mark.parametrize("cls,dtype", CLASSES)
@pytest.mark.parametrize("size", [5, 16, 300, 4096, 5000])
def test_fused_draws_are_torchrls(cls, dtype, size):
    """sample_prioritized with torchrl's masses (numpy's uniform(0, p_sum), float64, and torch's
    fp32 rand * p_sum), and with uniforms (mass = u * p_sum in float64): torchrl's leaves."""
    rng = np.random.default_rng(size + 2)
    for trial in range(4):
        values = _leaves(rng, size, dtype, zeros=0.3)
        values[0] = dtype(0.25)  # torchrl fails when a draw steps left of leaf 0
        tree = _tree(cls, values)
        model = BinaryHeapSumTree(values, dtype=dtype)
        num_valid = size if trial % 2 == 0 else int(rng.integers(1, size + 1))
        p_sum = tree.query(0, num_valid)
        assert _bits(p_sum, dtype) == _bits(model.query(0, num_valid), dtype)
        masses = np.concatenate([np.random.default_rng(trial).uniform(0.0, p_sum, 500),
                                 _boundary_masses(rng, model, dtype, n=0).astype(np.float64)])
        masses = masses[masses > 0]
        index, priority, weight = tree.sample_prioritized(num_valid, mass=masses, p_min=0.25, beta=0.6)
        expected = model.draws(masses, num_valid)
        np.testing.assert_array_equal(index, expected)
        np.testing.assert_array_equal(priority, values[expected])
        masses32 = torch.rand(300, generator=torch.Generator().manual_seed(trial)) * p_sum
        index, _, _ = tree.sample_prioritized(num_valid, mass=masses32)
        np.testing.assert_array_equal(index.numpy(), model.draws(masses32.numpy(), num_valid))
        uniform = rng.random(300)
        index, _, _ = tree.sample_prioritized(num_valid, uniform)
        np.testing.assert_array_equal(index, model.draws(uniform * float(p_sum), num_valid))


@pytest.mark.parametrize("cls,dtype", CLASSES)
@pytest.mark.parametrize("size", [1, 16, 17, 300, 4096, 5000])
def test_zeroed_draws_are_torchrls(cls, dtype, size):
    """sample_prioritized_zeroed against torchrl's tree with the excluded leaves written to 0:
    the sum handed to the mass callback and every draw, to the bit."""
    rng = np.random.default_rng(size + 3)
    for trial in range(4):
        values = _leaves(rng, size, dtype, zeros=0.2)
        tree = _tree(cls, values)
        exclude = np.unique(rng.integers(0, size, int(rng.integers(0, size + 1))))
        zeroed = values.copy()
        zeroed[exclude] = 0
        model = BinaryHeapSumTree(zeroed, dtype=dtype)
        num_valid = size if trial % 2 == 0 else int(rng.integers(1, size + 1))
        if not (zeroed[:num_valid] > 0).any() or zeroed[0] == 0:
            zeroed[0] = values[0] = dtype(0.5)  # leaf 0 positive: torchrl never fails then
            exclude = exclude[exclude != 0]
            tree = _tree(cls, values)
            model = BinaryHeapSumTree(zeroed, dtype=dtype)
        seen = []
        p_sum = model.query(0, num_valid)
        masses = np.concatenate([np.random.default_rng(trial).uniform(0.0, float(p_sum), 300),
                                 _boundary_masses(rng, model, dtype, n=0).astype(np.float64)])
        masses = masses[masses > 0]

        def draw(total):
            seen.append(total)
            return masses

        index, priority = tree.sample_prioritized_zeroed(num_valid, exclude, draw)
        assert _bits(seen, dtype).tolist() == _bits([p_sum], dtype).tolist()
        expected = model.draws(masses, num_valid)
        np.testing.assert_array_equal(index, expected)
        np.testing.assert_array_equal(priority, values[expected])


@pytest.mark.parametrize("cls,dtype", CLASSES)
def test_leaves_written_past_size_are_torchrls(cls, dtype):
    """Leaves between size and capacity (torchrl's sampler writes there when its storage is
    longer): the sums and descents of torchrl's tree over all capacity leaves."""
    rng = np.random.default_rng(7)
    for size in [5, 16, 100, 256, 3000]:
        values = _leaves(rng, size, dtype)
        tree = _tree(cls, values)
        capacity = tree.capacity
        extra = rng.integers(size, capacity, 3)
        tree[extra] = dtype(2.5)
        leaves = np.zeros(capacity, dtype=dtype)
        leaves[:size] = values
        leaves[extra] = dtype(2.5)
        model = BinaryHeapSumTree(leaves, size=size, dtype=dtype)
        assert _bits(tree.query(0, size), dtype) == _bits(model.root, dtype)
        lo = rng.integers(1, capacity, 50)
        hi = np.minimum(lo + rng.integers(1, capacity, 50), capacity - 1)
        np.testing.assert_array_equal(_bits([tree.query(int(a), int(b)) for a, b in zip(lo, hi)], dtype),
                                      _bits([model.query(int(a), int(b)) for a, b in zip(lo, hi)], dtype))
        masses = _boundary_masses(rng, model, dtype, n=200)
        np.testing.assert_array_equal(tree.scan_lower_bound(masses), model.scan_lower_bound(masses))


def test_model_is_torchrls_binary_heap():
    """The model itself on a case worked by hand: capacity 8 for 5 leaves, node sums in fp32,
    a mass past a rounded left sum going right."""
    leaves = np.array([1.0, 2.0 ** -24, 2.0 ** -24, 3.0, 0.5], dtype=np.float32)
    model = BinaryHeapSumTree(leaves, dtype=np.float32)
    assert model.capacity == 8
    # node [0, 2): 1 + 2^-24 rounds to 1 in fp32; [2, 4): 3 + 2^-24 rounds to 3
    assert model.values[4] == np.float32(1.0) and model.values[5] == np.float32(3.0)
    assert model.root == np.float32(4.5)
    assert model.query(1, 4) == np.float32(3.0)  # leaf 1, then node [2, 4): 2^-24 + 3 -> 3
    # the prefix sum of leaf 2 is 1 + 2^-23 exactly, but torchrl's node [0, 2) holds 1: the mass
    # goes right with 2^-23 left, which exceeds leaf 2 (2^-24): leaf 3
    assert model.scan_lower_bound([np.float32(1) + np.float32(2.0 ** -23)]).tolist() == [3]
    assert model.scan_lower_bound([4.5, 4.6, 0.0, 1.0]).tolist() == [4, 5, 0, 0]
