"""Permutations at n = 2^20: replay against torch.randperm (CPU), in the same groups.

Run: python -m pytest bench/test_bench_perm.py --benchmark-group-by=group
"""
import pytest
import torch

import replay

N = 2 ** 20
BATCH = 256


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.benchmark(group="randperm-2^20")
def test_torch_randperm(benchmark):
    benchmark.pedantic(torch.randperm, args=(N,), rounds=30, warmup_rounds=2)


@pytest.mark.benchmark(group="randperm-2^20")
def test_replay_randperm(benchmark):
    benchmark.pedantic(replay.randperm, args=(N,), rounds=30, warmup_rounds=2)


@pytest.mark.benchmark(group="first-batch-256-of-2^20")
def test_torch_randperm_first_batch(benchmark):
    benchmark.pedantic(lambda: torch.randperm(N)[:BATCH], rounds=200, warmup_rounds=5)


@pytest.mark.benchmark(group="first-batch-256-of-2^20")
def test_replay_epoch_first_batch(benchmark):
    # Timed including the epoch's construction (and its seed draw).
    benchmark.pedantic(lambda: replay.PermutationEpoch(N).next_batch(BATCH), rounds=200,
                       warmup_rounds=5)


@pytest.mark.benchmark(group="next-batch-256-of-2^20")
def test_torch_slice_next_batch(benchmark):
    # torchrl's SamplerWithoutReplacement: slice the next batch off a stored permutation.
    state = {"perm": torch.randperm(N)}

    def step():
        batch = state["perm"][:BATCH]
        state["perm"] = state["perm"][BATCH:]
        if state["perm"].numel() == 0:
            state["perm"] = torch.randperm(N)
        return batch

    benchmark.pedantic(step, rounds=2000, warmup_rounds=10)


@pytest.mark.parametrize("phase", ["sparse", "dense"])
@pytest.mark.benchmark(group="next-batch-256-of-2^20")
def test_replay_epoch_next_batch(benchmark, phase):
    epoch = replay.PermutationEpoch(N)
    epoch.next_batch(BATCH if phase == "sparse" else N // 8)

    def setup():
        if epoch.remaining < BATCH:
            epoch.reset()
        return (), {}

    benchmark.pedantic(lambda: epoch.next_batch(BATCH), setup=setup, rounds=2000,
                       warmup_rounds=10)
