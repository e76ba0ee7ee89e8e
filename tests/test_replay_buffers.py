"""torchrl_compat.replay_buffers against torchrl 0.11's buffers, operation by operation.

Each test builds a buffer of ours on our storages, samplers and writers and torchrl's
buffer on torchrl's, runs the same operations on both and compares what they return:
samples, info dictionaries (``index``, ``priority_weight``), lengths, indices written and
the data handed back to the caller. Deterministic samplers (``SamplerWithoutReplacement``
with ``shuffle=False``) compare the batches directly; random ones use the same seeded
generator on both sides.

torchrl's compiled segment trees only load on the torch release they were built for;
elsewhere its prioritized buffers run here on ``replay``'s trees (the ``torchrl_trees``
fixture), so the reference is torchrl's buffer and sampler code on our trees.
"""
from __future__ import annotations


import sys

import numpy as np
import pytest
import replay
import torch
import torchrl.data as TD
import torchrl.data.replay_buffers.replay_buffers as T
import torchrl.data.replay_buffers.samplers as TS
from hypothesis import example, given, settings, strategies as st
from tensordict import TensorDict
from torch.utils._pytree import tree_flatten

import torchrl_compat
import torchrl_compat as O
import torchrl_compat.replay_buffers as OR

from twin_checks import assert_api_matches, assert_no_torchrl_code

CLASSES = [
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "TensorDictReplayBuffer",
    "TensorDictPrioritizedReplayBuffer",
    "ReplayBufferEnsemble",
]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def torchrl_trees(monkeypatch):
    """torchrl's prioritized sampler on replay's trees where its compiled ones do not load
    (in the samplers package, and in the module that defines the sampler from 0.14 on)."""
    # the module whose globals the sampler's code reads (its __module__ names the package)
    defining = sys.modules[TS.PrioritizedSampler.__init__.__globals__["__name__"]]
    for module in {TS, defining}:
        if getattr(module, "SumSegmentTreeFp32", None) is None:
            for name in ("SumSegmentTreeFp32", "SumSegmentTreeFp64", "MinSegmentTreeFp32", "MinSegmentTreeFp64"):
                monkeypatch.setattr(module, name, getattr(replay, name))


def make_td(n, seed=0, start=0):
    g = torch.Generator().manual_seed(seed)
    step = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": torch.randn(n, 4, generator=g) + step.unsqueeze(-1),
            "action": torch.randint(0, 5, (n, 2), generator=g),
            "reward": step.float().unsqueeze(-1),
            ("next", "obs"): torch.randn(n, 4, generator=g),
            ("next", "done"): torch.rand(n, 1, generator=g) < 0.2,
        },
        [n],
    )


def make_data(kind, n, seed=0, start=0):
    td = make_td(n, seed, start)
    if kind == "tensordict":
        return td
    if kind == "tensor":
        return td["obs"]
    return {"obs": td["obs"], "more": (td["action"], td["next", "done"])}


def leaves(data):
    if isinstance(data, torch.Tensor):
        return {"": data}
    if hasattr(data, "items") and hasattr(data, "batch_size"):
        return {str(k): v for k, v in data.items(include_nested=True, leaves_only=True)}
    flat, spec = tree_flatten(data)
    return {f"{i}:{spec}": leaf for i, leaf in enumerate(flat)}


def assert_same(a, b):
    """Same type, keys (in order), batch sizes, dtypes and values."""
    assert type(a).__name__ == type(b).__name__
    if hasattr(b, "batch_size"):
        assert a.batch_size == b.batch_size and a.device == b.device
    la, lb = leaves(a), leaves(b)
    assert list(la) == list(lb)
    for key in la:
        x, y = la[key], lb[key]
        assert type(x) is type(y), key
        assert x.dtype == y.dtype and x.shape == y.shape, key
        if key == "priority_weight" and y.dtype == torch.float64:
            torch.testing.assert_close(x, y)  # see assert_same_info
        else:
            assert torch.equal(x, y), key


def assert_same_info(a, b):
    assert list(a) == list(b)
    for key in a:
        x, y = a[key], b[key]
        if isinstance(y, tuple):
            assert len(x) == len(y) and all(torch.equal(p, q) for p, q in zip(x, y))
        elif key == "priority_weight" and y.dtype == torch.float64:
            # fp64 trees: the sampler's kernel computes the weights in float64, torchrl with
            # torch ops (the samplers' tests compare them the same way)
            assert x.dtype == y.dtype
            torch.testing.assert_close(x, y)
        else:
            assert x.dtype == y.dtype and torch.equal(x, y), key


def buffers(name, storage_name="LazyTensorStorage", storage_args=(16,), sampler=None, sampler_args=(),
            storage_kwargs=None, sampler_kwargs=None, seed=None, **kwargs):
    """One buffer of ours and one of torchrl's, each on its own library's components (and
    its own generator seeded with ``seed``, when given)."""
    made = []
    for lib in (O, TD):
        parts = dict(kwargs)
        if seed is not None:
            parts["generator"] = torch.Generator().manual_seed(seed)
        if storage_name is not None:
            parts["storage"] = getattr(lib, storage_name)(*storage_args, **(storage_kwargs or {}))
        if sampler is not None:
            parts["sampler"] = getattr(lib, sampler)(*sampler_args, **(sampler_kwargs or {}))
        made.append(getattr(lib, name)(**parts))
    return made


def in_order():
    return dict(sampler="SamplerWithoutReplacement", sampler_kwargs={"shuffle": False})


# --------------------------------------------------------------------------- API


@pytest.mark.parametrize("name", CLASSES)
def test_signatures_match_torchrl(name):
    assert_api_matches(getattr(OR, name), getattr(T, name))


# torchrl's Ray hooks: as_remote (from its ray_buffer module) wraps whatever class it is
# called on, and 0.14's remote-owner hooks serve a buffer to torchrl's distributed transport
# (see docs/torchrl_compat.md).
RAY_HOOKS = frozenset({
    "as_remote", "_start_distributed_service", "_shutdown_distributed_service",
    "_bootstrap_distributed_extend", "_bootstrap_distributed_sample", "_bootstrap_distributed_priority",
    "_distributed_control_client", "_distributed_service_client",
})


@pytest.mark.parametrize("name", CLASSES)
def test_no_torchrl_code_runs_on_our_buffers(name):
    cls = getattr(OR, name)
    assert_no_torchrl_code(cls, left_to_torchrl=RAY_HOOKS)
    assert cls.as_remote.__func__ is T.ReplayBuffer.as_remote.__func__


def test_exports_and_removed_sampler():
    for name in OR.__all__:
        if name[0].isupper():
            assert getattr(torchrl_compat, name) is getattr(OR, name)
    with pytest.raises(RuntimeError, match="removed without replacement"):
        O.InPlaceSampler()
    assert issubclass(O.InPlaceSampler, T.InPlaceSampler)
    stacked = OR.stack_tensors([[torch.ones(3), torch.zeros(1, 2)] for _ in range(4)])
    ref = T.stack_tensors([[torch.ones(3), torch.zeros(1, 2)] for _ in range(4)])
    assert all(torch.equal(a, b) for a, b in zip(stacked, ref))


def test_accepts_torchrl_components():
    # torchrl's own storages, samplers and writers work in our buffers too
    rb = O.TensorDictReplayBuffer(
        storage=TD.LazyTensorStorage(8), sampler=TD.SamplerWithoutReplacement(shuffle=False),
        writer=TD.TensorDictRoundRobinWriter(), batch_size=4,
    )
    ref = TD.TensorDictReplayBuffer(
        storage=TD.LazyTensorStorage(8), sampler=TD.SamplerWithoutReplacement(shuffle=False), batch_size=4
    )
    for buffer in (rb, ref):
        buffer.extend(make_td(10))
    assert_same(rb.sample(), ref.sample())
    # and our components work in torchrl's buffers
    ref = TD.TensorDictReplayBuffer(
        storage=O.LazyTensorStorage(8), sampler=O.SamplerWithoutReplacement(shuffle=False),
        writer=O.TensorDictRoundRobinWriter(), batch_size=4,
    )
    rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(8), **{"sampler": O.SamplerWithoutReplacement(shuffle=False)}, batch_size=4)
    for buffer in (rb, ref):
        buffer.extend(make_td(10))
    assert_same(rb.sample(), ref.sample())


# ------------------------------------------------------------- same operations


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.integers(1, 13)),
        st.tuples(st.just("add"), st.just(0)),
        st.tuples(st.just("sample"), st.integers(1, 9)),
        st.tuples(st.just("getitem"), st.integers(0, 3)),
    ),
    min_size=1,
    max_size=10,
)


def run_same(ours, ref, ops, kind, capacity):
    written = 0
    for step, (op, arg) in enumerate(ops):
        if op == "extend":
            data = make_data(kind, arg, seed=step, start=written)
            copy = data.clone() if kind != "pytree" else data
            assert torch.equal(ours.extend(data), ref.extend(copy))
            if kind == "tensordict":
                assert_same(data, copy)  # what the writer left in the caller's data
            written += arg
        elif op == "add":
            item = make_data(kind, 1, seed=step, start=written)
            item = item[0] if kind != "pytree" else {"obs": item["obs"][0], "more": tuple(x[0] for x in item["more"])}
            got, expected = ours.add(item), ref.add(item)
            assert int(got) == int(expected)
            written += 1
        elif op == "sample":
            if not len(ref):
                with pytest.raises(RuntimeError):
                    ours.sample(arg)
                continue
            got, info = ours.sample(arg, return_info=True)
            expected, ref_info = ref.sample(arg, return_info=True)
            assert_same(got, expected)
            assert_same_info(info, ref_info)
        elif op == "getitem" and len(ref):
            index = [0, -1, slice(0, 3), torch.tensor([1, 0])][arg]
            if isinstance(index, torch.Tensor) and len(ref) < 2:
                continue
            assert_same(ours[index], ref[index])
        assert len(ours) == len(ref)
        assert ours.write_count == ref.write_count


# capacities: one item, two, and sizes that the writes of up to 13 items fill exactly,
# overrun and wrap around (the random samplers and ndim == 2 storages are compared in
# test_replay_buffers_random.py)
CAPACITIES = st.sampled_from([1, 2, 5, 12])


@settings(max_examples=100, deadline=None)
@given(ops=OPS, kind=st.sampled_from(["tensor", "tensordict", "pytree"]), capacity=CAPACITIES)
@example(ops=[("sample", 2), ("getitem", 0), ("add", 0), ("sample", 3), ("extend", 3), ("getitem", 1)],
         kind="tensordict", capacity=1)
@example(ops=[("extend", 5), ("sample", 5), ("extend", 6), ("sample", 5), ("getitem", 2)], kind="tensor", capacity=5)
def test_replay_buffer_same_operations(ops, kind, capacity):
    ours, ref = buffers("ReplayBuffer", storage_args=(capacity,), **in_order())
    run_same(ours, ref, ops, kind, capacity)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, capacity=CAPACITIES)
def test_tensordict_replay_buffer_same_operations(ops, capacity):
    ours, ref = buffers("TensorDictReplayBuffer", storage_args=(capacity,), **in_order())
    run_same(ours, ref, ops, "tensordict", capacity)


@pytest.mark.parametrize("storage_name", ["ListStorage", "LazyStackStorage", "LazyMemmapStorage"])
@pytest.mark.parametrize("kind", ["tensor", "tensordict"])
def test_other_storages_same_operations(storage_name, kind, tmp_path):
    if storage_name == "LazyStackStorage" and kind == "tensor":
        pytest.skip("LazyStackStorage holds tensor collections")
    ops = [("extend", 4), ("sample", 3), ("extend", 7), ("add", 0), ("sample", 5), ("getitem", 2), ("sample", 6)]
    name = "TensorDictReplayBuffer" if kind == "tensordict" else "ReplayBuffer"
    kwargs = {}
    if storage_name == "LazyMemmapStorage":
        made = []
        for lib, sub in ((O, "ours"), (TD, "ref")):
            made.append(getattr(lib, name)(storage=lib.LazyMemmapStorage(9, scratch_dir=tmp_path / sub),
                                           sampler=lib.SamplerWithoutReplacement(shuffle=False)))
        ours, ref = made
    else:
        ours, ref = buffers(name, storage_name, (9,), **in_order(), **kwargs)
    run_same(ours, ref, ops, kind, 9)


@pytest.mark.parametrize("dim_extend", [None, 1])
def test_ndim2_storage_matches_torchrl(dim_extend):
    # torchrl's ndim > 1 bookkeeping is right for tensor collections only (see the storages)
    ours, ref = buffers("ReplayBuffer", storage_args=(24,), storage_kwargs={"ndim": 2}, dim_extend=dim_extend,
                        **in_order())
    for step in range(3):
        data = make_data("tensordict", 12, seed=step).reshape(3, 4)
        data_t = data.clone()
        assert torch.equal(ours.extend(data), ref.extend(data_t))
        got, info = ours.sample(5, return_info=True)
        expected, ref_info = ref.sample(5, return_info=True)
        assert_same(got, expected)
        assert_same_info(info, ref_info)
        assert_same(ours[:], ref[:])
        assert len(ours) == len(ref)


def test_uniform_sampling_with_generator_matches_torchrl():
    ours, ref = buffers("TensorDictReplayBuffer", storage_args=(50,), seed=3)
    for buffer in (ours, ref):
        buffer.extend(make_td(30))
    for size in (1, 7, 64):
        got, info = ours.sample(size, return_info=True)
        expected, ref_info = ref.sample(size, return_info=True)
        assert_same(got, expected)
        assert_same_info(info, ref_info)
    # the global generator too
    ours, ref = buffers("ReplayBuffer", storage_args=(50,))
    for buffer in (ours, ref):
        buffer.extend(torch.arange(40.0))
    torch.manual_seed(5)
    got = ours.sample(16)
    torch.manual_seed(5)
    assert torch.equal(got, ref.sample(16))


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize(
    "sampler,kwargs",
    [
        ("SliceSampler", {"slice_len": 4, "end_key": ("next", "done")}),
        ("SliceSampler", {"num_slices": 3, "traj_key": "episode", "strict_length": False}),
        ("SliceSamplerWithoutReplacement", {"slice_len": 4, "end_key": ("next", "done"), "shuffle": False}),
        ("PrioritizedSliceSampler", {"max_capacity": 40, "alpha": 0.7, "beta": 0.5, "slice_len": 4,
                                     "end_key": ("next", "done")}),
    ],
)
def test_slice_samplers_match_torchrl(sampler, kwargs):
    ours, ref = buffers("TensorDictReplayBuffer", storage_args=(40,), sampler=sampler, sampler_kwargs=kwargs, seed=6)
    for step in range(4):
        data = make_td(13, seed=step, start=13 * step)
        data["episode"] = (torch.arange(13) + 13 * step) // 5
        data["next", "done"] = ((torch.arange(13) + 13 * step) % 5 == 4).unsqueeze(-1)
        assert torch.equal(ours.extend(data), ref.extend(data.clone()))
        got, info = ours.sample(12, return_info=True)
        expected, ref_info = ref.sample(12, return_info=True)
        assert_same(got, expected)
        assert_same_info(info, ref_info)
        if "Prioritized" in sampler:
            got["td_error"] = torch.rand(12, generator=torch.Generator().manual_seed(step))
            expected["td_error"] = got["td_error"].clone()
            ours.update_tensordict_priority(got)
            ref.update_tensordict_priority(expected)


@pytest.mark.parametrize("storage_name", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_slice_sample_gathered_with_a_new_next_level(storage_name, monkeypatch):
    """A trajectory-key sample of a storage without ``"next"``: the gather makes the level the
    done / terminated / truncated entries go in (no ``storage.get``), and the batch matches
    torchrl's, nested tensordicts (keys in order, batch size, device, lock) included."""
    ours, ref = buffers("TensorDictReplayBuffer", storage_name=storage_name, storage_args=(50,),
                        sampler="SliceSampler", sampler_kwargs={"num_slices": 4, "traj_key": "episode"}, seed=3)
    import torchrl_compat.replay_buffers.base as buffer_base

    gathered = []
    gather_rows = buffer_base.gather_rows
    monkeypatch.setattr(buffer_base, "gather_rows", lambda *a, **k: gathered.append(gather_rows(*a, **k)) or gathered[-1])
    for step in range(6):
        data = make_td(13, seed=step, start=13 * step).exclude("next")
        data["episode"] = (torch.arange(13) + 13 * step) // 6
        ours.extend(data)
        ref.extend(data.clone())
        got, info = ours.sample(12, return_info=True)
        expected, ref_info = ref.sample(12, return_info=True)
        assert_same(got, expected)
        assert_same_info(info, ref_info)
        assert list(got.keys(True)) == list(expected.keys(True))
        for a, b in ((got, expected), (got["next"], expected["next"])):
            assert (a.batch_size, a.device, a.is_locked, a.names) == (b.batch_size, b.device, b.is_locked, b.names)
    assert len(gathered) == 6 and all(batch is not None for batch in gathered)


@pytest.mark.parametrize("key", ["end_key", "traj_key"])
@pytest.mark.parametrize("return_info", [False, True])
def test_slice_sampler_loop_matches_torchrl(key, return_info):
    """The loop of the slice benchmark, small: writes of 13 items wrapping around a full
    storage of 60, episodes of 5 to 9 steps, a sample of 3 slices after each write (mostly
    read from the trajectory ends, see SliceSampler._sample_from_ends)."""
    kwargs = {"traj_key": "episode"} if key == "traj_key" else {"end_key": ("next", "done")}
    ours, ref = buffers("TensorDictReplayBuffer", storage_args=(60,), sampler="SliceSampler",
                        sampler_kwargs=dict(slice_len=4, **kwargs), seed=11)
    lengths = np.random.default_rng(0).integers(5, 10, 400)
    episode = torch.repeat_interleave(torch.arange(lengths.size), torch.as_tensor(lengths))
    done = torch.ones_like(episode, dtype=torch.bool)
    done[:-1] = episode[1:] != episode[:-1]
    for step in range(30):
        data = make_td(13, seed=step, start=13 * step)
        data["episode"] = episode[13 * step : 13 * step + 13]
        data["next", "done"] = done[13 * step : 13 * step + 13].unsqueeze(-1)
        assert torch.equal(ours.extend(data), ref.extend(data.clone()))
        if return_info:
            got, info = ours.sample(12, return_info=True)
            expected, ref_info = ref.sample(12, return_info=True)
            assert_same_info(info, ref_info)
            # the batch's index is a copy: editing it leaves the info's as it was
            got["index"] += 1
            assert torch.equal(info["index"][0], ref_info["index"][0])
            got["index"] -= 1
        else:
            got, expected = ours.sample(12), ref.sample(12)
        assert_same(got, expected)
    assert len(ours) == len(ref) == 60


@settings(max_examples=15)
@given(
    filled=st.integers(8, 70),
    episode=st.integers(2, 9),
    sampler=st.sampled_from(["SliceSampler", "SliceSamplerWithoutReplacement", "PrioritizedSliceSampler"]),
    strict=st.booleans(),
)
def test_sampled_rows_stay_in_the_filled_part(filled, episode, sampler, strict):
    # what lets the buffer gather these samplers' batches without checking the indices
    kwargs = {"slice_len": 4, "end_key": ("next", "done"), "strict_length": strict}
    if sampler == "PrioritizedSliceSampler":
        kwargs.update(max_capacity=40, alpha=0.7, beta=0.5)
    rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(40), sampler=getattr(O, sampler)(**kwargs),
                                  generator=torch.Generator().manual_seed(filled))
    data = make_td(filled)
    data["next", "done"] = (torch.arange(filled) % episode == episode - 1).unsqueeze(-1)
    rb.extend(data)
    for _ in range(3):
        try:
            index, _ = rb.sampler.sample(rb.storage, 8)
        except (RuntimeError, ValueError):
            continue  # no trajectory long enough for a slice: nothing sampled
        assert all(bool(((i >= 0) & (i < len(rb))).all()) for i in index)


# ------------------------------------------------------------------- prioritized


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tensordict_prioritized_matches_torchrl(dtype):
    made = []
    for lib in (O, TD):
        made.append(lib.TensorDictReplayBuffer(
            storage=lib.LazyTensorStorage(64),
            sampler=lib.PrioritizedSampler(64, 0.7, 0.5, dtype=dtype),
            generator=torch.Generator().manual_seed(1),
            batch_size=16,
        ))
    ours, ref = made
    if dtype == torch.float64 and TS.SumSegmentTreeFp32 is not replay.SumSegmentTreeFp32:
        # torchrl's compiled fp64 trees refuse the float32 default priority of a write
        with pytest.raises(RuntimeError, match="expected scalar type Double but found Float"):
            ref.extend(make_td(4))
        ours.extend(make_td(4))
        assert ours.sample().batch_size == (16,)
        return
    _run_prioritized(ours, ref)


@pytest.mark.usefixtures("torchrl_trees")
def test_tensordict_prioritized_class_matches_torchrl():
    ours, ref = buffers("TensorDictPrioritizedReplayBuffer", storage_args=(40,), alpha=0.8, beta=0.4,
                        seed=2, batch_size=8, reduction="max")
    _run_prioritized(ours, ref)


def _run_prioritized(ours, ref):
    for step in range(6):
        data = make_td(13, seed=step)
        if step % 2:
            data["td_error"] = torch.rand(13, generator=torch.Generator().manual_seed(step))
        data_ref = data.clone()
        assert torch.equal(ours.extend(data), ref.extend(data_ref))
        assert_same(data, data_ref)
        got, info = ours.sample(return_info=True)
        expected, ref_info = ref.sample(return_info=True)
        assert_same(got, expected)
        assert_same_info(info, ref_info)
        # two values per item: update_tensordict_priority reduces them
        got["td_error"] = torch.rand(got.shape[0], 2, generator=torch.Generator().manual_seed(100 + step)) * 5
        expected["td_error"] = got["td_error"].clone()
        ours.update_tensordict_priority(got)
        ref.update_tensordict_priority(expected)
        assert ours._sampler._max_priority[0] == ref._sampler._max_priority[0]
    item = make_td(1, seed=50)[0]
    item["td_error"] = torch.tensor(3.0)
    assert int(ours.add(item.clone())) == int(ref.add(item.clone()))
    ours.mark_update(torch.tensor([0, 1]))
    ref.mark_update(torch.tensor([0, 1]))
    for _ in range(3):
        got, info = ours.sample(return_info=True)
        expected, ref_info = ref.sample(return_info=True)
        assert_same(got, expected)
        assert_same_info(info, ref_info)


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("storage_name", ["ListStorage", "LazyTensorStorage"])
def test_prioritized_replay_buffer_matches_torchrl(storage_name):
    made = []
    for lib in (O, TD):
        made.append(lib.PrioritizedReplayBuffer(alpha=0.7, beta=0.9, storage=getattr(lib, storage_name)(20)))
        made[-1].set_rng(torch.Generator().manual_seed(4))
    ours, ref = made
    for buffer in (ours, ref):
        buffer.extend(torch.arange(12.0))
    for step in range(4):
        got, info = ours.sample(5, return_info=True)
        expected, ref_info = ref.sample(5, return_info=True)
        assert_same(got, expected)
        assert_same_info(info, ref_info)
        priority = torch.arange(5.0) + step
        ours.update_priority(info["index"], priority)
        ref.update_priority(ref_info["index"], priority)


@pytest.mark.usefixtures("torchrl_trees")
def test_prioritized_ndim2_matches_torchrl():
    made = []
    for lib in (O, TD):
        made.append(lib.TensorDictReplayBuffer(
            storage=lib.LazyTensorStorage(24, ndim=2),
            sampler=lib.PrioritizedSampler(24, 0.7, 0.5),
            generator=torch.Generator().manual_seed(0),
            batch_size=6,
        ))
    ours, ref = made
    data = make_td(12).reshape(3, 4)
    assert torch.equal(ours.extend(data.clone()), ref.extend(data.clone()))
    got, info = ours.sample(return_info=True)
    expected, ref_info = ref.sample(return_info=True)
    assert_same(got, expected)
    assert_same_info(info, ref_info)
    got["td_error"] = torch.arange(6.0)
    expected["td_error"] = torch.arange(6.0)
    ours.update_tensordict_priority(got)
    ref.update_tensordict_priority(expected)
    assert_same(ours.sample(), ref.sample())


def test_priority_key_and_reductions():
    rb = O.TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, priority_key="prio",
                                             storage=O.LazyTensorStorage(8), reduction="mean")
    data = make_td(4)
    data["prio"] = torch.tensor([4.0, 0.0, 0.0, 0.0])
    rb.extend(data)  # extend takes one priority per item as it is
    assert rb._sampler._sum_tree[0] == pytest.approx(4.0, rel=1e-6)
    data["prio"] = torch.tensor([[1.0, 3.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    data["index"] = torch.arange(4)
    rb.update_tensordict_priority(data)
    # the mean of the first item's two priorities, then ** alpha with eps
    assert rb._sampler._sum_tree[0] == pytest.approx(2.0, rel=1e-6)
    assert rb._get_priority_vector(data).tolist() == [2.0, 0.0, 0.0, 0.0]
    assert rb._get_priority_item(data[0]) == 2.0
    assert rb._get_priority_item(make_td(1)[0]) == rb._sampler.default_priority


def test_update_priority_on_uniform_sampler_warns():
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(4))
    rb.extend(torch.zeros(2, 1))
    with pytest.warns(UserWarning, match="not prioritized"):
        rb.update_priority(torch.tensor([0]), torch.tensor([1.0]))
    td = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(4))
    td.extend(make_td(2))
    assert td.update_tensordict_priority(td.sample(1)) is None  # a no-op without priorities


def test_bad_priority_is_refused_before_anything_changes():
    rb = O.TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=O.LazyTensorStorage(8))
    rb.extend(make_td(4))
    before = rb._sampler._sum_tree.query(0, 8)
    sample = rb.sample(2)
    sample["td_error"] = torch.tensor([1.0, float("nan")])
    with pytest.raises(ValueError, match="priority=nan at position 1"):
        rb.update_tensordict_priority(sample)
    assert rb._sampler._sum_tree.query(0, 8) == before
    bad = make_td(2)
    bad["td_error"] = torch.tensor([-1.0, 1.0])
    with pytest.raises(RuntimeError, match="Failed to update priority of extended data"):
        rb.extend(bad)


# ------------------------------------------------------------------- features


def test_batch_size_rules():
    ours, ref = buffers("ReplayBuffer", batch_size=3, **in_order())
    for buffer in (ours, ref):
        buffer.extend(torch.arange(8.0))
    assert torch.equal(ours.sample(), ref.sample())
    with pytest.warns(UserWarning, match="Got conflicting batch_sizes"):
        ours.sample(2)
    plain = O.ReplayBuffer(storage=O.LazyTensorStorage(4))
    plain.extend(torch.zeros(2))
    with pytest.raises(RuntimeError, match="batch_size not specified"):
        plain.sample()
    with pytest.raises(RuntimeError, match="Cannot iterate over the replay buffer"):
        next(iter(plain))
    with pytest.raises(ValueError, match="drop_last=True must work with a predictable batch-size"):
        O.ReplayBuffer(sampler=O.SamplerWithoutReplacement(drop_last=True))


@pytest.mark.parametrize("drop_last", [False, True])
def test_iteration_without_replacement_matches_torchrl(drop_last):
    ours, ref = buffers("TensorDictReplayBuffer", storage_args=(20,), sampler="SamplerWithoutReplacement",
                        sampler_kwargs={"drop_last": drop_last, "shuffle": False}, batch_size=4)
    for buffer in (ours, ref):
        buffer.extend(make_td(10))
    for _ in range(2):  # two epochs
        got, expected = list(ours), list(ref)
        assert len(got) == len(expected) == (2 if drop_last else 3)
        for a, b in zip(got, expected):
            assert_same(a, b)
    # after whole epochs, next() starts the next one as torchrl's does, and says where it ends
    steps = []
    for _ in range(5):
        a, b = ours.next(), ref.next()
        assert (a is None) == (b is None)
        steps.append(None if b is None else b["index"].tolist())
        if b is not None:
            assert_same(a, b)
    first, second = [0, 1, 2, 3], [4, 5, 6, 7]
    assert steps == ([first, second, None, first, second] if drop_last else [first, second, [8, 9], None, first])
    # next() walks the same batches, then returns None at the end of the epoch
    ours2, ref2 = buffers("TensorDictReplayBuffer", storage_args=(20,), sampler="SamplerWithoutReplacement",
                          sampler_kwargs={"shuffle": False}, batch_size=4)
    for buffer in (ours2, ref2):
        buffer.extend(make_td(6))
    for _ in range(3):
        a, b = ours2.next(), ref2.next()
        assert (a is None) == (b is None)
        if b is not None:
            assert_same(a, b)


def test_getitem_setitem_match_torchrl():
    ours, ref = buffers("TensorDictReplayBuffer", storage_args=(10,))
    for buffer in (ours, ref):
        buffer.extend(make_td(7))
    for index in [2, -1, slice(1, 5), torch.tensor([3, 1]), np.array([0, 2]), [4, 5], "obs", ("next", "done"), (3,)]:
        assert_same(ours[index], ref[index])
    value = make_td(2, seed=9)
    ours[torch.tensor([0, 1])] = value.clone()
    ref[torch.tensor([0, 1])] = value.clone()
    ours["reward"] = torch.zeros(7, 1)
    ref["reward"] = torch.zeros(7, 1)
    assert_same(ours[:], ref[:])


def test_empty_and_write_count():
    ours, ref = buffers("ReplayBuffer", storage_args=(5,))
    for buffer in (ours, ref):
        buffer.extend(torch.arange(7.0))
        assert buffer.write_count == 7
        buffer.empty(empty_write_count=False)
        assert len(buffer) == 0 and buffer.write_count == 7
        buffer.extend(torch.arange(2.0))
        assert buffer._writer._cursor == 2
        buffer.empty()
        assert buffer.write_count == 0
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        ours.sample(2)


def test_tensordict_buffer_leaves_the_callers_data_alone():
    # torchrl's (empty) transform chain hands the writer a copy: "index" lands on the copy
    ours, ref = buffers("TensorDictReplayBuffer", storage_args=(8,))
    data, data_ref = make_td(3), make_td(3)
    ours.extend(data)
    ref.extend(data_ref)
    assert "index" not in data.keys() and "index" not in data_ref.keys()
    item = make_td(1)[0]
    ours.add(item)
    assert "index" not in item.keys()
    locked = make_td(2).lock_()
    ours.extend(locked)
    assert locked.is_locked
    # a plain ReplayBuffer with the tensordict writer writes it into the caller's data
    ours, ref = buffers("ReplayBuffer", storage_args=(8,), writer=None)
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(8), writer=O.TensorDictRoundRobinWriter())
    data = make_td(3)
    rb.extend(data)
    assert torch.equal(data["index"], torch.arange(3))


def test_extend_refuses_non_tensordicts_and_update_priority_flag():
    rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(4))
    with pytest.raises(ValueError, match="only accepts TensorDictBase subclasses"):
        rb.extend(torch.zeros(2))
    plain = O.ReplayBuffer(storage=O.LazyTensorStorage(4))
    with pytest.raises(NotImplementedError, match="update_priority is not supported"):
        plain.extend(torch.zeros(2), update_priority=True)
    prio = O.TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=O.LazyTensorStorage(4))
    data = make_td(2)
    data["td_error"] = torch.tensor([5.0, 7.0])
    prio.extend(data, update_priority=False)
    assert prio._sampler._max_priority == (None, None) or float(prio._sampler._max_priority[0]) != 7.0
    prio.extend(data)
    assert float(prio._sampler._max_priority[0]) == 7.0


def test_constructor_errors():
    with pytest.raises(TypeError, match="mutually exclusive"):
        O.ReplayBuffer(transform=lambda x: x, transform_factory=lambda: (lambda x: x))
    with pytest.raises(ValueError, match="Dynamic batch-size specification is incompatible"):
        O.ReplayBuffer(prefetch=2)
    with pytest.raises(ValueError, match="dim_extend must be a positive value"):
        O.ReplayBuffer(dim_extend=-1)
    with pytest.raises(ValueError, match="Cannot share prefetched replay buffers"):
        O.ReplayBuffer(prefetch=2, batch_size=2, shared=True)
    with pytest.raises(TypeError, match="storage must be either a Storage"):
        O.ReplayBuffer(storage=lambda: 3)
    with pytest.raises(TypeError, match="sampler must be either a Sampler"):
        O.ReplayBuffer(sampler=lambda: 3)
    with pytest.raises(TypeError, match="writer must be either a Writer"):
        O.ReplayBuffer(writer=lambda: 3)
    with pytest.raises(RuntimeError, match="transform must be either a Transform instance or a callable"):
        O.ReplayBuffer(transform=3)
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(4))
    rb.dim_extend = 0
    with pytest.raises(RuntimeError, match="dim_extend cannot be reset"):
        rb.dim_extend = 1
    # callables build the components
    rb = O.ReplayBuffer(storage=lambda: O.LazyTensorStorage(3), sampler=O.RandomSampler, writer=O.RoundRobinWriter)
    assert type(rb.storage) is O.LazyTensorStorage and rb.storage.max_size == 3
    assert type(O.ReplayBuffer().storage) is O.ListStorage and O.ReplayBuffer().storage.max_size == 1000
    assert type(O.TensorDictReplayBuffer().writer) is O.TensorDictRoundRobinWriter
    assert type(O.PrioritizedReplayBuffer(alpha=0.5, beta=0.5).sampler) is O.PrioritizedSampler


def test_collate_fn():
    ours, ref = buffers("ReplayBuffer", "ListStorage", (10,), collate_fn=lambda x: ("collated", len(x)), **in_order())
    for buffer in (ours, ref):
        buffer.extend([torch.ones(2) * i for i in range(5)])
    assert ours.sample(3) == ref.sample(3) == ("collated", 3)
    default = O.ReplayBuffer(storage=O.ListStorage(10), sampler=O.SamplerWithoutReplacement(shuffle=False))
    default.extend([torch.ones(2) * i for i in range(5)])
    assert torch.equal(default.sample(3), torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]))


def test_transforms_match_torchrl():
    def double(data):
        data = data.clone()
        data["obs"] = data["obs"] * 2
        return data

    def plus_one(data):
        data["reward"] += 1
        return data

    ours, ref = buffers("TensorDictReplayBuffer", storage_args=(10,), transform=double, **in_order())
    for buffer in (ours, ref):
        buffer.append_transform(plus_one, invert=True)
    data, data_ref = make_td(6), make_td(6)
    ours.extend(data)
    ref.extend(data_ref)
    assert_same(data, data_ref)  # the inverted transform ran on the caller's tensors
    assert_same(ours.sample(4), ref.sample(4))
    assert_same(ours[1:3], ref[1:3])
    item = make_td(1, seed=3)[0]
    assert int(ours.add(item.clone())) == int(ref.add(item.clone()))
    for buffer in (ours, ref):
        buffer.insert_transform(0, _Scale(3.0))
    assert_same(ours.sample(3), ref.sample(3))
    assert len(ours.transform) == len(ref.transform) == 3
    # a plain callable can be inserted too (torchrl fails on its eval())
    ours.insert_transform(1, lambda td: td)
    assert len(ours.transform) == 4


class _Scale(torch.nn.Module):
    """A torchrl-free transform with state: a callable module with a buffer."""

    def __init__(self, factor):
        super().__init__()
        self.register_buffer("factor", torch.tensor(factor))

    def forward(self, data):
        data["obs"] = data["obs"] * self.factor
        return data


def test_pytree_transform_and_transform_factory():
    def zero(data):
        return {key: value * 0 if isinstance(value, torch.Tensor) else value for key, value in data.items()}

    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(10), transform=zero)
    rb.extend({"a": torch.ones(3), "b": torch.ones(3, 2)})
    sample = rb.sample(5)
    assert all(bool((leaf == 0).all()) for leaf in sample.values())
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(10), transform_factory=lambda: zero)
    assert rb._delayed_init and not rb.initialized
    rb.extend({"a": torch.ones(3)})
    assert rb.initialized and bool((rb.sample(2)["a"] == 0).all())


def test_delayed_init():
    rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(8), delayed_init=True, batch_size=2)
    assert not rb.initialized and "_storage" not in rb.__dict__
    assert len(rb) == 0 and rb.initialized
    for method in (len, lambda b: b.storage, lambda b: b.write_count, lambda b: b.sample(1) if len(b) else None):
        lazy = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(8), delayed_init=True, batch_size=2)
        method(lazy)
        assert lazy.initialized
    lazy = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(8), delayed_init=True, batch_size=2)
    lazy.extend(make_td(3))
    assert lazy.initialized and len(lazy) == 3


def test_checkpointer_and_hooks(tmp_path):
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(8), checkpointer=O.TensorStorageCheckpointer())
    assert type(rb.storage.checkpointer) is O.TensorStorageCheckpointer
    called = []
    rb.register_save_hook(lambda data, path=None: called.append("save") or data)
    rb.extend(make_td(3))
    rb.dumps(tmp_path)
    assert called == ["save"]


def test_set_components():
    rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(8), batch_size=2)
    rb.extend(make_td(3))
    new = O.LazyTensorStorage(4)
    assert type(rb.set_storage(new)) is O.LazyTensorStorage
    rb.extend(make_td(2))
    # the writer writes into the new storage, which the buffer samples from
    assert len(new) == 2 and rb in new._attached_entities
    old_sampler = rb.set_sampler(O.SamplerWithoutReplacement(shuffle=False))
    assert type(old_sampler) is O.RandomSampler
    assert torch.equal(rb.sample()["index"], torch.tensor([0, 1]))
    old_writer = rb.set_writer(O.TensorDictRoundRobinWriter())
    assert type(old_writer) is O.TensorDictRoundRobinWriter and rb.writer._storage is new


def _settle_prefetches(buffer):
    """Waits for a torchrl buffer's prefetches in flight. Its iteration races its prefetch
    thread: an end of epoch drawn after ``__iter__`` resets it stops the iteration at its first
    batch, which a busy machine makes happen. Ours waits for them itself; torchrl is made to
    here, so that both sides walk what an idle machine walks."""
    for future in list(buffer._prefetch_queue):
        future.result()


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_prefetch_matches_torchrl(shuffle, drop_last):
    # one batch prefetched: torchrl's thread pool then draws the batches in order, so they
    # are comparable one by one (with more, its threads race for the sampler)
    ours, ref = buffers("TensorDictReplayBuffer", storage_args=(30,), prefetch=1, batch_size=4, seed=2,
                        sampler="SamplerWithoutReplacement",
                        sampler_kwargs={"shuffle": shuffle, "drop_last": drop_last})
    for buffer in (ours, ref):
        buffer.extend(make_td(14))
    for _ in range(5):
        assert_same(ours.sample(), ref.sample())
    # iterating walks what is left of the epoch (and, with the batch prefetched past the
    # end, what torchrl walks then), then whole epochs, batch for batch as torchrl does
    for epoch in range(4):
        got = list(ours)
        _settle_prefetches(ref)
        expected = list(ref)
        assert [len(b) for b in got] == [len(b) for b in expected]
        for a, b in zip(got, expected):
            assert_same(a, b)
        if epoch:
            walked = torch.cat([b["index"] for b in expected])
            assert walked.unique().numel() == walked.numel() == (12 if drop_last else 14)
    for _ in range(3):
        a, b = ours.next(), ref.next()
        assert (a is None) == (b is None)
        if b is not None:
            assert_same(a, b)


def test_repr():
    rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(4), batch_size=2)
    text = repr(rb)
    assert text.startswith("TensorDictReplayBuffer(\n    storage=LazyTensorStorage(")
    assert "batch_size=2" in text and "writer=TensorDictRoundRobinWriter(cursor=0" in text


# --------------------------------------------------------------- gather paths


@pytest.mark.parametrize("full", [False, True])
def test_sample_gathers_what_storage_get_returns(full):
    rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(10), batch_size=6)
    data = make_td(10 if full else 7)
    data["half"] = torch.randn(data.shape[0], 2).to(torch.bfloat16)  # no numpy view
    data["flag"] = torch.zeros(data.shape[0], dtype=torch.int8)
    data["matrix"] = torch.randn(data.shape[0], 2, 3).double()
    rb.extend(data)
    for _ in range(5):
        sample, info = rb.sample(return_info=True)
        expected = rb.storage.get(info["index"])
        expected.set("index", info["index"])
        assert_same(sample, expected)


def test_sample_from_untrusted_sampler_checks_indices():
    class Wild(O.RandomSampler):
        def sample(self, storage, batch_size):
            return torch.tensor([-1, 0, 2]), {}

    rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(10), sampler=Wild())
    rb.extend(make_td(5))
    # a negative index reads from the end of the filled part, as storage.get does
    assert torch.equal(rb.sample(3)["reward"].squeeze(-1), torch.tensor([4.0, 0.0, 2.0]))


def test_docstring_examples():
    import doctest

    result = doctest.testmod(OR, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@needs_cuda
def test_cuda_storage_draws_what_torchrl_draws():
    """Uniform sampling from a CUDA storage: the draws of torchrl's buffer, on the device."""
    made = [
        lib.TensorDictReplayBuffer(storage=lib.LazyTensorStorage(32, device="cuda"), batch_size=8,
                                   generator=torch.Generator("cuda").manual_seed(0))
        for lib in (O, TD)
    ]
    ours, reference = made
    for step in range(3):
        data = make_td(12, seed=step).to("cuda")
        assert torch.equal(ours.extend(data), reference.extend(data))
        got, info = ours.sample(return_info=True)
        expected, ref_info = reference.sample(return_info=True)
        assert got.device.type == "cuda" and info["index"].device.type == "cuda"
        assert_same(got.cpu(), expected.cpu())


@needs_cuda
def test_cuda_storage_with_a_cpu_generator_fails_as_torchrl():
    # torch.randint cannot fill a CUDA tensor from a CPU generator: torchrl's storage raises
    errors = []
    for lib in (O, TD):
        rb = lib.TensorDictReplayBuffer(storage=lib.LazyTensorStorage(32, device="cuda"), batch_size=8,
                                        generator=torch.Generator().manual_seed(0))
        rb.extend(make_td(12).to("cuda"))
        with pytest.raises(RuntimeError, match="generator") as error:
            rb.sample()
        errors.append(str(error.value))
        assert len(rb) == 12
    assert errors[0] == errors[1]


@needs_cuda
def test_cuda_prioritized_matches_cpu():
    """Prioritized sampling from a CUDA storage (trees of torch ops on the device) against
    the CPU kernels: the same indices; the weights to the device's rounding of pow."""
    made = [
        O.TensorDictPrioritizedReplayBuffer(storage=O.LazyTensorStorage(32, device=device), batch_size=8,
                                            generator=torch.Generator().manual_seed(0), alpha=0.7, beta=0.5)
        for device in ("cuda", "cpu")
    ]
    cuda, cpu = made
    for step in range(3):
        data = make_td(12, seed=step)
        assert torch.equal(cuda.extend(data.to("cuda")).cpu(), cpu.extend(data))
        got, info = cuda.sample(return_info=True)
        expected, ref_info = cpu.sample(return_info=True)
        assert got.device.type == "cuda" and info["index"].device.type == "cuda"
        got = got.cpu()
        torch.testing.assert_close(got.pop("priority_weight"), expected.pop("priority_weight"))
        torch.testing.assert_close(info.pop("priority_weight").cpu(), ref_info.pop("priority_weight"))
        assert_same(got, expected)
        assert_same_info({k: v.cpu() for k, v in info.items()}, ref_info)
        got["td_error"] = torch.rand(8, generator=torch.Generator().manual_seed(step))
        expected["td_error"] = got["td_error"].clone()
        cuda.update_tensordict_priority(got.to("cuda"))
        cpu.update_tensordict_priority(expected)


@needs_cuda
def test_pin_memory():
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(8), pin_memory=True)
    rb.extend(torch.zeros(4, 2))
    assert rb.sample(2).is_pinned() and rb[0:2].is_pinned()


# ------------------------------------------------------------------- ensembles


def _ensembles(**kwargs):
    made = []
    for lib in (O, TD):
        parts = []
        for i in range(3):
            rb = lib.TensorDictReplayBuffer(storage=lib.LazyTensorStorage(10),
                                            sampler=lib.SamplerWithoutReplacement(shuffle=False))
            rb.extend(make_td(6, seed=i, start=10 * i))
            parts.append(rb)
        made.append(lib.ReplayBufferEnsemble(*parts, generator=torch.Generator().manual_seed(3), **kwargs))
    return made


def test_ensemble_matches_torchrl():
    ours, ref = _ensembles(batch_size=6, sample_from_all=True)
    for _ in range(3):
        got, expected = ours.sample(), ref.sample()
        assert_same(got, expected)
    assert len(ours) == len(ref) == 3
    assert_same(ours[1][2:4], ref[1][2:4])
    assert_same(ours[:, 1], ref[:, 1])
    sub, sub_ref = ours[[0, 2]], ref[[0, 2]]
    assert type(sub) is O.ReplayBufferEnsemble and len(sub) == len(sub_ref) == 2
    # torchrl's selection keeps the parent's count of buffers sampled and fails
    with pytest.raises(RuntimeError, match="batch dimension mismatch"):
        sub_ref.sample(6)
    sample = sub.sample(6)
    assert sample.batch_size == (2, 3) and sample["index", "buffer_ids"][:, 0].tolist() == [0, 1]
    assert torch.equal(sample["reward"][1].squeeze(-1), torch.tensor([20.0, 21, 22]))  # a new epoch
    with pytest.raises(RuntimeError):
        O.ReplayBufferEnsemble(ours[0], storages=ours._storage)
    assert repr(ours).startswith("ReplayBufferEnsemble(")


def test_ensemble_with_weights():
    # with p, the buffers are drawn from the buffer's generator (torchrl: the global one)
    ours, _ = _ensembles(batch_size=6, p=[0.0, 1.0, 0.0], num_buffer_sampled=2)
    sample = ours.sample()
    assert sample.batch_size == (2, 3)
    assert sample["index", "buffer_ids"].unique().tolist() == [1]
    assert torch.equal(sample["reward"].squeeze(-1), torch.tensor([[10.0, 11, 12], [13, 14, 15]]))
