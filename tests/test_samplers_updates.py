"""Priority updates of the prioritized samplers, side by side with torchrl 0.11's.

torchrl's compiled trees do not load on this torch: its Python samplers run here on
``replay``'s trees (which follow torchrl's tree API, capacity included), monkeypatched into
its module, so that only the samplers' own logic differs.
"""
import sys

import numpy as np
import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

import replay
import torchrl_compat.samplers as ours
from torchrl_compat._releases import since

# The module whose globals hold torchrl's tree classes (torchrl 0.14 splits samplers.py).
TRL_PRIORITIZED = sys.modules[trl.PrioritizedSampler._init.__module__]

TREE_NAMES = ("SumSegmentTreeFp32", "SumSegmentTreeFp64", "MinSegmentTreeFp32", "MinSegmentTreeFp64")
PATHS = ["kernels", "torch-ops"]  # replay's fused kernels, or the accelerator path on CPU


@pytest.fixture
def torchrl_trees(monkeypatch):
    for name in TREE_NAMES:
        monkeypatch.setattr(TRL_PRIORITIZED, name, getattr(replay, name))


def _ours(*args, path="kernels", **kwargs):
    sampler = ours.PrioritizedSampler(*args, **kwargs)
    sampler._use_cpu_kernels = path == "kernels"
    return sampler


def _leaves(sampler):
    capacity = sampler._sum_tree.capacity
    return (
        np.array([sampler._sum_tree[i] for i in range(capacity)]),
        np.array([sampler._min_tree[i] for i in range(capacity)]),
    )


def _snapshot(sampler):
    sum_leaves, min_leaves = _leaves(sampler)
    max_priority = tuple(None if x is None else (float(x), x.dtype if isinstance(x, torch.Tensor) else type(x))
                         for x in sampler._max_priority)
    return sum_leaves.tolist(), min_leaves.tolist(), max_priority, float(sampler.default_priority)


def _outcome(fn):
    try:
        fn()
    except Exception as err:  # the reference's exception is part of the expected outcome
        return type(err)
    return None


# --------------------------------------------------------------------- the largest priority


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", ["1-d", "0-d", "scalar-broadcast", "2-d index"])
def test_largest_priority_is_not_a_view_of_the_callers_tensor(path, shape):
    """A caller that reuses its priority buffer must not change ``default_priority``."""
    storage = LazyTensorStorage(16, ndim=2)
    storage.set(torch.arange(4), torch.zeros(4, 4))
    ref, mine = trl.PrioritizedSampler(16, 0.7, 0.5), _ours(16, 0.7, 0.5, path=path)
    for sampler in (ref, mine):
        if shape == "1-d":
            priority = torch.tensor([1.0, 5.0, 2.0])
            sampler.update_priority(torch.tensor([0, 3, 7]), priority)
        elif shape == "0-d":
            priority = torch.tensor(5.0)
            sampler.update_priority(torch.tensor([2]), priority)
        elif shape == "scalar-broadcast":
            priority = torch.tensor([5.0])
            sampler.update_priority(torch.tensor([2, 4]), priority)
        else:
            priority = torch.tensor([1.0, 5.0])
            sampler.update_priority(torch.tensor([[0, 1], [2, 3]]), priority, storage=storage)
        before = float(sampler.default_priority)
        priority.mul_(100)
        priority.fill_(0.5)
        expected = 5.0 if since("prioritized_raw_default_priority") else (5.0 + 1e-8) ** 0.7
        assert float(sampler.default_priority) == before == pytest.approx(expected)
        assert float(sampler._max_priority[0]) == 5.0
    assert _snapshot(mine) == _snapshot(ref)


# --------------------------------------------------------------------- edge cases vs torchrl


def _storage_2d():
    storage = LazyTensorStorage(16, ndim=2)
    storage.set(torch.arange(4), torch.zeros(4, 4))
    return storage


UPDATES = {
    "empty index": lambda s: s.update_priority(torch.tensor([], dtype=torch.long), torch.tensor([])),
    "empty index, scalar priority": lambda s: s.update_priority(torch.tensor([], dtype=torch.long), 2.0),
    "empty index, 1 priority": lambda s: s.update_priority(torch.zeros(0, dtype=torch.int32), torch.tensor([2.0])),
    "empty index, 3 priorities": lambda s: s.update_priority(torch.tensor([], dtype=torch.long), torch.ones(3)),
    "empty list": lambda s: s.update_priority([], []),
    "int priorities": lambda s: s.update_priority(torch.tensor([0, 1]), torch.tensor([3, 5])),
    "int8 priorities": lambda s: s.update_priority(torch.tensor([0, 1]), torch.tensor([3, 5], dtype=torch.int8)),
    "bool priorities": lambda s: s.update_priority(torch.tensor([0, 1, 2]), torch.tensor([True, False, True])),
    "half priorities": lambda s: s.update_priority(torch.tensor([0, 1]), torch.tensor([3.0, 5.5], dtype=torch.half)),
    "bfloat16 priorities": lambda s: s.update_priority(torch.tensor([4, 1]), torch.tensor([3.0, 5.5], dtype=torch.bfloat16)),
    "float64 priorities": lambda s: s.update_priority(torch.tensor([0, 1]), torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)),
    "python int priority": lambda s: s.update_priority(3, 2),
    "python float priority": lambda s: s.update_priority(torch.tensor([3, 5]), 2.5),
    "python bool priority": lambda s: s.update_priority(torch.tensor([3, 5]), True),
    "list index and priorities": lambda s: s.update_priority([1, 2], [1.0, 2.0]),
    "0-d index": lambda s: s.update_priority(torch.tensor(3), torch.tensor(2.0)),
    "int32 index": lambda s: s.update_priority(torch.tensor([3, 6], dtype=torch.int32), torch.tensor([2.0, 0.5])),
    "-1 skipped": lambda s: s.update_priority(torch.tensor([-1, 2, -1]), torch.tensor([9.0, 1.0, 9.0])),
    "only -1": lambda s: s.update_priority(torch.tensor([-1, -1]), torch.tensor([9.0, 9.0])),
    "-1 int": lambda s: s.update_priority(-1, 4.0),
    "repeated index": lambda s: s.update_priority(torch.tensor([2, 2, 2]), torch.tensor([1.0, 7.0, 3.0])),
    "[N, 1] priorities": lambda s: s.update_priority(torch.tensor([0, 1]), torch.tensor([[1.0], [2.0]])),
    "mismatched priorities": lambda s: s.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 2.0, 3.0])),
    "index past max_capacity": lambda s: s.update_priority(torch.tensor([1, 10, 15]), torch.tensor([1.0, 2.0, 3.0])),
    "2-d index": lambda s: s.update_priority(torch.tensor([[0, 1], [3, 3]]), torch.tensor([1.0, 2.0]), storage=_storage_2d()),
    "2-d index out of range": lambda s: s.update_priority(torch.tensor([[0, 1], [3, 4]]), torch.tensor([1.0, 2.0]), storage=_storage_2d()),
    "2-d index past the rows": lambda s: s.update_priority(torch.tensor([[4, 0]]), torch.tensor([1.0]), storage=_storage_2d()),
    "2-d index with -1": lambda s: s.update_priority(torch.tensor([[-1, -1], [1, 1]]), torch.tensor([1.0, 2.0]), storage=_storage_2d()),
    "2-d index, no storage": lambda s: s.update_priority(torch.tensor([[0, 1]]), torch.tensor([1.0])),
    "2-d index, storage without a shape": lambda s: s.update_priority(torch.tensor([[0, 1]]), torch.tensor([1.0]), storage=object()),
    "list index, [1, N] priorities": lambda s: s.update_priority([3, 5], torch.tensor([[1.0, 2.0]])),
    "list index, one priority in a list": lambda s: s.update_priority([4], torch.tensor([3.0])),
}
# Where torchrl's message says what is wrong, ours is the same text (elsewhere ours names the
# bad value where torchrl's does not, or torchrl crashes in torch).
SAME_MESSAGE = {"2-d index, no storage", "2-d index, storage without a shape", "empty index, 3 priorities",
                "mismatched priorities"}


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(UPDATES))
def test_update_matches_torchrl(case, dtype, path):
    """The same update on torchrl's sampler and ours, after the same history: the same
    exception type, or the same leaves, largest priority (value and dtype) and default."""
    ref, mine = trl.PrioritizedSampler(10, 0.7, 0.5, dtype=dtype), _ours(10, 0.7, 0.5, dtype=dtype, path=path)
    for sampler in (ref, mine):
        sampler.update_priority(torch.tensor([5, 6]), torch.tensor([0.25, 0.75], dtype=dtype))
    outcome = _outcome(lambda: UPDATES[case](ref))
    if outcome is RuntimeError and dtype is torch.float64 and _outcome(lambda: UPDATES[case](trl.PrioritizedSampler(10, 0.7, 0.5))) is None:
        # torchrl's fp64 trees refuse anything but float64 values ("expected scalar type Double")
        before = _snapshot(mine)
        UPDATES[case](mine)
        assert _snapshot(mine) != before or case.startswith(("empty", "only", "-1"))
        return
    assert _outcome(lambda: UPDATES[case](mine)) is outcome
    assert _snapshot(mine) == _snapshot(ref)
    if case in SAME_MESSAGE:
        assert _message(lambda: UPDATES[case](mine)) == _message(lambda: UPDATES[case](ref))


def _message(fn):
    try:
        fn()
    except Exception as err:
        return str(err)
    raise AssertionError("no exception raised")


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("path", PATHS)
def test_tuple_index_updates_the_positions_it_names(path):
    """A tuple of per-dimension indices, which torchrl's sampler refuses (TypeError) and its
    buffer stacks before calling it: ours stacks it too, the same update as the stacked index."""
    rows, cols = torch.tensor([0, 2, 3]), torch.tensor([1, 3, 0])
    priority = torch.tensor([1.0, 4.0, 2.0])
    with pytest.raises(TypeError):
        trl.PrioritizedSampler(16, 0.7, 0.5).update_priority((rows, cols), priority, storage=_storage_2d())
    by_tuple, stacked = _ours(16, 0.7, 0.5, path=path), _ours(16, 0.7, 0.5, path=path)
    by_tuple.update_priority((rows, cols), priority, storage=_storage_2d())
    stacked.update_priority(torch.stack([rows, cols], -1), priority, storage=_storage_2d())
    assert _snapshot(by_tuple) == _snapshot(stacked)
    assert _leaves(by_tuple)[0][[1, 11, 12]].tolist() == pytest.approx([(p + 1e-8) ** 0.7 for p in (1.0, 4.0, 2.0)])


@pytest.mark.parametrize("path", PATHS)
def test_2d_index_with_priorities_of_its_shape_is_refused(path):
    """One position of a 2-D storage given one priority per coordinate: torchrl fails inside
    torch ("Boolean value of Tensor ... is ambiguous"); ours names the shapes, and changes nothing."""
    sampler = _ours(16, 0.7, 0.5, path=path)
    sampler.update_priority(torch.tensor([5, 6]), torch.tensor([0.25, 0.75]))
    before = _snapshot(sampler)
    with pytest.raises(ValueError, match=r"got value of shape \(1, 2\) and index of shape \(1,\)"):
        sampler.update_priority(torch.tensor([[0, 1]]), torch.tensor([[1.0, 2.0]]), storage=_storage_2d())
    assert _snapshot(sampler) == before


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("path", PATHS)
def test_only_skipped_entries_on_a_fresh_sampler_leave_no_largest_priority(path):
    ref, mine = trl.PrioritizedSampler(10, 0.7, 0.5), _ours(10, 0.7, 0.5, path=path)
    for sampler in (ref, mine):
        sampler.update_priority(torch.tensor([-1, -1]), torch.tensor([3.0, 4.0]))
    assert mine._max_priority == (None, None)
    assert _snapshot(mine) == _snapshot(ref)


WRITTEN_INDICES = {
    "int, the largest": 3,
    "int, another": 2,
    "slice over it": slice(2, 5),
    "slice past it": slice(4, 6),
    "slice with a step": slice(1, 8, 2),
    "1-d tensor over it": torch.tensor([1, 3]),
    "1-d tensor past it": torch.tensor([1, 4]),
    "2-d tensor, a row equal to it": torch.tensor([[3, 3], [1, 1]]),
    "2-d tensor, no row equal to it": torch.tensor([[3, 0], [1, 1]]),
    "tuple": (torch.tensor([3]), torch.tensor([0])),
    "list": [3],
}


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("case", sorted(WRITTEN_INDICES))
def test_writing_over_the_largest_priority_forgets_it_as_torchrl_does(case):
    """With ``max_priority_within_buffer``, a write over the item holding the largest priority
    forgets it (new items then get the default again); each kind of index as torchrl reads it,
    and its refusal of other kinds in its words."""
    ref = trl.PrioritizedSampler(8, 0.7, 0.5, max_priority_within_buffer=True)
    mine = _ours(8, 0.7, 0.5, max_priority_within_buffer=True)
    outcomes = []
    for sampler in (ref, mine):
        sampler.update_priority(torch.tensor([1, 3, 5]), torch.tensor([1.0, 9.0, 2.0]))
        try:
            sampler.extend(WRITTEN_INDICES[case])
            outcomes.append(None)
        except Exception as err:
            outcomes.append((type(err), str(err)))
    if isinstance(WRITTEN_INDICES[case], slice):
        # torchrl's check passes the slice's bounds to range() as one tuple and fails
        # ("'tuple' object cannot be interpreted as an integer"); ours reads the slice
        assert outcomes[0][0] is TypeError and outcomes[1] is None
        forgotten = 3 in range(*WRITTEN_INDICES[case].indices(8))
        assert (mine._max_priority == (None, None)) == forgotten
        assert forgotten or int(mine._max_priority[1]) == 3
        return
    assert outcomes[1] == outcomes[0]
    assert _snapshot(mine) == _snapshot(ref)


# --------------------------------------------------------------------- rejected updates


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rejected_update_changes_nothing(path, dtype):
    """A finite priority whose stored value ``(p + eps) ** alpha`` does not fit the trees, or
    priorities whose sum would overflow them: ValueError, and the sampler (largest priority
    and default priority included) is as it was, so a buffer keeps working."""
    big = float(torch.finfo(dtype).max) ** 0.5  # finite; squared (alpha=2) it is not
    rb = ReplayBuffer(storage=LazyTensorStorage(8), sampler=_ours(8, 2.0, 0.5, dtype=dtype, path=path), batch_size=4)
    rb.extend(torch.arange(4.0))
    sampler = rb._sampler
    before = _snapshot(sampler)
    attempts = {
        "value past the dtype": (torch.tensor([1, 2]), torch.tensor([1.0, big * 2], dtype=torch.float64)),
        "0-d value past the dtype": (torch.tensor([1]), torch.tensor(big * 2, dtype=torch.float64)),
        "total past the dtype": (torch.tensor([0, 1]), torch.tensor([big * 0.8, big * 0.8], dtype=torch.float64)),
    }
    if dtype is torch.float32:
        attempts["float32 value past float32"] = (torch.tensor([3]), torch.tensor([1e20]))
    for name, (index, priority) in attempts.items():
        with pytest.raises(ValueError, match="cannot be stored|would make the sum"):
            sampler.update_priority(index, priority)
        assert _snapshot(sampler) == before, name
        with pytest.raises(ValueError, match="cannot be stored|would make the sum"):
            sampler.update_priority(index.unsqueeze(-1).expand(-1, 1).clone(), priority, storage=rb._storage)
        assert _snapshot(sampler) == before, name
    rb.extend(torch.arange(4.0, 8.0))  # mark_update with the default priority still works
    assert len(rb) == 8
    _, info = rb.sample(return_info=True)
    assert torch.isfinite(info["priority_weight"]).all()


@pytest.mark.parametrize("path", PATHS)
def test_rejected_update_of_the_slice_sampler_changes_nothing(path):
    sampler = ours.PrioritizedSliceSampler(8, 2.0, 0.5, slice_len=2, traj_key="episode")
    sampler._use_cpu_kernels = path == "kernels"
    sampler.update_priority(torch.arange(8), torch.ones(8))
    before = _snapshot(sampler)
    with pytest.raises(ValueError, match="cannot be stored"):
        sampler.update_priority(torch.tensor([1]), torch.tensor([1e20]))
    assert _snapshot(sampler) == before


# --------------------------------------------------------------------- failed slice draws


def _episode_storage(n=20, length=5):
    storage = LazyTensorStorage(n)
    storage.set(torch.arange(n), TensorDict({"episode": torch.arange(n) // length, "obs": torch.arange(n)}, [n]))
    return storage


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("path", PATHS)
def test_failed_slice_draw_consumes_no_random_numbers(path):
    """Priorities only on the steps that cannot start a slice (the others never written): the
    draw fails. torchrl refuses before drawing; so, in effect, do we (the draws the kernel
    took are given back), and the next draws of both samplers agree."""
    storage = _episode_storage()
    excluded = torch.tensor([3, 4, 8, 9, 13, 14, 18, 19])  # the last two steps of each episode
    samplers = {}
    for name, cls in (("torchrl", trl.PrioritizedSliceSampler), ("ours", ours.PrioritizedSliceSampler)):
        sampler = cls(20, 0.8, 0.6, slice_len=3, traj_key="episode", truncated_key=None)
        if name == "ours":
            sampler._use_cpu_kernels = path == "kernels"
        sampler._rng = torch.Generator().manual_seed(7)
        sampler.update_priority(excluded, torch.ones(excluded.numel()))
        state = sampler._rng.get_state()
        with pytest.raises(RuntimeError, match="non-positive p_sum"):
            sampler.sample(storage, 12)
        assert torch.equal(sampler._rng.get_state(), state)
        sampler.update_priority(torch.arange(20), torch.arange(1.0, 21.0))
        samplers[name] = sampler
    for _ in range(3):
        (ri,), rinfo = samplers["torchrl"].sample(storage, 12)
        (mi,), minfo = samplers["ours"].sample(storage, 12)
        assert torch.equal(ri, mi)
        assert torch.equal(rinfo["priority_weight"], minfo["priority_weight"])


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("eps", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_eps_is_refused(eps):
    """torchrl takes it, and every stored value ``(p + eps) ** alpha`` is then infinite or NaN."""
    trl.PrioritizedSampler(8, 0.7, 0.5, eps=eps)
    with pytest.raises(ValueError, match=rf"^eps must be a finite number, got eps={eps}$"):
        ours.PrioritizedSampler(8, 0.7, 0.5, eps=eps)


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("name", ["alpha", "beta"])
def test_a_nan_alpha_or_beta_is_refused(name):
    """torchrl takes it (its check is ``< 0``), and every weight or stored value is then NaN."""
    kwargs = {"alpha": 0.7, "beta": 0.5, name: float("nan")}
    trl.PrioritizedSampler(8, **kwargs)
    with pytest.raises(ValueError, match=rf"^{name} must be greater or equal (than|to) 0, got {name}=nan$"):
        ours.PrioritizedSampler(8, **kwargs)
