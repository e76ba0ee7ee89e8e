"""Sharded Ray buffer against torchrl 0.11's ``RayReplayBuffer``, side by side on one local
cluster (``ray.init(num_cpus=2)``).

Workload (see ``bench/ray_bench.py``, which also runs the 30-second mixed run and times the
parts of each call): a prioritized TensorDict buffer of 100,000 rows with a 64-float ``obs``,
filled before timing; writes of 1,000 rows; batches of 256 each followed by
``update_priority``. torchrl's side runs on the segment trees
``torchrl_compat.install_segment_trees()`` serves (its compiled trees do not load on torch 2.13).

    PYTHONPATH=$PWD python -m pytest bench/test_bench_ray.py --benchmark-group-by=group
"""
import os
import sys

import pytest

pytest.importorskip("ray")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ray_bench  # noqa: E402

MIXED_SECONDS = float(os.environ.get("RAY_BENCH_MIXED_SECONDS", "30"))
SIDES = ["torchrl", "torchrl_1thread", "ours_1", "ours_2"]


@pytest.fixture(scope="module")
def cluster():
    ray = ray_bench.start_cluster()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def data():
    return ray_bench.payloads()


def build(side: str, prefetch=None):
    if side.startswith("torchrl"):
        return ray_bench.make_torchrl(side == "torchrl_1thread")
    return ray_bench.make_ours(int(side.split("_")[1]), prefetch=prefetch)


@pytest.fixture(scope="module", params=SIDES)
def filled(request, cluster, data):
    rb = build(request.param)
    ray_bench.fill(rb, data)
    yield request.param, rb
    rb.close()


def test_extend(benchmark, filled, data):
    side, rb = filled
    benchmark.group = "ray extend 1000 rows"
    benchmark.name = side
    counter = iter(range(10**9))
    benchmark.pedantic(lambda: rb.extend(data[next(counter) % len(data)]), rounds=200, warmup_rounds=10)


def test_extend_sustained(benchmark, filled, data):
    """20 writes and the wait for them to land (ours returns from ``extend`` before its shard
    has written: this is the rate the shards keep up)."""
    side, rb = filled
    benchmark.group = "ray extend 1000 rows x 20, landed"
    benchmark.name = side
    counter = iter(range(10**9))
    benchmark.pedantic(lambda: ray_bench.sustained(rb, lambda: rb.extend(data[next(counter) % len(data)]), 20),
                       rounds=20, warmup_rounds=2)


def test_sample_update(benchmark, filled):
    side, rb = filled
    benchmark.group = "ray sample 256 + update_priority"
    benchmark.name = side
    benchmark.pedantic(lambda: ray_bench.learner_step(rb), rounds=200, warmup_rounds=10)


@pytest.mark.parametrize("side", ["ours_1", "ours_2"])
def test_sample_update_prefetch(benchmark, cluster, data, side):
    rb = build(side, prefetch=2)
    try:
        ray_bench.fill(rb, data)
        benchmark.group = "ray sample 256 + update_priority"
        benchmark.name = f"{side}_prefetch2"
        benchmark.pedantic(lambda: ray_bench.learner_step(rb), rounds=200, warmup_rounds=10)
    finally:
        rb.close()


@pytest.mark.parametrize("side", SIDES)
def test_mixed_run(benchmark, cluster, data, side):
    """Two writer processes and one learner for ``RAY_BENCH_MIXED_SECONDS``: transitions
    written + sampled per second go to ``extra_info``."""
    rb = build(side, prefetch=None if side.startswith("torchrl") else 2)
    try:
        ray_bench.fill(rb, data)
        benchmark.group = "ray mixed run"
        benchmark.name = side
        result = benchmark.pedantic(
            lambda: ray_bench.mixed_run(cluster, rb, side.startswith("torchrl"), MIXED_SECONDS), rounds=1, iterations=1
        )
        benchmark.extra_info.update(result)
        assert result["written_per_s"] > 0 and result["sampled_per_s"] > 0
    finally:
        rb.close()
