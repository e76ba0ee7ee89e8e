"""torchrl 0.14's three sequence-boundary benchmarks (pytorch/rl
``benchmarks/test_replaybuffer_benchmark.py``, 0.14 branch): torchrl 0.14.1's own classes
(not installed) against ours, side by side in one group each.

- ``sequence_boundary_query``: ``Sequence(length=64, burn_in=40, bootstrap=5).expand`` of 256
  anchors spread over a full ``LazyTensorStorage`` of 10^4 or 10^6 rows (episodes of 32 or 256
  rows), with the boundary cache hot, or after ``_bump_mutation_revision()`` (what a write does);
- ``sequence_multidimensional_boundary_query``: the same unit over a [10^5, lanes] storage;
- ``replay_boundary_kernel``: ``_boundary_distances_1d`` over 3,907 trajectories of 10^6 rows
  (torchrl's searchsorted query, and ours that ``install()`` puts in its place).

Needs torchrl 0.14 (skipped otherwise). The ratios: ``python bench/ratios.py FILE.json``.
"""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import torchrl_compat
from torchrl_compat.samplers import _boundary_queries

torchrl_units = pytest.importorskip("torchrl.data.replay_buffers.sample_units")
import torchrl.data as torchrl_data  # noqa: E402
from torchrl.data.replay_buffers import utils as torchrl_utils  # noqa: E402

from torchrl_compat import sample_units as our_units  # noqa: E402

SIDES = {
    "torchrl": (torchrl_data, torchrl_units.Sequence),
    "replay": (torchrl_compat, our_units.Sequence),
}


def _unit(cls):
    return cls(length=64, burn_in=40, bootstrap=5)


def _boundary_buffer(namespace, size, episode_length):
    done = torch.zeros(size, 1, dtype=torch.bool)
    done[episode_length - 1 :: episode_length] = True
    done[-1] = True
    rb = namespace.TensorDictReplayBuffer(storage=namespace.LazyTensorStorage(size))
    rb.extend(TensorDict({("next", "done"): done}, [size]))
    return rb


@pytest.mark.parametrize("side", list(SIDES))
@pytest.mark.parametrize("cache_state", ["hot", "write_invalidated"])
@pytest.mark.parametrize("episode_length", [32, 256])
@pytest.mark.parametrize("size", [10_000, 1_000_000])
def test_sequence_boundary_query(benchmark, size, episode_length, cache_state, side):
    benchmark.group = f"sequence_boundary_query size={size} episode={episode_length} {cache_state}"
    namespace, cls = SIDES[side]
    rb = _boundary_buffer(namespace, size, episode_length)
    anchor = torch.linspace(0, size - 1, 256).to(torch.long)
    unit = _unit(cls)
    unit.expand(anchor, {}, rb.storage)
    if cache_state == "write_invalidated":

        def query():
            rb.storage._bump_mutation_revision()
            return unit.expand(anchor, {}, rb.storage)

    else:

        def query():
            return unit.expand(anchor, {}, rb.storage)

    index, info = benchmark(query)
    assert index.shape == (256 * 109,) and info["validity_mask"].shape == index.shape


@pytest.mark.parametrize("side", list(SIDES))
@pytest.mark.parametrize("lanes", [8, 64])
def test_sequence_multidimensional_boundary_query(benchmark, lanes, side):
    benchmark.group = f"sequence_multidimensional_boundary_query lanes={lanes}"
    namespace, cls = SIDES[side]
    time = 100_000
    done = torch.zeros(time, lanes, 1, dtype=torch.bool)
    done[255::256] = True
    done[-1] = True
    rb = namespace.TensorDictReplayBuffer(storage=namespace.LazyTensorStorage(time * lanes, ndim=2), dim_extend=0)
    rb.extend(TensorDict({("next", "done"): done}, [time, lanes]))
    anchors = (torch.linspace(0, time - 1, 256).to(torch.long), torch.arange(256) % lanes)
    unit = _unit(cls)
    unit.expand(anchors, {}, rb.storage)
    index, info = benchmark(unit.expand, anchors, {}, rb.storage)
    assert len(index) == 2 and index[0].shape == (256 * 109,)


@pytest.mark.parametrize(
    "side, query",
    [("torchrl", torchrl_utils._boundary_distances_1d), ("replay", _boundary_queries._boundary_distances_1d)],
    ids=["torchrl", "replay"],
)
def test_replay_boundary_kernel(benchmark, side, query):
    benchmark.group = "replay_boundary_kernel"
    size, episode_length = 1_000_000, 256
    stop = torch.arange(episode_length - 1, size, episode_length, dtype=torch.long)
    if stop[-1] != size - 1:
        stop = torch.cat([stop, stop.new_tensor([size - 1])])
    start = torch.remainder(torch.roll(stop, 1) + 1, size)
    anchor = torch.linspace(0, size - 1, 256).to(torch.long)
    from_start, to_stop = benchmark(query, anchor, start, stop, size)
    assert from_start.dtype == torch.long and to_stop.shape == anchor.shape
