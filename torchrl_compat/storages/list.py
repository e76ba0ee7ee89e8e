"""Storages of Python lists: :class:`ListStorage`, :class:`LazyStackStorage` and :class:`CompressedListStorage`."""
from __future__ import annotations

import multiprocessing as mp
import sys
import warnings
from collections import OrderedDict
from copy import deepcopy
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any

import numpy as np
import tensordict
import torch
from tensordict import is_tensor_collection, lazy_stack, TensorDict, TensorDictBase
from torch.utils._pytree import tree_map

from .._releases import since
from ._index import index_error
from .._torchrl_lookup import torchrl_twin
from ..checkpointers import CompressedListStorageCheckpointer, ListStorageCheckpointer
from ..utils import _is_int, INT_CLASSES
from .base import Storage
from .utils import _collate_id, _stack_anything


class ListStorage(Storage, *torchrl_twin("storages", "ListStorage")):
    """A storage stored in a list.

    This class cannot be extended with PyTrees, the data provided during calls to
    :meth:`~torchrl.data.replay_buffers.ReplayBuffer.extend` should be iterables
    (like lists, tuples, tensors or tensordicts with non-empty batch-size).

    Args:
        max_size (int, optional): the maximum number of elements stored in the storage.
            If not provided, an unlimited storage is created.

    Keyword Args:
        compilable (bool, optional): if ``True``, the storage will be made compatible with :func:`~torch.compile` at
            the cost of being executable in multiprocessed settings.
        device (str, optional): the device to use for the storage. Defaults to `None` (inputs are not moved to the device).

    Examples:
        >>> import torch
        >>> from torchrl_compat import ListStorage
        >>> storage = ListStorage(3)
        >>> storage.set(range(2), [torch.zeros(2), torch.ones(2)])
        >>> len(storage)
        2
        >>> storage[1]
        tensor([1., 1.])

    .. note:: Errors name the offending index: reading past the end raises
        ``IndexError("index 5 at position 1 is out of range for a storage of length 2")``
        where torchrl raises a bare ``list index out of range``, and a batched :meth:`set`
        checks every cursor (and that cursors and data have the same length) before
        writing, so a failing call leaves the storage as it was. torchrl writes the items
        one by one and stops half-way.
    """

    # what a buffer collates its samples with (see utils._get_default_collate)
    _default_collate_fn = staticmethod(_stack_anything)

    _default_checkpointer = ListStorageCheckpointer

    def __init__(
        self,
        max_size: int | None = None,
        *,
        compilable: bool = False,
        device: torch.device | str | int | None = None,
    ):
        if max_size is None:
            max_size = torch.iinfo(torch.int64).max
        super().__init__(max_size, compilable=compilable)
        self._storage = []
        self.device = device
        if not self._compilable:
            # made now rather than at the first write (a shared Value takes a semaphore): a
            # storage forked before its first write then shares the revision too
            self.__dict__["_mutation_revision_value"] = mp.Value("q", 0)

    def _to_device(self, data: Any) -> Any:
        """Utility method to move data to the device."""
        if self.device is not None:
            if hasattr(data, "to"):
                data = data.to(self.device)
            else:
                data = tree_map(
                    lambda x: x.to(self.device) if hasattr(x, "to") else x, data
                )
        return data

    # What set() takes item by item, besides tensordict's accepted classes: those are read
    # at each call, as tensordict adds every tensorclass to them when it is defined.
    _ITERABLE_DATA = (list, tuple, torch.Tensor, TensorDictBase, range, set, np.ndarray)

    def _check_cursors(self, cursors: list) -> None:
        # Replays the append rules of the per-item path without writing anything.
        length = len(self._storage)
        for position, cursor in enumerate(cursors):
            if cursor < 0:
                if cursor < -length:
                    raise index_error(cursor, position, length)
                cursor += length
            if cursor > length:
                raise RuntimeError(
                    "Cannot append data located more than one item away from "
                    f"the storage size: the storage size is {length} "
                    f"and the index of the item to be set is {cursors[position]} "
                    f"(position {position} of the cursor)."
                )
            if cursor >= self.max_size:
                raise RuntimeError(
                    f"Cannot append data to the list storage: "
                    f"maximum capacity is {self.max_size} "
                    f"and the index of the item to be set is {cursor} "
                    f"(position {position} of the cursor)."
                )
            if cursor == length:
                length += 1

    def set(
        self,
        cursor: int | Sequence[int] | slice,
        data: Any,
        *,
        set_cursor: bool = True,
    ):
        steps = 1
        try:
            steps = self._set(cursor, data, set_cursor=set_cursor)
        finally:
            # also after a failure part-way: readers must look again
            self._bump_mutation_revision(steps)

    def _set(self, cursor, data, *, set_cursor: bool = True) -> int:
        """Writes ``data`` at ``cursor``; returns the mutation revision's steps: one per item
        of an index, one for an int or a slice (torchrl sets an index item by item)."""
        if isinstance(cursor, INT_CLASSES):
            length = len(self._storage)
            if cursor > length:
                raise RuntimeError(
                    "Cannot append data located more than one item away from "
                    f"the storage size: the storage size is {length} "
                    f"and the index of the item to be set is {cursor}."
                )
            if cursor >= self.max_size:
                raise RuntimeError(
                    f"Cannot append data to the list storage: "
                    f"maximum capacity is {self.max_size} "
                    f"and the index of the item to be set is {cursor}."
                )
            if cursor < -length:
                raise index_error(cursor, None, length)
            self._set_item(cursor, self._to_device(data))
            return 1
        if _is_int(cursor):  # 0-d tensor or array
            return self._set(int(cursor), data, set_cursor=set_cursor)
        if isinstance(cursor, slice):
            self._set_slice(cursor, self._to_device(data))
            return 1
        if not isinstance(data, self._ITERABLE_DATA) and not isinstance(
            data, tensordict.base._ACCEPTED_CLASSES
        ):
            raise TypeError(
                f"Cannot extend a {type(self)} with data of type {type(data)}. "
                f"Provide a list, tuple, set, range, np.ndarray, tensor or tensordict subclass instead."
            )
        if isinstance(cursor, (torch.Tensor, np.ndarray)):
            cursors = cursor.reshape(-1).tolist() if cursor.ndim else [int(cursor)]
        else:
            cursors = [int(c) for c in cursor]
        if isinstance(data, set):
            data = list(data)
        n_data = len(data)
        if n_data != len(cursors):
            raise ValueError(
                f"Cannot set {n_data} items at {len(cursors)} cursor positions: "
                "the cursor and the data must have the same length."
            )
        self._check_cursors(cursors)
        for _cursor, _data in zip(cursors, data):
            self._set_item(_cursor, self._to_device(_data))
        return len(cursors)

    def _set_item(self, cursor: int, data: Any) -> None:
        """Set a single item in the storage."""
        if cursor == len(self._storage):
            self._storage.append(data)
        else:
            self._storage[cursor] = data

    def _set_slice(self, cursor: slice, data: Any) -> None:
        """Set a slice in the storage."""
        self._storage[cursor] = data

    def get(self, index: int | Sequence[int] | slice) -> Any:
        if isinstance(index, INT_CLASSES):
            return self._get_item(index)
        if isinstance(index, slice):
            return self._get_slice(index)
        if isinstance(index, tuple):
            if len(index) > 1:
                raise RuntimeError(
                    f"{type(self).__name__} can only be indexed with one-length tuples."
                )
            return self.get(index[0])
        if isinstance(index, torch.Tensor):
            if index.ndim == 0:
                return self._get_item(int(index))
            index = index.tolist()
        elif isinstance(index, np.ndarray):
            if index.ndim == 0:
                return self._get_item(int(index))
            index = index.tolist()
        return self._get_list(index)

    def _get_item(self, index: int) -> Any:
        """Get a single item from the storage."""
        try:
            return self._storage[index]
        except IndexError:
            raise index_error(index, None, len(self._storage)) from None

    def _get_slice(self, index: slice) -> Any:
        """Get a slice from the storage."""
        return self._storage[index]

    def _get_list(self, index: list) -> list:
        """Get a list of items from the storage."""
        storage = self._storage
        try:
            return [storage[i] for i in index]
        except IndexError:
            length = len(storage)
            for position, i in enumerate(index):
                if not -length <= i < length:
                    raise index_error(i, position, length) from None
            raise

    def __len__(self):
        """Get the length of the storage."""
        return len(self._storage)

    def state_dict(self) -> dict[str, Any]:
        return {
            "_storage": [
                elt if not hasattr(elt, "state_dict") else elt.state_dict()
                for elt in self._storage
            ]
        }

    def load_state_dict(self, state_dict):
        # from 0.13, copies: the storage must not change with the caller's tensors
        clones = since("load_state_dict_clones")
        items = []
        for elt in state_dict["_storage"]:
            if isinstance(elt, torch.Tensor):
                items.append(elt.clone() if clones else elt)
            elif isinstance(elt, (dict, OrderedDict)):
                loaded = TensorDict().load_state_dict(elt, strict=False)
                items.append(loaded.clone() if clones else loaded)
            else:
                raise TypeError(
                    f"Objects of type {type(elt)} are not supported by ListStorage.load_state_dict"
                )
        # swap only once everything converted, so a bad entry leaves the storage intact
        self._storage = items
        self._bump_mutation_revision()

    def _empty(self):
        self._storage = []
        self._bump_mutation_revision()

    def __getstate__(self):
        if get_spawning_popen() is not None:
            raise RuntimeError(
                f"Cannot share a storage of type {type(self)} between processes."
            )
        return super().__getstate__()

    def __repr__(self):
        storage = getattr(self, "_storage", [None])
        if not storage:
            return f"{self.__class__.__name__}()"
        return f"{self.__class__.__name__}(items=[{storage[0]}, ...])"

    def contains(self, item):
        if isinstance(item, int):
            if item < 0:
                item += len(self._storage)
            return self._contains_int(item)
        if isinstance(item, torch.Tensor):
            return torch.tensor(
                [self.contains(elt) for elt in item.tolist()],
                dtype=torch.bool,
                device=item.device,
            ).reshape_as(item)
        raise NotImplementedError(f"type {type(item)} is not supported yet.")

    def _contains_int(self, item: int) -> bool:
        """Check if an integer index is contained in the storage."""
        return 0 <= item < len(self._storage)


class LazyStackStorage(ListStorage, *torchrl_twin("storages", "LazyStackStorage")):
    """A ListStorage that returns LazyStackTensorDict instances.

    This storage allows for heterougeneous structures to be indexed as a single `TensorDict` representation.
    It uses :class:`~tensordict.LazyStackedTensorDict` which operates on non-contiguous lists of tensordicts,
    lazily stacking items when queried.
    This means that this storage is going to be fast to sample but data access may be slow (as it requires a stack).
    Tensors of heterogeneous shapes can also be stored within the storage and stacked together.
    Because the storage is represented as a list, the number of tensors to store in memory will grow linearly with
    the size of the buffer.

    If possible, nested tensors can also be created via :meth:`~tensordict.LazyStackedTensorDict.densify`
    (see :mod:`~torch.nested`).

    Args:
        max_size (int, optional): the maximum number of elements stored in the storage.
            If not provided, an unlimited storage is created.

    Keyword Args:
        compilable (bool, optional): if ``True``, the storage will be made compatible with :func:`~torch.compile` at
            the cost of being executable in multiprocessed settings.
        stack_dim (int, optional): the stack dimension in terms of TensorDict batch sizes. Defaults to `0`.
        device (str, optional): the device to use for the storage. Defaults to `None` (inputs are not moved to the device).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyStackStorage
        >>> storage = LazyStackStorage(max_size=1000, stack_dim=-1)
        >>> storage.set(range(2), [TensorDict(a=torch.randn(10)), TensorDict(a=torch.randn(11))])
        >>> storage[[0, 1]].batch_size
        torch.Size([2])
    """

    _default_collate_fn = staticmethod(_collate_id)

    def __init__(
        self,
        max_size: int | None = None,
        *,
        compilable: bool = False,
        stack_dim: int = 0,
        device: torch.device | str | int | None = None,
    ):
        super().__init__(max_size=max_size, compilable=compilable, device=device)
        self.stack_dim = stack_dim

    def get(self, index: int | Sequence[int] | slice) -> Any:
        out = super().get(index=index)
        if isinstance(out, list):
            stack_dim = self.stack_dim
            if stack_dim < 0:
                stack_dim = out[0].ndim + 1 + stack_dim
            return lazy_stack(list(out), stack_dim)
        return out


class CompressedListStorage(ListStorage, *torchrl_twin("storages", "CompressedListStorage")):
    """A storage that compresses and decompresses data.

    This storage compresses data when storing and decompresses when retrieving.
    It's particularly useful for storing raw sensory observations like images
    that can be compressed significantly to save memory.

    Args:
        max_size (int): size of the storage, i.e. maximum number of elements stored
            in the buffer.

    Keyword Args:
        compression_fn (callable, optional): function to compress data. Should take
            a tensor and return a compressed byte tensor. Defaults to zstd compression
            on Python >= 3.14 and zlib compression before.
        decompression_fn (callable, optional): function to decompress data. Should take
            a compressed byte tensor and its metadata and return the original tensor.
            Defaults to the matching decompression.
        compression_level (int, optional): compression level (1-22 for zstd, 1-9 for
            zlib) when using the default compression function. Defaults to 3.
        device (torch.device, optional): device where the sampled tensors will be
            stored and sent. Default is :obj:`torch.device("cpu")`.
        compilable (bool, optional): whether the storage is compilable.
            If ``True``, the writer cannot be shared between multiple processes.
            Defaults to ``False``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import CompressedListStorage
        >>> storage = CompressedListStorage(max_size=1000, compression_level=3)
        >>> images = torch.zeros(10, 3, 84, 84)
        >>> storage.set(range(10), TensorDict({"obs": images}, batch_size=[10]))
        >>> storage[3]["obs"].shape
        torch.Size([3, 84, 84])
        >>> storage.bytes() < images.numel() * 4
        True

    .. note:: ``len()`` counts the empty slots by identity instead of building a Python
        list of the filled ones at each call; ``to_bytestream`` accepts numpy arrays
        (torchrl's ``isinstance(x, np.array)`` raises ``TypeError``). As in torchrl, the
        metadata of a tensordict item holds its fields only, and the item comes back with
        an empty batch size (``state_dict`` and checkpoints have torchrl's layout).
    """

    _default_collate_fn = staticmethod(lazy_stack)

    _default_checkpointer = CompressedListStorageCheckpointer

    def __init__(
        self,
        max_size: int,
        *,
        compression_fn: Callable | None = None,
        decompression_fn: Callable | None = None,
        compression_level: int = 3,
        device: torch.device = "cpu",
        compilable: bool = False,
    ):
        super().__init__(max_size, compilable=compilable, device=device)
        self.compression_level = compression_level
        self.compression_fn = (
            self._default_compression_fn if compression_fn is None else compression_fn
        )
        self.decompression_fn = (
            self._default_decompression_fn
            if decompression_fn is None
            else decompression_fn
        )
        self._storage = []
        self._metadata = []  # shape, dtype and device of each item

    @staticmethod
    def _codec():
        if sys.version_info >= (3, 14):
            from compression import zstd

            return zstd.compress, zstd.decompress
        import zlib

        return zlib.compress, zlib.decompress

    def _default_compression_fn(self, tensor: torch.Tensor) -> torch.Tensor:
        """Default compression using zstd (Python >= 3.14) or zlib."""
        compress, _ = self._codec()
        compressed = compress(self.to_bytestream(tensor), level=self.compression_level)
        return torch.frombuffer(bytearray(compressed), dtype=torch.uint8)

    def _default_decompression_fn(
        self, compressed_tensor: torch.Tensor, metadata: dict
    ) -> torch.Tensor:
        """Default decompression using zstd (Python >= 3.14) or zlib."""
        _, decompress = self._codec()
        raw = decompress(self.to_bytestream(compressed_tensor.cpu()))
        tensor = torch.frombuffer(bytearray(raw), dtype=metadata["dtype"])
        return tensor.reshape(metadata["shape"]).to(metadata["device"])

    def _compress_item(self, item: Any) -> tuple[torch.Tensor, dict]:
        """Compress a single item and return compressed data with metadata."""
        if isinstance(item, torch.Tensor):
            metadata = {
                "type": "tensor",
                "shape": item.shape,
                "dtype": item.dtype,
                "device": item.device,
            }
            return self.compression_fn(item), metadata
        if is_tensor_collection(item):
            compressed_fields = {}
            fields = {}
            for key, value in item.items():
                if isinstance(value, torch.Tensor):
                    compressed_fields[key] = self.compression_fn(value)
                    fields[key] = {
                        "type": "tensor",
                        "shape": value.shape,
                        "dtype": value.dtype,
                        "device": value.device,
                    }
                else:
                    # non-tensor entries (strings, nested tensordicts) are kept as they are
                    compressed_fields[key] = value
                    fields[key] = {"type": "non_tensor", "value": value}
            # torchrl's layout: no batch size (items come back with an empty one)
            return compressed_fields, {"type": "tensordict", "fields": fields}
        return item, {"type": "other", "value": item}

    def _decompress_item(self, compressed_data: Any, metadata: dict) -> Any:
        """Decompress a single item using its metadata."""
        kind = metadata["type"]
        if kind == "tensor":
            return self.decompression_fn(compressed_data, metadata)
        if kind == "tensordict":
            # a "batch_size" entry, where metadata written elsewhere has one, is honoured
            # as torchrl honours it
            result = TensorDict({}, batch_size=metadata.get("batch_size", []))
            for key, field_metadata in metadata["fields"].items():
                if field_metadata["type"] == "non_tensor":
                    result[key] = field_metadata["value"]
                else:
                    result[key] = self.decompression_fn(
                        compressed_data[key], field_metadata
                    )
            return result
        return metadata["value"]

    def _set_item(self, cursor: int, data: Any) -> None:
        """Set a single item in the compressed storage."""
        compressed_data, metadata = self._compress_item(data)
        while len(self._storage) <= cursor:
            self._storage.append(None)
            self._metadata.append(None)
        self._storage[cursor] = compressed_data
        self._metadata[cursor] = metadata

    def _set_slice(self, cursor: slice, data: Any) -> None:
        """Set a slice in the compressed storage."""
        if not hasattr(data, "__iter__"):
            data = [data]
        start, stop, step = cursor.indices(len(self._storage))
        for i, value in zip(range(start, stop, step), data):
            self._set_item(i, value)

    def _get_item(self, index: int) -> Any:
        """Get a single item from the compressed storage."""
        storage = self._storage
        if not -len(storage) <= index < len(storage) or storage[index] is None:
            raise IndexError(f"Index {index} out of bounds or not set")
        return self._decompress_item(storage[index], self._metadata[index])

    def _get_slice(self, index: slice) -> list:
        """Get a slice from the compressed storage."""
        start, stop, step = index.indices(len(self._storage))
        return [
            self._get_item(i)
            for i in range(start, stop, step)
            if self._storage[i] is not None
        ]

    def _get_list(self, index: list) -> list:
        """Get a list of items from the compressed storage."""
        if isinstance(index, torch.Tensor):
            index = index.tolist()
        storage = self._storage
        length = len(storage)
        for position, i in enumerate(index):
            if not -length <= i < length or storage[i] is None:
                raise IndexError(
                    f"Index {i} (position {position}) out of bounds or not set"
                )
        return [self._get_item(i) for i in index]

    def __len__(self) -> int:
        """Get the length of the compressed storage."""
        storage = self._storage
        # by identity: list.count(None) compares items with ==, which numpy arrays answer
        # elementwise (an error); and it is slower for tensors than this identity test
        return len(storage) - sum(1 for item in storage if item is None)

    def _contains_int(self, item: int) -> bool:
        """Check if an integer index is contained in the compressed storage."""
        return 0 <= item < len(self._storage) and self._storage[item] is not None

    def _empty(self):
        """Empty the storage."""
        self._storage = []
        self._metadata = []
        self._bump_mutation_revision()

    def state_dict(self) -> dict[str, Any]:
        """Save the storage state."""
        return {"_storage": self._storage, "_metadata": self._metadata}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the storage state."""
        storage = state_dict["_storage"]
        if since("load_state_dict_clones"):
            storage = [elt.clone() if isinstance(elt, torch.Tensor) else elt for elt in storage]
        self._storage = storage
        self._metadata = deepcopy(state_dict["_metadata"]) if since("load_state_dict_clones") else state_dict["_metadata"]
        self._bump_mutation_revision()

    def to_bytestream(self, data_to_bytestream: torch.Tensor | np.array | Any) -> bytes:
        """Convert data to a byte stream."""
        if isinstance(data_to_bytestream, torch.Tensor):
            return data_to_bytestream.cpu().numpy().tobytes()
        if isinstance(data_to_bytestream, np.ndarray):
            return data_to_bytestream.tobytes()
        import pickle

        return pickle.dumps(data_to_bytestream)

    def bytes(self):
        """Return the number of bytes in the storage."""

        def compressed_size(data: Any) -> int:
            if data is None:
                return 0
            if isinstance(data, bytes):
                return len(data)
            if isinstance(data, np.ndarray):
                return data.nbytes
            if isinstance(data, torch.Tensor):
                return data.numel() * data.element_size()
            if isinstance(data, (tuple, list, Sequence)) and not isinstance(data, str):
                return sum(compressed_size(item) for item in data)
            if isinstance(data, Mapping) or is_tensor_collection(data):
                return sum(compressed_size(value) for value in data.values())
            return 0

        size = compressed_size(self._storage)
        if size == 0:
            if len(self._storage) > 0:
                raise RuntimeError(
                    "Compressed storage is not empty but the compressed size is 0. This is a bug."
                )
            warnings.warn("Compressed storage is empty, returning 0 bytes.")
        return size
