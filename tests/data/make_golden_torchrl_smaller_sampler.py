"""Writes ``golden_torchrl_smaller_sampler.json``: what torchrl 0.11.0's own buffers draw, on
torchrl's own compiled trees, when a prioritized sampler is smaller than its storage
(``sampler_smaller_than_storage`` in ``tests/test_torchrl_matrix_more.py``, run with torchrl's
classes from the same seeds as there).

For ``PrioritizedSampler`` and ``PrioritizedSliceSampler``, the index and ``priority_weight`` of
``sample 0``, ``sample 1``, ``sample 2`` and ``sample after update``, as that test reads them
(weights as float32 values written exactly).

Run with torchrl 0.11.0 on torch 2.9.1, where its compiled trees load (``make
test-native-trees`` makes that environment), from the repository root:

    PYTHONPATH=$PWD python tests/data/make_golden_torchrl_smaller_sampler.py [--out DIR]

It refuses to run where torchrl's trees do not load: there torchrl's samplers would run on
``replay``'s, and the file would hold our draws. ``--out`` (default: this folder) is where the
file goes; ``tests/test_native_tree_differential.py`` makes it again and compares.
"""
import argparse
import json
import os
import sys
import tempfile

import torch

try:
    from torchrl._torchrl import SumSegmentTreeFp32, SumSegmentTreeFp64
except ImportError as err:
    sys.exit(f"torchrl's own compiled trees do not load with torch {torch.__version__} ({err}): "
             "this golden is made on them (torch 2.9.1 + torchrl 0.11.0, make test-native-trees)")

import torchrl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from test_torchrl_matrix_more import sampler_smaller_than_storage  # noqa: E402
from torchrl_matrix_support import run  # noqa: E402

RELEASE = "0.11.0"
LABELS = ("sample 0", "sample 1", "sample 2", "sample after update")
SAMPLERS = ("PrioritizedSampler", "PrioritizedSliceSampler")


def draws(sampler):
    """The scenario with torchrl's own classes (nothing of ours installed), read as the test
    reads it."""
    import torchrl.data.replay_buffers.samplers as samplers

    assert samplers.SumSegmentTreeFp32 is SumSegmentTreeFp32, samplers.SumSegmentTreeFp32
    with tempfile.TemporaryDirectory() as tmp:
        record = run(sampler_smaller_than_storage, tmp, sampler=sampler)
    steps = {label: (value, message) for label, value, message in record.steps}
    out = []
    for label in LABELS:
        value, message = steps[label]
        if message is not None:
            sys.exit(f"{sampler}, {label}: torchrl raised {message}")
        info = dict(value[1][1][1])
        index = info["index"][1][0][1] if info["index"][0] == "tuple" else info["index"][1]
        weight = info["priority_weight"][1]
        out.append({"label": label, "index": index.tolist(), "priority_weight": weight.tolist(),
                    "priority_weight_dtype": str(weight.dtype).replace("torch.", "")})
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=HERE, help="the folder the file goes to")
    out = parser.parse_args().out
    if torchrl.__version__ != RELEASE:
        sys.exit(f"needs torchrl {RELEASE}, found {torchrl.__version__}")
    golden = {"_made_with": {"torchrl": torchrl.__version__, "torch": torch.__version__.split("+")[0],
                             "trees": "torchrl._torchrl"}}
    golden.update({sampler: draws(sampler) for sampler in SAMPLERS})
    target = os.path.join(out, "golden_torchrl_smaller_sampler.json")
    with open(target, "w") as file:
        json.dump(golden, file, indent=1)
        file.write("\n")
    print("wrote", target)
