"""Checks that a batch fits a storage's rows, made before a writer moves its cursor.

A writer moves its cursor and write count before it writes (so that concurrent writers
take distinct rows). torchrl's then leaves them moved when the storage refuses the batch:
the next batch lands past the storage's length, and rows never written become visible. A
tensordict batch refused at its second entry has already written its first: on a full
storage the rows are torn, new values in some entries and old ones in others. These checks
find, before anything moves or is written, what the storage's write would refuse: an entry
whose dtype differs from the stored one (an indexed write does not cast) or whose shape
does not broadcast to the rows it is written to. They cost one pass over the entries, not
over the items.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, is_tensor_collection

from torchrl_compat.storages import TensorStorage

__all__ = ["check_batch_fits"]


def _plain_pairs(dest: TensorDict, data: TensorDict, numel, out: list, prefix=()) -> None:
    """Appends to ``out`` the ``(key, stored, written)`` pairs of two plain tensordicts whose
    dtype or shape differ from what an indexed write takes as is (the usual batch adds none):
    one pass over the entries, without tensordict's generic machinery."""
    stored = dest._tensordict
    for key, value in data._tensordict.items():
        leaf = stored.get(key)
        if leaf is None:
            continue
        if type(value) is TensorDict:
            if type(leaf) is TensorDict:
                _plain_pairs(leaf, value, numel, out, prefix + (key,))
            continue
        try:
            if numel is None:  # one item, copied (cast) into its row
                same = value.shape == leaf.shape[1:]
            else:
                same = value.dtype is leaf.dtype and value.shape[0] == numel and value.shape[1:] == leaf.shape[1:]
        except (AttributeError, IndexError):  # not tensors, or a 0-d one: checked below
            same = False
        if not same:
            out.append((prefix + (key,), leaf, value))


def _pairs(dest, data):
    """``(key, stored tensor, tensor written)`` for each entry both ``data`` and ``dest`` hold."""
    for key, value in data.items(include_nested=True, leaves_only=True):
        leaf = dest.get(key, None)
        if leaf is not None:
            yield key if isinstance(key, tuple) else (key,), leaf, value


def _name(key) -> str:
    return repr(key[0] if len(key) == 1 else key)


def check_batch_fits(storage, data, numel: int | None) -> None:
    """Raises the error the storage's write of ``data`` would raise, before anything is written.

    Args:
        storage (Storage): the storage written to; only initialized tensor storages are
            checked (the others check as they write).
        data (torch.Tensor or TensorDict): a batch of ``numel`` items (``extend``), or one
            item when ``numel`` is ``None`` (``add``, which casts as it copies).

    Raises:
        RuntimeError: naming the entry, its shape and dtype, and what the storage holds.
    """
    if not getattr(storage, "initialized", False) or not isinstance(storage, TensorStorage):
        return
    dest = storage._storage
    if type(dest) is TensorDict and type(data) is TensorDict:
        pairs = []
        _plain_pairs(dest, data, numel, pairs)
        if not pairs:
            return
    elif isinstance(dest, torch.Tensor) and isinstance(data, torch.Tensor):
        pairs = (((), dest, data),)
    elif is_tensor_collection(dest) and is_tensor_collection(data):
        pairs = _pairs(dest, data)
    else:
        return
    for key, leaf, value in pairs:
        if not isinstance(value, torch.Tensor) or not isinstance(leaf, torch.Tensor):
            continue
        entry = f"entry {_name(key)}" if key else ("the item" if numel is None else "the batch")
        row = leaf.shape[1:]
        if numel is None:
            target = row
        else:
            target = (numel, *row)
            if value.dtype != leaf.dtype:
                raise RuntimeError(
                    f"Cannot extend the storage: {entry} has dtype {value.dtype}, but the storage "
                    f"holds {leaf.dtype} there (a batch is written by index, which does not cast). "
                    "Nothing was written."
                )
        if tuple(value.shape) == tuple(target):
            continue
        try:
            fits = torch.broadcast_shapes(value.shape, target) == torch.Size(target)
        except RuntimeError:
            fits = False
        if not fits:
            what = "add to the storage" if numel is None else "extend the storage"
            raise RuntimeError(
                f"Cannot {what}: {entry} has shape {list(value.shape)}, which does not broadcast "
                f"to the {'row' if numel is None else 'rows'} it is written to, of shape "
                f"{list(target)} (the storage holds {list(leaf.shape)}). Nothing was written."
            )
