"""Writes the torchrl 0.14 prioritized-sampler golden files: ``golden_prioritized_sampler_014/``
(what ``PrioritizedSampler.dumps`` writes, schema version 1), ``golden_prioritized_sampler_014.pt``
(its ``state_dict``) and ``golden_prioritized_sampler_014.json`` (the draws torchrl makes after
loading them, with ``np.random.seed(0)``).

Run in an environment with torchrl 0.14.x, from the repository root:

    PYTHONPATH=$PWD python tests/data/make_golden_prioritized_014.py

torchrl 0.14's compiled trees load only on the torch it was built for, so the sampler runs on
``replay``'s trees (``install_segment_trees``); the files hold leaf values and metadata, which do
not depend on the tree classes.
"""
import json
import os
import shutil
import sys

import numpy as np
import torch

import torchrl_compat

torchrl_compat.install_segment_trees()

from torchrl.data.replay_buffers import LazyTensorStorage, PrioritizedSampler  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CAPACITY = 24


def make_sampler():
    sampler = PrioritizedSampler(CAPACITY, alpha=0.7, beta=0.4, max_priority_within_buffer=True)
    generator = torch.Generator().manual_seed(14)
    sampler.update_priority(torch.arange(20), torch.rand(20, generator=generator, dtype=torch.float64) * 5)
    sampler.update_priority(torch.tensor([3, 7]), torch.tensor([9.0, 0.0]))
    sampler.mark_update(torch.arange(20, 24))
    sampler.alpha = 0.6  # re-transformed in 0.14
    return sampler


def draws(sampler):
    storage = LazyTensorStorage(CAPACITY)
    storage.set(torch.arange(CAPACITY), torch.arange(CAPACITY))
    np.random.seed(0)
    index, info = sampler.sample(storage, 64)
    return {"index": index.tolist(), "priority_weight": info["priority_weight"].double().tolist()}


if __name__ == "__main__":
    import torchrl

    if not torchrl.__version__.startswith("0.14"):
        sys.exit(f"needs torchrl 0.14, found {torchrl.__version__}")
    sampler = make_sampler()
    target = os.path.join(HERE, "golden_prioritized_sampler_014")
    shutil.rmtree(target, ignore_errors=True)
    sampler.dumps(target)
    torch.save(sampler.state_dict(), os.path.join(HERE, "golden_prioritized_sampler_014.pt"))
    loaded = PrioritizedSampler(CAPACITY, alpha=0.7, beta=0.4, max_priority_within_buffer=True)
    loaded.loads(target)
    with open(os.path.join(HERE, "golden_prioritized_sampler_014.json"), "w") as file:
        json.dump(
            {
                "_made_with": {"torchrl": torchrl.__version__, "torch": torch.__version__},
                "max_priority": [float(v) for v in sampler._max_priority],
                "draws_after_loads": draws(loaded),
            },
            file,
            indent=1,
        )
    print("wrote", target)
