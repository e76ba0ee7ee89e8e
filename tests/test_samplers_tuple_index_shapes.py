"""``update_priority`` with a tuple of per-dimension indices whose members are not 1-D: 0-d
tensors (one position) and ``[N, 1]`` tensors. torchrl's sampler refuses a tuple; torchrl's
``ReplayBuffer.update_priority`` stacks it first (``torch.stack(index, -1)``) and hands the
result to the sampler. The reference is that: torchrl's own ``PrioritizedSampler`` (on
``replay``'s trees, which follow torchrl's tree API) given ``torch.stack(index, -1)``.
"""

import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl
from torchrl.data import LazyTensorStorage

import torchrl_compat.samplers as ours
from prioritized_support import torchrl_trees, sampler_state



def _storage_2d():
    storage = LazyTensorStorage(16, ndim=2)  # [4, 4]
    storage.set(torch.arange(4), torch.zeros(4, 4))
    return storage


TUPLES = {
    "0-d members": lambda: (torch.tensor(2), torch.tensor(3)),
    "[N, 1] members": lambda: (torch.tensor([[0], [2], [3]]), torch.tensor([[1], [3], [0]])),
}
PRIORITIES = {
    "0-d members": lambda: torch.tensor([1.5, 4.0]),
    "[N, 1] members": lambda: torch.tensor([[1.0], [4.0], [2.0]]),
}


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("case", sorted(TUPLES))
def test_tuple_index_is_the_update_of_the_stacked_index(case):
    ref, mine = trl.PrioritizedSampler(16, 0.7, 0.5), ours.PrioritizedSampler(16, 0.7, 0.5)
    ref.update_priority(torch.stack(TUPLES[case](), -1), PRIORITIES[case](), storage=_storage_2d())
    mine.update_priority(TUPLES[case](), PRIORITIES[case](), storage=_storage_2d())
    assert sampler_state(mine) == sampler_state(ref)
    assert any(leaf > 0 for leaf in sampler_state(mine)[0][0])
