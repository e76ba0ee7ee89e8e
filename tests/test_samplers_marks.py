"""``PrioritizedSampler.mark_update``: the default priority of new items, written as ranges of
leaves (one kernel call for both trees) when the index is a round-robin write's rows, with the
default priority kept from call to call, against the general path (the same sampler with the
range fill turned off) and torchrl 0.11's sampler.

torchrl's compiled trees do not load on this torch: its Python sampler runs here on
``replay``'s trees (the ``torchrl_trees`` fixture), so that only the samplers' own logic differs.
"""
import sys

import numpy as np
import pytest
import torch
import torchrl.data.replay_buffers.samplers as trl
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

import replay
import torchrl_compat.samplers as ours
from torchrl_compat._releases import since

# The module whose globals hold torchrl's tree classes (torchrl 0.14 splits samplers.py).
TRL_PRIORITIZED = sys.modules[trl.PrioritizedSampler._init.__module__]

TREE_NAMES = ("SumSegmentTreeFp32", "SumSegmentTreeFp64", "MinSegmentTreeFp32", "MinSegmentTreeFp64")
CAPACITY = 40


@pytest.fixture
def torchrl_trees(monkeypatch):
    for name in TREE_NAMES:
        monkeypatch.setattr(TRL_PRIORITIZED, name, getattr(replay, name))


@pytest.fixture
def fills(monkeypatch):
    """The range fills the samplers make: ``[(number of leaves, written? or the error type)]``."""
    made = []
    fill = replay.fill_priority_pair

    def counted(sum_tree, min_tree, index, value):
        try:
            written = fill(sum_tree, min_tree, index, value)
        except Exception as err:
            made.append((len(index), type(err)))
            raise
        made.append((len(index), written))
        return written

    monkeypatch.setattr(replay, "fill_priority_pair", counted)
    return made


def _general(sampler):
    """``sampler`` with the range fill turned off: every mark goes through update_priority."""
    sampler._mark_ranges = lambda index, storage: False
    return sampler


def _trio(cls=ours.PrioritizedSampler, ref_cls=trl.PrioritizedSampler, *args, **kwargs):
    """(ours with the range fill, ours without it, torchrl's), built alike."""
    return cls(*args, **kwargs), _general(cls(*args, **kwargs)), ref_cls(*args, **kwargs)


def _max_priority(sampler):
    return tuple(
        None if x is None else (float(x), x.dtype if isinstance(x, torch.Tensor) else type(x))
        for x in sampler._max_priority
    )


def _state(sampler):
    capacity = sampler._sum_tree.capacity
    leaves = [np.asarray(tree[np.arange(capacity)], dtype=np.float64).tolist()
              for tree in (sampler._sum_tree, sampler._min_tree)]
    return leaves, _max_priority(sampler), float(sampler.default_priority)


def _assert_same(fast, general, ref=None):
    assert _state(fast) == _state(general)
    # the whole tree buffers, every level and prefix sum, to the bit
    np.testing.assert_array_equal(fast._sum_tree._py_buffer(), general._sum_tree._py_buffer())
    np.testing.assert_array_equal(fast._min_tree._py_buffer(), general._min_tree._py_buffer())
    if ref is not None:
        assert _state(fast) == _state(ref)


def _outcome(fn):
    try:
        fn()
    except Exception as err:
        return type(err), str(err)
    return None


def _storage(length=CAPACITY):
    storage = LazyTensorStorage(CAPACITY)
    storage.set(torch.arange(length), TensorDict({"obs": torch.arange(length)}, [length]))
    return storage


@pytest.mark.usefixtures("torchrl_trees")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [0.5, 0.7, 1.0])
@pytest.mark.parametrize("priority_dtype", [torch.float32, torch.float64, torch.float16])
def test_marks_match_general_path_and_torchrl(dtype, alpha, priority_dtype, fills):
    """Round-robin writes (wrapping around), updates with priorities below and above 1 (so
    that the default priority is above the largest priority now and then, and marking moves
    it), marks of scattered indices, of skipped (-1) items and of an int."""
    fast, general, ref = _trio(ours.PrioritizedSampler, trl.PrioritizedSampler, CAPACITY, alpha, 0.5, dtype=dtype)
    storage = _storage()
    rng = np.random.default_rng(int(alpha * 10) + (dtype is torch.float64))
    cursor = 0
    for step in range(40):
        action = step % 5
        if action in (0, 1, 2):
            n = int(rng.integers(1, 25))
            index = (cursor + torch.arange(n)) % CAPACITY
            cursor = (cursor + n) % CAPACITY
        elif action == 3:
            index = torch.as_tensor(rng.choice(CAPACITY, size=int(rng.integers(1, 8)), replace=False))
            if step % 3 == 0:
                index[0] = -1  # an item a writer skipped
        else:
            index = int(rng.integers(0, CAPACITY))
        for sampler in (fast, general, ref):
            sampler.mark_update(index)
        _assert_same(fast, general, ref)
        if step % 4 == 3:
            update = torch.as_tensor(rng.choice(CAPACITY, size=6, replace=False))
            scale = 0.5 if step < 20 else 5.0  # below 1 first: the default priority exceeds them
            priority = (torch.as_tensor(rng.random(6)) * scale).to(priority_dtype)
            for sampler in (fast, general, ref):
                sampler.update_priority(update, priority)
            _assert_same(fast, general, ref)
        fast._rng, general._rng = torch.Generator().manual_seed(step), torch.Generator().manual_seed(step)
        (fi, finfo), (gi, ginfo) = fast.sample(storage, 16), general.sample(storage, 16)
        assert torch.equal(fi, gi) and torch.equal(finfo["priority_weight"], ginfo["priority_weight"])
    # every round-robin write was filled as ranges (and some scattered marks too)
    assert sum(written is True for _, written in fills) >= 24


@pytest.mark.usefixtures("torchrl_trees")
def test_first_mark_sets_the_largest_priority_as_torchrl(fills):
    """Without a largest priority the default is ``(1 + eps) ** alpha``, a float: marking
    makes it the largest priority (a default-dtype tensor), with the first item's index."""
    fast, general, ref = _trio(ours.PrioritizedSampler, trl.PrioritizedSampler, CAPACITY, 0.6, 0.5)
    for sampler in (fast, general, ref):
        sampler.mark_update(torch.arange(37, 45) % CAPACITY)
    _assert_same(fast, general, ref)
    assert int(fast._max_priority[1]) == 37 and fast._max_priority[0].dtype == torch.float32
    fast._max_priority[0].fill_(0.5)  # the caller's tensor, changed in place: kept track of
    general._max_priority[0].fill_(0.5)
    for sampler in (fast, general):
        sampler.mark_update(torch.arange(3))
    _assert_same(fast, general)
    assert fills == [(8, True), (3, True)]


@pytest.mark.usefixtures("torchrl_trees")
def test_default_priority_follows_its_inputs():
    """alpha, eps, the largest priority (replaced, changed in place, erased, loaded) and the
    default dtype all change the default priority between two marks."""
    fast, general, ref = _trio(ours.PrioritizedSampler, trl.PrioritizedSampler, CAPACITY, 0.7, 0.5)
    changes = [
        lambda s: s.update_priority(torch.tensor([3, 4]), torch.tensor([2.0, 9.0])),
        lambda s: setattr(s, "alpha", 0.3),
        lambda s: setattr(s, "_eps", 0.25),
        lambda s: s._max_priority[0].mul_(3),
        lambda s: s.update_priority(torch.tensor([5]), torch.tensor([100.0], dtype=torch.float64)),
        lambda s: s.load_state_dict(
            {"_alpha": 0.9, "_beta": 0.5, "_eps": 1e-8, "_max_priority": (torch.tensor(0.25), torch.tensor(1)),
             "_sum_tree": replay.SumSegmentTreeFp32(CAPACITY), "_min_tree": replay.MinSegmentTreeFp32(CAPACITY)}),
        lambda s: s._empty(),
    ]
    for step, change in enumerate(changes):
        for sampler in (fast, general, ref):
            change(sampler)
            sampler.mark_update(torch.arange(step * 5, step * 5 + 7))
        _assert_same(fast, general, ref)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        for sampler in (fast, general, ref):
            sampler._empty()
            sampler.mark_update(torch.arange(4))  # (1 + eps) ** alpha becomes a float64 tensor
        _assert_same(fast, general, ref)
        assert fast._max_priority[0].dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)


def test_dumps_and_loads_keep_the_default_priority_current(tmp_path):
    fast, general = ours.PrioritizedSampler(CAPACITY, 0.7, 0.5), _general(ours.PrioritizedSampler(CAPACITY, 0.7, 0.5))
    source = ours.PrioritizedSampler(CAPACITY, 0.7, 0.5)
    source.update_priority(torch.arange(10), torch.linspace(0, 6, 10))
    source.dumps(tmp_path)
    for sampler in (fast, general):
        sampler.update_priority(torch.tensor([1]), torch.tensor([2.0]))
        sampler.mark_update(torch.arange(4))
        sampler.loads(tmp_path)  # the largest priority tensor is overwritten in place
        sampler.mark_update(torch.arange(20, 30))
    _assert_same(fast, general)
    assert float(fast._max_priority[0]) == 6.0


def test_inference_tensor_as_largest_priority():
    """An inference tensor keeps no version counter: the default priority is derived at
    every mark, and stays right."""
    fast, general = ours.PrioritizedSampler(CAPACITY, 0.7, 0.5), _general(ours.PrioritizedSampler(CAPACITY, 0.7, 0.5))
    for sampler in (fast, general):
        with torch.inference_mode():
            sampler.update_priority(torch.tensor([2]), torch.tensor([3.0]))
        sampler.mark_update(torch.arange(5))
        sampler.mark_update(torch.arange(30, 45) % CAPACITY)
    _assert_same(fast, general)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rejected_mark_changes_nothing(dtype, fills):
    """A mark past the trees' capacity, or whose default priority cannot be stored: the same
    error as the general path, and nothing changes (largest priority included)."""
    fast, general = ours.PrioritizedSampler(CAPACITY, 2.0, 0.5, dtype=dtype), _general(
        ours.PrioritizedSampler(CAPACITY, 2.0, 0.5, dtype=dtype))
    capacity = fast._sum_tree.capacity
    huge = float(torch.finfo(dtype).max) ** 0.25  # its 0.11 default priority squared is inf
    # From torchrl 0.13 on the default priority is the raw largest one, whose stored value the
    # update already held: that mark succeeds.
    raw_default = since("prioritized_raw_default_priority")
    attempts = [
        lambda s: s.mark_update(torch.arange(capacity - 2, capacity + 3)),
        lambda s: s.mark_update(torch.tensor([capacity - 1, 0, capacity])),
        lambda s: (s.update_priority(torch.tensor([1]), torch.tensor([huge], dtype=dtype)),
                   s.mark_update(torch.arange(3, 9))),
    ]
    for attempt in attempts:
        before = _state(fast)
        assert _state(general) == before
        got, expected = _outcome(lambda: attempt(fast)), _outcome(lambda: attempt(general))
        assert got == expected
        assert got is not None or (raw_default and attempt is attempts[-1])
        _assert_same(fast, general)
    # each was tried as ranges first, and refused whole (or left to the general path)
    assert [written for _, written in fills] == [IndexError, False, True if raw_default else ValueError]
    fast._sum_tree.update(0, 1.0)  # the trees still take writes
    assert fast._sum_tree[0] == 1.0


@pytest.mark.usefixtures("torchrl_trees")
def test_slice_sampler_marks_match():
    fast, general, ref = _trio(
        ours.PrioritizedSliceSampler, trl.PrioritizedSliceSampler, CAPACITY, 0.7, 0.5, slice_len=4,
    )
    for start in range(0, 200, 13):
        index = (start + torch.arange(13)) % CAPACITY
        for sampler in (fast, general, ref):
            sampler.mark_update(index)
            sampler.update_priority(index[:3], torch.tensor([0.5, 2.0, 1.0]) * (start / 50 + 0.1))
        _assert_same(fast, general, ref)


def test_marks_call_overridden_methods():
    """A subclass that overrides update_priority (or default_priority) sees every mark, as
    torchrl's mark_update calls them."""
    calls = []

    class Counting(ours.PrioritizedSampler):
        def update_priority(self, index, priority, *, storage=None):
            calls.append(("update", index.tolist(), float(priority)))
            super().update_priority(index, priority, storage=storage)

    class Fixed(ours.PrioritizedSampler):
        @property
        def default_priority(self):
            return 3.0

    counting = Counting(CAPACITY, 0.7, 0.5)
    counting.mark_update(torch.arange(3))
    first_default = 1.0 if since("prioritized_raw_default_priority") else (1 + 1e-8) ** 0.7
    assert calls == [("update", [0, 1, 2], pytest.approx(first_default))]
    fixed, general = Fixed(CAPACITY, 1.0, 0.5), _general(Fixed(CAPACITY, 1.0, 0.5))
    for sampler in (fixed, general):
        sampler.mark_update(torch.arange(5))
    _assert_same(fixed, general)
    assert fixed._sum_tree[0] == pytest.approx(3.0)


def test_within_buffer_and_other_indices_take_the_general_path():
    """With ``max_priority_within_buffer`` (a mark can erase the largest priority), an int32
    index and a 2-d one: the range fill is not used, the outcome is the general path's."""
    fast, general = (ours.PrioritizedSampler(CAPACITY, 0.7, 0.5, max_priority_within_buffer=True),
                     _general(ours.PrioritizedSampler(CAPACITY, 0.7, 0.5, max_priority_within_buffer=True)))
    storage = LazyTensorStorage(CAPACITY, ndim=2)
    storage.set(torch.arange(5), torch.zeros(5, 8))
    for sampler in (fast, general):
        sampler.update_priority(torch.tensor([3]), torch.tensor([8.0]))
        sampler.mark_update(torch.arange(2, 6))  # overwrites the largest: rebuilt from the leaves
        sampler.mark_update(torch.arange(6, 9, dtype=torch.int32))
        sampler.mark_update(torch.tensor([[0, 1], [0, 2]]), storage=storage)
    _assert_same(fast, general)
    assert fast._mark_ranges(torch.arange(3), None) is False


def test_pickled_and_copied_samplers_mark_alike():
    import copy
    import pickle

    fast, general = ours.PrioritizedSampler(CAPACITY, 0.7, 0.5), _general(ours.PrioritizedSampler(CAPACITY, 0.7, 0.5))
    for sampler in (fast, general):
        sampler.update_priority(torch.tensor([1, 2]), torch.tensor([1.0, 3.0]))
        sampler.mark_update(torch.arange(3, 6))
    assert "_max_priority_record" not in fast.__getstate__()  # a cache: not pickled
    for twin in (pickle.loads(pickle.dumps(fast)), copy.deepcopy(fast)):
        twin._max_priority[0].fill_(0.5)  # its own tensor: the twin follows it, not fast's record
        general_twin = copy.deepcopy(general)
        general_twin._max_priority[0].fill_(0.5)
        for sampler in (twin, general_twin):
            sampler.mark_update(torch.arange(38, 44) % CAPACITY)
        _assert_same(twin, general_twin)
    fast.mark_update(torch.arange(10, 12))
    general.mark_update(torch.arange(10, 12))
    _assert_same(fast, general)
