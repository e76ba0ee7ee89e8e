"""The sharded Ray buffer's writes that do not wait for their shard: indices from reserved
ranges, unique across writer processes; a failed write reported by the next call, naming the
shard and rows; a sample after an update (or a write) seeing it.

One local cluster (``ray.init(num_cpus=2)``) serves the whole module.
"""
import time

import numpy as np
import pytest
import torch
from tensordict import TensorDict

ray = pytest.importorskip("ray")

from ray_support import local_cluster, prioritized  # noqa: E402

from torchrl_compat._ray_writes import Reservations, describe_rows  # noqa: E402
from torchrl_compat.ray_buffer import ShardRestartedError, ShardWriteError  # noqa: E402



@pytest.fixture(scope="module", autouse=True)
def cluster():
    with local_cluster():
        yield


def rows(n, start=0, width=1):
    obs = torch.arange(start, start + n, dtype=torch.float64).unsqueeze(-1).expand(n, width).contiguous()
    return TensorDict({"obs": obs}, [n])


def test_reservations_and_row_descriptions():
    reservations = Reservations(2, block=10)
    reservations.add(0, "t", 0)
    reservations.add(0, "t", 30)
    assert reservations.take(0, 4) == [("t", 0, 4)]
    assert reservations.take(0, 8) == [("t", 4, 6), ("t", 30, 2)]
    assert reservations.held(0) == 8 and reservations.held(1) == 0
    assert reservations.take(1, 3) == []
    assert reservations.drop() == [(0, "t", 32, 40)]
    assert describe_rows(np.array([100, 101, 102, 7, 9, 10])) == "100..102, 7, 9..10 (6 rows)"
    assert describe_rows(np.arange(0, 20, 2), limit=2).startswith("0, 2, ... (8 more runs)")


def test_extend_returns_indices_before_the_shards_answer():
    rb = prioritized(2, 400, chunk_rows=10)
    try:
        index = rb.extend(rows(150))
        # the write is in flight (or done): the indices are the rows' own all the same
        assert len(set(index.tolist())) == 150
        assert (rb[index]["obs"][:, 0] == torch.arange(150, dtype=torch.float64)).all()
        assert len(rb) == 150 and rb.write_count == 150
        # each shard holds its rows from row 0 on, in the order written
        shard, local = np.divmod(index.numpy(), 200)
        for k in (0, 1):
            assert (local[shard == k] == np.arange((shard == k).sum())).all()
        # a sample right after a write into an empty buffer sees the write
        rb.empty()
        fresh = rb.extend(rows(7, start=500))
        sample = rb.sample(64)
        assert set(sample["index"].tolist()) <= set(fresh.tolist())
    finally:
        rb.close()


@pytest.mark.parametrize("num_shards", [1, 2])
def test_failed_write_is_reported_by_the_next_call(num_shards):
    rb = prioritized(num_shards, 400, chunk_rows=10)
    try:
        rb.extend(rows(40))
        # a batch the shards' storages refuse (4 columns where they hold 1): extend returns
        bad = rb.extend(rows(20, start=1000, width=4))
        assert bad.shape == (20,)
        with pytest.raises(ShardWriteError) as caught:
            rb.sample(8)
        err = caught.value
        assert sorted(err.index.tolist()) == sorted(bad.tolist())
        stride = 400 // num_shards
        assert {shard for shard, _, _ in err.failures} == set((bad // stride).tolist())
        assert err.shard == int(bad[0] // stride)
        message = str(err)
        assert "20 row(s) an earlier extend returned the indices of were not stored" in message
        for shard, index, reason in err.failures:  # each write (a chunk, or part of one)
            assert f"shard {shard}: global indices {describe_rows(index)}: RuntimeError" in message
        assert "Nothing was written" in message
        # reported once; the buffer goes on: the next write lands where the failed one would have
        assert len(rb) == 40
        again = rb.extend(rows(20, start=2000))
        assert sorted(again.tolist()) == sorted(bad.tolist())
        assert (rb[again]["obs"][:, 0] == torch.arange(2000, 2020, dtype=torch.float64)).all()
        assert len(rb) == 60
    finally:
        rb.close()


def test_write_to_a_restarted_shard_is_reported_with_its_rows(tmp_path):
    rb = prioritized(1, 400, chunk_rows=10, recovery_dir=tmp_path / "recovery")
    try:
        rb.extend(rows(30))  # reservations of 40 rows: the client still holds 10
        rb.sync()
        actor = rb.actors[0]
        incarnation = rb.shard_totals()["incarnation"][0]
        ray.kill(actor, no_restart=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until Ray has restarted the shard
            try:
                if ray.get(actor.totals.remote(), timeout=5)[-1] != incarnation:
                    break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                time.sleep(0.1)
        lost = rb.extend(rows(10, start=100))  # under a reservation of the old incarnation
        with pytest.raises(ShardRestartedError) as caught:
            rb.sync()
        err = caught.value
        assert err.shard == 0 and err.rows_lost == 30
        assert sorted(err.index.tolist()) == sorted(lost.tolist())
        assert f"global indices {describe_rows(lost.numpy())}" in str(err)
        assert str(err).startswith("shard 0 of 1 was restarted empty (it had no checkpoint): it lost 30 of the 30")
        assert str(err).endswith("rows of writes in flight not stored: shard 0: global indices "
                                 f"{describe_rows(lost.numpy())}: not stored by the restarted shard")
        # the next write reserves again from the restarted shard
        index = rb.extend(rows(10, start=200))
        assert (rb[index]["obs"][:, 0] == torch.arange(200, 210, dtype=torch.float64)).all()
        assert len(rb) == 10
    finally:
        rb.close()


@ray.remote(num_cpus=0)
class Writer:
    """A writer process writing through its own client (unpickled here)."""

    def __init__(self, rb, tag: int):
        self.rb = rb
        self.tag = tag

    def run(self, writes: int, size: int):
        out = []
        for step in range(writes):
            start = self.tag * 1_000_000 + step * size
            out.append(self.rb.extend(rows(size, start=start)).numpy())
        self.rb.sync()
        self.rb.close()
        return np.concatenate(out)


def test_indices_from_several_writer_processes_are_unique():
    rb = prioritized(2, 4000, chunk_rows=25)
    try:
        writers = [Writer.remote(rb, tag) for tag in range(3)]
        results = ray.get([w.run.remote(12, 30) for w in writers])  # 1,080 rows, no lap
        every = np.concatenate(results)
        assert len(every) == 3 * 12 * 30
        assert len(np.unique(every)) == len(every)
        for tag, index in enumerate(results):
            got = rb[torch.tensor(index)]["obs"][:, 0].numpy()
            assert (got == tag * 1_000_000 + np.arange(len(index))).all()
        # rows reserved and left unwritten are never drawn by the prioritized sampler
        written = set(every.tolist())
        for _ in range(5):
            assert set(rb.sample(512)["index"].tolist()) <= written
        assert rb.write_count == len(every)
        for w in writers:
            ray.kill(w)
    finally:
        rb.close()


@pytest.mark.parametrize("num_shards", [1, 2])
def test_sample_after_update_sees_it_without_prefetch(num_shards):
    rb = prioritized(num_shards, 200, chunk_rows=10)
    try:
        index = rb.extend(rows(100))
        rng = np.random.default_rng(0)
        for _ in range(20):
            chosen = int(rng.integers(100))
            priority = torch.zeros(100, dtype=torch.float64)
            priority[chosen] = 1.0
            rb.update_priority(index, priority)  # sent, not waited for
            sample = rb.sample(32)
            assert (sample["index"] == index[chosen]).all()
            assert (sample["obs"][:, 0] == chosen).all()
    finally:
        rb.close()


@pytest.mark.parametrize("num_shards", [1, 2])
def test_prefetched_samples_see_an_update_after_prefetch_batches(num_shards):
    """With ``prefetch=2`` the two batches already in flight were drawn before the update;
    the one after them reflects it inside each shard (the split over several shards may
    still be the earlier one: a shard's share of draws then goes to its rows of priority
    ``eps``)."""
    rb = prioritized(num_shards, 200, chunk_rows=10, prefetch=2, batch_size=32)
    try:
        index = rb.extend(rows(100))
        rb.update_priority(index, torch.ones(100, dtype=torch.float64))
        rb.sample()
        for step, chosen in enumerate((3, 71, 40)):
            priority = torch.zeros(100, dtype=torch.float64)
            priority[chosen] = 1.0
            rb.update_priority(index, priority)
            rb.sample()
            rb.sample()  # drawn before the update
            sample = rb.sample()
            same_shard = sample["index"] // (200 // num_shards) == index[chosen] // (200 // num_shards)
            if step == 0:  # split by equal sums: both shards get draws
                assert same_shard.any()
            assert (sample["index"][same_shard] == index[chosen]).all()
            if num_shards == 1:
                assert same_shard.all()
    finally:
        rb.close()


def test_chunks_held_while_a_shard_is_busy_go_as_one_write_and_keep_their_rows():
    rb = prioritized(2, 4000, chunk_rows=10)
    try:
        sizes = []
        submit = rb._submit_write

        def counted(shard, packed, index, *args):
            sizes.append(len(index))
            return submit(shard, packed, index, *args)

        rb._submit_write = counted
        batch = rows(10)
        written = []
        for step in range(60):
            batch["obs"].fill_(float(step))  # the caller reuses its tensors once extend returns
            written.append(rb.extend(batch))
        held = [sum(len(chunk.index) for chunk in chunks) for chunks in rb._held]
        before = len(sizes)
        rb.sync()
        # what was held goes as one write a shard
        assert sorted(sizes[before:]) == sorted(rows for rows in held if rows)
        # a Ray round trip outlasts a client's extend: chunks met busy shards and went together
        assert sum(sizes) == 600 and len(sizes) < 60 and max(sizes) > 10
        index = torch.cat(written)
        assert len(set(index.tolist())) == 600 and len(rb) == 600
        for step, rows_of_step in enumerate(written):
            assert (rb[rows_of_step]["obs"][:, 0] == float(step)).all()
        # a sample right after writes still held sees them
        rb.empty()
        for step in range(5):
            fresh = rb.extend(rows(10, start=100 * step))
        assert set(rb.sample(64)["index"].tolist()) <= set(range(8000))
        assert len(rb) == 50
    finally:
        rb.close()


def test_transforms_run_on_the_client_as_in_one_buffer():
    from torchrl_compat import LazyTensorStorage, PrioritizedSampler, TensorDictReplayBuffer
    from torchrl_compat._buffer_transforms import Transform

    class Shift(Transform):
        """Written rows get obs + 1000; read rows get obs * 2."""

        def _call(self, td):
            td.set("obs", td.get("obs") * 2)
            return td

        forward = _call

        def _inv_call(self, td):
            td.set("obs", td.get("obs") + 1000)
            return td

    local = TensorDictReplayBuffer(
        storage=LazyTensorStorage(400),
        sampler=PrioritizedSampler(400, alpha=1.0, beta=0.6, dtype=torch.float64),
        transform=Shift(),
    )
    rb = prioritized(2, 400, chunk_rows=16, transform_factory=Shift)
    try:
        batch = rows(50)
        index = rb.extend(batch)
        local.extend(rows(50))
        assert (batch["obs"][:, 0] == torch.arange(50, dtype=torch.float64)).all()  # caller's data kept
        # stored through the inverse, read through the transform: what one buffer gives
        expected = local[torch.arange(50)]["obs"]
        assert (rb[index]["obs"] == expected).all()
        assert (expected[:, 0] == (torch.arange(50, dtype=torch.float64) + 1000) * 2).all()
        assert (rb[int(index[3])]["obs"] == expected[3]).all()
        sample = rb.sample(64)
        rows_of = {int(g): k for k, g in enumerate(index)}
        positions = torch.tensor([rows_of[int(g)] for g in sample["index"]])
        assert (sample["obs"] == expected[positions]).all()
        assert "priority_weight" in sample.keys()
        rb[index[:2]] = rows(2, start=7)
        assert (rb[index[:2]]["obs"][:, 0] == torch.tensor([1007.0, 1008.0]) * 2).all()
        with pytest.raises(TypeError, match="mutually exclusive"):
            prioritized(1, 40, transform=Shift(), transform_factory=Shift)
    finally:
        rb.close()
