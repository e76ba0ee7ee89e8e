"""Writes the golden Flat / Nested storage checkpoints of tests/test_checkpointers_ted.py with
the installed torchrl: run it once with torchrl 0.11.0 (tensordict 0.11) and once with torchrl
0.14.1 (tensordict 0.14.3), from the repository root:

    .venv/bin/python tests/data/make_golden_ted_checkpoints.py
    build/venv-torchrl-0.14/bin/python tests/data/make_golden_ted_checkpoints.py

Each run writes ``golden_trl0<minor>_<flat|nested>_checkpoint/``: a ``LazyTensorStorage`` of 6
rows holding 9 TED steps (wrapped around: shift 3, full), dumped by torchrl's checkpointer.
The two releases' layouts differ: the non-tensor entries (``shift``, ``is_full``,
``_storage_shape``) of torchrl 0.11 carry an ``other.pickle`` beside their ``meta.json``,
torchrl 0.14.1's do not. The data are fixed (``torch.arange``), so the tests rebuild the
expected storage from ``ted_steps`` below. The dumps are written in a temporary directory
first, so the paths the 0.11 pickles record are not the repository's.
"""
import pathlib
import shutil
import sys
import tempfile

import torch
import torchrl
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage
from torchrl.data.replay_buffers.checkpointers import FlatStorageCheckpointer, NestedStorageCheckpointer

HERE = pathlib.Path(__file__).parent
RELEASES = {"0.11": "trl011", "0.14": "trl014"}
ROWS = 6
STEPS = 9


def ted_steps(n):
    """``n`` TED steps of episodes of four steps: step ``t`` observes ``[t, -t]``; its next
    observation is the following step's, except at the end of an episode (``[t + 1, 100]``)."""
    step = torch.arange(n)
    obs = torch.stack([step, -step], -1).float()
    done = (step % 4 == 3).unsqueeze(-1)
    following = torch.stack([step + 1, -(step + 1)], -1).float()
    terminal = torch.stack([step + 1, torch.full_like(step, 100)], -1).float()
    next_obs = torch.where(done, terminal, following)
    return TensorDict(
        {
            "obs": obs,
            "action": (step % 3).unsqueeze(-1),
            "done": torch.zeros_like(done),
            "terminated": torch.zeros_like(done),
            "truncated": torch.zeros_like(done),
            "next": {
                "obs": next_obs,
                "done": done,
                "terminated": done.clone(),
                "truncated": torch.zeros_like(done),
                "reward": step.float().unsqueeze(-1),
            },
        },
        [n],
    )


def filled(checkpointer):
    storage = LazyTensorStorage(ROWS)
    storage.checkpointer = checkpointer
    data = ted_steps(STEPS)
    for t in range(STEPS):
        storage.set(t % ROWS, data[t])
    return storage


def main():
    release = ".".join(torchrl.__version__.split(".")[:2])
    if release not in RELEASES:
        sys.exit(f"run with torchrl 0.11.0 or 0.14.1, not {torchrl.__version__}")
    for kind, checkpointer in (("flat", FlatStorageCheckpointer), ("nested", NestedStorageCheckpointer)):
        target = HERE / f"golden_{RELEASES[release]}_{kind}_checkpoint"
        with tempfile.TemporaryDirectory() as tmp:
            dump = pathlib.Path(tmp) / "checkpoint"
            filled(checkpointer()).dumps(dump)
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(dump, target)


if __name__ == "__main__":
    main()
