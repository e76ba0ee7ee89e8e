"""Writes the torchrl 0.14.1 golden buffer checkpoints of tests/test_replay_buffers_checkpoints.py.

Run once, from the repository root, with torchrl 0.14.1 (tensordict 0.14.3) and without
torchrl_compat on the path:

    /work/venvs/trl014/bin/python tests/data/make_golden_buffers014.py

Two buffers, each saved by ``dumps`` and by ``state_dict`` (``torch.save``):

- ``golden_trl014_prefetch_buffer``: a buffer sampling one batch ahead (``prefetch=1``),
  which 0.14 saves with the checkpoint (``prefetch.pkl``, ``"_prefetch_state"``);
- ``golden_trl014_consuming_buffer``: a buffer whose items are consumed after two samples
  (``consume_after_n_samples=2``: ``consuming_sampler.pt``, ``"_consume_after_n_samples"``).

The content is built from ``torch.arange`` and the draws come from seeded generators, so
the tests rebuild the same buffers with either library. Keep the output small (it is
committed).
"""
import pathlib
import shutil

import torch
from tensordict import TensorDict

HERE = pathlib.Path(__file__).parent
PREFETCH = "golden_trl014_prefetch_buffer"
CONSUMING = "golden_trl014_consuming_buffer"


def golden_transitions(n, start=0):
    step = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict(
        {
            "obs": step.unsqueeze(-1) * torch.tensor([1.0, -1.0]),
            ("next", "done"): (step % 3 == 2).unsqueeze(-1),
        },
        batch_size=[n],
    )


def prefetch_buffer(lib):
    """8 items written over 11 writes (the cursor ends at 3), one batch handed out and the
    next one sampled ahead."""
    rb = lib.TensorDictReplayBuffer(
        storage=lib.LazyTensorStorage(8), batch_size=3, prefetch=1, generator=torch.Generator().manual_seed(11)
    )
    rb.extend(golden_transitions(6))
    rb.extend(golden_transitions(5, start=6))
    rb.sample()
    rb.synchronize()
    return rb


def consuming_buffer(lib):
    """6 items sampled three times by 3 (each used up after two samples), then 2 new items
    written into consumed slots."""
    rb = lib.TensorDictReplayBuffer(
        storage=lib.LazyTensorStorage(8), batch_size=3, consume_after_n_samples=2,
        generator=torch.Generator().manual_seed(12),
    )
    rb.extend(golden_transitions(6))
    for _ in range(3):
        rb.sample()
    rb.extend(golden_transitions(2, start=6))
    return rb


def main():
    import torchrl
    import torchrl.data as lib

    assert torchrl.__version__.startswith("0.14."), torchrl.__version__
    for name, build in ((PREFETCH, prefetch_buffer), (CONSUMING, consuming_buffer)):
        shutil.rmtree(HERE / name, ignore_errors=True)
        rb = build(lib)
        rb.dumps(HERE / name)
        torch.save(build(lib).state_dict(), HERE / f"{name}_state_dict.pt")
        rb.shutdown()


if __name__ == "__main__":
    main()
