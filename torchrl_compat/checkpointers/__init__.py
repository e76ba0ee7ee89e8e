"""Storage checkpointers: the ``dumps`` / ``loads`` back-ends of the storages.

This module stands in for ``torchrl.data.replay_buffers.checkpointers`` (torchrl 0.11). The
files written on disk have the same names, json keys and memory-mapped layout as torchrl's, so
a checkpoint written by one library is read by the other.

Two things differ from torchrl, on purpose:

- ``dumps`` writes into a sibling directory (``.<name>.partial-<id>``) and publishes it over
  the target in one atomic rename once every file is written, so an interrupted ``dumps``
  (even killed) leaves the previous checkpoint, or nothing if there was none, never a
  half-written one. The partial directories of killed dumps are removed by the next ``dumps``
  to the same path (see :mod:`torchrl_compat.checkpointers._publish`).
- ``loads`` checks the checkpoint before touching the storage: a missing directory or file raises
  :class:`FileNotFoundError`, an unreadable json file, a truncated memory-mapped file or a
  checkpoint that does not fit the storage raises :class:`ValueError`; each message names the file
  and what is wrong with it. ``_read_checkpoint(storage, path)`` does the reading and checking
  alone and returns the function that loads what it read, so that an ensemble (or a buffer)
  checks every part of its checkpoint before any part changes.
"""
from __future__ import annotations

import abc
import functools
import json
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from tensordict import is_tensor_collection, lazy_stack, NonTensorData, TensorDict
from tensordict.memmap import MemoryMappedTensor
from torch.utils._pytree import tree_flatten_with_path, tree_map

from torchrl_compat.checkpointers._checks import (
    MetadataError,
    load_module_states,
    read_for_loading,
    read_json_object,
    read_torch_file,
)
from torchrl_compat.checkpointers._publish import (
    COPY,
    LINK,
    carry_over,
    outermost_target,
    publish_file,
    published_path,
    reading,
    write_aside,
)
from torchrl_compat._releases import since
from torchrl_compat.checkpointers._live_home import files_home, memmap_files, move_out
from torchrl_compat.checkpointers._storage_checks import (
    TENSORDICT_METADATA_FILE,
    StorageCheckpoint,
    check_memmap_file,
    check_tensordict_layout,
    format_keys,
    leaf_specs,
    missing_checkpoint_error,
    read_json,
)

# the name torchrl gives the single leaf of a tensor-only storage
from torchrl_compat.utils import _path2str, _save_pytree_common, _str2dtype, SINGLE_TENSOR_BUFFER_NAME

__all__ = [
    "StorageCheckpointerBase",
    "ListStorageCheckpointer",
    "CompressedListStorageCheckpointer",
    "TensorStorageCheckpointer",
    "FlatStorageCheckpointer",
    "NestedStorageCheckpointer",
    "H5StorageCheckpointer",
    "StorageEnsembleCheckpointer",
]

# File names of torchrl 0.11's layouts; both libraries must agree on them.
STORAGE_METADATA_FILE = "storage_metadata.json"
COMPRESSED_DATA_DIR = "compressed_data"
COMPRESSED_METADATA_FILE = "metadata.json"
COMPRESSED_INDICES_FILE = "data_indices.json"


# -----------------------------------------------------------------------------
# Where a storage lives
# -----------------------------------------------------------------------------
def _lives_under(storage, path: Path) -> bool:
    """Whether some memory-mapped file of ``storage`` (or of its sub-storages) is under ``path``."""
    root = str(Path(path).absolute()) + os.sep
    substorages = getattr(storage, "_storages", None)
    if substorages is not None:
        return any(_lives_under(sub, path) for sub in substorages)
    return any(f.startswith(root) for f in memmap_files(getattr(storage, "_storage", None)))


def _lives_in_checkpoint(storage, path: Path) -> bool:
    """Whether ``storage`` is a memory-mapped storage whose ``scratch_dir`` is the checkpoint
    directory ``path`` (its files are there, or in the live home an earlier dump moved it
    to)."""
    scratch_dir = getattr(storage, "scratch_dir", None)
    return (
        scratch_dir is not None
        and Path(scratch_dir).absolute() == Path(path).absolute()
        and bool(memmap_files(getattr(storage, "_storage", None)))
    )


def _saved_path(data) -> Path | None:
    """Where the memory-mapped tensordict ``data`` lives (``None`` when it is not one)."""
    if not data.is_memmap() or not data.saved_path:
        return None
    return Path(data.saved_path).absolute()


def _link_live_files(storage, home: Path, directory: Path) -> None:
    """Carries the files of a storage living in ``home`` into the checkpoint ``directory``:
    its memory-mapped files as hard links (no data is copied), the other files (the
    ``meta.json`` describing them) as copies. Other memory-mapped files (the copy an
    earlier dump made) and the storage metadata, which this dump writes, are left out."""
    live_files = set(memmap_files(storage._storage))

    def how(file: Path):
        if os.path.abspath(file) in live_files:
            return LINK
        return None if file.suffix == ".memmap" else COPY

    carry_over(home, directory, skip=(STORAGE_METADATA_FILE,), how=how)


# -----------------------------------------------------------------------------
# Pytree leaves on disk (torchrl's naming: utils._path2str)
# -----------------------------------------------------------------------------
def _pytree_leaf_paths(tree) -> list[tuple[str, torch.Tensor]]:
    """``(relative file path without suffix, leaf)`` for every leaf of ``tree``.

    Raises:
        ValueError: for a key holding a ``'.'``: torchrl writes it as is and reads it back
            as a sub-directory, so such a checkpoint could never be loaded.
    """
    paths = []
    for key_path, leaf in tree_flatten_with_path(tree)[0]:
        for entry in key_path:
            key = getattr(entry, "key", None)
            if isinstance(key, (str, bytes)) and "." in str(key):
                raise ValueError(
                    f"Cannot dump a pytree storage whose key {str(key)!r} contains a '.': "
                    "the checkpoint layout uses '.' as the key separator."
                )
        paths.append((_path2str(key_path), leaf))
    return paths


def _pytree_leaf(storage_tree, key: str, file):
    """The leaf of ``storage_tree`` that checkpoint entry ``key`` names.

    torchrl's convention: ``'.'``-separated parts, and a part made of digits is tried as an
    int first (a sequence position, or an int dict key such as ``30``), then as a string.
    """
    node = storage_tree
    if key == SINGLE_TENSOR_BUFFER_NAME:
        return node
    for part in key.split("."):
        part = part.replace("_<dot>_", ".")
        if part.isdigit():
            index = int(part)
            if isinstance(node, (list, tuple)) and index < len(node):
                node = node[index]
                continue
            if isinstance(node, Mapping) and index in node:
                node = node[index]
                continue
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            raise ValueError(
                f"The checkpoint {file} holds the entry {key!r}, which the storage does not have."
            ) from None
    return node


def _save_pytree_leaves(tree, path: Path, metadata: dict, home: Path) -> None:
    """Writes every leaf of ``tree`` to ``path / <key path>.memmap`` (``utils._save_pytree``'s
    layout) and fills ``metadata``; a leaf already memory-mapped on that file in ``home`` is
    left as it is (a storage living in the checkpoint: its file is linked into ``path``)."""
    for tensor_path, tensor in _pytree_leaf_paths(tree):
        file = os.path.abspath(home / (tensor_path + ".memmap"))
        if memmap_files(tensor) != [file]:
            _save_pytree_common(tensor_path, path, tensor, metadata)
        else:
            metadata[tensor_path.replace("/", ".")] = {
                "dtype": str(tensor.dtype),
                "shape": list(tensor.shape),
            }


def _dump_json(content, file) -> None:
    with open(file, "w") as f:
        json.dump(content, f)


# -----------------------------------------------------------------------------
# Checkpointers
# -----------------------------------------------------------------------------
def _ted_kwargs(done_keys, reward_keys, **kwargs) -> dict:
    """Keyword arguments for the TED hooks: only the keys the caller set, so the hooks keep
    their own defaults otherwise."""
    if done_keys is not None:
        kwargs["done_keys"] = done_keys
    if reward_keys is not None:
        kwargs["reward_keys"] = reward_keys
    return kwargs


class StorageCheckpointerBase:
    """Public base class for storage checkpointers.

    Each storage checkpointer must implement a ``dumps`` and ``loads`` method that take as input a
    storage and a path.

    Save hooks are called on the storage content before it is written, load hooks on the loaded
    content before it is copied into the storage.
    """

    def __init__(self):
        self._save_hooks = []
        self._load_hooks = []

    def register_save_hook(self, hook):
        """Registers a save hook for this checkpointer."""
        self._save_hooks.append(hook)

    def register_load_hook(self, hook):
        """Registers a load hook for this checkpointer."""
        self._load_hooks.append(hook)

    def _get_shift_from_last_cursor(self, last_cursor):
        """Computes shift from the last cursor position."""
        if isinstance(last_cursor, slice):
            return last_cursor.stop + 1
        if isinstance(last_cursor, int):
            return last_cursor + 1
        if isinstance(last_cursor, range):
            return last_cursor[-1] + 1
        if isinstance(last_cursor, (torch.Tensor, np.ndarray)):
            return last_cursor.reshape(-1)[-1].item() + 1
        raise ValueError(f"Unrecognised last_cursor type {type(last_cursor)}.")

    def _set_hooks_shift_is_full(self, storage):
        """Sets shift and is_full attributes on save hooks that have them."""
        is_full = storage._is_full
        last_cursor = storage._last_cursor
        for hook in self._save_hooks:
            if hasattr(hook, "is_full"):
                hook.is_full = is_full
        if last_cursor is None:
            warnings.warn(
                "last_cursor is None. The replay buffer "
                "may not be saved properly in this setting. To solve this issue, make "
                "sure the storage updates the _last_cursor value during calls to `set`."
            )
            shift = 0
        else:
            shift = self._get_shift_from_last_cursor(last_cursor)
        for hook in self._save_hooks:
            if hasattr(hook, "shift"):
                hook.shift = shift

    @abc.abstractmethod
    def dumps(self, storage, path):
        ...

    @abc.abstractmethod
    def loads(self, storage, path):
        ...

    def _read_checkpoint(self, storage, path):
        """Reads and checks the checkpoint at ``path`` without changing ``storage``; returns
        the function that loads it. Here nothing is read ahead: the function runs
        :meth:`loads`, which checks as it goes."""
        return functools.partial(self.loads, storage, path)


class ListStorageCheckpointer(StorageCheckpointerBase):
    """A storage checkpointer for ListStorage.

    Currently not implemented: :meth:`dumps` and :meth:`loads` raise
    :class:`NotImplementedError`, as in torchrl. Use ``state_dict`` / ``load_state_dict``.
    """

    @staticmethod
    def dumps(storage, path):
        raise NotImplementedError(
            "ListStorage doesn't support serialization via `dumps` - `loads` API."
        )

    @staticmethod
    def loads(storage, path):
        raise NotImplementedError(
            "ListStorage doesn't support serialization via `dumps` - `loads` API."
        )


def _metadata_to_json(metadata):
    def is_leaf(item):
        return isinstance(
            item,
            (torch.Size, torch.dtype, torch.device, str, int, float, bool, torch.Tensor, NonTensorData),
        )

    def to_json(item):
        if isinstance(item, torch.Size):
            return {"__type__": "torch.Size", "value": list(item)}
        if isinstance(item, torch.dtype):
            return {"__type__": "torch.dtype", "value": str(item)}
        if isinstance(item, torch.device):
            return {"__type__": "torch.device", "value": str(item)}
        if isinstance(item, torch.Tensor):
            return {"__type__": "torch.Tensor", "value": item.tolist()}
        if isinstance(item, NonTensorData):
            return {"__type__": "NonTensorData", "value": item.data}
        return item

    return tree_map(to_json, metadata, is_leaf=is_leaf)


def _metadata_from_json(metadata, file):
    def is_leaf(item):
        return isinstance(item, dict) and "__type__" in item

    def from_json(item):
        if not is_leaf(item):
            return item
        kind, value = item["__type__"], item.get("value")
        if kind == "torch.Size":
            return torch.Size(value)
        if kind == "torch.dtype":
            # A lookup, not eval(): the file is data, never code.
            return _str2dtype(value, file)
        if kind == "torch.device":
            return torch.device(value)
        if kind == "torch.Tensor":
            return torch.tensor(value)
        if kind == "NonTensorData":
            return NonTensorData(value)
        return item

    return tree_map(from_json, metadata, is_leaf=is_leaf)


class CompressedListStorageCheckpointer(StorageCheckpointerBase):
    """A storage checkpointer for CompressedListStorage.

    The compressed items are saved as a memory-mapped lazy stack under ``compressed_data/``, the
    per-item metadata in ``metadata.json`` and the position of each item in ``data_indices.json``
    (torchrl 0.11's layout).

    .. note::
        Unlike torchrl, the files are written into a sibling directory that replaces ``path``
        only once complete, so an interrupted :meth:`dumps` keeps the previous checkpoint.
        :meth:`loads` checks that the three parts agree (and that no memory-mapped file is
        truncated) before changing the storage, and restores empty slots (``None`` entries of
        ``data_indices.json``), which torchrl's ``loads`` rejects.
    """

    def dumps(self, storage, path):
        """Saves a compressed storage in ``path``.

        Args:
            storage (CompressedListStorage): the storage to save.
            path (str or Path): the directory where to save the storage.
        """
        path = Path(path)
        if not hasattr(storage, "_storage") or len(storage._storage) == 0:
            raise RuntimeError(
                "Cannot save an empty or non-initialized CompressedListStorage."
            )
        state_dict = storage.state_dict()
        compressed_data = state_dict["_storage"]
        metadata = state_dict["_metadata"]

        items = []
        data_indices = []
        for item in compressed_data:
            if item is None:
                data_indices.append(None)
                continue
            data_indices.append(len(items))
            if isinstance(item, dict):
                items.append(TensorDict(item, batch_size=[]))
            elif is_tensor_collection(item):
                items.append(item)
            else:
                items.append(TensorDict({"data": item}, batch_size=[]))
        serializable_metadata = _metadata_to_json(metadata)

        def write(tmp):
            if items:
                lazy_stack(items).memmap_(tmp / COMPRESSED_DATA_DIR)
            with open(tmp / COMPRESSED_METADATA_FILE, "w") as f:
                json.dump(serializable_metadata, f, indent=2)
            with open(tmp / COMPRESSED_INDICES_FILE, "w") as f:
                json.dump(data_indices, f, indent=2)

        write_aside(path, write)

    def loads(self, storage, path):
        """Loads a compressed storage from ``path``.

        Args:
            storage (CompressedListStorage): the storage to fill.
            path (str or Path): the directory where the storage was saved.
        """
        self._read_checkpoint(storage, path)()

    def _read_checkpoint(self, storage, path):
        path = Path(path)
        if not path.is_dir():
            raise missing_checkpoint_error(path, "the directory does not exist")
        metadata_file = path / COMPRESSED_METADATA_FILE
        indices_file = path / COMPRESSED_INDICES_FILE
        if not metadata_file.is_file():
            raise missing_checkpoint_error(path, f"the metadata file {metadata_file} is missing")
        if not indices_file.is_file():
            raise missing_checkpoint_error(path, f"the data indices file {indices_file} is missing")
        serializable_metadata = read_json(metadata_file, "metadata file")
        data_indices = read_json(indices_file, "data indices file")
        if not isinstance(serializable_metadata, list) or not isinstance(data_indices, list):
            raise ValueError(
                f"The checkpoint files {metadata_file} and {indices_file} must each hold a json list."
            )
        if len(serializable_metadata) != len(data_indices):
            raise ValueError(
                f"The checkpoint at {path} is inconsistent: {metadata_file} lists "
                f"{len(serializable_metadata)} items but {indices_file} lists {len(data_indices)}."
            )
        present = [i for i in data_indices if i is not None]
        if present != list(range(len(present))):
            raise ValueError(
                f"The data indices file {indices_file} must number the stored items 0, 1, ... in "
                f"order, got {data_indices}."
            )
        metadata = _metadata_from_json(serializable_metadata, metadata_file)
        data_dir = path / COMPRESSED_DATA_DIR
        if present:
            if not data_dir.is_dir():
                raise FileNotFoundError(
                    f"The compressed data directory {data_dir} does not exist but {indices_file} "
                    f"lists {len(present)} stored items."
                )
            check_tensordict_layout(data_dir)
            stacked = TensorDict.load_memmap(data_dir).tolist()
            if len(stacked) != len(present):
                raise ValueError(
                    f"Length of compressed data ({len(stacked)}) in {data_dir} does not match the "
                    f"number of stored items ({len(present)}) in {indices_file}."
                )
        else:
            stacked = []
        compressed = []
        for index, mtdt in zip(data_indices, metadata):
            if index is None:
                compressed.append(None)
                continue
            item = stacked[index]
            if isinstance(mtdt, dict) and mtdt.get("type") == "tensor":
                item = item["data"]
            compressed.append(item)

        def load():
            storage._storage = compressed
            storage._metadata = metadata

        return load


class TensorStorageCheckpointer(StorageCheckpointerBase):
    """A storage checkpointer for TensorStorages.

    This class supports TensorDict-based storages as well as pytrees.

    This class will call save and load hooks if provided. These hooks should take as input the
    data being transformed as well as the path where the data should be saved.

    On disk, a TensorDict-based storage is a ``TensorDict.memmap`` directory; a pytree storage
    is one ``<key>.memmap`` file per leaf. Both come with ``storage_metadata.json``
    (``{"metadata": ..., "is_pytree": ..., "len": ...}``), as in torchrl 0.11.

    .. note::
        :meth:`dumps` writes into a sibling directory and renames it onto ``path`` once every
        file (``storage_metadata.json`` last) is written: if it is interrupted, ``path`` keeps
        the previous checkpoint, or stays absent, and no half-written checkpoint can be loaded.
        torchrl overwrites the previous checkpoint file by file. A
        :class:`~torchrl_compat.LazyMemmapStorage` dumped into its own ``scratch_dir`` (or
        whose ``scratch_dir`` is a replay buffer checkpoint's ``storage/``) has its files
        hard-linked into the new checkpoint rather than copied; the storage then moves out
        to a directory of its own beside the checkpoint (``.<name>.live-<id>``), with a copy
        of its data, so that what it writes next never changes a published checkpoint
        (torchrl's storage goes on writing into the checkpoint's files, under an older
        ``storage_metadata.json``). A storage loaded from the checkpoint it lives in moves
        out the same way.

    .. note::
        A pytree checkpoint written by torchrl 0.11 with ``ndim > 1`` has every leaf after the
        first over-allocated along the first dimension (torchrl grows ``max_size`` once per
        leaf); :meth:`loads` reads the rows that fit. torchrl itself cannot load the
        correctly-sized checkpoint of such a storage written here.

    .. note::
        :meth:`loads` checks the checkpoint before touching the storage and raises
        :class:`FileNotFoundError` for a missing directory or file, and :class:`ValueError`
        for corrupted json, a truncated memory-mapped file, a length larger than the capacity,
        or content whose shapes or dtypes do not fit an initialized storage, or that lacks
        one of its keys (torchrl then keeps the old rows of that key beside the loaded ones).
        Each message names the file. Entries the storage does not have are left out, as
        torchrl leaves them.
    """

    def dumps(self, storage, path):
        path = Path(path).absolute()
        if not storage.initialized:
            raise RuntimeError("Cannot save a non-initialized storage.")
        self._set_hooks_shift_is_full(storage)
        # where the checkpoint ends up: ``path`` itself, unless it is part of a larger
        # checkpoint being written aside
        live = published_path(path)
        if _lives_in_checkpoint(storage, live):
            return self._dumps_in_place(storage, path, live)
        if _lives_under(storage, live):
            raise ValueError(
                f"Cannot dump the storage into {live}: its memory-mapped files are inside it "
                f"({memmap_files(storage._storage)[0]}), but its scratch_dir is "
                f"{getattr(storage, 'scratch_dir', None)}. Dump it into its scratch_dir, or elsewhere."
            )
        write_aside(path, lambda tmp: self._write(storage, tmp))

    def _write(self, storage, path: Path, home: Path | None = None):
        """Writes the checkpoint into ``path``; the storage's files living in ``home``, already
        linked into ``path``, are not written again."""
        metadata = {}
        _storage = storage._storage
        for hook in self._save_hooks:
            _storage = hook(_storage, path=path)
        if is_tensor_collection(_storage):
            saved_in = _saved_path(_storage)
            if home is not None and saved_in == home:
                # The linked files are the data, described by the meta.json files copied
                # beside them. torchrl calls memmap_refresh_() here, which rewrites the
                # files in place: a dump killed then leaves them truncated.
                check_tensordict_layout(path)
            elif saved_in is not None and saved_in == Path(path).absolute():
                # A save hook (TED2Flat, TED2Nested) wrote the checkpoint here itself. It is
                # refreshed in place, as torchrl does, so the non-tensor entries' meta.json
                # are what the installed tensordict writes there: tensordict 0.11 adds
                # an ``other.pickle`` beside each, 0.14 none (a copy made with
                # ``memmap(path)`` would carry one everywhere). The directory is not
                # published yet, so rewriting it in place is safe.
                _storage.memmap_refresh_()
            else:
                _storage.memmap(path, copy_existing=True)
            is_pytree = False
        else:
            _save_pytree_leaves(_storage, path, metadata, path if home is None else home)
            is_pytree = True
        # Written last, in one rename: its presence marks the directory as a complete
        # checkpoint.
        content = {"metadata": metadata, "is_pytree": is_pytree, "len": storage._len}
        publish_file(path / STORAGE_METADATA_FILE, lambda file: _dump_json(content, file))

    def _dumps_in_place(self, storage, path: Path, live: Path):
        """Dumps a storage whose ``scratch_dir`` is the checkpoint ``live`` (``path`` itself,
        or the directory ``path`` is written aside to replace): its files are linked into the
        checkpoint, not copied, then the storage moves out to a live home of its own, so
        that what it writes next leaves the published checkpoint as it is."""
        home = files_home(storage)
        # save hooks write another layout: the data is written, not linked
        link = not self._save_hooks

        def write(directory: Path) -> None:
            if link:
                _link_live_files(storage, home, directory)
            self._write(storage, directory, home=home if link else None)
            move_out(storage, outermost_target(directory))

        if path == live:
            write_aside(path, write)
        else:
            # part of a larger checkpoint being written aside, which publishes it
            path.mkdir(exist_ok=True)
            write(path)

    @staticmethod
    def _read_storage_metadata(path: Path) -> dict:
        if not path.is_dir():
            raise missing_checkpoint_error(path, "the directory does not exist")
        file = path / STORAGE_METADATA_FILE
        if not file.is_file():
            raise missing_checkpoint_error(
                path,
                f"the metadata file {file} is missing (it is written last, so the directory "
                "holds no complete checkpoint)",
            )
        metadata = read_json(file, "storage metadata file")
        if not isinstance(metadata, dict):
            raise ValueError(f"The storage metadata file {file} does not hold a json object.")
        for key, kind in (("metadata", dict), ("is_pytree", bool), ("len", int)):
            if key not in metadata:
                raise ValueError(f"The storage metadata file {file} has no {key!r} entry.")
            if not isinstance(metadata[key], kind) or (kind is int and isinstance(metadata[key], bool)):
                raise ValueError(
                    f"The storage metadata file {file} has {key}={metadata[key]!r}, expected a "
                    f"{kind.__name__}."
                )
        if metadata["len"] < 0:
            raise ValueError(
                f"The storage metadata file {file} has len={metadata['len']}, expected len >= 0."
            )
        return metadata

    @staticmethod
    def _check_len(storage, length: int, shape, file) -> None:
        ndim = getattr(storage, "ndim", 1)
        capacity = math.prod(int(s) for s in tuple(shape)[:ndim])
        if length > capacity:
            raise ValueError(
                f"The storage metadata file {file} has len={length}, larger than the capacity "
                f"{capacity} of the saved data of shape {list(shape)[:ndim]}."
            )

    def loads(self, storage, path):
        self._read_checkpoint(storage, path)()

    def _read_checkpoint(self, storage, path):
        """Reads and checks the checkpoint at ``path`` (nothing changes); returns the function
        that loads it into ``storage``."""
        path = Path(path)
        metadata = self._read_storage_metadata(path)
        metadata_file = path / STORAGE_METADATA_FILE
        _len = metadata["len"]
        if metadata["is_pytree"]:
            fill, shape = self._read_pytree(storage, path, metadata["metadata"], metadata_file, _len)
        else:
            fill, shape = self._read_tensordict(storage, path, metadata_file, _len)

        def load():
            fill()
            storage._len = _len
            if _lives_under(storage, path):
                # the storage maps the checkpoint's files: it writes to files of its own
                move_out(storage, outermost_target(path))

        rows = None if shape is None else torch.Size(tuple(shape)[: getattr(storage, "ndim", 1)])
        return StorageCheckpoint(load, length=_len, rows=rows, file=metadata_file)

    def _read_pytree(self, storage, path, entries, metadata_file, _len):
        if self._load_hooks:
            raise RuntimeError("Loading hooks are not compatible with PyTree storages.")
        if not storage.initialized:
            # torchrl's message, word for word (tests compare them)
            raise RuntimeError("Cannot fill a non-initialized pytree-based TensorStorage.")
        plan = []
        for key, md in entries.items():
            if not isinstance(md, dict) or "shape" not in md or "dtype" not in md:
                raise ValueError(
                    f"The storage metadata file {metadata_file} has a malformed entry {key!r}: {md!r}."
                )
            file = path / (key.replace(".", "/") + ".memmap")
            shape = torch.Size(md["shape"])
            dtype = _str2dtype(md["dtype"], metadata_file)
            check_memmap_file(file, shape, dtype, metadata_file)
            dest = _pytree_leaf(storage._storage, key, metadata_file)
            if not isinstance(dest, torch.Tensor):
                raise ValueError(
                    f"The checkpoint entry {key!r} of {metadata_file} is a tensor but the storage "
                    f"holds a {type(dest).__name__} there."
                )
            rows = None
            if (
                dest.dtype == dtype
                and dest.ndim == len(shape)
                and dest.shape[1:] == shape[1:]
                and shape[0] > dest.shape[0]
                and getattr(storage, "ndim", 1) > 1
            ):
                # torchrl 0.11 over-allocates every leaf after the first when ndim > 1 (it
                # grows max_size once per leaf); rows past the first leaf's are never written.
                rows = dest.shape[0]
            elif dest.shape != shape or dest.dtype != dtype:
                raise ValueError(
                    f"The checkpoint entry {key!r} in {file} has shape {list(shape)} and dtype "
                    f"{dtype}, but the storage expects shape {list(dest.shape)} and dtype {dest.dtype}."
                )
            plan.append((file, shape, dtype, dest, rows))
        if plan:
            self._check_len(storage, _len, plan[0][3].shape, metadata_file)

        def fill():
            for file, shape, dtype, dest, rows in plan:
                source = MemoryMappedTensor.from_filename(filename=file, shape=shape, dtype=dtype)
                dest.copy_(source if rows is None else source[:rows])

        return fill, (plan[0][3].shape if plan else None)

    def _read_tensordict(self, storage, path, metadata_file, _len):
        check_tensordict_layout(path)
        _storage = TensorDict.load_memmap(path)
        if not self._load_hooks:
            self._check_len(storage, _len, _storage.batch_size, metadata_file)
            self._check_fits(storage, _storage, path)
        # with load hooks, what is on disk is not the storage's layout
        rows = None if self._load_hooks else _storage.batch_size
        return functools.partial(self._fill_tensordict, storage, path, _storage), rows

    def _fill_tensordict(self, storage, path, _storage):
        dest = storage._storage if storage.initialized else None
        for hook in self._load_hooks:
            _storage = hook(_storage, out=dest)
        if not storage.initialized:
            if (
                getattr(storage, "_files_in_scratch_dir", False)
                and storage.scratch_dir
                and Path(storage.scratch_dir).absolute() == path.absolute()
            ):
                storage._storage = TensorDict.load_memmap(path)
                storage.initialized = True
            else:
                storage._init(_storage[0])
                storage._storage.update_(_storage)
        elif (
            storage._storage.is_memmap()
            and storage._storage.saved_path
            and Path(storage._storage.saved_path).absolute() == path.absolute()
        ):
            # The storage already lives in these files.
            storage._storage.memmap_refresh_()
        else:
            storage._storage.copy_(_storage)

    @staticmethod
    def _check_fits(storage, loaded, path):
        meta_file = path / TENSORDICT_METADATA_FILE
        if storage.initialized:
            target = storage._storage
            if target.batch_size != loaded.batch_size:
                raise ValueError(
                    f"The checkpoint {meta_file} holds data of batch size {list(loaded.batch_size)}, "
                    f"but the storage has batch size {list(target.batch_size)}."
                )
            have, want = leaf_specs(loaded), leaf_specs(target)
            # Entries the storage does not have are left out, as torchrl's copy_ leaves them
            # (a TensorDict buffer adds an "index" entry to its storage at its first write,
            # so its dump holds one that a fresh preallocated storage does not). A key of the
            # storage missing from the checkpoint would keep its old rows beside the loaded
            # ones: refused.
            missing = format_keys(set(want) - set(have))
            if missing != "[]":
                raise ValueError(
                    f"The checkpoint {meta_file} does not have the storage's keys: missing "
                    f"{missing}."
                )
            for key, expected in want.items():
                shape, dtype = have[key]
                if expected != (shape, dtype):
                    raise ValueError(
                        f"The checkpoint entry {key!r} in {meta_file} has shape {list(shape)} and "
                        f"dtype {dtype}, but the storage expects shape {list(expected[0])} and "
                        f"dtype {expected[1]}."
                    )
            return
        ndim = getattr(storage, "ndim", 1)
        shape = loaded.batch_size
        if len(shape) < ndim:
            raise ValueError(
                f"The checkpoint {meta_file} holds data of batch size {list(shape)}, which has fewer "
                f"than ndim={ndim} dimensions."
            )
        per_row = math.prod(shape[1:ndim])
        expected_dim0 = -(int(storage.max_size) // -per_row) if per_row else 0
        if shape[0] != expected_dim0:
            raise ValueError(
                f"The checkpoint {meta_file} holds data of batch size {list(shape)}, which does not "
                f"fit a storage of max_size={storage.max_size} (expected {expected_dim0} rows along "
                "the first dimension)."
            )


def _ted_hooks(*names):
    try:
        from torchrl_compat import utils
    except ImportError as err:  # pragma: no cover - the package always ships utils
        raise ImportError("torchrl_compat.utils is required by this checkpointer.") from err
    missing = [name for name in names if not hasattr(utils, name)]
    if missing:
        raise ImportError(
            f"torchrl_compat.utils does not provide {missing}, needed by this checkpointer."
        )
    return [getattr(utils, name) for name in names]


class FlatStorageCheckpointer(TensorStorageCheckpointer):
    """Saves the storage in a compact form, saving space on the TED format.

    This class explicitly assumes and does NOT check that:

      - done states (including terminated and truncated) at the root are always False;
      - observations in the "next" tensordict are shifted by one step in the future (this
        is not the case when a multi-step transform is used for instance) unless `done` is `True`
        in which case the observation in `("next", key)` at time `t` and the one in `key` at time
        `t+1` should not match.

    .. seealso: The full list of arguments can be found in :class:`~torchrl.data.TED2Flat`.

    """

    # The (save, load) hooks from torchrl_compat.utils; NestedStorageCheckpointer swaps them.
    _TED_HOOKS = ("TED2Flat", "Flat2TED")

    def __init__(self, done_keys=None, reward_keys=None):
        super().__init__()
        kwargs = _ted_kwargs(done_keys, reward_keys)
        save, load = _ted_hooks(*self._TED_HOOKS)
        self._save_hooks = [save(**kwargs)]
        self._load_hooks = [load(**kwargs)]


class NestedStorageCheckpointer(FlatStorageCheckpointer):
    """Saves the storage in a compact form, saving space on the TED format and using memory-mapped nested tensors.

    This class explicitly assumes and does NOT check that:

      - done states (including terminated and truncated) at the root are always False;
      - observations in the "next" tensordict are shifted by one step in the future (this
        is not the case when a multi-step transform is used for instance).

    .. seealso: The full list of arguments can be found in :class:`~torchrl.data.TED2Flat`.

    """

    _TED_HOOKS = ("TED2Nested", "Nested2TED")


class H5StorageCheckpointer(NestedStorageCheckpointer):
    """Saves the storage in a compact form, saving space on the TED format and using H5 format to save the data.

    This class explicitly assumes and does NOT check that:

      - done states (including terminated and truncated) at the root are always False;
      - observations in the "next" tensordict are shifted by one step in the future (this
        is not the case when a multi-step transform is used for instance).

    Keyword Args:
        checkpoint_file: the filename where to save the checkpointed data.
            This will be ignored iff the path passed to dumps / loads ends with the ``.h5``
            suffix. Defaults to ``"checkpoint.h5"``.
        h5_kwargs (Dict[str, Any] or Tuple[Tuple[str, Any], ...]): kwargs to be
            passed to :meth:`h5py.File.create_dataset`.

    .. note:: Requires ``h5py``. To prevent out-of-memory issues, the data of the H5 file will
        be temporarily written on memory-mapped tensors stored in shared file system. The
        physical memory usage may increase during loading as a consequence.

    .. note:: :meth:`dumps` writes the file in a sibling ``.<file>.partial-<id>`` directory and
        renames it onto the checkpoint file once complete, so an interrupted dump keeps the
        previous file.
        :meth:`loads` of a missing file raises :class:`FileNotFoundError` naming it.

    .. seealso: The full list of arguments can be found in :class:`~torchrl.data.TED2Flat`. Note that this class only
        supports keyword arguments.

    """

    def __init__(
        self,
        *,
        checkpoint_file: str = "checkpoint.h5",
        done_keys=None,
        reward_keys=None,
        h5_kwargs=None,
        **kwargs,
    ):
        StorageCheckpointerBase.__init__(self)
        ted2_kwargs = _ted_kwargs(done_keys, reward_keys, **kwargs)
        ted2nested, h5split, h5combine, nested2ted = _ted_hooks(
            "TED2Nested", "H5Split", "H5Combine", "Nested2TED"
        )
        self._save_hooks = [ted2nested(**ted2_kwargs), h5split()]
        self._load_hooks = [h5combine(), nested2ted(**ted2_kwargs)]
        self.kwargs = {} if h5_kwargs is None else dict(h5_kwargs)
        self.checkpoint_file = checkpoint_file

    def dumps(self, storage, path):
        from tensordict import PersistentTensorDict

        path = Path(self._get_path(path))
        self._set_hooks_shift_is_full(storage)
        if not storage.initialized:
            raise RuntimeError("Cannot save a non-initialized storage.")
        _storage = storage._storage
        length = storage._len
        for hook in self._save_hooks:
            _storage = hook(_storage)
        if not is_tensor_collection(_storage):
            raise ValueError("Only tensor collections are supported.")

        def write(file):
            data = PersistentTensorDict.from_dict(_storage, str(file), **self.kwargs)
            data["_len"] = NonTensorData(data=length)
            data.close()

        publish_file(path, write)

    # the H5 file is read as it is loaded
    _read_checkpoint = StorageCheckpointerBase._read_checkpoint

    def loads(self, storage, path):
        from tensordict import PersistentTensorDict

        path = self._get_path(path, create=False)
        if not os.path.isfile(path):
            raise missing_checkpoint_error(Path(path), "the H5 file does not exist")
        try:
            data = PersistentTensorDict.from_h5(path)
        except OSError as err:
            raise ValueError(f"The H5 checkpoint {path} is truncated or corrupted: {err}.") from None
        if "_len" not in data.keys():
            raise ValueError(f"The H5 checkpoint {path} has no '_len' entry.")
        dest = storage._storage if storage.initialized else None
        _len = data["_len"]
        for hook in self._load_hooks:
            data = hook(data, out=dest)
        if not storage.initialized:
            storage._init(data[0])
            storage._storage.update_(data)
        else:
            storage._storage.copy_(data)
        storage._len = _len

    def _get_path(self, path, create=True):
        path = Path(path)
        if path.suffix == ".h5":
            return str(path.absolute())
        if create:
            try:
                path.mkdir(exist_ok=True)
            except Exception:
                raise RuntimeError(f"Failed to create the checkpoint directory {path}.")
        return str((path / self.checkpoint_file).absolute())


class StorageEnsembleCheckpointer(StorageCheckpointerBase):
    """Checkpointer for ensemble storages.

    Storage ``i`` is saved in ``path / str(i)`` and its transform, if any, in
    ``path / f"{i}_transform.pt"`` (torchrl 0.11's layout). From torchrl 0.14 on,
    ``metadata.json`` lists the empty members (``{"empty_members": [...]}``), which are not
    dumped and are emptied on load (a checkpoint without it has none).

    .. note::
        torchrl 0.11's ``dumps`` saves the transforms of the last sub-storage instead of the
        ensemble's (and fails when that sub-storage has none); this one saves the ensemble's.
        The whole directory is written aside, each sub-storage dumped into it, and renamed
        onto ``path`` once complete; what else ``path`` held is carried over (hard links),
        and a sub-storage living in its checkpoint directory keeps its files there (see
        :class:`TensorStorageCheckpointer`). :meth:`loads` reads and checks every
        sub-storage's checkpoint and every transform file before anything changes.
    """

    @staticmethod
    def dumps(storage, path: Path):
        path = Path(path).absolute()
        storages = storage._storages
        transforms = storage._transforms
        own = [str(i) for i in range(len(storages))]
        if transforms is not None:
            own += [f"{i}_transform.pt" for i in range(len(transforms))]
        empty = []
        if since("ensemble_checkpoint_empty_members"):
            own.append(ENSEMBLE_METADATA_FILE)
            empty = [i for i, sub in enumerate(storages) if not len(sub)]
        previous = published_path(path)

        def write(root):
            carry_over(previous, root, skip=own)
            if since("ensemble_checkpoint_empty_members"):
                _dump_json({"empty_members": empty}, root / ENSEMBLE_METADATA_FILE)
            for i, sub in enumerate(storages):
                if i not in empty:
                    sub.dumps(root / str(i))
            if transforms is not None:
                for i, transform in enumerate(transforms):
                    if transform is not None:
                        torch.save(transform.state_dict(), root / f"{i}_transform.pt")

        write_aside(path, write)

    @staticmethod
    def loads(storage, path: Path):
        StorageEnsembleCheckpointer._read_checkpoint(storage, path)()

    @staticmethod
    def _read_checkpoint(storage, path: Path):
        path = Path(path).absolute()
        if not path.is_dir():
            raise missing_checkpoint_error(path, "the directory does not exist")
        empty = _empty_members(path, len(storage._storages))
        loaders = [
            sub._empty if i in empty else read_for_loading(sub, path / str(i))
            for i, sub in enumerate(storage._storages)
        ]
        transform_states = []
        if storage._transforms is not None:
            for i, transform in enumerate(storage._transforms):
                if transform is None:
                    continue
                file = path / f"{i}_transform.pt"
                if not file.is_file():
                    raise FileNotFoundError(f"The transform checkpoint {file} does not exist.")
                transform_states.append((transform, read_torch_file(file), file))

        def load():
            restore = load_module_states(transform_states)
            try:
                with reading(path):
                    for load_sub in loaders:
                        load_sub()
            except BaseException:
                restore()
                raise

        return load


ENSEMBLE_METADATA_FILE = "metadata.json"


def _empty_members(path: Path, count: int) -> set:
    """The members an ensemble checkpoint lists as empty (torchrl 0.14's ``metadata.json``;
    none without it, as in an older checkpoint)."""
    file = path / ENSEMBLE_METADATA_FILE
    if not since("ensemble_checkpoint_empty_members") or not file.exists():
        return set()
    metadata = read_json_object(file)
    empty = metadata.get("empty_members")
    if not isinstance(empty, list) or not all(isinstance(i, int) and 0 <= i < count for i in empty):
        raise MetadataError(
            f"{file}: empty_members must be a list of member positions below {count}, got {empty!r}"
        )
    return set(empty)
