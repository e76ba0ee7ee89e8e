"""What ``loads`` does with the largest priority a sampler already holds, compared with
torchrl's sampler: a tensor held is updated in place (a caller keeping it sees the loaded
value), and the loaded numbers are taken as they are when nothing is held."""
from __future__ import annotations

import pytest
import torch

import torchrl.data.replay_buffers.samplers as trl_samplers

import torchrl_compat.samplers as ours

from prioritized_support import torchrl_trees  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("torchrl_trees")


def checkpoint(family, path):
    source = family.PrioritizedSampler(8, 0.7, 0.5)
    source.update_priority(torch.tensor([2, 6]), torch.tensor([1.5, 9.0]))
    source.dumps(path)
    return path


def test_largest_priority_held_as_tensors_is_loaded_in_place_as_torchrl(tmp_path):
    seen = []
    for family in (ours, trl_samplers):
        path = checkpoint(family, tmp_path / family.__name__)
        sampler = family.PrioritizedSampler(8, 0.7, 0.5)
        sampler.update_priority(torch.tensor([1]), torch.tensor([3.0]))
        held_value, held_index = sampler._max_priority
        sampler.loads(path)
        value, index = sampler._max_priority
        seen.append((float(held_value), int(held_index), value is held_value, index is held_index))
        assert float(value) == 9.0 and int(index) == 6
    assert seen[0] == seen[1] == (9.0, 6, True, True)


def test_largest_priority_loaded_into_a_fresh_sampler_is_the_checkpoints_as_torchrl(tmp_path):
    seen = []
    for family in (ours, trl_samplers):
        path = checkpoint(family, tmp_path / family.__name__)
        sampler = family.PrioritizedSampler(8, 0.7, 0.5)
        sampler.loads(path)
        seen.append(tuple(sampler._max_priority))
    assert seen[0] == seen[1] == (9.0, 6.0)
