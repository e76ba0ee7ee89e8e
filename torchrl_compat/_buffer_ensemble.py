"""Indexing an ensemble (of writers, samplers or storages) by torchrl's rules."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from torchrl_compat.utils import _ENSEMBLE_INDEX_ERROR, _ensemble_index

__all__ = ["select_members"]


def select_members(ensemble, index, members: Sequence, kind: str, make: Callable[[Sequence], object]):
    """``ensemble[index]``: the ensemble itself for ``:`` or ``...``, one member for an int,
    a new ensemble of the members selected (``make(members)``) for a slice, a list, a range,
    an array or a 1-D integer tensor.

    Args:
        ensemble: the ensemble indexed (named in error messages).
        index: the index; a tuple of one entry stands for that entry.
        members (sequence): the ensemble's members.
        kind (str): what the members are, for error messages (``"writers"``).
        make (callable): builds an ensemble of the given members.

    Raises:
        IndexError: for a tuple of more than one entry, a member out of range, or an
            index of another type; ``TypeError`` for a floating point tensor and
            ``RuntimeError`` for a tensor of more than one dimension (as torchrl).
    """
    if isinstance(index, tuple):
        if index[0] is Ellipsis:
            index = (slice(None), index[1:])
        result = select_members(ensemble, index[0], members, kind, make)
        if len(index) > 1:
            raise IndexError(
                f"Tuple of length greater than 1 are not accepted to index {kind} of type {type(ensemble)}."
            )
        return result
    single, selected = _ensemble_index(ensemble, index)
    if single is None and selected is None:
        return ensemble
    if single is not None:
        try:
            return members[single]
        except IndexError:
            raise IndexError(
                _ENSEMBLE_INDEX_ERROR.format(type(single)) + f" (index {single} for {len(members)} {kind})"
            ) from None
    if isinstance(selected, list):
        return make([members[i] for i in selected])
    return make(members[selected])
