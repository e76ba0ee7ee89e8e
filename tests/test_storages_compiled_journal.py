"""Writes a compilable storage makes inside compiled graphs (``set`` traced whole, as
torchrl 0.14's): a reader following the storage's writes learns each of them, in order,
numbered as the eager ones, as it learns the writes made eagerly."""
from __future__ import annotations

import numpy as np
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

import torchrl_compat.storages as O


def rows(cursor):
    return np.asarray(cursor).tolist()


def test_writes_made_in_compiled_graphs_are_journaled_in_order():
    torch._dynamo.reset()
    storage = O.LazyTensorStorage(12, compilable=True)
    storage.set(torch.arange(2), torch.zeros(2, 1))
    start, _ = storage._writes_since(None)  # following the writes from here
    counter = CompileCounter()
    write = torch.compile(lambda cursor, value: storage.set(cursor, value), backend=counter, fullgraph=True)
    cursors = [torch.tensor([2, 3]), torch.tensor([4, 5]), torch.tensor([6, 7])]
    for i, cursor in enumerate(cursors):
        write(cursor, torch.full((2, 1), float(i + 1)))
    assert counter.frame_count >= 1  # the writes ran in a compiled graph
    now, seen = storage._writes_since(start)
    assert now == start + 3
    assert [rows(c) for c in seen] == [[2, 3], [4, 5], [6, 7]]
    # read once, gone: the next reader call from ``now`` learns nothing more
    assert storage._writes_since(now) == (now, [])
    # from a count between them, only the later ones
    assert [rows(c) for c in storage._writes_since(start + 1)[1]] == [[4, 5], [6, 7]]
    # compiled writes, then an eager one: all in order
    write(torch.tensor([8, 9]), torch.full((2, 1), 9.0))
    storage.set(torch.tensor([10]), torch.full((1, 1), 10.0))
    later, seen = storage._writes_since(now)
    assert later == now + 2
    assert [rows(c) for c in seen] == [[8, 9], [10]]
    assert torch.equal(storage[:].squeeze(-1), torch.tensor([0.0, 0, 1, 1, 2, 2, 3, 3, 9, 9, 10]))
