"""The largest priority of a ``max_priority_within_buffer`` sampler loaded from a checkpoint.

A checkpoint's metadata holds the largest priority and its index as JSON numbers, so a sampler
that loads it into a fresh state keeps them as Python numbers (torchrl does the same). An
update that then overwrites that index must rebuild the largest priority from the trees, as
torchrl's sampler does (compared with torchrl's own ``PrioritizedSampler`` on ``replay``'s
trees, which follow torchrl's tree API).
"""

import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl

import torchrl_compat.samplers as ours
from prioritized_support import torchrl_trees, sampler_state



def _index(kind, position):
    if kind == "int":
        return position
    if kind == "1-d tensor":
        return torch.tensor([0, position])
    return [position]  # a list: the general path


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("kind", ["int", "1-d tensor", "list"])
@pytest.mark.parametrize("overwrite", [True, False])
@pytest.mark.parametrize("scale", [1.0, 0.1])  # 0.1: every priority below 1
def test_update_after_loads_rebuilds_the_largest_priority_as_torchrl(tmp_path, kind, overwrite, scale):
    source = ours.PrioritizedSampler(8, 0.7, 0.5, max_priority_within_buffer=True)
    source.update_priority(torch.tensor([1, 3, 5, 6]), torch.tensor([1.0, 9.0, 2.0, 4.0]) * scale)
    source.dumps(tmp_path / "ckpt")

    ref = trl.PrioritizedSampler(8, 0.7, 0.5, max_priority_within_buffer=True)
    mine = ours.PrioritizedSampler(8, 0.7, 0.5, max_priority_within_buffer=True)
    position = 3 if overwrite else 2
    for sampler in (ref, mine):
        sampler.loads(tmp_path / "ckpt")
        assert not isinstance(sampler._max_priority[1], torch.Tensor)  # a JSON number
        sampler.update_priority(_index(kind, position), 0.5 * scale)
    assert sampler_state(mine) == sampler_state(ref)
    # overwritten: the largest left is item 6's
    assert (int(mine._max_priority[1]) == 6) == overwrite
