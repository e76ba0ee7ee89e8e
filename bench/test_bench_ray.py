"""Sharded Ray buffer against torchrl 0.11's ``RayReplayBuffer``, side by side on one local
cluster (``ray.init(num_cpus=2)``), on equal work.

Workload (see ``bench/ray_bench.py``, which also runs the mixed run, torchrl 0.14.1's
``service_backend="ray"`` in its own environment, and times the parts of each call): a
prioritized TensorDict buffer of 100,000 rows with a 64-float ``obs``, filled before timing;
runs of 20 writes of 1,000 rows, timed until every write has landed (ours returns from
``extend`` before that: the run ends with ``sync()``); runs of 20 learner steps, each a
``sample(256)`` and its ``update_priority``, without prefetch on either side, timed until the
last update has landed. torchrl's side runs on the segment trees
``torchrl_compat.install_segment_trees()`` serves (its compiled trees do not load on torch 2.13).
``ours_<n>`` samples through its compiled learner graph, ``ours_<n>_task`` through Ray's tasks.

    PYTHONPATH=$PWD python -m pytest bench/test_bench_ray.py --benchmark-group-by=group
"""
import os
import sys

import pytest

pytest.importorskip("ray")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ray_bench  # noqa: E402

MIXED_SECONDS = float(os.environ.get("RAY_BENCH_MIXED_SECONDS", "30"))
ROUNDS = 20
SIDES = ["torchrl", "torchrl_1thread", "ours_1", "ours_2", "ours_1_task", "ours_2_task"]


@pytest.fixture(scope="module")
def cluster():
    ray = ray_bench.start_cluster()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def data():
    return ray_bench.payloads()


@pytest.fixture(scope="module", params=SIDES)
def filled(request, cluster, data):
    rb = ray_bench.make_side(request.param)
    ray_bench.fill(rb, data)
    ray_bench.warm_up(rb)
    yield request.param, rb
    rb.close()


def test_extend_landed(benchmark, filled, data):
    """20 writes of 1,000 rows, until all have landed (ms per run of 20)."""
    side, rb = filled
    benchmark.group = f"ray extend 1000 rows x {ROUNDS}, landed"
    benchmark.name = side
    counter = iter(range(10**9))
    benchmark.pedantic(lambda: ray_bench.sustained(rb, lambda: rb.extend(data[next(counter) % len(data)]), ROUNDS),
                       rounds=15, warmup_rounds=2)


def test_sample_update(benchmark, filled):
    """20 steps of sample(256) + update_priority without prefetch, until the last update has
    landed (ms per run of 20)."""
    side, rb = filled
    benchmark.group = f"ray sample 256 + update_priority x {ROUNDS}, no prefetch"
    benchmark.name = side
    benchmark.pedantic(lambda: ray_bench.sustained(rb, lambda: ray_bench.learner_step(rb), ROUNDS),
                       rounds=15, warmup_rounds=2)


@pytest.mark.parametrize("side", ["torchrl", "ours_1", "ours_2"])
def test_mixed_run(benchmark, cluster, data, side):
    """Two writer processes and one learner for ``RAY_BENCH_MIXED_SECONDS``: transitions
    written + sampled per second (each counted once landed) go to ``extra_info``."""
    rb = ray_bench.make_side(side)
    try:
        ray_bench.fill(rb, data)
        ray_bench.warm_up(rb)
        benchmark.group = "ray mixed run"
        benchmark.name = side
        result = benchmark.pedantic(
            lambda: ray_bench.mixed_run(cluster, rb, side.startswith("torchrl"), MIXED_SECONDS), rounds=1, iterations=1
        )
        benchmark.extra_info.update(result)
        assert result["written_per_s"] > 0 and result["sampled_per_s"] > 0
    finally:
        rb.close()
