"""What the Ray test modules share: one Ray cluster for all of them, buffers built once and
emptied for each test, and the checks they make.

The cluster is a ``ray.cluster_utils.Cluster``: a head node of 2 CPUs, to which the
multi-node module adds raylets of its own (as Ray's own tests do), with health checks fast
enough that a removed node is seen dead within a couple of seconds. It starts with the first
Ray test and stops when the run leaves the Ray modules (``tests/conftest.py``). Shard actors
cost a process each (seconds to start on a 2-core machine), so the buffers the tests use are
built once (:func:`pooled`) and handed out emptied.
"""
import contextlib
import functools
import os
import signal

import numpy as np
import torch
from tensordict import TensorDict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
RAY_MODULE_PREFIX = "test_ray_buffer"
# A removed node is declared dead after about 4 x 250 ms without a heartbeat.
HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 250,
                 "health_check_failure_threshold": 4}
MiB = 2**20

_state = {"cluster": None, "handlers": None, "pool": {}}


def cluster():
    """The session's cluster, started on first use (its head node only)."""
    if _state["cluster"] is None:
        import ray
        from ray.cluster_utils import Cluster

        # the shard and writer actors import this checkout and the test modules: the raylets
        # (and so the workers) inherit the driver's environment
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, TESTS, os.environ.get("PYTHONPATH")]))
        # ray.init replaces the driver's SIGTERM / SIGINT handlers and ray.shutdown leaves its
        # own: the storages' clean-up handlers of later tests would never run
        _state["handlers"] = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        head = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=2, object_store_memory=256 * MiB, include_dashboard=False, _system_config=HEALTH_CHECKS))
        ray.init(address=head.address, log_to_driver=False)
        _state["cluster"] = head
    return _state["cluster"]


def shutdown() -> None:
    """Closes the pooled buffers and stops the cluster (when it was started)."""
    head = _state["cluster"]
    if head is None:
        return
    import ray

    for rb in _state["pool"].values():
        with contextlib.suppress(Exception):
            rb.close()
    _state["pool"].clear()
    ray.shutdown()
    head.shutdown()
    _state["cluster"] = None
    for sig, handler in _state["handlers"].items():
        signal.signal(sig, handler)


def prioritized(num_shards, capacity, dtype=torch.float64, **kwargs):
    """A sharded prioritized buffer of ``capacity`` rows in all (alpha 1, beta 0.6)."""
    from torchrl_compat import LazyTensorStorage, PrioritizedSampler, RayReplayBuffer, TensorDictReplayBuffer

    return RayReplayBuffer(
        replay_buffer_cls=TensorDictReplayBuffer,
        num_shards=num_shards,
        storage=functools.partial(LazyTensorStorage, capacity),
        sampler=functools.partial(PrioritizedSampler, capacity, alpha=1.0, beta=0.6, dtype=dtype),
        **kwargs,
    )


def pooled(name, build, *, owner=False, **client):
    """The buffer ``name`` (built by ``build()`` the first time), emptied: the buffer itself
    with ``owner`` (its compiled learner graph included), else a new client of it on Ray's
    task path (``client`` its options: ``chunk_rows``, ``prefetch``, ``batch_size``), which
    the caller closes."""
    cluster()
    rb = _state["pool"].get(name)
    if rb is None or not rb.is_alive:
        rb = _state["pool"][name] = build()
    rb.empty()
    return rb if owner else rb.client(**client)


def rows(n, start=0, width=1):
    """``n`` rows whose ``id`` and ``obs`` (``width`` columns) are ``start``, ``start + 1``, ...
    (the pooled buffers hold rows of this layout: ``width=1``)."""
    obs = torch.arange(start, start + n, dtype=torch.float64).unsqueeze(-1).expand(n, width).contiguous()
    return TensorDict({"id": torch.arange(start, start + n), "obs": obs}, [n])


def chi_square_p(observed, expected, pool_below=5.0) -> float:
    """p-value of Pearson's chi-square test. Cells expecting fewer than ``pool_below`` draws are
    pooled into one; the test refuses to run when that pooled cell would hide more than a
    tenth of the cells (it could then hide a cell drawn ten times too often)."""
    observed = np.asarray(observed, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    small = expected < pool_below
    if small.sum() > 0.1 * len(expected):
        raise AssertionError(f"{int(small.sum())} of {len(expected)} cells expect fewer than {pool_below} draws")
    observed = np.append(observed[~small], observed[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    stat = float(((observed - expected) ** 2 / expected).sum())
    dof = len(expected) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def reference_ring(capacities, width):
    """The write ring by its definition: round ``r`` gives each shard in turn its rows
    ``[r * width, (r + 1) * width)`` that it has; ``(shard, local row)`` position by position."""
    order = []
    for start in range(0, max(capacities), width):
        for shard, capacity in enumerate(capacities):
            order += [(shard, local) for local in range(start, min(start + width, capacity))]
    return order


def ring_index(rb, chunk_rows=None):
    """``phi[p]``: the global index of the ``p``-th row of the write ring of ``rb`` (with runs
    of ``chunk_rows``), i.e. where the sharded buffer keeps the row one buffer of the same
    capacity keeps at index ``p``."""
    order = reference_ring(rb._capacities, chunk_rows or rb._chunk_rows)
    return np.array([shard * rb._stride + local for shard, local in order], dtype=np.int64)
