"""Sampler checkpoints under faults: processes killed during ``dumps``, damaged files at ``loads``.

``dumps`` writes aside and publishes in one rename: a process killed (SIGKILL) at any moment
leaves the previous checkpoint or the new one, whole, never a mix of the two and never
nothing. ``loads`` reads every file read-only and checks it before anything changes: each
damaged file gives an error naming it, the sampler and the checkpoint stay as they were.
The formats are torchrl 0.11's: a checkpoint crosses between the libraries both ways.
"""
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import sys
import time

import numpy as np
import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl

import replay
import torchrl_compat.samplers as ours
from torchrl_compat.samplers import _trees

# The module whose globals hold torchrl's tree classes (torchrl 0.14 splits samplers.py).
TRL_PRIORITIZED = sys.modules[trl.PrioritizedSampler._init.__module__]

JOIN_TIMEOUT = 60
TREE_NAMES = ("SumSegmentTreeFp32", "SumSegmentTreeFp64", "MinSegmentTreeFp32", "MinSegmentTreeFp64")
fork_only = pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")


@pytest.fixture
def torchrl_trees(monkeypatch):
    for name in TREE_NAMES:
        monkeypatch.setattr(TRL_PRIORITIZED, name, getattr(replay, name))


# ------------------------------------------------------------------------ versioned states
# Each sampler is put in "version v", a state whose every part says v, so that a checkpoint
# mixing two dumps is caught by comparing its parts.

PRIORITIZED_SIZE = 1 << 15


def _prioritized(version=0):
    sampler = ours.PrioritizedSampler(PRIORITIZED_SIZE, alpha=1.0, beta=0.5, eps=0.0)
    _set_prioritized(sampler, version)
    return sampler


def _set_prioritized(sampler, version):
    sampler._beta = float(version)
    sampler._max_priority = None
    sampler.update_priority(torch.arange(sampler._max_capacity), torch.full((sampler._max_capacity,), float(version + 1)))


def _prioritized_version(sampler):
    leaves = np.concatenate([sampler._sum_tree.values(), sampler._min_tree.values()])
    versions = {float(v) - 1 for v in np.unique(leaves)} | {sampler._beta, float(sampler._max_priority[0]) - 1}
    assert len(versions) == 1, f"a checkpoint mixing versions {sorted(versions)}"
    return versions.pop()


def _without_replacement(version=0):
    sampler = ours.SamplerWithoutReplacement()
    _set_without_replacement(sampler, version)
    return sampler


def _set_without_replacement(sampler, version):
    n = 1 << 16
    sampler.load_state_dict(
        {"len_storage": n + version, "_sample_list": (torch.arange(n) + version) % (n + version),
         "drop_last": bool(version % 2), "_ran_out": False}
    )


def _without_replacement_version(sampler):
    n = 1 << 16
    version = sampler.len_storage - n
    assert int(sampler._sample_list[0]) == version and sampler.drop_last == bool(version % 2)
    assert torch.equal(sampler._sample_list, (torch.arange(n) + version) % (n + version))
    return float(version)


def _ensemble(version=0):
    return ours.SamplerEnsemble(_prioritized(version), _without_replacement(version), ours.RandomSampler())


def _set_ensemble(sampler, version):
    _set_prioritized(sampler[0], version)
    _set_without_replacement(sampler[1], version)


def _ensemble_version(sampler):
    versions = {_prioritized_version(sampler[0]), _without_replacement_version(sampler[1])}
    assert len(versions) == 1, f"an ensemble checkpoint mixing versions {sorted(versions)}"
    return versions.pop()


KINDS = {
    "PrioritizedSampler": (_prioritized, _set_prioritized, _prioritized_version),
    "SamplerWithoutReplacement": (_without_replacement, _set_without_replacement, _without_replacement_version),
    "SamplerEnsemble": (_ensemble, _set_ensemble, _ensemble_version),
}


def _dump_forever(kind, path, first_version, started, finished):
    torch.set_num_threads(1)  # a forked child must not enter the parent's OpenMP pool
    make, set_version, _ = KINDS[kind]
    sampler = make(first_version)
    version = first_version
    started.set()
    while True:
        sampler.dumps(path)
        with finished.get_lock():
            finished.value += 1
        version += 1
        set_version(sampler, version)


def _partials(path):
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.partial-"))


@fork_only
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_killed_dumps_leaves_a_whole_checkpoint(kind, tmp_path):
    """SIGKILL at spread-out moments of repeated dumps over a previous checkpoint: every time,
    the path loads as one whole version, never older than the last one seen."""
    make, _, version_of = KINDS[kind]
    path = tmp_path / "sampler"
    make(0).dumps(path)
    # how long a dumps takes here, to spread the kills over a few of them
    start = time.perf_counter()
    make(0).dumps(path)
    span = 3 * (time.perf_counter() - start)
    context = mp.get_context("fork")
    rng = random.Random(0)
    last, seen = 0.0, set()
    for trial in range(16):
        started, finished = context.Event(), context.Value("i", 0)
        child = context.Process(target=_dump_forever, args=(kind, path, int(last) + 1, started, finished))
        child.start()
        assert started.wait(JOIN_TIMEOUT)
        # every other trial lets one dumps finish first, so new versions show up however slow
        # the machine is; the kill then lands at a spread-out moment of the next ones
        deadline = time.monotonic() + JOIN_TIMEOUT
        while finished.value < trial % 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(span * (trial + rng.random()) / 16)
        os.kill(child.pid, signal.SIGKILL)
        child.join(JOIN_TIMEOUT)
        loaded = make(-1 if kind != "SamplerWithoutReplacement" else 0)
        loaded.loads(path)  # never missing, never refused
        version = version_of(loaded)
        assert version >= last
        last = version
        seen.add(version)
    assert len(seen) > 1  # some dumps finished between the kills: the test saw new versions
    make(0).dumps(path)  # the leftovers of the killed processes go with the next dumps
    assert _partials(path) == []


# ------------------------------------------------------------------------ damaged files


def _directory_state(path):
    """Every file under ``path`` with its bytes: a loads must change none of them."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as file:
                out[os.path.relpath(full, path)] = file.read()
    return out


def _prioritized_snapshot(sampler):
    return (
        sampler._sum_tree.values().tolist(),
        sampler._min_tree.values().tolist(),
        [None if x is None else float(x) for x in sampler._max_priority],
        sampler._alpha, sampler._beta, sampler._eps,
    )


def _edit_json(file, **changes):
    def edit(path):
        metadata = json.loads((path / file).read_text())
        for key, value in changes.items():
            if value is KeyError:
                del metadata[key]
            else:
                metadata[key] = value
        (path / file).write_text(json.dumps(metadata))

    return edit


def _write(file, data):
    def edit(path):
        (path / file).write_bytes(data)

    return edit


def _truncate(file, keep=0.5):
    def edit(path):
        raw = (path / file).read_bytes()
        (path / file).write_bytes(raw[: int(len(raw) * keep)])

    return edit


def _remove(file):
    def edit(path):
        os.remove(path / file)

    return edit


def _leaf(file, position, value):
    def edit(path):
        leaves = np.fromfile(path / file, dtype=np.float64)
        leaves[position] = value
        leaves.tofile(path / file)

    return edit


META = "sampler_metadata.json"
PRIORITIZED_DAMAGE = {
    "missing sum tree": (_remove("sumtree.memmap"), FileNotFoundError, r"sumtree\.memmap: the file is missing"),
    "missing min tree": (_remove("mintree.memmap"), FileNotFoundError, r"mintree\.memmap: the file is missing"),
    "missing metadata": (_remove(META), FileNotFoundError, r"sampler_metadata\.json: the file is missing"),
    "truncated sum tree": (_truncate("sumtree.memmap"), ValueError, r"sumtree\.memmap: holds 64 bytes, max_capacity=16 needs 128"),
    "empty min tree": (_truncate("mintree.memmap", 0), ValueError, r"mintree\.memmap: holds 0 bytes"),
    "longer sum tree": (_write("sumtree.memmap", bytes(136)), ValueError, r"sumtree\.memmap: holds 136 bytes"),
    "garbage metadata": (_write(META, b"\xff\xfe\x00garbage"), ValueError, r"sampler_metadata\.json: not a JSON file"),
    "truncated metadata": (_truncate(META), ValueError, r"sampler_metadata\.json: not a JSON file"),
    "metadata not an object": (_write(META, b"[1, 2]"), ValueError, r"sampler_metadata\.json: .*expected a JSON object, got list"),
    "missing _alpha": (_edit_json(META, _alpha=KeyError), ValueError, r"sampler_metadata\.json: no '_alpha' entry"),
    "missing _max_priority": (_edit_json(META, _max_priority=KeyError), ValueError, r"sampler_metadata\.json: no '_max_priority' entry"),
    "string _alpha": (_edit_json(META, _alpha="x"), ValueError, r"sampler_metadata\.json: _alpha must be a finite number, got 'x'"),
    "negative _beta": (_edit_json(META, _beta=-1.0), ValueError, r"sampler_metadata\.json: _beta must be at least 0, got -1\.0"),
    "bool _eps": (_edit_json(META, _eps=True), ValueError, r"sampler_metadata\.json: _eps must be a finite number, got True"),
    "nan _eps": (_edit_json(META, _eps=float("nan")), ValueError, r"sampler_metadata\.json: _eps must be a finite number, got nan"),
    "string _max_priority": (_edit_json(META, _max_priority="abc"), ValueError, r"sampler_metadata\.json: _max_priority must be a list"),
    "short _max_priority": (_edit_json(META, _max_priority=[1.0]), ValueError, r"sampler_metadata\.json: _max_priority must be a list"),
    "negative max priority": (_edit_json(META, _max_priority=[-2.0, 1.0]), ValueError, r"sampler_metadata\.json: _max_priority\[0\] must be at least 0"),
    "negative _alpha": (_edit_json(META, _alpha=-0.5), ValueError, r"sampler_metadata\.json: _alpha must be at least 0, got -0\.5"),
    "string _beta": (_edit_json(META, _beta="b"), ValueError, r"sampler_metadata\.json: _beta must be a finite number, got 'b'"),
    "string _max_capacity": (_edit_json(META, _max_capacity="x"), ValueError, r"sampler_metadata\.json: _max_capacity must be a finite number, got 'x'"),
    "string max priority": (_edit_json(META, _max_priority=["p", 1]), ValueError, r"sampler_metadata\.json: _max_priority\[0\] must be a finite number, got 'p'"),
    "string max priority index": (_edit_json(META, _max_priority=[1.0, "i"]), ValueError, r"sampler_metadata\.json: _max_priority\[1\] must be a finite number, got 'i'"),
    "negative max priority index": (_edit_json(META, _max_priority=[1.0, -3]), ValueError, r"sampler_metadata\.json: _max_priority\[1\] must be at least 0, got -3"),
    "max priority index past the capacity": (_edit_json(META, _max_priority=[1.0, 99]), ValueError, r"sampler_metadata\.json: .*99"),
    "string schema version": (_edit_json(META, _schema_version="x"), ValueError, r"sampler_metadata\.json: _schema_version must be an integer, got 'x'"),
    "other capacity": (_edit_json(META, _max_capacity=7.0), RuntimeError, r"max capacity of loaded metadata \(7\.0\) differs from self\._max_capacity \(16\)"),
    "nan sum leaf": (_leaf("sumtree.memmap", 3, np.nan), ValueError, r"sumtree\.memmap: leaf 3 holds nan"),
    "negative sum leaf": (_leaf("sumtree.memmap", 5, -1.0), ValueError, r"sumtree\.memmap: leaf 5 holds -1\.0"),
    "infinite sum leaf": (_leaf("sumtree.memmap", 0, np.inf), ValueError, r"sumtree\.memmap: leaf 0 holds inf"),
    "nan min leaf": (_leaf("mintree.memmap", 15, np.nan), ValueError, r"mintree\.memmap: leaf 15 holds nan"),
    "negative min leaf": (_leaf("mintree.memmap", 2, -3.0), ValueError, r"mintree\.memmap: leaf 2 holds -3\.0"),
    "overflowing sum": (
        lambda path: np.full(16, 3e37).tofile(path / "sumtree.memmap"),
        ValueError, r"sumtree\.memmap: .*would make the sum of the tree's leaves",
    ),
}


@pytest.fixture(params=["one block", "blocks of 4"])
def leaf_block(request, monkeypatch):
    """The trees' files read, checked and written a block of leaves at a time: in one block, as
    at every capacity up to 2^22, or in blocks of 4 leaves (what a tree of 2^30 leaves gets)."""
    if request.param == "blocks of 4":
        monkeypatch.setattr(_trees, "LEAF_BLOCK", 4)
    return request.param


@pytest.mark.parametrize("damage", sorted(PRIORITIZED_DAMAGE))
@pytest.mark.parametrize("slice_sampler", [False, True])
def test_damaged_prioritized_checkpoint_is_refused_whole(damage, slice_sampler, tmp_path, leaf_block):
    edit, error, message = PRIORITIZED_DAMAGE[damage]

    def make():
        if slice_sampler:
            return ours.PrioritizedSliceSampler(16, 0.7, 0.4, slice_len=2, traj_key="episode")
        return ours.PrioritizedSampler(16, 0.7, 0.4)

    source = make()
    source.update_priority(torch.arange(16), torch.arange(1.0, 17.0))
    source.dumps(tmp_path / "ckpt")
    edit(tmp_path / "ckpt")
    files = _directory_state(tmp_path / "ckpt")
    target = make()
    target.update_priority(torch.tensor([2, 3]), torch.tensor([5.0, 0.5]))
    before = _prioritized_snapshot(target)
    with pytest.raises(error, match=message):
        target.loads(tmp_path / "ckpt")
    assert _prioritized_snapshot(target) == before
    assert _directory_state(tmp_path / "ckpt") == files  # nothing written while loading


def test_prioritized_checkpoint_loads_whole(tmp_path, leaf_block):
    source = ours.PrioritizedSampler(16, 0.7, 0.4, eps=1e-3)
    source.update_priority(torch.arange(16), torch.arange(1.0, 17.0))
    source.dumps(tmp_path / "ckpt")
    source.dumps(tmp_path / "ckpt")  # over the previous one
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["mintree.memmap", "sampler_metadata.json", "sumtree.memmap"]
    target = ours.PrioritizedSampler(16, 0.1, 0.1)
    target.loads(tmp_path / "ckpt")
    assert _prioritized_snapshot(target) == _prioritized_snapshot(source)


WITHOUT_REPLACEMENT_DAMAGE = {
    "missing directory": (shutil.rmtree, FileNotFoundError, r"ckpt: the directory is missing"),
    "missing meta.json": (_remove("meta.json"), FileNotFoundError, r"meta\.json: the file is missing"),
    "missing sample list": (_remove("_sample_list.memmap"), FileNotFoundError, r"_sample_list\.memmap: the file is missing"),
    "truncated sample list": (_truncate("_sample_list.memmap"), ValueError, r"_sample_list\.memmap: holds 40 bytes, a torch.int64 tensor of shape \[10\] needs 80"),
    "garbage meta.json": (_write("meta.json", b"{not json"), ValueError, r"meta\.json: not a JSON file"),
    "missing entry": (_edit_json("meta.json", _ran_out=KeyError), ValueError, r"meta\.json: no entry for '_ran_out'"),
    "entry not a tensor": (_edit_json("meta.json", len_storage={"dtype": "torch.int64", "shape": "x"}), ValueError, r"the entry of 'len_storage' is not a tensor description"),
    "float sample list": (_edit_json("meta.json", _sample_list={"device": "cpu", "shape": [10], "dtype": "torch.float64", "is_nested": False}),
                          ValueError, r"_sample_list\.memmap: expected a 1-d integer tensor"),
    "sample list out of range": (lambda path: np.full(10, 99, dtype=np.int64).tofile(path / "_sample_list.memmap"),
                                 ValueError, r"_sample_list\.memmap: index 99 at position 0 is out of range for len_storage=12"),
    "bool len_storage": (
        lambda path: (_edit_json("meta.json", len_storage={"device": "cpu", "shape": [], "dtype": "torch.bool", "is_nested": False})(path),
                      _write("len_storage.memmap", b"\x01")(path)),
        ValueError, r"meta\.json: len_storage must be a 0-d tensor of \(torch.int64",
    ),
}


@pytest.mark.parametrize("damage", sorted(WITHOUT_REPLACEMENT_DAMAGE))
def test_damaged_without_replacement_checkpoint_is_refused_whole(damage, tmp_path):
    edit, error, message = WITHOUT_REPLACEMENT_DAMAGE[damage]
    source = ours.SamplerWithoutReplacement(drop_last=True)
    source.load_state_dict({"len_storage": 12, "_sample_list": torch.arange(10), "drop_last": True, "_ran_out": False})
    source.dumps(tmp_path / "ckpt")
    edit(tmp_path / "ckpt")
    files = _directory_state(tmp_path / "ckpt") if (tmp_path / "ckpt").exists() else None
    target = ours.SamplerWithoutReplacement()
    target.load_state_dict({"len_storage": 5, "_sample_list": torch.tensor([4, 2]), "drop_last": False, "_ran_out": True})
    before = dict(target.state_dict())
    with pytest.raises(error, match=message):
        target.loads(tmp_path / "ckpt")
    after = target.state_dict()
    assert after["len_storage"] == before["len_storage"] and after["_ran_out"] == before["_ran_out"]
    assert torch.equal(after["_sample_list"], before["_sample_list"])
    if files is not None:
        assert _directory_state(tmp_path / "ckpt") == files


def test_without_replacement_empty_sample_list_round_trip(tmp_path):
    # TensorDict.memmap writes no file for an empty tensor: nothing to read, nothing missing
    state = {"len_storage": 3, "_sample_list": torch.zeros(0, dtype=torch.long), "drop_last": True, "_ran_out": False}
    source = ours.SamplerWithoutReplacement()
    source.load_state_dict(state)
    source.dumps(tmp_path / "ckpt")
    target = ours.SamplerWithoutReplacement()
    target.loads(tmp_path / "ckpt")
    assert target._sample_list.shape == (0,) and target.len_storage == 3 and target.drop_last
    # torchrl's loads fails on tensordict 0.11 (load_memmap skips the entry) and reads the empty
    # list back on newer releases: where it loads, it loads what ours does
    reference = trl.SamplerWithoutReplacement()
    try:
        reference.loads(tmp_path / "ckpt")
    except KeyError as error:
        assert "_sample_list" in str(error)
    else:
        assert reference._sample_list.shape == (0,) and int(reference.len_storage) == 3


@pytest.mark.usefixtures("torchrl_trees")
def test_prioritized_loads_into_a_loaded_sampler(tmp_path):
    for version in (1, 2):
        source = ours.PrioritizedSampler(16, 0.7, 0.4)
        source.update_priority(torch.arange(16), torch.arange(1.0, 17.0) * version)
        source.dumps(tmp_path / str(version))
    target = ours.PrioritizedSampler(16, 0.1, 0.1)
    target.loads(tmp_path / "1")
    target.loads(tmp_path / "2")  # torchrl's fails on float.copy_ (its max priority is a float now)
    assert _prioritized_snapshot(target) == _prioritized_snapshot(source)
    ref = trl.PrioritizedSampler(16, 0.1, 0.1)
    ref.loads(tmp_path / "1")
    with pytest.raises(AttributeError, match="copy_"):
        ref.loads(tmp_path / "2")


def test_ensemble_checks_every_member_before_any_changes(tmp_path):
    source = ours.SamplerEnsemble(ours.PrioritizedSampler(16, 0.7, 0.4), ours.SamplerWithoutReplacement())
    source[0].update_priority(torch.arange(16), torch.arange(1.0, 17.0))
    source[1].load_state_dict({"len_storage": 3, "_sample_list": torch.tensor([2, 0]), "drop_last": False, "_ran_out": False})
    source.dumps(tmp_path / "ckpt")
    _truncate("_sample_list.memmap")(tmp_path / "ckpt" / "1")
    target = ours.SamplerEnsemble(ours.PrioritizedSampler(16, 0.7, 0.4), ours.SamplerWithoutReplacement())
    before = _prioritized_snapshot(target[0])
    with pytest.raises(ValueError, match=r"1/_sample_list\.memmap: holds 8 bytes"):
        target.loads(tmp_path / "ckpt")
    assert _prioritized_snapshot(target[0]) == before
    source.dumps(tmp_path / "ckpt")
    target.loads(tmp_path / "ckpt")
    assert _prioritized_snapshot(target[0]) == _prioritized_snapshot(source[0])
    assert torch.equal(target[1]._sample_list, torch.tensor([2, 0])) and target[1].len_storage == 3


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("cls", ["PrioritizedSampler", "SamplerWithoutReplacement"])
def test_checkpoints_cross_both_ways(cls, tmp_path):
    if cls == "PrioritizedSampler":
        theirs, mine = trl.PrioritizedSampler(16, 0.7, 0.4), ours.PrioritizedSampler(16, 0.7, 0.4)
        theirs.update_priority(torch.arange(16), torch.arange(1.0, 17.0))
        mine.update_priority(torch.arange(8), torch.arange(8.0, 0.0, -1.0))
    else:
        theirs, mine = trl.SamplerWithoutReplacement(), ours.SamplerWithoutReplacement()
        theirs.load_state_dict({"len_storage": 6, "_sample_list": torch.tensor([5, 1, 3]), "drop_last": False, "_ran_out": False})
        mine.load_state_dict({"len_storage": 9, "_sample_list": torch.tensor([8, 0]), "drop_last": True, "_ran_out": True})
    theirs.dumps(tmp_path / "theirs")
    mine.dumps(tmp_path / "mine")
    fresh_ours = getattr(ours, cls)(16, 0.1, 0.1) if cls == "PrioritizedSampler" else ours.SamplerWithoutReplacement()
    fresh_theirs = getattr(trl, cls)(16, 0.1, 0.1) if cls == "PrioritizedSampler" else trl.SamplerWithoutReplacement()
    fresh_ours.loads(tmp_path / "theirs")
    fresh_theirs.loads(tmp_path / "mine")
    for loaded, source in ((fresh_ours, theirs), (fresh_theirs, mine)):
        if cls == "PrioritizedSampler":
            assert [loaded._sum_tree[i] for i in range(16)] == [source._sum_tree[i] for i in range(16)]
            assert [loaded._min_tree[i] for i in range(16)] == [source._min_tree[i] for i in range(16)]
            assert (loaded._alpha, loaded._beta) == (source._alpha, source._beta)
            assert [float(x) for x in loaded._max_priority] == [float(x) for x in source._max_priority]
        else:
            assert int(loaded.len_storage) == int(source.len_storage)
            assert torch.equal(torch.as_tensor(loaded._sample_list), source._sample_list)
            assert bool(loaded.drop_last) == source.drop_last


def test_dumps_without_an_atomic_exchange_still_publishes_whole(tmp_path, monkeypatch):
    """Where the file system cannot exchange two directories, the previous checkpoint is
    renamed aside, then the new one in place; nothing is left beside it."""
    from torchrl_compat.checkpointers import _publish

    monkeypatch.setattr(_publish, "_exchange", lambda a, b: False)
    sampler = ours.PrioritizedSampler(16, 0.7, 0.4)
    sampler.update_priority(torch.arange(16), torch.ones(16))
    sampler.dumps(tmp_path / "ckpt")
    sampler.update_priority(torch.arange(16), torch.full((16,), 3.0))
    sampler.dumps(tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
    target = ours.PrioritizedSampler(16, 0.7, 0.4)
    target.loads(tmp_path / "ckpt")
    assert _prioritized_snapshot(target) == _prioritized_snapshot(sampler)


def test_dumps_refuses_a_file_and_a_missing_parent(tmp_path):
    sampler = ours.PrioritizedSampler(4, 0.7, 0.4)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="file: it is not a directory"):
        sampler.dumps(tmp_path / "file")
    with pytest.raises(FileNotFoundError, match="the parent directory .*missing does not exist"):
        sampler.dumps(tmp_path / "missing" / "ckpt")
    assert sorted(os.listdir(tmp_path)) == ["file"]


TREE_DAMAGES = {
    "nan sum leaf 13": _leaf("sumtree.memmap", 13, np.nan),
    "negative min leaf 2": _leaf("mintree.memmap", 2, -3.0),
    "mismatched leaf 1": _leaf("mintree.memmap", 1, 100.0),
    "tiny priority 9": lambda path: (_leaf("sumtree.memmap", 9, 1e-50)(path), _leaf("mintree.memmap", 9, 1e-50)(path)),
    "overflowing sum": lambda path: np.full(16, 3e37).tofile(path / "sumtree.memmap"),
}


@pytest.mark.parametrize("second", sorted(TREE_DAMAGES))
@pytest.mark.parametrize("first", sorted(TREE_DAMAGES))
def test_tree_files_with_several_faults_name_the_same_one_in_any_blocks(first, second, tmp_path, monkeypatch):
    # read in blocks, the files' faults are reported as a read of the whole files reports them
    source = ours.PrioritizedSampler(16, 0.7, 0.4)
    source.update_priority(torch.arange(16), torch.arange(1.0, 17.0))
    source.dumps(tmp_path / "ckpt")
    TREE_DAMAGES[first](tmp_path / "ckpt")
    TREE_DAMAGES[second](tmp_path / "ckpt")
    messages = []
    for block in (1 << 22, 4, 1):
        monkeypatch.setattr(_trees, "LEAF_BLOCK", block)
        with pytest.raises(ValueError) as refused:
            ours.PrioritizedSampler(16, 0.7, 0.4).loads(tmp_path / "ckpt")
        message = str(refused.value).replace(str(tmp_path), "")
        # a sum the trees cannot hold is found in the block that passes it, and named there
        messages.append(re.sub(r"(sumtree\.memmap: )(leaves \[\d+, \d+\): )?value .*", r"\1value ...", message))
    assert messages[1] == messages[0] and messages[2] == messages[0], messages
    if "would make the sum" in str(refused.value):
        assert re.search(r"sumtree\.memmap: leaves \[\d+, \d+\): value 3e\+37 at position 0", str(refused.value))
