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


# =====================================================================================
# Permutations
# =====================================================================================
# (permutation section)

