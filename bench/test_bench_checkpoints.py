"""Buffer checkpoints: what publishing a checkpoint that never changes costs, and its fsyncs.

Workload: a ``TensorDictReplayBuffer`` over a ``LazyMemmapStorage`` of 2^20 transitions
(``obs`` (8), ``action`` (2), ``reward`` (1), ``("next", "obs")`` (8), ``("next", "done")``
(1): 80 MiB of files), full. Each timed call is one ``dumps`` (or one loop step):

- ``in place``: the storage's ``scratch_dir`` is the checkpoint's ``storage/``: its files are
  linked into the checkpoint, then the storage moves out to a copy of its own (the copy is
  what a published checkpoint that never changes costs);
- ``elsewhere``: the storage lives in a temporary directory: its data is copied into the
  checkpoint (the usual dump);
- ``no fsync`` variants: the same with the flushes to the disk turned off (what they cost);
- ``loop step``: ``extend`` 1000 + ``sample`` 256 on a storage in its scratch directory and
  on one moved out to its live home (what the move costs the loop afterwards).

Run: ``python -m pytest bench/test_bench_checkpoints.py --benchmark-group-by=group``.
"""
import itertools
import os
import sys

import pytest
import torch
from tensordict import TensorDict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torchrl_compat as ours  # noqa: E402
from torchrl_compat.checkpointers import _publish  # noqa: E402

N = 1 << 20
WRITE = 1000
BATCH = 256


def transitions(start, n):
    gen = torch.Generator().manual_seed(start)
    step = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": torch.randn(n, 8, generator=gen),
            "action": torch.randn(n, 2, generator=gen),
            "reward": torch.randn(n, 1, generator=gen),
            ("next", "obs"): torch.randn(n, 8, generator=gen),
            ("next", "done"): (step % 250 == 249).unsqueeze(-1),
        },
        [n],
    )


def full_buffer(scratch_dir):
    rb = ours.TensorDictReplayBuffer(storage=ours.LazyMemmapStorage(N, scratch_dir=scratch_dir), batch_size=BATCH)
    for start in range(0, N, 1 << 16):
        rb.extend(transitions(start, 1 << 16))
    return rb


@pytest.fixture
def no_fsync(monkeypatch):
    monkeypatch.setattr(_publish, "sync_tree", lambda root: None)
    monkeypatch.setattr(_publish, "sync_directory", lambda path: None)


@pytest.mark.parametrize("fsync", ["fsync", "no fsync"])
@pytest.mark.parametrize("where", ["in place", "elsewhere"])
def test_dumps(benchmark, tmp_path, request, where, fsync):
    benchmark.group = "buffer dumps, 2^20 transitions in a LazyMemmapStorage"
    if fsync == "no fsync":
        request.getfixturevalue("no_fsync")
    path = tmp_path / "ckpt"
    rb = full_buffer(path / "storage" if where == "in place" else tmp_path / "scratch")
    rb.dumps(path)  # the first dump of a storage in place links its scratch files
    counter = itertools.count()

    def step():
        # a write between dumps, as in a training loop
        rb.extend(transitions(next(counter) * WRITE, WRITE))
        rb.dumps(path)

    benchmark.pedantic(step, rounds=5, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("home", ["scratch dir", "live home"])
def test_loop_step(benchmark, tmp_path, home):
    benchmark.group = "loop step after dumps: extend 1000 + sample 256"
    path = tmp_path / "ckpt"
    rb = full_buffer(path / "storage")
    if home == "live home":
        rb.dumps(path)  # the storage moves out
        assert "live" in rb._storage._storage.get("obs").filename
    batches = [transitions(i * WRITE, WRITE) for i in range(8)]
    counter = itertools.count()
    torch.manual_seed(0)

    def step():
        rb.extend(batches[next(counter) % 8])
        rb.sample()

    benchmark.pedantic(step, rounds=300, iterations=1, warmup_rounds=10)
