"""Drop-in replacements for torchrl 0.11's replay buffers and their storages, checkpointers,
samplers and writers.

Each submodule mirrors its torchrl counterpart (``torchrl_compat.storages`` for
``torchrl.data.replay_buffers.storages`` and so on); every public name is also
available from the package itself. :func:`install` makes torchrl's own modules hand
out these classes in place of torchrl's (``uninstall`` undoes it).

Examples:
    >>> import torch
    >>> from torchrl_compat import LazyTensorStorage
    >>> storage = LazyTensorStorage(8)
    >>> storage.set(range(3), torch.arange(3.0))
    >>> storage[1:]
    tensor([1., 2.])
"""
from __future__ import annotations

from torchrl_compat.checkpointers import (
    CompressedListStorageCheckpointer,
    FlatStorageCheckpointer,
    ListStorageCheckpointer,
    NestedStorageCheckpointer,
    StorageCheckpointerBase,
    StorageEnsembleCheckpointer,
    TensorStorageCheckpointer,
)
from torchrl_compat.storages import (
    CompressedListStorage,
    LazyMemmapStorage,
    LazyStackStorage,
    LazyTensorStorage,
    ListStorage,
    Storage,
    StorageEnsemble,
    TensorStorage,
)

__all__ = [
    # storages
    "CompressedListStorage",
    "LazyMemmapStorage",
    "LazyStackStorage",
    "LazyTensorStorage",
    "ListStorage",
    "Storage",
    "StorageEnsemble",
    "TensorStorage",
    # checkpointers
    "CompressedListStorageCheckpointer",
    "FlatStorageCheckpointer",
    "ListStorageCheckpointer",
    "NestedStorageCheckpointer",
    "StorageCheckpointerBase",
    "StorageEnsembleCheckpointer",
    "TensorStorageCheckpointer",
]

from torchrl_compat.samplers import (  # noqa: E402
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    Sampler,
    SamplerEnsemble,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)

__all__ += [
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "RandomSampler",
    "Sampler",
    "SamplerEnsemble",
    "SamplerWithoutReplacement",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
]

from torchrl_compat.writers import (  # noqa: E402
    ImmutableDatasetWriter,
    RoundRobinWriter,
    TensorDictMaxValueWriter,
    TensorDictRoundRobinWriter,
    Writer,
    WriterEnsemble,
)
from torchrl_compat.replay_buffers import (  # noqa: E402
    InPlaceSampler,
    PrioritizedReplayBuffer,
    ReplayBuffer,
    ReplayBufferEnsemble,
    TensorDictPrioritizedReplayBuffer,
    TensorDictReplayBuffer,
)

__all__ += [
    "ImmutableDatasetWriter",
    "RoundRobinWriter",
    "TensorDictMaxValueWriter",
    "TensorDictRoundRobinWriter",
    "Writer",
    "WriterEnsemble",
    "InPlaceSampler",
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
    "ReplayBufferEnsemble",
    "TensorDictPrioritizedReplayBuffer",
    "TensorDictReplayBuffer",
]

# Only defined when h5py is installed, as in torchrl.
try:
    from torchrl_compat.checkpointers import H5StorageCheckpointer  # noqa: F401
except ImportError:
    pass
else:
    __all__.append("H5StorageCheckpointer")

# Torch-free, so it also runs from the start-up hook before anything imports torchrl.
from torchrl_compat_trees import install_segment_trees  # noqa: E402

__all__.append("install_segment_trees")

# Stands the classes above in for torchrl's own, in torchrl's modules.
from torchrl_compat._install import install, uninstall  # noqa: E402

__all__ += ["install", "uninstall"]
