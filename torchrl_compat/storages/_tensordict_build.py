"""Plain :class:`~tensordict.TensorDict` objects made from values already checked.

A gathered batch is built from leaves that are known to be tensors of the right batch size
under string keys, so ``TensorDict._new_unsafe`` has nothing left to check; its remaining
work (a device normalised, an MPS probe, the values copied into a new dict) still costs
about 1.4 us a tensordict, as much as gathering a small leaf. :func:`plain_tensordict` sets
the instance's attributes directly, the dict given becoming the tensordict's own.

That is only done where it gives exactly what ``_new_unsafe`` gives with the installed
tensordict: at import, both are built for a probe and their attributes compared (names,
types, values). Anything else (a tensordict release that keeps other attributes, or
different ones) uses ``_new_unsafe``.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict

__all__ = ["plain_tensordict"]


def _by_new_unsafe(values: dict, batch_size: torch.Size, device) -> TensorDict:
    return TensorDict._new_unsafe(values, batch_size=batch_size, device=device, nested=False)


def _direct_attributes():
    """The attributes ``_new_unsafe`` sets that do not depend on its arguments, for a
    tensordict with and without a device; ``None`` when setting them directly does not
    reproduce its result."""
    values = {"probe": torch.zeros(2)}
    batch_size = torch.Size([2])
    constants = {}
    for device in (None, torch.device("cpu")):
        reference = _by_new_unsafe(dict(values), batch_size, device).__dict__
        fixed = {"_device": device, "_tensordict": values, "_batch_size": batch_size, "_td_dim_names": None}
        extra = {name: value for name, value in reference.items() if name not in fixed}
        if set(extra) - {"_has_mps_val"} or set(fixed) - set(reference):
            return None
        if type(reference["_tensordict"]) is not dict or reference["_device"] != device:
            return None
        if reference["_batch_size"] != batch_size or reference["_td_dim_names"] is not None:
            return None
        constants[device is not None] = extra
    return constants


_CONSTANTS = _direct_attributes()
_NEW = TensorDict.__new__


def plain_tensordict(values: dict, batch_size: torch.Size, device) -> TensorDict:
    """``TensorDict._new_unsafe(values, batch_size=batch_size, device=device, nested=False)``
    for ``values`` a plain dict of string keys to tensors (or tensordicts) of ``batch_size``
    on ``device`` (a ``torch.device`` or ``None``), which the result then owns: the caller
    must not change it afterwards."""
    if _CONSTANTS is None:
        return _by_new_unsafe(values, batch_size, device)
    td = _NEW(TensorDict)
    attributes = td.__dict__
    attributes.update(_CONSTANTS[device is not None])
    attributes["_device"] = device
    attributes["_tensordict"] = values
    attributes["_batch_size"] = batch_size
    attributes["_td_dim_names"] = None
    return td
