"""Prioritized samplers smaller than their storage, inside torchrl 0.11's own replay buffers.

torchrl's segment trees hold ``capacity`` leaves (the power of two above ``max_capacity``), and
torchrl's ``PrioritizedSampler`` writes and draws any leaf below it. Its buffers rely on it: a
``TensorDictReplayBuffer`` on its default ``ListStorage(1000)`` with ``PrioritizedSampler(5)``,
extended with 3 then 5 items, updates indices 3..7; a ``PrioritizedSliceSampler(149)`` on a
storage of 150 gets index 149.

The reference is torchrl's own samplers on torchrl's compiled trees (fp32 trees: torchrl's
fp64 trees refuse the float32 priorities of ``mark_update`` and the float32 masses of a seeded
draw, so no buffer can drive them). Where those trees load (torch 2.9 with torchrl 0.11, torch
2.15 with 0.14.1: make test-matrix), a fresh interpreter draws it on the spot; elsewhere
``golden_prioritized_capacity.json`` holds what they drew on torch 2.9 (written by
``tests/data/make_golden_prioritized.py``; the last bits of its float32 weights and leaves
depend on the machine, see ``_assert_same``). The tests replay the scenarios on
``torchrl_compat``'s samplers (on any torch) and on torchrl's samplers with ``replay``'s trees
installed as torchrl's (``install_segment_trees``), and compare.
"""
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from native_trees import torchrl_trees_load

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "data", "golden_prioritized_capacity.json")
REFERENCE_PYTHON = "/opt/ref291/bin/python"  # torch 2.9.1, where torchrl's trees load


def _floats(tensor):
    if isinstance(tensor, tuple):  # the slice samplers' (index,)
        tensor = torch.stack(tensor, -1)
    return [float(x) for x in torch.as_tensor(tensor).reshape(-1).tolist()]


def _state(sampler):
    capacity = sampler._sum_tree.capacity
    max_priority = [None if x is None else float(x) for x in sampler._max_priority]
    return {
        "capacity": capacity,
        "sum_leaves": [float(sampler._sum_tree[i]) for i in range(capacity)],
        "min_leaves": [float(sampler._min_tree[i]) for i in range(capacity)],
        "max_priority": max_priority,
    }


def _list_storage_3_then_5(samplers, dtype=torch.float32):
    """TensorDictReplayBuffer on its default ListStorage(1000), PrioritizedSampler(5)."""
    from torchrl.data import TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(
        sampler=samplers.PrioritizedSampler(5, alpha=0.7, beta=0.5, dtype=dtype),
        batch_size=16,
        generator=torch.Generator().manual_seed(0),
    )
    record = {"draws": []}
    # torchrl's fp64 trees take float64 priorities only
    rb.extend(TensorDict({"obs": torch.arange(3.0), "td_error": torch.tensor([1.0, 4.0, 2.0], dtype=dtype)}, [3]))
    rb.extend(
        TensorDict({"obs": torch.arange(3.0, 8.0), "td_error": torch.tensor([0.5, 3.0, 6.0, 1.5, 2.5], dtype=dtype)}, [5])
    )
    for step in range(3):
        sample, info = rb.sample(return_info=True)
        record["draws"].append({"index": _floats(info["index"]), "weight": _floats(info["priority_weight"])})
        sample.set("td_error", (torch.arange(16.0) / 4 + step).to(dtype))
        rb.update_tensordict_priority(sample)
    record["state"] = _state(rb._sampler)
    return record


def _tensor_storage_past_max_capacity(samplers, dtype=torch.float32, device="cpu"):
    """ReplayBuffer on LazyTensorStorage(8) with PrioritizedSampler(6): indices 6 and 7."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    rb = ReplayBuffer(
        storage=LazyTensorStorage(8, device=device),
        sampler=samplers.PrioritizedSampler(6, alpha=1.0, beta=0.4, dtype=dtype, max_priority_within_buffer=True),
        batch_size=10,
        generator=torch.Generator().manual_seed(1),
    )
    index = rb.extend(torch.arange(8.0, device=device))
    rb.update_priority(index, torch.tensor([1.0, 0.0, 2.0, 3.0, 0.5, 1.0, 9.0, 4.0], dtype=dtype))
    record = {"draws": []}
    for _ in range(2):
        _, info = rb.sample(return_info=True)
        record["draws"].append({"index": _floats(info["index"]), "weight": _floats(info["priority_weight"])})
    rb.update_priority(torch.tensor([6]), torch.tensor([0.25], dtype=dtype))  # the largest one, overwritten
    _, info = rb.sample(return_info=True)
    record["draws"].append({"index": _floats(info["index"]), "weight": _floats(info["priority_weight"])})
    record["state"] = _state(rb._sampler)
    return record


def _slice_sampler_149(samplers, dtype=torch.float32):
    """TensorDictReplayBuffer on LazyTensorStorage(150), PrioritizedSliceSampler(149)."""
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(150),
        sampler=samplers.PrioritizedSliceSampler(
            max_capacity=149, alpha=0.8, beta=0.6, dtype=dtype, num_slices=4, traj_key="episode"
        ),
        batch_size=20,
        generator=torch.Generator().manual_seed(2),
    )
    episode = torch.arange(150) // 10
    rb.extend(TensorDict({"obs": torch.arange(150.0), "episode": episode, "td_error": (torch.arange(150) % 7).float()}, [150]))
    rb.update_priority(torch.arange(150), ((torch.arange(150) % 7) + 0.5).to(dtype))
    record = {"draws": []}
    for _ in range(3):
        _, info = rb.sample(return_info=True)
        record["draws"].append({"index": _floats(info["index"]), "weight": _floats(info["priority_weight"])})
    record["state"] = _state(rb._sampler)
    return record


SCENARIOS = {
    "list_storage_3_then_5": _list_storage_3_then_5,
    "tensor_storage_past_max_capacity": _tensor_storage_past_max_capacity,
    "slice_sampler_149": _slice_sampler_149,
}


def run_scenario(name, samplers):
    return SCENARIOS[name](samplers)


def _golden():
    with open(GOLDEN) as file:
        return json.load(file)


def _draws_in_a_fresh_interpreter(python, prelude):
    """Every scenario run by torchrl's samplers in a fresh ``python`` after ``prelude``."""
    code = (
        "import json, sys; sys.path[:0] = [{root!r}, {here!r}];" + prelude +
        "from torchrl.data.replay_buffers import samplers;"
        "from test_samplers_capacity import SCENARIOS, run_scenario;"
        "print(json.dumps({{n: run_scenario(n, samplers) for n in SCENARIOS}}))"
    ).format(root=os.path.dirname(HERE), here=HERE)
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# torchrl's own compiled trees, imported first: the draws are theirs
ON_TORCHRLS_TREES = "from torchrl import _torchrl;"

_REFERENCE = {}


def _reference():
    """What torchrl's own samplers on its compiled trees draw: on this torch where they load,
    else the golden file."""
    if not _REFERENCE:
        _REFERENCE.update(_draws_in_a_fresh_interpreter(sys.executable, ON_TORCHRLS_TREES)
                          if torchrl_trees_load() else _golden())
    return _REFERENCE


def _assert_same(got, expected, *, exact=True):
    """Draws and trees equal to the bit, or (``exact=False``, against the golden file, which
    another machine wrote) to within 2 float32 ulps in the weights and leaves: torch's and
    numpy's vectorised ``pow`` differ by an ulp between instruction sets (AVX-512 against
    AVX2), for torchrl as for us. The indices drawn are always the same."""

    def close(a, b):
        if exact:
            assert a == b
        else:
            np.testing.assert_array_max_ulp(np.float32(a), np.float32(b), maxulp=2)

    assert len(got["draws"]) == len(expected["draws"])
    for a, b in zip(got["draws"], expected["draws"]):
        assert a["index"] == b["index"]
        close(a["weight"], b["weight"])
    got_state, expected_state = dict(got["state"]), dict(expected["state"])
    for key in ("sum_leaves", "min_leaves"):
        close(got_state.pop(key), expected_state.pop(key))
    assert got_state == expected_state


def _assert_draws_torchrls(got, name):
    """``got`` against torchrl's own draws of scenario ``name``: drawn on this machine, to the
    bit; from the golden file (another machine wrote it), to within its ulps."""
    _assert_same(got, _reference()[name], exact=torchrl_trees_load())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_ours_draw_what_torchrl_draws(name):
    import torchrl_compat.samplers as ours

    _assert_draws_torchrls(run_scenario(name, ours), name)


def test_torchrl_on_replays_trees_draws_what_it_draws_on_its_own():
    """torchrl's own samplers with replay's trees standing in for its compiled ones
    (``install_segment_trees``, in a fresh interpreter)."""
    got = _draws_in_a_fresh_interpreter(
        sys.executable,
        "import torchrl_compat_trees; assert torchrl_compat_trees.install_segment_trees(replace=True);"
        "from torchrl.data.replay_buffers import samplers;"
        "assert samplers.SumSegmentTreeFp32.__module__ == 'replay';",
    )
    import torchrl_compat.samplers as ours

    for name in SCENARIOS:
        # on this machine, to the bit; against torchrl's own draws (the golden file's within its ulps)
        _assert_same(got[name], json.loads(json.dumps(run_scenario(name, ours))))
        _assert_draws_torchrls(got[name], name)


@pytest.mark.skipif(not os.path.exists(REFERENCE_PYTHON), reason="needs torch 2.9, where torchrl's trees load")
def test_golden_file_is_what_torchrl_draws_today():
    """Regenerates the golden scenarios with torchrl's compiled trees and compares (the
    golden file came from another machine: within its ulps, the indices to the bit)."""
    fresh = _draws_in_a_fresh_interpreter(REFERENCE_PYTHON, ON_TORCHRLS_TREES)
    golden = _golden()
    for name in SCENARIOS:
        _assert_same(fresh[name], golden[name], exact=False)


# ---------------------------------------------------------------------------- beyond torchrl


def test_index_past_the_capacity_raises_and_changes_nothing():
    """Where torchrl writes outside its trees: a clear IndexError, the sampler unchanged."""
    import torchrl_compat.samplers as ours
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyTensorStorage(12), sampler=ours.PrioritizedSampler(5, 0.7, 0.5), batch_size=4)
    rb.extend(torch.arange(8.0))
    before = _state(rb._sampler)
    with pytest.raises(IndexError, match="index 8 at position 0 is out of range for max_capacity=5: the priority trees hold 8 leaves"):
        rb.extend(torch.arange(8.0, 12.0))
    assert _state(rb._sampler) == before
    with pytest.raises(IndexError, match="index 9 at position 1"):
        rb._sampler.update_priority(torch.tensor([1, 9]), torch.tensor([1.0, 1.0]))
    assert _state(rb._sampler) == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_storage_draws_what_torchrl_draws():
    """A CUDA storage: the priorities move to torch-op trees on the GPU, same draws."""
    import torchrl_compat.samplers as ours

    got = _tensor_storage_past_max_capacity(ours, device="cuda")
    expected = _reference()["tensor_storage_past_max_capacity"]
    # the same draws; the weights to the device's rounding of pow
    for a, b in zip(got["draws"], expected["draws"], strict=True):
        assert a["index"] == b["index"]
        assert a["weight"] == pytest.approx(b["weight"], rel=1e-6)
    assert got["state"] == expected["state"]


def test_smaller_sampler_is_reported_once(caplog):
    import torchrl_compat.samplers as ours
    from torchrl.data import ListStorage, ReplayBuffer

    rb = ReplayBuffer(storage=ListStorage(100), sampler=ours.PrioritizedSampler(5, 0.7, 0.5), batch_size=4)
    rb.extend(torch.arange(5.0))
    # torchrl's logger (which torchrl keeps from propagating to the root's handlers)
    torchrl_logger = logging.getLogger("torchrl")
    torchrl_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger="torchrl"):
            rb.sample()
            assert not caplog.records  # not longer than the sampler yet
            rb.extend(torch.arange(3.0))
            for _ in range(3):
                rb.sample()
    finally:
        torchrl_logger.removeHandler(caplog.handler)
    records = [r for r in caplog.records if r.name == "torchrl"]
    assert len(records) == 1
    message = records[0].getMessage()
    assert "PrioritizedSampler(max_capacity=5) samples a storage of 8 items" in message
    assert "hold 8 leaves" in message


@pytest.mark.parametrize("use_cpu_kernels", [True, False])
def test_torch_op_trees_follow_the_same_rules(use_cpu_kernels):
    """The accelerator path (torch-op trees), run on CPU, gives the kernels' results."""
    import torchrl_compat.samplers as ours

    class Accelerated:
        PrioritizedSampler = type("PrioritizedSampler", (ours.PrioritizedSampler,), {"_use_cpu_kernels": use_cpu_kernels})
        PrioritizedSliceSampler = type(
            "PrioritizedSliceSampler", (ours.PrioritizedSliceSampler,), {"_use_cpu_kernels": use_cpu_kernels}
        )

    import torchrl_compat.samplers as kernels

    for name in SCENARIOS:
        _assert_same(run_scenario(name, Accelerated), run_scenario(name, kernels))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_moving_the_trees_keeps_the_leaves_past_max_capacity(dtype):
    """The trees move between kinds (replay's on CPU, torch ops elsewhere) with every leaf,
    those past max_capacity included, and the same draws follow."""
    import torchrl_compat.samplers as ours
    from torchrl.data import LazyTensorStorage

    storage = LazyTensorStorage(8)
    storage.set(torch.arange(8), torch.arange(8.0))
    sampler = ours.PrioritizedSampler(5, 0.8, 0.5, dtype=dtype)
    sampler.update_priority(torch.arange(8), torch.arange(1.0, 9.0, dtype=dtype))
    before = _state(sampler)
    sampler._rng = torch.Generator().manual_seed(4)
    expected = sampler.sample(storage, 32)
    sampler._use_cpu_kernels = False
    sampler._rng = torch.Generator().manual_seed(4)
    got = sampler.sample(storage, 32)  # moves the priorities first
    assert type(sampler._sum_tree).__module__ == "torchrl_compat._torch_ops.sumtree"
    assert _state(sampler) == before
    assert torch.equal(got[0], expected[0])
    torch.testing.assert_close(got[1]["priority_weight"], expected[1]["priority_weight"])
