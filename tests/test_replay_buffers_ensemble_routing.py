"""ReplayBufferEnsemble as torchrl 0.14 has it: routed writes (``routing_key`` /
``routing_dim``), the members of an ensemble built from components, ``stats``, routed
conditional updates and ``end_streams``; compared with torchrl's ensemble on the same
operations."""
from __future__ import annotations

import inspect

import pytest
import torch
from tensordict import TensorDict

import torchrl_compat as O
from torchrl_compat._releases import since

T = pytest.importorskip("torchrl.data")

pytestmark = pytest.mark.skipif(not since("ensemble_sampleable_routing"), reason="a torchrl 0.14 behaviour")

# slot generations (writers' track_generations) are what conditional updates and
# end_streams stand on
with_generations = pytest.mark.skipif(
    "track_generations" not in inspect.signature(O.RoundRobinWriter).parameters,
    reason="needs writers that track slot generations",
)


def _records(n, members=3, start=0):
    step = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": step.float().unsqueeze(-1),
            "member": (step * 7 % members).unsqueeze(-1),
            ("next", "done"): torch.zeros(n, 1, dtype=torch.bool),
        },
        [n],
    )


def _ensembles(members=3, size=6, writer_kwargs=None, sampler=None, **kwargs):
    made = []
    for ns in (O, T):
        rbs = [
            ns.TensorDictReplayBuffer(
                storage=ns.LazyTensorStorage(size),
                writer=ns.TensorDictRoundRobinWriter(**(writer_kwargs or {})),
                **({"sampler": sampler(ns)} if sampler else {}),
            )
            for _ in range(members)
        ]
        made.append(ns.ReplayBufferEnsemble(*rbs, **kwargs))
    return made


def _same_members(ours, theirs):
    for a, b in zip(ours._rbs, theirs._rbs):
        assert len(a) == len(b)
        if len(a):
            assert torch.equal(a[:]["obs"], b[:]["obs"])
        assert a._writer._cursor == b._writer._cursor


@pytest.mark.parametrize("routing_key", ["member", ("member",)])
def test_routing_key_writes_as_torchrl(routing_key):
    ours, theirs = _ensembles(routing_key=routing_key)
    assert ours.routing_key == theirs.routing_key == "member" and ours.routing_dim is None
    for rb in (ours, theirs):
        # an empty batch: tensordict's reshape(-1) of it fails, in torchrl's ensemble too
        with pytest.raises(RuntimeError, match="invalid for input of size 0"):
            rb.extend(_records(0))
    for start, n in ((0, 5), (5, 9), (14, 1)):
        data = _records(n, start=start)
        got, expected = ours.extend(data.clone()), theirs.extend(data.clone())
        assert set(got.keys()) == set(expected.keys()) == {"buffer_ids", "index"}
        assert torch.equal(got["buffer_ids"], expected["buffer_ids"])
        assert torch.equal(got["index"], expected["index"])
        _same_members(ours, theirs)
    one = _records(1, start=40)[0]
    got, expected = ours.add(one.clone()), theirs.add(one.clone())
    assert got.batch_size == expected.batch_size == torch.Size([])
    assert int(got["buffer_ids"]) == int(expected["buffer_ids"]) and int(got["index"]) == int(expected["index"])
    _same_members(ours, theirs)
    assert ours.stats() == theirs.stats()


def test_routing_dim_writes_as_torchrl():
    ours, theirs = _ensembles(routing_dim=1)
    data = _records(12).reshape(4, 3)
    got, expected = ours.extend(data.clone()), theirs.extend(data.clone())
    assert torch.equal(got["buffer_ids"], expected["buffer_ids"]) and torch.equal(got["index"], expected["index"])
    _same_members(ours, theirs)
    for rb in (ours, theirs):
        with pytest.raises(RuntimeError, match="Use extend"):
            rb.add(_records(1)[0])
        with pytest.raises(ValueError, match="routing_dim 1 has size 4, expected 3"):
            rb.extend(_records(12).reshape(3, 4))
        with pytest.raises(ValueError, match="routing_dim requires batched input"):
            rb.extend(_records(1)[0])


@pytest.mark.parametrize(
    "kwargs, data, error, match",
    [
        ({}, _records(3), RuntimeError, "writes are disabled"),
        ({"routing_key": "member"}, torch.zeros(3), TypeError, "require a TensorDict input"),
        ({"routing_key": "member"}, _records(4, members=5), ValueError, r"must lie in \[0, 2\]"),
        ({"routing_key": "obs"}, _records(3), TypeError, "member ids must be integers"),
        ({"routing_key": "member"}, _records(4).set("member", torch.zeros(4, 2, dtype=torch.long)),
         ValueError, "one member id per record"),
    ],
)
def test_routing_errors_match_torchrl(kwargs, data, error, match):
    for rb in _ensembles(**kwargs):
        with pytest.raises(error, match=match):
            rb.extend(data)
        assert all(len(member) == 0 for member in rb._rbs)


def test_constructor_checks_match_torchrl():
    for ns in (O, T):
        rb = ns.TensorDictReplayBuffer(storage=ns.LazyTensorStorage(4))
        with pytest.raises(ValueError, match="mutually exclusive"):
            ns.ReplayBufferEnsemble(rb, routing_key="a", routing_dim=0)
        with pytest.raises(TypeError, match="routing_dim must be an integer"):
            ns.ReplayBufferEnsemble(rb, routing_dim="0")
    with pytest.raises(NotImplementedError, match="update_priority"):
        _ensembles(routing_key="member")[0].extend(_records(2), update_priority=True)


def test_members_built_from_components_as_torchrl():
    made = []
    for ns in (O, T):
        storages = ns.StorageEnsemble(ns.LazyTensorStorage(4), ns.LazyTensorStorage(5))
        samplers = ns.SamplerEnsemble(ns.RandomSampler(), ns.RandomSampler())
        writers = ns.WriterEnsemble(ns.TensorDictRoundRobinWriter(), ns.TensorDictRoundRobinWriter())
        made.append(ns.ReplayBufferEnsemble(storages=storages, samplers=samplers, writers=writers, routing_key="member"))
    ours, theirs = made
    assert [type(m).__name__ for m in ours._rbs] == [type(m).__name__ for m in theirs._rbs] == ["ReplayBuffer"] * 2
    assert ours[1] is ours._rbs[1] and ours[1]._storage is ours._storage._storages[1]
    data = _records(7, members=2)
    assert torch.equal(ours.extend(data.clone())["index"], theirs.extend(data.clone())["index"])
    _same_members(ours, theirs)
    assert ours.stats() == theirs.stats()
    assert type(ours[[0, 1]]).__name__ == "ReplayBufferEnsemble"


def test_stats_match_torchrl_before_and_after_init():
    made = []
    for ns in (O, T):
        rbs = [ns.TensorDictReplayBuffer(storage=ns.LazyTensorStorage(4)) for _ in range(2)]
        made.append(ns.ReplayBufferEnsemble(*rbs, batch_size=2))
    assert made[0].stats() == made[1].stats()
    for rb in made:
        rb[0].extend(_records(3))
    assert made[0].stats() == made[1].stats()
    assert made[0].stats()["num_buffers"] == 2


def test_conditional_updates_and_end_streams_refused_without_generations():
    ours, theirs = _ensembles(routing_key="member")
    for rb in (ours, theirs):
        handles = rb.extend(_records(6))
        with pytest.raises(RuntimeError, match="track slot generations"):
            rb.update_if_present(index=handles, generation=torch.zeros(6, dtype=torch.long), patch={})
        with pytest.raises(TypeError, match="routed index metadata"):
            rb.update_if_present(index=handles["index"], generation=torch.zeros(6, dtype=torch.long), patch={})
        with pytest.raises(ValueError, match="provided together"):
            rb.update_if_present(index=handles, generation=torch.zeros(6, dtype=torch.long), patch={}, version=1)
        with pytest.raises(RuntimeError, match="end_streams requires"):
            rb.end_streams()
        with pytest.raises(ValueError, match="must be distinct"):
            rb.end_streams(end_key="a", terminated_key="a")


def _slice_sampler(ns):
    return ns.SliceSampler(slice_len=2, end_key=("next", "done"))


@with_generations
def test_routed_conditional_updates_match_torchrl():
    ours, theirs = _ensembles(routing_key="member", size=4, writer_kwargs={"track_generations": True})
    data = _records(10)
    handles = [ours.extend(data.clone()), theirs.extend(data.clone())]
    assert torch.equal(handles[0]["index_generation"], handles[1]["index_generation"])
    for rb, handle in zip((ours, theirs), handles):
        rb.extend(_records(3, start=10))  # some handles go stale
        result = rb.update_if_present(
            index=handle, generation=handle["index_generation"], patch={"obs": torch.full((10, 1), -1.0)}
        )
        handle["updated"] = result.updated
    assert torch.equal(handles[0]["updated"], handles[1]["updated"])
    _same_members(ours, theirs)


@with_generations
def test_end_streams_matches_torchrl():
    ours, theirs = _ensembles(
        members=2, size=8, routing_key="member", writer_kwargs={"track_generations": True}, sampler=_slice_sampler
    )
    data = _records(7, members=2)
    data["next", "truncated"] = torch.zeros(7, 1, dtype=torch.bool)
    for rb in (ours, theirs):
        rb.extend(data.clone())
        rb.end_streams()
    for a, b in zip(ours._rbs, theirs._rbs):
        assert torch.equal(a[:]["next", "done"], b[:]["next", "done"])
        assert torch.equal(a[:]["next", "truncated"], b[:]["next", "truncated"])
