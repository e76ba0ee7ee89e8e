""":class:`Writer`, the base of every writer, and :class:`ImmutableDatasetWriter`."""
from __future__ import annotations

import ctypes
import json
import multiprocessing as mp
from abc import ABC, abstractmethod
from collections.abc import Sequence
from copy import copy
from pathlib import Path
from typing import Any

import torch
from tensordict import is_tensor_collection
from torch.utils._pytree import tree_flatten

from ..checkpointers._checks import MetadataError, read_json_object
from .._releases import since
from .._torchrl_lookup import torchrl_twin
from ..utils import _is_int
from ._generations import untracked_generations_of

try:
    from torch.compiler import disable as compile_disable, is_compiling
except ImportError:  # pragma: no cover - torch < 2.3
    from torch._dynamo import disable as compile_disable, is_compiling


def _notify(storage, index) -> None:
    """Tells the entities attached to ``storage`` that the items at ``index`` changed."""
    for entity in storage._attached_entities_iter():
        entity.mark_update(index)


# torch.compile cannot trace the calls on the attached entities; eager calls skip the
# disabled wrapper, which costs microseconds.
_notify_outside_graph = compile_disable()(_notify)


def _mark_updated(storage, index) -> None:
    (_notify_outside_graph if is_compiling() else _notify)(storage, index)


def _counter(value: int, compilable: bool):
    """A cursor or write count: a plain int if compilable, else a shared int64.

    The shared value has no lock of its own: the buffer's locks serialise its writers.
    It is an int64 where torchrl's ``mp.Value("i")`` wraps past ``2**31 - 1`` writes.
    """
    if compilable:
        return int(value)
    return mp.Value(ctypes.c_int64, int(value), lock=False)


class _Counter:
    """A writer's counter attribute (``_cursor``, ``_write_count``) kept in
    ``__dict__[<name>_value]``: a shared int64, or a plain int for a compilable writer (one
    whose ``_compilable`` is true; ``always_shared`` counters ignore it)."""

    def __init__(self, always_shared: bool = False):
        self.always_shared = always_shared

    def __set_name__(self, owner, name):
        self.slot = f"{name}_value"

    def _plain(self, writer) -> bool:
        return not self.always_shared and writer._compilable

    def __get__(self, writer, owner=None):
        if writer is None:
            return self
        value = writer.__dict__.get(self.slot)
        if value is None:
            value = writer.__dict__[self.slot] = _counter(0, self._plain(writer))
        return value if self._plain(writer) else value.value

    def __set__(self, writer, value):
        shared = writer.__dict__.get(self.slot)
        if self._plain(writer) or shared is None:
            writer.__dict__[self.slot] = _counter(value, self._plain(writer))
        else:
            shared.value = value


WRITER_METADATA_FILE = "metadata.json"


TOP_VALUES_FILE = "current_top_values.memmap"


def _dump_json(content, file) -> None:
    with open(file, "w") as f:
        json.dump(content, f)


def _read_metadata(path, keys) -> tuple[Path, dict]:
    """A writer's ``metadata.json`` under ``path`` (read-only), with the entries ``keys``."""
    file = Path(path).absolute() / WRITER_METADATA_FILE
    metadata = read_json_object(file)
    for key in keys:
        if key not in metadata:
            raise MetadataError(f"{file}: no {key!r} entry")
    return file, metadata


def _batch_len(data) -> int:
    """The number of items ``extend`` receives, by torchrl's rules."""
    if is_tensor_collection(data) or isinstance(data, (torch.Tensor, list)):
        return len(data)
    return len(tree_flatten(data)[0][0])


class Writer(*(torchrl_twin("writers", "Writer") or (ABC,))):
    """A ReplayBuffer base Writer class.

    Args:
        compilable (bool, optional): whether the writer is meant to run under
            :func:`torch.compile`. Defaults to ``False``.

    .. note:: The ``dumps`` of every writer here writes torchrl's files aside and publishes
        them in one rename (a :class:`WriterEnsemble`'s, all its members' at once), so that
        a dump interrupted at any moment, even killed, leaves the previous checkpoint whole;
        torchrl rewrites the files in place. ``loads`` reads every file without writing to
        it and checks it all (JSON keys and types, file sizes) before the writer changes;
        each error names the file.
    """

    _storage = None
    _rng: torch.Generator | None = None

    def __init__(self, compilable: bool = False) -> None:
        self._storage = None
        self._compilable = compilable

    def register_storage(self, storage) -> None:
        self._storage = storage

    if since("writer_slot_generations"):
        #: Whether this writer stamps storage slots with their write generation: only a
        #: round-robin writer constructed with ``track_generations=True`` does.
        tracks_generations: bool = False

        generations_of = untracked_generations_of

    @abstractmethod
    def add(self, data: Any) -> int:
        """Inserts one piece of data at an appropriate index, and returns that index."""
        ...

    @abstractmethod
    def extend(self, data: Sequence) -> torch.Tensor:
        """Inserts a series of data points at appropriate indices, and returns a tensor containing the indices."""
        ...

    @abstractmethod
    def _empty(self, empty_write_count: bool = True) -> None:
        ...

    @abstractmethod
    def dumps(self, path):
        ...

    @abstractmethod
    def loads(self, path):
        ...

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        ...

    @abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ...

    def _replicate_index(self, index):
        """One row ``(i, j, ...)`` per element written when the storage has ``ndim > 1``.

        Item ``i`` of a storage of shape ``[n, d1, d2]`` covers the ``d1 * d2`` elements
        ``(i, j, k)``; a 1-D storage returns ``index`` as it is.
        """
        storage = self._storage
        if storage.ndim == 1:
            return index
        device = index.device if isinstance(index, torch.Tensor) else torch.device("cpu")
        mesh = self._element_mesh(tuple(storage.shape[1:]), device)
        if _is_int(index):
            first = torch.as_tensor(int(index)).expand(mesh.shape[0], 1)
            return torch.cat([first, mesh], 1)
        return torch.cat(
            [index.repeat_interleave(mesh.shape[0]).unsqueeze(1), mesh.repeat(index.numel(), 1)], 1
        )

    def _element_mesh(self, trailing: tuple, device) -> torch.Tensor:
        # The coordinates of every element of one item, in row-major order; cached, as
        # the storage's trailing shape is fixed once it is initialized.
        cached = self.__dict__.get("_mesh_cache")
        if cached is not None and cached[0] == (trailing, device):
            return cached[1]
        axes = [torch.arange(size, device=device) for size in trailing]
        mesh = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).flatten(0, -2)
        self.__dict__["_mesh_cache"] = ((trailing, device), mesh)
        return mesh

    def __repr__(self):
        return f"{self.__class__.__name__}()"

    def __getstate__(self):
        state = copy(self.__dict__)
        # generators don't pickle; the buffer sets its own again
        state["_rng"] = None
        # caches of what the storage holds: rebuilt on first use
        state.pop("_mesh_cache", None)
        state.pop("_leaf_arrays", None)
        return state


class ImmutableDatasetWriter(Writer, *torchrl_twin("writers", "ImmutableDatasetWriter")):
    """A blocking writer for immutable datasets.

    Examples:
        >>> writer = ImmutableDatasetWriter()
        >>> writer.state_dict()
        {}
    """

    WRITING_ERR = "This dataset doesn't allow writing."

    def add(self, data: Any) -> int:
        raise RuntimeError(self.WRITING_ERR)

    def extend(self, data: Sequence) -> torch.Tensor:
        raise RuntimeError(self.WRITING_ERR)

    def _empty(self, empty_write_count: bool = True) -> None:
        raise RuntimeError(self.WRITING_ERR)

    def dumps(self, path):
        ...

    def loads(self, path):
        ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return
