"""torchrl's own classes built on storages, samplers, writers and buffers (torchrl 0.14's
``HERReplayBuffer``, ``OfflineToOnlineReplayBuffer``, ``ConsumingSampler``,
``StalenessAwareSampler``, ``PromptGroupSampler``, ``StreamingSliceSampler``,
``StoreStorage``, the sample units and the trajectory query API), running on ours with
``install()`` in force, against the same classes on torchrl's own components.

Same method as the matrix tests (``torchrl_matrix_support``): each scenario runs twice from
the same seeds (``torch.manual_seed``, ``np.random.seed``), once with torchrl's own classes
in its modules, once with ours, taking every class from torchrl's modules by name; the
records must be equal step by step. A class the installed torchrl lacks is skipped.

Cases marked ``xfail(strict=True)`` fail for a torchrl 0.14 feature our buffers, samplers,
writers or storages do not have yet (named in the reason); the mark applies only where the
installed torchrl has that feature.
"""
from __future__ import annotations

import importlib

import pytest
import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers as rbs
from torchrl_matrix_support import check_same, installed_for_the_module  # noqa: F401 (autouse fixture)
from torchrl_matrix_support import WARNING_FILTERS

pytestmark = WARNING_FILTERS

CAPACITY = 12


def _torchrl_own(name):
    """torchrl's own class ``name`` (also while ours stand in for it), or ``None``."""
    cls = getattr(rbs, name, None)
    if not isinstance(cls, type):
        return cls
    return next((c for c in cls.__mro__ if c.__name__ == name and c.__module__.startswith("torchrl.")), None)


def needs(name):
    """Skips a test when the installed torchrl has no ``name``."""
    return pytest.mark.skipif(_torchrl_own(name) is None, reason=f"the installed torchrl has no {name}")


def check_ran(scenario, tmp_path, must_run, **params):
    """``check_same``, and the steps ``must_run`` returned (in both runs, being equal): the
    comparison is between results, not between two identical failures."""
    expected, _ = check_same(scenario, tmp_path, **params)
    raised = {label: message for label, _, message in expected.steps if message}
    assert not set(must_run) & set(raised), {label: raised[label] for label in set(must_run) & set(raised)}
    assert set(must_run) <= {label for label, _, _ in expected.steps}


def episodes(n, start=0, length=4, extra=None):
    """``n`` transitions of 4-step episodes numbered from ``start`` (``done`` at each end),
    with a goal, an achieved goal, a reward and a policy version."""
    step = torch.arange(start, start + n)
    done = (step % length == length - 1).unsqueeze(-1)
    data = TensorDict(
        {
            "obs": step.float().unsqueeze(-1) * 10 + torch.arange(2.0),
            "episode": step // length,
            "desired_goal": torch.zeros(n, 2),
            "achieved_goal": step.float().unsqueeze(-1) + torch.tensor([0.5, -0.5]),
            "policy_version": step // 3,
            "query": step % 3,
            ("next", "reward"): (step % 5).float().unsqueeze(-1),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
            ("next", "desired_goal"): torch.zeros(n, 2),
        },
        batch_size=[n],
    )
    if extra:
        data.update(extra)
    return data


def _steps(record, rb, label, n=3, **kwargs):
    for k in range(n):
        record.call(f"{label} sample {k}", rb.sample, return_info=True, **kwargs)


# =============================================================================
# HERReplayBuffer: relabelled goals on our TensorDictReplayBuffer and storages
# =============================================================================
def her(record, C, *, strategy, storage, peer=None):
    def reward_fn(td):
        distance = (td["achieved_goal"] - td["desired_goal"]).norm(dim=-1, keepdim=True)
        return (distance < 1.0).float()

    rb = rbs.HERReplayBuffer(
        reward_fn, her_ratio=0.5, strategy=strategy, storage=getattr(C, storage)(CAPACITY), batch_size=6,
    )
    record.call("sample, empty", rb.sample)
    record.call("extend", rb.extend, episodes(9))
    _steps(record, rb, "partial")
    record.call("extend, wraps", rb.extend, episodes(7, start=9))
    record("len", len(rb))
    _steps(record, rb, "full")
    record.call("sample 4", rb.sample, 4)
    record.call_quietly("state_dict", rb.state_dict)
    record.call("repr has the storage", lambda: type(rb.storage).__name__ in repr(rb))


@needs("HERReplayBuffer")
@pytest.mark.parametrize("storage", ["LazyTensorStorage", "LazyMemmapStorage"])
@pytest.mark.parametrize("strategy", ["future", "final", "episode", "random"])
def test_her_replay_buffer(tmp_path, strategy, storage):
    check_ran(her, tmp_path, ["partial sample 0", "full sample 2", "sample 4"], strategy=strategy, storage=storage)


def her_emptied(record, C, *, peer=None):
    rb = rbs.HERReplayBuffer(lambda td: td[("next", "reward")], storage=C.LazyTensorStorage(CAPACITY), batch_size=4)
    rb.extend(episodes(8))
    record.call("empty", rb.empty)
    record("len", len(rb))
    record.call("extend again", rb.extend, episodes(5, start=20))
    record.call("sample", rb.sample, return_info=True)


@needs("HERReplayBuffer")
def test_her_replay_buffer_empty(tmp_path):
    check_ran(her_emptied, tmp_path, ["empty", "sample"])


# =============================================================================
# OfflineToOnlineReplayBuffer and prefill_replay_buffer: our buffers on both sides
# =============================================================================
def offline_to_online(record, C, *, peer=None):
    offline = C.ReplayBuffer(storage=C.LazyTensorStorage(20))
    offline.extend(episodes(20, start=100))
    rb = rbs.OfflineToOnlineReplayBuffer(offline, online_capacity=8, offline_fraction=0.5, batch_size=6)
    record("online buffer", (type(rb.online_buffer).__name__, type(rb.online_buffer.storage).__name__))
    record.call("sample, online empty", rb.sample)
    record.call("extend", rb.extend, episodes(5))
    record("len", len(rb))
    record.call("sample", rb.sample)
    record.call("sample 4", rb.sample, 4)
    rb.anneal(3, 4)
    record("offline fraction", rb.offline_fraction)
    record.call("sample, annealed", rb.sample)
    rb.anneal(4, 4)
    record.call("sample, online only", rb.sample)
    record.call("extend, wraps", rb.extend, episodes(6, start=5))
    record.call("online rb[:]", rb.online_buffer.__getitem__, slice(None))
    target = C.ReplayBuffer(storage=C.LazyTensorStorage(30))
    record.call("prefill", lambda: len(rbs.prefill_replay_buffer(target, offline, n_samples=10, chunk_size=4)))
    record.call("prefilled rb[:]", target.__getitem__, slice(None))


@needs("OfflineToOnlineReplayBuffer")
def test_offline_to_online_replay_buffer(tmp_path):
    check_ran(offline_to_online, tmp_path, ["sample", "sample, annealed", "sample, online only", "prefill"])


# =============================================================================
# Samplers of torchrl 0.14 that we do not re-implement, in our buffers
# =============================================================================
def staleness(record, C, *, storage, max_staleness, peer=None):
    sampler = rbs.StalenessAwareSampler(max_staleness=max_staleness)
    rb = C.TensorDictReplayBuffer(storage=getattr(C, storage)(CAPACITY), sampler=sampler, batch_size=5)
    record.call("sample, empty", rb.sample)
    record.call("extend", rb.extend, episodes(10))
    for version in (3, 4, 6):
        sampler.consumer_version = version
        _steps(record, rb, f"version {version}", n=2)
    record.call("extend, wraps", rb.extend, episodes(6, start=10))
    sampler.increment_consumer_version()
    _steps(record, rb, "wrapped", n=2)
    record("state_dict", dict(rb.state_dict()["_sampler"]))
    record.call("empty", rb.empty)
    record("consumer version, emptied", sampler.consumer_version)


@needs("StalenessAwareSampler")
@pytest.mark.parametrize("max_staleness", [-1, 2])
@pytest.mark.parametrize("storage", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_staleness_aware_sampler(tmp_path, storage, max_staleness):
    check_ran(staleness, tmp_path, ["version 3 sample 0", "wrapped sample 1"], storage=storage, max_staleness=max_staleness)


def prompt_groups(record, C, *, storage, strategy, peer=None):
    sampler = rbs.PromptGroupSampler(num_groups=2, group_key="query", strategy=strategy)
    rb = C.ReplayBuffer(
        storage=getattr(C, storage)(CAPACITY), sampler=sampler, batch_size=6,
        generator=torch.Generator().manual_seed(3),
    )
    record.call("sample, empty", rb.sample)
    record.call("extend", rb.extend, episodes(9))
    _steps(record, rb, "partial")
    record.call("extend, wraps", rb.extend, episodes(6, start=9))
    _steps(record, rb, "full")
    record.call("sample 4", rb.sample, 4)
    record.call("sample 5, not divisible", rb.sample, 5)
    record("sampler state_dict", sampler.state_dict())


@needs("PromptGroupSampler")
@pytest.mark.parametrize("strategy", ["random", "recency", "reward", "variance"])
@pytest.mark.parametrize("storage", ["LazyTensorStorage", "LazyStackStorage"])
def test_prompt_group_sampler(tmp_path, storage, strategy):
    check_ran(prompt_groups, tmp_path, ["partial sample 0", "full sample 2", "sample 4"], storage=storage, strategy=strategy)


def consuming(record, C, *, storage, max_sample_count, peer=None):
    rb = C.ReplayBuffer(
        storage=getattr(C, storage)(8), sampler=rbs.ConsumingSampler(max_sample_count=max_sample_count),
        batch_size=3,
    )
    record.call("extend", rb.extend, torch.arange(6))
    for k in range(3):
        record.call(f"sample {k}", rb.sample)
        record(f"len {k}", len(rb))
    record.call("extend again", rb.extend, torch.arange(10, 14))
    record.call("rb[:]", rb.__getitem__, slice(None))
    record(f"len, refilled", len(rb))
    record.call("sample, refilled", rb.sample)


@needs("ConsumingSampler")
@pytest.mark.parametrize("max_sample_count", [1, 2])
@pytest.mark.parametrize("storage", ["ListStorage", "LazyTensorStorage"])
def test_consuming_sampler(tmp_path, storage, max_sample_count):
    check_ran(consuming, tmp_path, ["sample 0", "sample, refilled"], storage=storage, max_sample_count=max_sample_count)


def streaming_slices(record, C, *, peer=None):
    rb = C.TensorDictReplayBuffer(
        storage=C.LazyTensorStorage(16), sampler=rbs.StreamingSliceSampler(slice_len=3), batch_size=6,
    )
    done = torch.zeros(7, 1, dtype=torch.bool)
    done[4] = True
    record.call("extend", rb.extend, TensorDict({"value": torch.arange(7), ("next", "done"): done}, [7]))
    for k in range(3):
        record.call(f"sample {k}", rb.sample, return_info=True)
    record.call("extend again", rb.extend, TensorDict({"value": torch.arange(7, 12), ("next", "done"): done[:5]}, [5]))
    record.call("sample, new windows first", rb.sample, return_info=True)


@needs("StreamingSliceSampler")
def test_streaming_slice_sampler(tmp_path):
    check_ran(streaming_slices, tmp_path, ["sample 0", "sample, new windows first"])


@needs("StoreStorage")
def test_store_storage_on_our_storage_base():
    """``StoreStorage`` keeps its data in a Redis-compatible server (none here, and the
    ``redis`` client is not installed): what runs without one is its construction, which
    refuses the same way on our ``Storage`` as on torchrl's."""
    import torchrl_compat

    errors = []
    for installed in (False, True):
        if installed:
            torchrl_compat.install()
        else:
            torchrl_compat.uninstall()
        try:
            assert issubclass(rbs.StoreStorage, torchrl_compat.Storage) is installed
            try:
                rbs.StoreStorage(8)
            except Exception as err:  # noqa: BLE001
                errors.append((type(err), str(err)))
            else:
                errors.append(None)
        finally:
            torchrl_compat.install()
    assert errors[0] == errors[1]
    if importlib.util.find_spec("redis") is None:
        assert errors[0][0] is ModuleNotFoundError and "redis" in errors[0][1]


# =============================================================================
# Sample units on our storages; the sample_unit buffer argument
# =============================================================================
def _steps_of(n, ndim, start=0):
    """``n`` steps of one environment (``ndim == 1``) or of two, stacked as ``(env, time)``."""
    if ndim == 1:
        return episodes(n, start=start, length=3)
    return torch.stack([episodes(n, start=start, length=3), episodes(n, start=start + 50, length=3)], 0)


def _filled_storage(C, name, ndim=1):
    storage = getattr(C, name)(CAPACITY, ndim=ndim)
    rb = C.ReplayBuffer(storage=storage)
    rb.extend(_steps_of(10 // ndim, ndim))
    return storage, rb


def sample_units(record, C, *, storage, ndim, peer=None):
    from torchrl.data.replay_buffers import sample_units as units

    store, rb = _filled_storage(C, storage, ndim)
    anchors = torch.tensor([0, 2, 4]) if ndim == 1 else (torch.tensor([0, 2, 4]), torch.tensor([0, 1, 1]))
    record.call("Transition", units.Transition().expand, anchors, {"weight": torch.ones(3)}, store)
    for boundary in ("pad", "stop", "include_reset"):
        for burn_in, bootstrap, dilation in ((0, 0, 1), (1, 1, 1), (0, 1, 2)):
            unit = units.Sequence(3, episode_boundary=boundary, burn_in=burn_in, bootstrap=bootstrap, dilation=dilation)
            label = f"Sequence {boundary} {burn_in} {bootstrap} {dilation}"
            record.call(label, unit.expand, anchors, {"weight": torch.ones(3)}, store)
    record.call("Sequence, no done key", units.Sequence(2, done_key=None).expand, anchors, {}, store)
    record.call("Sequence on a list storage", units.Sequence(2).expand, torch.tensor([0]), {}, C.ListStorage(4))


@needs("Sequence")
@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("storage", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_sample_units_expand_our_storages(tmp_path, storage, ndim):
    check_ran(sample_units, tmp_path, ["Transition", "Sequence stop 1 1 1", "Sequence include_reset 0 1 2"], storage=storage, ndim=ndim)


def sample_units_wrapped(record, C, *, storage, ndim, peer=None):
    from torchrl.data.replay_buffers import sample_units as units

    store, rb = _filled_storage(C, storage, ndim)
    rb.extend(_steps_of(4 // ndim, ndim, start=30))
    anchors = torch.tensor([0, 2, 4]) if ndim == 1 else (torch.tensor([0, 2, 4]), torch.tensor([0, 1, 1]))
    for boundary in ("pad", "include_reset"):
        unit = units.Sequence(3, episode_boundary=boundary, burn_in=1)
        record.call(f"Sequence {boundary}, wrapped", unit.expand, anchors, {}, store)
    record.call("Sequence, no done key, wrapped", units.Sequence(2, done_key=None).expand, anchors, {}, store)


@needs("Sequence")
@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("storage", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_sample_units_at_the_write_seam_of_our_storages(tmp_path, storage, ndim):
    check_ran(sample_units_wrapped, tmp_path, ["Sequence pad, wrapped", "Sequence, no done key, wrapped"], storage=storage, ndim=ndim)


def buffer_sample_unit(record, C, *, peer=None):
    from torchrl.data.replay_buffers import sample_units as units

    rb = C.ReplayBuffer(storage=C.LazyTensorStorage(CAPACITY), batch_size=2, sample_unit=units.Sequence(3, burn_in=1))
    rb.extend(episodes(10, length=3))
    record.call("sample", rb.sample, return_info=True)


@needs("Sequence")
def test_buffer_with_a_sample_unit(tmp_path):
    check_ran(buffer_sample_unit, tmp_path, ["sample"])


# =============================================================================
# Trajectory queries over what our buffers hold
# =============================================================================
def trajectories(record, C, *, storage, peer=None):
    from torchrl.data.replay_buffers import query

    rb = C.TensorDictReplayBuffer(storage=getattr(C, storage)(CAPACITY))
    rb.extend(episodes(10, length=4))
    record("iter_trajectories", [t.data for t in query.iter_trajectories(rb[:])])
    record("by episode", [t.data for t in query.iter_trajectories(rb[:], trajectory_key="episode")])
    kept = query.filter_trajectories(rb[:], query.traj.length >= 4, trajectory_key="episode")
    record("filter_trajectories", [t.data for t in kept])
    rb.extend(episodes(5, start=10, length=4))
    record("iter_trajectories, wrapped", [t.data for t in query.iter_trajectories(rb[:], trajectory_key="episode")])


@needs("iter_trajectories")
@pytest.mark.parametrize("storage", ["LazyTensorStorage", "LazyStackStorage"])
def test_trajectory_queries_over_our_buffers(tmp_path, storage):
    check_ran(trajectories, tmp_path, [], storage=storage)


def buffer_query(record, C, *, peer=None):
    from torchrl.data.replay_buffers import query

    rb = C.TensorDictReplayBuffer(storage=C.LazyTensorStorage(CAPACITY))
    rb.extend(episodes(10, length=4))
    record.call("query", lambda: [t.data for t in rb.query(query.traj.length >= 4, trajectory_key="episode")])
    rb.extend(episodes(5, start=10, length=4))
    record.call("query, wrapped", lambda: [t.data for t in rb.query(trajectory_key="episode")])


@needs("iter_trajectories")
def test_buffer_query(tmp_path):
    check_ran(buffer_query, tmp_path, ["query", "query, wrapped"])
