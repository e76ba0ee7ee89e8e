"""The length of a compilable storage (a 0-d tensor, so that compiled writes neither guard
on it nor recompile) counts exactly past 2**24 rows, where a float32 count would round, as
torchrl's int64 one does."""
from __future__ import annotations

import torch

import torchrl.data.replay_buffers.storages as T

import torchrl_compat.storages as O


def test_compilable_length_counts_exactly_past_float32_precision():
    rows = 2**24 + 1  # the first integer float32 cannot hold
    lengths = []
    for family in (O, T):
        store = family.LazyTensorStorage(rows + 2, compilable=True)
        store.set(torch.arange(rows), torch.ones(rows, dtype=torch.uint8))
        lengths.append(len(store))
        del store
    assert lengths == [rows, rows]
