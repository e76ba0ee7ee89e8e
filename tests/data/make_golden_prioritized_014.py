"""Writes the torchrl 0.14 prioritized-sampler golden files: ``golden_prioritized_sampler_014/``
(what ``PrioritizedSampler.dumps`` writes, schema version 1), ``golden_prioritized_sampler_014.pt``
(its ``state_dict``) and ``golden_prioritized_sampler_014.json`` (the draws torchrl makes after
loading them, with ``np.random.seed(0)``).

Run with torchrl 0.14.1 on a torch its compiled trees load with (torch 2.15.0 or 2.14.1:
``make test-native-trees`` makes that environment), from the repository root:

    PYTHONPATH=$PWD python tests/data/make_golden_prioritized_014.py [--out DIR]

The sampler runs on torchrl's own compiled trees (the draws are theirs, and the ``state_dict``
pickles those trees); the script refuses to run where they do not load, rather than make the
draws on ``replay``'s. ``--out`` (default: this folder) is where the files go;
``tests/test_native_tree_differential.py`` makes them again in a temporary folder and compares.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch

try:
    from torchrl._torchrl import SumSegmentTreeFp32
except ImportError as err:
    sys.exit(f"torchrl's own compiled trees do not load with torch {torch.__version__} ({err}): "
             "these goldens are made on them (torch 2.15.0 + torchrl 0.14.1, make test-native-trees)")

from torchrl.data.replay_buffers import LazyTensorStorage, PrioritizedSampler  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CAPACITY = 24


def make_sampler():
    sampler = PrioritizedSampler(CAPACITY, alpha=0.7, beta=0.4, max_priority_within_buffer=True)
    generator = torch.Generator().manual_seed(14)
    # float32 priorities: torchrl's compiled fp32 trees refuse float64 ones (torchrl's bug)
    priority = (torch.rand(20, generator=generator, dtype=torch.float64) * 5).to(torch.float32)
    sampler.update_priority(torch.arange(20), priority)
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=HERE, help="the folder the files go to")
    out = parser.parse_args().out
    sampler = make_sampler()
    assert type(sampler._sum_tree) is SumSegmentTreeFp32, type(sampler._sum_tree)
    target = os.path.join(out, "golden_prioritized_sampler_014")
    shutil.rmtree(target, ignore_errors=True)
    sampler.dumps(target)
    torch.save(sampler.state_dict(), os.path.join(out, "golden_prioritized_sampler_014.pt"))
    loaded = PrioritizedSampler(CAPACITY, alpha=0.7, beta=0.4, max_priority_within_buffer=True)
    loaded.loads(target)
    with open(os.path.join(out, "golden_prioritized_sampler_014.json"), "w") as file:
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
