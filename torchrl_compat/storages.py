"""Replay-buffer storages (stand-in for ``torchrl.data.replay_buffers.storages``).

Same class names, constructor signatures, attributes, ``state_dict`` keys and error
types as torchrl 0.11, so that torchrl's replay buffers, writers, samplers and
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

import abc
import functools
import logging
import multiprocessing as mp
import os
import sys
import tempfile
import textwrap
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from copy import copy
from multiprocessing.context import get_spawning_popen
from typing import Any

import numpy as np
import tensordict
import torch
from tensordict import (
    is_tensor_collection,
    lazy_stack,
    LazyStackedTensorDict,
    TensorDict,
    TensorDictBase,
)
from tensordict.base import _NESTED_TENSORS_AS_LISTS
from tensordict.memmap import MemoryMappedTensor
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from torchrl_compat import _storage_cleanup
from torchrl_compat._ensemble import INDEX_ERROR, members_rng, pick, select_members
from torchrl_compat._storage_counters import (
    compile_disable,
    is_compiling,
    outside_graph,
    restore_counter,
    shared_counter,
)
from torchrl_compat._storage_index import filled_index, index_error
from torchrl_compat._storage_journal import ALL_ITEMS, RowRun, WriteJournal
from torchrl_compat._torchrl_lookup import torchrl_twin
from torchrl_compat.checkpointers import (
    CompressedListStorageCheckpointer,
    ListStorageCheckpointer,
    StorageCheckpointerBase,
    StorageEnsembleCheckpointer,
    TensorStorageCheckpointer,
)
from torchrl_compat.utils import (
    _init_pytree,
    _is_int,
    _make_ordinal_device,
    INT_CLASSES,
    tree_iter,
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

logger = logging.getLogger("torchrl_compat")


# The module-level names torchrl 0.11 has here, for code that reaches them.
_MEMMAP_STORAGE_REGISTRY = _storage_cleanup.registry()
_cleanup_all_memmap_storages = _storage_cleanup._cleanup_all
_signal_cleanup_handler = _storage_cleanup._on_signal
_register_cleanup_handlers = _ensure_cleanup_handlers = _storage_cleanup._install_handlers


def _rewrites_items(method):
    """Records a call to ``method`` as a change of every item in the write journal.

    Done once the call returns or raises: a reader that syncs in between would take
    the half-done change as complete.
    """

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        finally:
            self._note_write(ALL_ITEMS)

    return wrapper


class Storage(*torchrl_twin("storages", "Storage")):
    """A Storage is the container of a replay buffer.

    Every storage must have a set, get and __len__ methods implemented.
    Get and set should support integers as well as list of integers.

    The storage does not need to have a definite size, but if it does one should
    make sure that it is compatible with the buffer size.

    Args:
        max_size (int): the maximum number of elements stored in the storage.
        checkpointer (StorageCheckpointerBase, optional): the checkpointer used by
            :meth:`dumps` and :meth:`loads`. Defaults to the class'
            ``_default_checkpointer``.
        compilable (bool, optional): whether the storage is meant to be used under
            :func:`torch.compile`. Defaults to ``False``.
    """

    ndim = 1
    max_size: int
    _default_checkpointer: StorageCheckpointerBase = StorageCheckpointerBase
    _rng: torch.Generator | None = None

    def __init__(
        self,
        max_size: int,
        checkpointer: StorageCheckpointerBase | None = None,
        compilable: bool = False,
    ) -> None:
        self.max_size = int(max_size)
        self.checkpointer = checkpointer
        self._compilable = compilable
        self._attached_entities_list = []

    @property
    def checkpointer(self):
        return self._checkpointer

    @checkpointer.setter
    def checkpointer(self, value: StorageCheckpointerBase | None) -> None:
        if value is None:
            value = self._default_checkpointer()
        self._checkpointer = value

    def register_save_hook(self, hook):
        """Register a save hook for this storage.

        The hook is forwarded to the checkpointer.
        """
        self._checkpointer.register_save_hook(hook)

    def register_load_hook(self, hook):
        """Register a load hook for this storage.

        The hook is forwarded to the checkpointer.
        """
        self._checkpointer.register_load_hook(hook)

    @property
    def _is_full(self):
        return len(self) == self.max_size

    @property
    def _attached_entities(self) -> list:
        # Replay buffers (and samplers) reading from this storage register here, so
        # that a storage shared by several buffers notifies all of them.
        entities = getattr(self, "_attached_entities_list", None)
        if entities is None:
            self._attached_entities_list = entities = []
        return entities

    @torch._dynamo.assume_constant_result
    def _attached_entities_iter(self):
        return self._attached_entities

    @abc.abstractmethod
    def set(self, cursor: int, data: Any, *, set_cursor: bool = True):
        ...

    @abc.abstractmethod
    def get(self, index: int) -> Any:
        ...

    def dumps(self, path):
        """Saves the storage content in ``path`` through its checkpointer."""
        self.checkpointer.dumps(self, path)

    def loads(self, path):
        """Loads the storage content from ``path`` through its checkpointer."""
        self._apply_checkpoint(self._read_checkpoint(path))

    # ``loads`` in two steps, so that an ensemble or a buffer checks every part of its
    # checkpoint before any part changes: the checkpointer reads and checks (changing
    # nothing) and hands back the function that loads what it read.
    def _read_checkpoint(self, path):
        read = getattr(self.checkpointer, "_read_checkpoint", None)
        if read is None:  # a checkpointer of torchrl's: it checks as it loads
            return functools.partial(self.checkpointer.loads, self, path)
        return read(self, path)

    def _apply_checkpoint(self, load) -> None:
        load()

    def attach(self, buffer: Any) -> None:
        """This function attaches a sampler to this storage.

        Buffers that read from this storage must be included as an attached
        entity by calling this method. This guarantees that when data
        in the storage changes, components are made aware of changes even if the storage
        is shared with other buffers (eg. Priority Samplers).

        Args:
            buffer: the object that reads from this storage.
        """
        if buffer not in self._attached_entities:
            self._attached_entities.append(buffer)

    def __getitem__(self, item):
        return self.get(item)

    def __setitem__(self, index, value):
        """Sets values in the storage without updating the cursor or length."""
        return self.set(index, value, set_cursor=False)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    @abc.abstractmethod
    def __len__(self):
        ...

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        ...

    @abc.abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ...

    @abc.abstractmethod
    def _empty(self):
        ...

    # Without this, torch.compile guards on len(self) and recompiles at every write.
    @compile_disable()
    def _rand_given_ndim(self, batch_size):
        # random indices given the storage ndim
        if self.ndim == 1:
            return _uniform_indices(self, batch_size)
        raise RuntimeError(
            f"Random number generation is not implemented for storage of type {type(self)} with ndim {self.ndim}. "
            f"Please report this exception as well as the use case (incl. buffer construction) on github."
        )

    @property
    def shape(self):
        if self.ndim == 1:
            return torch.Size([self.max_size])
        raise RuntimeError(
            f"storage.shape is not supported for storages of type {type(self)} when ndim > 1."
            f"Please report this exception as well as the use case (incl. buffer construction) on github."
        )

    def _max_size_along_dim0(self, *, single_data=None, batched_data=None):
        if self.ndim == 1:
            return self.max_size
        raise RuntimeError(
            f"storage._max_size_along_dim0 is not supported for storages of type {type(self)} when ndim > 1."
            f"Please report this exception as well as the use case (incl. buffer construction) on github."
        )

    def flatten(self):
        if self.ndim == 1:
            return self
        raise RuntimeError(
            f"storage.flatten is not supported for storages of type {type(self)} when ndim > 1."
            f"Please report this exception as well as the use case (incl. buffer construction) on github."
        )

    def save(self, *args, **kwargs):
        """Alias for :meth:`dumps`."""
        return self.dumps(*args, **kwargs)

    def dump(self, *args, **kwargs):
        """Alias for :meth:`dumps`."""
        return self.dumps(*args, **kwargs)

    def load(self, *args, **kwargs):
        """Alias for :meth:`loads`."""
        return self.loads(*args, **kwargs)

    def __getstate__(self):
        state = copy(self.__dict__)
        # generators don't pickle; the receiving buffer sets its own
        state["_rng"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __contains__(self, item):
        return self.contains(item)

    @abc.abstractmethod
    def contains(self, item):
        ...


def _uniform_indices(storage, batch_size: int) -> torch.Tensor:
    """``batch_size`` indices drawn uniformly in ``[0, len(storage))``, with the storage's
    generator, on its device."""
    return torch.randint(
        0,
        len(storage),
        (batch_size,),
        generator=storage._rng,
        device=getattr(storage, "device", None),
    )


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
            return
        if _is_int(cursor):  # 0-d tensor or array
            self.set(int(cursor), data, set_cursor=set_cursor)
            return
        if isinstance(cursor, slice):
            self._set_slice(cursor, self._to_device(data))
            return
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
        items = []
        for elt in state_dict["_storage"]:
            if isinstance(elt, torch.Tensor):
                items.append(elt)
            elif isinstance(elt, (dict, OrderedDict)):
                items.append(TensorDict().load_state_dict(elt, strict=False))
            else:
                raise TypeError(
                    f"Objects of type {type(elt)} are not supported by ListStorage.load_state_dict"
                )
        # swap only once everything converted, so a bad entry leaves the storage intact
        self._storage = items

    def _empty(self):
        self._storage = []

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


class TensorStorage(Storage, *torchrl_twin("storages", "TensorStorage")):
    """A storage for tensors and tensordicts.

    Args:
        storage (tensor or TensorDict): the data buffer to be used.
        max_size (int): size of the storage, i.e. maximum number of elements stored
            in the buffer.

    Keyword Args:
        device (torch.device, optional): device where the sampled tensors will be
            stored and sent. Default is :obj:`torch.device("cpu")`.
            If "auto" is passed, the device is automatically gathered from the
            first batch of data passed. This is not enabled by default to avoid
            data placed on GPU by mistake, causing OOM issues.
        ndim (int, optional): the number of dimensions to be accounted for when
            measuring the storage size. For instance, a storage of shape ``[3, 4]``
            has capacity ``3`` if ``ndim=1`` and ``12`` if ``ndim=2``.
            Defaults to ``1``.
        compilable (bool, optional): whether the storage is compilable.
            If ``True``, the writer cannot be shared between multiple processes.
            Defaults to ``False``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import TensorStorage
        >>> data = TensorDict({
        ...     "some data": torch.randn(10, 11),
        ...     ("some", "nested", "data"): torch.randn(10, 11, 12),
        ... }, batch_size=[10, 11])
        >>> storage = TensorStorage(data)
        >>> len(storage)  # only the first dimension is considered as indexable
        10
        >>> storage.get(0).batch_size
        torch.Size([11])
        >>> storage.set(0, storage.get(0).zero_()) # zeros the data along index ``0``

    .. note:: ``len(storage)`` reads the shared length straight from shared memory
        (an aligned 64-bit integer, which a load reads atomically) instead of going
        through the ``multiprocessing.Value`` lock and a ``torch.compiler.disable``
        wrapper at each call as torchrl does. Writes in other processes are still seen.
        The length is an int64: torchrl's ``mp.Value("i")`` silently wraps past
        ``2**31 - 1`` elements.

    .. note:: :meth:`set` updates the length and ``_last_cursor`` only once the write
        succeeded: in torchrl a write that raises (bad index, mismatched data) has
        already grown the length. Reads of a partially filled storage check the index
        against the filled length and index the buffer in one step (torchrl slices the
        whole storage first); an out-of-range index raises
        ``IndexError("index 12 at position 3 is out of range for a storage of length 10")``.
        A write traced by ``torch.compile`` updates the shared length outside the graph,
        where torchrl replaces it with a plain int that ``len()`` never reads again.

    .. note:: Every read-modify-write of the shared length takes its lock, including the
        rounding to whole rows that the first read of :attr:`shape` makes: in torchrl a
        process reading ``storage.shape`` for the first time while another writes can
        lose that writer's length increment. Under ``torch.compile`` a compilable
        storage keeps its length and write count out of the graph (as torchrl keeps its
        ``len()``), so compiled writes and draws do not recompile as the length changes.
    """

    _storage = None
    _default_checkpointer = TensorStorageCheckpointer

    def __init__(
        self,
        storage,
        max_size=None,
        *,
        device: torch.device | str = "cpu",
        ndim: int = 1,
        compilable: bool = False,
    ):
        if not ((storage is None) ^ (max_size is None)):
            if storage is None:
                raise ValueError("Expected storage to be non-null.")
            leading = _leading_dim(storage)
            if max_size != leading:
                raise ValueError(
                    "The max-size and the storage shape mismatch: got "
                    f"max_size={max_size} for a storage of shape {_shape_of(storage)}."
                )
        elif storage is not None:
            max_size = _leading_dim(storage)
        self.ndim = ndim
        super().__init__(max_size, compilable=compilable)
        self.initialized = storage is not None
        self._len = max_size if self.initialized else 0
        if device != "auto":
            self.device = _make_ordinal_device(torch.device(device))
        elif storage is not None:
            self.device = _device_of(storage)
        else:
            self.device = "auto"
        self._storage = storage
        self._last_cursor = None
        self.__dict__["_storage_keys_cache"] = None

    # ---------------------------------------------------------------- length
    # The length lives in an int64 ``mp.Value`` (``_len_value``) so that writes made in
    # forked or spawned processes are seen here; ``_len_shared`` is its raw ctypes
    # object, read without the lock on the hot path (see ``_storage_counters``).

    def _make_shared_len(self, value: int = 0):
        shared = shared_counter(value)
        self.__dict__["_len_value"] = shared
        self.__dict__["_len_shared"] = shared.get_obj()
        if self.__dict__.get("_writes_value") is None:
            # with the length, so that a storage forked before its first write shares both
            self._make_shared_writes()
        return shared

    @property
    def _len(self):
        d = self.__dict__
        shared = d.get("_len_shared")
        if shared is not None:
            return shared.value
        if self._compilable:
            value = d.get("_len_value")
            if value is None:
                value = d["_len_value"] = 0
            return value
        return self._make_shared_len().get_obj().value

    @_len.setter
    @outside_graph
    def _len(self, value):
        if self._compilable:
            self.__dict__["_len_value"] = value
            return
        shared = self.__dict__.get("_len_value")
        if shared is None:
            self._make_shared_len(value)
        else:
            shared.value = value

    def _update_len(self, update) -> None:
        """Sets the length to ``update(length)``, a read-modify-write under the shared
        length's lock, so that concurrent writers in several processes don't lose each
        other's updates."""
        if self._compilable:
            self._len = update(self._len)
            return
        shared = self.__dict__.get("_len_value")
        if shared is None:
            shared = self._make_shared_len()
        with shared.get_lock():
            raw = shared.get_obj()
            raw.value = update(raw.value)

    @outside_graph
    def _add_len(self, numel: int) -> None:
        max_size = self.max_size
        self._update_len(lambda length: min(length + numel, max_size))

    @outside_graph
    def _round_len_to_rows(self, row: int) -> None:
        """Rounds the length up to whole rows of ``row`` elements (``ndim > 1``)."""
        self._update_len(lambda length: -(length // -row) * row)

    def __len__(self):
        shared = self.__dict__.get("_len_shared")
        if shared is not None:
            return shared.value
        return self._len_slow()

    # torch.compile would otherwise guard on the changing length and recompile
    @compile_disable()
    def _len_slow(self):
        return self._len

    # ---------------------------------------------------------- write journal
    # Readers that derive something from the stored items (the trajectory ends of a
    # SliceSampler) follow the writes instead of reading the whole storage each time.
    # Every write adds one to a counter shared like the length (``_writes_value``, an
    # int64 ``mp.Value``, so that writes made in other processes are seen) and is recorded
    # in a journal local to the process (``_storage_journal.WriteJournal``). A change that
    # may touch any item (initialization, emptying, loading) records no cursor: readers
    # behind it read everything again. ``_writes_since`` tells a reader what it missed.

    def _make_shared_writes(self, value: int = 0):
        # one lock (and one semaphore) for both shared counters
        shared = shared_counter(value, beside=self.__dict__.get("_len_value"))
        self.__dict__["_writes_value"] = shared
        self.__dict__["_writes_shared"] = shared.get_obj()
        return shared

    def _writes_raw(self):
        """The shared write counter's raw int64, made if missing (``None`` if compilable)."""
        d = self.__dict__
        raw = d.get("_writes_shared")
        if raw is None and not self._compilable:
            shared = d.get("_writes_value")
            if shared is None:
                shared = self._make_shared_writes()
            raw = d["_writes_shared"] = shared.get_obj()
        return raw

    def _write_journal(self) -> WriteJournal:
        journal = self.__dict__.get("_journal")
        if journal is None:
            journal = self.__dict__["_journal"] = WriteJournal(self.max_size)
        return journal

    @outside_graph
    def _note_write(self, cursor) -> None:
        """Counts a write at ``cursor`` (``ALL_ITEMS``: anywhere) and journals it. O(1).

        Called once the items are written, so that a reader seeing the new count reads
        the new items.
        """
        d = self.__dict__
        if self._compilable:
            # never shared (compilable storages refuse it): a plain int, as the length
            count = d["_writes_value"] = d.get("_writes_value", 0) + 1
        else:
            raw = d.get("_writes_shared")
            if raw is None:
                raw = self._writes_raw()
            # under the lock: two processes writing at once must get distinct counts
            with d["_writes_value"].get_lock():
                raw.value = count = raw.value + 1
        journal = d.get("_journal")
        if journal is not None:
            journal.append(count, cursor)

    def _writes_since(self, count: int | None) -> tuple[int, list | None]:
        """The cursors written since the write counter read ``count``.

        The first call starts the journal: later writes in this process are recorded.

        Args:
            count (int or None): the count returned by an earlier call, or ``None`` to
                read the counter only.

        Returns:
            a tuple ``(now, cursors)``: ``now`` is the current count, to pass to the next
            call; ``cursors`` lists the cursors of the writes ``count + 1`` to ``now`` in
            the order they were made (empty when nothing was written), or is ``None``
            when they are not all known here (``count`` is ``None``, writes made in
            another process, more writes than the journal holds, or a change that may
            have touched every item): the caller must then read the whole storage.
            Cursors are ints, slices and ranges as passed to :meth:`set`, copies of the
            index tensors and arrays (lists become arrays) taken at the write, or
            :class:`~torchrl_compat._storage_journal.RowRun` for the round-robin writes
            booked by :meth:`_note_rows_written`.
            O(journal length).
        """
        d = self.__dict__
        raw = d.get("_writes_shared")
        if raw is None:
            raw = self._writes_raw()
        journal = self._write_journal()
        journal.follow()
        # an aligned int64 load, atomic as the length's
        now = d.get("_writes_value", 0) if raw is None else raw.value
        if count is None:
            return now, None
        return now, journal.since(count, now)

    # ----------------------------------------------------------------- shapes
    @property
    def _storage_keys(self) -> list | None:
        """Cached list of storage keys for filtering incoming data.

        Returns None if storage is not locked, not a tensor collection, or not initialized.
        Only locked storage (shared memory) needs key filtering to prevent adding
        keys that won't propagate in multiprocessing pipelines.
        """
        # (the cache's own name: torch 2.9's dynamo recurses on a property reading its name)
        keys = self.__dict__.get("_storage_keys_cache")
        if keys is None and self.initialized and is_tensor_collection(self._storage):
            # unlocked storages accept new keys, so only a locked one is cached
            if self._storage.is_locked:
                keys = list(
                    self._storage.keys(
                        include_nested=True,
                        leaves_only=True,
                        is_leaf=_NESTED_TENSORS_AS_LISTS,
                    )
                )
                self.__dict__["_storage_keys_cache"] = keys
        return keys

    @_storage_keys.setter
    def _storage_keys(self, value):
        self.__dict__["_storage_keys_cache"] = value

    @property
    def _total_shape(self):
        # Total shape, irrespective of how full the storage is
        _total_shape = self.__dict__.get("_total_shape_value", None)
        if _total_shape is None and self.initialized:
            _total_shape = _shape_of(self._storage)[: self.ndim]
            self.__dict__["_total_shape_value"] = _total_shape
            if self.ndim > 1:
                # under the length's lock: a writer in another process may be adding to it
                self._round_len_to_rows(_total_shape[1:].numel())
        return _total_shape

    @property
    def _is_full(self):
        # whether the storage is full
        return len(self) == self.max_size

    @property
    def _len_along_dim0(self):
        # returns the length of the buffer along dim0
        len_along_dim = len(self)
        if self.ndim > 1:
            _total_shape = self._total_shape
            if _total_shape is None:
                return None
            len_along_dim = -(len_along_dim // -_total_shape[1:].numel())
        return len_along_dim

    def _max_size_along_dim0(self, *, single_data=None, batched_data=None):
        # returns the max_size of the buffer along dim0
        max_size = self.max_size
        if self.ndim > 1:
            shape = self.shape
            if shape is None:
                if single_data is not None:
                    data = single_data
                elif batched_data is not None:
                    data = batched_data
                else:
                    raise ValueError("single_data or batched_data must be passed.")
                datashape = _shape_of(data)[: self.ndim]
                if batched_data is not None:
                    datashape = datashape[1:]
                max_size = -(max_size // -datashape.numel())
            else:
                max_size = -(max_size // -self._total_shape[1:].numel())
        return max_size

    @property
    def shape(self):
        # Shape, truncated where needed to accommodate for the length of the storage
        if self._is_full:
            return self._total_shape
        _total_shape = self._total_shape
        if _total_shape is not None:
            return torch.Size([self._len_along_dim0] + list(_total_shape[1:]))

    # Outside torch.compile's graph, as torchrl's: traced, the draw guards on the length
    # and recompiles at every write. (RandomSampler draws directly when not compiling.)
    @compile_disable()
    def _rand_given_ndim(self, batch_size):
        return self._rand_given_ndim_impl(batch_size)

    def _rand_given_ndim_impl(self, batch_size):
        if self.ndim == 1:
            return _uniform_indices(self, batch_size)
        shape = self.shape
        return tuple(
            torch.randint(_dim, (batch_size,), generator=self._rng, device=self.device)
            for _dim in shape
        )

    def flatten(self):
        if self.ndim == 1:
            return self
        if not self.initialized:
            raise RuntimeError("Cannot flatten a non-initialized storage.")
        ndim = self.ndim
        if self._is_full:
            storage = self._storage
            if is_tensor_collection(storage):
                return TensorStorage(storage.flatten(0, ndim - 1))
            return TensorStorage(tree_map(lambda x: x.flatten(0, ndim - 1), storage))
        n = self._len_along_dim0
        if is_tensor_collection(self._storage):
            return TensorStorage(self._storage[:n].flatten(0, ndim - 1))
        return TensorStorage(
            tree_map(lambda x: x[:n].flatten(0, ndim - 1), self._storage)
        )

    # ---------------------------------------------------------- multiprocess
    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_len_shared", None)
        state.pop("_writes_shared", None)
        # the journal lists this process's writes: a copy starts without any
        state.pop("_journal", None)
        state.pop("_last_run", None)
        if get_spawning_popen() is None:
            # plain pickling: the length and the write count travel as numbers
            length = self._len
            state.pop("_len_value", None)
            state["len__context"] = length
            writes = self._writes_since(None)[0]
            state.pop("_writes_value", None)
            state["writes__context"] = writes
        elif not self.initialized:
            if not getattr(self, "shared_init", False):
                raise RuntimeError(
                    f"Cowardly refusing to share a storage of type {type(self)} between processes if "
                    f"it has not been initialized yet. You can either:\n"
                    f"- Populate the buffer with some data in the main process before passing it to the other processes (or create the buffer explicitly with a TensorStorage).\n"
                    f"- set shared_init=True when creating the storage such that it can be initialized by the remote processes."
                )
            return state
        else:
            # CPU tensors are moved to shared memory by the pickler, CUDA ones are shared
            # by nature and memmaps live in files: anything else cannot be shared.
            def assert_is_sharable(tensor):
                if tensor.device is None or tensor.device.type in (
                    "cuda",
                    "cpu",
                    "meta",
                ):
                    return
                raise RuntimeError(
                    "The storage must be place in shared memory or memmapped before being shared between processes."
                )

            storage = self._storage
            if is_tensor_collection(storage):
                storage.apply(assert_is_sharable, filter_empty=True)
            else:
                # torchrl calls tree_map(storage, fn) here (arguments swapped), which
                # fails for every pytree storage
                for leaf in tree_iter(storage):
                    assert_is_sharable(leaf)
        return state

    def __setstate__(self, state):
        restore_counter(state, "len__context", "_len_value", "_len_shared")
        restore_counter(
            state, "writes__context", "_writes_value", "_writes_shared",
            beside=state.get("_len_value"),
        )
        self.__dict__.update(state)

    # ------------------------------------------------------------ state dict
    def state_dict(self) -> dict[str, Any]:
        return {
            "_storage": self._storage_state_dict(),
            "initialized": self.initialized,
            "_len": self._len,
        }

    def _storage_state_dict(self):
        _storage = self._storage
        if isinstance(_storage, torch.Tensor):
            return _storage
        if is_tensor_collection(_storage):
            return _storage.state_dict()
        if _storage is None:
            return {}
        raise TypeError(
            f"Objects of type {type(_storage)} are not supported by {type(self)}.state_dict"
        )

    # torchrl's text (its memmap storage's omits the hint)
    _PYTREE_STATE_DICT_HINT = ". If your storage is pytree-based, use the dumps/load API instead."

    @_rewrites_items
    def load_state_dict(self, state_dict):
        _storage = copy(state_dict["_storage"])
        if isinstance(_storage, torch.Tensor):
            if isinstance(self._storage, torch.Tensor):
                self._storage.copy_(_storage)
            elif self._storage is None:
                self._storage = self._tensor_from_state_dict(_storage)
            else:
                raise RuntimeError(
                    f"Cannot copy a storage of type {type(_storage)} onto another of type {type(self._storage)}"
                )
        elif isinstance(_storage, (dict, OrderedDict)):
            if is_tensor_collection(self._storage):
                self._storage.load_state_dict(_storage, strict=False)
                self._after_tensordict_load()
            elif self._storage is None:
                self._storage = self._tensordict_from_state_dict(_storage)
            else:
                raise RuntimeError(
                    f"Cannot copy a storage of type {type(_storage)} onto another of type {type(self._storage)}"
                    + self._PYTREE_STATE_DICT_HINT
                )
        else:
            raise TypeError(
                f"Objects of type {type(_storage)} are not supported by ListStorage.load_state_dict"
            )
        self.initialized = state_dict["initialized"]
        self._len = state_dict["_len"]

    # What load_state_dict makes of a saved tensor or tensordict when the storage holds
    # nothing yet (a memmap storage memory-maps them).
    def _tensor_from_state_dict(self, tensor):
        return tensor

    def _tensordict_from_state_dict(self, state_dict):
        return TensorDict().load_state_dict(state_dict, strict=False)

    def _after_tensordict_load(self):
        pass

    # ----------------------------------------------------------------- write
    def _set_tree_map(self, cursor, data, storage):
        def set_tensor(datum, store):
            store[cursor] = datum

        tree_map(set_tensor, data, storage)

    def _get_new_len(self, data, cursor):
        ndim = self.ndim - _is_int(cursor)
        numel = _shape_of(data)[:ndim].numel()
        self._add_len(numel)

    def set(
        self,
        cursor: int | Sequence[int] | slice,
        data: TensorDictBase | torch.Tensor,
        *,
        set_cursor: bool = True,
    ):
        if isinstance(data, list):
            try:
                data = _flip_list(data)
            except Exception:
                raise RuntimeError(
                    "Stacking the elements of the list resulted in "
                    "an error. "
                    f"Storages of type {type(self)} expect all elements of the list "
                    f"to have the same tree structure. If the list is compact (each "
                    f"leaf is itself a batch with the appropriate number of elements) "
                    f"consider using a tuple instead, as lists are used within `extend` "
                    f"for per-item addition."
                )
        try:
            is_tc = is_tensor_collection(data)
            if not self.initialized:
                if not isinstance(cursor, INT_CLASSES):
                    if is_tc:
                        self._init(data[0])
                    else:
                        self._init(tree_map(lambda x: x[0], data))
                else:
                    self._init(data)
            if is_tc:
                # Only a locked (shared) storage caches its keys: extra keys in the data
                # (e.g. added by a policy) cannot reach its shared memory, so drop them.
                storage_keys = self._storage_keys
                if storage_keys is not None:
                    data = data.select(*storage_keys, strict=False)
                try:
                    self._storage[cursor] = data
                except RuntimeError as e:
                    if "locked" in str(e).lower():
                        self._raise_informative_lock_error(data, e)
                    raise
            elif isinstance(data, torch.Tensor) and isinstance(
                self._storage, torch.Tensor
            ):
                self._storage[cursor] = data
            else:
                self._set_tree_map(cursor, data, self._storage)
            if set_cursor:
                self._get_new_len(data, cursor)
                self._last_cursor = cursor
        except BaseException:
            # part of the items may be written: readers must read everything again
            self._note_write(ALL_ITEMS)
            raise
        self._note_write(cursor)

    def _note_rows_written(
        self, cursor, numel: int, *, complete: bool = True, first_row: int | None = None
    ) -> None:
        """Books a write made straight into this storage's tensors, as :meth:`set` does.

        A writer that copies a batch leaf by leaf into the rows ``cursor`` (a 1-D index
        tensor) of an initialized storage calls this once the copies are done: the length
        grows by ``numel``, ``_last_cursor`` becomes ``cursor`` and the write is journaled.
        ``complete=False`` books a write that stopped part-way: the length stays, and
        readers following the writes learn that any item may have changed.

        ``first_row`` says that ``cursor`` is ``(first_row + arange(numel)) % max_size`` (a
        round-robin write to a 1-D storage, ``0 <= first_row < max_size``): the write is
        then journaled as that :class:`~torchrl_compat._storage_journal.RowRun`, and the
        last row of ``cursor`` is remembered beside it (see :meth:`_last_cursor_row`).
        """
        if not complete:
            self._note_write(ALL_ITEMS)
            return
        self._add_len(numel)
        self._last_cursor = cursor
        journal = self.__dict__.get("_journal")
        if first_row is None or journal is None or not journal.followed:
            self._note_write(cursor)  # counted; journaled only once a reader follows
            return
        if not numel or cursor.is_inference():
            # no last row (an empty cursor), or no version counter to tell an edit by
            self.__dict__.pop("_last_run", None)
        else:
            # the row is trusted for as long as the very tensor, unmodified, is the last cursor
            last = (first_row + numel - 1) % self.max_size
            self.__dict__["_last_run"] = (cursor, cursor._version, last)
        self._note_write(RowRun(first_row, numel))

    def _last_cursor_row(self, cursor) -> int | None:
        """The last row of ``cursor`` when it is the index tensor of the last round-robin
        write booked by :meth:`_note_rows_written` and was not modified since; ``None``
        otherwise (the caller then reads ``cursor`` itself). O(1), no tensor op."""
        run = self.__dict__.get("_last_run")
        if run is not None and run[0] is cursor and cursor._version == run[1]:
            return run[2]
        return None

    def _wait_for_init(self):
        pass

    def _raise_informative_lock_error(
        self, data: TensorDictBase | torch.Tensor, original_error: RuntimeError
    ) -> None:
        """Raise an informative error when storage is locked and data has different keys.

        This method is called when an assignment to the storage fails due to a lock error.
        It provides detailed information about which keys are new in the data vs what the
        storage expects.
        """
        if not is_tensor_collection(data) or not is_tensor_collection(self._storage):
            raise original_error

        def leaf_keys(td):
            return set(
                td.keys(
                    include_nested=True,
                    leaves_only=True,
                    is_leaf=_NESTED_TENSORS_AS_LISTS,
                )
            )

        storage_keys = leaf_keys(self._storage)
        data_keys = leaf_keys(data)
        new_keys = data_keys - storage_keys
        missing_keys = storage_keys - data_keys

        error_parts = [
            "Cannot write to locked storage due to key mismatch.",
            f"\nOriginal error: {original_error}",
        ]
        if new_keys:
            error_parts.append(
                f"\n\nNew keys in data (not in storage): {sorted(str(k) for k in new_keys)}"
            )
        if missing_keys:
            error_parts.append(
                f"\n\nMissing keys in data (present in storage): {sorted(str(k) for k in missing_keys)}"
            )
        if new_keys or missing_keys:
            error_parts.append(
                "\n\nThis typically happens when:"
                "\n  1. The policy is called on some steps but not others (e.g., during init_random_frames)"
                "\n  2. A transform conditionally adds keys based on data content"
                "\n  3. Different collectors/workers produce data with different keys"
                "\n\nTo fix this, ensure all data written to the buffer has consistent keys."
            )
        else:
            error_parts.append(
                "\n\nNo key differences detected. The lock error may be due to shape or dtype mismatches."
            )
        raise RuntimeError("".join(error_parts)) from original_error

    # ------------------------------------------------------------------ read
    def get(self, index: int | Sequence[int] | slice) -> Any:
        if not self.initialized:
            if getattr(self, "shared_init", False):
                self._wait_for_init()
            raise RuntimeError("Cannot get elements out of a non-initialized storage.")
        _storage = self._storage
        is_tc = is_tensor_collection(_storage)
        if not self._is_full:
            length = self._len_along_dim0
            # traced, slice first as torchrl does (the check reads the index values)
            mapped = None if is_compiling() else filled_index(index, length)
            if mapped is None:
                # index kinds that depend on the filled length (masks...): slice first
                if is_tc:
                    _storage = _storage[:length]
                else:
                    _storage = tree_map(lambda x: x[:length], _storage)
            else:
                index = mapped
        if is_tc or isinstance(_storage, torch.Tensor):
            return _storage[index]
        return tree_map(lambda x: x[index], _storage)

    @_rewrites_items
    def _empty(self):
        # the data keeps its structure: resetting the length is enough
        self._len = 0

    @_rewrites_items
    def _apply_checkpoint(self, load) -> None:
        load()

    def _init(self):
        raise NotImplementedError(
            f"{type(self)} must be initialized during construction."
        )

    def __repr__(self):
        if not self.initialized:
            storage_str = textwrap.indent("data=<empty>", 4 * " ")
        elif is_tensor_collection(self._storage):
            storage_str = textwrap.indent(f"data={self[:]}", 4 * " ")
        else:

            def repr_item(x):
                if isinstance(x, torch.Tensor):
                    return f"{x.__class__.__name__}(shape={x.shape}, dtype={x.dtype}, device={x.device})"
                return x.__class__.__name__

            storage_str = textwrap.indent(
                f"data={tree_map(repr_item, self[:])}", 4 * " "
            )
        shape_str = textwrap.indent(f"shape={self.shape}", 4 * " ")
        len_str = textwrap.indent(f"len={len(self)}", 4 * " ")
        maxsize_str = textwrap.indent(f"max_size={self.max_size}", 4 * " ")
        return f"{self.__class__.__name__}(\n{storage_str}, \n{shape_str}, \n{len_str}, \n{maxsize_str})"

    def contains(self, item):
        if isinstance(item, int):
            if item < 0:
                item += self._len_along_dim0
            return 0 <= item < self._len_along_dim0
        if isinstance(item, torch.Tensor):

            def _is_valid_index(idx):
                try:
                    torch.zeros(self.shape, device="meta")[idx]
                    return True
                except IndexError:
                    return False

            if item.ndim:
                return torch.tensor(
                    [_is_valid_index(idx) for idx in item],
                    dtype=torch.bool,
                    device=item.device,
                )
            return torch.tensor(_is_valid_index(item), device=item.device)
        raise NotImplementedError(f"type {type(item)} is not supported yet.")


class LazyTensorStorage(TensorStorage, *torchrl_twin("storages", "LazyTensorStorage")):
    """A pre-allocated tensor storage for tensors and tensordicts.

    Args:
        max_size (int): size of the storage, i.e. maximum number of elements stored
            in the buffer.

    Keyword Args:
        device (torch.device, optional): device where the sampled tensors will be
            stored and sent. Default is :obj:`torch.device("cpu")`.
            If "auto" is passed, the device is automatically gathered from the
            first batch of data passed. This is not enabled by default to avoid
            data placed on GPU by mistake, causing OOM issues.
        ndim (int, optional): the number of dimensions to be accounted for when
            measuring the storage size. For instance, a storage of shape ``[3, 4]``
            has capacity ``3`` if ``ndim=1`` and ``12`` if ``ndim=2``.
            Defaults to ``1``.
        compilable (bool, optional): whether the storage is compilable.
            If ``True``, the writer cannot be shared between multiple processes.
            Defaults to ``False``.
        consolidated (bool, optional): if ``True``, the storage will be consolidated after
            its first expansion. Defaults to ``False``.
        shared_init (bool, optional): if ``True``, enables multiprocess coordination
            during storage initialization. First process initializes with memmap,
            others wait and load from the shared memmap. Defaults to ``False``.
        cleanup_memmap (bool, optional): if ``True`` and ``shared_init=True``, the
            temporary directory holding the initialization memmap is removed when the
            process that created the storage exits. Defaults to ``True``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyTensorStorage
        >>> data = TensorDict({
        ...     "some data": torch.randn(10, 11),
        ...     ("some", "nested", "data"): torch.randn(10, 11, 12),
        ... }, batch_size=[10, 11])
        >>> storage = LazyTensorStorage(100)
        >>> storage.set(range(10), data)
        >>> len(storage)  # only the first dimension is considered as indexable
        10
        >>> storage.get(0).batch_size
        torch.Size([11])

    .. note:: With ``ndim > 1`` the capacity is rounded up to whole rows at the first
        write, and the length counts the elements actually written: torchrl computes
        the length from the capacity *before* rounding, so ``LazyTensorStorage(10, ndim=2)``
        filled with one ``[3, 4]`` batch reports ``len == 10`` (and not full) although
        all 12 slots hold data. Ours reports 12. For tensor and pytree data torchrl also
        counts the feature dimensions of the leaves in ``max_size`` (a ``[3, 4, 3]``
        tensor batch into ``LazyTensorStorage(32, ndim=2)`` gives ``max_size == 96``), so
        the length overshoots the capacity and the storage never becomes full; here
        ``max_size`` counts the ``ndim`` leading dimensions only.

    .. note:: torchrl documents ``cleanup_memmap`` but never uses it, leaving the
        ``torchrl_storage_init_*`` directory of a ``shared_init`` storage behind. Here it
        is removed at exit (or on SIGINT/SIGTERM) of the creating process; processes that
        already mapped the files keep reading them.
    """

    _default_checkpointer = TensorStorageCheckpointer

    def __init__(
        self,
        max_size: int,
        *,
        device: torch.device | str = "cpu",
        ndim: int = 1,
        compilable: bool = False,
        consolidated: bool = False,
        shared_init: bool = False,
        cleanup_memmap: bool = True,
    ):
        super().__init__(
            storage=None,
            max_size=max_size,
            device=device,
            ndim=ndim,
            compilable=compilable,
        )
        self.consolidated = consolidated
        self.shared_init = shared_init
        self.cleanup_memmap = cleanup_memmap
        if self.shared_init:
            if self._compilable:
                raise RuntimeError(
                    "Cannot share a compilable storage between processes."
                )
            self._init_lock = mp.Lock()
            self._init_event = mp.Event()
            self._make_init_directory()

    def _make_init_directory(self):
        if getattr(self, "scratch_dir", None) is not None:
            self._init_directory = self.scratch_dir
            return
        self.scratch_dir = self._init_directory = tempfile.mkdtemp(
            prefix="torchrl_storage_init_"
        )
        if self.cleanup_memmap and not isinstance(self, LazyMemmapStorage):
            # (a LazyMemmapStorage registers itself, see auto_cleanup)
            self._init_cleanup = _storage_cleanup.InitDirectoryCleanup(self._init_directory)
            _storage_cleanup.register(self._init_cleanup)

    def _cleanup_init_directory(self) -> bool:
        """Removes the temporary initialization directory of a ``shared_init`` storage
        (only in the process that created the storage).

        Returns:
            bool: ``True`` if a directory was removed.
        """
        cleanup = getattr(self, "_init_cleanup", None)
        return cleanup.cleanup() if cleanup is not None else False

    def _init(
        self,
        data: TensorDictBase | torch.Tensor | PyTree,  # noqa: F821
    ) -> None:
        if not self.shared_init:
            return self._init_standard(data)
        # The first process to take the lock builds the memmap; the others wait for it.
        is_coordinator = not self._init_event.is_set()
        is_coordinator = is_coordinator and self._init_lock.acquire(block=False)
        if is_coordinator:
            try:
                self._init_coordinator(data)
            finally:
                self._init_event.set()
                self._init_lock.release()
        else:
            self._wait_for_init()
        self.initialized = True

    def _max_size_fn(self):
        def max_size_along_dim0(data_shape):
            if self.ndim > 1:
                result = (
                    -(self.max_size // -data_shape[: self.ndim - 1].numel()),
                    *data_shape,
                )
                # count storage slots only: torchrl multiplies in the feature dims of
                # tensor leaves too, inflating max_size past the capacity
                self.max_size = torch.Size(result[: self.ndim]).numel()
                return result
            return (self.max_size, *data_shape)

        return max_size_along_dim0

    @_rewrites_items
    def _init_standard(
        self,
        data: TensorDictBase | torch.Tensor | PyTree,  # noqa: F821
    ) -> None:
        """Standard initialization without multiprocess coordination."""
        if self.device == "auto":
            self.device = _device_of(data)
        max_size_along_dim0 = self._max_size_fn()
        if is_tensor_collection(data):
            out = data.to(self.device)
            out = torch.empty_like(out.expand(max_size_along_dim0(data.shape)))
            if self.consolidated:
                out = out.consolidate()
        else:
            if self.consolidated:
                raise ValueError("Cannot consolidate non-tensordict storages.")
            out = tree_map(
                lambda leaf: torch.empty(
                    max_size_along_dim0(leaf.shape),
                    device=self.device,
                    dtype=leaf.dtype,
                ),
                data,
            )
        self._storage = out
        self.initialized = True
        if hasattr(out, "shape"):
            logger.info(f"Initialized LazyTensorStorage with {out.shape} shape")

    @_rewrites_items
    def _init_coordinator(
        self,
        data: TensorDictBase | torch.Tensor | PyTree,  # noqa: F821
    ) -> None:
        """Initialize storage as the coordinating process using temporary memmap."""
        # the other processes load the structure from the shared directory
        memmap_storage = LazyMemmapStorage(
            max_size=self.max_size,
            scratch_dir=self._init_directory,
            ndim=self.ndim,
            existsok=False,
            shared_init=False,
            auto_cleanup=False,
        )
        memmap_storage._init_standard(data)
        self.max_size = memmap_storage.max_size
        self._storage = memmap_storage._storage

    @_rewrites_items
    def _wait_for_init(self) -> None:
        # wait till the coordinator has initialized the memmap
        self._init_event.wait()
        self._storage = TensorDict.load_memmap(self._init_directory)
        if self.ndim > 1:
            self.max_size = self._storage.shape[: self.ndim].numel()
        self.initialized = True

    def get(self, indices: slice) -> TensorDictBase | torch.Tensor | Any:
        if not self.initialized and self.shared_init:
            self._wait_for_init()
        return super().get(indices)

    def __del__(self):
        try:
            self._cleanup_init_directory()
        except Exception:
            # interpreter shutdown: the exit hook removes it
            pass


class LazyMemmapStorage(LazyTensorStorage, *torchrl_twin("storages", "LazyMemmapStorage")):
    """A memory-mapped storage for tensors and tensordicts.

    Args:
        max_size (int): size of the storage, i.e. maximum number of elements stored
            in the buffer.

    Keyword Args:
        scratch_dir (str or path): directory where memmap-tensors will be written.
            If ``shared_init=True`` and no ``scratch_dir`` is provided, a shared
            temporary directory will be created automatically.
        device (torch.device, optional): device where the sampled tensors will be
            stored and sent. Default is :obj:`torch.device("cpu")`.
            ``"auto"`` is accepted and means the CPU: memory maps only live there.
        ndim (int, optional): the number of dimensions to be accounted for when
            measuring the storage size. For instance, a storage of shape ``[3, 4]``
            has capacity ``3`` if ``ndim=1`` and ``12`` if ``ndim=2``.
            Defaults to ``1``.
        existsok (bool, optional): whether an error should be raised if any of the
            tensors already exists on disk. Defaults to ``False``. If ``True``, the
            tensor will be opened as is, not overwritten.
        compilable (bool, optional): whether the storage is compilable.
            Defaults to ``False``.
        shared_init (bool, optional): if ``True``, enables multiprocess coordination
            during storage initialization. First process initializes the memmap,
            others wait and load from the shared directory. Defaults to ``False``.
        auto_cleanup (bool, optional): if ``True``, automatically registers this
            storage for cleanup when the process exits (normally or via Ctrl+C/SIGTERM).
            This removes the memmap files from disk when no longer needed.
            Defaults to ``True`` when ``scratch_dir`` is ``None`` (using temp directory),
            and ``False`` when a custom ``scratch_dir`` is provided (preserving user data).

    .. note:: When checkpointing a ``LazyMemmapStorage``, one can provide a path identical to where the storage is
        already stored to avoid executing long copies of data that is already stored on disk.
        This will only work if the default :class:`~torchrl_compat.TensorStorageCheckpointer` checkpointer is used.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyMemmapStorage
        >>> data = TensorDict({
        ...     "some data": torch.randn(10, 11),
        ...     ("some", "nested", "data"): torch.randn(10, 11, 12),
        ... }, batch_size=[10, 11])
        >>> storage = LazyMemmapStorage(100)
        >>> storage.set(range(10), data)
        >>> len(storage)  # only the first dimension is considered as indexable
        10
        >>> type(storage.get(0)["some data"]).__name__
        'MemoryMappedTensor'

    .. note:: Cleanup at exit or on a signal only removes what the storage owns: its
        temporary directory, in the process that created it. torchrl's handler, inherited
        by forked children, also runs in a child stopped by SIGTERM and deletes the
        parent's live files; and for storages without ``scratch_dir`` it removes every
        directory under the system temporary directory holding one of the storage's files.
        When torchrl is importable, storages with ``auto_cleanup`` register in torchrl's
        own ``_MEMMAP_STORAGE_REGISTRY``, so the exit and signal cleanup of either library
        removes the files of both libraries' storages.
    """

    _default_checkpointer = TensorStorageCheckpointer

    def __init__(
        self,
        max_size: int,
        *,
        scratch_dir=None,
        device: torch.device | str = "cpu",
        ndim: int = 1,
        existsok: bool = False,
        compilable: bool = False,
        shared_init: bool = False,
        auto_cleanup: bool | None = None,
    ):
        self.initialized = False
        self.scratch_dir = None
        self._scratch_dir_is_temp = scratch_dir is None
        self.existsok = existsok
        if scratch_dir is not None:
            self.scratch_dir = str(scratch_dir)
            if self.scratch_dir[-1] != "/":
                self.scratch_dir += "/"
        super().__init__(
            max_size,
            ndim=ndim,
            compilable=compilable,
            shared_init=shared_init,
            cleanup_memmap=False,
        )
        self.device = (
            _make_ordinal_device(torch.device(device))
            if device != "auto"
            else torch.device("cpu")
        )
        if self.device.type != "cpu":
            raise ValueError(
                "Memory map device other than CPU isn't supported. To cast your data to the desired device, "
                "use `buffer.append_transform(lambda x: x.to(device))` or a similar transform."
            )
        self._len = 0
        # temp directories are ours to delete; a user's directory holds their data
        if auto_cleanup is None:
            auto_cleanup = self._scratch_dir_is_temp
        self._auto_cleanup = auto_cleanup
        self._cleaned_up = False
        self._owner_pid = os.getpid()
        if self._auto_cleanup:
            _storage_cleanup.register(self)

    def _storage_state_dict(self):
        _storage = self._storage
        if isinstance(_storage, torch.Tensor):
            return _mem_map_tensor_as_tensor(_storage)
        if isinstance(_storage, TensorDictBase):
            return _storage.apply(_mem_map_tensor_as_tensor).state_dict()
        if _storage is None:
            return {}
        raise TypeError(
            f"Objects of type {type(_storage)} are not supported by LazyTensorStorage.state_dict. If you are trying to serialize a PyTree, the storage.dumps/loads is preferred."
        )

    _PYTREE_STATE_DICT_HINT = ""

    def _tensor_from_state_dict(self, tensor):
        path = self.scratch_dir + "/tensor.memmap" if self.scratch_dir is not None else None
        return _make_memmap(tensor, path=path)

    def _tensordict_from_state_dict(self, state_dict):
        warnings.warn(
            "Loading the storage on an uninitialized TensorDict."
            "It is preferable to load a storage onto a"
            "pre-allocated one whenever possible."
        )
        return TensorDict().load_state_dict(state_dict, strict=False).memmap_()

    def _after_tensordict_load(self):
        self._storage.memmap_()

    def _init_coordinator(self, data: TensorDictBase | torch.Tensor | Any) -> None:
        return self._init_standard(data)

    @_rewrites_items
    def _init_standard(self, data: TensorDictBase | torch.Tensor) -> None:
        if self.device == "auto":
            self.device = _device_of(data)
        if self.device.type != "cpu":
            raise RuntimeError("Support for Memmap device other than CPU is deprecated")
        max_size_along_dim0 = self._max_size_fn()
        if is_tensor_collection(data):
            out = data.clone().to(self.device)
            out = out.expand(max_size_along_dim0(data.shape))
            out = out.memmap_like(prefix=self.scratch_dir, existsok=self.existsok)
            if logger.isEnabledFor(logging.DEBUG):
                for key, tensor in sorted(
                    out.items(
                        include_nested=True,
                        leaves_only=True,
                        is_leaf=_NESTED_TENSORS_AS_LISTS,
                    ),
                    key=str,
                ):
                    try:
                        filesize = os.path.getsize(tensor.filename) / 1024 / 1024
                        logger.debug(
                            f"\t{key}: {tensor.filename}, {filesize} Mb of storage (size: {tensor.shape})."
                        )
                    except (AttributeError, RuntimeError):
                        pass
        else:
            out = _init_pytree(self.scratch_dir, max_size_along_dim0, data)
        self._storage = out
        if hasattr(out, "shape"):
            logger.info(f"Initialized LazyMemmapStorage with {out.shape} shape")
        self.initialized = True

    def get(self, index: int | Sequence[int] | slice) -> Any:
        return super().get(index)

    def cleanup(self) -> bool:
        """Clean up memmap files from disk.

        This method removes the memmap directory and all its contents from disk.
        It is automatically called on process exit if ``auto_cleanup=True``.

        Returns:
            bool: ``True`` if cleanup was performed, ``False`` if already cleaned up
                or no cleanup needed.

        .. note:: Without a ``scratch_dir`` the memory maps are anonymous (they vanish
            with the process) and nothing is removed from disk. Only the storage object
            that created the files removes them, in its own process: a forked, unpickled
            or deep-copied storage shares them with it, and its ``cleanup()`` returns
            ``False``.

        Examples:
            >>> from torchrl_compat import LazyMemmapStorage
            >>> storage = LazyMemmapStorage(1000, auto_cleanup=True)
            >>> storage.cleanup()  # Manually clean up when done
            False
        """
        if getattr(self, "_cleaned_up", False):
            return False
        if getattr(self, "_owner_pid", os.getpid()) != os.getpid():
            return False
        self._cleaned_up = True
        scratch_dir = getattr(self, "scratch_dir", None)
        if scratch_dir is None:
            return False
        return _storage_cleanup.remove_tree(scratch_dir)

    def __getstate__(self):
        state = super().__getstate__()
        # a copy (in another process, or a deep copy) shares the files with this storage,
        # which alone removes them
        state["_owner_pid"] = None
        return state

    def __del__(self):
        """Ensure cleanup on garbage collection if auto_cleanup is enabled."""
        if getattr(self, "_auto_cleanup", False):
            self.cleanup()


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

    def state_dict(self) -> dict[str, Any]:
        """Save the storage state."""
        return {"_storage": self._storage, "_metadata": self._metadata}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the storage state."""
        self._storage = state_dict["_storage"]
        self._metadata = state_dict["_metadata"]

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


class StorageEnsemble(Storage, *torchrl_twin("storages", "StorageEnsemble")):
    """An ensemble of storages.

    This class is designed to work with :class:`~torchrl.data.replay_buffers.replay_buffers.ReplayBufferEnsemble`.

    Args:
        storages (sequence of Storage): the storages to make the composite storage.

    Keyword Args:
        transforms (list of :class:`~torchrl.envs.Transform`, optional): a list of
            transforms of the same length as storages.

    .. warning::
      This class signatures for :meth:`get` does not match other storages, as
      it will return a tuple ``(buffer_id, samples)`` rather than just the samples.

    .. warning::
       This class does not support writing (similarly to :class:`~torchrl.data.replay_buffers.writers.WriterEnsemble`).
       To extend one of the replay buffers, simply index the parent
       :class:`~torchrl.data.ReplayBufferEnsemble` object.

    .. note:: Unlike torchrl's, the ensemble has a checkpointer from the start
        (:class:`~torchrl_compat.StorageEnsembleCheckpointer`), so :meth:`dumps` and
        ``register_save_hook`` work instead of raising ``AttributeError``.
    """

    _default_checkpointer = StorageEnsembleCheckpointer

    def __init__(
        self,
        *storages: Storage,
        transforms: list[Transform] = None,  # noqa: F821
    ):
        self._rng_private = None
        self._storages = storages
        self._transforms = transforms
        if transforms is not None and len(transforms) != len(storages):
            raise TypeError(
                "transforms must have the same length as the storages provided."
            )
        self._checkpointer = self._default_checkpointer()
        self._compilable = False
        self._attached_entities_list = []

    _rng = members_rng("_storages")

    def extend(self, value):
        raise RuntimeError(
            "StorageEnsemble does not support writing: extend one of its storages (or index the parent ReplayBufferEnsemble)."
        )

    def add(self, value):
        raise RuntimeError(
            "StorageEnsemble does not support writing: add to one of its storages (or index the parent ReplayBufferEnsemble)."
        )

    def set(self, cursor, data, *, set_cursor: bool = True):
        raise RuntimeError(
            "StorageEnsemble does not support writing: set data in one of its storages."
        )

    def get(self, item):
        # the buffer id is returned too, to pick the matching collate_fn
        buffer_ids = item.get("buffer_ids")
        index = item.get("index")
        results = []
        for buffer_id, sample in zip(buffer_ids, index):
            buffer_id = self._convert_id(buffer_id)
            results.append((buffer_id, self._get_storage(buffer_id).get(sample)))
        if self._transforms is not None:
            results = [
                (buffer_id, self._transforms[buffer_id](result))
                if self._transforms[buffer_id] is not None
                else (buffer_id, result)
                for buffer_id, result in results
            ]
        return results

    def _convert_id(self, sub):
        if isinstance(sub, torch.Tensor):
            sub = sub.item()
        return sub

    def _get_storage(self, sub):
        return self._storages[sub]

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError

    _INDEX_ERROR = INDEX_ERROR

    def __getitem__(self, index):
        return select_members(
            self,
            index,
            self._storages,
            self._selection,
            kind="storages",
            index_each=lambda rest: [storage[rest] for storage in self._storages],
            ensemble_class=StorageEnsemble,
        )

    def _selection(self, selection) -> StorageEnsemble:
        storages = pick(self._storages, selection)
        transforms = pick(self._transforms, selection) if self._transforms is not None else [None] * len(storages)
        return StorageEnsemble(*storages, transforms=transforms)

    def __len__(self):
        return len(self._storages)

    def __repr__(self):
        storages = textwrap.indent(f"storages={self._storages}", " " * 4)
        transforms = textwrap.indent(f"transforms={self._transforms}", " " * 4)
        return f"StorageEnsemble(\n{storages}, \n{transforms})"


# =============================================================================
# Utils
# =============================================================================


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


def _mem_map_tensor_as_tensor(mem_map_tensor) -> torch.Tensor:
    if isinstance(mem_map_tensor, torch.Tensor):
        # MemoryMappedTensor is a torch.Tensor subclass: nothing to convert
        return mem_map_tensor


def _collate_list_tensordict(x):
    return torch.stack(x, 0)


def _stack_anything(data):
    """Stacks a list of tensors, tensordicts or pytrees of tensors along a new first dim."""
    if is_tensor_collection(data[0]):
        return LazyStackedTensorDict.maybe_dense_stack(data)
    return tree_map(
        lambda *x: torch.stack(x),
        *data,
        is_leaf=lambda x: isinstance(x, torch.Tensor) or is_tensor_collection(x),
    )


def _collate_id(x):
    return x


def _get_default_collate(storage, _is_tensordict=False):
    if isinstance(storage, (LazyStackStorage, TensorStorage)):
        return _collate_id
    if isinstance(storage, CompressedListStorage):
        return lazy_stack
    if isinstance(storage, (ListStorage, StorageEnsemble)):
        return _stack_anything
    raise NotImplementedError(
        f"Could not find a default collate_fn for storage {type(storage)}."
    )


def _make_memmap(tensor, path):
    return MemoryMappedTensor.from_tensor(tensor, filename=path)


def _make_empty_memmap(shape, dtype, path):
    return MemoryMappedTensor.empty(shape=shape, dtype=dtype, filename=path)


def _flip_list(data):
    """Turns a list of items (tensordicts or same-structure pytrees) into one stacked item."""
    if all(is_tensor_collection(_data) for _data in data):
        return torch.stack(data)
    flat_data, flat_specs = zip(*[tree_flatten(item) for item in data])
    stacks = [torch.stack(item) for item in zip(*flat_data)]
    return tree_unflatten(stacks, flat_specs[0])
