"""The accelerator path's steady state: trees updated in O(k log N), prioritized draws and
slices taken on the device, and no host synchronisation anywhere in the loop (proved on CPU
tensors by watching every torch call, and on CUDA under ``set_sync_debug_mode("error")``).
Results are compared with ``replay``'s kernels and with the checked torch-op path."""
import numpy as np
import pytest
import torch

import replay
from device_sync_watch import SyncWatch
from torchrl_compat.samplers import _device
from torchrl_compat._torch_ops import slices as torch_slices
from torchrl_compat._releases import since
from torchrl_compat._torch_ops.sumtree import (
    TorchMinSegmentTreeFp32,
    TorchMinSegmentTreeFp64,
    TorchSumSegmentTreeFp32,
    TorchSumSegmentTreeFp64,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
PAIRS = [
    (TorchSumSegmentTreeFp32, TorchMinSegmentTreeFp32, replay.SumSegmentTreeFp32),
    (TorchSumSegmentTreeFp64, TorchMinSegmentTreeFp64, replay.SumSegmentTreeFp64),
]
EPS, ALPHA, BETA = 1e-8, 0.7, 0.5


def steady_loop(device, *, steps=3, size=1 << 12, batch=256, seq_length=8):
    """extend (default priority), sample, update, and a slice draw, through the device path."""
    gen = torch.Generator(device=device).manual_seed(0)
    sum_tree, min_tree = TorchSumSegmentTreeFp32(size, device=device), TorchMinSegmentTreeFp32(size, device=device)
    max_priority = _device.initial_max_priority(device)
    end = torch.rand(size, generator=gen, device=device) < 0.02
    cursor = 0
    outputs = []
    for _ in range(steps):
        written = (cursor + torch.arange(batch, device=device)) % size
        cursor = (cursor + batch) % size
        default = _device.default_priority(max_priority, EPS, ALPHA)
        max_priority = _device.update_priority_nonblocking(
            sum_tree, min_tree, written, default, max_priority, eps=EPS, alpha=ALPHA)
        uniform = torch.rand(batch, generator=gen, device=device)
        index, weight = _device.draw_nonblocking(sum_tree, min_tree, size, BETA, uniform)
        priority = torch.rand(batch, generator=gen, device=device) + 0.1
        max_priority = _device.update_priority_nonblocking(
            sum_tree, min_tree, index, priority, max_priority, eps=EPS, alpha=ALPHA)
        flags = torch_slices.end_flags(end=end, at_capacity=True, cursor=(cursor - 1) % size)
        draws = torch.rand(2, batch // seq_length, generator=gen, device=device)
        slices, _, found = torch_slices.sample_slices_from_ends(flags, seq_length, draws[0], draws[1])
        outputs.append((index, weight, slices, found))
    return sum_tree, min_tree, max_priority, outputs


def test_steady_loop_makes_no_host_sync():
    steady_loop("cpu", steps=1)  # warm-up: first calls may build caches
    with SyncWatch() as watch:
        sum_tree, *_ = steady_loop("cpu")
    assert watch.found == []
    assert "aten::index_put_" in watch.ops and "aten::sort" in watch.ops  # the watch saw the loop
    sum_tree.check_errors()  # and the loop was valid


def test_the_watch_catches_syncs():
    tree = TorchSumSegmentTreeFp32(64)
    with SyncWatch() as watch:
        tree[torch.tensor([1, 2])] = torch.tensor([1.0, 2.0])  # the checked API reads its checks
        tree.query(0, 64)
    assert any(found.startswith(("aten::_local_scalar_dense", "Tensor.__bool__")) for found in watch.found)


@needs_cuda
def test_steady_loop_has_no_sync_on_cuda():
    steady_loop("cuda", steps=1)
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sum_tree, min_tree, max_priority, outputs = steady_loop("cuda", steps=4)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    sum_tree.check_errors()
    cpu = steady_loop("cpu", steps=4)
    # the same draws from the same leaves (CUDA's generator differs: compare trees instead)
    leaves = sum_tree.leaves.cpu()
    assert torch.isfinite(leaves).all() and (leaves >= 0).all() and cpu[0].leaves.shape == leaves.shape


@pytest.mark.parametrize("size,batch", [(1 << 10, 16), (1 << 20, 16), (1 << 20, 256)])
def test_update_reads_o_k_log_n_nodes(size, batch):
    """The elements every op of an update produces, counted: O(k log N), never O(N)."""
    tree = TorchSumSegmentTreeFp32(size)
    index = torch.randint(0, size, (batch,))
    value = torch.rand(batch)
    tree.update_nonblocking(index, value)  # warm-up

    class Count(torch.utils._python_dispatch.TorchDispatchMode):
        produced = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.is_view:
                return out  # a view of the levels moves no data
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and not any(t is a for a in args):
                    Count.produced += t.numel()
                elif isinstance(t, torch.Tensor):  # in place: what was written
                    Count.produced += sum(a.numel() for a in args[1:] if isinstance(a, torch.Tensor))
            return out

    with Count():
        tree.update_nonblocking(index, value)
    levels = len(tree._sizes)
    assert Count.produced <= 64 * batch * levels
    if size >= 1 << 20:
        assert Count.produced < size // 16  # not a pass over the leaves


def test_sums_do_not_drift():
    """10^7 random updates, in batches: the root stays the float64 sum of the leaves."""
    size, batch = 1 << 20, 1 << 14
    gen = torch.Generator().manual_seed(0)
    tree = TorchSumSegmentTreeFp32(size)
    for step in range(-(-10**7 // batch)):
        index = torch.randint(0, size, (batch,), generator=gen)
        # magnitudes that change over time: the hard case for running sums
        value = torch.rand(batch, generator=gen) * (10.0 ** (step % 7 - 3))
        tree.update_nonblocking(index, value)
    tree.check_errors()
    exact = tree.leaves.double().sum().item()
    assert abs(float(tree._root()) - exact) <= 1e-9 * exact


@pytest.mark.parametrize("sum_cls,min_cls", [p[:2] for p in PAIRS], ids=["Fp32", "Fp64"])
def test_nonblocking_update_matches_checked_update(sum_cls, min_cls):
    rng = np.random.default_rng(1)
    for size in (1, 5, 16, 17, 300, 5000):
        for cls in (sum_cls, min_cls):
            ours, checked = cls(size), cls(size)
            for _ in range(6):
                n = int(rng.integers(0, 3 * size + 2))
                index = torch.as_tensor(rng.integers(0, ours.capacity, n))  # duplicates too
                value = torch.as_tensor(rng.uniform(0, 4, n))
                ours.update_nonblocking(index, value)
                checked[index] = value
                assert torch.equal(ours.leaves, checked.leaves)
                assert torch.equal(ours._leaves, checked._leaves)
                for left, right in ((0, size), (0, ours.capacity), (1, max(size - 1, 1))):
                    assert ours.query(left, right) == pytest.approx(checked.query(left, right), rel=1e-12)
            ours.check_errors()
            # every ancestor equals the reduction of its children
            for level in range(1, len(ours._sizes)):
                assert torch.equal(ours._nodes[level][: ours._sizes[level]], ours._reduce(ours._rows(level - 1)))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_update_changes_nothing_and_raises_later(device):
    tree = TorchSumSegmentTreeFp32(10, device=device)
    tree.update_nonblocking(torch.arange(10, device=device), torch.ones(10, device=device))
    before = tree._leaves.clone()
    tree.update_nonblocking(torch.tensor([1, 2, 40], device=device), torch.full((3,), 5.0, device=device))
    assert torch.equal(tree._leaves, before) and float(tree._root()) == 10.0
    with pytest.raises(IndexError, match=r"index 40 at position 2 is out of range for size 10.*changed nothing"):
        tree.check_errors()
    tree.check_errors()  # reported once: the queue was cleared
    tree.update_nonblocking(torch.tensor([3], device=device), torch.tensor([float("nan")], device=device))
    with pytest.raises(ValueError, match="value nan at position 0"):
        tree.check_errors()
    tree.update_nonblocking(torch.tensor([3], device=device), torch.tensor([-1.0], device=device))
    if device == "cpu":  # the status is on the host at once: the next call raises
        with pytest.raises(ValueError, match="value -1.0 at position 0 is invalid"):
            tree.update_nonblocking(torch.tensor([3], device=device), torch.tensor([2.0], device=device))
    else:
        with pytest.raises(ValueError, match="value -1.0 at position 0 is invalid"):
            tree.check_errors()
    assert torch.equal(tree._leaves, before)
    with pytest.raises(TypeError, match="integer tensor"):
        tree.update_nonblocking(torch.tensor([0.5], device=device), torch.ones(1, device=device))
    with pytest.raises(ValueError, match=r"shape \(2,\) and index of shape \(3,\)"):
        tree.update_nonblocking(torch.arange(3, device=device), torch.ones(2, device=device))


@pytest.mark.parametrize("sum_cls,min_cls,replay_cls", PAIRS, ids=["Fp32", "Fp64"])
def test_draws_match_replay(sum_cls, min_cls, replay_cls):
    """The same masses give the same leaves as replay's fused kernel, for every num_valid
    (storage shorter, equal to or longer than the sampler), zero leaves included."""
    rng = np.random.default_rng(2)
    for size in (1, 3, 16, 40, 700):
        ours, theirs = sum_cls(size), replay_cls(size)
        values = rng.uniform(0, 3, size) * (rng.random(size) < 0.6)
        values[rng.integers(size)] = 1.0
        index = torch.arange(size)
        ours.update_nonblocking(index, torch.as_tensor(values))
        theirs[index] = torch.as_tensor(values)
        uniform = torch.as_tensor(np.concatenate([[0.0, 1 - 1e-16], rng.random(200)]))
        for num_valid in sorted({1, max(size // 2, 1), size, ours.capacity - 1, ours.capacity, 5 * size}):
            try:
                expected = theirs.sample_prioritized(num_valid, uniform)
            except RuntimeError:
                ours.draw_nonblocking(uniform, num_valid)
                with pytest.raises(RuntimeError, match="non-positive p_sum"):
                    ours.check_errors()
                continue
            got, priority, _ = ours.draw_nonblocking(uniform, num_valid)
            assert torch.equal(got, torch.as_tensor(expected[0])), (size, num_valid)
            assert torch.equal(priority, torch.as_tensor(expected[1]))
        ours.check_errors()


def test_sampler_update_and_weights_match_the_cpu_sampler():
    """The device update (skipped -1 indices, duplicates, largest priority) and draw against
    torchrl_compat's PrioritizedSampler on its CPU kernels, given the same draws."""
    from torchrl_compat import PrioritizedSampler

    size = 500
    sampler = PrioritizedSampler(size, ALPHA, BETA, eps=EPS)
    sum_tree, min_tree = TorchSumSegmentTreeFp32(size), TorchMinSegmentTreeFp32(size)
    max_priority = _device.initial_max_priority("cpu")
    rng = np.random.default_rng(3)
    first = torch.arange(size)
    raw = since("prioritized_raw_default_priority")
    sampler.mark_update(first)
    max_priority = _device.update_priority_nonblocking(
        sum_tree, min_tree, first, _device.default_priority(max_priority, EPS, ALPHA, raw=raw),
        max_priority, eps=EPS, alpha=ALPHA)
    for _ in range(10):
        index = torch.as_tensor(rng.integers(-1, size, 64))
        priority = torch.as_tensor(rng.uniform(0.01, 5, 64), dtype=torch.float32)
        sampler.update_priority(index, priority)
        max_priority = _device.update_priority_nonblocking(
            sum_tree, min_tree, index, priority, max_priority, eps=EPS, alpha=ALPHA)
        assert torch.equal(sum_tree.leaves, torch.as_tensor(sampler._sum_tree.values()))
        assert torch.equal(min_tree.leaves, torch.as_tensor(sampler._min_tree.values()))
        assert float(max_priority[0]) == float(sampler._max_priority[0])
        assert int(max_priority[1]) == int(sampler._max_priority[1])
        uniform = torch.rand(128, dtype=torch.float64)
        p_min = sampler._min_tree.query(0, size)
        expected, _, _ = sampler._sum_tree.sample_prioritized(size, uniform)
        got, weight = _device.draw_nonblocking(sum_tree, min_tree, size, BETA, uniform)
        assert torch.equal(got, torch.as_tensor(expected))
        expected_weight = torch.pow(torch.as_tensor(sampler._sum_tree[expected.numpy()]) / p_min, -BETA)
        torch.testing.assert_close(weight, expected_weight.to(weight.dtype), rtol=1e-6, atol=0)
    assert float(_device.default_priority(max_priority, EPS, ALPHA, raw=raw)) == pytest.approx(float(sampler.default_priority))
    sum_tree.check_errors()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("full", [True, False])
def test_slices_from_ends_match_the_listed_trajectories(device, full):
    """Given the same trajectory ranks and start draws, the slices of the bounds listed by
    find_start_stop_traj (kept when long enough, in their order), built as SliceSampler
    builds them."""
    rng = np.random.default_rng(4)
    for steps, rate, seq_length in [(50, 0.1, 3), (200, 0.05, 8), (1000, 0.002, 64), (7, 0.0, 2), (30, 0.9, 1)]:
        end = torch.as_tensor(rng.random(steps) < rate, device=device)
        cursor = int(rng.integers(steps)) if full else None
        flags = torch_slices.end_flags(end=end, at_capacity=full, cursor=cursor)
        start_idx, _, lengths = torch_slices.find_start_stop_traj(end=end, at_capacity=full, cursor=cursor)
        num_slices = 40
        traj_uniform = torch.as_tensor(rng.random(num_slices), device=device)
        start_uniform = torch.rand(num_slices, device=device)
        index, rank, found = torch_slices.sample_slices_from_ends(flags, seq_length, traj_uniform, start_uniform)
        kept = lengths >= seq_length
        assert bool(found) == bool(kept.any())
        if not kept.any():
            continue
        starts, kept_lengths = start_idx[kept][:, 0], lengths[kept]
        assert torch.equal(rank, (traj_uniform * kept.sum()).floor().long().clamp_max(kept.sum() - 1))
        room = kept_lengths[rank] - seq_length + 1
        offset = torch.minimum((start_uniform * room).floor().long(), room - 1)
        expected = torch_slices.slice_indices((starts[rank] + offset).unsqueeze(1), seq_length, steps)
        assert torch.equal(index, expected[:, 0]), (steps, seq_length)
