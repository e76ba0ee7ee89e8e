"""A list storage's batch stacked leaf by leaf is exactly tensordict's stack of the items."""
import numpy as np
import pytest
import torch
from hypothesis import event, given, settings, strategies as st
from tensordict import is_non_tensor, lazy_stack, LazyStackedTensorDict, NonTensorData, TensorDict

import torchrl_compat
from torchrl_compat.storages import _stack_anything
from torchrl_compat.storages._stacking import stack_same_structure


def _reference(items):
    return LazyStackedTensorDict.maybe_dense_stack(items)


def _assert_same_batch(ours, reference):
    assert type(ours) is type(reference)
    assert ours.batch_size == reference.batch_size
    assert ours.device == reference.device
    assert list(ours.keys(True, True)) == list(reference.keys(True, True))  # in its order
    for key in reference.keys(True, True):
        a, b = ours.get(key), reference.get(key)
        assert type(a) is type(b), key
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), key
        assert torch.equal(a, b), key
    for key in reference.keys(True):
        assert type(ours.get(key)) is type(reference.get(key)), key


def _assert_same_tree(ours, reference):
    """Two results of the general path (lazy stacks and non-tensor data included) alike."""
    assert type(ours) is type(reference)
    if isinstance(reference, torch.Tensor):
        assert ours.dtype == reference.dtype and torch.equal(ours, reference)
    elif is_non_tensor(reference):
        assert ours.batch_size == reference.batch_size and ours.tolist() == reference.tolist()
    elif isinstance(reference, LazyStackedTensorDict):
        assert ours.stack_dim == reference.stack_dim and len(ours.tensordicts) == len(reference.tensordicts)
        for a, b in zip(ours.tensordicts, reference.tensordicts):
            _assert_same_tree(a, b)
    else:
        assert ours.batch_size == reference.batch_size and ours.device == reference.device
        assert list(ours.keys()) == list(reference.keys())
        for (_, a), (_, b) in zip(ours.items(), reference.items()):
            _assert_same_tree(a, b)


def _item(seed, batch_size=(), extra_key=False, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    values = {
        "obs": torch.randn(*batch_size, 5, generator=gen).to(dtype),
        "pixels": torch.randint(0, 255, (*batch_size, 3, 4, 4), generator=gen, dtype=torch.uint8),
        "next": {"done": torch.rand(*batch_size, 1, generator=gen) > 0.5,
                 "deep": {"r": torch.randn(*batch_size, 1, generator=gen).squeeze(-1)}},
    }
    if extra_key:
        values["extra"] = torch.zeros(*batch_size, 2)
    return TensorDict(values, list(batch_size))


@given(
    count=st.integers(1, 40),
    batch_size=st.sampled_from([(), (1,), (3,), (2, 3)]),
    seed=st.integers(0, 2**16),
)
def test_same_structure_matches_tensordict_stack(count, batch_size, seed):
    items = [_item(seed + i, batch_size) for i in range(count)]
    ours = stack_same_structure(items)
    assert ours is not None
    _assert_same_batch(ours, _reference(items))
    _assert_same_batch(_stack_anything(items), _reference(items))


@pytest.mark.parametrize(
    "odd_one",
    [
        pytest.param(lambda i: _item(i, extra_key=True), id="other keys"),
        pytest.param(lambda i: _item(i, batch_size=(2,)), id="other batch size"),
        pytest.param(lambda i: _item(i).to("meta"), id="other device"),
        pytest.param(lambda i: _item(i).set("obs", torch.zeros(7)), id="leaf shape"),
        pytest.param(lambda i: _item(i).set("obs", _item(i)), id="tensor vs tensordict"),
        pytest.param(lambda i: _item(i).set("note", NonTensorData("x")).exclude("note").set("note", torch.zeros(())),
                     id="late key order"),
        pytest.param(lambda i: _item(i, dtype=torch.float64), id="promoted dtype"),
    ],
)
@pytest.mark.parametrize("position", [0, 1, 4])
def test_an_item_that_differs_gives_tensordicts_batch(odd_one, position):
    items = [_item(i) for i in range(5)]
    items[position] = odd_one(position)
    try:
        reference = _reference(items)
    except Exception as error:  # tensordict refuses the mix: so do we, with its error
        with pytest.raises(type(error)):
            _stack_anything(items)
        return
    ours = _stack_anything(items)
    if isinstance(reference, LazyStackedTensorDict):
        assert isinstance(ours, LazyStackedTensorDict)
        for a, b in zip(ours.tensordicts, reference.tensordicts):
            assert (a == b).all()
    else:
        _assert_same_batch(ours, reference)


def test_general_path_items():
    """Names, non-tensor leaves and other classes are left to tensordict's stack."""
    named = [_item(i, batch_size=(2,)) for i in range(3)]
    for item in named:
        item.names = ["time"]
    assert stack_same_structure(named) is None
    with_text = [_item(i).set("note", NonTensorData(f"n{i}")) for i in range(3)]
    assert stack_same_structure(with_text) is None
    assert _stack_anything(with_text)["note"] == _reference(with_text)["note"]
    lazy = [LazyStackedTensorDict.maybe_dense_stack([_item(i), _item(i + 1)]) for i in range(3)]
    assert stack_same_structure([_item(0), *lazy]) is None


@pytest.mark.parametrize("capacity", [10, 64])
@pytest.mark.parametrize("sampler", ["RandomSampler", "SamplerWithoutReplacement"])
def test_list_storage_buffer_batches(sampler, capacity):
    """The buffer loop on a ListStorage (at capacity and wrapped around), seeded as users do.
    RandomSampler: our batches are torchrl's. SamplerWithoutReplacement draws other
    permutations than torchrl's (see its note): the batches are those of our buffer on a
    LazyTensorStorage, whose batch is one gather per leaf."""
    trd = pytest.importorskip("torchrl.data")
    if sampler == "RandomSampler":
        reference = trd.ReplayBuffer(storage=trd.ListStorage(capacity), sampler=trd.RandomSampler(), batch_size=8)
    else:
        reference = torchrl_compat.ReplayBuffer(storage=torchrl_compat.LazyTensorStorage(capacity),
                                                sampler=torchrl_compat.SamplerWithoutReplacement(), batch_size=8)
    ours = torchrl_compat.ReplayBuffer(storage=torchrl_compat.ListStorage(capacity),
                                       sampler=getattr(torchrl_compat, sampler)(), batch_size=8)
    for step in range(8):
        data = TensorDict({"obs": torch.arange(step * 7, step * 7 + 7.0).unsqueeze(-1),
                           "nested": {"id": torch.arange(7) + step * 7}}, [7])
        results = []
        for rb in (reference, ours):
            rb.extend(data)
            torch.manual_seed(step)  # both sides draw the same numbers
            np.random.seed(step)
            results.append(rb.sample())
        if sampler != "RandomSampler":  # a tensor storage's batches carry its device
            results[0].clear_device_()
        _assert_same_batch(results[1], results[0])


class _Marked(torch.Tensor):
    """A tensor subclass: tensordict keeps it as it is, so its stack is tensordict's."""


def _reordered(td):
    """``td`` with its keys (and its nested TensorDicts' keys) in reverse order."""
    values = {key: _reordered(value) if type(value) is TensorDict else value
              for key, value in reversed(list(td.items()))}
    return TensorDict(values, td.batch_size, device=td.device)


@pytest.mark.parametrize(
    "odd_one, fast",
    [
        pytest.param(_reordered, True, id="keys in another order"),
        pytest.param(lambda td: td.exclude("obs"), False, id="missing key"),
        pytest.param(lambda td: td.exclude(("next", "deep", "r")), False, id="missing nested key"),
        pytest.param(lambda td: td.set(("next", "more"), torch.zeros(1)), False, id="extra nested key"),
        pytest.param(lambda td: td.set(("next", "deep", "r"), torch.zeros(2)), False, id="nested leaf shape"),
        pytest.param(lambda td: td.set(("next", "deep"), TensorDict({"r": torch.zeros(2)}, [2])), False,
                     id="nested batch size"),
        pytest.param(lambda td: td.set(("next", "deep", "r"), torch.zeros(()).as_subclass(_Marked)), False,
                     id="tensor subclass leaf"),
        pytest.param(lambda td: td.set("obs", torch.nn.Parameter(td["obs"])), False, id="parameter leaf"),
        pytest.param(lambda td: td.set(("next", "deep"), lazy_stack(
            [TensorDict({"r": torch.zeros(())}, []), TensorDict({"r": torch.zeros(())}, [])])), False,
            id="nested lazy stack"),
        pytest.param(lambda td: td.set(("next", "done"), torch.ones(1, dtype=torch.int64)), True,
                     id="nested dtype promoted"),
    ],
)
@pytest.mark.parametrize("position", [0, 2])
def test_each_difference_at_each_position(odd_one, fast, position):
    """A key order the first item does not have is stacked in the first item's order (as
    tensordict does); anything else that differs is tensordict's stack."""
    items = [_item(i) for i in range(3)]
    items[position] = odd_one(items[position].clone())
    ours = stack_same_structure(items)
    assert (ours is not None) == fast
    try:
        reference = _reference(items)
    except Exception as error:
        assert ours is None
        with pytest.raises(type(error)):
            _stack_anything(items)
        return
    if fast:
        _assert_same_batch(ours, reference)
    _assert_same_tree(_stack_anything(items), reference)


@pytest.mark.parametrize("named", [[0], [1], [0, 1], [0, 1, 2]])
def test_names_on_any_item(named):
    """Names on some items: the batch (and its names) are tensordict's."""
    items = [_item(i, batch_size=(2,)) for i in range(3)]
    for position in named:
        items[position].names = [f"t{position}"]
    ours = stack_same_structure(items)
    assert (ours is None) == (0 in named)
    reference = _reference(items)
    result = _stack_anything(items)
    _assert_same_batch(result, reference)
    assert result.names == reference.names


def test_one_item_and_empty_tensordicts():
    _assert_same_batch(stack_same_structure([_item(3)]), _reference([_item(3)]))
    empty = [TensorDict({}, [2]) for _ in range(3)]
    _assert_same_batch(stack_same_structure(empty), _reference(empty))
    nested_empty = [TensorDict({"x": torch.zeros(2), "e": TensorDict({}, [2])}, [2]) for _ in range(3)]
    ours = stack_same_structure(nested_empty)
    _assert_same_batch(ours, _reference(nested_empty))
    assert ours["e"].batch_size == _reference(nested_empty)["e"].batch_size


def test_items_in_other_sequences():
    """A tuple of items is stacked as a list is; other sequences go to tensordict's stack."""
    items = [_item(i) for i in range(3)]
    _assert_same_batch(stack_same_structure(tuple(items)), _reference(items))

    class Items:
        def __getitem__(self, index):
            return items[index]

        def __len__(self):
            return len(items)

    assert stack_same_structure(Items()) is None


def test_entries_not_held_in_a_dict():
    """A TensorDict whose entries sit in a dict subclass (tensordict keeps a plain dict)."""
    class Entries(dict):
        pass

    items = [_item(i) for i in range(3)]
    items[1]._tensordict = Entries(items[1]._tensordict)
    assert stack_same_structure(items) is None
    _assert_same_batch(_stack_anything(items), _reference(items))


# Random structures: a spec is a list of (key, node) pairs, a node either
# ("leaf", shape, dtype, kind) or ("td", extra batch dims, spec).
_DTYPES = [torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool]
_KEYS = ["obs", "next", "r", "done", "pixels", "k5"]


@st.composite
def _specs(draw, depth=0):
    keys = draw(st.lists(st.sampled_from(_KEYS), unique=True, min_size=1 if depth == 0 else 0,
                         max_size=3 if depth < 2 else 2))
    spec = []
    for key in keys:
        if depth < 2 and draw(st.booleans()):
            spec.append((key, ("td", draw(st.sampled_from([(), (2,)])), draw(_specs(depth + 1)))))
        else:
            spec.append((key, ("leaf", draw(st.sampled_from([(), (1,), (3,), (2, 2)])),
                               draw(st.sampled_from(_DTYPES)), "tensor")))
    return spec


def _build(spec, batch, gen):
    values = {}
    for key, node in spec:
        if node[0] == "td":
            values[key] = _build(node[2], (*batch, *node[1]), gen)
            continue
        _, shape, dtype, kind = node
        value = (torch.rand((*batch, *shape), generator=gen) * 100).to(dtype)
        if kind == "subclass":
            value = value.as_subclass(_Marked)
        elif kind == "text":
            value = NonTensorData("x", batch_size=batch)
        values[key] = value
    return TensorDict(values, list(batch))


def _paths(spec, prefix=()):
    """Every (path, node) of a spec, nested TensorDicts included."""
    for key, node in spec:
        yield (*prefix, key), node
        if node[0] == "td":
            yield from _paths(node[2], (*prefix, key))


def _mutated(spec, path, change):
    """``spec`` with ``change(spec_at_level, index)`` applied at ``path``'s level (a new spec),
    or ``None`` where the change does not apply there."""
    out = list(spec)
    keys = [key for key, _ in out]
    if path[0] not in keys:
        return change(out, len(out))
    index = keys.index(path[0])
    if len(path) > 1:
        key, (tag, extra, inner) = out[index]
        inner = _mutated(inner, path[1:], change)
        if inner is None:
            return None
        out[index] = (key, (tag, extra, inner))
        return out
    return change(out, index)


def _change(kind, draw):
    """A spec change and whether our stack still takes the items (else: tensordict's stack)."""
    def reorder(level, index):
        return level[::-1]

    def drop(level, index):
        return level[:index] + level[index + 1:]

    def add(level, index):
        return [*level, ("added", ("leaf", (1,), torch.float32, "tensor"))]

    def leaf(replace):
        def change(level, index):
            key, node = level[index]
            if node[0] != "leaf":
                return None
            return [*level[:index], (key, replace(node)), *level[index + 1:]]
        return change

    other_dtype = draw(st.sampled_from(_DTYPES))
    changes = {
        "reorder": (reorder, True),
        "drop": (drop, False),
        "add": (add, False),
        "leaf shape": (leaf(lambda n: ("leaf", (*n[1], 2), n[2], n[3])), False),
        "leaf dtype": (leaf(lambda n: ("leaf", n[1], other_dtype, n[3])), True),
        "tensor subclass": (leaf(lambda n: ("leaf", n[1], n[2], "subclass")), False),
        "non-tensor": (leaf(lambda n: ("leaf", n[1], n[2], "text")), False),
        "leaf to tensordict": (leaf(lambda n: ("td", (), [("r", n)])), False),
    }
    return changes[kind]


@settings(max_examples=300)
@given(
    spec=_specs(),
    batch=st.sampled_from([(), (2,)]),
    count=st.integers(2, 6),
    change=st.sampled_from(["none", "reorder", "drop", "add", "leaf shape", "leaf dtype", "tensor subclass",
                            "non-tensor", "leaf to tensordict"]),
    where=st.integers(0, 2**16),
    data=st.data(),
)
def test_random_structures_match_tensordict_stack(spec, batch, count, change, where, data):
    gen = torch.Generator().manual_seed(where)
    specs = [spec] * count
    apply, fast = _change(change, data.draw) if change != "none" else (None, True)
    on_leaves = change not in ("reorder", "drop", "add")
    paths = [path for path, node in _paths(spec) if node[0] == "leaf" or not on_leaves]
    if change == "add":
        paths.append(("added",))  # at the top level too (the level is the path's parent)
    changed = _mutated(spec, paths[where % len(paths)], apply) if apply and paths else None
    if count > 1 and changed is not None and changed != spec:
        specs[where % count] = changed
    else:
        change, fast = "none", True  # nothing to change there
    items = [_build(s, batch, gen) for s in specs]
    ours = stack_same_structure(items)
    event(f"{change}: {'stacked leaf by leaf' if ours is not None else 'general path'}")
    if fast:
        assert ours is not None
    try:
        reference = _reference(items)
    except Exception as error:  # tensordict refuses the mix: so do we
        assert ours is None
        with pytest.raises(type(error)):
            _stack_anything(items)
        return
    if ours is not None:
        _assert_same_batch(ours, reference)
    else:
        assert change != "none"
        _assert_same_tree(_stack_anything(items), reference)
