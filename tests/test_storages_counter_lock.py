"""A storage's shared counters (its length, its write count and its last written index)
sit under one lock, the length's: a write in one process updates all three before a
reader in another process can see any of them, and a fork or a spawn shares that lock."""
from __future__ import annotations

import pytest
import torch

import torchrl_compat.storages as O

MAKERS = {
    "LazyTensorStorage": lambda: O.LazyTensorStorage(6),
    "LazyMemmapStorage": lambda: O.LazyMemmapStorage(6),
    "TensorStorage": lambda: O.TensorStorage(torch.zeros(6, 2)),
}


def lock_of(counter):
    return counter.get_lock()


@pytest.mark.parametrize("kind", list(MAKERS))
def test_the_three_counters_share_the_length_lock(kind):
    store = MAKERS[kind]()
    for _ in range(2):
        length_lock = lock_of(store._len_value)
        assert lock_of(store._writes_value) is length_lock
        assert lock_of(store._last_cursor_value) is length_lock
        store.set(torch.arange(2), torch.ones(2, 2))
    assert store._last_cursor_index == 1 and len(store) == (6 if kind == "TensorStorage" else 4)
