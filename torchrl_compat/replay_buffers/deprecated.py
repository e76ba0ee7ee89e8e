"""torchrl's deprecated helpers, kept for code that still uses them: :class:`InPlaceSampler` and :func:`stack_tensors`."""
from __future__ import annotations

from typing import Any

import torch

from torchrl_compat._torchrl_lookup import torchrl_twin


class InPlaceSampler(*torchrl_twin("replay_buffers", "InPlaceSampler")):
    """[Deprecated] A sampler to write tennsordicts in-place (removed, as in torchrl).

    Args:
        device (torch.device, optional): unused.
    """

    def __init__(self, device: Any | None = None):
        raise RuntimeError(
            "This class has been removed without replacement. In-place sampling should be avoided."
        )


def stack_tensors(list_of_tensor_iterators: list) -> tuple[torch.Tensor]:
    """Zips a list of iterables containing tensor-like objects and stacks the resulting lists of tensors together.

    Args:
        list_of_tensor_iterators (list): Sequence containing similar iterators,
            where each element of the nested iterator is a tensor whose
            shape match the tensor of other iterators that have the same index.

    Returns:
         Tuple of stacked tensors.

    Examples:
         >>> import torch
         >>> stacked = stack_tensors([[torch.ones(3), torch.zeros(1, 2)] for _ in range(4)])
         >>> [tuple(t.shape) for t in stacked]
         [(4, 3), (4, 1, 2)]
    """
    return tuple(torch.stack(tensors, 0) for tensors in zip(*list_of_tensor_iterators))
