"""Sample units (torchrl 0.14's ``Sequence`` / ``Transition``) and the boundary queries on
``replay``'s kernels: against a plain numpy model of the windows (every release), and against
torchrl 0.14.1's own Python on twin storages (skipped where torchrl 0.14 is not installed).
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from tensordict import TensorDict

import replay
import torchrl_compat as O
from torchrl_compat.samplers import _boundary_queries
from torchrl_compat._releases import since
from torchrl_compat.sample_units import Sequence, Transition

BOUNDARIES = ("pad", "stop", "include_reset")


def _seed(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)


# ------------------------------------------------------------------ a numpy model of the windows


def _model_windows(end, anchor, lane, burn_in, length, bootstrap, dilation, boundary, *, cursor=None,
                   close_last=False, newest=0, oldest=0, rows=None):
    """Each anchor's window, record by record, from the definitions (torchrl 0.14.1's docstring
    and _derive_end_flags): an end is a flagged row, the cursor row of a full storage, the last
    row of one not full, or the last row of a lane with no end at all."""
    if boundary != "include_reset":
        end = np.asarray(end, dtype=bool).reshape(len(end), -1).copy()
        rows = end.shape[0]
        if close_last:
            end[-1] = True
        if cursor is not None:
            end[cursor] = True
        end[-1, ~end.any(0)] = True
    total = burn_in + length + bootstrap
    index, valid = [], []
    for i, a in enumerate(anchor):
        if boundary == "include_reset":
            to_stop, from_start = (newest - a) % rows, (a - oldest) % rows
        else:
            g = lane[i] if lane is not None else 0
            to_stop = next(k for k in range(rows) if end[(a + k) % rows, g])
            from_start = next(k for k in range(rows) if end[(a - k - 1) % rows, g])
        if boundary == "stop":
            shift = min(max(dilation * (length + bootstrap - 1) - to_stop, 0), from_start)
            a, to_stop, from_start = a - shift, to_stop + shift, from_start - shift
        for s in range(total):
            offset = (s - burn_in) * dilation
            valid.append(-from_start <= offset <= to_stop)
            index.append((a + min(max(offset, -from_start), to_stop)) % rows)
    return np.array(index, dtype=np.int64), np.array(valid, dtype=bool)


@settings(max_examples=150, deadline=None)
@given(
    rows=st.integers(1, 40),
    lanes=st.integers(1, 3),
    flag_rate=st.sampled_from([0.0, 0.1, 0.5]),
    window=st.tuples(st.integers(0, 4), st.integers(1, 5), st.integers(0, 4), st.integers(1, 4)),
    boundary=st.sampled_from(BOUNDARIES),
    forced=st.sampled_from(["cursor", "close_last", "none"]),
    seed=st.integers(0, 2**16),
)
def test_windows_match_a_numpy_model(rows, lanes, flag_rate, window, boundary, forced, seed):
    rng = np.random.default_rng(seed)
    end = rng.random((rows, lanes)) < flag_rate
    anchor = rng.integers(0, rows, 7)
    # include_reset reads no flags: its windows do not depend on lanes
    lane = rng.integers(0, lanes, 7) if lanes > 1 and boundary != "include_reset" else None
    cursor = int(rng.integers(0, rows)) if forced == "cursor" else None
    newest, oldest = (int(x) for x in rng.integers(0, rows, 2))
    kwargs = dict(cursor=cursor, close_last=forced == "close_last", newest=newest, oldest=oldest)
    index, validity, sequence_id, step, learning = replay.sequence_windows(
        end if boundary != "include_reset" else None, anchor, lane, *window, boundary, length=rows, **kwargs
    )
    expected_index, expected_valid = _model_windows(end, anchor, lane, *window, boundary, rows=rows, **kwargs)
    np.testing.assert_array_equal(index, expected_index)
    np.testing.assert_array_equal(validity, expected_valid)
    burn_in, length, bootstrap, _ = window
    total = burn_in + length + bootstrap
    np.testing.assert_array_equal(sequence_id, np.repeat(np.arange(7), total))
    np.testing.assert_array_equal(step, np.tile(np.arange(total), 7))
    np.testing.assert_array_equal(learning, np.tile((np.arange(total) >= burn_in) & (np.arange(total) < burn_in + length), 7))


def test_windows_far_apart_in_a_long_storage():
    # dilation past the storage's length, and a window longer than the storage
    end = np.zeros(50, dtype=bool)
    end[[9, 30]] = True
    anchor = np.array([0, 9, 10, 31, 49])
    for window in [(3, 4, 2, 70), (60, 80, 40, 1), (2, 3, 1, 7)]:
        for boundary in ("pad", "stop"):
            index, validity, *_ = replay.sequence_windows(end, anchor, None, *window, boundary, cursor=20)
            expected = _model_windows(end, anchor, None, *window, boundary, cursor=20)
            np.testing.assert_array_equal(index, expected[0])
            np.testing.assert_array_equal(validity, expected[1])


def test_windows_of_no_anchor():
    outputs = replay.sequence_windows(np.zeros(5, bool), np.zeros(0, np.int64), None, 1, 2, 1, 1, "pad")
    assert [o.shape for o in outputs] == [(0,)] * 5


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"anchor_time": np.array([1, 12])}, IndexError, r"anchor 12 \(position 1\) is out of range for a storage of 10 rows"),
        ({"anchor_time": np.array([-1])}, IndexError, r"anchor -1 \(position 0\)"),
        ({"anchor_time": np.array([1.0])}, TypeError, "anchor must hold integers"),
        ({"episode_boundary": "clip"}, ValueError, "Unknown episode_boundary 'clip'"),
        ({"dilation": 0}, ValueError, "dilation must be an integer >= 1, got dilation=0"),
        ({"burn_in": -2}, ValueError, "burn_in must be an integer >= 0, got burn_in=-2"),
        ({"cursor": 10}, ValueError, "cursor 10 is out of range for a storage of 10 rows"),
        ({"end": np.zeros(0, bool)}, ValueError, "empty storage"),
    ],
)
def test_windows_refuse_bad_input(kwargs, error, match):
    arguments = dict(end=np.zeros(10, bool), anchor_time=np.array([3]), anchor_group=None, burn_in=1,
                     seq_length=2, bootstrap=1, dilation=1, episode_boundary="pad")
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        replay.sequence_windows(**arguments)


def test_windows_refuse_an_anchor_outside_its_lanes():
    with pytest.raises(IndexError, match=r"anchor 2 \(lane 5, position 1\) .* and 3 lanes"):
        replay.sequence_windows(np.zeros((4, 3), bool), np.array([0, 2]), np.array([0, 5]), 0, 1, 0, 1, "pad")


def test_boundary_distances_match_a_searchsorted_model():
    _seed(0)
    for _ in range(50):
        length = int(np.random.randint(1, 60))
        stop = np.unique(np.random.randint(0, length, np.random.randint(1, 8)))
        start = np.random.randint(0, length, stop.shape[0])
        anchor = np.random.randint(-3, length + 3, 11)
        j = np.searchsorted(stop, anchor, side="left") % stop.shape[0]
        got = replay.boundary_distances(anchor, start, stop, length)
        np.testing.assert_array_equal(got[0], (anchor - start[j]) % length)
        np.testing.assert_array_equal(got[1], (stop[j] - anchor) % length)


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((np.array([1]), np.array([0]), np.array([], np.int64), 5), ValueError, "same shape, got 1 and 0"),
        ((np.array([1]), np.array([], np.int64), np.array([], np.int64), 5), ValueError, "empty stop"),
        ((np.array([1]), np.array([0]), np.array([4]), 0), ValueError, "length must be at least 1, got length=0"),
    ],
)
def test_boundary_distances_refuse_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        replay.boundary_distances(*args)


def test_boundary_distances_nd_name_an_anchor_without_trajectory():
    anchor = np.array([[1, 0], [3, 1]])
    start = stop = np.array([[2, 0]])
    with pytest.raises(IndexError, match=r"anchor \[3, 1\] at position 1"):
        replay.boundary_distances_nd(anchor, start, stop, np.array([2, 7]), np.array([0, 0]), np.array([1]), 5)


# ------------------------------------------------------------------ the unit, in every release


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"length": 0}, "length must be strictly positive, got 0."),
        ({"length": 2, "episode_boundary": "clip"}, "Unknown episode_boundary clip"),
        ({"length": 2, "burn_in": -1}, "burn_in must be non-negative, got -1."),
        ({"length": 2, "bootstrap": -1}, "bootstrap must be non-negative, got -1."),
        ({"length": 2, "dilation": 0}, "dilation must be strictly positive, got 0."),
    ],
)
def test_sequence_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Sequence(**kwargs)


def test_sequence_needs_a_tensordict_storage():
    with pytest.raises(TypeError, match="requires a TensorDict-backed TensorStorage"):
        Sequence(2).expand(torch.tensor([0]), {}, O.ListStorage(4))
    storage = O.LazyTensorStorage(4)
    storage.set(range(4), torch.arange(4))
    with pytest.raises(TypeError, match="holds Tensor instead"):
        Sequence(2).expand(torch.tensor([0]), {}, storage)


def _filled(storage_cls=O.LazyTensorStorage, size=10, n=10):
    storage = storage_cls(size)
    done = torch.zeros(n, 1, dtype=torch.bool)
    done[4] = done[n - 1] = True
    storage.set(torch.arange(n) % size, TensorDict({"obs": torch.arange(n), ("next", "done"): done}, [n]))
    return storage


def test_sequence_docstring_example():
    storage = _filled()
    index, info = Sequence(length=2, burn_in=1, bootstrap=1).expand(torch.tensor([5]), {}, storage)
    assert index.tolist() == [5, 5, 6, 7]
    assert info["learning_mask"].tolist() == [False, True, True, False]
    assert info["validity_mask"].tolist() == [False, True, True, True]
    index, _ = Sequence(length=3, dilation=2).expand(torch.tensor([0]), {}, storage)
    assert index.tolist() == [0, 2, 4]


def test_sequence_names_an_anchor_outside_the_storage():
    with pytest.raises(IndexError, match=r"anchor 10 \(position 1\) is out of range for a storage of 10 rows"):
        Sequence(2).expand(torch.tensor([0, 10]), {}, _filled())


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_sequence_over_an_empty_storage(boundary):
    # torchrl 0.14.1: the same RuntimeErrors for "pad" / "stop"; ZeroDivisionError and
    # TypeError ('NoneType' object is not subscriptable) for "include_reset"
    never_written = O.LazyTensorStorage(4)
    emptied = O.LazyTensorStorage(4)
    emptied.set(range(2), TensorDict({("next", "done"): torch.zeros(2, 1, dtype=torch.bool)}, [2]))
    emptied._empty()
    unit = Sequence(2, episode_boundary=boundary)
    for storage, match in ((never_written, "non-initialized storage|empty storage"), (emptied, "empty")):
        with pytest.raises(RuntimeError, match=match):
            unit.expand(torch.tensor([0]), {}, storage)


def test_transition_is_the_identity():
    index, info = torch.tensor([3, 1]), {"weight": torch.ones(2)}
    assert Transition().expand(index, info, None) == (index, info)


@pytest.mark.skipif(not since("sample_units"), reason="torchrl 0.14's classes")
def test_package_exports_the_units():
    assert O.Sequence is Sequence and O.Transition is Transition and "SampleUnit" in O.__all__


@pytest.mark.skipif(since("sample_units"), reason="torchrl 0.11-0.13 have no sample units")
def test_package_does_not_export_the_units_before_014():
    assert not hasattr(O, "Sequence") and "Sequence" not in O.__all__


# ------------------------------------------------------------------ against torchrl 0.14.1

needs_torchrl_units = pytest.mark.skipif(
    not since("sample_units") or not O.replay_buffers.base.torchrl_sample_units(),
    reason="needs torchrl 0.14's sample units",
)


def _torchrl():
    import torchrl.data as T
    from torchrl.data.replay_buffers import sample_units, utils

    return T, sample_units, utils


def _same(a, b):
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def _twin_storages(T, rng, capacity, lane_shape, writes):
    """The same writes into torchrl's LazyTensorStorage and ours; the storages, and the rows
    written."""
    ndim = 1 + len(lane_shape)
    lanes = int(np.prod(lane_shape)) if lane_shape else 1
    storages = [cls(capacity * lanes, ndim=ndim) for cls in (T.LazyTensorStorage, O.LazyTensorStorage)]
    written = 0
    for _ in range(writes):
        m = int(rng.integers(1, capacity + 1))
        done = torch.from_numpy(rng.random((m, *lane_shape, 1)) < 0.2)
        data = TensorDict({("next", "done"): done, "obs": torch.arange(m)}, [m])
        if lane_shape:
            data = TensorDict({("next", "done"): done}, [m, *lane_shape])
        rows = torch.arange(written, written + m) % capacity
        for storage in storages:
            storage.set(rows, data)
        written += m
    return storages, written


@needs_torchrl_units
@pytest.mark.parametrize("lane_shape", [(), (3,), (2, 3)], ids=["1d", "lanes", "lanes2d"])
@pytest.mark.parametrize("seed", range(6))
def test_expand_as_torchrl(seed, lane_shape):
    T, units, _ = _torchrl()
    _seed(seed)
    rng = np.random.default_rng(seed)
    for trial in range(40):
        capacity = int(rng.integers(1, 25))
        # one write (partly filled), several (at capacity, wrapped around)
        storages, _ = _twin_storages(T, rng, capacity, lane_shape, int(rng.integers(1, 4)))
        kwargs = dict(
            length=int(rng.integers(1, 6)), episode_boundary=BOUNDARIES[trial % 3],
            burn_in=int(rng.integers(0, 5)), bootstrap=int(rng.integers(0, 5)), dilation=int(rng.integers(1, 4)),
        )
        if trial % 5 == 0:
            kwargs["done_key"] = None
        rows = storages[0].shape[0]
        batch = int(rng.integers(1, 6))
        time = torch.from_numpy(rng.integers(0, rows, batch))
        if lane_shape:
            index = (time, *(torch.from_numpy(rng.integers(0, n, batch)) for n in lane_shape))
        else:
            index = time
        info = {"weight": torch.rand(batch), "scalar": 3.0, "listed": list(range(batch))}
        theirs = units.Sequence(**kwargs).expand(index, dict(info), storages[0])
        ours = Sequence(**kwargs).expand(index, dict(info), storages[1])
        assert _same(ours, theirs), (kwargs, storages[0]._is_full, theirs, ours)
        # again at the same revision: with lanes, from the ends listed this time
        again = Sequence(**kwargs).expand(index, dict(info), storages[1])
        assert _same(again, theirs), (kwargs, storages[0]._is_full, theirs, again)


@needs_torchrl_units
@pytest.mark.parametrize("lane_shape", [(), (3,)], ids=["1d", "lanes"])
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_expand_after_writes_as_torchrl(boundary, lane_shape):
    # torchrl caches the boundaries until the storage's revision moves; ours reads the flags
    # around the anchors, or (with lanes, from the second query at a revision) lists them:
    # both see every write, through extend and set
    T, units, _ = _torchrl()
    _seed(1)
    rng = np.random.default_rng(1)
    storages, written = _twin_storages(T, rng, 16, lane_shape, 2)
    ours, theirs = Sequence(3, boundary, burn_in=2, bootstrap=1), units.Sequence(3, boundary, burn_in=2, bootstrap=1)
    anchor = torch.arange(16)
    if lane_shape:
        anchor = (torch.arange(16), torch.arange(16) % 3)
    for step in range(6):
        expected = theirs.expand(anchor, {}, storages[0])
        assert _same(ours.expand(anchor, {}, storages[1]), expected)
        assert _same(ours.expand(anchor, {}, storages[1]), expected)
        m = int(rng.integers(1, 6))
        done = torch.from_numpy(rng.random((m, *lane_shape, 1)) < 0.4)
        data = TensorDict({("next", "done"): done}, [m, *lane_shape])
        rows = torch.arange(written, written + m) % 16
        written += m
        for storage in storages:
            if step % 2:
                storage.set(rows, data)
            else:  # a write of the flags alone, in place
                storage[rows] = data


@needs_torchrl_units
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_buffers_sample_as_torchrl(boundary):
    T, units, _ = _torchrl()
    samples = []
    for ns, cls in ((T, units.Sequence), (O, Sequence)):
        _seed(3)
        rb = ns.TensorDictReplayBuffer(storage=ns.LazyTensorStorage(30), batch_size=4,
                                       sample_unit=cls(3, boundary, burn_in=1, bootstrap=1))
        done = torch.zeros(45, 1, dtype=torch.bool)
        done[[6, 13, 14, 29, 40]] = True
        rb.extend(TensorDict({"obs": torch.arange(45), ("next", "done"): done}, [45]))
        samples.append(rb.sample(return_info=True))
    (theirs, their_info), (ours, our_info) = samples
    assert torch.equal(ours["obs"], theirs["obs"]) and ours.keys() == theirs.keys()
    assert _same(our_info, their_info)


@needs_torchrl_units
def test_signatures_as_torchrl():
    _, units, utils = _torchrl()
    for name in ("SampleUnit", "Transition", "Sequence"):
        for method in ("__init__", "expand"):
            assert inspect.signature(getattr(getattr(units, name), method)) == inspect.signature(
                getattr(getattr(O.sample_units, name), method)
            ), (name, method)
    for name, ours in _boundary_queries.BOUNDARY_QUERIES.items():
        assert inspect.signature(ours) == inspect.signature(getattr(utils, name))


@needs_torchrl_units
def test_boundary_queries_as_torchrl():
    _, _, utils = _torchrl()
    find = O.utils.find_start_stop_traj
    _seed(4)
    rng = np.random.default_rng(4)
    for trial in range(60):
        lane_shape = [(), (3,), (2, 2)][trial % 3]
        rows = int(rng.integers(1, 30))
        end = torch.from_numpy(rng.random((rows, *lane_shape)) < 0.2)
        at_capacity = bool(trial % 2)
        start, stop, _ = find(end=end, at_capacity=at_capacity, cursor=int(rng.integers(0, rows)) if at_capacity else None)
        time = torch.from_numpy(rng.integers(0, rows, 9))
        if not lane_shape:
            ours = _boundary_queries._boundary_distances_1d(time, start[:, 0], stop[:, 0], rows)
            theirs = utils._boundary_distances_1d(time, start[:, 0], stop[:, 0], rows)
            assert _same(ours, theirs)
            continue
        shape = (rows, *lane_shape)
        search = _boundary_queries._make_boundary_search_nd(start, stop, shape)
        assert _same(search, utils._make_boundary_search_nd(start, stop, shape))
        anchor = torch.stack([time, *(torch.from_numpy(rng.integers(0, n, 9)) for n in lane_shape)], -1)
        assert _same(
            _boundary_queries._boundary_distances_nd(anchor, start, stop, *search, rows),
            utils._boundary_distances_nd(anchor, start, stop, *search, rows),
        )


def test_boundary_queries_torch_path_as_kernels():
    # the torch operations (compiled graphs, other devices) give the kernels' results
    find = O.utils.find_start_stop_traj
    _seed(5)
    rng = np.random.default_rng(5)
    for trial in range(40):
        lane_shape = [(), (3,)][trial % 2]
        rows = int(rng.integers(1, 30))
        end = torch.from_numpy(rng.random((rows, *lane_shape)) < 0.2)
        start, stop, _ = find(end=end, at_capacity=True, cursor=int(rng.integers(0, rows)))
        time = torch.from_numpy(rng.integers(0, rows, 9))
        if not lane_shape:
            args = (time, start[:, 0], stop[:, 0])
            kernel = _boundary_queries._boundary_distances_1d(*args, rows)
            ops = _boundary_queries._torch_distances(*args, stop[:, 0], time, None, rows)
        else:
            stop_key, boundary_index, lane_stride = _boundary_queries._make_boundary_search_nd(start, stop, (rows, 3))
            anchor = torch.stack([time, torch.from_numpy(rng.integers(0, 3, 9))], -1)
            kernel = _boundary_queries._boundary_distances_nd(anchor, start, stop, stop_key, boundary_index, lane_stride, rows)
            search_key = anchor[:, 1] * lane_stride[0] * 2 * rows + anchor[:, 0]
            ops = _boundary_queries._torch_distances(time, start[:, 0], stop[:, 0], stop_key, search_key, boundary_index, rows)
        assert all(torch.equal(k, o) and k.dtype == o.dtype for k, o in zip(kernel, ops))


def test_boundary_query_compiles_in_one_graph():
    compiled = torch.compile(_boundary_queries._boundary_distances_1d, backend="eager", fullgraph=True)
    args = (torch.tensor([9, 3, 6]), torch.tensor([8, 3, 5]), torch.tensor([2, 4, 7]), 10)
    assert [d.tolist() for d in compiled(*args)] == [[1, 0, 1], [3, 1, 1]]
    assert [d.tolist() for d in _boundary_queries._boundary_distances_1d(*args)] == [[1, 0, 1], [3, 1, 1]]


@pytest.mark.parametrize("shape", [(0,), (5,), (4, 1), (3, 2), (2, 3)])
@pytest.mark.parametrize("times", [0, 1, 4])
def test_repeat_rows_as_numpy(shape, times):
    rows = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    got = replay.repeat_rows(rows, times)
    np.testing.assert_array_equal(got, np.repeat(rows, times, axis=0))
    assert got.dtype == np.int64
    with pytest.raises(ValueError, match="out must be a C-contiguous int64 array of shape"):
        replay.repeat_rows(rows, times, out=np.empty((1, 7), np.int64))


def test_sequence_names_an_anchor_outside_its_lanes():
    storage = O.LazyTensorStorage(12, ndim=2)
    storage.set(torch.arange(4), TensorDict({("next", "done"): torch.zeros(4, 3, 1, dtype=torch.bool)}, [4, 3]))
    with pytest.raises(IndexError, match=r"anchor \[1, 3\] at position 1 is outside the storage's lanes \(3,\)"):
        Sequence(2).expand((torch.tensor([0, 1]), torch.tensor([2, 3])), {}, storage)
