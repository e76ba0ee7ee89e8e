"""Torch-op implementations of the trajectory / slice computations of the slice samplers.

Every function here runs on any device with no host round trip unless stated, and gives
the same values, dtypes and row order as the corresponding step of torchrl 0.11's
``SliceSampler`` / ``PrioritizedSliceSampler`` (where torchrl's result is wrong, the
docstring says what we return instead). They are the CUDA path of
:mod:`torchrl_compat.samplers` and run on CPU tensors in the tests.
"""
from __future__ import annotations

import torch

from ._sampler_deps import _is_int

__all__ = [
    "end_to_start_stop",
    "excluded_start_positions",
    "excluded_tail",
    "find_start_stop_traj",
    "slices_from_starts",
    "stops_after_starts",
]


def find_start_stop_traj(
    *,
    trajectory: torch.Tensor | None = None,
    end: torch.Tensor | None = None,
    at_capacity: bool,
    cursor=None,
):
    """Start indices, stop indices and lengths of the trajectories in a storage.

    Same contract as torchrl's ``SliceSampler._find_start_stop_traj``: ``trajectory``
    (ids) or ``end`` (end-of-trajectory flags), shape ``[T]`` or ``[T, ...]``; when not
    ``at_capacity`` the last step ends every trajectory; at capacity the ``cursor`` (an
    int, a tensor or a range whose last element is the last written position) closes a
    trajectory, and a column without any end gets one at its last step.

    Returns:
        ``(start_idx, stop_idx, lengths)``: int64 tensors of shapes ``[M, ndim]``,
        ``[M, ndim]`` and ``[M]``, rows ordered as ``end.transpose(0, -1).nonzero()``.
    """
    if trajectory is not None:
        if trajectory.ndim == 0:
            raise RuntimeError(
                "Expected the end-of-trajectory signal to be at least 1-dimensional."
            )
        end = trajectory[:-1] != trajectory[1:]
        if at_capacity:
            last = trajectory[-1:] != trajectory[:1]
        else:
            last = torch.ones_like(end[:1]) if end.shape[0] else torch.ones_like(
                trajectory[:1], dtype=torch.bool
            )
        end = torch.cat([end, last], 0)
        length = trajectory.shape[0]
    else:
        if end.ndim == 0:
            raise RuntimeError(
                "Expected the end-of-trajectory signal to be at least 1-dimensional."
            )
        length = end.shape[0]
        if not at_capacity:
            # We presume that not done at the end means the trajectory spans the end and
            # the beginning of the storage: only a storage that is not full ends there.
            end = end.clone()
            end[length - 1] = True
    if at_capacity:
        if cursor is not None:
            if isinstance(cursor, torch.Tensor):
                cursor = cursor.reshape(-1)[-1].item()
            elif isinstance(cursor, range):
                cursor = cursor[-1]
            if not _is_int(cursor):
                raise RuntimeError("cursor should be an integer or a 1d tensor or a range.")
            end = end.clone()
            end[int(cursor)] = True
        no_end = ~end.any(0)
        if bool(no_end.any()):
            end = end.clone()
            end[-1] |= no_end
    return end_to_start_stop(end, length)


def end_to_start_stop(end: torch.Tensor, length: int):
    """``(start_idx, stop_idx, lengths)`` from end-of-trajectory flags (see above).

    Stops are the non-zero positions of ``end``, sorted by the trailing dimensions first
    (the order of ``end.transpose(0, -1).nonzero()``, which torchrl uses). Each start is
    the step after the previous stop of the same column; the first trajectory of a column
    starts after its last stop, wrapping around the time dimension. O(M) after the
    ``nonzero``.
    """
    coords = end.transpose(0, -1).nonzero()
    stop_idx = coords.clone()
    if coords.shape[1] > 1:
        stop_idx[:, 0] = coords[:, -1]
        stop_idx[:, -1] = coords[:, 0]
    num = stop_idx.shape[0]
    if num == 0:
        return stop_idx.clone(), stop_idx, stop_idx[:, 0].clone()
    device = stop_idx.device
    new_group = torch.ones(num, dtype=torch.bool, device=device)
    if stop_idx.shape[1] > 1:
        new_group[1:] = (stop_idx[1:, 1:] != stop_idx[:-1, 1:]).any(-1)
    else:
        new_group[1:] = False
    group_id = new_group.cumsum(0) - 1
    first_rows = new_group.nonzero().squeeze(-1)
    last_rows = torch.cat([first_rows[1:] - 1, first_rows.new_full((1,), num - 1)])
    previous = torch.arange(-1, num - 1, device=device)
    previous = torch.where(new_group, last_rows[group_id], previous)
    start_idx = stop_idx.clone()
    start_idx[:, 0] = (stop_idx[previous, 0] + 1) % end.shape[0]
    lengths = stop_idx[:, 0] - start_idx[:, 0] + 1
    lengths = torch.where(lengths <= 0, lengths + length, lengths)
    return start_idx, stop_idx, lengths


def slices_from_starts(seq_length, start: torch.Tensor, storage_length: int) -> torch.Tensor:
    """Every index of the slices ``start[k] + (0 .. seq_length[k] - 1)`` along dim 0.

    ``start`` is ``[N]`` or ``[N, ndim]``; ``seq_length`` an int or an ``[N]`` tensor.
    Returns ``[sum(seq_length), ndim]`` (``ndim = 1`` for a 1-D ``start``), of
    ``start``'s dtype, with dim 0 taken modulo ``storage_length``. One pass,
    vectorised (torchrl concatenates one tensor per slice when lengths differ).
    """
    start2d = start.unsqueeze(-1) if start.ndim == 1 else start
    num = start2d.shape[0]
    if isinstance(seq_length, int):
        offsets = torch.arange(seq_length, device=start.device, dtype=start.dtype)
        result = start2d.unsqueeze(1).expand(num, seq_length, start2d.shape[1]).clone()
        result[..., 0] += offsets
        result = result.flatten(0, 1)
    else:
        seq_length = seq_length.to(device=start.device)
        rows = torch.repeat_interleave(torch.arange(num, device=start.device), seq_length)
        first = torch.repeat_interleave(seq_length.cumsum(0) - seq_length, seq_length)
        offsets = torch.arange(rows.shape[0], device=start.device) - first
        result = start2d[rows].clone()
        result[:, 0] += offsets.to(start.dtype)
    result[:, 0] = result[:, 0] % storage_length
    return result


def excluded_tail(seq_length: int, span_right) -> int:
    """How many positions at the end of a trajectory cannot start a slice of ``seq_length``."""
    if isinstance(span_right, bool) and span_right:
        return 1
    return max(int(seq_length) - 1 - int(span_right), 0)


def excluded_start_positions(
    lengths: torch.Tensor, seq_length: int, span_right, strict_length: bool
) -> torch.Tensor:
    """Positions (in trajectory order) that cannot start a slice of ``seq_length``.

    The trajectories of ``lengths`` are laid end to end; in each, the last
    ``seq_length - 1 - span_right`` positions are excluded (only the last one when
    ``span_right is True``), except its first position when ``strict_length=False``
    (a short slice may then start there). Returns the sorted int64 positions. O(M + number
    of excluded positions) memory and time: torchrl builds a left-padded
    ``[M, max length]`` table.

    .. note:: torchrl excludes every position when ``seq_length - 1 - span_right`` is 0
        (e.g. ``slice_len=1``), which then fails with "non-positive p_sum"; here nothing is
        excluded then, as nothing needs to be.
    """
    tail = excluded_tail(seq_length, span_right)
    lengths = lengths.reshape(-1)
    if tail == 0 or not lengths.numel():
        return torch.zeros(0, dtype=torch.long, device=lengths.device)
    # Trajectory k excludes the `count[k]` positions just before its end: offsets
    # >= L - tail (and >= 1 without strict_length).
    limit = lengths if strict_length else (lengths - 1).clamp_min(0)
    count = limit.clamp_max(tail)
    ends = lengths.cumsum(0)
    first = torch.repeat_interleave(ends - count, count)
    within = torch.arange(first.shape[0], device=lengths.device) - torch.repeat_interleave(
        count.cumsum(0) - count, count
    )
    return first + within


def stops_after_starts(
    starts: torch.Tensor,
    start_idx: torch.Tensor,
    stop_idx: torch.Tensor,
    len_along_dim0: int,
) -> torch.Tensor:
    """For each slice start, the stop (dim-0 position) of the trajectory that holds it.

    ``starts`` is ``[N, ndim]``; ``start_idx`` / ``stop_idx`` are the ``[M, ndim]``
    trajectory tables of :func:`end_to_start_stop`. The stop of a trajectory that wraps
    around dim 0 is shifted by ``len_along_dim0``, so the result is never below the start
    and ``stop - start + 1`` is the room left in the trajectory. A binary search per
    start: O((M + N) log M) time, O(M + N) memory (torchrl builds an ``[M, N, ndim]``
    difference tensor).

    .. note:: For a start in the part of a wrapping trajectory that lies at the
        beginning of the storage, torchrl picks the first later stop of any trajectory
        (too far); the trajectory's own stop is returned here.
    """
    device = stop_idx.device
    starts = starts.to(device)
    if not starts.shape[0]:
        return starts[:, 0].clone()
    stop_t = stop_idx[:, 0]
    num_stops = stop_t.shape[0]
    if stop_idx.shape[1] > 1:
        # A linear id per column, increasing with the order of the rows of stop_idx
        # (trailing dimensions most significant).
        sizes = torch.maximum(stop_idx[:, 1:].amax(0), starts[:, 1:].amax(0)) + 1
        multipliers = torch.ones_like(sizes)
        for dim in range(sizes.shape[0] - 2, -1, -1):
            multipliers[dim] = multipliers[dim + 1] * sizes[dim + 1]
        stop_group = (stop_idx[:, 1:] * multipliers).sum(-1)
        start_group = (starts[:, 1:] * multipliers).sum(-1)
    else:
        stop_group = torch.zeros_like(stop_t)
        start_group = torch.zeros_like(starts[:, 0])
    span = 2 * int(len_along_dim0) + 2
    keys = stop_group * span + stop_t
    start_t = starts[:, 0]
    pos = torch.searchsorted(keys, start_group * span + start_t, side="left")
    pos_c = pos.clamp_max(num_stops - 1)
    same_group = (pos < num_stops) & (stop_group[pos_c] == start_group)
    first_of_group = torch.searchsorted(keys, start_group * span, side="left").clamp_max(
        num_stops - 1
    )
    # No later stop in the column: the start lies in the column's trajectory that wraps
    # around dim 0, whose stop is the column's first one, one turn later.
    return torch.where(same_group, stop_t[pos_c], stop_t[first_of_group] + len_along_dim0)
