"""``update_priority`` with priorities that require grad (TD errors straight from a loss): taken
detached, as torchrl's sampler takes them (``torch.as_tensor(priority).detach()``), on every
index kind. Compared with torchrl's own ``PrioritizedSampler`` on ``replay``'s trees (which
follow torchrl's tree API).
"""

import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl

import torchrl_compat.samplers as ours
from prioritized_support import torchrl_trees, sampler_state



INDICES = {
    "1-d tensor": lambda: torch.tensor([1, 4, 6]),
    "1-d tensor with a skipped entry": lambda: torch.tensor([1, -1, 6]),
    "list": lambda: [1, 4, 6],
}


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("shape", ["1-d", "0-d"])
@pytest.mark.parametrize("case", sorted(INDICES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_priorities_requiring_grad_are_taken_detached_as_torchrl(case, shape, dtype):
    weights = torch.tensor([0.5, -2.0, 1.5], dtype=dtype, requires_grad=True)
    td_error = (weights * 3.0).abs() if shape == "1-d" else (weights * 3.0).abs().max()
    assert td_error.requires_grad
    ref, mine = trl.PrioritizedSampler(8, 0.7, 0.5), ours.PrioritizedSampler(8, 0.7, 0.5)
    for sampler in (ref, mine):
        sampler.update_priority(INDICES[case](), td_error)
        sampler.update_priority(torch.tensor([2]), td_error.max() * 2)  # a new largest, with grad
    assert sampler_state(mine) == sampler_state(ref)
    assert not mine._max_priority[0].requires_grad
    td_error.sum().backward()  # the graph is left as it was
    assert weights.grad is not None
