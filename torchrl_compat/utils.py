"""Replay-buffer helpers (stand-in for ``torchrl.data.replay_buffers.utils``).

The functions here are the small building blocks that storages, samplers, writers and
checkpointers share: integer-index tests, numpy/torch conversion, reductions, pytree
iteration and the memory-mapped pytree layout (``<path>/<key>/<key>.memmap``) that
:class:`~torchrl_compat.checkpointers.TensorStorageCheckpointer` and
:class:`~torchrl_compat.storages.LazyMemmapStorage` write. The on-disk naming matches
torchrl 0.11 so that checkpoints written by one can be read by the other.
"""
from __future__ import annotations

import os
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union

import numpy as np
import torch
from tensordict import MemoryMappedTensor
from torch import Tensor
from torch.utils import _pytree

__all__ = [
    "INT_CLASSES",
    "INT_CLASSES_TYPING",
    "SINGLE_TENSOR_BUFFER_NAME",
    "pin_memory_output",
    "tree_iter",
    "unravel_index",
]

#: File stem used when a storage holds one bare tensor rather than a pytree of them.
SINGLE_TENSOR_BUFFER_NAME = os.environ.get(
    "SINGLE_TENSOR_BUFFER_NAME", "_-single-tensor-_"
)

INT_CLASSES_TYPING = Union[int, np.integer]
INT_CLASSES = typing.get_args(INT_CLASSES_TYPING)


def _to_numpy(data: Tensor) -> np.ndarray:
    """Returns a numpy view (CPU) or copy (other devices) of a tensor; other inputs pass through."""
    if isinstance(data, torch.Tensor):
        return data.detach().cpu().numpy()
    return data


def _to_torch(
    data: Tensor, device, pin_memory: bool = False, non_blocking: bool = False
) -> torch.Tensor:
    """Turns numpy arrays, numpy scalars and python numbers into tensors on ``device``.

    numpy arrays are wrapped without copy (``torch.from_numpy``) before being moved.
    """
    if isinstance(data, np.generic):
        return torch.as_tensor(data, device=device)
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(data)
    elif not isinstance(data, Tensor):
        data = torch.as_tensor(data, device=device)
    if pin_memory:
        data = data.pin_memory()
    if device is not None:
        data = data.to(device, non_blocking=non_blocking)
    return data


def _pin_memory(output: Any) -> Any:
    if hasattr(output, "pin_memory") and output.device == torch.device("cpu"):
        return output.pin_memory()
    return output


def pin_memory_output(fun) -> Callable:
    """Calls pin_memory on outputs of decorated function if they have such method."""

    def decorated_fun(self, *args, **kwargs):
        output = fun(self, *args, **kwargs)
        if not self._pin_memory:
            return output
        if isinstance(output, tuple):
            return tuple(_pin_memory(item) for item in output)
        return _pin_memory(output)

    return decorated_fun


_REDUCTIONS = {
    "max": torch.Tensor.max,
    "min": torch.Tensor.min,
    "mean": torch.Tensor.mean,
    "median": torch.Tensor.median,
    "sum": torch.Tensor.sum,
}


def _reduce(
    tensor: torch.Tensor, reduction: str, dim: int | None = None
) -> float | torch.Tensor:
    """Reduces a tensor given the reduction method.

    Returns a python number when ``dim`` is ``None`` and a tensor otherwise.

    .. note:: torchrl passes ``dim=None`` straight to ``Tensor.max`` / ``min`` /
        ``median``, which raise ``TypeError``; here a whole-tensor reduction works for
        every method.
    """
    try:
        fn = _REDUCTIONS[reduction]
    except KeyError:
        raise NotImplementedError(f"Unknown reduction method {reduction}") from None
    result = fn(tensor) if dim is None else fn(tensor, dim=dim)
    # max/min/median along a dim return (values, indices)
    if isinstance(result, tuple):
        result = result[0]
    return result.item() if dim is None else result


def _is_int(index) -> bool:
    """Whether ``index`` designates a single element (python/numpy int or a 0-d array)."""
    if isinstance(index, INT_CLASSES):
        return True
    if isinstance(index, (np.ndarray, torch.Tensor)):
        return index.ndim == 0
    return False


# -----------------------------------------------------------------------------
# pytrees

if hasattr(_pytree, "tree_iter"):

    def tree_iter(pytree):
        """A version-compatible wrapper around tree_iter."""
        yield from _pytree.tree_iter(pytree)

elif hasattr(_pytree, "tree_leaves"):

    def tree_iter(pytree):  # noqa: F811
        """A version-compatible wrapper around tree_iter."""
        yield from _pytree.tree_leaves(pytree)

else:  # pragma: no cover - torch < 2.3

    def tree_iter(pytree):  # noqa: F811
        """A version-compatible wrapper around tree_iter."""
        yield from _pytree.tree_flatten(pytree)[0]


def _path2str(path, default_name=None) -> str:
    """Turns a pytree key path into the relative file path used on disk.

    ``()`` (a bare tensor) maps to ``default_name`` (``SINGLE_TENSOR_BUFFER_NAME``), dict keys
    to their string and sequence positions to their index, joined with ``/``.
    """
    if default_name is None:
        default_name = SINGLE_TENSOR_BUFFER_NAME
    if not path:
        return default_name
    if isinstance(path, tuple):
        return "/".join(_path2str(sub, default_name=default_name) for sub in path)
    if isinstance(path, _pytree.MappingKey):
        if not isinstance(path.key, (int, str, bytes)):
            raise ValueError("Values must be of type int, str or bytes in PyTree maps.")
        result = str(path.key)
        if result == default_name:
            raise RuntimeError(
                "A tensor had the same identifier as the default name used when the buffer contains "
                f"a single tensor (name={default_name}). This behavior is not allowed. Please rename your "
                f"tensor in the map/dict or set a new default name with the environment variable SINGLE_TENSOR_BUFFER_NAME."
            )
        return result
    if isinstance(path, _pytree.SequenceKey):
        return str(path.idx)
    raise ValueError(
        f"Unsupported pytree key {path!r} of type {type(path).__name__}: only mapping keys "
        "and sequence positions can be stored on disk."
    )


def _get_paths(spec, cumulpath=""):
    """Yields the on-disk path of every leaf of a pytree spec, without key paths."""
    if spec.is_leaf():
        yield cumulpath if cumulpath else SINGLE_TENSOR_BUFFER_NAME
        return
    contexts = spec.context
    children_specs = spec.children_specs
    if contexts is None:
        contexts = range(len(children_specs))
    for context, child in zip(contexts, children_specs):
        cpath = f"{cumulpath}/{context}" if cumulpath else str(context)
        yield from _get_paths(child, cpath)


def _save_pytree_common(tensor_path, path, tensor, metadata):
    # torchrl computes a dot-free name here but drops the result (str.replace is not
    # in-place), so files keep their dots; we keep that naming for compatibility.
    total_tensor_path = Path(path) / (tensor_path + ".memmap")
    if os.path.exists(total_tensor_path):
        MemoryMappedTensor.from_filename(
            shape=tensor.shape, filename=total_tensor_path, dtype=tensor.dtype
        ).copy_(tensor)
    else:
        os.makedirs(total_tensor_path.parent, exist_ok=True)
        MemoryMappedTensor.from_tensor(
            tensor, filename=total_tensor_path, copy_existing=True, copy_data=True
        )
    key = tensor_path.replace("/", ".")
    if key in metadata:
        raise KeyError(
            "At least two values have conflicting representations in "
            f"the data structure to be serialized: {key}."
        )
    metadata[key] = {"dtype": str(tensor.dtype), "shape": list(tensor.shape)}


def _save_pytree(_storage, metadata, path):
    """Writes every leaf of ``_storage`` to ``path/<key path>.memmap`` and fills ``metadata``."""
    path = Path(path)

    def save_tensor(tensor_path, tensor):
        _save_pytree_common(_path2str(tensor_path), path, tensor, metadata)

    _pytree.tree_map_with_path(save_tensor, _storage)


def _init_pytree_common(tensor_path, scratch_dir, max_size_fn, tensor):
    if scratch_dir is not None:
        total_tensor_path = Path(scratch_dir) / (tensor_path + ".memmap")
        if os.path.exists(total_tensor_path):
            raise RuntimeError(
                f"The storage of tensor {total_tensor_path} already exists. "
                f"To load an existing replay buffer, use storage.loads. "
                f"Choose a different path to store your buffer or delete the existing files."
            )
        os.makedirs(total_tensor_path.parent, exist_ok=True)
    else:
        total_tensor_path = None
    return MemoryMappedTensor.empty(
        shape=max_size_fn(tensor.shape), filename=total_tensor_path, dtype=tensor.dtype
    )


def _init_pytree(scratch_dir, max_size_fn, data):
    """Creates an empty memory-mapped copy of pytree ``data`` with leading shape ``max_size_fn(shape)``.

    Files go to ``scratch_dir/<key path>.memmap`` (anonymous temporary files when
    ``scratch_dir`` is ``None``).
    """

    def make_tensor(tensor_path, tensor):
        return _init_pytree_common(
            _path2str(tensor_path), scratch_dir, max_size_fn, tensor
        )

    return _pytree.tree_map_with_path(make_tensor, data)


# -----------------------------------------------------------------------------
# indices


def _unravel_index(indices: Tensor, shape) -> tuple[Tensor, ...]:
    """Torch-op fallback of :func:`torch.unravel_index` (C order)."""
    if isinstance(shape, (int, torch.SymInt)):
        shape = torch.Size([shape])
    else:
        shape = torch.Size(shape)
    out = []
    rest = indices
    for dim in reversed(shape):
        out.append(rest % dim)
        rest = rest.div(dim, rounding_mode="floor")
    return tuple(reversed(out))


if hasattr(torch, "unravel_index"):

    def unravel_index(indices, shape):
        """A version-compatible wrapper around torch.unravel_index."""
        return torch.unravel_index(indices, shape)

else:  # pragma: no cover - torch < 2.2

    def unravel_index(indices, shape):  # noqa: F811
        """A version-compatible wrapper around torch.unravel_index."""
        return _unravel_index(indices, shape)


def _auto_device() -> torch.device:
    """The first accelerator found (CUDA, then MPS), else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda:0")
    if hasattr(torch, "mps") and torch.mps.is_available():
        return torch.device("mps:0")
    return torch.device("cpu")


def _make_ordinal_device(device) -> torch.device | None:
    """Gives CUDA/MPS devices an explicit index (``"cuda"`` -> ``"cuda:<current>"``)."""
    if device is None:
        return device
    device = torch.device(device)
    if device.index is None:
        if device.type == "cuda":
            return torch.device("cuda", index=torch.cuda.current_device())
        if device.type == "mps":
            return torch.device("mps", index=0)
    return device
