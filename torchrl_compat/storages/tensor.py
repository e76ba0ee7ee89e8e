"""Tensor storages: :class:`TensorStorage`, :class:`LazyTensorStorage` and the memory-mapped :class:`LazyMemmapStorage`."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import tempfile
import textwrap
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from copy import copy
from multiprocessing.context import get_spawning_popen
from typing import Any

import torch
from tensordict import is_tensor_collection, LazyStackedTensorDict, TensorDict, TensorDictBase
from tensordict.base import _NESTED_TENSORS_AS_LISTS
from tensordict.memmap import MemoryMappedTensor
from torch.utils._pytree import tree_map

from .. import _directory_cleanup
from ._first_write import (
    build_storage,
    empty_leaf,
    memmap_leaf,
    plain_leaves,
    write_leaf_rows,
)
from ._counters import (
    compile_disable,
    is_compiling,
    outside_graph,
    restore_counter,
    shared_counter,
)
from ._index import filled_index
from .._releases import since
from ._journal import ALL_ITEMS, JOURNAL_LENGTH, RowRun, WriteJournal
from .._torchrl_lookup import torchrl_twin
from ..checkpointers import TensorStorageCheckpointer
from ..utils import (
    _init_pytree,
    _is_int,
    _make_ordinal_device,
    INT_CLASSES,
    tree_iter,
)
from ._rows import get_rows, LeafArrays, set_rows
from .base import Storage, _initializes_items, _rewrites_items, _uniform_indices
from .utils import _collate_id, _device_of, _flip_list, _leading_dim, _shape_of


# torchrl's logger: a user who configures logging.getLogger("torchrl") configures ours too
logger = logging.getLogger("torchrl")


# The module-level names torchrl 0.11 has here, for code that reaches them.
_MEMMAP_STORAGE_REGISTRY = _directory_cleanup.registry()


_cleanup_all_memmap_storages = _directory_cleanup._cleanup_all


_signal_cleanup_handler = _directory_cleanup._on_signal


_register_cleanup_handlers = _ensure_cleanup_handlers = _directory_cleanup._install_handlers


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

    # what a buffer collates its samples with (see utils._get_default_collate)
    _default_collate_fn = staticmethod(_collate_id)

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
        if compilable:
            # made now: a compiled write that made it would be compiled again once it exists
            self._compilable_writes()
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
    # object, read without the lock on the hot path (see ``_counters``). A
    # compilable storage keeps a 0-d int64 tensor instead.

    def _make_shared_len(self, value: int = 0):
        shared = shared_counter(value)
        self.__dict__["_len_value"] = shared
        self.__dict__["_len_shared"] = shared.get_obj()
        if self.__dict__.get("_writes_value") is None:
            # with the length, so that a storage forked before its first write shares both
            self._make_shared_writes()
        if self.__dict__.get("_last_cursor_value") is None:
            self._make_shared_last_cursor()
        return shared

    def _make_shared_last_cursor(self, value: int | None = None):
        """The last time coordinate written (``_last_cursor_index``), shared like the length
        (-1: none yet)."""
        if value is None:
            value = self._last_cursor_index
        shared = shared_counter(-1 if value is None else value, beside=self.__dict__.get("_len_value"))
        self.__dict__["_last_cursor_value"] = shared
        self.__dict__["_last_cursor_shared"] = shared.get_obj()
        return shared

    @property
    def _len(self):
        d = self.__dict__
        shared = d.get("_len_shared")
        if shared is not None:
            return shared.value
        if self._compilable:
            length = self._compilable_len()
            return length if is_compiling() else int(length)
        return self._make_shared_len().get_obj().value

    def _compilable_len(self) -> torch.Tensor:
        """The length of a compilable storage: a 0-d int64 tensor updated in place, so that
        a compiled write neither guards on it nor recompiles when it changes (an int would
        be specialized, at least once per compiled frame). Made if missing."""
        length = getattr(self, "_len_value", None)
        if length is None:  # (``__setstate__`` makes it a tensor when it was pickled)
            length = self._len_value = torch.zeros((), dtype=torch.int64)
        return length

    @_len.setter
    @outside_graph
    def _len(self, value):
        if self._compilable:
            length = self._compilable_len()
            if isinstance(value, torch.Tensor):
                length.copy_(value)
            else:
                length.fill_(value)
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
            length = self._compilable_len()
            length.copy_(update(length))
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
        if self._compilable:
            self._update_len(lambda length: (length + numel).clamp_max(max_size))
        else:
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
    # in a journal local to the process (``_journal.WriteJournal``). A change that
    # may touch any item (emptying, loading, a write that failed half-way) records no
    # cursor: readers behind it read everything again. ``_writes_since`` tells a reader what
    # it missed. The count is also the storage's ``_mutation_revision``: one step a write,
    # as torchrl 0.14 counts (a first write's initialization is not a step of its own). A
    # compilable storage counts in a 0-d tensor (see ``_counters``).

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
            if self._compilable:
                self._compiled_writes = []
        return journal

    def _journal_compiled_writes(self, count: int) -> None:
        """Journals the writes of a compilable storage made in compiled graphs since the last
        eager one: the latest of them, whose write count reached ``count``."""
        pending = self.__dict__.get("_compiled_writes")
        if not pending:
            return
        journal = self.__dict__["_journal"]
        first = count - len(pending) + 1
        for offset, cursor in enumerate(pending):
            journal.append(first + offset, cursor)
        pending.clear()

    def _note_all_written(self) -> None:
        """Counts a change of every item (files remapped by a checkpointer, a load): readers
        read them all again."""
        self._note_write(ALL_ITEMS)

    @outside_graph
    def _note_write(self, cursor) -> None:
        """Counts a write at ``cursor`` (``ALL_ITEMS``: anywhere) and journals it. O(1).

        Called once the items are written, so that a reader seeing the new count reads
        the new items.
        """
        d = self.__dict__
        if self._compilable:
            # never shared (compilable storages refuse it): a 0-d tensor counted in place,
            # which torch.compile neither guards on nor recompiles for (as torchrl's
            # compilable revision)
            counter = self._compilable_writes()
            counter.add_(1)
            journal = getattr(self, "_journal", None)
            if journal is None or not journal.followed:
                return
            if is_compiling():
                # a graph cannot read its count: the cursor waits in a list (an append
                # torch.compile replays after the graph) until the next eager call
                pending = self._compiled_writes
                if len(pending) >= JOURNAL_LENGTH:
                    pending.pop(0)  # older than any reader could use: it leaves a gap
                pending.append(cursor if cursor is ALL_ITEMS or not isinstance(cursor, torch.Tensor) else cursor.clone())
                return
            count = int(counter)
            self._journal_compiled_writes(count - 1)
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
            :class:`~torchrl_compat.storages._journal.RowRun` for the round-robin writes
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
        if raw is None:
            now = int(self._compilable_writes())
            self._journal_compiled_writes(now)
        else:
            now = raw.value
        if count is None:
            return now, None
        return now, journal.since(count, now)

    def _compilable_writes(self) -> torch.Tensor:
        """The write count of a compilable storage: a 0-d int64 tensor, made if missing."""
        counter = getattr(self, "_writes_value", None)
        if counter is None:  # (``__setstate__`` makes it a tensor when it was pickled)
            counter = self._writes_value = torch.zeros((), dtype=torch.int64)
        return counter

    # The mutation revision is the shared write count: every write and every change that
    # may touch any item counts already (see ``_note_write``), at no extra cost.
    @property
    def _mutation_revision(self) -> int | torch.Tensor:
        raw = self.__dict__.get("_writes_shared")
        if raw is not None:
            return raw.value
        if self._compilable:
            # the tensor itself while compiling, as torchrl's
            counter = self._compilable_writes()
            return counter if is_compiling() else int(counter)
        return self._writes_raw().value

    def _bump_mutation_revision(self) -> None:
        self._note_write(ALL_ITEMS)

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
        state.pop("_last_cursor_shared", None)
        # the journal lists this process's writes: a copy starts without any
        state.pop("_journal", None)
        state.pop("_compiled_writes", None)
        state.pop("_last_run", None)
        state.pop("_leaf_array_views", None)  # views of this process's memory
        if get_spawning_popen() is None:
            # plain pickling: the length and the write count travel as numbers
            length = self._len
            state.pop("_len_value", None)
            state["len__context"] = length
            writes = self._writes_since(None)[0]
            state.pop("_writes_value", None)
            state["writes__context"] = writes
            if state.pop("_last_cursor_value", None) is not None:
                last = self._last_cursor_index
                state["last_cursor_index__context"] = -1 if last is None else last
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
        if state["_compilable"]:
            state.pop("last_cursor_index__context", None)
            if "_len_value" in state:
                state["_len_value"] = torch.tensor(int(state["_len_value"]), dtype=torch.int64)
            if "_writes_value" in state:
                state["_writes_value"] = torch.tensor(int(state["_writes_value"]), dtype=torch.int64)
        else:
            restore_counter(
                state, "last_cursor_index__context", "_last_cursor_value", "_last_cursor_shared",
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
        """Loads what :meth:`state_dict` returned, from this library or torchrl.

        .. note::
          A ``_len`` outside ``[0, max_size]`` raises a ``ValueError`` naming it, and nothing is
          loaded. torchrl (0.11 to 0.14) saves one for a wrapped ``ndim > 1`` storage of tensors
          (it counts the feature dims into the capacity) and loads it as it is, leaving a length
          past the storage's slots.
        """
        length = int(state_dict["_len"])
        if not 0 <= length <= self.max_size:
            # torchrl (0.11 to 0.14) counts the feature dims of an ndim > 1 storage into its
            # capacity, so a wrapped one saves a length past its slots: refused before anything
            # changes, as loads refuses it.
            raise ValueError(
                f"The state_dict has _len={length}, outside [0, {self.max_size}] for this storage "
                f"of max_size={self.max_size}: nothing was loaded."
            )
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
        # from 0.13, a copy: the storage must not change with the caller's tensor
        return tensor.clone() if since("load_state_dict_clones") else tensor

    def _tensordict_from_state_dict(self, state_dict):
        loaded = TensorDict().load_state_dict(state_dict, strict=False)
        return loaded.clone() if since("load_state_dict_clones") else loaded

    def _after_tensordict_load(self):
        pass

    # ----------------------------------------------------------------- write
    def _set_tree_map(self, cursor, data, storage):
        def set_tensor(datum, store):
            store[cursor] = datum

        tree_map(set_tensor, data, storage)

    def _set_tensordict(self, cursor, data) -> None:
        if isinstance(data, LazyStackedTensorDict) and since("storage_lazy_stack_direct_write"):
            # each stacked tensordict goes straight into the stored rows, no dense copy first
            if isinstance(cursor, slice):
                self._storage[cursor]._stack_onto_(list(data.unbind(data.stack_dim)), dim=data.stack_dim)
            else:
                self._storage.update_at_(data, cursor)
            return
        self._storage[cursor] = data

    # (where dynamo runs ``set`` eagerly, the length is not compiled as a frame of its own)
    @outside_graph
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
                if is_compiling() or not set_rows(self._storage, cursor, data):
                    try:
                        self._set_tensordict(cursor, data)
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
                self._set_last_cursor(cursor)
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
        then journaled as that :class:`~torchrl_compat.storages._journal.RowRun`, and the
        last row of ``cursor`` is remembered beside it (see :meth:`_last_cursor_row`).
        """
        if not complete:
            self._note_write(ALL_ITEMS)
            return
        self._add_len(numel)
        self._set_last_cursor(cursor)
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

    def _leaf_arrays(self) -> LeafArrays:
        """The numpy views of the leaves that :meth:`get` and :meth:`set` read and write."""
        arrays = self.__dict__.get("_leaf_array_views")
        if arrays is None:
            arrays = self.__dict__["_leaf_array_views"] = LeafArrays()
        return arrays

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
        if _storage is self._storage and type(index) is torch.Tensor and not is_compiling():
            rows = get_rows(_storage, index, self._leaf_arrays())
            if rows is not None:
                return rows
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

    # ------------------------------------------- conditional updates (torchrl 0.14)
    # The storage side of ReplayBuffer.update_if_present: the fields a patch may name are
    # the existing tensor leaves of a tensordict storage.
    if since("buffer_conditional_update"):
        supports_conditional_update = True

    def _conditional_patch_leaf(self, key) -> torch.Tensor:
        storage = self.__dict__.get("_storage")
        if storage is None or not self.initialized:
            raise RuntimeError(
                "Conditional updates require an initialized storage. Write some "
                "data to the buffer before calling update_if_present."
            )
        leaf = storage.get(key, default=None) if is_tensor_collection(storage) else None
        if leaf is None:
            raise KeyError(
                f"Key {key} does not exist in the storage. Conditional patches "
                "can only target existing tensor fields of a tensordict storage."
            )
        return leaf

    def _validate_conditional_patch(self, index: torch.Tensor, patch: dict) -> dict:
        """``patch`` with each value checked against its field (dtype; one row per record,
        of the field's feature shape) and moved to its device. Writes nothing."""
        n_coords = index.shape[-1] if index.ndim > 1 else 1
        n_rows = index.shape[0] if index.ndim > 1 else index.numel()
        normalized = {}
        for key, value in patch.items():
            leaf = self._conditional_patch_leaf(key)
            value = torch.as_tensor(value)
            if value.dtype != leaf.dtype:
                raise ValueError(
                    f"dtype mismatch for patch key {key}: got {value.dtype}, the storage holds {leaf.dtype}."
                )
            feature_shape = leaf.shape[n_coords:]
            try:
                value = value.reshape((n_rows, *feature_shape))
            except RuntimeError:
                raise ValueError(
                    f"shape mismatch for patch key {key}: got {tuple(value.shape)}, expected "
                    f"{n_rows} records with feature shape {tuple(feature_shape)}."
                ) from None
            normalized[key] = value.to(leaf.device)
        return normalized

    def _apply_conditional_patch(self, index: torch.Tensor, patch: dict) -> None:
        coords = tuple(index.unbind(-1)) if index.ndim > 1 else (index,)
        for key, value in patch.items():
            self._conditional_patch_leaf(key)[coords] = value
        # what readers derived from these items (trajectory ends) is read again
        self._note_write(coords if index.ndim > 1 else index)


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

    .. note:: A buffer's first batch (a plain :class:`~tensordict.TensorDict` or tensor,
        written by a round-robin writer) creates the storage leaf by leaf and copies each
        leaf's rows once; torchrl builds it from ``data[0]`` through tensordict's generic
        ``to`` / ``expand`` / ``empty_like`` and then scatters the batch with ``index_put``,
        about five times slower for a batch of 400 items of 1.2 MB. The storage made is the
        same (layout, device, key order).

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
            self._init_cleanup = _directory_cleanup.InitDirectoryCleanup(self._init_directory)
            _directory_cleanup.register(self._init_cleanup)

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

    @_initializes_items
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
        # (not from a compiled graph: a log call breaks it, inside the write's try block,
        # where torch.compile gives up on the whole frame)
        if hasattr(out, "shape") and not is_compiling():
            logger.info(f"Initialized LazyTensorStorage with {out.shape} shape")

    def _first_write(self, data, extra: dict | None, start: int, numel: int) -> bool:
        """Creates the storage from the batch ``data`` and writes the batch at rows ``start,
        start + 1, ...`` (wrapping at the capacity), what :meth:`set` does on a storage not
        initialized yet, leaf by leaf (see :mod:`~torchrl_compat.storages._first_write`).

        ``extra`` holds entries written as if ``data``'s top level held them too. Returns
        ``False``, having done nothing, for a storage or batch not of the plain kind.
        """
        if not self._takes_first_write(LazyTensorStorage):
            return False
        if type(data) is TensorDict:
            entries = plain_leaves(data, extra, self.device)
            if entries is None:
                return False
            pairs = []
            out = build_storage(entries, data._batch_size, self.max_size, self.device, empty_leaf, pairs)
        elif type(data) is torch.Tensor and extra is None:
            if data.device != self.device or data.requires_grad or not data.ndim or data.is_nested:
                return False
            # what _init_standard allocates for a tensor
            out = torch.empty((self.max_size, *data.shape[1:]), device=self.device, dtype=data.dtype)
            pairs = [(out, data)]
        else:
            return False
        self._first_write_into(out, "LazyTensorStorage", pairs, start, numel)
        return True

    def _takes_first_write(self, cls) -> bool:
        """Whether :meth:`_first_write` may build this storage: a 1-D one, not initialized,
        shared or consolidated, on a set device, initialized by ``cls``'s own code."""
        return (
            not self.initialized
            and not self.shared_init
            and not self.consolidated
            and self.ndim == 1
            and isinstance(self.device, torch.device)
            and type(self)._init is LazyTensorStorage._init
            and type(self)._init_standard is cls._init_standard
        )

    def _first_write_into(self, out, name: str, pairs: list, start: int, numel: int) -> None:
        self._storage = out
        self.initialized = True
        logger.info(f"Initialized {name} with {out.shape} shape")
        # the caller books the write (one revision step), or a failed one
        write_leaf_rows(pairs, start, numel)

    @_initializes_items
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
        if since("storage_shared_init_cpu"):
            self._reconcile_shared_init_device()

    @_initializes_items
    def _wait_for_init(self) -> None:
        # wait till the coordinator has initialized the memmap
        self._init_event.wait()
        self._storage = TensorDict.load_memmap(self._init_directory)
        if self.ndim > 1:
            self.max_size = self._storage.shape[: self.ndim].numel()
        if since("storage_shared_init_cpu"):
            self._reconcile_shared_init_device()
        self.initialized = True

    def _reconcile_shared_init_device(self) -> None:
        """Sets the device to the CPU, where a ``shared_init`` storage keeps its items (a
        memory-mapped tensordict), warning when another one was asked for: samplers build
        their indices on ``self.device``."""
        device = self.device
        if device not in (None, "auto") and torch.device(device).type != "cpu":
            warnings.warn(
                f"LazyTensorStorage(shared_init=True) stores data in a CPU "
                f"memory-mapped tensordict; the requested storage device "
                f"({device}) cannot be honored and is reset to 'cpu'."
            )
        self.device = torch.device("cpu")

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

    .. note:: Without a ``scratch_dir``, a buffer's first batch (a plain
        :class:`~tensordict.TensorDict`, written by a round-robin writer) creates the memory
        maps leaf by leaf and writes the rows into their shared-memory files with
        ``os.pwrite``; torchrl clones ``data[0]``, goes through ``memmap_like`` and scatters
        the batch with ``index_put`` through the maps, page fault by page fault. The maps
        made are the same.

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
    # its files live in scratch_dir: a checkpoint written there is loaded in place (the
    # checkpointers read this flag rather than import the storages)
    _files_in_scratch_dir = True

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
            _directory_cleanup.register(self)

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

    @_initializes_items
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

    def _first_write(self, data, extra: dict | None, start: int, numel: int) -> bool:
        # Anonymous memory maps of a plain tensordict only: with a scratch_dir, memmap_like
        # also writes the files' metadata; tensors and pytrees go through _init_pytree.
        if (
            not self._takes_first_write(LazyMemmapStorage)
            or self.scratch_dir is not None
            or type(data) is not TensorDict
            or logger.isEnabledFor(logging.DEBUG)
        ):
            return False
        entries = plain_leaves(data, extra, self.device)
        if entries is None:
            return False
        pairs = []
        out = build_storage(
            entries, data._batch_size, self.max_size, self.device, memmap_leaf(self.existsok), pairs, memmap=True
        )
        self._first_write_into(out, "LazyMemmapStorage", pairs, start, numel)
        return True

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
        return _directory_cleanup.remove_tree(scratch_dir)

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


def _mem_map_tensor_as_tensor(mem_map_tensor) -> torch.Tensor:
    if isinstance(mem_map_tensor, torch.Tensor):
        # MemoryMappedTensor is a torch.Tensor subclass: nothing to convert
        return mem_map_tensor


def _make_memmap(tensor, path):
    return MemoryMappedTensor.from_tensor(tensor, filename=path)


def _make_empty_memmap(shape, dtype, path):
    return MemoryMappedTensor.empty(shape=shape, dtype=dtype, filename=path)
