"""Replay-buffer benchmarks: torchrl_compat's buffers against torchrl 0.11's, side by side.

Each side is a buffer of its own library on its own classes (torchrl's buffer on torchrl's
storage, sampler and writer; ours on ours), in the loop a user runs. Run in the torch 2.9.1
reference environment, where torchrl's compiled trees load:
``/opt/ref291/bin/python -m pytest bench/test_bench_buffers.py --benchmark-group-by=group``.
Elsewhere (torchrl 0.14.1 on torch 2.13, say) torchrl's prioritized buffers run on
``install_segment_trees()``.

Workload: a full buffer of 2^20 transitions (a TensorDict of ``obs`` (8), ``action`` (2),
``reward`` (1), ``("next", "obs")`` (8), ``("next", "done")`` (1); episodes of 250 steps),
batches of 256, writes of 1000 transitions (so every write moves the cursor on and, now and
then, wraps around). The batches written rotate through a pool of 8, fixed by seed, built
before timing; each timed call is one loop step or one call.
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

N = 1 << 20
BATCH = 256
WRITE = 1000
SLICE = 32
EPISODE = 250
# torchrl's prioritized side needs its compiled trees: where they do not load (torchrl 0.11 on
# anything but torch 2.9, torchrl 0.14.1 on torch 2.13) it runs on install_segment_trees(), as a
# user there must (the run's header says which trees torchrl has).
if trl_samplers.SumSegmentTreeFp32 is None:
    ours.install_segment_trees()
SIDES = [pytest.param(trd, id="torchrl"), pytest.param(ours, id="ours")]
PRIORITIZED_SIDES = SIDES


def transitions(start, n, gen):
    step = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": torch.randn(n, 8, generator=gen),
            "action": torch.randn(n, 2, generator=gen),
            "reward": torch.randn(n, 1, generator=gen),
            ("next", "obs"): torch.randn(n, 8, generator=gen),
            ("next", "done"): (step % EPISODE == EPISODE - 1).unsqueeze(-1),
        },
        [n],
    )


class Writes:
    """The batches written, in order: a pool of 8 (fixed by seed), by successive positions."""

    def __init__(self):
        gen = torch.Generator().manual_seed(0)
        self.pool = [transitions(i * WRITE, WRITE, gen) for i in range(8)]
        self.count = 0

    def next(self):
        data = self.pool[self.count % len(self.pool)]
        self.count += 1
        return data


def filled(buffer):
    """``buffer`` after writing 2^20 transitions and a little more (full, cursor past 0)."""
    writes = Writes()
    for _ in range(N // WRITE + 3):
        buffer.extend(writes.next())
    return buffer, writes


def prioritized(lib):
    torch.manual_seed(0)
    rb, writes = filled(lib.TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=lib.LazyTensorStorage(N)))
    # random priorities everywhere, as after some training
    rb.update_priority(torch.arange(N), torch.rand(N))
    return rb, writes


def uniform(lib):
    torch.manual_seed(0)
    return filled(lib.TensorDictReplayBuffer(storage=lib.LazyTensorStorage(N)))


def slices(lib):
    torch.manual_seed(0)
    sampler = lib.SliceSampler(slice_len=SLICE, end_key=("next", "done"))
    return filled(lib.TensorDictReplayBuffer(storage=lib.LazyTensorStorage(N), sampler=sampler))


def _priorities(n=64):
    gen = torch.Generator().manual_seed(1)
    return [torch.rand(BATCH, generator=gen) * 4 for _ in range(n)]


# --------------------------------------------------------------------- loop steps


@pytest.mark.parametrize("lib", PRIORITIZED_SIDES)
def test_prioritized_loop_step(benchmark, lib):
    """extend 1000 + sample 256 + update_tensordict_priority."""
    benchmark.group = "buffer loop step: prioritized (extend 1000 + sample 256 + update_tensordict_priority)"
    rb, writes = prioritized(lib)
    priorities = iter(_priorities() * 100)

    def step(data):
        rb.extend(data)
        sample = rb.sample(BATCH)
        sample.set("td_error", next(priorities))
        rb.update_tensordict_priority(sample)

    benchmark.pedantic(step, setup=lambda: ((writes.next(),), {}), rounds=400, warmup_rounds=5)


@pytest.mark.parametrize("lib", SIDES)
def test_uniform_loop_step(benchmark, lib):
    """extend 1000 + sample 256."""
    benchmark.group = "buffer loop step: uniform (extend 1000 + sample 256)"
    rb, writes = uniform(lib)

    def step(data):
        rb.extend(data)
        rb.sample(BATCH)

    benchmark.pedantic(step, setup=lambda: ((writes.next(),), {}), rounds=400, warmup_rounds=5)


@pytest.mark.parametrize("lib", SIDES)
def test_slice_loop_step(benchmark, lib):
    """extend 1000 + sample 256 as 8 slices of 32."""
    benchmark.group = "buffer loop step: slices of 32 (extend 1000 + sample 256)"
    rb, writes = slices(lib)

    def step(data):
        rb.extend(data)
        rb.sample(BATCH)

    benchmark.pedantic(step, setup=lambda: ((writes.next(),), {}), rounds=400, warmup_rounds=3)


# ------------------------------------------------------------------- single calls


@pytest.mark.parametrize("lib", PRIORITIZED_SIDES)
def test_prioritized_sample(benchmark, lib):
    benchmark.group = "buffer call: prioritized sample 256"
    rb, _ = prioritized(lib)
    benchmark.pedantic(rb.sample, args=(BATCH,), rounds=400, warmup_rounds=5)


@pytest.mark.parametrize("lib", SIDES)
def test_uniform_extend(benchmark, lib):
    benchmark.group = "buffer call: uniform extend 1000"
    rb, writes = uniform(lib)
    benchmark.pedantic(rb.extend, setup=lambda: ((writes.next(),), {}), rounds=400, warmup_rounds=5)


@pytest.mark.parametrize("lib", SIDES)
def test_plain_tensor_sample(benchmark, lib):
    """``ReplayBuffer`` of plain tensors: a 2^20 x 8 float tensor storage, sample 256."""
    benchmark.group = "buffer call: ReplayBuffer of tensors, sample 256"
    torch.manual_seed(0)
    rb = lib.ReplayBuffer(storage=lib.LazyTensorStorage(N))
    rb.extend(torch.randn(N, 8))
    benchmark.pedantic(rb.sample, args=(BATCH,), rounds=2000, warmup_rounds=20)


# ------------------------------------- what bounds the prioritized step: its parts


@pytest.mark.parametrize("lib", PRIORITIZED_SIDES)
def test_prioritized_extend(benchmark, lib):
    benchmark.group = "prioritized step part: extend 1000"
    rb, writes = prioritized(lib)
    benchmark.pedantic(rb.extend, setup=lambda: ((writes.next(),), {}), rounds=400, warmup_rounds=5)


@pytest.mark.parametrize("lib", PRIORITIZED_SIDES)
def test_prioritized_update_tensordict_priority(benchmark, lib):
    benchmark.group = "prioritized step part: update_tensordict_priority 256"
    rb, _ = prioritized(lib)
    priorities = iter(_priorities() * 100)

    def setup():
        sample = rb.sample(BATCH)
        sample.set("td_error", next(priorities))
        return (sample,), {}

    benchmark.pedantic(rb.update_tensordict_priority, setup=setup, rounds=400, warmup_rounds=5)


@pytest.mark.parametrize("lib", PRIORITIZED_SIDES)
def test_prioritized_sampler_calls(benchmark, lib):
    """The sampler's share of a step: the three calls the buffer makes on it (the default
    priority of 1000 new items, one draw of 256, the update of 256 priorities)."""
    benchmark.group = "prioritized step part: the sampler's own calls (mark_update 1000 + sample 256 + update 256)"
    rb, writes = prioritized(lib)
    sampler, storage = rb.sampler, rb.storage
    priorities = iter(_priorities() * 100)
    start = iter(range(0, 10**12, WRITE))

    def calls(new):
        sampler.mark_update(new, storage=storage)
        index, _ = sampler.sample(storage, BATCH)
        sampler.update_priority(index, next(priorities), storage=storage)

    def setup():
        first = next(start)
        return ((torch.arange(first, first + WRITE) % N,), {})

    benchmark.pedantic(calls, setup=setup, rounds=400, warmup_rounds=5)
