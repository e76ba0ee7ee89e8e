"""The torch-op priority trees of torchrl_compat (the CUDA path) against a plain numpy model
and against ``replay``'s trees (the CPU path), on CPU tensors."""
import copy
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import replay
from torchrl_compat._torch_ops.sumtree import (
    sample_prioritized_leaves,
    TorchMinSegmentTreeFp32,
    TorchMinSegmentTreeFp64,
    TorchSumSegmentTreeFp32,
    TorchSumSegmentTreeFp64,
)

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    ),
]
TREES = [
    (TorchSumSegmentTreeFp32, "sum", np.float32),
    (TorchSumSegmentTreeFp64, "sum", np.float64),
    (TorchMinSegmentTreeFp32, "min", np.float32),
    (TorchMinSegmentTreeFp64, "min", np.float64),
]
TREE_IDS = ["SumFp32", "SumFp64", "MinFp32", "MinFp64"]


def identity(kind, dtype):
    return 0.0 if kind == "sum" else float(np.finfo(dtype).max)


def model_query(values, kind, dtype, left, right, size=None):
    """torchrl's query over ``values`` (every leaf below the capacity): a range from 0 that
    reaches ``size`` is the whole tree."""
    size = len(values) if size is None else size
    if left <= 0 and right >= size:
        left, right = 0, len(values)
    left, right = max(left, 0), min(right, len(values))
    if right <= left:
        return identity(kind, dtype)
    part = values[left:right].astype(np.float64)
    return part.sum() if kind == "sum" else part.min()


@pytest.mark.parametrize("cls,kind,dtype", TREES, ids=TREE_IDS)
class TestTreeAPI:
    def test_properties(self, cls, kind, dtype):
        for size, capacity in [(1, 2), (2, 4), (3, 4), (4, 8), (1000, 1024), (1024, 2048)]:
            tree = cls(size)
            assert tree.size == size == len(tree)
            assert tree.capacity == capacity
            assert tree.identity_element == identity(kind, dtype)
            assert tree[size - 1] == identity(kind, dtype)

    @pytest.mark.parametrize("device", DEVICES)
    def test_random_updates_match_model(self, cls, kind, dtype, device):
        rng = np.random.default_rng(0)
        for size in (1, 7, 64, 1000):
            tree = cls(size, device=device)
            model = np.full(tree.capacity, identity(kind, dtype), dtype=dtype)
            for step in range(20):
                n = int(rng.integers(0, 2 * size + 1))
                # leaves past size (below the capacity) now and then, as torchrl's samplers write
                index = rng.integers(0, tree.capacity if step % 4 == 3 else size, n)
                value = rng.uniform(0, 10, n).astype(dtype)
                tree[torch.as_tensor(index, device=device)] = torch.as_tensor(value, device=device)
                model[index] = value  # numpy: last write wins on duplicates
                left, right = sorted(rng.integers(-2, tree.capacity + 3, 2).tolist())
                expected = model_query(model, kind, dtype, left, right, size)
                np.testing.assert_allclose(tree.query(left, right), expected, rtol=1e-5)
                np.testing.assert_array_equal(tree[np.arange(tree.capacity)], model)
            assert tree.query(0, size) == pytest.approx(model_query(model, kind, dtype, 0, size, size), rel=1e-5)

    def test_batched_query(self, cls, kind, dtype):
        rng = np.random.default_rng(1)
        size = 37
        tree = cls(size)
        model = rng.uniform(0, 5, size).astype(dtype)
        tree[np.arange(size)] = model
        left = rng.integers(-3, size + 3, 50)
        right = rng.integers(-3, size + 3, 50)
        expected = [model_query(model, kind, dtype, a, b) for a, b in zip(left, right)]
        out = tree.query(left, right)
        assert isinstance(out, np.ndarray) and out.dtype == dtype and out.shape == (50,)
        np.testing.assert_allclose(out, expected, rtol=1e-5)
        out = tree.query(torch.as_tensor(left), torch.as_tensor(right))
        assert isinstance(out, torch.Tensor)
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)

    def test_getitem_types(self, cls, kind, dtype):
        tree = cls(10)
        tree[3] = 2.5
        tree.update(np.array([4, 5]), np.array([1.0, 2.0]))
        tree[[6, 7]] = 0.5  # a scalar broadcasts to every index
        assert isinstance(tree[3], float) and tree[3] == 2.5 == tree.at(3)
        out = tree[np.array([[3, 4], [5, 6]])]
        assert isinstance(out, np.ndarray) and out.shape == (2, 2) and out.dtype == dtype
        np.testing.assert_array_equal(out, [[2.5, 1.0], [2.0, 0.5]])
        out = tree[torch.tensor([7, 3])]
        assert isinstance(out, torch.Tensor) and out.dtype == torch.from_numpy(np.zeros(1, dtype)).dtype
        assert out.tolist() == [0.5, 2.5]

    def test_empty_batch(self, cls, kind, dtype):
        tree = cls(4)
        tree[torch.zeros(0, dtype=torch.long)] = torch.zeros(0)
        assert tree[torch.zeros(0, dtype=torch.long)].shape == (0,)
        assert tree[0] == identity(kind, dtype)

    def test_bad_input_leaves_tree_unchanged(self, cls, kind, dtype):
        tree = cls(8)
        tree[np.arange(8)] = np.arange(8, dtype=np.float64)
        before = tree[np.arange(8)].copy()
        with pytest.raises(IndexError, match=r"index 16 at position 2 is out of range for size 8: .* \[0, 16\)"):
            tree[torch.tensor([0, 1, 16])] = 1.0
        with pytest.raises(IndexError, match="index -1 at position 0"):
            tree[torch.tensor([-1])] = 1.0
        with pytest.raises(IndexError, match="index 17 is out of range"):
            tree[17]
        with pytest.raises(ValueError, match="position 1"):
            tree[torch.tensor([0, 1])] = torch.tensor([1.0, float("nan")])
        with pytest.raises(TypeError, match="must hold integers"):
            tree[torch.tensor([0.5])] = 1.0
        with pytest.raises(ValueError, match=r"shape \(3,\).*shape \(2,\)"):
            tree[np.array([0, 1])] = np.array([1.0, 2.0, 3.0])
        if kind == "sum":
            with pytest.raises(ValueError, match="value -1.0 at position 0"):
                tree[torch.tensor([3])] = -1.0
            with pytest.raises(ValueError, match="finite"):
                tree[torch.tensor([3])] = float("inf")
        np.testing.assert_array_equal(tree[np.arange(8)], before)

    def test_pickle_and_deepcopy(self, cls, kind, dtype):
        tree = cls(13)
        values = np.random.default_rng(2).uniform(0, 3, 13).astype(dtype)
        tree[np.arange(13)] = values
        for clone in (pickle.loads(pickle.dumps(tree)), copy.deepcopy(tree)):
            assert type(clone) is cls and clone.size == 13
            np.testing.assert_array_equal(clone[np.arange(13)], values)
            clone[0] = 100.0
            assert tree[0] == values[0]  # independent copies


@pytest.mark.parametrize("cls", [TorchSumSegmentTreeFp32, TorchSumSegmentTreeFp64])
class TestScanLowerBound:
    def test_against_model(self, cls):
        rng = np.random.default_rng(3)
        size = 50
        values = rng.uniform(0, 1, size)
        values[rng.random(size) < 0.3] = 0
        tree = cls(size)
        tree[np.arange(size)] = values
        stored = tree[np.arange(size)].astype(np.float64)
        prefix = np.cumsum(stored)
        mass = np.concatenate([rng.uniform(0, prefix[-1], 200), [0.0, prefix[-1], prefix[-1] * 1.5]])
        expected = np.searchsorted(prefix, mass, side="left")  # first prefix >= v; size past total
        out = tree.scan_lower_bound(mass.astype(np.float32) if cls is TorchSumSegmentTreeFp32 else mass)
        assert out.dtype == np.int64
        # fp32 masses may round onto a neighbouring boundary: compare on the same masses
        cast = mass.astype(np.float32).astype(np.float64) if cls is TorchSumSegmentTreeFp32 else mass
        np.testing.assert_array_equal(out, np.searchsorted(prefix, cast, side="left"))
        assert tree.scan_lower_bound(float(prefix[-1] * 2)) == size
        assert isinstance(tree.scan_lower_bound(0.0), int)
        inside = (mass > 0) & (mass < prefix[-1])
        assert (stored[expected[inside]] > 0).all()

    def test_nan_mass(self, cls):
        tree = cls(4)
        with pytest.raises(ValueError, match="position 1"):
            tree.scan_lower_bound(torch.tensor([0.5, float("nan")]))


class TestSamplePrioritized:
    @settings(max_examples=60, deadline=None)
    @given(
        values=st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0]), min_size=1, max_size=30),
        draws=st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=20),
        data=st.data(),
    )
    def test_rules(self, values, draws, data):
        """Clamp to the last valid leaf, step left past zeros (right when none), excluded leaves count as zero."""
        tree = TorchSumSegmentTreeFp64(len(values) + 3)
        tree[np.arange(len(values))] = np.array(values)
        num_valid = data.draw(st.integers(1, len(values)))
        exclude = data.draw(st.lists(st.integers(0, len(values) + 2), max_size=5))
        leaves = np.array(values[:num_valid])
        masked = leaves.copy()
        masked[[e for e in exclude if e < num_valid]] = 0
        uniform = torch.tensor(draws, dtype=torch.float64)
        before = tree[np.arange(tree.size)].copy()
        if masked.sum() <= 0:
            with pytest.raises(RuntimeError, match="non-positive p_sum"):
                tree.sample_prioritized(uniform, num_valid, exclude=torch.tensor(exclude, dtype=torch.long))
            return
        index, priority, total = tree.sample_prioritized(
            uniform, num_valid, exclude=torch.tensor(exclude, dtype=torch.long)
        )
        np.testing.assert_array_equal(tree[np.arange(tree.size)], before)  # never mutated
        assert float(total) == pytest.approx(masked.sum())
        prefix = np.cumsum(masked)
        for u, i, p in zip(draws, index.tolist(), priority.tolist()):
            j = min(int(np.searchsorted(prefix, u * masked.sum(), side="left")), num_valid - 1)
            if masked[j] == 0:
                left = [k for k in range(j, -1, -1) if masked[k] > 0]
                j = left[0] if left else [k for k in range(j, num_valid) if masked[k] > 0][0]
            assert i == j and p == masked[j] > 0

    def test_frequencies(self):
        torch.manual_seed(0)
        leaves = torch.tensor([1.0, 0.0, 2.0, 3.0, 0.5, 0.0, 1.5], dtype=torch.float32)
        n = 200_000
        index, _, _ = sample_prioritized_leaves(leaves, torch.rand(n))
        counts = torch.bincount(index, minlength=leaves.numel()).double()
        expected = leaves.double() / leaves.sum() * n
        assert counts[leaves == 0].sum() == 0
        chi2 = (((counts - expected) ** 2) / expected)[leaves > 0].sum()
        assert chi2 < 20.5  # chi-square, 4 degrees of freedom, p = 0.9996

    @pytest.mark.parametrize("device", DEVICES)
    def test_device_matches_cpu(self, device):
        rng = np.random.default_rng(4)
        values = rng.uniform(0, 1, 1000).astype(np.float32)
        values[::3] = 0
        uniform = torch.rand(500, generator=torch.Generator().manual_seed(1))
        trees = []
        for dev in ("cpu", device):
            tree = TorchSumSegmentTreeFp32(1000, device=dev)
            tree[torch.arange(1000, device=dev)] = torch.as_tensor(values, device=dev)
            trees.append(tree.sample_prioritized(uniform, 900, exclude=torch.arange(0, 900, 7)))
        (i0, p0, t0), (i1, p1, t1) = trees
        assert i1.device.type == torch.device(device).type
        assert torch.equal(i0, i1.cpu()) and torch.equal(p0, p1.cpu())
        assert float(t0) == pytest.approx(float(t1))

    def test_no_valid_leaf(self):
        tree = TorchSumSegmentTreeFp32(4)
        with pytest.raises(RuntimeError, match="non-positive p_sum"):
            tree.sample_prioritized(torch.rand(3), 4)
        with pytest.raises(RuntimeError, match="non-positive p_sum"):
            tree.sample_prioritized(torch.rand(3), 0)

    def test_fp32_sums_do_not_drift(self):
        tree = TorchSumSegmentTreeFp32(1 << 16)
        rng = np.random.default_rng(5)
        for _ in range(50):
            index = rng.integers(0, 1 << 16, 4096)
            tree[index] = rng.uniform(0, 1, 4096).astype(np.float32)
        leaves = tree[np.arange(1 << 16)].astype(np.float64)
        assert tree.query(0, 1 << 16) == pytest.approx(leaves.sum(), rel=1e-6)
        mass = rng.uniform(0, leaves.sum(), 10_000)
        index = tree.scan_lower_bound(mass)
        assert (index < (1 << 16)).all() and (leaves[index] > 0).all()

    def test_to_device_copy(self):
        tree = TorchMinSegmentTreeFp32(5)
        tree[np.arange(5)] = np.array([3.0, 1.0, 2.0, 5.0, 4.0])
        moved = tree.to("cpu")
        moved[1] = 9.0
        assert tree.query(0, 5) == 1.0 and moved.query(0, 5) == 2.0


# --------------------------------------------------------------------------- against replay

PAIRED = [
    (TorchSumSegmentTreeFp32, replay.SumSegmentTreeFp32),
    (TorchSumSegmentTreeFp64, replay.SumSegmentTreeFp64),
    (TorchMinSegmentTreeFp32, replay.MinSegmentTreeFp32),
    (TorchMinSegmentTreeFp64, replay.MinSegmentTreeFp64),
]


@pytest.mark.parametrize("torch_cls,replay_cls", PAIRED, ids=TREE_IDS)
@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 70), seed=st.integers(0, 2**32 - 1))
def test_torch_ops_match_replay(torch_cls, replay_cls, size, seed):
    """The same writes (leaves past size included) into both: every leaf, torchrl-rule queries,
    scans and prioritized draws agree exactly (small integer values keep every sum exact)."""
    rng = np.random.default_rng(seed)
    ours, theirs = torch_cls(size), replay_cls(size)
    assert ours.capacity == theirs.capacity
    reach = ours.capacity if seed % 3 == 0 else size
    for _ in range(4):
        index = torch.as_tensor(rng.integers(0, reach, int(rng.integers(0, 2 * size))))
        value = torch.as_tensor(rng.integers(0, 6, index.numel()).astype(np.float64))
        ours[index] = value
        theirs[index] = value
    every = np.arange(ours.capacity)
    np.testing.assert_array_equal(ours[every], theirs[every])
    left = rng.integers(-2, ours.capacity + 2, 30)
    right = rng.integers(-2, ours.capacity + 2, 30)
    np.testing.assert_array_equal(ours.query(left, right), theirs.query(left, right))
    assert ours.query(0, size) == theirs.query(0, size)
    if not torch_cls.__name__.startswith("TorchSum"):
        return
    total = theirs.query(0, size)
    mass = rng.uniform(-1, total + 2, 50)
    np.testing.assert_array_equal(ours.scan_lower_bound(mass), theirs.scan_lower_bound(mass))
    uniform = torch.as_tensor(np.concatenate([[0.0, 1.0], rng.random(40)]))
    for num_valid in {1, max(size - 1, 1), size, ours.capacity - 1, ours.capacity, 3 * ours.capacity}:
        try:
            expected = theirs.sample_prioritized(num_valid, uniform)
        except RuntimeError:
            with pytest.raises(RuntimeError, match="non-positive p_sum"):
                ours.sample_prioritized(uniform, num_valid)
            continue
        index, priority, _ = ours.sample_prioritized(uniform, num_valid)
        assert torch.equal(index, expected[0]), num_valid
        assert torch.equal(priority, expected[1])


@pytest.mark.parametrize("torch_cls,replay_cls", PAIRED[:2], ids=TREE_IDS[:2])
def test_total_overflow_refused_as_replay_refuses_it(torch_cls, replay_cls):
    big = float(torch.finfo(torch_cls._dtype).max) * 0.6
    for tree in (torch_cls(6), replay_cls(6)):
        tree[np.arange(6)] = np.arange(6.0)
        tree[2] = big
        before = tree[np.arange(tree.capacity)].copy()
        with pytest.raises(ValueError, match="would make the sum of the tree's leaves .* past the largest finite"):
            tree[np.array([0, 4])] = np.array([1.0, big])
        np.testing.assert_array_equal(tree[np.arange(tree.capacity)], before)
        tree[np.array([2, 4])] = np.array([1.0, big])  # replaces the big leaf: accepted
        assert np.isfinite(tree.query(0, 6))
