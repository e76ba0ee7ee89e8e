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
from tensordict import TensorDict

from torchrl_compat.samplers._storage_reads import has_plain_get
from torchrl_compat.storages._rows import array_of, gather_tensordict, LEAF_TYPES, Rows

__all__ = ["array_of", "gather_rows", "info_tree", "plain_storage"]

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
        return gather_tensordict(data, Rows(index, arrays, numpy_index), info)
    if info is None and type(data) in LEAF_TYPES:
        # is_cpu reads a flag, where comparing devices builds two objects
        if index.is_cpu:
            if not data.is_cpu:
                return None
            array = array_of(data, arrays)
            if array is not None:
                rows = index.numpy() if numpy_index is None else numpy_index
                return torch.from_numpy(array.take(rows, axis=0))
        elif data.device != index.device:
            return None
        return torch.index_select(data, 0, index)
    return None
