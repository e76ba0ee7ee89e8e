"""Round-robin writers: :class:`RoundRobinWriter` and :class:`TensorDictRoundRobinWriter`."""
from __future__ import annotations

from collections.abc import Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any

import torch
from tensordict import TensorDict, is_tensor_collection
from tensordict.utils import expand_as_right, is_tensorclass

from ..checkpointers._checks import MetadataError, read_count, read_tensor_file
from ..checkpointers._publish import write_aside
from .._releases import keywords_since, since
from .._torchrl_lookup import torchrl_twin
from ._checks import check_batch_fits
from ._rows import shallow_copy, write_rows
from ..storages import TensorStorage
from ..utils import _is_int, _str2dtype
from . import _generations
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

    Keyword Args:
        track_generations (bool, optional): from torchrl 0.14 on: if ``True``, every
            storage slot carries a counter that advances each time the slot is written, so
            that a consumer holding an index can tell whether the slot still holds what it
            sampled (:meth:`generations_of`); samples then carry an ``"index_generation"``
            entry in their info (and, for tensordict buffers, in the sample). The counters
            live on the storage, shared by every buffer writing to it, and in this
            process only. Defaults to ``False``.

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
        written become visible. Of a batch larger than the capacity, a tensor storage
        receives the last ``capacity`` items, each row whole (torchrl's indexed write to
        repeated rows keeps, entry by entry, any of the items written there); a list storage
        receives every item in order, as in torchrl. The indices returned are torchrl's.

    Examples:
        >>> import torch
        >>> from torchrl_compat import LazyTensorStorage
        >>> writer = RoundRobinWriter()
        >>> writer.register_storage(LazyTensorStorage(4))
        >>> writer.extend(torch.zeros(3, 2))
        tensor([0, 1, 2])
        >>> writer.extend(torch.ones(2, 2))
        tensor([3, 0])
        >>> writer._cursor, writer._write_count
        (1, 5)
    """

    def __init__(self, compilable: bool = False, *, track_generations: bool = False) -> None:
        super().__init__(compilable=compilable)
        self._cursor = 0
        self._write_count = 0
        self._track_generations = track_generations
        # counters loaded before a storage is registered wait here
        self._pending_generation = None

    # releases before 0.14 take no track_generations
    __init__ = keywords_since(__init__, track_generations="writer_slot_generations")

    # writers pickled before generations existed
    _track_generations = False
    _pending_generation = None

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
            self._before_write(data, index)
            self._storage.set(index, data)
        except BaseException:
            self._undo_move(index, cursor, 1)
            raise
        self._bump_generation(index, data)
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
        self._bump_generation(index, data, run=(start, capacity))
        index = self._replicate_index(index)
        _mark_updated(self._storage, index)
        return index

    def _write_rows(self, data, numel: int, start: int, index: torch.Tensor, capacity: int, leave_data: bool) -> None:
        """Writes the batch at the rows ``index`` (from ``start`` on, wrapping at ``capacity``).

        Of a batch larger than the capacity, a tensor storage gets only the last
        ``capacity`` items, each row once: torchrl hands the storage all of them, and an
        indexed write to repeated rows keeps, entry by entry, any one of the values written
        there (torn rows). A list storage gets every item, as in torchrl: it appends or
        replaces them one by one, in order, so each row ends whole, and only that order keeps
        every append next to the list's end.
        """
        extra = None
        if leave_data:
            extra = {"index": index}
        else:
            self._before_write(data, index)  # the caller's batch receives every index
        full_index = None
        oversized = numel > capacity and isinstance(self._storage, TensorStorage)
        if oversized and (isinstance(data, torch.Tensor) or is_tensor_collection(data)):
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
        if full_index is not None and hasattr(self._storage, "_set_last_cursor"):
            # the cursor torchrl's storage records: every index of the batch
            self._storage.__dict__.pop("_last_run", None)
            self._storage._set_last_cursor(full_index)

    def _undo_move(self, start: int, cursor: int, numel: int) -> None:
        """Puts the cursor and write count back after a write that failed (unless another
        writer moved the cursor since)."""
        if self._cursor == cursor:
            self._cursor = start
        self._write_count -= numel

    def _before_write(self, data, index) -> None:
        """What the item (``index`` an int) or batch (a tensor) receives before it is
        written (nothing here)."""

    # ----------------------------------------------------------- persistence
    def dumps(self, path):
        content = {"cursor": self._cursor}
        if since("writer_write_count_checkpoint"):
            content["write_count"] = self._write_count
        generation = self._generation_for_checkpoint()
        if generation is not None:
            generation = generation.cpu()
            content["generation_shape"] = list(generation.shape)
            content["generation_dtype"] = str(generation.dtype)

        def write(directory):
            if generation is not None and generation.numel():
                generation.numpy().tofile(directory / _generations.GENERATION_FILE)
            _dump_json(content, directory / WRITER_METADATA_FILE)

        write_aside(path, write)

    def loads(self, path):
        self._apply_checkpoint(self._read_checkpoint(path))

    def _read_checkpoint(self, path) -> dict:
        """What :meth:`loads` takes from ``path`` (the cursor; from torchrl 0.14 on the
        write count and slot generations when saved), read and checked without changing
        anything."""
        file, metadata = _read_metadata(path, ("cursor",))
        state = {"cursor": read_count(file, "cursor", metadata["cursor"])}
        if since("writer_write_count_checkpoint") and metadata.get("write_count") is not None:
            state["write_count"] = read_count(file, "write_count", metadata["write_count"])
        if since("writer_slot_generations") and metadata.get("generation_shape") is not None:
            shape = metadata["generation_shape"]
            if not (isinstance(shape, list) and len(shape) == 1 and _is_int(shape[0]) and shape[0] >= 0):
                raise MetadataError(f"{file}: generation_shape must be [number of slots], got {shape!r}")
            dtype = _str2dtype(metadata.get("generation_dtype"), file)
            if dtype is not torch.int64:
                raise MetadataError(f"{file}: generation_dtype must be torch.int64, got {dtype}")
            path = file.parent / _generations.GENERATION_FILE
            state["generation"] = read_tensor_file(path, dtype, shape).clone()
        return state

    def _apply_checkpoint(self, state: dict) -> None:
        self._cursor = state["cursor"]
        if "write_count" in state:
            self._write_count = state["write_count"]
        if "generation" in state:
            self._generation = state["generation"]
            self._align_generation_device()

    def state_dict(self) -> dict[str, Any]:
        state_dict = {"_cursor": self._cursor}
        if since("writer_write_count_checkpoint"):
            state_dict["_write_count"] = self._write_count
        generation = self._generation_for_checkpoint()
        if generation is not None:
            state_dict[_generations.GENERATION_STATE_KEY] = generation.clone()
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._cursor = state_dict["_cursor"]
        if since("writer_write_count_checkpoint") and state_dict.get("_write_count") is not None:
            self._write_count = state_dict["_write_count"]
        generation = state_dict.get(_generations.GENERATION_STATE_KEY)
        if since("writer_slot_generations") and generation is not None:
            self._generation = generation.clone()
            self._align_generation_device()

    def _empty(self, empty_write_count: bool = True) -> None:
        self._cursor = 0
        self._empty_generation()
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

    # ------------------------------------------------------ slot generations
    _generation = property(_generations._get_generation, _generations._set_generation)
    register_storage = _generations.register_storage
    _generation_device = _generations._generation_device
    _align_generation_device = _generations._align_generation_device
    _ensure_generation = _generations._ensure_generation
    _bump_generation = _generations._bump_generation
    _empty_generation = _generations._empty_generation
    _generation_for_checkpoint = _generations.generation_for_checkpoint
    _update_storage_len_for_write_at = _generations.update_storage_len_for_write_at

    def _write_at(self, index, data, *, index_entry: bool) -> int | torch.Tensor:
        """Writes ``data`` at the storage rows ``index``, leaving the cursor where it is;
        ``index_entry`` also sets ``data["index"]`` (tensordicts but tensorclasses)."""
        device = getattr(data, "device", None)
        if index_entry:
            index = torch.as_tensor(index, device=device, dtype=torch.long)
            numel = index.numel()
        elif _is_int(index):
            numel = 1
        else:
            index = torch.as_tensor(index, dtype=torch.long)
            if device is not None:
                index = index.to(device)
            numel = index.numel()
        self._write_count += numel
        if index_entry and not is_tensorclass(data):
            data.set("index", expand_as_right(index, data))
        self._storage.set(index, data, set_cursor=False)
        self._bump_generation(index, data)
        self._update_storage_len_for_write_at(index)
        index = self._replicate_index(index)
        _mark_updated(self._storage, index)
        return index

    if since("writer_slot_generations"):
        tracks_generations = property(_generations.tracks_generations)
        generations_of = _generations.generations_of

        def write_at(self, index: int | torch.Tensor, data: Any) -> int | torch.Tensor:
            """Writes data at explicit storage indices without moving the cursor.

            The generation of every written slot is bumped, so handles previously handed
            out for those slots are stale once this returns. The storage's length grows
            to cover the rows written; the write count grows by their number.

            Args:
                index (int or torch.Tensor): the storage rows to write.
                data: the items, one per row of ``index`` (one item for an int).

            Returns:
                the rows written (one row per element for a storage with ``ndim > 1``).
            """
            return self._write_at(index, data, index_entry=False)


class TensorDictRoundRobinWriter(RoundRobinWriter, *torchrl_twin("writers", "TensorDictRoundRobinWriter")):
    """A RoundRobin Writer class for composable, tensordict-based replay buffers.

    Each item written receives its storage index under the ``"index"`` key (tensorclasses
    excepted), so that samples carry it.

    Args:
        compilable (bool, optional): whether the writer is compilable.
            If ``True``, the writer cannot be shared between multiple processes.
            Defaults to ``False``.

    Keyword Args:
        track_generations (bool, optional): from torchrl 0.14 on, as
            :class:`RoundRobinWriter`'s; samples then hold ``"index_generation"`` beside
            ``"index"``. Defaults to ``False``.

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

    if since("writer_slot_generations"):

        def write_at(self, index: int | torch.Tensor, data: Any) -> int | torch.Tensor:
            """Writes data at explicit storage indices without moving the cursor, and
            records each item's row under its ``"index"`` key (tensorclasses excepted).

            See :meth:`RoundRobinWriter.write_at`.
            """
            return self._write_at(index, data, index_entry=True)
