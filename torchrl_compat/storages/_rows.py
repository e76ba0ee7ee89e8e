"""Rows of a tensor storage's data read and written leaf by leaf.

``TensorStorage.get(index)`` and ``set(index, data)`` with a 1-D index tensor index the
storage's tensordict, whose generic machinery (key validation, device and batch-size
checks, nested lookups) costs about as much as the copies themselves. When the data is a
plain CPU :class:`~tensordict.TensorDict` (or tensor) whose leaves numpy can view, each leaf
is read with ``numpy.take`` and written with one numpy row assignment instead: the same
tensors, in the same order, as the tensordict path gives. Anything else (other leaf or
container types, names, dtypes or shapes that differ, indices out of range) is left to the
generic path, which keeps torchrl's results and errors.
"""
from __future__ import annotations

import numpy as np
import replay
import torch
from tensordict import MemoryMappedTensor, TensorDict

from torchrl_compat.storages._tensordict_build import plain_tensordict

__all__ = ["array_of", "gather_tensordict", "get_rows", "LEAF_TYPES", "LeafArrays", "Rows", "set_rows"]

LEAF_TYPES = (torch.Tensor, MemoryMappedTensor)

_INDEX_DTYPES = (torch.int64, torch.int32)


class LeafArrays:
    """The numpy views of one storage's leaves, made once (about a microsecond each) and
    dropped when the storage's data object is replaced (a load, a new init), so that no
    replaced leaf is kept alive."""

    __slots__ = ("owner", "arrays")

    def __init__(self):
        self.owner = None
        self.arrays = {}

    def of(self, data) -> dict:
        if self.owner is not data:
            self.owner = data
            self.arrays = {}
        return self.arrays


def _cpu_rows(index) -> np.ndarray | None:
    """A numpy view of ``index`` when it is a 1-D integer CPU tensor, else ``None``."""
    if (
        type(index) is not torch.Tensor
        or index.ndim != 1
        or index.dtype not in _INDEX_DTYPES
        or not index.is_cpu
    ):
        return None
    return index.numpy()


def get_rows(data, index, arrays: LeafArrays):
    """``data[index]`` for a 1-D CPU index tensor, or ``None`` when not handled here.

    ``data`` is a storage's whole tensordict or tensor (not sliced to its filled part):
    the caller has mapped ``index`` onto it. Negative entries count from the end, as in
    torch; with an entry out of range, ``None`` (the generic path then raises torch's
    ``IndexError``).
    """
    rows = _cpu_rows(index)
    if rows is None:
        return None
    data_type = type(data)
    try:
        if data_type is TensorDict:
            # (None when a leaf is of another kind or on another device)
            return gather_tensordict(data, Rows(index, arrays.of(data), rows), None)
        if data_type is torch.Tensor and data.is_cpu:
            array = array_of(data, arrays.of(data))
            if array is None:
                return None
            return torch.from_numpy(array.take(rows, axis=0))
    except IndexError:
        return None
    return None


def set_rows(data, index, value) -> bool:
    """Writes ``value`` at the rows ``index`` of ``data`` as ``data[index] = value`` does
    (one ``index_put_`` per leaf, the op that assignment runs), and says whether it did;
    ``False`` (nothing written) unless ``data`` and ``value`` are plain CPU tensordicts with
    the same keys at every level, every leaf of ``value`` a tensor of the stored dtype and of
    shape ``(len(index), *stored_shape[1:])``, and every index within ``[0, len(data))``.
    Everything is checked before the first row is written.
    """
    rows = _cpu_rows(index)
    if rows is None or type(data) is not TensorDict or type(value) is not TensorDict:
        return False
    if rows.size:
        if rows.min() < 0 or rows.max() >= data.batch_size[0]:
            return False
    if value._td_dim_names is not None or data._td_dim_names is not None:
        return False
    if value.batch_size[0] != rows.size or value.batch_size[1:] != data.batch_size[1:]:
        return False
    pairs = []
    if not _pair_leaves(data, value, rows.size, pairs):
        return False
    key = (index,)
    for target, source in pairs:
        target.index_put_(key, source)
    return True


def _pair_leaves(store: TensorDict, value: TensorDict, numel: int, pairs: list) -> bool:
    """Appends ``(stored leaf, given leaf)`` for every leaf; ``False`` at the first mismatch
    (keys, container type, dtype, shape, device, a leaf needing grad)."""
    stored = store._tensordict
    given = value._tensordict
    if len(stored) != len(given):
        return False
    for key, source in given.items():
        target = stored.get(key)
        source_type = type(source)
        if source_type is TensorDict:
            if (
                type(target) is not TensorDict
                or source._td_dim_names is not None
                or source.batch_size[0] != numel
                or not _pair_leaves(target, source, numel, pairs)
            ):
                return False
        elif (
            source_type is not torch.Tensor
            or not isinstance(target, torch.Tensor)
            or source.dtype != target.dtype
            or source.shape[0] != numel
            or source.shape[1:] != target.shape[1:]
            or not source.is_cpu
            or not target.is_cpu
            or source.requires_grad
            or target.requires_grad
        ):
            return False
        else:
            pairs.append((target, source))
    return True


class Rows:
    """The sampled rows, and how to gather them from the leaves of one batch.

    CPU leaves that numpy can view are gathered together, in one ``replay.take_rows`` call
    once the batch's structure is known (:meth:`put` then :meth:`flush`); other leaves are
    gathered as they are met."""

    __slots__ = ("index", "numpy_index", "arrays", "batch_size", "_pending")

    def __init__(self, index: torch.Tensor, arrays: dict, numpy_index=None):
        self.index = index
        self.batch_size = torch.Size([index.shape[0]])
        if numpy_index is None and index.is_cpu:
            numpy_index = index.numpy()
        self.numpy_index = numpy_index
        self.arrays = arrays
        self._pending = []

    def put(self, leaf: torch.Tensor, out: dict, key: str) -> bool:
        """Sets ``out[key]`` to ``leaf[index]`` (a new tensor), now or at :meth:`flush`;
        ``False`` when ``leaf`` is on another device than the index."""
        if self.numpy_index is not None:
            # a CPU index (is_cpu reads a flag, where comparing devices builds two objects)
            if not leaf.is_cpu:
                return False
            array = array_of(leaf, self.arrays)
            if array is not None:
                out[key] = None  # holds the key's place until the flush
                self._pending.append((array, out, key))
                return True
        elif leaf.device != self.index.device:
            return False
        out[key] = torch.index_select(leaf, 0, self.index)
        return True

    def flush(self) -> None:
        """Gathers the leaves :meth:`put` left for later, all in one pass."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        arrays = [entry[0] for entry in pending]
        try:
            gathered = replay.take_rows(arrays, self.numpy_index)
        except (IndexError, TypeError, ValueError):
            # negative rows (numpy wraps them as torch does), strided views: one leaf at a time
            gathered = [array.take(self.numpy_index, axis=0) for array in arrays]
        for (_, out, key), value in zip(pending, gathered):
            out[key] = torch.from_numpy(value)


# Dtypes a CPU tensor shares with numpy (``Tensor.numpy()`` refuses the others).
_NUMPY_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
})


def array_of(leaf: torch.Tensor, arrays: dict):
    """A numpy view of the CPU tensor ``leaf`` (``None`` when it has none), cached in
    ``arrays`` by identity: making one costs about a microsecond."""
    entry = arrays.get(id(leaf))
    if entry is not None and entry[0] is leaf:
        return entry[1]
    array = None
    if leaf.dtype in _NUMPY_DTYPES and not leaf.requires_grad:
        try:
            array = leaf.numpy()
        except (TypeError, RuntimeError):  # conjugate or negative views
            array = None
    if len(arrays) >= _MAX_ARRAYS:
        arrays.clear()  # leaves replaced over time: start again rather than hold them
    arrays[id(leaf)] = (leaf, array)
    return array


_MAX_ARRAYS = 256


class _Level:
    """A level of the gathered batch, made a tensordict once its leaves are all in."""

    __slots__ = ("out", "batch_size", "device")

    def __init__(self, out: dict, batch_size: torch.Size, device):
        self.out, self.batch_size, self.device = out, batch_size, device

    def build(self) -> TensorDict:
        out = self.out
        for key, value in out.items():
            if type(value) is _Level:
                out[key] = value.build()
        return plain_tensordict(out, self.batch_size, self.device)


def gather_tensordict(data: TensorDict, rows: Rows, info: dict | None):
    """The rows of ``data``, with the entries of the ``info`` tree set as ``TensorDict.set``
    would: in place of a stored entry of the same key, else after the stored ones."""
    level = _gather_level(data, rows, info)
    if level is None:
        return None
    rows.flush()
    return level.build()


def _gather_level(data: TensorDict, rows: Rows, info: dict | None) -> _Level | None:
    if data._td_dim_names is not None:
        return None
    device = data.device
    if device is not None and (
        device.type != "cpu" if rows.numpy_index is not None else device != rows.index.device
    ):
        return None
    out = {}
    for key, leaf in data._tensordict.items():
        extra = None if info is None else info.get(key)
        if extra is not None and type(extra) is not dict:
            out[key] = extra  # replaced: not gathered
            continue
        leaf_type = type(leaf)
        if leaf_type is TensorDict:
            value = _gather_level(leaf, rows, extra)
            if value is None:
                return None
            out[key] = value
        elif extra is None and leaf_type in LEAF_TYPES:
            if not rows.put(leaf, out, key):
                return None
        else:
            return None  # a nested info key under a tensor, or a leaf of another kind
    stored_size = data._batch_size
    batch_size = rows.batch_size if len(stored_size) == 1 else rows.batch_size + stored_size[1:]
    if info is not None:
        for key, value in info.items():
            if key not in out:
                # set() makes a missing level (the slice samplers' "next") as an empty
                # tensordict of the batch's size and device, then fills it in order
                out[key] = _new_level(value, batch_size, device) if type(value) is dict else value
    return _Level(out, batch_size, device)


def _new_level(tree: dict, batch_size: torch.Size, device) -> TensorDict:
    """The tensordict ``set`` creates for a missing nested key, holding the ``tree``'s entries."""
    out = {key: _new_level(value, batch_size, device) if type(value) is dict else value for key, value in tree.items()}
    return plain_tensordict(out, batch_size, device)
