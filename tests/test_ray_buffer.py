"""The sharded Ray buffer's reads: exact prioritized draws at the defaults (overall and shard
by shard, through the compiled learner graph and the task path), global indices, uniform /
without-replacement / slice sampling (slices drawn as torchrl's one buffer draws them),
checkpoints with a manifest, shard restarts.
"""
import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from tensordict import TensorDict

ray = pytest.importorskip("ray")

from ray_support import chi_square_p, pooled, prioritized, ROOT, rows  # noqa: E402

from torchrl_compat import (  # noqa: E402
    LazyTensorStorage,
    PrioritizedSampler,
    RandomSampler,
    RayReplayBuffer,
    SamplerWithoutReplacement,
    SliceSampler,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)
from torchrl_compat.ray_buffer import ShardRestartedError  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")


def issue_buffer():
    """The buffer of the first example a new user tries, at every default: 4 shards of 2,048
    rows, smaller than the default ``chunk_rows`` (4,096), fp32 trees."""
    from torchrl_compat import LazyTensorStorage as Storage, PrioritizedSampler as Sampler

    return RayReplayBuffer(
        replay_buffer_cls=TensorDictReplayBuffer,
        storage=functools.partial(Storage, 8192),
        sampler=functools.partial(Sampler, 8192, alpha=1.0, beta=0.7),
        priority_key="td_error", batch_size=4096, num_shards=4)


def draw_counts(rb, position, draws, batch_size=None):
    """How often each row (``position[global index]``, its ``id``) is drawn in ``draws``
    draws; each drawn row is checked to be the one its index names."""
    counts = np.zeros(int(position.max()) + 1, dtype=np.int64)
    done = 0
    while done < draws:
        sample = rb.sample(batch_size)
        got = position[sample["index"].numpy()]
        assert (sample["id"].numpy() == got).all()
        counts += np.bincount(got, minlength=len(counts))
        done += len(got)
    return counts, done


def test_a_write_larger_than_a_shard_keeps_every_row_and_draws_are_exact():
    """The defaults, through the buffer's own client (its compiled learner graph)."""
    rb = pooled("issue", issue_buffer, owner=True)
    index = rb.extend(TensorDict({"id": torch.arange(4096), "obs": torch.zeros(4096, 4)}, [4096]))
    assert len(rb) == 4096 and rb.write_count == 4096
    assert len(np.unique(index.numpy())) == 4096
    assert (rb[index]["id"] == torch.arange(4096)).all()
    # a shard of 2,048 rows takes 2,048: the ring fills shards 0 and 1, none overfilled
    assert rb.shard_totals()["count"].tolist() == [2048, 2048, 0, 0]
    p = torch.from_numpy(np.random.default_rng(0).uniform(0.01, 1.0, 4096))
    rb.update_priority(index, p)
    position = np.full(4 * rb._stride, -1)
    position[index.numpy()] = np.arange(4096)
    torch.manual_seed(1)
    counts, draws = draw_counts(rb, position, 500_000, batch_size=1 << 15)
    expected = (p / p.sum()).numpy() * draws
    assert chi_square_p(counts, expected) > 1e-3
    for shard in (0, 1):  # and each shard's draws among its rows
        mine = index.numpy() // rb._stride == shard
        assert chi_square_p(counts[mine], expected[mine] / expected[mine].sum() * counts[mine].sum()) > 1e-3
    assert rb._graph is not None


def test_draws_are_exact_shard_by_shard_on_the_task_path():
    """Four shards of equal priority mass, each skewed 100x inside: the share of each shard
    and the draws inside each are checked apart, every cell expecting at least 5 draws."""
    rb = pooled("issue", issue_buffer, batch_size=1 << 17)
    try:
        index = rb.extend(TensorDict({"id": torch.arange(8192), "obs": torch.zeros(8192, 4)}, [8192])).numpy()
        shard = index // rb._stride
        assert np.bincount(shard).tolist() == [2048] * 4
        rng = np.random.default_rng(1)
        p = 10 ** rng.uniform(-2, 0, 8192)
        for k in range(4):
            p[shard == k] /= p[shard == k].sum()
        rb.update_priority(torch.from_numpy(index), torch.from_numpy(p))
        position = np.full(4 * rb._stride, -1)
        position[index] = np.arange(8192)
        torch.manual_seed(2)
        counts, draws = draw_counts(rb, position, 1_000_000)
        expected = p / p.sum() * draws
        assert expected.min() > 5
        per_shard = np.bincount(shard, weights=counts)
        assert chi_square_p(per_shard, np.full(4, draws / 4)) > 1e-3
        for k in range(4):
            mine = shard == k
            assert chi_square_p(counts[mine], expected[mine] / expected[mine].sum() * counts[mine].sum()) > 1e-3
        assert chi_square_p(counts, expected) > 1e-3
    finally:
        rb.close()


def test_one_shard_per_batch_is_not_exact():
    """Ape-X style sampling (each batch from one shard chosen uniformly) fails the same test
    on priorities whose shards' masses differ."""
    rng = np.random.default_rng(0)
    priorities = [10 ** rng.uniform(-1, 0, 60) * 3 ** k for k in range(4)]
    flat = np.concatenate(priorities)
    counts = np.zeros(240, dtype=np.int64)
    draws = 0
    while draws < 400_000:
        k = rng.integers(4)
        chosen = rng.choice(60, size=256, p=priorities[k] / priorities[k].sum())
        counts += np.bincount(chosen + 60 * k, minlength=240)
        draws += 256
    assert chi_square_p(counts, flat / flat.sum() * draws) < 1e-6


def p2(**client):
    return pooled("p2", lambda: prioritized(2, 400), **client)


def test_weights_equal_one_samplers():
    rb = p2()
    try:
        index = rb.extend(rows(240))  # 200 rows on shard 0, 40 on shard 1
        assert sorted(set((index // 200).tolist())) == [0, 1]
        priorities = 10 ** np.random.default_rng(3).uniform(-6, 0, 240)
        rb.update_priority(index, torch.from_numpy(priorities))
        single = PrioritizedSampler(240, alpha=1.0, beta=0.6, dtype=torch.float64)
        single.update_priority(torch.arange(240), torch.from_numpy(priorities))
        storage = LazyTensorStorage(240)
        storage.set(torch.arange(240), torch.zeros(240))
        torch.manual_seed(2)
        ref_index, ref_info = single.sample(storage, 200_000)
        reference = dict(zip(ref_index.tolist(), ref_info["priority_weight"].tolist()))
        position = {int(g): i for i, g in enumerate(index)}
        sample, info = rb.sample(20_000, return_info=True)
        compared = 0
        for g, w in zip(info["index"].tolist(), info["priority_weight"].tolist()):
            i = position[g]
            if i in reference:
                assert w == pytest.approx(reference[i], rel=1e-12)
                compared += 1
        assert compared > 10_000
        assert sample["priority_weight"].dtype == torch.float64
        assert (sample["priority_weight"] == info["priority_weight"]).all()
    finally:
        rb.close()


def test_index_errors_name_the_index():
    rb = p2()
    try:
        rb.extend(rows(240))
        with pytest.raises(IndexError, match="global index 400 at position 1"):
            rb.update_priority(torch.tensor([0, 400]), torch.tensor([1.0, 1.0]))
        with pytest.raises(IndexError, match="global index -3 at position 0"):
            rb[torch.tensor([-3])]
        with pytest.raises(ValueError, match="priority nan at position 1"):
            rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, float("nan")]))
        with pytest.raises(ValueError, match="chunk_rows=0"):
            rb.client(chunk_rows=0)
        # nothing changed: the rows still read back
        assert rb[torch.tensor([5])]["obs"].shape == (1, 1)
    finally:
        rb.close()


def test_uniform_draws_cover_shards_and_capacity_is_global():
    rb = pooled("uniform", lambda: RayReplayBuffer(
        replay_buffer_cls=TensorDictReplayBuffer, num_shards=3,
        storage=functools.partial(LazyTensorStorage, 300), sampler=RandomSampler))
    try:
        index = rb.extend(rows(150)).numpy()
        rb.sync()  # the writes' replies: shard_totals() makes no call
        assert rb.shard_totals()["count"].tolist() == [100, 50, 0]  # shard by shard, none overfilled
        got = rb[index]
        assert (got["obs"][:, 0] == torch.arange(150, dtype=torch.float64)).all()
        assert (got["index"].numpy() == index).all()
        assert int(rb[int(index[7])]["obs"]) == 7
        position = {int(g): i for i, g in enumerate(index)}
        hits = np.zeros(150)
        for _ in range(4):
            sample = rb.sample(50_000)
            got = np.array([position[g] for g in sample["index"].tolist()])
            assert (sample["obs"][:, 0].numpy() == got).all()
            hits += np.bincount(got, minlength=150)
        assert chi_square_p(hits, np.full(150, hits.sum() / 150)) > 1e-3
        # the capacity is global: 300 rows in all, past it the oldest rows go
        later = rb.extend(rows(200, start=1000)).numpy()
        assert len(rb) == 300 and rb.write_count == 350
        assert rb.shard_totals()["count"].tolist() == [100, 100, 100]
        kept = np.concatenate([index[50:], later])  # the 50 oldest were overwritten
        assert (rb[kept]["id"].numpy() == np.concatenate([np.arange(50, 150), np.arange(1000, 1200)])).all()
    finally:
        rb.close()


def test_without_replacement_epoch_spans_every_shard():
    rb = pooled("without_replacement", lambda: RayReplayBuffer(
        replay_buffer_cls=TensorDictReplayBuffer, num_shards=2,
        storage=functools.partial(LazyTensorStorage, 90), sampler=SamplerWithoutReplacement))
    try:
        index = rb.extend(rows(60))
        assert sorted(set((index // 45).tolist())) == [0, 1]
        assert len(rb) == 60
        seen = torch.cat([rb.sample(12)["index"] for _ in range(5)])
        assert sorted(seen.tolist()) == sorted(index.tolist())  # one epoch: each row once
    finally:
        rb.close()


def episodes(lengths, open_last=False):
    """Trajectories of the given lengths back to back: ``tid`` (the trajectory), ``t`` (its
    step) and ``("next", "done")`` at each trajectory's last step (not the last one's when
    ``open_last``)."""
    tid = np.repeat(np.arange(len(lengths)), lengths)
    t = np.concatenate([np.arange(n) for n in lengths])
    done = np.zeros(len(tid), dtype=bool)
    done[np.cumsum(lengths) - 1] = True
    if open_last:
        done[-1] = False
    n = len(tid)
    return TensorDict({"tid": torch.from_numpy(tid), "t": torch.from_numpy(t),
                       "next": {"done": torch.from_numpy(done).unsqueeze(-1)}}, [n])


def slice_counts(sample_fn, cells, slice_len, draws):
    """Counts of the ``(trajectory, first step)`` of ``draws`` slices; each slice checked to
    be consecutive steps of one trajectory."""
    counts = np.zeros(len(cells), dtype=np.int64)
    done = 0
    while done < draws:
        batch = sample_fn().reshape(-1, slice_len)
        tid, t = batch["tid"], batch["t"]
        assert (tid == tid[:, :1]).all() and (t.diff(dim=1) == 1).all()
        for a, b in zip(tid[:, 0].tolist(), t[:, 0].tolist()):
            counts[cells[(a, b)]] += 1
        done += len(tid)
    return counts


@pytest.mark.parametrize("chunk_rows", [4096, 7])
def test_slices_over_unaligned_writes_are_drawn_as_one_buffer_draws_them(chunk_rows):
    """Trajectories of 1 to 25 steps (``end_key``), written in batches that cut them anywhere,
    at the default ``chunk_rows`` and at one cutting them too: each trajectory whole on one
    shard, and slices drawn as torchrl's ``SliceSampler`` on one buffer draws them (each
    trajectory of at least ``slice_len`` steps uniformly, then a start uniformly)."""
    import torchrl.data as trl

    rb = pooled("slices", lambda: RayReplayBuffer(
        replay_buffer_cls=TensorDictReplayBuffer, num_shards=2,
        storage=functools.partial(LazyTensorStorage, 400),
        sampler=functools.partial(SliceSampler, slice_len=4, end_key=("next", "done"))), chunk_rows=chunk_rows)
    reference = trl.TensorDictReplayBuffer(storage=trl.LazyTensorStorage(400),
                                           sampler=trl.SliceSampler(slice_len=4, end_key=("next", "done")))
    try:
        lengths = np.random.default_rng(chunk_rows).integers(1, 26, 24)
        data = episodes(lengths, open_last=True)
        for cut in np.split(np.arange(len(data)), [37, 90, 119, 180, 224]):
            if len(cut):
                rb.extend(data[torch.from_numpy(cut)])
                reference.extend(data[torch.from_numpy(cut)])
        assert len(rb) == len(data)
        # no trajectory cut between shards
        stored = torch.cat([rb[torch.arange(k * 200, k * 200 + int(c))]["tid"]
                            for k, c in enumerate(rb.shard_totals()["count"]) if c])
        shard_of = {}
        for k, c in enumerate(rb.shard_totals()["count"]):
            for tid in rb[torch.arange(k * 200, k * 200 + int(c))]["tid"].unique().tolist() if c else []:
                assert shard_of.setdefault(tid, k) == k
        assert sorted(stored.tolist()) == sorted(data["tid"].tolist())
        cells = {(i, s): len_ for len_, (i, s) in enumerate(
            (i, s) for i, n in enumerate(lengths) if n >= 4 for s in range(n - 3))}
        eligible = int((lengths >= 4).sum())
        expected = np.array([1 / eligible / (lengths[i] - 3) for i, _ in cells])
        ours = slice_counts(lambda: rb.sample(256), cells, 4, 12_800)
        theirs = slice_counts(lambda: reference.sample(256), cells, 4, 12_800)
        assert chi_square_p(theirs, expected * theirs.sum()) > 1e-3  # torchrl's rule, as written
        assert chi_square_p(ours, expected * ours.sum()) > 1e-3
        # and a test of homogeneity between the two samples
        table = np.stack([ours, theirs])
        expect = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
        stat = float(((table - expect) ** 2 / np.where(expect > 0, expect, 1)).sum())
        dof = len(cells) - 1
        assert float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                             torch.tensor(stat / 2, dtype=torch.float64))) > 1e-3
    finally:
        rb.close()


def test_dumps_loads_round_trip_with_manifest(tmp_path):
    rb = p2(batch_size=32, chunk_rows=10)
    try:
        index = rb.extend(rows(50))
        rb.update_priority(index, torch.linspace(0.1, 5.0, 50, dtype=torch.float64))
        rb.dumps(tmp_path / "ckpt")
        manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
        assert sum(s["rows"] for s in manifest["shards"]) == 50
        assert {s["version"] for s in manifest["shards"]} == {manifest["version"]}
        for entry in manifest["shards"]:
            assert (tmp_path / "ckpt" / entry["directory"] / "shard.json").exists()
        torch.manual_seed(5)
        before = rb.sample(64, return_info=True)
        rows_before = rb[index]
        state = rb.state_dict()
        # change everything, then load the checkpoint back
        rb.extend(rows(30, start=500))
        rb.update_priority(index, torch.full((50,), 9.0, dtype=torch.float64))
        rb.loads(tmp_path / "ckpt")
        assert len(rb) == 50
        assert (rb[index]["obs"] == rows_before["obs"]).all()
        torch.manual_seed(5)
        after = rb.sample(64, return_info=True)
        assert torch.equal(before[1]["index"], after[1]["index"])
        assert torch.equal(before[1]["priority_weight"], after[1]["priority_weight"])
        # a second dump replaces the first: one version per shard left, the manifest's
        rb.extend(rows(5, start=700))
        rb.dumps(tmp_path / "ckpt")
        manifest2 = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
        assert manifest2["version"] != manifest["version"]
        for entry in manifest2["shards"]:
            versions = [p.name for p in (tmp_path / "ckpt" / f"shard_{entry['shard']:03d}").iterdir()]
            assert versions == [entry["version"]]
        # state_dict round trip
        rb.load_state_dict(state)
        assert len(rb) == 50
        torch.manual_seed(5)
        assert torch.equal(rb.sample(64, return_info=True)[1]["index"], before[1]["index"])
    finally:
        rb.close()


def test_loads_refuses_a_manifest_naming_a_missing_part(tmp_path):
    rb = p2(chunk_rows=10)
    try:
        rb.extend(rows(20))
        rb.dumps(tmp_path / "ckpt")
        manifest_file = tmp_path / "ckpt" / "manifest.json"
        manifest = json.loads(manifest_file.read_text())
        manifest["shards"][1]["version"] = "00000000000000000000-deadbeef"
        manifest_file.write_text(json.dumps(manifest))
        rb.extend(rows(4, start=100))
        with pytest.raises(FileNotFoundError, match="shard 1: checkpoint version 00000000000000000000-deadbeef"):
            rb.loads(tmp_path / "ckpt")
        assert len(rb) == 24  # no shard loaded anything
    finally:
        rb.close()


def test_checkpoint_in_a_mixed_run_gives_the_same_samples(tmp_path):
    rb = p2(batch_size=32)
    try:
        torch.manual_seed(0)
        for step in range(6):
            rb.extend(rows(40, start=40 * step))
            sample = rb.sample()
            rb.update_priority(sample["index"], torch.rand(32, dtype=torch.float64) * 10)
        rb.dumps(tmp_path / "mid")

        def run():
            torch.manual_seed(7)
            out = []
            for step in range(4):
                rb.extend(rows(10, start=1000 + 10 * step))
                sample = rb.sample()
                rb.update_priority(sample["index"], torch.rand(32, dtype=torch.float64))
                out.append((sample["index"].clone(), sample["priority_weight"].clone()))
            return out

        first = run()
        rb.loads(tmp_path / "mid")
        second = run()
        for (i1, w1), (i2, w2) in zip(first, second):
            assert torch.equal(i1, i2)
            # the largest priority (new rows') comes back from a checkpoint rounded to float32
            # (PrioritizedSampler.loads copies it through torch.as_tensor)
            torch.testing.assert_close(w1, w2, rtol=1e-6, atol=0)
    finally:
        rb.close()


def test_killed_shard_restarts_from_its_checkpoint(tmp_path):
    """Without a journal: the rows written after the checkpoint are lost, and counted (with
    one, nothing is: the multi-node module removes a journalled shard's node)."""
    write_ahead = False
    rb = prioritized(2, 200, chunk_rows=10, write_ahead=write_ahead,
                     recovery_dir=tmp_path / "recovery", sample_timeout=60)
    try:
        before = rb.extend(rows(60))
        rb.dumps(tmp_path / "ckpt")
        after = rb.extend(rows(60, start=1000))
        sample = rb.sample(16)
        rb.update_priority(sample["index"], torch.full((16,), 3.0, dtype=torch.float64))
        victim = 1
        written_after = int((after.numpy() // 100 == victim).sum())
        assert written_after > 0
        ray.kill(rb.actors[victim], no_restart=False)
        with pytest.raises(ShardRestartedError, match=f"shard {victim} of 2") as caught:
            for _ in range(100):
                rb.sample(16)
        expected_lost = 0 if write_ahead else written_after
        assert caught.value.shard == victim
        assert caught.value.rows_lost == expected_lost
        assert f"it lost {expected_lost} of the" in str(caught.value)
        # what the shard kept: everything written before the checkpoint, and (with the
        # journal) after it
        kept = rb[before]
        assert (kept["obs"][:, 0] == torch.arange(60, dtype=torch.float64)).all()
        if write_ahead:
            assert (rb[after]["obs"][:, 0] == torch.arange(1000, 1060, dtype=torch.float64)).all()
        else:
            survivors = after[after // 100 != victim]
            assert len(rb[survivors]) == 60 - written_after
            assert len(rb) == 120 - written_after
        # the other shards kept serving, and the restored shard serves again
        assert rb.sample(64)["obs"].shape == (64, 1)
    finally:
        rb.close()


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where it is missing
    with pytest.raises(ImportError, match=r'pip install "replay-torchrl-compat\[ray\]"'):
        RayReplayBuffer()


def test_prioritized_buffer_class_with_alpha_beta():
    rb = RayReplayBuffer(replay_buffer_cls=TensorDictPrioritizedReplayBuffer, num_shards=2, alpha=0.7,
                         beta=0.5, storage=functools.partial(LazyTensorStorage, 100), batch_size=8,
                         prefetch=2)
    try:
        assert rb.shard_totals()["count"].tolist() == [0, 0]
        index = rb.extend(TensorDict({"obs": torch.randn(70, 3)}, [70]))
        assert (index // 50).bincount().tolist() == [50, 20]  # shard 0 full, then shard 1
        # extend does not wait for the shards, and prefetched samples split their batches by the
        # totals known when they are queued (the class's staleness note): len() brings both
        # shards' totals in first, so that the first prefetched splits see shard 1's rows
        assert len(rb) == 70
        drawn = []
        for _ in range(5):
            sample = rb.sample()
            sample.set("td_error", torch.rand(8))
            rb.update_tensordict_priority(sample)
            drawn += sample["index"].tolist()
        assert sample["priority_weight"].dtype == torch.float32
        assert set(drawn) <= set(index.tolist())
        assert set(i // 50 for i in drawn) == {0, 1}  # both shards drawn from (P(missing) < 1e-5)
        assert len(rb) == 70
    finally:
        rb.close()


def test_docstring_example_runs():
    import doctest

    from torchrl_compat import ray_buffer

    class IgnoringRay(doctest.OutputChecker):
        """Ray's raylet prints its own warnings into the driver's output (its worker pool
        growing, say): they are no part of the example's output."""

        def check_output(self, want, got, optionflags):
            got = "".join(line for line in got.splitlines(keepends=True) if "(raylet)" not in line)
            return super().check_output(want, got, optionflags)

    runner = doctest.DocTestRunner(checker=IgnoringRay(), optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(ray_buffer):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0


def test_service_backend_ray_builds_a_sharded_buffer():
    """``TensorDictPrioritizedReplayBuffer(service_backend="ray")`` (torchrl 0.14's API, followed
    here through ``TORCHRL_COMPAT_RELEASE``) gives our RayReplayBuffer on the same cluster."""
    address = ray.get_runtime_context().gcs_address
    code = f"""
import functools, torch
from tensordict import TensorDict
from torchrl_compat import LazyTensorStorage, RayReplayBuffer, TensorDictPrioritizedReplayBuffer
rb = TensorDictPrioritizedReplayBuffer(
    alpha=0.7, beta=0.5, storage=functools.partial(LazyTensorStorage, 100), batch_size=8,
    service_backend="ray",
    service_backend_options={{"ray_init_config": {{"address": {address!r}}}, "num_shards": 2, "chunk_rows": 5}},
)
assert type(rb) is RayReplayBuffer and rb.service_backend == "ray" and rb.num_shards == 2
index = rb.extend(TensorDict({{"obs": torch.randn(20, 3)}}, [20]))
sample = rb.sample()
client = rb.client()
client.update_tensordict_priority(sample.set("td_error", torch.rand(8)))
print(len(client), sorted(set((index // 50).tolist())), sample["priority_weight"].shape)
client.close()
assert rb.is_alive and len(rb) == 20
rb.shutdown()
try:
    TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, service_backend="ray",
                                      service_backend_options={{"bogus": 1}})
except TypeError as err:
    print(err)
"""
    env = {**os.environ, "PYTHONPATH": ROOT, "TORCHRL_COMPAT_RELEASE": "0.14", "RL_WARNINGS": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "20 [0, 1] torch.Size([8])" in out.stdout
    assert "Unexpected Ray replay-buffer service options: ['bogus']" in out.stdout
