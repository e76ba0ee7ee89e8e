"""What the prioritized buffers add for ``sync=False`` (torchrl 0.13+).

With ``sync=False`` the buffer's own sampler is a shareable :class:`RandomSampler` (writer
processes write through it), and the learner keeps a local prioritized sampler that catches
up with the writes, from the buffer's ``write_count``, before each sample: the new items get
the default priority then. With ``sync=True`` (the default) the prioritized sampler is the
buffer's sampler, as before.
"""
from __future__ import annotations

from multiprocessing.context import get_spawning_popen
from typing import Any

import torch

from torchrl_compat.samplers import PrioritizedSampler, RandomSampler
from torchrl_compat.utils import _pin_memory, INT_CLASSES

__all__ = ["catch_up", "local_sampler", "prioritized_sampler_for", "sample_local", "state_for_pickling", "update_local"]


def prioritized_sampler_for(storage, prioritized_sampler, sync: bool, owner: str):
    """``(buffer sampler, local prioritized sampler or None)`` for ``sync``."""
    if sync:
        return prioritized_sampler, None
    if storage.ndim != 1:
        raise ValueError(f"{owner} only supports 1-D storages when sync=False, got storage.ndim={storage.ndim}.")
    return RandomSampler(), prioritized_sampler


def local_sampler(buffer) -> PrioritizedSampler:
    """The sampler that owns the priority trees (``prioritized_sampler``)."""
    if buffer._sync:
        return buffer._sampler
    sampler = buffer._prioritized_sampler
    if sampler is None:
        raise RuntimeError(f"{type(buffer).__name__} cannot sample with prioritized replay in a worker process.")
    return sampler


def catch_up(buffer) -> None:
    """Gives the items written since the last catch-up the default priority (all of them
    after a wrap-around of the whole storage; the sampler starts over after an empty)."""
    sampler = local_sampler(buffer)
    write_count = int(buffer.write_count)
    if write_count < buffer._prioritized_sampler_write_count:
        sampler._empty()
        buffer._prioritized_sampler_write_count = 0
    delta = write_count - buffer._prioritized_sampler_write_count
    if delta <= 0:
        return
    max_size = buffer._storage.max_size
    if delta >= max_size:
        index = torch.arange(max_size, dtype=torch.long)
    else:
        index = torch.arange(buffer._prioritized_sampler_write_count, write_count, dtype=torch.long).remainder_(max_size)
    sampler.mark_update(index, storage=buffer._storage)
    buffer._prioritized_sampler_write_count = write_count


def sample_local(buffer, batch_size: int) -> tuple[Any, dict]:
    """A sample drawn by the local prioritized sampler, once caught up: its anchors expanded
    by the buffer's sample unit, and with their slots' ``"index_generation"`` when the writer
    tracks them (torchrl 0.14), as a synchronized buffer's sample."""
    catch_up(buffer)
    storage = buffer._storage
    with buffer._replay_lock, buffer._write_lock:
        index, info = local_sampler(buffer).sample(storage, batch_size)
        if buffer._sample_unit is not None:
            index, info = buffer._sample_unit.expand(index, info, storage)
        info["index"] = index
        if getattr(buffer._writer, "tracks_generations", False):
            info["index_generation"] = buffer._writer.generations_of(index)
        data = storage.get(_on_storage_device(index, storage))
    if not isinstance(index, INT_CLASSES):
        data = buffer._collate_fn(data)
    if buffer._has_transforms():
        data = buffer._apply_transform(data)
    if buffer._pin_memory:
        data = _pin_memory(data)
    return data, info


def _on_storage_device(index, storage):
    """``index`` (a tensor or a tuple of them) on the storage's device, where the storage has
    one: the local sampler's trees may live elsewhere (``sampler_device``)."""
    device = getattr(storage, "device", None)
    if device is None or device == "auto":
        return index
    device = torch.device(device)

    def moved(item):
        return item.to(device) if isinstance(item, torch.Tensor) and item.device != device else item

    return tuple(moved(item) for item in index) if isinstance(index, tuple) else moved(index)


def update_local(buffer, index, priority) -> None:
    """``update_priority`` into the local prioritized sampler."""
    if buffer._delayed_init and not buffer._initialized:
        buffer._init()
    if isinstance(index, tuple):
        index = torch.stack(index, -1)
    priority = torch.as_tensor(priority)
    if buffer.dim_extend > 0 and priority.ndim > 1:
        priority = buffer._transpose(priority).flatten()
    with buffer._replay_lock, buffer._write_lock:
        local_sampler(buffer).update_priority(index, priority, storage=buffer.storage)


def state_for_pickling(buffer, state: dict) -> dict:
    """A buffer pickled for a worker process leaves its priorities with the learner."""
    if not buffer._sync and get_spawning_popen() is not None:
        state["_prioritized_sampler"] = None
    return state
