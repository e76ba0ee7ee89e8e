"""The sharded Ray buffer: exact prioritized draws across shards, global indices, sharded
uniform / without-replacement / slice sampling, checkpoints with a manifest, shard restarts.

One local cluster (``ray.init(num_cpus=2)``) serves the whole module.
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

from ray_support import local_cluster, prioritized, ROOT  # noqa: E402

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
from torchrl_compat import _ray_routing as routing  # noqa: E402
from torchrl_compat.ray_buffer import ShardRestartedError  # noqa: E402



@pytest.fixture(scope="module", autouse=True)
def cluster():
    with local_cluster():
        yield


def chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """p-value of Pearson's chi-square test; cells expecting fewer than 5 draws are pooled."""
    small = expected < 5
    observed = np.append(observed[~small], observed[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    stat = float(((observed - expected) ** 2 / expected).sum())
    dof = len(expected) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def rows(n, start=0):
    return TensorDict({"obs": torch.arange(start, start + n, dtype=torch.float64).unsqueeze(-1)}, [n])


def skewed_priorities(sizes, seed=0):
    """Heavy-tailed priorities over 6 orders of magnitude, shard k scaled by 10 ** (2 k)."""
    rng = np.random.default_rng(seed)
    parts = []
    for k, size in enumerate(sizes):
        p = 10 ** rng.uniform(-6, 0, size) * rng.pareto(1.5, size).clip(1e-3, 1e3)
        parts.append(p * 10.0 ** (2 * k) / 10.0 ** (2 * (len(sizes) - 1)) * 1e6)
    return parts


@pytest.fixture(scope="module")
def skewed_buffer():
    """4 shards of 60 rows, priorities of each shard 100x those of the previous one."""
    sizes = [60, 60, 60, 60]
    rb = prioritized(4, 240, chunk_rows=60)
    index = rb.extend(rows(240))
    priorities = np.concatenate(skewed_priorities(sizes))
    rb.update_priority(index, torch.from_numpy(priorities))
    yield rb, index.numpy(), priorities
    rb.close()


def test_global_indices_span_the_shards(skewed_buffer):
    rb, index, _ = skewed_buffer
    shard, local = np.divmod(index, 60)
    assert sorted(set(shard.tolist())) == [0, 1, 2, 3]
    assert len(set(index.tolist())) == 240
    assert (np.sort(local) == np.repeat(np.arange(60), 4)).all()


def test_prioritized_draws_are_exact(skewed_buffer):
    rb, index, priorities = skewed_buffer
    expected_p = priorities / priorities.sum()
    assert expected_p.max() / expected_p.min() > 1e6  # the spread the test asks for
    counts = np.zeros(240, dtype=np.int64)
    position = {int(g): i for i, g in enumerate(index)}
    torch.manual_seed(1)
    draws = 0
    while draws < 1_000_000:
        sample = rb.sample(1 << 17)
        got = np.array([position[g] for g in sample["index"].tolist()])
        counts += np.bincount(got, minlength=240)
        # each row is the one its index names
        assert (sample["obs"][:, 0].numpy() == got).all()
        draws += len(got)
    assert chi_square_p(counts, expected_p * draws) > 0.01


def test_one_shard_per_batch_is_not_exact(skewed_buffer):
    """Ape-X style sampling (each batch from one shard chosen uniformly, weights from that
    shard's own count and minimum) fails the same test on the same priorities."""
    _, _, priorities = skewed_buffer
    shards = np.split(priorities, 4)
    rng = np.random.default_rng(0)
    counts = np.zeros(240, dtype=np.int64)
    draws = 0
    while draws < 1_000_000:
        k = rng.integers(4)
        chosen = rng.choice(60, size=256, p=shards[k] / shards[k].sum())
        counts += np.bincount(chosen + 60 * k, minlength=240)
        draws += 256
    assert chi_square_p(counts, priorities / priorities.sum() * draws) < 1e-6


def test_weights_equal_one_samplers(skewed_buffer):
    rb, index, priorities = skewed_buffer
    single = PrioritizedSampler(240, alpha=1.0, beta=0.6, dtype=torch.float64)
    single.update_priority(torch.arange(240), torch.from_numpy(priorities))
    storage = LazyTensorStorage(240)
    storage.set(torch.arange(240), torch.zeros(240))
    reference = {}
    torch.manual_seed(2)
    ref_index, ref_info = single.sample(storage, 200_000)
    for i, w in zip(ref_index.tolist(), ref_info["priority_weight"].tolist()):
        reference[i] = w
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


def test_index_errors_name_the_index(skewed_buffer):
    rb, _, _ = skewed_buffer
    with pytest.raises(IndexError, match="global index 240 at position 1"):
        rb.update_priority(torch.tensor([0, 240]), torch.tensor([1.0, 1.0]))
    with pytest.raises(IndexError, match="global index -3 at position 0"):
        rb[torch.tensor([-3])]
    with pytest.raises(ValueError, match="priority nan at position 1"):
        rb.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, float("nan")]))
    # nothing changed: the rows still read back
    assert rb[torch.tensor([5])]["obs"].shape == (1, 1)


def test_routing_splits_capacity_and_factories():
    assert routing.shard_capacities(10, 4) == [3, 3, 2, 2]
    factory = routing.shard_factory(functools.partial(LazyTensorStorage, 1_000_000), "storage", 250_000)
    assert factory().max_size == 250_000
    factory = routing.shard_factory(functools.partial(PrioritizedSampler, max_capacity=8, alpha=1, beta=1),
                                    "sampler", 2)
    assert factory().max_size == 2
    with pytest.raises(ValueError, match="as a factory"):
        routing.shard_factory(LazyTensorStorage(10), "storage", 5)
    with pytest.raises(ValueError, match="num_shards=4"):
        routing.shard_capacities(3, 4)


def test_uniform_draws_cover_shards_and_capacity_is_global():
    rb = RayReplayBuffer(replay_buffer_cls=TensorDictReplayBuffer, num_shards=3,
                         storage=functools.partial(LazyTensorStorage, 300), sampler=RandomSampler,
                         chunk_rows=7)
    try:
        assert rb.shard_totals()["count"].tolist() == [0, 0, 0]
        index = rb.extend(rows(150)).numpy()
        rb.sync()  # the writes' replies: shard_totals() makes no call
        counts = rb.shard_totals()["count"]
        assert counts.sum() == 150 and len(set(counts.tolist())) > 1  # uneven shards
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
        assert chi_square_p(hits, np.full(150, hits.sum() / 150)) > 0.01
        # the capacity is global: 300 rows in all, past it each shard drops its oldest rows
        rb.extend(rows(200, start=1000))
        assert len(rb) == 300
        assert rb.write_count == 350
        assert rb.shard_totals()["count"].tolist() == [100, 100, 100]
    finally:
        rb.close()


def test_without_replacement_epoch_spans_every_shard():
    rb = RayReplayBuffer(replay_buffer_cls=TensorDictReplayBuffer, num_shards=2,
                         storage=functools.partial(LazyTensorStorage, 90),
                         sampler=SamplerWithoutReplacement, chunk_rows=7)
    try:
        index = rb.extend(rows(60))
        seen = torch.cat([rb.sample(12)["index"] for _ in range(5)])
        assert sorted(seen.tolist()) == sorted(index.tolist())  # one epoch: each row once
    finally:
        rb.close()


def test_slices_stay_in_one_trajectory_and_shard():
    rb = RayReplayBuffer(replay_buffer_cls=TensorDictReplayBuffer, num_shards=2,
                         storage=functools.partial(LazyTensorStorage, 400),
                         sampler=functools.partial(SliceSampler, num_slices=8, traj_key="traj"),
                         chunk_rows=40)
    try:
        traj = torch.arange(200) // 20  # 10 trajectories of 20 steps; a chunk holds 2 whole ones
        rb.extend(TensorDict({"traj": traj, "t": torch.arange(200) % 20}, [200]))
        sample = rb.sample(64).reshape(8, 8)
        assert (sample["traj"] == sample["traj"][:, :1]).all()
        assert (sample["t"].diff(dim=1) == 1).all()
        shard = sample["index"] // 200
        assert (shard == shard[:, :1]).all()
    finally:
        rb.close()


@pytest.fixture(scope="module")
def checkpoint_buffer():
    rb = prioritized(2, 300, chunk_rows=10, batch_size=32)
    yield rb
    rb.close()


def test_dumps_loads_round_trip_with_manifest(checkpoint_buffer, tmp_path):
    rb = checkpoint_buffer
    rb.empty()
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


def test_loads_refuses_a_manifest_naming_a_missing_part(checkpoint_buffer, tmp_path):
    rb = checkpoint_buffer
    rb.empty()
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


def test_checkpoint_in_a_mixed_run_gives_the_same_samples(checkpoint_buffer, tmp_path):
    rb = checkpoint_buffer
    rb.empty()
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
        assert torch.equal(w1, w2)


@pytest.mark.parametrize("write_ahead", [False, True])
def test_killed_shard_restarts_from_its_checkpoint(tmp_path, write_ahead):
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


def test_missing_ray_names_the_extra():
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from torchrl_compat import RayReplayBuffer\n"
        "try:\n    RayReplayBuffer()\nexcept ImportError as err:\n    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert 'pip install "replay-torchrl-compat[ray]"' in out.stdout, out.stderr


def test_prioritized_buffer_class_with_alpha_beta():
    rb = RayReplayBuffer(replay_buffer_cls=TensorDictPrioritizedReplayBuffer, num_shards=2, alpha=0.7,
                         beta=0.5, storage=functools.partial(LazyTensorStorage, 100), batch_size=8,
                         chunk_rows=5, prefetch=2)
    try:
        assert rb.shard_totals()["count"].tolist() == [0, 0]
        rb.extend(TensorDict({"obs": torch.randn(20, 3)}, [20]))
        for _ in range(5):
            sample = rb.sample()
            sample.set("td_error", torch.rand(8))
            rb.update_tensordict_priority(sample)
        assert sample["priority_weight"].dtype == torch.float32
        assert (sample["index"] // 50).unique().numel() >= 1
        assert len(rb) == 20
    finally:
        rb.close()


def test_docstring_example_runs():
    import doctest

    from torchrl_compat import ray_buffer

    result = doctest.testmod(ray_buffer, optionflags=doctest.ELLIPSIS)
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
