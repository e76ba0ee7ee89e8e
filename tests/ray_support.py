"""What the Ray test modules share: a local cluster for the length of a module, and the
prioritized sharded buffer they build."""
import contextlib
import functools
import os
import signal

import ray
import torch

from torchrl_compat import LazyTensorStorage, PrioritizedSampler, RayReplayBuffer, TensorDictReplayBuffer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")


@contextlib.contextmanager
def local_cluster():
    """``ray.init(num_cpus=2)`` unless a cluster is up, shut down again on exit.

    The shard and writer actors import this checkout and the test modules: the workers inherit
    the driver's environment. ``ray.init`` replaces the driver's SIGTERM / SIGINT handlers,
    and ``ray.shutdown`` leaves its own: the storages' clean-up handlers of later tests (and
    their forked children) would never run, so the handlers found are handed back.
    """
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, TESTS, os.environ.get("PYTHONPATH")]))
    started = not ray.is_initialized()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def prioritized(num_shards, capacity, **kwargs):
    """A sharded prioritized buffer of ``capacity`` rows in all (fp64 trees, alpha 1)."""
    return RayReplayBuffer(
        replay_buffer_cls=TensorDictReplayBuffer,
        num_shards=num_shards,
        storage=functools.partial(LazyTensorStorage, capacity),
        sampler=functools.partial(PrioritizedSampler, capacity, alpha=1.0, beta=0.6, dtype=torch.float64),
        **kwargs,
    )
