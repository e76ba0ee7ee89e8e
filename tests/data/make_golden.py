"""Writes the golden checkpoints of tests/test_checkpointers.py with torchrl 0.11.

Run once, from the repository root, with torchrl 0.11.0 installed:

    python tests/data/make_golden.py

The content is built from ``torch.arange`` (no random numbers), so the tests rebuild the expected
values without these files. Keep the output small (it is committed).
"""
import pathlib
import shutil

import torch
import torchrl
from tensordict import TensorDict
from torchrl.data import CompressedListStorage, LazyMemmapStorage, LazyTensorStorage

assert torchrl.__version__.startswith("0.11."), torchrl.__version__
HERE = pathlib.Path(__file__).parent


def golden_tensordict(n=5):
    obs = torch.arange(n * 4, dtype=torch.float32).reshape(n, 4)
    return TensorDict(
        {"obs": obs, "action": obs[:, 0].long(), ("next", "done"): obs[:, :1] > 8},
        batch_size=[n],
    )


def main():
    for name in [
        "golden_lazy_tensor_storage",
        "golden_pytree_ndim2_storage",
        "golden_compressed_storage",
    ]:
        shutil.rmtree(HERE / name, ignore_errors=True)

    storage = LazyMemmapStorage(8)
    storage.set(range(5), golden_tensordict())
    storage.dumps(HERE / "golden_lazy_tensor_storage")

    storage = LazyTensorStorage(8 * 3, ndim=2)
    obs = torch.arange(8 * 3 * 2, dtype=torch.float32).reshape(8, 3, 2)
    storage.set(range(8), {"obs": obs, "mask": obs[..., 0] > 20})
    storage.dumps(HERE / "golden_pytree_ndim2_storage")

    storage = CompressedListStorage(8)
    storage.set(range(3), torch.arange(3 * 6, dtype=torch.float32).reshape(3, 2, 3))
    storage.dumps(HERE / "golden_compressed_storage")

    storage = LazyTensorStorage(8)
    storage.set(range(5), golden_tensordict())
    torch.save(storage.state_dict(), HERE / "golden_state_dict.pt")


if __name__ == "__main__":
    main()
