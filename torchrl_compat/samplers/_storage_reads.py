"""How the samplers read the storages they sample from.

The samplers work with any storage that follows torchrl's storage API (duck typing, as
torchrl's samplers do). For tensor storages whose ``get`` is torchrl's or ours, the fields a
sampler needs are read from the storage's tensordict directly, at the rows it needs, instead of
gathering every field of the data.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from torchrl_compat._torchrl_lookup import with_torchrl_namesakes
from torchrl_compat.storages import LazyMemmapStorage, LazyTensorStorage, TensorStorage

__all__ = [
    "entry",
    "flag_columns",
    "gather_fields",
    "has_plain_get",
    "ravel",
    "snapshot",
    "storage_device",
]


# The ``get`` methods that read ``storage._storage[:len][index]``: ours, and torchrl's when
# importable.
_PLAIN_GETS = frozenset(
    cls.get for cls in with_torchrl_namesakes(TensorStorage, LazyTensorStorage, LazyMemmapStorage)
)


def has_plain_get(storage) -> bool:
    """Whether ``storage.get(index)`` is ``storage._storage[:len][index]`` (the ``get`` of a
    tensor storage class of ours or torchrl's), so its data can be read directly."""
    return type(storage).get in _PLAIN_GETS


def _plain_tensordict(storage):
    """The tensordict of a tensor storage whose ``get`` is torchrl's (or ours), which its
    fields can be read from directly; ``None`` for any other storage."""
    data = getattr(storage, "_storage", None)
    if (
        type(storage).get in _PLAIN_GETS
        and getattr(storage, "initialized", False)
        and isinstance(data, TensorDictBase)
    ):
        return data
    return None


_RAISE = object()


def entry(data, key, default=_RAISE):
    """``data[key]`` (or ``data.get(key, default)`` when a default is given), read from the
    nested dicts of a plain :class:`~tensordict.TensorDict` directly: the generic lookup
    (key unravelling, validation) costs a few microseconds, several times per sample."""
    node = data
    parts = (key,) if type(key) is str else key if type(key) is tuple else None
    if parts:
        for part in parts:
            if type(node) is not TensorDict or type(part) is not str:
                break  # not a plain path: the generic lookup
            node = node._tensordict.get(part)
            if node is None:
                if default is _RAISE:
                    break  # missing: the generic lookup raises its KeyError
                return default
        else:
            return node
    return data[key] if default is _RAISE else data.get(key, default)


def gather_fields(storage, index, keys):
    """``storage[index].get(key)`` for each key (``None`` when missing), gathering only those keys.

    Tensor storages whose ``get`` is torchrl's (or ours) index their tensordict directly, for
    the indices a sampler produces (within the filled length): ``storage[index]`` would gather
    every field of the data.
    """
    data = _plain_tensordict(storage)
    if data is not None:
        out = []
        for key in keys:
            value = entry(data, key, None)
            out.append(None if value is None else value[index])
        return out
    gathered = storage[index]
    return [gathered.get(key, default=None) for key in keys]


def flag_columns(storage, keys):
    """The ``[rows, 1]`` bool CPU columns of a plain tensor storage at ``keys`` (``None`` for a
    missing key), for ``replay.sample_slice_index`` to read at the sampled rows; ``None`` when
    a column is of another kind (the caller then indexes the storage as torchrl does)."""
    data = _plain_tensordict(storage)
    if data is None:
        return None
    columns = []
    for key in keys:
        value = entry(data, key, None)
        if value is not None and not (
            isinstance(value, torch.Tensor)
            and value.dtype is torch.bool
            and value.ndim == 2
            and value.shape[1] == 1
            and value.is_cpu
        ):
            return None
        columns.append(value)
    return columns


def snapshot(signal):
    """A private copy of a signal read from a storage's memory, for a scan that reads it more
    than once (count, then fill): another process may write that memory meanwhile (a shared
    or memory-mapped storage), and the passes would disagree. One O(rows) copy."""
    if isinstance(signal, torch.Tensor) and signal.is_cpu:
        return signal.clone()
    return signal


def storage_device(storage) -> torch.device | None:
    """The device a storage keeps its data on, ``None`` when it does not say (or says "auto")."""
    device = getattr(storage, "device", None)
    if device is None or isinstance(device, str) and device == "auto":
        return None
    try:
        return torch.device(device)
    except (TypeError, RuntimeError):
        return None


def ravel(coords, shape, device=None) -> torch.Tensor:
    """``np.ravel_multi_index`` in torch ops (coordinates are trusted to be in range)."""
    flat = None
    stride = 1
    for coord, size in zip(reversed(tuple(coords)), reversed(tuple(shape))):
        coord = torch.as_tensor(coord, device=device)
        term = coord * stride
        flat = term if flat is None else flat + term
        stride *= int(size)
    return flat
