"""Logical trajectory runs of a storage whose steps are interleaved (``fragmented=True``).

A ``SliceSampler`` with ``fragmented=True`` reads the trajectory id and the step number of
every stored item and samples slices along runs of consecutive steps of one trajectory,
wherever those steps lie in the storage. :func:`fragmented_runs` lists the runs, sorted by
(trajectory, step): the packing depends only on the stored values, so a given generator
state draws the same slices whatever the write history.
"""
from __future__ import annotations

import numpy as np
import torch
from tensordict import is_tensor_collection

__all__ = ["fragmented_runs"]


def _duplicate_error(trajectory_key, step_key, trajectory: int, step: int) -> RuntimeError:
    return RuntimeError(
        f"Found duplicate records for trajectory {trajectory!r} at step "
        f"{step} (traj_key={trajectory_key!r}, "
        f"step_key={step_key!r}). Trajectory-step pairs must be "
        "unique in the live storage. This commonly happens when "
        "trajectory ids are reused, e.g. a recreated collector restarts "
        "its traj_ids at 0 while episodes from a previous run are still "
        "stored. Use a trajectory key whose ids stay unique across the "
        "buffer lifetime, or empty the buffer before reusing ids."
    )


def _column(value, key, count: int) -> torch.Tensor:
    """``value`` as ``[count]`` int64 values, checked as torchrl checks them."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"key={key!r} must contain a tensor, got {type(value).__name__}.")
    value = value.reshape(count, -1)
    if value.shape[1] != 1:
        raise RuntimeError(f"Expected scalar values under key={key!r}, got shape {tuple(value.shape)}.")
    if value.dtype == torch.bool or torch.is_floating_point(value) or torch.is_complex(value):
        raise TypeError(f"key={key!r} must contain integer values, got dtype={value.dtype}.")
    return value[:, 0]


def _read_columns(storage, trajectory_key, step_key):
    """The trajectory ids and step numbers of the ``len(storage)`` filled rows."""
    count = len(storage)
    index = torch.arange(count, dtype=torch.long)
    trajectory = step = None
    try:
        source = storage[:]
    except Exception:
        source = None
    if is_tensor_collection(source):
        try:
            trajectory = source.get(trajectory_key, default=None)
            step = source.get(step_key, default=None)
        except Exception:
            trajectory = step = None
    if trajectory is not None and step is not None:
        trajectory, step = trajectory[index.to(trajectory.device)], step[index.to(step.device)]
    else:
        data = storage.get(index)
        if not is_tensor_collection(data):
            raise TypeError(
                "Fragmented trajectory indexing requires a single-dimensional "
                "storage whose slices return a tensor collection, such as "
                "LazyTensorStorage or LazyStackStorage."
            )
        trajectory, step = data.get(trajectory_key), data.get(step_key)
    trajectory = _column(trajectory, trajectory_key, count)
    step = _column(step, step_key, count)
    return trajectory, step


def fragmented_runs(storage, trajectory_key, step_key):
    """The runs of consecutive steps of each trajectory in ``storage``.

    Args:
        storage (Storage): a 1-D storage holding tensordicts.
        trajectory_key (NestedKey): the key of the integer trajectory ids.
        step_key (NestedKey): the key of the non-negative integer step numbers.

    Returns:
        ``(ordered_slots, run_offsets, run_lengths)``: the storage rows sorted by
        (trajectory, step), where each run starts in that order, and each run's length
        (int64 tensors on the step column's device).

    Raises:
        NotImplementedError: for a storage with more than one dimension.
        TypeError: for a column that is not an integer tensor.
        RuntimeError: for a column with more than one value per row, or a (trajectory,
            step) pair stored twice (the first repeat, in storage order, is named).
        ValueError: for a negative step (the first, in storage order).
        KeyError: for a missing key.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyTensorStorage
        >>> storage = LazyTensorStorage(6)
        >>> data = TensorDict({"traj": torch.tensor([0, 1, 0, 1, 0, 0]),
        ...                    "step": torch.tensor([0, 0, 1, 1, 2, 4])}, [6])
        >>> storage.set(torch.arange(6), data)
        >>> slots, offsets, lengths = fragmented_runs(storage, "traj", "step")
        >>> slots.tolist(), offsets.tolist(), lengths.tolist()
        ([0, 2, 4, 5, 1, 3], [0, 3, 4], [3, 1, 2])
    """
    if storage.ndim > 1:
        raise NotImplementedError(
            "Fragmented trajectory indexing only supports single-dimensional "
            f"storages, got storage.ndim={storage.ndim}."
        )
    trajectory, step = _read_columns(storage, trajectory_key, step_key)
    device = step.device
    traj = trajectory.detach().to("cpu", torch.long).numpy()
    steps = step.detach().to("cpu", torch.long).numpy()
    # Stable sort by (trajectory, step): equal pairs keep their storage order.
    order = np.lexsort((steps, traj))
    sorted_traj, sorted_step = traj[order], steps[order]
    negative = np.flatnonzero(steps < 0)
    same = (sorted_traj[1:] == sorted_traj[:-1]) & (sorted_step[1:] == sorted_step[:-1])
    repeats = order[1:][same]
    # torchrl reads the rows in storage order and raises at the first bad one.
    first_negative = int(negative[0]) if negative.size else None
    first_repeat = int(repeats.min()) if repeats.size else None
    if first_negative is not None and (first_repeat is None or first_negative < first_repeat):
        raise ValueError(
            f"Step numbers must be non-negative, got {int(steps[first_negative])} under "
            f"step_key={step_key!r}."
        )
    if first_repeat is not None:
        raise _duplicate_error(trajectory_key, step_key, int(traj[first_repeat]), int(steps[first_repeat]))
    new_run = np.ones(order.size, dtype=bool)
    new_run[1:] = (sorted_traj[1:] != sorted_traj[:-1]) | (sorted_step[1:] != sorted_step[:-1] + 1)
    offsets = np.flatnonzero(new_run)
    lengths = np.diff(np.append(offsets, order.size))
    return tuple(
        torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).to(device)
        for array in (order, offsets, lengths)
    )
