"""First writes: one ``extend`` of 400 rows into a new buffer, torchrl vs torchrl_compat.

The workload of torchrl's own replay-buffer benchmark ``test_rb_populate``: each round builds a
new buffer (setup, not timed) and times one ``rb.extend(data)`` of 400 rows, the storage being
created lazily by that write. Data is a TensorDict of a 5-float leaf ``"a"`` and a nested
3x32x32 uint8 leaf ``("b", "c")`` (1.2 MB). Buffers are ``TensorDictReplayBuffer`` with a
``RandomSampler`` over a ``LazyTensorStorage``, a ``LazyMemmapStorage`` and a ``ListStorage``,
and a ``TensorDictPrioritizedReplayBuffer`` (alpha 0.7, beta 0.9) over a ``ListStorage``; each
at capacity 400 (torchrl's parameters) and 10,000. Each side is a buffer of its own library on
its own classes. torchrl's prioritized side needs its compiled trees: on a torch where they do
not load it runs on ``install_segment_trees()``, as a user there must.

    python -m pytest bench/test_bench_first_writes.py -q --benchmark-group-by=group \
        --benchmark-columns=min,median,mean,rounds
"""
import os
import sys

import pytest
import torch
import torchrl.data as trd
import torchrl.data.replay_buffers.samplers as trl_samplers
from tensordict import TensorDict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torchrl_compat as ours  # noqa: E402

if trl_samplers.SumSegmentTreeFp32 is None:
    ours.install_segment_trees()

ROWS = 400
ROUNDS = 100
SIDES = [pytest.param(trd, id="torchrl"), pytest.param(ours, id="ours")]


def uniform(storage):
    return lambda lib, capacity: lib.TensorDictReplayBuffer(
        storage=getattr(lib, storage)(capacity), sampler=lib.RandomSampler(), batch_size=3
    )


def prioritized(lib, capacity):
    return lib.TensorDictPrioritizedReplayBuffer(
        alpha=0.7, beta=0.9, storage=lib.ListStorage(capacity), batch_size=3
    )


BUFFERS = {
    "LazyTensorStorage": uniform("LazyTensorStorage"),
    "LazyMemmapStorage": uniform("LazyMemmapStorage"),
    "ListStorage": uniform("ListStorage"),
    "prioritized ListStorage": prioritized,
}


def make_data():
    return TensorDict(
        {"a": torch.zeros(ROWS, 5), ("b", "c"): torch.zeros(ROWS, 3, 32, 32, dtype=torch.uint8)},
        batch_size=[ROWS],
    )


@pytest.mark.parametrize("capacity", [ROWS, 10_000])
@pytest.mark.parametrize("buffer", list(BUFFERS))
@pytest.mark.parametrize("lib", SIDES)
def test_first_write(benchmark, lib, buffer, capacity):
    benchmark.group = f"first write of {ROWS}, {buffer}, capacity {capacity}"
    torch.manual_seed(0)
    data = make_data()
    held = []

    def setup():
        # The previous round's buffer is dropped here, outside the timed call. (Buffers hold
        # reference cycles: the collector may still free one inside a timed call, of either
        # side; collecting here each round would take longer than the whole benchmark.)
        held.clear()
        rb = BUFFERS[buffer](lib, capacity)
        held.append(rb)
        return (rb, data), {}

    def populate(rb, td):
        rb.extend(td)

    benchmark.pedantic(populate, setup=setup, iterations=1, rounds=ROUNDS)
    held.clear()
