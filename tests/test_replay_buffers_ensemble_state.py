"""The state of the ensembles (StorageEnsemble, SamplerEnsemble, WriterEnsemble and the
ReplayBufferEnsemble made of them): ``state_dict`` / ``load_state_dict``, ``empty`` and the
empty members of a storage ensemble's checkpoint, compared with torchrl's ensembles of the
installed release. From torchrl 0.14 the ``state_dict``s and checkpoints cross between
torchrl's ensembles and ours in both directions; before, the storage and writer ensembles
raise ``NotImplementedError`` as torchrl's do."""
from __future__ import annotations

import json

import pytest
import torch
from tensordict import TensorDict

import torchrl_compat as O
from torchrl_compat._releases import since

T = pytest.importorskip("torchrl.data")

LIBS = {"torchrl": T, "ours": O}
# loading a state_dict into a lazy storage not yet initialized warns (in both libraries)
pytestmark = pytest.mark.filterwarnings("ignore:Loading the storage on an uninitialized TensorDict")
with_state = pytest.mark.skipif(not since("ensemble_members_state"), reason="a torchrl 0.14 behaviour")
without_state = pytest.mark.skipif(since("ensemble_members_state"), reason="torchrl 0.11-0.13 behaviour")


def _records(n, start=0):
    step = torch.arange(start, start + n)
    return TensorDict({"obs": step.float().unsqueeze(-1), "step": step}, [n])


def _ensemble(M, tmp_path, *, fill=True, sample_from_all=False, start=0, third=None):
    """Three member buffers (tensor, memory-mapped and list storages; a random and two
    ordered without-replacement samplers), the first two wrapped around. (A shuffling
    without-replacement sampler draws other permutations than torchrl's from the same
    generator: see test_shuffled_epoch_crosses.)"""
    rbs = [
        M.TensorDictReplayBuffer(storage=M.LazyTensorStorage(6), sampler=M.RandomSampler()),
        M.TensorDictReplayBuffer(
            storage=M.LazyMemmapStorage(5, scratch_dir=tmp_path),
            sampler=M.SamplerWithoutReplacement(shuffle=False),
        ),
        M.TensorDictReplayBuffer(
            storage=(third or M.ListStorage)(7), sampler=M.SamplerWithoutReplacement(shuffle=False)
        ),
    ]
    if fill:
        rbs[0].extend(_records(8, start=start))
        rbs[1].extend(_records(7, start=start + 100))
        rbs[2].extend(_records(4, start=start + 200))
    return M.ReplayBufferEnsemble(
        *rbs, batch_size=6, sample_from_all=sample_from_all, generator=torch.Generator().manual_seed(3)
    )


def assert_same_state(got, expected, where="state_dict"):
    """``got`` and ``expected`` hold the same keys (in the same order) and values."""
    if isinstance(expected, dict):
        assert isinstance(got, dict), where
        assert list(got) == list(expected), where
        for key in expected:
            assert_same_state(got[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(got) is type(expected) and len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_same_state(a, b, f"{where}[{i}]")
    elif isinstance(expected, torch.Tensor) or hasattr(expected, "batch_size"):
        assert type(got).__name__ == type(expected).__name__ or isinstance(got, torch.Tensor), where
        assert (got == expected).all(), where
    else:
        assert got == expected, where


def _sampled(rbe, n=3):
    out = []
    for _ in range(n):
        sample, info = rbe.sample(return_info=True)
        out.append((sample["step"].clone(), info["index", "buffer_ids"].clone()))
    return out


def _assert_same_samples(got, expected):
    for (steps, ids), (want_steps, want_ids) in zip(got, expected):
        assert torch.equal(steps, want_steps) and torch.equal(ids, want_ids)


# -----------------------------------------------------------------------------
# torchrl 0.14: state_dict, load_state_dict, empty
# -----------------------------------------------------------------------------
@with_state
@pytest.mark.parametrize("sample_from_all", [False, True])
def test_state_dict_matches_torchrl(tmp_path, sample_from_all):
    ensembles = {
        lib: _ensemble(M, tmp_path / lib, sample_from_all=sample_from_all) for lib, M in LIBS.items()
    }
    for rbe in ensembles.values():
        _sampled(rbe, 2)  # the without-replacement samplers are mid-epoch
    theirs, ours = (ensembles[lib].state_dict() for lib in ("torchrl", "ours"))
    assert list(ours) == list(theirs)
    for part in ("_storage", "_sampler", "_writer"):
        assert list(ours[part]) == ["0", "1", "2"]
        assert_same_state(ours[part], theirs[part], part)
    for part in ("_storage", "_sampler", "_writer"):
        component = {"_storage": "storage", "_sampler": "sampler", "_writer": "writer"}[part]
        assert_same_state(getattr(ensembles["ours"], component).state_dict(), theirs[part], component)


@with_state
@pytest.mark.parametrize("src,dst", [("torchrl", "ours"), ("ours", "torchrl"), ("ours", "ours")])
def test_state_dict_crosses(tmp_path, src, dst):
    # (sampling from all the members, the ordered samplers' epochs end with a short batch,
    # which neither library stacks with the other members')
    sample_from_all = False
    source = _ensemble(LIBS[src], tmp_path / "src", sample_from_all=sample_from_all, third=LIBS[src].LazyTensorStorage)
    _sampled(source, 2)
    state = source.state_dict()
    # Filled with other records, and without list storage: a lazy storage that
    # load_state_dict initializes has no device, nor have the records of a list storage
    # loaded so, and in both libraries the ensemble then fails to stack them with the
    # memory-mapped member's records (on the CPU).
    target = _ensemble(
        LIBS[dst], tmp_path / "dst", sample_from_all=sample_from_all, start=1000, third=LIBS[dst].LazyTensorStorage
    )
    target.load_state_dict(state)
    assert len(target) == len(source)
    for i in range(3):
        assert torch.equal(target[i][:]["step"], source[i][:]["step"])
        assert target[i].writer._cursor == source[i].writer._cursor
    # the generator and the samplers' epochs carry on where the source's were
    _assert_same_samples(_sampled(target), _sampled(source))


@with_state
@pytest.mark.parametrize("part", ["storage", "sampler", "writer"])
def test_component_state_dict_crosses(tmp_path, part):
    theirs = _ensemble(T, tmp_path / "torchrl")
    _sampled(theirs, 1)
    ours = _ensemble(O, tmp_path / "ours", fill=False)
    getattr(ours, part).load_state_dict(getattr(theirs, part).state_dict())
    assert_same_state(getattr(ours, part).state_dict(), getattr(theirs, part).state_dict(), part)
    back = _ensemble(T, tmp_path / "back", fill=False)
    getattr(back, part).load_state_dict(getattr(ours, part).state_dict())
    assert_same_state(getattr(back, part).state_dict(), getattr(theirs, part).state_dict(), part)


@with_state
@pytest.mark.parametrize("src,dst", [("torchrl", "ours"), ("ours", "torchrl")])
def test_shuffled_epoch_crosses(tmp_path, src, dst):
    """A shuffling member's epoch, half consumed, goes on in the other library's ensemble."""
    def build(M, fill):
        rbs = [
            M.TensorDictReplayBuffer(storage=M.LazyTensorStorage(9), sampler=M.SamplerWithoutReplacement())
            for _ in range(2)
        ]
        if fill:
            rbs[0].extend(_records(9))
            rbs[1].extend(_records(6, start=100))
        return M.ReplayBufferEnsemble(*rbs, batch_size=6, sample_from_all=True)

    source = build(LIBS[src], True)
    source.sample()
    target = build(LIBS[dst], False)
    target.load_state_dict(source.state_dict())
    # the rest of the second member's epoch, and of the first one's (which is longer: the
    # second member's next epoch is a new permutation, another one in each library)
    assert torch.equal(target.sample()["step"], source.sample()["step"])
    assert torch.equal(target.sample()["step"][0], source.sample()["step"][0])


@with_state
def test_load_state_dict_missing_member(tmp_path):
    state = _ensemble(O, tmp_path / "a").state_dict()
    del state["_storage"]["2"]
    with pytest.raises(KeyError, match="'2'"):
        _ensemble(O, tmp_path / "b", fill=False).load_state_dict(state)


@with_state
def test_empty_matches_torchrl(tmp_path):
    results = {}
    for lib, M in LIBS.items():
        rbe = _ensemble(M, tmp_path / lib)
        _sampled(rbe, 1)
        rbe.empty()
        lengths = [len(rbe[i]) for i in range(3)]
        cursors = [rbe[i].writer._cursor for i in range(3)]
        rbe[0].extend(_records(2, start=50))
        results[lib] = (len(rbe), lengths, cursors, rbe[0][:]["step"].tolist(), rbe.state_dict()["_writer"])
    assert results["ours"][:4] == results["torchrl"][:4]
    assert results["ours"][1] == [0, 0, 0]
    assert_same_state(results["ours"][4], results["torchrl"][4], "_writer")


@with_state
def test_empty_keeps_write_count(tmp_path):
    for M in LIBS.values():
        rbe = _ensemble(M, tmp_path / M.__name__)
        counts = [rbe[i].writer._write_count for i in range(3)]
        rbe.empty(empty_write_count=False)
        assert [rbe[i].writer._write_count for i in range(3)] == counts
        rbe.empty()
        assert [rbe[i].writer._write_count for i in range(3)] == [0, 0, 0]


@with_state
def test_storage_ensemble_max_size():
    for M in LIBS.values():
        ensemble = M.StorageEnsemble(M.LazyTensorStorage(4), M.ListStorage(3))
        assert ensemble.max_size == 7


# -----------------------------------------------------------------------------
# torchrl 0.11-0.13: the storage and writer ensembles have no state
# -----------------------------------------------------------------------------
@without_state
@pytest.mark.parametrize("lib", ["torchrl", "ours"])
def test_no_state_before_014(tmp_path, lib):
    rbe = _ensemble(LIBS[lib], tmp_path)
    for call in (rbe.state_dict, rbe.storage.state_dict, rbe.writer.state_dict, rbe.empty, rbe.sampler._empty):
        with pytest.raises(NotImplementedError):
            call()
    with pytest.raises(NotImplementedError):
        rbe.storage.load_state_dict({})
    # the sampler ensemble has always had one
    assert list(rbe.sampler.state_dict()) == ["0", "1", "2"]
    assert not hasattr(rbe.storage, "max_size")


# -----------------------------------------------------------------------------
# StorageEnsembleCheckpointer: the empty members (torchrl 0.14's metadata.json)
# -----------------------------------------------------------------------------
def _storage_ensemble(M, tmp_path, *, filled=(True, False, True)):
    storages = M.StorageEnsemble(
        M.LazyTensorStorage(6), M.LazyTensorStorage(5), M.LazyMemmapStorage(4, scratch_dir=tmp_path / "scratch")
    )
    for k, (storage, fill) in enumerate(zip(storages._storages, filled)):
        if fill:
            storage.set(torch.arange(3), _records(3, start=100 * k))
    return storages


def _files(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


needs_empty_members = pytest.mark.skipif(
    not since("ensemble_checkpoint_empty_members"), reason="a torchrl 0.14 behaviour"
)


@needs_empty_members
@pytest.mark.parametrize("src,dst", [("torchrl", "ours"), ("ours", "torchrl"), ("ours", "ours")])
def test_empty_members_checkpoint_crosses(tmp_path, src, dst):
    source = _storage_ensemble(LIBS[src], tmp_path / "src")
    source.dumps(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "metadata.json").read_text()) == {"empty_members": [1]}
    assert not (tmp_path / "ckpt" / "1").exists()
    # the target's second member holds records, which the load empties
    target = _storage_ensemble(LIBS[dst], tmp_path / "dst", filled=(False, True, False))
    target.loads(tmp_path / "ckpt")
    assert [len(storage) for storage in target._storages] == [3, 0, 3]
    for k in (0, 2):
        assert target._storages[k][:3]["step"].tolist() == [100 * k, 100 * k + 1, 100 * k + 2]


@needs_empty_members
def test_empty_members_files_as_torchrl(tmp_path):
    for lib, M in LIBS.items():
        _storage_ensemble(M, tmp_path / f"src-{lib}").dumps(tmp_path / lib)
    assert _files(tmp_path / "ours") == _files(tmp_path / "torchrl")
    assert (tmp_path / "ours" / "metadata.json").read_text() == (tmp_path / "torchrl" / "metadata.json").read_text()


@needs_empty_members
def test_checkpoint_without_metadata_loads_every_member(tmp_path):
    """An ensemble checkpoint written before torchrl 0.14 (no metadata.json) loads each
    member, as torchrl 0.14 loads it."""
    _storage_ensemble(O, tmp_path / "src", filled=(True, True, True)).dumps(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "metadata.json").unlink()
    for lib, M in LIBS.items():
        target = _storage_ensemble(M, tmp_path / f"dst-{lib}", filled=(False, False, False))
        target.loads(tmp_path / "ckpt")
        assert [len(storage) for storage in target._storages] == [3, 3, 3], lib


@needs_empty_members
@pytest.mark.parametrize("empty_members", [[3], ["1"], 1, [-1]])
def test_bad_empty_members_is_refused_before_loading(tmp_path, empty_members):
    _storage_ensemble(O, tmp_path / "src").dumps(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "metadata.json").write_text(json.dumps({"empty_members": empty_members}))
    target = _storage_ensemble(O, tmp_path / "dst", filled=(False, True, False))
    with pytest.raises(ValueError, match="empty_members must be a list of member positions below 3"):
        target.loads(tmp_path / "ckpt")
    assert [len(storage) for storage in target._storages] == [0, 3, 0]


@pytest.mark.skipif(since("ensemble_checkpoint_empty_members"), reason="torchrl 0.11-0.13 behaviour")
def test_empty_member_cannot_be_dumped_before_014(tmp_path):
    """Before torchrl 0.14 every member is dumped, and an empty lazy one cannot be."""
    with pytest.raises(RuntimeError, match="Cannot save a non-initialized storage"):
        _storage_ensemble(O, tmp_path / "src").dumps(tmp_path / "ckpt")
    assert not (tmp_path / "ckpt").exists()


@needs_empty_members
@pytest.mark.parametrize("src,dst", [("torchrl", "ours"), ("ours", "torchrl")])
def test_buffer_ensemble_dumps_cross(tmp_path, src, dst):
    """A whole ensemble's dumps (storages, samplers, writers, generator): the same files in
    both libraries, each loaded by the other, sampling on as the source does."""
    def build(M, where, **kwargs):
        return _ensemble(M, tmp_path / where, third=M.LazyTensorStorage, **kwargs)

    dumps = {}
    for lib, M in LIBS.items():
        rbe = build(M, f"made-{lib}")
        _sampled(rbe, 2)
        rbe.dumps(tmp_path / lib)
        dumps[lib] = rbe
    assert _files(tmp_path / "ours") == _files(tmp_path / "torchrl")
    source = dumps[src]
    target = build(LIBS[dst], "target", start=1000)
    target.loads(tmp_path / src)
    for i in range(3):
        assert torch.equal(target[i][:]["step"], source[i][:]["step"])
    _assert_same_samples(_sampled(target), _sampled(source))
