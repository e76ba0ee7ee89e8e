"""What the storages share: shapes, devices, and the default collate functions."""
from __future__ import annotations

import torch
from tensordict import is_tensor_collection, lazy_stack, LazyStackedTensorDict
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ..utils import tree_iter
from ._stacking import stack_same_structure


def _shape_of(data) -> torch.Size:
    """Batch shape of a tensor collection, else shape of the first pytree leaf."""
    if is_tensor_collection(data) or isinstance(data, torch.Tensor):
        return data.shape
    for leaf in tree_iter(data):
        return leaf.shape
    raise ValueError(f"Cannot find a tensor in data of type {type(data)}.")


def _leading_dim(data) -> int:
    return _shape_of(data)[0]


def _device_of(data):
    if is_tensor_collection(data) or isinstance(data, torch.Tensor):
        return data.device
    for leaf in tree_iter(data):
        return leaf.device
    return None


def _collate_list_tensordict(x):
    return torch.stack(x, 0)


def _stack_anything(data):
    """Stacks a list of tensors, tensordicts or pytrees of tensors along a new first dim.

    TensorDicts that share one structure are stacked leaf by leaf
    (:func:`~torchrl_compat.storages._stacking.stack_same_structure`), others as tensordict
    stacks them.
    """
    if is_tensor_collection(data[0]):
        stacked = stack_same_structure(data)
        if stacked is not None:
            return stacked
        return LazyStackedTensorDict.maybe_dense_stack(data)
    return tree_map(
        lambda *x: torch.stack(x),
        *data,
        is_leaf=lambda x: isinstance(x, torch.Tensor) or is_tensor_collection(x),
    )


def _collate_id(x):
    return x


def _get_default_collate(storage, _is_tensordict=False):
    # Each storage class names its own (``_default_collate_fn``): the storage modules import
    # this one, so it does not import them.
    collate = getattr(storage, "_default_collate_fn", None)
    if collate is None:
        raise NotImplementedError(
            f"Could not find a default collate_fn for storage {type(storage)}."
        )
    return collate


def _flip_list(data):
    """Turns a list of items (tensordicts or same-structure pytrees) into one stacked item."""
    if all(is_tensor_collection(_data) for _data in data):
        return torch.stack(data)
    flat_data, flat_specs = zip(*[tree_flatten(item) for item in data])
    stacks = [torch.stack(item) for item in zip(*flat_data)]
    return tree_unflatten(stacks, flat_specs[0])
