"""Trajectory starts / stops and slice indices, against the installed torchrl's SliceSampler code."""
from functools import partial

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchrl.data.replay_buffers.samplers import SliceSampler

import replay
from torchrl_compat._torch_ops import slices as TORCH_OPS
from torchrl_compat._releases import since
from torchrl_compat.utils import _trajectory_bounds

SAMPLER = SliceSampler(num_slices=1)
# The kernels follow torchrl 0.11; from 0.14 on, torchrl_compat.utils adds that release's
# input checks and its one-step trajectory fix around them.
NEWER = since("find_start_stop_traj_public")
IMPLEMENTATIONS = {
    "replay": partial(_trajectory_bounds, on_cpu=True) if NEWER else replay.find_start_stop_traj,
    "torch-ops": partial(_trajectory_bounds, on_cpu=False) if NEWER else TORCH_OPS.find_start_stop_traj,
}
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _outcome(fn, **kwargs):
    try:
        return "ok", fn(**kwargs)
    except Exception as err:  # the reference's exception is part of the expected result
        return "error", err


def _assert_same(expected, actual):
    assert len(actual) == 3
    for want, got in zip(expected, actual):
        assert isinstance(got, torch.Tensor)
        assert got.dtype == want.dtype == torch.int64
        assert got.shape == want.shape
        assert torch.equal(got, want), (want, got)


def _check_all(**kwargs):
    """Every implementation gives torchrl's result, or an exception of its type and text."""
    kind, expected = _outcome(SAMPLER._find_start_stop_traj, **kwargs)
    for name, fn in IMPLEMENTATIONS.items():
        if kind == "ok":
            _assert_same(expected, fn(**kwargs))
        else:
            with pytest.raises(type(expected)) as info:
                fn(**kwargs)
            assert str(info.value) == str(expected), name
    return kind, expected


@st.composite
def _shapes(draw, max_length=12):
    length = draw(st.integers(1, max_length))
    batch = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
    return (length, *batch)


@st.composite
def _cursors(draw, length):
    kind = draw(st.sampled_from(["none", "int", "negative", "tensor", "range", "numpy"]))
    if kind == "none":
        return None
    last = draw(st.integers(0, length - 1))
    if kind == "int":
        return last
    if kind == "negative":
        return last - length
    if kind == "tensor":
        return torch.tensor(draw(st.lists(st.integers(0, length - 1), max_size=3)) + [last])
    if kind == "range":
        first = draw(st.integers(0, last))
        return range(first, last + 1)
    return np.int64(last)


@st.composite
def _end_cases(draw):
    shape = draw(_shapes())
    density = draw(st.sampled_from([0.0, 0.05, 0.3, 0.7, 1.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    end = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < density
    at_capacity = draw(st.booleans())
    return dict(end=end, at_capacity=at_capacity, cursor=draw(_cursors(shape[0])))


@st.composite
def _trajectory_cases(draw):
    shape = draw(_shapes())
    density = draw(st.sampled_from([0.0, 0.1, 0.4, 1.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    changes = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < density
    trajectory = changes.long().cumsum(0) % draw(st.integers(1, 4))
    if draw(st.booleans()):
        # A trajectory running from the end of the buffer into its start: same id there.
        trajectory[-1] = trajectory[0]
    at_capacity = draw(st.booleans())
    return dict(trajectory=trajectory, at_capacity=at_capacity, cursor=draw(_cursors(shape[0])))


@SETTINGS
@given(_end_cases())
def test_end_signal_matches_torchrl(case):
    kind, expected = _check_all(**case)
    assert kind == "ok", expected
    start, stop, lengths = expected
    assert start.shape == stop.shape == (lengths.shape[0], case["end"].ndim)


@SETTINGS
@given(_trajectory_cases())
def test_trajectory_ids_match_torchrl(case):
    kind, expected = _check_all(**case)
    assert kind == "ok", expected


@pytest.mark.parametrize("shape", [(1,), (7,), (1, 3), (5, 3), (4, 2, 3), (3, 2, 1, 2)])
@pytest.mark.parametrize("at_capacity", [True, False])
def test_no_end_at_all(shape, at_capacity):
    end = torch.zeros(shape, dtype=torch.bool)
    _, (start, stop, lengths) = _check_all(end=end, at_capacity=at_capacity)
    groups = int(np.prod(shape[1:]))
    # One trajectory per column, spanning the whole buffer.
    assert lengths.tolist() == [shape[0]] * groups
    assert (stop[:, 0] == shape[0] - 1).all() and (start[:, 0] == 0).all()
    _check_all(trajectory=torch.zeros(shape, dtype=torch.long), at_capacity=at_capacity)


def test_wrap_around_1d():
    end = torch.tensor([False, True, False, False, True, False, False])
    start, stop, lengths = replay.find_start_stop_traj(end=end, at_capacity=True)
    # The last trajectory runs from step 5 through the end of the buffer into steps 0-1.
    assert start.flatten().tolist() == [5, 2]
    assert stop.flatten().tolist() == [1, 4]
    assert lengths.tolist() == [4, 3]
    _check_all(end=end, at_capacity=True)
    _check_all(end=end, at_capacity=True, cursor=3)
    _check_all(end=end, at_capacity=False)


@pytest.mark.parametrize("shape", [(4096,), (1024, 3), (300, 2, 5), (64, 3, 2, 4)])
@pytest.mark.parametrize("density", [0.0005, 0.01, 0.5])
def test_large_signals_match_torchrl(shape, density):
    # Long enough for the kernels' 32-byte zero-skipping and multi-block counting.
    gen = torch.Generator().manual_seed(int(density * 1e4) + len(shape))
    end = torch.rand(shape, generator=gen) < density
    _check_all(end=end, at_capacity=True, cursor=shape[0] // 3)
    _check_all(end=end, at_capacity=True)
    _check_all(end=end, at_capacity=False)
    trajectory = end.long().cumsum(0)
    _check_all(trajectory=trajectory, at_capacity=True, cursor=range(0, shape[0] - 5))
    _check_all(trajectory=trajectory, at_capacity=False)


@pytest.mark.parametrize(
    "shape, at_capacity, from_ids",
    [((0,), True, False), ((0,), True, True), ((0,), False, True), ((0, 3), True, False),
     ((3, 0), True, False), ((3, 0), False, False), ((2, 0, 4), False, True),
     ((1,), False, True), ((1, 3), False, True), ((1,), True, True), ((1,), False, False)],
)
def test_empty_and_single_step(shape, at_capacity, from_ids):
    signal = torch.zeros(shape, dtype=torch.long if from_ids else torch.bool)
    key = "trajectory" if from_ids else "end"
    kind, expected = _check_all(**{key: signal, "at_capacity": at_capacity})
    if NEWER and shape[0] == 0:
        assert kind == "error"  # "Cannot recover trajectory boundaries from an empty (T=0) input."
        return
    assert kind == "ok"
    if from_ids and shape[0] == 1 and not at_capacity and NEWER:
        assert expected[2].tolist() == [1] * int(np.prod(shape[1:]))
    elif from_ids and shape[0] == 1 and not at_capacity:
        # torchrl's quirk, kept: one-step ids in a storage that is not full give nothing.
        assert expected[2].numel() == 0


def test_empty_end_not_at_capacity_raises():
    kind, _ = _check_all(end=torch.zeros(0, dtype=torch.bool), at_capacity=False)
    assert kind == "error"
    error, message = (RuntimeError, "empty") if NEWER else (IndexError, "index -1 is out of bounds for dimension 0 with size 0")
    for fn in IMPLEMENTATIONS.values():
        with pytest.raises(error, match=message):
            fn(end=torch.zeros(0, dtype=torch.bool), at_capacity=False)


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
@pytest.mark.parametrize("key", ["end", "trajectory"])
def test_zero_dim_signal(name, key):
    fn = IMPLEMENTATIONS[name]
    for error in (RuntimeError,) if NEWER else (RuntimeError, IndexError):
        with pytest.raises(error, match="at least 1-dimensional"):
            fn(**{key: torch.tensor(1), "at_capacity": True})
    # torchrl 0.11 reaches an IndexError before its own RuntimeError: ours is both there.
    with pytest.raises(RuntimeError if NEWER else IndexError):
        SAMPLER._find_start_stop_traj(**{key: torch.tensor(1), "at_capacity": True})


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
@pytest.mark.parametrize(
    "cursor", [3.0, "a", np.array([3]), torch.tensor([3.0]), [1, 2], object()],
)
def test_bad_cursor(name, cursor):
    end = torch.tensor([False, False, True, False, False])
    with pytest.raises(RuntimeError, match="cursor should be an integer or a 1d tensor or a range."):
        IMPLEMENTATIONS[name](end=end, at_capacity=True, cursor=cursor)
    with pytest.raises(RuntimeError, match="cursor should be an integer"):
        SAMPLER._find_start_stop_traj(end=end, at_capacity=True, cursor=cursor)
    # torchrl ignores the cursor of a storage that is not full.
    _check_all(end=end, at_capacity=False, cursor=cursor)


@pytest.mark.parametrize(
    "cursor, error, message",
    [(5, IndexError, "index 5 is out of bounds for dimension 0 with size 5"),
     (-6, IndexError, "index -6 is out of bounds for dimension 0 with size 5"),
     (range(0), IndexError, "range object index out of range"),
     (torch.tensor([], dtype=torch.long), IndexError, "index -1 is out of bounds"),
     (torch.tensor(3), IndexError, "index -1 is out of bounds"),
     (torch.tensor([[1, 3]]), RuntimeError, "a Tensor with 2 elements cannot be converted")],
)
def test_cursor_errors_match_torchrl(cursor, error, message):
    end = torch.tensor([False, False, True, False, False])
    kind, expected = _check_all(end=end, at_capacity=True, cursor=cursor)
    if NEWER:
        assert kind == "error" or isinstance(cursor, torch.Tensor)  # 0.14 reads a tensor's last item
        return  # _check_all compared the type and text with torchrl's
    assert kind == "error" and isinstance(expected, error)
    for fn in IMPLEMENTATIONS.values():
        with pytest.raises(error, match=message):
            fn(end=end, at_capacity=True, cursor=cursor)


@pytest.mark.parametrize(
    "cursor", [True, np.array(3), torch.tensor([True]), torch.tensor([[1], [3]]), -1, range(1, 4)],
)
def test_unusual_cursors_match_torchrl(cursor):
    end = torch.tensor([False, False, True, False, False])
    kind, _ = _check_all(end=end, at_capacity=True, cursor=cursor)
    assert kind == "ok"


def test_missing_signal():
    for fn in IMPLEMENTATIONS.values():
        with pytest.raises(TypeError, match="Exactly one of" if NEWER else "needs one of trajectory or end"):
            fn(at_capacity=True)


def test_trajectory_takes_precedence_over_end():
    trajectory = torch.tensor([0, 0, 1, 1, 1, 2])
    end = torch.ones(6, dtype=torch.bool)
    kind, expected = _check_all(trajectory=trajectory, end=end, at_capacity=False)
    if NEWER:
        assert kind == "error" and isinstance(expected, TypeError)  # exclusive from 0.14 on
    else:
        assert expected[2].tolist() == [2, 3, 1]


@pytest.mark.parametrize(
    "trajectory",
    [torch.tensor([3, 3, 1, 1, 3], dtype=torch.int32), torch.tensor([3, 3, 1, 1, 3], dtype=torch.uint8),
     torch.tensor([0.5, 0.5, float("nan"), 1.0, 0.5]), torch.tensor([True, True, False, True]),
     torch.tensor([1.0, 1.0, 2.0, 2.0], dtype=torch.bfloat16),
     torch.tensor([[2**62, 5], [2**62, 5], [-1, 5]], dtype=torch.int64)],
)
@pytest.mark.parametrize("at_capacity", [True, False])
def test_trajectory_dtypes(trajectory, at_capacity):
    kind, _ = _check_all(trajectory=trajectory, at_capacity=at_capacity)
    assert kind == "ok"


@pytest.mark.parametrize("at_capacity", [True, False])
def test_non_bool_and_non_contiguous_end(at_capacity):
    _check_all(end=torch.tensor([0, 0, 2, 0, 1]), at_capacity=at_capacity)
    _check_all(end=torch.tensor([0.0, 0.5, 0.0, 0.0]), at_capacity=False)
    wide = torch.rand(6, 4, 3, generator=torch.Generator().manual_seed(1)) < 0.3
    _check_all(end=wide.transpose(0, 1), at_capacity=at_capacity, cursor=2)
    _check_all(end=wide[::2, :, 1], at_capacity=at_capacity)
    _check_all(trajectory=wide.long().cumsum(0).permute(1, 0, 2), at_capacity=at_capacity)


def test_non_bool_end_without_end_in_a_column():
    # torchrl fails here (masked_fill_ needs a bool mask); ours treats nonzero as an end.
    end = torch.tensor([[0, 0], [0, 3], [0, 0]])
    with pytest.raises(RuntimeError, match="boolean masks"):
        SAMPLER._find_start_stop_traj(end=end, at_capacity=True)
    expected = SAMPLER._find_start_stop_traj(end=end.bool(), at_capacity=True)
    for fn in IMPLEMENTATIONS.values():
        _assert_same(expected, fn(end=end, at_capacity=True))


def test_numpy_signal_gives_numpy():
    end = np.array([False, True, False, True])
    start, stop, lengths = replay.find_start_stop_traj(end=end, at_capacity=True)
    assert isinstance(start, np.ndarray) and start.dtype == np.int64
    expected = SAMPLER._find_start_stop_traj(end=torch.from_numpy(end), at_capacity=True)
    assert np.array_equal(start, expected[0].numpy())
    assert np.array_equal(stop, expected[1].numpy())
    assert np.array_equal(lengths, expected[2].numpy())


def test_replay_and_torch_ops_agree_on_big_nd_ids():
    gen = torch.Generator().manual_seed(3)
    trajectory = (torch.rand(500, 3, 4, generator=gen) < 0.02).long().cumsum(0)
    for cursor in (None, 17, torch.tensor([4, 499])):
        got = replay.find_start_stop_traj(trajectory=trajectory, at_capacity=True, cursor=cursor)
        _assert_same(got, TORCH_OPS.find_start_stop_traj(
            trajectory=trajectory, at_capacity=True, cursor=cursor))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("from_ids", [False, True])
def test_cuda_signal(from_ids):
    gen = torch.Generator().manual_seed(4)
    end = torch.rand(2000, 3, generator=gen) < 0.01
    signal = end.long().cumsum(0) if from_ids else end
    key = "trajectory" if from_ids else "end"
    expected = SAMPLER._find_start_stop_traj(**{key: signal, "at_capacity": True, "cursor": 100})
    for cursor in (100, torch.tensor([100]), torch.tensor([100], device="cuda")):
        for fn in IMPLEMENTATIONS.values():
            got = fn(**{key: signal.cuda(), "at_capacity": True, "cursor": cursor})
            assert all(x.device.type == "cuda" for x in got)
            _assert_same(expected, tuple(x.cpu() for x in got))


# ------------------------------------------------------------------------------------------
# slice_indices
# ------------------------------------------------------------------------------------------

SLICE_IMPLEMENTATIONS = {
    "replay": replay.slice_indices,
    "torch-ops": TORCH_OPS.slice_indices,
}


@SETTINGS
@given(
    num_slices=st.integers(1, 6),
    ndim=st.integers(1, 3),
    storage_length=st.integers(1, 20),
    uniform=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_slice_indices_match_torchrl(num_slices, ndim, storage_length, uniform, seed):
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, storage_length, (num_slices, ndim), generator=gen)
    if uniform:
        seq_length = int(torch.randint(0, 2 * storage_length, (1,), generator=gen))
    else:
        seq_length = torch.randint(0, 2 * storage_length, (num_slices,), generator=gen)
    expected = SAMPLER._tensor_slices_from_startend(seq_length, start, storage_length)
    for fn in SLICE_IMPLEMENTATIONS.values():
        got = fn(start, seq_length, storage_length)
        assert got.dtype == torch.int64 and got.shape == expected.shape
        assert torch.equal(got, expected)
        # Wrap-around keeps the time column inside the storage.
        assert got.numel() == 0 or (0 <= got[:, 0].min() and got[:, 0].max() < storage_length)


@pytest.mark.parametrize("name", SLICE_IMPLEMENTATIONS)
def test_slice_indices_edge_cases(name):
    fn = SLICE_IMPLEMENTATIONS[name]
    start_1d = torch.tensor([3, 0])
    expected = SAMPLER._tensor_slices_from_startend(2, start_1d, 4)
    assert torch.equal(fn(start_1d, 2, 4), expected)  # 1-D starts give [N, 1]
    expected = SAMPLER._tensor_slices_from_startend(torch.tensor([1, 3]), start_1d, 4)
    assert torch.equal(fn(start_1d, torch.tensor([1, 3]), 4), expected)
    assert fn(torch.empty(0, 2, dtype=torch.long), 3, 5).shape == (0, 2)
    assert fn(torch.empty(0, 2, dtype=torch.long), torch.empty(0, dtype=torch.long), 5).shape == (0, 2)
    assert fn(torch.tensor([[1, 2]]), 0, 5).shape == (0, 2)
    # Negative starts wrap like torch's floor `%`.
    assert fn(torch.tensor([[-1, 2]]), 3, 5).tolist() == [[4, 2], [0, 2], [1, 2]]


@pytest.mark.parametrize("name", SLICE_IMPLEMENTATIONS)
def test_slice_indices_errors(name):
    fn = SLICE_IMPLEMENTATIONS[name]
    start = torch.tensor([[1, 0], [2, 1]])
    with pytest.raises(ValueError, match="got -2 at position 1"):
        fn(start, torch.tensor([3, -2]), 5)
    with pytest.raises(ValueError, match="seq_length=-1"):
        fn(start, -1, 5)
    with pytest.raises(ValueError, match=r"shape \(2,\).*got shape \(3,\)"):
        fn(start, torch.tensor([1, 2, 3]), 5)
    with pytest.raises(ValueError, match="storage_length=0"):
        fn(start, 2, 0)
    with pytest.raises(TypeError, match="start must hold integers"):
        fn(start.float(), 2, 5)
    with pytest.raises(ValueError, match=r"got shape \(2, 2, 1\)"):
        fn(start.unsqueeze(-1), 2, 5)


# --------------------------------------------------------------------------- sorted end rows


# A signal of `length` rows, its end density, rows forced to end a trajectory, how many rows
# at its end do not count (length - limit), a seed.
SORTED_END_CASES = dict(
    length=st.integers(1, 60),
    density=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    forced=st.lists(st.integers(-1, 59), max_size=4),
    limit_cut=st.integers(0, 2),
    seed=st.integers(0, 2**32 - 1),
)


SCAN_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.int32, np.int64, np.uint64,
               np.float16, np.float32, np.float64]


@SETTINGS
@given(
    size=st.integers(0, 300),
    density=st.sampled_from([0.0, 0.01, 0.3, 1.0]),
    step=st.integers(1, 3),
    dtype=st.sampled_from(SCAN_DTYPES),
    seed=st.integers(0, 2**32 - 1),
)
def test_scan_ends_matches_numpy(size, density, step, dtype, seed):
    # numpy's own reading is the reference: nonzero rows, ids that change from one row to the next
    rng = np.random.default_rng(seed)
    flags = rng.random(size * step) < density
    values = (flags * rng.integers(1, 100, size * step)).astype(dtype)
    if np.dtype(dtype).kind == "f" and size * step >= 3:
        values[:3] = [-0.0, np.nan, -np.inf]  # -0.0 is no end, NaN and infinities are
    signal = values[::step]  # strided views are read in place
    np.testing.assert_array_equal(replay.scan_ends(signal), np.flatnonzero(signal))
    assert replay.scan_ends(torch.from_numpy(signal.copy())).tolist() == np.flatnonzero(signal).tolist()
    if np.dtype(dtype).kind in "iu":
        ids = np.cumsum(flags).astype(dtype)[::step]
        np.testing.assert_array_equal(
            replay.scan_ends(ids, from_ids=True), np.flatnonzero(ids[:-1] != ids[1:]))


def test_scan_ends_grows_its_output_and_reads_every_bool_byte():
    # every row an end: the output is grown many times over
    n = (1 << 16) + 3
    np.testing.assert_array_equal(replay.scan_ends(np.ones(n, dtype=bool)), np.arange(n))
    np.testing.assert_array_equal(replay.scan_ends(np.arange(n), from_ids=True), np.arange(n - 1))
    # uninitialized bool rows may hold bytes other than 0 and 1; ends past a run of zero words
    raw = np.zeros(40, dtype=np.uint8)
    raw[[7, 8, 17, 39]] = [2, 255, 1, 128]
    assert replay.scan_ends(raw.view(np.bool_)).tolist() == [7, 8, 17, 39]
    # ids on either side of 2^32 and of the sign bit: all 8 bytes compared
    ids = np.array([1, 1 + 2**32, 1 + 2**32, -(1 + 2**32), 2**63 - 1], dtype=np.int64)
    assert replay.scan_ends(ids, from_ids=True).tolist() == [0, 2, 3]


@pytest.mark.parametrize("size", [0, 1, 2])
def test_scan_ends_short_signals(size):
    assert replay.scan_ends(np.ones(size, dtype=bool)).tolist() == list(range(size))
    assert replay.scan_ends(np.arange(size), from_ids=True).tolist() == list(range(size - 1))
    assert replay.scan_ends(np.arange(size), from_ids=True).dtype == np.int64


@pytest.mark.parametrize(
    "signal, from_ids, error, match",
    [
        (np.zeros((2, 3)), False, ValueError, r"1-D signal, got one of shape \(2, 3\)"),
        (np.zeros(()), False, ValueError, r"shape \(\)"),
        (np.zeros(3, dtype=complex), False, TypeError, "end signal of dtype complex128"),
        (np.zeros(3, dtype=">i4"), False, TypeError, "dtype >i4"),
        (np.zeros(3, dtype=object), False, TypeError, "dtype object"),
        (np.zeros(3, dtype=np.float32), True, TypeError, "trajectory ids of dtype float32"),
        (np.zeros(3, dtype=bool), True, TypeError, "trajectory ids of dtype bool"),
    ],
)
def test_scan_ends_refuses_what_it_does_not_read(signal, from_ids, error, match):
    with pytest.raises(error, match=match):
        replay.scan_ends(signal, from_ids=from_ids)


@SETTINGS
@given(**SORTED_END_CASES)
def test_bounds_from_ends_match_find_start_stop_traj(length, density, forced, limit_cut, seed):
    rng = np.random.default_rng(seed)
    end = rng.random(length) < density
    ends = np.flatnonzero(end).astype(np.int64)
    forced = [r for r in forced if r < length]
    limit = max(length - limit_cut, 0)
    # the reference: the same signal with the ends at or past limit cleared, forced rows set
    signal = end.copy()
    signal[limit:] = False
    for row in forced:
        if row >= 0:
            signal[row] = True
    start, stop, lengths = replay.bounds_from_ends(ends, limit, length, forced)
    ref = replay.find_start_stop_traj(end=torch.as_tensor(signal), at_capacity=True)
    for got, expected in zip((start, stop, lengths), ref):
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, expected.numpy())


@SETTINGS
@given(
    size=st.integers(1, 80),
    seed=st.integers(0, 2**32 - 1),
    n_rows=st.integers(0, 30),
)
def test_patch_ends_matches_a_rescan(size, seed, n_rows):
    rng = np.random.default_rng(seed)
    end = rng.random(size) < rng.random()
    ends = np.flatnonzero(end).astype(np.int64)
    rows = np.unique(rng.integers(0, size, n_rows)).astype(np.int64)
    flags = rng.random(rows.size) < 0.5
    end[rows] = flags
    patched = replay.patch_ends(ends, rows, flags)
    np.testing.assert_array_equal(patched, np.flatnonzero(end))
    assert (patched is ends) == np.array_equal(np.flatnonzero(end), ends)


@SETTINGS
@given(
    size=st.integers(1, 80),
    seed=st.integers(0, 2**32 - 1),
    run=st.tuples(st.integers(0, 80), st.integers(0, 80)),
    dtype=st.sampled_from([np.bool_, np.uint8, np.float32, np.int64]),
)
def test_patch_ends_run_matches_a_rescan(size, seed, run, dtype):
    rng = np.random.default_rng(seed)
    end = rng.random(size) < rng.random()
    ends = np.flatnonzero(end).astype(np.int64)
    lo = min(run) % (size + 1)
    hi = max(lo, min(max(run), size))
    flags = (rng.random(hi - lo) < rng.random()).astype(dtype)
    before = ends.copy()
    end[lo:hi] = flags != 0
    patched = replay.patch_ends_run(ends, lo, hi, flags)
    np.testing.assert_array_equal(patched, np.flatnonzero(end))
    assert (patched is ends) == np.array_equal(np.flatnonzero(end), before)
    np.testing.assert_array_equal(ends, before)  # the input is never written
    # the same as listing the rows for patch_ends
    np.testing.assert_array_equal(patched, replay.patch_ends(before, np.arange(lo, hi), flags != 0))


def test_patch_ends_run_reads_any_nonzero_byte_as_an_end():
    # uninitialized bool rows may hold bytes other than 0 and 1
    flags = np.array([0, 2, 0, 0, 0, 0, 0, 0, 0, 255, 1], dtype=np.uint8)
    assert replay.patch_ends_run(np.array([0, 20]), 3, 14, flags).tolist() == [0, 4, 12, 13, 20]
    assert replay.patch_ends_run(np.array([0, 20]), 3, 14, flags.view(np.bool_)).tolist() == [0, 4, 12, 13, 20]


@SETTINGS
@given(**SORTED_END_CASES)
def test_bounds_summary_and_slices_from_ends_match_the_listed_bounds(length, density, forced, limit_cut, seed):
    rng = np.random.default_rng(seed)
    ends = np.flatnonzero(rng.random(length) < density).astype(np.int64)
    forced = [r for r in forced if r < length]
    limit = max(length - limit_cut, 0)
    start, _, lengths = replay.bounds_from_ends(ends, limit, length, forced)
    # the model: count and minimum of the listed lengths
    assert replay.bounds_summary(ends, limit, length, forced) == (lengths.size, int(lengths.min()))
    n = int(rng.integers(0, 6) if seed % 3 else rng.integers(60, 70))  # kept on the stack up to 64
    traj = torch.from_numpy(rng.integers(0, lengths.size, n))
    uniform = torch.rand(n, generator=torch.Generator().manual_seed(seed % 1000), dtype=torch.float64 if seed % 2 else torch.float32)
    seq_length = int(rng.integers(1, 5))
    span = (bool(rng.integers(0, 2)) or int(rng.integers(0, 3)), bool(rng.integers(0, 2)))
    flags = (torch.from_numpy(rng.random((length, 1)) < 0.5), None)
    kwargs = dict(span=span, flags=flags)
    expected = _outcome(lambda: replay.sample_slice_index(
        torch.from_numpy(start), torch.from_numpy(lengths), traj, uniform, seq_length, length, **kwargs))
    got = _outcome(lambda: replay.sample_slice_index_from_ends(
        ends, limit, length, forced, traj, uniform, seq_length, length, **kwargs))
    assert got[0] == expected[0]
    if expected[0] == "error":
        assert type(got[1]) is type(expected[1]) and str(got[1]) == str(expected[1])
        return
    assert len(got[1]) == len(expected[1])
    mine, theirs = list(got[1][:2]), list(expected[1][:2])
    if len(got[1]) == 3:  # the flag columns read at the rows (nothing drawn: not returned)
        assert got[1][2][1] is None and expected[1][2][1] is None
        mine.append(got[1][2][0])
        theirs.append(expected[1][2][0])
    for a, b in zip(mine, theirs):
        assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)


@SETTINGS
@given(**SORTED_END_CASES, min_length=st.integers(0, 12))
def test_short_trajectories_match_the_listed_bounds(length, density, forced, limit_cut, seed, min_length):
    # the model: the positions of the listed lengths below min_length
    rng = np.random.default_rng(seed)
    ends = np.flatnonzero(rng.random(length) < density).astype(np.int64)
    forced = [r for r in forced if r < length]
    limit = max(length - limit_cut, 0)
    _, _, lengths = replay.bounds_from_ends(ends, limit, length, forced)
    short = replay.short_trajectories(ends, limit, length, forced, min_length)
    np.testing.assert_array_equal(short, np.flatnonzero(lengths < min_length))
    assert short.dtype == np.int64


def test_short_trajectories_grow_their_output_and_refuse_bad_forced_rows():
    # every trajectory short: more positions than the first room of 16
    ends = np.arange(0, 100, 2)
    assert replay.short_trajectories(ends, 100, 100, [], 5).tolist() == list(range(50))
    with pytest.raises(ValueError):
        replay.short_trajectories(ends, 100, 100, [100], 5)


def test_slices_from_ends_wrap_around_a_full_storage():
    # ends at 3 and 7 of 10 rows, cursor row 8 forced: trajectories (4..7), (8..8), (9..3)
    ends = np.array([3, 7])
    assert replay.bounds_summary(ends, 10, 10, [8]) == (3, 1)
    index, truncated = replay.sample_slice_index_from_ends(
        ends, 10, 10, [8], torch.tensor([0, 2]), torch.tensor([0.99, 0.0]), 3, 10)
    # the first slice wraps past row 9; the second runs on past its 1-step trajectory, as
    # torchrl's does (strict_length filters such trajectories out before drawing)
    assert index.flatten().tolist() == [1, 2, 3, 8, 9, 0]
    assert index.flatten().tolist() == replay.sample_slice_index(
        *[torch.from_numpy(a) for a in replay.bounds_from_ends(ends, 10, 10, [8])[::2]],
        torch.tensor([0, 2]), torch.tensor([0.99, 0.0]), 3, 10)[0].flatten().tolist()
    assert truncated.flatten().tolist() == [False, False, True, False, False, True]


def test_sorted_end_kernels_reject_bad_input():
    with pytest.raises(ValueError, match="rows must be strictly increasing, got 3 at position 2"):
        replay.patch_ends(np.array([1, 5]), np.array([2, 4, 3]), np.array([True, False, True]))
    with pytest.raises(ValueError, match="one value per row"):
        replay.patch_ends(np.array([1, 5]), np.array([2, 4]), np.array([True]))
    with pytest.raises(ValueError, match=r"forced rows must lie in \[-1, 6\)"):
        replay.bounds_from_ends(np.array([1]), 6, 6, [6])
    with pytest.raises(ValueError, match="at most 8 forced rows, got 9"):
        replay.bounds_from_ends(np.array([1]), 6, 6, [0] * 9)
    with pytest.raises(ValueError, match="length must be at least 1"):
        replay.bounds_from_ends(np.array([], dtype=np.int64), 0, 0)
    with pytest.raises(TypeError, match="ends must hold integers"):
        replay.bounds_from_ends(np.array([1.0]), 6, 6)
    with pytest.raises(ValueError, match=r"0 <= lo <= hi, got lo=3, hi=2"):
        replay.patch_ends_run(np.array([1, 5]), 3, 2, np.array([], dtype=bool))
    with pytest.raises(ValueError, match=r"0 <= lo <= hi, got lo=-1, hi=2"):
        replay.patch_ends_run(np.array([1, 5]), -1, 2, np.array([True, False, True]))
    with pytest.raises(ValueError, match=r"got 2 flags for rows \[1, 4\)"):
        replay.patch_ends_run(np.array([1, 5]), 1, 4, np.array([True, False]))
    with pytest.raises(TypeError, match="ends must hold integers"):
        replay.patch_ends_run(np.array([1.0]), 0, 1, np.array([True]))
    for fn, args in ((replay.bounds_summary, ()), (replay.sample_slice_index_from_ends,
                                                   (torch.tensor([0]), torch.tensor([0.5]), 1, 6))):
        with pytest.raises(ValueError, match=r"forced rows must lie in \[-1, 6\), got \[7\]"):
            fn(np.array([1]), 6, 6, [7], *args)
        with pytest.raises(ValueError, match="at most 8 forced rows, got 9"):
            fn(np.array([1]), 6, 6, [0] * 9, *args)
        with pytest.raises(ValueError, match="length must be at least 1, got length=0"):
            fn(np.array([], dtype=np.int64), 0, 0, [], *args)
        with pytest.raises(TypeError, match="ends must hold integers"):
            fn(np.array([1.0]), 6, 6, [], *args)
    # ends 1 and 4 of 6 rows: two trajectories
    with pytest.raises(IndexError, match="traj value 2 at position 1 is out of range for 2 trajectories"):
        replay.sample_slice_index_from_ends(np.array([1, 4]), 6, 6, [], torch.tensor([0, 2]), torch.tensor([0.5, 0.5]), 1, 6)
    with pytest.raises(IndexError, match="traj value -1 at position 0"):
        replay.sample_slice_index_from_ends(np.array([1, 4]), 6, 6, [], torch.tensor([-1]), torch.tensor([0.5]), 1, 6)
    with pytest.raises(ValueError, match="uniform must have shape"):
        replay.sample_slice_index_from_ends(np.array([1, 4]), 6, 6, [], torch.tensor([0]), torch.tensor([0.5, 0.5]), 1, 6)
    # nothing drawn: empty results
    index, truncated = replay.sample_slice_index_from_ends(np.array([1, 4]), 6, 6, [], torch.tensor([], dtype=torch.long), torch.tensor([]), 2, 6)
    assert index.shape == (0, 1) and truncated.shape == (0, 1)


def _excluded_model(lengths, tail, keep_first, offset, total):
    out, end = [], 0
    for length in lengths:
        end += length
        count = min(tail, max(length - 1, 0) if keep_first else length)
        out.extend((p + offset) % total for p in range(end - count, end))
    return sorted(out)


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), max_size=12),
    tail=st.integers(0, 14),
    keep_first=st.booleans(),
    slack=st.integers(0, 5),
    data=st.data(),
)
def test_excluded_starts_match_model(lengths, tail, keep_first, slack, data):
    total = sum(lengths) + slack
    if total == 0:
        return
    offset = data.draw(st.integers(0, total - 1))
    got = replay.excluded_starts(np.array(lengths, dtype=np.int64), tail, keep_first=keep_first,
                                 offset=offset, total=total)
    assert got.dtype == np.int64
    assert got.tolist() == _excluded_model(lengths, tail, keep_first, offset, total)


def test_excluded_starts_match_the_torch_path():
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = torch.as_tensor(rng.integers(1, 60, int(rng.integers(1, 40))))
        total = int(lengths.sum())
        offset = int(rng.integers(0, total))
        for strict_length in (True, False):
            torch_ops = TORCH_OPS.excluded_start_positions(lengths, 8, 0, strict_length)
            expected = np.sort(((torch_ops + offset) % total).numpy())
            got = replay.excluded_starts(lengths, 7, keep_first=not strict_length, offset=offset)
            np.testing.assert_array_equal(got, expected)


def test_excluded_starts_bad_input():
    with pytest.raises(ValueError, match="tail=-1"):
        replay.excluded_starts([3], -1)
    with pytest.raises(ValueError, match="offset=3"):
        replay.excluded_starts([3], 1, offset=3)
    with pytest.raises(ValueError, match="sum past total"):
        replay.excluded_starts([3, 4], 1, total=5)
    with pytest.raises(ValueError):
        replay.excluded_starts([3, -1], 1, total=5)
    with pytest.raises(TypeError):
        replay.excluded_starts([1.5], 1)
    assert replay.excluded_starts(np.zeros(0, dtype=np.int64), 3).size == 0
