"""torchrl_compat.samplers (non-slice samplers) against torchrl 0.11's Python samplers.

torchrl's compiled segment trees do not load on this torch, so its PrioritizedSampler runs
here on ``NumpyTree``, a plain numpy model of the tree API (monkeypatched in its module).
"""
import inspect
import json
import pickle
import sys

import numpy as np
import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl
from tensordict import TensorDict
from torchrl.data.replay_buffers import LazyTensorStorage, ListStorage
from torchrl.data.replay_buffers.storages import StorageEnsemble

import torchrl_compat.samplers as ours
from torchrl_compat._releases import since

from twin_checks import assert_no_torchrl_code

# The module whose globals hold torchrl's tree classes (torchrl 0.14 splits samplers.py).
TRL_PRIORITIZED = sys.modules[trl.PrioritizedSampler._init.__module__]

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    ),
]
# Where the priorities of a CPU sampler live: replay's trees, or the torch-op trees of the
# accelerator path (``_use_cpu_kernels = False``).
BACKENDS = ["torch", "replay"]


class NumpyTree:
    """The segment-tree API of torchrl._torchrl, as a plain O(size) numpy model."""

    dtype = np.float32
    kind = "sum"

    def __init__(self, size):
        self.size = size
        self.capacity = 1 << int(size).bit_length()
        self.identity_element = 0.0 if self.kind == "sum" else float(np.finfo(self.dtype).max)
        self.values = np.full(size, self.identity_element, dtype=self.dtype)

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        if isinstance(index, int):
            return float(self.values[index])
        out = self.values[np.asarray(index)]
        return torch.as_tensor(out) if isinstance(index, torch.Tensor) else out

    def __setitem__(self, index, value):
        self.values[np.asarray(index)] = np.asarray(value, dtype=self.dtype)

    def query(self, left, right):
        part = self.values[max(left, 0) : min(right, self.size)].astype(np.float64)
        if not part.size:
            return self.identity_element
        return float(self.dtype(part.sum() if self.kind == "sum" else part.min()))

    def scan_lower_bound(self, value):
        prefix = np.cumsum(self.values.astype(np.float64))
        out = np.searchsorted(prefix, np.asarray(value, dtype=np.float64), side="left")
        return torch.as_tensor(out) if isinstance(value, torch.Tensor) else out


def _tree_class(kind, dtype):
    return type(f"Numpy{kind}{dtype.__name__}", (NumpyTree,), {"kind": kind, "dtype": dtype})


@pytest.fixture
def torchrl_trees(monkeypatch):
    monkeypatch.setattr(TRL_PRIORITIZED, "SumSegmentTreeFp32", _tree_class("sum", np.float32))
    monkeypatch.setattr(TRL_PRIORITIZED, "SumSegmentTreeFp64", _tree_class("sum", np.float64))
    monkeypatch.setattr(TRL_PRIORITIZED, "MinSegmentTreeFp32", _tree_class("min", np.float32))
    monkeypatch.setattr(TRL_PRIORITIZED, "MinSegmentTreeFp64", _tree_class("min", np.float64))


def make_storage(n, filled=None, ndim=1, device="cpu"):
    storage = LazyTensorStorage(n, ndim=ndim, device=device)
    filled = n if filled is None else filled
    if ndim == 1:
        storage.set(torch.arange(filled), TensorDict({"obs": torch.arange(filled)}, [filled]))
    else:
        shape = (filled // 4, 4)
        storage.set(
            torch.arange(shape[0]),
            TensorDict({"obs": torch.arange(shape[0] * 4).view(shape)}, list(shape)),
        )
    return storage


def generator(seed=0):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------- API


CLASSES = [
    "Sampler",
    "RandomSampler",
    "SamplerWithoutReplacement",
    "PrioritizedSampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "PrioritizedSliceSampler",
    "SamplerEnsemble",
]


@pytest.mark.parametrize("name", CLASSES)
def test_signatures_match_torchrl(name):
    ref, mine = getattr(trl, name), getattr(ours, name)
    assert inspect.signature(mine) == inspect.signature(ref)
    public = {m for m in dir(ref) if not m.startswith("_")} | {"__init__", "__getitem__", "__len__"}
    for member in sorted(public):
        if not hasattr(ref, member):
            continue
        assert hasattr(mine, member), member
        ref_attr = inspect.getattr_static(ref, member)
        mine_attr = inspect.getattr_static(mine, member)
        assert isinstance(mine_attr, property) == isinstance(ref_attr, property), member
        if callable(getattr(ref, member)) and not isinstance(ref_attr, property):
            ref_fn, mine_fn = getattr(ref, member), getattr(mine, member)
            try:
                ref_sig = inspect.signature(ref_fn)
            except (TypeError, ValueError):
                continue
            assert inspect.signature(mine_fn) == ref_sig, member
    assert issubclass(mine, ours.Sampler)
    # Our own bases follow torchrl's order; torchrl's twins come after them all.
    own = [b.__name__ for b in mine.__mro__[1:-1] if not b.__module__.startswith("torchrl.")]
    assert own == [b.__name__ for b in ref.__mro__[1:-1]]
    assert issubclass(mine, ref)


def test_module_names_used_by_torchrl():
    # Names torchrl's other modules import from torchrl.data.replay_buffers.samplers.
    for name in CLASSES + ["_EMPTY_STORAGE_ERROR"]:
        assert hasattr(ours, name), name
    assert ours._EMPTY_STORAGE_ERROR == trl._EMPTY_STORAGE_ERROR


def test_reprs():
    assert repr(ours.RandomSampler()) == repr(trl.RandomSampler())
    assert repr(ours.SamplerWithoutReplacement()) == repr(trl.SamplerWithoutReplacement())
    s = ours.PrioritizedSampler(10, 0.5, 0.4)
    assert repr(s) == "PrioritizedSampler(alpha=0.5, beta=0.4, eps=1e-08, reduction=max)"


# ------------------------------------------------------------------------- RandomSampler


@pytest.mark.parametrize("ndim", [1, 2])
def test_random_sampler_matches_torchrl(ndim):
    storage = make_storage(40, ndim=ndim)
    torch.manual_seed(3)
    ref, _ = trl.RandomSampler().sample(storage, 16)
    torch.manual_seed(3)
    mine, info = ours.RandomSampler().sample(storage, 16)
    assert info == {}
    if ndim == 1:
        assert torch.equal(ref, mine) and ((mine >= 0) & (mine < 40)).all()
    else:
        assert isinstance(mine, tuple) and len(mine) == 2
        assert all(torch.equal(a, b) for a, b in zip(ref, mine))
        assert (mine[1] < 4).all() and (mine[0] < 10).all()


def test_random_sampler_partial_and_empty():
    storage = make_storage(40, filled=5)
    index, _ = ours.RandomSampler().sample(storage, 1000)
    assert set(index.tolist()) == set(range(5))
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage."):
        ours.RandomSampler().sample(LazyTensorStorage(4), 2)
    assert ours.RandomSampler().state_dict() == {}


# ------------------------------------------------------------------------- without replacement


def _run_without_replacement(module, storage_sizes, batch_size, **kwargs):
    sampler = module.SamplerWithoutReplacement(**kwargs)
    sampler._rng = generator(7)
    out = []
    for size in storage_sizes:
        storage = make_storage(64, filled=size)
        index, _ = sampler.sample(storage, batch_size)
        out.append((index.tolist(), sampler.ran_out, sampler._remaining_batches))
    return out


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_without_replacement_matches_torchrl(drop_last, shuffle):
    # includes a storage-length change (re-shuffle) midway
    sizes = [10] * 7 + [13] * 6
    kwargs = dict(drop_last=drop_last, shuffle=shuffle)
    assert _run_without_replacement(ours, sizes, 3, **kwargs) == _run_without_replacement(
        trl, sizes, 3, **kwargs
    )


@pytest.mark.parametrize("with_generator", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("seed", range(3))
def test_without_replacement_buffer_draws_torchrls_batches(seed, ndim, drop_last, with_generator):
    """Seeded as torchrl's users seed (``torch.manual_seed``, or a buffer generator), buffers on
    ours sample torchrl's batches over several epochs, a growing storage and the wrap-around,
    and leave torch's RNG where torchrl's leave it."""

    def run(lib):
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed + 10) if with_generator else None
        rb = lib.ReplayBuffer(
            storage=lib.LazyTensorStorage(24, ndim=ndim),
            sampler=lib.SamplerWithoutReplacement(drop_last=drop_last),
            batch_size=5,
            generator=gen,
        )
        out = []
        for step in range(12):
            if step % 3 == 0:  # 7 items (rows of 2 when ndim == 2) a write, wrapping at 24
                data = torch.arange(step * 100, step * 100 + 14)
                rb.extend(data.view(7, 2) if ndim == 2 else data[:7])
            out.append(rb.sample())
        return out, torch.rand(4)

    import torchrl.data as torchrl_data

    import torchrl_compat

    theirs, mine = run(torchrl_data), run(torchrl_compat)
    assert len(theirs[0]) == len(mine[0])
    for a, b in zip(theirs[0], mine[0]):
        assert torch.equal(a, b)
    assert torch.equal(theirs[1], mine[1])


@pytest.mark.parametrize("n,batch", [(1, 1), (10, 3), (12, 4), (64, 64), (7, 10)])
def test_without_replacement_epoch_covers_each_once(n, batch):
    storage = make_storage(64, filled=n)
    sampler = ours.SamplerWithoutReplacement()
    seen = []
    while True:
        index, _ = sampler.sample(storage, batch)
        seen += index.tolist()
        if sampler.ran_out:
            break
    first_epoch = seen[: n]
    assert sorted(first_epoch) == list(range(n))
    if n % batch:
        # the last batch is completed from the next permutation, without repeats inside it
        assert len(set(seen[-batch:])) == len(seen[-batch:])


def test_without_replacement_drop_last_errors_and_ndim():
    storage = make_storage(64, filled=5)
    sampler = ours.SamplerWithoutReplacement(drop_last=True)
    with pytest.raises(ValueError, match=r"The batch size \(6\) is greater than the storage capacity \(5\)"):
        sampler.sample(storage, 6)
    index, _ = sampler.sample(storage, 5)  # still usable
    assert sorted(index.tolist()) == list(range(5))
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage."):
        sampler.sample(LazyTensorStorage(3), 1)
    storage2 = make_storage(40, ndim=2)
    sampler = ours.SamplerWithoutReplacement()
    rows, cols = sampler.sample(storage2, 40)[0]
    assert sorted((rows * 4 + cols).tolist()) == list(range(40))


def test_without_replacement_state_dict_crosses_torchrl(tmp_path):
    storage = make_storage(64, filled=20)
    ref = trl.SamplerWithoutReplacement(drop_last=True)
    ref._rng = generator(1)
    ref.sample(storage, 6)
    mine = ours.SamplerWithoutReplacement(drop_last=False)
    mine.load_state_dict(ref.state_dict())
    mine._rng = torch.Generator()
    mine._rng.set_state(ref._rng.get_state())
    assert mine.drop_last is True
    for _ in range(3):
        a, _ = ref.sample(storage, 6)
        b, _ = mine.sample(storage, 6)
        assert torch.equal(a, b) and ref.ran_out == mine.ran_out
    assert list(mine.state_dict()) == list(ref.state_dict())
    # dumps here, loads in torchrl, and the reverse
    mine.dumps(tmp_path / "ours")
    back = trl.SamplerWithoutReplacement()
    back.loads(tmp_path / "ours")
    assert torch.equal(back._sample_list, mine._sample_list) and back.len_storage == 20
    ref.dumps(tmp_path / "ref")
    fresh = ours.SamplerWithoutReplacement()
    fresh.loads(tmp_path / "ref")
    assert torch.equal(fresh._sample_list, ref._sample_list) and fresh._ran_out == ref._ran_out
    assert repr(fresh) == repr(ref)


# ------------------------------------------------------------------------- prioritized


def _priorities(n, seed=0):
    return torch.rand(n, generator=generator(seed)) * 4


def _make_pair(n, **kwargs):
    ref = trl.PrioritizedSampler(n, **kwargs)
    mine = ours.PrioritizedSampler(n, **kwargs)
    ref._rng = generator(11)
    mine._rng = generator(11)
    return ref, mine


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha,beta,eps", [(0.7, 0.5, 1e-8), (0.0, 1.0, 1e-8), (1.0, 0.0, 0.1)])
def test_prioritized_matches_torchrl(dtype, alpha, beta, eps):
    n = 50
    storage = make_storage(n, filled=40)
    ref, mine = _make_pair(n, alpha=alpha, beta=beta, eps=eps, dtype=dtype)
    priority = _priorities(40)
    priority[::5] = 0
    for sampler in (ref, mine):
        sampler.update_priority(torch.arange(40), priority)
        sampler.update_priority(torch.tensor([3, 4, -1]), torch.tensor([10.0, 0.5, 99.0]))
    for _ in range(3):
        (ri, rinfo), (mi, minfo) = ref.sample(storage, 64), mine.sample(storage, 64)
        assert torch.equal(ri, mi)
        assert minfo.keys() == rinfo.keys() == {"priority_weight"}
        assert minfo["priority_weight"].dtype == rinfo["priority_weight"].dtype == dtype
        torch.testing.assert_close(minfo["priority_weight"], rinfo["priority_weight"])
    assert mine.default_priority == pytest.approx(float(ref.default_priority))
    assert float(mine._max_priority[0]) == float(ref._max_priority[0]) == pytest.approx(10.0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prioritized_frequencies_and_weights(backend, dtype):
    """Chi-square of the sample frequencies against p^alpha / sum, and exact weights."""
    n, alpha, beta, eps = 20, 0.6, 0.4, 1e-8
    storage = make_storage(32, filled=n)
    sampler = ours.PrioritizedSampler(32, alpha=alpha, beta=beta, eps=eps, dtype=dtype)
    sampler._use_cpu_kernels = backend == "replay"
    priority = torch.arange(1, n + 1, dtype=torch.float64)
    sampler.update_priority(torch.arange(n), priority)
    sampler._rng = generator(5)
    draws = 100_000
    index, info = sampler.sample(storage, draws)
    p = (priority + eps) ** alpha
    expected = p / p.sum() * draws
    counts = torch.bincount(index, minlength=n).double()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 43.8  # chi-square with 19 degrees of freedom, p = 0.999
    stored = p.to(dtype)
    expected_weight = torch.pow(stored[index] / stored.min(), -beta)
    assert torch.equal(info["priority_weight"], expected_weight.to(dtype))


def test_prioritized_fp32_vs_fp64_precision():
    storage = make_storage(8)
    for dtype in (torch.float32, torch.float64):
        s = ours.PrioritizedSampler(8, 1.0, 1.0, eps=0.0, dtype=dtype)
        s.update_priority(torch.arange(8), torch.full((8,), 1 / 3, dtype=torch.float64))
        assert s._sum_tree[0] == float(torch.tensor(1 / 3, dtype=dtype))
        assert s.sample(storage, 4)[1]["priority_weight"].dtype == dtype
    with pytest.raises(NotImplementedError, match="dtype torch.int64 not supported by PrioritizedSampler"):
        ours.PrioritizedSampler(8, 1.0, 1.0, dtype=torch.int64)


def test_prioritized_constructor_errors():
    with pytest.raises(ValueError, match="alpha must be greater or equal than 0, got alpha=-1"):
        ours.PrioritizedSampler(8, -1, 1.0)
    with pytest.raises(ValueError, match="beta must be greater or equal to 0, got beta=-0.5"):
        ours.PrioritizedSampler(8, 1.0, -0.5)
    s = ours.PrioritizedSampler(8, 0.5, 0.5)
    s.alpha, s.beta = 0.2, 0.3
    assert (s.alpha, s.beta, s.max_size) == (0.2, 0.3, 8)


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("within_buffer", [False, True])
def test_max_priority_tracking_matches_torchrl(within_buffer):
    ref, mine = _make_pair(16, alpha=0.8, beta=0.5, max_priority_within_buffer=within_buffer)
    steps = [
        ("update", torch.arange(8), torch.arange(8.0)),
        ("extend", torch.tensor([7]), None),
        ("update", torch.tensor([7, 2]), torch.tensor([0.5, 3.0])),
        ("add", 2, None),
        ("mark", torch.tensor([9, 10]), None),
        ("extend", slice(0, 4), None),
        ("update", torch.tensor(5), torch.tensor(20.0)),
        ("update", torch.tensor(-1), torch.tensor(50.0)),
    ]
    for op, index, priority in steps:
        for sampler in (ref, mine):
            if op == "update":
                sampler.update_priority(index, priority)
            elif op == "extend":
                try:
                    sampler.extend(index)
                except TypeError:  # torchrl: range(tuple) for slices
                    assert sampler is ref and isinstance(index, slice)
                    sampler._max_priority = mine._max_priority
            elif op == "add":
                sampler.add(index)
            else:
                sampler.mark_update(index)
        rp, mp = ref._max_priority, mine._max_priority
        assert (rp[0] is None) == (mp[0] is None)
        if rp[0] is not None:
            assert float(rp[0]) == pytest.approx(float(mp[0]))
            assert int(rp[1]) == int(mp[1])
        assert float(ref.default_priority) == pytest.approx(float(mine.default_priority))
        np.testing.assert_allclose(mine._sum_tree[np.arange(16)], ref._sum_tree[np.arange(16)], rtol=1e-6)
        np.testing.assert_allclose(mine._min_tree[np.arange(16)], ref._min_tree[np.arange(16)], rtol=1e-6)


@pytest.mark.usefixtures("torchrl_trees")
def test_update_priority_nd_index_with_storage():
    storage = make_storage(40, ndim=2)  # shape [10, 4]
    ref, mine = _make_pair(40, alpha=1.0, beta=1.0)
    index = torch.tensor([[0, 1], [3, 3], [9, 0]])
    for sampler in (ref, mine):
        sampler.update_priority(index, torch.tensor([1.0, 2.0, 3.0]), storage=storage)
    assert [mine._sum_tree[i] for i in (1, 15, 36)] == pytest.approx([1.0, 2.0, 3.0])
    np.testing.assert_allclose(mine._sum_tree[np.arange(40)], ref._sum_tree[np.arange(40)])
    (r0, r1), _ = ref.sample(storage, 32)
    (m0, m1), info = mine.sample(storage, 32)
    assert torch.equal(r0, m0) and torch.equal(r1, m1)
    with pytest.raises(RuntimeError, match="storage should be provided"):
        mine.update_priority(index, torch.ones(3))
    # Rows outside the storage, a -1 row included: torchrl's ravel_multi_index raises
    # ValueError, so do we (naming the row), and neither sampler changes.
    before = mine._sum_tree[np.arange(40)].copy(), mine._max_priority
    for rows, message in (
        ([[2, 2], [10, 0]], r"index \[10, 0\] at position 1 is out of range for a storage of shape \(10, 4\)"),
        ([[-1, -1], [2, 2]], r"index \[-1, -1\] at position 0 is out of range"),
        ([[0, 4]], r"index \[0, 4\] at position 0"),
    ):
        for sampler, match in ((ref, "invalid entry in coordinates array"), (mine, message)):
            with pytest.raises(ValueError, match=match):
                sampler.update_priority(torch.tensor(rows), torch.ones(len(rows)), storage=storage)
    np.testing.assert_array_equal(mine._sum_tree[np.arange(40)], before[0])
    assert mine._max_priority is before[1]


def test_update_priority_bad_input_leaves_sampler_usable():
    storage = make_storage(10)
    s = ours.PrioritizedSampler(10, 0.5, 0.5)
    s.update_priority(torch.arange(10), torch.ones(10))
    before = (s._sum_tree[np.arange(10)].copy(), s._min_tree[np.arange(10)].copy(), s._max_priority)
    with pytest.raises(RuntimeError, match=r"priority should be a number or an iterable of the same length as index\. Got priority of shape torch.Size\(\[3\]\) and index torch.Size\(\[2\]\)"):
        s.update_priority(torch.tensor([0, 1]), torch.ones(3))
    with pytest.raises(ValueError, match="priority must be finite and non-negative, got priority=nan at position 1"):
        s.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="got priority=-2.0 at position 0"):
        s.update_priority(torch.tensor([0]), torch.tensor([-2.0]))
    with pytest.raises(ValueError, match="got priority=inf"):
        s.update_priority(torch.tensor([0]), torch.tensor([float("inf")]))
    with pytest.raises(IndexError, match="index 16 at position 1 is out of range for max_capacity=10: the priority trees hold 16 leaves"):
        s.update_priority(torch.tensor([0, 16]), torch.tensor([1.0, 2.0]))
    with pytest.raises(IndexError, match="index -3"):
        s.update_priority(torch.tensor(-3), torch.tensor(2.0))
    after = (s._sum_tree[np.arange(10)], s._min_tree[np.arange(10)], s._max_priority)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    assert before[2] is after[2]
    index, info = s.sample(storage, 5)
    assert (info["priority_weight"] == 1).all()
    s.update_priority(torch.tensor([-1, -1]), torch.tensor([5.0, 5.0]))  # all skipped
    np.testing.assert_array_equal(s._sum_tree[np.arange(10)], before[0])


def test_sample_errors():
    s = ours.PrioritizedSampler(10, 1.0, 0.5, eps=0.0)
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage."):
        s.sample(LazyTensorStorage(10), 4)
    storage = make_storage(10, filled=4)
    with pytest.raises(RuntimeError, match="non-positive p_sum"):
        s.sample(storage, 4)  # nothing was given a priority
    s.update_priority(torch.arange(4), torch.tensor([0.0, 1.0, 0.0, 2.0]))
    with pytest.raises(RuntimeError, match="non-positive p_min"):
        s.sample(storage, 4)
    s.update_priority(torch.tensor([0, 2]), torch.tensor([1.0, 1.0]))
    assert s.sample(storage, 4)[0].shape == (4,)


def test_zero_priority_leaves_never_sampled():
    # eps=0 leaves zero-valued leaves in the tree; none of them may be drawn (the last valid
    # leaf is a zero one, so clamped draws must step left)
    storage = make_storage(16, filled=10)
    s = ours.PrioritizedSampler(16, 1.0, 0.0, eps=0.0)
    s.update_priority(torch.arange(16), torch.tensor([0.0, 1, 0, 0, 2, 0, 1, 0, 0, 0] + [5.0] * 6))
    s._min_tree[np.arange(16)] = 1.0  # only the sum tree matters for the draws
    s._rng = generator(2)
    index, info = s.sample(storage, 20_000)
    assert set(index.tolist()) == {1, 4, 6}
    assert (info["priority_weight"] == 1).all()


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prioritized_dumps_loads_cross_torchrl(tmp_path, dtype):
    n = 12
    storage = make_storage(n)
    ref, mine = _make_pair(n, alpha=0.9, beta=0.3, dtype=dtype)
    ref.update_priority(torch.arange(n), _priorities(n, 1))
    ref.dumps(tmp_path / "ref")
    assert {p.name for p in (tmp_path / "ref").iterdir()} == {
        "sumtree.memmap",
        "mintree.memmap",
        "sampler_metadata.json",
    }
    mine.loads(tmp_path / "ref")
    np.testing.assert_array_equal(mine._sum_tree[np.arange(n)], ref._sum_tree[np.arange(n)])
    np.testing.assert_array_equal(mine._min_tree[np.arange(n)], ref._min_tree[np.arange(n)])
    assert torch.equal(ref.sample(storage, 30)[0], mine.sample(storage, 30)[0])
    mine.update_priority(torch.tensor([0, 5]), torch.tensor([9.0, 0.1]))
    mine.dumps(tmp_path / "ours")
    with open(tmp_path / "ours" / "sampler_metadata.json") as f:
        meta = json.load(f)
    with open(tmp_path / "ref" / "sampler_metadata.json") as f:
        assert set(json.load(f)) == set(meta)
    assert meta["_max_capacity"] == n and meta["_max_priority"][0] == pytest.approx(9.0)
    back = trl.PrioritizedSampler(n, alpha=0.1, beta=0.1, dtype=dtype)
    back.loads(tmp_path / "ours")
    assert (back._alpha, back._beta) == (0.9, 0.3)
    np.testing.assert_array_equal(back._sum_tree[np.arange(n)], mine._sum_tree[np.arange(n)])
    assert back._max_priority[0] == pytest.approx(9.0)
    wrong = ours.PrioritizedSampler(n + 1, 1.0, 1.0)
    with pytest.raises(RuntimeError, match=r"max capacity of loaded metadata \(12.0\) differs from self._max_capacity \(13\)"):
        wrong.loads(tmp_path / "ours")
    # a fresh sampler (no priority yet) dumps too (torchrl's tree_map(float, None) fails there)
    ours.PrioritizedSampler(n, 1.0, 1.0).dumps(tmp_path / "fresh")
    fresh = ours.PrioritizedSampler(n, 1.0, 1.0)
    fresh.loads(tmp_path / "fresh")
    assert fresh._max_priority == (None, None) or tuple(fresh._max_priority) == (None, None)


@pytest.mark.usefixtures("torchrl_trees")
def test_prioritized_state_dict_cross_torchrl():
    n = 10
    storage = make_storage(n)
    ref, mine = _make_pair(n, alpha=0.5, beta=0.5)
    ref.update_priority(torch.arange(n), _priorities(n, 2))
    sd = ref.state_dict()
    versioned = {"_schema_version"} if since("prioritized_state_schema") else set()
    assert set(sd) == {"_alpha", "_beta", "_eps", "_max_priority", "_sum_tree", "_min_tree"} | versioned
    mine.load_state_dict(sd)
    assert isinstance(mine._sum_tree, ours.SumSegmentTreeFp32)
    np.testing.assert_array_equal(mine._sum_tree[np.arange(n)], ref._sum_tree[np.arange(n)])
    assert torch.equal(mine.sample(storage, 20)[0], ref.sample(storage, 20)[0])
    # our state dict holds tree objects torchrl's sampler can run on
    mine.update_priority(torch.tensor([1]), torch.tensor([30.0]))
    sd = mine.state_dict()
    saved_tree = sd["_sum_tree"]
    other = trl.PrioritizedSampler(n, 0.5, 0.5)
    other.load_state_dict(sd)
    other._rng, mine._rng = generator(4), generator(4)
    (oi, oinfo), (mi, minfo) = other.sample(storage, 40), mine.sample(storage, 40)
    assert torch.equal(oi, mi)
    torch.testing.assert_close(oinfo["priority_weight"], minfo["priority_weight"])
    # state dicts are copies
    mine.update_priority(torch.tensor([2]), torch.tensor([0.0]))
    assert saved_tree[2] != mine._sum_tree[2]


def test_prioritized_pickle_drops_rng():
    s = ours.PrioritizedSampler(6, 0.5, 0.5)
    s.update_priority(torch.arange(6), torch.arange(6.0))
    s._rng = generator(0)
    clone = pickle.loads(pickle.dumps(s))
    assert clone._rng is None
    np.testing.assert_array_equal(clone._sum_tree[np.arange(6)], s._sum_tree[np.arange(6)])


@pytest.mark.usefixtures("torchrl_trees")
def test_reduction_of_multidimensional_priorities():
    """Buffers reduce [N, ...] priorities with ``sampler.reduction`` (torchrl's ``_reduce``)."""
    from torchrl.data.replay_buffers.utils import _reduce

    td_error = torch.arange(24.0).view(8, 3)
    results = {}
    for module in (trl, ours):
        for reduction in ("max", "min", "mean", "median"):
            sampler = module.PrioritizedSampler(8, 1.0, 1.0, eps=0.0, reduction=reduction)
            assert sampler.reduction == reduction
            sampler.update_priority(torch.arange(8), _reduce(td_error, sampler.reduction, dim=1))
            results[module.__name__, reduction] = sampler._sum_tree[np.arange(8)].tolist()
    for reduction in ("max", "min", "mean", "median"):
        assert results[trl.__name__, reduction] == results[ours.__name__, reduction]
    assert results[ours.__name__, "max"][1] == 5.0 and results[ours.__name__, "min"][1] == 3.0


@pytest.mark.parametrize("device", DEVICES)
def test_prioritized_torch_path_follows_storage_device(device):
    storage_dev = make_storage(64, filled=50, device=device)
    storage_cpu = make_storage(64, filled=50)
    samplers = []
    for storage in (storage_cpu, storage_dev):
        s = ours.PrioritizedSampler(64, 0.7, 0.4)
        s._use_cpu_kernels = False
        s.update_priority(torch.arange(50), _priorities(50, 3), storage=storage)
        s._rng = generator(9)
        samplers.append((s, s.sample(storage, 128)))
    (s0, (i0, w0)), (s1, (i1, w1)) = samplers
    assert i1.device.type == torch.device(device).type == s1._sum_tree.device.type
    assert torch.equal(i0, i1.cpu())
    torch.testing.assert_close(w0["priority_weight"], w1["priority_weight"].cpu())


# ------------------------------------------------------------------------- ensemble


def _ensemble_storage():
    return StorageEnsemble(make_storage(10), make_storage(20), make_storage(30))


def test_ensemble_matches_torchrl_and_indexing():
    storage = _ensemble_storage()
    outs = []
    for module in (trl, ours):
        ens = module.SamplerEnsemble(module.RandomSampler(), module.RandomSampler(), module.RandomSampler(), num_buffer_sampled=4)
        torch.manual_seed(0)
        outs.append(ens.sample(storage, 8))
    (rs, rinfo), (ms, minfo) = outs
    assert torch.equal(rs["index"], ms["index"]) and torch.equal(rs["buffer_ids"], ms["buffer_ids"])
    assert ms.batch_size == torch.Size([4])
    ens = ours.SamplerEnsemble(
        ours.RandomSampler(), ours.SamplerWithoutReplacement(), ours.RandomSampler(), p=[1, 1, 2]
    )
    assert ens.p.tolist() == [0.25, 0.25, 0.5]
    assert len(ens) == 3 and ens[:] is ens and isinstance(ens[1], ours.SamplerWithoutReplacement)
    sub = ens[[0, 2]]
    assert isinstance(sub, ours.SamplerEnsemble) and len(sub) == 2
    assert sub.p.tolist() == pytest.approx([1 / 3, 2 / 3])
    assert len(ens[0:2]) == 2 and ens[(1,)] is ens[1]
    with pytest.raises(IndexError, match="Tuple of length greater than 1"):
        ens[0, 1]
    with pytest.raises(TypeError, match="A floating point index was received"):
        ens[torch.tensor([0.5])]
    with pytest.raises(RuntimeError, match="more than one dimension"):
        ens[torch.zeros(1, 1, dtype=torch.long)]
    with pytest.raises(IndexError, match="Expected an index of type"):
        ens[5]
    assert len(ours.SamplerEnsemble(ours.RandomSampler())[[0]]) == 1  # p=None slices too


def test_ensemble_sample_from_all_p_and_errors():
    storage = _ensemble_storage()
    ens = ours.SamplerEnsemble(*(ours.RandomSampler() for _ in range(3)), sample_from_all=True)
    samples, infos = ens.sample(storage, 9)
    assert samples["buffer_ids"].tolist() == [0, 1, 2]
    assert (samples["index"][0] < 10).all() and samples["index"].shape == (3, 3)
    with pytest.raises(RuntimeError, match="Cannot pass both `p` argument and `sample_from_all=True`."):
        ours.SamplerEnsemble(ours.RandomSampler(), p=[1], sample_from_all=True)
    ens = ours.SamplerEnsemble(*(ours.RandomSampler() for _ in range(3)), p=[0, 0, 1], num_buffer_sampled=2)
    ens._rng = generator(0)
    assert all(s._rng is ens._rng for s in ens._samplers)
    samples, _ = ens.sample(storage, 4)
    assert samples["buffer_ids"].tolist() == [2, 2]
    with pytest.raises(ValueError, match="batch_size=5 and num_buffer_sampled=2"):
        ens.sample(storage, 5)
    with pytest.raises(TypeError, match="got a storage of type LazyTensorStorage"):
        ens.sample(make_storage(4), 4)
    sd = ours.SamplerEnsemble(ours.SamplerWithoutReplacement(), ours.RandomSampler()).state_dict()
    assert list(sd) == ["0", "1"]


def test_ensemble_prioritized_info_and_dumps(tmp_path):
    storage = StorageEnsemble(make_storage(8), make_storage(8))
    samplers = [ours.PrioritizedSampler(8, 1.0, 1.0) for _ in range(2)]
    for s in samplers:
        s.update_priority(torch.arange(8), torch.arange(1.0, 9.0))
    ens = ours.SamplerEnsemble(*samplers, sample_from_all=True)
    samples, infos = ens.sample(storage, 8)
    assert infos["priority_weight"].shape == (2, 4)
    ens.dumps(tmp_path)
    other = ours.SamplerEnsemble(ours.PrioritizedSampler(8, 1.0, 1.0), ours.PrioritizedSampler(8, 1.0, 1.0))
    other.loads(tmp_path)
    np.testing.assert_array_equal(other[1]._sum_tree[np.arange(8)], samplers[1]._sum_tree[np.arange(8)])


def test_list_storage_random_and_without_replacement():
    storage = ListStorage(10)
    storage.set(list(range(6)), list(range(6)))
    index, _ = ours.SamplerWithoutReplacement().sample(storage, 6)
    assert sorted(index.tolist()) == list(range(6))
    s = ours.PrioritizedSampler(10, 1.0, 1.0)
    s.update_priority(torch.arange(6), torch.ones(6))
    index, _ = s.sample(storage, 50)
    assert index.max() < 6


def test_docstring_examples_run():
    import doctest

    result = doctest.testmod(ours, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 10 and result.failed == 0


SAMPLER_NAMES = [
    "Sampler", "RandomSampler", "SamplerWithoutReplacement", "PrioritizedSampler", "SliceSampler",
    "SliceSamplerWithoutReplacement", "PrioritizedSliceSampler", "SamplerEnsemble",
]


@pytest.mark.parametrize("name", SAMPLER_NAMES)
def test_no_torchrl_method_runs_on_our_samplers(name):
    assert_no_torchrl_code(getattr(ours, name))


def test_torchrl_replay_buffer_accepts_our_samplers():
    import torchrl.data as trl_data

    import torchrl_compat

    assert all(hasattr(torchrl_compat, name) for name in SAMPLER_NAMES)
    rb = trl_data.ReplayBuffer(
        storage=torchrl_compat.LazyTensorStorage(100),
        sampler=torchrl_compat.PrioritizedSampler(100, alpha=0.7, beta=0.9),
        batch_size=8,
    )
    rb.extend(torch.arange(50.0))
    sample, info = rb.sample(return_info=True)
    assert sample.shape == (8,) and (info["index"] < 50).all()
    rb.update_priority(info["index"], torch.full((8,), 5.0))
    assert torch.equal(info["priority_weight"], torch.ones(8))  # all priorities equal before
    rb = trl_data.ReplayBuffer(
        storage=torchrl_compat.LazyTensorStorage(100),
        sampler=torchrl_compat.SamplerWithoutReplacement(),
        batch_size=10,
    )
    rb.extend(torch.arange(30))
    seen = torch.cat([rb.sample() for _ in range(3)])
    assert sorted(seen.tolist()) == list(range(30))


def test_slice_helpers_match_torchrl():
    ref_slice = trl.SliceSampler(num_slices=1)
    mine_slice = ours.SliceSampler(num_slices=1)
    for st in (torch.tensor(3), torch.tensor([5]), torch.tensor([7, 2, 1])):
        for length in (1, 4):
            assert torch.equal(mine_slice._start_to_end(st, length), ref_slice._start_to_end(st, length))
    shapes = torch.tensor([5, 3, 4, 1])
    arange = torch.arange(100, 100 + int(shapes.sum()))
    ref = trl.PrioritizedSliceSampler.__new__(trl.PrioritizedSliceSampler)
    mine = ours.PrioritizedSliceSampler.__new__(ours.PrioritizedSliceSampler)
    assert torch.equal(mine._padded_indices(shapes, arange), ref._padded_indices(shapes, arange))


def test_random_sampler_draws_what_torchrls_storage_draws():
    """On torchrl's own 1-D storages the draw is inlined (skipping its dynamo-disabled
    wrappers): the indices are those of storage._rand_given_ndim for the same generator,
    eagerly and under torch.compile."""
    from tensordict import TensorDict
    from torchrl.data.replay_buffers import LazyTensorStorage

    storage = LazyTensorStorage(50)
    storage.set(torch.arange(30), TensorDict({"x": torch.arange(30)}, [30]))
    sampler = ours.RandomSampler()
    storage._rng = torch.Generator().manual_seed(5)
    got = sampler.sample(storage, 64)[0]
    storage._rng = torch.Generator().manual_seed(5)
    assert torch.equal(got, storage._rand_given_ndim(64))
    compiled = torch.compile(lambda: sampler.sample(storage, 16)[0], backend="eager")
    for _ in range(2):
        out = compiled()
        assert out.shape == (16,) and bool(((out >= 0) & (out < 30)).all())
