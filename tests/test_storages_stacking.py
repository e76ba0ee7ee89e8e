"""A list storage's batch stacked leaf by leaf is exactly tensordict's stack of the items."""
import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict

import torchrl_compat
from torchrl_compat.storages import _stack_anything
from torchrl_compat.storages._stacking import stack_same_structure


def _reference(items):
    return LazyStackedTensorDict.maybe_dense_stack(items)


def _assert_same_batch(ours, reference):
    assert type(ours) is type(reference)
    assert ours.batch_size == reference.batch_size
    assert ours.device == reference.device
    assert set(ours.keys(True, True)) == set(reference.keys(True, True))
    for key in reference.keys(True, True):
        a, b = ours.get(key), reference.get(key)
        assert type(a) is type(b), key
        assert a.dtype == b.dtype and a.shape == b.shape, key
        assert torch.equal(a, b), key
    for key in reference.keys(True):
        assert type(ours.get(key)) is type(reference.get(key)), key


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
