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
import torch
from tensordict import MemoryMappedTensor, TensorDict

__all__ = ["array_of", "gather_tensordict", "LEAF_TYPES", "LeafArrays", "read_rows", "Rows", "write_rows"]

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


def read_rows(data, index, arrays: LeafArrays):
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


def write_rows(data, index, value) -> bool:
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
    """The sampled rows, and how to gather them from one leaf."""

    __slots__ = ("index", "numpy_index", "arrays")

    def __init__(self, index: torch.Tensor, arrays: dict, numpy_index=None):
        self.index = index
        if numpy_index is None and index.is_cpu:
            numpy_index = index.numpy()
        self.numpy_index = numpy_index
        self.arrays = arrays

    def take(self, leaf: torch.Tensor) -> torch.Tensor | None:
        """``leaf[index]`` as a new tensor, or ``None`` when ``leaf`` is on another device."""
        if self.numpy_index is not None:
            # a CPU index (is_cpu reads a flag, where comparing devices builds two objects)
            if not leaf.is_cpu:
                return None
            array = array_of(leaf, self.arrays)
            if array is not None:
                return torch.from_numpy(array.take(self.numpy_index, axis=0))
        elif leaf.device != self.index.device:
            return None
        return torch.index_select(leaf, 0, self.index)


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


def gather_tensordict(data: TensorDict, rows: Rows, info: dict | None):
    """The rows of ``data``, with the entries of the ``info`` tree set as ``TensorDict.set``
    would: in place of a stored entry of the same key, else after the stored ones."""
    if data._td_dim_names is not None:
        return None
    device = data.device
    if device is not None and device != rows.index.device:
        return None
    out = {}
    for key, leaf in data._tensordict.items():
        extra = None if info is None else info.get(key)
        if extra is not None and type(extra) is not dict:
            out[key] = extra  # replaced: not gathered
            continue
        leaf_type = type(leaf)
        if leaf_type is TensorDict:
            value = gather_tensordict(leaf, rows, extra)
        elif extra is None and leaf_type in LEAF_TYPES:
            value = rows.take(leaf)
        else:
            return None  # a nested info key under a tensor, or a leaf of another kind
        if value is None:
            return None
        out[key] = value
    batch_size = torch.Size([rows.index.shape[0]]) + data._batch_size[1:]
    if info is not None:
        for key, value in info.items():
            if key not in out:
                # set() makes a missing level (the slice samplers' "next") as an empty
                # tensordict of the batch's size and device, then fills it in order
                out[key] = _new_level(value, batch_size, device) if type(value) is dict else value
    return TensorDict._new_unsafe(out, batch_size=batch_size, device=device, nested=False)


def _new_level(tree: dict, batch_size: torch.Size, device) -> TensorDict:
    """The tensordict ``set`` creates for a missing nested key, holding the ``tree``'s entries."""
    out = {key: _new_level(value, batch_size, device) if type(value) is dict else value for key, value in tree.items()}
    return TensorDict._new_unsafe(out, batch_size=batch_size, device=device, nested=False)
