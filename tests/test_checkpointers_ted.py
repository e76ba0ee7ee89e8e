"""TED checkpointing hooks and the Flat / Nested / H5 checkpointers against torchrl 0.11.

The hooks (``TED2Flat``, ``Flat2TED``, ``TED2Nested``, ``Nested2TED``, ``H5Split``,
``H5Combine``) are run next to torchrl's on the same TED data and must give equal outputs;
storages dumped by one library's checkpointer are loaded by the other's and compared with the
data that was written, for partially filled and wrapped storages of one and two dimensions.
"""
import inspect
import json
import os
import pathlib
import shutil
import warnings

import pytest
import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers.checkpointers as trl_ck
import torchrl.data.replay_buffers.storages as trl
import torchrl.data.replay_buffers.utils as TU

import torchrl_compat.checkpointers as ck
from data import make_golden_ted_checkpoints as golden
from torchrl_compat._releases import FOLLOWED
import torchrl_compat.storages as ours
import torchrl_compat.utils as U

DATA = pathlib.Path(__file__).parent / "data"
HOOKS = ["TED2Flat", "Flat2TED", "TED2Nested", "Nested2TED", "H5Split", "H5Combine"]
PAIRS = [("TED2Flat", "Flat2TED"), ("TED2Nested", "Nested2TED")]
ROWS = 6  # time steps held by the test storages
COLS = 2  # batch columns of a two-dimensional storage
STORAGES = {"torchrl": (trl, trl_ck), "ours": (ours, ck)}
DIRECTIONS = [("torchrl", "ours"), ("ours", "torchrl"), ("ours", "ours")]


def ted_stream(nsteps, batch=(), seed=0, done_last=False):
    """Consecutive TED steps: ``obs[t + 1] == ("next", "obs")[t]`` unless ``done[t]``."""
    g = torch.Generator().manual_seed(seed)
    shape = (nsteps, *batch)
    next_obs = torch.randn(*shape, 3, generator=g)
    done = torch.rand(*shape, 1, generator=g) < 0.3
    if done_last:
        done[-1] = True
    fresh = torch.randn(*shape, 3, generator=g)
    obs = torch.empty_like(next_obs)
    obs[0] = fresh[0]
    obs[1:] = torch.where(done[:-1], fresh[1:], next_obs[:-1])
    return TensorDict(
        {
            "obs": obs,
            "action": torch.randint(5, shape, generator=g),
            "done": torch.zeros_like(done),
            "terminated": torch.zeros_like(done),
            "truncated": torch.zeros_like(done),
            ("agent", "pos"): obs[..., :2].clone(),
            "next": {
                "obs": next_obs,
                ("agent", "pos"): next_obs[..., :2].clone(),
                "done": done,
                "terminated": done.clone(),
                "truncated": torch.zeros_like(done),
                "reward": torch.randn(*shape, 1, generator=g),
            },
        },
        list(shape),
    )


def leaves(td):
    out = {}
    for key, value in td.items(True, True):
        if value.is_nested:
            value = torch.cat([row.reshape(-1) for row in value.unbind(0)])
        out[key] = value
    return out


def assert_td_equal(a, b):
    la, lb = leaves(a), leaves(b)
    assert set(la) == set(lb)
    for key in la:
        assert la[key].shape == lb[key].shape, key
        assert la[key].dtype == lb[key].dtype, key
        assert torch.equal(la[key], lb[key]), key
    for key in ("shift", "is_full", "_storage_shape"):
        if key in a.keys():
            assert a.get_non_tensor(key) == b.get_non_tensor(key), key


def set_hooks(hooks, shift, is_full):
    for hook in hooks:
        hook.shift, hook.is_full = shift, is_full


# -----------------------------------------------------------------------------
# Signatures
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", HOOKS)
def test_signatures_match_torchrl(name):
    ref, mine = getattr(TU, name), getattr(U, name)
    assert inspect.signature(mine) == inspect.signature(ref)
    assert inspect.signature(mine.__call__) == inspect.signature(ref.__call__)
    assert [c.__name__ for c in mine.__mro__] == [c.__name__ for c in ref.__mro__]
    assert name in U.__all__


def test_defaults_match_torchrl():
    for name in ("TED2Flat", "Flat2TED", "TED2Nested", "Nested2TED", "H5Split"):
        a, b = getattr(U, name)(), getattr(TU, name)()
        for attr in ("done_key", "shift_key", "is_full_key", "done_keys", "reward_keys"):
            assert getattr(a, attr) == getattr(b, attr), (name, attr)
    hook = U.TED2Flat(done_keys=(("agent", "done"),), reward_keys=["r"])
    assert hook.done_keys == {("agent", "done")} and hook.reward_keys == {"r"}


# -----------------------------------------------------------------------------
# Hooks against torchrl's, on the same input
# -----------------------------------------------------------------------------
# (shift, is_full) pairs the checkpointers produce: one past the last written row.
CURSORS = [(3, False), (ROWS, False), (1, True), (4, True)]


@pytest.mark.parametrize("save,load", PAIRS)
@pytest.mark.parametrize("batch", [(), (COLS,)], ids=["ndim1", "ndim2"])
@pytest.mark.parametrize("shift,is_full", CURSORS)
@pytest.mark.parametrize("seed", [0, 1])
def test_hooks_match_torchrl(save, load, batch, shift, is_full, seed):
    data = ted_stream(ROWS, batch, seed=seed, done_last=seed == 1)
    if is_full:
        # a wrapped storage: the oldest step sits at row ``shift``
        data = torch.cat([data[-shift:], data[:-shift]]) if shift % ROWS else data
    outputs = []
    for mod in (TU, U):
        hook = getattr(mod, save)()
        set_hooks([hook], shift, is_full)
        flat = hook(data.clone())
        restored = getattr(mod, load)()(flat)
        into = data.clone().zero_()
        getattr(mod, load)()(flat, out=into)
        outputs.append((flat, restored, into))
    for mine, ref in zip(outputs[1], outputs[0]):
        assert_td_equal(mine, ref)
    # and the written rows come back as they were (root done states read as False)
    written = slice(None) if is_full else slice(0, shift - 1)
    expected = data.clone()
    expected["terminated"].zero_()
    restored = outputs[1][1]
    for key in expected.keys(True, True):
        assert torch.equal(restored[written].get(key), expected[written].get(key)), key


def test_flat_layout():
    # two trajectories [o0 o1 | o2 o3 o4] -> each observation once, plus the one after each end
    done = torch.tensor([False, True, False, False, False]).unsqueeze(-1)
    obs = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])
    next_obs = torch.tensor([1.0, 10.0, 3.0, 4.0, 20.0])
    data = TensorDict(
        {"obs": obs, "action": torch.arange(5), "next": {"obs": next_obs, "done": done}}, [5]
    )
    hook = U.TED2Flat()
    set_hooks([hook], 5, False)
    flat = hook(data)
    assert flat["obs"].tolist() == [0.0, 1.0, 10.0, 2.0, 3.0, 4.0, 20.0]
    assert flat["action"].tolist() == [0, 1, 2, 3, 4]
    assert flat["done"].squeeze(-1).tolist() == done.squeeze(-1).tolist()
    assert flat.get_non_tensor("_storage_shape") == (5,)
    # wrapped after row 1: rows 2..4 are the oldest, written first
    hook = U.TED2Flat()
    set_hooks([hook], 2, True)
    flat = hook(data)
    assert flat["action"].tolist() == [2, 3, 4, 0, 1]
    # rows 2..4 then 0..1 form one trajectory (row 4 is not done), ended by row 1
    assert flat["obs"].tolist() == [2.0, 3.0, 4.0, 0.0, 1.0, 10.0]
    ref = TU.TED2Flat()
    set_hooks([ref], 2, True)
    assert torch.equal(flat["obs"], ref(data)["obs"])


def test_nested_rows_are_trajectories():
    data = ted_stream(ROWS, seed=3)
    hook = U.TED2Nested()
    set_hooks([hook], ROWS, True)
    nested = hook(data)
    done = data["next", "done"].squeeze(-1).clone()
    done[-1] = True
    lengths = torch.diff(done.nonzero().squeeze(-1), prepend=torch.tensor([-1]))
    assert nested.batch_size == torch.Size([len(lengths)])
    for row, length in zip(nested.unbind(0), lengths.tolist()):
        assert row["action"].shape[0] == length
        assert row["obs"].shape[0] == length + 1  # plus the observation after the last step


# -----------------------------------------------------------------------------
# Edge cases
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("save,load", PAIRS)
def test_single_step_storage(save, load):
    data = ted_stream(1, seed=0)
    for is_full in (False, True):
        mine, ref = getattr(U, save)(), getattr(TU, save)()
        set_hooks([mine, ref], 1, is_full)
        flat = mine(data.clone())
        assert_td_equal(flat, ref(data.clone()))
        if save == "TED2Flat":
            assert flat["obs"].shape == (2, 3)  # the step and the one after it
        restored = getattr(U, load)()(flat)
        assert torch.equal(restored["obs"], data["obs"])
        if is_full:
            assert torch.equal(restored["next", "obs"], data["next", "obs"])
        else:
            # torchrl's Flat2TED fails here (it pads with an empty row); the last next
            # observation of a storage that is not full reads as zeros
            assert not restored["next", "obs"].any()


@pytest.mark.parametrize("save,load", PAIRS)
@pytest.mark.parametrize("batch", [(), (COLS,), (COLS, 3)], ids=["ndim1", "ndim2", "ndim3"])
def test_done_at_last_step_and_full_cursor_at_end(save, load, batch):
    # Last write on the last row of a full storage: torchrl saves it but cannot load it back.
    data = ted_stream(ROWS, batch, seed=2, done_last=True)
    hook = getattr(U, save)()
    set_hooks([hook], ROWS, True)
    flat = hook(data.clone())
    restored = getattr(U, load)()(flat)
    expected = data.clone()
    expected["terminated"].zero_()
    assert_td_equal(restored, expected)
    ref = getattr(TU, save)()
    set_hooks([ref], ROWS, True)
    assert_td_equal(flat, ref(data.clone()))
    # torchrl's own loading fails (TypeError for three dimensions)
    with pytest.raises((RuntimeError, TypeError)):
        getattr(TU, load)()(ref(data.clone()), out=data.clone().zero_())


def test_locked_out_missing_root_done():
    # torchrl fails to add a root done entry to a locked one-dimensional ``out``; ours leaves
    # it out and fills the rest.
    data = ted_stream(ROWS, seed=6).exclude("truncated")
    hook = U.TED2Flat()
    set_hooks([hook], ROWS, True)
    flat = hook(data.clone())
    out = data.clone().zero_().lock_()
    U.Flat2TED()(flat, out=out)
    assert "truncated" not in out.keys()
    assert torch.equal(out["next", "obs"], data["next", "obs"])
    assert torch.equal(out["obs"], data["obs"])
    ref = TU.TED2Flat()
    set_hooks([ref], 3, True)
    with pytest.raises(RuntimeError, match="locked"):
        TU.Flat2TED()(ref(data.clone()), out=data.clone().zero_().lock_())


def test_every_step_done():
    data = ted_stream(ROWS, seed=4)
    data["next", "done"].fill_(True)
    data["obs"][1:] = torch.randn(ROWS - 1, 3)
    for mod in (U, TU):
        hook = mod.TED2Flat()
        set_hooks([hook], 2, True)
        flat = hook(data.clone())
        assert flat["obs"].shape[0] == 2 * ROWS
    restored = U.Flat2TED()(flat)
    assert torch.equal(restored["next", "obs"], data["next", "obs"])
    assert torch.equal(restored["obs"], data["obs"])


@pytest.mark.parametrize("checkpointer", ["FlatStorageCheckpointer", "NestedStorageCheckpointer"])
def test_empty_storage_is_refused(tmp_path, checkpointer):
    for lib, (mod, ckmod) in STORAGES.items():
        storage = mod.LazyMemmapStorage(ROWS)
        storage.checkpointer = getattr(ckmod, checkpointer)()
        with pytest.raises(RuntimeError, match="Cannot save a non-initialized storage"):
            storage.dumps(tmp_path / lib)
    assert not (tmp_path / "ours").exists()


def test_h5split_names():
    h5 = U.H5Split()
    for ntraj, first, last in [(1, "traj_0", "traj_0"), (10, "traj_0", "traj_9"), (11, "traj_00", "traj_10")]:
        data = TensorDict({"x": torch.arange(ntraj)}, [ntraj])
        data.set_non_tensor("shift", 3)
        out = h5(data)
        names = sorted(k for k in out.keys() if k.startswith("traj"))
        assert names[0] == first and names[-1] == last and len(names) == ntraj
        assert out.get_non_tensor("shift") == 3
        assert sorted(TU.H5Split()(data).keys()) == sorted(out.keys())


# -----------------------------------------------------------------------------
# Checkpointers across libraries
# -----------------------------------------------------------------------------
def fill(lib, ndim, nwrites, seed, checkpointer):
    mod, ckmod = STORAGES[lib]
    storage = mod.LazyMemmapStorage(ROWS * (COLS if ndim == 2 else 1), ndim=ndim)
    storage.checkpointer = getattr(ckmod, checkpointer)()
    stream = ted_stream(nwrites, () if ndim == 1 else (COLS,), seed=seed)
    for i in range(nwrites):
        storage.set(i % ROWS, stream[i])
    return storage


@pytest.mark.parametrize("checkpointer", ["FlatStorageCheckpointer", "NestedStorageCheckpointer"])
@pytest.mark.parametrize("src,dst", DIRECTIONS)
@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("nwrites", [4, ROWS + 3], ids=["partial", "wrapped"])
@pytest.mark.parametrize("initialized", [False, True], ids=["fresh", "initialized"])
def test_checkpoints_cross_load(tmp_path, checkpointer, src, dst, ndim, nwrites, initialized):
    source = fill(src, ndim, nwrites, 0, checkpointer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source.dumps(tmp_path / "ckpt")
    if initialized:
        target = fill(dst, ndim, 2, 9, checkpointer)
    else:
        mod, ckmod = STORAGES[dst]
        target = mod.LazyMemmapStorage(ROWS * (COLS if ndim == 2 else 1), ndim=ndim)
        target.checkpointer = getattr(ckmod, checkpointer)()
    target.loads(tmp_path / "ckpt")
    assert len(target) == len(source)
    rows = min(nwrites, ROWS)
    expected = source._storage[:rows].clone()
    expected["done"].zero_()
    expected["terminated"].zero_()
    got = target._storage[:rows]
    keys = set(expected.keys(True, True))
    assert keys <= set(got.keys(True, True))
    full = nwrites >= ROWS
    for key in keys:
        want, have = expected.get(key), got.get(key)
        if key in (("next", "obs"), ("next", "agent", "pos")) and not full:
            # the step written last has no successor in a storage that is not full
            want, have = want[: rows - 1], have[: rows - 1]
        assert torch.equal(have, want), key


@pytest.mark.parametrize("checkpointer", ["FlatStorageCheckpointer", "NestedStorageCheckpointer"])
@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("nwrites", [4, ROWS + 3], ids=["partial", "wrapped"])
def test_checkpoint_files_match_torchrl(tmp_path, checkpointer, ndim, nwrites):
    for lib in ("torchrl", "ours"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fill(lib, ndim, nwrites, 0, checkpointer).dumps(tmp_path / lib)
    ref, mine = (TensorDict.load_memmap(tmp_path / lib) for lib in ("torchrl", "ours"))
    assert_td_equal(mine, ref)
    # every file, down to the non-tensor entries' (which carry an other.pickle with
    # torchrl 0.11 and tensordict 0.11, none with torchrl 0.14)
    assert files_of(tmp_path / "ours") == files_of(tmp_path / "torchrl")


def files_of(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


# -----------------------------------------------------------------------------
# Golden checkpoints of torchrl 0.11.0 and 0.14.1 (tests/data/make_golden_ted_checkpoints.py)
# -----------------------------------------------------------------------------
GOLDEN_LAYOUTS = {(0, 11): "trl011", (0, 14): "trl014"}
GOLDEN_CHECKPOINTERS = {"flat": "FlatStorageCheckpointer", "nested": "NestedStorageCheckpointer"}


def golden_dir(layout, kind):
    return DATA / f"golden_{layout}_{kind}_checkpoint"


def golden_expected():
    """The storage the golden checkpoints hold: 9 steps in 6 rows (rows 0-2 overwritten),
    root done states zeroed as the checkpointers restore them."""
    data = golden.ted_steps(golden.STEPS)[torch.tensor([6, 7, 8, 3, 4, 5])]
    for key in ("done", "terminated", "truncated"):
        data[key].zero_()
    return data


@pytest.mark.filterwarnings("ignore:TensorDict.load_memmap is loading a pickled non-tensor field")
@pytest.mark.parametrize("lib", ["torchrl", "ours"])
@pytest.mark.parametrize("kind", sorted(GOLDEN_CHECKPOINTERS))
@pytest.mark.parametrize("layout", sorted(GOLDEN_LAYOUTS.values()))
def test_golden_checkpoint_loads(tmp_path, layout, kind, lib):
    """Both releases' layouts load into ours (and into the installed torchrl's storage), with
    or without an ``other.pickle`` beside the non-tensor entries."""
    shutil.copytree(golden_dir(layout, kind), tmp_path / "ckpt")
    mod, ckmod = STORAGES[lib]
    storage = mod.LazyTensorStorage(golden.ROWS)
    storage.checkpointer = getattr(ckmod, GOLDEN_CHECKPOINTERS[kind])()
    storage.loads(tmp_path / "ckpt")
    assert len(storage) == golden.ROWS
    expected = golden_expected()
    got = storage._storage
    for key in expected.keys(True, True):
        assert torch.equal(got.get(key), expected.get(key)), key


@pytest.mark.parametrize("kind", sorted(GOLDEN_CHECKPOINTERS))
def test_dumps_as_golden_of_release(tmp_path, kind):
    """Ours writes the files, and the metadata, the followed release's torchrl wrote."""
    layout = GOLDEN_LAYOUTS.get(FOLLOWED)
    if layout is None:
        pytest.skip(f"no golden checkpoint of torchrl {FOLLOWED}")
    storage = ours.LazyTensorStorage(golden.ROWS)
    storage.checkpointer = getattr(ck, GOLDEN_CHECKPOINTERS[kind])()
    data = golden.ted_steps(golden.STEPS)
    for t in range(golden.STEPS):
        storage.set(t % golden.ROWS, data[t])
    storage.dumps(tmp_path / "ckpt")
    reference = golden_dir(layout, kind)
    assert files_of(tmp_path / "ckpt") == files_of(reference)
    for name in files_of(reference):
        mine, theirs = (tmp_path / "ckpt" / name).read_bytes(), (reference / name).read_bytes()
        if name.endswith(".json"):
            assert json.loads(mine) == json.loads(theirs), name
        elif name.endswith(".memmap"):
            assert mine == theirs, name


# -----------------------------------------------------------------------------
# H5
# -----------------------------------------------------------------------------
def test_h5_hooks_match_torchrl():
    pytest.importorskip("h5py")
    data = ted_stream(ROWS, seed=5)
    results = []
    for mod in (TU, U):
        nested = mod.TED2Nested()
        split = mod.H5Split()
        set_hooks([nested, split], 4, True)
        parts = split(nested(data.clone()))
        combined = mod.H5Combine()(parts)
        results.append((parts, combined, mod.Nested2TED()(combined)))
    (p_ref, c_ref, r_ref), (p_mine, c_mine, r_mine) = results
    assert sorted(p_mine.keys()) == sorted(p_ref.keys())
    for key in p_ref.keys():
        if key.startswith("traj"):
            assert_td_equal(p_mine[key], p_ref[key])
    assert_td_equal(c_mine, c_ref)
    assert_td_equal(r_mine, r_ref)


@pytest.mark.parametrize("src,dst", DIRECTIONS)
@pytest.mark.parametrize("nwrites", [4, ROWS + 3], ids=["partial", "wrapped"])
def test_h5_checkpoints_cross_load(tmp_path, src, dst, nwrites):
    pytest.importorskip("h5py")
    source = fill(src, 1, nwrites, 0, "H5StorageCheckpointer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source.dumps(tmp_path / "ckpt")
    target = fill(dst, 1, 2, 9, "H5StorageCheckpointer")
    target.loads(tmp_path / "ckpt")
    assert len(target) == len(source)
    rows = min(nwrites, ROWS)
    for key in ("obs", "action", ("next", "done"), ("next", "reward"), ("agent", "pos")):
        assert torch.equal(target._storage[:rows].get(key), source._storage[:rows].get(key)), key


def test_h5_interrupted_dumps_keeps_previous_file(tmp_path, monkeypatch):
    h5py = pytest.importorskip("h5py")
    from tensordict import PersistentTensorDict

    source = fill("ours", 1, 4, 0, "H5StorageCheckpointer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        source.dumps(tmp_path / "ckpt")
        first = source._storage[:4].clone()
        for i in range(4, 6):
            source.set(i, ted_stream(6, seed=5)[i])
        real = PersistentTensorDict.from_dict

        def interrupted(*args, **kwargs):
            real(*args, **kwargs).close()  # the file is complete, but not yet published
            raise KeyboardInterrupt

        monkeypatch.setattr(PersistentTensorDict, "from_dict", interrupted)
        with pytest.raises(KeyboardInterrupt):
            source.dumps(tmp_path / "ckpt")
    assert os.listdir(tmp_path / "ckpt") == ["checkpoint.h5"]
    target = fill("ours", 1, 2, 9, "H5StorageCheckpointer")
    target.loads(tmp_path / "ckpt")
    assert len(target) == 4
    assert torch.equal(target._storage[:4].get("obs"), first.get("obs"))
    with h5py.File(tmp_path / "ckpt" / "checkpoint.h5") as f:
        assert int(f["_len"][()]) == 4
