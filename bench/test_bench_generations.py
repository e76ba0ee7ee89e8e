"""Slot generations and conditional updates (torchrl 0.14): ours against torchrl 0.14.1's,
side by side, and what tracking generations costs a write.

Run with torchrl 0.14.1 installed:
``/work/venvs/trl014/bin/python -m pytest bench/test_bench_generations.py --benchmark-group-by=group``
(with an older torchrl only the untracked rows run: the others need ``track_generations``).
The workload is bench/test_bench_buffers.py's: a full buffer of 2^20 transitions, writes of
1000, batches of 256.
"""
import os
import sys

import pytest
import torch
import torchrl.data as trd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchrl_compat as ours  # noqa: E402
from test_bench_buffers import BATCH, N, filled  # noqa: E402
from torchrl_compat._releases import since  # noqa: E402

SIDES = [pytest.param(trd, id="torchrl"), pytest.param(ours, id="ours")]
needs_generations = pytest.mark.skipif(not since("writer_slot_generations"), reason="torchrl 0.14 tracks generations")


def tracked(lib, track=True):
    torch.manual_seed(0)
    writer = lib.TensorDictRoundRobinWriter(track_generations=True) if track else lib.TensorDictRoundRobinWriter()
    return filled(lib.TensorDictReplayBuffer(storage=lib.LazyTensorStorage(N), writer=writer))


@pytest.mark.parametrize("lib", SIDES)
@pytest.mark.parametrize("track", [pytest.param(False, id="untracked"), pytest.param(True, id="tracked", marks=needs_generations)])
def test_extend(benchmark, lib, track):
    benchmark.group = f"uniform extend 1000, generations {'tracked' if track else 'not tracked'}"
    rb, writes = tracked(lib, track)
    benchmark.pedantic(rb.extend, setup=lambda: ((writes.next(),), {}), rounds=400, warmup_rounds=5)


@needs_generations
@pytest.mark.parametrize("lib", SIDES)
def test_sample_with_generations(benchmark, lib):
    benchmark.group = "uniform sample 256, generations tracked"
    rb, _ = tracked(lib)
    benchmark.pedantic(rb.sample, args=(BATCH,), rounds=1000, warmup_rounds=10)


@needs_generations
@pytest.mark.parametrize("lib", SIDES)
def test_update_if_present(benchmark, lib):
    """Patch ``reward`` of a sampled batch of 256, a quarter of it stale."""
    benchmark.group = "update_if_present 256 (a quarter stale)"
    rb, _ = tracked(lib)
    torch.manual_seed(1)
    sample = rb.sample(BATCH)
    generation = sample["index_generation"].clone()
    generation[::4] -= 1
    patch = {"reward": torch.randn(BATCH, 1)}

    def update():
        return rb.update_if_present(index=sample["index"], generation=generation, patch=patch)

    assert update().stale_count > 0
    benchmark.pedantic(update, rounds=400, warmup_rounds=5)
