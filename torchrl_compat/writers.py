"""Writers for composable replay buffers (stand-in for ``torchrl.data.replay_buffers.writers``).

A writer decides where each new item goes in the storage, writes it there and tells the
entities attached to the storage (the buffers, hence their samplers) which indices
changed. The classes have torchrl 0.11's names, signatures, defaults, ``state_dict`` /
``dumps`` / ``loads`` formats and errors, and work with our storages and torchrl's.

.. note:: When torchrl is importable (and ``TORCHRL_COMPAT_STANDALONE`` is not ``"1"``)
    every class here also lists its torchrl twin as its last base, so that torchrl's
    buffers accept it; no torchrl code runs on it.
"""
from __future__ import annotations

import ctypes
import heapq
import json
import math
import multiprocessing as mp
import textwrap
from abc import ABC, abstractmethod
from collections.abc import Sequence
from copy import copy
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any

import torch
from tensordict import is_tensor_collection, TensorDict, TensorDictBase
from tensordict.utils import expand_as_right, is_tensorclass
from torch.utils._pytree import tree_flatten

from torchrl_compat._checkpoint_checks import (
    MetadataError,
    read_count,
    read_for_loading,
    read_json_object,
    read_tensor_file,
)
from torchrl_compat._checkpoint_publish import write_aside
from torchrl_compat._ensemble import INDEX_ERROR, members_rng, pick, select_members
from torchrl_compat._torchrl_lookup import torchrl_twin
from torchrl_compat._writer_rows import shallow_copy, write_rows
from torchrl_compat.utils import _is_int, _reduce, _str2dtype

try:
    from torch.compiler import disable as compile_disable, is_compiling
except ImportError:  # pragma: no cover - torch < 2.3
    from torch._dynamo import disable as compile_disable, is_compiling

__all__ = [
    "ImmutableDatasetWriter",
    "RoundRobinWriter",
    "TensorDictMaxValueWriter",
    "TensorDictRoundRobinWriter",
    "Writer",
    "WriterEnsemble",
]

def _notify(storage, index) -> None:
    """Tells the entities attached to ``storage`` that the items at ``index`` changed."""
    for entity in storage._attached_entities_iter():
        entity.mark_update(index)


# torch.compile cannot trace the calls on the attached entities; eager calls skip the
# disabled wrapper, which costs microseconds.
_notify_outside_graph = compile_disable()(_notify)


def _mark_updated(storage, index) -> None:
    (_notify_outside_graph if is_compiling() else _notify)(storage, index)


def _counter(value: int, compilable: bool):
    """A cursor or write count: a plain int if compilable, else a shared int64.

    The shared value has no lock of its own: the buffer's locks serialise its writers.
    It is an int64 where torchrl's ``mp.Value("i")`` wraps past ``2**31 - 1`` writes.
    """
    if compilable:
        return int(value)
    return mp.Value(ctypes.c_int64, int(value), lock=False)


class _Counter:
    """A writer's counter attribute (``_cursor``, ``_write_count``) kept in
    ``__dict__[<name>_value]``: a shared int64, or a plain int for a compilable writer (one
    whose ``_compilable`` is true; ``always_shared`` counters ignore it)."""

    def __init__(self, always_shared: bool = False):
        self.always_shared = always_shared

    def __set_name__(self, owner, name):
        self.slot = f"{name}_value"

    def _plain(self, writer) -> bool:
        return not self.always_shared and writer._compilable

    def __get__(self, writer, owner=None):
        if writer is None:
            return self
        value = writer.__dict__.get(self.slot)
        if value is None:
            value = writer.__dict__[self.slot] = _counter(0, self._plain(writer))
        return value if self._plain(writer) else value.value

    def __set__(self, writer, value):
        shared = writer.__dict__.get(self.slot)
        if self._plain(writer) or shared is None:
            writer.__dict__[self.slot] = _counter(value, self._plain(writer))
        else:
            shared.value = value


WRITER_METADATA_FILE = "metadata.json"
TOP_VALUES_FILE = "current_top_values.memmap"


def _dump_json(content, file) -> None:
    with open(file, "w") as f:
        json.dump(content, f)


def _read_metadata(path, keys) -> tuple[Path, dict]:
    """A writer's ``metadata.json`` under ``path`` (read-only), with the entries ``keys``."""
    file = Path(path).absolute() / WRITER_METADATA_FILE
    metadata = read_json_object(file)
    for key in keys:
        if key not in metadata:
            raise MetadataError(f"{file}: no {key!r} entry")
    return file, metadata


def _batch_len(data) -> int:
    """The number of items ``extend`` receives, by torchrl's rules."""
    if is_tensor_collection(data) or isinstance(data, (torch.Tensor, list)):
        return len(data)
    return len(tree_flatten(data)[0][0])


class Writer(*(torchrl_twin("writers", "Writer") or (ABC,))):
    """A ReplayBuffer base Writer class.

    Args:
        compilable (bool, optional): whether the writer is meant to run under
            :func:`torch.compile`. Defaults to ``False``.

    .. note:: The ``dumps`` of every writer here writes torchrl's files aside and publishes
        them in one rename (a :class:`WriterEnsemble`'s, all its members' at once), so that
        a dump interrupted at any moment, even killed, leaves the previous checkpoint whole;
        torchrl rewrites the files in place. ``loads`` reads every file without writing to
        it and checks it all (JSON keys and types, file sizes) before the writer changes;
        each error names the file.
    """

    _storage = None
    _rng: torch.Generator | None = None

    def __init__(self, compilable: bool = False) -> None:
        self._storage = None
        self._compilable = compilable

    def register_storage(self, storage) -> None:
        self._storage = storage

    @abstractmethod
    def add(self, data: Any) -> int:
        """Inserts one piece of data at an appropriate index, and returns that index."""
        ...

    @abstractmethod
    def extend(self, data: Sequence) -> torch.Tensor:
        """Inserts a series of data points at appropriate indices, and returns a tensor containing the indices."""
        ...

    @abstractmethod
    def _empty(self, empty_write_count: bool = True) -> None:
        ...

    @abstractmethod
    def dumps(self, path):
        ...

    @abstractmethod
    def loads(self, path):
        ...

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        ...

    @abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ...

    def _replicate_index(self, index):
        """One row ``(i, j, ...)`` per element written when the storage has ``ndim > 1``.

        Item ``i`` of a storage of shape ``[n, d1, d2]`` covers the ``d1 * d2`` elements
        ``(i, j, k)``; a 1-D storage returns ``index`` as it is.
        """
        storage = self._storage
        if storage.ndim == 1:
            return index
        device = index.device if isinstance(index, torch.Tensor) else torch.device("cpu")
        mesh = self._element_mesh(tuple(storage.shape[1:]), device)
        if _is_int(index):
            first = torch.as_tensor(int(index)).expand(mesh.shape[0], 1)
            return torch.cat([first, mesh], 1)
        return torch.cat(
            [index.repeat_interleave(mesh.shape[0]).unsqueeze(1), mesh.repeat(index.numel(), 1)], 1
        )

    def _element_mesh(self, trailing: tuple, device) -> torch.Tensor:
        # The coordinates of every element of one item, in row-major order; cached, as
        # the storage's trailing shape is fixed once it is initialized.
        cached = self.__dict__.get("_mesh_cache")
        if cached is not None and cached[0] == (trailing, device):
            return cached[1]
        axes = [torch.arange(size, device=device) for size in trailing]
        mesh = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).flatten(0, -2)
        self.__dict__["_mesh_cache"] = ((trailing, device), mesh)
        return mesh

    def __repr__(self):
        return f"{self.__class__.__name__}()"

    def __getstate__(self):
        state = copy(self.__dict__)
        # generators don't pickle; the buffer sets its own again
        state["_rng"] = None
        # caches of what the storage holds: rebuilt on first use
        state.pop("_mesh_cache", None)
        state.pop("_leaf_arrays", None)
        return state


class ImmutableDatasetWriter(Writer, *torchrl_twin("writers", "ImmutableDatasetWriter")):
    """A blocking writer for immutable datasets.

    Examples:
        >>> writer = ImmutableDatasetWriter()
        >>> writer.state_dict()
        {}
    """

    WRITING_ERR = "This dataset doesn't allow writing."

    def add(self, data: Any) -> int:
        raise RuntimeError(self.WRITING_ERR)

    def extend(self, data: Sequence) -> torch.Tensor:
        raise RuntimeError(self.WRITING_ERR)

    def _empty(self, empty_write_count: bool = True) -> None:
        raise RuntimeError(self.WRITING_ERR)

    def dumps(self, path):
        ...

    def loads(self, path):
        ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return


class RoundRobinWriter(Writer, *torchrl_twin("writers", "RoundRobinWriter")):
    """A RoundRobin Writer class for composable replay buffers.

    Items go to the storage's rows in order, from the cursor on, wrapping around at the
    capacity.

    Args:
        compilable (bool, optional): whether the writer is compilable.
            If ``True``, the writer cannot be shared between multiple processes.
            Defaults to ``False``.

    .. note:: When the rows an :meth:`extend` fills form one range (two when it wraps)
        and the storage is one of ours holding plain tensors or tensordicts, each leaf of
        the batch is copied into row slices of the storage (torchrl scatters the batch
        through an index tensor and the generic tensordict assignment, several times
        slower); the storage content, length, ``_last_cursor`` and the returned indices
        are the same. The cursor and write count are shared int64 values read without a
        lock (torchrl's are ``mp.Value("i")``, locked at each access, and the write count
        wraps past ``2**31 - 1``).

    Examples:
        >>> import torch
        >>> from torchrl_compat import LazyTensorStorage
        >>> writer = RoundRobinWriter()
        >>> writer.register_storage(LazyTensorStorage(4))
        >>> writer.extend(torch.zeros(3, 2))
        tensor([0, 1, 2])
        >>> writer.extend(torch.ones(2, 2))
        tensor([3, 0])
        >>> writer.state_dict(), writer._write_count
        ({'_cursor': 1}, 5)
    """

    def __init__(self, compilable: bool = False) -> None:
        super().__init__(compilable=compilable)
        self._cursor = 0
        self._write_count = 0

    _cursor = _Counter()
    _write_count = _Counter()

    # ----------------------------------------------------------------- write
    def add(self, data: Any) -> int | torch.Tensor:
        index = self._cursor
        # the cursor moves before the write, so that concurrent writers take distinct rows
        self._cursor = (index + 1) % self._storage._max_size_along_dim0(single_data=data)
        self._write_count += 1
        self._storage.set(index, data)
        index = self._replicate_index(index)
        _mark_updated(self._storage, index)
        return index

    def extend(self, data: Sequence) -> torch.Tensor:
        numel = _batch_len(data)
        if numel == 0:
            raise RuntimeError(f"Expected at least one element in extend. Got {data=}")
        return self._write_batch(data, numel)

    def _write_batch(self, data, numel: int, *, leave_data: bool = False) -> torch.Tensor:
        """Writes ``numel`` items from the cursor on and returns their indices.

        ``leave_data=True`` writes what the batch would receive (see :meth:`_before_write`)
        without changing the caller's ``data``.
        """
        start = self._cursor
        device = data.device if hasattr(data, "device") else None
        capacity = self._storage._max_size_along_dim0(batched_data=data)
        index = torch.arange(start, start + numel, dtype=torch.long, device=device)
        if start + numel > capacity:
            index.remainder_(capacity)
        self._cursor = (start + numel) % capacity
        self._write_count += numel
        extra = None
        if leave_data:
            extra = {"index": index}
        else:
            self._before_write(data, index)
        arrays = self.__dict__.get("_leaf_arrays")
        if arrays is None:
            arrays = self.__dict__["_leaf_arrays"] = {}
        if not write_rows(self._storage, start, index, data, arrays, extra):
            if leave_data:
                data = shallow_copy(data)
                self._before_write(data, index)
            self._storage.set(index, data)
        index = self._replicate_index(index)
        _mark_updated(self._storage, index)
        return index

    def _before_write(self, data, index: torch.Tensor) -> None:
        """What the batch receives before it is written (nothing here)."""

    # ----------------------------------------------------------- persistence
    def dumps(self, path):
        content = {"cursor": self._cursor}
        write_aside(path, lambda directory: _dump_json(content, directory / WRITER_METADATA_FILE))

    def loads(self, path):
        self._apply_checkpoint(self._read_checkpoint(path))

    def _read_checkpoint(self, path) -> int:
        """The cursor saved at ``path``, read and checked without changing anything."""
        file, metadata = _read_metadata(path, ("cursor",))
        return read_count(file, "cursor", metadata["cursor"])

    def _apply_checkpoint(self, cursor: int) -> None:
        self._cursor = cursor

    def state_dict(self) -> dict[str, Any]:
        return {"_cursor": self._cursor}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._cursor = state_dict["_cursor"]

    def _empty(self, empty_write_count: bool = True) -> None:
        self._cursor = 0
        if empty_write_count:
            self._write_count = 0

    def _mark_update_entities(self, index: torch.Tensor) -> None:
        """Mark entities as updated with the given index."""
        _mark_updated(self._storage, index)

    def __getstate__(self):
        state = super().__getstate__()
        if get_spawning_popen() is None:
            # plain pickling: the counters travel as numbers
            state.pop("_cursor_value", None)
            state.pop("_write_count_value", None)
            state["cursor__context"] = self._cursor
            state["write_count__context"] = self._write_count
        return state

    def __setstate__(self, state):
        compilable = state.get("_compilable", False)
        for context, name in (("cursor__context", "_cursor_value"), ("write_count__context", "_write_count_value")):
            value = state.pop(context, None)
            if value is not None:
                state[name] = _counter(value, compilable)
        self.__dict__.update(state)

    def __repr__(self):
        return f"{self.__class__.__name__}(cursor={int(self._cursor)}, full_storage={self._storage._is_full})"


class TensorDictRoundRobinWriter(RoundRobinWriter, *torchrl_twin("writers", "TensorDictRoundRobinWriter")):
    """A RoundRobin Writer class for composable, tensordict-based replay buffers.

    Each item written receives its storage index under the ``"index"`` key (tensorclasses
    excepted), so that samples carry it.

    Args:
        compilable (bool, optional): whether the writer is compilable.
            If ``True``, the writer cannot be shared between multiple processes.
            Defaults to ``False``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyTensorStorage
        >>> writer = TensorDictRoundRobinWriter()
        >>> writer.register_storage(LazyTensorStorage(4))
        >>> data = TensorDict({"obs": torch.zeros(3, 2)}, [3])
        >>> writer.extend(data)
        tensor([0, 1, 2])
        >>> data["index"]
        tensor([0, 1, 2])
    """

    def add(self, data: Any) -> int | torch.Tensor:
        index = self._cursor
        capacity = self._storage._max_size_along_dim0(single_data=data)
        self._cursor = (index + 1) % capacity
        self._write_count += 1
        self._before_write(data, index)
        self._storage.set(index, data)
        index = self._replicate_index(index)
        _mark_updated(self._storage, index)
        return index

    def extend(self, data: Sequence) -> torch.Tensor:
        # torchrl does not refuse an empty batch here (unlike RoundRobinWriter)
        return self._write_batch(data, len(data))

    def _extend_leaving_data(self, data: TensorDict) -> torch.Tensor:
        """:meth:`extend` for a plain tensordict that is to stay without an ``"index"``
        entry (a tensordict buffer's caller's data): the index is written beside it."""
        return self._write_batch(data, len(data), leave_data=True)

    def _before_write(self, data, index) -> None:
        if (
            type(data) is TensorDict
            and type(index) is torch.Tensor
            and not data._is_locked
            and index.dtype is torch.long
            and index.shape == data._batch_size
            and (data._device is None or index.device == data._device)
        ):
            # what set() stores once it has checked the entry (about 2 us for the checks)
            data._tensordict["index"] = index
        elif not is_tensorclass(data):
            index = torch.as_tensor(index, device=data.device, dtype=torch.long)
            data.set("index", index if index.ndim == data.ndim else expand_as_right(index, data))


class TensorDictMaxValueWriter(Writer, *torchrl_twin("writers", "TensorDictMaxValueWriter")):
    """A Writer class for composable replay buffers that keeps the top elements based on some ranking key.

    While the storage is not full, items fill it in order; once it is, an item replaces
    the stored item of lowest rank when its own rank is higher. Items not written get
    index ``-1`` (which prioritized samplers ignore).

    Args:
        rank_key (str or tuple of str): the key to rank the elements by. Defaults to ``("next", "reward")``.
        reduction (str): the reduction method to use if the rank key has more than one element.
            Can be ``"max"``, ``"min"``, ``"mean"``, ``"median"`` or ``"sum"``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyTensorStorage
        >>> writer = TensorDictMaxValueWriter(rank_key="key")
        >>> writer.register_storage(LazyTensorStorage(2))
        >>> writer.extend(TensorDict({"key": torch.tensor([3.0, 1.0, 5.0, 0.0])}, [4]))
        tensor([ 0, -1,  1, -1])
        >>> sorted(value for value, _ in writer._current_top_values)
        [3.0, 5.0]

    .. note:: This class isn't compatible with storages with more than one dimension:
        trajectories must be stored one per item (a storage of ``[T]``-shaped items).

    .. note:: :meth:`extend` reads the ranks of the whole batch with one reduction and
        writes the kept items with one storage call; torchrl iterates over the batch one
        tensordict at a time. A missing ``rank_key`` raises a ``KeyError`` naming it
        (torchrl fails on ``None.numel()``). Loading a dump gives the indices back as
        ints (torchrl reads them back as floats); a dump whose metadata names an unknown
        dtype raises a ``ValueError`` naming the file (torchrl: a bare ``KeyError``).
    """

    def __init__(self, rank_key=None, reduction: str = "sum", **kwargs) -> None:
        super().__init__(**kwargs)
        self._cursor = 0
        self._current_top_values = []
        self._rank_key = ("next", "reward") if rank_key is None else rank_key
        self._reduction = reduction

    def register_storage(self, storage) -> None:
        if storage.ndim > 1:
            raise ValueError(
                "TensorDictMaxValueWriter is not compatible with storages with more than one dimension. "
                "See the docstring constructor note about storing trajectories with TensorDictMaxValueWriter."
            )
        return super().register_storage(storage)

    # shared even for a compilable writer, as torchrl's (its cursor is a plain attribute)
    _write_count = _Counter(always_shared=True)

    def _rank_of(self, data) -> torch.Tensor:
        rank = data.get(self._rank_key, None)
        if rank is None:
            raise KeyError(f"Rank key {self._rank_key} not found in data.")
        return rank

    def get_insert_index(self, data: Any) -> int:
        """Returns the index where the data should be inserted, or ``None`` if it should not be inserted."""
        if not is_tensor_collection(data):
            raise RuntimeError(
                f"{type(self)} expects data to be a tensor collection (tensordict or tensorclass). Found a {type(data)} instead."
            )
        if data.batch_dims > 1:
            raise RuntimeError(
                "Expected input tensordict to have no more than 1 dimension, got"
                f"tensordict.batch_size = {data.batch_size}"
            )
        rank = self._rank_of(data)
        if rank.numel() > 1:
            value = float(_reduce(rank.reshape(-1), self._reduction, dim=0))
        else:
            value = rank.item()
        return self._insert(value)

    def _insert(self, value) -> int | None:
        """The heap step for one item of rank ``value``: the row it takes, or ``None``."""
        top = self._current_top_values
        if len(top) < self._storage.max_size:
            row = self._cursor
            self._cursor = (row + 1) % self._storage.max_size
            heapq.heappush(top, (value, row))
            return row
        if value > top[0][0]:
            # the row of the lowest-ranked item is handed to the new one
            row = heapq.heappop(top)[1]
            heapq.heappush(top, (value, row))
            return row
        return None

    def add(self, data: Any) -> int | torch.Tensor:
        """Inserts a single element of data at an appropriate index, and returns that index.

        The ``rank_key`` in the data passed to this module should be structured as [].
        If it has more dimensions, it will be reduced to a single value using the ``reduction`` method.
        """
        index = self.get_insert_index(data)
        if index is not None:
            data.set("index", index)
            self._write_count += 1
            self._storage.set(index, data)
            index = self._replicate_index(index)
            _mark_updated(self._storage, index)
        return index

    def extend(self, data: TensorDictBase) -> None:
        """Inserts a series of data points at appropriate indices.

        The ``rank_key`` in the data passed to this module should be structured as [B].
        If it has more dimensions, it will be reduced to a single value using the ``reduction`` method.
        """
        if not is_tensor_collection(data):
            raise RuntimeError(
                f"{type(self)} expects data to be a tensor collection (tensordict or tensorclass). Found a {type(data)} instead."
            )
        if data.batch_dims > 2:
            raise RuntimeError(
                "Expected input tensordict to have no more than 1 dimension, got"
                f"tensordict.batch_size = {data.batch_size[1:]}"
            )
        numel = data.shape[0] if data.batch_dims else 0
        ranks = self._batch_ranks(data, numel)
        # row in the storage -> position in the batch; a row taken twice keeps the later item
        rows = {}
        for position, value in enumerate(ranks):
            row = self._insert(value)
            if row is not None:
                self._write_count += 1
                rows[row] = position
        if rows:
            storage_idx, data_idx = zip(*rows.items())
            index = data.get("index", None)
            dtype = index.dtype if index is not None else torch.long
            device = index.device if index is not None else data.device
            out_index = torch.full(data.shape, -1, dtype=torch.long, device=device)
            data_idx = torch.as_tensor(data_idx, dtype=dtype, device=device)
            storage_idx = torch.as_tensor(storage_idx, dtype=dtype, device=device)
            out_index[data_idx] = storage_idx
            self._storage.set(storage_idx, data[data_idx])
        else:
            device = getattr(self._storage, "device", None)
            out_index = torch.full(data.shape, -1, dtype=torch.long, device=device)
        index = self._replicate_index(out_index)
        _mark_updated(self._storage, index)
        return index

    def _batch_ranks(self, data, numel: int) -> list:
        """The rank of each item of the batch, as Python numbers (one reduction for all)."""
        if numel == 0:
            return []
        rank = self._rank_of(data)
        per_item = rank.reshape(numel, -1)
        if per_item.shape[1] > 1:
            return _reduce(per_item, self._reduction, dim=1).tolist()
        return per_item[:, 0].tolist()

    def _mark_update_entities(self, index: torch.Tensor) -> None:
        """Mark entities as updated with the given index."""
        _mark_updated(self._storage, index)

    def _empty(self, empty_write_count: bool = True) -> None:
        self._cursor = 0
        self._current_top_values = []
        if empty_write_count:
            self._write_count = 0

    def __getstate__(self):
        if get_spawning_popen() is not None:
            raise RuntimeError(
                f"Writers of type {type(self)} cannot be shared between processes. "
                f"Please submit an issue at https://github.com/pytorch/rl if this feature is needed."
            )
        state = super().__getstate__()
        if "_write_count_value" in state:
            state["write_count__context"] = self._write_count
            del state["_write_count_value"]
        return state

    def __setstate__(self, state):
        write_count = state.pop("write_count__context", None)
        if write_count is not None:
            state["_write_count_value"] = _counter(write_count, False)
        self.__dict__.update(state)

    def dumps(self, path):
        values = torch.as_tensor(self._current_top_values)
        content = {
            "cursor": self._cursor,
            "rank_key": self._rank_key,
            "dtype": str(values.dtype),
            "shape": list(values.shape),
        }

        def write(directory):
            if values.numel():  # MemoryMappedTensor writes no file for an empty tensor
                values.numpy().tofile(directory / TOP_VALUES_FILE)
            _dump_json(content, directory / WRITER_METADATA_FILE)

        write_aside(path, write)

    def loads(self, path):
        self._apply_checkpoint(self._read_checkpoint(path))

    def _read_checkpoint(self, path) -> dict:
        """Everything :meth:`loads` takes from ``path``, read and checked (nothing changes)."""
        file, metadata = _read_metadata(path, ("cursor", "rank_key", "dtype", "shape"))
        cursor = read_count(file, "cursor", metadata["cursor"])
        rank_key = metadata["rank_key"]
        # json turns a nested key's tuple into a list
        if isinstance(rank_key, list) and rank_key and all(isinstance(part, str) for part in rank_key):
            rank_key = tuple(rank_key)
        elif not isinstance(rank_key, str):
            raise MetadataError(f"{file}: rank_key must be a key (a string or a list of strings), got {rank_key!r}")
        dtype = _str2dtype(metadata["dtype"], file)
        shape = metadata["shape"]
        if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
        ) or (math.prod(shape) and (len(shape) != 2 or shape[1] != 2)):
            raise MetadataError(f"{file}: shape must be [number of items, 2] (or empty), got {shape!r}")
        values = read_tensor_file(Path(path).absolute() / TOP_VALUES_FILE, dtype, shape)
        return {
            "cursor": cursor,
            "rank_key": rank_key,
            "top_values": [(value, int(row)) for value, row in values.reshape(-1, 2).tolist()],
        }

    def _apply_checkpoint(self, state: dict) -> None:
        self._cursor = state["cursor"]
        self._rank_key = state["rank_key"]
        self._current_top_values = state["top_values"]

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError

    def __repr__(self):
        return f"{self.__class__.__name__}(cursor={int(self._cursor)}, full_storage={self._storage._is_full}, rank_key={self._rank_key}, reduction={self._reduction})"


class WriterEnsemble(Writer, *torchrl_twin("writers", "WriterEnsemble")):
    """An ensemble of writers.

    This class is designed to work with :class:`~torchrl_compat.ReplayBufferEnsemble`.
    It contains the writers but blocks writing with any of them.

    Args:
        writers (sequence of Writer): the writers to make the composite writer.

    .. warning::
       This class does not support writing.
       To extend one of the replay buffers, simply index the parent
       :class:`~torchrl_compat.ReplayBufferEnsemble` object.

    Examples:
        >>> ensemble = WriterEnsemble(RoundRobinWriter(), RoundRobinWriter())
        >>> len(ensemble), type(ensemble[1]).__name__, len(ensemble[:1])
        (2, 'RoundRobinWriter', 1)
    """

    def __init__(self, *writers):
        self._rng_private = None
        self._writers = writers

    _rng = members_rng("_writers")

    def _empty(self, empty_write_count: bool = True) -> None:
        raise NotImplementedError

    def dumps(self, path: Path):
        # every member's files are written aside and published together
        def write(directory):
            for i, writer in enumerate(self._writers):
                writer.dumps(directory / str(i))

        write_aside(path, write)

    def loads(self, path: Path):
        self._apply_checkpoint(self._read_checkpoint(path))

    def _read_checkpoint(self, path) -> list:
        # every member's checkpoint is read and checked before any member changes
        path = Path(path).absolute()
        return [read_for_loading(writer, path / str(i)) for i, writer in enumerate(self._writers)]

    def _apply_checkpoint(self, loaders: list) -> None:
        for load in loaders:
            load()

    def add(self):
        raise NotImplementedError

    def extend(self):
        raise NotImplementedError

    _INDEX_ERROR = INDEX_ERROR

    def __getitem__(self, index):
        return select_members(
            self, index, self._writers, lambda selection: WriterEnsemble(*pick(self._writers, selection)), kind="writers"
        )

    def __len__(self):
        return len(self._writers)

    def __repr__(self):
        writers = textwrap.indent(f"writers={self._writers}", " " * 4)
        return f"WriterEnsemble(\n{writers})"

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError

    def __getstate__(self):
        state = copy(self.__dict__)
        state["_rng_private"] = None
        return state
