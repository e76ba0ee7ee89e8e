"""The prioritized samplers against the installed torchrl's (0.11 or 0.14), on the same seeds.

Where torchrl's compiled trees do not load (make test's torch 2.13), its side runs on
``replay``'s trees, installed with :func:`torchrl_compat.install_segment_trees` as a user there
must; where they load (torch 2.9 / 2.15, make test-matrix) on its own, whose refusal of the
other float type is torchrl's failure (``native_trees``). Seeds are set as users set them
(``np.random.seed``, ``torch.manual_seed``, a buffer generator).
"""
import contextlib
import json
import multiprocessing as mp
import warnings

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import torchrl_compat
from native_trees import torchrls_side
from torchrl_compat._releases import since

torchrl_compat.install_segment_trees()

import torchrl.data.replay_buffers as trl  # noqa: E402
from torchrl.data.replay_buffers import LazyTensorStorage  # noqa: E402

import torchrl_compat.samplers as ours  # noqa: E402

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _storage(n, ndim=1):
    storage = LazyTensorStorage(n, ndim=ndim)
    if ndim == 1:
        storage.set(torch.arange(n), TensorDict({"obs": torch.arange(n)}, [n]))
    else:
        shape = (n // 4, 4)
        storage.set(torch.arange(shape[0]), TensorDict({"obs": torch.zeros(shape)}, list(shape)))
    return storage


def _pair(n, **kwargs):
    return trl.PrioritizedSampler(n, **kwargs), ours.PrioritizedSampler(n, **kwargs)


def _update_both(ref, mine, index, priority):
    mine.update_priority(index, priority)
    with torchrls_side():
        ref.update_priority(index, priority)


def _same_sample(ref, mine, storage, batch_size, seed):
    np.random.seed(seed)
    torch.manual_seed(seed + 1)  # torch's global RNG plays no part without a generator
    mi, minfo = mine.sample(storage, batch_size)
    np.random.seed(seed)
    torch.manual_seed(seed)
    with torchrls_side():
        ri, rinfo = ref.sample(storage, batch_size)
    if isinstance(ri, tuple):
        assert all(torch.equal(r, m) for r, m in zip(ri, mi))
    else:
        assert torch.equal(ri, mi)
    assert minfo["priority_weight"].dtype == rinfo["priority_weight"].dtype
    assert torch.equal(minfo["priority_weight"], rinfo["priority_weight"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("generator", [False, True])
@pytest.mark.parametrize("n,filled", [(1, 1), (37, 37), (1000, 600), (1000, 1000), (4096, 4096)])
def test_draws_are_torchrls_to_the_bit(dtype, generator, n, filled):
    """Indices and weights, bit for bit: numpy's global RNG without a generator, the
    generator's torch.rand with one; zero priorities, a partly filled storage, at capacity."""
    storage = _storage(n)
    if filled < n:
        storage = LazyTensorStorage(n)
        storage.set(torch.arange(filled), TensorDict({"obs": torch.arange(filled)}, [filled]))
    ref, mine = _pair(n, alpha=0.7, beta=0.4, dtype=dtype)
    priority = torch.rand(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64) * 10
    priority[1::7] = 0
    priority[0] = 1.0
    _update_both(ref, mine, torch.arange(n), priority)
    if generator:
        for sampler in (ref, mine):
            sampler._rng = torch.Generator().manual_seed(3)
    for seed in range(4):
        _same_sample(ref, mine, storage, 257, seed)
    _same_sample(ref, mine, storage, 0, 9)


def test_draws_on_a_2d_storage_are_torchrls():
    storage = _storage(64, ndim=2)
    ref, mine = _pair(64, alpha=1.0, beta=0.5)
    for sampler in (ref, mine):
        sampler.update_priority(torch.arange(64), torch.arange(64.0) % 5)
    _same_sample(ref, mine, storage, 100, 0)


def test_buffers_draw_torchrls_batches():
    """A TensorDictPrioritizedReplayBuffer of each library, seeded with np.random.seed: the
    same indices and weights through extend / sample / update (wrap-around included)."""
    buffers = [
        lib.TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=lib.LazyTensorStorage(50), batch_size=16)
        for lib in (trl, torchrl_compat)
    ]
    for step in range(6):
        data = TensorDict({"obs": torch.arange(20.0) + 20 * step}, [20])
        for rb in buffers:
            rb.extend(data.clone())
        np.random.seed(step)
        ref = buffers[0].sample()
        np.random.seed(step)
        mine = buffers[1].sample()
        assert torch.equal(ref["index"], mine["index"])
        assert torch.equal(ref["priority_weight"], mine["priority_weight"])
        for rb, sample in zip(buffers, (ref, mine)):
            sample.set("td_error", (sample["obs"] % 7) + 0.5)
            rb.update_tensordict_priority(sample)


def test_new_items_get_the_releases_default_priority():
    """0.13+: new items are stored as (max_p + eps) ** alpha; 0.11: alpha applied twice."""
    ref, mine = _pair(8, alpha=0.5, beta=1.0)
    for sampler in (ref, mine):
        sampler.update_priority(torch.tensor([0, 1]), torch.tensor([4.0, 9.0]))
        sampler.mark_update(torch.tensor([2, 3]))
    stored = mine._sum_tree[2]
    assert stored == ref._sum_tree[2] == mine._sum_tree[3]
    if since("prioritized_raw_default_priority"):
        assert float(mine.default_priority) == 9.0
        assert stored == pytest.approx((9.0 + 1e-8) ** 0.5)
    else:
        assert stored == pytest.approx(((9.0 + 1e-8) ** 0.5 + 1e-8) ** 0.5)
    assert float(mine.default_priority) == float(ref.default_priority)


@pytest.mark.parametrize("within_buffer", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_setting_alpha_follows_the_release(within_buffer, dtype):
    ref, mine = _pair(16, alpha=0.5, beta=1.0, dtype=dtype, max_priority_within_buffer=within_buffer)
    _update_both(ref, mine, torch.arange(10), torch.arange(1.0, 11.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref.alpha = 0.9
        mine.alpha = 0.9
    assert len(caught) % 2 == 0  # whatever torchrl warns, we warn too
    np.testing.assert_array_equal(mine._sum_tree[np.arange(16)], ref._sum_tree[np.arange(16)])
    np.testing.assert_array_equal(mine._min_tree[np.arange(16)], ref._min_tree[np.arange(16)])
    if since("prioritized_alpha_retransforms"):
        expected = ((torch.arange(1.0, 11.0, dtype=torch.float64) + 1e-8) ** 0.9).to(dtype)
        torch.testing.assert_close(torch.as_tensor(mine._sum_tree[np.arange(10)]), expected, rtol=1e-6, atol=0)
    assert float(mine._max_priority[0]) == float(ref._max_priority[0])
    if since("prioritized_raw_max_within_buffer") or not within_buffer:
        assert float(mine._max_priority[0]) == pytest.approx(10.0, rel=1e-6)  # the raw maximum
    if since("prioritized_device_argument"):
        with pytest.raises(ValueError, match="alpha must be greater or equal than 0, got alpha=-1"):
            mine.alpha = -1
    # the next draws agree too
    storage = _storage(16)
    _same_sample(ref, mine, storage, 64, 5)


def test_alpha_from_zero_keeps_the_stored_values():
    ref, mine = _pair(8, alpha=0.0, beta=1.0)
    for sampler in (ref, mine):
        sampler.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    said = []
    for sampler in (ref, mine):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sampler.alpha = 1.0
        said.append([str(w.message) for w in caught])
    assert said[1] == said[0]  # torchrl's warning, word for word
    if since("prioritized_alpha_retransforms"):
        assert any("away from 0" in message for message in said[1])
    assert mine._sum_tree[np.arange(4)].tolist() == [1.0, 1.0, 1.0, 1.0]


OLD_CHECKPOINTS = {
    # alpha, eps, priorities written, the largest priority the old checkpoint holds
    "alpha 1, large eps": (1.0, 0.5, [1.0, 5.0, 2.0], (5.5, 1)),
    "alpha 0.7": (0.7, 1e-8, [1.0, 5.0, 2.0], ((5.0 + 1e-8) ** 0.7, 1)),
    "values below 1": (1.0, 0.0, [0.25, 0.5], (0.5, 1)),
    "empty trees": (0.7, 0.0, [0.0, 0.0], (3.0, 1)),
}


@pytest.mark.parametrize("case", sorted(OLD_CHECKPOINTS))
def test_old_within_buffer_checkpoint_loads_as_torchrls(case):
    """A within-buffer state dict written before the schema version (its largest priority a
    stored value): the release's rebuild from the trees, compared exactly with torchrl's."""
    alpha, eps, priorities, stored_max = OLD_CHECKPOINTS[case]
    ref, mine = _pair(8, alpha=alpha, beta=1.0, eps=eps, max_priority_within_buffer=True)
    _update_both(ref, mine, torch.arange(len(priorities)), torch.tensor(priorities))
    old = dict(mine.state_dict(), _max_priority=(torch.tensor(stored_max[0]), torch.tensor(stored_max[1])))
    old.pop("_schema_version", None)
    for sampler in (ref, mine):
        sampler.load_state_dict(dict(old))
    _assert_same_largest_priority(ref, mine)


def _assert_same_largest_priority(ref, mine):
    if ref._max_priority[0] is None:
        assert mine._max_priority == (None, None)
    else:
        assert float(mine._max_priority[0]) == float(ref._max_priority[0])
        assert int(mine._max_priority[1]) == int(ref._max_priority[1])
    assert float(mine.default_priority) == float(ref.default_priority)


@pytest.mark.parametrize("case", sorted(set(OLD_CHECKPOINTS) - {"empty trees"}))
def test_old_within_buffer_checkpoint_files_load_as_torchrls(case, tmp_path):
    """The same, through ``dumps`` files written before the schema version (no
    ``_schema_version`` entry in the metadata): both samplers load the same files. (Files of
    zero priorities are refused by ``loads``: no draw could succeed from them.)"""
    alpha, eps, priorities, stored_max = OLD_CHECKPOINTS[case]
    ref, mine = _pair(8, alpha=alpha, beta=1.0, eps=eps, max_priority_within_buffer=True)
    _update_both(ref, mine, torch.arange(len(priorities)), torch.tensor(priorities))
    mine.dumps(tmp_path)
    metadata_file = tmp_path / "sampler_metadata.json"
    metadata = json.loads(metadata_file.read_text())
    metadata.pop("_schema_version", None)
    metadata["_max_priority"] = [stored_max[0], stored_max[1]]
    metadata_file.write_text(json.dumps(metadata))
    fresh_ref, fresh_mine = _pair(8, alpha=alpha, beta=1.0, eps=eps, max_priority_within_buffer=True)
    for sampler in (fresh_ref, fresh_mine):
        sampler.loads(tmp_path)
    _assert_same_largest_priority(fresh_ref, fresh_mine)


@pytest.mark.parametrize("alpha", [0.0, 0.7])
def test_within_buffer_maximum_is_torchrls(alpha):
    ref, mine = _pair(16, alpha=alpha, beta=1.0, max_priority_within_buffer=True)
    steps = [
        (torch.arange(6), torch.tensor([1.0, 8.0, 2.0, 3.0, 0.5, 4.0])),
        (torch.tensor([1]), torch.tensor([0.25])),  # overwrites the largest: rebuilt
        (torch.tensor([5, 2]), torch.tensor([0.1, 0.2])),
    ]
    for index, priority in steps:
        for sampler in (ref, mine):
            sampler.update_priority(index, priority)
            sampler.mark_update(torch.tensor([7]))
        assert float(mine._max_priority[0]) == pytest.approx(float(ref._max_priority[0]), rel=1e-6)
        assert int(mine._max_priority[1]) == int(ref._max_priority[1])
        np.testing.assert_array_equal(mine._sum_tree[np.arange(16)], ref._sum_tree[np.arange(16)])


def test_state_dict_schema_and_copies():
    ref, mine = _pair(8, alpha=0.7, beta=1.0, max_priority_within_buffer=True)
    for sampler in (ref, mine):
        sampler.update_priority(torch.arange(4), torch.tensor([1.0, 5.0, 2.0, 3.0]))
    assert set(mine.state_dict()) == set(ref.state_dict())
    sd = ref.state_dict()
    loaded = ours.PrioritizedSampler(8, alpha=0.7, beta=1.0, max_priority_within_buffer=True)
    loaded.load_state_dict(sd)
    # the largest priority travels: new items get the same default priority
    assert float(loaded._max_priority[0]) == float(mine._max_priority[0]) == float(ref._max_priority[0])
    assert int(loaded._max_priority[1]) == int(mine._max_priority[1]) == 1
    assert float(loaded.default_priority) == float(mine.default_priority) == float(ref.default_priority)
    if since("prioritized_load_state_dict_copies"):
        assert "_sum_tree" in sd  # the caller's dict is left whole ...
        sd["_max_priority"][0].fill_(100.0)  # ... and shares nothing with the sampler
        assert float(loaded._max_priority[0]) == 5.0
    # a checkpoint written before the schema version: the largest priority is rebuilt raw
    old = dict(mine.state_dict(), _max_priority=(torch.tensor((5.0 + 1e-8) ** 0.7), torch.tensor(1)))
    old.pop("_schema_version", None)
    for sampler in (ref, loaded):
        sampler.load_state_dict(dict(old))
    assert float(loaded._max_priority[0]) == pytest.approx(float(ref._max_priority[0]), rel=1e-6)
    if since("prioritized_state_schema"):
        assert float(loaded._max_priority[0]) == pytest.approx(5.0, rel=1e-5)


def test_state_dict_of_another_capacity_is_refused():
    """torchrl takes trees of another capacity as they are (its sampler then holds 8 leaves for
    a capacity of 16); ours refuses them, naming both capacities, and keeps its own."""
    source = ours.PrioritizedSampler(8, alpha=0.7, beta=1.0)
    source.update_priority(torch.arange(4), torch.tensor([1.0, 5.0, 2.0, 3.0]))
    ref, mine = _pair(16, alpha=0.7, beta=1.0)
    ref.load_state_dict(source.state_dict())
    assert len(ref._sum_tree) == 8
    with pytest.raises(
        RuntimeError, match=r"^max capacity of loaded trees \(8\) differs from self._max_capacity \(16\)\.$"
    ):
        mine.load_state_dict(source.state_dict())
    assert len(mine._sum_tree) == 16 and mine._max_priority == (None, None)


def _refusal_to_spawn(sampler):
    process = mp.get_context("spawn").Process(target=print, args=(sampler,))
    with pytest.raises(RuntimeError) as info:
        process.start()
    return str(info.value).replace(str(type(sampler)), "<its class>")


def test_sharing_with_a_spawned_process_is_refused_in_torchrls_words():
    ref, mine = _pair(8, alpha=0.7, beta=1.0)
    refusal = _refusal_to_spawn(mine)
    assert refusal == _refusal_to_spawn(ref)
    assert refusal.startswith("Samplers of type <its class> cannot be shared between processes.")
    assert ("sync=False" in refusal) == since("multiprocess_errors_name_fix")


def test_dumps_carry_the_schema_version(tmp_path):
    import json

    ref, mine = _pair(8, alpha=0.7, beta=1.0)
    for sampler in (ref, mine):
        sampler.update_priority(torch.arange(4), torch.tensor([1.0, 5.0, 2.0, 3.0]))
    ref.dumps(tmp_path / "ref")
    mine.dumps(tmp_path / "mine")
    ref_meta = json.loads((tmp_path / "ref" / "sampler_metadata.json").read_text())
    mine_meta = json.loads((tmp_path / "mine" / "sampler_metadata.json").read_text())
    assert mine_meta == ref_meta
    assert ("_schema_version" in mine_meta) == since("prioritized_state_schema")


def test_device_arguments_follow_the_release():
    if not since("prioritized_device_argument"):
        with pytest.raises(TypeError, match="unexpected keyword argument 'device'"):
            ours.PrioritizedSampler(8, 1.0, 1.0, device="cpu")
        with pytest.raises(TypeError, match="unexpected keyword argument 'sampler_device'"):
            torchrl_compat.PrioritizedReplayBuffer(alpha=1.0, beta=1.0, sampler_device="cpu")
        return
    sampler = ours.PrioritizedSampler(8, 1.0, 1.0, device="cpu")
    assert sampler.device == torch.device("cpu")
    assert isinstance(sampler._sum_tree, ours.SumSegmentTreeFp32)
    with pytest.raises(TypeError, match="sampler_device cannot be passed when sampler is provided"):
        torchrl_compat.PrioritizedReplayBuffer(alpha=1.0, beta=1.0, sampler=sampler, sampler_device="cpu")
    rb = torchrl_compat.TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=1.0, sampler_device="cpu")
    assert rb.prioritized_sampler.device == torch.device("cpu")
    with pytest.raises(ValueError, match="only supports 1-D storages when sync=False, got storage.ndim=2"):
        torchrl_compat.PrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=torchrl_compat.LazyTensorStorage(8, ndim=2), sync=False)


@pytest.mark.parametrize("update", ["update_tensordict_priority", "update_priority"])
def test_sync_false_matches_torchrl(update):
    """sync=False: a uniform buffer sampler, a learner sampler that catches up with writes and
    takes the priorities, whichever method gives them."""
    if not since("prioritized_device_argument"):
        pytest.skip("torchrl 0.13+")
    buffers = [
        lib.TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=lib.LazyTensorStorage(30), batch_size=8, sync=False)
        for lib in (trl, torchrl_compat)
    ]
    assert type(buffers[1]._sampler).__name__ == "RandomSampler"
    for step in range(5):
        for rb in buffers:
            rb.extend(TensorDict({"obs": torch.arange(12.0) + step}, [12]))
        np.random.seed(step)
        ref = buffers[0].sample()
        np.random.seed(step)
        mine = buffers[1].sample()
        assert torch.equal(ref["index"], mine["index"])
        assert torch.equal(ref["priority_weight"], mine["priority_weight"])
        for rb, sample in zip(buffers, (ref, mine)):
            sample.set("td_error", sample["obs"] + 1)
            if update == "update_priority":
                rb.update_priority(sample["index"], sample["td_error"])
            else:
                rb.update_tensordict_priority(sample)
    np.testing.assert_array_equal(
        buffers[1].prioritized_sampler._sum_tree[np.arange(30)], buffers[0].prioritized_sampler._sum_tree[np.arange(30)]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_op_trees_on_cpu_agree_with_the_kernels(dtype):
    """The accelerator path (torch-op trees), run on CPU tensors, against replay's trees:
    the same stored values and, from the same generator, the same draws."""
    storage = _storage(300)
    kernels = ours.PrioritizedSampler(300, 0.6, 0.4, dtype=dtype)
    torch_ops = ours.PrioritizedSampler(300, 0.6, 0.4, dtype=dtype)
    torch_ops._use_cpu_kernels = False
    torch_ops._init()
    priority = torch.arange(300, dtype=torch.float64) % 13
    for sampler in (kernels, torch_ops):
        sampler.update_priority(torch.arange(300), priority)
        sampler.mark_update(torch.arange(290, 300))
    np.testing.assert_array_equal(
        np.asarray(torch_ops._sum_tree[torch.arange(300)]), kernels._sum_tree[np.arange(300)]
    )
    positive = set((priority[:290] > 0).nonzero().view(-1).tolist()) | set(range(290, 300))
    stored = torch.as_tensor(kernels._sum_tree[np.arange(300)])
    for sampler in (kernels, torch_ops):
        sampler._rng = torch.Generator().manual_seed(0)
        index, info = sampler.sample(storage, 2000)
        assert set(index.tolist()) <= positive
        expected = torch.pow(stored[index] / stored[stored > 0].min(), -0.4)
        torch.testing.assert_close(info["priority_weight"], expected, rtol=1e-6, atol=0)


@CUDA
def test_device_argument_puts_the_trees_on_cuda():
    sampler = ours.PrioritizedSampler(64, 0.7, 0.5, device="cuda")
    assert sampler.device.type == "cuda"
    sampler.update_priority(torch.arange(64), torch.arange(64.0))
    storage = _storage(64)  # a CPU storage: the trees stay where device= put them
    index, info = sampler.sample(storage, 32)
    assert index.device.type == "cuda" and bool((index > 0).all())
    assert sampler._sum_tree.device.type == "cuda"


# ---------------------------------------------------------------- torchrl 0.14 golden files

GOLDEN = __import__("pathlib").Path(__file__).parent / "data"


def _golden_draws(sampler):
    storage = LazyTensorStorage(24)
    storage.set(torch.arange(24), torch.arange(24))
    np.random.seed(0)
    index, info = sampler.sample(storage, 64)
    return {"index": index.tolist(), "priority_weight": info["priority_weight"].double().tolist()}


def _golden():
    import json

    return json.loads((GOLDEN / "golden_prioritized_sampler_014.json").read_text())


def test_golden_014_checkpoints_load():
    """dumps and state_dict written by torchrl 0.14.1 on its own compiled trees
    (tests/data/make_golden_prioritized_014.py; the state_dict pickles those trees): loaded by
    ours (in either release's mode), the same trees, maximum and draws."""
    golden = _golden()
    from_dumps = ours.PrioritizedSampler(24, alpha=0.7, beta=0.4, max_priority_within_buffer=True)
    from_dumps.loads(GOLDEN / "golden_prioritized_sampler_014")
    from_state = ours.PrioritizedSampler(24, alpha=0.7, beta=0.4, max_priority_within_buffer=True)
    from_state.load_state_dict(torch.load(GOLDEN / "golden_prioritized_sampler_014.pt", weights_only=False))
    leaves = np.fromfile(GOLDEN / "golden_prioritized_sampler_014" / "sumtree.memmap", dtype=np.float64)
    for sampler in (from_dumps, from_state):
        assert sampler.alpha == 0.6
        np.testing.assert_array_equal(sampler._sum_tree[np.arange(24)], leaves.astype(np.float32))
        assert [float(v) for v in sampler._max_priority] == golden["max_priority"]
        assert _golden_draws(sampler) == golden["draws_after_loads"]


def test_golden_014_is_what_we_write():
    """The same operations on ours write torchrl 0.14.1's files (0.14 mode), and the installed
    torchrl loads ours and draws what ours draws."""
    import filecmp
    import tempfile

    ours_sampler = ours.PrioritizedSampler(24, alpha=0.7, beta=0.4, max_priority_within_buffer=True)
    generator = torch.Generator().manual_seed(14)
    # float32 priorities, as the script hands torchrl's compiled fp32 trees (they refuse float64)
    priority = (torch.rand(20, generator=generator, dtype=torch.float64) * 5).to(torch.float32)
    ours_sampler.update_priority(torch.arange(20), priority)
    ours_sampler.update_priority(torch.tensor([3, 7]), torch.tensor([9.0, 0.0]))
    ours_sampler.mark_update(torch.arange(20, 24))
    warns = since("prioritized_alpha_change_warns") and not since("prioritized_alpha_retransforms")
    with pytest.warns(UserWarning, match="does not re-transform") if warns else contextlib.nullcontext():
        ours_sampler.alpha = 0.6  # 0.13 only warns: the stored values keep alpha 0.7
    with tempfile.TemporaryDirectory() as tmp:
        ours_sampler.dumps(tmp)
        if since("prioritized_alpha_retransforms"):
            for name in ("sampler_metadata.json", "sumtree.memmap", "mintree.memmap"):
                assert filecmp.cmp(f"{tmp}/{name}", GOLDEN / "golden_prioritized_sampler_014" / name, shallow=False), name
        theirs = trl.PrioritizedSampler(24, alpha=0.7, beta=0.4, max_priority_within_buffer=True)
        theirs.loads(tmp)
        loaded = ours.PrioritizedSampler(24, alpha=0.7, beta=0.4, max_priority_within_buffer=True)
        loaded.loads(tmp)
    assert _golden_draws(theirs) == _golden_draws(loaded) == _golden_draws(ours_sampler)
    if since("prioritized_alpha_retransforms"):
        assert _golden_draws(loaded) == _golden()["draws_after_loads"]
