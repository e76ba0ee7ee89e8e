"""A largest priority whose index is a tuple of per-dimension indices (what a state dict may
carry: ``load_state_dict`` takes ``_max_priority`` as it is, in torchrl as here), then
``extend`` with a tuple index (``max_priority_within_buffer``): torchrl's sampler compares
the tuples member by member and forgets the largest priority only when every member matches.
The reference is torchrl's own ``PrioritizedSampler`` on ``replay``'s trees (which follow
torchrl's tree API), given the same state dict and the same writes.
"""
import copy

import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl

import torchrl_compat.samplers as ours
from prioritized_support import torchrl_trees



WRITES = {
    "both members match": (torch.tensor([0, 1]), torch.tensor([5, 2])),
    "first member only": (torch.tensor([1]), torch.tensor([3])),
    "second member only": (torch.tensor([3]), torch.tensor([2])),
    "neither": (torch.tensor([0]), torch.tensor([0])),
    "ints, both match": (1, 2),
    "ints, one matches": (1, 0),
}


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("case", sorted(WRITES))
def test_tuple_index_of_the_largest_priority_is_compared_as_torchrl(case):
    source = trl.PrioritizedSampler(8, 0.7, 0.5)
    source.update_priority(torch.tensor([1, 3, 6]), torch.tensor([1.0, 9.0, 2.0]))
    state = source.state_dict()
    state["_max_priority"] = (torch.tensor(9.0), (1, 2))  # row 1, column 2

    ref = trl.PrioritizedSampler(8, 0.7, 0.5, max_priority_within_buffer=True)
    mine = ours.PrioritizedSampler(8, 0.7, 0.5, max_priority_within_buffer=True)
    outcomes = []
    for sampler in (ref, mine):
        sampler.load_state_dict(copy.deepcopy(state))
        try:
            sampler.extend(WRITES[case])
            outcomes.append(None)
        except Exception as err:  # the reference's exception is part of the expected outcome
            outcomes.append(type(err))
    assert outcomes[1] == outcomes[0]
    forgotten = [sampler._max_priority == (None, None) for sampler in (ref, mine)]
    assert forgotten[1] == forgotten[0]
    assert forgotten[1] == ("both" in case)
