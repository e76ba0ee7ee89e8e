"""The priority trees of the prioritized samplers, chosen by device.

Priorities of a CPU storage live in ``replay``'s compiled segment trees, whose fused kernels
draw and update a batch in one call; those of a storage on an accelerator live in the
torch-op trees of :mod:`torchrl_compat._torch_ops.sumtree` on that device. Both follow the API of torchrl's
trees (``capacity`` leaves, torchrl's query rule), so that the samplers read and write them
the same way. A private switch (``cpu_kernels=False``) puts CPU priorities in torch-op trees
too, which is how the tests compare the accelerator path with the kernels.
"""
from __future__ import annotations

import numpy as np
import torch

import replay

from torchrl_compat._torch_ops.sumtree import (
    _TorchSegmentTree,
    TorchMinSegmentTreeFp32,
    TorchMinSegmentTreeFp64,
    TorchSumSegmentTreeFp32,
    TorchSumSegmentTreeFp64,
)

__all__ = [
    "LEAF_BLOCK",
    "is_replay_tree",
    "leaf_blocks",
    "make_trees",
    "moved_trees",
    "read_leaves",
    "tree_device",
    "tree_dtype",
    "trees_fit",
    "write_at",
    "write_leaf_range",
    "write_leaves",
]

_REPLAY_TREES = {
    torch.float32: (replay.SumSegmentTreeFp32, replay.MinSegmentTreeFp32),
    torch.float64: (replay.SumSegmentTreeFp64, replay.MinSegmentTreeFp64),
}
_TORCH_TREES = {
    torch.float32: (TorchSumSegmentTreeFp32, TorchMinSegmentTreeFp32),
    torch.float64: (TorchSumSegmentTreeFp64, TorchMinSegmentTreeFp64),
}
_REPLAY_TREE_TYPES = frozenset(cls for pair in _REPLAY_TREES.values() for cls in pair)
_CPU = torch.device("cpu")


def tree_dtype(dtype) -> torch.dtype:
    """The trees' dtype for a sampler's ``dtype`` argument, as torchrl accepts it."""
    if dtype in (torch.float, torch.FloatType, torch.float32):
        return torch.float32
    if dtype in (torch.double, torch.DoubleTensor, torch.float64):
        return torch.float64
    raise NotImplementedError(f"dtype {dtype} not supported by PrioritizedSampler")


def is_replay_tree(tree) -> bool:
    """Whether ``tree`` is one of ``replay``'s compiled trees (the fused CPU kernels)."""
    return type(tree) in _REPLAY_TREE_TYPES


def tree_device(tree) -> torch.device:
    return tree.device if isinstance(tree, _TorchSegmentTree) else _CPU


def make_trees(size: int, dtype: torch.dtype, device=None, *, cpu_kernels: bool = True):
    """A ``(sum tree, min tree)`` pair of ``size`` leaves for priorities on ``device``."""
    device = _CPU if device is None else torch.device(device)
    if device.type == "cpu" and cpu_kernels:
        sum_cls, min_cls = _REPLAY_TREES[dtype]
        return sum_cls(size), min_cls(size)
    sum_cls, min_cls = _TORCH_TREES[dtype]
    return sum_cls(size, device=device), min_cls(size, device=device)


def trees_fit(tree, device, cpu_kernels: bool) -> bool:
    """Whether ``tree`` is the kind :func:`make_trees` gives for ``device``."""
    if device.type == "cpu" and cpu_kernels:
        return is_replay_tree(tree)
    return isinstance(tree, _TorchSegmentTree) and tree.device == device


def read_leaves(tree, count: int, start: int = 0) -> torch.Tensor:
    """Leaves ``[start, count)`` of a tree (``count`` up to its capacity), as a tensor."""
    if isinstance(tree, _TorchSegmentTree):
        return tree._leaves[start:count]
    return torch.as_tensor(tree[np.arange(start, count, dtype=np.int64)])


# Leaves read, checked or written at a time by the checkpoints: the temporaries of a tree of
# 2^30 leaves stay at a few tens of MiB instead of several float64 copies of 8 GiB.
LEAF_BLOCK = 1 << 22


def leaf_blocks(count: int):
    """The ranges ``(lo, hi)`` of at most :data:`LEAF_BLOCK` leaves covering ``[0, count)``."""
    return [(lo, min(lo + LEAF_BLOCK, count)) for lo in range(0, count, LEAF_BLOCK)]


def write_leaves(tree, values: torch.Tensor) -> None:
    """Sets leaves ``[0, len(values))`` of ``tree`` (checked by the tree, written whole or not
    at all)."""
    if isinstance(tree, _TorchSegmentTree) and values.numel() == tree.size:
        tree._set_all(values)
    elif values.numel():
        tree[np.arange(values.numel(), dtype=np.int64)] = values.detach().cpu().numpy()


def write_leaf_range(tree, start: int, values: torch.Tensor) -> None:
    """Sets leaves ``[start, start + len(values))`` of ``tree`` (checked by the tree, written
    whole or not at all)."""
    if start == 0:
        write_leaves(tree, values)
    else:
        write_at(tree, torch.arange(start, start + values.numel()), values)


def write_at(tree, index: torch.Tensor, values: torch.Tensor) -> None:
    """Sets the leaves ``index`` of ``tree`` to ``values`` (checked by the tree, written whole
    or not at all)."""
    if isinstance(tree, _TorchSegmentTree):
        tree[index.to(tree.device)] = values.to(tree.device)
    elif index.numel():
        tree[index.detach().cpu().numpy()] = values.detach().cpu().numpy()


def moved_trees(sum_tree, min_tree, dtype: torch.dtype, device, *, cpu_kernels: bool = True):
    """New trees of the kind :func:`make_trees` gives for ``device``, holding the leaves of
    ``sum_tree`` / ``min_tree`` (those past ``size`` too, when any was written)."""
    size, capacity = sum_tree.size, sum_tree.capacity
    new_sum, new_min = make_trees(size, dtype, device, cpu_kernels=cpu_kernels)
    for old, new in ((sum_tree, new_sum), (min_tree, new_min)):
        leaves = read_leaves(old, capacity)
        # Past ``size`` only when one was written: a replay tree lays itself out again then.
        written_past = bool((leaves[size:] != old.identity_element).any())
        write_leaves(new, leaves if written_past else leaves[:size])
    return new_sum, new_min
