"""Sampled batches gathered leaf by leaf: the common case of a buffer's ``sample``.

torchrl reads a sampled batch with ``storage.get(index)``: for a tensordict storage that
slices the filled part, then indexes the tensordict, whose generic machinery (key
validation, device checks, batch-size inference) costs about as much again as the
copies themselves; :class:`~torchrl_compat.TensorDictReplayBuffer` then sets ``index``
and ``priority_weight`` into the result one ``set`` at a time. Here each leaf of a plain
tensor storage is gathered on its own and the result is assembled directly, with the
info entries already in place (at the position ``set`` would give them), so the buffer
returns the same tensordict.

A CPU leaf is gathered with ``numpy.take`` on a cached array view of it: the rows of a
large storage are scattered in memory, the copy waits on memory far more than it
computes, and numpy's row-copy loop keeps more of those reads in flight than torch's
``index_select`` (about 35 us against 60 us for six leaves of 256 random rows of a 2^20
storage; the output is the same tensor). Other leaves use ``index_select``.
"""
from __future__ import annotations

import torch
from tensordict import MemoryMappedTensor, TensorDict

from torchrl_compat._sampler_storage import has_plain_get

__all__ = ["array_of", "gather_rows", "info_tree", "plain_storage"]

_LEAF_TYPES = (torch.Tensor, MemoryMappedTensor)


def info_tree(info: dict, numel: int, device) -> dict | None:
    """The entries of ``info`` a tensordict buffer sets into a 1-D batch as they are, as a
    tree of dicts (a nested key ``("next", "done")`` under ``"next"``), in ``info``'s order;
    ``None`` unless every entry is a tensor of ``numel`` rows on ``device`` under a string
    key or a tuple of them."""
    if device is None:
        return None
    on_cpu = device.type == "cpu"
    tree = {}
    for key, value in info.items():
        if (
            type(value) is not torch.Tensor
            or not value.ndim
            or value.shape[0] != numel
            # is_cpu reads a flag, where comparing devices builds two objects
            or not (value.is_cpu if on_cpu else value.device == device)
        ):
            return None
        path = _path_of(key)
        if path is None:
            return None
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if type(node) is not dict:
                return None
        if type(node.get(path[-1])) is dict:
            return None
        node[path[-1]] = value
    return tree


def _path_of(key) -> tuple | None:
    """``key`` as a tuple of strings (a string key is a path of one), or ``None`` for any
    other key."""
    if type(key) is str:
        return (key,)
    if type(key) is not tuple or not key:
        return None
    for part in key:
        if type(part) is not str:
            return None
    return key


def plain_storage(storage) -> bool:
    """Whether ``storage`` is a 1-D tensor storage whose ``get`` reads
    ``storage._storage[:len][index]`` (ours or torchrl's), which :func:`gather_rows` reads."""
    return has_plain_get(storage) and storage.ndim == 1


def gather_rows(
    storage,
    index,
    *,
    trusted: bool,
    info: dict | None = None,
    arrays: dict | None = None,
    numpy_index=None,
):
    """``storage.get(index)`` for a :func:`plain_storage`, or ``None`` when not handled here.

    Args:
        storage (Storage): the storage to read (a :func:`plain_storage`).
        index: the sampled indices; only a 1-D integer tensor (or a tuple holding one)
            is handled.

    Keyword Args:
        trusted (bool): whether ``index`` comes from a sampler known to draw within the
            filled part (``0 <= index < len(storage)``); otherwise it is checked, and an
            index outside is left to ``storage.get`` (which wraps or raises).
        info (dict, optional): entries a tensordict buffer sets into the batch: when
            they fit it as they are (see :func:`info_tree`), they replace the stored
            leaf of the same key (which is then not gathered) or follow the stored keys
            of their level.
        arrays (dict, optional): the numpy views of the leaves already made (filled in
            as leaves are met; see :func:`array_of`).
        numpy_index (np.ndarray, optional): a numpy view of ``index``, when the caller
            has one.

    Returns:
        The batch ``storage.get`` would return (same keys in the same order, dtypes,
        devices and batch sizes), with ``info`` set in it; or ``None``.

    Called outside :func:`torch.compile` only (a traced buffer reads through ``get``).
    """
    if type(index) is tuple and len(index) == 1:
        index = index[0]  # a 1-D storage indexed with one index per dimension
    if (
        type(index) is not torch.Tensor
        or index.ndim != 1
        or (index.dtype is not torch.int64 and index.dtype is not torch.int32)
        or not storage.initialized
    ):
        return None
    if not trusted and index.numel():
        low, high = torch.aminmax(index)
        if int(low) < 0 or int(high) >= len(storage):
            return None
    data = storage._storage
    if arrays is None:
        arrays = {}
    if type(data) is TensorDict:
        if info is not None:
            info = info_tree(info, index.shape[0], data.device)  # None: the buffer sets them
        return _gather_tensordict(data, _Rows(index, arrays, numpy_index), info)
    if info is None and type(data) in _LEAF_TYPES and data.device == index.device:
        if index.device.type == "cpu":
            array = array_of(data, arrays)
            if array is not None:
                rows = index.numpy() if numpy_index is None else numpy_index
                return torch.from_numpy(array.take(rows, axis=0))
        return torch.index_select(data, 0, index)
    return None


class _Rows:
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


def _gather_tensordict(data: TensorDict, rows: _Rows, info: dict | None):
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
            value = _gather_tensordict(leaf, rows, extra)
        elif extra is None and leaf_type in _LEAF_TYPES:
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
