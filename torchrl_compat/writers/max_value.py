""":class:`TensorDictMaxValueWriter`: keeps the items of highest rank."""
from __future__ import annotations

import heapq
import math
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any

import torch
from tensordict import is_tensor_collection, TensorDictBase

from ..checkpointers._checks import MetadataError, read_count, read_tensor_file
from ..checkpointers._publish import write_aside
from .._releases import since
from .._torchrl_lookup import torchrl_twin
from ._checks import check_batch_fits
from ..utils import _reduce, _str2dtype
from .base import (
    TOP_VALUES_FILE,
    WRITER_METADATA_FILE,
    Writer,
    _Counter,
    _counter,
    _dump_json,
    _mark_updated,
    _read_metadata,
)


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
        # checked first: a refused item must leave the ranking as it was
        check_batch_fits(self._storage, data, None)
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
        # checked first: a refused batch must leave the ranking as it was
        if numel:
            check_batch_fits(self._storage, data, numel)
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
        content = {"cursor": self._cursor}
        if since("writer_write_count_checkpoint"):
            content["write_count"] = self._write_count
        content |= {
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
        write_count = metadata.get("write_count")
        if since("writer_write_count_checkpoint") and write_count is not None:
            write_count = read_count(file, "write_count", write_count)
        else:
            write_count = None
        return {
            "cursor": cursor,
            "write_count": write_count,
            "rank_key": rank_key,
            "top_values": [(value, int(row)) for value, row in values.reshape(-1, 2).tolist()],
        }

    def _apply_checkpoint(self, state: dict) -> None:
        self._cursor = state["cursor"]
        if state.get("write_count") is not None:
            self._write_count = state["write_count"]
        self._rank_key = state["rank_key"]
        self._current_top_values = state["top_values"]

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError

    def __repr__(self):
        return f"{self.__class__.__name__}(cursor={int(self._cursor)}, full_storage={self._storage._is_full}, rank_key={self._rank_key}, reduction={self._reduction})"
