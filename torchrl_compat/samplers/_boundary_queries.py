"""torchrl 0.14's trajectory-boundary queries (``_boundary_distances_1d``,
``_boundary_distances_nd``, ``_make_boundary_search_nd`` of
``torchrl.data.replay_buffers.utils``) on ``replay``'s kernels, with torchrl's signatures and
outputs (int64 tensors on the anchors' device, the same values).

:func:`~torchrl_compat.install` puts them in torchrl's ``utils`` module (torchrl 0.14), where
its ``_ReplayBoundaryIndex`` calls them. Our ``Sequence`` does not need them: it reads the end
flags around its anchors directly (:func:`replay.sequence_windows`).

Under ``torch.compile`` and for tensors on another device than the CPU, the queries run as torch
operations with the same results (``_torch_distances``), which the compiler traces in one graph
(torchrl compiles them with ``fullgraph=True``).
"""
from __future__ import annotations

import math

import numpy as np
import torch

import replay
from torchrl_compat._compile import is_compiling

__all__ = ["BOUNDARY_QUERIES", "_boundary_distances_1d", "_boundary_distances_nd", "_make_boundary_search_nd"]


def _on_host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.device.type == "cpu" else tensor.cpu()


def _torch_distances(anchor_time, start_time, stop_time, keys, search_key, trajectory_of, length):
    """The queries as torch operations: the first key at or past each anchor's search key
    (``torch.searchsorted``), its trajectory (``trajectory_of``, the position itself when
    ``None``, wrapping to the first past the last), and the distances modulo ``length``."""
    position = torch.searchsorted(keys, search_key)
    if trajectory_of is None:
        trajectory = torch.where(position == keys.shape[0], torch.zeros_like(position), position)
    else:
        trajectory = trajectory_of[position]
    from_start = torch.remainder(anchor_time - start_time[trajectory], length)
    to_stop = torch.remainder(stop_time[trajectory] - anchor_time, length)
    return from_start.to(torch.long), to_stop.to(torch.long)


def _boundary_distances_1d(
    anchor: torch.Tensor,
    start: torch.Tensor,
    stop: torch.Tensor,
    length: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Distances of each anchor to the first and last rows of its trajectory, modulo ``length``
    (torchrl 0.14's searchsorted query, one C pass: :func:`replay.boundary_distances`).
    """
    if is_compiling() or anchor.device.type != "cpu":
        return _torch_distances(anchor, start, stop, stop, anchor, None, length)
    return replay.boundary_distances(anchor, start, stop, int(length))


def _boundary_distances_nd(
    anchor: torch.Tensor,
    start: torch.Tensor,
    stop: torch.Tensor,
    stop_key: torch.Tensor,
    boundary_index: torch.Tensor,
    lane_stride: torch.Tensor,
    length: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The lane-aware :func:`_boundary_distances_1d` for multidimensional storages, over the
    search keys of :func:`_make_boundary_search_nd` (:func:`replay.boundary_distances_nd`)."""
    if is_compiling() or anchor.device.type != "cpu":
        lane = (anchor[:, 1:] * lane_stride).sum(-1)
        search_key = lane * (2 * length) + anchor[:, 0]
        return _torch_distances(anchor[:, 0], start[:, 0], stop[:, 0], stop_key, search_key, boundary_index, length)
    return replay.boundary_distances_nd(anchor, start, stop, stop_key, boundary_index, lane_stride, int(length))


def _make_boundary_search_nd(
    start: torch.Tensor,
    stop: torch.Tensor,
    storage_shape: tuple[int, ...],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The search keys of :func:`_boundary_distances_nd`: ``(stop_key, boundary_index,
    lane_stride)``. Each stop ``(t, *lane)`` gets the key ``lane * 2 * T + t`` (``lane``
    flattened row-major, ``T = storage_shape[0]``), and each lane a sentinel ``T`` past its
    first stop's key, which leads an anchor past the lane's last stop back to its first
    trajectory (the one that wraps). Keys are sorted; ``boundary_index`` is each key's
    trajectory. O(m log m) in numpy, for ``m`` stops (a key is unique: a sort is enough).
    """
    lane_shape = tuple(storage_shape[1:])
    strides = [math.prod(lane_shape[j + 1:]) for j in range(len(lane_shape))]
    lane_stride = torch.tensor(strides, dtype=torch.long, device=stop.device)
    stops = _on_host(stop).numpy().astype(np.int64, copy=False)
    time_length = int(storage_shape[0])
    lane = stops[:, 1:] @ np.asarray(strides, dtype=np.int64) if strides else np.zeros(len(stops), np.int64)
    keys = lane * (2 * time_length) + stops[:, 0]
    order = np.argsort(keys, kind="stable")
    sorted_keys, sorted_lane = keys[order], lane[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_lane[1:] != sorted_lane[:-1]
    all_keys = np.concatenate([sorted_keys, sorted_keys[first] + time_length])
    all_index = np.concatenate([order, order[first]])
    ordered = np.argsort(all_keys, kind="stable")
    device = stop.device
    return (
        torch.from_numpy(all_keys[ordered]).to(device),
        torch.from_numpy(all_index[ordered]).to(device),
        lane_stride,
    )


# name -> ours, for install()
BOUNDARY_QUERIES = {
    "_boundary_distances_1d": _boundary_distances_1d,
    "_boundary_distances_nd": _boundary_distances_nd,
    "_make_boundary_search_nd": _make_boundary_search_nd,
}
