"""``_max_size_along_dim0``, which torchrl's own writers call on the storage they write to
(``RoundRobinWriter.add`` / ``extend``), compared with torchrl's storages: the number of
dim-0 slots for storages of one and several dims, before and after the first write."""
from __future__ import annotations

import pytest
import torch

import torchrl.data.replay_buffers.storages as T

import torchrl_compat.storages as O


def answers(family, ndim, written, **data):
    store = family.LazyTensorStorage(12, ndim=ndim)
    if written:
        store.set(torch.arange(2), torch.zeros(2, 3, 5))
    return store._max_size_along_dim0(**data)


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("written", [False, True])
@pytest.mark.parametrize(
    "data",
    [{"single_data": torch.zeros(3, 5)}, {"batched_data": torch.zeros(4, 3, 5)}, {"batched_data": torch.zeros(7, 4)}],
    ids=["single", "batched", "batched_other_width"],
)
def test_slots_along_dim0_match_torchrl(ndim, written, data):
    got = answers(O, ndim, written, **data)
    if ndim == 2 and written:
        # 12 cells in rows of 3: 4 rows. torchrl's written storage says 20: it counts the
        # feature dim (5) into its capacity (60), a difference LazyTensorStorage's docstring notes
        assert got == 4
    else:
        assert got == answers(T, ndim, written, **data)


@pytest.mark.parametrize("ndim", [1, 2])
def test_slots_along_dim0_without_data_match_torchrl(ndim):
    results = []
    for family in (O, T):
        store = family.LazyTensorStorage(12, ndim=ndim)
        try:
            results.append(("value", store._max_size_along_dim0()))
        except ValueError as err:
            results.append(("ValueError", str(err)))
    assert results[0] == results[1]
    assert results[0] == (("value", 12) if ndim == 1 else ("ValueError", "single_data or batched_data must be passed."))
