"""The buffers' steady state on the accelerator path, end to end: a prioritized buffer
(extend, sample, update_tensordict_priority) and a slice buffer (extend, sample) on a tensor
storage make no host synchronisation (proved on CPU tensors with the torch ops forced, by
watching every torch call, and on CUDA under ``set_sync_debug_mode("error")``), and give
what ``replay``'s kernels give from the same draws."""
import numpy as np
import pytest
import torch
from tensordict import TensorDict

import replay
from device_sync_watch import SyncWatch
from torchrl_compat import (
    LazyTensorStorage,
    PrioritizedSampler,
    ReplayBuffer,
    SliceSampler,
    TensorDictPrioritizedReplayBuffer,
)
from torchrl_compat._torch_ops import slices as torch_slices

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
ALPHA, BETA = 0.7, 0.5


def prioritized_buffer(device="cpu", *, torch_ops=True, size=200):
    rb = TensorDictPrioritizedReplayBuffer(
        alpha=ALPHA, beta=BETA, storage=LazyTensorStorage(size, device=device), batch_size=32,
        priority_key="td_error",
    )
    if torch_ops:
        rb._sampler._use_cpu_kernels = False  # the accelerator path, on CPU tensors here
        rb._sampler._init()
    return rb


def prioritized_batch(device="cpu"):
    return TensorDict({"obs": torch.randn(48, 3), "td_error": torch.rand(48)}, [48], device=device)


def prioritized_step(rb, data=None):
    """One loop step (extend, sample, update); returns what it drew."""
    rb.extend(prioritized_batch() if data is None else data)
    sample = rb.sample()
    drawn = sample["index"].clone(), sample["priority_weight"].clone()
    sample["td_error"] = torch.rand(32, device=data.device if data is not None else "cpu") + 0.1
    rb.update_tensordict_priority(sample)
    return drawn


def leaves(sampler):
    tree = sampler._sum_tree
    if isinstance(tree, (replay.SumSegmentTreeFp32, replay.SumSegmentTreeFp64)):
        return torch.as_tensor(tree.values())
    return tree.leaves.cpu()


def test_prioritized_loop_makes_no_host_sync():
    torch.manual_seed(0)
    np.random.seed(0)
    rb = prioritized_buffer()
    for _ in range(2):
        prioritized_step(rb)  # warm-up: the storage is built at the first write
    with SyncWatch() as watch:
        for _ in range(6):  # 48 rows a step into 200: wraps around
            prioritized_step(rb)
    assert watch.found == []
    assert "aten::sort" in watch.ops and "aten::cumsum" in watch.ops  # the device path ran
    rb._sampler._sum_tree.check_errors()


def test_prioritized_loop_equals_the_kernels():
    """The same seeds through replay's kernels and the torch-op trees: the same indices,
    weights (to the bit), leaves and largest priority at every step, wrap-around included."""
    runs = {}
    for torch_ops in (False, True):
        torch.manual_seed(1)
        np.random.seed(1)
        rb = prioritized_buffer(torch_ops=torch_ops)
        steps = []
        for _ in range(10):
            index, weight = prioritized_step(rb)
            steps.append((index, weight, leaves(rb._sampler)[:200].clone()))
        runs[torch_ops] = steps, rb._sampler._max_priority, rb._sampler.default_priority
    (kernel_steps, kernel_max, kernel_default), (torch_steps, torch_max, torch_default) = runs[False], runs[True]
    assert type(prioritized_buffer()._sampler._sum_tree).__name__ == "TorchSumSegmentTreeFp32"
    for (ki, kw, kl), (ti, tw, tl) in zip(kernel_steps, torch_steps):
        assert torch.equal(ki, ti)
        assert kw.dtype == tw.dtype and torch.equal(kw, tw)
        assert torch.equal(kl, tl.to(kl.dtype))
    assert float(kernel_max[0]) == float(torch_max[0]) and int(kernel_max[1]) == int(torch_max[1])
    assert float(kernel_default) == float(torch_default)


@pytest.mark.parametrize("torch_ops", [False, True], ids=["kernels", "torch-ops"])
def test_bad_update_raises_at_the_call_and_changes_nothing(torch_ops):
    """On CPU tensors the device path raises what the checked path raises, at the same call,
    and keeps the trees and the largest priority; a negative priority is refused even where
    alpha = 2 would store a positive value."""
    sampler = PrioritizedSampler(16, 2.0, BETA)
    sampler._use_cpu_kernels = not torch_ops
    sampler._init()
    sampler.update_priority(torch.arange(16), torch.rand(16) + 0.5)
    before = leaves(sampler).clone(), float(sampler._max_priority[0])
    with pytest.raises(ValueError, match=r"priority=-1.0 at position 1"):
        sampler.update_priority(torch.tensor([2, 3]), torch.tensor([1.0, -1.0]))
    with pytest.raises(IndexError, match="index 40 at position 0 is out of range"):
        sampler.update_priority(torch.tensor([40, 3]), torch.tensor([1.0, 9.0]))
    assert torch.equal(leaves(sampler), before[0]) and float(sampler._max_priority[0]) == before[1]
    sampler.update_priority(torch.tensor([3]), torch.tensor([7.0]))  # the sampler goes on
    assert float(sampler._max_priority[0]) == 7.0


def test_empty_trees_refuse_a_draw_before_taking_random_numbers():
    storage = LazyTensorStorage(8)
    storage.set(torch.arange(4), torch.zeros(4))
    sampler = PrioritizedSampler(8, ALPHA, BETA)
    sampler._use_cpu_kernels = False
    sampler._init()
    state = np.random.get_state()[1].copy()
    with pytest.raises(RuntimeError, match="non-positive p_sum"):
        sampler.sample(storage, 4)
    assert np.array_equal(np.random.get_state()[1], state)


def episodes(steps, device="cpu"):
    done = torch.zeros(steps, 1, dtype=torch.bool)
    done[torch.randperm(steps)[: steps // 12]] = True
    return TensorDict(
        {"obs": torch.arange(steps), "next": {"done": done, "truncated": done.clone()}}, [steps], device=device
    )


def slice_buffer(device="cpu", **kwargs):
    sampler = SliceSampler(slice_len=8, end_key=("next", "done"), **kwargs)
    sampler._use_cpu_kernels = False
    return ReplayBuffer(storage=LazyTensorStorage(300, device=device), sampler=sampler, batch_size=64)


@pytest.mark.parametrize("truncated_key", [None, ("next", "truncated")])
def test_slice_loop_makes_no_host_sync(truncated_key):
    torch.manual_seed(2)
    rb = slice_buffer(truncated_key=truncated_key)
    for _ in range(2):
        rb.extend(episodes(70))
        rb.sample()
    with SyncWatch() as watch:
        for _ in range(6):  # 70 rows a step into 300: wraps around
            rb.extend(episodes(70))
            rb.sample()
    assert watch.found == []
    assert "aten::searchsorted" in watch.ops  # the device path ran
    assert "_device_checks" in rb._sampler.__dict__


def test_slice_draws_are_the_listed_trajectories_slices():
    """On CPU tensors: each slice lies in the trajectory listed by find_start_stop_traj that
    torchrl's draws pick (randint over the long enough ones, then a start), and the truncation
    flags mark each slice's last step."""
    torch.manual_seed(3)
    rb = slice_buffer(truncated_key=("next", "truncated"))
    for _ in range(6):
        rb.extend(episodes(70))
    storage = rb._storage
    end = storage[:][("next", "done")].squeeze(-1)
    start_idx, _, lengths = torch_slices.find_start_stop_traj(
        end=end, at_capacity=storage._is_full, cursor=storage._last_cursor
    )
    kept = lengths >= 8
    starts, kept_lengths = start_idx[kept][:, 0], lengths[kept]
    state = torch.random.get_rng_state()
    sample, info = rb.sampler.sample(storage, 64)
    torch.random.set_rng_state(state)
    rank, start_uniform = torch.randint(int(kept.sum()), (8,)), torch.rand(8)
    room = kept_lengths[rank] - 8 + 1
    offset = torch.minimum((start_uniform * room).floor().long(), room - 1)
    expected = ((starts[rank] + offset).unsqueeze(1) + torch.arange(8)).remainder(300).reshape(-1)
    assert torch.equal(sample[0], expected)
    truncated = info[("next", "truncated")].reshape(8, 8)
    assert truncated[:, -1].all() and not truncated[:, :-1].any()  # no episode ends inside a slice


@needs_cuda
def test_prioritized_loop_has_no_sync_on_cuda():
    rb = prioritized_buffer("cuda", torch_ops=False)
    batches = [prioritized_batch("cuda") for _ in range(8)]  # made on the host, copied first
    for data in batches[:2]:
        prioritized_step(rb, data)
    assert rb._sampler._sum_tree.device.type == "cuda"
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for data in batches[2:]:
            index, weight = prioritized_step(rb, data)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    rb._sampler._sum_tree.check_errors()
    assert index.device.type == "cuda" and bool(torch.isfinite(weight).all())


@needs_cuda
def test_slice_loop_has_no_sync_on_cuda():
    rb = slice_buffer("cuda")
    rb._sampler._use_cpu_kernels = True  # chosen by the storage's device, not the flag
    batches = [episodes(70, "cuda") for _ in range(8)]  # made on the host, copied first
    for data in batches[:2]:
        rb.extend(data)
        rb.sample()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for data in batches[2:]:
            rb.extend(data)
            sample = rb.sample()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    rb._sampler._device_checks.wait()
    assert sample["obs"].device.type == "cuda" and sample.shape == (64,)
