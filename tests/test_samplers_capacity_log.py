"""The line the prioritized sampler logs (once) when its storage is longer than it.

The sampler's trees hold ``capacity`` leaves, the smallest power of two above ``max_capacity``
(torchrl's segment_tree.h: ``for (capacity_ = 1; capacity_ <= size; capacity_ <<= 1);``).
The logged line must give that number of leaves and the last index that gets a priority
(``capacity - 1``), the numbers the sampler then goes by: that index takes a priority, the
next one raises IndexError.
"""
import logging

import pytest
import torch
from torchrl.data import LazyTensorStorage

import torchrl_compat.samplers as ours


def _tree_leaves(size):
    """torchrl's segment tree capacity for ``size`` items (a plain model of it)."""
    capacity = 1
    while capacity <= size:
        capacity *= 2
    return capacity


def _logged_lines(caplog, action):
    # torchrl's logger does not propagate to the root's handlers: caplog listens on it
    torchrl_logger = logging.getLogger("torchrl")
    torchrl_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="torchrl"):
            action()
    finally:
        torchrl_logger.removeHandler(caplog.handler)
    return [r.getMessage() for r in caplog.records if r.name == "torchrl" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("max_capacity, length", [(5, 8), (7, 9), (8, 17), (100, 130)])
def test_logged_line_names_the_last_index_the_trees_hold(caplog, max_capacity, length):
    leaves = _tree_leaves(max_capacity)
    storage = LazyTensorStorage(length)
    storage.set(torch.arange(length), torch.arange(float(length)))
    sampler = ours.PrioritizedSampler(max_capacity, 0.7, 0.5)
    sampler.update_priority(torch.arange(min(length, leaves)), 1.0)

    lines = _logged_lines(caplog, lambda: [sampler.sample(storage, 4) for _ in range(2)])

    assert len(lines) == 1
    line = lines[0]
    assert f"PrioritizedSampler(max_capacity={max_capacity}) samples a storage of {length} items" in line
    assert f"its priority trees hold {leaves} leaves" in line
    assert f"items up to {leaves - 1} get priorities and can be drawn" in line
    # ... which is what the sampler does
    sampler.update_priority(torch.tensor([leaves - 1]), 2.0)
    with pytest.raises(IndexError):
        sampler.update_priority(torch.tensor([leaves]), 2.0)
