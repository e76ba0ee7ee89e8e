""":class:`WriterEnsemble`: one writer per storage of a storage ensemble."""
from __future__ import annotations

import textwrap
from collections import OrderedDict
from copy import copy
from pathlib import Path
from typing import Any

import torch

from ..checkpointers._checks import read_for_loading
from ..checkpointers._publish import write_aside
from .._ensemble import INDEX_ERROR, members_rng, pick, select_members
from .._releases import since
from .._torchrl_lookup import accepted_classes, torchrl_twin
from ..storages import StorageEnsemble
from ._generations import routed_generations
from .base import Writer


class WriterEnsemble(Writer, *torchrl_twin("writers", "WriterEnsemble")):
    """An ensemble of writers.

    This class is designed to work with :class:`~torchrl_compat.ReplayBufferEnsemble`.
    It contains the writers but blocks writing with any of them.

    Args:
        writers (sequence of Writer): the writers to make the composite writer.

    .. warning::
       This class does not support writing.
       To extend one of the replay buffers, simply index the parent
       :class:`~torchrl_compat.ReplayBufferEnsemble` object.

    Examples:
        >>> ensemble = WriterEnsemble(RoundRobinWriter(), RoundRobinWriter())
        >>> len(ensemble), type(ensemble[1]).__name__, len(ensemble[:1])
        (2, 'RoundRobinWriter', 1)
    """

    def __init__(self, *writers):
        self._rng_private = None
        self._writers = writers

    _rng = members_rng("_writers")

    def dumps(self, path: Path):
        # every member's files are written aside and published together
        def write(directory):
            for i, writer in enumerate(self._writers):
                writer.dumps(directory / str(i))

        write_aside(path, write)

    def loads(self, path: Path):
        self._apply_checkpoint(self._read_checkpoint(path))

    def _read_checkpoint(self, path) -> list:
        # every member's checkpoint is read and checked before any member changes
        path = Path(path).absolute()
        return [read_for_loading(writer, path / str(i)) for i, writer in enumerate(self._writers)]

    def _apply_checkpoint(self, loaders: list) -> None:
        for load in loaders:
            load()

    def add(self):
        raise NotImplementedError

    def extend(self):
        raise NotImplementedError

    _INDEX_ERROR = INDEX_ERROR

    def __getitem__(self, index):
        return select_members(
            self, index, self._writers, lambda selection: WriterEnsemble(*pick(self._writers, selection)), kind="writers"
        )

    def __len__(self):
        return len(self._writers)

    def __repr__(self):
        writers = textwrap.indent(f"writers={self._writers}", " " * 4)
        return f"WriterEnsemble(\n{writers})"

    if since("ensemble_members_state"):

        def _empty(self, empty_write_count: bool = True) -> None:
            for writer in self._writers:
                writer._empty(empty_write_count=empty_write_count)

        def state_dict(self) -> dict[str, Any]:
            """The members' ``state_dict``s, under their positions (``"0"``, ``"1"``, ...)."""
            return OrderedDict((str(i), writer.state_dict()) for i, writer in enumerate(self._writers))

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            for i, writer in enumerate(self._writers):
                writer.load_state_dict(state_dict[str(i)])

    else:

        def _empty(self, empty_write_count: bool = True) -> None:
            raise NotImplementedError

        def state_dict(self) -> dict[str, Any]:
            raise NotImplementedError

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            raise NotImplementedError

    def __getstate__(self):
        state = copy(self.__dict__)
        state["_rng_private"] = None
        return state

    # -------------------------------------------- members as one (torchrl 0.14)
    if since("writer_ensemble_members"):

        @property
        def tracks_generations(self) -> bool:
            """Whether every member writer stamps its slots with their write generation."""
            return all(writer.tracks_generations for writer in self._writers)

        @property
        def _write_count(self) -> int:
            return sum(getattr(writer, "_write_count", 0) for writer in self._writers)

        def register_storage(self, storage) -> None:
            """Registers a storage ensemble: its ``i``-th storage on the ``i``-th writer."""
            if not isinstance(storage, accepted_classes(StorageEnsemble, "storages")):
                raise TypeError("WriterEnsemble requires a StorageEnsemble.")
            if len(storage._storages) != len(self._writers):
                raise ValueError("WriterEnsemble and StorageEnsemble must have the same number of members.")
            self._storage = storage
            for writer, member_storage in zip(self._writers, storage._storages):
                writer.register_storage(member_storage)

        def generations_of(self, index) -> torch.Tensor:
            """The slot generations of routed indices: ``index`` is a tensordict holding
            ``"buffer_ids"`` (one member id per row) and ``"index"`` (each row's index in
            that member); row ``k`` gets its member writer's stamp.

            Returns:
                torch.Tensor: the stamps, row by row (a nested tensor when members' stamps
                have different shapes).
            """
            return routed_generations(self._writers, index)
