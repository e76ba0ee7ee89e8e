# cython: language_level=3
"""Replay-buffer kernels: segment trees, trajectory slice starts and permutations.

``replay`` is built against numpy only: torch is imported lazily and met only at the Python
edge, where CPU tensors become zero-copy numpy views and results go back as tensors on the
caller's device. One build therefore serves every torch release.
"""
import sys
import threading

import numpy as np

from libc.stdint cimport int64_t, uint64_t, uint32_t

INT64_MAX = 9223372036854775807

# =====================================================================================
# Torch / numpy edge
# =====================================================================================

cdef inline bint _is_tensor(object x):
    """True for a torch.Tensor; never imports torch (an unimported torch made no tensor)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


cdef object _tensor_to_numpy(object tensor):
    """A numpy view of a CPU tensor (a host copy for other devices)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    return tensor.resolve_conj().resolve_neg().numpy()


cdef object _numpy_to_like(object array, object like):
    """``array`` as a torch tensor on ``like``'s device when ``like`` is a tensor."""
    if _is_tensor(like):
        torch = sys.modules["torch"]
        out = torch.from_numpy(array)
        if like.device.type != "cpu":
            out = out.to(like.device)
        return out
    return array


cdef object _as_array(object x):
    if _is_tensor(x):
        return _tensor_to_numpy(x)
    return np.asarray(x)


cdef object _as_index_array(object x, str name):
    """``x`` as a C-contiguous 1-D int64 array (its original shape is ``np.shape`` of the input).

    Refuses float, bool and complex dtypes with TypeError instead of casting them, and
    unsigned values past int64 with IndexError, before narrowing.
    """
    arr = _as_array(x)
    kind = arr.dtype.kind
    if kind not in "iu":
        raise TypeError(f"{name} must hold integers, got an array of dtype {arr.dtype}")
    if kind == "u" and arr.dtype.itemsize == 8 and arr.size and arr.max() > INT64_MAX:
        raise IndexError(f"{name} value {int(arr.max())} does not fit in int64")
    return np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)


cdef object _as_value_array(object x, object dtype, str name):
    """``x`` as a C-contiguous 1-D array of ``dtype`` (any real dtype is cast)."""
    arr = _as_array(x)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got an array of dtype {arr.dtype}")
    return np.ascontiguousarray(arr.reshape(-1), dtype=dtype)


# =====================================================================================
# Segment trees
# =====================================================================================
# (segment-tree section)


# =====================================================================================
# Slices
# =====================================================================================
# (slice section)
import operator

from libc.stdint cimport uint8_t

_CURSOR_ERROR = "cursor should be an integer or a 1d tensor or a range."
_SIGNAL_NDIM_ERROR = "Expected the end-of-trajectory signal to be at least 1-dimensional."


class _SignalDimError(IndexError, RuntimeError):
    """A 0-dim end-of-trajectory signal.

    torchrl's ``_find_start_stop_traj`` means to raise a RuntimeError here but reaches an
    IndexError first (``end.shape[0]``), so this error is both.
    """


cdef object _signal_to_numpy(object signal):
    """A numpy view (or host copy) of an end signal or of trajectory ids."""
    if not _is_tensor(signal):
        return np.asarray(signal)
    try:
        return _tensor_to_numpy(signal)
    except TypeError:
        # bfloat16, float8 or complex32 have no numpy dtype; widening keeps (in)equalities.
        torch = sys.modules["torch"]
        if signal.is_complex():
            return _tensor_to_numpy(signal.to(torch.complex128))
        if signal.is_floating_point():
            return _tensor_to_numpy(signal.to(torch.float64))
        raise


cdef bint _is_int_cursor(object cursor):
    # torchrl's ``_is_int``: Python / numpy integers (bool included) or 0-dim arrays.
    if isinstance(cursor, (int, np.integer)):
        return True
    if isinstance(cursor, np.ndarray) or _is_tensor(cursor):
        return cursor.ndim == 0
    return False


cdef int64_t _cursor_row(object cursor, int64_t length) except -2:
    """The row the cursor forces to be an end, in ``[0, length)``, following torchrl's rules."""
    # operator.getitem: Cython's compiled ``x[-1]`` skips wrap-around under wraparound=False.
    if _is_tensor(cursor):
        cursor = operator.getitem(cursor, -1).item()
    elif isinstance(cursor, range):
        cursor = operator.getitem(cursor, -1)
    if not _is_int_cursor(cursor):
        raise RuntimeError(_CURSOR_ERROR)
    row = int(cursor)
    if not -length <= row < length:
        raise IndexError(f"index {row} is out of bounds for dimension 0 with size {length}")
    return row % length if row < 0 else row


cdef object _group_major(object arr):
    """``arr`` ([T, D1, ..., Dk]) as a C-contiguous [T, G] array whose columns follow the
    order of ``end.transpose(0, -1).nonzero()``: Dk slowest, then D1, ..., D(k-1)."""
    cdef Py_ssize_t nd = arr.ndim
    if nd >= 3:
        arr = arr.transpose((0, nd - 1) + tuple(range(1, nd - 1)))
    arr = np.ascontiguousarray(arr)
    return arr.reshape(arr.shape[0], -1)


cdef object _group_coordinates(tuple shape):
    """[G, ndim - 1] coordinates (D1, ..., Dk order) of the groups of ``_group_major``."""
    cdef Py_ssize_t nd = len(shape)
    tshape = (shape[nd - 1],) + tuple(shape[1 : nd - 1])
    coords = np.indices(tshape, dtype=np.int64).reshape(nd - 1, -1).T
    return np.ascontiguousarray(coords[:, list(range(1, nd - 1)) + [0]])


cdef object _end_flags(object arr, bint from_ids, bint at_capacity):
    """The [T, G] uint8 end signal of an end signal or of trajectory ids (T >= 1, G >= 1)."""
    cdef const int64_t[:, ::1] ids
    cdef uint8_t[:, ::1] out
    cdef int64_t bad = 0
    cdef int rc
    kind = arr.dtype.kind
    if not from_ids:
        if kind == "b":
            return _group_major(arr).view(np.uint8)
        return _group_major(arr != 0).view(np.uint8)
    if kind not in "iub":
        # Floats and complex: compare in numpy (NaN never equals itself, as in torch).
        arr = _group_major(arr)
        flags = np.empty(arr.shape, dtype=bool)
        np.not_equal(arr[:-1], arr[1:], out=flags[:-1])
        if at_capacity:
            np.not_equal(arr[-1], arr[0], out=flags[-1])
        else:
            flags[-1] = True
        return flags.view(np.uint8)
    if kind == "u" and arr.dtype.itemsize == 8:
        arr = arr.view(np.int64)  # a bijection, so (in)equalities are kept
    ids = np.ascontiguousarray(_group_major(arr), dtype=np.int64)
    flags = np.empty((ids.shape[0], ids.shape[1]), dtype=np.uint8)
    out = flags
    with nogil:
        rc = rp_slice_ends_from_ids(&ids[0, 0], ids.shape[0], ids.shape[1], at_capacity,
                                    &out[0, 0], &bad)
    if rc != RP_OK:
        raise ValueError(f"trajectory ids of shape {tuple(arr.shape)} are empty")
    return flags


def find_start_stop_traj(*, trajectory=None, end=None, at_capacity, cursor=None):
    """Start, stop and length of every trajectory of an end signal or of trajectory ids.

    The result is identical (values, ``torch.int64`` dtype, shapes and row order) to
    torchrl's ``SliceSampler._find_start_stop_traj``: ``start_idx`` and ``stop_idx`` are
    ``[num_traj, ndim]`` indices into the signal (time first), ``lengths`` is
    ``[num_traj]``. Rows are ordered by the last batch dimension, then the other batch
    dimensions, then time. A trajectory without an end at the last step runs on from the
    end of the storage to its beginning when the storage is at capacity.

    Keyword Args:
        trajectory (torch.Tensor, optional): trajectory ids of shape ``[T, ...]``; a new
            trajectory starts wherever the id changes. Takes precedence over ``end``.
        end (torch.Tensor, optional): end-of-trajectory signal of shape ``[T, ...]``
            (``True`` or nonzero at the last step of each trajectory).
        at_capacity (bool): whether the storage is full. When it is not, the last step
            closes every trajectory; when it is, the step at ``cursor`` does, and a column
            without any end holds a single trajectory ending at its last step.
        cursor (int, torch.Tensor or range, optional): the last written position of a full
            storage (a 1-D tensor or a range gives its last element). Ignored when
            ``at_capacity`` is ``False``.

    Returns:
        a tuple ``(start_idx, stop_idx, lengths)`` of int64 tensors on the signal's device
        (numpy arrays when the signal is not a tensor).

    Examples:
        >>> import torch, replay
        >>> end = torch.tensor([False, True, False, False, True, False])
        >>> start, stop, lengths = replay.find_start_stop_traj(end=end, at_capacity=True)
        >>> start.flatten().tolist(), stop.flatten().tolist(), lengths.tolist()
        ([5, 2], [1, 4], [3, 3])

    .. note:: The signal is scanned by a C kernel with the GIL released. A signal on
        another device is copied to the host and the results are moved back; the torch-op
        implementation in ``torchrl_compat`` avoids that copy. Unlike torchrl, a non-bool
        ``end`` with a column holding no end is accepted (torchrl fails in ``masked_fill``).

    .. warning:: As in torchrl, ``trajectory`` ids with a single step and
        ``at_capacity=False`` give no trajectory at all (torchrl's closing row is
        ``ones_like(end[:1])``, empty there); ``end=`` signals do not have this quirk.
    """
    cdef bint from_ids = trajectory is not None
    cdef bint full = bool(at_capacity)
    cdef int64_t length, groups, total = 0, bad = 0, c_cursor = -1
    cdef Py_ssize_t nd
    cdef int rc
    cdef const uint8_t[:, ::1] flags_view
    cdef uint8_t[::1] block_view
    cdef int64_t[::1] count_view, scratch_view, lengths_view
    cdef int64_t[:, ::1] start_view, stop_view
    cdef const int64_t[:, ::1] coord_view
    cdef const int64_t *coord_ptr = NULL

    signal = trajectory if from_ids else end
    if signal is None:
        raise TypeError("find_start_stop_traj() needs one of trajectory or end")
    arr = _signal_to_numpy(signal)
    nd = arr.ndim
    if nd == 0:
        raise _SignalDimError(_SIGNAL_NDIM_ERROR)
    shape = tuple(arr.shape)
    length = shape[0]
    groups = 1
    for d in shape[1:]:
        groups *= d
    if full and cursor is not None:
        c_cursor = _cursor_row(cursor, length)
    if length == 0 and not from_ids and not full:
        # torchrl sets end[length - 1] = True first.
        raise IndexError("index -1 is out of bounds for dimension 0 with size 0")
    if length == 0 or groups == 0 or (from_ids and length == 1 and not full):
        # torchrl closes the last trajectory with ``torch.ones_like(end[:1])``, which is empty
        # when the ids have a single step, so a one-step storage that is not full has no
        # trajectory at all; kept so that results stay identical.
        empty = np.empty((0, nd), dtype=np.int64)
        return (_numpy_to_like(empty, signal), _numpy_to_like(empty.copy(), signal),
                _numpy_to_like(np.empty(0, dtype=np.int64), signal))

    flags = _end_flags(arr, from_ids, full)
    flags_view = flags
    counts = np.empty(groups, dtype=np.int64)
    count_view = counts
    blocks = np.empty(rp_slice_block_count_size(length, groups), dtype=np.uint8)
    block_view = blocks
    with nogil:
        rc = rp_slice_count_ends(&flags_view[0, 0], length, groups, c_cursor, not full,
                                 &block_view[0], &count_view[0], &total, &bad)
    if rc != RP_OK:
        _raise_slice_error(rc, bad, length)

    if nd >= 3:
        coords = _group_coordinates(shape)
        coord_view = coords
        coord_ptr = &coord_view[0, 0]
    start = np.empty((total, nd), dtype=np.int64)
    stop = np.empty((total, nd), dtype=np.int64)
    lengths = np.empty(total, dtype=np.int64)
    scratch = np.empty(2 * groups, dtype=np.int64)
    start_view = start
    stop_view = stop
    lengths_view = lengths
    scratch_view = scratch
    with nogil:
        rc = rp_slice_starts(&flags_view[0, 0], length, groups, c_cursor, not full,
                             &block_view[0], &count_view[0], nd, coord_ptr, &scratch_view[0], &start_view[0, 0],
                             &stop_view[0, 0], &lengths_view[0], &bad)
    if rc != RP_OK:
        _raise_slice_error(rc, bad, length)
    return (_numpy_to_like(start, signal), _numpy_to_like(stop, signal),
            _numpy_to_like(lengths, signal))


cdef _raise_slice_error(int rc, int64_t bad, int64_t length):
    if rc == RP_ERR_INDEX:
        raise IndexError(f"index {bad} is out of bounds for dimension 0 with size {length}")
    # Only a signal written to by another thread between the two passes gets here.
    raise RuntimeError(f"the end-of-trajectory signal changed while it was read (column {bad})")


def slice_indices(start, seq_length, storage_length):
    """Storage indices of slices given their starts and lengths.

    The equivalent of torchrl's ``SliceSampler._tensor_slices_from_startend``: slice ``k``
    contributes the rows ``start[k] + (i, 0, ..., 0)`` for ``i < seq_length`` (or
    ``seq_length[k]``), in order, with the first (time) column taken modulo
    ``storage_length`` so that slices wrap from the end of the storage to its start.

    Args:
        start (torch.Tensor): ``[num_slices, ndim]`` (or ``[num_slices]``) integer start
            indices, time first.
        seq_length (int or torch.Tensor): the length of every slice, or a ``[num_slices]``
            integer tensor of per-slice lengths.
        storage_length (int): the length of the storage's time dimension.

    Returns:
        an int64 ``[total_length, ndim]`` tensor on ``start``'s device (``ndim`` is 1 for a
        1-D ``start``).

    Examples:
        >>> import torch, replay
        >>> replay.slice_indices(torch.tensor([[3, 0], [0, 1]]), 2, 4).tolist()
        [[3, 0], [0, 0], [0, 1], [1, 1]]
        >>> replay.slice_indices(torch.tensor([[3], [1]]), torch.tensor([1, 3]), 4).flatten().tolist()
        [3, 1, 2, 3]

    .. note:: torchrl builds the per-slice-length case with one tensor per slice; this is a
        single C pass. A negative length raises ValueError naming it (torchrl's
        ``torch.arange`` raises a RuntimeError), and a ``seq_length`` whose size differs
        from the number of slices is refused rather than truncated by ``zip``.
    """
    cdef const int64_t[:, ::1] start_view
    cdef const int64_t[::1] len_view
    cdef int64_t[:, ::1] out_view
    cdef int64_t n, ndim, rows, bad = 0, c_storage
    cdef bint uniform
    cdef int rc

    arr = _as_array(start)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"start must hold integers, got an array of dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    elif arr.ndim != 2:
        raise ValueError(f"start must have shape [num_slices, ndim], got shape {tuple(arr.shape)}")
    st = np.ascontiguousarray(arr, dtype=np.int64)
    n = st.shape[0]
    ndim = st.shape[1]
    if _is_tensor(storage_length) or isinstance(storage_length, np.ndarray):
        storage_length = storage_length.item()
    c_storage = storage_length
    if c_storage < 1:
        raise ValueError(f"storage_length must be at least 1, got storage_length={storage_length}")

    uniform = isinstance(seq_length, (int, np.integer)) or (
        (_is_tensor(seq_length) or isinstance(seq_length, np.ndarray)) and seq_length.ndim == 0)
    if uniform:
        steps = int(seq_length)
        if steps < 0:
            raise ValueError(f"seq_length must be non-negative, got seq_length={steps}")
        lens = np.full(1, steps, dtype=np.int64)
        rows = n * steps
    else:
        lens_arr = _as_array(seq_length)
        if lens_arr.dtype.kind not in "iu":
            raise TypeError(f"seq_length must hold integers, got an array of dtype {lens_arr.dtype}")
        if lens_arr.shape != (n,):
            raise ValueError(
                f"seq_length must have shape ({n},) to match start of shape {tuple(st.shape)}, "
                f"got shape {tuple(lens_arr.shape)}")
        lens = np.ascontiguousarray(lens_arr, dtype=np.int64)
        negative = np.flatnonzero(lens < 0)
        if negative.size:
            bad = negative[0]
            raise ValueError(
                f"seq_length must be non-negative, got {int(lens[bad])} at position {bad}")
        rows = int(lens.sum())
    out = np.empty((rows, ndim), dtype=np.int64)
    if rows == 0:
        return _numpy_to_like(out, start)
    start_view = st
    len_view = lens
    out_view = out
    with nogil:
        rc = rp_slice_indices(&start_view[0, 0], n, ndim, &len_view[0], uniform, c_storage,
                              &out_view[0, 0], &bad)
    if rc != RP_OK:
        raise ValueError(f"seq_length must be non-negative, got {int(lens[bad])} at position {bad}")
    return _numpy_to_like(out, start)


# =====================================================================================
# Permutations
# =====================================================================================
# (permutation section)

