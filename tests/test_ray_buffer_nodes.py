"""The sharded Ray buffer on several nodes: a ``ray.cluster_utils.Cluster`` of the session's head
and three raylets added here (several raylets on one machine, as Ray's own tests run them).

Shards go one per node by default, a writer and the learner on nodes of their own; when a
shard's node is removed while a writer writes and the learner samples, the buffer goes on,
the shard restarts on another node from its checkpoint and journal, and the errors name every
row lost, for every shard lost in the call; a call waits for shards that are down at most one
``sample_timeout``, however many writes it has in flight.
"""
import contextlib
import sys
import time

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

import ray_support  # noqa: E402
from ray_support import prioritized, rows  # noqa: E402

from torchrl_compat import ray_buffer as ray_buffer_module  # noqa: E402
from torchrl_compat.ray_buffer import ShardRestartedError, ShardUnavailableError  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.fixture(scope="module")
def worker_nodes():
    """Three raylets of one CPU each, added to the session's head node for this module."""
    head = ray_support.cluster()
    added = [head.add_node(num_cpus=1, object_store_memory=80 * ray_support.MiB, wait=False) for _ in range(3)]
    head.wait_for_nodes()
    yield added
    alive = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    for node in added:
        if node.node_id in alive:
            head.remove_node(node)


def node_of(actor) -> str:
    return ray.get(actor.describe.remote(), timeout=60)["node"]


def _named(err) -> np.ndarray:
    """The global indices an error names as not stored (none when it names no rows)."""
    return np.zeros(0, dtype=np.int64) if err.index is None else err.index.numpy()


@ray.remote(num_cpus=0)
class Writer:
    """A writer on a node of its own: writes batches through its client, and keeps going
    after a write is reported lost (as a collector would), noting what each error named."""

    def node(self):
        return ray.get_runtime_context().get_node_id()

    def run(self, rb, writes: int, size: int, start: int, pause: float = 0.0):
        out, lost = [], []
        for step in range(writes):
            try:
                out.append(rb.extend(rows(size, start + step * size)).numpy())
            except (ShardRestartedError, ShardUnavailableError) as err:
                lost.append((sorted(err.shards), _named(err)))
                out.append(None)  # this write's rows are not returned: it raised first
            time.sleep(pause)
        try:
            rb.sync()
        except (ShardRestartedError, ShardUnavailableError) as err:
            lost.append((sorted(err.shards), _named(err)))
        rb.close()
        return out, lost


@pytest.fixture(scope="module")
def spread(worker_nodes, tmp_path_factory):
    """Three shards (journalled) on a cluster of four nodes, and a writer on a worker node."""
    recovery = tmp_path_factory.mktemp("recovery")
    rb = prioritized(3, 3000, write_ahead=True, recovery_dir=recovery, sample_timeout=30)
    shard_nodes = [node_of(actor) for actor in rb.actors]
    free = [node.node_id for node in worker_nodes if node.node_id not in shard_nodes]
    target = free[0] if free else shard_nodes[0]
    writer = Writer.options(scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
        target, soft=False)).remote()
    yield rb, shard_nodes, writer
    rb.close()


def test_shards_spread_one_per_node_and_rows_cross_nodes(spread):
    rb, shard_nodes, writer = spread
    learner = ray.get_runtime_context().get_node_id()
    assert len(set(shard_nodes)) == 3
    # placed so, not by chance: a placement group of one bundle a shard, STRICT_SPREAD (4 nodes
    # for 3 shards)
    groups = [g for g in ray.util.placement_group_table().values() if g["state"] == "CREATED"]
    assert [(g["strategy"], len(g["bundles"])) for g in groups] == [("STRICT_SPREAD", 3)]
    writer_node = ray.get(writer.node.remote())
    assert writer_node != learner
    # rows written from the writer's node read back on the learner's, sampled across nodes
    out, lost = ray.get(writer.run.remote(rb, 12, 250, 0))
    assert not lost
    index = np.concatenate(out)
    assert len(rb) == 3000 and len(np.unique(index)) == 3000
    assert (rb[torch.from_numpy(index)]["id"].numpy() == np.arange(3000)).all()
    sample = rb.sample(4096)
    assert set((sample["index"] // rb._stride).tolist()) == {0, 1, 2}
    row_of = dict(zip(index.tolist(), range(3000)))
    assert [row_of[g] for g in sample["index"].tolist()] == sample["id"].tolist()


def test_a_lost_node_s_shard_restarts_elsewhere_and_the_buffer_goes_on(spread, worker_nodes, tmp_path):
    rb, shard_nodes, writer = spread
    head = ray_support.cluster()
    rb.dumps(tmp_path / "ckpt")  # the shard restarts from this checkpoint and its journal after it
    writer_node = ray.get(writer.node.remote())
    victim = next(k for k, node in enumerate(shard_nodes)
                  if node != writer_node and node in {n.node_id for n in worker_nodes})
    run = writer.run.remote(rb, 60, 50, 10_000, 0.02)  # writes all through the node's loss
    restarted = None
    for step in range(400):
        if step == 5:
            head.remove_node(next(n for n in worker_nodes if n.node_id == shard_nodes[victim]))
        try:
            sample = rb.sample(256)
            assert len(sample) == 256
        except ShardRestartedError as err:
            restarted = err
        if restarted is not None and step > 20:
            break
    out, lost = ray.get(run)
    assert restarted is not None and restarted.shards == (victim,)
    assert restarted.rows_lost == 0  # its journal kept every write it acknowledged
    assert node_of(rb.actors[victim]) not in (shard_nodes[victim], None)
    # every row the writer was given an index for reads back its row, unless an error named it
    named = np.concatenate([index for _, index in lost]) if lost else np.zeros(0, dtype=np.int64)
    assert all(shards == [victim] for shards, _ in lost)
    for k, index in enumerate(out):
        if index is None:
            continue
        kept = ~np.isin(index, named)
        got = rb[torch.from_numpy(index[kept])]["id"].numpy()
        assert (got == 10_000 + 50 * k + np.flatnonzero(kept)).all()
    assert rb.sample(512)["id"].shape == (512,)  # the learner goes on


def test_two_shards_lost_in_one_call_are_named_with_all_their_rows(spread):
    rb, _, _ = spread
    writer = rb.client(chunk_rows=20)
    try:
        writer.extend(rows(60, 50_000))
        writer.sync()
        for shard in range(3):  # rows reserved on every shard: the next writes call no other
            writer._receive_reservation(shard, 40)
        # shards 0 and 1 busy: the writes below wait in their queues, so that the kills land
        # before any of them runs (ray.kill does not wait: a write that ran first would be
        # acknowledged, journalled and kept, rightly not named)
        for shard in (0, 1):
            rb.actors[shard].__ray_call__.remote(lambda shard: time.sleep(30))
        # three runs of 20 rows: one a shard, two to shards that die with them in their queues
        # (or restarted meanwhile, which refuse rows reserved before)
        index = torch.cat([writer.extend(rows(20, 50_100 + 20 * step)) for step in range(3)]).numpy()
        ray.kill(rb.actors[0], no_restart=False)
        ray.kill(rb.actors[1], no_restart=False)
        shard = index // rb._stride
        assert sorted(set(shard.tolist())) == [0, 1, 2]
        with pytest.raises(ShardRestartedError) as caught:
            writer.sync()
        err = caught.value
        assert err.shards == (0, 1) and set(err.lost) == {0, 1}
        assert "shard 0 of 3 was restarted" in str(err) and "shard 1 of 3 was restarted" in str(err)
        # every row of both shards is named, and only those
        assert sorted(err.index.tolist()) == sorted(index[shard < 2].tolist())
        assert (rb[torch.from_numpy(index[shard == 2])]["id"].numpy() == 50_100 + np.flatnonzero(shard == 2)).all()
    finally:
        writer.close()


def test_a_call_waits_one_sample_timeout_for_a_shard_that_is_gone(spread, monkeypatch):
    """Many writes in flight to a shard that never comes back: ``sync`` waits for it once (one
    deadline for the whole call), then names every row of every one of them."""
    rb, _, _ = spread
    writer = rb.client(chunk_rows=20, sample_timeout=3)
    waits = []
    await_restart = ray_buffer_module.RayReplayBuffer._await_restart

    def counted(self, shard, faults):
        waits.append(shard)
        return await_restart(self, shard, faults)

    monkeypatch.setattr(ray_buffer_module.RayReplayBuffer, "_await_restart", counted)
    try:
        with contextlib.suppress(ShardRestartedError):
            len(writer)  # the restarts of the test before, which this client's totals predate
        waits.clear()
        writer.extend(rows(20, 70_000))
        writer.sync()
        writer._receive_reservation(2, 400)  # rows enough on shard 2: no reservation waited for
        # the shard stops answering (busy), its writes pile up, then it dies for good
        rb.actors[2].__ray_call__.remote(lambda shard: time.sleep(60))
        written = [writer.extend(rows(20, 70_100 + 20 * step)) for step in range(30)]
        ray.kill(rb.actors[2], no_restart=True)
        index = torch.cat(written).numpy()
        with pytest.raises((ShardUnavailableError, ShardRestartedError)) as caught:
            writer.sync()
        err = caught.value
        assert waits.count(2) == 1  # one wait for the shard, not one per write
        assert 2 in err.shards
        assert set(index[index // rb._stride == 2].tolist()) <= set(err.index.tolist())
    finally:
        writer.__dict__.pop("_actors", None)  # its shard is gone for good: nothing to release


def test_spread_strategy_follows_the_nodes(monkeypatch):
    """``STRICT_SPREAD`` with more nodes than shards, ``SPREAD`` with as many or fewer, none on
    one node or for one shard; nodes without the CPU a bundle asks for do not count."""
    made = []

    class FakeGroup:
        def __init__(self, bundles, strategy):
            made.append((len(bundles), strategy, bundles[0]))

        def wait(self, timeout):
            return True

    class FakeRay:
        def __init__(self, cpus):
            self.cpus = cpus

        def nodes(self):
            return [{"Alive": True, "Resources": {"CPU": c}} for c in self.cpus]

    monkeypatch.setattr(sys.modules["ray.util.placement_group"], "placement_group", FakeGroup)
    spread_group = ray_buffer_module._spread_group
    assert spread_group(FakeRay([2, 1, 1, 1]), {"num_cpus": 0}, 3, 1) is not None
    assert spread_group(FakeRay([2, 1, 1]), {"num_cpus": 0}, 3, 1) is not None
    assert spread_group(FakeRay([2, 1]), {"num_cpus": 1}, 4, 1) is not None
    assert spread_group(FakeRay([2, 0, 0]), {"num_cpus": 0}, 2, 1) is None  # one node has a CPU
    assert spread_group(FakeRay([2, 2]), {"num_cpus": 0}, 1, 1) is None
    assert made == [(3, "STRICT_SPREAD", {"CPU": 0.01}), (3, "SPREAD", {"CPU": 0.01}), (4, "SPREAD", {"CPU": 1.0})]
