"""The names ``torchrl_compat.samplers`` takes from outside this package.

Storages and index helpers come from torchrl 0.11 for now, so the samplers run on
torchrl's own storages (they only rely on duck typing, as torchrl's samplers do). This is
the one place to point at ``torchrl_compat``'s own modules once they exist.
"""
from torchrl._utils import _replace_last, logger
from torchrl.data.replay_buffers.storages import Storage, StorageEnsemble, TensorStorage
from torchrl.data.replay_buffers.utils import _auto_device, _is_int, unravel_index

__all__ = [
    "Storage",
    "StorageEnsemble",
    "TensorStorage",
    "_auto_device",
    "_is_int",
    "_replace_last",
    "logger",
    "unravel_index",
]
