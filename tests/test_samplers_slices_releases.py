"""Slice samplers against the installed torchrl's, on what changed since 0.11: the trajectory
key found in the storage, ``is_init`` at each slice start, ``pad_output``, ``end_keys``,
``init_key``, ``fragmented`` / ``step_key``, ``can_sample``'s count, the storage revision and
``find_start_stop_traj``. Each case runs in every release; the reference is the installed
torchrl on the same data and seeds."""
import inspect
import json
import pathlib

import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl_samplers
import torchrl.data.replay_buffers.storages as trl_storages
from tensordict import TensorDict

import torchrl_compat as ours
from torchrl_compat._releases import since
from torchrl_compat.utils import find_start_stop_traj

DATA = pathlib.Path(__file__).parent / "data"


def _data(size, *, keys=("episode",), is_init=True, seed=0):
    """Trajectories of random lengths: ids under ``keys``, done at their ends, step counts."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (size,), generator=g)
    traj = torch.repeat_interleave(torch.arange(size), lengths)[:size]
    step = torch.arange(size) - torch.repeat_interleave(lengths.cumsum(0) - lengths, lengths)[:size]
    done = torch.zeros(size, 1, dtype=torch.bool)
    done[:-1, 0] = traj[1:] != traj[:-1]
    fields = {("next", "done"): done, "step_count": step, "obs": torch.arange(size)}
    for key in keys:
        fields[key] = traj
    if is_init:
        fields["is_init"] = (step == 0).unsqueeze(-1)
    return TensorDict(fields, [size])


def _storages(data, capacity, *, shift=0):
    """Ours and torchrl's storage holding ``data`` written from row ``shift`` on (wrapping)."""
    pair = []
    for cls in (ours.LazyTensorStorage, trl_storages.LazyTensorStorage):
        storage = cls(capacity)
        rows = (torch.arange(data.shape[0]) + shift) % capacity
        storage.set(rows, data)
        pair.append(storage)
    return pair


def _sample_both(kwargs, data, batch_size, *, capacity=None, shift=0, calls=3, cls="SliceSampler"):
    capacity = capacity or data.shape[0]
    mine, theirs = _storages(data, capacity, shift=shift)
    our_sampler = getattr(ours, cls)(**kwargs)
    their_sampler = getattr(trl_samplers, cls)(**kwargs)
    for call in range(calls):
        outcomes = []
        for sampler, storage in ((our_sampler, mine), (their_sampler, theirs)):
            torch.manual_seed(call)
            try:
                outcomes.append(("ok", sampler.sample(storage, batch_size)))
            except Exception as err:  # the reference's error is part of the expected result
                outcomes.append(("error", err))
        (kind, got), (want_kind, want) = outcomes
        assert kind == want_kind, (got, want)
        if kind == "error":
            assert type(got) is type(want) and str(got) == str(want)
            continue
        _assert_same_sample(got, want)
    assert repr(our_sampler) == repr(their_sampler)
    return our_sampler, their_sampler


def _assert_same_sample(got, want):
    (index, info), (ref_index, ref_info) = got, want
    assert len(index) == len(ref_index)
    for a, b in zip(index, ref_index):
        assert torch.equal(a, b), (a, b)
    assert list(info) == list(ref_info)
    for key in ref_info:
        assert torch.equal(torch.as_tensor(info[key]), torch.as_tensor(ref_info[key])), key


CASES = [
    dict(num_slices=4),
    dict(slice_len=3),
    dict(slice_len=5, strict_length=False),
    dict(slice_len=3, truncated_key=None),
    dict(slice_len=3, end_key=("next", "done")),
    dict(slice_len=3, traj_key="episode", cache_values=True),
]
if since("slice_pad_output"):
    CASES += [
        # torchrl 0.11 fails on this one with an int slice length (ours cuts the slice)
        dict(slice_len=4, span=True),
        dict(slice_len=4, span=(1, 2)),
        dict(slice_len=6, strict_length=False, pad_output=True),
        dict(slice_len=6, strict_length=False, pad_output=True, truncated_key=None),
        dict(slice_len=7, strict_length=False, pad_output=True, span=(0, True)),
    ]
if since("slice_end_keys_fragmented"):
    CASES += [
        dict(slice_len=3, init_key=None),
        dict(slice_len=3, init_key="obs_init"),
        dict(slice_len=3, end_keys=[("next", "done"), ("next", "truncated")]),
        dict(slice_len=3, end_keys=[("next", "missing")]),
    ]


@pytest.mark.parametrize("kwargs", CASES, ids=str)
@pytest.mark.parametrize("layout", ["partial", "full", "wrapped"])
def test_slices_match_torchrl(kwargs, layout):
    data = _data(40)
    if layout == "partial":
        _sample_both(kwargs, data, 12, capacity=64)
    elif layout == "full":
        _sample_both(kwargs, data, 12)
    else:
        _sample_both(kwargs, data, 12, shift=13)


@pytest.mark.parametrize("keys", [("episode",), (("collector", "traj_ids"),), ("episode", ("collector", "traj_ids")), ()])
@pytest.mark.parametrize("is_init", [True, False])
def test_trajectory_key_found_as_torchrl_finds_it(keys, is_init):
    data = _data(30, keys=keys, is_init=is_init)
    if ("collector", "traj_ids") in keys and "episode" in keys:
        data["episode"] = torch.zeros(30, dtype=torch.long)  # one trajectory: a wrong pick shows
    ours_sampler, theirs = _sample_both(dict(slice_len=3), data, 9)
    assert ours_sampler.traj_key == theirs.traj_key
    assert ours_sampler._fetch_traj == theirs._fetch_traj


@pytest.mark.parametrize("shuffle", [False, True])
def test_without_replacement_matches_torchrl(shuffle):
    kwargs = dict(num_slices=3, shuffle=shuffle)
    if since("slice_end_keys_fragmented"):
        kwargs.update(end_keys=[("next", "done")], init_key="is_init")
    _sample_both(kwargs, _data(40), 9, calls=4, cls="SliceSamplerWithoutReplacement")


def test_ndim2_storage_matches_torchrl():
    data = torch.stack([_data(16, seed=1), _data(16, seed=2)], 1)
    pair = []
    for cls in (ours.LazyTensorStorage, trl_storages.LazyTensorStorage):
        storage = cls(32, ndim=2)
        storage.set(torch.arange(16), data)
        pair.append(storage)
    for kwargs in ([dict(slice_len=3, traj_key="episode")] + ([dict(slice_len=3)] if since("slice_traj_key_auto") else [])):
        results = []
        for module, storage in ((ours, pair[0]), (trl_samplers, pair[1])):
            torch.manual_seed(0)
            results.append(module.SliceSampler(**kwargs).sample(storage, 12))
        _assert_same_sample(*results)


@pytest.mark.skipif(not since("slice_end_keys_fragmented"), reason="fragmented=True is torchrl 0.14's")
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(slice_len=3, fragmented=True, traj_key="episode"),
        dict(slice_len=4, fragmented=True, traj_key="episode", strict_length=False),
        dict(slice_len=5, fragmented=True, strict_length=False, pad_output=True),
        dict(slice_len=20, fragmented=True, traj_key="episode"),
    ],
    ids=str,
)
def test_fragmented_matches_torchrl(kwargs):
    data = _data(48, seed=3)
    # interleave the trajectories: storage order no longer follows them
    data = data[torch.randperm(48, generator=torch.Generator().manual_seed(4))]
    data["step_count"][5] = 100  # a gap: one trajectory in two runs
    _sample_both(kwargs, data, 20 if kwargs["slice_len"] == 20 else 12, capacity=64)


@pytest.mark.skipif(not since("slice_end_keys_fragmented"), reason="fragmented=True is torchrl 0.14's")
def test_fragmented_errors_match_torchrl():
    data = _data(20)
    data["step_count"][7] = data["step_count"][6]
    data["episode"][7] = data["episode"][6]
    _sample_both(dict(slice_len=2, fragmented=True, traj_key="episode"), data, 4, calls=1)
    data = _data(20)
    data["step_count"][3] = -2
    _sample_both(dict(slice_len=2, fragmented=True, traj_key="episode"), data, 4, calls=1)
    for bad in (dict(ends=torch.ones(3, dtype=torch.bool)), dict(span=True), dict(step_key=None)):
        errors = []
        for module in (ours, trl_samplers):
            with pytest.raises((ValueError, NotImplementedError)) as info:
                module.SliceSampler(slice_len=2, fragmented=True, **bad)
            errors.append((type(info.value), str(info.value)))
        assert errors[0] == errors[1]


@pytest.mark.skipif(not since("slice_end_keys_fragmented"), reason="can_sample's count is torchrl 0.14's")
@pytest.mark.parametrize("kwargs", [dict(slice_len=4), dict(slice_len=4, strict_length=False), dict(slice_len=50)], ids=str)
def test_sampleable_count_matches_torchrl(kwargs):
    mine, theirs = _storages(_data(40), 64)
    batch = 2 * kwargs["slice_len"]
    got = ours.SliceSampler(**kwargs)._sampleable_count(mine, batch)
    want = trl_samplers.SliceSampler(**kwargs)._sampleable_count(theirs, batch)
    assert int(got) == int(want)
    empty = ours.LazyTensorStorage(8)
    assert ours.SliceSampler(**kwargs)._sampleable_count(empty, batch) == 0


def test_constructor_keywords_follow_the_release():
    for name in ("SliceSampler", "SliceSamplerWithoutReplacement"):
        mine, theirs = getattr(ours, name).__init__, getattr(trl_samplers, name).__init__
        assert list(inspect.signature(mine).parameters) == list(inspect.signature(theirs).parameters)
    if not since("slice_pad_output"):
        with pytest.raises(TypeError, match="unexpected keyword argument 'pad_output'"):
            ours.SliceSampler(slice_len=2, pad_output=False)
    else:
        with pytest.raises(ValueError, match="pad_output=True is incompatible"):
            ours.SliceSampler(slice_len=2, pad_output=True)
    if since("slice_end_keys_fragmented"):
        with pytest.raises(RuntimeError, match="`end_key` and `end_keys` are exclusive"):
            ours.SliceSampler(slice_len=2, end_key="a", end_keys=["b"])
    else:
        with pytest.raises(TypeError, match="unexpected keyword argument 'end_keys'"):
            ours.SliceSamplerWithoutReplacement(slice_len=2, end_keys=None)


@pytest.mark.skipif(not since("slice_mutation_revision"), reason="revision-checked caches are torchrl 0.14's")
def test_cache_values_sees_writes_through_the_revision():
    from torchrl_compat.samplers.slice import _revision_key

    storage = ours.LazyTensorStorage(40)
    storage.set(torch.arange(2), _data(2))
    if _revision_key(storage) is None:
        pytest.skip("this storage keeps no mutation revision")
    data = _data(40)
    storage.set(torch.arange(40), data)
    sampler = ours.SliceSampler(slice_len=2, traj_key="episode", cache_values=True)
    before = sampler._get_stop_and_length(storage)[2].clone()
    data["episode"] = torch.zeros(40, dtype=torch.long)
    storage.set(torch.arange(40), data)  # not through the sampler's extend
    after = sampler._get_stop_and_length(storage)[2]
    assert before.numel() > 1 and after.tolist() == [40]


SIGNALS = [
    dict(end=torch.tensor([False, True, False, False, True, False]), at_capacity=True),
    dict(end=torch.tensor([False, True, False, False, True, False]), at_capacity=True, cursor=3),
    dict(end=torch.tensor([False, True, False, False, True, False]), at_capacity=False),
    dict(end=torch.zeros(6, 2, dtype=torch.bool), at_capacity=True, cursor=torch.tensor([1, 2])),
    dict(trajectory=torch.tensor([5, 5, 5, 0, 0, 1, 1, 1, 5, 5]), at_capacity=True),
    dict(trajectory=torch.tensor([3]), at_capacity=False),
    dict(trajectory=torch.tensor([[3, 4]]), at_capacity=False),
    dict(trajectory=torch.tensor([1, 1, 2]), at_capacity=True, cursor=range(0, 2)),
    dict(end=torch.zeros(0, dtype=torch.bool), at_capacity=False),
    dict(end=torch.tensor(True), at_capacity=False),
    dict(end=torch.ones(3, dtype=torch.bool), at_capacity=True, cursor=torch.zeros(0, dtype=torch.long)),
    dict(end=torch.ones(3, dtype=torch.bool), at_capacity=True, cursor=range(0)),
    dict(end=torch.ones(3, dtype=torch.bool), trajectory=torch.ones(3), at_capacity=True),
    dict(at_capacity=True),
]


@pytest.mark.parametrize("kwargs", SIGNALS, ids=range(len(SIGNALS)))
@pytest.mark.parametrize("kernels", [True, False], ids=["replay", "torch-ops"])
def test_trajectory_bounds_match_torchrl(kwargs, kernels):
    """The sampler's boundaries (and, from 0.14 on, the public ``find_start_stop_traj``) give
    the installed torchrl's results and errors."""
    if not since("find_start_stop_traj_public") and ("trajectory" not in kwargs and "end" not in kwargs or kwargs.get("end", torch.ones(1)).ndim == 0):
        pytest.skip("torchrl 0.11's method needs a signal (its 0-dim error: tests/test_slices.py)")
    ref_sampler = trl_samplers.SliceSampler(num_slices=1)
    sampler = ours.SliceSampler(num_slices=1)
    sampler._use_cpu_kernels = kernels
    pairs = [(sampler._find_start_stop_traj, ref_sampler._find_start_stop_traj)]
    if since("find_start_stop_traj_public"):
        from torchrl.data.replay_buffers.utils import find_start_stop_traj as reference

        pairs.append((find_start_stop_traj, reference))
    for mine, theirs in pairs:
        try:
            want = theirs(**kwargs)
        except Exception as err:
            with pytest.raises(type(err)) as info:
                mine(**kwargs)
            assert str(info.value) == str(err)
            continue
        got = mine(**kwargs)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), (a, b)


@pytest.mark.skipif(not since("find_start_stop_traj_public"), reason="a public function from torchrl 0.14 on")
def test_find_start_stop_traj_exported():
    assert ours.find_start_stop_traj is find_start_stop_traj
    end = torch.tensor([False, True, False, True])
    got = find_start_stop_traj(end=end, at_capacity=False, device="cpu")
    assert [t.tolist() for t in got] == [[[0], [2]], [[1], [3]], [2, 2]]


# -----------------------------------------------------------------------------
# Golden files of torchrl 0.14.1's SliceSamplerWithoutReplacement
# (tests/data/make_golden_slice_samplers014.py), in every release
# -----------------------------------------------------------------------------
def _golden():
    from data import make_golden_slice_samplers014 as golden

    return golden


def _golden_record():
    golden = _golden()
    return json.loads((DATA / f"{golden.NAME}.json").read_text())


def _state_of(sampler) -> dict:
    return {
        key: value.tolist() if isinstance(value, torch.Tensor) else value
        for key, value in sampler.state_dict().items()
    }


def _loaded_pair(load):
    """Ours and torchrl's ``SliceSamplerWithoutReplacement``, each given ``load(sampler)``,
    with a storage of the golden trajectories each."""
    golden = _golden()
    pair = []
    for samplers, storages in ((ours, ours), (trl_samplers, trl_storages)):
        sampler = samplers.SliceSamplerWithoutReplacement(**golden.SAMPLER_KWARGS)
        load(sampler)
        pair.append((sampler, golden.trajectories(storages.LazyTensorStorage)))
    return pair


def test_golden_slice_without_replacement_state_dict_loads():
    """torchrl 0.14.1's state_dict, part-way through the permutation of the trajectories,
    loads into ours and the epoch goes on with torchrl's slices (its state_dict has the
    same layout in every release)."""
    golden = _golden()
    state = torch.load(DATA / f"{golden.NAME}.pt")
    (mine, my_storage), (theirs, their_storage) = _loaded_pair(lambda sampler: sampler.load_state_dict(state))
    record = _golden_record()
    assert _state_of(mine) == _state_of(theirs) == record["state"]
    got = golden.next_slices(mine, my_storage)
    assert got == golden.next_slices(theirs, their_storage)
    if since("slice_end_keys_fragmented"):  # the slices torchrl 0.14.1 sampled
        assert got == record["next_slices"]


def test_golden_slice_without_replacement_dumps_loads():
    """torchrl 0.14.1's dumps loads into ours as into the installed torchrl: from 0.13 the
    permutation state is read (and the epoch goes on with torchrl's slices); before, loads is a
    no-op in both, and the samplers keep their fresh state."""
    golden = _golden()
    (mine, my_storage), (theirs, their_storage) = _loaded_pair(lambda sampler: sampler.loads(DATA / golden.NAME))
    assert _state_of(mine) == _state_of(theirs)
    if since("slice_without_replacement_dumps"):
        assert _state_of(mine) == _golden_record()["state"]
        assert golden.next_slices(mine, my_storage) == golden.next_slices(theirs, their_storage)
    else:
        assert _state_of(mine)["len_storage"] == 0


def test_slice_without_replacement_dumps_as_torchrl_014(tmp_path):
    """Ours, holding the golden state, dumps torchrl 0.14.1's files (from 0.13; nothing before,
    as torchrl), which torchrl's sampler loads back."""
    golden = _golden()
    state = torch.load(DATA / f"{golden.NAME}.pt")
    mine = ours.SliceSamplerWithoutReplacement(**golden.SAMPLER_KWARGS)
    mine.load_state_dict(state)
    mine.dumps(tmp_path / "ckpt")
    theirs = trl_samplers.SliceSamplerWithoutReplacement(**golden.SAMPLER_KWARGS)
    theirs.dumps(tmp_path / "theirs")
    if not since("slice_without_replacement_dumps"):
        assert not (tmp_path / "ckpt").exists() and not (tmp_path / "theirs").exists()
        return
    reference = DATA / golden.NAME
    files = sorted(p.name for p in reference.iterdir())
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == files
    for name in files:
        mine_bytes, golden_bytes = (tmp_path / "ckpt" / name).read_bytes(), (reference / name).read_bytes()
        if name.endswith(".json"):
            assert json.loads(mine_bytes) == json.loads(golden_bytes), name
        else:
            assert mine_bytes == golden_bytes, name
    theirs.loads(tmp_path / "ckpt")
    assert _state_of(theirs) == _golden_record()["state"]
