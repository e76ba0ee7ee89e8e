"""``PrioritizedSampler.mark_update`` with indices other than a non-empty 1-D int64 tensor:
empty, 0-d, 2-D (rows of a storage of two dimensions), int32, bool, float. torchrl's
``mark_update`` is ``update_priority(index, default_priority)``, which converts the index with
``torch.as_tensor(index, dtype=torch.long)``, ravels 2-D rows with the storage's shape and
skips an empty index: the trees and the largest priority must end as torchrl's (its own
``PrioritizedSampler`` on ``replay``'s trees, which follow torchrl's tree API).
"""

import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl
from torchrl.data import LazyTensorStorage

import torchrl_compat.samplers as ours
from prioritized_support import torchrl_trees, sampler_state

CAPACITY = 16


INDICES = {
    "empty int64": lambda: torch.empty(0, dtype=torch.long),
    "0-d int64": lambda: torch.tensor(5),
    "2-d int64 rows": lambda: torch.tensor([[1, 2], [1, 3]]),
    "2-d int64, one row": lambda: torch.tensor([[2, 0]]),
    "int32": lambda: torch.arange(3, 7, dtype=torch.int32),
    "int16": lambda: torch.arange(9, 11, dtype=torch.int16),
    "bool": lambda: torch.tensor([False, True, True]),
    "float": lambda: torch.tensor([4.0, 5.0]),
}


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("before", ["fresh", "after an update"])
@pytest.mark.parametrize("case", sorted(INDICES))
def test_mark_update_of_other_index_kinds_is_torchrls(case, before):
    storage = LazyTensorStorage(CAPACITY, ndim=2)  # [4, 4]: a 2-d index is raveled with it
    storage.set(torch.arange(4), torch.zeros(4, 4))
    ref, mine = trl.PrioritizedSampler(CAPACITY, 0.7, 0.5), ours.PrioritizedSampler(CAPACITY, 0.7, 0.5)
    outcomes = []
    for sampler in (ref, mine):
        if before == "after an update":
            sampler.update_priority(torch.tensor([0, 12]), torch.tensor([0.5, 0.25]))
        try:
            sampler.mark_update(INDICES[case](), storage=storage)
            outcomes.append(None)
        except Exception as err:  # the reference's exception is part of the expected outcome
            outcomes.append(type(err))
        # and a later mark of a plain range still agrees
        sampler.mark_update(torch.arange(13, 15), storage=storage)
    assert outcomes[1] == outcomes[0]
    assert sampler_state(mine) == sampler_state(ref)
