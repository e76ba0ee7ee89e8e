"""torchrl_compat.utils against torchrl 0.11's replay_buffers/utils.py."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import torchrl.data.replay_buffers.utils as TU
import torchrl._utils as T_utils

import torchrl_compat.utils as U


@pytest.mark.parametrize(
    "value",
    [0, 3, np.int64(2), np.int32(-1), torch.tensor(3), np.array(4), torch.tensor([1]),
     np.array([1, 2]), 1.0, "a", None, slice(1), [1], (1,), True],
)
def test_is_int_matches_torchrl(value):
    assert U._is_int(value) == TU._is_int(value)


def test_int_classes_and_constants():
    assert U.INT_CLASSES == TU.INT_CLASSES
    assert U.SINGLE_TENSOR_BUFFER_NAME == TU.SINGLE_TENSOR_BUFFER_NAME == "_-single-tensor-_"


@pytest.mark.parametrize("reduction", ["max", "min", "mean", "median", "sum"])
@pytest.mark.parametrize("dim", [None, 0, 1])
def test_reduce_matches_torchrl(reduction, dim):
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    a = U._reduce(x, reduction, dim)
    if dim is None:
        expected = getattr(x, reduction)().item()
        assert isinstance(a, float) and a == expected
        if reduction in ("max", "min", "median"):
            # torchrl passes dim=None to max/min/median, which torch rejects (a TypeError on
            # torch 2.13, a RuntimeError on 2.9)
            with pytest.raises((TypeError, RuntimeError)):
                TU._reduce(x, reduction, dim)
        else:
            assert a == TU._reduce(x, reduction, dim)
    else:
        assert torch.equal(a, TU._reduce(x, reduction, dim))


def test_reduce_unknown_method():
    with pytest.raises(NotImplementedError, match="Unknown reduction method mode"):
        U._reduce(torch.ones(2), "mode")


@pytest.mark.parametrize(
    "data", [np.arange(3), np.float32(2.5), [1, 2], 3, torch.arange(2.0), np.zeros((2, 2))]
)
def test_to_torch_and_to_numpy_match_torchrl(data):
    a, b = U._to_torch(data, "cpu"), TU._to_torch(data, "cpu")
    assert torch.equal(a, b) and a.dtype == b.dtype
    n1, n2 = U._to_numpy(a), TU._to_numpy(b)
    np.testing.assert_array_equal(n1, n2)
    assert U._to_numpy("x") == "x"


def test_to_torch_shares_numpy_memory():
    arr = np.zeros(3)
    out = U._to_torch(arr, None)
    arr[0] = 5
    assert out[0] == 5


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    data=st.data(),
)
def test_unravel_index_matches_torchrl(shape, data):
    numel = int(np.prod(shape))
    flat = data.draw(st.lists(st.integers(0, numel - 1), min_size=0, max_size=20))
    idx = torch.tensor(flat, dtype=torch.long)
    ours, ref = U.unravel_index(idx, shape), TU.unravel_index(idx, shape)
    fallback = U._unravel_index(idx, shape)
    assert len(ours) == len(ref) == len(fallback) == len(shape)
    for a, b, c in zip(ours, ref, fallback):
        assert torch.equal(a, b) and torch.equal(c, b)


def test_tree_iter_matches_torchrl():
    tree = {"a": torch.zeros(1), "b": (torch.ones(2), [torch.full((3,), 2.0)])}
    ours, ref = list(U.tree_iter(tree)), list(TU.tree_iter(tree))
    assert len(ours) == len(ref) == 3
    assert all(a is b for a, b in zip(ours, ref))


@pytest.mark.parametrize("device", [None, "cpu", "meta", torch.device("cpu")])
def test_make_ordinal_device_matches_torchrl(device):
    assert U._make_ordinal_device(device) == T_utils._make_ordinal_device(device)


def test_auto_device():
    expected = torch.device("cuda:0") if torch.cuda.is_available() else None
    got = U._auto_device()
    assert got == TU._auto_device()
    if expected is not None:
        assert got == expected


def _tree():
    return {
        "obs": torch.randn(4, 3, generator=torch.Generator().manual_seed(0)),
        "nested": {"r": torch.arange(4)},
        "seq": (torch.ones(4, 2), torch.zeros(4, dtype=torch.bool)),
    }


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("tree", [_tree(), torch.arange(6.0)], ids=["pytree", "tensor"])
def test_save_pytree_layout_matches_torchrl(tmp_path, tree):
    md_ours, md_ref = {}, {}
    U._save_pytree(tree, md_ours, tmp_path / "ours")
    TU._save_pytree(tree, md_ref, tmp_path / "ref")
    assert md_ours == md_ref
    json.dumps(md_ours)  # the metadata goes to storage_metadata.json
    assert _files(tmp_path / "ours") == _files(tmp_path / "ref")
    for name in _files(tmp_path / "ours"):
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    # writing again over existing files updates them in place
    U._save_pytree(tree, {}, tmp_path / "ref")
    with pytest.raises(KeyError, match="conflicting representations"):
        U._save_pytree_common("x", tmp_path / "ours", torch.zeros(1), {"x": {}})


def test_init_pytree_layout_matches_torchrl(tmp_path):
    tree = _tree()
    item = {"obs": tree["obs"][0], "nested": {"r": tree["nested"]["r"][0]}}

    def size_fn(shape):
        return (5, *shape)

    ours = U._init_pytree(str(tmp_path / "ours"), size_fn, item)
    ref = TU._init_pytree(str(tmp_path / "ref"), size_fn, item)
    assert _files(tmp_path / "ours") == _files(tmp_path / "ref")
    assert ours["obs"].shape == ref["obs"].shape == (5, 3)
    assert type(ours["nested"]["r"]) is type(ref["nested"]["r"])
    with pytest.raises(RuntimeError, match="already exists"):
        U._init_pytree(str(tmp_path / "ours"), size_fn, item)
    anon = U._init_pytree(None, size_fn, torch.zeros(2))
    assert anon.shape == (5, 2)


def test_path2str_and_get_paths_match_torchrl():
    from torch.utils._pytree import tree_flatten, tree_flatten_with_path

    tree = _tree()
    paths = [p for p, _ in tree_flatten_with_path(tree)[0]]
    assert [U._path2str(p) for p in paths] == [TU._path2str(p) for p in paths]
    assert U._path2str(()) == TU._path2str(()) == U.SINGLE_TENSOR_BUFFER_NAME
    for item in (tree, {"a": torch.zeros(1), "b": {"c": [torch.zeros(1), (torch.zeros(1),)]}, 30: torch.zeros(1)}):
        spec = tree_flatten(item)[1]
        with warnings.catch_warnings():
            # torchrl reads treespec.children_specs, deprecated (with a warning) on newer torch
            warnings.simplefilter("ignore", FutureWarning)
            expected = list(TU._get_paths(spec))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # ours reads the children without a warning
            assert list(U._get_paths(spec)) == expected
    bad = tree_flatten_with_path({U.SINGLE_TENSOR_BUFFER_NAME: torch.zeros(1)})[0][0][0]
    with pytest.raises(RuntimeError, match="same identifier as the default name"):
        U._path2str(bad)


def test_pin_memory_output_decorator():
    class Holder:
        _pin_memory = False

        @U.pin_memory_output
        def get(self):
            return torch.zeros(2), torch.ones(1)

    out = Holder().get()
    assert isinstance(out, tuple) and torch.equal(out[1], torch.ones(1))
