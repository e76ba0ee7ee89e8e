"""The CPU kernel paths of the samplers against their torch-op paths (``_use_cpu_kernels``)."""
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data.replay_buffers import LazyTensorStorage

import torchrl_compat.samplers as ours
import torchrl_compat.samplers.prioritized as prioritized_module
from torchrl_compat.samplers import _priorities
from torchrl_compat.samplers import _trees


def make_storage(n, filled=None):
    storage = LazyTensorStorage(n)
    filled = n if filled is None else filled
    storage.set(torch.arange(filled), TensorDict({"obs": torch.arange(filled)}, [filled]))
    return storage


def generator(seed=0):
    return torch.Generator().manual_seed(seed)


def _pair(cls, *args, **kwargs):
    fast, slow = cls(*args, **kwargs), cls(*args, **kwargs)
    slow._use_cpu_kernels = False
    return fast, slow


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("within_buffer", [False, True])
def test_prioritized_update_and_sample_match_torch_path(dtype, within_buffer):
    n = 300
    storage = make_storage(n, filled=250)
    fast, slow = _pair(
        ours.PrioritizedSampler, n, 0.7, 0.4, dtype=dtype, max_priority_within_buffer=within_buffer
    )
    assert _trees.is_replay_tree(fast._sum_tree)
    rng = np.random.default_rng(0)
    for step in range(20):
        index = torch.as_tensor(rng.integers(-1, n, size=int(rng.integers(0, 40))))
        priority = torch.as_tensor(rng.uniform(0, 5, size=index.shape[0]), dtype=torch.float32)
        if step == 5:
            priority = priority.max() + 10  # a scalar, broadcast
        if step == 9 and index.numel():
            index[:] = -1  # nothing to update
        for sampler in (fast, slow):
            sampler.update_priority(index, priority)
        np.testing.assert_array_equal(fast._sum_tree.values(), slow._sum_tree.values())
        np.testing.assert_array_equal(fast._min_tree.values(), slow._min_tree.values())
        fmax, smax = fast._max_priority, slow._max_priority
        assert (fmax[0] is None) == (smax[0] is None)
        if fmax[0] is not None:
            assert float(fmax[0]) == float(smax[0]) and int(fmax[1]) == int(smax[1])
        fast._rng, slow._rng = generator(step), generator(step)
        (fi, finfo), (si, sinfo) = fast.sample(storage, 64), slow.sample(storage, 64)
        assert torch.equal(fi, si)
        assert finfo["priority_weight"].dtype == sinfo["priority_weight"].dtype == dtype
        torch.testing.assert_close(finfo["priority_weight"], sinfo["priority_weight"])
    assert _trees.is_replay_tree(fast._sum_tree)
    assert not _trees.is_replay_tree(slow._sum_tree)  # the accelerator path's trees


def test_prioritized_kernel_errors_match_torch_path():
    storage = make_storage(10, filled=4)
    fast, slow = _pair(ours.PrioritizedSampler, 10, 1.0, 0.5, eps=0.0)
    for sampler in (fast, slow):
        with pytest.raises(RuntimeError, match="non-positive p_sum"):
            sampler.sample(storage, 4)
        with pytest.raises(IndexError, match="index 16 at position 1 is out of range for max_capacity=10"):
            sampler.update_priority(torch.tensor([1, 16]), torch.tensor([1.0, 1.0]))
        with pytest.raises(ValueError, match="got priority=nan at position 1"):
            sampler.update_priority(torch.tensor([1, 2]), torch.tensor([1.0, float("nan")]))
        with pytest.raises(ValueError, match="got priority=-1.0 at position 0"):
            sampler.update_priority(torch.tensor([1, 2]), torch.tensor([-1.0, 1.0]))
        with pytest.raises(RuntimeError, match="priority should be a number or an iterable"):
            sampler.update_priority(torch.tensor([1, 2]), torch.tensor([1.0, 1.0, 1.0]))
        sampler.update_priority(torch.arange(4), torch.tensor([0.0, 1.0, 0.0, 2.0]))
        with pytest.raises(RuntimeError, match="non-positive p_min"):
            sampler.sample(storage, 4)
        assert sampler._sum_tree.values()[:4].tolist() == [0.0, 1.0, 0.0, 2.0]


def test_prioritized_draws_on_a_2d_storage_match_torch_path():
    """A storage of two dimensions: both paths give its draws as one index per dimension."""
    storage = LazyTensorStorage(24, ndim=2)
    storage.set(torch.arange(6), TensorDict({"obs": torch.zeros(6, 4)}, [6, 4]))
    fast, slow = _pair(ours.PrioritizedSampler, 24, 0.7, 0.5)
    for sampler in (fast, slow):
        sampler.update_priority(torch.arange(24), torch.linspace(0.5, 3.0, 24))
        sampler._rng = generator(7)
    (fi, finfo), (si, sinfo) = fast.sample(storage, 32), slow.sample(storage, 32)
    assert isinstance(fi, tuple) and isinstance(si, tuple) and len(fi) == len(si) == 2
    for a, b in zip(fi, si):
        assert torch.equal(a, b)
    assert int(fi[0].max()) < 6 and int(fi[1].max()) < 4
    torch.testing.assert_close(finfo["priority_weight"], sinfo["priority_weight"])


BAD_UPDATES = {
    "NaN after a skipped -1": (torch.tensor([-1, 0, 3]), torch.tensor([1.0, float("nan"), 1.0])),
    "negative at index 0": (torch.tensor([0, -1, 2]), torch.tensor([-2.0, 1.0, 1.0])),
    "index past the trees after a -1": (torch.tensor([-1, 0, 40]), torch.tensor([1.0, 1.0, 1.0])),
    "past float32 at index 0": (torch.tensor([0, 1]), torch.tensor([1e39, 1.0], dtype=torch.float64)),
    "infinite scalar": (torch.tensor([0, -1]), torch.tensor(float("inf"))),
}


@pytest.mark.parametrize("case", sorted(BAD_UPDATES))
def test_refused_updates_say_the_same_on_both_paths(case):
    """The torch-op path refuses a bad batch on the device, then explains it with the checked
    path's words: the same exception and text as the kernels, the ``-1`` entries left out."""
    index, priority = BAD_UPDATES[case]
    errors = []
    for sampler in _pair(ours.PrioritizedSampler, 10, 1.0, 0.5):
        sampler.update_priority(torch.tensor([5]), torch.tensor([2.0]))
        before = sampler._sum_tree.values().copy()
        with pytest.raises(Exception) as info:
            sampler.update_priority(index, priority)
        errors.append((type(info.value), str(info.value)))
        np.testing.assert_array_equal(sampler._sum_tree.values(), before)
        assert float(sampler._max_priority[0]) == 2.0
    assert errors[0] == errors[1]
    assert errors[0][0] in (IndexError, ValueError)


def test_prioritized_global_seed_reproduces():
    """Without a generator the masses come from numpy's global RNG, as in torchrl: seeding
    numpy reproduces a batch, whatever torch's RNG does in between."""
    storage = make_storage(100)
    sampler = ours.PrioritizedSampler(100, 1.0, 1.0)
    sampler.update_priority(torch.arange(100), torch.rand(100, generator=generator(0)))
    np.random.seed(3)
    torch.manual_seed(3)
    a = sampler.sample(storage, 32)
    np.random.seed(3)
    torch.manual_seed(4)
    b = sampler.sample(storage, 32)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1]["priority_weight"], b[1]["priority_weight"])
    c = sampler.sample(storage, 32)
    assert not torch.equal(a[0], c[0])


# ------------------------------------------------------------------------- without replacement


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n,batch", [(1, 1), (10, 3), (12, 4), (64, 64), (7, 10)])
def test_without_replacement_epochs(n, batch, drop_last):
    """Each epoch is torchrl's (the same ``torch.randperm``), and ran_out / _remaining_batches
    follow torchrl's."""
    import torchrl.data.replay_buffers.samplers as trl

    storage = make_storage(64, filled=n)
    mine, theirs = ours.SamplerWithoutReplacement(drop_last=drop_last), trl.SamplerWithoutReplacement(drop_last=drop_last)
    mine._rng, theirs._rng = generator(1), generator(1)
    if drop_last and batch > n:
        for sampler in (mine, theirs):
            with pytest.raises(ValueError, match="greater than the storage capacity"):
                sampler.sample(storage, batch)
        return
    epoch_size = n // batch * batch if drop_last else n
    for _ in range(3):
        seen = []
        while True:
            (a, _), (b, _) = mine.sample(storage, batch), theirs.sample(storage, batch)
            assert torch.equal(a, b) and a.dtype == b.dtype == torch.int64
            assert (mine.ran_out, mine._remaining_batches) == (theirs.ran_out, theirs._remaining_batches)
            seen += a.tolist()
            if mine.ran_out:
                break
        assert len(seen) == epoch_size and len(set(seen)) == epoch_size
        assert set(seen) <= set(range(n))


def test_without_replacement_state_is_torchrl_format(tmp_path):
    import torchrl.data.replay_buffers.samplers as trl

    storage = make_storage(64, filled=20)
    mine = ours.SamplerWithoutReplacement()
    mine._rng = generator(3)
    first, _ = mine.sample(storage, 6)
    assert mine.__dict__["_sample_pos"] == 6  # the rest not cut yet
    assert repr(mine) == "SamplerWithoutReplacement( 70.0000% sampled)"
    state = mine.state_dict()
    assert list(state) == ["len_storage", "_sample_list", "drop_last", "_ran_out"]
    rest = state["_sample_list"]
    assert sorted(first.tolist() + rest.tolist()) == list(range(20))
    mine.dumps(tmp_path / "ours")
    back = trl.SamplerWithoutReplacement()
    back.loads(tmp_path / "ours")
    assert torch.equal(back._sample_list, rest) and back.len_storage == 20
    # both continue with the materialised rest of the epoch
    a, _ = mine.sample(storage, 7)
    b, _ = back.sample(storage, 7)
    assert torch.equal(a, b) and torch.equal(a, rest[:7])


def test_without_replacement_kernel_seeds():
    storage = make_storage(1000)
    runs = []
    for seed in (0, 0, 1):
        sampler = ours.SamplerWithoutReplacement()
        sampler._rng = generator(seed)
        runs.append(torch.cat([sampler.sample(storage, 100)[0] for _ in range(3)]))
    torch.manual_seed(5)
    global_a = ours.SamplerWithoutReplacement().sample(storage, 100)[0]
    torch.manual_seed(5)
    global_b = ours.SamplerWithoutReplacement().sample(storage, 100)[0]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    assert torch.equal(global_a, global_b)


def test_slice_without_replacement_kernel_covers_each_trajectory_once():
    episode = torch.repeat_interleave(torch.arange(8), torch.tensor([7, 3, 12, 5, 9, 20, 6, 8]))
    storage = LazyTensorStorage(episode.shape[0])
    storage.set(torch.arange(episode.shape[0]), TensorDict({"episode": episode}, [episode.shape[0]]))
    sampler = ours.SliceSamplerWithoutReplacement(num_slices=2, traj_key="episode", strict_length=False)
    sampler._rng = generator(2)
    seen = []
    while True:
        (index,), _ = sampler.sample(storage, 6)
        seen += episode[index].view(2, -1)[:, 0].tolist()
        if sampler.ran_out:
            break
    assert sorted(seen) == list(range(8))


# ------------------------------------------------------------------------- slices


def _episode_storage(lengths, capacity, wrap=False):
    episode = torch.repeat_interleave(torch.arange(len(lengths)), torch.as_tensor(lengths))
    n = episode.shape[0]
    done = torch.ones(n, dtype=torch.bool)
    done[:-1] = episode[1:] != episode[:-1]
    data = TensorDict({"episode": episode, ("next", "done"): done.unsqueeze(-1)}, [n])
    storage = LazyTensorStorage(capacity)
    if wrap:
        data["next", "done"][-1] = False
        written = 0
        for size in (capacity // 2,) * 3:
            storage.set(torch.arange(written, written + size) % capacity, data[written : written + size])
            written += size
    else:
        storage.set(torch.arange(n), data)
    return storage


@pytest.mark.parametrize(
    "config",
    [
        dict(num_slices=4),
        dict(slice_len=5, strict_length=False),
        dict(slice_len=5, span=(True, 2)),
        dict(slice_len=4, cache_values=True),
    ],
    ids=str,
)
@pytest.mark.parametrize("key", ["traj_key", "end_key"])
@pytest.mark.parametrize("wrap", [False, True])
def test_slice_sampler_kernels_match_torch_path(config, key, wrap):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 15, 40).tolist()
    storage = _episode_storage(lengths, capacity=90 if wrap else sum(lengths), wrap=wrap)
    kwargs = {"traj_key": "episode"} if key == "traj_key" else {"end_key": ("next", "done")}
    fast, slow = _pair(lambda: ours.SliceSampler(**kwargs, **config))
    fast._rng, slow._rng = generator(4), generator(4)
    for _ in range(3):
        (fi, finfo), (si, sinfo) = fast.sample(storage, 20), slow.sample(storage, 20)
        assert len(fi) == len(si) and all(torch.equal(x, y) for x, y in zip(fi, si))
        assert set(finfo) == set(sinfo)
        for name in finfo:
            assert torch.equal(finfo[name], sinfo[name])


# ------------------------------------------------------------------------- prioritized slices


@pytest.mark.parametrize(
    "config",
    [dict(num_slices=4), dict(slice_len=5, strict_length=False), dict(slice_len=4, span=(0, 2), cache_values=True)],
    ids=str,
)
@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_prioritized_slice_kernel_matches_torch_path(config, wrap, dtype, monkeypatch):
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 15, 40).tolist()
    capacity = 90 if wrap else sum(lengths)
    storage = _episode_storage(lengths, capacity=capacity, wrap=wrap)
    fast, slow = _pair(
        lambda: ours.PrioritizedSliceSampler(capacity, 0.8, 0.6, dtype=dtype, traj_key="episode", **config)
    )
    priority = torch.as_tensor(rng.integers(0, 4, capacity), dtype=torch.float32)
    for sampler in (fast, slow):
        sampler.update_priority(torch.arange(capacity), priority)
    before = fast._sum_tree.values()
    for step in range(3):
        fast._rng, slow._rng = generator(step), generator(step)
        (si,), sinfo = slow.sample(storage, 20)
        # the kernel path neither reads every leaf nor writes the trees
        with monkeypatch.context() as patch:
            patch.setattr(prioritized_module, "read_leaves", None)
            patch.setattr(_priorities, "read_leaves", None)
            (fi,), finfo = fast.sample(storage, 20)
        assert torch.equal(fi, si)
        assert set(finfo) == set(sinfo)
        for name in finfo:
            torch.testing.assert_close(finfo[name], sinfo[name])
    np.testing.assert_array_equal(fast._sum_tree.values(), before)


def test_without_replacement_state_mid_epoch_after_slicing_batches():
    """After the rest of the epoch is stored, batches advance a position in it: state_dict,
    repr and pickling see exactly the elements not handed out yet."""
    import pickle

    storage = make_storage(64, filled=20)
    sampler = ours.SamplerWithoutReplacement()
    sampler._rng = generator(4)
    handed = [sampler.sample(storage, 4)[0] for _ in range(3)]
    assert sampler.__dict__["_sample_pos"] == 12
    assert repr(sampler) == "SamplerWithoutReplacement( 40.0000% sampled)"
    clone = pickle.loads(pickle.dumps(sampler))
    rest = sampler.state_dict()["_sample_list"]
    assert rest.shape == (8,) and sampler.__dict__["_sample_pos"] == 0
    assert sorted(torch.cat(handed).tolist() + rest.tolist()) == list(range(20))
    # the pickled copy continues with the same elements, in the same order
    a = torch.cat([sampler.sample(storage, 4)[0] for _ in range(2)])
    b = torch.cat([clone.sample(storage, 4)[0] for _ in range(2)])
    assert torch.equal(a, b) and torch.equal(a, rest)
    assert sampler.ran_out and clone.ran_out


def test_without_replacement_reading_its_state_does_not_change_the_epoch():
    """Reading ``_sample_list`` (state_dict, dumps) after the first batch cuts the rest of the
    epoch exactly as the next batches hand it out: the samples stay the same."""
    storage = make_storage(64, filled=40)
    read, unread = ours.SamplerWithoutReplacement(), ours.SamplerWithoutReplacement()
    read._rng, unread._rng = generator(9), generator(9)
    assert torch.equal(read.sample(storage, 5)[0], unread.sample(storage, 5)[0])
    rest = read.state_dict()["_sample_list"]
    following = [unread.sample(storage, 5)[0] for _ in range(7)]
    assert torch.equal(torch.cat(following), rest)
    assert all(torch.equal(read.sample(storage, 5)[0], batch) for batch in following)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("pickled", [False, True])
def test_without_replacement_reading_its_state_at_an_epoch_boundary(drop_last, pickled):
    """Reading the state when an epoch has just ended (the next one opened, nothing drawn from
    it yet) leaves the following epochs as they are, for the same batch size; the state read
    there is the whole next epoch."""
    import pickle

    storage = make_storage(64, filled=30)
    read, unread = ours.SamplerWithoutReplacement(drop_last), ours.SamplerWithoutReplacement(drop_last)
    read._rng, unread._rng = generator(3), generator(3)
    for epoch in range(3):
        for _ in range(6):  # 6 * 5 = 30: the last batch of each epoch sets ran_out
            assert torch.equal(read.sample(storage, 5)[0], unread.sample(storage, 5)[0])
        assert read.ran_out and unread.ran_out
        state = read.state_dict()
        if pickled:  # the generator is not pickled: the buffer sets it again
            read = pickle.loads(pickle.dumps(read))
            read._rng = torch.Generator()
            read._rng.set_state(unread._rng.get_state())
        assert sorted(state["_sample_list"].tolist()) == list(range(30))
    following = torch.cat([unread.sample(storage, 5)[0] for _ in range(6)])
    assert torch.equal(following, state["_sample_list"])
    assert torch.equal(torch.cat([read.sample(storage, 5)[0] for _ in range(6)]), following)


def test_without_replacement_boundary_state_with_another_batch_size_is_a_permutation():
    storage = make_storage(64, filled=30)
    sampler = ours.SamplerWithoutReplacement()
    sampler._rng = generator(5)
    for _ in range(6):
        sampler.sample(storage, 5)
    sampler.state_dict()
    epoch = torch.cat([sampler.sample(storage, 6)[0] for _ in range(5)])
    assert sorted(epoch.tolist()) == list(range(30)) and sampler.ran_out


@pytest.mark.parametrize("tree_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("priority_dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("scalar", [False, True])
def test_update_stores_torch_values_for_every_priority_dtype(tree_dtype, priority_dtype, scalar):
    """The kernel path stores (p + eps) ** alpha exactly as torch computes it from the user's
    tensor, whatever its dtype and shape, also after eps is changed on the sampler."""
    n = 64
    sampler = ours.PrioritizedSampler(n, 0.7, 0.4, dtype=tree_dtype)
    index = torch.arange(0, n, 3)
    for eps in (1e-8, 0.25):
        sampler._eps = eps
        priority = torch.rand(()) if scalar else torch.rand(index.shape[0])
        priority = (priority * 3 + 1e-7).to(priority_dtype)
        sampler.update_priority(index, priority)
        expected = torch.pow(priority + eps, 0.7).to(tree_dtype).expand(index.shape[0])
        stored = torch.as_tensor(sampler._sum_tree.values()[index.numpy()])
        assert torch.equal(stored, expected), (eps, priority_dtype)
