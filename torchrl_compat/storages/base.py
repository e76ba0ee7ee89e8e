""":class:`Storage`, the base of every storage."""
from __future__ import annotations

import abc
import functools
import multiprocessing as mp
from copy import copy
from typing import Any

import torch

from torchrl_compat._releases import since
from torchrl_compat.storages._counters import compile_disable, is_compiling
from torchrl_compat.storages._journal import ALL_ITEMS
from torchrl_compat._torchrl_lookup import torchrl_twin
from torchrl_compat.checkpointers import StorageCheckpointerBase


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


def _initializes_items(method):
    """Records a failed call to ``method`` (an initialization) as a change of every item.

    A storage initialized by its first write counts that write once, as torchrl 0.14 does
    (one ``_mutation_revision`` step a write): before the call it held no item, and the
    write that follows journals the rows it fills. Only a call that stops part-way leaves
    what a reader cannot follow.
    """

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            self._note_write(ALL_ITEMS)
            raise

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
    supports_conditional_update: bool = False
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

    # ------------------------------------------------ mutation revision, cursor
    # ``_mutation_revision`` grows at every change of the stored items, so that what a
    # reader derived from them (trajectory ends, a query's boundaries) can tell it is out
    # of date; ``_last_cursor_index`` is the time coordinate written last. Storages that
    # count their writes already (the tensor storages) read the revision from that count.

    @property
    def _mutation_revision(self) -> int:
        """Monotonic revision of the storage's content, shared with forked processes."""
        revision = self.__dict__.get("_mutation_revision_value")
        if revision is None:
            return 0
        return revision if isinstance(revision, int) else revision.value

    def _bump_mutation_revision(self, steps: int = 1) -> None:
        """Marks the stored items as changed (``steps``: the revision's steps, one per change
        torchrl counts)."""
        revision = self.__dict__.get("_mutation_revision_value")
        if self._compilable:
            self.__dict__["_mutation_revision_value"] = (revision or 0) + steps
            return
        if revision is None:
            revision = self.__dict__["_mutation_revision_value"] = mp.Value("q", 0)
        with revision.get_lock():
            revision.value += steps

    @property
    def _last_cursor_index(self) -> int | None:
        """The last time coordinate written (``None`` before the first write)."""
        shared = self.__dict__.get("_last_cursor_shared")
        if shared is not None:
            # written in whichever process wrote last
            coordinate = shared.value
            return None if coordinate < 0 else coordinate
        cursor = getattr(self, "_last_cursor", None)
        taken = self.__dict__.get("_last_cursor_time")
        if taken is not None and taken[0] is cursor:
            coordinate = taken[1]
        else:
            coordinate = _time_coordinate(cursor, self.max_size)
        if isinstance(coordinate, torch.Tensor) and not is_compiling():
            # (the tensor itself while compiling, as torchrl's compilable storages)
            return int(coordinate)
        return coordinate

    def _set_last_cursor(self, cursor: Any) -> None:
        self._last_cursor = cursor
        # read at the write, as torchrl 0.14 does: the caller may reuse its index object
        coordinate = _time_coordinate(cursor, self.max_size)
        self._last_cursor_time = (cursor, coordinate)
        shared = self.__dict__.get("_last_cursor_shared")
        if shared is not None:
            shared.value = -1 if coordinate is None else int(coordinate)

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
        revision = state.pop("_mutation_revision_value", None)
        if revision is not None:
            state["mutation_revision__context"] = revision if isinstance(revision, int) else revision.value
        return state

    def __setstate__(self, state):
        revision = state.pop("mutation_revision__context", None)
        if revision is not None:
            state["_mutation_revision_value"] = (
                revision if state.get("_compilable", False) else mp.Value("q", revision)
            )
        self.__dict__.update(state)

    def __contains__(self, item):
        return self.contains(item)

    @abc.abstractmethod
    def contains(self, item):
        ...


def _time_coordinate(cursor, max_size: int) -> int | None:
    """The last time coordinate a storage write at ``cursor`` touched, as torchrl reads it:
    the last element of an index (of its first entry for a tuple of coordinates), the last
    row of a slice or range within ``max_size``, the int itself; ``None`` for none."""
    if isinstance(cursor, (tuple, list)) and cursor:
        cursor = cursor[0]
    if isinstance(cursor, torch.Tensor):
        cursor = cursor.detach().reshape(-1)
        if not cursor.numel():
            return None
        if cursor.device.type == "cpu" and not is_compiling():
            return int(cursor.numpy()[-1])  # read from memory: no torch op to wait for
        # a device cursor is copied on its device and read only when asked for: a write
        # never waits for the device (nor a compiled one leaves its graph)
        return cursor[-1].clone()
    if isinstance(cursor, slice):
        cursor = range(*cursor.indices(max_size))
    if isinstance(cursor, range):
        return int(cursor[-1]) if len(cursor) else None
    if cursor is None or isinstance(cursor, (tuple, list)):
        return None
    try:
        cursor = int(cursor)
    except (TypeError, ValueError):
        return None
    return cursor if cursor >= 0 else None


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

# Before 0.14 storages have no supports_conditional_update.
if not since("storage_mutation_revision"):
    del Storage.supports_conditional_update
