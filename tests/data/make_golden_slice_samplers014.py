"""Writes the torchrl 0.14.1 golden files of ``SliceSamplerWithoutReplacement``, part-way through
an epoch of its trajectory permutation (2 of 8 trajectories sampled):
``golden_trl014_slice_without_replacement/`` (what its ``dumps`` writes),
``golden_trl014_slice_without_replacement.pt`` (its ``state_dict``) and
``golden_trl014_slice_without_replacement.json`` (the sampler's state and the slices torchrl
samples after loading them). ``SliceSampler`` writes no files and has an empty ``state_dict``
in every release, so it has none.

Run once, from the repository root, with torchrl 0.14.1 (tensordict 0.14.3):

    build/venv-torchrl-0.14/bin/python tests/data/make_golden_slice_samplers014.py

The storage holds fixed trajectories (``trajectories``), and the permutation comes from
``torch.manual_seed(SEED)``, so the files are the same at every run. ``next_slices`` seeds the
global RNG the slice starts are drawn from, so a loaded sampler of another library can be
asked for the same batches.
"""
import json
import pathlib
import shutil

import torch
import torchrl
from tensordict import TensorDict
from torchrl.data.replay_buffers import LazyTensorStorage, SliceSamplerWithoutReplacement

HERE = pathlib.Path(__file__).parent
NAME = "golden_trl014_slice_without_replacement"
LENGTHS = (4, 6, 4, 8, 6, 4, 6, 4)  # 8 trajectories, 42 steps
SEED = 14
SAMPLER_KWARGS = {"num_slices": 2, "traj_key": "episode", "strict_length": False}
BATCH_SIZE = 8  # 2 slices of 4 steps


def trajectories(storage_class=LazyTensorStorage):
    """A storage of 42 steps: trajectory ``k`` has ``LENGTHS[k]`` steps, ``obs`` counts them."""
    episode = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    data = TensorDict({"episode": episode, "obs": torch.arange(episode.numel())}, [episode.numel()])
    storage = storage_class(episode.numel())
    storage.set(torch.arange(episode.numel()), data)
    return storage


def slices(sampler, storage, calls):
    """``calls`` batches of slices, as lists of the sampled ``obs``."""
    return [storage[sampler.sample(storage, BATCH_SIZE)[0]]["obs"].tolist() for _ in range(calls)]


def next_slices(sampler, storage):
    """The next two batches (four of the six trajectories left), seeded. The epoch does not
    end there: torchrl then draws the next permutation, which ours draws otherwise (another
    permutation, from other random numbers)."""
    torch.manual_seed(SEED + 1)
    return slices(sampler, storage, 2)


def main():
    assert torchrl.__version__.startswith("0.14."), torchrl.__version__
    storage = trajectories()
    sampler = SliceSamplerWithoutReplacement(**SAMPLER_KWARGS)
    torch.manual_seed(SEED)
    slices(sampler, storage, 1)  # 2 of the 8 trajectories sampled
    target = HERE / NAME
    shutil.rmtree(target, ignore_errors=True)
    sampler.dumps(target)
    state = sampler.state_dict()
    torch.save(state, HERE / f"{NAME}.pt")
    record = {
        "state": {key: value.tolist() if isinstance(value, torch.Tensor) else value for key, value in state.items()},
        # the next two batches, their slice starts drawn after torch.manual_seed(SEED + 1)
        "next_slices": next_slices(sampler, storage),
    }
    (HERE / f"{NAME}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
