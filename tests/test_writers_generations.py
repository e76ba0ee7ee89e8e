"""Slot generations, write counts in checkpoints and the buffers' write-side methods, against
the installed torchrl.

From torchrl 0.14 on, round-robin writers can stamp slots with their write generation, save
their write count, write at given rows (``write_at``), and buffers patch the records still
live (``update_if_present``). Each operation runs on our classes and on torchrl's, and the
returned values, the writers' state and the storages' content are compared after every
call. Up to 0.13 the same tests check that none of it is there, as in torchrl; golden
checkpoints written by torchrl 0.14.1 (``tests/data/make_golden_writers014.py``) are read
in both cases.
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch
import torchrl.data.replay_buffers as T
import torchrl.data.replay_buffers.storages as TS
import torchrl.data.replay_buffers.writers as TW
from hypothesis import given, settings, strategies as st
from tensordict import TensorDict, tensorclass

import torchrl_compat as O
from torchrl_compat._releases import since

DATA = pathlib.Path(__file__).parent / "data"
GOLDEN = json.loads((DATA / "golden_trl014_writers.json").read_text())

GENERATIONS = since("writer_slot_generations")
needs_generations = pytest.mark.skipif(not GENERATIONS, reason="slot generations come with torchrl 0.14")


def assert_same(a, b):
    """Same value: tensors (dtype and content), tensordicts, dicts and sequences of them."""
    if isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, (a, b)
        assert torch.equal(a, b), (a, b)
    elif isinstance(b, TensorDict):
        assert sorted(a.keys(True, True), key=str) == sorted(b.keys(True, True), key=str)
        for key in b.keys(True, True):
            assert_same(a[key], b[key])
    elif isinstance(b, dict):
        assert sorted(a, key=str) == sorted(b, key=str), (a, b)
        for key in b:
            assert_same(a[key], b[key])
    elif isinstance(b, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b, (a, b)


def same_error(call_ours, call_ref):
    """Both calls raise: the same exception type and message."""
    with pytest.raises(Exception) as ref_error:
        call_ref()
    with pytest.raises(type(ref_error.value)) as our_error:
        call_ours()
    assert str(our_error.value) == str(ref_error.value)
    return our_error.value


def same_outcome(call_ours, call_ref):
    """Both calls return the same value, or both raise the same exception type and message."""
    try:
        expected = call_ref()
    except Exception as error:
        with pytest.raises(type(error)) as our_error:
            call_ours()
        assert str(our_error.value) == str(error)
        return False
    assert_same(call_ours(), expected)
    return True


def writer_pair(name="RoundRobinWriter", capacity=5, ndim=1, storage="LazyTensorStorage", **kwargs):
    ours, ref = getattr(O, name)(**kwargs), getattr(TW, name)(**kwargs)
    extra = {"ndim": ndim} if ndim > 1 else {}
    ours.register_storage(getattr(O, storage)(capacity, **extra))
    ref.register_storage(getattr(TS, storage)(capacity, **extra))
    return ours, ref


def assert_same_writers(ours, ref, capacity, written=()):
    """Same cursor, write count, state, generations, storage length and, at the rows
    ``written`` (the others of a row written past the length hold whatever memory had),
    the same items."""
    assert ours._cursor == ref._cursor and ours._write_count == ref._write_count
    assert_same(ours.state_dict(), ref.state_dict())
    slots = torch.arange(-1, capacity + 2)
    assert_same(ours.generations_of(slots), ref.generations_of(slots))
    assert len(ours._storage) == len(ref._storage)
    if written:
        rows = torch.tensor(sorted(written))
        assert_same(ours._storage._storage[rows], ref._storage._storage[rows])


# ------------------------------------------------------------------ up to 0.13


@pytest.mark.skipif(GENERATIONS, reason="torchrl 0.14 has slot generations")
def test_releases_before_generations_have_none():
    with pytest.raises(TypeError):
        O.RoundRobinWriter(track_generations=True)
    writer = O.RoundRobinWriter()
    for name in ("write_at", "generations_of", "tracks_generations"):
        assert hasattr(writer, name) == hasattr(TW.RoundRobinWriter(), name) == False  # noqa: E712
    for name in ("update_if_present", "submit_update_if_present"):
        assert not hasattr(O.ReplayBuffer, name) and not hasattr(T.ReplayBuffer, name)
    assert not hasattr(O, "ConditionalUpdateResult")
    for name in ("set_at_", "set_", "update_", "write_all", "read_all_in_order"):
        assert hasattr(O.ReplayBuffer, name) == hasattr(T.ReplayBuffer, name), name


def test_golden_trl014_round_robin_writer_loads_as_installed_torchrl_does():
    """torchrl 0.14.1's dump read by our writer and by the installed torchrl's: up to 0.13
    only the cursor is read, from 0.14 on the write count and generations too."""
    ours, ref = writer_pair()
    ours.loads(DATA / "golden_trl014_round_robin_writer")
    ref.loads(DATA / "golden_trl014_round_robin_writer")
    golden = GOLDEN["golden_trl014_round_robin_writer"]
    assert ours._cursor == ref._cursor == golden["cursor"]
    assert ours._write_count == ref._write_count == (golden["write_count"] if GENERATIONS else 0)
    assert_same(ours.state_dict(), ref.state_dict())
    ours, ref = writer_pair(name="TensorDictMaxValueWriter", capacity=3, rank_key="key")
    ours.loads(DATA / "golden_trl014_max_value_writer")
    ref.loads(DATA / "golden_trl014_max_value_writer")
    # torchrl 0.11 reads the rows back as floats in lists (ours: ints in tuples, as written)
    assert ours._current_top_values == [(value, int(row)) for value, row in ref._current_top_values]
    assert ours._write_count == ref._write_count


def test_golden_trl014_state_dict_loads_as_installed_torchrl_does():
    state = torch.load(DATA / "golden_trl014_round_robin_writer_state_dict.pt")
    ours, ref = writer_pair()
    ours.load_state_dict(state)
    ref.load_state_dict(state)
    assert_same(ours.state_dict(), ref.state_dict())
    assert ours._write_count == ref._write_count


# ------------------------------------------------------------------- generations

OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(1, 12)),
        st.tuples(st.just("add"), st.just(0)),
        st.tuples(st.just("write_at"), st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True)),
        st.tuples(st.just("write_at_int"), st.integers(0, 5)),
        st.tuples(st.just("empty"), st.booleans()),
    ),
    min_size=1,
    max_size=8,
)


@needs_generations
@settings(max_examples=30, deadline=None)
@given(
    capacity=st.integers(1, 6),
    track=st.booleans(),
    tensordict=st.booleans(),
    operations=OPERATIONS,
)
def test_generations_match_torchrl(capacity, track, tensordict, operations):
    name = "TensorDictRoundRobinWriter" if tensordict else "RoundRobinWriter"
    ours, ref = writer_pair(name, capacity, track_generations=track)
    assert ours.tracks_generations == ref.tracks_generations == track
    counter = 0.0

    def batch(n):
        nonlocal counter
        values = torch.arange(counter, counter + n)
        counter += n
        if tensordict:
            return TensorDict({"obs": values.unsqueeze(-1).expand(n, 2).clone()}, [n])
        return values

    written = set()
    for op, arg in operations:
        if op == "extend":
            data = batch(arg)
            got, expected = ours.extend(data), ref.extend(data.clone())
            written.update(got.tolist())
        elif op == "add":
            data = batch(1)[0]
            got, expected = ours.add(data), ref.add(data.clone())
            written.add(int(got))
        elif op in ("write_at", "write_at_int"):
            rows = [row % capacity for row in (arg if op == "write_at" else [arg])]
            if len(set(rows)) < len(rows):
                continue
            data = batch(len(rows))
            index = torch.tensor(rows) if op == "write_at" else rows[0]
            if op == "write_at_int":
                data = data[0]
            # a single tensordict item is refused until the storage is initialized
            if same_outcome(lambda: ours.write_at(index, data), lambda: ref.write_at(index, data.clone())):
                written.update(rows)
            assert_same_writers(ours, ref, capacity, written)
            continue
        else:
            ours._empty(empty_write_count=arg)
            ref._empty(empty_write_count=arg)
            ours._storage._empty()
            ref._storage._empty()
            got = expected = None
        assert_same(got, expected)
        assert_same_writers(ours, ref, capacity, written)


@needs_generations
def test_generations_of_index_forms_match_torchrl():
    ours, ref = writer_pair(capacity=4, ndim=2, track_generations=True)
    data = torch.arange(18.0).reshape(6, 3)  # 6 items of 3 elements: wraps the 4 rows
    assert_same(ours.extend(data), ref.extend(data))
    cells = ours.extend(torch.zeros(1, 3))
    assert_same(cells, ref.extend(torch.zeros(1, 3)))
    for index in (
        torch.tensor([0, 1, 2, 3]),  # a batch of slots
        (torch.tensor([0, 3]), torch.tensor([1, 2])),  # per-dimension indices: dim 0 counts
        cells,  # the coordinate rows extend returned
        torch.tensor([[0, 1], [3, 2]]),
        2,
        torch.tensor([[1, 2]]),
    ):
        assert_same(ours.generations_of(index), ref.generations_of(index))
    untracked, untracked_ref = writer_pair()
    assert_same(untracked.generations_of(torch.tensor([0, 1])), untracked_ref.generations_of(torch.tensor([0, 1])))
    assert_same(O.ImmutableDatasetWriter().generations_of(3), TW.ImmutableDatasetWriter().generations_of(3))


@needs_generations
def test_generations_live_on_the_shared_storage():
    """Two writers on one storage: the one not tracking keeps the other's counters up to date."""
    for lib_storage, lib_writer in ((O, O), (TS, TW)):
        storage = lib_storage.LazyTensorStorage(4)
        tracking, plain = lib_writer.RoundRobinWriter(track_generations=True), lib_writer.RoundRobinWriter()
        tracking.register_storage(storage)
        plain.register_storage(storage)
        tracking.extend(torch.arange(3.0))
        plain.extend(torch.arange(2.0))
        plain._empty()
        if lib_writer is O:
            ours = (tracking.generations_of(torch.arange(4)), storage._slot_generations.clone(), plain.generations_of(0))
        else:
            ref = (tracking.generations_of(torch.arange(4)), storage._slot_generations.clone(), plain.generations_of(0))
    assert_same(ours, ref)
    # a writer that does not track and finds no counters creates none
    writer, _ = writer_pair()
    writer.extend(torch.arange(3.0))
    assert getattr(writer._storage, "_slot_generations", None) is None


@needs_generations
def test_large_storage_counters_grow_as_torchrl():
    """An unbounded list storage: counters start at 1024 slots and double as it fills."""
    ours, ref = O.RoundRobinWriter(track_generations=True), TW.RoundRobinWriter(track_generations=True)
    ours.register_storage(O.ListStorage())
    ref.register_storage(TS.ListStorage())
    for numel in (3, 1100, 1):
        items = [torch.tensor(float(i)) for i in range(numel)]
        assert_same(ours.extend(items), ref.extend(list(items)))
        assert ours._generation.shape == ref._generation.shape
        slots = torch.tensor([0, 2, 1023, 1024, 1103, 1104, 5000])
        assert_same(ours.generations_of(slots), ref.generations_of(slots))
    assert_same(ours.write_at(torch.tensor([1, 1104]), [torch.tensor(1.0)] * 2), ref.write_at(torch.tensor([1, 1104]), [torch.tensor(1.0)] * 2))
    assert_same(ours.generations_of(slots), ref.generations_of(slots))


# ---------------------------------------------------------------- checkpoints


@needs_generations
@pytest.mark.parametrize("track", [True, False])
def test_state_dict_and_dumps_cross_with_torchrl(tmp_path, track):
    ours, ref = writer_pair(track_generations=track)
    for writer in (ours, ref):
        writer.extend(torch.arange(7.0))
        writer.write_at(torch.tensor([1, 3]), torch.tensor([10.0, 30.0]))
    assert_same(ours.state_dict(), ref.state_dict())
    ours.dumps(tmp_path / "ours")
    ref.dumps(tmp_path / "ref")
    for directory in ("ours", "ref"):
        assert sorted(p.name for p in (tmp_path / directory).iterdir()) == sorted(
            p.name for p in (tmp_path / "ref").iterdir()
        )
    assert json.loads((tmp_path / "ours/metadata.json").read_text()) == json.loads(
        (tmp_path / "ref/metadata.json").read_text()
    )
    if track:
        assert (tmp_path / "ours/generation.memmap").read_bytes() == (tmp_path / "ref/generation.memmap").read_bytes()
    # each library loads the other's, into a writer with its storage and one without yet
    for source_path, source_state, lib in (("ref", ref.state_dict(), O), ("ours", ours.state_dict(), TW)):
        for loaded_before_storage in (False, True):
            storage_lib = O if lib is O else TS
            fresh = lib.RoundRobinWriter(track_generations=True)
            if not loaded_before_storage:
                fresh.register_storage(storage_lib.LazyTensorStorage(5))
            fresh.loads(tmp_path / source_path)
            if loaded_before_storage:
                fresh.register_storage(storage_lib.LazyTensorStorage(5))
            expected = (ours if lib is TW else ref).generations_of(torch.arange(5))
            assert_same(fresh.generations_of(torch.arange(5)), expected if track else torch.full((5,), -1))
            assert fresh._write_count == 9 and fresh._cursor == 2
            other = lib.RoundRobinWriter(track_generations=True)
            other.register_storage(storage_lib.LazyTensorStorage(5))
            other.load_state_dict(source_state)
            assert_same(other.state_dict(), fresh.state_dict())


@needs_generations
def test_golden_trl014_generations():
    golden = GOLDEN["golden_trl014_round_robin_writer"]
    writer = O.RoundRobinWriter(track_generations=True)
    writer.loads(DATA / "golden_trl014_round_robin_writer")
    writer.register_storage(O.LazyTensorStorage(5))
    assert writer.generations_of(torch.arange(5)).tolist() == golden["generation"]
    # and what we write from the same operations is what torchrl 0.14.1 wrote
    ours = O.RoundRobinWriter(track_generations=True)
    ours.register_storage(O.LazyTensorStorage(5))
    ours.extend(torch.arange(7.0))
    ours.write_at(torch.tensor([1, 3]), torch.tensor([10.0, 30.0]))
    ours.extend(torch.arange(7.0, 9.0))
    assert_same(ours.state_dict(), torch.load(DATA / "golden_trl014_round_robin_writer_state_dict.pt"))


@needs_generations
def test_bad_generation_checkpoints_are_refused_naming_the_file(tmp_path):
    writer, _ = writer_pair(track_generations=True)
    writer.extend(torch.arange(3.0))
    writer.dumps(tmp_path / "dump")
    before = writer.state_dict()
    metadata = json.loads((tmp_path / "dump/metadata.json").read_text())
    for change, message in (
        ({"generation_shape": [4]}, "generation.memmap: holds 40 bytes"),
        ({"generation_shape": "5"}, "generation_shape must be"),
        ({"generation_shape": [3, 4]}, "generation_shape must be"),
        ({"generation_dtype": "torch.float32"}, "generation_dtype must be torch.int64"),
        ({"generation_dtype": "nonsense"}, "unknown dtype 'nonsense'"),
        ({"write_count": -1}, "write_count must be an integer >= 0"),
        ({"write_count": "x"}, "write_count must be an integer >= 0"),
    ):
        (tmp_path / "dump/metadata.json").write_text(json.dumps({**metadata, **change}))
        with pytest.raises(ValueError, match=message) as refused:
            writer.loads(tmp_path / "dump")
        # the file is named: metadata.json, or the memmap its shape does not fit
        assert str(tmp_path / "dump") in str(refused.value)
        assert_same(writer.state_dict(), before)


def test_round_robin_writer_defaults_match_torchrl():
    ours, ref = O.RoundRobinWriter(), TW.RoundRobinWriter()
    assert ours._compilable is ref._compilable is False


@needs_generations
@pytest.mark.parametrize("name", ["RoundRobinWriter", "TensorDictRoundRobinWriter"])
def test_write_at_an_int32_index_returns_and_stamps_a_long_index(name):
    # torchrl takes the rows as int64 whatever the index tensor's dtype: the returned index
    # and a tensordict's "index" entry are int64
    pair = writer_pair(name)
    for writer in pair:
        writer.extend(TensorDict({"obs": torch.arange(4.0)}, [4]))
    got = []
    for writer in pair:
        data = TensorDict({"obs": torch.tensor([10.0, 30.0])}, [2])
        got.append((writer.write_at(torch.tensor([1, 3], dtype=torch.int32), data), data))
    assert got[0][0].dtype == torch.long
    assert_same(got[0], got[1])
    assert_same(pair[0]._storage[:], pair[1]._storage[:])


@needs_generations
def test_write_at_a_tensorclass_batch_gets_no_index_entry():
    @tensorclass
    class Step:
        obs: torch.Tensor

    pair = writer_pair("TensorDictRoundRobinWriter")
    for writer in pair:
        writer.extend(Step(obs=torch.arange(4.0), batch_size=[4]))
    for writer in pair:
        batch = Step(obs=torch.tensor([10.0, 30.0]), batch_size=[2])
        index = writer.write_at(torch.tensor([1, 3]), batch)
        assert torch.equal(index, torch.tensor([1, 3]))
        assert "index" not in batch.to_tensordict().keys()
    assert torch.equal(pair[0]._storage[:].obs, pair[1]._storage[:].obs)


@needs_generations
def test_max_value_writer_write_count_crosses(tmp_path):
    ours, ref = writer_pair(name="TensorDictMaxValueWriter", capacity=3, rank_key="key")
    for writer in (ours, ref):
        writer.extend(TensorDict({"key": torch.tensor([3.0, 1.0, 5.0, 0.0, 4.0])}, [5]))
    ours.dumps(tmp_path / "ours")
    ref.dumps(tmp_path / "ref")
    assert json.loads((tmp_path / "ours/metadata.json").read_text()) == json.loads(
        (tmp_path / "ref/metadata.json").read_text()
    )
    fresh_ours, fresh_ref = writer_pair(name="TensorDictMaxValueWriter", capacity=3, rank_key="key")
    fresh_ours.loads(tmp_path / "ref")
    fresh_ref.loads(tmp_path / "ours")
    assert fresh_ours._write_count == fresh_ref._write_count == 4


# --------------------------------------------------------------- buffer samples


def buffer_pair(cls="TensorDictReplayBuffer", capacity=10, track=True, writer="TensorDictRoundRobinWriter", **kwargs):
    extra = {"track_generations": True} if track else {}
    ours = getattr(O, cls)(storage=O.LazyTensorStorage(capacity), writer=getattr(O, writer)(**extra), **kwargs)
    ref = getattr(T, cls)(storage=TS.LazyTensorStorage(capacity), writer=getattr(TW, writer)(**extra), **kwargs)
    return ours, ref


def records(n, start=0):
    step = torch.arange(start, start + n)
    return TensorDict(
        {"obs": step.float().unsqueeze(-1).expand(n, 3).clone(), "v": step.clone(), ("nested", "x"): step.float()},
        [n],
    )


@needs_generations
@pytest.mark.parametrize(
    "cls,writer",
    [("TensorDictReplayBuffer", "TensorDictRoundRobinWriter"), ("ReplayBuffer", "RoundRobinWriter")],
)
@pytest.mark.parametrize("track", [True, False])
def test_samples_carry_generations_as_torchrl(cls, writer, track):
    ours, ref = buffer_pair(cls, writer=writer, track=track, batch_size=6)
    for rb in (ours, ref):
        rb.extend(records(14) if cls == "TensorDictReplayBuffer" else torch.arange(14.0))
    for _ in range(3):
        torch.manual_seed(3)
        got, got_info = ours.sample(return_info=True)
        torch.manual_seed(3)
        expected, expected_info = ref.sample(return_info=True)
        assert_same(got, expected)
        assert_same(got_info, expected_info)
    assert ("index_generation" in got_info) == track


# --------------------------------------------------------------- conditional updates


@needs_generations
@settings(max_examples=25, deadline=None)
@given(
    capacity=st.integers(2, 8),
    first=st.integers(1, 10),
    later=st.integers(0, 10),
    picks=st.lists(st.integers(0, 7), min_size=1, max_size=8),
    versions=st.lists(st.integers(0, 12), min_size=8, max_size=8),
    use_version=st.sampled_from([None, "scalar", "tensor"]),
    require_newer=st.booleans(),
    as_tensordict=st.booleans(),
)
def test_update_if_present_matches_torchrl(
    capacity, first, later, picks, versions, use_version, require_newer, as_tensordict
):
    ours, ref = buffer_pair(capacity=capacity)
    for rb in (ours, ref):
        rb.extend(records(first))
    index = torch.tensor([p % min(first, capacity) for p in picks])
    generation = ours.writer.generations_of(index)
    assert_same(generation, ref.writer.generations_of(index))
    for rb in (ours, ref):
        if later:
            rb.extend(records(later, start=100))  # some handles go stale
    n = index.numel()
    patch = {"obs": torch.arange(n * 3.0).reshape(n, 3) + 0.5, ("nested", "x"): -torch.arange(float(n))}
    if as_tensordict:
        patch = TensorDict(patch, [n])
    kwargs = {"require_newer": require_newer}
    if use_version == "scalar":
        kwargs.update(version_key="v", version=versions[0])
    elif use_version == "tensor":
        kwargs.update(version_key="v", version=torch.tensor(versions[:n]))
    got = ours.update_if_present(index=index, generation=generation, patch=patch, **kwargs)
    expected = ref.update_if_present(index=index, generation=generation, patch=patch, **kwargs)
    assert isinstance(got, type(expected)) and isinstance(got, O.ConditionalUpdateResult)
    assert_same(got.updated, expected.updated)
    assert (got.version_rejected is None) == (expected.version_rejected is None)
    if expected.version_rejected is not None:
        assert_same(got.version_rejected, expected.version_rejected)
    assert (got.updated_count, got.stale_count, got.version_rejected_count) == (
        expected.updated_count,
        expected.stale_count,
        expected.version_rejected_count,
    )
    assert_same(ours[:], ref[:])


@needs_generations
def test_update_if_present_on_ndim2_storage_matches_torchrl():
    def make(lib_rb, lib_storage, lib_writer):
        return lib_rb.TensorDictReplayBuffer(
            storage=lib_storage.LazyTensorStorage(3, ndim=2), writer=lib_writer.TensorDictRoundRobinWriter(track_generations=True)
        )

    ours, ref = make(O, O, O), make(T, TS, TW)
    data = TensorDict({"obs": torch.arange(8.0).reshape(2, 4), "v": torch.ones(2, 4, dtype=torch.long)}, [2, 4])
    got_index, ref_index = ours.extend(data.clone()), ref.extend(data.clone())
    assert_same(got_index, ref_index)
    cells = got_index[:3]
    generation = ours.writer.generations_of(cells)
    kwargs = dict(index=cells, generation=generation, patch={"obs": torch.full((3,), 9.0)}, version_key="v", version=2)
    assert_same(ours.update_if_present(**kwargs).updated, ref.update_if_present(**kwargs).updated)
    assert_same(ours[:], ref[:])


@needs_generations
def test_update_if_present_errors_match_torchrl():
    ours, ref = buffer_pair()
    for rb in (ours, ref):
        rb.extend(records(4))
    index = torch.arange(4)
    generation = ours.writer.generations_of(index)
    before = ours[:].clone()
    for kwargs in (
        dict(patch={"missing": torch.zeros(4)}),
        dict(patch={"obs": torch.zeros(4, 2)}),
        dict(patch={"obs": torch.zeros(4, 3, dtype=torch.float64)}),
        dict(patch={"obs": torch.zeros(4, 3)}, version_key="v"),
        dict(patch={"obs": torch.zeros(4, 3)}, version=3),
        dict(patch={"v": torch.zeros(4, dtype=torch.long)}, version_key="v", version=3),
        dict(patch={"obs": torch.zeros(4, 3)}, version_key="nested.x", version=3),
        dict(patch={"v": torch.zeros(4, dtype=torch.long)}, version_key="obs", version=3),
        dict(patch={"obs": torch.zeros(4, 3)}, version_key="v", version=torch.zeros(3)),
        dict(patch={"obs": torch.zeros(4, 3)}, generation=torch.zeros(3, dtype=torch.long)),
    ):
        call = dict(index=index, generation=generation) | kwargs
        same_error(lambda: ours.update_if_present(**call), lambda: ref.update_if_present(**call))
        assert_same(ours[:], before)
    # a writer without generations, a storage without tensordict fields
    for track, cls, writer in ((False, "TensorDictReplayBuffer", "TensorDictRoundRobinWriter"),):
        plain_ours, plain_ref = buffer_pair(cls, writer=writer, track=track)
        for rb in (plain_ours, plain_ref):
            rb.extend(records(2))
        call = dict(index=torch.arange(2), generation=torch.zeros(2, dtype=torch.long), patch={"v": torch.ones(2, dtype=torch.long)})
        same_error(lambda: plain_ours.update_if_present(**call), lambda: plain_ref.update_if_present(**call))
    list_ours = O.ReplayBuffer(storage=O.ListStorage(4), writer=O.RoundRobinWriter(track_generations=True))
    list_ref = T.ReplayBuffer(storage=TS.ListStorage(4), writer=TW.RoundRobinWriter(track_generations=True))
    call = dict(index=torch.arange(1), generation=torch.zeros(1, dtype=torch.long), patch={"v": torch.ones(1)})
    same_error(lambda: list_ours.update_if_present(**call), lambda: list_ref.update_if_present(**call))
    empty_ours, empty_ref = buffer_pair()
    call = dict(index=torch.arange(1), generation=torch.zeros(1, dtype=torch.long), patch={"v": torch.ones(1)})
    same_error(lambda: empty_ours.update_if_present(**call), lambda: empty_ref.update_if_present(**call))


@needs_generations
def test_submitted_updates_run_in_order_before_later_samples():
    ours, _ = buffer_pair(capacity=4, batch_size=4)
    ours.extend(records(4))
    index = torch.arange(4)
    generation = ours.writer.generations_of(index)
    futures = [
        ours.submit_update_if_present(
            index=index, generation=generation, patch={"v": torch.full((4,), k)}, version_key=("nested", "x"), version=3.0
        )
        for k in range(5)
    ]
    sample = ours.sample()  # waits for the last update submitted
    assert (sample["v"] == 4).all()
    assert [f.result().updated_count for f in futures] == [4] * 5
    ours.extend(records(4, start=10))  # every handle goes stale
    stale = ours.submit_update_if_present(index=index, generation=generation, patch={"v": torch.zeros(4, dtype=torch.long)})
    assert stale.result().stale_count == 4
    failing = ours.submit_update_if_present(index=index, generation=generation, patch={"missing": torch.zeros(4)})
    with pytest.raises(KeyError):
        failing.result()
    with pytest.raises(KeyError):
        ours.sample()  # the next sample reports the failed update, as torchrl's does
    with pytest.raises(KeyError):
        ours.synchronize()  # and so does synchronize, once: it settles the updates
    ours.synchronize()
    assert ours.sample().shape == (4,)  # sampling works again
    copy = __import__("pickle").loads(__import__("pickle").dumps(ours))
    assert "_update_queue" in copy.__dict__ and copy.__dict__["_update_queue"].sample_dependency() is None


@needs_generations
def test_submitted_update_waits_for_prefetched_samples():
    ours = O.TensorDictReplayBuffer(
        storage=O.LazyTensorStorage(8),
        writer=O.TensorDictRoundRobinWriter(track_generations=True),
        batch_size=8,
        prefetch=2,
        sampler=O.SamplerWithoutReplacement(shuffle=False),
    )
    ours.extend(records(8))
    first = ours.sample()  # prefetches the next batches
    index = torch.arange(8)
    future = ours.submit_update_if_present(index=index, generation=ours.writer.generations_of(index), patch={"v": -torch.ones(8, dtype=torch.long)})
    assert future.result().updated_count == 8
    assert (first["v"] >= 0).all()
    later = [ours.sample() for _ in range(3)]
    # batches prefetched before the update hold the old values; the last is sampled after it
    assert (later[-1]["v"] == -1).all()


# -------------------------------------------------------- in-place and ordered writes


def test_in_place_and_ordered_writes_match_torchrl():
    ours, ref = buffer_pair(capacity=6, track=False)
    for rb in (ours, ref):
        rb.extend(records(4))
    steps = []
    if since("buffer_in_place_writes"):
        steps += [
            lambda rb: rb.set_at_("obs", torch.full((2, 3), 7.0), torch.tensor([1, 3])),
            lambda rb: rb.set_("v", torch.arange(10, 14)),
            lambda rb: rb.update_({"v": torch.arange(20, 24)}),
            lambda rb: rb.update_(TensorDict({"v": torch.zeros(4, dtype=torch.long), "obs": torch.ones(4, 3)}, [4]), keys_to_update=["obs"]),
            lambda rb: rb.set_at_("v", torch.tensor(5), np.array([0])),
        ]
    if since("buffer_write_all"):
        steps += [
            lambda rb: rb.write_all(records(4, start=50)),
            lambda rb: rb.write_all(records(2, start=60), end=2),
            lambda rb: rb.read_all_in_order(),
            lambda rb: rb.read_all_in_order(end=3),
        ]
    for step in steps:
        got, expected = step(ours), step(ref)
        if expected is ref:
            assert got is ours
        else:
            assert_same(got, expected)
        assert_same(ours[:], ref[:])
    for rb in (ours, ref):
        rb.extend(records(2, start=30))  # now full: write_all covers everything
    if since("buffer_write_all"):
        ours.write_all(records(6, start=70))
        ref.write_all(records(6, start=70))
        assert_same(ours[:], ref[:])
    if since("buffer_in_place_writes"):
        same_error(lambda: ours.set_("missing_key_", torch.zeros(6)), lambda: ref.set_("missing_key_", torch.zeros(6)))


@pytest.mark.skipif(not since("buffer_in_place_writes"), reason="in-place writes come with torchrl 0.12")
def test_in_place_writes_reach_slice_readers():
    """An in-place write to the trajectory key is seen by a slice sampler's next draw (the
    storage is told its items changed): once every item is its own trajectory, slices are
    one item long."""
    rb = O.TensorDictReplayBuffer(
        storage=O.LazyTensorStorage(8),
        sampler=O.SliceSampler(num_slices=2, traj_key="traj", strict_length=False),
        batch_size=4,
    )
    rb.extend(TensorDict({"traj": torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]), "obs": torch.arange(8)}, [8]))
    torch.manual_seed(0)
    assert rb.sample().shape == (4,)
    rb.set_("traj", torch.arange(8))
    torch.manual_seed(0)
    assert rb.sample().shape == (2,)
    rb.set_at_("traj", torch.zeros(8, dtype=torch.long), np.arange(8))
    torch.manual_seed(0)
    assert rb.sample().shape == (4,)


@needs_generations
def test_buffer_checkpoints_carry_generations_both_ways(tmp_path):
    """A tracking buffer's state_dict and dumps, ours loaded by torchrl 0.14.1 and back."""
    ours, ref = buffer_pair(capacity=6)
    for rb in (ours, ref):
        rb.extend(records(9))
        rb.writer.write_at(torch.tensor([0, 4]), records(2, start=40))
    ours.dumps(tmp_path / "ours")
    ref.dumps(tmp_path / "ref")
    for source, lib, storage_lib, writer_lib in (("ref", O, O, O), ("ours", T, TS, TW)):
        fresh = lib.TensorDictReplayBuffer(
            storage=storage_lib.LazyTensorStorage(6), writer=writer_lib.TensorDictRoundRobinWriter(track_generations=True)
        )
        fresh.loads(tmp_path / source)
        assert_same(fresh.writer.generations_of(torch.arange(6)), ref.writer.generations_of(torch.arange(6)))
        assert fresh.write_count == 11
        assert_same(fresh[:], ref[:])
    state = ours.state_dict()
    assert_same(state["_writer"], ref.state_dict()["_writer"])
    fresh = T.TensorDictReplayBuffer(
        storage=TS.LazyTensorStorage(6), writer=TW.TensorDictRoundRobinWriter(track_generations=True)
    )
    fresh.load_state_dict(state)
    assert_same(fresh.writer.generations_of(torch.arange(6)), ours.writer.generations_of(torch.arange(6)))
    back = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(6), writer=O.TensorDictRoundRobinWriter(track_generations=True))
    back.load_state_dict(fresh.state_dict())
    assert_same(back.writer.state_dict(), ours.writer.state_dict())
    # emptying advances every written slot: old handles go stale
    back.empty()
    assert (back.writer.generations_of(torch.arange(6)) == ours.writer.generations_of(torch.arange(6)) + 1).all()


@needs_generations
def test_docstring_examples():
    import doctest

    import torchrl_compat.replay_buffers._conditional_update as conditional

    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    for obj in (
        O.ReplayBuffer.update_if_present,
        O.ReplayBuffer.submit_update_if_present,
        O.ConditionalUpdateResult,
        O.RoundRobinWriter,
        O.TensorDictRoundRobinWriter,
    ):
        for test in finder.find(obj, globs=dict(vars(O)) | dict(vars(conditional))):
            runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted >= 20 and result.failed == 0
