"""What the samplers share: the storage classes they branch on and the random draws made on a storage's device."""
from __future__ import annotations

import torch

from .._torchrl_lookup import accepted_classes, with_torchrl_namesakes
from ..storages import StorageEnsemble, TensorStorage


_EMPTY_STORAGE_ERROR = "Cannot sample from an empty storage."


_CPU = torch.device("cpu")


# The samplers take any storage that follows torchrl's storage API (duck typing, as torchrl's
# samplers do); where they branch on a storage class, torchrl's own counts as ours.
_TENSOR_STORAGES = accepted_classes(TensorStorage, "storages")


_STORAGE_ENSEMBLES = accepted_classes(StorageEnsemble, "storages")


# The ``TensorStorage._rand_given_ndim`` of ours and torchrl's (when importable): for a 1-D
# storage, ``torch.randint(len(storage))`` behind dynamo-disabled wrappers.
_PLAIN_RAND_GIVEN_NDIM = frozenset(cls._rand_given_ndim for cls in with_torchrl_namesakes(TensorStorage))


def _replace_last(key, new_ending):
    """``key`` with its last element replaced (a string key is replaced whole)."""
    if isinstance(key, str):
        return new_ending
    return key[:-1] + (new_ending,)


def _on_cpu(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"


def _gen_device(generator, device):
    return generator.device if generator is not None else device


def _rand(num: int, device, generator) -> torch.Tensor:
    if generator is None or device is None or generator.device == device:
        return torch.rand(num, generator=generator, device=_gen_device(generator, device))
    return torch.rand(num, generator=generator, device=generator.device).to(device)


def _randint(high: int, num: int, device, generator) -> torch.Tensor:
    if generator is None or device is None or generator.device == device:
        return torch.randint(high, (num,), generator=generator, device=_gen_device(generator, device))
    return torch.randint(high, (num,), generator=generator, device=generator.device).to(device)


def _as_long(index: torch.Tensor) -> torch.Tensor:
    return index if index.dtype is torch.long else index.to(torch.long)


def _randperm(num: int, device, generator) -> torch.Tensor:
    out = torch.randperm(num, generator=generator, device=_gen_device(generator, device))
    return out.to(device) if device is not None else out
