"""Tensor storages read and write rows leaf by leaf (``storages/_rows.py``): the same data,
results and errors as torchrl's storages, which index the whole tensordict.

Random operations run on ours and on torchrl's storage of the same class side by side: writes
of random rows (repeated ones included) of nested tensordicts, reads of random rows (negative
ones on a full storage, out-of-range ones, none at all), batches the short path refuses (other
dtypes, missing or extra keys, rows of another shape), on 1-D and 2-D storages.
"""
import pytest
import torch
from hypothesis import given, settings, strategies as st
from tensordict import TensorDict

import torchrl.data.replay_buffers.storages as trl

import torchrl_compat.storages as ours
from torchrl_compat.storages._rows import get_rows, set_rows

CLASSES = ["LazyTensorStorage", "LazyMemmapStorage"]


def make_batch(generator, shape, *, dtype=torch.float32, extra=False, missing=False):
    data = {
        "obs": torch.randn(*shape, 3, generator=generator).to(dtype),
        "action": torch.randint(0, 9, (*shape, 1), generator=generator),
        ("next", "obs"): torch.randn(*shape, 3, generator=generator),
        ("next", "done"): torch.rand(*shape, 1, generator=generator) > 0.5,
        "pixels": torch.randint(0, 255, (*shape, 2, 2), generator=generator, dtype=torch.uint8),
    }
    if extra:
        data["extra"] = torch.ones(*shape)
    if missing:
        del data["action"]
    return TensorDict(data, batch_size=list(shape))


def assert_same(mine, theirs):
    assert type(mine) is type(theirs)
    if isinstance(theirs, torch.Tensor):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        assert torch.equal(mine, theirs)
        return
    assert mine.batch_size == theirs.batch_size
    assert list(mine.keys(True, True)) == list(theirs.keys(True, True))
    for key in theirs.keys(True, True):
        assert type(mine[key]) is type(theirs[key]), key
        assert mine[key].dtype == theirs[key].dtype, key
        assert torch.equal(mine[key], theirs[key]), key


def pair(cls_name, capacity, ndim, tmp_path_factory):
    """Ours and torchrl's storage of ``capacity`` rows (of 3 items each when ``ndim`` is 2)."""
    kwargs = {"ndim": ndim}
    capacity = capacity * 3 if ndim == 2 else capacity
    if cls_name == "LazyMemmapStorage":
        return (
            getattr(ours, cls_name)(capacity, scratch_dir=tmp_path_factory.mktemp("ours"), **kwargs),
            getattr(trl, cls_name)(capacity, scratch_dir=tmp_path_factory.mktemp("theirs"), **kwargs),
        )
    return getattr(ours, cls_name)(capacity, **kwargs), getattr(trl, cls_name)(capacity, **kwargs)


def get_both(mine, theirs, index):
    try:
        expected = theirs.get(index)
    except Exception as error:  # noqa: BLE001 - whatever torchrl raises, ours must raise too
        with pytest.raises(type(error)) as caught:
            mine.get(index)
        assert str(caught.value) == str(error)
        return
    assert_same(mine.get(index), expected)


@pytest.mark.parametrize("cls_name", CLASSES)
@given(
    seed=st.integers(0, 2**31 - 1),
    capacity=st.integers(1, 40),
    ndim=st.sampled_from([1, 2]),
    steps=st.lists(
        st.tuples(st.sampled_from(["set", "set", "get", "odd"]), st.integers(0, 60)), min_size=1, max_size=8
    ),
)
@settings(max_examples=40, deadline=None)
def test_rows_as_torchrl(tmp_path_factory, cls_name, seed, capacity, ndim, steps):
    generator = torch.Generator().manual_seed(seed)
    mine, theirs = pair(cls_name, capacity, ndim, tmp_path_factory)
    cols = (3,) if ndim == 2 else ()
    first = make_batch(generator, (capacity, *cols))
    mine.set(torch.arange(capacity), first)
    theirs.set(torch.arange(capacity), first)
    for kind, n in steps:
        if kind == "set":
            index = torch.randint(0, capacity, (n,), generator=generator)  # repeats included
            batch = make_batch(generator, (n, *cols))
            mine.set(index, batch)
            theirs.set(index, batch)
        elif kind == "odd":  # batches the short path refuses: the generic path writes them
            index = torch.randint(0, capacity, (n,), generator=generator)
            variant = n % 3
            batch = make_batch(
                generator, (n, *cols), dtype=torch.float64 if variant == 0 else torch.float32,
                extra=variant == 1, missing=variant == 2,
            )
            for storage in (mine, theirs):
                try:
                    storage.set(index, batch.clone())
                except Exception as error:  # noqa: BLE001
                    outcome = (type(error), str(error))
                else:
                    outcome = None
                if storage is mine:
                    mine_outcome = outcome
            assert (mine_outcome is None) == (outcome is None)
        else:
            index = torch.randint(-capacity, capacity, (n,), generator=generator)
            get_both(mine, theirs, index)
        get_both(mine, theirs, torch.arange(capacity))
    for index in (torch.tensor([capacity]), torch.tensor([-capacity - 1]), torch.tensor([], dtype=torch.long)):
        get_both(mine, theirs, index)


@pytest.mark.parametrize("cls_name", CLASSES)
def test_half_filled_reads_check_the_length(tmp_path_factory, cls_name):
    """On a storage not yet full, rows past the length are refused as torchrl's are."""
    generator = torch.Generator().manual_seed(0)
    mine, theirs = pair(cls_name, 10, 1, tmp_path_factory)
    batch = make_batch(generator, (6,))
    mine.set(torch.arange(6), batch)
    theirs.set(torch.arange(6), batch)
    for index in (torch.tensor([0, 5, -1, -6]), torch.tensor([2, 2, 2])):
        get_both(mine, theirs, index)
    with pytest.raises(IndexError):
        mine.get(torch.tensor([6]))


def test_short_paths_refuse_what_they_do_not_handle():
    """The row helpers hand back (``None`` / ``False``, nothing written) anything they do not
    handle, so the generic path decides."""
    data = make_batch(torch.Generator().manual_seed(0), (8,))
    before = data.clone()
    index = torch.tensor([1, 2])
    assert get_rows(data, index.to(torch.float32), _arrays()) is None
    assert get_rows(data, index.view(2, 1), _arrays()) is None
    assert get_rows(data, torch.tensor([8]), _arrays()) is None  # out of range: torch raises
    batch = make_batch(torch.Generator().manual_seed(1), (2,))
    assert not set_rows(data, torch.tensor([1, 8]), batch)  # out of range
    assert not set_rows(data, torch.tensor([-1, 0]), batch)  # negative: left to torch
    assert not set_rows(data, index, batch.apply(lambda x: x.double() if x.is_floating_point() else x))
    assert not set_rows(data, index, make_batch(torch.Generator(), (2,), extra=True))
    assert not set_rows(data, index, make_batch(torch.Generator(), (2,), missing=True))
    assert not set_rows(data, index, make_batch(torch.Generator(), (3,)))
    needs_grad = batch.clone()
    needs_grad.set("obs", needs_grad["obs"].requires_grad_())
    assert not set_rows(data, index, needs_grad)
    assert_same(data, before)
    assert set_rows(data, index, batch)
    assert_same(data[index], batch)


def _arrays():
    from torchrl_compat.storages._rows import LeafArrays

    return LeafArrays()


@pytest.mark.parametrize("device", [None, "cpu"])
def test_plain_tensordict_is_what_new_unsafe_builds(device):
    from torchrl_compat.storages._tensordict_build import _CONSTANTS, plain_tensordict

    # the installed tensordict builds its tensordicts the way plain_tensordict reproduces
    assert _CONSTANTS is not None
    device = None if device is None else torch.device(device)
    inner = TensorDict._new_unsafe({"c": torch.arange(3)}, batch_size=torch.Size([3]), device=device)
    values = {"a": torch.randn(3, 2), "b": inner}
    ours = plain_tensordict(dict(values), torch.Size([3]), device)
    reference = TensorDict._new_unsafe(dict(values), batch_size=torch.Size([3]), device=device, nested=False)
    assert type(ours) is TensorDict
    assert ours.__dict__.keys() == reference.__dict__.keys()
    assert ours.device == reference.device and ours.batch_size == reference.batch_size
    assert ours.names == reference.names and not ours.is_locked
    assert list(ours.keys(True, True)) == list(reference.keys(True, True))
    assert (ours == reference).all()
    # a working tensordict: set, index, lock, clone
    ours["d"] = torch.ones(3)
    assert ours[1]["a"].shape == (2,)
    assert ours.clone().lock_().is_locked
