"""Segment trees against a plain numpy model, for every (Sum|Min) x (Fp32|Fp64) variant."""
import copy
import pickle
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import replay
from torchrl_heap import BinaryHeapSumTree

SUM_CLASSES = [replay.SumSegmentTreeFp32, replay.SumSegmentTreeFp64]
MIN_CLASSES = [replay.MinSegmentTreeFp32, replay.MinSegmentTreeFp64]
ALL_CLASSES = SUM_CLASSES + MIN_CLASSES
PAIRS = [
    (replay.SumSegmentTreeFp32, replay.MinSegmentTreeFp32),
    (replay.SumSegmentTreeFp64, replay.MinSegmentTreeFp64),
]


def _dtype(cls):
    return np.float64 if cls.__name__.endswith("Fp64") else np.float32


def _is_sum(cls):
    return cls.__name__.startswith("Sum")


def _capacity(size):
    """torchrl's tree capacity: the smallest power of two strictly greater than size."""
    return 1 << int(size).bit_length()


class Model:
    """The reference: torchrl's tree semantics over a float64 array, reductions by numpy.

    torchrl's trees hold ``capacity`` leaves and accept every index below it; a query from 0
    (or below) that reaches ``size`` covers all of them; the scan of a mass past the total
    gives ``size``.
    """

    def __init__(self, cls, size):
        self.is_sum = _is_sum(cls)
        self.size = size
        self.identity = 0.0 if self.is_sum else float(np.finfo(_dtype(cls)).max)
        self.leaves = np.full(_capacity(size), self.identity, dtype=np.float64)

    def update(self, index, value):
        for i, v in zip(np.ravel(index), np.broadcast_to(value, np.shape(index)).ravel()):
            self.leaves[i] = v  # sequential: a repeated index keeps its last value

    def query(self, l, r):
        if l <= 0 and r >= self.size:
            l, r = 0, self.leaves.size
        l, r = max(l, 0), min(r, self.leaves.size)
        if l >= r:
            return self.identity
        part = self.leaves[l:r]
        return part.sum() if self.is_sum else part.min()

    def scan(self, v):
        total = self.leaves.sum()
        if v <= 0:
            return 0
        if v > total:
            return self.size
        return int(np.searchsorted(np.cumsum(self.leaves), v, side="left"))


@pytest.mark.parametrize("cls", ALL_CLASSES)
class TestBasics:
    def test_attributes(self, cls):
        tree = cls(10)
        assert tree.size == 10 and len(tree) == 10
        assert tree.capacity == 16  # smallest power of two strictly greater than size
        assert cls(16).capacity == 32 and cls(1).capacity == 2
        expected = 0.0 if _is_sum(cls) else float(np.finfo(_dtype(cls)).max)
        assert tree.identity_element == expected
        assert tree.at(3) == expected and tree.query(0, 10) == expected
        assert repr(tree) == f"{cls.__name__}(size=10)"

    def test_index_kinds_and_shapes(self, cls):
        tree = cls(50)
        values = np.arange(50, dtype=np.float64)
        tree[np.arange(50)] = values
        assert tree[7] == 7.0 and tree.at(np.int32(8)) == 8.0
        out = tree[np.array([[1, 2], [3, 4]], dtype=np.uint16)]
        assert isinstance(out, np.ndarray) and out.shape == (2, 2) and out.dtype == _dtype(cls)
        np.testing.assert_array_equal(out, [[1, 2], [3, 4]])
        strided = np.arange(0, 40, dtype=np.int64)[::7]
        np.testing.assert_array_equal(tree[strided], strided)
        t = tree[torch.tensor([5, 6], dtype=torch.int32)]
        assert isinstance(t, torch.Tensor) and t.dtype == torch.from_numpy(np.zeros(1, _dtype(cls))).dtype
        assert t.tolist() == [5.0, 6.0]
        assert tree[torch.tensor(9)].shape == ()
        np.testing.assert_array_equal(tree[[1, 2]], [1, 2])
        assert tree[np.array([], dtype=np.int64)].shape == (0,)

    def test_value_kinds(self, cls):
        tree = cls(8)
        tree[np.array([0, 1])] = np.array([1, 2], dtype=np.float16)
        tree[torch.tensor([2, 3])] = torch.tensor([3.0, 4.0], dtype=torch.float64)
        tree[np.array([4, 5])] = 6  # scalar broadcast
        tree.update(6, np.float32(7.0))
        tree[7] = torch.tensor(8.0)
        np.testing.assert_array_equal(tree.values(), [1, 2, 3, 4, 6, 6, 7, 8])
        tree[np.array([], dtype=np.int64)] = np.array([])  # empty batch: nothing happens
        np.testing.assert_array_equal(tree.values(), [1, 2, 3, 4, 6, 6, 7, 8])

    def test_query_arrays(self, cls):
        tree = cls(20)
        tree[np.arange(20)] = np.arange(20)
        model = Model(cls, 20)
        model.update(np.arange(20), np.arange(20))
        lo, hi = np.array([0, 3, 5, -4, 19]), np.array([20, 9, 5, 30, 7])
        out = tree.query(lo, hi)
        assert out.dtype == _dtype(cls)
        np.testing.assert_allclose(out, [model.query(a, b) for a, b in zip(lo, hi)])
        out_t = tree.query(torch.tensor([1, 2]), 10)  # broadcast against a scalar
        assert isinstance(out_t, torch.Tensor)
        np.testing.assert_allclose(out_t.numpy(), [model.query(1, 10), model.query(2, 10)])

    def test_size_zero(self, cls):
        tree = cls(0)
        assert len(tree) == 0 and tree.capacity == 1 and tree.query(0, 10) == tree.identity_element
        with pytest.raises(IndexError, match=r"index 1 is out of range for size 0: .* \[0, 1\)"):
            tree[1] = 1.0
        tree[0] = 1.0  # torchrl's capacity-1 tree takes leaf 0
        assert tree[0] == 1.0 and tree.query(0, 0) == 1.0 and tree.values().shape == (0,)

    def test_pickle_and_deepcopy(self, cls):
        tree = cls(100)
        rng = np.random.default_rng(0)
        tree[np.arange(100)] = rng.random(100)
        for clone in (pickle.loads(pickle.dumps(tree)), copy.deepcopy(tree)):
            assert type(clone) is cls and clone.size == 100
            np.testing.assert_array_equal(clone.values(), tree.values())
            assert clone.query(3, 77) == tree.query(3, 77)
            clone[0] = 5.0
            assert tree[0] != 5.0  # independent copies

    def test_setstate_checks(self, cls):
        tree = cls(4)
        with pytest.raises(TypeError, match="must have dtype"):
            tree.__setstate__(np.zeros(4, dtype=np.int64))
        with pytest.raises(ValueError, match=r"must have shape \(4,\), got \(5,\)"):
            tree.__setstate__(np.zeros(5, dtype=_dtype(cls)))
        with pytest.raises(TypeError, match="must be a numpy array"):
            tree.__setstate__([0.0] * 4)
        bad = np.zeros(4, dtype=_dtype(cls))
        bad[2] = np.nan
        with pytest.raises(ValueError, match="position 2"):
            tree.__setstate__(bad)
        assert np.all(tree.values() == tree.identity_element)


@pytest.mark.parametrize("cls", ALL_CLASSES)
class TestBadInput:
    def _filled(self, cls, size=30):
        tree = cls(size)
        tree[np.arange(size)] = np.arange(1, size + 1)
        return tree

    def test_out_of_range_index(self, cls):
        tree = self._filled(cls)  # size 30, capacity 32
        before = tree.values()
        with pytest.raises(IndexError, match=r"index 32 is out of range for size 30: .* \[0, 32\)"):
            tree[32] = 1.0
        with pytest.raises(IndexError, match="index -1 is out of range"):
            tree.update(-1, 1.0)
        with pytest.raises(IndexError, match="index 1000003 at position 2 is out of range for size 30"):
            tree[np.array([0, 1, 1000003, 4])] = np.array([9.0, 9.0, 9.0, 9.0])
        with pytest.raises(IndexError, match="index -5 at position 1"):
            tree[torch.tensor([3, -5])] = 2.0
        with pytest.raises(IndexError, match="index 32 at position 1"):
            tree[np.array([31, 32])]
        with pytest.raises(IndexError, match="index 33 is out of range"):
            tree.at(33)
        with pytest.raises(IndexError, match="index 32 at position 2"):  # grown or not
            tree[np.array([0, 31, 32])] = 1.0
        with pytest.raises(IndexError, match="does not fit in int64"):
            tree[np.array([2**64 - 1], dtype=np.uint64)]
        np.testing.assert_array_equal(tree.values(), before)  # batch rejected whole

    def test_nan_and_bad_values(self, cls):
        tree = self._filled(cls)
        before = tree.values()
        with pytest.raises(ValueError, match="value nan at position 1"):
            tree[np.array([0, 1, 2])] = np.array([5.0, np.nan, 5.0])
        if _is_sum(cls):
            with pytest.raises(ValueError, match="value -1.0 at position 0 .*finite and non-negative"):
                tree[np.array([4, 5])] = np.array([-1.0, 2.0])
            with pytest.raises(ValueError, match="value inf at position 1"):
                tree[torch.tensor([4, 5])] = torch.tensor([1.0, float("inf")])
            if _dtype(cls) == np.float32:
                with pytest.raises(ValueError, match="value 1e\\+300 at position 0"):
                    tree[np.array([4])] = np.array([1e300])  # overflows to inf in fp32
        else:
            tree[np.array([4, 5])] = np.array([-1.0, np.inf])  # a min tree takes both
            assert tree.query(0, 30) == -1.0
            tree[np.array([4, 5])] = before[4:6]
        np.testing.assert_array_equal(tree.values(), before)

    def test_type_and_shape_errors(self, cls):
        tree = self._filled(cls)
        with pytest.raises(TypeError, match="index must hold integers, got an array of dtype float64"):
            tree[np.array([1.0, 2.0])]
        with pytest.raises(TypeError, match="dtype bool"):
            tree[torch.tensor([True, False])] = 1.0
        with pytest.raises(TypeError, match="must hold real numbers"):
            tree[np.array([1])] = np.array(["a"])
        with pytest.raises(ValueError, match=r"shape \(3,\) and index of shape \(2,\)"):
            tree[np.array([1, 2])] = np.array([1.0, 2.0, 3.0])
        with pytest.raises(TypeError, match="size must be an int"):
            cls(3.5)
        with pytest.raises(ValueError, match="size must be non-negative, got size=-2"):
            cls(-2)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("update"), st.lists(st.integers(0, 99), min_size=0, max_size=40),
                  st.integers(0, 1000)),
        st.tuples(st.just("scalar"), st.integers(0, 99), st.integers(0, 1000)),
        st.tuples(st.just("query"), st.integers(-5, 105), st.integers(-5, 105)),
        st.tuples(st.just("scan"), st.floats(-10, 200_000, allow_nan=False), st.just(0)),
    ),
    min_size=1,
    max_size=40,
)


@pytest.mark.parametrize("cls", ALL_CLASSES)
@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 100), ops=OPS, seed=st.integers(0, 2**32 - 1))
def test_random_operation_sequences(cls, size, ops, seed):
    """Integer-valued leaves keep every sum exact, so results must match the model exactly."""
    rng = np.random.default_rng(seed)
    tree, model = cls(size), Model(cls, size)
    # Mostly leaves below size; some past it, below capacity, as torchrl's samplers write them.
    reach = size if seed % 3 else tree.capacity
    for op, a, b in ops:
        if op == "update":
            index = np.array([i % reach for i in a], dtype=np.int64)
            values = rng.integers(0, 1000, index.size).astype(np.float64)
            tree[index] = values
            model.update(index, values)
        elif op == "scalar":
            tree[a % reach] = float(b)
            model.update(np.array([a % reach]), float(b))
        elif op == "query":
            assert tree.query(a, b) == pytest.approx(model.query(a, b), rel=0, abs=0)
        elif op == "scan" and _is_sum(cls):
            assert tree.scan_lower_bound(a) == model.scan(np.float32(a) if _dtype(cls) == np.float32 else a)
    np.testing.assert_array_equal(tree.values(), model.leaves[:size].astype(_dtype(cls)))
    every = np.arange(tree.capacity)
    np.testing.assert_array_equal(tree[every], model.leaves.astype(_dtype(cls)))
    assert tree.query(0, size) == model.query(0, size)
    if _is_sum(cls):
        masses = rng.uniform(-1, model.leaves.sum() + 2, 64).astype(_dtype(cls))
        np.testing.assert_array_equal(tree.scan_lower_bound(masses), [model.scan(v) for v in masses])


@pytest.mark.parametrize("cls", ALL_CLASSES)
@pytest.mark.parametrize("size", [1, 15, 16, 17, 255, 256, 4097, 70_000])
def test_dense_build_matches_incremental(cls, size):
    """Setting every leaf at once (the O(size) rebuild) equals setting them one batch at a time."""
    rng = np.random.default_rng(size)
    values = rng.integers(0, 100, size).astype(np.float64)
    dense, sparse = cls(size), cls(size)
    dense[np.arange(size)] = values
    for chunk in np.array_split(rng.permutation(size), max(1, size // 7)):
        sparse[chunk] = values[chunk]
    for level in range(8):
        try:
            np.testing.assert_array_equal(dense._py_level(level), sparse._py_level(level))
        except IndexError:
            break
    ref = values.sum() if _is_sum(cls) else values.min()
    assert dense.query(0, size) == ref
    lo = rng.integers(0, size, 50)
    hi = rng.integers(0, size + 1, 50)
    model = Model(cls, size)
    model.leaves[:size] = values
    np.testing.assert_array_equal(dense.query(lo, hi), [model.query(a, b) for a, b in zip(lo, hi)])


@pytest.mark.slow
def test_fp32_sums_do_not_drift():
    size = 2**16
    tree = replay.SumSegmentTreeFp32(size)
    rng = np.random.default_rng(0)
    for _ in range(1000):  # 10^6 random updates in batches of 1000
        tree[rng.integers(0, size, 1000)] = rng.random(1000).astype(np.float32) * 10
    leaves = tree.values().astype(np.float64)
    assert tree.query(0, size) == pytest.approx(leaves.sum(), rel=1e-5)
    assert tree.query(100, 60_000) == pytest.approx(leaves[100:60_000].sum(), rel=1e-5)


@pytest.mark.parametrize("cls", SUM_CLASSES)
def test_scan_on_sparse_badly_scaled_leaves_is_torchrls(cls):
    """Sparse, badly scaled leaves, where the rounding of the internal sums matters: the descent
    is torchrl's to the leaf (tests/torchrl_heap.py), zero-valued leaves and padding leaves past
    ``size`` included, and the sampler's draws from the same masses still land on positive
    leaves only (clamped, then moved left as torchrl's sampler moves them)."""
    size = 2**17 + 3
    dtype = _dtype(cls)
    rng = np.random.default_rng(1)
    values = np.zeros(size)
    positive = rng.choice(size, 5000, replace=False)
    values[positive] = 10.0 ** rng.uniform(-6, 4, positive.size)
    values[size - 1] = 0.0
    values[0] = 1e-3
    tree = cls(size)
    tree[np.arange(size)] = values
    model = BinaryHeapSumTree(values, dtype=dtype)
    total = tree.query(0, size)
    assert np.asarray(total, dtype=dtype).tobytes() == model.root.tobytes()
    masses = np.concatenate([
        rng.uniform(0, total, 100_000),
        [np.nextafter(total, 0), total, np.finfo(np.float64).tiny, 1e-30],
        np.nextafter(np.cumsum(values.astype(dtype))[positive], np.inf),
    ]).astype(dtype)
    masses = masses[(masses > 0) & (masses <= total)]
    index = tree.scan_lower_bound(masses)
    np.testing.assert_array_equal(index, model.scan_lower_bound(masses))
    drawn, priority, _ = tree.sample_prioritized(size, mass=masses.astype(np.float64))
    np.testing.assert_array_equal(drawn, model.draws(masses, size))
    assert drawn.max() < size and np.all(priority > 0)


class TestSamplePrioritized:
    def _tree(self, cls, values):
        tree = cls(len(values))
        tree[np.arange(len(values))] = np.asarray(values, dtype=np.float64)
        return tree

    def _model(self, values, num_valid, uniform):
        values = np.asarray(values, dtype=np.float64)
        cumsum = np.cumsum(values[:num_valid])
        out = []
        for u in uniform:
            mass = max(u * cumsum[-1], 5e-324)
            i = min(int(np.searchsorted(cumsum, mass, side="left")), num_valid - 1)
            if values[i] == 0:
                left = np.nonzero(values[: i + 1] > 0)[0]
                i = left[-1] if left.size else np.nonzero(values[i:num_valid] > 0)[0][0] + i
            out.append(i)
        return np.array(out)

    @pytest.mark.parametrize("cls", SUM_CLASSES)
    @settings(max_examples=50, deadline=None)
    @given(values=st.lists(st.integers(0, 50), min_size=1, max_size=80), data=st.data())
    def test_matches_model(self, cls, values, data):
        num_valid = data.draw(st.integers(1, len(values)))
        if sum(values[:num_valid]) == 0:
            values[data.draw(st.integers(0, num_valid - 1))] = 3
        uniform = np.array(data.draw(st.lists(st.floats(0, 1), min_size=0, max_size=40)))
        tree = self._tree(cls, values)
        index, priority, weight = tree.sample_prioritized(num_valid, uniform, p_min=1.0, beta=0.7)
        np.testing.assert_array_equal(index, self._model(values, num_valid, uniform))
        np.testing.assert_array_equal(priority, np.asarray(values, dtype=np.float64)[index])
        np.testing.assert_allclose(weight, (priority.astype(np.float64) / 1.0) ** -0.7, rtol=1e-12)
        assert np.all(priority > 0)

    def test_zero_draw_and_zero_first_leaf(self):
        # torchrl raises "Failed to find a suitable index" here; a zero draw lands on leaf 2.
        tree = self._tree(replay.SumSegmentTreeFp32, [0, 0, 5, 1])
        index, priority, _ = tree.sample_prioritized(4, np.array([0.0, 1.0]))
        assert index.tolist() == [2, 3] and priority.tolist() == [5.0, 1.0]

    def test_clamps_to_num_valid(self):
        tree = self._tree(replay.SumSegmentTreeFp64, [1, 0, 0, 7, 7])
        index, _, _ = tree.sample_prioritized(3, np.linspace(0, 1, 11))
        assert set(index.tolist()) == {0}

    def test_tensor_in_tensor_out_and_seed(self):
        tree = self._tree(replay.SumSegmentTreeFp32, np.arange(1, 101))
        index, priority, weight = tree.sample_prioritized(100, torch.rand(16))
        assert isinstance(index, torch.Tensor) and index.dtype == torch.int64 and weight is None
        a = tree.sample_prioritized(100, batch_size=64, seed=123)
        b = tree.sample_prioritized(100, batch_size=64, seed=123)
        c = tree.sample_prioritized(100, batch_size=64, seed=124)
        np.testing.assert_array_equal(a[0], b[0])
        assert not np.array_equal(a[0], c[0])

    def test_frequencies_chi_square(self):
        values = np.array([1.0, 2.0, 3.0, 4.0, 0.0, 10.0])
        tree = self._tree(replay.SumSegmentTreeFp32, values)
        draws = 60_000
        index, _, _ = tree.sample_prioritized(6, batch_size=draws, seed=7)
        counts = np.bincount(index, minlength=6)
        assert counts[4] == 0
        expected = values / values.sum() * draws
        keep = expected > 0
        chi2 = (((counts[keep] - expected[keep]) ** 2) / expected[keep]).sum()
        assert chi2 < 20.5  # 99.9% quantile of chi-square with 4 degrees of freedom

    def test_errors(self):
        tree = self._tree(replay.SumSegmentTreeFp32, [0, 0, 1])
        with pytest.raises(RuntimeError, match="no positive priority among the first 2 leaves"):
            tree.sample_prioritized(2, np.array([0.5]))
        with pytest.raises(IndexError, match="num_valid=0 must be at least 1"):
            tree.sample_prioritized(0, np.array([0.5]))
        with pytest.raises(IndexError, match="num_valid=1: a tree of size 0 has no leaf to draw"):
            replay.SumSegmentTreeFp32(0).sample_prioritized(1, np.array([0.5]))
        with pytest.raises(ValueError, match="uniform draw 1.5 at position 1"):
            tree.sample_prioritized(3, np.array([0.1, 1.5]))
        with pytest.raises(ValueError, match="p_min is required"):
            tree.sample_prioritized(3, np.array([0.1]), beta=0.5)
        with pytest.raises(ValueError, match="batch_size must be"):
            tree.sample_prioritized(3)
        assert tree.values().tolist() == [0, 0, 1]


def test_scan_errors_and_kinds():
    tree = replay.SumSegmentTreeFp32(10)
    tree[np.arange(10)] = 1.0
    with pytest.raises(ValueError, match="value nan at position 1"):
        tree.scan_lower_bound(np.array([1.0, np.nan]))
    assert tree.scan_lower_bound(3.0) == 2 and isinstance(tree.scan_lower_bound(3.0), int)
    out = tree.scan_lower_bound(torch.tensor([[0.5, 11.0]]))
    assert out.dtype == torch.int64 and out.tolist() == [[0, 10]]
    assert tree.scan_lower_bound(np.array([], dtype=np.float32)).shape == (0,)


def test_threads_never_corrupt_the_tree():
    size = 5000
    tree = replay.SumSegmentTreeFp64(size)
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                tree[rng.integers(0, size, 300)] = rng.integers(0, 100, 300).astype(np.float64)
                total = tree.query(0, size)
                if total > 0:
                    index = tree.scan_lower_bound(rng.uniform(0, total, 100))
                    assert index.max() <= size
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    leaves = tree.values()
    assert tree.query(0, size) == leaves.sum()  # integer values: exact
    level1 = tree._py_level(1)
    padded = np.zeros(level1.size * 16)[: -(-size // 16) * 16]
    padded[:size] = leaves
    np.testing.assert_array_equal(level1[: padded.size // 16], padded.reshape(-1, 16).sum(1))


# --------------------------------------------------------------------------- leaves past size


def _levels(tree):
    """Every internal level of the layout (a tree's whole state, for unchanged-state checks)."""
    out = []
    for level in range(20):
        try:
            out.append(tree._py_level(level))
        except IndexError:
            return out


@pytest.mark.parametrize("cls", ALL_CLASSES)
@pytest.mark.parametrize("size", [5, 16, 149])
def test_leaves_past_size_behave_as_torchrls(cls, size):
    """torchrl's trees keep ``capacity`` leaves; torchrl's samplers write past ``size`` when the
    storage is longer. Reads before any such write see the identity; the first write lays the
    buffer out again (once); a whole-tree query and the scan cover those leaves; pickling keeps
    the ``size`` leaves only, as torchrl's trees do."""
    tree, model = cls(size), Model(cls, size)
    capacity = tree.capacity
    assert capacity == _capacity(size)
    past = np.arange(size, capacity)
    np.testing.assert_array_equal(tree[past], np.full(past.size, tree.identity_element, _dtype(cls)))
    assert tree.at(capacity - 1) == tree.identity_element
    tree[np.arange(size)] = np.arange(1.0, size + 1)
    model.update(np.arange(size), np.arange(1.0, size + 1))
    allocated = tree._py_level(0).size
    tree[capacity - 1] = 0.5
    model.update([capacity - 1], 0.5)
    assert tree._py_level(0).size >= capacity > allocated or allocated >= capacity
    tree[torch.tensor([size, capacity - 2])] = torch.tensor([7.0, 3.0])
    model.update([size, capacity - 2], [7.0, 3.0])
    np.testing.assert_array_equal(tree[np.arange(capacity)], model.leaves.astype(_dtype(cls)))
    for l, r in [(0, size), (-3, size + 5), (0, capacity), (1, size), (size, capacity - 1), (0, size - 1)]:
        assert tree.query(l, r) == model.query(l, r), (l, r)
    np.testing.assert_array_equal(
        tree.query(np.array([0, -1, 2, size]), np.array([size, capacity, size, capacity - 1])),
        [model.query(0, size), model.query(-1, capacity), model.query(2, size), model.query(size, capacity - 1)],
    )
    if _is_sum(cls):
        total = model.leaves.sum()
        masses = np.array([0.5, total - 0.25, total, total + 1.0])
        assert tree.scan_lower_bound(masses).tolist() == [model.scan(v) for v in masses]
    assert tree.values().shape == (size,) and len(tree) == size
    clone = pickle.loads(pickle.dumps(tree))
    np.testing.assert_array_equal(clone.values(), tree.values())
    assert clone.at(capacity - 1) == tree.identity_element  # torchrl pickles the size leaves
    tree.__setstate__(tree.values())
    assert tree.at(capacity - 1) == tree.identity_element


@pytest.mark.parametrize("sum_cls,min_cls", PAIRS)
def test_update_priority_pair_grows_both_trees(sum_cls, min_cls):
    sum_tree, min_tree = sum_cls(5), min_cls(5)
    replay.update_priority_pair(sum_tree, min_tree, np.arange(3), 1.0, 1.0)
    assert replay.update_priority_pair(sum_tree, min_tree, np.array([3, 7, -1]), np.array([2.0, 0.5, 9.0]),
                                       np.array([2.0, 0.5, 9.0])) == 0
    assert sum_tree.query(0, 5) == 5.5 and min_tree.query(0, 5) == 0.5
    assert sum_tree.at(7) == min_tree.at(7) == 0.5
    with pytest.raises(IndexError, match=r"index 8 at position 1 is out of range for size 5: .* \[0, 8\)"):
        replay.update_priority_pair(sum_tree, min_tree, np.array([1, 8]), 1.0, 1.0)


# --------------------------------------------------------------------------- sum overflow


@pytest.mark.parametrize("cls", SUM_CLASSES)
def test_write_whose_total_overflows_is_refused_whole(cls):
    """Each leaf finite, their sum not (two fp32 leaves of 2e38): the write is refused and the
    tree is left as it was, every level to the bit; a write that keeps the total finite near
    the limit goes through (the exact check, not the bound)."""
    big = float(np.finfo(_dtype(cls)).max) * 0.6
    tree = cls(40)
    tree[np.arange(40)] = np.arange(40.0)
    tree[3] = big
    before = _levels(tree)
    attempts = [
        lambda: tree.update(7, big),
        lambda: tree.update(np.array([1, 2]), np.array([big / 2, big / 2])),
        lambda: tree.update(np.arange(40), big / 20),  # broadcast, in-order path
        lambda: tree.update(torch.tensor([9, 9]), torch.tensor([0.0, big], dtype=torch.float64)),  # last wins
    ]
    for attempt in attempts:
        with pytest.raises(ValueError, match="would make the sum of the tree's leaves .* past the largest finite"):
            attempt()
        for a, b in zip(_levels(tree), before):
            np.testing.assert_array_equal(a, b)
    tree[np.array([3, 5])] = np.array([big / 3, big])  # replaces the big leaf: total stays finite
    assert tree[5] == np.float64(_dtype(cls)(big)) and np.isfinite(tree.query(0, 40))
    sum_tree, min_tree = cls(4), (replay.MinSegmentTreeFp64 if _dtype(cls) == np.float64 else replay.MinSegmentTreeFp32)(4)
    replay.update_priority_pair(sum_tree, min_tree, np.array([0]), big, big)
    pair_before = _levels(sum_tree), _levels(min_tree)
    with pytest.raises(ValueError, match="would make the sum"):
        replay.update_priority_pair(sum_tree, min_tree, np.array([1]), big, big)
    for tree_now, levels in zip((sum_tree, min_tree), pair_before):
        for a, b in zip(_levels(tree_now), levels):
            np.testing.assert_array_equal(a, b)
    state = np.full(4, big, dtype=_dtype(cls))
    with pytest.raises(ValueError, match="state sums to"):
        sum_tree.__setstate__(state)
    for a, b in zip(_levels(sum_tree), pair_before[0]):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- empty sequences


@pytest.mark.parametrize("cls", ALL_CLASSES)
def test_empty_sequences_are_accepted_as_torchrls_trees_accept_them(cls):
    """``tree[[]] = []`` and friends: numpy turns an empty list into float64, yet torchrl's
    trees take them as empty index batches (nothing written, empty results)."""
    tree = cls(6)
    tree[np.arange(6)] = np.arange(6.0)
    before = _levels(tree)
    tree[[]] = []
    tree[()] = ()
    tree[[]] = 1.0
    tree[np.array([])] = np.array([])
    tree.update([], [])
    out = tree[[]]
    assert isinstance(out, np.ndarray) and out.shape == (0,) and out.dtype == _dtype(cls)
    assert tree.query([], []).shape == (0,)
    if _is_sum(cls):
        assert tree.scan_lower_bound([]).shape == (0,)
    for a, b in zip(_levels(tree), before):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="dtype float32"):
        tree[torch.tensor([])] = torch.tensor([])  # an empty float tensor still has a dtype
    with pytest.raises(TypeError, match="index must hold integers"):
        tree[[1.0]] = [2.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_give_cuda_results():
    tree = replay.SumSegmentTreeFp32(100)
    tree[torch.arange(100, device="cuda")] = torch.ones(100, device="cuda")
    out = tree.scan_lower_bound(torch.tensor([3.0, 50.0], device="cuda"))
    assert out.device.type == "cuda" and out.tolist() == [2, 49]
    assert tree[torch.tensor([1], device="cuda")].device.type == "cuda"


def test_bfloat16_priorities_are_widened():
    tree = replay.SumSegmentTreeFp32(4)
    tree[torch.tensor([0, 1])] = torch.tensor([0.5, 2.0], dtype=torch.bfloat16)
    assert tree.values().tolist() == [0.5, 2.0, 0.0, 0.0]


# --------------------------------------------------------------------------- update_priority_pair

def _leaves(tree):
    """Every leaf below the capacity (those past ``size`` included)."""
    return np.asarray(tree[np.arange(tree.capacity)], dtype=np.float64)


@pytest.mark.parametrize("sum_cls,min_cls", PAIRS)
@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(1, 40),
    n=st.integers(0, 30),
    scalar_priority=st.booleans(),
    as_tensor=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_update_priority_pair_matches_model(sum_cls, min_cls, size, n, scalar_priority, as_tensor, seed):
    rng = np.random.default_rng(seed)
    sum_tree, min_tree = sum_cls(size), min_cls(size)
    sum_model, min_model = Model(sum_cls, size), Model(min_cls, size)
    # Leaves past size (below capacity) in some examples: a storage longer than the trees.
    reach = size if seed % 4 else sum_tree.capacity
    for _ in range(3):
        index = rng.integers(-1, reach, n)  # -1 marks an item to skip; repeats allowed
        priority = rng.random(1 if scalar_priority else n) * 10
        if n and not scalar_priority:
            priority[rng.integers(0, n)] = priority.max()  # a tie: the first one wins
        value = (priority + 1e-8) ** 0.7
        kept = index >= 0
        expected_argmax = -1
        if kept.any():
            full = np.broadcast_to(priority, (n,))
            candidates = np.flatnonzero(kept)
            expected_argmax = int(candidates[np.argmax(full[candidates])])
        args = (index, value, priority)
        if as_tensor:
            args = tuple(torch.as_tensor(a) for a in args)
        assert replay.update_priority_pair(sum_tree, min_tree, *args) == expected_argmax
        stored = np.broadcast_to(value, (n,)).astype(_dtype(sum_cls))
        sum_model.update(index[kept], stored[kept])
        min_model.update(index[kept], stored[kept])
        np.testing.assert_array_equal(_leaves(sum_tree), sum_model.leaves)
        np.testing.assert_array_equal(_leaves(min_tree), min_model.leaves)
        assert sum_tree.values().shape == (size,)
        np.testing.assert_allclose(sum_tree.query(0, size), sum_model.query(0, size), rtol=1e-5)
        assert min_tree.query(0, size) == min_model.query(0, size)


@pytest.mark.parametrize("sum_cls,min_cls", PAIRS)
def test_update_priority_pair_rejects_bad_input_whole(sum_cls, min_cls):
    sum_tree, min_tree = sum_cls(8), min_cls(8)
    replay.update_priority_pair(sum_tree, min_tree, np.arange(8), np.arange(1.0, 9.0), np.arange(1.0, 9.0))
    before = _leaves(sum_tree), _leaves(min_tree)
    index = np.array([1, 2, 3])
    good = np.array([1.0, 2.0, 3.0])
    cases = [
        (IndexError, "index 16 at position 2 is out of range for size 8", (np.array([1, 2, 16]), good, good)),
        (ValueError, "priority=nan at position 1", (index, good, np.array([1.0, np.nan, 3.0]))),
        (ValueError, "priority=-1.0 at position 0", (index, good, np.array([-1.0, 2.0, 3.0]))),
        (ValueError, "priority=inf at position 2", (index, good, np.array([1.0, 2.0, np.inf]))),
        (ValueError, "value inf at position 1", (index, np.array([1.0, np.inf, 3.0]), good)),
        (ValueError, "value must be a scalar or hold as many", (index, good[:2], good)),
        (ValueError, "priority must be a scalar or hold as many", (index, good, good[:2])),
        (TypeError, "index must hold integers", (good, good, good)),
    ]
    for error, message, args in cases:
        with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
            replay.update_priority_pair(sum_tree, min_tree, *args)
        np.testing.assert_array_equal(_leaves(sum_tree), before[0])
        np.testing.assert_array_equal(_leaves(min_tree), before[1])
    # a bad priority at a skipped index is not looked at
    assert replay.update_priority_pair(sum_tree, min_tree, np.array([-1, 4]), good[:2], np.array([np.nan, 2.0])) == 1
    # every index skipped: nothing written
    assert replay.update_priority_pair(sum_tree, min_tree, np.array([-1, -1]), good[:2], good[:2]) == -1
    with pytest.raises(TypeError, match="a sum tree, then a min tree"):
        replay.update_priority_pair(sum_tree, sum_cls(8), index, good, good)
    with pytest.raises(TypeError, match="share a size and dtype"):
        replay.update_priority_pair(sum_tree, min_cls(9), index, good, good)
    other = PAIRS[1][1] if min_cls is PAIRS[0][1] else PAIRS[0][1]
    with pytest.raises(TypeError, match="share a size and dtype"):
        replay.update_priority_pair(sum_tree, other(8), index, good, good)


@pytest.mark.parametrize("cls", SUM_CLASSES)
def test_relative_priorities_match_torch_division_bit_for_bit(cls):
    """sample_prioritized(relative_to=p_min) divides in the tree's precision exactly as
    torch's div_ does, so PrioritizedSampler's weights stay torchrl's to the last bit."""
    rng = np.random.default_rng(0)
    size = 4096
    tree = cls(size)
    values = (rng.random(size) * 10.0 ** rng.integers(-6, 6, size)).astype(_dtype(cls))
    tree[np.arange(size)] = values
    p_min = float(values.min())
    for divisor in (p_min, 0.1, 3.0, 1e-30):
        index, priority, _ = tree.sample_prioritized(size, batch_size=2048, seed=7)
        _, relative, _ = tree.sample_prioritized(size, batch_size=2048, seed=7, relative_to=divisor)
        expected = torch.from_numpy(priority.copy()).div_(divisor)
        assert torch.equal(torch.from_numpy(relative), expected), divisor
    with pytest.raises(ValueError, match="relative_to must be positive"):
        tree.sample_prioritized(size, batch_size=4, seed=1, relative_to=0.0)


@pytest.mark.parametrize("cls", ALL_CLASSES)
@pytest.mark.parametrize("size", [5, 16, 300, 5000, 70_000])
def test_in_order_writes_match_model(cls, size):
    """Writes of leaves 0..n-1 in order copy and reduce node by node: every internal level
    must then equal a tree built from scratch, whatever n (whole nodes or not, any level)."""
    rng = np.random.default_rng(size)
    dtype = _dtype(cls)
    tree, model = cls(size), Model(cls, size)
    start = rng.integers(0, 9, size).astype(dtype)
    tree[np.arange(size)] = start
    model.update(np.arange(size), start)
    for n in sorted({1, 15, 16, 17, 255, 256, 257, 4097, size - 1, size} & set(range(1, size + 1))):
        values = rng.integers(0, 9, n).astype(dtype)
        tree[torch.arange(n)] = torch.from_numpy(values)
        model.update(np.arange(n), values)
        rebuilt = cls(size)  # written in a shuffled order: the scatter path
        order = rng.permutation(size)
        rebuilt[order] = model.leaves[order].astype(dtype)
        lo = rng.integers(0, size, 40)
        hi = rng.integers(0, size + 1, 40)
        np.testing.assert_array_equal(tree.query(lo, hi), [model.query(a, b) for a, b in zip(lo, hi)])
        np.testing.assert_array_equal(tree.query(lo, hi), rebuilt.query(lo, hi))
        if _is_sum(cls) and model.leaves.sum() > 0:
            mass = rng.uniform(0, model.leaves.sum(), 64)
            np.testing.assert_array_equal(tree.scan_lower_bound(mass), rebuilt.scan_lower_bound(mass))


@pytest.mark.parametrize("cls", SUM_CLASSES)
@pytest.mark.parametrize("size", [16, 4099, 70_000])
def test_scan_at_exact_prefix_boundaries(cls, size):
    """Masses exactly at and half a unit below every prefix sum of small integer leaves (all sums
    exact in fp32 too): the descent, whose lowest levels compute their prefix sums in vector
    lanes, must give numpy's searchsorted exactly, never a zero-valued leaf."""
    rng = np.random.default_rng(size)
    values = rng.integers(0, 4, size).astype(_dtype(cls))
    values[rng.integers(0, size, size // 3)] = 0
    values[-1] = 1
    tree = cls(size)
    tree[rng.permutation(size)] = values[rng.permutation(size)] * 0  # scatter path first
    tree[np.arange(size)] = values
    cumsum = np.cumsum(values.astype(np.float64))
    masses = np.unique(np.concatenate([cumsum, cumsum - 0.5]))
    masses = masses[masses > 0].astype(_dtype(cls))
    expected = np.searchsorted(cumsum, masses.astype(np.float64), side="left")
    got = tree.scan_lower_bound(masses)
    np.testing.assert_array_equal(got, expected)
    assert (values[got] > 0).all()


@pytest.mark.parametrize("cls", [replay.SumSegmentTreeFp32, replay.SumSegmentTreeFp64,
                                 replay.MinSegmentTreeFp32, replay.MinSegmentTreeFp64])
def test_state_in_torchrls_pickle_format(cls):
    """torchrl's compiled trees pickle as ``__new__`` alone and a one-item tuple of leaves
    (pybind11): a checkpoint written on them unpickles into ours, with the size the leaves
    give; a wrong shape or dtype is refused by name."""
    dtype = np.float64 if cls.__name__.endswith("64") else np.float32
    leaves = np.random.default_rng(3).random(37).astype(dtype)
    tree = cls.__new__(cls)
    tree.__setstate__((leaves,))
    assert tree.size == 37
    np.testing.assert_array_equal(np.asarray(tree[np.arange(37)]), leaves)
    reference = cls(37)
    reference[np.arange(37)] = leaves
    assert tree.query(0, 37) == reference.query(0, 37)
    with pytest.raises(ValueError, match=r"one-dimensional, got shape \(2, 2\)"):
        cls.__new__(cls).__setstate__((np.zeros((2, 2), dtype=dtype),))
    with pytest.raises(TypeError, match="must have dtype"):
        cls.__new__(cls).__setstate__((np.zeros(3, dtype=np.int64),))
