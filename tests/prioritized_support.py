"""What the prioritized-sampler tests share: torchrl's sampler on ``replay``'s trees (torchrl's
compiled trees load with one torch release only) and the state two samplers are compared by."""
import sys

import numpy as np
import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl

import replay

# The module whose globals hold torchrl's tree classes (torchrl 0.14 splits samplers.py).
TRL_PRIORITIZED = sys.modules[trl.PrioritizedSampler._init.__module__]
TREE_NAMES = ("SumSegmentTreeFp32", "SumSegmentTreeFp64", "MinSegmentTreeFp32", "MinSegmentTreeFp64")


@pytest.fixture
def torchrl_trees(monkeypatch):
    """torchrl's samplers built on ``replay``'s trees, which follow torchrl's tree API."""
    for name in TREE_NAMES:
        monkeypatch.setattr(TRL_PRIORITIZED, name, getattr(replay, name))


def described(value):
    """A number as compared between the two samplers: its value, dtype (or type) and shape."""
    if value is None:
        return None
    return float(value), getattr(value, "dtype", type(value)), tuple(getattr(value, "shape", ()))


def sampler_state(sampler):
    """Every leaf of both trees, the largest priority and its index, and the default priority."""
    capacity = sampler._sum_tree.capacity
    leaves = [
        np.array([tree[i] for i in range(capacity)]).tolist() for tree in (sampler._sum_tree, sampler._min_tree)
    ]
    return leaves, tuple(described(x) for x in sampler._max_priority), described(sampler.default_priority)
