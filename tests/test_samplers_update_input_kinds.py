"""``update_priority`` on a grid of inputs: index kinds (1-D, with skipped ``-1`` entries, all
skipped, one entry, empty, int32, repeated, a list, a Python int, a 0-d tensor) times priority kinds (float32/64/16, bfloat16,
shapes ``[N]``, ``[N, 1]``, ``[1, N]``, ``[2]``, ``[2, 1]``, 0-d, ``[1]``, ``[1, 1]``, integer,
bool, Python float and int, numpy float64, a list, ties, a priority requiring grad), on a
fresh sampler and after an update, with and without ``max_priority_within_buffer``, each
followed by a one-item update.

Whichever path takes an input (the fused kernel, the general path), the outcome must be
torchrl's: the same exception type or none, the same leaves in both trees, the same largest
priority (value, dtype, shape) and default priority. The reference is torchrl's own
``PrioritizedSampler`` on ``replay``'s trees (which follow torchrl's tree API).
"""

import numpy as np
import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl

import torchrl_compat.samplers as ours
from prioritized_support import torchrl_trees, sampler_state



INDICES = {
    "1-d": lambda: torch.tensor([1, 4, 6]),
    "1-d with a skipped entry": lambda: torch.tensor([1, -1, 6]),
    "all skipped": lambda: torch.tensor([-1, -1]),
    "one entry": lambda: torch.tensor([3]),
    "empty": lambda: torch.empty(0, dtype=torch.long),
    "int32": lambda: torch.tensor([2, 5, 7], dtype=torch.int32),
    "repeated entry": lambda: torch.tensor([2, 2, 5]),
    # the general path's
    "list": lambda: [1, 4, 6],
    "list with a skipped entry": lambda: [1, -1, 6],
    "Python int": lambda: 3,
    "0-d tensor": lambda: torch.tensor(3),
}
PRIORITIES = {
    "float32 [3]": lambda: torch.tensor([0.5, 3.0, 2.0]),
    "float64 [3]": lambda: torch.tensor([0.5, 3.0, 2.0], dtype=torch.float64),
    "float16 [3]": lambda: torch.tensor([0.5, 3.0, 2.0], dtype=torch.float16),
    "bfloat16 [3]": lambda: torch.tensor([0.5, 3.0, 2.0], dtype=torch.bfloat16),
    "float32 [3, 1]": lambda: torch.tensor([[0.5], [3.0], [2.0]]),
    "float32 [1, 3]": lambda: torch.tensor([[0.5, 3.0, 2.0]]),
    "float32 [2]": lambda: torch.tensor([4.0, 1.0]),
    "float32 [2, 1]": lambda: torch.tensor([[4.0], [1.0]]),
    "float32 0-d": lambda: torch.tensor(2.5),
    "float64 0-d": lambda: torch.tensor(2.5, dtype=torch.float64),
    "float32 [1]": lambda: torch.tensor([2.5]),
    "float32 [1, 1]": lambda: torch.tensor([[2.5]]),
    "int64 [3]": lambda: torch.tensor([1, 3, 2]),
    "int64 0-d": lambda: torch.tensor(4),
    "bool [3]": lambda: torch.tensor([True, False, True]),
    "Python float": lambda: 2.5,
    "Python int": lambda: 3,
    "numpy float64": lambda: np.float64(2.5),
    "list": lambda: [0.5, 3.0, 2.0],
    "ties": lambda: torch.tensor([3.0, 3.0, 3.0]),
    "requires grad": lambda: torch.tensor([0.5, 3.0, 2.0], requires_grad=True) * 1,
}


def _run(make, steps, within):
    sampler = make(8, 0.7, 0.5, max_priority_within_buffer=within)
    outcomes = []
    for index, priority in steps:
        try:
            sampler.update_priority(INDICES[index](), PRIORITIES[priority]())
            outcomes.append(None)
        except Exception as err:  # the reference's exception is part of the expected outcome
            outcomes.append(type(err))
    return outcomes, sampler_state(sampler)


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("within", [False, True], ids=["since made", "within buffer"])
@pytest.mark.parametrize("index", sorted(INDICES))
def test_updates_of_every_input_kind_end_as_torchrls(index, within):
    for priority in PRIORITIES:
        for before in ([], [("1-d", "float32 [3]")]):
            steps = before + [(index, priority), ("one entry", "float32 0-d")]
            mine = _run(ours.PrioritizedSampler, steps, within)
            ref = _run(trl.PrioritizedSampler, steps, within)
            assert mine == ref, (steps, within)
