"""Drop-in replacements for torchrl's replay buffers and their storages, checkpointers,
samplers and writers.

They follow the torchrl release installed beside them, 0.11.x to 0.14.x (names, signatures,
defaults, sampling numbers, checkpoint formats of that release), and the newest, 0.14, without
torchrl; ``TORCHRL_COMPAT_RELEASE=0.11`` asks for another (:mod:`torchrl_compat._releases`
holds the one table of what differs between releases).

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

from torchrl_compat import checkpointers, replay_buffers, samplers, storages, writers
from torchrl_compat.checkpointers import *  # noqa: F401,F403
from torchrl_compat.replay_buffers import *  # noqa: F401,F403
from torchrl_compat.samplers import *  # noqa: F401,F403
from torchrl_compat.storages import *  # noqa: F401,F403
from torchrl_compat.writers import *  # noqa: F401,F403

__all__ = [
    *storages.__all__,
    *checkpointers.__all__,
    *samplers.__all__,
    *writers.__all__,
    *replay_buffers.__all__,
]

# Ray is imported when a RayReplayBuffer is built, not here.
from torchrl_compat.ray_buffer import RayReplayBuffer  # noqa: E402

__all__.append("RayReplayBuffer")

# Torch-free, so it also runs from the start-up hook before anything imports torchrl.
from torchrl_compat_trees import install_segment_trees  # noqa: E402

__all__.append("install_segment_trees")

# Stands the classes above in for torchrl's own, in torchrl's modules.
from torchrl_compat._install import install, uninstall  # noqa: E402

__all__ += ["install", "uninstall"]

# torchrl 0.14 exports its trajectory-boundary routine with the replay-buffer classes.
from torchrl_compat._releases import since as _since  # noqa: E402
from torchrl_compat.utils import find_start_stop_traj  # noqa: E402

if _since("find_start_stop_traj_public"):
    __all__.append("find_start_stop_traj")

# torchrl 0.14's sample units (the module imports in every release; torchrl 0.11-0.13 have
# no such classes, so the package names them only from 0.14).
from torchrl_compat import sample_units  # noqa: E402

if _since("sample_units"):
    from torchrl_compat.sample_units import SampleUnit, Sequence, Transition  # noqa: E402,F401

    __all__ += sample_units.__all__

# What an earlier version pickled names the private modules as they were before they moved
# into their families' packages.
from torchrl_compat._moved_modules import install_old_names as _install_old_names  # noqa: E402

_install_old_names()
