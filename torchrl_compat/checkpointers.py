"""Storage checkpointers (stand-in for ``torchrl.data.replay_buffers.checkpointers``)."""
from __future__ import annotations

import abc


class StorageCheckpointerBase:
    """Public base class for storage checkpointers."""

    def __init__(self):
        self._save_hooks = []
        self._load_hooks = []

    def register_save_hook(self, hook):
        """Registers a save hook for this checkpointer."""
        self._save_hooks.append(hook)

    def register_load_hook(self, hook):
        """Registers a load hook for this checkpointer."""
        self._load_hooks.append(hook)

    @abc.abstractmethod
    def dumps(self, storage, path):
        ...

    @abc.abstractmethod
    def loads(self, storage, path):
        ...


class ListStorageCheckpointer(StorageCheckpointerBase):
    pass


class CompressedListStorageCheckpointer(StorageCheckpointerBase):
    pass


class TensorStorageCheckpointer(StorageCheckpointerBase):
    pass


class FlatStorageCheckpointer(TensorStorageCheckpointer):
    pass


class NestedStorageCheckpointer(FlatStorageCheckpointer):
    pass


class StorageEnsembleCheckpointer(StorageCheckpointerBase):
    pass
