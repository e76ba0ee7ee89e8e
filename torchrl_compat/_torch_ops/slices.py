"""Torch-op implementations of the trajectory and slice computations of the slice samplers.

These run where the signal lives (the accelerator path of :class:`SliceSampler` and
:class:`PrioritizedSliceSampler`) and give the same values, dtypes, row order and errors as
``replay``'s kernels (``replay.find_start_stop_traj``, ``replay.slice_indices``,
``replay.excluded_starts``) and as the corresponding steps of torchrl 0.11's samplers (where
torchrl's result is wrong, the docstring says what is returned instead). They also run on CPU
tensors, where the tests compare them with ``replay``. Their only host synchronisation is the
one a data-dependent output size needs (``nonzero`` for the trajectories, the total length for
per-slice lengths) unless stated.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

_CURSOR_ERROR = "cursor should be an integer or a 1d tensor or a range."
_SIGNAL_NDIM_ERROR = "Expected the end-of-trajectory signal to be at least 1-dimensional."


class _SignalDimError(IndexError, RuntimeError):
    """A 0-dim end-of-trajectory signal.

    torchrl's ``_find_start_stop_traj`` means to raise a RuntimeError here but reaches an
    IndexError first (``end.shape[0]``), so this error is both.
    """


def _is_int_cursor(cursor) -> bool:
    # torchrl's ``_is_int``: Python / numpy integers (bool included) or 0-dim arrays.
    if isinstance(cursor, (int, np.integer)):
        return True
    if isinstance(cursor, (np.ndarray, torch.Tensor)):
        return cursor.ndim == 0
    return False


def _mark_cursor(end: torch.Tensor, cursor) -> None:
    """Sets the cursor row of ``end`` (owned, modified in place) to ``True``."""
    if isinstance(cursor, torch.Tensor):
        last = cursor[-1]
        if last.device.type != "cpu" and last.numel() == 1 and not (
            last.is_floating_point() or last.is_complex()
        ):
            # A device cursor stays on its device: no host round trip. An out-of-range
            # value is then a device-side error instead of an IndexError.
            index = last.reshape(1).to(device=end.device, dtype=torch.long)
            end.index_fill_(0, index, True)
            return
        # A host cursor is read from its memory (no torch op, nothing to wait for).
        cursor = last.numpy().item() if last.device.type == "cpu" and last.numel() == 1 else last.item()
    elif isinstance(cursor, range):
        cursor = cursor[-1]
    if not _is_int_cursor(cursor):
        raise RuntimeError(_CURSOR_ERROR)
    # Basic indexing wraps negative rows and raises torchrl's IndexError for the others.
    end[int(cursor)] = True


def _empty_result(ndim: int, device):
    empty = torch.empty((0, ndim), dtype=torch.long, device=device)
    return empty, empty.clone(), torch.empty((0,), dtype=torch.long, device=device)


__all__ = [
    "end_to_start_stop",
    "excluded_start_positions",
    "draw_slices",
    "excluded_tail",
    "end_flags",
    "find_start_stop_traj",
    "sample_slices_from_ends",
    "slice_indices",
    "slice_start_table",
    "stops_after_starts",
]


def find_start_stop_traj(*, trajectory=None, end=None, at_capacity, cursor=None):
    """Start, stop and length of every trajectory, with torch ops on the signal's device.

    Same arguments, results and errors as ``replay.find_start_stop_traj`` (and torchrl's
    ``SliceSampler._find_start_stop_traj``).

    Keyword Args:
        trajectory (torch.Tensor, optional): trajectory ids of shape ``[T, ...]``. Takes
            precedence over ``end``.
        end (torch.Tensor, optional): end-of-trajectory signal of shape ``[T, ...]``.
        at_capacity (bool): whether the storage is full.
        cursor (int, torch.Tensor or range, optional): the last written position of a full
            storage. Ignored when ``at_capacity`` is ``False``.

    Returns:
        a tuple ``(start_idx, stop_idx, lengths)`` of int64 tensors on the signal's device.

    Examples:
        >>> import torch
        >>> end = torch.tensor([False, True, False, False, True, False])
        >>> start, stop, lengths = find_start_stop_traj(end=end, at_capacity=True)
        >>> start.flatten().tolist(), stop.flatten().tolist(), lengths.tolist()
        ([5, 2], [1, 4], [3, 3])

    .. note:: torchrl synchronises with the host for the cursor (``.item()``), for the
        "is there a column without an end" test and for its boolean-mask shifts; here only
        ``nonzero`` does (and ``.item()`` of a CPU cursor, which costs no device sync).
    """
    flags = end_flags(trajectory=trajectory, end=end, at_capacity=at_capacity, cursor=cursor)
    return end_to_start_stop(flags, flags.shape[0])


def end_flags(*, trajectory=None, end=None, at_capacity, cursor=None) -> torch.Tensor:
    """The end-of-trajectory table :func:`find_start_stop_traj` reads its trajectories from
    (same arguments): a bool ``[T, ...]`` tensor, ``True`` at the last step of every
    trajectory, with the ends torchrl adds (the cursor of a full storage, the last row). No
    host synchronisation for a device signal and cursor. O(T * columns)."""
    from_ids = trajectory is not None
    signal = trajectory if from_ids else end
    if signal is None:
        raise TypeError("find_start_stop_traj() needs one of trajectory or end")
    if signal.ndim == 0:
        raise _SignalDimError(_SIGNAL_NDIM_ERROR)
    full = bool(at_capacity)
    length = signal.shape[0]

    if from_ids:
        flags = signal[:-1] != signal[1:]
        if full:
            last = signal[-1:] != signal[:1]
        else:
            # As torchrl: empty for a single step, which then holds no trajectory.
            last = torch.ones_like(flags[:1])
        flags = torch.cat([flags, last], 0)
    else:
        if length == 0 and not full:
            raise IndexError("index -1 is out of bounds for dimension 0 with size 0")
        flags = signal.clone() if signal.dtype == torch.bool else signal != 0
        if not full:
            flags[length - 1] = True
    if full:
        if cursor is not None:
            _mark_cursor(flags, cursor)
        if flags.shape[0]:
            # A column without any end holds one trajectory ending at the last row. Done
            # unconditionally: testing first would cost a host sync.
            flags[-1] |= ~flags.any(0)
    return flags


def sample_slices_from_ends(
    end: torch.Tensor,
    seq_length: int,
    traj_uniform: torch.Tensor,
    start_uniform: torch.Tensor,
):
    """Slices of ``seq_length`` steps drawn from a 1-D end-of-trajectory table, with no host
    synchronisation (every shape is known on the host).

    A trajectory is drawn uniformly among those at least ``seq_length`` long (rank
    ``floor(traj_uniform * count)`` in the order of :func:`end_to_start_stop`, the one that
    wraps around the storage first), then a start uniformly among its positions that leave
    room for the slice (``floor(start_uniform * (length - seq_length + 1))``): the draws of
    ``SliceSampler`` with ``strict_length=True`` and no span, given the same trajectory ranks.

    Args:
        end (torch.Tensor): bool ``[T]`` table from :func:`end_flags` (every trajectory
            closed), on the device the slices are drawn on.
        seq_length (int): the length of every slice (at least 1).
        traj_uniform (torch.Tensor): ``[num_slices]`` draws in ``[0, 1)``, one per slice.
        start_uniform (torch.Tensor): ``[num_slices]`` draws in ``[0, 1)``, one per slice.

    Returns:
        ``(index, traj_rank, found)``: the int64 ``[num_slices * seq_length]`` storage
        positions, slice after slice; the rank of each slice's trajectory among the long
        enough ones; and a 0-d bool tensor, ``False`` when no trajectory is long enough
        (the other results are then meaningless: the caller raises from it, when it can read
        it without waiting).

    O(T) for the table's running counts and O(num_slices * (log T + seq_length)) for the
    draws, in about 25 kernels: the trajectories are never listed (listing them needs
    ``nonzero``, whose output size only the device knows).
    """
    table = slice_start_table(end, seq_length)
    return draw_slices(table, traj_uniform, start_uniform)


def slice_start_table(end: torch.Tensor, seq_length: int):
    """What :func:`sample_slices_from_ends` reads its draws from, before any draw: a tuple
    ``(start, length, running, count, seq_length)`` where ``count`` (a 0-d int64 tensor) is
    the number of trajectories at least ``seq_length`` long (a caller that reads the device
    for free, on CPU, can refuse a draw from it before taking random numbers). O(T), no host
    synchronisation."""
    if end.ndim != 1:
        raise ValueError(f"end must be a 1-D table, got shape {tuple(end.shape)}")
    seq_length = int(seq_length)
    if seq_length < 1:
        raise ValueError(f"seq_length must be at least 1, got seq_length={seq_length}")
    flags = end if end.dtype == torch.bool else end != 0
    steps = flags.shape[0]
    device = flags.device
    positions = torch.arange(steps, device=device)
    # The last end at or before each step, then strictly before it (-1: none).
    last_end = torch.cummax(torch.where(flags, positions, -1), 0).values
    previous_end = F.pad(last_end[:-1], (1, 0), value=-1)
    # Each end's trajectory starts after the previous end; the first one after the table's
    # last end, one turn earlier (it wraps around the storage).
    start = torch.where(previous_end >= 0, previous_end, last_end[-1] - steps) + 1
    length = positions - start + 1
    eligible = flags & (length >= seq_length)
    running = eligible.long().cumsum(0)
    return start, length, running, running[-1], seq_length


def draw_slices(table, traj_draw: torch.Tensor, start_uniform: torch.Tensor):
    """The slices of :func:`sample_slices_from_ends` drawn from a :func:`slice_start_table`:
    ``(index, traj_rank, found)``. No host synchronisation.

    ``traj_draw`` is either floating draws in ``[0, 1)`` (rank ``floor(u * count)``) or the
    int64 ranks themselves (``torch.randint(count)``, torchrl's draw, for a caller that knows
    ``count``). The start is ``floor(u * room)`` in ``start_uniform``'s dtype, as torchrl
    computes it."""
    start, length, running, count, seq_length = table
    steps = start.shape[0]
    device = start.device
    if traj_draw.is_floating_point():
        rank = (traj_draw.double() * count).floor().long()
    else:
        rank = traj_draw.long()
    rank = torch.minimum(rank, (count - 1).clamp_min(0))
    stop = torch.searchsorted(running, rank + 1).clamp_max(steps - 1)
    room = length[stop] - seq_length + 1
    offset = torch.minimum((start_uniform * room).floor().long(), room - 1)
    first = start[stop] + offset
    index = (first.unsqueeze(1) + torch.arange(seq_length, device=device)).remainder(steps)
    return index.reshape(-1), rank, count > 0


def end_to_start_stop(end: torch.Tensor, length: int):
    """``(start_idx, stop_idx, lengths)`` of the trajectories an end-of-trajectory table closes.

    Stops are the non-zero positions of ``end`` (``[T, ...]``), in the order of torchrl's
    ``end.transpose(0, -1).nonzero()`` (trailing dimensions slowest); each start is the step
    after the previous stop of its column, the first trajectory of a column starting after the
    column's last stop (wrapping around the time dimension). A column without any end holds
    no trajectory. Same results as torchrl's ``SliceSampler._end_to_start_stop``, with one
    ``nonzero``. O(T * columns).
    """
    flags = end if end.dtype == torch.bool else end != 0
    ndim = flags.ndim
    device = flags.device
    if flags.shape[0] == 0 or flags.numel() == 0:
        return _empty_result(ndim, device)

    rows = flags.shape[0]
    groups = math.prod(flags.shape[1:])
    if ndim >= 3:
        # The column order of torchrl's ``end.transpose(0, -1).nonzero()``: last dim slowest.
        flags = flags.permute(0, ndim - 1, *range(1, ndim - 1))
    group_shape = flags.shape[1:]
    group, stop_t = flags.reshape(rows, groups).t().nonzero().unbind(1)

    # The first trajectory of a group starts after its last end, the others one step after
    # the previous end (a group without an end has no row here).
    first = torch.ones_like(group, dtype=torch.bool)
    first[1:] = group[1:] != group[:-1]
    last_stop = torch.full((groups,), -1, dtype=torch.long, device=device)
    last_stop.scatter_reduce_(0, group, stop_t, reduce="amax")
    previous = torch.where(first, last_stop[group], stop_t.roll(1))
    start_t = previous + 1
    start_t = torch.where(start_t == rows, torch.zeros_like(start_t), start_t)
    lengths = stop_t - start_t + 1
    lengths = torch.where(lengths <= 0, lengths + length, lengths)

    if ndim == 1:
        coords = []
    elif ndim == 2:
        coords = [group]
    else:
        unravelled = torch.unravel_index(group, tuple(group_shape))
        coords = list(unravelled[1:]) + [unravelled[0]]
    stop_idx = torch.stack([stop_t, *coords], 1)
    start_idx = torch.stack([start_t, *coords], 1)
    return start_idx, stop_idx, lengths


def slice_indices(start, seq_length, storage_length):
    """Storage indices of slices given their starts and lengths, with torch ops.

    Same arguments and results as ``replay.slice_indices`` (torchrl's
    ``SliceSampler._tensor_slices_from_startend``).

    Args:
        start (torch.Tensor): ``[num_slices, ndim]`` (or ``[num_slices]``) integer starts.
        seq_length (int or torch.Tensor): the length of every slice, or ``[num_slices]``
            per-slice lengths.
        storage_length (int): the length of the storage's time dimension.

    Returns:
        an int64 ``[total_length, ndim]`` tensor on ``start``'s device.

    Examples:
        >>> import torch
        >>> slice_indices(torch.tensor([[3, 0], [0, 1]]), 2, 4).tolist()
        [[3, 0], [0, 0], [0, 1], [1, 1]]
    """
    if start.is_floating_point() or start.is_complex() or start.dtype == torch.bool:
        raise TypeError(f"start must hold integers, got a tensor of dtype {start.dtype}")
    if start.ndim == 1:
        start = start.unsqueeze(-1)
    elif start.ndim != 2:
        raise ValueError(f"start must have shape [num_slices, ndim], got shape {tuple(start.shape)}")
    start = start.to(torch.long)
    if isinstance(storage_length, (torch.Tensor, np.ndarray)):
        storage_length = storage_length.item()
    if storage_length < 1:
        raise ValueError(f"storage_length must be at least 1, got storage_length={storage_length}")
    num_slices = start.shape[0]
    if isinstance(seq_length, (int, np.integer)) or (
        isinstance(seq_length, (torch.Tensor, np.ndarray)) and seq_length.ndim == 0
    ):
        steps = int(seq_length)
        if steps < 0:
            raise ValueError(f"seq_length must be non-negative, got seq_length={steps}")
        offset = torch.arange(steps, device=start.device)
        result = start.unsqueeze(1).repeat(1, steps, 1)
        result[..., 0] += offset
        result = result.flatten(0, 1)
    else:
        seq_length = torch.as_tensor(seq_length, device=start.device)
        if seq_length.is_floating_point() or seq_length.is_complex() or seq_length.dtype == torch.bool:
            raise TypeError(
                f"seq_length must hold integers, got an array of dtype {seq_length.dtype}"
            )
        if tuple(seq_length.shape) != (num_slices,):
            raise ValueError(
                f"seq_length must have shape ({num_slices},) to match start of shape "
                f"{tuple(start.shape)}, got shape {tuple(seq_length.shape)}"
            )
        seq_length = seq_length.to(torch.long)
        negative = (seq_length < 0).nonzero()
        if negative.numel():
            bad = int(negative[0, 0])
            raise ValueError(
                f"seq_length must be non-negative, got {int(seq_length[bad])} at position {bad}"
            )
        total = int(seq_length.sum())
        slice_of_row = torch.repeat_interleave(
            torch.arange(num_slices, device=start.device), seq_length, output_size=total
        )
        first_row = seq_length.cumsum(0) - seq_length
        offset = torch.arange(total, device=start.device) - first_row[slice_of_row]
        result = start[slice_of_row]
        result[:, 0] += offset
    result[:, 0] %= storage_length
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
