"""Checkpoints of pytree storages whose keys are not all strings, against torchrl 0.11.

torchrl names each leaf file after its key path (``b/c/1/0.memmap``, ``30.memmap``) and, when
loading, tries a part made of digits as an int first: an int dict key (``30``) or a sequence
position. Both libraries write and read the same files.
"""
import pytest
import torch
from torch.utils._pytree import tree_flatten

import torchrl.data as trl_data
import torchrl.data.replay_buffers.storages as trl

import torchrl_compat.storages as ours

LIBS = {"torchrl": trl, "ours": ours}
CLASSES = ["LazyTensorStorage", "LazyMemmapStorage"]
DIRECTIONS = [("torchrl", "torchrl"), ("ours", "ours"), ("torchrl", "ours"), ("ours", "torchrl")]
NOT_INITIALIZED = "Cannot fill a non-initialized pytree-based TensorStorage"


def make_tree(n, offset=0.0):
    t = torch.arange(n, dtype=torch.float32) + offset
    return {"a": t, "b": {"c": [t * 2, (t.long() + 3,)]}, 30: t.reshape(n, 1) - 1}


def assert_same_tree(a, b):
    flat_a, spec_a = tree_flatten(a)
    flat_b, spec_b = tree_flatten(b)
    assert spec_a == spec_b
    for x, y in zip(flat_a, flat_b):
        assert x.dtype == y.dtype
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def filled(lib, cls_name, offset):
    storage = getattr(LIBS[lib], cls_name)(6)
    storage.set(range(4), make_tree(4, offset))
    return storage


@pytest.mark.parametrize("cls_name", CLASSES)
@pytest.mark.parametrize("writer,reader", DIRECTIONS)
def test_dumps_twice_then_loads_into_initialized(tmp_path, cls_name, writer, reader):
    path = tmp_path / "ckpt"
    source = filled(writer, cls_name, offset=0.0)
    source.dumps(path)
    # the second dumps replaces the first in the same directory
    source.set(range(2, 6), make_tree(4, offset=50.0))
    source.dumps(path)
    target = filled(reader, cls_name, offset=-9.0)
    target._len = 1
    target.loads(path)
    assert len(target) == len(source) == 6
    assert_same_tree(target[:], source[:])
    # what the reader loaded is what torchrl loads from the same files
    reference = filled("torchrl", cls_name, offset=-9.0)
    reference.loads(path)
    assert_same_tree(target[:], reference[:])


@pytest.mark.parametrize("cls_name", CLASSES)
def test_same_files_as_torchrl(tmp_path, cls_name):
    for lib in LIBS:
        filled(lib, cls_name, offset=0.0).dumps(tmp_path / lib)
    files = {lib: sorted(str(p.relative_to(tmp_path / lib)) for p in (tmp_path / lib).rglob("*.memmap")) for lib in LIBS}
    assert files["ours"] == files["torchrl"]
    assert "30.memmap" in files["ours"] and "b/c/1/0.memmap" in files["ours"]


@pytest.mark.parametrize("cls_name", CLASSES)
@pytest.mark.parametrize("writer", ["torchrl", "ours"])
def test_loads_into_non_initialized_refused_as_torchrl(tmp_path, cls_name, writer):
    filled(writer, cls_name, offset=0.0).dumps(tmp_path / "ckpt")
    errors = {}
    for lib in LIBS:
        target = getattr(LIBS[lib], cls_name)(6)
        with pytest.raises(RuntimeError, match=NOT_INITIALIZED) as err:
            target.loads(tmp_path / "ckpt")
        errors[lib] = str(err.value)
        assert not target.initialized and len(target) == 0
    assert errors["ours"] == errors["torchrl"]


def test_keys_with_the_same_name_refused_as_torchrl(tmp_path):
    # "7" and 7 would share the file 7.memmap
    for lib in LIBS:
        storage = LIBS[lib].LazyTensorStorage(4)
        storage.set(range(2), {"7": torch.ones(2), 7: torch.zeros(2)})
        with pytest.raises(KeyError, match="conflicting representations"):
            storage.dumps(tmp_path / lib)


def test_string_key_made_of_digits(tmp_path):
    """A string key "7" is found under its string: torchrl only tries the int, and its
    ``loads`` fails with a KeyError."""
    source = ours.LazyTensorStorage(4)
    source.set(range(2), {"7": torch.arange(2.0)})
    source.dumps(tmp_path / "s")
    back = ours.LazyTensorStorage(4)
    back.set(0, {"7": torch.zeros(())})
    back.loads(tmp_path / "s")
    assert len(back) == 2 and torch.equal(back[:]["7"], torch.arange(2.0))
    reference = trl.LazyTensorStorage(4)
    reference.set(0, {"7": torch.zeros(())})
    with pytest.raises(KeyError):
        reference.loads(tmp_path / "s")


@pytest.mark.parametrize("cls_name", CLASSES)
def test_through_torchrl_replay_buffer(tmp_path, cls_name):
    """torchrl 0.11's ReplayBuffer on our storage dumps and loads the same pytree."""
    buffers = {}
    for lib in LIBS:
        buffer = trl_data.ReplayBuffer(storage=getattr(LIBS[lib], cls_name)(6), batch_size=2)
        buffer.extend(make_tree(4))
        buffer.dumps(tmp_path / lib)
        buffer.extend(make_tree(3, offset=10.0))
        buffer.dumps(tmp_path / lib)
        buffers[lib] = buffer
    for writer in LIBS:
        for reader in LIBS:
            target = trl_data.ReplayBuffer(storage=getattr(LIBS[reader], cls_name)(6), batch_size=2)
            target.extend(make_tree(1, offset=-1.0))
            target.loads(tmp_path / writer)
            assert len(target) == 6
            assert_same_tree(target[:], buffers[writer][:])
            assert tree_flatten(target.sample())[1] == tree_flatten(make_tree(2))[1]
