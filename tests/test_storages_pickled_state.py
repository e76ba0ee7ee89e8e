"""What a tensor storage's pickled state carries: plainly pickled, a copy with its own
length, write count and last cursor, the same as torchrl's copy; pickled for a spawned
process (checked in this process, through ``__getstate__`` / ``__setstate__``), the shared
counters themselves, so that the copy and the original see each other's writes."""
from __future__ import annotations

import pickle
import re

import pytest
import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers.storages as T

import torchrl_compat.storages as O
import torchrl_compat.storages.tensor as storage_tensor

from storage_support import refusals


def batch(n, seed=0):
    return TensorDict(
        {"obs": torch.arange(n, dtype=torch.float32) + 100 * seed, ("nested", "r"): torch.full((n, 2), seed)},
        batch_size=[n],
    )


def written_pair(cursors, cls="LazyTensorStorage", size=8, **kwargs):
    """Ours and torchrl's storage with the same writes made at ``cursors``."""
    out = []
    for ns in (O, T):
        store = getattr(ns, cls)(size, **kwargs)
        for seed, cursor in enumerate(cursors):
            n = len(range(size)[cursor]) if isinstance(cursor, slice) else (
                1 if isinstance(cursor, int) else len(cursor))
            data = batch(n, seed) if not isinstance(cursor, int) else batch(1, seed)[0]
            store.set(cursor, data)
        out.append(store)
    return out


def last_written(cursors, size):
    """The model of the last time coordinate: the last index of the last write."""
    cursor = cursors[-1]
    if isinstance(cursor, int):
        return cursor
    if isinstance(cursor, slice):
        return range(size)[cursor][-1]
    return int(torch.as_tensor(cursor).reshape(-1)[-1])


CURSORS = {
    "range": [range(3)],
    "tensor": [range(4), torch.tensor([5, 4])],
    "int": [range(2), 2],
    "slice": [slice(0, 3), slice(3, 5)],
}


@pytest.mark.parametrize("writes", list(CURSORS))
def test_plain_pickle_copies_length_rows_and_last_cursor_as_torchrl(writes):
    cursors = CURSORS[writes]
    ours, ref = written_pair(cursors)
    ours[torch.tensor([0, 1])]  # the tensor-index read path keeps views of the rows
    copy_o, copy_r = pickle.loads(pickle.dumps(ours)), pickle.loads(pickle.dumps(ref))
    assert len(copy_o) == len(copy_r) == len(ours)
    assert (copy_o[:] == copy_r[:]).all()
    assert copy_o._last_cursor_index == last_written(cursors, 8)
    assert ours._last_cursor_index == last_written(cursors, 8)
    lc_o, lc_r = copy_o._last_cursor, copy_r._last_cursor
    assert type(lc_o) is type(lc_r)
    assert (lc_o == lc_r).all() if isinstance(lc_o, torch.Tensor) else lc_o == lc_r
    # the copy counts the writes made before it was pickled: one a write
    assert copy_o._writes_since(None)[0] == ours._writes_since(None)[0] == len(cursors)


def test_plain_pickle_of_a_storage_never_written_keeps_no_last_cursor():
    data = batch(4)
    ours, ref = O.TensorStorage(data.clone()), T.TensorStorage(data.clone())
    assert len(ours) == 4  # its counters exist (made with the length)
    copy_o, copy_r = pickle.loads(pickle.dumps(ours)), pickle.loads(pickle.dumps(ref))
    assert copy_o._last_cursor is None and copy_r._last_cursor is None
    assert copy_o._last_cursor_index is None
    assert len(copy_o) == len(copy_r) == 4
    copy_o.set(2, batch(1, 3)[0])
    assert copy_o._last_cursor_index == 2 and ours._last_cursor_index is None


def test_plain_pickled_copy_counts_on_its_own():
    ours, ref = written_pair([range(3)])
    copy_o, copy_r = pickle.loads(pickle.dumps(ours)), pickle.loads(pickle.dumps(ref))
    for copy in (copy_o, copy_r):
        copy.set(torch.tensor([3, 4]), batch(2, 1))
    assert len(copy_o) == len(copy_r) == 5 and len(ours) == len(ref) == 3
    assert copy_o._writes_since(None)[0] == 2 and ours._writes_since(None)[0] == 1
    assert copy_o._last_cursor_index == 4 and ours._last_cursor_index == 2
    # the original goes on writing without touching the copy
    ours.set(torch.tensor([7]), batch(1, 2))
    assert len(ours) == 4 and len(copy_o) == 5
    assert ours._writes_since(None)[0] == 2 and copy_o._writes_since(None)[0] == 2
    assert ours._last_cursor_index == 7 and copy_o._last_cursor_index == 4
    # both counters of the copy take one lock, as those of a storage made here
    assert copy_o._writes_value.get_lock() is copy_o._len_value.get_lock()
    assert copy_o._last_cursor_value.get_lock() is copy_o._len_value.get_lock()


def test_plain_pickled_copy_reads_the_rows_it_writes():
    ours, ref = written_pair([range(4)])
    index = torch.tensor([1, 3])
    ours[index], ref[index]  # (ours keeps views of its rows for such reads)
    copy_o, copy_r = pickle.loads(pickle.dumps(ours)), pickle.loads(pickle.dumps(ref))
    for copy in (copy_o, copy_r):
        copy.set(index, batch(2, 5))
    # (the length counts the two items again: rows 4 and 5 were never written)
    for got, want in ((copy_o[index], copy_r[index]), (copy_o[:4], copy_r[:4])):
        assert (got == want).all()
    assert copy_o[index]["obs"].tolist() == [500.0, 501.0]
    assert ours[index]["obs"].tolist() == [1.0, 3.0]


def test_plain_pickled_copy_starts_without_the_journal():
    ours, _ = written_pair([range(2)])
    start, _ = ours._writes_since(None)  # following the writes from here
    ours.set(torch.tensor([2, 3]), batch(2, 1))
    now, cursors = ours._writes_since(start)
    assert [c.tolist() for c in cursors] == [[2, 3]]
    copy = pickle.loads(pickle.dumps(ours))
    # the writes before the copy was made are not known to it: it must read everything
    assert copy._writes_since(start) == (now, None)
    copy.set(torch.tensor([5]), batch(1, 2))
    assert copy._writes_since(None)[0] == now + 1


@pytest.mark.parametrize("pickled", ["plain", "deepcopy"])
def test_pickled_compilable_storage_keeps_length_and_write_count(pickled):
    import copy as copy_module

    ours, ref = written_pair([range(3), torch.tensor([3])], compilable=True)
    if pickled == "plain":
        copy_o, copy_r = pickle.loads(pickle.dumps(ours)), pickle.loads(pickle.dumps(ref))
    else:
        copy_o, copy_r = copy_module.deepcopy(ours), copy_module.deepcopy(ref)
    assert len(copy_o) == len(copy_r) == 4
    assert copy_o._writes_since(None)[0] == 2
    copy_o.set(torch.tensor([4, 5]), batch(2, 1))
    assert len(copy_o) == 6 and len(ours) == 4
    assert copy_o._writes_since(None)[0] == 3 and ours._writes_since(None)[0] == 2
    assert copy_o._last_cursor_index == 5


# ------------------------------------------------------- pickled for a spawned process


@pytest.fixture
def spawning(monkeypatch):
    monkeypatch.setattr(storage_tensor, "get_spawning_popen", lambda: object())


def spawned_copy(store):
    """What a spawned process unpickles, without the pickling itself (the counters are
    ``mp.Value`` objects, pickled only for a process start): the state goes to a new
    object's ``__setstate__`` as it is."""
    state = store.__getstate__()
    copy = type(store).__new__(type(store))
    copy.__setstate__(dict(state))
    return state, copy


def test_state_for_a_spawned_process_carries_the_shared_counters(spawning):
    ours, _ = written_pair([range(3)])
    state, copy = spawned_copy(ours)
    assert state["_len_value"] is ours._len_value
    assert state["_writes_value"] is ours._writes_value
    assert state["_last_cursor_value"] is ours._last_cursor_value
    # whatever cannot be pickled for a process start stays here
    for name in ("_len_shared", "_writes_shared", "_last_cursor_shared"):
        assert name not in state
        with pytest.raises(TypeError):
            pickle.dumps(getattr(ours, name))
    assert not any(k.endswith("__context") for k in state)
    # the copy writes into the counters the original reads
    copy.set(torch.tensor([3, 4]), batch(2, 1))
    assert len(ours) == len(copy) == 5
    assert ours._writes_since(None)[0] == copy._writes_since(None)[0] == 2
    assert ours._last_cursor_index == copy._last_cursor_index == 4
    ours.set(6, batch(1, 2)[0])
    assert len(copy) == 6 and copy._last_cursor_index == 6
    assert copy._writes_since(None)[0] == 3


def test_state_for_a_spawned_process_drops_this_process_caches(spawning):
    ours, _ = written_pair([range(4)])
    ours._writes_since(None)
    ours[torch.tensor([0, 1])]
    ours._note_rows_written(torch.tensor([4, 5]), 2, first_row=4)  # a round-robin write booked here
    assert {"_journal", "_leaf_array_views", "_last_run"} <= set(ours.__dict__)
    state, copy = spawned_copy(ours)
    for name in ("_journal", "_leaf_array_views", "_last_run", "_compiled_writes"):
        assert name not in state
    assert copy._last_cursor_row(ours.__dict__["_last_run"][0]) is None


def test_spawned_copy_of_an_unwritten_storage_is_refused_as_torchrl(spawning, monkeypatch):
    monkeypatch.setattr(T.tensor if hasattr(T, "tensor") else T, "get_spawning_popen", lambda: object())
    messages = refusals(RuntimeError, lambda family: family.LazyTensorStorage(3).__getstate__())
    assert "LazyTensorStorage" in messages[0]
    strip = lambda m: re.sub(r"<class '[\w.]+'>", "<class>", m)
    assert strip(messages[0]) == strip(messages[1])
    assert messages[0].startswith(
        f"Cowardly refusing to share a storage of type {type(O.LazyTensorStorage(3))} between processes"
    )


def test_spawned_copy_of_an_unwritten_shared_init_storage(spawning):
    store = O.LazyTensorStorage(3, shared_init=True)
    state = store.__getstate__()
    assert state["initialized"] is False and "_init_event" in state


@pytest.mark.parametrize("kind", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_spawned_copy_of_a_shared_init_storage_reads_what_the_first_writer_wrote(spawning, kind):
    # the copy was made before anything was written: its first read waits for the process
    # that initialized the storage and maps that process's rows
    store = getattr(O, kind)(4, shared_init=True)
    _, copy = spawned_copy(store)
    assert not copy.initialized
    store.set(torch.arange(3), batch(3))
    rows = copy.get(torch.tensor([0, 2]))
    assert copy.initialized
    assert torch.equal(rows["obs"], batch(3)["obs"][[0, 2]])
    store.set(torch.tensor([1]), batch(1, 7))
    assert torch.equal(copy.get(torch.tensor([1]))["obs"], batch(1, 7)["obs"])
    if kind == "LazyTensorStorage":
        store._cleanup_init_directory()


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("kind", ["tensordict", "tensor", "pytree"])
def test_spawned_copy_of_cpu_and_meta_storages_is_allowed(spawning, device, kind):
    data = batch(3).to(device)
    if kind == "tensor":
        data = data["obs"]
    elif kind == "pytree":
        data = {"obs": data["obs"], "r": (data["nested", "r"],)}
    store = O.TensorStorage(data)
    state = store.__getstate__()
    assert state["_storage"] is data


class OddDevice(torch.Tensor):
    """A tensor that says it lives on a device no process can share (neither CPU memory,
    nor CUDA, nor meta)."""

    @property
    def device(self):
        return torch.device("xpu")


def odd_leaf():
    return torch.zeros(3, 2).as_subclass(OddDevice)


def test_spawned_copy_of_a_storage_on_another_device_is_refused_as_torchrl(spawning, monkeypatch):
    monkeypatch.setattr(T.tensor if hasattr(T, "tensor") else T, "get_spawning_popen", lambda: object())
    messages = refusals(
        RuntimeError,
        lambda family: family.TensorStorage(
            TensorDict({"a": odd_leaf(), "b": torch.zeros(3)}, batch_size=[3])
        ).__getstate__(),
    )
    assert messages[0] == messages[1] == (
        "The storage must be place in shared memory or memmapped before being shared between processes."
    )


@pytest.mark.parametrize("kind", ["tensor", "pytree"])
def test_spawned_copy_of_tensor_and_pytree_storages_on_another_device_is_refused(spawning, kind):
    # torchrl means to raise the same error here (its check calls tree_map with its
    # arguments swapped, and fails with a TypeError for any tensor or pytree storage)
    data = odd_leaf() if kind == "tensor" else {"a": torch.zeros(3), "b": (odd_leaf(),)}
    store = O.TensorStorage(data)
    with pytest.raises(RuntimeError, match="^The storage must be place in shared memory or memmapped before being shared between processes.$"):
        store.__getstate__()


def test_spawned_copy_of_an_unwritten_tensor_storage_is_refused(spawning):
    # a TensorStorage made without data has no shared_init: torchrl's check then fails on
    # the missing attribute (AttributeError) instead of giving the error it means
    store = O.TensorStorage(None, max_size=3)
    assert not store.initialized
    with pytest.raises(RuntimeError, match="^Cowardly refusing to share a storage of type"):
        store.__getstate__()


def test_spawned_copy_of_a_plain_pickled_copy_shares_its_last_cursor(monkeypatch):
    # plainly pickled before any write, then sent on to a spawned process: the two see the
    # last cursor each other writes, as they see the length
    store = O.TensorStorage(batch(4))
    assert len(store) == 4 and store._last_cursor_index is None
    copy = pickle.loads(pickle.dumps(store))
    assert copy._last_cursor_index is None
    monkeypatch.setattr(storage_tensor, "get_spawning_popen", lambda: object())
    _, child = spawned_copy(copy)
    child.set(torch.tensor([1, 2]), batch(2, 1))
    assert copy._last_cursor_index == child._last_cursor_index == 2
    assert copy._writes_since(None)[0] == 1 and store._writes_since(None)[0] == 0
    assert store._last_cursor_index is None


def test_state_pickled_before_the_write_count_existed_counts_from_zero():
    # a storage pickled by an earlier release carries its length but no write count: it
    # loads, counts its writes from 0 and shares the new counter as it shares its length
    store, ref = written_pair([range(3)])
    state = store.__getstate__()
    del state["writes__context"]
    old = O.LazyTensorStorage.__new__(O.LazyTensorStorage)
    old.__setstate__(state)
    assert "_writes_value" not in old.__dict__
    assert len(old) == 3 and old._mutation_revision == 0
    old.set(torch.tensor([3, 4]), batch(2, 1))
    assert len(old) == 5 and old._writes_since(None)[0] == 1 and old._mutation_revision == 1
    ref.set(torch.tensor([3, 4]), batch(2, 1))
    assert torch.equal(old[:5]["obs"], ref[:5]["obs"])
    assert old._writes_value.get_lock() is old._len_value.get_lock()
    assert old._writes_shared.value == 1
