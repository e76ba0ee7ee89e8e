"""Random sequences of writes, samples, priority updates and emptying, run on a buffer of
ours and on torchrl 0.11's own, compared step by step.

Both buffers draw from the global generators, seeded before each step as torchrl's users
seed them (``torch.manual_seed``, ``np.random.seed``), so the random samplers give the same
batches. Storages hold 1 to 8 items (time steps of ``ENVS`` environments when ``ndim == 2``),
written in pieces of up to twice that, so they run empty, at capacity and wrapped around.
Every sampler runs on 1-D storages (in tensordict buffers) and on ndim == 2 ones (in plain
buffers, see make_pair); the examples under the test run under each of them.
torchrl's prioritized sampler runs on ``replay``'s trees where its compiled ones do not load
(see ``torchrl_trees`` in test_replay_buffers.py).
"""
from __future__ import annotations

import contextlib
import sys

import numpy as np
import pytest
import replay
import torch
import torchrl.data as TD
import torchrl.data.replay_buffers.samplers as TS
from hypothesis import HealthCheck, event, example, given, settings, strategies as st

import torchrl_compat as O

from test_replay_buffers import assert_same, assert_same_info, make_td

ENVS = 3  # environments side by side in an ndim == 2 storage
SLICE_LEN = 2
DROP_LAST_BATCH = 3
REFUSALS = (RuntimeError, ValueError, IndexError)
SAMPLERS = ["RandomSampler", "SamplerWithoutReplacement", "PrioritizedSampler", "SliceSampler"]


@contextlib.contextmanager
def torchrl_on_replay_trees():
    """torchrl's prioritized sampler on replay's trees where its compiled ones do not load."""
    defining = sys.modules[TS.PrioritizedSampler.__init__.__globals__["__name__"]]
    with pytest.MonkeyPatch.context() as patch:
        for module in {TS, defining}:
            if getattr(module, "SumSegmentTreeFp32", None) is None:
                for name in ("SumSegmentTreeFp32", "SumSegmentTreeFp64", "MinSegmentTreeFp32", "MinSegmentTreeFp64"):
                    patch.setattr(module, name, getattr(replay, name))
        yield


def make_sampler(lib, name, size, options):
    if name == "RandomSampler":
        return lib.RandomSampler()
    if name == "SamplerWithoutReplacement":
        return lib.SamplerWithoutReplacement(drop_last=options["drop_last"], shuffle=options["shuffle"])
    if name == "PrioritizedSampler":
        return lib.PrioritizedSampler(size, 0.7, 0.5)
    return lib.SliceSampler(slice_len=SLICE_LEN, end_key=("next", "done"), strict_length=options["strict"])


def make_pair(name, capacity, ndim, options):
    size = capacity * (ENVS if ndim == 2 else 1)
    # torchrl's TensorDictReplayBuffer cannot write one time step to an ndim == 2 storage
    # (its "index" entry, one row per item, does not fit the data's shape): a plain buffer
    name_of_buffer = "TensorDictReplayBuffer" if ndim == 1 else "ReplayBuffer"
    # drop_last needs the batch size up front
    fixed = {"batch_size": DROP_LAST_BATCH} if name == "SamplerWithoutReplacement" and options["drop_last"] else {}
    return [
        getattr(lib, name_of_buffer)(
            storage=lib.LazyTensorStorage(size, ndim=ndim), sampler=make_sampler(lib, name, size, options), **fixed
        )
        for lib in (O, TD)
    ]


def steps_data(n, start, ndim):
    """``n`` time steps from ``start`` (of ``ENVS`` environments, time last, when ``ndim == 2``);
    episodes end every third step."""
    td = make_td(n * ENVS if ndim == 2 else n, seed=start, start=start)
    step = torch.arange(start, start + n)
    if ndim == 2:
        td = td.reshape(ENVS, n)
        step = step.expand(ENVS, n)
    td["next", "done"] = (step % 3 == 2).unsqueeze(-1)
    return td


def seeded(step, fn, *args, **kwargs):
    torch.manual_seed(step)
    np.random.seed(step)
    return fn(*args, **kwargs)


def same_outcome(step, ours_fn, ref_fn):
    """Runs ``ref_fn`` then ``ours_fn``, each under the same seeds: both return (then the
    results), or both refuse (then ``None``; ours may refuse with another type, e.g. the
    RuntimeError of an empty storage where torchrl's slice sampler fails on an IndexError)."""
    try:
        expected = seeded(step, ref_fn)
    except REFUSALS:
        with pytest.raises(REFUSALS):
            seeded(step, ours_fn)
        return None
    return seeded(step, ours_fn), expected


def run_random_ops(ours, ref, ops, sampler, ndim, capacity):
    written = 0
    last_index = None
    compared = 0
    for step, (op, arg) in enumerate(ops):
        if op == "extend":
            data = steps_data(arg, written, ndim)
            outcome = same_outcome(step, lambda: ours.extend(data.clone()), lambda: ref.extend(data.clone()))
            assert outcome is not None
            got, expected = outcome
            assert torch.equal(got, expected), f"extend wrote at {got.tolist()}, torchrl at {expected.tolist()}"
            written += arg
        elif op == "sample":
            size = arg * SLICE_LEN if sampler == "SliceSampler" else arg
            if ref._batch_size is not None:
                size = None  # the buffer's own
            outcome = same_outcome(
                step, lambda: ours.sample(size, return_info=True), lambda: ref.sample(size, return_info=True)
            )
            if outcome is not None:
                (got, info), (expected, ref_info) = outcome
                assert_same(got, expected)
                assert_same_info(info, ref_info)
                last_index = ref_info["index"]
                compared += 1
        elif op == "update" and sampler == "PrioritizedSampler" and last_index is not None and len(ref):
            numel = (last_index[0] if isinstance(last_index, tuple) else last_index).shape[0]
            priority = torch.rand(numel, generator=torch.Generator().manual_seed(arg)) * 4 + 0.1
            ours.update_priority(last_index, priority.clone())
            ref.update_priority(last_index, priority.clone())
        elif op == "empty":
            ours.empty()
            ref.empty()
            last_index = None
        assert len(ours) == len(ref)
        assert ours.write_count == ref.write_count
        if len(ref):
            assert_same(ours[:], ref[:])
    # (shown by --hypothesis-show-statistics: what the examples reached)
    event(f"batches compared: {min(compared, 3)}{'+' * (compared > 3)}")
    event(f"wrapped around: {written > capacity}")


def ops_for(capacity):
    return st.lists(
        st.one_of(
            st.tuples(st.just("extend"), st.integers(1, 2 * capacity + 1)),
            st.tuples(st.just("sample"), st.integers(1, 6)),
            st.tuples(st.just("update"), st.integers(0, 2**16)),
            st.tuples(st.just("empty"), st.just(0)),
        ),
        min_size=2,
        max_size=12,
    )


@st.composite
def scenarios(draw):
    capacity = draw(st.sampled_from([1, 2, 5, 8]))
    options = {"drop_last": draw(st.booleans()), "shuffle": draw(st.booleans()), "strict": draw(st.booleans())}
    # most sequences start with a write and end with a sample (0: none written first)
    lead = draw(st.integers(0, 2 * capacity + 1))
    ops = [("extend", lead)] * (lead > 0) + draw(ops_for(capacity)) + [("sample", draw(st.integers(1, 6)))]
    return capacity, options, ops


NO_OPTIONS = {"drop_last": False, "shuffle": True, "strict": False}


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("sampler", SAMPLERS)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
# under every sampler: an empty buffer sampled; one item, overwritten; filled to capacity,
# then wrapped around; emptied, written and sampled again (with priority updates before)
@example(scenario=(1, NO_OPTIONS, [("sample", 2), ("extend", 3), ("sample", 4), ("extend", 1), ("sample", 1)]))
@example(scenario=(5, NO_OPTIONS, [("extend", 5), ("sample", 6), ("extend", 3), ("sample", 6), ("extend", 9),
                                   ("sample", 4)]))
@example(scenario=(5, NO_OPTIONS, [("extend", 4), ("sample", 5), ("update", 1), ("extend", 4), ("sample", 6),
                                   ("update", 2), ("sample", 6), ("empty", 0), ("sample", 1), ("extend", 2),
                                   ("sample", 3)]))
@example(scenario=(8, {"drop_last": True, "shuffle": False, "strict": True},
                   [("extend", 8), ("sample", 3), ("sample", 3), ("sample", 3), ("extend", 5), ("sample", 4)]))
def test_random_operations_match_torchrl(sampler, ndim, scenario):
    capacity, options, ops = scenario
    with torchrl_on_replay_trees():
        ours, ref = make_pair(sampler, capacity, ndim, options)
        run_random_ops(ours, ref, ops, sampler, ndim, capacity)
