"""TrajectoryEnds and the storages' write journal.

Every result of ``TrajectoryEnds.bounds`` is compared with a full read of the end signal
through ``replay.find_start_stop_traj``, as ``SliceSampler`` computes it.
"""
import doctest
import multiprocessing as mp
import pickle

import numpy as np
import pytest
import replay
from torchrl_compat._releases import since
import torch
from hypothesis import given, settings, strategies as st
from tensordict import TensorDict

import torchrl.data.replay_buffers.storages as trl

import torchrl_compat.samplers._trajectory_ends as te_module
import torchrl_compat.storages as ours
from torchrl_compat.storages._journal import RowRun
from torchrl_compat.samplers._trajectory_ends import TrajectoryEnds
from torchrl_compat.writers._rows import write_rows

KEY = ("next", "done")
JOIN_TIMEOUT = 60
STORAGES = ["LazyTensorStorage", "LazyMemmapStorage"]


def make_td(done, end_shape="[N, 1]"):
    done = torch.as_tensor(done)
    if end_shape == "[N, 1]":
        done = done.unsqueeze(-1)
    n = done.shape[0]
    return TensorDict({"obs": torch.randn(n, 2), KEY: done}, batch_size=[n])


def reference(storage):
    """What SliceSampler computes from the whole signal (``cache_values=False``)."""
    return replay.find_start_stop_traj(
        end=storage[:][KEY].squeeze()[: len(storage)],
        at_capacity=storage._is_full,
        # torchrl 0.14 reads the time coordinate taken at the write
        cursor=storage._last_cursor_index if since("slice_mutation_revision") else storage._last_cursor,
    )


def check(ends, storage, reference=reference, may_defer=lambda storage: False):
    """``ends.bounds`` equals the full read, or is ``None`` exactly where that raises (or
    where ``may_defer(storage)`` allows the caller's full read)."""
    got = ends.bounds(storage)
    try:
        expected = reference(storage)
    except (IndexError, RuntimeError) as error:
        expected = error
    if isinstance(expected, Exception):
        assert got is None, (got, expected)
        return None
    if got is None and may_defer(storage):
        return None
    assert got is not None, expected
    for mine, theirs in zip(got, expected):
        assert mine.dtype == theirs.dtype == torch.int64
        assert torch.equal(mine, theirs), (got, expected)
    return got


class CountingEnds(TrajectoryEnds):
    """Counts the rows of the end signal read in full scans and in row reads."""

    def __init__(self, end_key, **kwargs):
        super().__init__(end_key, **kwargs)
        self.scanned = 0
        self.read = 0

    def _scan(self, signal):
        self.scanned += signal.size
        return super()._scan(signal)

    def _read(self, signal, rows):
        self.read += rows.size
        return super()._read(signal, rows)

    def _read_run(self, signal, lo, hi):
        self.read += hi - lo
        self.runs += 1
        return super()._read_run(signal, lo, hi)

    runs = 0  # runs of rows read as one block


def make_storage(cls_name, capacity, **kwargs):
    return getattr(ours, cls_name)(capacity, **kwargs)


def as_lists(writes):
    """``storage._writes_since(...)`` with the journalled index copies as plain lists."""
    now, cursors = writes
    if cursors is None:
        return now, None
    return now, [c.tolist() if isinstance(c, (torch.Tensor, np.ndarray)) else c for c in cursors]


def filled(cls_name, capacity, done, **kwargs):
    storage = make_storage(cls_name, capacity, **kwargs)
    done = torch.as_tensor(done)
    storage.set(torch.arange(done.shape[0]), make_td(done))
    return storage


# -----------------------------------------------------------------------------
# random write sequences against the full read
# -----------------------------------------------------------------------------
OPS = ["extend", "extend", "extend", "add", "slice", "range", "random", "setitem", "mask",
       "fail", "empty", "load", "burst", "rows", "rows", "edit_cursor"]


def _draw_done(data, n, dtype):
    p = data.draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]), label="p")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    done = torch.from_numpy(rng.random(n) < p)
    return done if dtype == torch.bool else done.to(dtype)


def _apply(data, storage, op, capacity, state, td):
    """Applies one write operation, the way torchrl's writers and buffers issue them;
    ``td(n)`` makes the ``n`` rows written."""
    if op == "extend":  # RoundRobinWriter.extend
        n = data.draw(st.integers(1, 2 * capacity), label="n")
        cursor = torch.arange(state["cursor"], state["cursor"] + n) % capacity
        state["cursor"] = (state["cursor"] + n) % capacity
        storage.set(cursor, td(n))
    elif op == "rows":  # our RoundRobinWriter.extend: rows copied, journaled as a RowRun
        n = data.draw(st.integers(0 if storage.initialized else 1, capacity), label="n")
        start = state["cursor"]
        cursor = torch.arange(start, start + n) % capacity
        batch = td(n)
        if not write_rows(storage, start, cursor, batch):  # not initialized yet
            storage.set(cursor, batch)
        state["cursor"] = (start + n) % capacity
        state["last"] = cursor
    elif op == "edit_cursor":  # the caller edits the index extend returned (the last cursor)
        cursor = state.get("last")
        if cursor is not None and cursor.numel():
            cursor[-1] = data.draw(st.integers(0, capacity - 1), label="row")
    elif op == "add":  # RoundRobinWriter.add
        storage.set(state["cursor"], td(1)[0])
        state["cursor"] = (state["cursor"] + 1) % capacity
    elif op == "burst":  # more writes than the journal holds
        for _ in range(data.draw(st.integers(60, 70), label="burst")):
            storage.set(state["cursor"], td(1)[0])
            state["cursor"] = (state["cursor"] + 1) % capacity
    elif op == "slice":
        a = data.draw(st.integers(0, capacity - 1), label="a")
        b = data.draw(st.integers(a + 1, capacity), label="b")
        storage.set(slice(a, b), td(b - a))
    elif op == "range":
        a = data.draw(st.integers(0, capacity - 1), label="a")
        n = data.draw(st.integers(1, capacity - a), label="n")
        storage.set(range(a, a + n), td(n))
    elif op in ("random", "setitem"):
        index = data.draw(
            st.lists(st.integers(-capacity, capacity - 1), min_size=1, max_size=capacity),
            label="index",
        )
        kind = data.draw(st.sampled_from(["tensor", "list", "array"]), label="kind")
        cursor = {"tensor": torch.tensor, "list": list, "array": np.array}[kind](index)
        if op == "setitem":
            storage[cursor] = td(len(index))
        else:
            storage.set(cursor, td(len(index)), set_cursor=data.draw(st.booleans()))
    elif op == "mask":
        mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=capacity,
                                               max_size=capacity), label="mask"))
        storage.set(mask, td(int(mask.sum())), set_cursor=data.draw(st.booleans()))
    elif op == "fail":  # an index out of range: the write raises
        with pytest.raises(IndexError):
            storage.set(torch.tensor([0, capacity + 2]), td(2))
    elif op == "empty":  # ReplayBuffer.empty
        storage._empty()
    elif op == "load":
        donor = make_storage(type(storage).__name__, capacity)
        n = data.draw(st.integers(1, capacity), label="n")
        donor.set(torch.arange(n), td(n))
        storage.load_state_dict(donor.state_dict())


@pytest.mark.parametrize("end_shape", ["[N, 1]", "[N]"])
@pytest.mark.parametrize("cls_name", STORAGES)
@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data())
def test_bounds_match_full_read(cls_name, end_shape, data):
    capacity = data.draw(st.integers(1, 50), label="capacity")
    dtype = data.draw(st.sampled_from([torch.bool, torch.bool, torch.uint8, torch.float32]))
    storage = make_storage(cls_name, capacity)
    every_write = TrajectoryEnds(KEY)  # checked after every write
    now_and_then = TrajectoryEnds(KEY)  # misses some writes, then catches up
    state = {"cursor": 0}
    assert every_write.bounds(storage) is None  # not initialized yet
    for _ in range(data.draw(st.integers(1, 12), label="steps")):
        op = data.draw(st.sampled_from(OPS), label="op")
        if not storage.initialized and op in ("mask", "fail", "empty", "load"):
            op = "extend"
        _apply(data, storage, op, capacity, state,
               lambda n: make_td(_draw_done(data, n, dtype), end_shape))
        check(every_write, storage)
        if data.draw(st.booleans(), label="check now_and_then"):
            check(now_and_then, storage)
    check(now_and_then, storage)


# -----------------------------------------------------------------------------
# cost: rows read
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("cls_name", STORAGES)
def test_a_write_of_k_rows_reads_k_rows(cls_name):
    capacity = 10_000
    rng = np.random.default_rng(0)
    storage = make_storage(cls_name, capacity)
    ends = CountingEnds(KEY)
    cursor = 0
    for _ in range(10):
        index = torch.arange(cursor, cursor + 1000) % capacity
        storage.set(index, make_td(rng.random(1000) < 0.01))
        cursor += 1000
    check(ends, storage)
    assert ends.scanned == capacity and ends.read == 0
    for k in (1, 7, 300, 1, 2500):
        before = ends.read
        index = torch.arange(cursor, cursor + k) % capacity  # wraps around the end
        storage.set(index, make_td(rng.random(k) < 0.05))
        cursor += k
        check(ends, storage)
        assert ends.read - before == k
    # several writes between two calls: each row once
    before = ends.read
    storage.set(torch.arange(10, 20), make_td(rng.random(10) < 0.5))
    storage.set(15, make_td(torch.tensor([True]))[0])
    storage[torch.tensor([18, 18, 40])] = make_td(torch.tensor([False, True, True]))
    check(ends, storage)
    assert ends.read - before == 11
    # nothing written: nothing read
    before = ends.read
    check(ends, storage)
    assert ends.read == before
    assert ends.scanned == capacity


def test_a_write_through_a_mask_reads_the_rows_it_selects():
    capacity = 200
    rng = np.random.default_rng(2)
    storage = filled("LazyTensorStorage", capacity, rng.random(capacity) < 0.05)
    ends = CountingEnds(KEY)
    check(ends, storage)
    mask = torch.from_numpy(rng.random(capacity) < 0.1)
    count = int(mask.sum())
    before = ends.read
    storage.set(mask, make_td(rng.random(count) < 0.5))
    check(ends, storage)
    # the selected rows, not another scan of the whole signal
    assert ends.read - before == count
    assert ends.scanned == capacity


@pytest.mark.parametrize("from_ids", [False, True])
def test_round_robin_runs_read_each_row_once(from_ids):
    capacity = 1000
    key = IDS_KEY if from_ids else KEY
    rng = np.random.default_rng(1)
    storage = make_storage("LazyTensorStorage", capacity)
    episode = {"id": 0}

    def batch(n):
        done = torch.from_numpy(rng.random(n) < 0.05)
        if not from_ids:
            return make_td(done)
        ids = episode["id"] + torch.cumsum(done.long(), 0)
        episode["id"] = int(ids[-1]) if n else episode["id"]
        return TensorDict({IDS_KEY: ids, "obs": torch.randn(n, 2)}, [n])

    storage.set(torch.arange(capacity), batch(capacity))
    ends = CountingEnds(key, from_ids=from_ids)
    checker = check_ids if from_ids else check
    checker(ends, storage)
    assert ends.scanned == capacity and ends.read == 0
    cursor = 0
    for k in (1, 7, 300, 990, 1000):  # the 990 and 1000 rows wrap around the end
        index = torch.arange(cursor, cursor + k) % capacity
        assert write_rows(storage, cursor, index, batch(k))
        assert storage._writes_since(ends._count)[1] == [RowRun(cursor, k)]
        before, runs = ends.read, ends.runs
        checker(ends, storage)
        cursor = (cursor + k) % capacity
        pieces = 1 + (index[-1] < index[0]).item() if k < capacity else 2 - (index[0] == 0).item()
        assert ends.runs - runs == pieces
        # ids: the pairs (t, t + 1) a run of rows touches, one more per piece (none before row 0)
        assert ends.read - before <= k + (pieces if from_ids else 0)
        assert ends.read - before >= k - (2 if from_ids else 0)
    # several runs between two calls: each merged in turn
    for k in (5, 6):
        index = torch.arange(cursor, cursor + k) % capacity
        assert write_rows(storage, cursor, index, batch(k))
        cursor += k
    runs = ends.runs
    checker(ends, storage)
    assert ends.runs - runs == 2
    # more runs than are merged one by one: the rows are listed and merged at once
    before, runs = ends.read, ends.runs
    for _ in range(te_module._MAX_RUNS + 1):
        index = torch.arange(cursor, cursor + 3) % capacity
        assert write_rows(storage, cursor, index, batch(3))
        cursor += 3
    checker(ends, storage)
    assert ends.runs == runs and ends.read > before
    assert ends.scanned == capacity


def test_last_cursor_row_is_read_from_the_write_unless_edited():
    capacity = 20
    storage = filled("LazyTensorStorage", capacity, torch.arange(capacity) % 6 == 5)
    ends = TrajectoryEnds(KEY)
    index = torch.arange(5, 8)
    assert write_rows(storage, 5, index, make_td(torch.tensor([False, True, False])))
    assert storage._last_cursor_row(index) is None  # nobody follows the writes yet
    check(ends, storage)
    index = torch.arange(15, 25) % capacity
    assert write_rows(storage, 15, index, make_td(torch.arange(10) % 4 == 0))
    assert storage._last_cursor is index and storage._last_cursor_row(index) == 4
    check(ends, storage)
    assert ends.stops(storage)[3] == (4,)
    index[-1] = 9  # edited in place: read from the tensor up to 0.13, taken at the write from 0.14
    assert storage._last_cursor_row(index) is None
    check(ends, storage)
    assert ends.stops(storage)[3] == ((4,) if since("slice_mutation_revision") else (9,))
    # another cursor set by hand is read as it is
    storage._last_cursor = torch.arange(15, 25) % capacity
    assert storage._last_cursor_row(storage._last_cursor) is None
    check(ends, storage)
    # inference tensors have no version counter: nothing remembered
    with torch.inference_mode():
        index = torch.arange(0, 3)
    assert write_rows(storage, 0, index, make_td(torch.tensor([False, True, False])))
    assert storage._last_cursor_row(index) is None
    check(ends, storage)


def test_stops_give_the_bounds():
    storage = filled("LazyTensorStorage", 30, torch.arange(30) % 7 == 3)
    ends = TrajectoryEnds(KEY)
    for step in range(5):
        index = torch.arange(step * 9, step * 9 + 9) % 30
        write_rows(storage, (step * 9) % 30, index, make_td(torch.arange(9) % (step + 2) == 0))
        got = check(ends, storage)
        stops = ends.stops(storage)
        expected = replay.bounds_from_ends(*stops)
        assert all(torch.equal(a, torch.from_numpy(b)) for a, b in zip(got, expected))
        assert replay.bounds_summary(*stops) == (got[2].numel(), int(got[2].min()))


def test_full_reads_happen_when_needed():
    storage = filled("LazyTensorStorage", 20, torch.arange(12) % 5 == 4)
    ends = CountingEnds(KEY)
    read = 0

    def check_full_read(storage):
        # a full read reads the filled rows, not the whole capacity
        nonlocal read
        check(ends, storage)
        read += min(len(storage), storage.max_size)
        assert ends.scanned == read

    check_full_read(storage)
    assert read == 12
    for _ in range(70):  # more than the journal holds
        storage.set(3, make_td(torch.tensor([True]))[0])
    check_full_read(storage)
    storage._empty()
    storage.set(torch.arange(3), make_td(torch.tensor([False, True, False])))
    check_full_read(storage)
    # the data replaced behind the storage's back: a new end tensor
    storage._storage = storage._storage.clone()
    storage._storage[KEY][5] = True
    check_full_read(storage)
    # the length decreased without a recorded write
    storage._len = 2
    check_full_read(storage)
    # another storage
    other = filled("LazyTensorStorage", 20, torch.arange(20) % 3 == 0)
    check_full_read(other)
    check(ends, other)
    assert ends.scanned == read


def test_results_are_shared_until_the_next_write():
    done = torch.arange(10) % 4 == 1
    storage = filled("LazyTensorStorage", 10, done)  # full, last cursor at row 9
    ends = TrajectoryEnds(KEY)
    first = check(ends, storage)
    # nothing written: the same tensors, as SliceSampler's cache gives them
    assert all(a is b for a, b in zip(first, ends.bounds(storage)))
    # rows rewritten with what they held, same cursor row: still the same
    storage.set(torch.tensor([8, 9]), make_td(done[8:]))
    assert all(a is b for a, b in zip(first, check(ends, storage)))
    # a new end: new tensors, the old ones untouched
    before = [t.clone() for t in first]
    storage.set(torch.tensor([2, 9]), make_td(torch.tensor([True, False])))
    second = check(ends, storage)
    assert all(a is not b for a, b in zip(first, second))
    assert all(torch.equal(a, b) for a, b in zip(first, before))


# -----------------------------------------------------------------------------
# writes made in other processes
# -----------------------------------------------------------------------------
def _child_write(storage, start, done):
    storage.set(torch.arange(start, start + len(done)), make_td(torch.tensor(done)))


def _shared(cls_name, tmp_path, capacity, done):
    kwargs = {"scratch_dir": tmp_path / "mm"} if cls_name == "LazyMemmapStorage" else {}
    storage = filled(cls_name, capacity, done, **kwargs)
    if cls_name == "LazyTensorStorage":
        storage._storage.share_memory_()  # a forked child writes into shared pages only
    return storage


def _run(context, target, args):
    process = context.Process(target=target, args=args)
    process.start()
    process.join(JOIN_TIMEOUT)
    if process.is_alive():
        process.kill()
        process.join(5)
        pytest.fail(f"child process {process.pid} did not finish within {JOIN_TIMEOUT}s")
    assert process.exitcode == 0


@pytest.mark.parametrize("cls_name", STORAGES)
def test_forked_child_write_is_seen(tmp_path, cls_name):
    storage = _shared(cls_name, tmp_path, 20, [False, False, True] + [False] * 9)
    ends = CountingEnds(KEY)
    check(ends, storage)
    count = ends._count
    _run(mp.get_context("fork"), _child_write, (storage, 12, [False, False, True, False]))
    assert len(storage) == 16
    now, cursors = storage._writes_since(count)
    assert now == count + 1 and cursors is None  # not in this process's journal
    got = check(ends, storage)
    assert ends.scanned == 12 + 16  # the filled rows, twice
    assert 14 in got[1].flatten().tolist()
    # the parent's own writes are followed again afterwards
    storage.set(torch.arange(16, 18), make_td(torch.tensor([True, False])))
    check(ends, storage)
    assert ends.scanned == 28 and ends.read == 2


def test_spawned_child_write_is_counted(tmp_path):
    storage = _shared("LazyTensorStorage", tmp_path, 20, [False, True, False])
    ends = CountingEnds(KEY)
    check(ends, storage)
    count = ends._count
    _run(mp.get_context("spawn"), _child_write, (storage, 3, [False, True]))
    assert storage._writes_since(count) == (count + 1, None)
    got = check(ends, storage)
    assert ends.scanned == 3 + 5  # the filled rows, twice
    assert got[1].flatten().tolist() == [1, 4]


def test_plain_pickle_gets_its_own_counter():
    storage = filled("LazyTensorStorage", 10, [False, True, False])
    now = storage._writes_since(None)[0]
    copy = pickle.loads(pickle.dumps(storage))
    assert copy._writes_since(None)[0] == now
    assert copy._writes_since(now) == (now, [])
    cursor = torch.arange(3, 5)
    storage.set(cursor, make_td(torch.tensor([True, False])))
    assert as_lists(storage._writes_since(now)) == (now + 1, [[3, 4]])
    assert copy._writes_since(now) == (now, [])
    copy.set(2, make_td(torch.tensor([True]))[0])
    assert copy._writes_since(now) == (now + 1, [2])
    ends = TrajectoryEnds(KEY)
    check(ends, copy)
    check(ends, storage)
    # a tracker pickles without its storage and starts over
    clone = pickle.loads(pickle.dumps(ends))
    assert clone.end_key == KEY and clone._count is None
    check(clone, storage)
    by_ids = pickle.loads(pickle.dumps(TrajectoryEnds(IDS_KEY, from_ids=True)))
    assert by_ids.end_key == IDS_KEY and by_ids.from_ids is True
    # a tracker pickled before ``from_ids`` existed reads done flags
    older = TrajectoryEnds.__new__(TrajectoryEnds)
    older.__setstate__({"end_key": KEY})
    assert older.end_key == KEY and older.from_ids is False


# -----------------------------------------------------------------------------
# the write journal
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("cls_name", STORAGES)
def test_journal_lists_cursors_in_order(cls_name):
    storage = make_storage(cls_name, 30)
    assert storage._writes_since(None) == (0, None)
    first = torch.arange(4)
    storage.set(first, make_td(torch.zeros(4, dtype=torch.bool)))
    now = storage._writes_since(None)[0]
    # one count for the write, as torchrl 0.14's mutation revision: the storage held nothing
    # before it was initialized, so the rows written are all there is to read
    assert now == 1
    assert as_lists(storage._writes_since(0)) == (1, [[0, 1, 2, 3]])
    cursors = [slice(2, 5), range(3, 6), [1, 2], np.array([7]), 9, torch.tensor([8, 8])]
    for cursor in cursors[:-2]:
        n = len(range(30)[cursor]) if isinstance(cursor, slice) else len(cursor)
        storage.set(cursor, make_td(torch.zeros(n, dtype=torch.bool)))
    storage.set(cursors[-2], make_td(torch.zeros(1, dtype=torch.bool))[0], set_cursor=False)
    storage[cursors[-1]] = make_td(torch.zeros(2, dtype=torch.bool))
    since, listed = storage._writes_since(now)
    assert since == now + len(cursors)
    assert len(listed) == len(cursors)
    # copies of the indices (lists become arrays)
    assert all(
        a == b if isinstance(b, (int, slice, range)) else np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(listed, cursors)
    )
    assert storage._writes_since(since) == (since, [])
    assert storage._writes_since(since + 1) == (since, None)  # a count from elsewhere


def test_journal_is_bounded():
    storage = filled("LazyTensorStorage", 1000, torch.zeros(10, dtype=torch.bool))
    now = storage._writes_since(None)[0]
    for i in range(100):
        storage.set(i, make_td(torch.tensor([False]))[0])
    assert storage._writes_since(now) == (now + 100, None)
    since, cursors = storage._writes_since(now + 36)
    assert since == now + 100 and cursors == list(range(36, 100))
    # the index tensors held add up to at most max_size rows
    small = filled("LazyTensorStorage", 10, torch.zeros(2, dtype=torch.bool))
    now = small._writes_since(None)[0]
    for _ in range(3):
        small.set(torch.arange(6), make_td(torch.zeros(6, dtype=torch.bool)))
    assert small._writes_since(now + 1) == (now + 3, None)
    assert len(small._writes_since(now + 2)[1]) == 1
    assert small.__dict__["_journal"].rows == 6


@pytest.mark.parametrize("cls_name", STORAGES)
def test_wholesale_changes_are_unknown_writes(tmp_path, cls_name):
    storage = filled(cls_name, 10, [False, True, False, True])
    donor = filled(cls_name, 10, [True] * 7)

    def unknown_after(change):
        now = storage._writes_since(None)[0]
        change()
        since, cursors = storage._writes_since(now)
        assert since > now and cursors is None
        # later writes are journalled again
        storage.set(0, make_td(torch.tensor([False]))[0])
        assert storage._writes_since(since) == (since + 1, [0])

    unknown_after(storage._empty)
    unknown_after(lambda: storage.load_state_dict(donor.state_dict()))
    donor.dumps(tmp_path / "ckpt")
    unknown_after(lambda: storage.loads(tmp_path / "ckpt"))

    def failing_write():
        with pytest.raises(IndexError):
            storage.set(torch.tensor([1, 12]), make_td(torch.tensor([True, True])))

    unknown_after(failing_write)
    ends = TrajectoryEnds(KEY)
    check(ends, storage)


def test_compilable_storage_counts_in_a_tensor():
    # (a 0-d tensor counted in place: torch.compile neither guards on it nor recompiles)
    storage = ours.LazyTensorStorage(8, compilable=True)
    storage._writes_since(None)  # a reader follows from the start
    storage.set(torch.arange(3), make_td(torch.tensor([False, True, False])))
    counter = storage.__dict__["_writes_value"]
    assert isinstance(counter, torch.Tensor) and int(counter) == 1 == storage._mutation_revision
    assert as_lists(storage._writes_since(0)) == (1, [storage._last_cursor.tolist()])
    copy = pickle.loads(pickle.dumps(storage))
    assert isinstance(copy.__dict__["_writes_value"], torch.Tensor) and copy._mutation_revision == 1
    copy.set(torch.arange(3, 5), make_td(torch.tensor([False, True])))
    assert (copy._mutation_revision, storage._mutation_revision) == (2, 1)
    check(TrajectoryEnds(KEY), storage)


# -----------------------------------------------------------------------------
# cursors and unsupported storages
# -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cursor",
    [7, -1, np.int64(3), torch.tensor([2, 9]), range(4, 8), range(0), slice(0, 10), [1, 2],
     torch.tensor(5), torch.tensor([]), 10, torch.tensor([1.0])],
    ids=repr,
)
def test_full_storage_cursor_kinds(cursor):
    storage = filled("LazyTensorStorage", 10, torch.arange(10) % 4 == 0)
    storage._last_cursor = cursor
    check(TrajectoryEnds(KEY), storage)


def test_storage_built_on_data():
    done = torch.arange(12) % 5 == 2
    storage = ours.TensorStorage(make_td(done))
    ends = CountingEnds(KEY)
    check(ends, storage)  # full, no cursor: the last trajectory runs on to the first row
    storage.set(torch.tensor([11, 0]), make_td(torch.tensor([True, False])))
    check(ends, storage)
    assert ends.scanned == 12 and ends.read == 2


def test_length_set_past_the_capacity():
    storage = filled("LazyTensorStorage", 10, torch.arange(10) % 4 == 1)
    storage._len = 13  # by hand: the full read takes the 10 rows, not at capacity
    check(TrajectoryEnds(KEY), storage)


def test_unsupported_storages():
    td = make_td(torch.tensor([False, True, False]))
    theirs = trl.LazyTensorStorage(10)
    theirs.set(torch.arange(3), td)
    two_dim = ours.LazyTensorStorage(12, ndim=2)
    two_dim_done = torch.zeros(3, 4, 1, dtype=torch.bool)
    two_dim.set(torch.arange(3), TensorDict({KEY: two_dim_done}, [3, 4]))
    plain = ours.LazyTensorStorage(10)
    plain.set(torch.arange(3), torch.zeros(3, 2))
    wide = ours.LazyTensorStorage(10)
    wide.set(torch.arange(3), TensorDict({KEY: torch.zeros(3, 2, dtype=torch.bool)}, [3]))
    bf16 = ours.LazyTensorStorage(10)
    bf16.set(torch.arange(3), TensorDict({KEY: torch.zeros(3, 1, dtype=torch.bfloat16)}, [3]))
    listed = ours.ListStorage(10)
    listed.set(0, td[0])
    for storage in (theirs, two_dim, plain, listed, ours.LazyTensorStorage(10)):
        assert not TrajectoryEnds.supports(storage)
        assert TrajectoryEnds(KEY).bounds(storage) is None
    for storage in (wide, bf16):
        assert TrajectoryEnds.supports(storage)
        ends = TrajectoryEnds(KEY)
        assert ends.bounds(storage) is None and not ends.update(storage)
    ok = filled("LazyTensorStorage", 10, [False, True, False])
    assert TrajectoryEnds(KEY).update(ok)
    with pytest.raises(KeyError):
        TrajectoryEnds(("next", "missing")).bounds(ok)
    # a storage of length 1: the full read raises, bounds defers to it
    one = filled("LazyTensorStorage", 10, [True])
    assert TrajectoryEnds(KEY).bounds(one) is None
    with pytest.raises(IndexError):
        reference(one)


def test_docstring_examples_run():
    result = doctest.testmod(te_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 5 and result.failed == 0


# -----------------------------------------------------------------------------
# trajectory ids
# -----------------------------------------------------------------------------
IDS_KEY = "episode"
IDS_OPS = ["extend", "extend", "extend", "add", "slice", "random", "empty", "burst", "rows", "rows"]


def reference_ids(storage):
    """What SliceSampler computes from the whole id signal (``traj_key``)."""
    return replay.find_start_stop_traj(
        trajectory=storage[:][IDS_KEY],
        at_capacity=storage._is_full,
        # torchrl 0.14 reads the time coordinate taken at the write
        cursor=storage._last_cursor_index if since("slice_mutation_revision") else storage._last_cursor,
    )


def check_ids(ends, storage):
    # None only where the full path gives no trajectory (one-step storages) or its cursor rules
    return check(ends, storage, reference_ids, lambda st: len(st) < 2 or st._is_full)


@pytest.mark.parametrize("cls_name", STORAGES)
@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data())
def test_bounds_from_ids_match_full_read(cls_name, data):
    capacity = data.draw(st.integers(1, 40), label="capacity")
    storage = make_storage(cls_name, capacity)
    every_write = TrajectoryEnds(IDS_KEY, from_ids=True)
    now_and_then = TrajectoryEnds(IDS_KEY, from_ids=True)
    state = {"cursor": 0, "episode": 0}

    def td(n):
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
        p = data.draw(st.sampled_from([0.0, 0.2, 0.7]), label="p")
        # ids grow by one at each new episode, and come back after wrapping
        steps = rng.random(n) < p
        ids = state["episode"] + np.cumsum(steps)
        state["episode"] = int(ids[-1]) if n else state["episode"]
        return TensorDict({IDS_KEY: torch.as_tensor(ids % 7), "obs": torch.randn(n, 2)}, [n])

    for _ in range(data.draw(st.integers(1, 12), label="steps")):
        op = data.draw(st.sampled_from(IDS_OPS), label="op")
        if not storage.initialized and op == "empty":
            op = "extend"
        _apply(data, storage, op, capacity, state, td)
        if op == "empty":
            state["cursor"] = 0
        check_ids(every_write, storage)
        if data.draw(st.booleans(), label="check now_and_then"):
            check_ids(now_and_then, storage)
    check_ids(now_and_then, storage)


def test_ids_write_reads_only_neighbouring_pairs():
    capacity = 1000
    storage = make_storage("LazyTensorStorage", capacity)
    ids = torch.arange(capacity) // 10
    storage.set(torch.arange(capacity), TensorDict({IDS_KEY: ids}, [capacity]))

    ends = CountingEnds(IDS_KEY, from_ids=True)
    check_ids(ends, storage)
    assert ends.scanned == capacity and ends.read == 0
    storage.set(torch.arange(995, 1005) % capacity, TensorDict({IDS_KEY: torch.full((10,), 500)}, [10]))
    check_ids(ends, storage)
    # pairs (t, t + 1) named by t: 994..998 and 0..4 (row 999 vs row 0 is read apart)
    assert ends.scanned == capacity and ends.read == 10
    before = ends.read
    check_ids(ends, storage)
    assert ends.read == before
    assert ends.bounds(storage) is ends.bounds(storage)  # nothing written: the same tensors


def test_ids_of_shape_n1_are_left_to_the_full_read():
    storage = make_storage("LazyTensorStorage", 10)
    storage.set(torch.arange(10), TensorDict({IDS_KEY: (torch.arange(10) // 3).unsqueeze(-1)}, [10]))
    assert TrajectoryEnds(IDS_KEY, from_ids=True).bounds(storage) is None


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 40), data=st.data())
def test_pairs_touched_and_written_rows_match_plain_numpy(size, data):
    rows = np.array(data.draw(st.lists(st.integers(-size, size - 1), max_size=30)), dtype=np.int64)
    cursors = [torch.as_tensor(rows), list(range(0, size, 3)), data.draw(st.integers(-size, size - 1))]
    written = te_module._written_rows(cursors, size)
    model = np.unique(np.concatenate([rows % size, np.arange(0, size, 3), [cursors[2] % size]]))
    np.testing.assert_array_equal(written, model.astype(np.int64))
    both = np.concatenate((written - 1, written))
    expected = np.unique(both[(both >= 0) & (both < size - 1)])
    np.testing.assert_array_equal(te_module._pairs_touched(written, size), expected)
    assert te_module._written_rows([torch.tensor([size])], size) is None
    assert te_module._written_rows([torch.tensor([-size - 1, 0])], size) is None


# -----------------------------------------------------------------------------
# the full scan
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("block", [3, 1 << 20])
@pytest.mark.parametrize(
    "key, values, from_ids",
    [
        # dtypes replay.scan_ends does not read: numpy scans them a block at a time
        (KEY, lambda n: torch.tensor([0, 1j, 0, -0.0, 2, 0, 0, 1, 0, 0, 0, 3])[:n].unsqueeze(-1), False),
        (IDS_KEY, lambda n: (torch.arange(n) // 2).double().neg().add(0.5), True),
        # and those it reads, for comparison
        (KEY, lambda n: (torch.arange(n) % 3 == 1).unsqueeze(-1), False),
        (IDS_KEY, lambda n: torch.arange(n) // 3, True),
    ],
    ids=["complex-done", "float-ids", "bool-done", "int-ids"],
)
@pytest.mark.parametrize("n", [0, 1, 2, 7, 12])
def test_full_scan_of_every_dtype_matches_the_full_read(monkeypatch, block, key, values, from_ids, n):
    monkeypatch.setattr(te_module, "_SCAN_BLOCK", block)
    storage = make_storage("LazyTensorStorage", 12)
    storage.set(torch.arange(12), TensorDict({key: values(12)}, [12]))
    if n < 12:  # a storage not full: the rows written after the first 12 are the reads' limit
        storage = make_storage("LazyTensorStorage", 12)
        if n:
            storage.set(torch.arange(n), TensorDict({key: values(n)}, [n]))
    if not storage.initialized:
        return
    ends = TrajectoryEnds(key, from_ids=from_ids)
    if from_ids:
        check_ids(ends, storage)
    else:
        check(ends, storage)
    signal = te_module._signal_view(storage._storage.get(key), 12)
    expected = np.flatnonzero(signal[:-1] != signal[1:]) if from_ids else np.flatnonzero(signal)
    np.testing.assert_array_equal(ends._scan(signal), expected)


def test_full_scan_copies_nothing_of_the_column_size():
    # the first sample after a fill reads the whole column: at 2^22 int64 ids (32 MiB), a copy
    # or a temporary of its size (the comparison of neighbours: 4 MiB of bools) shows in numpy's
    # traced allocations; the ends themselves (here 2^22 / 1000 rows) are all that is made
    import tracemalloc

    capacity = 1 << 22
    storage = make_storage("LazyTensorStorage", capacity)
    ids = torch.arange(capacity) // 1000
    done = (torch.arange(capacity) % 1000 == 999).unsqueeze(-1)
    storage.set(torch.arange(capacity), TensorDict({IDS_KEY: ids, KEY: done}, [capacity]))
    for key, from_ids in [(IDS_KEY, True), (KEY, False)]:
        ends = TrajectoryEnds(key, from_ids=from_ids)
        tracemalloc.start()
        try:
            assert ends.update(storage)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert ends._ends.size == capacity // 1000
        assert peak < capacity // 8, f"{key}: {peak} bytes allocated by the scan of {capacity} rows"


@pytest.mark.parametrize("from_ids", [False, True])
def test_rows_past_the_length_are_read_once_the_length_reaches_them(from_ids):
    # a storage of 2^20 rows filled to 1,000: the first read reads 1,000 rows (not 2^20), each
    # write after it its own rows once (the growth of the length reads nothing twice)
    capacity = 1 << 20
    storage = make_storage("LazyTensorStorage", capacity)
    key = IDS_KEY if from_ids else KEY
    checker = check_ids if from_ids else check

    def rows(start, n):
        step = torch.arange(start, start + n)
        value = step // 7 if from_ids else (step % 7 == 6).unsqueeze(-1)
        return TensorDict({key: value}, [n])

    storage.set(torch.arange(1000), rows(0, 1000))
    ends = CountingEnds(key, from_ids=from_ids)
    checker(ends, storage)
    assert ends.scanned == 1000 and ends.read == 0
    storage.set(torch.arange(1000, 1100), rows(1000, 100))  # an index tensor: rows listed
    checker(ends, storage)
    assert write_rows(storage, 1100, torch.arange(1100, 1150), rows(1100, 50))  # a round-robin run
    checker(ends, storage)
    # the rows written, once (ids: the pairs of rows, the first of each write's shared with
    # the row before it, the last's read when the length grows past it)
    assert ends.scanned == 1000 and ends.read == 150
    # rows written past the length (by hand), then the length set over them
    storage.set(torch.arange(2000, 2010), rows(1150, 10), set_cursor=False)
    storage._len = 2100
    checker(ends, storage)
    assert ends.scanned == 1000 and ends.read == 150 + 950


def test_a_length_set_lower_then_higher_by_hand_reads_the_rows_again():
    # a full read after the length decreased covers the new length only: when the length is
    # set higher again, the rows between are read again (not taken as read before)
    storage = filled("LazyTensorStorage", 20, torch.arange(20) % 3 == 0)
    ends = TrajectoryEnds(KEY)
    check(ends, storage)
    storage._len = 2
    check(ends, storage)
    storage._len = 12
    check(ends, storage)


def test_repr_names_the_class_the_key_and_the_number_of_ends():
    storage = filled("LazyTensorStorage", 6, [False, True, False, True, False, False])
    ends = TrajectoryEnds(KEY)
    assert repr(ends) == "TrajectoryEnds(end_key=('next', 'done'), num_ends=0)"
    ends.update(storage)
    assert repr(ends) == "TrajectoryEnds(end_key=('next', 'done'), num_ends=2)"
    assert repr(CountingEnds("done")) == "CountingEnds(end_key='done', num_ends=0)"


def followed_after_a_full_read(capacity, rng, end_rate=0.2):
    """A filled storage with random ends, and a ``CountingEnds`` that has read it once, in full."""
    storage = filled("LazyTensorStorage", capacity, rng.random(capacity) < end_rate)
    ends = CountingEnds(KEY)
    check(ends, storage)
    assert ends.scanned == capacity and ends.read == 0
    return storage, ends


def test_more_runs_than_merged_one_by_one_read_their_rows_only():
    """Past ``_MAX_RUNS`` runs the rows are listed; runs starting at row 0, empty runs and a run
    over the whole capacity are listed like the others, never a reason for a full read."""
    capacity = 50
    rng = np.random.default_rng(3)
    storage, ends = followed_after_a_full_read(capacity, rng)

    def write_runs(runs):
        for start, k in runs:
            index = torch.arange(start, start + k) % capacity
            assert write_rows(storage, start, index, make_td(rng.random(k) < 0.3))
        assert len(storage._writes_since(ends._count)[1]) == len(runs) > te_module._MAX_RUNS

    write_runs([(0, 2), (10, 3), (13, 0), (20, 3), (30, 3)])
    before = ends.read
    check(ends, storage)
    assert ends.read - before == 2 + 3 + 3 + 3  # rows 0-1, 10-12, 20-22, 30-32
    assert ends.scanned == capacity
    write_runs([(5, 1), (7, capacity), (9, 1), (11, 1), (44, 1)])
    before = ends.read
    check(ends, storage)
    assert ends.read - before == capacity  # each row once
    assert ends.scanned == capacity


@pytest.mark.parametrize(
    "cursor, rows",
    [
        (7, [7]),
        (-3, [37]),
        (np.int32(5), [5]),
        (slice(2, 20, 3), [2, 5, 8, 11, 14, 17]),
        (slice(-6, None, 2), [34, 36, 38]),
        (range(1, 30, 7), [1, 8, 15, 22, 29]),
        (range(30, 10, -5), [30, 25, 20, 15]),
        ([4, 9, 4, -1], [4, 9, 39]),
        (np.array([12, 3, 3], dtype=np.int16), [3, 12]),
        (torch.tensor([-40, 0, 21]), [0, 21]),
        (torch.arange(40) % 9 == 0, [0, 9, 18, 27, 36]),
    ],
    ids=lambda value: type(value).__name__,
)
def test_a_write_at_any_index_reads_the_rows_it_names(cursor, rows):
    """Ints, slices, ranges, lists, numpy arrays and tensors (integer and bool) are followed
    row by row: each row they name is read once, and the signal is never read in full."""
    capacity = 40
    rng = np.random.default_rng(4)
    storage, ends = followed_after_a_full_read(capacity, rng)
    # the items the write takes, repeats included (repeated rows are read once)
    selected = torch.arange(capacity)[list(cursor) if isinstance(cursor, range) else cursor]
    data = make_td(rng.random(max(selected.numel(), 1)) < 0.5)
    storage.set(cursor, data if selected.ndim else data[0])
    check(ends, storage)
    assert ends.read == len(rows)
    assert ends.scanned == capacity


@pytest.mark.skipif(
    since("slice_mutation_revision"),
    reason="from torchrl 0.14 the last cursor is the time coordinate taken at the write, a "
    "tensor of its own, whose last element is read",
)
def test_a_full_storage_takes_its_last_row_from_the_write_without_reading_the_index(monkeypatch):
    """After a round-robin write the row that closes the storage is the one remembered at the
    write: O(1), the index tensor is not read (``_cursor_row`` is the fallback that reads it)."""
    capacity = 20
    storage = filled("LazyTensorStorage", capacity, torch.arange(capacity) % 6 == 5)
    ends = TrajectoryEnds(KEY)
    check(ends, storage)
    index = torch.arange(15, 25) % capacity
    assert write_rows(storage, 15, index, make_td(torch.arange(10) % 4 == 0))
    expected = reference(storage)

    def read_the_index(cursor, length):
        raise AssertionError("the index tensor was read")

    monkeypatch.setattr(te_module, "_cursor_row", read_the_index)
    assert ends.stops(storage)[3] == (4,)
    for mine, theirs in zip(ends.bounds(storage), expected):
        assert torch.equal(mine, theirs)
    # a write that ends at row 0
    monkeypatch.undo()
    index = torch.arange(5, 21) % capacity
    assert write_rows(storage, 5, index, make_td(torch.arange(16) % 5 == 0))
    expected = reference(storage)
    monkeypatch.setattr(te_module, "_cursor_row", read_the_index)
    assert ends.stops(storage)[3] == (0,)
    for mine, theirs in zip(ends.bounds(storage), expected):
        assert torch.equal(mine, theirs)


def test_an_end_tensor_given_other_memory_in_place_is_read_again():
    """The same tensor object pointed at other memory (``Tensor.set_``) is not the signal that
    was read: its numpy view is made again and the signal read in full."""
    capacity = 12
    storage = filled("LazyTensorStorage", capacity, torch.arange(capacity) % 4 == 3)
    ends = CountingEnds(KEY)
    check(ends, storage)
    done = storage._storage.get(KEY)
    done.set_((torch.arange(capacity) % 5 == 1).unsqueeze(-1))
    assert storage._storage.get(KEY) is done
    got = check(ends, storage)
    assert got[1].flatten().tolist() == [1, 6, 11]
    assert ends.scanned == 2 * capacity


def test_a_write_not_followed_that_grows_the_length_is_read_in_full():
    """A write at an index kind that is not followed row by row (a tuple) which also makes the
    storage longer: the signal is read again in full, the rows it grew over with it."""
    storage = filled("LazyTensorStorage", 10, torch.tensor([False, True, False, False]))
    ends = CountingEnds(KEY)
    check(ends, storage)
    assert ends.scanned == 4
    storage.set((torch.tensor([4, 5]),), make_td(torch.tensor([True, False])))
    assert len(storage) == 6
    got = check(ends, storage)
    assert got[1].flatten().tolist() == [1, 4, 5]
    assert ends.scanned == 4 + 6 and ends.read == 0


@pytest.mark.parametrize("ids", [[5, 6], [5, 5], [7, 3, 3], [2, 2, 9]])
@pytest.mark.parametrize("rewrite_first", [None, 8, 6])
def test_full_storages_of_two_and_three_ids_match_full_read(ids, rewrite_first):
    """The last filled row's id against the first one's, on the shortest full storages, with
    the last write at the last row or (rewriting row 0) at the first."""
    capacity = len(ids)
    storage = make_storage("LazyTensorStorage", capacity)

    def write(index, values):
        n = len(values)
        storage.set(index, TensorDict({IDS_KEY: torch.tensor(values), "obs": torch.randn(n, 2)}, [n]))

    write(torch.arange(capacity), ids)
    if rewrite_first is not None:
        write(torch.tensor([0]), [rewrite_first])
    assert storage._is_full
    ends = TrajectoryEnds(IDS_KEY, from_ids=True)
    got = check(ends, storage, reference_ids)
    assert got is not None


def test_exactly_as_many_runs_as_are_merged_one_by_one():
    capacity = 60
    rng = np.random.default_rng(5)
    storage, ends = followed_after_a_full_read(capacity, rng)
    for start in range(0, 4 * te_module._MAX_RUNS, 4):
        index = torch.arange(start, start + 3)
        assert write_rows(storage, start, index, make_td(rng.random(3) < 0.5))
    runs, before = ends.runs, ends.read
    check(ends, storage)
    assert ends.runs - runs == te_module._MAX_RUNS
    assert ends.read - before == 3 * te_module._MAX_RUNS


def test_an_empty_round_robin_write_reads_nothing():
    capacity = 30
    rng = np.random.default_rng(6)
    storage, ends = followed_after_a_full_read(capacity, rng)
    assert write_rows(storage, 7, torch.arange(7, 7), make_td(torch.zeros(0, dtype=torch.bool)))
    assert storage._writes_since(ends._count)[1] == [RowRun(7, 0)]
    check(ends, storage)
    assert ends.scanned == capacity and ends.read == 0


def test_a_round_robin_write_past_the_length_is_read_once_as_the_rows_grown_over():
    capacity = 30
    storage = make_storage("LazyTensorStorage", capacity)
    assert write_rows(storage, 0, torch.arange(10), make_td(torch.arange(10) % 3 == 2))
    ends = CountingEnds(KEY)
    check(ends, storage)
    assert ends.scanned == 10
    assert write_rows(storage, 10, torch.arange(10, 17), make_td(torch.arange(7) % 4 == 1))
    runs, before = ends.runs, ends.read
    check(ends, storage)
    assert ends.runs - runs == 1 and ends.read - before == 7
    assert ends.scanned == 10


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.uint8, torch.bool])
def test_round_robin_runs_of_any_end_dtype_match_full_read(dtype):
    """Runs read from an end signal that is not bool (nonzero is an end: 3, 0.5)."""
    capacity = 16
    rng = np.random.default_rng(7)
    storage = make_storage("LazyTensorStorage", capacity)

    def batch(n):
        done = torch.from_numpy(rng.random(n) < 0.3)
        value = {torch.int64: 3, torch.float32: 0.5, torch.uint8: 2, torch.bool: True}[dtype]
        return make_td(torch.where(done, torch.tensor(value, dtype=dtype), torch.tensor(0, dtype=dtype)))

    ends = CountingEnds(KEY)
    cursor = 0
    for k in (5, 9, 4, 7, 16, 3):
        index = (torch.arange(cursor, cursor + k) % capacity)
        assert write_rows(storage, cursor % capacity, index, batch(k))
        cursor += k
        check(ends, storage)
    assert ends.runs > 0


def test_one_row_written_into_an_emptied_storage_of_ids_reads_no_pair():
    storage = make_storage("LazyTensorStorage", 8)
    storage.set(torch.arange(4), TensorDict({IDS_KEY: torch.tensor([1, 1, 2, 2]), "obs": torch.randn(4, 2)}, [4]))
    storage._empty()  # as ReplayBuffer.empty() does
    ends = CountingEnds(IDS_KEY, from_ids=True)
    ends.update(storage)
    assert ends.scanned == 0
    assert write_rows(storage, 0, torch.arange(1), TensorDict({IDS_KEY: torch.tensor([3]), "obs": torch.randn(1, 2)}, [1]))
    ends.update(storage)
    # one row makes no pair (t, t + 1): nothing to read
    assert ends.runs == 0 and ends.read == 0 and ends.scanned == 0


def test_a_write_at_a_two_dim_index_tensor_reads_its_distinct_rows():
    capacity = 12
    rng = np.random.default_rng(8)
    storage, ends = followed_after_a_full_read(capacity, rng, end_rate=0.3)
    index = torch.tensor([[1, 2, 3], [7, 8, 2]])
    done = torch.tensor([[True, False, True], [False, True, False]]).unsqueeze(-1)
    storage.set(index, TensorDict({"obs": torch.randn(2, 3, 2), KEY: done}, [2, 3]))
    check(ends, storage)
    assert ends.read == 5 and ends.scanned == capacity


def test_an_end_key_naming_a_nested_tensordict_is_not_followed():
    storage = make_storage("LazyTensorStorage", 6)
    done = torch.zeros(4, 1, dtype=torch.bool)
    storage.set(torch.arange(4), TensorDict({"next": {"done": done}, "obs": torch.randn(4, 2)}, [4]))
    ends = TrajectoryEnds("next")
    assert ends.bounds(storage) is None
    assert not ends.update(storage)
