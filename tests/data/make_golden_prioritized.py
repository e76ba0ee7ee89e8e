"""Writes golden_prioritized_capacity.json: what torchrl 0.11's own prioritized samplers, on
torchrl's compiled segment trees, draw when the storage is longer than the sampler.

Run with a torch on which ``torchrl._torchrl`` loads (torch 2.9.x):

    python tests/data/make_golden_prioritized.py

The scenarios are in ``tests/test_samplers_capacity.py`` (``SCENARIOS``), which replays them
on torchrl_compat's samplers and compares with this file.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the tests directory

import torch  # noqa: E402
from torchrl import _torchrl  # noqa: E402,F401  (fails here when torchrl's trees do not load)
from torchrl.data.replay_buffers import samplers as torchrl_samplers  # noqa: E402

from test_samplers_capacity import SCENARIOS, run_scenario  # noqa: E402

if __name__ == "__main__":
    out = {name: run_scenario(name, torchrl_samplers) for name in SCENARIOS}
    out["_made_with"] = {"torch": torch.__version__}
    with open(os.path.join(HERE, "golden_prioritized_capacity.json"), "w") as file:
        json.dump(out, file, indent=1, sort_keys=True)
    print("wrote", sorted(out))
