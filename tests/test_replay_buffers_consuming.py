"""Consumed items (``consume_after_n_samples``, ``ConsumingSampler``, torchrl 0.14): the same
operations on our buffers and on torchrl's, seeded alike, give the same batches, write rows,
lengths and sampler states; checkpoints cross both ways."""
from __future__ import annotations

import pickle

import pytest
import torch
from tensordict import TensorDict

import torchrl_compat as O
from torchrl_compat._releases import since
from twin_checks import assert_api_matches, assert_no_torchrl_code

T = pytest.importorskip("torchrl.data")

pytestmark = pytest.mark.skipif(
    not since("buffer_consume_after_n_samples"), reason="a torchrl 0.14 behaviour"
)


def _items(n, start=0):
    return TensorDict({"obs": torch.arange(start, start + n, dtype=torch.float32), "a": torch.arange(start, start + n)}, [n])


def _pair(storage="LazyTensorStorage", size=10, tensordict=True, **kwargs):
    made = []
    for ns in (O, T):
        cls = ns.TensorDictReplayBuffer if tensordict else ns.ReplayBuffer
        made.append(cls(storage=getattr(ns, storage)(size), **kwargs))
    return made


def _same_state(ours, theirs):
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b)
    for key in a:
        x, y = a[key], b[key]
        if isinstance(y, torch.Tensor):
            assert x is not None and torch.equal(x, y), key
        else:
            assert x == y, key


def _run_same(ours, theirs, steps, seed=0):
    """Runs ``steps`` (("extend", n) / ("add",) / ("sample", n)) on both buffers with the
    global generator seeded alike before each draw; checks every result."""
    start = 0
    # writes are counted from here (a loaded writer starts from the count it restored)
    counted = ours._writer._write_count, theirs._writer._write_count
    for step in steps:
        if step[0] == "extend":
            data = _items(step[1], start)
            start += step[1]
            got, expected = ours.extend(data.clone()), theirs.extend(data.clone())
            assert torch.equal(torch.as_tensor(got), torch.as_tensor(expected)), step
        elif step[0] == "add":
            data = _items(1, start)[0]
            start += 1
            assert int(ours.add(data.clone())) == int(theirs.add(data.clone())), step
        else:
            seed += 1
            torch.manual_seed(seed)
            outcome = []
            for rb in (ours, theirs):
                torch.manual_seed(seed)
                try:
                    outcome.append(rb.sample(step[1], return_info=True))
                except RuntimeError as err:
                    outcome.append(str(err))
            if isinstance(outcome[1], str):
                assert outcome[0] == outcome[1]
            else:
                assert torch.equal(outcome[0][0]["a"], outcome[1][0]["a"]), step
                assert torch.equal(outcome[0][1]["index"], outcome[1][1]["index"]), step
        assert len(ours) == len(theirs), step
        assert ours._writer._cursor == theirs._writer._cursor, step
        assert ours._writer._write_count - counted[0] == theirs._writer._write_count - counted[1], step
        assert len(ours._storage) == len(theirs._storage), step
        assert torch.equal(ours[:]["a"], theirs[:]["a"]), step
        _same_state(ours._sampler, theirs._sampler)


STEPS = [
    ("extend", 6), ("sample", 4), ("extend", 3), ("sample", 5), ("add",), ("extend", 7),
    ("sample", 10), ("sample", 3), ("extend", 2), ("add",), ("sample", 20), ("sample", 1),
    ("extend", 12), ("sample", 6),
]


@pytest.mark.parametrize("count", [1, 2, 3])
@pytest.mark.parametrize("storage", ["LazyTensorStorage", "ListStorage"])
def test_consuming_buffer_matches_torchrl(count, storage):
    """Samples, consumed slots refilled first (then the cursor, past them), wrap-around at
    capacity, an empty live set, len() and the sampler state, step by step."""
    ours, theirs = _pair(storage, consume_after_n_samples=count)
    assert type(ours._sampler).__name__ == "ConsumingSampler"
    _run_same(ours, theirs, STEPS)


def test_explicit_sampler_and_plain_buffer_match_torchrl():
    ours = O.ReplayBuffer(storage=O.ListStorage(6), sampler=O.ConsumingSampler(2), batch_size=3)
    theirs = T.ReplayBuffer(storage=T.ListStorage(6), sampler=T.ConsumingSampler(2), batch_size=3)
    assert ours._consume_after_n_samples == theirs._consume_after_n_samples == 2
    for rb in (ours, theirs):
        rb.extend([torch.tensor(i) for i in range(5)])
    for seed in range(6):
        torch.manual_seed(seed)
        got = ours.sample() if len(ours) else None
        torch.manual_seed(seed)
        expected = theirs.sample() if len(theirs) else None
        assert (got is None and expected is None) or torch.equal(got, expected)
        assert len(ours) == len(theirs)
    assert ours._sampler.ran_out == theirs._sampler.ran_out
    assert repr(ours._sampler) == repr(theirs._sampler)
    for rb in (ours, theirs):
        rb.extend([torch.tensor(10 + i) for i in range(4)])
    assert ours[:] == theirs[:] if isinstance(ours[:], list) else torch.equal(ours[:], theirs[:])


def test_iteration_stops_when_all_consumed():
    ours, theirs = _pair(batch_size=4, consume_after_n_samples=1)
    for rb in (ours, theirs):
        rb.extend(_items(10))
    batches = []
    for rb in (ours, theirs):
        torch.manual_seed(5)
        batches.append([b["a"] for b in rb])
    assert [len(b) for b in batches[0]] == [4, 4, 2]
    assert all(torch.equal(x, y) for x, y in zip(*batches))
    assert len(ours) == 0 and ours.stats()["size"] == 0 == theirs.stats()["size"]
    assert not ours.can_sample() and not theirs.can_sample()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"sampler": "SliceSampler"}, ValueError, "only supports the default RandomSampler"),
        ({"sampler": "SamplerWithoutReplacement"}, ValueError, "only supports the default RandomSampler"),
        ({"sampler": "ConsumingSampler"}, ValueError, "conflicts with the provided"),
        ({"storage": "ndim2"}, ValueError, "only supports 1-dimensional storages"),
        ({"writer": "without write_at"}, TypeError, "requires a writer with a callable"),
    ],
)
def test_consuming_errors_match_torchrl(kwargs, error, match):
    for ns in (O, T):
        parts = {"consume_after_n_samples": 2, "storage": ns.LazyTensorStorage(8)}
        if kwargs.get("sampler") == "SliceSampler":
            parts["sampler"] = ns.SliceSampler(num_slices=2)
        elif kwargs.get("sampler") == "ConsumingSampler":
            parts["sampler"] = ns.ConsumingSampler(3)
        elif "sampler" in kwargs:
            parts["sampler"] = getattr(ns, kwargs["sampler"])()
        if kwargs.get("storage") == "ndim2":
            parts["storage"] = ns.LazyTensorStorage(8, ndim=2)
        if "writer" in kwargs:
            # a round-robin writer whose write_at a subclass took away
            parts["writer"] = type("WriterWithoutWriteAt", (ns.RoundRobinWriter,), {"write_at": None})()
        with pytest.raises(error, match=match):
            ns.ReplayBuffer(**parts)
    for ns in (O, T):
        with pytest.raises(TypeError, match="max_sample_count must be a positive integer"):
            ns.ConsumingSampler(1.5)
        with pytest.raises(ValueError, match="max_sample_count must be a positive integer"):
            ns.ConsumingSampler(0)


def test_set_sampler_follows_the_count():
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(8))
    rb.set_sampler(O.ConsumingSampler(4))
    assert rb._consume_after_n_samples == 4
    rb.extend(torch.arange(3))
    assert len(rb) == 3
    rb.set_sampler(O.RandomSampler())
    assert rb._consume_after_n_samples is None
    prefetching = O.ReplayBuffer(storage=O.LazyTensorStorage(8), batch_size=2, prefetch=2)
    with pytest.raises(ValueError, match="Prefetching is not supported with ConsumingSampler"):
        prefetching.set_sampler(O.ConsumingSampler())


def _filled(ns):
    rb = ns.TensorDictReplayBuffer(storage=ns.LazyTensorStorage(8), consume_after_n_samples=2, batch_size=3)
    rb.extend(_items(8))
    torch.manual_seed(9)
    rb.sample()
    rb.sample()
    rb.sample()
    return rb


@pytest.mark.parametrize("source", ["ours", "torchrl"])
def test_state_dict_and_dumps_cross(tmp_path, source):
    """A consuming buffer saved by one library and loaded by the other holds the same
    counts, free list and ``consume_after_n_samples``, and goes on alike."""
    saved = _filled(O if source == "ours" else T)
    state = saved.state_dict()
    assert state["_consume_after_n_samples"] == 2
    saved.dumps(tmp_path / "saved")
    assert (tmp_path / "saved" / "sampler" / "consuming_sampler.pt").exists()
    for load in ("state_dict", "dumps"):
        loaded = []
        for ns in (O, T):
            rb = ns.TensorDictReplayBuffer(storage=ns.LazyTensorStorage(8), sampler=ns.ConsumingSampler(2), batch_size=3)
            if load == "state_dict":
                rb.load_state_dict(state)
            else:
                rb.loads(tmp_path / "saved")
            assert rb._consume_after_n_samples == 2
            loaded.append(rb)
        _same_state(loaded[0]._sampler, saved._sampler)
        _run_same(*loaded, [("extend", 3), ("sample", 3), ("extend", 4), ("sample", 3), ("sample", 3)], seed=30)


def test_pickled_consuming_buffer_goes_on_alike():
    rb = _filled(O)
    copy = pickle.loads(pickle.dumps(rb))
    assert len(copy) == len(rb)
    for target in (rb, copy):
        torch.manual_seed(12)
        target.extend(_items(2, 100))
    torch.manual_seed(13)
    a = rb.sample()["a"]
    torch.manual_seed(13)
    assert torch.equal(copy.sample()["a"], a)


def test_load_state_dict_copies_and_rebuilds_free_list():
    state = dict(_filled(O)._sampler.state_dict())
    other = O.ConsumingSampler(2)
    other.load_state_dict(state)
    state["_sample_count"].fill_(0)
    assert other._sample_count.sum() > 0
    # a state without a free list (as older checkpoints): rebuilt from the counts, as torchrl does
    rebuilt, theirs = O.ConsumingSampler(2), T.ConsumingSampler(2)
    for sampler, ns in ((rebuilt, O), (theirs, T)):
        sampler.load_state_dict({k: v for k, v in _filled(ns)._sampler.state_dict().items() if k != "_free_indices"})
    assert torch.equal(rebuilt._free_indices, theirs._free_indices)
    assert rebuilt._remaining_batches == theirs._remaining_batches


def test_empty_resets_everything():
    ours, theirs = _pair(consume_after_n_samples=1)
    _run_same(ours, theirs, [("extend", 5), ("sample", 3)])
    for rb in (ours, theirs):
        rb.empty()
    assert len(ours) == len(theirs) == 0
    _run_same(ours, theirs, [("extend", 4), ("sample", 2), ("add",), ("sample", 5)], seed=50)


def test_consuming_sampler_stands_in_for_torchrl():
    assert_api_matches(O.ConsumingSampler, T.ConsumingSampler)
    assert_no_torchrl_code(O.ConsumingSampler)
    assert "ConsumingSampler" in O.__all__
