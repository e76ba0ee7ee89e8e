"""Replay-buffer helpers (stand-in for ``torchrl.data.replay_buffers.utils``).

The functions here are the small building blocks that storages, samplers, writers and
checkpointers share: integer-index tests, numpy/torch conversion, reductions, pytree
iteration and the memory-mapped pytree layout (``<path>/<key>/<key>.memmap``) that
:class:`~torchrl_compat.checkpointers.TensorStorageCheckpointer` and
:class:`~torchrl_compat.storages.LazyMemmapStorage` write. The on-disk naming matches
torchrl 0.11 so that checkpoints written by one can be read by the other.
"""
from __future__ import annotations

import math
import os
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Union

import numpy as np
import torch
from tensordict import MemoryMappedTensor, NonTensorData, TensorDict, TensorDictBase, unravel_key
from torch import Tensor
from torch.utils import _pytree

__all__ = [
    "Flat2TED",
    "H5Combine",
    "H5Split",
    "INT_CLASSES",
    "INT_CLASSES_TYPING",
    "Nested2TED",
    "SINGLE_TENSOR_BUFFER_NAME",
    "TED2Flat",
    "TED2Nested",
    "find_start_stop_traj",
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
# dtypes named in checkpoint metadata


def _dtype_named(name) -> torch.dtype | None:
    """The dtype a checkpoint names (``"torch.float32"``, as ``TensorDict.memmap`` and the
    checkpointers write it): a lookup, never ``eval``; ``None`` when ``name`` names none."""
    dtype = getattr(torch, str(name).replace("torch.", ""), None)
    return dtype if isinstance(dtype, torch.dtype) else None


def _str2dtype(name: str, file) -> torch.dtype:
    """The dtype named ``name`` (``"torch.float32"``) in the checkpoint file ``file``."""
    dtype = _dtype_named(name)
    if dtype is None:
        raise ValueError(f"The checkpoint file {file} names an unknown dtype {name!r}.")
    return dtype


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


def _tree_children(spec) -> list:
    """The child specs of pytree ``spec``: ``spec.children()`` where torch has it (2.10 on,
    where reading ``children_specs`` warns), else the ``children_specs`` field."""
    children = getattr(spec, "children", None)
    if callable(children):
        return list(children())
    return spec.children_specs


def _get_paths(spec, cumulpath=""):
    """Yields the on-disk path of every leaf of a pytree spec, without key paths."""
    if spec.is_leaf():
        yield cumulpath if cumulpath else SINGLE_TENSOR_BUFFER_NAME
        return
    contexts = spec.context
    children_specs = _tree_children(spec)
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


# -----------------------------------------------------------------------------
# TED checkpointing hooks
#
# A TED storage of shape ``[T, *batch]`` (time first) holds, for each step, the root
# observation ``key`` and the next one ``("next", key)``. Within a trajectory
# ``("next", key)[t]`` equals ``key[t + 1]``, so the flat layout keeps each trajectory's
# observations once, followed by one extra slot for the observation that follows its last
# (done) step. Batch columns are laid one after the other (column-major), each in time order,
# and a wrapped storage is written oldest step first. Entries that have no such duplication
# (actions, rewards, done states) are laid in the same column-major, oldest-first order.


def _batch_cols(storage_shape) -> int:
    return math.prod(int(s) for s in tuple(storage_shape)[1:])


def _time_order(nsteps: int, shift, rolled: bool) -> Tensor:
    """Position, in the oldest-first sequence, of each storage row."""
    steps = torch.arange(nsteps)
    if not rolled or not shift:
        return steps
    return (steps - int(shift)) % nsteps


def _exclusive_cumsum(x: Tensor, dim: int) -> Tensor:
    x = x.long()
    return x.cumsum(dim) - x


def _write(out: TensorDictBase, key, value: Tensor, add: bool = True) -> None:
    dest = out.get(key, None)
    if dest is not None:
        dest.copy_(value)
    elif add:
        out.set(key, value)


def _set_ted_keys(hook, done_key, shift_key, is_full_key, done_keys, reward_keys) -> None:
    """The entry names a TED conversion hook reads (``TED2Flat`` and ``Flat2TED`` alike)."""
    hook.done_key = done_key
    hook.shift_key = shift_key
    hook.is_full_key = is_full_key
    hook.done_keys = {unravel_key(key) for key in done_keys}
    hook.reward_keys = {unravel_key(key) for key in reward_keys}


class TED2Flat:
    """A storage saving hook to serialize TED data in a compact format.

    Observations that appear both at the root and in ``"next"`` are written once per
    trajectory, plus one slot per trajectory for the observation that follows its last step.
    Done and reward entries are only kept from the ``"next"`` tensordict (root done states are
    assumed to be ``False``). The result is a memory-mapped tensordict holding, besides the
    data, the ``shift``, ``is_full`` and ``_storage_shape`` non-tensor entries needed by
    :class:`~torchrl_compat.utils.Flat2TED` to rebuild the storage.

    Args:
        done_key (NestedKey, optional): the key where the done states should be read.
            Defaults to ``("next", "done")``.
        shift_key (NestedKey, optional): the key where the shift will be written.
            Defaults to "shift".
        is_full_key (NestedKey, optional): the key where the is_full attribute will be written.
            Defaults to "is_full".
        done_keys (Tuple[NestedKey], optional): a tuple of nested keys indicating the done entries.
            Defaults to ("done", "truncated", "terminated")
        reward_keys (Tuple[NestedKey], optional): a tuple of nested keys indicating the reward entries.
            Defaults to ("reward",)

    The ``shift`` (one past the last written row) and ``is_full`` attributes are set by the
    checkpointer before each call.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat.utils import TED2Flat
        >>> done = torch.tensor([False, True, False, False]).unsqueeze(-1)
        >>> obs = torch.arange(4.0)
        >>> next_obs = torch.tensor([1.0, 10.0, 3.0, 4.0])
        >>> data = TensorDict(
        ...     {"obs": obs, "next": {"obs": next_obs, "done": done}}, batch_size=[4]
        ... )
        >>> data["obs"][2] = 2.0  # a new trajectory starts after the done step
        >>> hook = TED2Flat()
        >>> hook.shift, hook.is_full = 4, False
        >>> flat = hook(data)
        >>> flat["obs"]
        MemoryMappedTensor([ 0.,  1., 10.,  2.,  3.,  4.])

    .. note:: Unlike torchrl 0.11, a full storage whose last write ended on its last row
        (``shift`` equal to the number of rows) is saved; torchrl fails to load it back.
    """

    _shift: int | None = None
    _is_full: bool | None = None

    def __init__(
        self,
        done_key=("next", "done"),
        shift_key="shift",
        is_full_key="is_full",
        done_keys=("done", "truncated", "terminated"),
        reward_keys=("reward",),
    ):
        _set_ted_keys(self, done_key, shift_key, is_full_key, done_keys, reward_keys)

    @property
    def shift(self):
        return self._shift

    @shift.setter
    def shift(self, value: int):
        self._shift = value

    @property
    def is_full(self):
        return self._is_full

    @is_full.setter
    def is_full(self, value: int):
        self._is_full = value

    def _ends(self, done: Tensor, shift, is_full) -> Tensor:
        """Done states ``[T, cols]`` in storage order, with the last written row marked done.

        The step written last ends a trajectory as far as the checkpoint is concerned: its next
        observation must be kept even if the episode goes on.
        """
        ends = done.clone()
        if ends.shape[0]:
            last = int(shift or 0) - 1
            ends[last % ends.shape[0] if is_full else last] = True
        return ends

    def __call__(self, data: TensorDictBase, path: Path = None):
        shift = self.shift
        is_full = self.is_full
        output = TensorDict()
        output.set_non_tensor(self.is_full_key, is_full)
        output.set_non_tensor(self.shift_key, shift)
        output.set_non_tensor("_storage_shape", tuple(data.shape))
        output.memmap_(path)

        nsteps, ncols = data.shape[0], _batch_cols(data.shape)
        ends = self._ends(
            data.get(self.done_key).squeeze(-1).reshape(nsteps, ncols), shift, is_full
        )
        order = _time_order(nsteps, shift, is_full)
        # ends in flat (column-major, oldest-first) order
        ends_flat = torch.zeros(ncols, nsteps, dtype=torch.bool)
        ends_flat[:, order] = ends.T
        slots = torch.arange(nsteps * ncols) + _exclusive_cumsum(ends_flat.reshape(-1), 0)
        # flat slot of the root observation of each storage element, shape [T, cols]
        root_slot = slots.view(ncols, nsteps)[:, order].T
        next_slot = root_slot[ends] + 1
        plain_slot = (torch.arange(ncols) * nsteps).unsqueeze(0) + order.unsqueeze(1)

        next_td = data.get("next")
        special = self.done_keys | self.reward_keys
        next_keys = set(next_td.keys(True, True))
        to_expand = next_keys - special
        all_keys = set(data.exclude("next").keys(True, True)) | next_keys
        n_expanded = nsteps * ncols + int(ends.sum())
        for key in all_keys:
            entry = data.get(("next",) + _as_tuple(key)) if key in special else data.get(key)
            feature = entry.shape[data.ndim :]
            entry = entry.reshape(nsteps, ncols, *feature)
            if key in to_expand:
                dest = output.make_memmap(key, shape=[n_expanded, *feature], dtype=entry.dtype)
                dest[root_slot] = entry
                following = next_td.get(key).reshape(nsteps, ncols, *feature)
                dest[next_slot] = following[ends]
            else:
                dest = output.make_memmap(key, shape=[nsteps * ncols, *feature], dtype=entry.dtype)
                dest[plain_slot] = entry
        return output


def _as_tuple(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


class Flat2TED:
    """A storage loading hook to deserialize flattened TED data to TED format.

    Inverse of :class:`~torchrl_compat.utils.TED2Flat`: each root and ``"next"`` entry is read
    back from the shared observation slots, done and reward entries are restored in ``"next"``
    and the root done states are set to ``False`` (when ``out`` does not hold them already).

    Args:
        done_key (NestedKey, optional): the key where the done states should be read in the
            flat data, where they sit at the root. Defaults to ``"done"``.
        shift_key (NestedKey, optional): the key where the shift will be read.
            Defaults to "shift".
        is_full_key (NestedKey, optional): the key where the is_full attribute will be read.
            Defaults to "is_full".
        done_keys (Tuple[NestedKey], optional): a tuple of nested keys indicating the done entries.
            Defaults to ("done", "truncated", "terminated")
        reward_keys (Tuple[NestedKey], optional): a tuple of nested keys indicating the reward entries.
            Defaults to ("reward",)

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat.utils import Flat2TED, TED2Flat
        >>> done = torch.tensor([False, True, False, False]).unsqueeze(-1)
        >>> data = TensorDict(
        ...     {
        ...         "obs": torch.tensor([0.0, 1.0, 2.0, 3.0]),
        ...         "next": {"obs": torch.tensor([1.0, 10.0, 3.0, 4.0]), "done": done},
        ...     },
        ...     batch_size=[4],
        ... )
        >>> save = TED2Flat()
        >>> save.shift, save.is_full = 4, True
        >>> restored = Flat2TED()(save(data))
        >>> restored["next", "obs"]
        tensor([ 1., 10.,  3.,  4.])
        >>> bool((restored == data.set("done", torch.zeros_like(done))).all())
        True

    .. note:: torchrl 0.11 fails on a full storage whose last write ended on its last row,
        on a storage of a single row that is not full, on storages with more than two
        dimensions, and when a locked ``out`` (an initialized storage) lacks a root done entry;
        all are restored here, the missing root done entries being left out as torchrl does
        for two-dimensional storages.

    .. note:: As in torchrl, rows past the last written one in a storage that is not full hold
        no data and are not restored faithfully, and the last row of each ``("next", key)``
        observation is left untouched (zeros when ``out`` is ``None``).
    """

    def __init__(
        self,
        done_key="done",
        shift_key="shift",
        is_full_key="is_full",
        done_keys=("done", "truncated", "terminated"),
        reward_keys=("reward",),
    ):
        _set_ted_keys(self, done_key, shift_key, is_full_key, done_keys, reward_keys)

    def __call__(self, data: TensorDictBase, out: TensorDictBase = None):
        done = data.get(self.done_key)
        storage_shape = data.get_non_tensor("_storage_shape", default=None)
        if storage_shape is None:
            storage_shape = (done.shape[0],)
        elif isinstance(storage_shape, int):
            storage_shape = (storage_shape,)
        storage_shape = torch.Size(storage_shape)
        shift = data.get_non_tensor(self.shift_key, default=None)
        is_full = data.get_non_tensor(self.is_full_key, default=None)
        nsteps, ncols = storage_shape[0], _batch_cols(storage_shape)
        # torchrl fills a given multi-dimensional ``out`` through per-column views, so entries
        # that ``out`` lacks are dropped there; a one-dimensional ``out`` gains them, unless it
        # is locked (a storage's content), where torchrl fails.
        add = out is None or (len(storage_shape) == 1 and not out.is_locked)
        if out is None:
            out = TensorDict(batch_size=storage_shape)

        # saved done states, [cols, T] in flat order
        saved = done.reshape(ncols, nsteps).bool()
        ends = saved.clone()
        if nsteps:
            ends[:, int(shift or 0) - 1 if not is_full else -1] = True
        # Each column takes T slots plus one per trajectory end (the marked one included).
        col_start = torch.arange(ncols) * nsteps + _exclusive_cumsum(ends.sum(1), 0)
        # Within a column, slots are counted from the saved done states, as torchrl does:
        # they differ from ``ends`` only after the last written row, which holds no data.
        root_flat = (
            col_start.unsqueeze(1) + torch.arange(nsteps) + _exclusive_cumsum(saved, 1)
        )
        order = _time_order(nsteps, shift, bool(is_full) and shift is not None)
        root_slot = root_flat[:, order].T  # [T, cols], storage order
        plain_slot = (torch.arange(ncols) * nsteps).unsqueeze(0) + order.unsqueeze(1)
        # next slots of the last row may run past the data when the storage is not full
        next_rows = slice(None) if is_full else slice(0, max(nsteps - 1, 0))

        special = self.done_keys | self.reward_keys
        existing = set(out.keys(True, True))
        for key, entry in data.items(True, True):
            feature = entry.shape[1:]
            if entry.shape[0] == nsteps * ncols:
                value = entry[plain_slot].reshape(*storage_shape, *feature)
                if key in special:
                    if key != "reward" and key not in existing and add:
                        out.set(key, torch.zeros_like(value))
                    _write(out, ("next",) + _as_tuple(key), value, add)
                else:
                    _write(out, key, value, add)
                continue
            following = entry[root_slot[next_rows] + 1].reshape(-1, *storage_shape[1:], *feature)
            next_key = ("next",) + _as_tuple(key)
            dest = out.get(next_key, None)
            if dest is not None:
                dest[next_rows].copy_(following)
            elif add:
                if not is_full:
                    following = torch.cat([following, following.new_zeros((1, *following.shape[1:]))])
                out.set(next_key, following)
            _write(out, key, entry[root_slot].reshape(*storage_shape, *feature), add)
        return out


class TED2Nested(TED2Flat):
    """Converts a TED-formatted dataset into a tensordict populated with nested tensors where each row is a trajectory.

    The data is first flattened by :class:`~torchrl_compat.utils.TED2Flat`; each entry is then
    exposed as a memory-mapped nested tensor over the same storage, with one row per
    trajectory (observations have one more step than the other entries, except the
    trajectories that end with a column of a storage that is not full).

    Accepts the same arguments as :class:`~torchrl_compat.utils.TED2Flat`.

    .. note:: Requires torch>=2.4.
    """

    _shift: int | None = None
    _is_full: bool | None = None

    def __init__(self, *args, **kwargs):
        if not hasattr(torch, "_nested_compute_contiguous_strides_offsets"):
            raise ValueError(
                f"Unsupported torch version {torch.__version__}. "
                f"torch>=2.4 is required for {type(self).__name__} to be used."
            )
        super().__init__(*args, **kwargs)

    def __call__(self, data: TensorDictBase, path: Path = None):
        flat = super().__call__(data, path=path)
        shift, is_full = self.shift, self.is_full
        storage_shape = tuple(flat.get_non_tensor("_storage_shape", (-1,)))
        nsteps = storage_shape[0]

        ends = flat.get("done").squeeze(-1).clone()
        per_col = ends.view(-1, nsteps) if ends.numel() else ends.view(0, max(nsteps, 0))
        if nsteps > 0:
            if not is_full:
                per_col[:, int(shift or 0) - 1] = True
            # every column ends a trajectory on its last row
            per_col[:, -1] = True
        ends_at = ends.nonzero(as_tuple=True)[0]
        lengths = torch.diff(ends_at, prepend=ends_at.new_full((1,), -1)).unsqueeze(-1)
        if is_full:
            expanded_lengths = lengths + 1
        else:
            # A trajectory that stops at a column end was not ended by a marked row: it has no
            # extra observation slot (see TED2Flat).
            expanded_lengths = lengths + (lengths.cumsum(0) % nsteps != 0)

        out = TensorDict(batch_size=[ends_at.numel()])
        out.update(dict(flat.non_tensor_items()))
        out.memmap_(path)
        for key, value in flat.items(True, True):
            rows = lengths if value.shape[0] == ends.shape[0] else expanded_lengths
            feature = torch.tensor(value.shape[1:], dtype=torch.long).expand(rows.shape[0], -1)
            # A new shape over the flat file's storage: nothing is copied.
            out.make_memmap_from_storage(
                key,
                value.untyped_storage(),
                dtype=value.dtype,
                shape=torch.cat([rows, feature], -1),
            )
        return out


class Nested2TED(Flat2TED):
    """Converts a nested tensordict where each row is a trajectory into the TED format.

    Inverse of :class:`~torchrl_compat.utils.TED2Nested`: the nested entries are read back as
    the flat layout of :class:`~torchrl_compat.utils.TED2Flat`, then restored by
    :class:`~torchrl_compat.utils.Flat2TED`, whose arguments it accepts.
    """

    def __call__(self, data, out: TensorDictBase = None):
        def as_flat(tensor):
            # The whole underlying storage is the flat layout, including slots that no
            # trajectory row covers.
            storage = tensor.untyped_storage()
            numel = storage.nbytes() // tensor.element_size()
            flat = torch.empty(0, dtype=tensor.dtype).set_(
                storage, 0, (numel,), (1,)
            )
            return flat.view(-1, *(tensor.size(i) for i in range(2, tensor.dim())))

        flat = data.apply(as_flat, batch_size=[])
        return super().__call__(flat, out=out)


class H5Split(TED2Flat):
    """Splits a dataset prepared with TED2Nested into a TensorDict where each trajectory is stored as views on their parent nested tensors.

    Trajectory ``i`` is stored under ``"traj_<i>"``, zero-padded to the number of digits of the
    last index; non-tensor entries are kept at the root.
    """

    _shift: int | None = None
    _is_full: bool | None = None

    def __call__(self, data):
        ntraj = data.shape[0]
        width = int(math.ceil(math.log10(ntraj))) if ntraj > 0 else 0
        trajectories = data.filter_non_tensor_data().unbind(0)
        result = TensorDict(
            {f"traj_{str(i).zfill(width)}": traj for i, traj in enumerate(trajectories)}
        )
        return result.update(dict(data.non_tensor_items()))


class H5Combine:
    """Combines trajectories in a persistent tensordict into a single standing tensordict stored in filesystem.

    Inverse of :class:`~torchrl_compat.utils.H5Split`: the ``"traj_*"`` entries are stacked
    into memory-mapped nested tensors (one row per trajectory); every other entry becomes a
    non-tensor entry. ``out`` is ignored.

    .. note:: The trajectories are read one at a time into the memory-mapped result.
    """

    def __call__(self, data, out=None):
        names = [key for key in data.keys() if key.startswith("traj")]
        trajectories = [data.get(name) for name in names]
        result = TensorDict(
            {key: NonTensorData(data[key]) for key in data.keys() if not key.startswith("traj")}
        )
        # anonymous memory map: no file is left behind
        result.memmap_()
        if not trajectories:
            return result
        keys = list(trajectories[0].keys(True, True))
        for key in keys:
            parts = [traj.get(key) for traj in trajectories]
            result.make_memmap(
                key,
                shape=torch.stack([torch.tensor(part.shape) for part in parts]),
                dtype=parts[0].dtype,
            )
            dest = result.get(key)
            for i, part in enumerate(parts):
                dest[i].copy_(part)
        return result


# -----------------------------------------------------------------------------
# trajectory boundaries


def _check_trajectory_signal(trajectory, end, cursor, at_capacity) -> None:
    """The input errors of torchrl 0.14's ``find_start_stop_traj``, raised before any work."""
    if (trajectory is None) == (end is None):
        raise TypeError(
            "Exactly one of `trajectory` and `end` must be provided, got "
            f"trajectory={trajectory} and end={end}."
        )
    signal = trajectory if trajectory is not None else end
    if signal.ndim == 0:
        raise RuntimeError("Expected the end-of-trajectory signal to be at least 1-dimensional.")
    if signal.shape[0] == 0:
        raise RuntimeError("Cannot recover trajectory boundaries from an empty (T=0) input.")
    if at_capacity and cursor is not None:
        if isinstance(cursor, torch.Tensor) and not cursor.numel():
            raise RuntimeError("cursor must not be an empty tensor.")
        if isinstance(cursor, range) and not len(cursor):
            raise RuntimeError("cursor must not be an empty range.")


def _checked_trajectory_signal(trajectory, end, cursor, at_capacity):
    """``(trajectory, end, cursor)`` checked and read as torchrl 0.14 reads them: a single
    filled step is one trajectory (torchrl 0.11 found none there), a tensor cursor flat."""
    _check_trajectory_signal(trajectory, end, cursor, at_capacity)
    if trajectory is not None and trajectory.shape[0] == 1 and not at_capacity:
        end, trajectory = torch.ones_like(trajectory, dtype=torch.bool), None
    if isinstance(cursor, torch.Tensor):
        cursor = cursor.reshape(-1)
    return trajectory, end, cursor


def _trajectory_bounds(*, trajectory=None, end=None, at_capacity, cursor=None, on_cpu=True):
    """``(start, stop, lengths)`` with torchrl 0.14's semantics, computed where the signal
    lives: ``replay``'s C pass on CPU (``on_cpu``), torch ops elsewhere."""
    import replay
    from torchrl_compat._torch_ops import slices as torch_slices

    trajectory, end, cursor = _checked_trajectory_signal(trajectory, end, cursor, at_capacity)
    signal = trajectory if trajectory is not None else end
    if on_cpu and signal.device.type == "cpu":
        return replay.find_start_stop_traj(
            trajectory=trajectory, end=end, at_capacity=at_capacity, cursor=cursor
        )
    return torch_slices.find_start_stop_traj(
        trajectory=trajectory, end=end, at_capacity=at_capacity, cursor=cursor
    )


def find_start_stop_traj(
    *,
    trajectory: torch.Tensor | None = None,
    end: torch.Tensor | None = None,
    at_capacity: bool,
    cursor: int | torch.Tensor | range | None = None,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Recover trajectory boundaries from trajectory ids or end-of-trajectory flags.

    The routine :class:`~torchrl_compat.samplers.SliceSampler` and its subclasses use. It
    reads the storage layout of the replay buffers: circular storages where a trajectory
    may span the wrap point, and partially filled storages whose last filled row closes
    every trajectory.

    Keyword Args:
        trajectory (torch.Tensor, optional): trajectory ids in storage order, time along dim
            ``0`` (shape ``[T, *B]``). A boundary is wherever the id changes between two
            consecutive steps. Exclusive with ``end``.
        end (torch.Tensor, optional): end-of-trajectory flags in storage order (shape
            ``[T, *B]``); ``True`` marks the last step of a trajectory. Exclusive with
            ``trajectory``.
        at_capacity (bool): whether the storage is full and behaves as a circular buffer:
            a trajectory without an end after the last row continues at row ``0``. If
            ``False``, the last row is always an end.
        cursor (int, torch.Tensor or range, optional): the last written row (e.g.
            ``storage._last_cursor``). Only used when ``at_capacity=True``: the row under the
            cursor is an end, as the data that followed it has been overwritten.
        device (torch.device, optional): where to compute the boundaries. The results are
            returned on the input's device. Defaults to ``None`` (where the input lives).

    Returns:
        ``(start, stop, lengths)``: ``[N, 1 + len(B)]`` int64 tensors holding each
        trajectory's first and last (inclusive) time index in column ``0`` and its batch
        coordinates in the others, and the ``[N]`` lengths. For a trajectory spanning the
        wrap point, ``start[i, 0] > stop[i, 0]``.

    Raises:
        TypeError: if neither or both of ``trajectory`` and ``end`` are given.
        RuntimeError: for a 0-dimensional or empty signal, an empty cursor, or a cursor
            that is not an integer, a 1-d tensor or a range.

    Examples:
        >>> import torch
        >>> from torchrl_compat.utils import find_start_stop_traj
        >>> end = torch.zeros(10, dtype=torch.bool)
        >>> end[2] = end[7] = True
        >>> start, stop, lengths = find_start_stop_traj(end=end, at_capacity=True, cursor=4)
        >>> start.squeeze(-1).tolist(), stop.squeeze(-1).tolist(), lengths.tolist()
        ([8, 3, 5], [2, 4, 7], [5, 2, 3])

    .. note:: On CPU the signal is scanned once by a C kernel with the GIL released (torchrl
        runs about ten torch ops over it); elsewhere by torch ops that synchronise with the
        host once (``nonzero``).
    """
    _check_trajectory_signal(trajectory, end, cursor, at_capacity)
    source = trajectory if trajectory is not None else end
    if device is not None and torch.device(device) != source.device:
        device = torch.device(device)
        result = _trajectory_bounds(
            trajectory=None if trajectory is None else trajectory.to(device),
            end=None if end is None else end.to(device),
            at_capacity=at_capacity,
            cursor=cursor,
        )
        return tuple(value.to(source.device) for value in result)
    return _trajectory_bounds(
        trajectory=trajectory, end=end, at_capacity=at_capacity, cursor=cursor
    )
