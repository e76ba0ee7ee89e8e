"""The prioritized sampler's torch-op path (the one a CUDA storage takes, run here on CPU
tensors) against its CPU kernel path and torchrl's own sampler, for every kind of update
input: integer and column-shaped priorities, Python numbers, a largest priority that the
general path or a loaded state left as a number, indices of two dims, and sequences that
move between the two paths."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers.samplers as trl_samplers
from torchrl.data.replay_buffers import LazyTensorStorage

import torchrl_compat.samplers as ours
from torchrl_compat.samplers import _trees

from prioritized_support import sampler_state, torchrl_trees  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("torchrl_trees")

CAPACITY = 16


def filled_storage(n=CAPACITY, ndim=1):
    storage = LazyTensorStorage(n, ndim=ndim)
    if ndim == 1:
        storage.set(torch.arange(n), TensorDict({"obs": torch.arange(float(n))}, [n]))
    else:
        rows = n // 4
        storage.set(torch.arange(rows), TensorDict({"obs": torch.zeros(rows, 4)}, [rows, 4]))
    return storage


def three_samplers(**kwargs):
    """Ours on its kernel trees, ours on its torch-op trees, torchrl's."""
    fast = ours.PrioritizedSampler(CAPACITY, 0.7, 0.5, **kwargs)
    slow = ours.PrioritizedSampler(CAPACITY, 0.7, 0.5, **kwargs)
    slow._use_cpu_kernels = False
    reference = trl_samplers.PrioritizedSampler(CAPACITY, 0.7, 0.5, **kwargs)
    return fast, slow, reference


def leaves(sampler):
    """Every leaf of the sum tree and of the min tree."""
    return sampler_state(sampler)[0]


def largest(sampler):
    value, position = sampler._max_priority
    if value is None:
        return None
    return float(value), (None if position is None else int(position) if not isinstance(position, tuple) else tuple(int(p) for p in position))


def assert_same_state(fast, slow, reference, reference_rounded=False):
    """``reference_rounded``: torchrl's float64 sampler loaded its own checkpoint, whose leaves
    it wrote rounded to float32 (an empty min leaf reads ``inf`` there); ours keeps them."""
    assert not _trees.is_replay_tree(slow._sum_tree)
    want = leaves(reference)
    if reference_rounded:
        highest = torch.finfo(torch.float64).max
        want = tuple([highest if v == float("inf") else v for v in tree] for tree in want)
        for tree, wanted in zip(leaves(fast), want):
            np.testing.assert_allclose(tree, wanted, rtol=1e-7)
    else:
        assert leaves(fast) == want
    np.testing.assert_allclose(leaves(slow), want, rtol=1e-6)
    assert largest(fast) == largest(slow) == largest(reference)
    assert float(fast.default_priority) == pytest.approx(float(reference.default_priority), rel=1e-6)
    assert float(slow.default_priority) == pytest.approx(float(reference.default_priority), rel=1e-6)


def apply(samplers, index, priority):
    for sampler in samplers:
        sampler.update_priority(
            index.clone() if isinstance(index, torch.Tensor) else index,
            priority.clone() if isinstance(priority, torch.Tensor) else priority,
        )


def same_draws(samplers, storage, seed):
    """The kernel path draws torchrl's numbers with the same seeds; the torch-op path (its
    own random stream) lands on rows it can draw."""
    drawn = []
    for sampler in (samplers[0], samplers[2], samplers[1]):
        torch.manual_seed(seed)
        np.random.seed(seed)
        index, info = sampler.sample(storage, 32)
        index = index if isinstance(index, tuple) else (index,)
        drawn.append((index, info["priority_weight"]))
    (fast_index, fast_weight), (ref_index, ref_weight), (slow_index, slow_weight) = drawn
    assert all(torch.equal(a, b) for a, b in zip(fast_index, ref_index))
    torch.testing.assert_close(fast_weight, ref_weight)
    for coordinate, size in zip(slow_index, storage.shape):
        assert ((coordinate >= 0) & (coordinate < size)).all()
    assert slow_weight.shape == fast_weight.shape and (slow_weight > 0).all()


UPDATES = {
    "integer priorities": (torch.tensor([1, 4, 9]), torch.tensor([3, 7, 2])),
    "column priorities": (torch.tensor([0, 5, 6]), torch.tensor([[2.5], [0.5], [6.0]])),
    "one priority for several": (torch.tensor([2, 3, 12]), torch.tensor([4.5])),
    "float64 priorities": (torch.tensor([7, 8]), torch.tensor([1.25, 9.5], dtype=torch.float64)),
    "python float": (torch.tensor([10, 11]), 3.5),
    "python int": (torch.tensor([13]), 5),
    "numpy float": (torch.tensor([14, 15]), np.float64(0.75)),
    "int32 index": (torch.tensor([3, 1], dtype=torch.int32), torch.tensor([8.0, 0.25])),
    "skipped entries": (torch.tensor([-1, 6, -1]), torch.tensor([1.0, 11.0, 2.0])),
}


@pytest.mark.parametrize("first", list(UPDATES))
@pytest.mark.parametrize("then", list(UPDATES))
def test_pairs_of_update_kinds_match_kernels_and_torchrl(first, then):
    samplers = three_samplers()
    apply(samplers, *UPDATES[first])
    assert_same_state(*samplers)
    apply(samplers, *UPDATES[then])
    assert_same_state(*samplers)
    # a lower priority over the largest one's slot: the largest is the one recorded
    index = UPDATES[first][0][-1:].long()
    apply(samplers, index, torch.tensor([0.125]))
    assert_same_state(*samplers)
    same_draws(samplers, filled_storage(), seed=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_updates_after_loading_a_state_match_kernels_and_torchrl(dtype):
    samplers = three_samplers(dtype=dtype)
    apply(samplers, torch.tensor([0, 3, 5]), torch.tensor([2.0, 9.0, 1.0]))
    states = [sampler.state_dict() for sampler in samplers]
    loaded = three_samplers(dtype=dtype)
    for sampler, state in zip(loaded, states):
        sampler.load_state_dict(state)
    loaded[1]._use_cpu_kernels = False
    # the loaded largest priority is a number; the torch-op path takes it to its tensors
    apply(loaded, torch.tensor([1, 2]), torch.tensor([4.0, 0.5]))
    assert_same_state(*loaded)
    apply(loaded, torch.tensor([3]), torch.tensor([0.25]))
    assert_same_state(*loaded)
    apply(loaded, torch.tensor([4, 6]), torch.tensor([12.0, 0.5]))
    assert_same_state(*loaded)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("first_update", ["lower over the largest", "higher elsewhere", "skipped only"])
def test_updates_after_loading_a_checkpoint_match_kernels_and_torchrl(dtype, first_update, tmp_path):
    """A checkpoint's metadata holds the largest priority and its index as JSON numbers:
    the torch-op path takes them to its own tensors at its first update."""
    samplers = three_samplers(dtype=dtype)
    apply(samplers, torch.tensor([0, 3, 5]), torch.tensor([2.0, 9.0, 1.0]))
    loaded = three_samplers(dtype=dtype)
    for number, (sampler, fresh) in enumerate(zip(samplers, loaded)):
        sampler.dumps(tmp_path / str(number))
        fresh.loads(tmp_path / str(number))
    loaded[1]._use_cpu_kernels = False
    index, priority = {
        "lower over the largest": (torch.tensor([3]), torch.tensor([0.25])),
        "higher elsewhere": (torch.tensor([4, 6]), torch.tensor([12.0, 0.5])),
        "skipped only": (torch.tensor([-1]), torch.tensor([4.0])),
    }[first_update]
    rounded = dtype == torch.float64
    apply(loaded, index, priority)
    assert_same_state(*loaded, reference_rounded=rounded)
    apply(loaded, torch.tensor([1, 2]), torch.tensor([4.0, 0.5]))
    assert_same_state(*loaded, reference_rounded=rounded)
    if not rounded:
        same_draws(loaded, filled_storage(), seed=7)


def test_two_dim_index_on_a_two_dim_storage_matches_kernels_and_torchrl():
    storage = filled_storage(ndim=2)
    samplers = three_samplers()
    for sampler in samplers:
        sampler.update_priority(torch.tensor([[0, 1], [2, 3]]), torch.tensor([5.0, 0.5]), storage=storage)
    assert_same_state(*samplers)
    for sampler in samplers:
        sampler.update_priority(torch.tensor([[1, 0]]), torch.tensor([7.0]), storage=storage)
    assert_same_state(*samplers)
    same_draws(samplers, storage, seed=5)


@pytest.mark.parametrize(
    "index,priority,error",
    [
        (torch.tensor([True, False] * 8), torch.ones(16), None),
        (torch.tensor([1.0, 2.0]), torch.ones(2), None),
        (torch.tensor([], dtype=torch.long), torch.ones(0), None),
        (torch.tensor([1, 2, 3]), torch.ones(2), RuntimeError),
        (torch.tensor([1, 100]), torch.ones(2), IndexError),
        (torch.tensor([1, 2]), torch.tensor([1.0, float("nan")]), ValueError),
    ],
    ids=["bool index", "float index", "empty index", "length mismatch", "out of range", "nan"],
)
def test_other_inputs_take_the_same_route_on_both_paths(index, priority, error):
    fast, slow, _ = three_samplers()
    apply((fast, slow), torch.tensor([0, 1]), torch.tensor([3.0, 1.0]))
    outcomes = []
    for sampler in (fast, slow):
        try:
            sampler.update_priority(index.clone(), priority.clone())
            outcomes.append(None)
        except Exception as err:  # noqa: BLE001 - the kind is compared below
            outcomes.append(type(err))
    if error is not None:
        assert outcomes == [error, error]
    else:
        assert outcomes[0] == outcomes[1]
    for fast_leaves, slow_leaves in zip(leaves(fast), leaves(slow)):
        np.testing.assert_allclose(fast_leaves, slow_leaves, rtol=1e-6)
    assert largest(fast) == largest(slow)


def test_only_skipped_entries_then_an_update_match_kernels_and_torchrl():
    samplers = three_samplers()
    apply(samplers, torch.tensor([-1, -1]), torch.tensor([3.0, 4.0]))
    assert all(largest(sampler) is None for sampler in samplers)
    apply(samplers, torch.tensor([2, -1, 7]), torch.tensor([0.5, 9.0, 4.0]))
    assert_same_state(*samplers)
    same_draws(samplers, filled_storage(), seed=11)
