""":class:`StorageEnsemble`: several storages read as one."""
from __future__ import annotations

import textwrap
from collections import OrderedDict
from typing import Any

import torch

from .._ensemble import INDEX_ERROR, members_rng, pick, select_members
from .._releases import since
from .._torchrl_lookup import torchrl_twin
from ..checkpointers import StorageEnsembleCheckpointer
from .base import Storage
from .utils import _stack_anything


class StorageEnsemble(Storage, *torchrl_twin("storages", "StorageEnsemble")):
    """An ensemble of storages.

    This class is designed to work with :class:`~torchrl.data.replay_buffers.replay_buffers.ReplayBufferEnsemble`.

    Args:
        storages (sequence of Storage): the storages to make the composite storage.

    Keyword Args:
        transforms (list of :class:`~torchrl.envs.Transform`, optional): a list of
            transforms of the same length as storages.

    .. warning::
      This class signatures for :meth:`get` does not match other storages, as
      it will return a tuple ``(buffer_id, samples)`` rather than just the samples.

    .. warning::
       This class does not support writing (similarly to :class:`~torchrl.data.replay_buffers.writers.WriterEnsemble`).
       To extend one of the replay buffers, simply index the parent
       :class:`~torchrl.data.ReplayBufferEnsemble` object.

    .. note:: Unlike torchrl's, the ensemble has a checkpointer from the start
        (:class:`~torchrl_compat.StorageEnsembleCheckpointer`), so :meth:`dumps` and
        ``register_save_hook`` work instead of raising ``AttributeError``.
    """

    # what a buffer collates its samples with (see utils._get_default_collate)
    _default_collate_fn = staticmethod(_stack_anything)

    _default_checkpointer = StorageEnsembleCheckpointer

    def __init__(
        self,
        *storages: Storage,
        transforms: list[Transform] = None,  # noqa: F821
    ):
        self._rng_private = None
        self._storages = storages
        self._transforms = transforms
        if transforms is not None and len(transforms) != len(storages):
            raise TypeError(
                "transforms must have the same length as the storages provided."
            )
        self._checkpointer = self._default_checkpointer()
        self._compilable = False
        self._attached_entities_list = []
        if since("storage_ensemble_max_size"):
            self.max_size = sum(storage.max_size for storage in storages)

    _rng = members_rng("_storages")

    def extend(self, value):
        raise RuntimeError(
            "StorageEnsemble does not support writing: extend one of its storages (or index the parent ReplayBufferEnsemble)."
        )

    def add(self, value):
        raise RuntimeError(
            "StorageEnsemble does not support writing: add to one of its storages (or index the parent ReplayBufferEnsemble)."
        )

    def set(self, cursor, data, *, set_cursor: bool = True):
        raise RuntimeError(
            "StorageEnsemble does not support writing: set data in one of its storages."
        )

    def get(self, item):
        # the buffer id is returned too, to pick the matching collate_fn
        buffer_ids = item.get("buffer_ids")
        index = item.get("index")
        results = []
        for buffer_id, sample in zip(buffer_ids, index):
            buffer_id = self._convert_id(buffer_id)
            results.append((buffer_id, self._get_storage(buffer_id).get(sample)))
        if self._transforms is not None:
            results = [
                (buffer_id, self._transforms[buffer_id](result))
                if self._transforms[buffer_id] is not None
                else (buffer_id, result)
                for buffer_id, result in results
            ]
        return results

    def _convert_id(self, sub):
        if isinstance(sub, torch.Tensor):
            sub = sub.item()
        return sub

    def _get_storage(self, sub):
        return self._storages[sub]

    if since("ensemble_members_state"):

        def state_dict(self) -> dict[str, Any]:
            """The members' ``state_dict``s, under their positions (``"0"``, ``"1"``, ...)."""
            return OrderedDict((str(i), storage.state_dict()) for i, storage in enumerate(self._storages))

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            for i, storage in enumerate(self._storages):
                storage.load_state_dict(state_dict[str(i)])

        def _empty(self) -> None:
            for storage in self._storages:
                storage._empty()

    else:

        def state_dict(self) -> dict[str, Any]:
            raise NotImplementedError

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            raise NotImplementedError

    _INDEX_ERROR = INDEX_ERROR

    def __getitem__(self, index):
        return select_members(
            self,
            index,
            self._storages,
            self._selection,
            kind="storages",
            index_each=lambda rest: [storage[rest] for storage in self._storages],
            ensemble_class=StorageEnsemble,
        )

    def _selection(self, selection) -> StorageEnsemble:
        storages = pick(self._storages, selection)
        transforms = pick(self._transforms, selection) if self._transforms is not None else [None] * len(storages)
        return StorageEnsemble(*storages, transforms=transforms)

    def __len__(self):
        return len(self._storages)

    def __repr__(self):
        storages = textwrap.indent(f"storages={self._storages}", " " * 4)
        transforms = textwrap.indent(f"transforms={self._transforms}", " " * 4)
        return f"StorageEnsemble(\n{storages}, \n{transforms})"
