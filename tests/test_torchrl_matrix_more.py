"""The installed torchrl's buffers (0.11 to 0.14) with ``install()`` in force: layouts,
ensembles, checkpointers, ``torch.compile``, transforms and buffer options, against torchrl.

Same method as ``test_torchrl_matrix.py`` (see ``torchrl_matrix_support``).
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

import torchrl_compat
from torchrl_matrix_support import (
    BATCH,
    CAP,
    check_same,
    CLASSES,
    COLS,
    dumps_and_loads,
    first_item,
    make_buffer,
    make_data,
    make_storage,
    assert_ran,
    max_size,
    must_run,
    raises_saying,
    returns,
    run,
    assert_records_equal,
    torchrl_own_classes,
)
from torchrl_matrix_support import installed_for_the_module, known_gaps  # noqa: F401 (autouse fixtures)
from torchrl_matrix_support import WARNING_FILTERS

pytestmark = WARNING_FILTERS


# =============================================================================
# state_dict layouts, and torchrl's state_dict loaded into ours
# =============================================================================
@must_run("set", "state_dict", "load_state_dict, torchrl's", "len, loaded", "get, loaded")
def layout(record, C, *, storage, kind, ndim, peer=None):
    st = make_storage(C, record, storage, kind, ndim)
    n = CAP - 2
    data = make_data(kind, n, ndim)
    if ndim == 2:
        # What the buffer hands a storage: time first.
        data = data.transpose(0, 1) if hasattr(data, "transpose") and not isinstance(data, dict) else torch.utils._pytree.tree_map(lambda x: x.transpose(0, 1), data)
    record.call("set", st.set, torch.arange(n), data)
    state = record.call("state_dict", st.state_dict)
    if state is None:
        return
    torch.save(state, os.path.join(record.dir("state"), "state.pt"))
    theirs = os.path.join(peer if peer is not None else record.dir(""), "state", "state.pt")
    fresh = make_storage(C, record, storage, kind, ndim)
    record.call("load_state_dict, torchrl's", fresh.load_state_dict, torch.load(theirs, weights_only=False))
    record("len, loaded", len(fresh))
    record.call("get, loaded", fresh.get, torch.arange(len(fresh)) if ndim == 1 else slice(None))


def _layout_cases():
    for storage in ("ListStorage", "LazyStackStorage", "CompressedListStorage", "TensorStorage", "LazyTensorStorage", "LazyMemmapStorage"):
        for kind in ("tensor", "tensordict", "pytree"):
            for ndim in (1, 2) if storage in ("TensorStorage", "LazyTensorStorage") else (1,):
                yield pytest.param(storage, kind, ndim, id=f"{storage}-{kind}-ndim{ndim}")


LIST_STORAGES = ("ListStorage", "LazyStackStorage", "CompressedListStorage")


def layout_raises(storage, kind):
    """What torchrl refuses in ``layout`` (ours do as torchrl does): label -> exception type,
    ``None`` for a step the refusal keeps the scenario from."""
    if kind == "pytree" and storage in LIST_STORAGES:
        # torchrl's list storages take a list, tuple, tensor or tensordict, not a dict;
        # the stack of no item: "items cannot be empty"
        return {"set": "TypeError", **({"get, loaded": "RuntimeError"} if storage == "LazyStackStorage" else {})}
    if kind == "pytree":
        # "Objects of type <class 'dict'> are not supported by ... state_dict"
        return {"state_dict": "TypeError", "load_state_dict, torchrl's": None, "len, loaded": None, "get, loaded": None}
    if storage == "LazyMemmapStorage" and kind == "tensor":
        # torchrl's memmap storage loads a single tensor's state onto its own file: "A
        # filename was provided but the tensor already has a file associated", and is
        # left uninitialised: "Cannot get elements out of a non-initialized storage."
        return {"load_state_dict, torchrl's": "RuntimeError", "get, loaded": "RuntimeError"}
    return {}


@pytest.mark.parametrize("storage,kind,ndim", list(_layout_cases()))
def test_state_dict_layout(tmp_path, storage, kind, ndim):
    check_same(layout, tmp_path, raises=layout_raises(storage, kind), storage=storage, kind=kind, ndim=ndim)


# =============================================================================
# ndim == 2 with tensor and pytree leaves: torchrl mis-sizes them, ours match its
# tensordict behaviour
# =============================================================================
def _obs(value):
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
        return (_obs(value[0]), value[1])
    if isinstance(value, torch.Tensor):
        return value
    return value["obs"]


@must_run("extend 0", "add 1", "extend 2", "extend 3", "len 3")
def wrap_around_2d(record, C, *, storage, kind, peer=None):
    rb = make_buffer(C, record, "ReplayBuffer", storage, kind, 2, sampler="RandomSampler")
    for k, (n, start) in enumerate(((5, 0), (1, 5), (4, 6), (3, 10))):
        data = make_data(kind, n, 2, start=start)
        if n == 1:
            record.call(f"add {k}", rb.add, first_item(data, 2))
        else:
            record.call(f"extend {k}", rb.extend, data)
        record(f"len {k}", len(rb))
        record(f"rb[:] obs {k}", _obs(rb[:]))
        record(f"sample obs {k}", _obs(rb.sample()))


@pytest.mark.parametrize("storage", ["LazyTensorStorage", "LazyMemmapStorage"])
@pytest.mark.parametrize("kind", ["tensor", "pytree"])
def test_ndim2_leaves_wrap_around(tmp_path, storage, kind):
    """torchrl's lazy ndim > 1 storages count the feature dims of tensor and pytree leaves
    in their capacity, and their wrap-around then raises ``IndexError: index 8 is out of
    bounds for dimension 0 with size 8``. Ours store them as torchrl stores the same items
    in a TensorDict: that is the reference here."""
    with torchrl_own_classes():
        expected = run(wrap_around_2d, tmp_path / "torchrl", storage=storage, kind="tensordict")
    got = run(wrap_around_2d, tmp_path / "ours", storage=storage, kind=kind)
    assert_ran(wrap_around_2d, expected)
    assert_records_equal(expected, got)
    with torchrl_own_classes():
        theirs = run(wrap_around_2d, tmp_path / "torchrl-leaves", storage=storage, kind=kind)
    assert ("extend 2", ("raises", "IndexError")) in [step[:2] for step in theirs.steps]


# =============================================================================
# Ensembles: ReplayBufferEnsemble, StorageEnsemble, SamplerEnsemble, WriterEnsemble
# =============================================================================
@must_run(
    "extend 0", "extend 1", "len", "rbe[0][:]", "rbe[1, :3]", "sample 0", "sample 1", "sample 2",
    "state_dict", "empty", "len, emptied",
)
def ensemble(record, C, *, form, sample_from_all, peer=None):
    if form == "buffers":
        rb0 = make_buffer(C, record, "TensorDictReplayBuffer", "LazyTensorStorage", "tensordict", 1, sampler="RandomSampler")
        rb1 = make_buffer(C, record, "TensorDictReplayBuffer", "LazyMemmapStorage", "tensordict", 1, sampler="SamplerWithoutReplacement-ordered")
        record.call("extend 0", rb0.extend, make_data("tensordict", 5, 1))
        record.call("extend 1", rb1.extend, make_data("tensordict", 6, 1, start=100))
        rbe = C.ReplayBufferEnsemble(
            rb0, rb1, batch_size=BATCH, sample_from_all=sample_from_all,
            generator=torch.Generator().manual_seed(3),
        )
    else:
        storages = C.StorageEnsemble(C.LazyTensorStorage(CAP), C.ListStorage(CAP))
        samplers = C.SamplerEnsemble(C.RandomSampler(), C.SamplerWithoutReplacement(shuffle=False))
        writers = C.WriterEnsemble(C.RoundRobinWriter(), C.RoundRobinWriter())
        rbe = C.ReplayBufferEnsemble(
            storages=storages, samplers=samplers, writers=writers, batch_size=BATCH,
            sample_from_all=sample_from_all, generator=torch.Generator().manual_seed(3),
        )
        record.call("extend 0", rbe[0].extend, make_data("tensordict", 5, 1))
        record.call("extend 1", rbe[1].extend, make_data("tensordict", 6, 1, start=100))
    record("len", len(rbe))
    record.call("rbe[0][:]", lambda: rbe[0][:])
    record.call("rbe[1, :3]", rbe.__getitem__, (1, slice(0, 3)))
    for k in range(3):
        record.call(f"sample {k}", rbe.sample, return_info=True)
    record.call_quietly("state_dict", rbe.state_dict)
    # torchrl 0.11 never gets past dumps here (see test_ensembles); our round trip is
    # checked in test_replay_buffers_faults.py
    record.call("dumps", rbe.dumps, record.dir("dump"))
    record.call("empty", rbe.empty)
    record("len, emptied", len(rbe))


@pytest.mark.parametrize("sample_from_all", [False, True])
@pytest.mark.parametrize("form", ["buffers", "components"])
def test_ensembles(tmp_path, form, sample_from_all):
    torchrl_fails = {}
    if form == "buffers":
        # torchrl's StorageEnsembleCheckpointer writes into <path>/storage/0 without creating
        # <path>/storage: "FileNotFoundError: [Errno 2] No such file or directory". Ours
        # writes the whole ensemble checkpoint.
        torchrl_fails["dumps"] = ("FileNotFoundError", returns)
    if form == "components":
        # torchrl's StorageEnsembleCheckpointer writes into <path>/storage/0 without
        # creating <path>/storage: "FileNotFoundError: [Errno 2] No such file or
        # directory". Ours gets to the ListStorage, which cannot be dumped, and says so.
        torchrl_fails["dumps"] = ("FileNotFoundError", raises_saying("ListStorage doesn't support serialization"))
    # torchrl 0.11's ensembles have no state_dict and no empty (NotImplementedError), and
    # index a ListStorage member with a tuple asking it for "_storages" (AttributeError);
    # ours then do the same. Where the installed torchrl has them, ours must match it.
    for label, error in (("state_dict", "NotImplementedError"), ("empty", "NotImplementedError"), ("rbe[1, :3]", "AttributeError")):
        torchrl_fails[label] = (error, lambda value, message, error=error: value == ("raises", error))
    check_same(ensemble, tmp_path, torchrl_fails, form=form, sample_from_all=sample_from_all)


# =============================================================================
# Checkpointers
# =============================================================================
def ted_data(n, start=0):
    """Transitions in torchrl's TED layout: episodes of three steps, ``next`` observations."""
    step = torch.arange(start, start + n)
    obs = step.float().unsqueeze(-1) * torch.ones(2)
    done = (step % 3 == 2).unsqueeze(-1)
    return TensorDict(
        {
            "observation": obs,
            "action": (step % 2).unsqueeze(-1),
            ("collector", "traj_ids"): step // 3,
            ("next", "observation"): obs + 1,
            ("next", "reward"): step.float().unsqueeze(-1),
            ("next", "done"): done,
            ("next", "terminated"): done,
            ("next", "truncated"): torch.zeros_like(done),
        },
        batch_size=[n],
    )


@must_run(
    "extend", "extend, wrapping", "dumps", "loads, own dump", "loads, torchrl's dump",
    "rb[:], own dump", "rb[:], torchrl's dump", "sample, torchrl's dump", "dumps again",
    "loads, dumped twice", "rb[:], dumped twice",
)
def checkpointing(record, C, *, checkpointer, storage, peer=None):
    def build():
        rb = make_buffer(C, record, "TensorDictReplayBuffer", storage, "tensordict", 1, sampler="RandomSampler")
        if checkpointer is not None:
            rb.storage.checkpointer = getattr(C, checkpointer)()
        return rb

    rb = build()
    record.call("extend", rb.extend, ted_data(7))
    record.call("extend, wrapping", rb.extend, ted_data(4, start=7))
    if not dumps_and_loads(record, rb, build, peer):
        return
    # Dumping twice to the same place.
    dump = record.dir("dump")
    record.call("dumps again", rb.dumps, dump)
    fresh = build()
    record.call("loads, dumped twice", fresh.loads, dump)
    record.call("rb[:], dumped twice", fresh.__getitem__, slice(None))


def _checkpointer_cases():
    for checkpointer in (None, "TensorStorageCheckpointer", "FlatStorageCheckpointer", "NestedStorageCheckpointer", "H5StorageCheckpointer"):
        for storage in ("LazyMemmapStorage", "LazyTensorStorage"):
            if checkpointer == "H5StorageCheckpointer" and not hasattr(torchrl_compat, "H5StorageCheckpointer"):
                continue
            # Without h5py both sides raise ModuleNotFoundError at dumps: nothing to compare.
            no_h5py = checkpointer == "H5StorageCheckpointer" and importlib.util.find_spec("h5py") is None
            marks = pytest.mark.skipif(no_h5py, reason="H5StorageCheckpointer needs h5py")
            yield pytest.param(checkpointer, storage, id=f"{checkpointer or 'default'}-{storage}", marks=marks)


@pytest.mark.parametrize("checkpointer,storage", list(_checkpointer_cases()))
def test_checkpointers(tmp_path, checkpointer, storage):
    check_same(checkpointing, tmp_path, checkpointer=checkpointer, storage=storage)


# =============================================================================
# Transforms and buffer options: transform, collate_fn, prefetch, dim_extend,
# delayed_init, RNG
# =============================================================================
@must_run("extend", "rb[:]", "sample 0", "sample 1", "sample 2")
def options(record, C, *, option, peer=None):
    from torchrl.envs.transforms import Compose, ExcludeTransform, RenameTransform

    kwargs = {}
    if option == "transform":
        kwargs["transform"] = Compose(ExcludeTransform("p"), RenameTransform(["obs"], ["observation"]))
    elif option == "collate_fn":
        kwargs["collate_fn"] = lambda batch: batch.apply(lambda x: x * 2)
    elif option == "prefetch":
        kwargs["prefetch"] = 2
    elif option == "dim_extend":
        kwargs["dim_extend"] = 1
    elif option == "delayed_init":
        kwargs["delayed_init"] = True
    rb = make_buffer(C, record, "TensorDictReplayBuffer", "LazyTensorStorage", "tensordict", 2 if option == "dim_extend" else 1, sampler="RandomSampler", **kwargs)
    ndim = 2 if option == "dim_extend" else 1
    record.call("extend", rb.extend, make_data("tensordict", 6, ndim))
    record.call("rb[:]", rb.__getitem__, slice(None))
    for k in range(3):
        record.call(f"sample {k}", rb.sample, return_info=True)
    if option == "rng":
        state = rb._rng.get_state()
        first = rb.sample()
        rb._rng.set_state(state)
        record.call("same rng state, same sample", lambda: (first == rb.sample()).all())
        rb.set_rng(torch.Generator().manual_seed(11))
        record.call("set_rng sample", rb.sample, return_info=True)


@pytest.mark.parametrize("option", ["transform", "collate_fn", "prefetch", "dim_extend", "delayed_init", "rng"])
def test_buffer_options(tmp_path, option):
    check_same(options, tmp_path, option=option)


# =============================================================================
# torch.compile: extend + sample in one compiled function
# =============================================================================
def _count_graphs():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return graphs, backend


@must_run("step *", "len")
def compiled_buffer(record, C, *, kind, size, peer=None):
    import torch._dynamo

    torch._dynamo.reset()
    graphs, backend = _count_graphs()
    rb = C.ReplayBuffer(
        storage=C.LazyTensorStorage(size, compilable=True), sampler=C.RandomSampler(),
        batch_size=3, compilable=True,
    )

    @torch.compile(backend=backend)
    def step(data):
        rb.extend(data)
        return rb.sample()

    counts = []
    for k in range(8):
        if kind == "tensor":
            data = torch.arange(2 * k, 2 * k + 2).float().unsqueeze(-1)
        else:
            data = {"a": torch.arange(2 * k, 2 * k + 2).float(), "b": (torch.full((2,), float(k)),)}
        record(f"step {k}", step(data))
        counts.append(len(graphs))
    record("len", len(rb))
    # Graphs compiled after three warm-up calls: recorded, compared below (not here).
    record.compiled_after_warm_up = counts[-1] - counts[2]


@must_run("step *")
def compiled_storage_and_sampler(record, C, *, peer=None):
    import torch._dynamo

    torch._dynamo.reset()
    graphs, backend = _count_graphs()
    storage = C.LazyTensorStorage(100, compilable=True)
    sampler = C.RandomSampler()

    @torch.compile(backend=backend)
    def step(data):
        storage.set(torch.arange(data.shape[0]) + len(storage), data)
        return sampler.sample(storage, 4)

    counts = []
    for k in range(12):
        record(f"step {k}", step(torch.full((2, 3), float(k))))
        counts.append(len(graphs))
    record.compiled_after_warm_up = counts[-1] - counts[2]


def _check_compiled(scenario, expected, got):
    assert_ran(scenario, expected)
    assert_records_equal(expected, got)
    assert got.compiled_after_warm_up <= expected.compiled_after_warm_up, (
        f"torch.compile recompiled {got.compiled_after_warm_up} times after warm-up on "
        f"torchrl_compat's classes, {expected.compiled_after_warm_up} on torchrl's"
    )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tensor", "pytree"])
def test_compiled_extend_and_sample(tmp_path, kind):
    with torchrl_own_classes():
        expected = run(compiled_buffer, tmp_path / "torchrl", kind=kind, size=100)
    got = run(compiled_buffer, tmp_path / "ours", kind=kind, size=100)
    _check_compiled(compiled_buffer, expected, got)


@pytest.mark.slow
def test_compiled_storage_set_and_sampler(tmp_path):
    with torchrl_own_classes():
        expected = run(compiled_storage_and_sampler, tmp_path / "torchrl")
    got = run(compiled_storage_and_sampler, tmp_path / "ours")
    _check_compiled(compiled_storage_and_sampler, expected, got)


# =============================================================================
# Cases torchrl's own buffers run into on torchrl_compat
# =============================================================================
@must_run("extend 0", "extend 1", "len", "sample 0", "sample 1", "sample 2", "update_tensordict_priority", "sample after update")
def sampler_smaller_than_storage(record, C, *, sampler, peer=None):
    """torchrl's buffers hand a prioritized sampler every storage index, also those past its
    max_capacity (its trees hold a power of two of leaves)."""
    if sampler == "PrioritizedSampler":
        rb = C.TensorDictReplayBuffer(sampler=C.PrioritizedSampler(5, alpha=1.0, beta=1.0), priority_key="p", batch_size=4, generator=torch.Generator().manual_seed(1))
        batches = ((3, 0), (5, 3))
    else:
        rb = C.TensorDictReplayBuffer(
            storage=C.LazyTensorStorage(10),
            sampler=C.PrioritizedSliceSampler(max_capacity=9, alpha=1.0, beta=1.0, num_slices=2, traj_key="episode", strict_length=False),
            priority_key="p", batch_size=4, generator=torch.Generator().manual_seed(1),
        )
        batches = ((6, 0), (4, 6))
    for k, (n, start) in enumerate(batches):
        record.call(f"extend {k}", rb.extend, make_data("tensordict", n, 1, start=start))
    record("len", len(rb))
    for k in range(3):
        sample = record.call(f"sample {k}", rb.sample, return_info=True)
    if sample is not None:
        data, info = sample
        data["p"] = torch.arange(1.0, data.numel() + 1)
        record.call("update_tensordict_priority", rb.update_tensordict_priority, data)
        record.call("sample after update", rb.sample, return_info=True)


# What torchrl 0.11 returns with its own (C++) trees, on torch 2.9.1 where they load:
# (index, priority_weight) of "sample 0", "sample 1", "sample 2", "sample after update".
# On the CI torch, torchrl's reference run uses replay's trees, which cannot show it.
_THIRD = 0.3333333432674408
_FIFTH = 0.20000000298023224
TORCHRL_SMALLER_SAMPLER = {
    "PrioritizedSampler": (
        ([5, 2, 3, 5], [1.0, _THIRD, 0.25, 1.0]),
        ([0, 6, 3, 5], [1.0, 0.5, 0.25, 1.0]),
        ([4, 3, 4, 4], [_FIFTH, 0.25, _FIFTH, _FIFTH]),
        ([5, 2, 4, 4], [1.0, _THIRD, 0.25, 0.25]),
    ),
    "PrioritizedSliceSampler": (
        ([7, 8, 3, 4], [_THIRD, _THIRD, 0.25, 0.25]),
        ([4, 5, 7, 8], [_FIFTH, _FIFTH, _THIRD, _THIRD]),
        ([0, 1, 9], [1.0, 1.0, _FIFTH]),
        ([4, 5, 7, 8], [_FIFTH, _FIFTH, _THIRD, _THIRD]),
    ),
}


@pytest.mark.parametrize("sampler", ["PrioritizedSampler", "PrioritizedSliceSampler"])
def test_sampler_smaller_than_storage(tmp_path, sampler):
    got = run(sampler_smaller_than_storage, tmp_path, sampler=sampler)
    assert_ran(sampler_smaller_than_storage, got)  # ours (torchrl's values are below)
    steps = {label: (value, message) for label, value, message in got.steps}
    assert steps["extend 1"][1] is None, steps["extend 1"][1]
    assert steps["len"][0] == (8 if sampler == "PrioritizedSampler" else 10)
    labels = ("sample 0", "sample 1", "sample 2", "sample after update")
    for label, (index, weight) in zip(labels, TORCHRL_SMALLER_SAMPLER[sampler]):
        value, message = steps[label]
        assert message is None, f"{label}: {message}"
        info = dict(value[1][1][1])
        drawn = info["index"][1][0][1] if info["index"][0] == "tuple" else info["index"][1]
        assert drawn.tolist() == index, label
        assert torch.equal(info["priority_weight"][1], torch.tensor(weight)), label


@must_run("set", "dumps", "dumps again", "loads, initialised", "get, initialised", "loads, not initialised")
def pytree_non_string_keys(record, C, *, storage, peer=None):
    def tree(value):
        t = torch.full((2, 3), float(value))
        return {"a": t, "b": {"c": [t, (t,)]}, 30: t}

    def build():
        if storage == "LazyMemmapStorage":
            return C.LazyMemmapStorage(CAP, scratch_dir=record.fresh_dir("scratch"))
        return C.LazyTensorStorage(CAP)

    st = build()
    record.call("set", st.set, torch.arange(2), tree(1))
    dump = Path(record.dir("dump"))
    record.call("dumps", st.dumps, dump)
    record.call("dumps again", st.dumps, dump)
    initialised = build()
    initialised.set(torch.arange(2), tree(0))
    record.call("loads, initialised", initialised.loads, dump)
    record.call("get, initialised", initialised.get, torch.arange(2))
    record.call("loads, not initialised", build().loads, dump)


@pytest.mark.parametrize(
    "storage",
    ["LazyTensorStorage", "LazyMemmapStorage"],
)
def test_pytree_non_string_keys_dumps_loads(tmp_path, storage):
    # torchrl: "Cannot fill a non-initialized pytree-based TensorStorage."
    raises = {"loads, not initialised": "RuntimeError"}
    check_same(pytree_non_string_keys, tmp_path, raises=raises, storage=storage)


def test_memmap_storages_share_torchrls_cleanup_registry(tmp_path):
    """torchrl's exit / signal cleanup sees the memmap storages built through torchrl."""
    from torchrl.data.replay_buffers import storages as torchrl_storages

    storage = CLASSES.LazyMemmapStorage(CAP, auto_cleanup=True)
    assert isinstance(storage, torchrl_compat.LazyMemmapStorage)
    assert storage in torchrl_storages._MEMMAP_STORAGE_REGISTRY
