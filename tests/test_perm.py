"""Uniform permutations: ``replay.randperm`` and ``replay.PermutationEpoch``."""
import itertools
import pickle
import threading

import numpy as np
import pytest
import torch

import replay

MASK = (1 << 64) - 1
SIZES = list(range(65)) + [4095, 4096, 8193, 100_003, 2 ** 20 + 7]


# ---- reference PRNG (written from the published algorithms, not from prng.h) ------------


def _splitmix64(x):
    out = []
    for _ in range(4):
        x = (x + 0x9E3779B97F4A7C15) & MASK
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        out.append(z ^ (z >> 31))
    return out


def _rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & MASK


def _xoshiro256ss(s, count):
    s = list(s)
    out = []
    for _ in range(count):
        out.append((_rotl((s[1] * 5) & MASK, 7) * 9) & MASK)
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
    return out


def test_reference_xoshiro_matches_published_vectors():
    # First outputs of xoshiro256** from state {1, 2, 3, 4}, as in other implementations'
    # reference tests (e.g. rand_xoshiro).
    assert _xoshiro256ss([1, 2, 3, 4], 6) == [
        11520, 0, 1509978240, 1215971899390074240, 1216172134540287360, 607988272756665600,
    ]


@pytest.mark.parametrize("seed", [0, 1, 42, 2 ** 63, MASK])
def test_kernel_stream_matches_reference(seed):
    expected = _xoshiro256ss(_splitmix64(seed), 64)
    assert replay._py_prng_u64(seed, 64).tolist() == expected


def _lemire(stream, bound):
    """Lemire's nearly-divisionless bounded draws over a stream of 64-bit words."""
    words = iter(stream)
    while True:
        product = next(words) * bound
        if product & MASK < bound:
            threshold = (MASK + 1 - bound) % bound
            while product & MASK < threshold:
                product = next(words) * bound
        yield product >> 64


@pytest.mark.parametrize("bound", [1, 3, 1000, 2 ** 32 + 1, 2 ** 63 + 1, MASK])
def test_kernel_bounded_draws_match_reference(bound):
    """The 128-bit product of Lemire's method, a GCC extension, and its portable fallback (the
    debug build of make test forces it: REPLAY_PORTABLE) give the same draws."""
    draws = _lemire(_xoshiro256ss(_splitmix64(7), 1000), bound)
    expected = [next(draws) for _ in range(200)]
    assert replay._py_prng_u64(7, 200, bound).tolist() == expected


# ---- randperm ------------------------------------------------------------------------------


def _assert_permutation(perm, n):
    assert isinstance(perm, torch.Tensor)
    assert perm.dtype == torch.int64 and perm.device.type == "cpu"
    assert perm.shape == (n,)
    assert torch.equal(perm.sort().values, torch.arange(n))


@pytest.mark.parametrize("n", SIZES)
def test_randperm_is_permutation(n):
    torch.manual_seed(n)
    _assert_permutation(replay.randperm(n), n)


@pytest.mark.parametrize("bits, capacity", [(0, 0), (1, -1), (3, 1000), (3, 0), (5, 3)])
@pytest.mark.parametrize("n", [0, 1, 2, 17, 1000, 30_001])
def test_randperm_layouts_are_permutations(n, bits, capacity):
    # Forced layouts reach the single-bucket path and (with tiny capacities) the overflow replay.
    perm = replay._py_randperm(n, 5, bits, capacity)
    assert perm.dtype == np.int64
    np.testing.assert_array_equal(np.sort(perm), np.arange(n))


@pytest.mark.parametrize("n", [20_000, 300_001])
def test_randperm_overflow_replay_gives_the_same_permutation(n):
    # Bucket overflow replays the same draws into exact offsets: the result must not change.
    default = replay._py_randperm(n, 11)
    bits = 4
    for capacity in (n, 1, 0, n >> bits):
        np.testing.assert_array_equal(replay._py_randperm(n, 11, bits, capacity),
                                      replay._py_randperm(n, 11, bits, n))
    assert not np.array_equal(default, np.arange(n))


def test_randperm_seeded_reproducibility():
    torch.manual_seed(3)
    a = replay.randperm(1000)
    b = replay.randperm(1000)  # the global RNG moved on
    torch.manual_seed(3)
    assert torch.equal(replay.randperm(1000), a)
    assert not torch.equal(a, b)
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert torch.equal(replay.randperm(100_000, generator=g1), replay.randperm(100_000, generator=g2))
    g3 = torch.Generator().manual_seed(10)
    assert not torch.equal(replay.randperm(100_000, generator=g1), replay.randperm(100_000, generator=g3))


def test_randperm_generator_leaves_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    replay.randperm(50, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.rand(3), expected)


def test_randperm_accepts_integer_like():
    torch.manual_seed(1)
    _assert_permutation(replay.randperm(np.int64(7)), 7)
    _assert_permutation(replay.randperm(torch.tensor(5)), 5)


@pytest.mark.parametrize("bad, exc, match", [
    (-1, RuntimeError, "n=-1"),
    (-(2 ** 40), RuntimeError, f"n={-(2 ** 40)}"),
    (2.5, TypeError, "must be int, not float"),
    (True, TypeError, "must be int, not bool"),
    ("3", TypeError, "must be int, not str"),
    (None, TypeError, "must be int, not NoneType"),
])
def test_randperm_bad_n(bad, exc, match):
    with pytest.raises(exc, match=match):
        replay.randperm(bad)
    with pytest.raises(exc):  # the same exception type as torch
        torch.randperm(bad)


# ---- uniformity ----------------------------------------------------------------------------

# Upper 0.1% points of the chi-square distribution (fixed seeds make the tests deterministic).
CHI2_999 = {23: 49.73, 49: 85.35}


def _position_chi2(draws, n):
    """Chi-square of the n x n table counting where each element lands (df = (n - 1)^2)."""
    counts = np.zeros((n, n))
    draws = np.asarray(draws)
    for position in range(n):
        counts[position] += np.bincount(draws[:, position], minlength=n)
    expected = draws.shape[0] / n
    return ((counts - expected) ** 2 / expected).sum()


def _permutation_chi2(draws, n):
    """Chi-square of the counts of all n! permutations (df = n! - 1)."""
    index = {p: k for k, p in enumerate(itertools.permutations(range(n)))}
    counts = np.zeros(len(index))
    for row in draws:
        counts[index[tuple(row)]] += 1
    assert (counts > 0).all(), "some permutation never appeared"
    expected = len(draws) / len(index)
    return ((counts - expected) ** 2 / expected).sum()


def _randperm_draws(n, count):
    torch.manual_seed(1234)
    return [replay.randperm(n).tolist() for _ in range(count)]


def _layout_draws(n, count, bits, capacity):
    return [replay._py_randperm(n, seed, bits, capacity).tolist() for seed in range(count)]


def _shuffle_draws(n, count, bits, capacity):
    # The values path of the bucketed shuffle: values in reverse order come out uniformly.
    values = np.arange(n)[::-1].copy()
    return [replay._py_shuffle(values, seed, bits, capacity).tolist() for seed in range(count)]


def _shuffle_rest_draws(n, count, first):
    g = torch.Generator().manual_seed(7)
    draws = []
    for _ in range(count):
        epoch = replay.PermutationEpoch(n, generator=g)
        head = epoch.next_batch(first).tolist()
        draws.append(head + epoch.shuffle_rest().tolist())
        assert epoch.remaining == 0 and epoch.shuffle_rest().numel() == 0
    return draws


def _epoch_draws(n, count, batch_sizes):
    g = torch.Generator().manual_seed(99)
    draws = []
    epoch = replay.PermutationEpoch(n, generator=g)
    for k in range(count):
        if k:
            epoch.reset(generator=g)
        parts = []
        for size in itertools.cycle(batch_sizes):
            if not epoch.remaining:
                break
            parts.extend(epoch.next_batch(size).tolist())
        draws.append(parts)
    return draws


@pytest.fixture
def sparse_everywhere(monkeypatch):
    # Keep small epochs in the sparse phase so its kernel is tested too.
    monkeypatch.setattr(replay, "_DENSE_BELOW", 0)
    monkeypatch.setattr(replay, "_SPARSE_FRACTION", 1)


@pytest.fixture
def sparse_then_dense(monkeypatch):
    monkeypatch.setattr(replay, "_DENSE_BELOW", 0)
    monkeypatch.setattr(replay, "_SPARSE_FRACTION", 2)


SOURCES = {
    "randperm": lambda n, c: _randperm_draws(n, c),
    "buckets": lambda n, c: _layout_draws(n, c, 2, 8),
    "bucket-overflow": lambda n, c: _layout_draws(n, c, 2, 0),
    "epoch-dense": lambda n, c: _epoch_draws(n, c, [3, 1, 2]),
    "shuffle-values-buckets": lambda n, c: _shuffle_draws(n, c, 2, 8),
    "shuffle-values-overflow": lambda n, c: _shuffle_draws(n, c, 2, 0),
    "shuffle-values-in-place": lambda n, c: _shuffle_draws(n, c, 0, 0),
    "epoch-shuffle-rest": lambda n, c: _shuffle_rest_draws(n, c, 1),
}


@pytest.mark.parametrize("source", list(SOURCES) + ["epoch-sparse", "epoch-switch"])
def test_positions_are_uniform(source, request):
    n, count = 8, 4000
    if source == "epoch-sparse":
        request.getfixturevalue("sparse_everywhere")
        draws = _epoch_draws(n, count, [3, 1, 2])
    elif source == "epoch-switch":
        request.getfixturevalue("sparse_then_dense")
        draws = _epoch_draws(n, count, [1, 2])
    else:
        draws = SOURCES[source](n, count)
    for row in draws:
        assert sorted(row) == list(range(n))
    assert _position_chi2(draws, n) < CHI2_999[49]


@pytest.mark.parametrize("source", list(SOURCES) + ["epoch-sparse", "epoch-switch"])
def test_all_permutations_equally_likely(source, request):
    n, count = 4, 4800
    if source == "epoch-sparse":
        request.getfixturevalue("sparse_everywhere")
        draws = _epoch_draws(n, count, [1])
    elif source == "epoch-switch":
        request.getfixturevalue("sparse_then_dense")
        draws = _epoch_draws(n, count, [1])
    elif source in ("buckets", "bucket-overflow"):
        draws = _layout_draws(n, count, 1, 4 if source == "buckets" else 0)
    elif source in ("shuffle-values-buckets", "shuffle-values-overflow"):
        draws = _shuffle_draws(n, count, 1, 4 if source == "shuffle-values-buckets" else 0)
    else:
        draws = SOURCES[source](n, count)
    assert _permutation_chi2(draws, n) < CHI2_999[23]


def test_uniform_first_batch_of_a_large_epoch():
    # The first elements of a sparse-phase epoch are uniform over the whole range.
    n, count, bins = 1 << 20, 2000, 16
    g = torch.Generator().manual_seed(5)
    firsts = np.array([replay.PermutationEpoch(n, generator=g).next_batch(4).tolist()
                       for _ in range(count)]).reshape(-1)
    counts = np.bincount(firsts * bins // n, minlength=bins)
    expected = firsts.size / bins
    assert ((counts - expected) ** 2 / expected).sum() < 37.7  # df = 15, 0.1%


# ---- PermutationEpoch ----------------------------------------------------------------------


def _drain(epoch, batch_sizes):
    parts = []
    for size in itertools.cycle(batch_sizes):
        before = epoch.remaining
        batch = epoch.next_batch(size)
        assert batch.dtype == torch.int64 and batch.shape == (min(size, before),)
        assert epoch.remaining == before - batch.shape[0]
        parts.append(batch)
        if not epoch.remaining:
            break
    return torch.cat(parts)


@pytest.mark.parametrize("n", list(range(0, 65)) + [5000, 70_001])
def test_epoch_batches_form_a_permutation(n):
    g = torch.Generator().manual_seed(n)
    epoch = replay.PermutationEpoch(n, generator=g)
    assert epoch.n == n and len(epoch) == n and epoch.remaining == n
    sizes = [1, 0, 7, 3] if n < 1000 else [256, 1, 4096, 0, 999]
    if n == 0:
        assert epoch.next_batch(5).shape == (0,)
        return
    perm = _drain(epoch, sizes)
    assert torch.equal(perm.sort().values, torch.arange(n))
    assert epoch.next_batch(10).shape == (0,)
    assert epoch.remaining == 0 and epoch.n == n


@pytest.mark.parametrize("n", [2 ** 20])
def test_epoch_large_phases(n):
    # Crosses the sparse -> dense switch with batch sizes that straddle it.
    epoch = replay.PermutationEpoch(n, generator=torch.Generator().manual_seed(0))
    perm = _drain(epoch, [256, 40_000, 1, 300_000])
    assert torch.equal(perm.sort().values, torch.arange(n))


def test_epoch_batch_larger_than_remaining():
    epoch = replay.PermutationEpoch(10, generator=torch.Generator().manual_seed(0))
    first = epoch.next_batch(4)
    rest = epoch.next_batch(100)
    assert first.shape == (4,) and rest.shape == (6,) and epoch.remaining == 0
    assert sorted(torch.cat([first, rest]).tolist()) == list(range(10))


def test_epoch_seeded_reproducibility_and_reset():
    torch.manual_seed(7)
    a = replay.PermutationEpoch(5000).next_batch(5000)
    torch.manual_seed(7)
    epoch = replay.PermutationEpoch(5000)
    assert torch.equal(epoch.next_batch(100), a[:100])
    assert torch.equal(epoch.next_batch(4900), a[100:])
    epoch.reset(generator=torch.Generator().manual_seed(8))
    b = epoch.next_batch(5000)
    assert epoch.remaining == 0 and not torch.equal(a, b)
    assert torch.equal(b.sort().values, torch.arange(5000))


@pytest.mark.parametrize("bad, exc, match", [
    (-1, ValueError, "batch_size=-1"),
    (1.5, TypeError, "got float"),
    (True, TypeError, "got bool"),
    (None, TypeError, "got NoneType"),
])
def test_epoch_bad_batch_size(bad, exc, match):
    epoch = replay.PermutationEpoch(10, generator=torch.Generator().manual_seed(0))
    epoch.next_batch(3)
    with pytest.raises(exc, match=match):
        epoch.next_batch(bad)
    assert epoch.remaining == 7  # untouched


@pytest.mark.parametrize("bad, exc, match", [
    (-3, RuntimeError, "n=-3"), (2.0, TypeError, "not float"), (False, TypeError, "not bool"),
])
def test_epoch_bad_n(bad, exc, match):
    with pytest.raises(exc, match=match):
        replay.PermutationEpoch(bad)


@pytest.mark.parametrize("n, done", [(10, 3), (10, 0), (10, 10), (200_000, 1000),
                                     (200_000, 50_000), (0, 0)])
def test_epoch_pickle_continues_the_same_epoch(n, done):
    epoch = replay.PermutationEpoch(n, generator=torch.Generator().manual_seed(1))
    head = epoch.next_batch(done)
    restored = pickle.loads(pickle.dumps(epoch))
    assert restored.n == n and restored.remaining == n - done
    tail = epoch.next_batch(n)
    assert torch.equal(restored.next_batch(n), tail)
    assert torch.equal(torch.cat([head, tail]).sort().values, torch.arange(n))


def test_epoch_unpickling_does_not_touch_torch_rng():
    epoch = replay.PermutationEpoch(100, generator=torch.Generator().manual_seed(1))
    blob = pickle.dumps(epoch)
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    pickle.loads(blob)
    assert torch.equal(torch.rand(2), expected)


@pytest.mark.parametrize("n, edit, match", [
    (10, lambda s: s.update({"class": "Other"}), "not a PermutationEpoch state"),
    (10, lambda s: s.update({"consumed": 11}), "consumed=11 exceeds n=10"),
    (10, lambda s: s.update({"prng": [0, 0, 0, 0]}), "not all zero"),
    (10, lambda s: s.update({"values": s["values"].astype(np.float64)}), "dtype float64"),
    (10, lambda s: s.update({"values": s["values"] + 100}), r"values must lie in \[0, 10\)"),
    (10, lambda s: s.update({"values": s["values"][1:]}), r"values has shape \(6,\), expected \(7,\)"),
    (5000, lambda s: s.update({"keys": s["keys"][:0]}), "keys must be int64 with the shape"),
    (5000, lambda s: s.update({"keys": s["keys"] * 0}), r"keys must lie in \[3, 5000\)"),
])
def test_epoch_setstate_validates(n, edit, match):
    epoch = replay.PermutationEpoch(n, generator=torch.Generator().manual_seed(1))
    epoch.next_batch(3)
    state = epoch.__getstate__()
    assert state["dense"] == (n == 10)  # small epochs go dense at once
    edit(state)
    fresh = replay._rebuild_permutation_epoch()
    with pytest.raises(ValueError, match=match):
        fresh.__setstate__(state)


def test_epoch_threads_share_one_epoch():
    n = 300_000
    epoch = replay.PermutationEpoch(n, generator=torch.Generator().manual_seed(2))
    results = [[] for _ in range(4)]

    def work(k):
        while True:
            batch = epoch.next_batch(97 + k)
            if batch.numel() == 0:
                return
            results[k].append(batch)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    perm = torch.cat([b for r in results for b in r])
    assert torch.equal(perm.sort().values, torch.arange(n))


def test_densify_keeps_the_permutation():
    a = replay.PermutationEpoch(100_000, generator=torch.Generator().manual_seed(5))
    b = replay.PermutationEpoch(100_000, generator=torch.Generator().manual_seed(5))
    first_a, first_b = a.next_batch(100), b.next_batch(100)
    assert torch.equal(first_a, first_b) and not a.is_dense
    a.densify()
    a.densify()  # idempotent
    assert a.is_dense and a.remaining == 99_900
    # the same draws give the same permutation, sparse or dense
    middle = a.next_batch(3000)
    assert torch.equal(middle, b.next_batch(3000)) and not b.is_dense
    rest = a.next_batch(100_000)
    assert a.remaining == 0
    assert sorted(torch.cat([first_a, middle, rest]).tolist()) == list(range(100_000))


def test_shuffle_rest_of_a_large_epoch_covers_each_element_once():
    n = 1 << 16  # large enough for the bucketed path
    g = torch.Generator().manual_seed(3)
    for first in (0, 1, 300, n // 2):
        epoch = replay.PermutationEpoch(n, generator=g)
        parts = [epoch.next_batch(first)] if first else []
        if first == n // 2:
            epoch.densify()
        parts.append(epoch.shuffle_rest())
        everything = torch.cat(parts)
        assert everything.dtype == torch.int64 and torch.equal(everything.sort().values, torch.arange(n))
        assert epoch.remaining == 0


def test_shuffle_rest_is_seeded():
    def run():
        epoch = replay.PermutationEpoch(5000, generator=torch.Generator().manual_seed(11))
        return torch.cat([epoch.next_batch(10), epoch.shuffle_rest()])

    assert torch.equal(run(), run())


def test_bucketed_shuffle_rejects_values_outside_int32():
    with pytest.raises(ValueError, match="rejected values"):
        replay._py_shuffle(np.array([1, -1, 3]), 0, 1, 4)
    with pytest.raises(ValueError, match="rejected values"):
        replay._py_shuffle(np.array([1, 2**31, 3]), 0, 1, 4)
    # the in-place path takes any int64
    out = replay._py_shuffle(np.array([-5, 2**40, 3]), 0, 0, 0)
    assert sorted(out.tolist()) == [-5, 3, 2**40]
