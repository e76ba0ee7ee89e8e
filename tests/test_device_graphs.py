"""The prioritized steady state replayed as CUDA graphs (``torchrl_compat.samplers._cuda_graphs``):
the same trees, largest priority, draws and errors as the eager device functions, step by
step, the recorded calls free of host data and host reads. On CPU tensors each "replay" runs
the recorded call eagerly (everything but the capture); on CUDA they are real graphs."""
import pickle

import pytest
import torch

from device_sync_watch import SyncWatch
from torchrl_compat.samplers import _device
from torchrl_compat.samplers._cuda_graphs import GraphedPriorityOps
from torchrl_compat._torch_ops.sumtree import (
    TorchMinSegmentTreeFp32,
    TorchMinSegmentTreeFp64,
    TorchSumSegmentTreeFp32,
    TorchSumSegmentTreeFp64,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
TREES = [(TorchSumSegmentTreeFp32, TorchMinSegmentTreeFp32), (TorchSumSegmentTreeFp64, TorchMinSegmentTreeFp64)]
EPS, ALPHA, BETA = 1e-8, 0.7, 0.5


class Twins:
    """The same calls through the eager functions and through GraphedPriorityOps, on two
    pairs of trees that start equal."""

    def __init__(self, device, size=1000, trees=TREES[0]):
        sum_cls, min_cls = trees
        self.device = torch.device(device)
        self.eager = (sum_cls(size, device=device), min_cls(size, device=device))
        graphed = (sum_cls(size, device=device), min_cls(size, device=device))
        self.ops = GraphedPriorityOps(*graphed, eps=EPS, alpha=ALPHA, beta=BETA)
        self.highest = {"eager": _device.initial_max_priority(device), "graphs": _device.initial_max_priority(device)}

    def update(self, index, priority):
        self.highest["eager"] = _device.update_priority_nonblocking(
            *self.eager, index, priority, self.highest["eager"], eps=EPS, alpha=ALPHA)
        self.highest["graphs"] = self.ops.update(index, priority, self.highest["graphs"])

    def default_update(self, index):
        for side in ("eager", "graphs"):
            default = _device.default_priority(self.highest[side], EPS, ALPHA)
            if side == "eager":
                self.highest[side] = _device.update_priority_nonblocking(
                    *self.eager, index, default, self.highest[side], eps=EPS, alpha=ALPHA)
            else:
                self.highest[side] = self.ops.update(index, default, self.highest[side])

    def draw(self, num_valid, uniform):
        expected = _device.draw_nonblocking(*self.eager, num_valid, BETA, uniform)
        got = self.ops.draw(num_valid, uniform)
        for a, b in zip(got, expected):
            assert torch.equal(a, b)
        return got[0]

    def assert_same(self):
        for mine, theirs in zip((self.ops.sum_tree, self.ops.min_tree), self.eager):
            # the leaves (not the scratch slot past them, where masked writes race on CUDA)
            assert torch.equal(mine._leaves, theirs._leaves)
            for level in range(1, len(theirs._sizes)):
                assert torch.equal(mine._nodes[level], theirs._nodes[level])
        for a, b in zip(self.highest["graphs"], self.highest["eager"]):
            assert torch.equal(a.to(b.dtype), b) or (bool(torch.isnan(a)) and bool(torch.isnan(b)))

    def check_errors(self):
        self.eager[0].check_errors()
        self.ops.check_errors()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("trees", TREES, ids=["Fp32", "Fp64"])
def test_steady_loop_matches_the_eager_path(device, trees):
    """extend (default priority), sample, update, step after step: the first call of each
    shape records it, the later ones replay it; a fill that is not yet full, a second batch
    size, skipped (-1) and duplicated indices take their own recordings."""
    size, batch = 1000, 64
    twins = Twins(device, size, trees)
    gen = torch.Generator(device=device).manual_seed(0)
    cursor = filled = 0
    for step in range(12):
        count = batch if step != 7 else 2 * batch  # one step of another size
        written = (cursor + torch.arange(count, device=device)) % size
        cursor, filled = (cursor + count) % size, min(filled + count, size)
        twins.default_update(written)
        index = twins.draw(filled, torch.rand(count, generator=gen, device=device))
        priority = torch.rand(count, generator=gen, device=device) * 3
        if step % 3 == 2:  # a writer's skipped items and duplicated indices
            index = index.clone()
            index[::5] = -1
            index[1::5] = index[2::5]
        twins.update(index, priority.to(twins.eager[0].dtype if step % 2 else torch.float32))
        twins.assert_same()
    twins.check_errors()
    recorded = {key[0] for key in twins.ops._recorded}
    assert recorded == {"update", "draw"} and len(twins.ops._recorded) > 4


@pytest.mark.parametrize("device", DEVICES)
def test_bad_update_is_masked_and_raised_later_as_on_the_eager_path(device):
    twins = Twins(device, 100)
    index = torch.arange(32, device=device)
    for _ in range(2):  # recorded, then replayed
        twins.update(index, torch.rand(32, device=device) + 0.1)
    before = twins.ops.sum_tree._leaves.clone()
    bad = index.clone()
    bad[5] = 300
    twins.update(bad, torch.rand(32, device=device) + 0.1)
    twins.assert_same()
    assert torch.equal(twins.ops.sum_tree._leaves, before)  # the scratch slot past them took the masked writes
    messages = []
    for tree in (twins.eager[0], twins.ops.sum_tree):
        with pytest.raises(IndexError, match=r"index 300 at position 5 .*changed nothing") as error:
            tree.check_errors()
        messages.append(str(error.value))
    assert messages[0] == messages[1]
    priority = torch.rand(32, device=device)
    priority[3] = float("nan")
    twins.update(index, priority)
    twins.assert_same()
    if device == "cpu":  # the status is on the host at once: the next call raises
        with pytest.raises(ValueError, match="value nan at position 3"):
            twins.ops.update(index, torch.ones(32, device=device), twins.highest["graphs"])
    else:
        with pytest.raises(ValueError, match="value nan at position 3"):
            twins.ops.check_errors()
    with pytest.raises(ValueError, match="value nan at position 3"):
        twins.eager[0].check_errors()
    twins.check_errors()  # each error reported once


@pytest.mark.parametrize("device", DEVICES)
def test_refusals_at_the_call_are_the_eager_paths(device):
    ops = Twins(device, 100).ops
    highest = _device.initial_max_priority(device)
    with pytest.raises(ValueError, match=r"index must be 1-D here, got shape \(2, 2\)"):
        ops.update(torch.zeros(2, 2, dtype=torch.long, device=device), torch.ones(4, device=device), highest)
    with pytest.raises(TypeError, match="integer tensor"):
        ops.update(torch.zeros(2, device=device), torch.ones(2, device=device), highest)
    with pytest.raises(ValueError, match=r"shape \(3,\) and index of shape \(2,\)"):
        ops.update(torch.zeros(2, dtype=torch.long, device=device), torch.ones(3, device=device), highest)
    with pytest.raises(RuntimeError, match="non-positive p_sum: there is no item"):
        ops.draw(0, torch.rand(4, device=device))
    assert ops._recorded == {}


@pytest.mark.parametrize("device", DEVICES)
def test_reloaded_trees_drop_the_recordings(device):
    twins = Twins(device, 200)
    index = torch.arange(50, device=device)
    for _ in range(2):
        twins.update(index, torch.rand(50, device=device) + 0.5)
        twins.draw(200, torch.rand(16, device=device))
    for tree in (*twins.eager, twins.ops.sum_tree, twins.ops.min_tree):
        tree.__setstate__(pickle.loads(pickle.dumps(tree)).__reduce__()[2])
    for _ in range(2):
        twins.update(index, torch.rand(50, device=device) + 0.5)
        twins.draw(200, torch.rand(16, device=device))
        twins.assert_same()
    assert len(twins.ops._recorded) == 2  # recorded again, on the new tensors
    twins.check_errors()


def test_capture_needs_cuda():
    with pytest.raises(ValueError, match="capture=True needs trees on a CUDA device, got cpu"):
        GraphedPriorityOps(TorchSumSegmentTreeFp32(8), TorchMinSegmentTreeFp32(8), eps=EPS, alpha=ALPHA, beta=BETA, capture=True)
    with pytest.raises(ValueError, match="share a device and a capacity"):
        GraphedPriorityOps(TorchSumSegmentTreeFp32(8), TorchMinSegmentTreeFp32(20), eps=EPS, alpha=ALPHA, beta=BETA)


def test_recorded_calls_take_no_host_data_and_read_nothing_back():
    """What a CUDA graph records must neither read the device from the host (a sync, which
    capture refuses) nor make a tensor from host data (a copy from pageable memory, which a
    replay would not redo): watched on CPU tensors over the replays."""
    twins = Twins("cpu", 4096)
    index = torch.arange(256)
    twins.default_update(index)
    twins.update(index, torch.rand(256) + 0.1)
    twins.draw(4096, torch.rand(256))
    with SyncWatch() as watch:
        for _ in range(2):
            default = _device.default_priority(twins.highest["graphs"], EPS, ALPHA)
            twins.highest["graphs"] = twins.ops.update(index, default, twins.highest["graphs"])
            twins.ops.draw(4096, torch.rand(256))
            twins.highest["graphs"] = twins.ops.update(index, torch.rand(256) + 0.1, twins.highest["graphs"])
    assert watch.found == []
    assert "aten::sort" in watch.ops and "aten::index_put_" in watch.ops  # the watch saw the calls
    assert not {"aten::lift_fresh", "aten::lift_fresh_copy"} & set(watch.ops)
    with SyncWatch() as watch:  # ... and would have seen a tensor made from host data
        torch.zeros(()).new_tensor(1.0)
    assert "aten::lift_fresh" in watch.ops
    twins.ops.check_errors()


@needs_cuda
def test_replays_are_cuda_graphs_and_do_not_sync():
    twins = Twins("cuda", 1 << 14)
    index = torch.arange(512, device="cuda")
    for _ in range(2):
        twins.update(index, torch.rand(512, device="cuda") + 0.1)
        twins.draw(1 << 14, torch.rand(512, device="cuda"))
    assert twins.ops.capture and all(isinstance(r.replay.__self__, torch.cuda.CUDAGraph) for r in twins.ops._recorded.values())
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(4):
            highest = twins.ops.update(index, torch.rand(512, device="cuda") + 0.1, twins.highest["graphs"])
            twins.highest["graphs"] = highest
            twins.ops.draw(1 << 14, torch.rand(512, device="cuda"))
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    twins.ops.check_errors()
