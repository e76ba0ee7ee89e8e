"""Round-robin writers: :class:`RoundRobinWriter` and :class:`TensorDictRoundRobinWriter`."""
from __future__ import annotations

from collections.abc import Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any

import torch
from tensordict import TensorDict, is_tensor_collection
from tensordict.utils import expand_as_right, is_tensorclass

from torchrl_compat._checkpoint_checks import read_count
from torchrl_compat._checkpoint_publish import write_aside
from torchrl_compat._torchrl_lookup import torchrl_twin
from torchrl_compat._writer_checks import check_batch_fits
from torchrl_compat._writer_rows import shallow_copy, write_rows
from .base import (
    WRITER_METADATA_FILE,
    Writer,
    _Counter,
    _batch_len,
    _counter,
    _dump_json,
    _mark_updated,
    _read_metadata,
)


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

    .. note:: A batch the storage refuses (an entry of another dtype, or of a trailing shape
        that does not broadcast to the storage's rows) raises, naming the entry, before
        anything is written, and the cursor and write count stay where they were: torchrl's
        move on, so that its next batch lands past the storage's length and rows never
        written become visible. Of a batch larger than the capacity, the last ``capacity``
        items are written, each row whole (torchrl's indexed write to repeated rows keeps,
        entry by entry, any of the items written there); the indices returned are torchrl's.

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
        check_batch_fits(self._storage, data, None)
        index = self._cursor
        # the cursor moves before the write, so that concurrent writers take distinct rows
        cursor = (index + 1) % self._storage._max_size_along_dim0(single_data=data)
        self._cursor = cursor
        self._write_count += 1
        try:
            self._storage.set(index, data)
        except BaseException:
            self._undo_move(index, cursor, 1)
            raise
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
        cursor = (start + numel) % capacity
        self._cursor = cursor
        self._write_count += numel
        try:
            self._write_rows(data, numel, start, index, capacity, leave_data)
        except BaseException:
            self._undo_move(start, cursor, numel)
            raise
        index = self._replicate_index(index)
        _mark_updated(self._storage, index)
        return index

    def _write_rows(self, data, numel: int, start: int, index: torch.Tensor, capacity: int, leave_data: bool) -> None:
        """Writes the batch at the rows ``index`` (from ``start`` on, wrapping at ``capacity``).

        Of a batch larger than the capacity, only the last ``capacity`` items are written,
        each row once: torchrl hands the storage all of them, and an indexed write to repeated
        rows keeps, entry by entry, any one of the values written there (torn rows).
        """
        extra = None
        if leave_data:
            extra = {"index": index}
        else:
            self._before_write(data, index)  # the caller's batch receives every index
        full_index = None
        if numel > capacity and (isinstance(data, torch.Tensor) or is_tensor_collection(data)):
            skipped = numel - capacity
            full_index = index
            data, index, start = data[skipped:], index[skipped:], (start + skipped) % capacity
            if extra is not None:
                extra = {"index": index}
        arrays = self.__dict__.get("_leaf_arrays")
        if arrays is None:
            arrays = self.__dict__["_leaf_arrays"] = {}
        # What the storage would refuse is refused before anything is written (the caller
        # then puts the cursor back); a batch copied whole by replay.copy_rows needs no check.
        storage, batch, rows = self._storage, data, index.shape[0]
        if not write_rows(storage, start, index, data, arrays, extra, lambda: check_batch_fits(storage, batch, rows)):
            check_batch_fits(storage, data, rows)
            if leave_data:
                data = shallow_copy(data)
                self._before_write(data, index)
            self._storage.set(index, data)
        if full_index is not None and hasattr(self._storage, "_last_cursor"):
            # the cursor torchrl's storage records: every index of the batch
            self._storage.__dict__.pop("_last_run", None)
            self._storage._last_cursor = full_index

    def _undo_move(self, start: int, cursor: int, numel: int) -> None:
        """Puts the cursor and write count back after a write that failed (unless another
        writer moved the cursor since)."""
        if self._cursor == cursor:
            self._cursor = start
        self._write_count -= numel

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
        check_batch_fits(self._storage, data, None)
        index = self._cursor
        capacity = self._storage._max_size_along_dim0(single_data=data)
        cursor = (index + 1) % capacity
        self._cursor = cursor
        self._write_count += 1
        try:
            self._before_write(data, index)
            self._storage.set(index, data)
        except BaseException:
            self._undo_move(index, cursor, 1)
            raise
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
