"""Which device the prioritized sampler's trees are asked to be on, as torchrl 0.13+'s own
code asks it (``_tree_device_from_storage`` / ``_maybe_init_from_storage``, called from its
sampler methods and from subclasses): compared with torchrl's answers for storages on the
CPU, on ``meta``, with ``device="auto"``, on a CUDA device (named only: no CUDA needed), and
without a storage."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import torchrl.data.replay_buffers.samplers as trl_samplers
from torchrl.data.replay_buffers import LazyTensorStorage, TensorStorage

import torchrl_compat.samplers as ours
from torchrl_compat._releases import since

from prioritized_support import sampler_state, torchrl_trees  # noqa: F401 - a fixture

pytestmark = [
    pytest.mark.usefixtures("torchrl_trees"),
    pytest.mark.skipif(not since("prioritized_device_argument"), reason="torchrl 0.13+ places trees by device"),
]


class NamedDevice:
    """A storage that only says where it is."""

    def __init__(self, device):
        self.device = device


STORAGES = {
    "none": lambda: None,
    "cpu": lambda: LazyTensorStorage(4),
    "auto": lambda: LazyTensorStorage(4, device="auto"),
    "meta": lambda: TensorStorage(torch.zeros(4, device="meta"), device="meta"),
    "cuda named": lambda: NamedDevice("cuda:1"),
    "cuda device": lambda: NamedDevice(torch.device("cuda", 0)),
    "no device": lambda: object(),
}


@pytest.mark.parametrize("requested", [None, "cpu", torch.device("cpu")], ids=["none", "str", "device"])
@pytest.mark.parametrize("storage", list(STORAGES))
def test_tree_device_asked_for_matches_torchrl(storage, requested):
    kwargs = {} if requested is None else {"device": requested}
    answers = []
    for family in (ours, trl_samplers):
        sampler = family.PrioritizedSampler(8, 0.7, 0.5, **kwargs)
        answers.append(sampler._tree_device_from_storage(STORAGES[storage]()))
    assert answers[0] == answers[1]
    assert answers[0] is None or isinstance(answers[0], torch.device)


@pytest.mark.parametrize("requested", [None, "cpu"])
@pytest.mark.parametrize("storage", ["none", "cpu", "auto", "meta", "no device"])
def test_trees_stay_and_keep_their_priorities_where_torchrl_would_not_move_them(storage, requested):
    # (the trees already on the device asked for are kept as they are, not rebuilt)
    sampler = ours.PrioritizedSampler(8, 0.7, 0.5, **({} if requested is None else {"device": requested}))
    sampler.update_priority(torch.tensor([1, 5]), torch.tensor([2.0, 0.5]))
    before = sampler._sum_tree, sampler_state(sampler)
    sampler._maybe_init_from_storage(STORAGES[storage]())
    assert sampler._sum_tree is before[0] and sampler.device == torch.device("cpu")
    assert sampler_state(sampler) == before[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_trees_rebuilt_for_the_torch_op_path_keep_their_priorities_and_dtype(dtype):
    # a sampler whose trees must be of the torch-op kind (the CUDA path's) rebuilds them on
    # the device asked for, with every priority and the largest one kept
    sampler = ours.PrioritizedSampler(8, 0.7, 0.5, dtype=dtype, device="cpu")
    sampler.update_priority(torch.tensor([1, 5, 6]), torch.tensor([2.0, 0.5, 7.0]))
    (sums, mins), _, _ = sampler_state(sampler)
    largest = tuple(float(x) for x in sampler._max_priority)
    sampler._use_cpu_kernels = False
    sampler._maybe_init_from_storage(LazyTensorStorage(8))
    assert type(sampler._sum_tree).__name__.startswith("Torch") and type(sampler._min_tree).__name__.startswith("Torch")
    assert sampler._sum_tree.device == sampler._min_tree.device == torch.device("cpu")
    assert sampler._sum_tree.dtype == sampler._min_tree.dtype == dtype
    (now_sums, now_mins), _, _ = sampler_state(sampler)
    np.testing.assert_allclose(now_sums, sums, rtol=1e-7)
    np.testing.assert_allclose(now_mins, mins, rtol=1e-7)
    assert tuple(float(x) for x in sampler._max_priority) == largest
    assert sampler._sum_tree.capacity == sampler._min_tree.capacity >= 8
