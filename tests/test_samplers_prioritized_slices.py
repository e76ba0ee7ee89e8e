"""PrioritizedSliceSampler against the installed torchrl's (0.11 or 0.14), draw for draw.

torchrl's side always runs on ``replay``'s trees: where torchrl's compiled trees do not load
(make test's torch 2.13) installed with :func:`torchrl_compat.install_segment_trees` as a user
there must, and where they load (torch 2.9 / 2.15, make test-matrix) put in their place for
this module (``replace=True``) and given back after, so that the file runs the same
comparisons alone and after other tests, whichever trees those left in torchrl's modules
(torchrl's own trees refuse the other float type in nearly every example; they are compared
with ``replay``'s in ``test_native_tree_differential.py``). torchrl
writes zeros at the leaves that cannot start a slice, draws, and writes them back; ours reads
that zeroed tree without writing it. Both must give the same indices, weights and info
entries, bit for bit, from the same seeds (``np.random.seed`` / ``torch.manual_seed``, or a
sampler / buffer generator), on random storages: trajectories of random lengths (some shorter
than a slice), ``end_key`` or ``traj_key``, ``span``, ``strict_length``, ``truncated_key``,
``cache_values``, fp32 / fp64 trees, writes that wrap around at capacity, 2-d storages, and
priorities over many orders of magnitude, zeros included.
"""
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

import replay

import torchrl_compat
import torchrl_compat_trees

torchrl_compat.install_segment_trees()

import torchrl.data.replay_buffers as trl  # noqa: E402
from torchrl.data.replay_buffers import LazyTensorStorage  # noqa: E402

import torchrl_compat.replay_buffers as our_buffers  # noqa: E402
import torchrl_compat.samplers as ours  # noqa: E402
import torchrl_compat.storages as our_storages  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def torchrl_on_replays_trees():
    """torchrl's samplers build ``replay``'s trees for this module, also where torchrl's own
    load and stand in its modules (given back after)."""
    own = torchrl_compat_trees.own_trees()
    if own is not None:
        assert torchrl_compat.install_segment_trees(replace=True)
    assert trl.samplers.SumSegmentTreeFp32 is replay.SumSegmentTreeFp32
    yield
    if own is not None:
        torchrl_compat_trees.restore_own_trees(own)


# --------------------------------------------------------------------------- storages


def _trajectory_rows(rng, rows, max_len, first_id):
    """Episode ids of ``rows`` steps, trajectories of 1 to ``max_len`` steps."""
    ids, current = [], first_id
    while len(ids) < rows:
        ids += [current] * int(rng.integers(1, max_len + 1))
        current += 1
    return torch.tensor(ids[:rows])


def _make_storage(rng, ndim, capacity, max_len, wrap, terminated, storage_cls=LazyTensorStorage):
    """A ``LazyTensorStorage`` written in chunks; with ``wrap`` the writes run past its
    capacity (the cursor wraps around and the last trajectory is cut). 2-d storages hold
    ``columns`` trajectories side by side (their ids never shared between columns)."""
    columns = 1 if ndim == 1 else int(rng.integers(2, 4))
    rows = capacity // columns
    total = rows + int(rng.integers(1, rows)) if wrap else int(rng.integers(max(2, rows // 2), rows + 1))
    episode = torch.stack(
        [_trajectory_rows(rng, total, max_len, 1000 * c) for c in range(columns)], -1
    )
    done = torch.ones_like(episode, dtype=torch.bool)
    done[:-1] = episode[1:] != episode[:-1]
    done[-1] = bool(rng.integers(2))  # the last trajectory may still be running
    fields = {"episode": episode, "step": torch.arange(total).unsqueeze(-1).expand_as(episode).clone(),
              ("next", "done"): done.unsqueeze(-1)}
    if terminated:
        fields[("next", "terminated")] = (done & torch.as_tensor(rng.random(done.shape) < 0.5)).unsqueeze(-1)
    data = TensorDict(fields, [total, columns])
    if ndim == 1:
        data = data[:, 0]
    storage = storage_cls(rows * columns, ndim=ndim)
    written = 0
    while written < total:
        size = min(int(rng.integers(1, rows + 1)), total - written)
        storage.set(torch.arange(written, written + size) % rows, data[written:written + size])
        written += size
    return storage


def _priorities(rng, n, with_zeros):
    """Priorities over 12 orders of magnitude, some zero when ``with_zeros``."""
    p = rng.random(n) * 10.0 ** rng.integers(-6, 7, n)
    if with_zeros:
        p[rng.random(n) < 0.2] = 0.0
    return torch.as_tensor(p)


# --------------------------------------------------------------------------- comparison


def _run(module, make, storage, priority, batch_size, calls, seed, seeding):
    """``calls`` samples (or the exception a call raised) of a fresh sampler of ``module``,
    and the prioritized draws (slice starts and their weights) each call made."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = make(module)
    n = storage.shape.numel()
    sampler.update_priority(torch.arange(n), priority)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if seeding == "generator":
        sampler._rng = torch.Generator().manual_seed(seed)
    draws = []
    # torchrl calls PrioritizedSampler.sample on the class; ours its own _prioritized_sample
    owner, name = (
        (trl.samplers.PrioritizedSampler, "sample") if module is trl.samplers else (sampler, "_prioritized_sample")
    )
    original = getattr(owner, name)

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        draws.append((result[0], dict(result[1])))  # the callers rewrite the info dict
        return result

    setattr(owner, name, spy)
    out = []
    try:
        for _ in range(calls):
            try:
                out.append(sampler.sample(storage, batch_size))
            except Exception as err:  # noqa: BLE001 (compared with torchrl's)
                out.append(err)
                break
    finally:
        if owner is sampler:
            del sampler._prioritized_sample
        else:
            setattr(owner, name, original)
    # what remains of the RNG streams: both sides must have taken the same numbers
    rest = (np.random.random(), torch.rand(()), None if sampler._rng is None else torch.rand((), generator=sampler._rng))
    return out, draws, rest, sampler


def _starts(index):
    return torch.stack(index, -1) if isinstance(index, tuple) else index.unsqueeze(-1)


def _slices_within_trajectories(sampler, storage, starts, weight, seq_length, next_stop_of_any=False):
    """The output of a prioritized slice draw from ``starts`` (``[N, ndim]``) and their
    ``weight``, each slice cut at the end of its own trajectory (the plain definition), or,
    with ``next_stop_of_any``, at the first stop at or after its start of any trajectory of
    its column, a stop before its trajectory's start counted one storage length later
    (torchrl's rule). Also returns, for each slice, whether its start lies in the part of a
    trajectory that wraps around the storage's end (after the wrap)."""
    start_idx, stop_idx, _ = sampler._get_stop_and_length(storage)
    rows = storage.shape[0]
    lengths, wrapped = [], []
    for start in starts.tolist():
        same = (start_idx[:, 1:] == torch.tensor(start[1:])).all(-1) if starts.shape[1] > 1 else torch.ones(start_idx.shape[0], dtype=torch.bool)
        r = start[0]
        bounds = list(zip(start_idx[same, 0].tolist(), stop_idx[same, 0].tolist()))
        own = [(b, e) for b, e in bounds if (b <= e and b <= r <= e) or (b > e and (r >= b or r <= e))]
        assert len(own) == 1, (start, bounds)
        b, e = own[0]
        wrapped.append(b > e and r <= e)
        if next_stop_of_any:
            stop = min(s + rows if s < s_b else s for s_b, s in bounds if (s + rows if s < s_b else s) >= r)
            length = stop - r + 1
        else:
            length = (e - r) % rows + 1
        lengths.append(min(seq_length, length))
    lengths = torch.tensor(lengths)
    steps = torch.cat([torch.arange(k) for k in lengths.tolist()])
    first = torch.repeat_interleave(starts, lengths, 0)
    index = first.clone()
    index[:, 0] = (first[:, 0] + steps) % rows
    index = index.unbind(-1)
    info = {"priority_weight": torch.repeat_interleave(weight, lengths)}
    if sampler.truncated_key is not None:
        truncated = torch.zeros((index[0].shape[0], 1), dtype=torch.bool)
        truncated[lengths.cumsum(0) - 1] = True
        data = storage[index]
        info[sampler.truncated_key] = truncated
        info[("next", "done")] = data["next", "done"] | truncated
        terminated = data.get(("next", "terminated"), None)
        info[("next", "terminated")] = torch.zeros_like(truncated) if terminated is None else terminated
    return (index, info), lengths, torch.tensor(wrapped)


def _assert_wrapped_start_divergence(sampler, storage, draw, expected, got, seq_length):
    """The one divergence from torchrl documented in PrioritizedSliceSampler's note: a slice
    drawn (``span[1]`` or ``strict_length=False``, a storage that wrapped around) from a start
    in the part of a trajectory after the storage's end is cut by torchrl at the next stop of
    any trajectory (running into the trajectories that follow), by ours at its own
    trajectory's end. torchrl must give exactly its rule, ours the plain definition, and the
    two differ only at such starts."""
    assert not isinstance(expected, Exception) and not isinstance(got, Exception), (expected, got)
    assert storage._is_full and (sampler.span[1] or not sampler.strict_length)
    starts, weight = _starts(draw[0]), draw[1]["priority_weight"]
    plain, plain_lengths, wrapped = _slices_within_trajectories(sampler, storage, starts, weight, seq_length)
    theirs, their_lengths, _ = _slices_within_trajectories(sampler, storage, starts, weight, seq_length, True)
    _assert_same(plain, got)
    _assert_same(theirs, expected)
    differ = plain_lengths != their_lengths
    assert differ.any() and wrapped[differ].all(), (plain_lengths, their_lengths, wrapped)
    # torchrl's slices there run past their trajectory's end
    assert (their_lengths[differ] > plain_lengths[differ]).all()


def _assert_same(expected, got):
    if isinstance(expected, Exception):
        assert isinstance(got, type(expected)), (expected, got)
        # ours names the values after torchrl's message
        assert str(got).startswith(str(expected).split(":")[0]), (expected, got)
        return
    assert not isinstance(got, Exception), (expected, got)
    (index_e, info_e), (index_g, info_g) = expected, got
    assert isinstance(index_g, tuple) and len(index_g) == len(index_e)
    for e, g in zip(index_e, index_g):
        assert e.dtype == g.dtype and torch.equal(e, g), (e, g)
    assert set(info_e) == set(info_g)
    for key in info_e:
        e, g = info_e[key], info_g[key]
        assert e.dtype == g.dtype and e.shape == g.shape and torch.equal(e, g), (key, e, g)


def _compare(make, storage, priority, batch_size, calls, seed, seeding, own_storage=None):
    """torchrl's sampler on ``storage`` against ours (on ``own_storage``, which holds the same
    data, when given)."""
    got, got_draws, got_rest, sampler = _run(
        ours, make, storage if own_storage is None else own_storage, priority, batch_size, calls, seed, seeding
    )
    ref, ref_draws, ref_rest, ref_sampler = _run(trl.samplers, make, storage, priority, batch_size, calls, seed, seeding)
    assert len(ref) == len(got) and len(ref_draws) == len(got_draws)
    # the prioritized draws: the same starts and weights, to the bit
    for (index_e, info_e), (index_g, info_g) in zip(ref_draws, got_draws):
        assert torch.equal(_starts(index_e), _starts(index_g))
        weight_e, weight_g = info_e["priority_weight"], info_g["priority_weight"]
        assert weight_e.dtype == weight_g.dtype and torch.equal(weight_e, weight_g)
    for k, (expected, mine) in enumerate(zip(ref, got)):
        try:
            _assert_same(expected, mine)
        except AssertionError:
            # Only the divergence PrioritizedSliceSampler's note documents (torchrl's slices
            # from a start in the wrapped part of a trajectory run into the next ones).
            seq_length = sampler._adjusted_batch_size(batch_size)[0]
            _assert_wrapped_start_divergence(ref_sampler, storage, ref_draws[k], expected, mine, seq_length)
    assert ref_rest[0] == got_rest[0] and torch.equal(ref_rest[1], got_rest[1])
    if ref_rest[2] is not None:
        assert torch.equal(ref_rest[2], got_rest[2])
    # ours never wrote its leaves (torchrl writes them back, unless a draw failed)
    n = storage.shape.numel()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = make(trl.samplers)
    fresh.update_priority(torch.arange(n), priority)
    np.testing.assert_array_equal(np.asarray(fresh._sum_tree[np.arange(n)]), np.asarray(sampler._sum_tree[np.arange(n)]))
    return ref, got


SPANS = st.sampled_from(["off", "true", "int"])


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    ndim=st.sampled_from([1, 2]),
    wrap=st.booleans(),
    use_traj_key=st.booleans(),
    slice_len=st.integers(2, 6),
    by_num_slices=st.booleans(),
    span=SPANS,
    strict_length=st.booleans(),
    truncated=st.booleans(),
    cache_values=st.booleans(),
    double=st.booleans(),
    with_zeros=st.booleans(),
    seeding=st.sampled_from(["numpy", "generator"]),
    own_storage=st.booleans(),
)
def test_prioritized_slice_sampler_matches_torchrl(
    seed, ndim, wrap, use_traj_key, slice_len, by_num_slices, span, strict_length, truncated,
    cache_values, double, with_zeros, seeding, own_storage,
):
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(8, 120))
    terminated = truncated and bool(rng.integers(2))
    storage_seed = int(rng.integers(2**31))
    storage = _make_storage(np.random.default_rng(storage_seed), ndim, capacity, 3 * slice_len, wrap, terminated)
    # ours on torchrl_compat's storage (bounds followed from its writes) or on torchrl's
    mine = None
    if own_storage:
        mine = _make_storage(
            np.random.default_rng(storage_seed), ndim, capacity, 3 * slice_len, wrap, terminated,
            our_storages.LazyTensorStorage,
        )
    n = storage.shape.numel()
    slices = int(rng.integers(1, 9))
    batch_size = slices * slice_len
    # A right span of span_right lets a slice start up to span_right + 1 steps before its
    # trajectory's end; from slice_len - 1 on torchrl excludes nonsense (see the note).
    span_value = {"off": False, "true": True, "int": int(rng.integers(0, slice_len - 1))}[span]
    kwargs = dict(
        num_slices=slices if by_num_slices else None,
        slice_len=None if by_num_slices else slice_len,
        strict_length=strict_length,
        span=span_value,
        cache_values=cache_values,
        dtype=torch.double if double else torch.float,
        eps=float(rng.choice([1e-8, 1e-3, 0.0])),  # 0: zero priorities stay zero
    )
    if not truncated:
        kwargs["truncated_key"] = None
    if use_traj_key:
        kwargs["traj_key"] = "episode"
    else:
        kwargs["end_key"] = ("next", "done")
    alpha, beta = float(rng.uniform(0.3, 1.2)), float(rng.uniform(0.1, 1.0))

    def make(module):
        return module.PrioritizedSliceSampler(n, alpha, beta, **kwargs)

    priority = _priorities(rng, n, with_zeros)
    _compare(make, storage, priority, batch_size, 3, seed, seeding, mine)


@pytest.mark.parametrize("seeding", ["numpy", "generator"])
@pytest.mark.parametrize("double", [False, True])
def test_excluded_leaves_change_the_draws(seeding, double):
    """Priorities over 16 orders of magnitude, the largest at the excluded leaves: the
    zeroed tree's fp32 sums then differ from the masked sums of the full tree, and the
    draws land where torchrl's do (summing only the allowed leaves did not)."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(2, 40, 300)
    episode = torch.repeat_interleave(torch.arange(len(lengths)), torch.as_tensor(lengths))
    n = episode.shape[0]
    storage = LazyTensorStorage(n)
    done = torch.ones(n, dtype=torch.bool)
    done[:-1] = episode[1:] != episode[:-1]
    storage.set(torch.arange(n), TensorDict({"episode": episode, ("next", "done"): done.unsqueeze(-1)}, [n]))
    priority = torch.as_tensor(rng.random(n) * 10.0 ** rng.integers(-8, 8, n))
    priority[done] *= 1e6

    def make(module):
        return module.PrioritizedSliceSampler(
            n, 1.0, 0.5, slice_len=4, traj_key="episode", strict_length=False,
            dtype=torch.double if double else torch.float,
        )

    for seed in range(4):
        _compare(make, storage, priority, 4 * 1000, 2, seed, seeding)


@pytest.mark.parametrize("seeding", ["numpy", "generator"])
def test_buffer_sample_matches_torchrl(seeding):
    """Through the buffers (``generator=`` or the global RNGs), with the info entries."""
    rng = np.random.default_rng(5)
    storages = [_make_storage(np.random.default_rng(5), 1, 64, 9, True, True) for _ in range(2)]
    n = storages[0].shape.numel()
    priority = _priorities(rng, n, True)
    out = {}
    for module, storage in ((our_buffers, storages[1]), (trl, storages[0])):  # torchrl's last
        sampler = (trl.samplers if module is trl else ours).PrioritizedSliceSampler(
            n, 0.7, 0.4, slice_len=3, end_key=("next", "done"), strict_length=False
        )
        generator = torch.Generator().manual_seed(11) if seeding == "generator" else None
        buffer = module.TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=12, generator=generator)
        sampler.update_priority(torch.arange(n), priority)
        np.random.seed(11)
        torch.manual_seed(11)
        out[module] = [buffer.sample(return_info=True) for _ in range(3)]
    for (data_e, info_e), (data_g, info_g) in zip(out[trl], out[our_buffers]):
        assert torch.equal(data_e["step"], data_g["step"]) and torch.equal(data_e["index"], data_g["index"])
        assert set(info_e) == set(info_g)
        for key in info_e:
            e, g = info_e[key], info_g[key]
            if isinstance(e, tuple):
                assert isinstance(g, tuple) and len(e) == len(g), key
                assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(e, g)), key
            else:
                assert e.dtype == g.dtype and torch.equal(e, g), key


def test_refused_draw_takes_no_random_number():
    """Every start excluded: torchrl raises "non-positive p_sum" before drawing, and so
    does ours; the RNG streams are where they were."""
    storage = LazyTensorStorage(6)
    episode = torch.tensor([0, 0, 1, 1, 2, 2])
    storage.set(torch.arange(6), TensorDict({"episode": episode}, [6]))
    for module in (trl.samplers, ours):
        sampler = module.PrioritizedSliceSampler(6, 1.0, 1.0, slice_len=3, traj_key="episode")
        sampler.update_priority(torch.arange(6), torch.ones(6))
        np.random.seed(0)
        torch.manual_seed(0)
        with pytest.raises(RuntimeError, match="non-positive p_sum"):
            sampler.sample(storage, 6)
        np.random.seed(0)
        expected = np.random.random()
        np.random.seed(0)
        with pytest.raises(RuntimeError, match="non-positive p_sum"):
            sampler.sample(storage, 6)
        assert np.random.random() == expected


@pytest.mark.parametrize("seeding", ["numpy", "generator"])
@pytest.mark.parametrize("given", ["ends", "trajectories"])
def test_given_ends_or_trajectories_match_torchrl(seeding, given):
    """``ends=`` / ``trajectories=`` with ``cache_values=True``: the excluded starts come from
    the given signal and are cached, the draws stay torchrl's over several calls."""
    rng = np.random.default_rng(9)
    storage = _make_storage(rng, 1, 90, 8, False, False)
    n = storage.shape.numel()
    data = storage[:]
    signal = {"ends": data["next", "done"].squeeze(-1), "trajectories": data["episode"]}[given]
    priority = _priorities(rng, n, True)

    def make(module):
        return module.PrioritizedSliceSampler(
            n, 0.9, 0.7, slice_len=3, cache_values=True, strict_length=False, **{given: signal}
        )

    for seed in range(3):
        _compare(make, storage, priority, 24, 4, seed, seeding)


@pytest.mark.parametrize("seeding", ["numpy", "generator"])
def test_cached_excluded_starts_follow_the_slice_length(seeding):
    """``cache_values=True`` with ``num_slices`` and changing batch sizes: torchrl keeps the
    starts excluded for the first call's slice length (see the note); ours lists them again
    for each length, and draws what torchrl draws without the cache."""
    rng = np.random.default_rng(2)
    storage = _make_storage(rng, 1, 80, 8, False, False)
    n = storage.shape.numel()
    priority = _priorities(rng, n, False)
    outputs = {}
    for module, cache_values in ((ours, True), (trl.samplers, False)):  # torchrl's last
        sampler = module.PrioritizedSliceSampler(n, 0.8, 0.5, num_slices=4, traj_key="episode", cache_values=cache_values)
        sampler.update_priority(torch.arange(n), priority)
        np.random.seed(0)
        torch.manual_seed(0)
        if seeding == "generator":
            sampler._rng = torch.Generator().manual_seed(0)
        outputs[module] = [sampler.sample(storage, batch_size) for batch_size in (8, 20, 20, 8, 12)]
    for expected, got in zip(outputs[trl.samplers], outputs[ours]):
        _assert_same(expected, got)


@pytest.mark.parametrize("column", [False, True], ids=["lengths", "column"])
def test_padded_indices_match_torchrl(column):
    """The left-padded table of ``_padded_indices``, for lengths given flat or as the column
    torchrl's ``_preceding_stop_idx`` passes (zero lengths and a longer ``arange`` included)."""
    rng = np.random.default_rng(4)
    ref = trl.samplers.PrioritizedSliceSampler(10, 1.0, 1.0, slice_len=2)
    mine = ours.PrioritizedSliceSampler(10, 1.0, 1.0, slice_len=2)
    for _ in range(30):
        lengths = torch.as_tensor(rng.integers(0, 7, int(rng.integers(1, 6))))
        lengths[0] += 1
        shapes = lengths.view(-1, 1) if column else lengths
        arange = torch.arange(int(lengths.sum()) + int(rng.integers(0, 3)))
        expected, got = ref._padded_indices(shapes, arange), mine._padded_indices(shapes, arange)
        assert expected.dtype == got.dtype and torch.equal(expected, got)
