"""``mark_update`` when the default priority is not a finite float: integer priorities (from
torchrl 0.13 on the default is the raw largest priority, an integer tensor after integer
updates, as torchrl keeps it), and a default whose stored value ``(p + eps) ** alpha`` does
not fit the trees.

Integer defaults are compared with torchrl's own ``PrioritizedSampler`` on ``replay``'s trees
(which follow torchrl's tree API). Where the stored value overflows the trees' dtype, torchrl
writes ``inf``; this sampler refuses the write (ValueError, documented in its class notes) and
changes nothing: checked against a float32 model of the stored value.
"""

import numpy as np
import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl

import torchrl_compat.samplers as ours
from torchrl_compat._releases import since
from prioritized_support import torchrl_trees, sampler_state



@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_marks_after_integer_priorities_are_torchrls(dtype):
    ref, mine = trl.PrioritizedSampler(16, 0.7, 0.5), ours.PrioritizedSampler(16, 0.7, 0.5)
    for sampler in (ref, mine):
        sampler.update_priority(torch.tensor([0, 1, 2]), torch.tensor([3, 7, 5], dtype=dtype))
        sampler.mark_update(torch.arange(4, 8))
        sampler.mark_update(torch.tensor([9, 10]))
    state = sampler_state(mine)
    assert state == sampler_state(ref)
    assert state[0][0][4] > 0  # the marks were written


@pytest.mark.skipif(
    since("prioritized_raw_default_priority"),
    reason="from torchrl 0.13 the default is the raw largest priority, whose stored value fits",
)
def test_mark_whose_stored_default_overflows_is_refused_whole():
    alpha, eps = 2.0, 1e-8
    sampler = ours.PrioritizedSampler(16, alpha, 0.5, eps=eps)
    # stored (p + eps) ** 2 fits float32 for this priority; torchrl 0.11-0.12's default is
    # that stored value, (p + eps) ** alpha ...
    priority = 1.5e19
    sampler.update_priority(torch.tensor([0]), torch.tensor([priority]))
    default = float(sampler.default_priority)
    # ... but not for the default priority's stored value (a float32 model of it)
    with np.errstate(over="ignore"):
        stored = np.float32(np.float32(default) + np.float32(eps)) ** np.float32(alpha)
    assert not np.isfinite(stored)
    before = [np.array([tree[i] for i in range(16)]).tolist() for tree in (sampler._sum_tree, sampler._min_tree)]
    largest = tuple(float(x) for x in sampler._max_priority)
    with pytest.raises(ValueError, match="cannot be stored"):
        sampler.mark_update(torch.arange(1, 5))
    assert [np.array([tree[i] for i in range(16)]).tolist() for tree in (sampler._sum_tree, sampler._min_tree)] == before
    assert tuple(float(x) for x in sampler._max_priority) == largest
