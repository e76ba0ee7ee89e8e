"""The numpy views through which a storage's ``get`` and ``set`` move rows are made once
per data object and kept, not rebuilt on every call (each costs about a microsecond per
leaf)."""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

import torchrl_compat.storages as O


def batch(n, offset=0.0):
    return TensorDict(
        {"obs": torch.arange(n * 3.0).reshape(n, 3) + offset, "done": torch.zeros(n, 1, dtype=torch.bool)},
        batch_size=[n],
    )


def views_of(store):
    return dict(store._leaf_arrays().arrays)


def test_views_are_made_once_and_kept_across_reads_and_writes():
    store = O.LazyTensorStorage(8)
    store.set(torch.arange(4), batch(4))
    store.get(torch.tensor([0, 2]))
    first = views_of(store)
    assert first and all(isinstance(view[1], np.ndarray) for view in first.values())
    store.get(torch.tensor([1, 3]))
    store.set(torch.tensor([4, 5]), batch(2, offset=100.0))
    kept = views_of(store)
    assert kept.keys() == first.keys() and all(kept[key] is first[key] for key in first)
    # the views are the storage's memory: the writes made through them are the storage's rows
    assert torch.equal(store.get(torch.tensor([4, 5]))["obs"], batch(2, offset=100.0)["obs"])

