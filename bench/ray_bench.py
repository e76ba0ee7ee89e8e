"""Sharded Ray buffer against torchrl's one-actor ``RayReplayBuffer``, on one local cluster.

Workload: a prioritized TensorDict buffer of 100,000 rows (a 64-float ``obs``), filled
first; writes of 1,000 rows; batches of 256, each followed by ``update_priority``. torchrl
0.11's compiled trees do not load on torch 2.13, so its side runs on the trees
``torchrl_compat.install_segment_trees()`` serves (``TORCHRL_COMPAT_INSTALL_TREES=1`` in the
actors), as a user on torch 2.13 must run it.

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


def make_ours(num_shards: int, prefetch: int | None = None):
    from torchrl_compat import LazyTensorStorage, PrioritizedSampler, RayReplayBuffer, TensorDictReplayBuffer

    return RayReplayBuffer(
        replay_buffer_cls=TensorDictReplayBuffer,
        num_shards=num_shards,
        storage=functools.partial(LazyTensorStorage, CAPACITY),
        sampler=functools.partial(PrioritizedSampler, CAPACITY, alpha=0.7, beta=0.5),
        batch_size=BATCH,
        prefetch=prefetch,
    )


def fill(rb, data) -> None:
    for i in range(CAPACITY // WRITE):
        rb.extend(data[i % len(data)])


def learner_step(rb) -> int:
    sample = rb.sample(BATCH)
    rb.update_priority(sample["index"], torch.rand(BATCH) + 0.01)
    return BATCH


def sustained(rb, fn, rounds: int) -> float:
    """Seconds per call over ``rounds`` calls and the wait for what they left in flight (ours
    returns from ``extend`` before the shard has written: this is the rate the shards keep)."""
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    if hasattr(rb, "sync"):
        rb.sync()
    return (time.perf_counter() - start) / rounds


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

        def run(self, seconds: float) -> int:
            import ray as _ray

            written = 0
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                data = self.data[written // WRITE % 4]
                if self.torchrl_side:
                    _ray.get(self.target.extend.remote(data))
                else:
                    self.target.extend(data)
                written += WRITE
            if not self.torchrl_side:
                self.target.sync()  # our writes return before they land: count landed ones
            return written

    return Writer


def mixed_run(ray, rb, torchrl_side: bool, seconds: float) -> dict:
    """Two writer processes and one learner (this process) for ``seconds``."""
    Writer = writer_actor(ray)
    target = rb._rb if torchrl_side else rb
    writers = [Writer.remote(target, torchrl_side) for _ in range(2)]
    ray.get([w.__ray_ready__.remote() for w in writers])
    runs = [w.run.remote(seconds) for w in writers]
    sampled = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sampled += learner_step(rb)
    written = sum(ray.get(runs))
    for w in writers:
        ray.kill(w)
    return {
        "written_per_s": written / seconds,
        "sampled_per_s": sampled / seconds,
        "transitions_per_s": (written + sampled) / seconds,
    }


def parts(rb, data, rounds: int = 200) -> dict:
    """Time per part of our extend and sample: client side and the shard's side."""
    import pickle

    from torchrl_compat import _ray_routing as routing, _ray_wire as wire

    ray = rb._ray
    actor = rb._actors[0]
    packed = wire.pack(data[0])
    out = {
        "client_pack_us": per_call(lambda: wire.pack(data[0]), rounds) * 1e6,
        "round_trip_ping_us": per_call(lambda: ray.get(actor.ping.remote()), rounds) * 1e6,
        "round_trip_extend_us": per_call(lambda: ray.get(actor.extend.remote(None, *wire.to_arguments(packed))), rounds) * 1e6,
        "round_trip_extend_one_argument_us": per_call(
            lambda: ray.get(actor.extend.remote(None, (packed[0], packed[1], (1,) * len(packed[2]), packed[3]), *packed[2])),
            rounds) * 1e6,
    }
    args = wire.to_arguments(packed)
    # Ray pickles arguments with protocol 5, numpy buffers out of band
    out["client_pickle_pieces_us"] = per_call(
        lambda: pickle.dumps(args, protocol=5, buffer_callback=[].append), rounds) * 1e6
    out["client_pickle_pieces_inband_us"] = per_call(lambda: pickle.dumps(args, protocol=5), rounds) * 1e6
    token_start = ray.get(actor.reserve.remote(WRITE * rounds))[0]
    starts = iter(range(token_start[1], token_start[1] + WRITE * rounds, WRITE))
    refs = []
    out["client_submit_write_us"] = per_call(
        lambda: refs.append(actor.write_at.remote(token_start[0], next(starts), None, *args)), rounds) * 1e6
    ray.get(refs)
    fraction = np.random.default_rng(0).random(BATCH)
    out["round_trip_sample_us"] = per_call(lambda: ray.get(actor.sample_prioritized.remote(fraction)), rounds) * 1e6
    reply = ray.get(actor.sample_prioritized.remote(fraction))
    positions = [np.arange(BATCH)]
    out["client_route_us"] = per_call(lambda: routing.route_masses(rb._totals.sum, BATCH), rounds) * 1e6
    out["client_assemble_us"] = per_call(lambda: wire.unpack(wire.scatter([reply[0]], positions, BATCH)), rounds) * 1e6
    shard_times = ray.get(actor.time_parts.remote(packed, fraction, rounds)) if hasattr(actor, "time_parts") else {}
    out.update(shard_times)
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--sides", nargs="+", default=["torchrl", "torchrl_1thread", "ours"],
                        help="torchrl (0.11's RayReplayBuffer), torchrl_1thread (the same, its actor on "
                             "one torch thread), torchrl014 (0.14's service_backend='ray', in its own "
                             "environment), ours")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    ray = start_cluster()
    data = payloads()
    results = {}
    sides = [(side, None) for side in args.sides if side != "ours"]
    if "ours" in args.sides:
        sides += [(f"ours_{n}", n) for n in args.shards]
    for name, shards in sides:
        if shards is not None:
            rb = make_ours(shards)
        else:
            rb = make_torchrl014() if name == "torchrl014" else make_torchrl(name == "torchrl_1thread")
        fill(rb, data)
        counter = iter(range(10**9))
        result = {
            "extend_ms": per_call(lambda: rb.extend(data[next(counter) % len(data)]), args.rounds) * 1e3,
            "extend_sustained_ms": sustained(rb, lambda: rb.extend(data[next(counter) % len(data)]), args.rounds) * 1e3,
            "sample_update_ms": per_call(lambda: learner_step(rb), args.rounds) * 1e3,
        }
        if shards is not None:
            result["parts"] = parts(rb, data)
        else:
            result["parts"] = torchrl_parts(rb, data, local_torchrl)
        result["mixed"] = mixed_run(ray, rb, shards is None, args.seconds)
        rb.close()
        if shards is not None:
            rb = make_ours(shards, prefetch=2)
            fill(rb, data)
            result["sample_update_prefetch_ms"] = per_call(lambda: learner_step(rb), args.rounds) * 1e3
            result["mixed_prefetch"] = mixed_run(ray, rb, False, args.seconds)
            rb.close()
        results[name] = result
        print(name, json.dumps(result, indent=1), flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
