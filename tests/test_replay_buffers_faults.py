"""Buffer checkpoints under faults: processes killed during ``dumps``, damaged files at ``loads``.

``ReplayBuffer.dumps`` writes the whole checkpoint (storage, sampler, writer, generator state,
transform state, metadata) aside and publishes it in one rename: a process killed (SIGKILL) at
any moment leaves the previous checkpoint or the new one, whole, which torchrl 0.11's own
buffer loads too. ``loads`` reads and checks every part before any part changes: a damaged
file gives an error naming it, and the buffer and the checkpoint stay as they were.
"""
import json
import os
import shutil

import numpy as np
import pytest
import torch
import torchrl.data as TD
from tensordict import TensorDict

import torchrl_compat as O
from torchrl_compat.checkpointers import _publish
from torchrl_compat._releases import since

from test_checkpointers_kill import dump_stopping_in_hook, FORK, kill_spread, TIMEOUT
from test_replay_buffers import torchrl_trees  # noqa: F401 (fixture)

# From torchrl 0.14 a buffer checkpoint also holds its prefetch queue.
PREFETCH_FILES = ["prefetch.pkl"] if since("buffer_prefetch_state") else []

CAPACITY = 1 << 13
TRIALS = 10


def version_data(n, version, start=0):
    """``n`` transitions of version ``version`` (every ``v`` and ``obs`` says it), written
    from row ``start`` on, in episodes of 16 rows."""
    rows = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": torch.full((n, 8), float(version)),
            "v": torch.full((n,), version),
            "row": rows,
            "episode": rows // 16,
            ("next", "done"): (rows % 16 == 15).unsqueeze(-1),
        },
        [n],
    )


def priorities(version, n):
    return ((version % 5) + 1 + torch.arange(n) % 3).float()


# -----------------------------------------------------------------------------
# one entry per kind of buffer: make, put in version k, load, read the version back
# -----------------------------------------------------------------------------
class PrioritizedCase:
    """A prioritized TensorDict buffer: each version rewrites the storage (its length too),
    the priorities, the sampler's beta, the generator and the batch size."""

    def storage(self, path, lib):
        return lib.LazyTensorStorage(CAPACITY)

    def make(self, path, lib=O):
        return lib.TensorDictPrioritizedReplayBuffer(
            alpha=1.0, beta=0.5, storage=self.storage(path, lib), batch_size=1
        )

    def fresh(self, path, lib):
        return self.make(path, lib)

    def length(self, version):
        return CAPACITY // 2 + 64 * (version % 8)

    def write(self, rb, version):
        n = self.length(version)
        rb.empty()
        rb.extend(version_data(n, version))
        rb.update_priority(torch.arange(n), priorities(version, n))
        rb._sampler._beta = float(version)
        rb.set_rng(torch.Generator().manual_seed(version))
        rb._batch_size = self.batch_size(version)

    def batch_size(self, version):
        return version

    def version(self, rb):
        versions = rb[:]["v"].unique().tolist()
        assert len(versions) == 1, f"a storage mixing versions {versions}"
        return versions[0]

    def reference(self, path, version):
        """A buffer of ours put in ``version`` from scratch: what a checkpoint of that
        version must load as."""
        rb = self.fresh(path, O)
        for step in self.steps_to(version):
            self.write(rb, step)
        return rb

    def steps_to(self, version):
        return [version]

    def one_version_samples(self):
        return True


class MemmapCase(PrioritizedCase):
    def storage(self, path, lib):
        return lib.LazyMemmapStorage(CAPACITY, scratch_dir=path.parent / f"scratch-{os.getpid()}")

    def fresh(self, path, lib):
        return lib.TensorDictPrioritizedReplayBuffer(
            alpha=1.0, beta=0.5, storage=lib.LazyMemmapStorage(CAPACITY), batch_size=1
        )


class MemmapInPlaceCase(MemmapCase):
    """The storage lives in the checkpoint's ``storage/`` directory (its ``scratch_dir``): a
    dump links its files into the checkpoint, and each version rewrites the rows the
    previous checkpoint holds. A kill during a dump, or during the writes after it, must
    leave that checkpoint as it was published."""

    def storage(self, path, lib):
        return lib.LazyMemmapStorage(CAPACITY, scratch_dir=path / "storage")


class SliceCase(PrioritizedCase):
    """A TensorDict buffer sampling prioritized slices of episodes."""

    def make(self, path, lib=O):
        sampler = lib.PrioritizedSliceSampler(
            max_capacity=CAPACITY, alpha=1.0, beta=0.5, num_slices=4, traj_key="episode"
        )
        return lib.TensorDictReplayBuffer(storage=self.storage(path, lib), sampler=sampler, batch_size=4)

    def batch_size(self, version):
        return 4 * (version % 4 + 1)


CASES = {
    "prioritized tensor": PrioritizedCase(),
    "prioritized memmap": MemmapCase(),
    "prioritized memmap in place": MemmapInPlaceCase(),
    "prioritized slices": SliceCase(),
}


def leaves(tree):
    return np.asarray(tree[np.arange(CAPACITY)])


def assert_same_buffer(loaded, reference):
    """The same items, priorities, sampler state, writer cursor, generator and batch size."""
    assert len(loaded) == len(reference)
    got, expected = loaded[:], reference[:]
    for key in ("obs", "v", "row", "episode", ("next", "done")):
        assert torch.equal(got[key], expected[key]), key
    assert loaded._writer._cursor == reference._writer._cursor
    assert torch.equal(loaded._rng.get_state(), reference._rng.get_state())
    assert loaded._batch_size == reference._batch_size
    sampler, ref_sampler = loaded._sampler, reference._sampler
    if hasattr(ref_sampler, "_sum_tree"):
        np.testing.assert_array_equal(leaves(sampler._sum_tree), leaves(ref_sampler._sum_tree))
        np.testing.assert_array_equal(leaves(sampler._min_tree), leaves(ref_sampler._min_tree))
        for name in ("_alpha", "_beta", "_eps"):
            assert float(getattr(sampler, name)) == float(getattr(ref_sampler, name)), name
        assert float(sampler._max_priority[0]) == float(ref_sampler._max_priority[0])


def assert_samples_one_version(rb, version):
    sample = rb.sample()
    assert bool((sample["v"] == version).all())
    if isinstance(rb._sampler, O.SliceSampler):
        # four slices, each within one episode
        episodes = sample["episode"].reshape(4, -1)
        assert bool((episodes == episodes[:, :1]).all())


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("name", list(CASES))
def test_killed_dumps_leave_one_whole_version(tmp_path, name):
    case = CASES[name]
    path = tmp_path / "ckpt"

    def check(trial, started, done):
        loaded = case.fresh(path, O)
        loaded.loads(path)
        version = case.version(loaded)
        # the version dumped before the kill, or the one being dumped
        assert done <= version <= started, (trial, version, done, started)
        reference = case.reference(path, version)
        assert_same_buffer(loaded, reference)
        if case.one_version_samples():
            assert_samples_one_version(loaded, version)
        theirs = case.fresh(path, TD)
        theirs.loads(path)
        assert_same_buffer(theirs, reference)
        if name == "prioritized memmap in place":
            # the next child's live files start over from version 1
            shutil.rmtree(path)

    kill_spread(case, path, tmp_path / "timing", TRIALS, check)
    # the next dump removes what the killed ones left beside the checkpoint
    rb = case.make(path)
    case.write(rb, 1)
    rb.dumps(path)
    assert _publish.partial_siblings(path) == []


def _buffer_of_version_5():
    case = CASES["prioritized tensor"]
    rb = case.make(None)
    case.write(rb, 5)
    return rb


def _partial_of(storage_path, path):
    """The buffer's partial directory that a storage path lies in."""
    (partial,) = [p for p in _publish.partial_siblings(path) if str(storage_path).startswith(f"{p}/")]
    return partial


def test_next_dump_removes_killed_partials_but_not_a_live_one(tmp_path):
    case = CASES["prioritized tensor"]
    path = tmp_path / "ckpt"
    parent, child = FORK.Pipe()
    release, never = FORK.Event(), FORK.Event()
    live = FORK.Process(target=dump_stopping_in_hook, args=(_buffer_of_version_5, path, child, release), daemon=True)
    live.start()
    assert parent.poll(TIMEOUT)
    live_partial = _partial_of(parent.recv(), path)
    killed = FORK.Process(target=dump_stopping_in_hook, args=(_buffer_of_version_5, path, child, never), daemon=True)
    killed.start()
    assert parent.poll(TIMEOUT)
    dead_partial = _partial_of(parent.recv(), path)
    killed.kill()
    killed.join(TIMEOUT)
    # this process dumps meanwhile: the dead partial goes, the live one stays
    rb = case.make(path)
    case.write(rb, 1)
    rb.dumps(path)
    assert _publish.partial_siblings(path) == [live_partial] != [dead_partial]
    loaded = case.fresh(path, O)
    loaded.loads(path)
    assert case.version(loaded) == 1
    # the live dump completes and publishes over it
    release.set()
    assert parent.poll(TIMEOUT) and parent.recv() == "done"
    live.join(TIMEOUT)
    assert live.exitcode == 0
    assert _publish.partial_siblings(path) == []
    loaded.loads(path)
    assert_same_buffer(loaded, case.reference(path, 5))


# -----------------------------------------------------------------------------
# loads of a damaged checkpoint
# -----------------------------------------------------------------------------
def transformed_buffer(version):
    """A prioritized buffer with a generator and a transform with a state, in ``version``."""
    from torchrl.envs.transforms import ObservationNorm

    norm = ObservationNorm(loc=torch.tensor(float(version)), scale=torch.tensor(2.0), in_keys=["obs"])
    rb = O.TensorDictPrioritizedReplayBuffer(
        alpha=0.7, beta=0.5, storage=O.LazyTensorStorage(32), transform=norm, batch_size=4
    )
    n = 8 + 4 * version
    rb.extend(version_data(n, version))
    rb.update_priority(torch.arange(n), priorities(version, n))
    rb.set_rng(torch.Generator().manual_seed(version))
    rb._batch_size = version
    return rb


def assert_same_transformed(loaded, reference):
    assert len(loaded) == len(reference)
    for key in ("obs", "v", "row"):
        assert torch.equal(loaded._storage[: len(loaded)][key], reference._storage[: len(reference)][key])
    assert loaded._writer._cursor == reference._writer._cursor
    assert torch.equal(loaded._rng.get_state(), reference._rng.get_state())
    assert loaded._batch_size == reference._batch_size
    for name in ("_alpha", "_beta", "_eps"):
        assert getattr(loaded._sampler, name) == getattr(reference._sampler, name)
    assert float(loaded._sampler._max_priority[0]) == float(reference._sampler._max_priority[0])
    np.testing.assert_array_equal(loaded._sampler._sum_tree.values(), reference._sampler._sum_tree.values())
    np.testing.assert_array_equal(loaded._sampler._min_tree.values(), reference._sampler._min_tree.values())
    state, ref_state = loaded._transform.state_dict(), reference._transform.state_dict()
    assert state.keys() == ref_state.keys()
    assert all(torch.equal(state[key], ref_state[key]) for key in state)


def directory_state(path):
    """Every file under ``path`` with its bytes: a loads must change none of them."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def remove(file):
    file.unlink()


def truncate(file):
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def garbage(file):
    file.write_bytes(b"\xff\xfe not what it should be")


def misfit_transform_state(file):
    # loc fits, the extra entry does not: load_state_dict copies loc before it refuses
    state = torch.load(file)
    state["transforms.0.loc"] = torch.tensor(99.0)
    state["transforms.0.unknown"] = torch.tensor(1.0)
    torch.save(state, file)


def edit_json(**entries):
    def spoil(file):
        content = json.loads(file.read_text())
        content.update(entries)
        file.write_text(json.dumps(content))

    return spoil


def set_leaves(values, trees=("sumtree", "mintree")):
    """Sets leaves ``{position: value}`` of the sampler's tree files (both by default)."""

    def spoil(file):
        for tree in trees:
            tree_file = file.parent / f"{tree}.memmap"
            leaves = np.fromfile(tree_file, dtype=np.float64)
            for position, value in values.items():
                leaves[position] = value
            leaves.tofile(tree_file)

    return spoil


DAMAGES = {
    "storage metadata missing": ("storage/storage_metadata.json", remove, FileNotFoundError),
    "storage leaf truncated": ("storage/obs.memmap", truncate, ValueError),
    "sum tree truncated": ("sampler/sumtree.memmap", truncate, ValueError),
    "min tree missing": ("sampler/mintree.memmap", remove, FileNotFoundError),
    "sampler metadata garbage": ("sampler/sampler_metadata.json", garbage, ValueError),
    "writer metadata missing": ("writer/metadata.json", remove, FileNotFoundError),
    "writer metadata truncated": ("writer/metadata.json", truncate, ValueError),
    "writer cursor negative": ("writer/metadata.json", lambda f: f.write_text('{"cursor": -3}'), ValueError),
    "generator state truncated": ("rng_state/rng_state.memmap", truncate, ValueError),
    "generator state missing": ("rng_state/rng_state.memmap", remove, FileNotFoundError),
    "transform state garbage": ("transform.t", garbage, ValueError),
    "transform state misfit": ("transform.t", misfit_transform_state, RuntimeError),
    "buffer metadata missing": ("buffer_metadata.json", remove, FileNotFoundError),
    "buffer metadata truncated": ("buffer_metadata.json", truncate, ValueError),
    "batch size not a count": ("buffer_metadata.json", lambda f: f.write_text('{"batch_size": "x"}'), ValueError),
    # parts that do not fit together (transformed_buffer(1) holds 12 items in 32 rows)
    "writer cursor past the capacity": ("writer/metadata.json", edit_json(cursor=40), ValueError),
    "writer cursor behind the length": ("storage/storage_metadata.json", edit_json(len=20), ValueError),
    "writer cursor ahead of the length": ("writer/metadata.json", edit_json(cursor=13), ValueError),
    "priorities past the length": ("sampler/sumtree.memmap", set_leaves({20: 1.5}), ValueError),
    # priorities the sampler cannot draw from
    "min tree leaf 0": ("sampler/mintree.memmap", set_leaves({3: 0.0}, trees=("mintree",)), ValueError),
    "a priority of 0": ("sampler/mintree.memmap", set_leaves({3: 0.0}, trees=("sumtree", "mintree")), ValueError),
    "a priority 0 in fp32": ("sampler/mintree.memmap", set_leaves({3: 1e-50}), ValueError),
    "min tree not the sum tree's": ("sampler/mintree.memmap", set_leaves({5: 7.0}, trees=("mintree",)), ValueError),
    "max priority index past the capacity": (
        "sampler/sampler_metadata.json", edit_json(_max_priority=[1.0, 32]), ValueError,
    ),
    "max capacity not the sampler's": ("sampler/sampler_metadata.json", edit_json(_max_capacity=64.0), RuntimeError),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_checkpoint_leaves_the_buffer_as_it_was(tmp_path, damage):
    name, spoil, error = DAMAGES[damage]
    transformed_buffer(1).dumps(tmp_path / "ckpt")
    spoil(tmp_path / "ckpt" / name)
    files = directory_state(tmp_path / "ckpt")
    target = transformed_buffer(2)
    with pytest.raises(error, match=os.path.basename(name).replace(".", r"\.")):
        target.loads(tmp_path / "ckpt")
    assert_same_transformed(target, transformed_buffer(2))
    assert directory_state(tmp_path / "ckpt") == files  # never written to
    # the buffer still works, and loads a whole checkpoint
    transformed_buffer(1).dumps(tmp_path / "ckpt")
    target.loads(tmp_path / "ckpt")
    assert_same_transformed(target, transformed_buffer(1))


IN_PLACE_DAMAGES = ["storage metadata missing", "storage leaf truncated", "sum tree truncated",
                    "writer cursor past the capacity", "priorities past the length"]


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("damage", IN_PLACE_DAMAGES)
def test_damaged_checkpoint_of_a_storage_living_in_it(tmp_path, damage):
    # the buffer's storage lives in the checkpoint it loads: a damaged one changes nothing,
    # neither the buffer (its storage included) nor the checkpoint
    name, spoil, error = DAMAGES[damage]
    if damage == "writer cursor past the capacity":
        spoil = edit_json(cursor=CAPACITY + 3)
    elif damage == "priorities past the length":
        spoil = set_leaves({CAPACITY - 1: 1.5})
    case = CASES["prioritized memmap in place"]
    path = tmp_path / "ckpt"
    rb = case.make(path)
    case.write(rb, 1)
    rb.dumps(path)
    case.write(rb, 2)
    spoil(path / name)
    files = directory_state(path)
    with pytest.raises(error, match=os.path.basename(name).replace(".", r"\.")):
        rb.loads(path)
    assert_same_buffer(rb, case.reference(path, 2))
    assert directory_state(path) == files
    # whole again, it loads
    rb.dumps(path)
    case.write(rb, 3)
    rb.loads(path)
    assert_same_buffer(rb, case.reference(path, 2))


def test_loads_takes_every_part(tmp_path):
    transformed_buffer(3).dumps(tmp_path / "ckpt")
    target = transformed_buffer(2)
    target.loads(tmp_path / "ckpt")
    assert_same_transformed(target, transformed_buffer(3))
    assert float(target.transform[0].loc) == 3.0


# -----------------------------------------------------------------------------
# the storage in the checkpoint, ensembles, what else the directory holds
# -----------------------------------------------------------------------------
def live_homes(path):
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.live-"))


@pytest.mark.usefixtures("torchrl_trees")
def test_storage_living_in_the_checkpoint_never_changes_it(tmp_path):
    case = CASES["prioritized memmap in place"]
    path = tmp_path / "ckpt"
    rb = case.make(path)
    case.write(rb, 1)
    rb.dumps(path)
    obs_file = path / "storage" / "obs.memmap"
    inode = os.stat(obs_file).st_ino
    published = directory_state(path)
    # the storage goes on writing elsewhere: the published checkpoint keeps its bytes
    case.write(rb, 2)
    assert directory_state(path) == published
    assert os.path.dirname(rb._storage._storage.get("obs").filename) == str(tmp_path / live_homes(path)[0])
    for lib in (O, TD):
        loaded = case.fresh(path, lib)
        loaded.loads(path)
        assert_same_buffer(loaded, case.reference(path, 1))
    # the next dump links the storage's files again (no copy in the checkpoint) ...
    case.write(rb, 3)
    rb.dumps(path)
    assert os.stat(obs_file).st_ino != inode
    assert os.stat(obs_file).st_nlink == 1  # the storage has moved out of this one too
    published = directory_state(path)
    case.write(rb, 4)
    assert directory_state(path) == published
    loaded = case.fresh(path, O)
    loaded.loads(path)
    assert_same_buffer(loaded, case.reference(path, 3))
    # ... and the storage keeps one home, removed with it
    assert len(live_homes(path)) == 1
    assert torch.equal(rb[:]["v"], torch.full((case.length(4),), 4))
    del rb, loaded
    import gc

    gc.collect()
    assert live_homes(path) == []


@pytest.mark.usefixtures("torchrl_trees")
def test_loads_into_a_storage_living_in_the_checkpoint_never_changes_it(tmp_path):
    case = CASES["prioritized memmap in place"]
    path = tmp_path / "ckpt"
    rb = case.make(path)
    case.write(rb, 1)
    rb.dumps(path)
    del rb
    published = directory_state(path)
    # a new process's buffer, its storage in the checkpoint, loads it and goes on
    rb = case.make(path)
    rb.loads(path)
    assert_same_buffer(rb, case.reference(path, 1))
    case.write(rb, 2)
    assert directory_state(path) == published
    assert_same_buffer(rb, case.reference(path, 2))


def test_dumps_keeps_what_else_the_directory_holds(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    (path / "model.pt").write_text("weights")
    (path / "logs").mkdir()
    (path / "logs" / "events").write_text("step 1")
    transformed_buffer(1).dumps(path)
    transformed_buffer(2).dumps(path)
    assert (path / "model.pt").read_text() == "weights"
    assert (path / "logs" / "events").read_text() == "step 1"
    assert sorted(os.listdir(path)) == sorted(
        ["buffer_metadata.json", "logs", "model.pt", "rng_state", "sampler", "storage", "transform.t", "writer",
         *PREFETCH_FILES]
    )
    target = transformed_buffer(1)
    target.loads(path)
    assert_same_transformed(target, transformed_buffer(2))


def ensemble(version):
    rbs = [transformed_buffer(version + i) for i in range(2)]
    rbs[1].set_sampler(O.SamplerWithoutReplacement())
    rbs[1].set_rng(torch.Generator().manual_seed(version))
    rbs[1].sample()  # a sampler state to save
    return O.ReplayBufferEnsemble(*rbs, batch_size=4, generator=torch.Generator().manual_seed(version))


def assert_same_ensemble(loaded, reference):
    for a, b in zip(loaded._rbs, reference._rbs):
        assert len(a) == len(b) and torch.equal(a[:]["obs"], b[:]["obs"])
        assert a._writer._cursor == b._writer._cursor
    np.testing.assert_array_equal(loaded[0]._sampler._sum_tree.values(), reference[0]._sampler._sum_tree.values())
    assert loaded[1]._sampler.state_dict().keys() == reference[1]._sampler.state_dict().keys()
    for key, value in reference[1]._sampler.state_dict().items():
        got = loaded[1]._sampler.state_dict()[key]
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(value)), key
    assert torch.equal(loaded._rng.get_state(), reference._rng.get_state())


@pytest.mark.parametrize(
    "damage",
    ["storage/1/storage_metadata.json", "sampler/1/_sample_list.memmap", "writer/1/metadata.json"],
)
def test_ensemble_dumps_whole_and_loads_whole(tmp_path, damage):
    path = tmp_path / "ckpt"
    ensemble(1).dumps(path)
    assert sorted(os.listdir(path)) == sorted(
        ["buffer_metadata.json", "rng_state", "sampler", "storage", "writer", *PREFETCH_FILES]
    )
    target = ensemble(5)
    target.loads(path)
    assert_same_ensemble(target, ensemble(1))
    # a damaged member: no member changes
    ensemble(3).dumps(path)
    truncate(path / damage)
    with pytest.raises((ValueError, FileNotFoundError), match=os.path.basename(damage).replace(".", r"\.")):
        target.loads(path)
    assert_same_ensemble(target, ensemble(1))


@pytest.mark.parametrize("damage", [name for name, (file, _, _) in DAMAGES.items() if file.startswith("sampler/")])
def test_damaged_trees_are_named_alike_in_any_blocks(tmp_path, damage, monkeypatch):
    # the trees' files are read a block of leaves at a time (2^22): the faults found, and the
    # leaves named, are those of a read of the whole files
    from torchrl_compat.samplers import _trees

    name, spoil, error = DAMAGES[damage]
    transformed_buffer(1).dumps(tmp_path / "ckpt")
    spoil(tmp_path / "ckpt" / name)
    messages = []
    for block in (1 << 22, 4, 1):
        monkeypatch.setattr(_trees, "LEAF_BLOCK", block)
        target = transformed_buffer(2)
        with pytest.raises(error) as refused:
            target.loads(tmp_path / "ckpt")
        assert_same_transformed(target, transformed_buffer(2))
        messages.append(str(refused.value))
    assert messages[1] == messages[0] and messages[2] == messages[0], messages
