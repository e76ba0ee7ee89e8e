"""The index of the largest priority is the sampler's own: a caller reusing its index tensor
after ``update_priority`` (a training loop writing the next batch's indices into the same
buffer) does not move it, whichever path the update takes."""
import pytest
import torch

from torchrl_compat.samplers import PrioritizedSampler

PRIORITIES = {
    "float32 (the kernels)": lambda: torch.tensor([0.5, 3.0, 1.0, 2.0]),
    "float64 (the kernels)": lambda: torch.tensor([0.5, 3.0, 1.0, 2.0], dtype=torch.float64),
    "float16 (the general path)": lambda: torch.tensor([0.5, 3.0, 1.0, 2.0], dtype=torch.float16),
    "[N, 1]": lambda: torch.tensor([[0.5], [3.0], [1.0], [2.0]]),
    "int64 (the general path)": lambda: torch.tensor([1, 3, 2, 2]),
    "a float for every index": lambda: 3.0,
    "a 0-d tensor for every index": lambda: torch.tensor(3.0),
}


@pytest.mark.parametrize("kind", list(PRIORITIES))
def test_reusing_the_index_tensor_leaves_the_largest_priority_where_it_was(kind):
    sampler = PrioritizedSampler(max_capacity=10, alpha=0.7, beta=0.5)
    index = torch.tensor([4, 6, 1, 8])
    sampler.update_priority(index, PRIORITIES[kind]())
    highest, position = sampler._max_priority
    # one priority for all: the first index holds the largest (torch's max gives the first)
    expected = 4 if kind.startswith("a ") else 6
    assert float(highest) == 3.0 and int(position) == expected
    index.copy_(torch.tensor([0, 2, 3, 5]))  # the caller's buffer, reused
    assert int(sampler._max_priority[1]) == expected
