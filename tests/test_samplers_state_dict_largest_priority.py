"""The largest priority that ``load_state_dict`` leaves in a ``max_priority_within_buffer``
sampler: a state dict of the current schema (torchrl 0.14's ``_schema_version`` 1, or
torchrl 0.11's, which has none and never rebuilds) keeps the largest priority it holds as it
is; it is not rebuilt from the trees (only a 0.14 state dict without a schema version is).
The state dict here comes from a sampler that tracks the largest priority since it was made
(not within the buffer), whose largest item was then overwritten with a lower priority: its
largest priority is not the trees' largest.
Compared with torchrl's own ``PrioritizedSampler`` on ``replay``'s trees (which follow
torchrl's tree API), loading the same state dict.
"""
import copy

import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl

import torchrl_compat.samplers as ours
from prioritized_support import torchrl_trees



def _largest(sampler):
    return tuple(None if x is None else float(x) for x in sampler._max_priority)


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("writer", ["torchrl", "ours"])
@pytest.mark.parametrize("alpha", [0.7, 0.3, 1.3])
def test_loaded_state_dict_keeps_the_tracked_largest_priority(writer, alpha):
    make = trl.PrioritizedSampler if writer == "torchrl" else ours.PrioritizedSampler
    source = make(8, alpha, 0.5, eps=1e-3)
    source.update_priority(torch.tensor([1, 3, 5]), torch.tensor([1.3, 9.1, 2.7]))
    source.update_priority(torch.tensor([3]), torch.tensor([0.5]))  # the trees' largest is now item 5's
    state = source.state_dict()

    ref = trl.PrioritizedSampler(8, 0.1, 0.1, max_priority_within_buffer=True)
    mine = ours.PrioritizedSampler(8, 0.1, 0.1, max_priority_within_buffer=True)
    for sampler in (ref, mine):
        sampler.load_state_dict(copy.deepcopy(state))
    assert _largest(mine) == _largest(ref)
    assert _largest(mine) == (float(torch.tensor(9.1)), 3.0)  # what was tracked, to the bit
    assert float(mine.default_priority) == float(ref.default_priority)
