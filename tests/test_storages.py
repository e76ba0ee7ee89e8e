"""torchrl_compat.storages against torchrl 0.11's own storages, operation by operation."""
from __future__ import annotations

import inspect
import pickle
import warnings

import numpy as np
import pytest
import torch
from tensordict import is_tensor_collection, tensorclass, TensorDict
from torch.utils._pytree import tree_flatten, tree_map

import torchrl.data as trl_data
import torchrl.data.replay_buffers.storages as T

import torchrl_compat
import torchrl_compat.storages as O
import torchrl_compat.storages.list as storage_list
import torchrl_compat.storages.tensor as storage_tensor

from twin_checks import assert_no_torchrl_code

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@tensorclass
class Pair:
    obs: torch.Tensor
    reward: torch.Tensor


KINDS = ["tensor", "tensordict", "tensorclass", "pytree"]
ROW = 4  # size of the second batch dim when ndim == 2
CAP0 = 8  # capacity along dim 0


def make_batch(kind, n, ndim, seed):
    g = torch.Generator().manual_seed(seed)
    batch = (n,) if ndim == 1 else (n, ROW)
    obs = torch.randn(*batch, 3, generator=g)
    reward = torch.randint(0, 100, batch, generator=g)
    if kind == "tensor":
        return obs
    if kind == "tensordict":
        return TensorDict(
            {"obs": obs, ("nested", "reward"): reward}, batch_size=list(batch)
        )
    if kind == "tensorclass":
        return Pair(obs=obs, reward=reward, batch_size=list(batch))
    return {"obs": obs, "more": (reward, obs * 2)}


def as_leaves(x):
    if is_tensor_collection(x):
        x = x.to_dict() if not hasattr(x, "to_tensordict") else x.to_tensordict()
        return {
            str(k): v
            for k, v in x.items(include_nested=True, leaves_only=True)
        }, x.batch_size
    leaves, spec = tree_flatten(x)
    return leaves, str(spec)


def assert_same(a, b):
    assert type(a).__name__ == type(b).__name__
    la, sa = as_leaves(a)
    lb, sb = as_leaves(b)
    assert sa == sb
    if isinstance(la, dict):
        assert la.keys() == lb.keys()
        la, lb = [la[k] for k in sorted(la)], [lb[k] for k in sorted(lb)]
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert type(x) is type(y)
        assert x.shape == y.shape and x.dtype == y.dtype
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def wrap_leaves(data, batch_dims):
    """A TensorDict holding the pytree leaves of ``data``, keyed by position.

    torchrl's ndim > 1 bookkeeping is only right for tensor collections (for tensor and
    pytree leaves its ``max_size`` counts the feature dims too), so tensor and pytree
    data are compared with torchrl holding the same leaves in a TensorDict.
    """
    leaves = tree_flatten(data)[0]
    return TensorDict(
        {str(i): leaf for i, leaf in enumerate(leaves)},
        batch_size=leaves[0].shape[:batch_dims],
    )


def unwrap_leaves(td, like):
    leaves, spec = tree_flatten(like)
    from torch.utils._pytree import tree_unflatten

    return tree_unflatten([td[str(i)] for i in range(len(leaves))], spec)


def pair(cls_name, *args, **kwargs):
    return getattr(O, cls_name)(*args, **kwargs), getattr(T, cls_name)(*args, **kwargs)


def index_kinds(length, ndim):
    """Every index kind torchrl accepts, on a storage with ``length`` rows filled."""
    last = length - 1
    out = [
        0,
        last,
        -1,
        -length,
        np.int64(last),
        torch.tensor(last),
        slice(None),
        slice(1, None),
        slice(None, -1),
        slice(0, length, 2),
        slice(-3, None),
        [0, last, 0],
        range(length),
        np.array([last, 0]),
        torch.tensor([last, 0, -1]),
        torch.tensor([[0, 1], [last, 0]]),
        torch.arange(length, dtype=torch.int32),
        (torch.tensor([0, last]),),
        (slice(None),),
        torch.zeros(length, dtype=torch.bool).index_fill_(0, torch.tensor([0]), True),
    ]
    if ndim == 2:
        out += [
            (torch.tensor([0, last]), torch.tensor([1, ROW - 1])),
            (last, 2),
            (slice(None), 1),
            (-1, slice(1, 3)),
            (Ellipsis, 0),
        ]
    return [i for i in out if not (isinstance(i, slice) and not range(length)[i])]


def compare_reads(ours, ref, ndim, wrapped=False):
    assert len(ours) == len(ref)
    assert ours._is_full == ref._is_full
    assert ours._len_along_dim0 == ref._len_along_dim0
    assert ours.shape == ref.shape
    length = ref._len_along_dim0
    for index in index_kinds(length, ndim):
        if wrapped and isinstance(index, tuple) and index[0] is Ellipsis:
            continue  # on a tensor an ellipsis spans the feature dims too, not on a TensorDict
        got = ours[index]
        expected = ref[index]
        if wrapped:
            expected = unwrap_leaves(expected, got)
        assert_same(got, expected)
        if not wrapped:
            assert_same(ours.get(index), ref.get(index))


# --------------------------------------------------------------------------
# set / get against torchrl


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("cls_name", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_set_get_wraparound_matches_torchrl(cls_name, ndim, kind):
    ours, ref = pair(cls_name, CAP0 * (ROW if ndim == 2 else 1), ndim=ndim)
    wrapped = ndim == 2 and kind in ("tensor", "pytree")
    to_ref = (lambda d, dims: wrap_leaves(d, dims)) if wrapped else (lambda d, dims: d)
    assert not ours.initialized and not ref.initialized
    cursor = 0
    # batches of 3 into 8 rows: partial fill, at capacity, then wrapping around twice
    for step in range(6):
        data = make_batch(kind, 3, ndim, seed=step)
        index = torch.arange(cursor, cursor + 3) % CAP0
        cursor = (cursor + 3) % CAP0
        ours.set(index, data)
        ref.set(index, to_ref(data, ndim))
        assert ours.initialized and ref.initialized
        assert ours.max_size == ref.max_size
        compare_reads(ours, ref, ndim, wrapped)
    assert ours._is_full
    # per-item writes (int cursor), slice writes and writes without cursor update
    one = make_batch(kind, 1, ndim, seed=10)
    one = one[0] if kind != "pytree" else {"obs": one["obs"][0], "more": tuple(x[0] for x in one["more"])}
    two = make_batch(kind, 2, ndim, seed=11)
    for store, conv in ((ours, lambda d, dims: d), (ref, to_ref)):
        store.set(5, conv(one, ndim - 1))
        store.set(slice(0, 2), conv(two, ndim))
        store[7] = conv(one, ndim - 1)
    compare_reads(ours, ref, ndim, wrapped)
    assert ours._last_cursor == ref._last_cursor == slice(0, 2)


@pytest.mark.parametrize("kind", ["tensor", "pytree"])
def test_ndim2_tensor_leaves_max_size_counts_slots(kind):
    ours, ref = pair("LazyTensorStorage", CAP0 * ROW, ndim=2)
    data = make_batch(kind, 3, 2, seed=0)
    ours.set(range(3), data)
    ref.set(range(3), data)
    assert ours.max_size == CAP0 * ROW
    assert ref.max_size > CAP0 * ROW  # torchrl multiplies in the feature dims of the leaves
    assert len(ours) == len(ref) == 3 * ROW


@pytest.mark.parametrize("kind", KINDS)
def test_single_item_and_list_writes(kind):
    ours, ref = pair("LazyTensorStorage", 5)
    batch = make_batch(kind, 1, 1, seed=0)
    items = [
        batch[0] if kind != "pytree" else {"obs": batch["obs"][0], "more": tuple(x[0] for x in batch["more"])}
        for _ in range(2)
    ]
    for store in (ours, ref):
        store.set(0, items[0])  # lazy init from a single item
        store.set([1, 2], items)  # list of items: stacked first
    compare_reads(ours, ref, 1)
    assert len(ours) == 3


@pytest.mark.parametrize("kind", ["tensor", "tensordict", "tensorclass", "pytree"])
def test_tensor_storage_given_data(kind):
    data = make_batch(kind, 6, 1, seed=3)
    ours, ref = O.TensorStorage(data), T.TensorStorage(data)
    assert ours.max_size == ref.max_size == 6
    assert ours.initialized and len(ours) == 6 and ours._is_full
    compare_reads(ours, ref, 1)
    ours.set(torch.tensor([0, 1]), make_batch(kind, 2, 1, seed=4))
    assert len(ours) == 6


def test_tensor_storage_bad_construction_messages():
    with pytest.raises(ValueError, match="Expected storage to be non-null"):
        O.TensorStorage(None)
    with pytest.raises(ValueError, match="max_size=3 for a storage of shape"):
        O.TensorStorage(torch.zeros(4), max_size=3)
    # pytree storages have no .shape: torchrl raises AttributeError here
    with pytest.raises(ValueError, match=r"max_size=3 for a storage of shape torch.Size\(\[4\]\)"):
        O.TensorStorage({"a": torch.zeros(4)}, max_size=3)


def test_list_storage_matches_torchrl():
    ours, ref = pair("ListStorage", 4)
    g = torch.Generator().manual_seed(0)
    items = [torch.randn(2, generator=g) for _ in range(4)]
    for store in (ours, ref):
        store.set(0, items[0])
        store.set([1, 2], items[1:3])
        store.set(torch.tensor(3), items[3])
        store.set(slice(0, 2), items[2:4])
        store.set(np.int64(1), items[0])
    assert len(ours) == len(ref) == 4
    for index in [0, -1, slice(1, 3), [0, 3], torch.tensor([3, 0]), np.array([1]), (2,)]:
        a, b = ours[index], ref[index]
        if isinstance(a, list):
            assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
        else:
            assert torch.equal(a, b)
    assert repr(ours) == repr(ref)
    assert repr(O.ListStorage()) == repr(T.ListStorage()) == "ListStorage()"
    assert ours.max_size == ref.max_size
    assert O.ListStorage().max_size == T.ListStorage().max_size == torch.iinfo(torch.int64).max


@pytest.mark.parametrize("cls_name", ["ListStorage", "LazyStackStorage", "CompressedListStorage"])
def test_list_storages_take_a_tensorclass_defined_after_import(cls_name):
    # tensordict registers each tensorclass as it is defined: one defined after our modules
    # were imported is stored item by item, as torchrl stores it
    @tensorclass
    class Late:
        x: torch.Tensor

    ours, ref = pair(cls_name, 8)
    data = Late(x=torch.arange(6.0).reshape(3, 2), batch_size=[3])
    for store in (ours, ref):
        store.set(torch.arange(3), data)
        store.set([3], data[1:2])
    assert len(ours) == len(ref) == 4
    for index in range(4):
        assert type(ours[index]) is type(ref[index])
        assert torch.equal(ours[index].get("x"), ref[index].get("x"))
    # what no storage takes is still refused, with torchrl's message
    with pytest.raises(TypeError, match="Cannot extend a .* with data of type <class 'object'>"):
        ours.set([0], object())


def test_lazy_stack_storage_matches_torchrl():
    ours, ref = pair("LazyStackStorage", 10, stack_dim=-1)
    data = [TensorDict(a=torch.arange(n, dtype=torch.float32), b=torch.ones(2)) for n in (3, 4, 3)]
    for store in (ours, ref):
        store.set(range(3), data)
    a, b = ours[[0, 2]], ref[[0, 2]]
    assert type(a) is type(b) and a.batch_size == b.batch_size
    assert torch.equal(a["a"], b["a"])
    assert torch.equal(ours[1]["a"], ref[1]["a"])


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_device_and_lazy_init(device):
    ours, ref = pair("LazyTensorStorage", 4, device=device)
    assert ours.device == ref.device
    with pytest.raises(RuntimeError, match="non-initialized storage"):
        ours.get(0)
    data = make_batch("tensordict", 2, 1, seed=0)
    ours.set(range(2), data)
    ref.set(range(2), data)
    assert ours.device == ref.device
    assert ours._storage.device == ref._storage.device
    assert ours._storage.batch_size == ref._storage.batch_size == torch.Size([4])


def test_memmap_device_auto_is_cpu():
    ours, ref = pair("LazyMemmapStorage", 4, device="auto")
    assert ours.device == ref.device == torch.device("cpu")
    with pytest.raises(ValueError, match="Memory map device other than CPU"):
        O.LazyMemmapStorage(4, device="meta")


@pytest.mark.parametrize("ndim", [1, 2])
def test_contains_matches_torchrl(ndim):
    ours, ref = pair("LazyTensorStorage", CAP0 * (ROW if ndim == 2 else 1), ndim=ndim)
    data = make_batch("tensordict", 3, ndim, seed=0)
    ours.set(range(3), data)
    ref.set(range(3), data)
    for item in [0, 2, 3, -1, -3, -4, 100]:
        assert ours.contains(item) == ref.contains(item)
        assert (item in ours) == (item in ref)
    for item in [torch.tensor([0, 2, 3, -1]), torch.tensor(2), torch.tensor(5)]:
        assert torch.equal(ours.contains(item), ref.contains(item))
    with pytest.raises(NotImplementedError, match="not supported"):
        ours.contains("a")
    lo, lr = pair("ListStorage", 4)
    lo.set(range(2), [torch.zeros(1)] * 2)
    lr.set(range(2), [torch.zeros(1)] * 2)
    for item in [0, 1, 2, -1, -3]:
        assert lo.contains(item) == lr.contains(item)
    assert torch.equal(lo.contains(torch.tensor([0, 5, -2])), lr.contains(torch.tensor([0, 5, -2])))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ndim", [1, 2])
def test_repr_matches_torchrl(kind, ndim):
    if ndim == 2 and kind in ("tensor", "pytree"):
        pytest.skip("torchrl's max_size is inflated for ndim > 1 tensor leaves")
    ours, ref = pair("LazyTensorStorage", CAP0 * (ROW if ndim == 2 else 1), ndim=ndim)
    assert repr(ours) == repr(ref)
    data = make_batch(kind, 3, ndim, seed=0)
    ours.set(range(3), data)
    ref.set(range(3), data)
    assert repr(ours) == repr(ref)


@pytest.mark.parametrize("ndim", [1, 2])
def test_ndim_helpers_match_torchrl(ndim):
    size = CAP0 * (ROW if ndim == 2 else 1)
    ours, ref = pair("LazyTensorStorage", size, ndim=ndim)
    data = make_batch("tensordict", 3, ndim, seed=0)
    assert ours._max_size_along_dim0(batched_data=data) == ref._max_size_along_dim0(batched_data=data)
    assert ours._max_size_along_dim0(single_data=data[0]) == ref._max_size_along_dim0(single_data=data[0])
    for store in (ours, ref):
        store.set(range(3), data)
    assert ours._max_size_along_dim0() == ref._max_size_along_dim0() == CAP0
    assert ours._total_shape == ref._total_shape
    flat_o, flat_r = ours.flatten(), ref.flatten()
    assert (flat_o is ours) if ndim == 1 else (type(flat_o) is O.TensorStorage)
    assert len(flat_o) == len(flat_r)
    assert_same(flat_o[:], flat_r[:])
    ours._rng = torch.Generator().manual_seed(1)
    ref._rng = torch.Generator().manual_seed(1)
    a, b = ours._rand_given_ndim(16), ref._rand_given_ndim(16)
    if ndim == 1:
        assert torch.equal(a, b)
    else:
        assert len(a) == len(b) == 2 and all(torch.equal(x, y) for x, y in zip(a, b))


def test_ndim2_capacity_rounding_counts_written_items():
    # capacity 10 with rows of 4 rounds up to 3 rows (12 slots); one [3, 4] batch fills them
    ours, ref = pair("LazyTensorStorage", 10, ndim=2)
    data = make_batch("tensordict", 3, 2, seed=0)
    ours.set(range(3), data)
    ref.set(range(3), data)
    assert ours.max_size == ref.max_size == 12
    assert len(ours) == 12 and ours._is_full
    assert len(ref) == 10 and not ref._is_full  # torchrl: length computed before rounding
    assert_same(ours[:], ref[:])


# --------------------------------------------------------------------------
# state_dict


@pytest.mark.parametrize("kind", ["tensor", "tensordict"])
@pytest.mark.parametrize("cls_name", ["LazyTensorStorage", "LazyMemmapStorage"])
@pytest.mark.parametrize("direction", ["ours->ours", "torchrl->ours", "ours->torchrl"])
def test_state_dict_round_trips(kind, cls_name, direction):
    src_mod, dst_mod = {
        "ours->ours": (O, O),
        "torchrl->ours": (T, O),
        "ours->torchrl": (O, T),
    }[direction]
    src = getattr(src_mod, cls_name)(8)
    data = make_batch(kind, 5, 1, seed=0)
    src.set(range(5), data)
    sd = src.state_dict()
    assert set(sd) == {"_storage", "initialized", "_len"}
    # onto a pre-allocated storage, and onto a fresh one
    dst = getattr(dst_mod, cls_name)(8)
    dst.set(range(2), make_batch(kind, 2, 1, seed=1))
    dst.load_state_dict(sd)
    assert len(dst) == 5 and dst.initialized
    if kind == "tensorclass":  # state_dict keeps the tensordict, not the class
        assert_same(dst[:].to_tensordict() if hasattr(dst[:], "to_tensordict") else dst[:], src[:].to_tensordict())
    else:
        assert_same(dst[:], src[:])
    fresh = getattr(dst_mod, cls_name)(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh.load_state_dict(src.state_dict())
    assert len(fresh) == 5
    a = fresh[:]
    b = src[:]
    if kind == "tensorclass":
        b = b.to_tensordict()
    if kind == "tensor":
        assert torch.equal(a, b)
    else:
        assert (a == b).all()


@pytest.mark.parametrize("cls_name", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_state_dict_tensorclass_like_torchrl(cls_name):
    # A tensorclass does not round-trip through state_dict with tensordict 0.11 (TypeError or
    # KeyError, for torchrl and us alike); from tensordict 0.15 it loads back as a TensorDict.
    outcomes = []
    for mod in (O, T):
        store = getattr(mod, cls_name)(4)
        store.set(range(2), make_batch("tensorclass", 2, 1, seed=0))
        loaded = getattr(mod, cls_name)(4)
        try:
            loaded.load_state_dict(store.state_dict())
        except (TypeError, KeyError) as err:
            outcomes.append(type(err))
        else:
            outcomes.append((type(loaded._storage), len(loaded), loaded[:2].to_dict()))
    assert type(outcomes[0]) is type(outcomes[1])
    if isinstance(outcomes[0], tuple):
        (cls_ours, len_ours, data_ours), (cls_ref, len_ref, data_ref) = outcomes
        assert (cls_ours, len_ours) == (cls_ref, len_ref)
        assert data_ours.keys() == data_ref.keys()
        for key in data_ours:
            assert torch.equal(torch.as_tensor(data_ours[key]), torch.as_tensor(data_ref[key]))
    else:
        assert outcomes[0] is outcomes[1]


def test_state_dict_pytree_and_list_storage():
    ours, ref = pair("LazyTensorStorage", 4)
    data = make_batch("pytree", 2, 1, seed=0)
    ours.set(range(2), data)
    ref.set(range(2), data)
    with pytest.raises(TypeError, match="not supported"):
        ours.state_dict()
    with pytest.raises(TypeError):
        ref.state_dict()
    lo, lr = pair("ListStorage", 4)
    items = [torch.zeros(2), TensorDict(a=torch.ones(2))]
    lo.set(range(2), items)
    lr.set(range(2), items)
    for src, dst in [(lo, O.ListStorage(4)), (lr, O.ListStorage(4)), (lo, T.ListStorage(4))]:
        dst.load_state_dict(src.state_dict())
        assert len(dst) == 2 and torch.equal(dst[0], items[0])
        assert (dst[1] == items[1]).all()
    # a bad entry leaves the previous content in place
    with pytest.raises(TypeError, match="not supported by ListStorage.load_state_dict"):
        lo.load_state_dict({"_storage": [torch.ones(1), "bad"]})
    assert len(lo) == 2 and torch.equal(lo[0], items[0])


# --------------------------------------------------------------------------
# torchrl replay buffers driving our storages


@pytest.mark.parametrize(
    "cls_name,kwargs",
    [
        ("LazyTensorStorage", {}),
        ("LazyMemmapStorage", {}),
        ("LazyTensorStorage", {"ndim": 2}),
        ("ListStorage", {}),
        ("LazyStackStorage", {}),
        ("CompressedListStorage", {}),
    ],
)
def test_torchrl_replay_buffer_end_to_end(cls_name, kwargs):
    ndim = kwargs.get("ndim", 1)
    size = CAP0 * (ROW if ndim == 2 else 1)
    buffers = []
    for mod in (O, T):
        rb = trl_data.ReplayBuffer(
            storage=getattr(mod, cls_name)(size, **kwargs),
            batch_size=5,
            generator=torch.Generator().manual_seed(0),
        )
        buffers.append(rb)
    for step in range(4):  # 12 rows into 8: wraps around
        data = make_batch("tensordict", 3, ndim, seed=step)
        idx = [rb.extend(data) for rb in buffers]
        assert torch.equal(idx[0], idx[1])
        assert len(buffers[0]) == len(buffers[1])
    for _ in range(3):
        a, b = (rb.sample() for rb in buffers)
        assert_same(a.to_tensordict() if hasattr(a, "to_tensordict") else a, b.to_tensordict() if hasattr(b, "to_tensordict") else b)
    assert_same(buffers[0][:], buffers[1][:]) if cls_name not in ("ListStorage",) else None
    assert buffers[0]._storage._is_full == buffers[1]._storage._is_full
    buffers[0].empty()
    assert len(buffers[0]) == 0


def test_torchrl_tensordict_replay_buffer_and_default_collate():
    rb = trl_data.TensorDictReplayBuffer(storage=O.LazyTensorStorage(16), batch_size=4)
    rb.extend(make_batch("tensordict", 10, 1, seed=0))
    assert len(rb) == 10
    sample = rb.sample()
    assert sample.batch_size == torch.Size([4]) and "index" in sample.keys()
    assert T._get_default_collate(O.LazyTensorStorage(2)) is T._collate_id
    assert O._get_default_collate(O.ListStorage(2)) is O._stack_anything
    assert O._get_default_collate(O.CompressedListStorage(2)).__name__ == "lazy_stack"
    with pytest.raises(NotImplementedError, match="Could not find a default collate_fn"):
        O._get_default_collate(object())


@pytest.mark.parametrize("name", O.__all__)
def test_no_torchrl_method_runs_on_our_storages(name):
    assert_no_torchrl_code(getattr(O, name), owner_module="torchrl_compat.storages")


# --------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("kind", KINDS)
def test_out_of_range_reads_name_the_index(kind):
    ours = O.LazyTensorStorage(8)
    ours.set(range(3), make_batch(kind, 3, 1, seed=0))
    with pytest.raises(IndexError, match=r"index 3 is out of range for a storage of length 3"):
        ours[3]
    with pytest.raises(IndexError, match=r"index -4 is out of range"):
        ours[-4]
    with pytest.raises(IndexError, match=r"index 7 at position 2 is out of range for a storage of length 3"):
        ours[torch.tensor([0, 1, 7])]
    with pytest.raises(IndexError, match=r"index -9 at position 1"):
        ours[[0, -9]]
    with pytest.raises(IndexError, match=r"index 5 at position 0"):
        ours[(torch.tensor([5]),)]
    with pytest.raises(IndexError):
        ours[torch.tensor([0.5])]
    # reads past the filled part but within capacity fail in torchrl too
    ref = T.LazyTensorStorage(8)
    ref.set(range(3), make_batch(kind, 3, 1, seed=0))
    with pytest.raises(IndexError):
        ref[torch.tensor([0, 1, 7])]


def test_list_storage_errors_and_atomic_batch_writes():
    store = O.ListStorage(3)
    store.set(range(2), [torch.zeros(1), torch.ones(1)])
    with pytest.raises(IndexError, match=r"index 5 is out of range for a storage of length 2"):
        store[5]
    with pytest.raises(IndexError, match=r"index 4 at position 1 is out of range for a storage of length 2"):
        store[[0, 4]]
    with pytest.raises(IndexError, match=r"index 4 at position 1"):
        store[torch.tensor([1, 4])]
    with pytest.raises(RuntimeError, match="more than one item away"):
        store.set(3, torch.zeros(1))
    with pytest.raises(RuntimeError, match="maximum capacity is 3"):
        store.set([2, 3], [torch.zeros(1)] * 2)
    with pytest.raises(RuntimeError, match=r"index of the item to be set is 5 \(position 1"):
        store.set([0, 5], [torch.full((1,), 9.0)] * 2)
    with pytest.raises(ValueError, match="Cannot set 1 items at 2 cursor positions"):
        store.set([0, 1], [torch.full((1,), 9.0)])
    with pytest.raises(TypeError, match="Cannot extend a"):
        store.set([0], object())
    with pytest.raises(RuntimeError, match="one-length tuples"):
        store[(0, 1)]
    # nothing written by the failed calls
    assert len(store) == 2
    assert torch.equal(store[0], torch.zeros(1)) and torch.equal(store[1], torch.ones(1))
    # torchrl writes the first items before failing
    ref = T.ListStorage(3)
    ref.set(range(2), [torch.zeros(1), torch.ones(1)])
    with pytest.raises(RuntimeError):
        ref.set([0, 5], [torch.full((1,), 9.0)] * 2)
    assert torch.equal(ref[0], torch.full((1,), 9.0))


@pytest.mark.parametrize("kind", ["tensor", "tensordict", "pytree"])
def test_failed_writes_keep_length_and_content(kind):
    ours = O.LazyTensorStorage(4)
    ours.set(range(2), make_batch(kind, 2, 1, seed=0))
    before = ours[:]
    with pytest.raises(IndexError, match="out of bounds"):
        ours.set(torch.tensor([2, 9]), make_batch(kind, 2, 1, seed=1))
    with pytest.raises(RuntimeError):
        ours.set(torch.tensor([2, 3]), make_batch(kind, 3, 1, seed=1))  # 3 items, 2 cursors
    assert len(ours) == 2 and ours._last_cursor == range(2)
    assert_same(ours[:], before)
    ref = T.LazyTensorStorage(4)
    ref.set(range(2), make_batch(kind, 2, 1, seed=0))
    with pytest.raises(IndexError):
        ref.set(torch.tensor([2, 9]), make_batch(kind, 2, 1, seed=1))
    assert len(ref) == 4  # torchrl grew the length before the write failed


def test_flip_list_error_message():
    store = O.LazyTensorStorage(4)
    with pytest.raises(RuntimeError, match="same tree structure"):
        store.set([0, 1], [torch.zeros(2), torch.zeros(3)])
    assert not store.initialized and len(store) == 0


# --------------------------------------------------------------------------
# pickling and processes


def test_pickle_keeps_length_and_data():
    store = O.LazyTensorStorage(6)
    store.set(range(4), make_batch("tensordict", 4, 1, seed=0))
    store._rng = torch.Generator()
    clone = pickle.loads(pickle.dumps(store))
    assert len(clone) == 4 and clone._rng is None
    assert (clone[:] == store[:]).all()
    clone.set(range(4, 6), make_batch("tensordict", 2, 1, seed=1))
    assert len(clone) == 6 and len(store) == 4  # plain pickles don't share the length


def test_getstate_rules_when_spawning(monkeypatch):
    # Each storage module asks multiprocessing whether it is being pickled for a spawn.
    for module in (storage_list, storage_tensor):
        monkeypatch.setattr(module, "get_spawning_popen", lambda: object())
    with pytest.raises(RuntimeError, match="Cannot share a storage of type"):
        O.ListStorage(3).__getstate__()
    with pytest.raises(RuntimeError, match="Cowardly refusing to share"):
        O.LazyTensorStorage(3).__getstate__()
    store = O.LazyTensorStorage(3)
    store.set(0, torch.zeros(2))
    state = store.__getstate__()
    assert "_len_value" in state and "_len_shared" not in state and "len__context" not in state
    # pytree storages can be sent too (torchrl's check calls tree_map with swapped arguments)
    tree = O.LazyTensorStorage(3)
    tree.set(range(2), make_batch("pytree", 2, 1, seed=0))
    assert "_len_value" in tree.__getstate__()
    shared = O.LazyTensorStorage(3, shared_init=True)
    assert "_init_event" in shared.__getstate__()


def _fork_writer(store):
    store.set(range(3), make_batch("tensordict", 3, 1, seed=0))


def test_length_written_in_forked_child_is_seen():
    import multiprocessing as mp

    store = O.LazyTensorStorage(8)
    store.set(0, make_batch("tensordict", 1, 1, seed=0)[0])
    assert len(store) == 1
    ctx = mp.get_context("fork")
    proc = ctx.Process(target=_fork_writer, args=(store,))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    assert len(store) == 4 and store._len == 4


def test_len_is_int64():
    store = O.LazyTensorStorage(2**40)
    store._len = 2**33
    assert len(store) == 2**33 and store._len == 2**33


def test_compilable_storage_keeps_plain_int_length():
    store = O.LazyTensorStorage(4, compilable=True)
    store.set(range(2), torch.zeros(2, 3))
    assert len(store) == 2 and store.__dict__["_len_value"] == 2
    with pytest.raises(RuntimeError, match="Cannot share a compilable storage"):
        O.LazyTensorStorage(4, compilable=True, shared_init=True)


# --------------------------------------------------------------------------
# memmap


def test_memmap_scratch_dir_layout_and_existsok(tmp_path):
    data = make_batch("tensordict", 3, 1, seed=0)
    ours = O.LazyMemmapStorage(4, scratch_dir=tmp_path / "ours")
    ref = T.LazyMemmapStorage(4, scratch_dir=tmp_path / "ref")
    ours.set(range(3), data)
    ref.set(range(3), data)
    assert ours.scratch_dir == str(tmp_path / "ours") + "/"
    files = lambda root: sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert files(tmp_path / "ours") == files(tmp_path / "ref")
    assert type(ours[0]["obs"]).__name__ == type(ref[0]["obs"]).__name__ == "MemoryMappedTensor"
    assert not ours._auto_cleanup  # user directory: kept
    O._cleanup_all_memmap_storages.__wrapped__ if hasattr(O._cleanup_all_memmap_storages, "__wrapped__") else None
    assert (tmp_path / "ours").exists()
    again = O.LazyMemmapStorage(4, scratch_dir=tmp_path / "ours", existsok=False)
    again_ref = T.LazyMemmapStorage(4, scratch_dir=tmp_path / "ref", existsok=False)
    with pytest.raises(RuntimeError) as err_ours:
        again.set(range(3), data)
    with pytest.raises(RuntimeError) as err_ref:
        again_ref.set(range(3), data)
    assert type(err_ours.value) is type(err_ref.value)
    ok = O.LazyMemmapStorage(4, scratch_dir=tmp_path / "ours", existsok=True)
    ok.set(range(3), data)
    assert len(ok) == 3
    pytree = O.LazyMemmapStorage(4, scratch_dir=tmp_path / "tree")
    pytree_ref = T.LazyMemmapStorage(4, scratch_dir=tmp_path / "tree_ref")
    tree = make_batch("pytree", 2, 1, seed=0)
    pytree.set(range(2), tree)
    pytree_ref.set(range(2), tree)
    assert files(tmp_path / "tree") == files(tmp_path / "tree_ref")
    assert_same(pytree[:], pytree_ref[:])


def test_memmap_cleanup_rules(tmp_path, monkeypatch):
    from torchrl_compat import _directory_cleanup

    user = O.LazyMemmapStorage(4, scratch_dir=tmp_path / "keep")
    user.set(range(2), torch.zeros(2, 3))
    temp = O.LazyMemmapStorage(4, shared_init=True)  # gets its own temporary directory
    temp.set(range(2), torch.zeros(2, 3))
    temp_dir = temp.scratch_dir
    assert temp._auto_cleanup and temp in O._MEMMAP_STORAGE_REGISTRY
    assert user not in O._MEMMAP_STORAGE_REGISTRY
    # a storage inherited by a forked child is not the child's to delete
    monkeypatch.setattr(temp, "_owner_pid", -1)
    monkeypatch.setattr(_directory_cleanup._Handlers, "done", False)
    O._cleanup_all_memmap_storages()
    import os

    assert os.path.isdir(temp_dir)
    assert temp.cleanup() is False  # nor is an explicit cleanup() in that child
    monkeypatch.setattr(temp, "_owner_pid", os.getpid())
    monkeypatch.setattr(_directory_cleanup._Handlers, "done", False)
    O._cleanup_all_memmap_storages()
    assert not os.path.exists(temp_dir)
    assert (tmp_path / "keep").is_dir()
    assert temp.cleanup() is False  # already done
    assert O.LazyMemmapStorage(4).cleanup() is False  # anonymous maps: nothing on disk


def test_shared_init_lazy_tensor_storage_directory_removed(monkeypatch):
    import os

    store = O.LazyTensorStorage(4, shared_init=True)
    init_dir = store._init_directory
    store.set(range(2), make_batch("tensordict", 2, 1, seed=0))
    assert len(store) == 2 and os.path.isdir(init_dir)
    assert not hasattr(store, "cleanup")  # not public on torchrl's LazyTensorStorage
    assert store._cleanup_init_directory() is True and not os.path.exists(init_dir)


# --------------------------------------------------------------------------
# compressed storage


def test_compressed_list_storage_of_numpy_arrays_matches_torchrl():
    """len() counts filled slots by identity: numpy items compare with None elementwise."""
    ours, ref = pair("CompressedListStorage", 10)
    items = [np.arange(3.0), np.ones(2), np.zeros((2, 2))]
    for store in (ours, ref):
        store.set(range(3), items)
        store.set(3, np.full(4, 7.0))
    assert len(ours) == len(ref) == 4
    for index in (0, 2, 3, [0, 3]):
        a, b = ours[index], ref[index]
        for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
            np.testing.assert_array_equal(x, y)
    assert [ours.contains(i) for i in range(8)] == [ref.contains(i) for i in range(8)]
    for store in (ours, ref):
        store._empty()
    assert len(ours) == len(ref) == 0


@pytest.mark.parametrize("kind", ["tensor", "tensordict"])
def test_compressed_list_storage_matches_torchrl(kind):
    ours, ref = pair("CompressedListStorage", 10, compression_level=6)
    data = make_batch(kind, 4, 1, seed=0)
    if kind == "tensor":
        data = torch.zeros(4, 64)
    for store in (ours, ref):
        store.set(range(4), data)
    assert len(ours) == len(ref) == 4
    assert ours.bytes() == ref.bytes() < 4 * 64 * 4 + 1000
    for index in [0, -1, slice(1, 3), [0, 3], torch.tensor([2, 1])]:
        a, b = ours[index], ref[index]
        if isinstance(a, list):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                assert_same(x, y)
        else:
            assert_same(a, b)
    for x, y in zip(ours._storage, ref._storage):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y)
    with pytest.raises(IndexError, match=r"Index 7 \(position 1\) out of bounds or not set"):
        ours[[0, 7]]
    sd = ours.state_dict()
    assert set(sd) == {"_storage", "_metadata"}
    ref2 = T.CompressedListStorage(10)
    ref2.load_state_dict(sd)
    assert_same(ref2[1], ours[1])
    assert ours.to_bytestream(np.arange(3, dtype=np.int64)) == np.arange(3, dtype=np.int64).tobytes()
    with pytest.warns(UserWarning, match="empty"):
        assert O.CompressedListStorage(3).bytes() == 0


def test_compressed_list_storage_custom_codec_and_batch_size():
    # a tensordict item comes back with torchrl's empty batch size, unless its metadata
    # names one (which torchrl honours too)
    codec = dict(compression_fn=lambda t: t.flatten().clone(), decompression_fn=lambda c, m: c.reshape(m["shape"]))
    ours, ref = pair("CompressedListStorage", 4, **codec)
    for store in (ours, ref):
        store.set(0, TensorDict(a=torch.ones(2, 3), batch_size=[2]))
    for store in (ours, ref):
        out = store[0]
        assert out.batch_size == torch.Size([])
        assert torch.equal(out["a"], torch.ones(2, 3))
    assert ours._metadata[0].keys() == ref._metadata[0].keys() == {"type", "fields"}
    for store in (ours, ref):
        store._metadata[0]["batch_size"] = torch.Size([2])
        assert store[0].batch_size == torch.Size([2])


@pytest.mark.parametrize("direction", [("ours", "torchrl"), ("torchrl", "ours"), ("ours", "ours")])
def test_compressed_list_storage_state_dict_round_trips(direction):
    libs = {"ours": O, "torchrl": T}
    src, dst = (libs[name].CompressedListStorage(6) for name in direction)
    items = [
        torch.arange(6.0).reshape(2, 3),
        TensorDict(a=torch.ones(2, 3), b=torch.arange(2), batch_size=[2]),
        TensorDict(x=torch.zeros(4)),
    ]
    src.set(range(3), items)
    dst.load_state_dict(src.state_dict())
    assert len(dst) == len(src) == 3
    for index in range(3):
        assert_same(dst[index], src[index])
    assert_same(dst[1], TensorDict(a=torch.ones(2, 3), b=torch.arange(2)))


# --------------------------------------------------------------------------
# ensemble


def test_storage_ensemble_matches_torchrl():
    subs_o = [O.LazyTensorStorage(4) for _ in range(3)]
    subs_r = [T.LazyTensorStorage(4) for _ in range(3)]
    for i, (so, sr) in enumerate(zip(subs_o, subs_r)):
        so.set(range(2), torch.full((2, 2), float(i)))
        sr.set(range(2), torch.full((2, 2), float(i)))
    ours, ref = O.StorageEnsemble(*subs_o), T.StorageEnsemble(*subs_r)
    assert len(ours) == len(ref) == 3
    assert ours[1] is subs_o[1]
    assert ours[:] is ours
    sub = ours[[0, 2]]
    assert isinstance(sub, O.StorageEnsemble) and len(sub) == 2
    assert torch.equal(ours[2, 1], ref[2, 1])
    assert [torch.equal(a, b) for a, b in zip(ours[:, 0], ref[:, 0])] == [True] * 3
    got = ours.get({"buffer_ids": torch.tensor([0, 2]), "index": [torch.tensor([1]), torch.tensor([0])]})
    exp = ref.get({"buffer_ids": torch.tensor([0, 2]), "index": [torch.tensor([1]), torch.tensor([0])]})
    assert [b for b, _ in got] == [b for b, _ in exp] == [0, 2]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(got, exp))
    gen = torch.Generator()
    ours._rng = gen
    assert all(s._rng is gen for s in subs_o)
    with pytest.raises(IndexError, match="Expected an index of type"):
        ours[5]
    with pytest.raises(TypeError, match="floating point index"):
        ours[torch.tensor([0.0])]
    with pytest.raises(TypeError, match="same length as the storages"):
        O.StorageEnsemble(*subs_o, transforms=[None])
    assert isinstance(ours.checkpointer, torchrl_compat.StorageEnsembleCheckpointer)
    assert repr(ours).startswith("StorageEnsemble(\n    storages=")


# --------------------------------------------------------------------------
# module helpers


def test_module_helpers_match_torchrl():
    items = [make_batch("pytree", 2, 1, seed=s) for s in range(3)]
    assert_same(O._stack_anything(items), T._stack_anything(items))
    assert_same(O._flip_list(items), T._flip_list(items))
    tds = [make_batch("tensordict", 2, 1, seed=s) for s in range(3)]
    assert_same(O._stack_anything(tds), T._stack_anything(tds))
    assert_same(O._flip_list(tds), T._flip_list(tds))
    assert O._collate_id(items) is items
    t = torch.arange(4.0)
    assert torch.equal(O._collate_list_tensordict([t, t]), T._collate_list_tensordict([t, t]))
    mm = O._make_memmap(t, None)
    assert type(mm).__name__ == "MemoryMappedTensor" and torch.equal(mm, t)
    empty = O._make_empty_memmap((3, 2), torch.int32, None)
    assert empty.shape == (3, 2) and empty.dtype == torch.int32
    assert O._mem_map_tensor_as_tensor(t) is t
    for name in [
        "_MEMMAP_STORAGE_REGISTRY",
        "_cleanup_all_memmap_storages",
        "_signal_cleanup_handler",
        "_register_cleanup_handlers",
        "_ensure_cleanup_handlers",
    ]:
        assert hasattr(O, name), name


def test_every_name_torchrl_imports_from_storages_exists():
    # names imported from torchrl.data.replay_buffers.storages anywhere in torchrl 0.11
    imported = {
        "_collate_id", "_get_default_collate", "_stack_anything", "CompressedListStorage",
        "LazyMemmapStorage", "LazyStackStorage", "LazyTensorStorage", "ListStorage",
        "Storage", "StorageEnsemble", "TensorStorage", "_make_memmap",
        "_make_empty_memmap", "_flip_list",
    }
    missing = sorted(name for name in imported if not hasattr(O, name))
    assert not missing
    for name in O.__all__:
        assert getattr(torchrl_compat, name) is getattr(O, name)


# --------------------------------------------------------------------------
# signatures


def _public_members(cls):
    names = {"__init__", "__len__", "__getitem__", "__setitem__", "__contains__", "__iter__"}
    names |= {n for n in dir(cls) if not n.startswith("_")}
    return sorted(n for n in names if hasattr(cls, n))


@pytest.mark.parametrize("name", O.__all__)
def test_signatures_match_torchrl(name):
    ours, ref = getattr(O, name), getattr(T, name)
    assert _public_members(ours) == _public_members(ref)
    for member in _public_members(ref):
        a, b = inspect.getattr_static(ours, member), inspect.getattr_static(ref, member)
        if isinstance(b, property):
            assert isinstance(a, property), member
            assert (a.fset is None) == (b.fset is None), member
            continue
        assert isinstance(a, staticmethod) == isinstance(b, staticmethod), member
        assert isinstance(a, classmethod) == isinstance(b, classmethod), member
        if callable(getattr(ref, member)):
            # torchrl wraps some methods with implement_for: compare what users call
            sa = inspect.signature(getattr(ours, member))
            sb = inspect.signature(getattr(ref, member))
            assert [(p.name, p.kind, p.default) for p in sa.parameters.values()] == [
                (p.name, p.kind, p.default) for p in sb.parameters.values()
            ], member
        else:
            assert a == b, member


# --------------------------------------------------------------------------
# CUDA


def _to_device(x, device):
    if is_tensor_collection(x) or isinstance(x, torch.Tensor):
        return x.to(device)
    return tree_map(lambda leaf: leaf.to(device), x)


def _to_cpu(x):
    return _to_device(x, "cpu")


def _to_cuda(x):
    return _to_device(x, "cuda")


@needs_cuda
@pytest.mark.parametrize("kind", ["tensor", "tensordict", "pytree"])
def test_cuda_storage_matches_cpu_path(kind):
    cuda, cpu = O.LazyTensorStorage(8, device="cuda"), O.LazyTensorStorage(8)
    ref = T.LazyTensorStorage(8, device="cuda")
    assert cuda.device == ref.device == torch.device("cuda", torch.cuda.current_device())
    data = make_batch(kind, 5, 1, seed=0)
    if kind != "tensordict":
        # plain tensors are stored as given: CPU ones into CUDA storage fail as in torchrl
        for store in (O.LazyTensorStorage(8, device="cuda"), T.LazyTensorStorage(8, device="cuda")):
            with pytest.raises(RuntimeError, match="same device"):
                store.set(torch.arange(5), data)
    for store in (cuda, cpu, ref):
        store.set(torch.arange(5), data if store is cpu else _to_cuda(data))
    for index in [1, -1, slice(1, 4), torch.tensor([4, 0, -1]), torch.tensor([4, 0], device="cuda")]:
        got = cuda[index]
        leaves = tree_flatten(got.to_dict() if is_tensor_collection(got) else got)[0]
        assert all(leaf.device.type == "cuda" for leaf in leaves)
        assert_same(_to_cpu(got), _to_cpu(ref[index]))
        cpu_index = index.cpu() if isinstance(index, torch.Tensor) else index
        assert_same(_to_cpu(got), cpu[cpu_index])
    with pytest.raises(IndexError, match="index 6 at position 1"):
        cuda[torch.tensor([0, 6])]


@needs_cuda
def test_cuda_auto_device_from_data():
    store = O.LazyTensorStorage(4, device="auto")
    store.set(range(2), torch.zeros(2, 3, device="cuda"))
    assert store.device.type == "cuda" and store._storage.device.type == "cuda"


def test_rand_given_ndim_eager_and_under_torch_compile():
    storage = O.LazyTensorStorage(10)
    storage.set(torch.arange(10), TensorDict({"obs": torch.arange(10)}, [10]))
    eager = storage._rand_given_ndim(64)
    assert eager.shape == (64,) and eager.dtype == torch.int64 and bool(((eager >= 0) & (eager < 10)).all())
    compiled = torch.compile(lambda: storage._rand_given_ndim(64), backend="eager")
    for _ in range(3):  # back-to-back calls: the draw stays outside the graph
        out = compiled()
        assert out.shape == (64,) and bool(((out >= 0) & (out < 10)).all())
    torch.manual_seed(0)
    first = storage._rand_given_ndim(8)
    torch.manual_seed(0)
    assert torch.equal(first, storage._rand_given_ndim(8))


@pytest.mark.parametrize("cls_name", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_set_under_torch_compile_keeps_the_length(cls_name, tmp_path):
    kwargs = {"scratch_dir": tmp_path} if cls_name == "LazyMemmapStorage" else {}
    storage = getattr(O, cls_name)(10, **kwargs)
    storage.set(torch.arange(2), TensorDict({"a": torch.zeros(2)}, [2]))
    before, _ = storage._writes_since(None)
    write = torch.compile(
        lambda start: storage.set(torch.arange(start, start + 2), TensorDict({"a": torch.ones(2)}, [2])),
        backend="eager",
    )
    write(2)
    write(4)
    assert len(storage) == 6 and storage._len == 6
    assert torch.equal(storage[:]["a"], torch.tensor([0.0, 0, 1, 1, 1, 1]))
    # the write counter saw them too
    count, _ = storage._writes_since(None)
    assert count == before + 2
