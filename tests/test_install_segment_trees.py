"""torchrl 0.11's own prioritized samplers and buffers running on replay's trees.

On the CI torch (2.13) torchrl's compiled trees do not load, so everything torchrl does
here after ``install_segment_trees()`` goes through ``replay``'s trees; where they load (torch
2.9 with torchrl 0.11, torch 2.15 with torchrl 0.14.1: make test-matrix), the fixture asks for
``replace=True``. The in-process
tests share one installation (the ``installed`` fixture) and undo it afterwards; the
before-import, torchrl-missing and start-up hook tests run in fresh interpreters.
"""
from __future__ import annotations

import ast
import copy
import importlib.util
import json
import math
import os
import pickle
import re
import subprocess
import sys
import textwrap
import types
import warnings

import numpy as np
import pytest
import torch

import replay
import torchrl_compat
from torchrl_compat._releases import since
import torchrl_compat_trees
from torchrl_compat_trees import ENV_VAR, EXTENSION_NAME, TREE_NAMES
from install_support import site_dir_like_pip
from native_trees import torchrl_trees_load
from torchrl_matrix_support import known_gaps  # noqa: F401 (autouse fixture: features of the installed torchrl ours lack)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLERS = "torchrl.data.replay_buffers.samplers"
FLT_MAX = float(np.finfo(np.float32).max)
DBL_MAX = float(np.finfo(np.float64).max)


# =============================================================================
# Fixtures and helpers
# =============================================================================
def _snapshot():
    """What install_segment_trees may change: meta_path, the extension entry, tree globals."""
    import torchrl  # noqa: F401  (torchrl_compat imported it already)

    samplers = sys.modules[SAMPLERS]
    return (
        list(sys.meta_path),
        sys.modules.get(EXTENSION_NAME),
        sys.modules["torchrl"].__dict__.get("_torchrl"),
        {name: getattr(samplers, name) for name in TREE_NAMES},
    )


def _restore(snapshot):
    meta_path, extension, attribute, globals_ = snapshot
    sys.meta_path[:] = meta_path
    if extension is None:
        sys.modules.pop(EXTENSION_NAME, None)
    else:
        sys.modules[EXTENSION_NAME] = extension
    torchrl = sys.modules["torchrl"]
    if attribute is None:
        torchrl.__dict__.pop("_torchrl", None)
    else:
        torchrl._torchrl = attribute
    for name, value in globals_.items():
        setattr(sys.modules[SAMPLERS], name, value)


@pytest.fixture(scope="module")
def installed():
    """replay's trees in torchrl. Where torchrl's own load, install_segment_trees() keeps them
    (and says so), and replace=True puts ours in their place."""
    snapshot = _snapshot()
    own_trees_load = torchrl_trees_load()
    assert torchrl_compat.install_segment_trees() is not own_trees_load
    if own_trees_load:
        assert torchrl_compat.install_segment_trees(replace=True) is True
    yield
    _restore(snapshot)


def _run(*parts: str, env_update=None, cwd=ROOT, timeout=120):
    """Run the dedented, joined ``parts`` in a fresh interpreter; return its stdout.

    The working tree is importable only when ``cwd`` is the repository root.
    """
    env = dict(os.environ)
    env.pop(ENV_VAR, None)
    if cwd == ROOT:
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["RL_WARNINGS"] = "0"
    env.update(env_update or {})
    proc = subprocess.run(
        [sys.executable, "-c", "\n".join(textwrap.dedent(part) for part in parts)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _f32(x):
    return torch.tensor(x, dtype=torch.float32)


def _leaf_priority(p, alpha, eps=1e-8, dtype=torch.float32):
    """The leaf torchrl's update_priority writes: ``(p + eps) ** alpha``."""
    return torch.pow(torch.as_tensor(p) + eps, alpha).to(dtype)


# Code run in fresh interpreters: torchrl's PrioritizedSampler end to end.
_USE_PRIORITIZED_SAMPLER = """
import torch
from torchrl.data import ReplayBuffer, LazyTensorStorage, PrioritizedSampler
rb = ReplayBuffer(storage=LazyTensorStorage(4),
                  sampler=PrioritizedSampler(max_capacity=4, alpha=1.0, beta=1.0))
rb.extend(torch.arange(4))
rb.update_priority(torch.arange(4), torch.tensor([0.0, 0.0, 5.0, 0.0]))
sample, info = rb.sample(8, return_info=True)
print("SAMPLE", sorted(set(sample.tolist())))
"""


# =============================================================================
# What gets installed
# =============================================================================
class TestInstalled:
    def test_extension_module(self, installed):
        module = sys.modules[EXTENSION_NAME]
        import torchrl
        from torchrl._extension import is_module_available

        assert torchrl._torchrl is module
        for name in TREE_NAMES:
            assert getattr(module, name) is getattr(replay, name)
            assert getattr(sys.modules[SAMPLERS], name) is getattr(replay, name)
        spec = importlib.util.find_spec(EXTENSION_NAME)
        assert spec is module.__spec__
        assert spec.name == EXTENSION_NAME and spec.origin == "replay"
        assert is_module_available(EXTENSION_NAME)
        from torchrl._torchrl import SumSegmentTreeFp64

        assert SumSegmentTreeFp64 is replay.SumSegmentTreeFp64

    def test_idempotent(self, installed):
        module = sys.modules[EXTENSION_NAME]
        meta_path = list(sys.meta_path)
        assert torchrl_compat.install_segment_trees() is True
        assert torchrl_compat.install_segment_trees(strict=True) is True
        assert sys.modules[EXTENSION_NAME] is module
        assert sys.meta_path == meta_path
        finders = [f for f in sys.meta_path if type(f).__name__ == "_TreesFinder"]
        assert len(finders) == 1

    def test_sampler_builds_replay_trees(self, installed):
        from torchrl.data import PrioritizedSampler

        for dtype, sum_cls, min_cls in (
            (torch.float32, replay.SumSegmentTreeFp32, replay.MinSegmentTreeFp32),
            (torch.float64, replay.SumSegmentTreeFp64, replay.MinSegmentTreeFp64),
        ):
            sampler = PrioritizedSampler(7, alpha=0.5, beta=0.5, dtype=dtype)
            assert type(sampler._sum_tree) is sum_cls and len(sampler._sum_tree) == 7
            assert type(sampler._min_tree) is min_cls
            assert sampler._min_tree[0] == sampler._min_tree.identity_element

    def test_public_export(self):
        assert torchrl_compat.install_segment_trees is torchrl_compat_trees.install_segment_trees
        assert "install_segment_trees" in torchrl_compat.__all__


class TestOwnTreesPresent:
    """torchrl's own extension loaded (faked: the CI torch cannot load the real one)."""

    def test_left_alone_unless_replace(self):
        snapshot = _snapshot()
        own = types.ModuleType(EXTENSION_NAME)
        own.__spec__ = importlib.machinery.ModuleSpec(EXTENSION_NAME, None, origin="own.so")
        for name in TREE_NAMES:
            setattr(own, name, type(name, (), {}))
        try:
            sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_TreesFinder"]
            sys.modules[EXTENSION_NAME] = own
            for name in TREE_NAMES:
                setattr(sys.modules[SAMPLERS], name, getattr(own, name))
            assert torchrl_compat.install_segment_trees() is False
            assert sys.modules[EXTENSION_NAME] is own
            assert sys.modules[SAMPLERS].SumSegmentTreeFp32 is own.SumSegmentTreeFp32
            assert not any(type(f).__name__ == "_TreesFinder" for f in sys.meta_path)

            assert torchrl_compat.install_segment_trees(replace=True) is True
            assert sys.modules[EXTENSION_NAME] is not own
            assert sys.modules["torchrl"]._torchrl is sys.modules[EXTENSION_NAME]
            for name in TREE_NAMES:
                assert getattr(sys.modules[SAMPLERS], name) is getattr(replay, name)
        finally:
            _restore(snapshot)


# =============================================================================
# torchrl's docstring examples (spec/torchrl-0.11.0/samplers.py)
# =============================================================================
class TestDocExamples:
    def test_prioritized_sampler(self, installed):
        from tensordict import TensorDict
        from torchrl.data.replay_buffers import (
            LazyTensorStorage,
            PrioritizedSampler,
            ReplayBuffer,
        )

        rb = ReplayBuffer(
            storage=LazyTensorStorage(10),
            sampler=PrioritizedSampler(max_capacity=10, alpha=1.0, beta=1.0),
        )
        priority = torch.tensor([0, 1000])
        data_0 = TensorDict({"reward": 0, "obs": [0], "action": [0], "priority": priority[0]}, [])
        data_1 = TensorDict({"reward": 1, "obs": [1], "action": [2], "priority": priority[1]}, [])
        rb.add(data_0)
        rb.add(data_1)
        rb.update_priority(torch.tensor([0, 1]), priority=priority)
        sample, info = rb.sample(10, return_info=True)
        # print(sample): the fields, shapes and dtypes of the docstring.
        assert sample.batch_size == torch.Size([10])
        assert set(sample.keys()) == {"action", "obs", "priority", "reward"}
        for key, shape in (("action", [10, 1]), ("obs", [10, 1]), ("priority", [10]), ("reward", [10])):
            assert sample[key].shape == torch.Size(shape) and sample[key].dtype == torch.int64
        # print(info): index 1 every time, weight (1000 / 1e-8) ** -1 = 1e-11.
        assert set(info) == {"priority_weight", "index"}
        assert np.asarray(info["index"]).tolist() == [1] * 10
        weight = np.asarray(info["priority_weight"])
        assert weight.dtype == np.float32 and weight.shape == (10,)
        expected = torch.pow(_leaf_priority(1000, 1.0) / _leaf_priority(0, 1.0).item(), -1.0)
        np.testing.assert_allclose(weight, np.full(10, expected.item()), rtol=1e-6)
        np.testing.assert_allclose(weight, np.full(10, 1e-11), rtol=1e-5)
        assert sample["obs"].flatten().tolist() == [1] * 10

    def test_prioritized_sampler_tensordict_note(self, installed):
        from tensordict import TensorDict
        from torchrl.data.replay_buffers import LazyTensorStorage, PrioritizedSampler
        from torchrl.data.replay_buffers import TensorDictReplayBuffer as TDRB

        rb = TDRB(
            storage=LazyTensorStorage(10),
            sampler=PrioritizedSampler(max_capacity=10, alpha=1.0, beta=1.0),
            priority_key="priority",
        )
        priority = torch.tensor([0, 1000])
        data_0 = TensorDict({"reward": 0, "obs": [0], "action": [0], "priority": priority[0]}, [])
        data_1 = TensorDict({"reward": 1, "obs": [1], "action": [2], "priority": priority[1]}, [])
        data = torch.stack([data_0, data_1])
        index = rb.extend(data)  # also writes the "priority" entries to the trees
        assert index.tolist() == [0, 1]
        # The note calls rb.update_priority(data), which takes (index, priority) in 0.11;
        # update_tensordict_priority is the method that reads priority_key and "index".
        rb.update_tensordict_priority(data.set("index", index))
        sample, info = rb.sample(10, return_info=True)
        assert sample["index"].tolist() == [1] * 10

    def test_prioritized_slice_sampler(self, installed, tmp_path):
        from tensordict import TensorDict
        from torchrl.data.replay_buffers import (
            LazyMemmapStorage,
            PrioritizedSliceSampler,
            TensorDictReplayBuffer,
        )

        torch.manual_seed(0)
        np.random.seed(0)
        sampler = PrioritizedSliceSampler(max_capacity=9, num_slices=3, alpha=0.7, beta=0.9)
        rb = TensorDictReplayBuffer(
            storage=LazyMemmapStorage(9, scratch_dir=tmp_path), sampler=sampler, batch_size=6
        )
        data = TensorDict(
            {
                "observation": torch.randn(9, 16),
                "action": torch.randn(9, 1),
                "episode": torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2], dtype=torch.long),
                "steps": torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2], dtype=torch.long),
                ("next", "observation"): torch.randn(9, 16),
                ("next", "reward"): torch.randn(9, 1),
                ("next", "done"): torch.tensor([0, 0, 1, 0, 0, 1, 0, 0, 1], dtype=torch.bool).unsqueeze(1),
            },
            batch_size=[9],
        )
        rb.extend(data)

        def check_slices(sample):
            episode, steps = sample["episode"].tolist(), sample["steps"].tolist()
            assert len(episode) == len(steps) == 6
            for k in range(0, 6, 2):  # three slices of two consecutive steps of one episode
                assert episode[k] == episode[k + 1]
                assert steps[k + 1] == steps[k] + 1
            return episode, steps

        sample, info = rb.sample(return_info=True)
        check_slices(sample)
        assert info["priority_weight"].tolist() == [1.0] * 6  # "weight [1.0, ... 1.0]"

        priority = torch.tensor([0, 3, 3, 0, 0, 0, 1, 1, 1])
        rb.update_priority(torch.arange(0, 9, 1), priority=priority)
        leaves = sampler._sum_tree.values().copy()
        p_min = _leaf_priority(0, 0.7).item()
        weight_of = {
            int(p): torch.pow(_leaf_priority(p, 0.7) / p_min, -0.9).item() for p in (1, 3)
        }
        # The docstring's printed weight is that of a slice starting on a priority-1 step.
        assert weight_of[1] == pytest.approx(9.120110917137936e-06, rel=1e-6)
        seen = set()
        for _ in range(20):
            sample, info = rb.sample(return_info=True)
            episode, steps = check_slices(sample)
            # Priority-0 steps hold (1e-8) ** 0.7 of the mass: never drawn with this seed.
            assert 1 not in episode
            starts = [(episode[k], steps[k]) for k in range(0, 6, 2)]
            seen.update(starts)
            expected = [weight_of[int(priority[3 * e + s])] for e, s in starts for _ in range(2)]
            np.testing.assert_allclose(info["priority_weight"].tolist(), expected, rtol=1e-6)
            # sample() zeroes the leaves that cannot start a slice, then restores them.
            np.testing.assert_array_equal(sampler._sum_tree.values(), leaves)
        assert seen <= {(0, 1), (2, 0), (2, 1)} and len(seen) == 3


# =============================================================================
# Sampling through torchrl's buffers
# =============================================================================
# 0.999 quantile of the chi-square distribution with 15 degrees of freedom.
CHI2_15_Q999 = 37.697


class TestSampling:
    @pytest.mark.parametrize("seeded_by", ["numpy", "generator"])
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_chi_square(self, installed, seeded_by, dtype):
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

        n, draws, alpha = 16, 40000, 0.7
        priority = torch.linspace(0.1, 4.0, n, dtype=torch.float64)
        rb = PrioritizedReplayBuffer(alpha=alpha, beta=0.5, storage=LazyTensorStorage(n), dtype=dtype)
        if seeded_by == "generator":  # torchrl draws with torch.rand(generator=...)
            rb.set_rng(torch.Generator().manual_seed(1))
        else:  # torchrl draws with np.random.uniform
            np.random.seed(1)
        rb.extend(torch.arange(n))
        rb.update_priority(torch.arange(n), priority)
        counts = np.zeros(n)
        for _ in range(draws // 1000):
            _, info = rb.sample(1000, return_info=True)
            counts += np.bincount(np.asarray(info["index"]), minlength=n)
        expected = ((priority + 1e-8) ** alpha / ((priority + 1e-8) ** alpha).sum()).numpy() * draws
        chi2 = ((counts - expected) ** 2 / expected).sum()
        assert counts.sum() == draws
        assert chi2 < CHI2_15_Q999, (chi2, counts, expected)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_importance_weights_exact(self, installed, dtype):
        from tensordict import TensorDict
        from torchrl.data import (
            LazyTensorStorage,
            PrioritizedSampler,
            TensorDictPrioritizedReplayBuffer,
            TensorDictReplayBuffer,
        )

        n, alpha, beta = 12, 0.6, 0.4
        priority = torch.arange(1, n + 1, dtype=torch.float64) / 3
        common = dict(storage=LazyTensorStorage(n), batch_size=64, priority_key="td_error",
                      generator=torch.Generator().manual_seed(3))
        if dtype == torch.float32:
            rb = TensorDictPrioritizedReplayBuffer(alpha=alpha, beta=beta, **common)
        else:  # TensorDictPrioritizedReplayBuffer has no dtype argument
            sampler = PrioritizedSampler(n, alpha=alpha, beta=beta, dtype=dtype)
            rb = TensorDictReplayBuffer(sampler=sampler, **common)
        rb.extend(TensorDict({"obs": torch.arange(n), "td_error": priority}, [n]))
        sample = rb.sample()
        leaf = _leaf_priority(priority, alpha, dtype=dtype)
        p_min = leaf.min().item()
        index = sample["index"]
        np.testing.assert_array_equal(sample["obs"], index)
        expected = torch.pow(leaf[index] / p_min, -beta)
        torch.testing.assert_close(
            torch.as_tensor(sample["priority_weight"]).to(dtype), expected.to(dtype), rtol=0, atol=0
        )
        # Any leaf value the tree holds is the one torchrl wrote.
        np.testing.assert_array_equal(rb._sampler._sum_tree.values(), leaf.numpy())
        np.testing.assert_array_equal(rb._sampler._min_tree.values(), leaf.numpy())


# =============================================================================
# update_priority
# =============================================================================
class TestUpdatePriority:
    def _sampler(self, n=8, **kwargs):
        from torchrl.data import PrioritizedSampler

        return PrioritizedSampler(n, alpha=0.5, beta=0.5, **kwargs)

    def test_values_and_broadcast(self, installed):
        sampler = self._sampler()
        sampler.update_priority(torch.tensor([1, 3]), torch.tensor([4.0, 9.0]))
        sampler.update_priority(5, 16.0)
        sampler.update_priority(torch.tensor([6, 7]), 25.0)  # one priority for every index
        leaf = sampler._sum_tree.values()
        expected = np.zeros(8, dtype=np.float32)
        for i, p in ((1, 4.0), (3, 9.0), (5, 16.0), (6, 25.0), (7, 25.0)):
            expected[i] = _leaf_priority(p, 0.5).item()
        np.testing.assert_array_equal(leaf, expected)
        mins = sampler._min_tree.values()
        np.testing.assert_array_equal(mins[[0, 2, 4]], np.float32(FLT_MAX))
        assert sampler._max_priority[0].item() == 25.0

    def test_minus_one_from_max_value_writer_is_skipped(self, installed):
        sampler = self._sampler()
        sampler.update_priority(torch.tensor([-1, 2, -1]), torch.tensor([7.0, 4.0, 7.0]))
        sampler.update_priority(torch.tensor(-1), 3.0)
        sampler.update_priority(torch.tensor([-1, -1]), torch.tensor([1.0, 1.0]))
        leaf = sampler._sum_tree.values()
        assert leaf[2] == _leaf_priority(4.0, 0.5).item()
        assert np.count_nonzero(leaf) == 1

    def test_max_value_writer_buffer(self, installed):
        from tensordict import TensorDict
        from torchrl.data import (
            LazyTensorStorage,
            PrioritizedSampler,
            TensorDictMaxValueWriter,
            TensorDictReplayBuffer,
        )

        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(4), sampler=PrioritizedSampler(4, alpha=1.0, beta=1.0),
            writer=TensorDictMaxValueWriter(rank_key="key"), priority_key="p", batch_size=4,
        )
        rb.extend(TensorDict({"key": torch.arange(4.0), "p": torch.ones(4)}, [4]))
        # Lower-ranked than everything stored: the writer marks them -1, torchrl skips them.
        rb.extend(TensorDict({"key": -torch.ones(2), "p": torch.full((2,), 5.0)}, [2]))
        assert sorted(rb.storage[:]["key"].tolist()) == [0.0, 1.0, 2.0, 3.0]
        # Priority 5 was never written: the -1 indices were dropped before the trees.
        assert rb._sampler._sum_tree.values().tolist() == [1.0] * 4
        assert rb._sampler._max_priority[0].item() == 1.0
        sample = rb.sample()
        assert sample.batch_size == torch.Size([4])

    def test_ndim2_storage(self, installed):
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

        storage = LazyTensorStorage(12, ndim=2)
        rb = PrioritizedReplayBuffer(alpha=1.0, beta=1.0, storage=storage)
        written = rb.extend(torch.arange(12).reshape(3, 4))  # (row, column) pairs
        index = written[[1, 11]]
        rb.update_priority(index, torch.tensor([5.0, 7.0]))
        flat = np.ravel_multi_index(tuple(index.T.numpy()), tuple(storage.shape))
        leaf = rb._sampler._sum_tree.values()
        assert leaf[flat[0]] == _leaf_priority(5.0, 1.0).item()
        assert leaf[flat[1]] == _leaf_priority(7.0, 1.0).item()
        assert flat[1] == 11 and np.count_nonzero(leaf == 1.0) == 10
        sample, info = rb.sample(64, return_info=True)
        assert isinstance(info["index"], tuple) and len(info["index"]) == 2

    def test_max_priority_within_buffer(self, installed):
        sampler = self._sampler(max_priority_within_buffer=True)
        sampler.update_priority(torch.arange(4), torch.tensor([1.0, 9.0, 4.0, 2.0]))
        assert sampler._max_priority[1].item() == 1
        # Overwriting the max rescans every leaf (each read is in range).
        sampler.update_priority(torch.tensor([1]), torch.tensor([0.5]))
        assert sampler._max_priority[1].item() == 2
        # kept as the leaf's (p + eps) ** alpha up to 0.12, turned back into the raw priority after
        expected = 4.0 if since("prioritized_raw_max_within_buffer") else _leaf_priority(4.0, 0.5).item()
        assert sampler._max_priority[0].item() == pytest.approx(expected)

    def test_invalid_values_rejected_whole(self, installed):
        # torchrl's own trees write outside their buffer or store NaN here.
        sampler = self._sampler()
        sampler.update_priority(torch.tensor([0]), torch.tensor([1.0]))
        before = sampler._sum_tree.values()
        with pytest.raises(IndexError, match="index 16 at position 1 is out of range for size 8"):
            sampler.update_priority(torch.tensor([2, 16]), torch.tensor([1.0, 1.0]))
        # torchrl itself drops every negative index before the trees see it.
        sampler.update_priority(torch.tensor([-2, -5]), torch.tensor([1.0, 2.0]))
        with pytest.raises(IndexError, match="index -2 at position 0"):
            sampler._sum_tree[torch.tensor([-2])] = 1.0
        with pytest.raises(ValueError, match="value nan at position 1 cannot be stored"):
            sampler.update_priority(torch.tensor([2, 3]), torch.tensor([1.0, float("nan")]))
        with pytest.raises(ValueError, match="finite and non-negative"):
            sampler.update_priority(torch.tensor([2]), torch.tensor([float("inf")]))
        np.testing.assert_array_equal(sampler._sum_tree.values(), before)


# =============================================================================
# state_dict, pickling, dumps / loads
# =============================================================================
class TestCheckpoints:
    def _filled(self, dtype=torch.float32):
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

        rb = PrioritizedReplayBuffer(alpha=0.8, beta=0.6, storage=LazyTensorStorage(6), dtype=dtype)
        rb.extend(torch.arange(4))
        rb.update_priority(torch.arange(4), torch.tensor([3.0, 0.5, 2.0, 1.0]))
        return rb

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_state_dict_round_trip(self, installed, dtype):
        rb = self._filled(dtype)
        sampler = rb._sampler
        state = sampler.state_dict()
        sum_leaves, min_leaves = sampler._sum_tree.values(), sampler._min_tree.values()
        assert state["_sum_tree"] is not sampler._sum_tree  # a deep copy
        sampler.update_priority(torch.arange(4), torch.ones(4) * 100)
        sampler.load_state_dict(state)
        np.testing.assert_array_equal(sampler._sum_tree.values(), sum_leaves)
        np.testing.assert_array_equal(sampler._min_tree.values(), min_leaves)

        rb_state = rb.state_dict()
        other = self._filled(dtype)
        other.update_priority(torch.arange(4), torch.ones(4))
        other.load_state_dict(pickle.loads(pickle.dumps(rb_state)))
        np.testing.assert_array_equal(other._sampler._sum_tree.values(), sum_leaves)
        np.testing.assert_array_equal(other._sampler._min_tree.values(), min_leaves)
        clone = copy.deepcopy(sampler)
        np.testing.assert_array_equal(clone._sum_tree.values(), sum_leaves)
        assert type(clone._sum_tree) is type(sampler._sum_tree)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_dumps_loads(self, installed, tmp_path, dtype):
        rb = self._filled(dtype)
        sampler = rb._sampler
        with warnings.catch_warnings():
            # Reading back the min tree's identity (FLT_MAX / DBL_MAX) must not overflow.
            warnings.simplefilter("error")
            rb.dumps(tmp_path)
            other = self._filled(dtype)
            other.update_priority(torch.arange(4), torch.ones(4))
            other.loads(tmp_path)
        # torchrl's dumps builds its float64 memmaps from torch.as_tensor(list of floats),
        # a float32 tensor: fp64 leaves are rounded to float32 and DBL_MAX becomes inf.
        # loads then writes inf into the min tree, which accepts it (only NaN is refused).
        identity = FLT_MAX if dtype == torch.float32 else math.inf
        mintree = np.fromfile(tmp_path / "sampler" / "mintree.memmap", dtype=np.float64)
        sumtree = np.fromfile(tmp_path / "sampler" / "sumtree.memmap", dtype=np.float64)
        sum_leaves = sampler._sum_tree.values().astype(np.float32).astype(np.float64)
        min_leaves = sampler._min_tree.values()[:4].astype(np.float32).astype(np.float64)
        np.testing.assert_array_equal(sumtree, sum_leaves)
        np.testing.assert_array_equal(mintree, [*min_leaves, identity, identity])
        with open(tmp_path / "sampler" / "sampler_metadata.json") as file:
            assert json.load(file)["_max_capacity"] == 6
        loaded = other._sampler
        np.testing.assert_array_equal(loaded._sum_tree.values(), sum_leaves)
        np.testing.assert_array_equal(loaded._min_tree.values(), [*min_leaves, identity, identity])
        assert loaded._min_tree.query(0, 6) == min_leaves.min()
        assert loaded._sum_tree.query(0, 6) == pytest.approx(sum_leaves.sum(), rel=1e-6)
        index, info = other.sample(32, return_info=True)
        assert index.shape == (32,) and int(index.max()) < 4


# =============================================================================
# Fresh interpreters: before import, torchrl missing, start-up hook
# =============================================================================
class TestFreshInterpreter:
    def test_before_import_torchrl(self):
        # Where torchrl's own trees load, the finder hands them to torchrl, and only
        # replace=True (here called after the import) puts ours in their place.
        out = _run(
            f"""
            import sys, importlib.util
            import torchrl_compat_trees
            assert torchrl_compat_trees.install_segment_trees(strict=True) is True
            assert "torch" not in sys.modules and "torchrl" not in sys.modules
            import torchrl
            spec = importlib.util.find_spec("torchrl._torchrl")
            print("LOADER", type(spec.loader).__name__)
            from torchrl.data.replay_buffers import samplers
            import replay
            if {torchrl_trees_load()}:
                assert torchrl_compat_trees.own_trees().SumSegmentTreeFp32 is samplers.SumSegmentTreeFp32
                assert torchrl_compat_trees.install_segment_trees() is False
                assert torchrl_compat_trees.install_segment_trees(replace=True) is True
            assert samplers.SumSegmentTreeFp32 is replay.SumSegmentTreeFp32
            assert samplers.MinSegmentTreeFp64 is replay.MinSegmentTreeFp64
            assert sys.modules["torchrl._torchrl"].__spec__.origin == "replay"
            """,
            _USE_PRIORITIZED_SAMPLER
        )
        assert "LOADER _TreesLoader" in out
        assert "SAMPLE [2]" in out

    def test_torchrl_missing(self):
        out = _run(
            """
            import sys
            class Block:
                def __init__(self, names): self.names = names
                def find_spec(self, name, path=None, target=None):
                    if name.split(".")[0] in self.names:
                        raise ModuleNotFoundError(f"No module named {name!r}")
            sys.meta_path.insert(0, Block({"torchrl"}))
            import torchrl_compat_trees as t
            assert t.install_segment_trees() is False
            try:
                t.install_segment_trees(strict=True)
            except ImportError as err:
                print("STRICT", err)
            assert not any(type(f).__name__ == "_TreesFinder" for f in sys.meta_path)
            sys.meta_path[0] = Block({"replay"})
            assert t.install_segment_trees() is False
            try:
                t.install_segment_trees(strict=True)
            except ImportError as err:
                print("STRICT", err)
            """
        )
        assert "STRICT install_segment_trees(strict=True): torchrl is not installed" in out
        assert "the 'replay' extension is not importable" in out

    @pytest.fixture(scope="class")
    @classmethod
    def site_dir(cls, tmp_path_factory):
        """What pip installs (torchrl_compat_trees.pth included)."""
        site = tmp_path_factory.mktemp("site")
        site_dir_like_pip(site)
        return site

    def test_installed_pth_is_the_hook(self, site_dir):
        with open(os.path.join(ROOT, "torchrl_compat_trees.pth"), "rb") as file:
            source = file.read()
        with open(site_dir / "torchrl_compat_trees.pth", "rb") as file:
            assert file.read() == source
        assert (site_dir / "torchrl_compat_trees.py").is_file()
        lines = [line for line in source.decode().splitlines() if line.strip()]
        # site only executes .pth lines that start with "import".
        assert len(lines) == 1 and lines[0].startswith("import ")
        assert "torchrl_compat_trees" in lines[0]
        # One switch per variable, and the .pth and install_from_env agree on what leaves
        # each off.
        switches = re.findall(r'os\.environ\.get\("(\w+)", ""\)\.strip\(\)\.lower\(\) not in (\([^)]*\))', lines[0])
        assert [name for name, _ in switches] == [ENV_VAR, torchrl_compat_trees.INSTALL_ENV_VAR]
        for _, off in switches:
            assert ast.literal_eval(off) == torchrl_compat_trees._OFF_VALUES

    def test_hook_on(self, site_dir):
        # site.addsitedir processes the .pth exactly as start-up does for site-packages. The
        # variable is set only then: with it set at start-up, a hook installed in this
        # interpreter's site-packages (pip install -e .) would run first.
        out = _run(
            f"""
            import os, site, sys
            assert "torchrl_compat_trees" not in sys.modules
            os.environ[{ENV_VAR!r}] = "1"
            site.addsitedir({str(site_dir)!r})
            assert "torch" not in sys.modules
            assert type(sys.meta_path[0]).__name__ == "_TreesFinder"
            assert sys.modules["torchrl_compat_trees"].__file__.startswith({str(site_dir)!r})
            """,
            _USE_PRIORITIZED_SAMPLER,
            cwd=site_dir,
        )
        assert "SAMPLE [2]" in out

    @pytest.mark.parametrize("value", [None, "0", "off"])
    def test_hook_off_imports_nothing(self, site_dir, value):
        out = _run(
            f"""
            import site, sys
            site.addsitedir({str(site_dir)!r})
            print("TORCH", "torch" in sys.modules, "HOOK", "torchrl_compat_trees" in sys.modules)
            print("FINDER", any(type(f).__name__ == "_TreesFinder" for f in sys.meta_path))
            """,
            env_update={} if value is None else {ENV_VAR: value},
            cwd=site_dir,
        )
        assert "TORCH False HOOK False" in out
        assert "FINDER False" in out

    def test_hook_module_directly(self):
        out = _run(
            """
            import sys
            import torchrl_compat_trees
            assert torchrl_compat_trees.install_from_env() is True
            assert "torch" not in sys.modules
            """,
            _USE_PRIORITIZED_SAMPLER,
            env_update={ENV_VAR: "1"},
        )
        assert "SAMPLE [2]" in out
