"""A prioritized sampler over a storage on a device its trees do not follow (``meta`` here;
torchrl follows CUDA storages only, from 0.13 on, and none before) samples from the trees it
has, as torchrl's does: the same indices and weights for the same seeds."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import torchrl.data.replay_buffers.samplers as trl_samplers
from torchrl.data.replay_buffers import TensorStorage

import torchrl_compat.samplers as ours
from torchrl_compat._releases import since

from prioritized_support import torchrl_trees  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("torchrl_trees")


def requested_devices():
    return [None, "cpu"] if since("prioritized_device_argument") else [None]


@pytest.mark.parametrize("requested", requested_devices())
@pytest.mark.parametrize("kernels", [True, False], ids=["kernel trees", "torch-op trees"])
def test_sampling_a_meta_storage_matches_torchrl(requested, kernels):
    storage = TensorStorage(torch.zeros(8, device="meta"), device="meta")
    kwargs = {} if requested is None else {"device": requested}
    drawn = []
    for family in (ours, trl_samplers):
        sampler = family.PrioritizedSampler(8, 0.7, 0.5, **kwargs)
        if family is ours:
            sampler._use_cpu_kernels = kernels
        sampler.update_priority(torch.arange(8), torch.arange(1.0, 9.0))
        torch.manual_seed(0)
        np.random.seed(0)
        index, info = sampler.sample(storage, 6)
        if family is ours:
            assert sampler._device == torch.device("cpu")
        drawn.append((index, info["priority_weight"]))
    if kernels:
        assert torch.equal(drawn[0][0], drawn[1][0])
        torch.testing.assert_close(drawn[0][1], drawn[1][1])
    else:  # its own random stream: rows it can draw
        assert ((drawn[0][0] >= 0) & (drawn[0][0] < 8)).all() and (drawn[0][1] > 0).all()
