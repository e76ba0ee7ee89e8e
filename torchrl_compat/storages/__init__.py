"""Replay-buffer storages (stand-in for ``torchrl.data.replay_buffers.storages``).

Same class names, constructor signatures, attributes, ``state_dict`` keys and error
types as the followed torchrl release (:mod:`torchrl_compat._releases`), so that torchrl's replay buffers, writers, samplers and
checkpointers can drive these storages unchanged.

.. note:: When torchrl is importable (and the ``TORCHRL_COMPAT_STANDALONE`` environment
    variable is not ``"1"``), every class here also lists its torchrl twin as its *last*
    base class (after all of ours). torchrl tests storages with ``isinstance`` against
    its own classes (``ReplayBuffer`` refuses anything that is not a torchrl ``Storage``,
    ``_get_default_collate`` picks the collate function by type, ``SliceSampler`` and
    ``TensorStorageCheckpointer`` branch on ``TensorStorage`` / ``LazyMemmapStorage``).
    Our classes define every method torchrl's do, so the twin only answers those
    ``isinstance`` checks: no torchrl code runs on our storages.
"""
from __future__ import annotations

from .base import (
    _rewrites_items as _rewrites_items,
    Storage,
    _uniform_indices as _uniform_indices,
)
from .list import (
    ListStorage,
    LazyStackStorage,
    CompressedListStorage,
)
from .tensor import (
    logger,
    _MEMMAP_STORAGE_REGISTRY as _MEMMAP_STORAGE_REGISTRY,
    _cleanup_all_memmap_storages as _cleanup_all_memmap_storages,
    _signal_cleanup_handler as _signal_cleanup_handler,
    _register_cleanup_handlers as _register_cleanup_handlers,
    _ensure_cleanup_handlers as _ensure_cleanup_handlers,
    TensorStorage,
    LazyTensorStorage,
    LazyMemmapStorage,
    _mem_map_tensor_as_tensor as _mem_map_tensor_as_tensor,
    _make_memmap as _make_memmap,
    _make_empty_memmap as _make_empty_memmap,
)
from .ensemble import (
    StorageEnsemble,
)
from .utils import (
    _shape_of as _shape_of,
    _leading_dim as _leading_dim,
    _device_of as _device_of,
    _collate_list_tensordict as _collate_list_tensordict,
    _stack_anything as _stack_anything,
    _collate_id as _collate_id,
    _get_default_collate as _get_default_collate,
    _flip_list as _flip_list,
)

__all__ = [
    "CompressedListStorage",
    "LazyMemmapStorage",
    "LazyStackStorage",
    "LazyTensorStorage",
    "ListStorage",
    "Storage",
    "StorageEnsemble",
    "TensorStorage",
]

# Classes and functions keep the module path they had before the split, so pickles and
# torchrl-style ``__module__`` lookups find them here.
for _export in (
    _rewrites_items,
    Storage,
    _uniform_indices,
    ListStorage,
    LazyStackStorage,
    CompressedListStorage,
    logger,
    _MEMMAP_STORAGE_REGISTRY,
    _cleanup_all_memmap_storages,
    _signal_cleanup_handler,
    _register_cleanup_handlers,
    _ensure_cleanup_handlers,
    TensorStorage,
    LazyTensorStorage,
    LazyMemmapStorage,
    _mem_map_tensor_as_tensor,
    _make_memmap,
    _make_empty_memmap,
    StorageEnsemble,
    _shape_of,
    _leading_dim,
    _device_of,
    _collate_list_tensordict,
    _stack_anything,
    _collate_id,
    _get_default_collate,
    _flip_list,
):
    if getattr(_export, "__module__", "").startswith(__name__ + "."):
        _export.__module__ = __name__
del _export
