"""The sharded Ray buffer's writes: one buffer's rows, row for row, at every size; indices from
reserved ranges, distinct across writer processes, through laps and checkpoints; a failed
write reported by the next call, naming the shard and rows; a sample after an update (or a
write) seeing it.

The property tests run a random program of writes (1 row to more than the capacity),
samples and priority updates against the sharded buffer and against one local
``TensorDictReplayBuffer`` of the same capacity (the model), on shards whose capacities are
below the default ``chunk_rows`` and at unaligned ``chunk_rows``: the same rows present, every
returned index reading back its row, the same priorities, and importance weights equal to the
model's (to 1e-6: torchrl's sampler adds ``eps`` to the largest priority at each write, and the
shards each count their own writes).
"""
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

ray = pytest.importorskip("ray")

import ray_support  # noqa: E402
from ray_support import pooled, prioritized, ring_index, rows  # noqa: E402

from torchrl_compat import LazyTensorStorage, PrioritizedSampler, TensorDictReplayBuffer  # noqa: E402
from torchrl_compat._ray.writes import describe_rows  # noqa: E402
from torchrl_compat.ray_buffer import ShardRestartedError, ShardWriteError  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")

# The pooled prioritized buffers (fp64 trees, alpha 1, beta 0.6), by shards and capacity: all
# below the default chunk_rows (4096), the last with shards of 8, 8 and 7 rows.
POOL = {"p1": (1, 400), "p2": (2, 400), "p3s": (3, 23)}


def pool(name, **client):
    num_shards, capacity = POOL[name]
    return pooled(name, lambda: prioritized(num_shards, capacity), **client)


class Model:
    """One prioritized ``TensorDictReplayBuffer`` of the sharded buffer's capacity: its row at
    index ``p`` is the sharded buffer's at ``phi[p]`` (the write ring's ``p``-th row)."""

    def __init__(self, rb, chunk_rows):
        capacity = sum(rb._capacities)
        self.buffer = TensorDictReplayBuffer(
            storage=LazyTensorStorage(capacity),
            sampler=PrioritizedSampler(capacity, alpha=1.0, beta=0.6, dtype=torch.float64))
        self.phi = ring_index(rb, chunk_rows)
        self.position = {int(g): p for p, g in enumerate(self.phi)}

    def __len__(self):
        return len(self.buffer)

    def weights(self, global_index) -> np.ndarray:
        """``(p_i / p_min) ** -beta`` of the model's rows at the sharded ``global_index``."""
        sampler = self.buffer._sampler
        leaves = np.array([float(sampler._sum_tree[self.position[int(g)]]) for g in global_index])
        smallest = float(sampler._min_tree.query(0, len(self.buffer)))
        return (leaves / smallest) ** -0.6


def check_rows(rb, model):
    """The sharded buffer holds the model's rows, each at its ring index, and as many."""
    assert len(rb) == len(model)
    if not len(model):
        return
    held = model.phi[: len(model)]
    assert (rb[held]["id"] == model.buffer[torch.arange(len(model))]["id"]).all()
    totals = rb.shard_totals()
    assert totals["sum"].sum() == pytest.approx(float(model.buffer._sampler._sum_tree.query(0, len(model))), rel=1e-6)


program_st = st.lists(
    st.one_of(st.tuples(st.just("extend"), st.floats(0, 1.2)),
              st.tuples(st.just("sample"), st.integers(1, 24)),
              st.tuples(st.just("update"), st.integers(0, 2**31))),
    min_size=3, max_size=10)


def run_program(rb, model, program):
    written = 0
    rng = np.random.default_rng(len(program))
    capacity = len(model.phi)
    for op, value in program:
        if op == "extend":
            size = max(1, int(value * (capacity + 3)))  # 1 row to more than the capacity
            index = rb.extend(rows(size, written))
            expected = model.buffer.extend(rows(size, written))
            written += size
            assert (index.numpy() == model.phi[expected.numpy()]).all()
            if size <= capacity:
                assert len(np.unique(index.numpy())) == size
        elif not len(model):
            continue
        elif op == "update":
            chosen = np.random.default_rng(value).choice(len(model), size=min(len(model), 5), replace=False)
            priority = torch.from_numpy(rng.uniform(0.01, 5.0, len(chosen)))
            model.buffer.update_priority(torch.from_numpy(chosen), priority)
            rb.update_priority(torch.from_numpy(model.phi[chosen]), priority)
        else:
            sample = rb.sample(value)
            got = sample["index"].numpy()
            positions = np.array([model.position[int(g)] for g in got])
            assert (positions < len(model)).all()  # rows that hold data
            assert (sample["id"] == model.buffer[torch.from_numpy(positions)]["id"]).all()
            np.testing.assert_allclose(sample["priority_weight"].numpy(), model.weights(got), rtol=1e-6)
    rb.sync()
    check_rows(rb, model)


@pytest.mark.parametrize("name", ["p3s", "p2", "p1"])
@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(chunk_rows=st.sampled_from([4096, 1, 2, 3, 5, 7]), program=program_st)
def test_writes_samples_and_updates_match_one_buffer(name, chunk_rows, program):
    """Random programs on shards smaller than ``chunk_rows`` (the default) and at unaligned
    ``chunk_rows``, through the task path."""
    rb = pool(name, chunk_rows=chunk_rows)
    try:
        run_program(rb, Model(rb, chunk_rows), program)
    finally:
        rb.close()


@settings(max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(program=program_st)
def test_writes_samples_and_updates_match_one_buffer_through_the_compiled_graph(program):
    """The same programs from the buffer's own client: samples and updates through its
    compiled learner graph, at the defaults."""
    rb = pooled("p3s", lambda: prioritized(*POOL["p3s"]), owner=True)
    run_program(rb, Model(rb, rb._chunk_rows), program + [("extend", 0.5), ("sample", 3)])
    assert rb._graph is not None and not rb._graph_broken


def test_extend_returns_indices_before_the_shards_answer():
    rb = pool("p2")
    try:
        index = rb.extend(rows(150))
        # the write is in flight (or done): the indices are the rows' own all the same
        assert len(set(index.tolist())) == 150
        assert (rb[index]["obs"][:, 0] == torch.arange(150, dtype=torch.float64)).all()
        assert len(rb) == 150 and rb.write_count == 150
        # the first shard's 200 rows fill first (a shard smaller than chunk_rows), in order
        assert (index.numpy() == np.arange(150)).all()
        more = rb.extend(rows(100, start=150))
        assert (more.numpy() == np.concatenate([np.arange(150, 200), np.arange(200, 250)])).all()
        # a sample right after a write into an empty buffer sees the write
        rb.empty()
        fresh = rb.extend(rows(7, start=500))
        sample = rb.sample(64)
        assert set(sample["index"].tolist()) <= set(fresh.tolist())
    finally:
        rb.close()


@pytest.mark.parametrize("name", ["p1", "p2"])
def test_failed_write_is_reported_by_the_next_call(name):
    rb = pool(name, chunk_rows=10)
    num_shards = rb.num_shards
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
        assert err.shard == 0 and err.rows_lost == 30 and err.shards == (0,) and err.lost == {0: 30}
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
    """A writer process: writes through a client of its own (the buffer it is handed,
    unpickled here), then lets go of it."""

    def run(self, rb, sizes, start):
        out = []
        for size in sizes:
            out.append(rb.extend(rows(size, start)).numpy())
            start += size
        rb.sync()
        rb.close()
        return out


@pytest.fixture(scope="module")
def writers():
    ray_support.cluster()  # module fixtures come before the function-scoped cluster fixture
    return [Writer.remote() for _ in range(2)]


def run_writers(writers, rb, sizes):
    """Each writer writes batches of ``sizes[w]`` rows (ids ``w * 10**6`` on), concurrently;
    their indices, write by write, and ids."""
    results = ray.get([w.run.remote(rb, s, k * 10**6) for k, (w, s) in enumerate(zip(writers, sizes))])
    written = {}
    for k, (writes, s) in enumerate(zip(results, sizes)):
        start = k * 10**6
        for index, size in zip(writes, s):
            for offset, g in enumerate(index.tolist()):
                written[start + offset] = g
            start += size
    return results, written


def test_several_writer_processes_fill_every_row_before_any_lap(writers):
    rb = pool("p2")
    try:
        sizes = [[37, 5, 60, 18], [11, 70, 3, 29, 40]]  # 273 rows, no lap: every row kept
        results, written = run_writers(writers, rb, sizes)
        every = np.concatenate([np.concatenate(w) for w in results])
        assert len(np.unique(every)) == len(every) == 273
        assert len(rb) == 273 and rb.write_count == 273
        assert rb[torch.tensor(list(written.values()))]["id"].tolist() == list(written)  # each its row
        # rows reserved and left unwritten are never drawn: every draw holds a written row
        for _ in range(3):
            sample = rb.sample(512)
            assert all(written[int(i)] == int(g) for i, g in zip(sample["id"], sample["index"]))
    finally:
        rb.close()


@pytest.mark.parametrize("name", ["p3s", "p2"])
def test_laps_with_several_writers_keep_every_row_named_by_its_index(writers, name):
    rb = pool(name)
    capacity = sum(rb._capacities)
    try:
        rng = np.random.default_rng(capacity)
        sizes = [rng.integers(1, capacity // 2 + 2, 14).tolist(), rng.integers(1, capacity // 3 + 2, 20).tolist()]
        results, written = run_writers(writers, rb, sizes)
        for writes, s in zip(results, sizes):
            for index, size in zip(writes, s):
                assert len(np.unique(index)) == size  # distinct within a write
        assert sum(map(sum, sizes)) > 2 * capacity
        assert len(rb) == capacity
        everything = np.concatenate([np.arange(k * rb._stride, k * rb._stride + c) for k, c in enumerate(rb._capacities)])
        held = rb[torch.from_numpy(everything)]["id"].tolist()
        # every row holds a row written there (its index names it), each row once
        assert all(written[i] == g for i, g in zip(held, everything.tolist()))
        assert len(set(held)) == capacity
    finally:
        rb.close()


def test_a_wrapped_buffers_checkpoint_continues_as_one_buffer(tmp_path):
    rb = pool("p3s", chunk_rows=3)
    model = Model(rb, 3)
    try:
        written = 0
        for size in (9, 17, 4, 11):  # 41 rows: past a lap of 23
            assert (rb.extend(rows(size, written)).numpy() == model.phi[model.buffer.extend(rows(size, written)).numpy()]).all()
            written += size
        rb.update_priority(torch.from_numpy(model.phi[:5]), torch.arange(1.0, 6.0, dtype=torch.float64))
        model.buffer.update_priority(torch.arange(5), torch.arange(1.0, 6.0, dtype=torch.float64))
        rb.dumps(tmp_path / "rb")
        model.buffer.dumps(tmp_path / "model")
        for size in (6, 13):
            rb.extend(rows(size, 1000))
            model.buffer.extend(rows(size, 1000))
        rb.loads(tmp_path / "rb")
        model.buffer.loads(tmp_path / "model")
        check_rows(rb, model)
        for size in (5, 8, 30):  # the ring goes on where the checkpoint left it
            assert (rb.extend(rows(size, written)).numpy() == model.phi[model.buffer.extend(rows(size, written)).numpy()]).all()
            written += size
        check_rows(rb, model)
        state = rb.state_dict()
        rb.extend(rows(7, 5000))
        rb.load_state_dict(state)
        assert (rb.extend(rows(4, written)).numpy() == model.phi[model.buffer.extend(rows(4, written)).numpy()]).all()
        check_rows(rb, model)
    finally:
        rb.close()


def test_a_client_whose_shards_another_emptied_reserves_again():
    """A client holding ranges of a lap when another client empties the shards: its totals
    show room again while what it holds overwrites; its write is refused and named (never a
    write that waits for room it cannot reach), and the next one reserves afresh."""
    rb = pool("p2", chunk_rows=50)
    other = rb.client()
    try:
        rb.extend(rows(450))  # a lap: the client holds ranges past the first one
        rb.sync()
        other.empty()
        assert len(rb) == 0  # the shards' totals: room everywhere
        lapsed = rb.extend(rows(30, start=1000)).numpy()
        with pytest.raises(ShardWriteError, match="emptied or loaded after the rows were reserved") as caught:
            rb.sync()
        named = caught.value.index.numpy()
        assert len(named) and set(named) <= set(lapsed)
        kept = ~np.isin(lapsed, named)  # the rows of new reservations, taken once the old ran out
        assert (rb[torch.from_numpy(lapsed[kept])]["id"].numpy() == 1000 + np.flatnonzero(kept)).all()
        index = rb.extend(rows(30, start=2000))
        assert (rb[index]["id"] == torch.arange(2000, 2030)).all() and len(rb) == 30 + kept.sum()
    finally:
        other.close()
        rb.close()


@pytest.mark.parametrize("name", ["p1", "p2"])
def test_sample_after_update_sees_it_without_prefetch(name):
    rb = pool(name)
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


def test_new_rows_get_the_largest_priority_of_an_update_in_flight():
    rb = pool("p2")
    try:
        index = rb.extend(rows(10))
        rb.update_priority(index, torch.full((10,), 0.5, dtype=torch.float64))
        rb.update_priority(index[:1], torch.tensor([40.0], dtype=torch.float64))  # not waited for
        fresh = rb.extend(rows(1, start=10))  # gets 40, as in one buffer
        rb.update_priority(index[:1], torch.tensor([0.5], dtype=torch.float64))
        info = rb.sample(20_000, return_info=True)[1]
        share = float((info["index"] == fresh[0]).double().mean())
        assert share == pytest.approx(40 / (40 + 10 * 0.5), abs=0.02)
    finally:
        rb.close()


@pytest.mark.parametrize("name", ["p1", "p2"])
def test_prefetched_samples_see_an_update_after_prefetch_batches(name):
    """With ``prefetch=2`` the two batches already in flight were drawn before the update;
    the one after them reflects it inside each shard (the split over several shards may
    still be the earlier one: a shard's share of draws then goes to its rows of priority
    ``eps``)."""
    rb = pool(name, prefetch=2, batch_size=32, chunk_rows=10)
    num_shards = rb.num_shards
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
            same_shard = sample["index"] // (400 // num_shards) == index[chosen] // (400 // num_shards)
            if step == 0:  # split by equal sums: both shards get draws
                assert same_shard.any()
            assert (sample["index"][same_shard] == index[chosen]).all()
            if num_shards == 1:
                assert same_shard.all()
    finally:
        rb.close()


def test_chunks_held_while_a_shard_is_busy_go_as_one_write_and_keep_their_rows():
    rb = pool("p2", chunk_rows=10)
    try:
        sizes = []
        submit = rb._submit_write

        def counted(shard, packed, index, *args):
            sizes.append(len(index))
            return submit(shard, packed, index, *args)

        rb._submit_write = counted
        batch = rows(10)
        written = []
        for step in range(35):
            batch["obs"].fill_(float(step))  # the caller reuses its tensors once extend returns
            written.append(rb.extend(batch))
        held = [sum(len(chunk.index) for chunk in chunks) for chunks in rb._held]
        before = len(sizes)
        rb.sync()
        # what was held goes as one write a shard
        assert sorted(sizes[before:]) == sorted(rows for rows in held if rows)
        # a Ray round trip outlasts a client's extend: chunks met busy shards and went together
        assert sum(sizes) == 350 and len(sizes) < 35 and max(sizes) > 10
        index = torch.cat(written)
        assert len(set(index.tolist())) == 350 and len(rb) == 350
        for step, rows_of_step in enumerate(written):
            assert (rb[rows_of_step]["obs"][:, 0] == float(step)).all()
        # a sample right after writes still held sees them
        rb.empty()
        fresh = torch.cat([rb.extend(rows(10, start=100 * step)) for step in range(5)])
        assert set(rb.sample(64)["index"].tolist()) <= set(fresh.tolist())
        assert len(rb) == 50
    finally:
        rb.close()


def test_transforms_run_on_the_client_as_in_one_buffer():
    from torchrl_compat.replay_buffers._transforms import Transform

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
    rb = prioritized(1, 400, transform_factory=Shift)
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
