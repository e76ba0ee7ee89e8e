"""``replay``'s segment trees and prioritized sampler against torchrl's own compiled ones.

Where torchrl's compiled trees load (torch 2.9.1 with torchrl 0.11.0, torch 2.15.0 / 2.14.1
with torchrl 0.14.1: ``make test-native-trees``), the same operations go to both: updates
(batched, with repeated indices, and single), sums and minima over ranges, and
``scan_lower_bound`` at masses on, and one float step either side of, the prefix-sum
boundaries, on random non-integer priorities from 2^4 to 2^20 leaves; then torchrl's
``PrioritizedSampler`` on its own trees against ours, on the same seeds. Everything is
compared bit for bit, and must be equal: leaves and minima, and sums and draws too, ours
computing torchrl's binary sums in the tree's dtype inside its 16-ary layout (segtree.h). A
difference is still checked against rounding (a sum within (log2(size) + 2) epsilons of the
total, a draw's mass that close to the boundary between the two leaves), so that the failure
says which kind it is, then fails the test.
On the CI torch (2.13) torchrl's trees do not load and there is nothing of torchrl's to compare
with: the whole file skips.

The golden files made by ``tests/data/make_golden_*`` scripts on torchrl's own trees are made
again here (in a temporary folder) where the script's release is installed, and must equal
the committed ones.
"""
from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, HealthCheck, settings, strategies as st

import replay
from native_trees import torchrl_trees_load, torchrls_side

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
TREES_LOAD = torchrl_trees_load()

pytestmark = [
    pytest.mark.skipif(
        not TREES_LOAD,
        reason=f"torchrl's own compiled trees do not load with torch {torch.__version__}: nothing "
        "of torchrl's to compare with (make test-native-trees runs this file where they load)",
    ),
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning"),
]

if TREES_LOAD:
    import torchrl
    import torchrl._torchrl as native
    import torchrl.data.replay_buffers.samplers as trl_samplers
    from torchrl.data.replay_buffers import LazyTensorStorage

    import torchrl_compat.samplers as ours_samplers

KINDS = [(kind, fp) for kind in ("Sum", "Min") for fp in ("Fp32", "Fp64")]
DTYPES = {"Fp32": np.float32, "Fp64": np.float64}


@pytest.fixture(autouse=True, scope="module")
def _torchrls_own_trees():
    """torchrl's classes here are its compiled ones, not ours installed in their place."""
    for kind, fp in KINDS:
        cls = getattr(native, f"{kind}SegmentTree{fp}")
        assert cls.__module__ == "torchrl._torchrl" and cls is not getattr(replay, cls.__name__)
    assert trl_samplers.SumSegmentTreeFp32 is native.SumSegmentTreeFp32
    # ... and ours are this clone's build (the environment may hold an installed copy)
    assert os.path.abspath(replay.__file__).startswith(ROOT + os.sep), replay.__file__


# =============================================================================
# Trees
# =============================================================================
def _bits(array):
    array = np.asarray(array)
    if array.dtype.kind == "f":
        return array.view(np.int32 if array.dtype == np.float32 else np.int64)
    return array


def _numpy(x):
    return x.numpy() if torch.is_tensor(x) else np.asarray(x)


def _assert_same(ours, theirs, what, inputs=None):
    """Same type, dtype, shape and bits; on failure, the first positions that differ.

    torchrl's compiled trees take a one-element index tensor or array for an int (pybind's
    overloads try ``SupportsIndex`` first) and give a Python float: torchrl's quirk, where
    ours keeps the tensor; the value is compared."""
    if isinstance(theirs, float) and not isinstance(ours, float) and _numpy(ours).size == 1:
        ours, theirs = _numpy(ours).reshape(()), np.asarray(theirs, dtype=_numpy(ours).dtype)
    assert type(ours) is type(theirs), f"{what}: ours {type(ours)}, torchrl's {type(theirs)}"
    o, t = _numpy(ours), _numpy(theirs)
    assert o.dtype == t.dtype and o.shape == t.shape, f"{what}: ours {o.dtype}{o.shape}, torchrl's {t.dtype}{t.shape}"
    differ = np.flatnonzero(_bits(o).reshape(-1) != _bits(t).reshape(-1))
    if differ.size:
        shown = differ[:5]
        given_ = "" if inputs is None else f" for inputs {_numpy(inputs).reshape(-1)[shown].tolist()!r}"
        pytest.fail(f"{what}: {differ.size} of {o.size} differ, at {shown.tolist()}{given_}: ours "
                    f"{o.reshape(-1)[shown].tolist()!r}, torchrl's {t.reshape(-1)[shown].tolist()!r}")


def _priorities(rng, n, dtype):
    """Non-integer priorities over many magnitudes, none zero."""
    value = np.exp(rng.uniform(-12.0, 6.0, n)) * rng.uniform(0.5, 1.0, n)
    value = value.astype(dtype)
    value[value == np.round(value)] += dtype(0.25)  # never an integer
    return value


def _draws_apart_by_rounding(ours, theirs, masses, leaves, dtype, what) -> int:
    """How many draws differ (the same type and dtype asserted); each must have its mass
    within rounding (``_tolerance``) of the prefix sums at both leaves: running sums in extended
    precision (a float64 running sum over 2^20 leaves is itself further off than the two trees
    are). torchrl's descent can end on a padding leaf past ``size`` (a mass at or past the total,
    rounded): that counts as ``size``, what ours returns."""
    assert type(ours) is type(theirs), f"{what}: ours {type(ours)}, torchrl's {type(theirs)}"
    o, t = _numpy(ours).reshape(-1), _numpy(theirs).reshape(-1)
    assert o.dtype == t.dtype == np.int64 and o.shape == t.shape, what
    differ = np.flatnonzero(o != t)
    if not differ.size:
        return 0
    size = leaves.size
    prefix = np.concatenate([[0.0], np.cumsum(leaves, dtype=np.longdouble)])
    m = np.asarray(masses, dtype=np.longdouble).reshape(-1)[differ]
    lo = np.minimum(np.minimum(o[differ], t[differ]), size)
    hi = np.minimum(np.maximum(o[differ], t[differ]), size)
    tolerance = _tolerance(leaves, dtype)
    near = (np.abs(m - prefix[np.minimum(lo + 1, size)]) <= tolerance) & (np.abs(m - prefix[hi]) <= tolerance)
    bad = differ[~near]
    assert not bad.size, (
        f"{what}: draws differ away from a prefix-sum boundary: masses "
        f"{np.asarray(masses).reshape(-1)[bad][:3].tolist()}, ours {o[bad][:3].tolist()}, torchrl's {t[bad][:3].tolist()}")
    return differ.size


def _tolerance(leaves, dtype):
    """How far two summation orders of these leaves may round apart: torchrl's binary tree in
    the dtype, log2(capacity) roundings deep, a descent as many subtractions; ours in float64
    (and a rounding to the dtype): (log2(size) + 2) epsilons of the total."""
    eps = float(np.finfo(dtype).eps)
    return (np.log2(max(leaves.size, 2)) + 2) * eps * float(np.sum(leaves, dtype=np.float64))


class _Pair:
    """One of ours and one of torchrl's, fed the same calls. What must be equal bit for bit
    (leaves, min queries) fails at once; sums and draws are compared bit for bit too, and each
    difference is kept (``self.differences``) after checking that rounding explains it."""

    def __init__(self, kind, fp, size):
        self.kind, self.fp, self.size = kind, fp, size
        self.dtype = DTYPES[fp]
        self.ours = getattr(replay, f"{kind}SegmentTree{fp}")(size)
        self.theirs = getattr(native, f"{kind}SegmentTree{fp}")(size)
        self.differences = []

    def update(self, index, value):
        if isinstance(index, (int, np.integer)):
            self.ours.update(int(index), float(value))
            self.theirs.update(int(index), float(value))
            return
        index_t, value_t = torch.from_numpy(index), torch.from_numpy(value)
        self.ours.update(index_t, value_t)
        self.theirs.update(index_t, value_t)

    def leaves(self):
        return _numpy(self.theirs[np.arange(self.size)])

    def tolerance(self):
        return _tolerance(self.leaves(), self.dtype)

    def check_leaves(self, what):
        index = torch.arange(self.size)
        _assert_same(self.ours.at(index), self.theirs.at(index), f"{what}: leaves")
        np_index = np.arange(self.size)
        _assert_same(self.ours[np_index], self.theirs[np_index], f"{what}: leaves (numpy)")

    def _sums_agree(self, ours, theirs, what, lo, hi):
        """Min: bit for bit. Sum: bit for bit, or a difference rounding explains (kept)."""
        o, t = _numpy(ours).reshape(-1), _numpy(theirs).reshape(-1)
        differ = np.flatnonzero(_bits(o) != _bits(t))
        if not differ.size:
            return
        if self.kind == "Min":
            _assert_same(ours, theirs, what)
        gap = np.abs(o[differ].astype(np.float64) - t[differ].astype(np.float64))
        assert gap.max() <= self.tolerance(), (
            f"{what}: ours {o[differ][:3].tolist()} and torchrl's {t[differ][:3].tolist()} for "
            f"[{np.asarray(lo).reshape(-1)[differ][:3].tolist()}, {np.asarray(hi).reshape(-1)[differ][:3].tolist()}) "
            f"differ by more than rounding ({self.tolerance()})")
        self.differences.append(f"{what}: {differ.size} of {o.size} sums, by up to {gap.max():.3g}")

    def check_queries(self, rng, what, count=64):
        for lo, hi in [(0, self.size)] + [sorted(rng.integers(0, self.size + 1, 2).tolist()) for _ in range(3)]:
            ours, theirs = self.ours.query(lo, hi), self.theirs.query(lo, hi)
            assert type(ours) is type(theirs), f"{what}: query({lo}, {hi}) ours {type(ours)}, torchrl's {type(theirs)}"
            self._sums_agree(np.float64(ours), np.float64(theirs), f"{what}: query({lo}, {hi})", lo, hi)
        lo = rng.integers(0, self.size, count)
        hi = np.minimum(lo + rng.integers(1, self.size + 1, count), self.size)
        lo[:2], hi[:2] = 0, self.size
        for wrap, label in ((torch.from_numpy, "query([l], [r])"), (np.asarray, "query([l], [r]) (numpy)")):
            ours, theirs = self.ours.query(wrap(lo), wrap(hi)), self.theirs.query(wrap(lo), wrap(hi))
            assert type(ours) is type(theirs) and _numpy(ours).dtype == _numpy(theirs).dtype, f"{what}: {label}"
            self._sums_agree(ours, theirs, f"{what}: {label}", lo, hi)

    def boundary_masses(self, rng, count):
        """Prefix sums (the tree's own, and numpy's running sum in the tree's dtype), each with
        its float neighbours on either side, plus uniform masses, 0, the total and past it."""
        ends = np.concatenate([rng.integers(1, self.size + 1, count), [1, self.size]])
        tree_sums = _numpy(self.theirs.query(np.zeros_like(ends), ends)).astype(self.dtype)
        running = np.cumsum(self.leaves(), dtype=self.dtype)[ends - 1]
        at = np.concatenate([tree_sums, running])
        total = self.dtype(self.theirs.query(0, self.size))
        masses = np.concatenate([
            at, np.nextafter(at, self.dtype(0)), np.nextafter(at, self.dtype(np.inf)),
            rng.uniform(0, total, count).astype(self.dtype), [0, total, np.nextafter(total, self.dtype(np.inf))],
        ]).astype(self.dtype)
        return masses[masses >= 0]

    def _draws_agree(self, ours, theirs, masses, what):
        apart = _draws_apart_by_rounding(ours, theirs, masses, self.leaves(), self.dtype, what)
        if apart:
            self.differences.append(f"{what}: {apart} of {_numpy(ours).size} draws")

    def check_draws(self, rng, what, count=256):
        masses = self.boundary_masses(rng, count)
        self._draws_agree(self.ours.scan_lower_bound(torch.from_numpy(masses)),
                          self.theirs.scan_lower_bound(torch.from_numpy(masses)), masses, f"{what}: scan_lower_bound")
        self._draws_agree(self.ours.scan_lower_bound(masses), self.theirs.scan_lower_bound(masses), masses,
                          f"{what}: scan_lower_bound (numpy)")
        singles = masses[:: max(1, masses.size // 8)]
        self._draws_agree(np.array([self.ours.scan_lower_bound(float(m)) for m in singles]),
                          np.array([self.theirs.scan_lower_bound(float(m)) for m in singles]), singles,
                          f"{what}: scan_lower_bound(float)")
        if self.dtype == np.float32:
            # torchrl's sampler hands an fp32 tree numpy's float64 masses, which torchrl rounds
            # to float32: a float64 mass just past a float32 boundary draws the boundary's leaf.
            wide = masses.astype(np.float64)
            wide = np.concatenate([wide, np.nextafter(wide, 0.0), np.nextafter(wide, np.inf),
                                   wide + np.spacing(masses).astype(np.float64) / 2])
            wide = wide[wide >= 0]
            self._draws_agree(self.ours.scan_lower_bound(wide), self.theirs.scan_lower_bound(wide), wide,
                              f"{what}: scan_lower_bound (float64 masses)")
        uniform = rng.uniform(0, float(self.theirs.query(0, self.size)), 4 * count).astype(self.dtype)
        self._draws_agree(self.ours.scan_lower_bound(uniform), self.theirs.scan_lower_bound(uniform), uniform,
                          f"{what}: scan_lower_bound (uniform masses)")


ROUNDING = ("sums round apart from torchrl's binary ones in the tree's dtype, and draws at a "
            "prefix-sum boundary go to the leaf on the other side")


def _exercise(kind, fp, size, seed, rounds):
    """Updates and draws interleaved: every leaf first (a batch with repeated indices), then
    rounds of a batched update with repeats, a single update, and the checks. Leaves and min
    queries must be torchrl's bit for bit; sums and draws too, or differ only by rounding
    (then an expected failure naming each difference)."""
    rng = np.random.default_rng(seed)
    pair = _Pair(kind, fp, size)
    what = f"{kind}SegmentTree{fp}({size}), seed {seed}"
    index = np.concatenate([rng.permutation(size), rng.integers(0, size, size // 4 + 1)])
    pair.update(index.astype(np.int64), _priorities(rng, index.size, pair.dtype))
    for step in range(rounds + 1):
        here = f"{what}, round {step}"
        pair.check_leaves(here)
        pair.check_queries(rng, here)
        if kind == "Sum":
            pair.check_draws(rng, here)
        if step == rounds:
            break
        n = int(rng.integers(1, max(2, size // 8)))
        index = rng.integers(0, size, n).astype(np.int64)
        index = np.concatenate([index, index[: n // 2 + 1]])  # repeats: the last value stays
        pair.update(index, _priorities(rng, index.size, pair.dtype))
        single = int(rng.integers(0, size))
        pair.update(single, _priorities(rng, 1, pair.dtype)[0])
    return pair.differences


def _assert_none(differences):
    """Sums and draws apart only by rounding were kept in ``differences``: each one fails."""
    if differences:
        sums = [d for d in differences if d.endswith(" sums") or " sums, " in d]
        draws = [d for d in differences if d.endswith(" draws")]
        pytest.fail(f"{ROUNDING}: sums apart in {len(sums)} checks, draws apart in {len(draws)}; e.g. "
                    f"{'; '.join((sums[:1] + draws[:2]))}")


SMALL_SIZES = st.one_of(st.sampled_from([2**k for k in range(4, 11)]), st.integers(1, 1500))


@pytest.mark.parametrize("kind,fp", KINDS)
def test_small_trees_are_torchrls_to_the_bit(kind, fp):
    differences = []

    @settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
    @given(size=SMALL_SIZES, seed=st.integers(0, 2**32 - 1))
    def exercise(size, seed):
        differences.extend(_exercise(kind, fp, size, seed, rounds=4))

    exercise()
    _assert_none(differences)


@pytest.mark.parametrize("kind,fp", KINDS)
@pytest.mark.parametrize("size", [2**12, 2**16 - 1, 2**16, 100_003, 2**20])
def test_large_trees_are_torchrls_to_the_bit(kind, fp, size):
    _assert_none(_exercise(kind, fp, size, seed=size, rounds=2))


# =============================================================================
# PrioritizedSampler
# =============================================================================
def _filled(storage, start, n):
    storage.set(torch.arange(start, start + n), torch.arange(start, start + n))
    return torch.arange(start, start + n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("generator", [False, True])
@pytest.mark.parametrize("capacity", [100, 4096, 2**17 + 3])
def test_prioritized_sampler_is_torchrls_to_the_bit(dtype, generator, capacity):
    """torchrl's PrioritizedSampler on its own trees and ours, through extends (a partly
    filled storage first), priority updates with repeated indices and samples, on the same
    seeds: the same indices and weights, bit for bit (a draw apart fails, saying whether its
    mass, made again from the seed, lies within rounding of a prefix-sum boundary; the other
    draws' weights are compared bit for bit first). torchrl's fp64 sampler
    hands its trees float32 masses when it has a generator and fails (torchrl's bug): an
    expected failure."""
    kwargs = dict(alpha=0.7, beta=0.5, dtype=dtype)
    theirs = trl_samplers.PrioritizedSampler(capacity, **kwargs)
    ours = ours_samplers.PrioritizedSampler(capacity, **kwargs)
    if generator:
        theirs._rng = torch.Generator().manual_seed(capacity)
        ours._rng = torch.Generator().manual_seed(capacity)
    storage = LazyTensorStorage(capacity)
    torch.manual_seed(capacity)
    chunk = max(1, capacity // 3)
    differences = []
    for step in range(5):
        if len(storage) < capacity:
            index = _filled(storage, len(storage), min(chunk, capacity - len(storage)))
            ours.extend(index)
            theirs.extend(index)
        n = max(1, len(storage) // 2)
        index = torch.randint(0, len(storage), (n,))
        index = torch.cat([index, index[: n // 3]])
        priority = (torch.rand(index.numel(), dtype=torch.float64) * 8 + 1e-3).to(dtype)
        ours.update_priority(index, priority)
        with torchrls_side():
            theirs.update_priority(index, priority)
        for batch in (1, 64, 1000):
            seed = step * 1000 + batch
            rng_state = theirs._rng.get_state() if generator else None
            np.random.seed(seed)
            ours_index, ours_info = ours.sample(storage, batch)
            np.random.seed(seed)
            with torchrls_side():
                their_index, their_info = theirs.sample(storage, batch)
            what = f"capacity {capacity}, step {step}, batch {batch}"
            # the masses torchrl drew, made again from the same seed
            p_sum = theirs._sum_tree.query(0, len(storage))
            if generator:
                masses = torch.rand(batch, generator=torch.Generator().set_state(rng_state)) * p_sum
            else:
                np.random.seed(seed)
                masses = np.random.uniform(0.0, p_sum, size=batch)
            leaves = _numpy(theirs._sum_tree[np.arange(len(storage))])
            apart = _draws_apart_by_rounding(ours_index, their_index, _numpy(masses), leaves, leaves.dtype.type, what)
            if apart:
                differences.append(f"{what}: {apart} of {batch} draws")
            same = ours_index == their_index
            ours_weight, their_weight = ours_info["priority_weight"], their_info["priority_weight"]
            if batch == 1:
                # torchrl's trees give a one-element index's leaf as a Python float (pybind's
                # SupportsIndex overload first): one draw gets a 0-d float32 weight, ours a
                # weight of shape (1,) in the sampler's dtype (torchrl's bug, docs/torchrl.md)
                assert their_weight.shape == () and their_weight.dtype == torch.float32, what
                if dtype == torch.float64 or not same.all():
                    continue
                ours_weight, their_weight = ours_weight.reshape(()), their_weight
            else:
                assert ours_weight.dtype == their_weight.dtype and ours_weight.shape == their_weight.shape, what
                ours_weight, their_weight = ours_weight[same], their_weight[same]
            _assert_same(ours_weight, their_weight, f"{what}: priority_weight")
        assert float(ours._max_priority[0]) == float(theirs._max_priority[0])
    _assert_none(differences)


# =============================================================================
# Golden files made on torchrl's own trees
# =============================================================================
# script -> (the torchrl release it runs under, the files it writes under its --out folder)
GOLDEN_SCRIPTS = {
    "make_golden_prioritized_014.py": ("0.14", [
        "golden_prioritized_sampler_014.json",
        "golden_prioritized_sampler_014.pt",
        "golden_prioritized_sampler_014/sampler_metadata.json",
        "golden_prioritized_sampler_014/sumtree.memmap",
        "golden_prioritized_sampler_014/mintree.memmap",
    ]),
    "make_golden_torchrl_smaller_sampler.py": ("0.11", ["golden_torchrl_smaller_sampler.json"]),
}
# Committed goldens known to differ from what their script makes on torchrl's own trees, and
# why; the test fails once they no longer differ (then drop the entry).
KNOWN_DIFFERENCES: dict = {}


def _state_dict_differences(made, committed, what):
    if type(made) is not type(committed):
        return [f"{what}: made {type(made).__module__}.{type(made).__name__}, committed "
                f"{type(committed).__module__}.{type(committed).__name__}"]
    if isinstance(made, dict):
        if list(made) != list(committed):
            return [f"{what}: keys {list(made)} made, {list(committed)} committed"]
        return [d for key in made for d in _state_dict_differences(made[key], committed[key], f"{what}[{key!r}]")]
    if isinstance(made, (tuple, list)):
        if len(made) != len(committed):
            return [f"{what}: {len(made)} items made, {len(committed)} committed"]
        return [d for k, (a, b) in enumerate(zip(made, committed)) for d in _state_dict_differences(a, b, f"{what}[{k}]")]
    if torch.is_tensor(made):
        same = made.dtype == committed.dtype and made.shape == committed.shape and torch.equal(made, committed)
        return [] if same else [f"{what}: {made} made, {committed} committed"]
    if hasattr(made, "scan_lower_bound") or hasattr(made, "identity_element"):
        a, b = _numpy(made[np.arange(made.size)]), _numpy(committed[np.arange(committed.size)])
        return [] if a.dtype == b.dtype and np.array_equal(_bits(a), _bits(b)) else [f"{what}: leaves differ"]
    return [] if made == committed else [f"{what}: {made!r} made, {committed!r} committed"]


def _json_differences(made, committed, name):
    a, b = json.loads(made.read_text()), json.loads(open(committed).read())
    differ = [key for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    return [f"{name}: {key!r} differs" for key in differ] or [f"{name}: bytes differ"]


@pytest.mark.parametrize("script", sorted(GOLDEN_SCRIPTS))
def test_goldens_are_what_their_script_makes(tmp_path, script):
    """Each golden script run again (on torchrl's own trees, where the script's release is
    installed) makes the committed files: bytes equal (a .pt: what it holds, bit for bit)."""
    release, files = GOLDEN_SCRIPTS[script]
    if not torchrl.__version__.startswith(release):
        pytest.skip(f"{script} runs under torchrl {release}, this is torchrl {torchrl.__version__}")
    env = dict(os.environ, PYTHONPATH=ROOT)
    for name in ("TORCHRL_COMPAT_INSTALL", "TORCHRL_COMPAT_INSTALL_TREES"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, os.path.join(DATA, script), "--out", str(tmp_path)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    differences = []
    for name in files:
        made, committed = tmp_path / name, os.path.join(DATA, name)
        if name.endswith(".pt"):  # a zip with a serialization id of its own: compare what it holds
            differences += _state_dict_differences(torch.load(made, weights_only=False),
                                                   torch.load(committed, weights_only=False), name)
        elif not filecmp.cmp(made, committed, shallow=False):
            differences += _json_differences(made, committed, name) if name.endswith(".json") else [f"{name}: bytes differ"]
    known = KNOWN_DIFFERENCES.get(script)
    if known is None:
        assert not differences, f"{script} makes other files than the committed ones: {differences}"
    else:
        assert differences, f"{script} now makes the committed files: drop its KNOWN_DIFFERENCES entry"
        pytest.xfail(f"{known}: {'; '.join(differences)}")
