"""Sharded Ray buffer against torchrl's one-actor ``RayReplayBuffer``, on one local cluster.

Workload: a prioritized TensorDict buffer of 100,000 rows (a 64-float ``obs``), filled
first; writes of 1,000 rows; batches of 256, each followed by ``update_priority``. torchrl
0.11's compiled trees do not load on torch 2.13, so its side runs on the trees
``torchrl_compat.install_segment_trees()`` serves (``TORCHRL_COMPAT_INSTALL_TREES=1`` in the
actors), as a user on torch 2.13 must run it.

Both sides do the same work: a write counts once it has landed (torchrl's ``extend`` returns
then; ours returns before, so a run of writes is timed until :meth:`sync` has seen them all),
samples go without prefetch on both sides, and a learner step's priority update has landed
before the step is over (torchrl's blocks; ours is sent without waiting and is seen by the
next sample, so a run of steps is timed until :meth:`sync`). Ours samples through its
compiled learner graph (``ours_<n>``) or Ray's task path (``ours_<n>_task``).

Used by ``bench/test_bench_ray.py`` (pytest-benchmark) and runnable on its own for the mixed
run and the time per part::

    PYTHONPATH=$PWD python bench/ray_bench.py --seconds 30 --shards 1 2
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import numpy as np
import torch
from tensordict import TensorDict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CAPACITY = 100_000
WRITE = 1_000
BATCH = 256
OBS = 64


def start_cluster(num_cpus: int = 2, trees: bool = True):
    """A local cluster whose workers import this checkout and (``trees``) serve torchrl 0.11
    our segment trees."""
    bench = os.path.join(ROOT, "bench")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, bench, os.environ.get("PYTHONPATH")]))
    import ray

    runtime_env = None
    if trees:
        serve_trees()
        # every worker serves the trees before anything unpickles torchrl's samplers
        runtime_env = {"worker_process_setup_hook": "ray_bench.serve_trees"}
    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, runtime_env=runtime_env)
    return ray


def serve_trees() -> None:
    """``replay``'s trees for torchrl: ``install_segment_trees()`` (torchrl 0.11), and for
    torchrl 0.14, whose sampler module moved, the same four names set in that module."""
    import torchrl_compat_trees

    torchrl_compat_trees.install_segment_trees()
    try:
        import torchrl.data.replay_buffers.samplers.prioritized as prioritized
    except ImportError:
        return
    import replay

    for name in torchrl_compat_trees.TREE_NAMES:
        if getattr(prioritized, name, None) is None:
            setattr(prioritized, name, getattr(replay, name))


def payloads(count: int = 8):
    gen = torch.Generator().manual_seed(0)
    return [TensorDict({"obs": torch.randn(WRITE, OBS, generator=gen)}, [WRITE]) for _ in range(count)]


# torch in a Ray worker of a 2-CPU cluster runs 2 intra-op threads: on a loaded machine a
# gather then waits for the second one (our shards use one thread; this gives torchrl's actor
# the same, for a like-for-like comparison).
ONE_THREAD = {"runtime_env": {"env_vars": {"OMP_NUM_THREADS": "1"}}}


def make_torchrl(one_thread: bool = False):
    from torchrl.data import LazyTensorStorage, PrioritizedSampler, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer

    return RayReplayBuffer(
        replay_buffer_cls=TensorDictReplayBuffer,
        remote_config={"num_cpus": 0, **(ONE_THREAD if one_thread else {})},
        storage=functools.partial(LazyTensorStorage, CAPACITY),
        sampler=functools.partial(PrioritizedSampler, CAPACITY, alpha=0.7, beta=0.5),
        batch_size=BATCH,
    )


def make_torchrl014():
    """torchrl 0.14's own: ``TensorDictReplayBuffer(service_backend="ray")`` (run with the
    torchrl 0.14.1 environment's interpreter)."""
    from torchrl.data import LazyTensorStorage, PrioritizedSampler, TensorDictReplayBuffer

    return TensorDictReplayBuffer(
        service_backend="ray",
        service_backend_options={"remote_config": {"num_cpus": 0}},
        storage=functools.partial(LazyTensorStorage, CAPACITY),
        sampler=functools.partial(PrioritizedSampler, CAPACITY, alpha=0.7, beta=0.5),
        batch_size=BATCH,
    )


def make_ours(num_shards: int, prefetch: int | None = None, compiled_graph: bool = True):
    from torchrl_compat import LazyTensorStorage, PrioritizedSampler, RayReplayBuffer, TensorDictReplayBuffer

    return RayReplayBuffer(
        replay_buffer_cls=TensorDictReplayBuffer,
        num_shards=num_shards,
        storage=functools.partial(LazyTensorStorage, CAPACITY),
        sampler=functools.partial(PrioritizedSampler, CAPACITY, alpha=0.7, beta=0.5),
        batch_size=BATCH,
        prefetch=prefetch,
        compiled_graph=compiled_graph,
    )


def make_side(side: str):
    """``torchrl``, ``torchrl_1thread``, ``torchrl014``, ``ours_<n>`` or ``ours_<n>_task``."""
    if side == "torchrl014":
        return make_torchrl014()
    if side.startswith("torchrl"):
        return make_torchrl(side == "torchrl_1thread")
    parts = side.split("_")
    return make_ours(int(parts[1]), compiled_graph=parts[-1] != "task")


def fill(rb, data) -> None:
    for i in range(CAPACITY // WRITE):
        rb.extend(data[i % len(data)])
    settle(rb)


def warm_up(rb, steps: int = 5) -> None:
    """A few learner steps before timing: ours compiles its learner graph on the first sample
    (about a second), which is set-up, not a step's cost."""
    for _ in range(steps):
        learner_step(rb)
    settle(rb)


def settle(rb) -> None:
    """Waits for what ``rb`` has in flight (ours: writes and updates; torchrl's: nothing)."""
    if hasattr(rb, "sync"):
        rb.sync()


def learner_step(rb) -> int:
    sample = rb.sample(BATCH)
    rb.update_priority(sample["index"], torch.rand(BATCH) + 0.01)
    return BATCH


def sustained(rb, fn, rounds: int) -> float:
    """Seconds per call over ``rounds`` calls and the wait for what they left in flight: the
    rate at which the work lands (ours returns from ``extend`` and ``update_priority`` before
    the shard has done it)."""
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    settle(rb)
    return (time.perf_counter() - start) / rounds


def repeated(fn, repeats: int) -> list[float]:
    return [fn() for _ in range(repeats)]


def per_call(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def writer_actor(ray):
    @ray.remote(num_cpus=0)
    class Writer:
        """A writer process: extends for ``seconds`` (torchrl's buffer through its actor handle,
        as its client does; ours through a client of its own, unpickled here)."""

        def __init__(self, target, torchrl_side: bool):
            self.target = target
            self.torchrl_side = torchrl_side
            self.data = payloads(4)

        def run(self, seconds: float) -> tuple[int, float]:
            """Rows written, and the seconds until the last of them landed."""
            import ray as _ray

            written = 0
            start = time.monotonic()
            deadline = start + seconds
            while time.monotonic() < deadline:
                data = self.data[written // WRITE % 4]
                if self.torchrl_side:
                    _ray.get(self.target.extend.remote(data))
                else:
                    self.target.extend(data)
                written += WRITE
            if not self.torchrl_side:
                self.target.sync()  # our writes return before they land: counted once landed
            return written, time.monotonic() - start

    return Writer


def mixed_run(ray, rb, torchrl_side: bool, seconds: float) -> dict:
    """Two writer processes and one learner (this process) for ``seconds``; each side's
    rows per second counted over the time until its work had landed (ours drains its writes
    and updates in flight at the end: that time counts)."""
    Writer = writer_actor(ray)
    target = rb._rb if torchrl_side else rb
    writers = [Writer.remote(target, torchrl_side) for _ in range(2)]
    ray.get([w.__ray_ready__.remote() for w in writers])
    runs = [w.run.remote(seconds) for w in writers]
    sampled = 0
    start = time.monotonic()
    deadline = start + seconds
    while time.monotonic() < deadline:
        sampled += learner_step(rb)
    settle(rb)
    learner_seconds = time.monotonic() - start
    results = ray.get(runs)
    written = sum(rows for rows, _ in results)
    writer_seconds = max(elapsed for _, elapsed in results)
    for w in writers:
        ray.kill(w)
    return {
        "written_per_s": written / writer_seconds,
        "sampled_per_s": sampled / learner_seconds,
        "transitions_per_s": written / writer_seconds + sampled / learner_seconds,
    }


def parts(rb, data, rounds: int = 200) -> dict:
    """Time per part of our calls (µs, medians): the client's own work, Ray's round trips on
    the task path and through the compiled graph, and the shard's own work."""
    import pickle

    from torchrl_compat._ray import routing
    from torchrl_compat._ray import wire

    ray = rb._ray
    actor = rb._actors[0]
    packed = wire.pack(data[0])
    args = wire.to_arguments(packed)
    counter = iter(range(10**9))
    out = {
        "client_pack_us": per_call(lambda: wire.pack(data[0]), rounds) * 1e6,
        "client_copy_held_us": per_call(lambda: wire.copy(packed), rounds) * 1e6,
        # Ray pickles arguments with protocol 5, numpy buffers out of band
        "client_pickle_pieces_us": per_call(lambda: pickle.dumps(args, protocol=5, buffer_callback=[].append),
                                            rounds) * 1e6,
        "client_extend_returns_us": per_call(lambda: rb.extend(data[next(counter) % len(data)]), rounds) * 1e6,
    }
    settle(rb)
    out["round_trip_ping_us"] = per_call(lambda: ray.get(actor.ping.remote()), rounds) * 1e6
    token, start, stop, _ = ray.get(actor.reserve.remote(WRITE * rounds))[0]
    starts = iter(range(start, stop, WRITE))
    out["round_trip_write_us"] = per_call(
        lambda: ray.get(actor.write_at.remote(token, next(starts), None, *args)), rounds) * 1e6
    rb._refresh_totals()
    fraction = np.random.default_rng(0).random(BATCH)
    out["round_trip_sample_task_us"] = per_call(lambda: ray.get(actor.sample_prioritized.remote(fraction)),
                                                rounds) * 1e6
    if rb._uses_graph():
        idle = [("ping", None, None)] * rb.num_shards
        draw = [("sample_prioritized", fraction, None)] + [("ping", None, None)] * (rb.num_shards - 1)
        out["round_trip_graph_empty_us"] = per_call(lambda: ray.get(rb._graph.execute(idle)), rounds) * 1e6
        out["round_trip_graph_sample_us"] = per_call(lambda: ray.get(rb._graph.execute(draw)), rounds) * 1e6
    reply = ray.get(actor.sample_prioritized.remote(fraction))
    positions = [np.arange(BATCH)]
    out["client_route_us"] = per_call(lambda: routing.route_masses(rb._totals.sum, BATCH), rounds) * 1e6
    out["client_assemble_us"] = per_call(lambda: wire.unpack(wire.scatter([reply[0]], positions, BATCH)),
                                         rounds) * 1e6
    out.update(ray.get(actor.time_parts.remote(packed, fraction, rounds)))
    return out


def torchrl_parts(rb, data, make_local, rounds: int = 200) -> dict:
    """Time per part of torchrl's calls: a round trip doing nothing, pickling the batch, and the
    work its actor does (the same buffer, local)."""
    import pickle

    ray = start_cluster.__globals__.get("ray") or __import__("ray")
    local = make_local()
    for i in range(CAPACITY // WRITE):
        local.extend(data[i % len(data)])
    counter = iter(range(10**9))
    return {
        "round_trip_getattr_us": per_call(lambda: ray.get(rb._rb._getattr.remote("_batch_size")), rounds) * 1e6,
        "pickle_batch_us": per_call(lambda: pickle.dumps(data[0]), rounds) * 1e6,
        "actor_extend_us": per_call(lambda: local.extend(data[next(counter) % len(data)]), rounds) * 1e6,
        "actor_sample_update_us": per_call(lambda: learner_step(local), rounds) * 1e6,
    }


def local_torchrl():
    from torchrl.data import LazyTensorStorage, PrioritizedSampler, TensorDictReplayBuffer

    return TensorDictReplayBuffer(
        storage=LazyTensorStorage(CAPACITY),
        sampler=PrioritizedSampler(CAPACITY, alpha=0.7, beta=0.5),
        batch_size=BATCH,
    )


def measure(side: str, data, rounds: int, repeats: int) -> dict:
    """The equal-work figures of one side (ms): a write's share of ``rounds`` writes once they
    have landed, and a learner step's share of ``rounds`` steps once their updates have, each
    ``repeats`` times (their median, and each run)."""
    rb = make_side(side)
    try:
        fill(rb, data)
        warm_up(rb)
        counter = iter(range(10**9))
        write = lambda: rb.extend(data[next(counter) % len(data)])  # noqa: E731
        extend = repeated(lambda: sustained(rb, write, rounds) * 1e3, repeats)
        step = repeated(lambda: sustained(rb, lambda: learner_step(rb), rounds) * 1e3, repeats)
        return {"extend_landed_ms": float(np.median(extend)), "extend_runs": extend,
                "sample_update_ms": float(np.median(step)), "sample_update_runs": step}
    finally:
        rb.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0, help="of each mixed run (0: none)")
    parser.add_argument("--sides", nargs="+", default=["torchrl", "ours_1", "ours_2", "ours_1_task", "ours_2_task"],
                        help="torchrl (0.11's RayReplayBuffer), torchrl_1thread (the same, its actor on one "
                             "torch thread), torchrl014 (0.14's service_backend='ray', in its own environment), "
                             "ours_<shards> (through the compiled learner graph), ours_<shards>_task (Ray's "
                             "task path)")
    parser.add_argument("--rounds", type=int, default=20, help="writes / learner steps per timed run")
    parser.add_argument("--repeats", type=int, default=15, help="timed runs per side and round")
    parser.add_argument("--interleave", type=int, default=2, help="rounds over all sides, one after the other")
    parser.add_argument("--parts", action="store_true", help="time the parts of each call")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    ray = start_cluster()
    data = payloads()
    results = {side: [] for side in args.sides}
    for _ in range(args.interleave):
        for side in args.sides:
            result = measure(side, data, args.rounds, args.repeats)
            results[side].append(result)
            print(side, json.dumps({k: v for k, v in result.items() if not k.endswith("runs")}), flush=True)
    summary = {side: {"extend_landed_ms": float(np.median([r["extend_landed_ms"] for r in runs])),
                      "sample_update_ms": float(np.median([r["sample_update_ms"] for r in runs]))}
               for side, runs in results.items()}
    for side in args.sides:
        rb = make_side(side)
        try:
            fill(rb, data)
            warm_up(rb)
            if args.parts:
                if side.startswith("ours"):
                    summary[side]["parts"] = parts(rb, data)
                else:
                    summary[side]["parts"] = torchrl_parts(rb, data, local_torchrl)
            if args.seconds:
                summary[side]["mixed"] = mixed_run(ray, rb, side.startswith("torchrl"), args.seconds)
        finally:
            rb.close()
    print(json.dumps(summary, indent=1), flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"summary": summary, "runs": results}, handle, indent=1)


if __name__ == "__main__":
    main()
