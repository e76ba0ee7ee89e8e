"""Buffer checkpoints crossing between the installed torchrl and torchrl_compat, both ways.

``state_dict`` / ``load_state_dict``, ``dumps`` / ``loads`` and pickling: a checkpoint
written by one library is loaded by the other, which must then hold the same items,
cursor, priorities and generator state, and go on sampling the same batches. Golden
checkpoints written by torchrl's own buffers are loaded back too: torchrl 0.11's
(``tests/data/make_golden_buffers.py``, on the torch its trees load on) where that release
is followed, torchrl 0.14.1's (``tests/data/make_golden_buffers014.py``: prefetch state and
consumed items) where 0.14 is.
"""
from __future__ import annotations

import copy
import json
import pathlib
import pickle

import numpy as np
import pytest
import torch
import torchrl.data as TD
import torchrl.data.replay_buffers.samplers as TS

import torchrl_compat as O
from torchrl_compat._releases import since

# the data the golden checkpoints hold, as the script that wrote them builds it
from data.make_golden_buffers import golden_transitions
from test_replay_buffers import assert_same, assert_same_info, make_td, torchrl_trees  # noqa: F401

DATA = pathlib.Path(__file__).parent / "data"
LIBS = {"ours": O, "torchrl": TD}


def make(lib, kind, **kwargs):
    if kind == "tensordict":
        return lib.TensorDictReplayBuffer(
            storage=lib.LazyTensorStorage(16), batch_size=5, generator=torch.Generator().manual_seed(7), **kwargs
        )
    if kind == "prioritized":
        return lib.TensorDictPrioritizedReplayBuffer(
            alpha=0.6, beta=0.4, storage=lib.LazyTensorStorage(16), batch_size=5,
            generator=torch.Generator().manual_seed(7), **kwargs,
        )
    if kind == "memmap":
        return lib.TensorDictReplayBuffer(
            storage=lib.LazyMemmapStorage(16), batch_size=5, generator=torch.Generator().manual_seed(7), **kwargs
        )
    return lib.ReplayBuffer(storage=lib.LazyTensorStorage(16), batch_size=5, **kwargs)


def fill(rb, kind):
    if kind == "tensor":
        rb.extend(torch.arange(20.0).unsqueeze(-1))
        return
    for step in range(3):
        data = make_td(7, seed=step)
        if kind == "prioritized":
            data["td_error"] = torch.arange(7.0) + step
        rb.extend(data)
    if kind == "prioritized":
        sample = rb[torch.tensor([1, 2, 9])]
        sample["td_error"] = torch.tensor([9.0, 0.5, 4.0])
        rb.update_tensordict_priority(sample)


def sorted_leaves(data):
    if isinstance(data, torch.Tensor):
        return {"": data}
    return dict(sorted((str(k), v) for k, v in data.items(include_nested=True, leaves_only=True)))


def assert_same_content(a, b):
    """The same items, cursor, batch size and generator state (key order aside: a storage
    loaded from a checkpoint lists its keys in the checkpoint's order)."""
    assert len(a) == len(b)
    la, lb = sorted_leaves(a[:]), sorted_leaves(b[:])
    assert la.keys() == lb.keys()
    for key in la:
        assert la[key].dtype == lb[key].dtype and torch.equal(la[key], lb[key]), key
    assert a._writer._cursor == b._writer._cursor
    assert a._batch_size == b._batch_size
    if a._rng is not None or b._rng is not None:
        assert torch.equal(a._rng.get_state(), b._rng.get_state())


def assert_same_future(a, b, make_data=None):
    """The two buffers sample the same batches from here on (and write the same rows)."""
    for step in range(3):
        data = make_td(3, seed=40 + step) if make_data is None else make_data(3, 40 + 3 * step)
        assert torch.equal(a.extend(data.clone()), b.extend(data.clone()))
        got, info = a.sample(return_info=True)
        expected, ref_info = b.sample(return_info=True)
        assert_same(got, expected)
        assert_same_info(info, ref_info)


def loaded_pair(kind, load):
    """A fresh buffer of ours and one of torchrl's, each loaded by ``load(buffer)``."""
    made = []
    for lib in (O, TD):
        rb = make(lib, kind)
        if kind == "tensor":
            rb.extend(torch.zeros(1, 1))  # loading tensor data needs an initialized storage
        load(rb)
        made.append(rb)
    return made


def check_loaded(source, ours, ref, kind):
    for target in (ours, ref):
        assert_same_content(target, source)
    if kind == "prioritized":
        for target in (ours, ref):
            for name in ("_alpha", "_beta", "_eps"):
                assert getattr(target._sampler, name) == getattr(source._sampler, name)
            assert float(target._sampler._max_priority[0]) == float(source._sampler._max_priority[0])
            np.testing.assert_array_equal(target._sampler._sum_tree[np.arange(16)],
                                          source._sampler._sum_tree[np.arange(16)])
    if kind != "tensor":
        # ours loaded the checkpoint as torchrl did: same batches from here on
        assert_same_future(ours, ref)


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("kind", ["tensor", "tensordict", "prioritized"])
@pytest.mark.parametrize("writer", ["ours", "torchrl"])
def test_state_dict_crosses(kind, writer):
    source = make(LIBS[writer], kind)
    fill(source, kind)
    state = source.state_dict()
    # the followed release's entries, in torchrl's order
    assert list(state) == list(make(TD, kind).state_dict())
    # loading pops the trees out of a prioritized sampler's state (in torchrl too)
    ours, ref = loaded_pair(kind, lambda rb: rb.load_state_dict(copy.deepcopy(state)))
    check_loaded(source, ours, ref, kind)


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("kind", ["tensor", "tensordict", "prioritized", "memmap"])
@pytest.mark.parametrize("writer", ["ours", "torchrl"])
def test_dumps_crosses(tmp_path, kind, writer):
    source = make(LIBS[writer], kind)
    fill(source, kind)
    source.dumps(tmp_path / "saved")
    ours, ref = loaded_pair(kind, lambda rb: rb.loads(tmp_path / "saved"))
    check_loaded(source, ours, ref, kind)


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("kind", ["tensor", "prioritized"])
def test_dumps_writes_torchrl_files(tmp_path, kind):
    for name, lib in LIBS.items():
        rb = make(lib, kind)
        fill(rb, kind)
        rb.dumps(tmp_path / name)
    ours = sorted(str(p.relative_to(tmp_path / "ours")) for p in (tmp_path / "ours").rglob("*"))
    ref = sorted(str(p.relative_to(tmp_path / "torchrl")) for p in (tmp_path / "torchrl").rglob("*"))
    assert ours == ref
    for name in ("buffer_metadata.json", "writer/metadata.json"):
        assert json.loads((tmp_path / "ours" / name).read_text()) == json.loads((tmp_path / "torchrl" / name).read_text())


def test_transform_state_crosses(tmp_path):
    from torchrl.envs.transforms import ObservationNorm

    made = {}
    for name, lib in LIBS.items():
        norm = ObservationNorm(loc=torch.tensor(1.0), scale=torch.tensor(2.0), in_keys=["obs"])
        made[name] = lib.TensorDictReplayBuffer(storage=lib.LazyTensorStorage(8), transform=norm, batch_size=2)
        made[name].extend(make_td(4))
    made["ours"].transform[0].loc.fill_(3.0)
    made["ours"].dumps(tmp_path)
    assert (tmp_path / "transform.t").exists()
    made["torchrl"].loads(tmp_path)
    assert float(made["torchrl"].transform[0].loc) == 3.0
    made["torchrl"].transform[0].scale.fill_(5.0)
    made["ours"].load_state_dict(made["torchrl"].state_dict())
    assert float(made["ours"].transform[0].scale) == 5.0


@pytest.mark.parametrize("kind", ["tensordict", "prioritized"])
def test_pickle_round_trip(kind):
    rb = make(O, kind)
    fill(rb, kind)
    copy = pickle.loads(pickle.dumps(rb))
    assert_same_content(copy, rb)
    assert type(copy._replay_lock) is type(rb._replay_lock)
    assert_same_future(copy, rb)


# -------------------------------------------------------------------- golden files




def _golden_prioritized(lib):
    return lib.TensorDictPrioritizedReplayBuffer(alpha=0.1, beta=0.1, storage=lib.LazyTensorStorage(8), batch_size=1)


def _check_golden_prioritized(rb):
    expected = torch.cat([golden_transitions(6), golden_transitions(5, start=6)])
    rows = torch.tensor([8, 9, 10, 3, 4, 5, 6, 7])  # item written last at each row
    assert len(rb) == 8 and rb._writer._cursor == 3 and rb._batch_size == 4
    stored = rb[:]
    for key in ("obs", ("next", "done"), "td_error"):
        assert torch.equal(stored[key], expected[key][rows]), key
    assert torch.equal(stored["index"], torch.arange(8))
    assert (rb._sampler._alpha, rb._sampler._beta) == (0.7, 0.5)
    priority = expected["td_error"][rows].double()
    priority[0], priority[5] = 3.0, 0.25
    leaves = torch.as_tensor(rb._sampler._sum_tree[np.arange(8)]).double()
    torch.testing.assert_close(leaves, ((priority + 1e-8) ** 0.7).float().double())
    assert float(rb._sampler._max_priority[0]) == 3.0 and int(rb._sampler._max_priority[1]) == 2


# torchrl 0.11's prioritized checkpoints, read with 0.11's priority semantics (the maximum
# kept with alpha applied)
written_by_011 = pytest.mark.skipif(since("buffer_prefetch_state"), reason="torchrl 0.11's checkpoints, as 0.11 reads them")


@written_by_011
@pytest.mark.usefixtures("torchrl_trees")
def test_golden_prioritized_dumps_loads():
    rb = _golden_prioritized(O)
    rb.loads(DATA / "golden_prioritized_buffer")
    _check_golden_prioritized(rb)
    ref = _golden_prioritized(TD)
    ref.loads(DATA / "golden_prioritized_buffer")
    _check_golden_prioritized(ref)
    assert torch.equal(rb._rng.get_state(), ref._rng.get_state())
    assert_same_future(rb, ref, golden_transitions)


@written_by_011
@pytest.mark.skipif(
    TS.SumSegmentTreeFp32 is None,
    reason="a torchrl state dict holds torchrl's pickled compiled trees, which only unpickle "
    "where those load (replay's trees do not take torchrl's pickle format)",
)
def test_golden_prioritized_state_dict():
    state = torch.load(DATA / "golden_prioritized_buffer_state_dict.pt", weights_only=False)
    rb = _golden_prioritized(O)
    rb.load_state_dict(copy.deepcopy(state))
    _check_golden_prioritized(rb)
    ref = _golden_prioritized(TD)
    ref.load_state_dict(state)
    assert_same_future(rb, ref, golden_transitions)


def test_golden_max_value_buffer():
    rb = O.TensorDictReplayBuffer(
        storage=O.LazyTensorStorage(4), writer=O.TensorDictMaxValueWriter(rank_key="td_error"), batch_size=2
    )
    rb.loads(DATA / "golden_max_value_buffer")
    kept = sorted(rb[:]["td_error"].tolist())
    assert kept == [1.25, 1.5, 1.75, 2.0]  # the four highest of 0.5 .. 2.0
    assert sorted(value for value, _ in rb._writer._current_top_values) == kept
    assert all(type(row) is int for _, row in rb._writer._current_top_values)
    # the data holds the default priority key: the buffer hands it to its RandomSampler,
    # which warns as torchrl's does
    with pytest.warns(UserWarning, match="sampler RandomSampler that is not prioritized"):
        rb.extend(golden_transitions(1, start=20))  # outranks the lowest
    assert sorted(rb[:]["td_error"].tolist()) == [1.5, 1.75, 2.0, 5.5]


# ------------------------------------------------- torchrl 0.14.1's golden files
written_by_014 = pytest.mark.skipif(not since("buffer_prefetch_state"), reason="torchrl 0.14's checkpoints")


def _golden014():
    from data import make_golden_buffers014 as golden

    return golden


def _check_golden_content(rb, expected, rows, cursor):
    assert len(rb._storage) == len(rows) and rb._writer._cursor == cursor and rb._batch_size == 3
    stored = rb._storage[: len(rows)]
    for key in ("obs", ("next", "done")):
        assert torch.equal(stored[key], expected[key][rows]), key


def _loaded014(name, how):
    """Our buffer and torchrl's, each loading torchrl 0.14.1's golden checkpoint ``name``
    (``dumps`` directory or ``state_dict`` file) into a fresh buffer built as it was."""
    golden = _golden014()
    made = []
    for lib in (O, TD):
        rb = lib.TensorDictReplayBuffer(
            storage=lib.LazyTensorStorage(8), batch_size=3,
            **({"prefetch": 1} if name == golden.PREFETCH else {"sampler": lib.ConsumingSampler(2)}),
        )
        if how == "dumps":
            rb.loads(DATA / name)
        else:
            rb.load_state_dict(torch.load(DATA / f"{name}_state_dict.pt", weights_only=False))
        made.append(rb)
    return golden, made


@written_by_014
@pytest.mark.parametrize("how", ["dumps", "state_dict"])
def test_golden014_prefetch_buffer(how):
    """The batch torchrl sampled ahead comes out first, then both go on alike."""
    golden, (ours, ref) = _loaded014("golden_trl014_prefetch_buffer", how)
    expected = torch.cat([golden.golden_transitions(6), golden.golden_transitions(5, start=6)])
    for rb in (ours, ref):
        _check_golden_content(rb, expected, torch.tensor([8, 9, 10, 3, 4, 5, 6, 7]), cursor=3)
    if how == "dumps":
        with open(DATA / golden.PREFETCH / "prefetch.pkl", "rb") as file:
            saved = pickle.load(file)
    else:
        saved = torch.load(DATA / f"{golden.PREFETCH}_state_dict.pt", weights_only=False)["_prefetch_state"]
    assert saved["capacity"] == 1 and len(saved["queue"]) == 1
    ahead = saved["queue"][0][0]["index"]
    assert len(ours._prefetch_queue) == 1
    assert torch.equal(ours.sample()["index"], ahead) and torch.equal(ref.sample()["index"], ahead)
    ours.synchronize(), ref.synchronize()  # the next batch ahead drawn in both
    assert torch.equal(ours._rng.get_state(), ref._rng.get_state())
    for _ in range(3):
        assert torch.equal(ours.sample()["index"], ref.sample()["index"])
    ours.shutdown(), ref.shutdown()


@written_by_014
@pytest.mark.parametrize("how", ["dumps", "state_dict"])
def test_golden014_consuming_buffer(how):
    """The counts, live mask and free list torchrl saved, then the same writes and batches."""
    golden, (ours, ref) = _loaded014("golden_trl014_consuming_buffer", how)
    for rb in (ours, ref):
        assert rb._consume_after_n_samples == 2
    # the two items written last went into consumed slots: the storage did not grow
    assert len(ours) == len(ref) and len(ours._storage) == len(ref._storage) == 6
    theirs_state = ref._sampler.state_dict()
    for key, value in ours._sampler.state_dict().items():
        expected = theirs_state[key]
        assert torch.equal(value, expected) if isinstance(expected, torch.Tensor) else value == expected, key
    stored = [rb._storage[: len(rb._storage)] for rb in (ours, ref)]
    assert torch.equal(stored[0]["obs"], stored[1]["obs"])
    for step in range(4):
        data = golden.golden_transitions(2, start=20 + 2 * step)
        assert torch.equal(ours.extend(data.clone()), ref.extend(data.clone()))
        torch.manual_seed(step)
        got = ours.sample()["index"]
        torch.manual_seed(step)
        assert torch.equal(got, ref.sample()["index"])
        assert len(ours) == len(ref)


@written_by_014
@pytest.mark.parametrize("name", ["golden_trl014_prefetch_buffer", "golden_trl014_consuming_buffer"])
def test_ours_written_as_golden014_loads_in_torchrl(tmp_path, name):
    """The same buffers built by ours and saved are loaded by torchrl 0.14.1 as its own
    checkpoint is: the same files, and the same state once loaded."""
    golden = _golden014()
    build = golden.prefetch_buffer if name == golden.PREFETCH else golden.consuming_buffer
    ours = build(O)
    ours.dumps(tmp_path / "ours")
    files = sorted(str(p.relative_to(tmp_path / "ours")) for p in (tmp_path / "ours").rglob("*"))
    assert files == sorted(str(p.relative_to(DATA / name)) for p in (DATA / name).rglob("*"))
    assert json.loads((tmp_path / "ours" / "buffer_metadata.json").read_text()) == json.loads(
        (DATA / name / "buffer_metadata.json").read_text()
    )
    state = ours.state_dict()
    loaded = []
    for source in ("dumps", "state_dict"):
        rb = TD.TensorDictReplayBuffer(
            storage=TD.LazyTensorStorage(8), batch_size=3,
            **({"prefetch": 1} if name == golden.PREFETCH else {"sampler": TD.ConsumingSampler(2)}),
        )
        if source == "dumps":
            rb.loads(tmp_path / "ours")
        else:
            rb.load_state_dict(state)
        loaded.append(rb)
    for rb in loaded:
        assert len(rb) == len(ours)
        assert torch.equal(rb._storage[: len(rb._storage)]["obs"], ours._storage[: len(ours._storage)]["obs"])
        if name == golden.PREFETCH:
            assert torch.equal(rb._rng.get_state(), ours._rng.get_state())
            assert len(rb._prefetch_queue) == len(ours._prefetch_queue) == 1
    for _ in range(3):
        torch.manual_seed(4)
        expected = ours.sample()["index"]
        for rb in loaded:
            torch.manual_seed(4)
            assert torch.equal(rb.sample()["index"], expected)
