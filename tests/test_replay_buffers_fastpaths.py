"""The prioritized buffer's short paths against its general ones and torchrl 0.11's buffer.

Each test runs the same operations on three buffers: ours as it is (a round-robin write marks
its rows with the sampler's range fill, and ``update_tensordict_priority`` hands a batch's
one-priority-per-item entry straight to the sampler), ours with both short paths turned off,
and torchrl's. Writes wrap around the storage; samples, info dictionaries, indices written and
the sampler's state (every tree buffer to the bit, the largest priority) must agree.

torchrl's compiled trees only load on the torch release they were built for; its prioritized
sampler runs here on ``replay``'s trees, so that only the buffers' and samplers' code differs.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torchrl.data as TD
import torchrl.data.replay_buffers.samplers as TS
from tensordict import TensorDict

import replay
import torchrl_compat as O

from test_replay_buffers import assert_same, assert_same_info, make_td

CAPACITY = 40


@pytest.fixture(autouse=True)
def torchrl_trees(monkeypatch):
    # torchrl 0.14 looks its trees up in the module defining its PrioritizedSampler (whose
    # __module__ names the package): patch that module's namespace too
    defining = TD.PrioritizedSampler._init.__globals__
    for name in ("SumSegmentTreeFp32", "SumSegmentTreeFp64", "MinSegmentTreeFp32", "MinSegmentTreeFp64"):
        monkeypatch.setattr(TS, name, getattr(replay, name))
        monkeypatch.setitem(defining, name, getattr(replay, name))


def _general(buffer):
    """``buffer`` with its prioritized short paths turned off."""
    buffer._sampler._mark_ranges = lambda index, storage: False
    buffer._update_item_priorities = lambda data: False
    return buffer


def _three(dtype=torch.float32, seed=0, **kwargs):
    """(ours, ours on the general paths, torchrl's) prioritized tensordict buffers."""
    made = []
    for lib in (O, O, TD):
        made.append(lib.TensorDictReplayBuffer(
            storage=lib.LazyTensorStorage(CAPACITY),
            sampler=lib.PrioritizedSampler(CAPACITY, kwargs.get("alpha", 0.7), 0.5, dtype=dtype),
            generator=torch.Generator().manual_seed(seed),
            batch_size=12,
        ))
    _general(made[1])
    return made


def _assert_same_sampler(a, b):
    for x, y in ((a._sum_tree, b._sum_tree), (a._min_tree, b._min_tree)):
        if isinstance(y, (replay.SumSegmentTreeFp32, replay.SumSegmentTreeFp64,
                          replay.MinSegmentTreeFp32, replay.MinSegmentTreeFp64)):
            np.testing.assert_array_equal(x._py_buffer(), y._py_buffer())
    mine, theirs = a._max_priority, b._max_priority
    assert (mine[0] is None) == (theirs[0] is None)
    if mine[0] is not None:
        assert float(mine[0]) == float(theirs[0]) and mine[0].dtype == theirs[0].dtype
        assert int(mine[1]) == int(theirs[1])


def _priorities(kind, n, step):
    g = torch.Generator().manual_seed(100 + step)
    # below 1 in the first steps: the default priority of new items exceeds them, so that
    # writes move the largest priority
    scale = 0.5 if step < 6 else 4.0
    if kind == "items":
        return torch.rand(n, generator=g) * scale
    if kind == "column":
        return torch.rand(n, 1, generator=g) * scale
    return torch.rand(n, 2, generator=g) * scale  # two per item: reduced


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["items", "column", "pairs"])
def test_prioritized_loop_matches(dtype, kind):
    """extend (with and without priorities in the data) + sample + update_tensordict_priority,
    writes of 1 to 25 items wrapping around a 40-item storage."""
    buffers = _three(dtype, seed=3)
    rng = np.random.default_rng(7)
    start = 0
    for step in range(16):
        n = int(rng.integers(1, 26))
        data = make_td(n, seed=step, start=start)
        start += n
        if step % 3 == 2:
            data["td_error"] = torch.rand(n, generator=torch.Generator().manual_seed(step)) * 3
        copies = [data.clone() for _ in buffers]
        written = [rb.extend(copy) for rb, copy in zip(buffers, copies)]
        assert torch.equal(written[0], written[2]) and torch.equal(written[1], written[2])
        assert_same(copies[0], copies[2])
        results = [rb.sample(return_info=True) for rb in buffers]
        for got, info in results[:2]:
            assert_same(got, results[2][0])
            assert_same_info(info, results[2][1])
        priority = _priorities(kind, results[0][0].shape[0], step)
        for rb, (got, _) in zip(buffers, results):
            got.set("td_error", priority.clone())
            rb.update_tensordict_priority(got)
        _assert_same_sampler(buffers[0]._sampler, buffers[1]._sampler)
        _assert_same_sampler(buffers[0]._sampler, buffers[2]._sampler)


def _rand(*shape, dtype=torch.float32):
    """The same priorities on every buffer."""
    return torch.rand(*shape, generator=torch.Generator().manual_seed(9), dtype=dtype) * 2


UPDATES = {
    "int priorities": lambda td: td.set("td_error", torch.arange(td.shape[0])),
    "float64 priorities": lambda td: td.set("td_error", _rand(td.shape[0], dtype=torch.float64)),
    "half priorities": lambda td: td.set("td_error", _rand(td.shape[0]).half()),
    "priorities requiring grad": lambda td: td.set("td_error", _rand(td.shape[0]).requires_grad_()),
    "a view of a larger tensor": lambda td: td.set("td_error", _rand(2, td.shape[0])[1]),
    "locked sample": lambda td: (td.set("td_error", _rand(td.shape[0])), td.lock_()),
    "skipped items (-1)": lambda td: (td.set("td_error", _rand(td.shape[0])),
                                      td["index"].__setitem__(slice(0, 3), -1)),
    "one item": lambda td: td[:1].set("td_error", torch.tensor([7.0])),
    "a priority key per item, nested": lambda td: td.set(("td_error",), _rand(td.shape[0])),
    "nan priority": lambda td: td.set("td_error", torch.tensor([1.0, float("nan")] + [1.0] * (td.shape[0] - 2))),
    "negative priority": lambda td: td.set("td_error", -torch.ones(td.shape[0])),
    "no priority": lambda td: td,
}


@pytest.mark.parametrize("case", sorted(UPDATES))
def test_update_tensordict_priority_matches(case):
    """Priorities of every kind a batch may carry: the same outcome (the same exception, or
    the same trees and largest priority) on the three buffers; a refused update changes nothing."""
    buffers = _three(seed=5)
    for rb in buffers:
        rb.extend(make_td(CAPACITY + 7))
    outcomes = []
    for rb in buffers:
        sample = rb.sample()
        target = UPDATES[case](sample)
        target = sample if not isinstance(target, TensorDict) else target
        try:
            with warnings.catch_warnings():
                # torchrl's buffer copy-constructs the default priority with torch.tensor
                warnings.filterwarnings("ignore", "To copy construct from a tensor", UserWarning)
                rb.update_tensordict_priority(target)
            outcomes.append(None)
        except Exception as err:  # the reference's exception is part of the expected outcome
            outcomes.append(type(err))
    assert outcomes[0] is outcomes[1]
    if outcomes[2] is None:
        assert outcomes[0] is None
    else:
        assert outcomes[0] in (outcomes[2], ValueError)  # we refuse a NaN torchrl stores
    _assert_same_sampler(buffers[0]._sampler, buffers[1]._sampler)
    if outcomes[2] is None:
        _assert_same_sampler(buffers[0]._sampler, buffers[2]._sampler)
    for rb in buffers[:2]:  # still sampling
        assert rb.sample().batch_size == (12,)


def test_the_short_paths_are_taken(monkeypatch):
    """The loop a user runs goes through the range fill and the direct priority update."""
    rb = O.TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=O.LazyTensorStorage(CAPACITY))
    seen = {"fill": 0, "direct": 0}
    fill, direct = replay.fill_priority_pair, rb._update_item_priorities

    def counted_fill(*args):
        seen["fill"] += 1
        return fill(*args)

    def counted_direct(data):
        handled = direct(data)
        seen["direct"] += handled
        return handled

    monkeypatch.setattr(replay, "fill_priority_pair", counted_fill)
    rb._update_item_priorities = counted_direct
    for step in range(5):
        rb.extend(make_td(13, seed=step))
        sample = rb.sample(8)
        sample["td_error"] = torch.rand(8)
        rb.update_tensordict_priority(sample)
    assert seen == {"fill": 5, "direct": 5}


@pytest.mark.parametrize("name", ["TensorDictReplayBuffer", "TensorDictPrioritizedReplayBuffer"])
def test_writes_copy_rows_as_torchrl_stores_them(name, monkeypatch):
    """Round-robin writes (wrapping) copied leaf by leaf in one call: the storage holds what
    torchrl's holds, and the writes are booked as when numpy copies them (a slice sampler
    reads the write journal)."""
    calls = []
    copy_rows = replay.copy_rows
    refuse = [False]

    def counted(*args):
        calls.append(not refuse[0] and copy_rows(*args))
        return calls[-1]

    monkeypatch.setattr(replay, "copy_rows", counted)
    kwargs = {"alpha": 0.7, "beta": 0.5} if "Prioritized" in name else {}
    ours, numpy_copies, ref = (getattr(lib, name)(storage=lib.LazyTensorStorage(CAPACITY), **kwargs)
                               for lib in (O, O, TD))
    start = 0
    journals = None
    for step, n in enumerate([7, 25, 13, 30, 1, 39]):
        data = make_td(n, seed=step, start=start)
        start += n
        assert torch.equal(ours.extend(data.clone()), ref.extend(data.clone()))
        refuse[0] = True
        numpy_copies.extend(data.clone())
        refuse[0] = False
        if journals is None:  # followed from here on
            journals = [rb._storage._writes_since(None)[0] for rb in (ours, numpy_copies)]
        else:
            mine, theirs = (rb._storage._writes_since(count) for rb, count in zip((ours, numpy_copies), journals))
            assert mine[0] == theirs[0] and (mine[1] is None) == (theirs[1] is None)
            if step == 2:  # a write that wraps, still in the journal
                assert len(mine[1]) == 2 and all(torch.equal(torch.as_tensor(a), torch.as_tensor(b))
                                                 for a, b in zip(mine[1], theirs[1]))
        assert len(ours) == len(ref)
        assert_same(ours._storage._storage[: len(ref)], ref._storage._storage[: len(ref)])
        assert_same(ours._storage._storage[: len(ref)], numpy_copies._storage._storage[: len(ref)])
    # every write copied in one call, the first one too (it creates the storage first)
    assert calls[0::2] == [True] * 6 and calls[1::2] == [False] * 6


def test_overridden_update_priority_is_called():
    """A buffer subclass that overrides update_priority sees every tensordict update."""
    calls = []

    class Logging(O.TensorDictPrioritizedReplayBuffer):
        def update_priority(self, index, priority):
            calls.append(priority.clone())
            return super().update_priority(index, priority)

    rb = Logging(alpha=0.7, beta=0.5, storage=O.LazyTensorStorage(CAPACITY))
    rb.extend(make_td(10))
    sample = rb.sample(4)
    sample["td_error"] = torch.arange(1.0, 5.0)
    rb.update_tensordict_priority(sample)
    assert len(calls) == 1 and torch.equal(calls[0], torch.arange(1.0, 5.0))
