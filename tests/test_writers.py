"""torchrl_compat.writers against torchrl 0.11's writers, operation by operation.

Each writer drives a storage of its own library; the storages' contents, the returned
indices, the cursors and write counts, and the data handed back to the caller are
compared after every call. The row-slice writes of :func:`write_rows` are checked against
``storage.set`` (the path torchrl takes) on the same batches.
"""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
import torchrl.data.replay_buffers.storages as TS
import torchrl.data.replay_buffers.writers as T
from hypothesis import given, settings, strategies as st
from tensordict import TensorDict

import torchrl_compat
import torchrl_compat.storages as OS
import torchrl_compat.writers as O
import torchrl_compat.writers.max_value as writer_max_value
import torchrl_compat.writers.round_robin as writer_round_robin
from torchrl_compat.storages._journal import RowRun
from torchrl_compat.writers._rows import write_rows

from twin_checks import assert_api_matches, assert_no_torchrl_code

CLASSES = O.__all__


def make_td(n, seed=0, width=3):
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "obs": torch.randn(n, width, generator=g),
            "reward": torch.randn(n, 1, generator=g),
            ("next", "done"): torch.rand(n, 1, generator=g) < 0.3,
        },
        [n],
    )


def leaves(data):
    if isinstance(data, torch.Tensor):
        return {"": data}
    return {str(k): v for k, v in data.items(include_nested=True, leaves_only=True)}


def assert_same_data(a, b):
    la, lb = leaves(a), leaves(b)
    assert list(la) == list(lb)
    for key in la:
        assert la[key].dtype == lb[key].dtype, key
        assert torch.equal(la[key], lb[key]), key


def assert_same_storage(ours, ref):
    assert len(ours) == len(ref)
    assert ours._is_full == ref._is_full
    if len(ref):
        assert_same_data(ours[:], ref[:])
    cursor, ref_cursor = ours._last_cursor, ref._last_cursor
    if isinstance(ref_cursor, torch.Tensor):
        assert torch.equal(cursor, ref_cursor)
    else:
        assert cursor == ref_cursor


def pair(writer_name, storage_name, *args, writer_kwargs=None, **kwargs):
    writer_kwargs = writer_kwargs or {}
    ours = getattr(O, writer_name)(**writer_kwargs)
    ref = getattr(T, writer_name)(**writer_kwargs)
    ours.register_storage(getattr(OS, storage_name)(*args, **kwargs))
    ref.register_storage(getattr(TS, storage_name)(*args, **kwargs))
    return ours, ref


# ----------------------------------------------------------------------------- API


@pytest.mark.parametrize("name", CLASSES)
def test_signatures_match_torchrl(name):
    assert_api_matches(getattr(O, name), getattr(T, name))


@pytest.mark.parametrize("name", CLASSES)
def test_no_torchrl_code_runs_on_our_writers(name):
    assert_no_torchrl_code(getattr(O, name))


def test_exported_from_package():
    for name in CLASSES:
        assert getattr(torchrl_compat, name) is getattr(O, name)
    assert O.ImmutableDatasetWriter.WRITING_ERR == T.ImmutableDatasetWriter.WRITING_ERR


# ----------------------------------------------------------------- round robin


@settings(max_examples=25)
@given(
    capacity=st.integers(1, 12),
    sizes=st.lists(st.integers(1, 15), min_size=1, max_size=6),
    kind=st.sampled_from(["tensor", "tensordict"]),
    tensordict_writer=st.booleans(),
)
def test_round_robin_extend_matches_torchrl(capacity, sizes, kind, tensordict_writer):
    name = "TensorDictRoundRobinWriter" if tensordict_writer and kind == "tensordict" else "RoundRobinWriter"
    ours, ref = pair(name, "LazyTensorStorage", capacity)
    for i, size in enumerate(sizes):
        data = make_td(size, seed=i) if kind == "tensordict" else torch.randn(size, 2)
        ref_data = data.clone()
        got, expected = ours.extend(data), ref.extend(ref_data)
        assert torch.equal(got, expected)
        # the tensordict writer records the index in the caller's data, as torchrl's does
        assert_same_data(data, ref_data)
        assert_same_storage(ours._storage, ref._storage)
        assert ours._cursor == ref._cursor and ours._write_count == ref._write_count
        assert ours.state_dict() == ref.state_dict()


@pytest.mark.parametrize("kind", ["tensor", "tensordict"])
def test_round_robin_add_matches_torchrl(kind):
    name = "TensorDictRoundRobinWriter" if kind == "tensordict" else "RoundRobinWriter"
    ours, ref = pair(name, "LazyTensorStorage", 3)
    for i in range(7):
        item = make_td(1, seed=i)[0] if kind == "tensordict" else torch.full((2,), float(i))
        ref_item = item.clone()
        assert ours.add(item) == ref.add(ref_item)
        assert_same_data(item, ref_item)
        assert_same_storage(ours._storage, ref._storage)
    assert ours._write_count == ref._write_count == 7


def test_round_robin_ndim2_replicates_index():
    ours, ref = pair("RoundRobinWriter", "LazyTensorStorage", 12, ndim=2)
    data = make_td(8).reshape(2, 4)
    data_ref = data.clone()
    got, expected = ours.extend(data), ref.extend(data_ref)
    assert torch.equal(got, expected) and got.shape == (8, 2)
    got, expected = ours.add(data[0]), ref.add(data_ref[0])
    assert torch.equal(got, expected)
    assert_same_data(ours._storage[:], ref._storage[:])


def test_round_robin_list_and_pytree_data():
    ours, ref = pair("RoundRobinWriter", "ListStorage", 5)
    items = [torch.full((2,), float(i)) for i in range(7)]
    assert torch.equal(ours.extend(items), ref.extend(items))
    assert [x.tolist() for x in ours._storage._storage] == [x.tolist() for x in ref._storage._storage]
    ours, ref = pair("RoundRobinWriter", "LazyTensorStorage", 4)
    tree = (torch.arange(3.0), {"a": torch.ones(3, 2)})
    assert torch.equal(ours.extend(tree), ref.extend(tree))


def test_round_robin_empty_batch_refused():
    ours, _ = pair("RoundRobinWriter", "LazyTensorStorage", 4)
    with pytest.raises(RuntimeError, match="Expected at least one element in extend"):
        ours.extend(torch.zeros(0, 2))
    assert ours._cursor == 0 and ours._write_count == 0


def test_round_robin_empty_and_persistence(tmp_path):
    ours, ref = pair("RoundRobinWriter", "LazyTensorStorage", 4)
    for writer in (ours, ref):
        writer.extend(torch.zeros(6, 2))
    ours.dumps(tmp_path / "ours")
    ref.dumps(tmp_path / "ref")
    assert json.loads((tmp_path / "ours" / "metadata.json").read_text()) == json.loads(
        (tmp_path / "ref" / "metadata.json").read_text()
    )
    fresh_ours, fresh_ref = pair("RoundRobinWriter", "LazyTensorStorage", 4)
    fresh_ours.loads(tmp_path / "ref")
    fresh_ref.loads(tmp_path / "ours")
    assert fresh_ours._cursor == fresh_ref._cursor == 2
    fresh_ours.load_state_dict(ref.state_dict())
    # {"_cursor": 2} up to torchrl 0.13; the write count beside it from 0.14 on
    assert fresh_ours.state_dict() == ref.state_dict()
    assert fresh_ours._write_count == fresh_ref._write_count
    ours._empty(empty_write_count=False)
    assert ours._cursor == 0 and ours._write_count == 6
    ours._empty()
    assert ours._write_count == 0


def test_round_robin_pickle_and_compilable():
    ours, ref = pair("RoundRobinWriter", "LazyTensorStorage", 4)
    ours.extend(torch.zeros(3, 2))
    ours._rng = torch.Generator()
    copy = pickle.loads(pickle.dumps(ours))
    assert copy._cursor == 3 and copy._write_count == 3 and copy._rng is None
    copy._cursor = 1
    assert ours._cursor == 3  # a plain copy shares nothing
    compilable = O.RoundRobinWriter(compilable=True)
    compilable.register_storage(OS.LazyTensorStorage(4))
    compilable.extend(torch.zeros(5, 2))
    assert compilable._cursor == 1 and compilable._write_count == 5
    assert type(compilable.__dict__["_cursor_value"]) is int
    assert pickle.loads(pickle.dumps(compilable))._cursor == 1
    assert repr(ours) == repr(ref).replace("0", "3") == "RoundRobinWriter(cursor=3, full_storage=False)"


def test_write_count_is_int64():
    ours, _ = pair("RoundRobinWriter", "LazyTensorStorage", 4)
    ours._write_count = 2**31 + 5  # torchrl's mp.Value("i") wraps here
    ours.extend(torch.zeros(2, 2))
    assert ours._write_count == 2**31 + 7


def test_writer_notifies_attached_entities():
    seen = []

    class Entity:
        def mark_update(self, index):
            seen.append(index)

    writer = O.RoundRobinWriter()
    storage = OS.LazyTensorStorage(4)
    storage.attach(Entity())
    writer.register_storage(storage)
    index = writer.extend(torch.zeros(3, 2))
    assert seen[0] is index
    writer.add(torch.zeros(2))
    assert seen[1] == 3


# ------------------------------------------------------------------ row slices


def _storage_pair(capacity, first, kind):
    fast, slow = OS.LazyTensorStorage(capacity), OS.LazyTensorStorage(capacity)
    for storage in (fast, slow):
        storage.set(torch.arange(first.shape[0]), first.clone())
    return fast, slow


@settings(max_examples=40)
@given(
    capacity=st.integers(2, 10),
    start=st.integers(0, 9),
    numel=st.integers(0, 10),
    kind=st.sampled_from(["tensor", "tensordict"]),
)
def test_write_rows_equals_storage_set(capacity, start, numel, kind):
    start %= capacity
    numel = min(numel, capacity)
    first = make_td(capacity, seed=1) if kind == "tensordict" else torch.randn(capacity, 3)
    fast, slow = _storage_pair(capacity, first, kind)
    # a reader follows the writes from here (the journal records nothing before that)
    before_fast, _ = fast._writes_since(None)
    before_slow, _ = slow._writes_since(None)
    data = make_td(numel, seed=2) if kind == "tensordict" else torch.randn(numel, 3)
    index = torch.arange(start, start + numel) % capacity
    assert write_rows(fast, start, index, data)
    slow.set(index, data)
    assert_same_storage(fast, slow)
    assert fast._last_cursor is index  # as storage.set books it
    count_fast, (cursor_fast,) = fast._writes_since(before_fast)
    count_slow, (cursor_slow,) = slow._writes_since(before_slow)
    assert count_fast - before_fast == count_slow - before_slow == 1
    # the same rows journaled as set journals them (as a run of rows), which the caller
    # cannot change
    expected = index.tolist()
    index += capacity
    assert isinstance(cursor_fast, RowRun)
    assert _journaled_rows(cursor_fast, capacity) == torch.as_tensor(cursor_slow).tolist() == expected
    assert _journaled_rows(fast._writes_since(before_fast)[1][0], capacity) == expected


def _journaled_rows(cursor, capacity):
    """The rows a journal entry names, as a list."""
    if isinstance(cursor, RowRun):
        return [(cursor.start + k) % capacity for k in range(cursor.numel)]
    return torch.as_tensor(cursor).tolist()


def test_write_rows_broadcasts_and_refuses_as_set():
    capacity = 6
    first = make_td(capacity)
    rows = torch.arange(2, 5)
    broadcast = TensorDict({"obs": torch.ones(3, 1), "reward": torch.zeros(3, 1),
                            ("next", "done"): torch.zeros(3, 1, dtype=torch.bool)}, [3])
    fast, slow = _storage_pair(capacity, first, "tensordict")
    assert write_rows(fast, 2, rows, broadcast)
    slow.set(rows, broadcast)
    assert_same_storage(fast, slow)
    # the indexed assignment does not cast: another dtype goes to storage.set, which raises
    cast = make_td(3)
    cast["obs"] = cast["obs"].double()
    assert not write_rows(fast, 2, rows, cast)
    with pytest.raises(RuntimeError, match="dtypes match"):
        slow.set(rows, cast)
    # shapes that do not broadcast raise in both
    bad = make_td(3)
    bad["obs"] = torch.zeros(3, 2)
    with pytest.raises(RuntimeError):
        write_rows(fast, 2, rows, bad)
    with pytest.raises(RuntimeError):
        slow.set(rows, bad)


def test_write_rows_declines_what_it_does_not_handle():
    first = make_td(6)
    storage = OS.LazyTensorStorage(6)
    # a storage not initialized yet is created from the batch (tests/test_storages_first_write.py)
    assert write_rows(storage, 0, torch.arange(3), make_td(3)) and storage.initialized
    assert not write_rows(OS.LazyTensorStorage(6, ndim=2), 0, torch.arange(3), make_td(3))
    storage.set(torch.arange(6), first)
    before = storage[:].clone()
    declined = [
        make_td(3).exclude("obs"),  # a key missing
        make_td(3).set("extra", torch.zeros(3)),  # a key added
        make_td(7),  # more items than rows
        TensorDict({"obs": torch.zeros(3, 3), "reward": torch.zeros(3, 1), "next": {"done": torch.zeros(3, 1)}}, []),
    ]
    for data in declined:
        assert not write_rows(storage, 4, torch.arange(4, 4 + max(len(data.batch_size) and data.shape[0], 1)) % 6, data)
    assert_same_data(storage[:], before)
    assert not write_rows(TS.LazyTensorStorage(6), 0, torch.arange(3), make_td(3))  # torchrl's


def test_write_rows_error_keeps_length_and_warns_readers():
    storage = OS.LazyTensorStorage(6)
    storage.set(torch.arange(4), make_td(4))
    count, _ = storage._writes_since(None)
    bad = make_td(2)
    bad["obs"] = torch.zeros(2, 5)  # does not fit the stored rows
    with pytest.raises(RuntimeError):
        write_rows(storage, 4, torch.arange(4, 6), bad)
    assert len(storage) == 4
    # readers following the writes are told to read everything again
    assert storage._writes_since(count) == (count + 1, None)


# ------------------------------------------------------------------- max value


def _max_value_pair(capacity, **kwargs):
    return pair("TensorDictMaxValueWriter", "LazyTensorStorage", capacity, writer_kwargs=kwargs)


@settings(max_examples=25)
@given(
    capacity=st.integers(1, 6),
    batches=st.lists(st.lists(st.integers(-5, 5), min_size=1, max_size=8), min_size=1, max_size=5),
    per_item=st.sampled_from([1, 3]),
    reduction=st.sampled_from(["sum", "max", "min", "mean", "median"]),
)
def test_max_value_extend_matches_torchrl(capacity, batches, per_item, reduction):
    ours, ref = _max_value_pair(capacity, rank_key="key", reduction=reduction)
    for i, values in enumerate(batches):
        n = len(values)
        key = torch.tensor(values, dtype=torch.float32).unsqueeze(-1).expand(n, per_item).contiguous()
        key = key + torch.arange(per_item) * 0.25
        data = TensorDict({"key": key if per_item > 1 else key.squeeze(-1), "obs": torch.arange(n) + 100 * i}, [n])
        got, expected = ours.extend(data.clone()), ref.extend(data.clone())
        assert torch.equal(got, expected)
        assert_same_storage(ours._storage, ref._storage)
        assert [(float(v), r) for v, r in ours._current_top_values] == [
            (float(v), r) for v, r in ref._current_top_values
        ]
        assert ours._write_count == ref._write_count


def test_max_value_add_and_errors():
    ours, ref = _max_value_pair(2, rank_key="key")
    for value in [3.0, 1.0, 5.0, 0.0]:
        item = TensorDict({"key": torch.tensor(value), "obs": torch.tensor(value)}, [])
        assert ours.add(item.clone()) == ref.add(item.clone())
    assert_same_storage(ours._storage, ref._storage)
    with pytest.raises(KeyError, match="Rank key key not found"):
        ours.extend(TensorDict({"obs": torch.zeros(2)}, [2]))
    with pytest.raises(RuntimeError, match="expects data to be a tensor collection"):
        ours.get_insert_index(torch.zeros(2))
    with pytest.raises(ValueError, match="not compatible with storages with more than one dimension"):
        O.TensorDictMaxValueWriter().register_storage(OS.LazyTensorStorage(4, ndim=2))
    with pytest.raises(NotImplementedError):
        ours.state_dict()
    assert O.TensorDictMaxValueWriter()._rank_key == ("next", "reward")


def test_max_value_dumps_cross(tmp_path):
    ours, ref = _max_value_pair(3, rank_key=("next", "reward"))
    data = TensorDict({("next", "reward"): torch.tensor([4.0, 2.0, 7.0, 1.0, 9.0]), "obs": torch.arange(5)}, [5])
    ours.extend(data.clone())
    ref.extend(data.clone())
    ours.dumps(tmp_path / "ours")
    ref.dumps(tmp_path / "ref")
    for name in ("metadata.json",):
        assert json.loads((tmp_path / "ours" / name).read_text()) == json.loads((tmp_path / "ref" / name).read_text())
    assert (tmp_path / "ours" / "current_top_values.memmap").read_bytes() == (
        tmp_path / "ref" / "current_top_values.memmap"
    ).read_bytes()
    loaded, _ = _max_value_pair(3)
    loaded.loads(tmp_path / "ref")
    assert loaded._rank_key == ("next", "reward") and loaded._cursor == ref._cursor
    assert loaded._current_top_values == [(float(v), int(r)) for v, r in ref._current_top_values]
    more = TensorDict({("next", "reward"): torch.tensor([8.0]), "obs": torch.tensor([50])}, [1])
    loaded._storage.set(torch.arange(3), ours._storage[:])
    ref_index = ref.extend(more.clone())
    assert torch.equal(loaded.extend(more.clone()), ref_index)


def test_max_value_loads_unknown_dtype(tmp_path):
    # torchrl: a bare KeyError of the dtype's name
    ours, ref = _max_value_pair(3, rank_key="key")
    data = TensorDict({"key": torch.tensor([4.0, 2.0, 7.0])}, [3])
    ours.extend(data.clone())
    ours.dumps(tmp_path)
    metadata = json.loads((tmp_path / "metadata.json").read_text())
    metadata["dtype"] = "torch.nonsense"
    (tmp_path / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(KeyError, match="torch.nonsense"):
        ref.loads(tmp_path)
    with pytest.raises(ValueError, match=r"metadata\.json names an unknown dtype 'torch\.nonsense'"):
        _max_value_pair(3)[0].loads(tmp_path)


def test_max_value_pickle():
    ours, _ = _max_value_pair(2, rank_key="key")
    ours.extend(TensorDict({"key": torch.tensor([1.0, 2.0, 3.0])}, [3]))
    copy = pickle.loads(pickle.dumps(ours))
    assert copy._write_count == ours._write_count == 3
    assert copy._current_top_values == ours._current_top_values


# ------------------------------------------------------------ immutable, ensemble


def test_immutable_dataset_writer():
    writer = O.ImmutableDatasetWriter()
    for call in (lambda: writer.add(1), lambda: writer.extend([1]), writer._empty):
        with pytest.raises(RuntimeError, match="This dataset doesn't allow writing"):
            call()
    assert writer.state_dict() == {} and writer.load_state_dict({}) is None
    assert writer.dumps("unused") is None and writer.loads("unused") is None


def test_writer_ensemble_indexing_and_rng(tmp_path):
    writers = [O.RoundRobinWriter() for _ in range(3)]
    refs = [T.RoundRobinWriter() for _ in range(3)]
    ens, ref = O.WriterEnsemble(*writers), T.WriterEnsemble(*refs)
    for index in [1, -1, slice(0, 2), [0, 2], torch.tensor([2, 1]), np.array([0]), range(2), (1,), slice(None)]:
        got, expected = ens[index], ref[index]
        if isinstance(expected, T.WriterEnsemble):
            assert [writers.index(w) for w in got._writers] == [refs.index(w) for w in expected._writers]
        else:
            assert writers.index(got) == refs.index(expected)
    for bad, error in [((0, 1), IndexError), (torch.zeros(2, 2, dtype=torch.long), RuntimeError),
                       (torch.tensor([0.5]), TypeError), (5, IndexError)]:
        with pytest.raises(error):
            ens[bad]
    gen = torch.Generator()
    ens._rng = gen
    assert all(w._rng is gen for w in writers)
    for writer in writers:
        writer.register_storage(OS.LazyTensorStorage(4))
        writer.extend(torch.zeros(3, 2))
    ens.dumps(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1", "2"]
    fresh = O.WriterEnsemble(*[O.RoundRobinWriter() for _ in range(3)])
    fresh.loads(tmp_path)
    assert [w._cursor for w in fresh._writers] == [3, 3, 3]
    for call in (ens.add, ens.extend):
        with pytest.raises(NotImplementedError):
            call()
    # up to torchrl 0.13 these raise NotImplementedError; from 0.14 on they act on every member
    for ref_writer in refs:
        ref_writer.register_storage(TS.LazyTensorStorage(4))
        ref_writer.extend(torch.zeros(3, 2))
    try:
        expected = ref.state_dict()
    except NotImplementedError:
        for call in (ens._empty, ens.state_dict):
            with pytest.raises(NotImplementedError):
                call()
    else:
        assert ens.state_dict() == expected
        ens._empty(empty_write_count=False)
        ref._empty(empty_write_count=False)
        assert [(w._cursor, w._write_count) for w in writers] == [(w._cursor, w._write_count) for w in refs]
        assert ens._write_count == ref._write_count == 9
        fresh.load_state_dict(expected)
        assert fresh.state_dict() == expected
    assert len(ens) == 3 and "WriterEnsemble(" in repr(ens)
    assert pickle.loads(pickle.dumps(ens))._rng is None


# ----------------------------------------------------------------------------- checkpoints
# dumps publishes whole; loads checks everything before the writer changes


class Interrupted(Exception):
    pass


def _round_robin(cursor):
    writer = O.RoundRobinWriter()
    writer.register_storage(OS.LazyTensorStorage(8))
    writer.extend(torch.zeros(cursor, 2))
    return writer


def _max_value(version):
    writer, _ = _max_value_pair(4, rank_key="key")
    writer.extend(TensorDict({"key": torch.arange(3.0) + 10 * version}, [3]))
    return writer


def _ensemble(version):
    return O.WriterEnsemble(_round_robin(version), _max_value(version))


def _writer_state(writer):
    if isinstance(writer, O.WriterEnsemble):
        return [_writer_state(member) for member in writer._writers]
    return writer._cursor, getattr(writer, "_rank_key", None), list(getattr(writer, "_current_top_values", []))


WRITER_KINDS = {"RoundRobinWriter": _round_robin, "TensorDictMaxValueWriter": _max_value, "WriterEnsemble": _ensemble}


def _files(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("kind", list(WRITER_KINDS))
def test_interrupted_dumps_keeps_the_previous_checkpoint(tmp_path, kind, monkeypatch):
    make = WRITER_KINDS[kind]
    path = tmp_path / "writer"
    make(1).dumps(path)
    before = _files(path)

    written = O._dump_json
    # a metadata file is each writer's last (after the top values); the ensemble's second
    # member is interrupted once the first one is written
    calls = {"left": 2 if kind == "WriterEnsemble" else 1}

    def broken(content, file):
        calls["left"] -= 1
        if calls["left"]:
            return written(content, file)
        with open(file, "w") as f:
            f.write('{"curs')
        raise Interrupted

    for module in (writer_round_robin, writer_max_value):
        monkeypatch.setattr(module, "_dump_json", broken)
    with pytest.raises(Interrupted):
        make(2).dumps(path)
    assert _files(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["writer"]
    monkeypatch.undo()
    loaded = make(5)
    loaded.loads(path)
    assert _writer_state(loaded) == _writer_state(make(1))


WRITER_DAMAGES = {
    "metadata missing": ("RoundRobinWriter", "metadata.json", lambda f: f.unlink(), FileNotFoundError),
    "metadata truncated": ("RoundRobinWriter", "metadata.json", lambda f: f.write_text('{"cur'), ValueError),
    "cursor missing": ("RoundRobinWriter", "metadata.json", lambda f: f.write_text("{}"), ValueError),
    "cursor a float": ("RoundRobinWriter", "metadata.json", lambda f: f.write_text('{"cursor": 1.5}'), ValueError),
    "top values truncated": (
        "TensorDictMaxValueWriter", "current_top_values.memmap", lambda f: f.write_bytes(f.read_bytes()[:5]), ValueError
    ),
    "top values missing": ("TensorDictMaxValueWriter", "current_top_values.memmap", lambda f: f.unlink(), FileNotFoundError),
    "rank key not a key": (
        "TensorDictMaxValueWriter",
        "metadata.json",
        lambda f: f.write_text(json.dumps({**json.loads(f.read_text()), "rank_key": 3})),
        ValueError,
    ),
    "second member damaged": ("WriterEnsemble", "1/metadata.json", lambda f: f.write_text("[]"), ValueError),
}


@pytest.mark.parametrize("damage", list(WRITER_DAMAGES))
def test_damaged_checkpoint_leaves_the_writer_as_it_was(tmp_path, damage):
    kind, name, spoil, error = WRITER_DAMAGES[damage]
    make = WRITER_KINDS[kind]
    make(1).dumps(tmp_path)
    spoil(tmp_path / name)
    files = _files(tmp_path)
    writer = make(2)
    with pytest.raises(error, match=name.replace(".", r"\.")):
        writer.loads(tmp_path)
    assert _writer_state(writer) == _writer_state(make(2))
    assert _files(tmp_path) == files


def test_max_value_empty_dumps_loads(tmp_path):
    writer, ref = _max_value_pair(2, rank_key="key")
    writer.dumps(tmp_path / "ours")
    ref.dumps(tmp_path / "ref")
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == sorted(p.name for p in (tmp_path / "ref").iterdir())
    loaded = _max_value(3)
    loaded.loads(tmp_path / "ref")
    assert loaded._current_top_values == [] and loaded._cursor == 0


def test_docstring_examples():
    import doctest

    result = doctest.testmod(O, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
