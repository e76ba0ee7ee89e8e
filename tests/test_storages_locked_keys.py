"""The error a write into a locked (shared) tensordict storage raises when the data's keys
differ from the storage's: its text, its cause and when the original error goes out
unchanged, compared with torchrl's own storages."""
from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorData, TensorDict

import torchrl.data.replay_buffers.storages as T

import torchrl_compat.storages as O


def stored():
    return TensorDict(
        {"a": torch.zeros(2), ("n", "b"): torch.zeros(2, 3), ("n", "m", "c"): torch.zeros(2)},
        batch_size=[2],
    )


def locked_pair(storage_data=None):
    out = []
    for ns in (O, T):
        store = ns.LazyTensorStorage(4)
        store.set(range(2), stored() if storage_data is None else storage_data)
        if hasattr(store._storage, "lock_"):
            store._storage.lock_()
        out.append(store)
    return out


def raised(store, data, original):
    with pytest.raises(RuntimeError) as info:
        store._raise_informative_lock_error(data, original)
    return info.value


# each: the data written, as the keys it holds differ from the storage's
CASES = {
    "new top-level key": {"a": torch.ones(2), ("n", "b"): torch.ones(2, 3), ("n", "m", "c"): torch.ones(2), "z": torch.ones(2)},
    "new nested keys": {"a": torch.ones(2), ("n", "b"): torch.ones(2, 3), ("n", "m", "c"): torch.ones(2), ("n", "y"): torch.ones(2), ("n", "m", "x"): torch.ones(2)},
    "missing keys": {"a": torch.ones(2)},
    "missing nested sub-tree": {"a": torch.ones(2), ("n", "b"): torch.ones(2, 3)},
    "new and missing": {("n", "b"): torch.ones(2, 3), "z": torch.ones(2), "y": torch.ones(2)},
    "same keys": {"a": torch.ones(2), ("n", "b"): torch.ones(2, 3), ("n", "m", "c"): torch.ones(2)},
}


@pytest.mark.parametrize("case", list(CASES))
def test_lock_error_text_and_cause_match_torchrl(case):
    ours, ref = locked_pair()
    data = TensorDict(CASES[case], batch_size=[2])
    original = RuntimeError("Cannot modify locked TensorDict (some reason)")
    got, want = raised(ours, data, original), raised(ref, data, original)
    assert type(got) is type(want) is RuntimeError
    assert str(got) == str(want)
    assert got.__cause__ is original and want.__cause__ is original
    # the text names the original error and starts as torchrl's does
    assert str(got).startswith("Cannot write to locked storage due to key mismatch.\nOriginal error: Cannot modify")


def test_lock_error_lists_a_new_string_entry_as_torchrl():
    # a non-tensor entry (a string) is no leaf of the key listing torchrl compares
    ours, ref = locked_pair()
    data = stored().clone()
    data.unlock_()
    data["tag"] = NonTensorData("x", batch_size=[2])
    original = RuntimeError("locked")
    got, want = raised(ours, data, original), raised(ref, data, original)
    assert str(got) == str(want)
    assert "New keys" not in str(want) and "No key differences detected" in str(want)


@pytest.mark.parametrize("which", ["tensor data", "tensor storage"])
def test_lock_error_for_non_tensordicts_is_the_original_error(which):
    original = RuntimeError("locked somewhere")
    out = []
    for ns in (O, T):
        store = ns.LazyTensorStorage(4)
        if which == "tensor data":
            store.set(range(2), stored())
            data = torch.ones(2)
        else:
            store.set(range(2), torch.zeros(2, 3))
            data = stored()
        with pytest.raises(RuntimeError) as info:
            store._raise_informative_lock_error(data, original)
        out.append(info.value)
    assert out[0] is original and out[1] is original


def test_write_with_a_key_the_locked_storage_lacks_raises_torchrls_error():
    # The storage caches the keys it lets through once locked; a cache naming a key the
    # storage lacks (set through the setter, as a shared storage's peer may) lets that key
    # reach the locked tensordict, whose lock error is then explained.
    outcome = []
    for store in locked_pair():
        store._storage_keys = ["a", ("n", "b"), ("n", "m", "c"), "z"]
        data = TensorDict(CASES["new top-level key"], batch_size=[2])
        with pytest.raises(RuntimeError) as info:
            store.set(torch.tensor([0, 1]), data)
        err = info.value
        outcome.append((str(err), type(err.__cause__), str(err.__cause__)))
    assert outcome[0] == outcome[1]
    assert "New keys in data (not in storage): ['z']" in outcome[0][0]
