"""``extend`` over the item holding the largest priority (``max_priority_within_buffer``), for
tensor indices of more than two dimensions: torchrl's sampler compares each entry with the
largest priority's index, reduces the last dimension with ``all`` and forgets the largest
priority when any of what is left is true. Compared with torchrl's own ``PrioritizedSampler``
on ``replay``'s trees (which follow torchrl's tree API).
"""

import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl

import torchrl_compat.samplers as ours
from prioritized_support import torchrl_trees, sampler_state



INDICES = {
    # the largest priority is item 3
    "3-d, a last-dim row all equal to it": torch.tensor([[[3, 3], [1, 3]]]),
    "3-d, equal entries only across the middle dim": torch.tensor([[[3, 1], [3, 0]]]),
    "3-d, none equal": torch.tensor([[[0, 1], [2, 4]]]),
    "4-d, a last-dim row all equal to it": torch.tensor([[[[1, 3], [3, 3]]]]),
}


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("case", sorted(INDICES))
def test_extend_with_a_many_dim_index_forgets_the_largest_priority_as_torchrl(case):
    ref = trl.PrioritizedSampler(8, 0.7, 0.5, max_priority_within_buffer=True)
    mine = ours.PrioritizedSampler(8, 0.7, 0.5, max_priority_within_buffer=True)
    for sampler in (ref, mine):
        sampler.update_priority(torch.tensor([1, 3, 5]), torch.tensor([1.0, 9.0, 2.0]))
        sampler.extend(INDICES[case])
    assert sampler_state(mine) == sampler_state(ref)
    # a model of torchrl's check: any last-dim row all equal to the index 3
    forgotten = bool((INDICES[case] == 3).all(-1).any())
    assert (mine._max_priority == (None, None)) == forgotten
