"""What every ensemble (of storages, samplers, writers or replay buffers) does alike: index its
members by torchrl's rules, and hand its generator on to them."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

__all__ = ["INDEX_ERROR", "members_rng", "pick", "select_members"]

# torchrl's message (each ensemble class holds it as ``_INDEX_ERROR``, as torchrl's do).
INDEX_ERROR = (
    "Expected an index of type torch.Tensor, range, np.ndarray, int, slice or ellipsis, got {} instead."
)


def members_rng(members: str) -> property:
    """The ``_rng`` property of an ensemble: a generator set on the ensemble is set on each of
    its members (the sequence held in the attribute named ``members``) too."""

    def get(self):
        return self._rng_private

    def set(self, value):
        self._rng_private = value
        for member in getattr(self, members):
            member._rng = value

    return property(get, set)


def pick(sequence: Sequence, selection):
    """The entries of ``sequence`` at ``selection``: a list of positions, or a slice."""
    if isinstance(selection, list):
        return [sequence[i] for i in selection]
    return sequence[selection]


def _normalised(ensemble, index):
    """``(None, None)`` for ``slice(None)`` (the whole ensemble), ``(int, None)`` for one
    member, or ``(None, selection)`` where ``selection`` is a list of ints or a slice, with
    torchrl's rules and errors."""
    if isinstance(index, slice) and index == slice(None):
        return None, None
    if isinstance(index, (list, range, np.ndarray)):
        index = torch.as_tensor(index)
    if isinstance(index, torch.Tensor):
        if index.ndim > 1:
            raise RuntimeError(
                f"Cannot index a {type(ensemble)} with tensor indices that have more than one dimension."
            )
        if index.is_floating_point():
            raise TypeError(
                "A floating point index was received when an integer dtype was expected."
            )
    if isinstance(index, int) or (not isinstance(index, slice) and len(index) == 0):
        try:
            return int(index), None
        except Exception:
            raise IndexError(ensemble._INDEX_ERROR.format(type(index))) from None
    if isinstance(index, torch.Tensor):
        return None, index.tolist()
    return None, index


def select_members(
    ensemble,
    index,
    members: Sequence | None,
    make: Callable,
    *,
    kind: str,
    index_each: Callable | None = None,
    ensemble_class: type | None = None,
):
    """``ensemble[index]`` by torchrl's rules: the ensemble itself for ``:`` or ``...``, one
    member for an int, and ``make(selection)`` for a slice, a list, a range, an array or a
    1-D integer tensor.

    Args:
        ensemble: the ensemble indexed (its ``_INDEX_ERROR`` and type name the errors).
        index: the index. In a tuple, the first entry selects as above; what follows it
            is refused unless ``index_each`` is given.
        members (sequence or None): the members. ``None``: ``make`` builds the result
            for a single member too (it is given the int).
        make (callable): builds the ensemble of the members at ``selection`` (a list of
            positions or a slice, see :func:`pick`).

    Keyword Args:
        kind (str): what the members are, for error messages (``"writers"``).
        index_each (callable, optional): for ``ensemble[:, *rest]``, given ``rest``: the
            members' items. With it, a tuple index goes on into what its first entry
            selects, as torchrl's storage and buffer ensembles do: an
            ``ensemble_class`` is indexed with ``(slice(None), *rest)``, anything else
            with ``rest``.
        ensemble_class (type, optional): the ensemble class, with ``index_each``.

    Raises:
        IndexError: for a member out of range, an index of another type, or (without
            ``index_each``) a tuple of more than one entry; ``TypeError`` for a floating
            point tensor and ``RuntimeError`` for a tensor of more than one dimension (as
            torchrl).
    """
    if isinstance(index, tuple):
        if index[0] is Ellipsis:
            index = (slice(None), index[1:])
        first, rest = index[0], index[1:]
        result = select_members(
            ensemble, first, members, make, kind=kind, index_each=index_each, ensemble_class=ensemble_class
        )
        if not rest:
            return result
        if index_each is None:
            raise IndexError(
                f"Tuple of length greater than 1 are not accepted to index {kind} of type {type(ensemble)}."
            )
        if result is ensemble:
            return index_each(rest)
        if isinstance(result, ensemble_class):
            return result[(slice(None), *rest)]
        return result[rest]
    single, selection = _normalised(ensemble, index)
    if single is None and selection is None:
        return ensemble
    if single is None:
        return make(selection)
    if members is None:
        return make(single)
    try:
        return members[single]
    except IndexError:
        raise IndexError(
            ensemble._INDEX_ERROR.format(type(single)) + f" (index {single} for {len(members)} {kind})"
        ) from None
