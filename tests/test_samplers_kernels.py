"""The CPU kernel paths of the samplers against their torch-op paths (``_use_cpu_kernels``)."""
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data.replay_buffers import LazyTensorStorage

import torchrl_compat.samplers as ours

pytestmark = pytest.mark.skipif(ours._REPLAY_TREES is None, reason="replay's trees not built")


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
    assert ours._is_replay_tree(fast._sum_tree)
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


def test_prioritized_kernel_errors_match_torch_path():
    storage = make_storage(10, filled=4)
    fast, slow = _pair(ours.PrioritizedSampler, 10, 1.0, 0.5, eps=0.0)
    for sampler in (fast, slow):
        with pytest.raises(RuntimeError, match="non-positive p_sum"):
            sampler.sample(storage, 4)
        with pytest.raises(IndexError, match="index 10 at position 1 is out of range for max_capacity=10"):
            sampler.update_priority(torch.tensor([1, 10]), torch.tensor([1.0, 1.0]))
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


def test_prioritized_global_seed_reproduces():
    storage = make_storage(100)
    sampler = ours.PrioritizedSampler(100, 1.0, 1.0)
    sampler.update_priority(torch.arange(100), torch.rand(100, generator=generator(0)))
    torch.manual_seed(3)
    a = sampler.sample(storage, 32)
    torch.manual_seed(3)
    b = sampler.sample(storage, 32)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1]["priority_weight"], b[1]["priority_weight"])
    c = sampler.sample(storage, 32)
    assert not torch.equal(a[0], c[0])
