"""RoundRobinWriter and TensorDictRoundRobinWriter at their edges: a single item refused or
failing mid-write, the first item on a multi-dimensional lazy storage, tensorclass and locked
batches, and pickling for a spawned process.

Each case is compared with torchrl 0.11's own writers where torchrl behaves as we do, and with
a plain expectation (nothing written, the cursor back where it was) where the class
description says we differ from torchrl.
"""
from __future__ import annotations

import pytest
import torch
import torchrl.data.replay_buffers.storages as TS
import torchrl.data.replay_buffers.writers as T
from tensordict import TensorDict, tensorclass

import torchrl_compat.storages as OS
import torchrl_compat.writers as O
import torchrl_compat.writers.round_robin as writer_round_robin


def _filled(storage_module, writer_module, writer="RoundRobinWriter", size=5):
    storage = storage_module.LazyTensorStorage(size)
    writer = getattr(writer_module, writer)()
    writer.register_storage(storage)
    return storage, writer


def _td(n, value=0.0):
    return TensorDict({"obs": torch.full((n, 2), value), "reward": torch.full((n, 1), value)}, [n])


def test_add_refused_item_writes_no_entry():
    # The reward of the item does not broadcast to the storage's rows: the item is refused
    # before its obs entry reaches row 2, and the cursor stays there.
    storage, writer = _filled(OS, O)
    writer.extend(_td(2, 1.0))
    row_before = storage._storage["obs"][2].clone()  # never written: whatever the memory held
    bad = TensorDict({"obs": torch.full((2,), 7.0), "reward": torch.full((3,), 7.0)}, [])
    with pytest.raises(RuntimeError):
        writer.add(bad)
    assert writer._cursor == 2 and writer._write_count == 2
    # bit for bit: a row never written may hold NaNs
    assert torch.equal(storage._storage["obs"][2].view(torch.int32), row_before.view(torch.int32))
    assert writer.add(_td(1, 3.0)[0]) == 2


def test_add_failing_storage_set_puts_cursor_back(monkeypatch):
    # A failure inside storage.set (after every check passed): the cursor and write count
    # move back, the error is the storage's, and the next item takes the same row.
    storage, writer = _filled(OS, O)
    writer.extend(_td(3, 1.0))

    def failing_set(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(storage, "set", failing_set)
    with pytest.raises(OSError, match="disk full"):
        writer.add(_td(1, 5.0)[0])
    assert (writer._cursor, writer._write_count) == (3, 3)
    monkeypatch.undo()
    assert writer.add(_td(1, 5.0)[0]) == 3
    assert (writer._cursor, writer._write_count) == (4, 4)


def test_add_first_item_on_lazy_storage_of_two_dims():
    # The storage's shape is not known before the first item: the rows along the first
    # dimension come from the item itself (12 // 3 = 4), as in torchrl.
    results = []
    for storage_module, writer_module in ((OS, O), (TS, T)):
        storage = storage_module.LazyTensorStorage(12, ndim=2)
        writer = writer_module.RoundRobinWriter()
        writer.register_storage(storage)
        index = writer.add(torch.arange(6.0).reshape(3, 2))
        results.append((index.tolist(), int(writer._cursor), int(writer._write_count)))
    assert results[0] == results[1]


def test_tensorclass_batch_gets_no_index_entry():
    @tensorclass
    class Step:
        obs: torch.Tensor

    results = []
    for storage_module, writer_module in ((OS, O), (TS, T)):
        storage, writer = _filled(storage_module, writer_module, "TensorDictRoundRobinWriter")
        data = Step(obs=torch.arange(6.0).reshape(3, 2), batch_size=[3])
        index = writer.extend(data)
        results.append((index.tolist(), sorted(data._tensordict.keys()), sorted(storage._storage._tensordict.keys())))
    assert results[0] == results[1]
    assert results[0][1] == ["obs"]


def test_locked_tensordict_batch_is_refused():
    errors = []
    for storage_module, writer_module in ((OS, O), (TS, T)):
        storage, writer = _filled(storage_module, writer_module, "TensorDictRoundRobinWriter")
        data = _td(3).lock_()
        with pytest.raises(RuntimeError, match="locked") as info:
            writer.extend(data)
        assert "index" not in data.keys()
        errors.append(type(info.value))
    assert errors[0] is errors[1]


def test_state_pickled_for_a_spawned_process_loads(monkeypatch):
    # For a spawn the counters travel in their shared form (no "__context" numbers): the
    # receiving side takes them as they are.
    storage, writer = _filled(OS, O)
    writer.extend(_td(3))
    monkeypatch.setattr(writer_round_robin, "get_spawning_popen", lambda: object())
    state = writer.__getstate__()
    monkeypatch.undo()
    assert "cursor__context" not in state
    copy = O.RoundRobinWriter.__new__(O.RoundRobinWriter)
    copy.__setstate__(dict(state))
    assert (copy._cursor, copy._write_count) == (3, 3)


@pytest.mark.parametrize(
    "bad",
    [
        {"obs": torch.zeros(3, 2, dtype=torch.float64), "reward": torch.zeros(3, 1)},
        {"obs": torch.zeros(3, 2), "reward": torch.zeros(3, 4)},
    ],
    ids=["dtype", "trailing-shape"],
)
def test_extend_refused_batch_writes_nothing(bad):
    # After a first batch fixed the storage's entries, a batch the storage refuses raises
    # (naming no other error: not one from putting the cursor back) and changes nothing.
    storage, writer = _filled(OS, O)
    writer.extend(_td(2, 1.0))
    before = storage._storage.clone()
    with pytest.raises((RuntimeError, TypeError, ValueError)) as info:
        writer.extend(TensorDict(bad, [3]))
    assert "obs" in str(info.value) or "reward" in str(info.value)
    assert (writer._cursor, writer._write_count) == (2, 2)
    for key in ("obs", "reward"):  # bit for bit: rows never written may hold NaNs
        assert torch.equal(storage._storage[key].view(torch.int32), before[key].view(torch.int32)), key
    assert writer.extend(_td(1, 5.0)).tolist() == [2]


def test_loads_names_a_bad_cursor(tmp_path):
    import json

    storage, writer = _filled(OS, O)
    writer.extend(_td(3))
    writer.dumps(tmp_path)
    (metadata,) = [p for p in tmp_path.rglob("*.json")]
    content = json.loads(metadata.read_text())
    content["cursor"] = -1
    metadata.write_text(json.dumps(content))
    with pytest.raises(Exception, match="cursor must be an integer >= 0, got -1"):
        writer.loads(tmp_path)
    assert writer._cursor == 3


@pytest.mark.parametrize("kind", ["tensor", "tensordict"])
def test_extend_larger_than_capacity_keeps_last_items(kind):
    # Plain model: the rows hold the last `capacity` items of the batch, row by row in
    # round-robin order; the indices returned are torchrl's.
    n, capacity = 11, 4
    values = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
    data = values if kind == "tensor" else TensorDict({"a": values, "b": values[:, :1] * 2}, [n])
    storage, writer = _filled(OS, O, size=capacity)
    index = writer.extend(data)
    ref_storage, ref_writer = _filled(TS, T, size=capacity)
    assert index.tolist() == ref_writer.extend(data.clone()).tolist()
    expected = torch.empty(capacity, 3)
    for k in range(n):
        expected[k % capacity] = values[k]
    stored = storage._storage if kind == "tensor" else storage._storage["a"]
    assert torch.equal(stored, expected)
    assert writer._cursor == n % capacity


def _strided(n, value):
    # a batch of non-contiguous leaves (views of transposes): replay.copy_rows takes
    # contiguous leaves only, so these rows go through the writer's numpy views
    return TensorDict({"obs": torch.full((2, n), value).t(), "reward": torch.full((1, n), value).t()}, [n])


@pytest.mark.parametrize("kind", ["tensordict", "tensor", "strided", "strided-tensor"])
def test_initialized_storage_is_written_row_by_row_without_set(kind, monkeypatch):
    # Once the storage holds its leaves, a plain batch is copied into their rows directly
    # (replay.copy_rows, or numpy views of the leaves that the writer keeps from write to
    # write): the storage's ``set`` is never called, and the rows read back as torchrl's
    # writer leaves them.
    make = {
        "tensordict": _td,
        "tensor": lambda n, v: torch.full((n, 2), v),
        "strided": _strided,
        "strided-tensor": lambda n, v: torch.full((2, n), v).t(),
    }[kind]
    theirs_storage, theirs = _filled(TS, T)
    ours_storage, ours = _filled(OS, O)
    for writer in (theirs, ours):
        writer.extend(make(2, 1.0))  # initializes the storage
    calls = []
    plain_set = ours_storage.set

    def counted_set(*args, **kwargs):
        calls.append(args)
        return plain_set(*args, **kwargs)

    monkeypatch.setattr(ours_storage, "set", counted_set)
    views = None
    for step, n in enumerate((2, 4, 3)):  # the second and third batches wrap around
        got = [writer.extend(make(n, 2.0 + step)) for writer in (theirs, ours)]
        assert torch.equal(got[0], got[1])
        if kind.startswith("strided"):
            kept = ours.__dict__["_leaf_arrays"]
            assert kept and (views is None or kept is views)  # the views live on between writes
            views = kept
    assert calls == []
    if kind in ("tensordict", "strided"):
        assert (ours_storage._storage == theirs_storage._storage).all()
    else:
        assert torch.equal(ours_storage._storage, theirs_storage._storage)
