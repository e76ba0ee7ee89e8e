"""Writes the golden buffer checkpoints of tests/test_replay_buffers_checkpoints.py with torchrl 0.11.

Run once, from the repository root, with torchrl 0.11.0 on the torch release its compiled
segment trees load on (2.9.x; the prioritized buffer needs them):

    /opt/ref291/bin/python tests/data/make_golden_buffers.py

The content is built from ``torch.arange`` and fixed priorities (no random numbers), so the
tests rebuild the expected values without these files. Keep the output small (it is
committed).
"""
import pathlib
import shutil

import torch
import torchrl
from tensordict import TensorDict
from torchrl.data import (
    LazyTensorStorage,
    TensorDictMaxValueWriter,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)

HERE = pathlib.Path(__file__).parent


def golden_transitions(n, start=0):
    step = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict(
        {
            "obs": step.unsqueeze(-1) * torch.tensor([1.0, -1.0]),
            ("next", "done"): (step % 3 == 2).unsqueeze(-1),
            "td_error": step / 4 + 0.5,
        },
        batch_size=[n],
    )


def prioritized_buffer():
    rb = TensorDictPrioritizedReplayBuffer(
        alpha=0.7, beta=0.5, storage=LazyTensorStorage(8), batch_size=4,
        generator=torch.Generator().manual_seed(11),
    )
    rb.extend(golden_transitions(6))
    rb.extend(golden_transitions(5, start=6))  # wraps around: the cursor ends at 3
    data = rb[torch.tensor([0, 5])]
    data["td_error"] = torch.tensor([3.0, 0.25])
    rb.update_tensordict_priority(data)
    return rb


def main():
    assert torchrl.__version__.startswith("0.11."), torchrl.__version__
    for name in ("golden_prioritized_buffer", "golden_max_value_buffer"):
        shutil.rmtree(HERE / name, ignore_errors=True)
    prioritized_buffer().dumps(HERE / "golden_prioritized_buffer")
    torch.save(prioritized_buffer().state_dict(), HERE / "golden_prioritized_buffer_state_dict.pt")

    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(4), writer=TensorDictMaxValueWriter(rank_key="td_error"), batch_size=2
    )
    rb.extend(golden_transitions(7)[torch.tensor([3, 0, 6, 1, 5, 2, 4])])
    rb.dumps(HERE / "golden_max_value_buffer")


if __name__ == "__main__":
    main()
