"""``TensorStorage.flatten`` on storages of more than one batch dimension, full or partly
filled, of every data kind, compared with torchrl's own storages."""
from __future__ import annotations

import pytest
import torch
from tensordict import is_tensor_collection, tensorclass, TensorDict
from torch.utils._pytree import tree_flatten

import torchrl.data.replay_buffers.storages as T

import torchrl_compat.storages as O

from storage_support import refusals


@tensorclass
class Pair:
    obs: torch.Tensor
    reward: torch.Tensor


KINDS = ["tensor", "tensordict", "tensorclass", "pytree"]


def make_data(kind, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    numel = torch.Size(shape).numel()
    obs = (torch.arange(numel * 2, dtype=torch.float32).reshape(*shape, 2) + seed * 1000)
    reward = torch.randint(0, 100, shape, generator=g)
    if kind == "tensor":
        return obs
    if kind == "tensordict":
        return TensorDict({"obs": obs, ("nested", "reward"): reward}, batch_size=list(shape))
    if kind == "tensorclass":
        return Pair(obs=obs, reward=reward, batch_size=list(shape))
    return {"obs": obs, "more": (reward, obs * 2)}


def leaves(x):
    if is_tensor_collection(x):
        td = x.to_tensordict() if hasattr(x, "to_tensordict") else x
        items = sorted(
            (str(k), v) for k, v in td.items(include_nested=True, leaves_only=True)
        )
        return [v for _, v in items], (type(x).__name__, td.batch_size, [k for k, _ in items])
    flat, spec = tree_flatten(x)
    return flat, (type(x).__name__, str(spec))


def assert_same(a, b):
    la, sa = leaves(a)
    lb, sb = leaves(b)
    assert sa == sb
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert torch.equal(x, y)


def flat_contents(flat):
    assert type(flat) is O.TensorStorage or type(flat) is T.TensorStorage
    return flat.ndim, flat.max_size, len(flat), flat[:]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 2)])
def test_flatten_of_a_full_storage_matches_torchrl(kind, shape):
    ndim = len(shape)
    data = make_data(kind, shape)
    ours = O.TensorStorage(data, ndim=ndim)
    ref = T.TensorStorage(data, ndim=ndim)
    assert ours._is_full and ref._is_full
    flat_o, flat_r = ours.flatten(), ref.flatten()
    assert type(flat_o) is O.TensorStorage
    n_o, size_o, len_o, rows_o = flat_contents(flat_o)
    n_r, size_r, len_r, rows_r = flat_contents(flat_r)
    assert (n_o, size_o, len_o) == (n_r, size_r, len_r) == (1, torch.Size(shape).numel(), torch.Size(shape).numel())
    assert_same(rows_o, rows_r)
    # a model: the rows are the data's first ndim dims merged, in order
    model = make_data(kind, shape)
    first = leaves(rows_o)[0][0]
    want = leaves(model)[0][0].flatten(0, ndim - 1)
    assert torch.equal(first, want)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape,written", [((4, 3), 2), ((3, 2, 2), 1), ((3, 2, 2), 2)])
def test_flatten_of_a_partly_filled_storage_keeps_the_written_rows(kind, shape, written):
    ndim = len(shape)
    data = make_data(kind, (written, *shape[1:]), seed=1)
    row = torch.Size(shape[1:]).numel()
    ours = O.LazyTensorStorage(torch.Size(shape).numel(), ndim=ndim)
    ours.set(range(written), data)
    assert not ours._is_full and ours._len_along_dim0 == written
    flat = ours.flatten()
    assert type(flat) is O.TensorStorage and flat.ndim == 1
    assert len(flat) == flat.max_size == written * row
    # the model: the written rows' leaves with their first ndim dims merged
    for got, want in zip(leaves(flat[:])[0], leaves(data)[0]):
        assert torch.equal(got, want.flatten(0, ndim - 1))
    if kind in ("tensordict", "tensorclass"):
        # torchrl counts its length right for tensor collections only
        ref = T.LazyTensorStorage(torch.Size(shape).numel(), ndim=ndim)
        ref.set(range(written), data)
        flat_r = ref.flatten()
        assert len(flat) == len(flat_r)
        assert_same(flat[:], flat_r[:])


def test_flatten_of_a_one_dim_storage_is_itself_as_torchrl():
    for ns in (O, T):
        store = ns.LazyTensorStorage(4)
        assert store.flatten() is store  # even before the first write
        store.set(range(2), make_data("tensordict", (2,)))
        assert store.flatten() is store


def test_flatten_before_the_first_write_raises_torchrls_error():
    messages = refusals(RuntimeError, lambda family: family.LazyTensorStorage(12, ndim=2).flatten())
    assert messages[0] == messages[1] == "Cannot flatten a non-initialized storage."


@pytest.mark.parametrize("kind", ["tensordict", "tensorclass"])
@pytest.mark.parametrize("written", [None, 1, 2])
def test_flatten_merges_only_the_storage_dims_of_a_deeper_batch(kind, written):
    # the stored tensordicts have a batch dim more than the storage counts (ndim=2): only
    # the first two are merged, the third stays
    data = make_data(kind, (3, 2, 4), seed=2)
    if written is None:
        ours, ref = O.TensorStorage(data, ndim=2), T.TensorStorage(data, ndim=2)
    else:
        ours, ref = O.LazyTensorStorage(6, ndim=2), T.LazyTensorStorage(6, ndim=2)
        for store in (ours, ref):
            store.set(range(written), data[:written])
    flat_o, flat_r = ours.flatten(), ref.flatten()
    rows = 3 if written is None else written
    assert len(flat_o) == len(flat_r) == rows * 2
    assert flat_o[:].batch_size == flat_r[:].batch_size == torch.Size([rows * 2, 4])
    assert_same(flat_o[:], flat_r[:])
