# cython: language_level=3
"""Replay-buffer kernels: segment trees, trajectory slice starts, permutations, row copies,
and the columns a list storage's batch is gathered from.

``replay`` is built against numpy only: torch is imported lazily and met only at the Python
edge, where CPU tensors become zero-copy numpy views and results go back as tensors on the
caller's device. One build therefore serves every torch release.
"""
import sys
import threading

import numpy as np

from libc.stdint cimport int64_t, uint64_t, uint32_t, uintptr_t
from libc.float cimport DBL_MAX, FLT_MAX

INT64_MAX = 9223372036854775807

# =====================================================================================
# Torch / numpy edge
# =====================================================================================

# torch.Tensor and torch.from_numpy, looked up once torch has been imported: each lookup
# through sys.modules costs more than the small kernels it guards.
cdef object _TENSOR_TYPE = None
cdef object _FROM_NUMPY = None


cdef object _TORCH_INT64 = None
cdef object _TORCH_FLOAT32 = None
cdef object _TORCH_FLOAT64 = None
cdef object _TORCH_BOOL = None


cdef inline bint _is_tensor(object x):
    """True for a torch.Tensor; never imports torch (an unimported torch made no tensor)."""
    global _TENSOR_TYPE, _FROM_NUMPY, _TORCH_INT64, _TORCH_FLOAT32, _TORCH_FLOAT64, _TORCH_BOOL
    if _TENSOR_TYPE is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        _FROM_NUMPY = torch.from_numpy
        _TORCH_INT64 = torch.int64
        _TORCH_FLOAT32 = torch.float32
        _TORCH_FLOAT64 = torch.float64
        _TORCH_BOOL = torch.bool
        _TENSOR_TYPE = torch.Tensor
    return isinstance(x, _TENSOR_TYPE)


cdef inline bint _is_plain_cpu_tensor(object x, object dtype):
    """Whether ``x`` is a contiguous CPU tensor of ``dtype`` whose memory reads as it is (no
    conjugate or negative bit): its ``data_ptr()`` can then be handed to a kernel directly,
    skipping the numpy view (about 1.5 us a tensor)."""
    return (_is_tensor(x) and x.dtype is dtype and x.is_cpu and x.is_contiguous()
            and not x.is_neg())


cdef object _int64_data(object x, str name, const int64_t **data, int64_t *n):
    """``x`` flattened to int64: sets ``data`` and ``n`` and returns the object owning the
    memory (keep it alive while ``data`` is used). TypeError for non-integer input."""
    cdef const int64_t[::1] view
    if _is_plain_cpu_tensor(x, _TORCH_INT64):
        n[0] = x.numel()
        data[0] = <const int64_t *><uintptr_t>x.data_ptr()
        return x
    if type(x) is np.ndarray and x.ndim == 1 and x.dtype == np.int64 and x.flags.c_contiguous:
        arr = x  # already what _as_index_array makes: taken as it is
    else:
        arr = _as_index_array(x, name)
    n[0] = arr.shape[0]
    data[0] = NULL
    if n[0]:
        view = arr
        data[0] = &view[0]
    return arr


cdef object _real_data(object x, str name, const float **f32, const double **f64, int64_t *n):
    """``x`` flattened to float32 (when it is float32) or float64: sets one of ``f32`` /
    ``f64`` (the other stays NULL) and ``n``, and returns the object owning the memory."""
    cdef const float[::1] v32
    cdef const double[::1] v64
    f32[0] = NULL
    f64[0] = NULL
    if _is_plain_cpu_tensor(x, _TORCH_FLOAT32):
        n[0] = x.numel()
        f32[0] = <const float *><uintptr_t>x.data_ptr()
        return x
    if _is_plain_cpu_tensor(x, _TORCH_FLOAT64):
        n[0] = x.numel()
        f64[0] = <const double *><uintptr_t>x.data_ptr()
        return x
    arr = _as_array(x)
    arr = _as_value_array(arr, np.float32 if arr.dtype == np.float32 else np.float64, name)
    n[0] = arr.shape[0]
    if n[0]:
        if arr.dtype == np.float32:
            v32 = arr
            f32[0] = &v32[0]
        else:
            v64 = arr
            f64[0] = &v64[0]
    return arr


cdef object _tensor_to_numpy(object tensor):
    """A numpy view of a CPU tensor (a host copy for other devices)."""
    if tensor.is_cpu and not tensor.requires_grad:
        try:  # the common case, without the detach / resolve round trips (~1 us each)
            return tensor.numpy()
        except (RuntimeError, TypeError):  # conjugate / negative bit set, or no numpy dtype
            pass
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    torch = sys.modules["torch"]
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: widen, exactly
        tensor = tensor.float()
    return tensor.resolve_conj().resolve_neg().numpy()


cdef object _from_numpy(object array):
    """``torch.from_numpy(array)``, torch imported on first use."""
    global _FROM_NUMPY
    if _FROM_NUMPY is None:
        import torch
        _FROM_NUMPY = torch.from_numpy
    return _FROM_NUMPY(array)


cdef object _numpy_to_like(object array, object like):
    """``array`` as a torch tensor on ``like``'s device when ``like`` is a tensor."""
    if _is_tensor(like):
        out = _FROM_NUMPY(array)
        if not like.is_cpu:
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
    if arr.size == 0 and kind == "f" and not _is_tensor(x):
        # An empty sequence has no dtype of its own (numpy makes it float64): nothing to index.
        return np.empty(0, dtype=np.int64)
    if kind not in "iu":
        raise TypeError(f"{name} must hold integers, got an array of dtype {arr.dtype}")
    if kind == "u" and arr.dtype.itemsize == 8 and arr.size and arr.max() > INT64_MAX:
        raise IndexError(f"{name} value {int(arr.max())} does not fit in int64")
    arr = arr.reshape(-1)
    if arr.dtype == np.int64 and arr.flags.c_contiguous:
        return arr
    return np.ascontiguousarray(arr, dtype=np.int64)


cdef object _as_value_array(object x, object dtype, str name):
    """``x`` as a C-contiguous 1-D array of ``dtype`` (any real dtype is cast)."""
    arr = _as_array(x)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got an array of dtype {arr.dtype}")
    arr = arr.reshape(-1)
    if arr.dtype == dtype and arr.flags.c_contiguous:
        return arr
    # An overflow to inf is reported by the kernel's value check, naming the caller's value.
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(arr, dtype=dtype)


# =====================================================================================
# Segment trees
# =====================================================================================
from cpython.long cimport PyLong_Check, PyLong_CheckExact

cdef object _ALIGN_BYTES = 64


cdef inline bint _is_scalar_int(object x):
    # bool is an int subclass but never a valid tree index.
    return (PyLong_Check(x) or isinstance(x, np.integer)) and not isinstance(x, (bool, np.bool_))


cdef inline int64_t _clamped_int64(object x) except? -1:
    """A Python int clamped to [-INT64_MAX, INT64_MAX] (query bounds are clamped anyway)."""
    try:
        return x
    except OverflowError:
        return INT64_MAX if x > 0 else -INT64_MAX


cdef inline bint _is_scalar_real(object x):
    return isinstance(x, (float, int, np.floating, np.integer)) and not isinstance(x, (bool, np.bool_))


cdef object _aligned_empty(int64_t n, object dtype, bint zeroed=False):
    """A 64-byte aligned 1-D array of ``n`` elements and the array that owns its memory
    (``zeroed``: all zeros, from pages the kernel hands out zeroed and maps when first touched)."""
    itemsize = np.dtype(dtype).itemsize
    storage = (np.zeros if zeroed else np.empty)(n + _ALIGN_BYTES // itemsize, dtype=dtype)
    shift = (-storage.ctypes.data % _ALIGN_BYTES) // itemsize
    return storage, storage[shift:shift + n]


# A min tree this many leaves or more writes its leaves' identity as they are first reached
# (_SegmentTree._reach), by chunks of _REACH_CHUNK leaves, instead of all of them when built.
cdef int64_t _LAZY_LEAVES = 1 << 16
cdef int64_t _REACH_CHUNK = 1 << 12


cdef int64_t _capacity_for(int64_t size) noexcept:
    """The smallest power of two strictly greater than ``size``, torchrl's tree capacity."""
    cdef int64_t c = 1
    while c <= size:
        c <<= 1
    return c


cdef class _SegmentTree:
    """Common state and methods of the sum and min segment trees (16-ary, see segtree.h).

    torchrl's trees keep ``capacity`` leaves (the smallest power of two above ``size``) and
    accept every index below it; torchrl's ``PrioritizedSampler`` writes there when its
    storage is longer than the sampler. So do these: leaves ``[0, capacity)`` can be read and
    written, and a query that starts at 0 and reaches ``size`` covers all of them. The buffer
    holds ``size`` leaves (the others read as the identity) until a leaf past them is first
    written; it is then laid out for ``capacity`` leaves, once.
    """

    def __cinit__(self, *args, **kwargs):
        self._t32 = NULL
        self._t64 = NULL
        self._saved_ptr = NULL
        self._saved_len = 0

    cdef _setup(self, object size, bint fp64, bint is_min):
        if not _is_scalar_int(size):
            raise TypeError(f"size must be an int, got {type(size).__name__}")
        if size < 0:
            raise ValueError(f"size must be non-negative, got size={size}")
        if size > INT64_MAX // 4:
            raise ValueError(f"size={size} is too large")
        self._fp64 = fp64
        self._is_min = is_min
        self._dtype = np.dtype(np.float64 if fp64 else np.float32)
        self._size = size
        self._capacity = _capacity_for(size)
        self._lock = threading.Lock()
        self._allocate(size)

    cdef _allocate(self, int64_t leaves):
        """Lay out and allocate the buffer for ``leaves`` leaves, every entry the identity.

        Nothing of a sum tree is written (its identity, 0, is what fresh pages hold): a tree
        of 2^30 leaves costs no time until its leaves are written, and those pages are touched
        once, by the write. A large min tree writes its identity above the leaves (1/15 of the
        buffer) and leaves the leaves to ``_reach``.
        """
        cdef rp_segtree_layout layout
        cdef float[::1] v32
        cdef double[::1] v64
        if rp_segtree_layout_init(&layout, leaves, not self._is_min) != RP_OK:
            raise ValueError(f"size={leaves} is too large")
        nbytes = layout.total * self._dtype.itemsize
        try:
            storage, tree = _aligned_empty(layout.total, self._dtype, not self._is_min)
        except MemoryError:
            raise MemoryError(f"cannot allocate {nbytes} bytes for a segment tree of {leaves} leaves")
        ready = layout.ready  # every leaf, as laid out
        if self._is_min:
            identity = self.identity_element
            if layout.size >= _LAZY_LEAVES:
                ready = 0
                tree[layout.offset[1]:] = identity  # (2^16 leaves or more: a level above them)
            else:
                tree[:] = identity
        if self._fp64:
            v64 = tree
            self._t64 = &v64[0]
        else:
            v32 = tree
            self._t32 = &v32[0]
        layout.ready = ready
        self._layout = layout
        self._storage = storage
        self._tree = tree

    cdef void _reach(self, int64_t stop) noexcept nogil:
        """Write the identity into the leaves a min tree has not reached yet below ``stop``
        (rounded up to a chunk; hold the lock). Its levels above hold the identity from the
        start, so leaves ``[layout.ready, size)`` read as the identity everywhere but in memory."""
        cdef int64_t i, end
        if stop <= self._layout.ready:
            return
        end = (stop + _REACH_CHUNK - 1) // _REACH_CHUNK * _REACH_CHUNK
        if end > self._layout.length[0] or stop >= self._layout.size:
            end = self._layout.length[0]  # the last node's padding too: its min reads them
        if self._fp64:
            for i in range(self._layout.ready, end):
                self._t64[i] = DBL_MAX
        else:
            for i in range(self._layout.ready, end):
                self._t32[i] = FLT_MAX
        self._layout.ready = end

    cdef void _reach_leaves(self, const int64_t *index, int64_t n) noexcept nogil:
        """``_reach`` past the largest of the leaves ``index[0..n)`` (one outside the tree
        reaches them all: the kernel refuses it after, and reaching changes no value)."""
        cdef int64_t k, largest = -1
        if self._layout.ready >= self._layout.size:
            return
        for k in range(n):
            if index[k] > largest:
                largest = index[k]
        self._reach(largest + 1 if largest < self._layout.size else self._layout.size)

    cdef bint _grow_for(self, int64_t index) except -1:
        """Lays the buffer out for ``capacity`` leaves when ``index`` lies past the allocated
        ones but below ``capacity`` (O(capacity), once). Returns whether it did."""
        if index < self._layout.size or index >= self._capacity:
            return False
        with self._lock:
            if self._layout.size < self._capacity:
                self._reach(self._layout.size)
                leaves = self._tree[:self._layout.size].copy()
                self._allocate(self._capacity)
                self._reach(self._layout.size)
                self._tree[:leaves.shape[0]] = leaves
                with nogil:
                    self._rebuild()
        return True

    @property
    def size(self):
        """The number of leaves asked for."""
        return self._size

    @property
    def capacity(self):
        """The smallest power of two strictly greater than ``size`` (torchrl's capacity): leaves
        ``[0, capacity)`` can be read and written."""
        return self._capacity

    @property
    def nbytes(self):
        """The bytes of the tree's buffer: every level, and the mini-heaps of a sum tree (a min
        tree's leaves count before they are first written)."""
        return self._layout.total * self._dtype.itemsize

    @property
    def identity_element(self):
        """0.0 for a sum tree, the dtype's largest finite value for a min tree."""
        if not self._is_min:
            return 0.0
        return float(np.finfo(self._dtype).max)

    def __len__(self):
        return self._size

    def __repr__(self):
        return f"{type(self).__name__}(size={self._size})"

    cdef str _kind(self):
        return "min" if self._is_min else "sum"

    # --- leaves ------------------------------------------------------------------------

    def at(self, index):
        """The value of leaf ``index``: a float for an int, an array / tensor of the tree's
        dtype and of ``index``'s shape for an integer array / tensor."""
        cdef int64_t i, n, bad = 0
        cdef int rc = RP_OK
        cdef const int64_t[::1] idx
        cdef float[::1] o32
        cdef double[::1] o64
        if _is_scalar_int(index):
            if not 0 <= index < self._capacity:
                raise IndexError(_index_message(index, -1, self._size, self._capacity))
            i = index
            with self._lock:
                if i >= self._layout.size or i >= self._layout.ready:  # past the allocated leaves, or not reached
                    return self.identity_element
                return float(self._t64[i]) if self._fp64 else float(self._t32[i])
        shape = np.shape(index) if not _is_tensor(index) else tuple(index.shape)
        arr = _as_index_array(index, "index")
        out = np.empty(arr.shape[0], dtype=self._dtype)
        n = arr.shape[0]
        if n:
            idx = arr
            with self._lock:
                self._reach_leaves(&idx[0], n)
                if self._fp64:
                    o64 = out
                    with nogil:
                        rc = rp_segtree_get_f64(&self._layout, self._t64, &idx[0], n, &o64[0], &bad)
                else:
                    o32 = out
                    with nogil:
                        rc = rp_segtree_get_f32(&self._layout, self._t32, &idx[0], n, &o32[0], &bad)
            if rc != RP_OK:
                out = self._read_past_layout(arr)
        return _numpy_to_like(out.reshape(shape), index)

    cdef _read_past_layout(self, object arr):
        """Leaves ``arr`` when some lie past the allocated ones (they read as the identity);
        IndexError for the first index outside ``[0, capacity)``."""
        outside = (arr < 0) | (arr >= self._capacity)
        if outside.any():
            position = int(np.argmax(outside))
            raise IndexError(_index_message(int(arr[position]), position, self._size, self._capacity))
        out = np.full(arr.shape[0], self.identity_element, dtype=self._dtype)
        with self._lock:
            self._reach(self._layout.size)
            inside = arr < self._layout.size
            out[inside] = self._tree[arr[inside]]
        return out

    def __getitem__(self, index):
        return self.at(index)

    def update(self, index, value):
        """Set leaves ``index`` to ``value`` and recompute their parents.

        ``value`` is a scalar (broadcast to every index) or holds as many elements as
        ``index``. A batch holding one bad index or value is rejected whole: the tree is
        left unchanged. A repeated index keeps its last value.
        """
        cdef int64_t n, n_value, stride, bad = 0
        cdef int rc = RP_OK
        cdef const int64_t *iptr = NULL
        cdef const void *vptr = NULL
        cdef bint single = _is_scalar_int(index)
        if single:
            if not 0 <= index < self._capacity:
                raise IndexError(_index_message(index, -1, self._size, self._capacity))
            index = np.array([index], dtype=np.int64)
        if _is_scalar_real(value):
            value = np.array([value], dtype=self._dtype)
        # plain CPU tensors go straight to the kernel (data_ptr), anything else through numpy
        arr = _int64_data(index, "index", &iptr, &n)
        vals = _value_data(value, self, "value", &vptr, &n_value)
        if single and n_value != 1:
            raise ValueError(
                f"a single index takes a single value, got value of shape {np.shape(value)}")
        if n_value != n and n_value != 1:
            raise ValueError(
                f"value must be a scalar or hold as many elements as index, got value of "
                f"shape {_shape_of(value)} and index of shape {_shape_of(index)}")
        if n == 0:
            return
        stride = 0 if n_value == 1 else 1
        with self._lock:
            rc = self._write(iptr, vptr, stride, n, &bad)
        if rc == RP_ERR_INDEX and self._grow_for(iptr[bad]):
            with self._lock:
                rc = self._write(iptr, vptr, stride, n, &bad)
        if rc != RP_OK:
            self._raise_write_error(rc, bad, iptr, vptr, stride, n, value)

    cdef int _write(self, const int64_t *iptr, const void *vptr, int64_t stride, int64_t n,
                    int64_t *bad) except? -100:
        """One update-kernel call (hold the lock): leaves ``iptr[k]`` get ``vptr[k * stride]``."""
        cdef int rc
        cdef void *saved = NULL
        if not self._is_min:
            saved = self._saved_scratch(n)
        with nogil:
            self._reach_leaves(iptr, n)
            if self._fp64:
                if self._is_min:
                    rc = rp_mintree_update_f64(&self._layout, self._t64, iptr, <const double *>vptr, stride, n, bad)
                else:
                    rc = rp_sumtree_update_f64(&self._layout, self._t64, iptr, <const double *>vptr, stride, n,
                                               <double *>saved, bad)
            else:
                if self._is_min:
                    rc = rp_mintree_update_f32(&self._layout, self._t32, iptr, <const float *>vptr, stride, n, bad)
                else:
                    rc = rp_sumtree_update_f32(&self._layout, self._t32, iptr, <const float *>vptr, stride, n,
                                               <float *>saved, bad)
        return rc

    cdef void *_saved_scratch(self, int64_t n) except NULL:
        """The sum-tree update's scratch for ``n`` leaves (kept between calls, grown as needed:
        a fresh one would cost an allocation per update)."""
        if self._saved_ptr == NULL or self._saved_len < n:
            self._saved = np.empty(max(n, 1), dtype=self._dtype)
            self._saved_ptr = <void *><uintptr_t>self._saved.ctypes.data
            self._saved_len = max(n, 1)
        return self._saved_ptr

    cdef _raise_write_error(self, int rc, int64_t bad, const int64_t *iptr, const void *vptr,
                            int64_t stride, int64_t n, object value):
        """The exception for an update kernel's ``rc`` (``bad`` as the kernel set it)."""
        if rc == RP_ERR_INDEX:
            raise IndexError(_index_message(iptr[bad], bad, self._size, self._capacity))
        if rc == RP_ERR_VALUE:
            self._raise_value_error(_stored_at(vptr, self._fp64, bad * stride), value, bad * stride)
        if rc == RP_ERR_TOTAL:
            index = np.asarray(<int64_t[:n]><int64_t *>iptr).copy()
            if stride:
                if self._fp64:
                    values = np.asarray(<double[:n]><double *>vptr).copy()
                else:
                    values = np.asarray(<float[:n]><float *>vptr).copy()
            else:
                values = np.full(n, _stored_at(vptr, self._fp64, 0), dtype=self._dtype)
            with self._lock:
                leaves = self._tree[:self._layout.size].astype(np.float64)
            leaves[index] = values
            largest = int(np.argmax(values))
            try:  # name the caller's value, not its cast
                named = _as_array(value).reshape(-1)[largest if stride else 0].item()
            except Exception:
                named = float(values[largest])
            with np.errstate(over="ignore"):
                message = (
                    f"value {named} at position {largest} would make the sum of the tree's leaves "
                    f"{leaves.sum()}, past the largest finite {self._dtype} "
                    f"({np.finfo(self._dtype).max}): the update was refused, the tree is unchanged")
            raise ValueError(message)
        raise RuntimeError(f"unexpected kernel return code {rc}")

    def __setitem__(self, index, value):
        self.update(index, value)

    cdef _raise_value_error(self, object stored, object value, int64_t position):
        # Name the caller's value, not its cast (1e300 becomes inf in an fp32 tree).
        try:
            original = _as_array(value).reshape(-1)[position].item()
        except Exception:
            original = stored
        rule = "not NaN" if self._is_min else "finite and non-negative"
        raise ValueError(
            f"value {original} at position {position} cannot be stored in a {self._kind()} "
            f"segment tree: values must be {rule}")

    # --- reductions ----------------------------------------------------------------------

    def query(self, l, r):
        """The sum (or min) of leaves ``[l, r)``, both clamped to ``[0, capacity]``: a sum is
        torchrl's, bit for bit (its binary tree's nodes added bottom-up in the tree's dtype).

        Ints give a float; integer arrays / tensors (broadcast together) give an array /
        tensor of the tree's dtype. ``l <= 0 and r >= size`` is the whole tree: every leaf
        below ``capacity``, as in torchrl (where ``r`` past ``capacity`` with ``l > 0`` reads
        outside the tree).
        """
        cdef int64_t lo, hi, n
        cdef const int64_t[::1] lv
        cdef const int64_t[::1] rv
        cdef double[::1] ov
        # plain ints first: cheaper to recognise (bool is a subclass, not an exact int)
        if (PyLong_CheckExact(l) and PyLong_CheckExact(r)) or (_is_scalar_int(l) and _is_scalar_int(r)):
            lo = _clamped_int64(int(l))
            hi = _clamped_int64(int(r))
            with self._lock:
                if lo <= 0 and hi >= self._size:
                    hi = self._layout.size  # the whole tree, grown leaves included
                return self._query_one(lo, hi)
        like = l if _is_tensor(l) else r
        la = _as_index_array(l, "l") if not _is_scalar_int(l) else np.array([l], dtype=np.int64)
        ra = _as_index_array(r, "r") if not _is_scalar_int(r) else np.array([r], dtype=np.int64)
        shape = np.broadcast_shapes(_shape_of(l), _shape_of(r))
        la = np.ascontiguousarray(np.broadcast_to(la.reshape(_shape_of(l)), shape).reshape(-1))
        ra = np.ascontiguousarray(np.broadcast_to(ra.reshape(_shape_of(r)), shape).reshape(-1))
        out = np.empty(la.shape[0], dtype=np.float64)
        if self._layout.size > self._size:  # grown: whole-tree queries reach every leaf
            ra = np.where((la <= 0) & (ra >= self._size), self._layout.size, ra)
        if self._layout.ready < self._layout.size:  # a min tree's leaves past ready: the identity
            ra = np.minimum(ra, self._layout.ready)
        n = la.shape[0]
        if n:
            lv = la
            rv = ra
            ov = out
            with self._lock:
                with nogil:
                    if self._fp64:
                        if self._is_min:
                            rp_mintree_query_batch_f64(&self._layout, self._t64, &lv[0], &rv[0], n, &ov[0])
                        else:
                            rp_sumtree_query_batch_f64(&self._layout, self._t64, &lv[0], &rv[0], n, &ov[0])
                    else:
                        if self._is_min:
                            rp_mintree_query_batch_f32(&self._layout, self._t32, &lv[0], &rv[0], n, &ov[0])
                        else:
                            rp_sumtree_query_batch_f32(&self._layout, self._t32, &lv[0], &rv[0], n, &ov[0])
        return _numpy_to_like(out.astype(self._dtype, copy=False).reshape(shape), like)

    cdef double _query_one(self, int64_t l, int64_t r) noexcept:
        if r > self._layout.ready and self._is_min:  # leaves past ready: the identity
            r = self._layout.ready
        if self._fp64:
            if self._is_min:
                return rp_mintree_query_f64(&self._layout, self._t64, l, r)
            return rp_sumtree_query_f64(&self._layout, self._t64, l, r)
        if self._is_min:
            return rp_mintree_query_f32(&self._layout, self._t32, l, r)
        return rp_sumtree_query_f32(&self._layout, self._t32, l, r)

    cdef void _draw_range(self, int64_t num_valid, int64_t *mass_end, int64_t *limit) noexcept:
        """The leaves a prioritized draw spreads its mass over, ``[0, mass_end)``, and the
        clamp of its leaves, ``[0, limit)`` (hold the lock). torchrl's sampler sums
        ``query(0, len(storage))``, the whole tree once the storage reaches ``size``, and clamps
        the draws to ``len(storage) - 1``."""
        mass_end[0] = self._layout.size if num_valid >= self._size else num_valid
        limit[0] = num_valid if num_valid < mass_end[0] else mass_end[0]

    # --- bulk access and pickling ----------------------------------------------------------

    def values(self):
        """A numpy copy of the ``size`` leaf values."""
        with self._lock:
            self._reach(self._layout.size)
            return self._tree[:self._size].copy()

    def __reduce__(self):
        # The ``size`` leaves only, as torchrl's trees pickle theirs.
        return (type(self), (self._size,), self.values())

    cdef void _rebuild(self) noexcept nogil:
        """Recompute every level above the leaves (hold the lock). O(leaves)."""
        if self._fp64:
            if self._is_min:
                rp_mintree_build_f64(&self._layout, self._t64)
            else:
                rp_sumtree_build_f64(&self._layout, self._t64)
        else:
            if self._is_min:
                rp_mintree_build_f32(&self._layout, self._t32)
            else:
                rp_sumtree_build_f32(&self._layout, self._t32)

    def __setstate__(self, state):
        cdef int64_t bad = 0
        cdef int rc = RP_OK
        cdef const float[::1] v32
        cdef const double[::1] v64
        if isinstance(state, tuple) and len(state) == 1 and isinstance(state[0], np.ndarray):
            # torchrl's compiled trees pickle their leaves as a one-item tuple, and are made
            # again by ``__new__`` alone (pybind11): a checkpoint torchrl wrote on its own trees,
            # read where these stand in for them.
            state = state[0]
        if not isinstance(state, np.ndarray):
            raise TypeError(f"{type(self).__name__} state must be a numpy array, got {type(state).__name__}")
        if self._tree is None:
            # made by ``__new__`` without ``__init__``: the leaves give the size
            if state.ndim != 1:
                raise ValueError(f"{type(self).__name__} state must be one-dimensional, got shape {state.shape}")
            type(self).__init__(self, state.shape[0])
        if state.dtype != self._dtype:
            raise TypeError(f"{type(self).__name__} state must have dtype {self._dtype}, got {state.dtype}")
        if state.shape != (self._size,):
            raise ValueError(
                f"{type(self).__name__} state must have shape ({self._size},), got {state.shape}")
        state = np.ascontiguousarray(state)
        n = state.shape[0]
        if n:
            if self._fp64:
                v64 = state
                rc = rp_mintree_check_f64(&v64[0], n, &bad) if self._is_min else rp_sumtree_check_f64(&v64[0], n, &bad)
            else:
                v32 = state
                rc = rp_mintree_check_f32(&v32[0], n, &bad) if self._is_min else rp_sumtree_check_f32(&v32[0], n, &bad)
            if rc != RP_OK:
                self._raise_value_error(state[bad], state, bad)
        with self._lock:
            self._reach(self._layout.size)
            previous = self._tree[:self._layout.size].copy()
            self._tree[:n] = state
            # The state holds the ``size`` leaves: any grown past them go back to the identity.
            self._tree[n:self._layout.size] = self.identity_element
            with nogil:
                self._rebuild()
            if self._is_min or self._query_one(0, self._layout.size) <= np.finfo(self._dtype).max:
                return
            self._tree[:self._layout.size] = previous
            with nogil:
                self._rebuild()
        with np.errstate(over="ignore"):
            total = state.sum(dtype=np.float64)
        raise ValueError(
            f"{type(self).__name__} state sums to {total}, past the "
            f"largest finite {self._dtype} ({float(np.finfo(self._dtype).max)}): the tree is unchanged")

    def _py_buffer(self):
        """Test hook: a copy of the whole buffer (every level, and the mini-heaps of a sum tree)."""
        with self._lock:
            self._reach(self._layout.size)
            return self._tree.copy()

    def _py_level(self, t):
        """Test hook: a copy of level ``t`` of the internal layout (0 = leaves)."""
        if not 0 <= t <= self._layout.top:
            raise IndexError(f"level {t} is out of range [0, {self._layout.top}]")
        off = self._layout.offset[t]
        with self._lock:
            self._reach(self._layout.size)
            return self._tree[off:off + self._layout.length[t]].copy()


cdef object _shape_of(object x):
    if _is_tensor(x):
        return tuple(x.shape)
    return np.shape(x)


cdef int64_t _num_valid(object num_valid) except -1:
    """``num_valid`` of a prioritized draw (``len(storage)``), checked; past int64 it clamps
    (no tree is that large)."""
    if not _is_scalar_int(num_valid):
        raise TypeError(f"num_valid must be an int, got {type(num_valid).__name__}")
    if num_valid < 1:
        raise IndexError(f"num_valid={num_valid} must be at least 1")
    return num_valid if num_valid < INT64_MAX else INT64_MAX


cdef str _index_message(object value, int64_t position, int64_t size, int64_t capacity):
    """The IndexError message for leaf ``value`` (at ``position`` of a batch, when >= 0)."""
    where = f" at position {position}" if position >= 0 else ""
    return (f"index {value}{where} is out of range for size {size}: a tree of that size holds "
            f"leaves [0, {capacity})")


cdef object _uniform_draws(object uniform, object batch_size, object seed):
    """The draws of a prioritized sample: ``uniform`` as float64, or ``batch_size`` draws of a
    xoshiro256** stream seeded with ``seed``."""
    cdef rp_prng_state st
    cdef double[::1] uv
    if uniform is not None:
        return _as_value_array(uniform, np.float64, "uniform")
    if batch_size is None or not _is_scalar_int(batch_size) or batch_size < 0:
        raise ValueError(f"batch_size must be a non-negative int when uniform is omitted, got {batch_size!r}")
    us = np.empty(batch_size, dtype=np.float64)
    if batch_size:
        rp_prng_seed(&st, <uint64_t>((seed or 0) & 0xFFFFFFFFFFFFFFFF))
        uv = us
        rp_prng_fill_double(&st, batch_size, &uv[0])
    return us


cdef _divide_in_place(object values, bint fp64, double by):
    """``values /= by`` in the array's precision (``by`` rounded to it first, as torch does)."""
    cdef float[::1] v32
    cdef double[::1] v64
    cdef float by32 = <float>by
    cdef Py_ssize_t k
    if not by > 0:
        raise ValueError(f"relative_to must be positive, got relative_to={by}")
    if fp64:
        v64 = values
        for k in range(v64.shape[0]):
            v64[k] = v64[k] / by
    else:
        v32 = values
        for k in range(v32.shape[0]):
            v32[k] = v32[k] / by32


cdef tuple _weight_request(object p_min, object beta, int64_t n):
    """``(p_min, beta, weight buffer)`` for the kernels: ``(1, 0, None)`` when no importance
    weights are asked for."""
    if beta is None:
        return 1.0, 0.0, None
    if p_min is None:
        raise ValueError("p_min is required with beta to compute importance weights")
    if not p_min > 0:
        raise ValueError(f"p_min must be positive, got p_min={p_min}")
    return float(p_min), float(beta), np.empty(n, dtype=np.float64)


cdef class _SumSegmentTree(_SegmentTree):
    """Sum-tree operations: prefix search and fused prioritized sampling."""

    def scan_lower_bound(self, value):
        """The first leaf whose inclusive prefix sum is ``>= value``, as torchrl's tree finds it.

        ``size`` when ``value`` (rounded to the tree's dtype) exceeds the total (leaves below
        ``capacity`` included), 0 when ``value <= 0``. A float gives an int; an array / tensor
        gives int64 of the same shape. The descent is torchrl's, bit for bit: its binary sums
        and subtractions in the tree's dtype, so where they round it can end on a zero-valued
        leaf, or on a leaf past ``size`` (below ``capacity``), as torchrl's does. NaN raises
        ValueError.
        """
        cdef int64_t n, bad = 0
        cdef int rc = RP_OK
        cdef const void *vptr = NULL
        cdef int64_t[::1] ov
        if _is_scalar_real(value):
            vals = np.array([value], dtype=self._dtype)
            shape = None
        else:
            shape = _shape_of(value)
            vals = value
        vals = _value_data(vals, self, "value", &vptr, &n)
        out = np.empty(n, dtype=np.int64)
        if n:
            ov = out
            with self._lock:
                if self._fp64:
                    with nogil:
                        rc = rp_sumtree_scan_lower_bound_f64(&self._layout, self._t64, <const double *>vptr, n, &ov[0], &bad)
                else:
                    with nogil:
                        rc = rp_sumtree_scan_lower_bound_f32(&self._layout, self._t32, <const float *>vptr, n, &ov[0], &bad)
                allocated = self._layout.size
            if rc != RP_OK:
                raise ValueError(f"value nan at position {bad} cannot be searched for in a sum tree")
            if allocated > self._size:  # grown: past the total is still ``size``, as in torchrl
                out[out == allocated] = self._size
        if shape is None:
            return int(out[0])
        return _numpy_to_like(out.reshape(shape), value)

    def sample_prioritized(self, num_valid, uniform=None, *, batch_size=None, seed=None,
                           p_min=None, beta=None, relative_to=None, mass=None):
        """Draw leaves in proportion to their value, in one pass.

        Follows :class:`~torchrl.data.PrioritizedSampler`'s rules: the mass of draw ``k`` is
        ``uniform[k] * query(0, num_valid)`` (every leaf below ``capacity`` once ``num_valid``
        reaches ``size``); its leaf is clamped to ``num_valid - 1`` and moved off a zero-valued
        leaf to the nearest positive one on its left (on its right when there is none: torchrl
        raises there, for a draw of exactly 0).

        Args:
            num_valid (int): leaves ``[0, num_valid)`` may be drawn (``len(storage)``, which
                may exceed ``size``).
            uniform (array or tensor, optional): draws in ``[0, 1]``; the outputs follow its
                kind (tensor in, tensors out). If omitted, ``batch_size`` draws come from a
                xoshiro256** stream seeded with ``seed``.

        Keyword Args:
            batch_size (int, optional): the number of draws when ``uniform`` is omitted.
            seed (int, optional): 64-bit seed of those draws. Defaults to 0.
            p_min (float, optional): the smallest priority, for importance weights.
            beta (float, optional): importance exponent; when given with ``p_min``, the third
                output is ``(priority / p_min) ** -beta``.
            relative_to (float, optional): when given, the priorities are returned divided
                by it, in the tree's precision (as dividing the tree-dtype tensor by it in
                torch gives, bit for bit).
            mass (array or tensor, optional): the prefix masses of the draws, given instead of
                ``uniform``: draw ``k`` lands where :meth:`scan_lower_bound` puts ``mass[k]``
                (rounded to the tree's dtype as it rounds its values), then is clamped and
                moved off zero-valued leaves as above. This is how a caller draws the masses
                with the RNG it must follow (``np.random.uniform(0.0, p_sum, n)``).

        Returns:
            ``(index, priority, weight)``: int64 indices, the leaf values (tree dtype) and the
            float64 weights, or ``None`` for the weights when ``beta`` is not given.

        Raises:
            IndexError: when ``num_valid`` is below 1, or the tree has no leaf.
            ValueError: for a draw outside ``[0, 1]`` or NaN, a NaN mass, or both ``uniform``
                and ``mass`` given.
            RuntimeError: when no leaf in ``[0, num_valid)`` is positive.
        """
        cdef int64_t n, nv, mass_end, bad = 0
        cdef int rc = RP_OK
        cdef double pmin = 1.0, b = 0.0
        cdef const double[::1] uv
        cdef int64_t[::1] oi
        cdef float[::1] p32
        cdef double[::1] p64
        cdef double[::1] wv
        cdef double *wptr = NULL
        cdef rp_prng_state st
        cdef bint given_mass = mass is not None
        wanted = _num_valid(num_valid)
        if given_mass:
            if uniform is not None:
                raise ValueError("give uniform or mass, not both")
            like = mass
            us = _as_value_array(mass, np.float64, "mass")
        else:
            like = uniform
            us = _uniform_draws(uniform, batch_size, seed)
        n = us.shape[0]
        out_index = np.empty(n, dtype=np.int64)
        out_priority = np.empty(n, dtype=self._dtype)
        pmin, b, out_weight = _weight_request(p_min, beta, n)
        if n:
            uv = us
            oi = out_index
            if out_weight is not None:
                wv = out_weight
                wptr = &wv[0]
            with self._lock:
                self._draw_range(wanted, &mass_end, &nv)
                if self._fp64:
                    p64 = out_priority
                    with nogil:
                        if given_mass:
                            rc = rp_sumtree_sample_masses_f64(&self._layout, self._t64, mass_end, nv, &uv[0], n,
                                                              pmin, b, &oi[0], &p64[0], wptr, &bad)
                        else:
                            rc = rp_sumtree_sample_f64(&self._layout, self._t64, mass_end, nv, &uv[0], n,
                                                       pmin, b, &oi[0], &p64[0], wptr, &bad)
                else:
                    p32 = out_priority
                    with nogil:
                        if given_mass:
                            rc = rp_sumtree_sample_masses_f32(&self._layout, self._t32, mass_end, nv, &uv[0], n,
                                                              pmin, b, &oi[0], &p32[0], wptr, &bad)
                        else:
                            rc = rp_sumtree_sample_f32(&self._layout, self._t32, mass_end, nv, &uv[0], n,
                                                       pmin, b, &oi[0], &p32[0], wptr, &bad)
            if rc == RP_ERR_INDEX:
                raise IndexError(f"num_valid={num_valid}: a tree of size {self._size} has no leaf to draw")
            if rc == RP_ERR_EMPTY:
                raise RuntimeError(
                    f"no positive priority among the first {num_valid} leaves: cannot sample")
            if rc == RP_ERR_VALUE:
                if given_mass:
                    raise ValueError(f"mass {us[bad]} at position {bad} is NaN")
                raise ValueError(f"uniform draw {us[bad]} at position {bad} is not in [0, 1]")
        if relative_to is not None:
            _divide_in_place(out_priority, self._fp64, relative_to)
        return (_numpy_to_like(out_index, like), _numpy_to_like(out_priority, like),
                None if out_weight is None else _numpy_to_like(out_weight, like))


    def sample_prioritized_excluding(self, num_valid, exclude, uniform=None, *, batch_size=None,
                                     seed=None, p_min=None, beta=None, relative_to=None):
        """:meth:`sample_prioritized` with the leaves ``exclude`` treated as zero, for this call only.

        The tree is never modified (torchrl's slice sampler zeroes such leaves and restores them
        afterwards, which races with a concurrent update). The mass of draw ``k`` is
        ``uniform[k]`` times the sum of the other leaves of ``query(0, num_valid)``'s range, and
        no draw lands on an excluded leaf. Costs O(len(exclude)) plus one range query per gap
        between excluded leaves, then O(log) per draw: no pass over the leaves.

        Args:
            num_valid (int): leaves ``[0, num_valid)`` may be drawn (as in
                :meth:`sample_prioritized`).
            exclude (array or tensor of ints): the leaves that may not be drawn, in any order;
                repeats and values outside the leaves that carry the mass are ignored.
            uniform (array or tensor, optional): draws in ``[0, 1]`` (see
                :meth:`sample_prioritized`).

        Keyword Args:
            batch_size, seed, p_min, beta, relative_to: as in :meth:`sample_prioritized`.

        Returns:
            ``(index, priority, weight)`` as :meth:`sample_prioritized` does.

        Raises:
            IndexError: when ``num_valid`` is below 1, or the tree has no leaf.
            ValueError: for a draw outside ``[0, 1]`` or NaN.
            RuntimeError: when no leaf of ``[0, num_valid)`` outside ``exclude`` is positive.
        """
        cdef int64_t n, nv, mass_end, m, bad = 0
        cdef int rc = RP_OK
        cdef double pmin = 1.0, b = 0.0
        cdef const double[::1] uv
        cdef const int64_t[::1] ev
        cdef double[::1] sv
        cdef int64_t[::1] oi
        cdef float[::1] p32
        cdef double[::1] p64
        cdef double[::1] wv
        cdef double *wptr = NULL
        cdef const int64_t *eptr = NULL
        cdef double *sptr = NULL
        cdef rp_prng_state st
        wanted = _num_valid(num_valid)
        ex = _as_index_array(exclude, "exclude")
        if ex.shape[0] > 1 and not (ex[1:] > ex[:ex.shape[0] - 1]).all():
            ex = np.unique(ex)  # the kernel takes a strictly increasing list
        like = uniform
        us = _uniform_draws(uniform, batch_size, seed)
        n = us.shape[0]
        out_index = np.empty(n, dtype=np.int64)
        out_priority = np.empty(n, dtype=self._dtype)
        pmin, b, out_weight = _weight_request(p_min, beta, n)
        m = 0
        if n:
            uv = us
            oi = out_index
            if out_weight is not None:
                wv = out_weight
                wptr = &wv[0]
            with self._lock:
                self._draw_range(wanted, &mass_end, &nv)
                if ex.shape[0] and (ex[0] < 0 or ex[ex.shape[0] - 1] >= mass_end):
                    ex = np.ascontiguousarray(ex[(ex >= 0) & (ex < mass_end)])
                m = ex.shape[0]
                if m:
                    ev = ex
                    eptr = &ev[0]
                # The kernel's scratch (3 doubles an excluded leaf) is kept between calls and
                # used under the lock: a fresh one costs its page faults at every call.
                if self._scratch is None or self._scratch.shape[0] < 3 * m + 1:
                    self._scratch = np.empty(3 * m + 1, dtype=np.float64)
                sv = self._scratch
                sptr = &sv[0]
                if self._fp64:
                    p64 = out_priority
                    with nogil:
                        rc = rp_sumtree_sample_exclude_f64(&self._layout, self._t64, mass_end, nv, eptr, m,
                                                           &uv[0], n, pmin, b, sptr, 3 * m, &oi[0], &p64[0],
                                                           wptr, &bad)
                else:
                    p32 = out_priority
                    with nogil:
                        rc = rp_sumtree_sample_exclude_f32(&self._layout, self._t32, mass_end, nv, eptr, m,
                                                           &uv[0], n, pmin, b, sptr, 3 * m, &oi[0], &p32[0],
                                                           wptr, &bad)
            if rc == RP_ERR_EMPTY:
                raise RuntimeError(
                    f"no positive priority among the first {num_valid} leaves outside the "
                    f"{m} excluded ones: cannot sample")
            if rc == RP_ERR_VALUE:
                raise ValueError(f"uniform draw {us[bad]} at position {bad} is not in [0, 1]")
            if rc != RP_OK and bad < 0:
                raise IndexError(f"num_valid={num_valid}: a tree of size {self._size} has no leaf to draw")
            if rc != RP_OK:
                raise IndexError(f"exclude value {int(ex[bad])} at position {bad} is invalid")
        if relative_to is not None:
            _divide_in_place(out_priority, self._fp64, relative_to)
        return (_numpy_to_like(out_index, like), _numpy_to_like(out_priority, like),
                None if out_weight is None else _numpy_to_like(out_weight, like))


    def sample_prioritized_zeroed(self, num_valid, exclude, masses, *, relative_to=None):
        """Draw as torchrl's ``PrioritizedSliceSampler`` does, with the leaves ``exclude`` set to
        zero for this call only, without writing the tree.

        torchrl writes zeros at those leaves, sums ``query(0, num_valid)``, draws the prefix
        masses from that sum, finds them with :meth:`scan_lower_bound`, clamps the leaves to
        ``num_valid - 1``, steps left off zero-valued leaves, and writes the leaves back. Every
        parent of this tree being a fixed function of its children, the zeroed tree is known
        from the ancestors of the excluded leaves alone: their entries are computed once (no
        copy of, nor pass over, the leaves) and read in place of the tree's, so the sum and the
        draws are those of the zeroed tree bit for bit, while the tree (and any concurrent
        reader or writer, held off by its lock) never sees a zero.

        Args:
            num_valid (int): leaves ``[0, num_valid)`` may be drawn (as in
                :meth:`sample_prioritized`).
            exclude (array or tensor of ints): the leaves set to zero, in any order; repeats
                and values past the tree's leaves are ignored.
            masses (callable): called once with the sum of the zeroed tree's leaves
                ``[0, num_valid)`` (a float, as :meth:`query` gives it), under the tree's
                lock (so it must not call this tree); returns the prefix masses of the draws
                (array or tensor of reals). It may raise, to refuse the draw (nothing is
                drawn then).

        Keyword Args:
            relative_to (float, optional): as in :meth:`sample_prioritized`.

        Returns:
            ``(index, priority)``: int64 indices and their leaf values (tree dtype), numpy
            arrays.

        Raises:
            IndexError: when ``num_valid`` is below 1, or a value of ``exclude`` is negative.
            ValueError: for a NaN mass.
            RuntimeError: when no leaf below ``num_valid`` outside ``exclude`` is positive.
        """
        cdef int64_t n, nv, mass_end, m, need, bad = 0
        cdef int rc = RP_OK
        cdef double p_sum
        cdef const int64_t[::1] ev
        cdef const double[::1] mv
        cdef int64_t[::1] oi
        cdef float[::1] p32
        cdef double[::1] p64
        cdef int64_t[::1] ib
        cdef double[::1] vb
        cdef const int64_t *eptr = NULL
        cdef const double *mptr = NULL
        cdef rp_segtree_zeroed z
        wanted = _num_valid(num_valid)
        ex = _as_index_array(exclude, "exclude")
        with self._lock:
            self._draw_range(wanted, &mass_end, &nv)
            # The kernel checks the list as it reads it (strictly increasing, within the
            # leaves): any other list is sorted, deduplicated and cut here, then read again.
            for attempt in range(2):
                m = ex.shape[0]
                eptr = NULL
                if m:
                    ev = ex
                    eptr = &ev[0]
                need = rp_segtree_zeroed_scratch(&self._layout, m)
                # kept between calls (and used under the lock): fresh ones cost page faults
                if self._zeroed_scratch is None or self._zeroed_scratch[0].shape[0] <= need:
                    self._zeroed_scratch = (np.empty(need + 1, dtype=np.int64), np.empty(need + 1, dtype=np.float64))
                ib = self._zeroed_scratch[0]
                vb = self._zeroed_scratch[1]
                with nogil:
                    if self._fp64:
                        rc = rp_sumtree_zeroed_build_f64(&self._layout, self._t64, eptr, m, &ib[0], &vb[0], need, &z, &bad)
                    else:
                        rc = rp_sumtree_zeroed_build_f32(&self._layout, self._t32, eptr, m, &ib[0], &vb[0], need, &z, &bad)
                if rc != RP_ERR_INDEX or attempt:
                    break
                ex = np.unique(ex)
                if ex.shape[0] and ex[0] < 0:
                    raise IndexError(f"exclude value {int(ex[0])} is negative")
                ex = np.ascontiguousarray(ex[ex < self._layout.size])
            if rc != RP_OK:
                raise RuntimeError(f"unexpected kernel return code {rc} (bad={bad})")
            with nogil:
                if self._fp64:
                    p_sum = rp_sumtree_zeroed_query_f64(&self._layout, self._t64, &z, 0, mass_end)
                else:
                    p_sum = rp_sumtree_zeroed_query_f32(&self._layout, self._t32, &z, 0, mass_end)
            us = _as_value_array(masses(p_sum), np.float64, "mass")
            n = us.shape[0]
            out_index = np.empty(n, dtype=np.int64)
            out_priority = np.empty(n, dtype=self._dtype)
            if n:
                mv = us
                mptr = &mv[0]
                oi = out_index
                if self._fp64:
                    p64 = out_priority
                    with nogil:
                        rc = rp_sumtree_zeroed_sample_masses_f64(&self._layout, self._t64, &z, nv, mptr, n,
                                                                 &oi[0], &p64[0], &bad)
                else:
                    p32 = out_priority
                    with nogil:
                        rc = rp_sumtree_zeroed_sample_masses_f32(&self._layout, self._t32, &z, nv, mptr, n,
                                                                 &oi[0], &p32[0], &bad)
        if rc == RP_ERR_VALUE:
            raise ValueError(f"mass {us[bad]} at position {bad} is NaN")
        if rc == RP_ERR_EMPTY:
            raise RuntimeError(
                f"no positive priority among the first {num_valid} leaves outside the "
                f"{m} excluded ones: cannot sample")
        if rc != RP_OK:
            raise IndexError(f"num_valid={num_valid}: a tree of size {self._size} has no leaf to draw")
        if relative_to is not None:
            _divide_in_place(out_priority, self._fp64, relative_to)
        return out_index, out_priority

cdef class SumSegmentTreeFp32(_SumSegmentTree):
    """A sum segment tree over float32 leaves; drop-in for ``torchrl._torchrl.SumSegmentTreeFp32``.

    Args:
        size (int): the number of leaves. Every leaf starts at 0.
    """

    def __init__(self, size):
        self._setup(size, False, False)


cdef class SumSegmentTreeFp64(_SumSegmentTree):
    """A sum segment tree over float64 leaves; drop-in for ``torchrl._torchrl.SumSegmentTreeFp64``.

    Args:
        size (int): the number of leaves. Every leaf starts at 0.
    """

    def __init__(self, size):
        self._setup(size, True, False)


cdef class MinSegmentTreeFp32(_SegmentTree):
    """A min segment tree over float32 leaves; drop-in for ``torchrl._torchrl.MinSegmentTreeFp32``.

    Args:
        size (int): the number of leaves. Every leaf starts at the largest finite float32.
    """

    def __init__(self, size):
        self._setup(size, False, True)


cdef class MinSegmentTreeFp64(_SegmentTree):
    """A min segment tree over float64 leaves; drop-in for ``torchrl._torchrl.MinSegmentTreeFp64``.

    Args:
        size (int): the number of leaves. Every leaf starts at the largest finite float64.
    """

    def __init__(self, size):
        self._setup(size, True, True)


cdef inline double _stored_at(const void *values, bint fp64, int64_t k) noexcept:
    """Entry ``k`` of the tree-dtype buffer ``values`` handed to a kernel (``_value_data``)."""
    return (<const double *>values)[k] if fp64 else (<const float *>values)[k]


cdef object _value_data(object x, _SegmentTree tree, str name, const void **data, int64_t *n):
    """``x`` flattened to ``tree``'s dtype: sets ``data`` and ``n`` and returns the owner."""
    cdef const float *f32 = NULL
    cdef const double *f64 = NULL
    if not _is_plain_cpu_tensor(x, _TORCH_FLOAT64 if tree._fp64 else _TORCH_FLOAT32):
        x = _as_value_array(x, tree._dtype, name)
    owner = _real_data(x, name, &f32, &f64, n)
    data[0] = <const void *>f64 if tree._fp64 else <const void *>f32
    return owner


def update_priority_pair(_SumSegmentTree sum_tree not None, _SegmentTree min_tree not None, index, value, priority):
    """Write one prioritized-replay update into a sum tree and its min tree, checked first.

    The update step of :class:`~torchrl.data.PrioritizedSampler` in one call: the indices,
    the raw priorities and the values stored in both trees are checked in one pass, the
    largest priority is located in the same pass, and both trees are written under their
    locks. Nothing is written when anything is wrong.

    Args:
        sum_tree (SumSegmentTreeFp32 or SumSegmentTreeFp64): the sum tree.
        min_tree (MinSegmentTreeFp32 or MinSegmentTreeFp64): its min tree, of the same size
            and dtype.
        index (1-D integers): the leaves; negative entries are skipped (writers mark the
            items to leave alone with -1).
        value (scalar or 1-D reals): what both trees store at ``index`` (for example
            ``(priority + eps) ** alpha``), one per index or one for all; cast to the trees'
            dtype.
        priority (scalar or 1-D reals): the raw priorities, one per index or one for all;
            those at kept indices must be finite and non-negative.

    Returns:
        the position in ``index`` of the first largest kept priority, or -1 when every
        index is negative (nothing is written then).

    Raises:
        IndexError: for an index at or past the trees' capacity (naming it and its position).
        ValueError: for a NaN, negative or infinite priority or value, a batch after which
            the sum tree's total would overflow, or mismatched sizes.
        TypeError: for trees of different dtypes or kinds, or non-integer indices.

    Examples:
        >>> import torch, replay
        >>> sum_tree, min_tree = replay.SumSegmentTreeFp32(4), replay.MinSegmentTreeFp32(4)
        >>> replay.update_priority_pair(sum_tree, min_tree, torch.tensor([2, -1, 0]),
        ...                             torch.tensor([3.0, 9.0, 1.0]), torch.tensor([3.0, 9.0, 1.0]))
        0
        >>> sum_tree.query(0, 4), min_tree.query(0, 4)
        (4.0, 1.0)
    """
    cdef const int64_t *iptr = NULL
    cdef const void *vptr = NULL
    cdef const float *p32 = NULL
    cdef const double *p64 = NULL
    cdef int64_t n, n_value, n_priority, v_stride, p_stride, skipped = 0, argmax = -1, bad = 0
    cdef int rc
    _check_tree_pair(sum_tree, min_tree, "update_priority_pair")
    idx_owner = _int64_data(index, "index", &iptr, &n)
    if _is_scalar_real(value):
        value = np.array([value], dtype=sum_tree._dtype)
    value_owner = _value_data(value, sum_tree, "value", &vptr, &n_value)
    p_owner = _real_data(priority, "priority", &p32, &p64, &n_priority)
    for name, count in (("value", n_value), ("priority", n_priority)):
        if count != n and count != 1:
            raise ValueError(
                f"{name} must be a scalar or hold as many elements as index, got {name} of "
                f"shape {_shape_of(value if name == 'value' else priority)} and index of shape "
                f"{_shape_of(index)}")
    if n == 0:
        return -1
    v_stride = 0 if n_value == 1 else 1
    p_stride = 0 if n_priority == 1 else 1
    rc = _scan_priorities(iptr, n, min(sum_tree._layout.size, min_tree._layout.size), p32, p64,
                          p_stride, &skipped, &argmax, &bad)
    if rc == RP_ERR_INDEX and 0 <= iptr[bad] < sum_tree._capacity:
        # A leaf past the allocated ones (a storage longer than the trees): both grow, once.
        sum_tree._grow_for(sum_tree._capacity - 1)
        min_tree._grow_for(min_tree._capacity - 1)
        rc = _scan_priorities(iptr, n, sum_tree._capacity, p32, p64, p_stride, &skipped,
                              &argmax, &bad)
    if rc == RP_ERR_INDEX:
        raise IndexError(_index_message(iptr[bad], bad, sum_tree._size, sum_tree._capacity))
    if rc == RP_ERR_VALUE:
        bad_priority = p32[bad * p_stride] if p32 != NULL else p64[bad * p_stride]
        raise ValueError(
            f"priority must be finite and non-negative, got priority={bad_priority} at position {bad}")
    if argmax < 0:
        return -1
    if skipped:
        # Rare (a writer skipped items): keep the non-negative indices and their values.
        idx_arr = _as_index_array(index, "index")
        keep = idx_arr >= 0
        idx_owner = np.ascontiguousarray(idx_arr[keep])
        iptr = NULL
        idx_owner = _int64_data(idx_owner, "index", &iptr, &n)
        if v_stride:
            value_owner = np.ascontiguousarray(_as_value_array(value, sum_tree._dtype, "value")[keep])
            value_owner = _value_data(value_owner, sum_tree, "value", &vptr, &n_value)
    with sum_tree._lock, min_tree._lock:
        # The sum tree's checks run first and refuse all the min tree would (and a total
        # that would overflow): nothing is written then.
        rc = sum_tree._write(iptr, vptr, v_stride, n, &bad)
        if rc == RP_OK:
            rc = min_tree._write(iptr, vptr, v_stride, n, &bad)
    if rc != RP_OK:
        sum_tree._raise_write_error(rc, bad, iptr, vptr, v_stride, n, value_owner)
    return argmax


cdef _check_tree_pair(_SegmentTree sum_tree, _SegmentTree min_tree, str caller):
    """TypeError unless ``sum_tree`` / ``min_tree`` are a sum tree and a min tree of one size and dtype."""
    if sum_tree._is_min or not min_tree._is_min:
        raise TypeError(f"{caller} takes a sum tree, then a min tree")
    if sum_tree._fp64 != min_tree._fp64 or sum_tree._size != min_tree._size:
        raise TypeError(
            f"the trees must share a size and dtype, got {sum_tree!r} ({sum_tree._dtype}) and "
            f"{min_tree!r} ({min_tree._dtype})")


cdef int _scan_priorities(const int64_t *iptr, int64_t n, int64_t size, const float *p32,
                          const double *p64, int64_t p_stride, int64_t *skipped, int64_t *argmax,
                          int64_t *bad) noexcept:
    """``rp_priority_scan`` of the priorities' dtype (one of ``p32`` / ``p64`` is set)."""
    cdef int rc
    with nogil:
        if p32 != NULL:
            rc = rp_priority_scan_f32(iptr, n, size, p32, p_stride, skipped, argmax, bad)
        else:
            rc = rp_priority_scan_f64(iptr, n, size, p64, p_stride, skipped, argmax, bad)
    return rc


# The most runs of consecutive leaves fill_priority_pair writes as ranges: a round-robin
# write is one run, or two when it wraps around the storage.
cdef int64_t _MAX_FILL_RUNS = 2


def fill_priority_pair(_SumSegmentTree sum_tree not None, _SegmentTree min_tree not None, index, value):
    """Set the leaves ``index`` of a sum tree and its min tree to one value, written as ranges.

    The write of a default priority for new items: the rows a round-robin writer fills are
    one run of consecutive leaves (two when they wrap), and each run is filled whole, its
    parents refreshed once per node, with no scatter through the index. Trees and errors are
    those of :func:`update_priority_pair` with a scalar value (the trees end bit for bit the
    same); nothing is written when anything is wrong.

    Args:
        sum_tree (SumSegmentTreeFp32 or SumSegmentTreeFp64): the sum tree.
        min_tree (MinSegmentTreeFp32 or MinSegmentTreeFp64): its min tree, of the same size
            and dtype.
        index (1-D integers): the leaves, in [0, capacity).
        value (float): what both trees store at every leaf of ``index``, cast to their dtype.

    Returns:
        ``True`` once written (or for an empty ``index``); ``False``, having written nothing,
        when ``index`` is not one or two runs of consecutive leaves
        (:func:`update_priority_pair` takes those).

    Raises:
        IndexError: for a leaf outside ``[0, capacity)`` (naming it and its position).
        ValueError: for a value a sum tree cannot hold (NaN, negative or infinite in the
            trees' dtype), or one after which its total would overflow.
        TypeError: for trees of different dtypes or kinds, non-integer indices or a value
            that is not a real number.

    Examples:
        >>> import torch, replay
        >>> sum_tree, min_tree = replay.SumSegmentTreeFp32(8), replay.MinSegmentTreeFp32(8)
        >>> replay.fill_priority_pair(sum_tree, min_tree, torch.tensor([6, 7, 0, 1]), 0.5)
        True
        >>> sum_tree.query(0, 8), min_tree.query(0, 8), sum_tree.values().tolist()
        (2.0, 0.5, [0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5])
        >>> replay.fill_priority_pair(sum_tree, min_tree, torch.tensor([1, 3, 5]), 0.5)
        False
    """
    cdef const int64_t *iptr = NULL
    cdef int64_t n, n_runs = 0, r, first, bad = 0
    cdef int64_t bounds[4]
    cdef float v32
    cdef double v64
    cdef const void *vptr
    cdef int rc = RP_OK
    _check_tree_pair(sum_tree, min_tree, "fill_priority_pair")
    if not _is_scalar_real(value):
        raise TypeError(f"value must be a real number, got {type(value).__name__}")
    idx_owner = _int64_data(index, "index", &iptr, &n)
    if n == 0:
        return True
    if rp_segtree_index_runs(iptr, n, _MAX_FILL_RUNS, bounds, &n_runs, &bad) != RP_OK:
        return False
    # Every run inside [0, capacity) before anything is written; a leaf past the allocated
    # ones (a storage longer than the trees) grows both, once, as update_priority_pair does.
    first = 0
    for r in range(n_runs):
        if bounds[2 * r] < 0:
            raise IndexError(_index_message(bounds[2 * r], first, sum_tree._size, sum_tree._capacity))
        if bounds[2 * r + 1] > sum_tree._capacity:
            raise IndexError(_index_message(sum_tree._capacity, first + sum_tree._capacity - bounds[2 * r],
                                            sum_tree._size, sum_tree._capacity))
        first += bounds[2 * r + 1] - bounds[2 * r]
    for r in range(n_runs):
        if bounds[2 * r + 1] > sum_tree._layout.size:
            sum_tree._grow_for(sum_tree._capacity - 1)
            min_tree._grow_for(min_tree._capacity - 1)
    v64 = value
    v32 = <float>v64  # IEEE round to nearest (past the largest float: inf), as numpy casts
    vptr = <const void *>&v64 if sum_tree._fp64 else <const void *>&v32
    with sum_tree._lock, min_tree._lock:
        # The sum tree refuses all the min tree would (and a total that would overflow).
        rc = _fill_ranges(sum_tree, bounds, n_runs, vptr, n, &bad)
        if rc == RP_OK:
            rc = _fill_ranges(min_tree, bounds, n_runs, vptr, n, &bad)
    if rc != RP_OK:
        sum_tree._raise_write_error(rc, 0 if bad < 0 else bad, iptr, vptr, 0, n, value)
    return True


cdef int _fill_ranges(_SegmentTree tree, const int64_t *bounds, int64_t n_ranges, const void *vptr,
                      int64_t n, int64_t *bad) except? -100:
    """One fill-ranges kernel call (hold the tree's lock); ``n`` leaves in all."""
    cdef int rc
    cdef void *saved = NULL
    cdef int64_t r, stop = 0
    if not tree._is_min:
        saved = tree._saved_scratch(n)
    with nogil:
        for r in range(n_ranges):
            if bounds[2 * r + 1] > stop:
                stop = bounds[2 * r + 1]
        tree._reach(stop)
        if tree._fp64:
            if tree._is_min:
                rc = rp_mintree_fill_ranges_f64(&tree._layout, tree._t64, bounds, n_ranges, (<const double *>vptr)[0], bad)
            else:
                rc = rp_sumtree_fill_ranges_f64(&tree._layout, tree._t64, bounds, n_ranges, (<const double *>vptr)[0],
                                                <double *>saved, n, bad)
        else:
            if tree._is_min:
                rc = rp_mintree_fill_ranges_f32(&tree._layout, tree._t32, bounds, n_ranges, (<const float *>vptr)[0], bad)
            else:
                rc = rp_sumtree_fill_ranges_f32(&tree._layout, tree._t32, bounds, n_ranges, (<const float *>vptr)[0],
                                                <float *>saved, n, bad)
    return rc


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
        last = arr.shape[0] - 1  # explicit: wraparound is off in this module
        np.not_equal(arr[:last], arr[1:], out=flags[:last])
        if at_capacity:
            np.not_equal(arr[last], arr[0], out=flags[last])
        else:
            flags[last] = True
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


_EMPTY_SLICES = "every slice is empty: there is no row to sample"


cdef int64_t _span_code(object span, str name) except? -2:
    """A span entry as rp_slice_sample_index's code: False / 0, True, or a positive int."""
    if span is True:
        return RP_SPAN_ALL
    if span is False or span is None:
        return RP_SPAN_NONE
    if not _is_scalar_int(span) or span < 0:
        raise ValueError(f"{name} must be a bool or a non-negative int, got {span!r}")
    return span


def sample_slice_index(start, lengths, traj, uniform, seq_length, storage_length, *,
                       span=(False, False), flags=None):
    """Storage indices and truncation flags of sampled slices, from the sampler's draws.

    The index step of torchrl's ``SliceSampler._get_index`` in one C pass: slice ``k`` lies
    in trajectory ``traj[k]`` (a row of ``start`` / ``lengths``) and starts
    ``floor(uniform[k] * (hi - lo)) + lo`` steps into it, computed in the precision of
    ``uniform`` as torch computes it, where ``[lo, hi)`` is the range of starts that keeps
    the slice within the trajectory, widened by ``span``. Slices that start before the
    trajectory (left span) or run past its end (right span) are shortened accordingly.

    Args:
        start (torch.Tensor): ``[num_traj, ndim]`` int64 first rows of the trajectories.
        lengths (torch.Tensor): ``[num_traj]`` int64 trajectory lengths.
        traj (torch.Tensor): ``[num_slices]`` integer trajectory of each slice.
        uniform (torch.Tensor): ``[num_slices]`` draws in ``[0, 1)`` (float32 or float64).
        seq_length (int or torch.Tensor): the requested length of every slice, or a
            ``[num_slices]`` tensor of per-slice lengths.
        storage_length (int): the storage's time length; rows wrap modulo it.

    Keyword Args:
        span (tuple): ``(left, right)`` as in ``SliceSampler``: ``False`` (or 0), ``True``
            or a positive int each.
        flags (sequence, optional): bool columns of the storage (``[storage rows, 1]`` CPU
            tensors, or ``None`` entries) to read at the rows sampled, e.g. the ``done`` and
            ``terminated`` entries; 1-D storages (``ndim == 1``) only.

    Returns:
        ``(index, truncated)``: the int64 ``[rows, ndim]`` indices, slice after slice, and
        the bool ``[rows, 1]`` flags marking the last row of every slice, as torch tensors
        (numpy arrays when ``start`` is not a tensor); with ``flags``, a third item: the list
        of those columns read at the rows (bool ``[rows, 1]`` tensors, ``None`` for ``None``).

    Raises:
        IndexError: for a ``traj`` entry outside ``[0, num_traj)``.
        ValueError: for a negative length, a span leaving a slice a negative length, a
            ``storage_length`` below 1, mismatched shapes, or when every slice is empty.

    Examples:
        >>> import torch, replay
        >>> start, lengths = torch.tensor([[0], [5]]), torch.tensor([5, 3])
        >>> index, truncated = replay.sample_slice_index(
        ...     start, lengths, torch.tensor([1, 0]), torch.tensor([0.0, 0.99]), 2, 8)
        >>> index.flatten().tolist(), truncated.flatten().tolist()
        ([5, 6, 3, 4], [False, True, False, True])
    """
    cdef const int64_t *start_ptr = NULL
    cdef const int64_t *length_ptr = NULL
    cdef const int64_t *traj_ptr = NULL
    cdef int64_t m, n, numel, ndim

    # start: [num_traj, ndim] (a 1-D start is [num_traj, 1])
    shape = _shape_of(start)
    if len(shape) == 1:
        ndim = 1
    elif len(shape) == 2:
        ndim = shape[1]
    else:
        raise ValueError(f"start must have shape [num_traj, ndim], got shape {tuple(shape)}")
    start_owner = _int64_data(start, "start", &start_ptr, &numel)
    m = shape[0]
    if ndim < 1:
        raise ValueError(f"start must have at least one column, got shape {tuple(shape)}")
    length_owner = _int64_data(lengths, "lengths", &length_ptr, &n)
    if n != m:
        raise ValueError(
            f"lengths must have shape ({m},) to match start of shape {tuple(shape)}, "
            f"got {_shape_of(lengths)}")
    traj_owner = _int64_data(traj, "traj", &traj_ptr, &n)
    return _slices_from_draws(start_ptr, length_ptr, m, ndim, traj_ptr, n, uniform, seq_length,
                              storage_length, span, flags, start, shape)


cdef object _slices_from_draws(const int64_t *start_ptr, const int64_t *length_ptr, int64_t m,
                               int64_t ndim, const int64_t *traj_ptr, int64_t n, object uniform,
                               object seq_length, object storage_length, object span,
                               object flags, object like, object shape):
    """:func:`sample_slice_index` once its trajectories and draws are read: checks the other
    arguments, runs the kernel, and returns its result (tensors when ``like`` is one)."""
    cdef const int64_t *seq_ptr = NULL
    cdef const float *u32 = NULL
    cdef const double *u64 = NULL
    cdef int64_t[:, ::1] out_view
    cdef uint8_t[::1] trunc_view
    cdef int64_t n_seq, numel, capacity, rows = 0, bad = 0, c_storage, left, right
    cdef int64_t steps = 0
    cdef bint uniform_length
    cdef int rc

    u_owner = _real_data(uniform, "uniform", &u32, &u64, &numel)
    if numel != n:
        raise ValueError(
            f"uniform must have shape ({n},) to match traj, got shape {_shape_of(uniform)}")
    uniform_length = _is_scalar_int(seq_length) or (
        (_is_tensor(seq_length) or isinstance(seq_length, np.ndarray)) and seq_length.ndim == 0)
    if uniform_length:
        steps = int(seq_length)
        if steps < 0:
            raise ValueError(f"seq_length must be non-negative, got seq_length={steps}")
        seq_ptr = &steps
        capacity = n * steps
    else:
        seq_owner = _int64_data(seq_length, "seq_length", &seq_ptr, &n_seq)
        if n_seq != n:
            raise ValueError(
                f"seq_length must have shape ({n},) to match traj, got shape {_shape_of(seq_length)}")
        capacity = 0
        for k in range(n):
            if seq_ptr[k] < 0:
                raise ValueError(
                    f"seq_length must be non-negative, got {seq_ptr[k]} at position {k}")
            capacity += seq_ptr[k]
    if _is_tensor(storage_length) or isinstance(storage_length, np.ndarray):
        storage_length = storage_length.item()
    c_storage = storage_length
    if c_storage < 1:
        raise ValueError(f"storage_length must be at least 1, got storage_length={storage_length}")
    left = _span_code(span[0], "span[0]")
    right = _span_code(span[1], "span[1]")

    out = np.empty((capacity, ndim), dtype=np.int64)
    truncated = np.empty((capacity, 1), dtype=np.bool_)
    if n == 0:
        return (_numpy_to_like(out, like), _numpy_to_like(truncated, like))
    if capacity == 0:
        raise ValueError(_EMPTY_SLICES)
    out_view = out
    trunc_view = truncated.view(np.uint8).reshape(-1)
    with nogil:
        rc = rp_slice_sample_index(start_ptr, length_ptr, m, ndim, traj_ptr, u32, u64, n,
                                   seq_ptr, uniform_length, left, right, c_storage,
                                   &out_view[0, 0], &trunc_view[0], &rows, &bad)
    if rc == RP_ERR_INDEX:
        raise IndexError(
            f"traj value {traj_ptr[bad]} at position {bad} is out of range for {m} trajectories")
    if rc == RP_ERR_VALUE:
        raise ValueError(f"the span leaves slice {bad} a negative length")
    if rc == RP_ERR_EMPTY:
        raise ValueError(_EMPTY_SLICES)
    if rows != capacity:
        out = out[:rows]
        truncated = truncated[:rows]
    result = (_numpy_to_like(out, like), _numpy_to_like(truncated, like))
    if flags is None:
        return result
    if ndim != 1:
        raise ValueError(f"flags are read for 1-D storages only, got start of shape {tuple(shape)}")
    return result + ([_gather_flags(column, out, rows) for column in flags],)


cdef object _gather_flags(object column, object rows_array, int64_t n):
    """``column[rows]`` for a bool column of one byte per storage row, as a [n, 1] tensor."""
    cdef const int64_t[::1] row_view
    cdef const uint8_t[::1] flag_view
    cdef uint8_t[::1] out_view
    cdef int64_t bad = 0
    cdef int rc
    cdef const uint8_t *flag_ptr = NULL
    cdef int64_t length
    if column is None:
        return None
    if _is_plain_cpu_tensor(column, _TORCH_BOOL) and column.dim() in (1, 2) and column.numel() == column.shape[0]:
        length = column.shape[0]
        flag_ptr = <const uint8_t *><uintptr_t>column.data_ptr()  # torch.bool is one byte
        owner = column
    else:
        arr = _as_array(column)
        if arr.dtype != np.bool_ or arr.ndim not in (1, 2) or (arr.ndim == 2 and arr.shape[1] != 1):
            raise ValueError(
                f"flags must be bool columns of shape [rows] or [rows, 1], got {arr.dtype} of "
                f"shape {tuple(arr.shape)}")
        owner = np.ascontiguousarray(arr.reshape(-1)).view(np.uint8)
        length = owner.shape[0]
        if length:
            flag_view = owner
            flag_ptr = &flag_view[0]
    out = np.empty((n, 1), dtype=np.bool_)
    if n:
        row_view = rows_array.reshape(-1)
        out_view = out.view(np.uint8).reshape(-1)
        with nogil:
            rc = rp_slice_gather_flags(flag_ptr, length, &row_view[0], n, &out_view[0], &bad)
        if rc != RP_OK:
            raise IndexError(
                f"row {row_view[bad]} at position {bad} is out of range for flags of {length} rows")
    return _from_numpy(out)


def patch_ends(ends, rows, flags):
    """Sorted end rows with some rows read again.

    Args:
        ends (np.ndarray): strictly increasing int64 end rows.
        rows (np.ndarray): strictly increasing int64 rows read again.
        flags (np.ndarray): one bool (or byte) per row, true where the row is an end now.

    Returns:
        the updated strictly increasing int64 ends: ``ends`` itself when nothing changed, a
        new array otherwise.

    Raises:
        ValueError: for rows that are not strictly increasing, or mismatched sizes.

    Examples:
        >>> import numpy as np, replay
        >>> replay.patch_ends(np.array([2, 5, 9]), np.array([5, 6]), np.array([False, True])).tolist()
        [2, 6, 9]
    """
    cdef const int64_t *ends_ptr = NULL
    cdef const int64_t *rows_ptr = NULL
    cdef const uint8_t[::1] flag_view
    cdef int64_t[::1] out_view
    cdef int64_t n_ends, n_rows, n_out = 0
    cdef int changed = 0
    cdef int rc
    ends_owner = _int64_data(ends, "ends", &ends_ptr, &n_ends)
    rows_owner = _int64_data(rows, "rows", &rows_ptr, &n_rows)
    flag_arr = np.ascontiguousarray(_as_array(flags).reshape(-1))
    if flag_arr.dtype != np.uint8:
        flag_arr = (flag_arr != 0).view(np.uint8)
    if flag_arr.shape[0] != n_rows:
        raise ValueError(
            f"flags must hold one value per row, got {flag_arr.shape[0]} flags for {n_rows} rows")
    if n_rows == 0:
        return ends
    flag_view = flag_arr
    out = np.empty(n_ends + n_rows, dtype=np.int64)
    out_view = out
    with nogil:
        rc = rp_slice_patch_ends(ends_ptr, n_ends, rows_ptr, &flag_view[0], n_rows,
                                 &out_view[0], &n_out, &changed)
    if rc != RP_OK:
        raise ValueError(f"rows must be strictly increasing, got {rows_ptr[n_out]} at position {n_out}")
    return out[:n_out] if changed else ends


def bounds_from_ends(ends, limit, length, forced=()):
    """Start, stop and length of the trajectories of a 1-D signal, from its sorted end rows.

    What :func:`find_start_stop_traj` returns for a 1-D signal whose ends (after its cursor
    and closing rules) are the entries of ``ends`` below ``limit`` plus the ``forced`` rows,
    computed in O(number of ends) instead of a pass over the signal.

    Args:
        ends (np.ndarray): strictly increasing int64 rows where the signal ends a trajectory.
        limit (int): only the ends below it count (the filled part of the signal).
        length (int): the number of rows of the signal (at least 1).
        forced (sequence of int, optional): rows that end a trajectory whatever ``ends`` says
            (the cursor row, the last row); ``-1`` entries are skipped; at most 8.

    Returns:
        ``(start, stop, lengths)``: int64 arrays of shapes ``[n, 1]``, ``[n, 1]``, ``[n]``.

    Examples:
        >>> import numpy as np, replay
        >>> start, stop, lengths = replay.bounds_from_ends(np.array([1, 4]), 6, 6)
        >>> start.ravel().tolist(), stop.ravel().tolist(), lengths.tolist()
        ([5, 2], [1, 4], [3, 3])
    """
    cdef const int64_t *ends_ptr = NULL
    cdef int64_t forced_rows[RP_SLICE_MAX_FORCED]
    cdef int64_t[:, ::1] start_view
    cdef int64_t[:, ::1] stop_view
    cdef int64_t[::1] length_view
    cdef int64_t n_ends, n_forced, n_out = 0, c_limit = limit, c_length = length
    cdef int rc
    ends_owner = _int64_data(ends, "ends", &ends_ptr, &n_ends)
    n_forced = _forced_rows(forced, length, forced_rows)
    start = np.empty((n_ends + n_forced + 1, 1), dtype=np.int64)
    stop = np.empty((n_ends + n_forced + 1, 1), dtype=np.int64)
    lengths = np.empty(n_ends + n_forced + 1, dtype=np.int64)
    start_view = start
    stop_view = stop
    length_view = lengths
    with nogil:
        rc = rp_slice_bounds_from_ends(ends_ptr, n_ends, c_limit, c_length, forced_rows, n_forced,
                                       &start_view[0, 0], &stop_view[0, 0], &length_view[0],
                                       &n_out)
    if rc != RP_OK:
        raise ValueError(_forced_message(forced, length))
    return start[:n_out], stop[:n_out], lengths[:n_out]


cdef int64_t _forced_rows(object forced, object length, int64_t *rows) except -1:
    """Copies the forced rows of :func:`bounds_from_ends` (at most RP_SLICE_MAX_FORCED) into
    ``rows`` and returns how many; checks ``length`` too (their range is the kernel's check)."""
    cdef int64_t n = 0
    for row in forced:
        if n == RP_SLICE_MAX_FORCED:
            raise ValueError(f"at most {RP_SLICE_MAX_FORCED} forced rows, got {len(forced)}")
        rows[n] = row
        n += 1
    if length < 1:
        raise ValueError(f"length must be at least 1, got length={length}")
    return n


cdef str _forced_message(object forced, object length):
    return f"forced rows must lie in [-1, {length}), got {list(forced)}"


def patch_ends_run(ends, lo, hi, flags):
    """Sorted end rows with one run of rows read again: :func:`patch_ends` for the rows
    ``lo, lo + 1, ..., hi - 1`` (what a round-robin write touches), without listing them.

    Args:
        ends (np.ndarray): strictly increasing int64 end rows.
        lo (int): the first row read again (``>= 0``).
        hi (int): one past the last row read again (``>= lo``).
        flags (np.ndarray): ``hi - lo`` bools (or bytes), true where row ``lo + j`` is an end
            now: typically the end signal's own ``[lo:hi]`` view.

    Returns:
        the updated strictly increasing int64 ends: ``ends`` itself when nothing changed, a
        new array otherwise.

    Raises:
        ValueError: for ``lo < 0``, ``hi < lo``, or a number of flags other than ``hi - lo``.

    Examples:
        >>> import numpy as np, replay
        >>> replay.patch_ends_run(np.array([2, 5, 9]), 4, 7, np.array([False, False, True])).tolist()
        [2, 6, 9]
    """
    cdef const int64_t *ends_ptr = NULL
    cdef const uint8_t[::1] flag_view
    cdef int64_t[::1] out_view
    cdef int64_t n_ends, c_lo = lo, c_hi = hi, n_out = 0
    cdef int changed = 0
    cdef int rc
    ends_owner = _int64_data(ends, "ends", &ends_ptr, &n_ends)
    if c_lo < 0 or c_hi < c_lo:
        raise ValueError(f"the rows read again must satisfy 0 <= lo <= hi, got lo={lo}, hi={hi}")
    flag_arr = _flag_bytes(flags)
    if flag_arr.shape[0] != c_hi - c_lo:
        raise ValueError(
            f"flags must hold one value per row, got {flag_arr.shape[0]} flags for rows "
            f"[{lo}, {hi})")
    if c_hi == c_lo:
        return ends
    flag_view = flag_arr
    out = np.empty(n_ends + c_hi - c_lo, dtype=np.int64)
    out_view = out
    with nogil:
        rc = rp_slice_patch_ends_run(ends_ptr, n_ends, c_lo, c_hi, &flag_view[0], &out_view[0],
                                     &n_out, &changed)
    if rc != RP_OK:  # the arguments were checked above
        raise ValueError(f"patch_ends_run() got lo={lo}, hi={hi}")
    return out[:n_out] if changed else ends


# Rows of ends a scan makes room for at first (doubled while they come).
cdef int64_t _SCAN_FIRST_ROOM = 1 << 12


def scan_ends(signal, *, from_ids=False):
    """The sorted rows where a 1-D end signal is nonzero, or where trajectory ids change: what
    ``np.flatnonzero(signal)`` (``np.flatnonzero(ids[:-1] != ids[1:])``) gives, in one pass
    over the signal, without copying it or building a temporary of its size.

    Args:
        signal (np.ndarray or torch.Tensor): a 1-D array on the CPU, of any strides: integer
            or (without ``from_ids``) bool or float values, in native byte order. A bool
            byte other than 0 and 1 counts as an end, as ``find_start_stop_traj`` reads it.

    Keyword Args:
        from_ids (bool, optional): if ``True``, ``signal`` holds integer trajectory ids and
            row ``t`` is listed when ``signal[t] != signal[t + 1]``. Defaults to ``False``.

    Returns:
        the strictly increasing int64 rows.

    Raises:
        ValueError: for a signal that is not 1-D.
        TypeError: for a dtype not read here (complex, float or bool ids, objects,
            non-native byte order), named in the message: ``np.flatnonzero`` reads those.

    Examples:
        >>> import numpy as np, replay
        >>> replay.scan_ends(np.array([0, 1, 0, 0, 3])).tolist()
        [1, 4]
        >>> replay.scan_ends(np.array([7, 7, 2, 2, 2, 5]), from_ids=True).tolist()
        [1, 4]

    .. note:: The scan releases the GIL and reads each element once: a signal written
        meanwhile (by another thread or process) gives rows from its old and new values,
        never an error.
    """
    cdef int64_t length, stride, row = 0, stop, n = 0, got = 0, room
    cdef int width
    cdef uint64_t mask
    cdef bint ids = bool(from_ids)
    cdef const void *data
    cdef int64_t[::1] out_view
    arr = _as_array(signal)
    if arr.ndim != 1:
        raise ValueError(f"scan_ends() needs a 1-D signal, got one of shape {tuple(arr.shape)}")
    dtype = arr.dtype
    width = dtype.itemsize
    kind = dtype.kind
    if not dtype.isnative or width not in (1, 2, 4, 8) or not (
            kind in "iu" or (kind in "bf" and not ids)):
        what = "trajectory ids" if ids else "an end signal"
        raise TypeError(f"scan_ends() does not read {what} of dtype {dtype}")
    # floats: every bit but the sign, so that -0.0 is zero and NaN is not
    mask = (~<uint64_t>0) >> (64 - 8 * width) if kind != "f" else (~<uint64_t>0) >> (65 - 8 * width)
    length = arr.shape[0]
    stride = arr.strides[0]
    stop = length - 1 if ids else length
    room = min(max(stop, 0), _SCAN_FIRST_ROOM)
    out = np.empty(room, dtype=np.int64)
    data = <const void *><uintptr_t>arr.ctypes.data
    while row < stop:
        if n == room:
            room = min(2 * room, stop)
            grown = np.empty(room, dtype=np.int64)
            grown[:n] = out[:n]
            out = grown
        out_view = out
        with nogil:
            row = rp_slice_scan_ends(data, length, stride, width, mask, ids, row,
                                     &out_view[n], room - n, &got)
        if row < 0:  # the arguments were checked above
            raise ValueError(f"scan_ends() could not read a signal of dtype {dtype}")
        n += got
    return out[:n].copy() if n < room // 2 else out[:n]


cdef object _flag_bytes(object flags):
    """``flags`` as a C-contiguous 1-D uint8 array, nonzero where true: bool arrays are viewed
    as their bytes (not copied), other dtypes compared with 0."""
    arr = _as_array(flags).reshape(-1)
    if arr.dtype == np.bool_ or arr.dtype == np.uint8:
        return np.ascontiguousarray(arr).view(np.uint8)
    return (arr != 0).view(np.uint8)


def bounds_summary(ends, limit, length, forced=()):
    """How many trajectories :func:`bounds_from_ends` lists for these arguments, and the
    length of the shortest, without listing them.

    Args:
        ends, limit, length, forced: as for :func:`bounds_from_ends`.

    Returns:
        ``(count, shortest)``, two ints.

    Raises:
        ValueError, TypeError: where :func:`bounds_from_ends` raises them.

    Examples:
        >>> import numpy as np, replay
        >>> replay.bounds_summary(np.array([1, 4]), 6, 6, [2])
        (3, 1)
    """
    cdef const int64_t *ends_ptr = NULL
    cdef int64_t forced_rows[RP_SLICE_MAX_FORCED]
    cdef int64_t n_ends, n_forced, c_limit = limit, c_length = length, count = 0, shortest = 0
    cdef int64_t bad = 0
    cdef int rc
    ends_owner = _int64_data(ends, "ends", &ends_ptr, &n_ends)
    n_forced = _forced_rows(forced, length, forced_rows)
    with nogil:
        rc = rp_slice_bounds_summary(ends_ptr, n_ends, c_limit, c_length, forced_rows, n_forced,
                                     &count, &shortest, &bad)
    if rc != RP_OK:
        raise ValueError(_forced_message(forced, length))
    return count, shortest


def short_trajectories(ends, limit, length, forced, min_length):
    """The positions of the trajectories :func:`bounds_from_ends` lists whose length is below
    ``min_length`` (those a slice sampler with ``strict_length`` leaves out), without listing
    the trajectories.

    Args:
        ends, limit, length, forced: as for :func:`bounds_from_ends`.
        min_length (int): the shortest length kept.

    Returns:
        the increasing int64 positions, an index into the trajectories listed.

    Raises:
        ValueError, TypeError: where :func:`bounds_from_ends` raises them.

    Examples:
        >>> import numpy as np, replay
        >>> replay.short_trajectories(np.array([1, 4, 5, 9]), 10, 10, [], 3).tolist()
        [2]
    """
    cdef const int64_t *ends_ptr = NULL
    cdef int64_t forced_rows[RP_SLICE_MAX_FORCED]
    cdef int64_t n_ends, n_forced, c_limit = limit, c_length = length, c_min = min_length
    cdef int64_t n_out = 0, bad = 0, room = 16
    cdef int rc
    cdef int64_t[::1] out_view
    ends_owner = _int64_data(ends, "ends", &ends_ptr, &n_ends)
    n_forced = _forced_rows(forced, length, forced_rows)
    while True:
        out = np.empty(room, dtype=np.int64)
        out_view = out
        with nogil:
            rc = rp_slice_short_trajectories(ends_ptr, n_ends, c_limit, c_length, forced_rows, n_forced,
                                             c_min, &out_view[0], room, &n_out, &bad)
        if rc != RP_OK:
            raise ValueError(_forced_message(forced, length))
        if n_out <= room:
            return out[:n_out]
        room = n_out


# ---- Sequence windows (torchrl 0.14's sample units) ----------------------------------

_SEQUENCE_POLICIES = {
    "pad": RP_SEQUENCE_PAD,
    "stop": RP_SEQUENCE_STOP,
    "include_reset": RP_SEQUENCE_INCLUDE_RESET,
}


_SEQUENCE_DTYPES = (np.dtype(np.int64), np.dtype(np.bool_), np.dtype(np.int64), np.dtype(np.int64),
                    np.dtype(np.bool_))


def _sequence_outputs(int64_t size):
    """The five outputs of :func:`sequence_windows`, views of one block."""
    block = np.empty(size * 26, dtype=np.uint8)
    return (block[:8 * size].view(np.int64), block[24 * size:25 * size].view(np.bool_),
            block[8 * size:16 * size].view(np.int64), block[16 * size:24 * size].view(np.int64),
            block[25 * size:].view(np.bool_))


cdef object _reshaped_like(object array, object shape, object like):
    return _numpy_to_like(array.reshape(shape), like)


def boundary_distances(anchor, start, stop, length):
    """Distances of anchors to the first and last rows of their trajectories, as torchrl
    0.14's ``_boundary_distances_1d``: the trajectory of an anchor is the first whose stop is
    at or after it (by binary search, as ``torch.searchsorted``), the first one when none is,
    and both distances are taken modulo ``length``.

    Args:
        anchor (np.ndarray or torch.Tensor): integer rows, of any shape.
        start (np.ndarray or torch.Tensor): the first row of each trajectory, 1-D.
        stop (np.ndarray or torch.Tensor): the last row of each trajectory, 1-D, sorted.
        length (int): the storage's time length (the modulus).

    Returns:
        ``(distance_from_start, distance_to_stop)``, int64, of ``anchor``'s shape (tensors on
        its device when it is a tensor).

    Raises:
        TypeError: for non-integer inputs.
        ValueError: for ``start`` and ``stop`` of different shapes, no trajectory, or
            ``length < 1``.

    Examples:
        >>> import numpy as np, replay
        >>> stop = np.array([2, 4, 7]); start = np.array([8, 3, 5])
        >>> [d.tolist() for d in replay.boundary_distances(np.array([0, 4, 9]), start, stop, 10)]
        [[2, 1, 1], [2, 0, 3]]
    """
    cdef int64_t n, m, m_start, c_length, bad = 0
    cdef int rc = RP_OK
    cdef const int64_t *a_ptr = NULL
    cdef const int64_t *start_ptr = NULL
    cdef const int64_t *stop_ptr = NULL
    cdef int64_t[::1] out_view
    # (the plain-tensor fast path of _int64_data: no numpy view, no buffer acquisition)
    a_owner = _int64_data(anchor, "anchor", &a_ptr, &n)
    start_owner = _int64_data(start, "start", &start_ptr, &m_start)
    stop_owner = _int64_data(stop, "stop", &stop_ptr, &m)
    if m_start != m:
        raise ValueError(f"start and stop must have the same shape, got {m_start} and {m}")
    if m == 0:
        raise ValueError("boundary_distances() needs at least one trajectory, got an empty stop")
    if length < 1:
        raise ValueError(f"length must be at least 1, got length={length}")
    c_length = length
    # both outputs in one array: one allocation, one buffer acquisition
    out = np.empty((2, n), dtype=np.int64)
    if n:
        out_view = out.reshape(-1)
        with nogil:
            rc = rp_sequence_distances(a_ptr, n, start_ptr, stop_ptr, m, c_length,
                                       &out_view[0], &out_view[n], &bad)
    if rc != RP_OK:  # the arguments were checked above
        raise ValueError(f"boundary_distances() refused its arguments (code {rc})")
    shape = anchor.shape if _is_tensor(anchor) else np.shape(anchor)
    if len(shape) == 1:
        return _numpy_to_like(out[0], anchor), _numpy_to_like(out[1], anchor)
    return _reshaped_like(out[0], shape, anchor), _reshaped_like(out[1], shape, anchor)


def boundary_distances_nd(anchor, start, stop, stop_key, boundary_index, lane_stride, length):
    """The lane-aware :func:`boundary_distances`, as torchrl 0.14's ``_boundary_distances_nd``:
    an anchor ``(t, *lane)`` is looked up among the stops of its lane through the sorted
    ``stop_key`` (``lane * 2 * length + t``, a sentinel past each lane's last stop leading
    back to its first) and ``boundary_index`` (the trajectory of each key).

    Args:
        anchor (np.ndarray or torch.Tensor): ``[n, ndim]`` integer coordinates, time first.
        start (np.ndarray or torch.Tensor): ``[m, ndim]`` first rows of the trajectories.
        stop (np.ndarray or torch.Tensor): ``[m, ndim]`` last rows of the trajectories.
        stop_key (np.ndarray or torch.Tensor): the sorted search keys, 1-D.
        boundary_index (np.ndarray or torch.Tensor): the trajectory of each key.
        lane_stride (np.ndarray or torch.Tensor): ``ndim - 1`` strides flattening a lane.
        length (int): the storage's time length.

    Returns:
        ``(distance_from_start, distance_to_stop)``, two int64 ``[n]`` arrays (tensors on
        ``anchor``'s device when it is a tensor).

    Raises:
        TypeError: for non-integer inputs.
        ValueError: for shapes that do not fit together (both named), or ``length < 1``.
        IndexError: for an anchor whose key is past every key, or whose trajectory is outside
            ``start``, naming the anchor and its position.
    """
    cdef int64_t n, m, k, ndim, c_length, bad = 0
    cdef int rc = RP_OK
    cdef const int64_t[::1] a_view, start_view, stop_view, key_view, traj_view, stride_view
    cdef int64_t[::1] from_view, to_view
    a_shape = np.shape(_as_array(anchor))
    start_shape = np.shape(_as_array(start))
    stop_shape = np.shape(_as_array(stop))
    if len(a_shape) != 2 or len(start_shape) != 2 or start_shape != stop_shape or \
            a_shape[1] != start_shape[1]:
        raise ValueError(
            f"boundary_distances_nd() needs anchor [n, ndim] and start, stop [m, ndim], got "
            f"anchor {tuple(a_shape)}, start {tuple(start_shape)} and stop {tuple(stop_shape)}")
    ndim = a_shape[1]
    a = _as_index_array(anchor, "anchor")
    st = _as_index_array(start, "start")
    sp = _as_index_array(stop, "stop")
    keys = _as_index_array(stop_key, "stop_key")
    traj = _as_index_array(boundary_index, "boundary_index")
    strides = _as_index_array(lane_stride, "lane_stride")
    if keys.shape[0] != traj.shape[0]:
        raise ValueError(f"stop_key and boundary_index must have the same shape, got "
                         f"{keys.shape[0]} and {traj.shape[0]}")
    if strides.shape[0] != ndim - 1:
        raise ValueError(f"lane_stride must hold ndim - 1 = {ndim - 1} strides, got {strides.shape[0]}")
    if start_shape[0] == 0:
        raise ValueError("boundary_distances_nd() needs at least one trajectory, got an empty stop")
    if length < 1:
        raise ValueError(f"length must be at least 1, got length={length}")
    n, m, k, c_length = a_shape[0], start_shape[0], keys.shape[0], length
    distance_from_start = np.empty(n, dtype=np.int64)
    distance_to_stop = np.empty(n, dtype=np.int64)
    if n:
        # empty keys or strides have no first element: a one-element stand-in (never read past k)
        keys = keys if k else np.zeros(1, dtype=np.int64)
        traj = traj if k else np.zeros(1, dtype=np.int64)
        strides = strides if ndim > 1 else np.zeros(1, dtype=np.int64)
        a_view, start_view, stop_view = a, st, sp
        key_view, traj_view, stride_view = keys, traj, strides
        from_view, to_view = distance_from_start, distance_to_stop
        with nogil:
            rc = rp_sequence_distances_nd(&a_view[0], n, ndim, &start_view[0], &stop_view[0], m,
                                          &key_view[0], &traj_view[0], k, &stride_view[0],
                                          c_length, &from_view[0], &to_view[0], &bad)
    if rc == RP_ERR_INDEX:
        raise IndexError(f"anchor {a[bad * ndim:(bad + 1) * ndim].tolist()} at position {bad} "
                         f"has no trajectory among the {m} given (its key is past every stop_key, "
                         f"or boundary_index names no trajectory)")
    if rc != RP_OK:
        raise ValueError(f"boundary_distances_nd() refused its arguments (code {rc})")
    return _numpy_to_like(distance_from_start, anchor), _numpy_to_like(distance_to_stop, anchor)


def repeat_rows(rows, times, out=None):
    """Each row of a 1-D or 2-D int64 array repeated ``times`` times, in order: what
    ``np.repeat(rows, times, axis=0)`` gives, written into ``out`` when given (a C-contiguous
    int64 array of that shape). numpy's broadcasting copy of rows two values wide is ~10x
    slower.

    Examples:
        >>> import numpy as np, replay
        >>> replay.repeat_rows(np.array([[1, 2], [3, 4]]), 2).tolist()
        [[1, 2], [1, 2], [3, 4], [3, 4]]
    """
    cdef int64_t n, width, c_times
    cdef const int64_t[::1] rows_view
    cdef int64_t[::1] out_view
    arr = _as_array(rows)
    if arr.ndim not in (1, 2):
        raise ValueError(f"repeat_rows() needs a 1-D or 2-D array, got one of shape {tuple(arr.shape)}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"rows must hold integers, got an array of dtype {arr.dtype}")
    if isinstance(times, bool) or not isinstance(times, (int, np.integer)) or times < 0:
        raise ValueError(f"times must be an integer >= 0, got times={times!r}")
    arr = np.ascontiguousarray(arr, dtype=np.int64)
    shape = (arr.shape[0] * times, *arr.shape[1:])
    if out is None:
        out = np.empty(shape, dtype=np.int64)
    elif out.dtype != np.int64 or out.shape != shape or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous int64 array of shape {shape}, got {out.dtype} {out.shape}")
    n, width, c_times = arr.shape[0], (arr.shape[1] if arr.ndim == 2 else 1), times
    if n == 0 or width == 0 or c_times == 0:
        return out
    rows_view = arr.reshape(-1)
    out_view = out.reshape(-1)
    with nogil:
        rp_sequence_repeat_rows(&rows_view[0], n, width, c_times, &out_view[0])
    return out


def sequence_windows(end, anchor_time, anchor_group, burn_in, seq_length, bootstrap, dilation,
                     episode_boundary, *, length=None, cursor=None, close_last=False, newest=0,
                     oldest=0, out=None, anchor_out=None, stops=None):
    """The records torchrl 0.14's ``Sequence`` sample unit expands each anchor into, read from
    the end flags around the anchors only (no trajectory list, no cache to invalidate).

    Args:
        end (np.ndarray or torch.Tensor or None): the ``[length, *lanes]`` end-of-episode
            flags (nonzero = the last row of an episode), time first; ``None`` with
            ``"include_reset"``, or with ``stops``.
        anchor_time (np.ndarray or torch.Tensor): the anchors' rows, 1-D integers.
        anchor_group (np.ndarray or torch.Tensor or None): the anchors' lanes (flattened,
            row-major), or ``None`` for a storage without lanes.
        burn_in, seq_length, bootstrap, dilation (int): the window (``seq_length`` is
            ``Sequence``'s ``length``).
        episode_boundary (str): ``"pad"``, ``"stop"`` or ``"include_reset"``.

    Keyword Args:
        length (int, optional): the time length; ``end``'s first dimension when not given
            (required without ``end``).
        cursor (int, optional): a row forced to end every episode (the last written row of a
            full storage). Defaults to none.
        close_last (bool, optional): the last row ends every episode (a storage not full).
            Defaults to ``False``.
        newest, oldest (int, optional): the newest and oldest written rows
            (``"include_reset"``). Default to 0.
        out (tuple of np.ndarray, optional): the five outputs to write, C-contiguous, of
            ``n * total`` entries each, in the dtypes below. Defaults to views of one new
            block (five separate arrays of a few hundred kB each make glibc give memory back
            and fault it in again at every call: 10x the kernel's time).

        anchor_out (np.ndarray, optional): a C-contiguous int64 array of ``n * total``
            entries that receives each record's anchor row. Defaults to none.
        stops (tuple of np.ndarray, optional): ``(rows, offsets)``, the effective ends of
            every lane listed (``rows[offsets[g]:offsets[g + 1]]`` increasing, at least one a
            lane; what :func:`find_start_stop_traj` gives as stops), read instead of ``end``
            in O(log ends) an anchor: for repeated queries over a storage that did not change.
            Defaults to none.

    Returns:
        ``(index, validity, sequence_id, step, learning)``: numpy arrays of ``n * total``
        entries (int64, bool, int64, int64, bool), anchor after anchor (``out`` when given).

    Raises:
        TypeError: for non-integer anchors.
        ValueError: for an unknown ``episode_boundary``, a bad window, cursor, ``newest`` or
            ``oldest``, or anchors and lanes of different lengths, each named.
        IndexError: for an anchor outside the storage, naming it and its position.

    Examples:
        >>> import numpy as np, replay
        >>> end = np.zeros(10, dtype=bool); end[[4, 9]] = True
        >>> index, validity, *_ = replay.sequence_windows(end, np.array([5]), None, 1, 2, 1, 1, "pad")
        >>> index.tolist(), validity.tolist()
        ([5, 5, 6, 7], [False, True, True, True])
    """
    cdef int64_t n, groups = 1, c_length, c_cursor, c_newest = newest, c_oldest = oldest, bad = 0
    cdef int64_t c_burn_in, c_seq_length, c_bootstrap, c_dilation, total
    cdef int policy, rc = RP_OK
    cdef bint c_close_last = bool(close_last)
    cdef const uint8_t *end_ptr = NULL
    cdef const int64_t *group_ptr = NULL
    cdef const int64_t[::1] time_view, group_view
    cdef const uint8_t[::1] end_view
    cdef int8_t[::1] has_end_view
    cdef int64_t[::1] index_view, sequence_view, step_view, anchor_view
    cdef int64_t *anchor_ptr = NULL
    cdef const int64_t *stops_ptr = NULL
    cdef const int64_t *offsets_ptr = NULL
    cdef int64_t n_stops = 0, n_offsets = 0
    cdef uint8_t[::1] valid_view, learning_view
    policy = _SEQUENCE_POLICIES.get(episode_boundary, -1) if isinstance(episode_boundary, str) else -1
    if policy < 0:
        raise ValueError(f"Unknown episode_boundary {episode_boundary!r}: use 'pad', 'stop' or "
                         f"'include_reset'")
    for name, value, low in (("burn_in", burn_in, 0), ("length", seq_length, 1),
                             ("bootstrap", bootstrap, 0), ("dilation", dilation, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {name}={value!r}")
    c_burn_in, c_seq_length, c_bootstrap, c_dilation = burn_in, seq_length, bootstrap, dilation
    if policy != RP_SEQUENCE_INCLUDE_RESET and end is None and stops is not None:
        # the ends listed: end is not read
        if length is None:
            raise ValueError("sequence_windows() needs length without end")
        groups = len(stops[1]) - 1
    elif policy != RP_SEQUENCE_INCLUDE_RESET:
        flags = _as_array(end)
        if flags.ndim == 0:
            raise ValueError("end must have a time dimension, got a 0-d array")
        length = flags.shape[0] if length is None else length
        if flags.shape[0] != length:
            raise ValueError(f"end has {flags.shape[0]} rows, expected length={length}")
        groups = flags.size // length if length else 1
        flags = _flag_bytes(flags)
        if flags.shape[0]:
            end_view = flags
            end_ptr = &end_view[0]
    elif length is None:
        raise ValueError("sequence_windows() needs length without end")
    if length < 1:
        raise ValueError(f"cannot expand anchors over an empty storage (length={length})")
    c_length = length
    c_cursor = -1 if cursor is None else cursor
    if not -1 <= c_cursor < c_length:
        raise ValueError(f"cursor {cursor} is out of range for a storage of {length} rows")
    if policy == RP_SEQUENCE_INCLUDE_RESET and not (0 <= c_newest < c_length and 0 <= c_oldest < c_length):
        raise ValueError(f"newest={newest} and oldest={oldest} must be rows of a storage of "
                         f"{length} rows")
    times = _as_index_array(anchor_time, "anchor")
    n = times.shape[0]
    if anchor_group is not None:
        lanes = _as_index_array(anchor_group, "anchor lane")
        if lanes.shape[0] != n:
            raise ValueError(f"anchor_time and anchor_group must have the same shape, got {n} "
                             f"and {lanes.shape[0]}")
    total = c_burn_in + c_seq_length + c_bootstrap
    if total > (1 << 62) // c_dilation:
        raise ValueError(f"a window of {total} records {dilation} rows apart is too long")
    if n and total > (1 << 62) // n:
        raise ValueError(f"{n} windows of {total} records are too many")
    if out is None:
        out = _sequence_outputs(n * total)
    index, validity, sequence_id, step, learning = out
    for array, dtype in zip(out, _SEQUENCE_DTYPES):
        if array.dtype != dtype or array.shape != (n * total,) or not array.flags.c_contiguous:
            raise ValueError(f"out must hold C-contiguous arrays of {n * total} entries of dtypes "
                             f"int64, bool, int64, int64, bool, got {array.dtype} {array.shape}")
    if anchor_out is not None and (anchor_out.dtype != np.int64 or anchor_out.shape != (n * total,)
                                   or not anchor_out.flags.c_contiguous):
        raise ValueError(f"anchor_out must be a C-contiguous int64 array of {n * total} entries, got "
                         f"{anchor_out.dtype} {anchor_out.shape}")
    if n == 0:
        return index, validity, sequence_id, step, learning
    has_end = np.empty(groups, dtype=np.int8)
    if anchor_out is not None:
        anchor_view = anchor_out
        anchor_ptr = &anchor_view[0]
    if stops is not None and policy != RP_SEQUENCE_INCLUDE_RESET:
        stops_owner = _int64_data(stops[0], "stops", &stops_ptr, &n_stops)
        offsets_owner = _int64_data(stops[1], "stop offsets", &offsets_ptr, &n_offsets)
        if n_offsets != groups + 1 or n_stops == 0:
            raise ValueError(f"stops must list the ends of {groups} lanes ({groups + 1} offsets), got "
                             f"{n_stops} ends and {n_offsets} offsets")
        if offsets_owner[0] != 0 or offsets_owner[n_offsets - 1] != n_stops:
            raise ValueError(f"stop offsets must run from 0 to the number of ends ({n_stops}), got "
                             f"{offsets_owner[0]} to {offsets_owner[n_offsets - 1]}")
    time_view = times
    if anchor_group is not None:
        group_view = lanes
        group_ptr = &group_view[0]
    has_end_view, index_view, valid_view = has_end, index, validity.view(np.uint8)
    sequence_view, step_view, learning_view = sequence_id, step, learning.view(np.uint8)
    with nogil:
        rc = rp_sequence_windows(end_ptr, c_length, groups, c_cursor, c_close_last, &time_view[0],
                                 group_ptr, n, c_burn_in, c_seq_length, c_bootstrap, c_dilation,
                                 policy, c_newest, c_oldest, &has_end_view[0], &index_view[0],
                                 &valid_view[0], &sequence_view[0], &step_view[0],
                                 &learning_view[0], anchor_ptr, stops_ptr, offsets_ptr, &bad)
    if rc == RP_ERR_INDEX:
        where = f"lane {lanes[bad]}, " if anchor_group is not None else ""
        raise IndexError(f"anchor {times[bad]} ({where}position {bad}) is out of range for a "
                         f"storage of {length} rows" + (f" and {groups} lanes" if groups > 1 else ""))
    if rc != RP_OK and stops is not None and bad >= 0:
        raise ValueError(f"stops do not hold the anchor {times[bad]}'s lane's ends in increasing rows "
                         f"of a storage of {length} rows (position {bad})")
    if rc != RP_OK:  # the arguments were checked above
        raise ValueError(f"sequence_windows() refused its arguments (code {rc})")
    return index, validity, sequence_id, step, learning


# Slices whose trajectory bounds sample_slice_index_from_ends keeps on the stack.
cdef enum:
    _SMALL_DRAWS = 64


def sample_slice_index_from_ends(ends, limit, length, forced, traj, uniform, seq_length,
                                 storage_length, *, span=(False, False), flags=None):
    """:func:`sample_slice_index` over the trajectories :func:`bounds_from_ends` lists for
    ``(ends, limit, length, forced)``, reading the bounds of the drawn trajectories only.

    The same result as ``sample_slice_index(start, lengths, traj, ...)`` with ``start, _,
    lengths = bounds_from_ends(ends, limit, length, forced)``, in O(log(ends) + rows)
    instead of O(ends): a slice sampler draws a few trajectories out of thousands.

    Args:
        ends, limit, length, forced: as for :func:`bounds_from_ends`.
        traj, uniform, seq_length, storage_length: as for :func:`sample_slice_index`
            (``traj`` indexes the trajectories listed).

    Keyword Args:
        span, flags: as for :func:`sample_slice_index`.

    Returns:
        what :func:`sample_slice_index` returns (torch tensors when ``traj`` is one).

    Raises:
        IndexError: for a ``traj`` entry outside ``[0, count)`` (see :func:`bounds_summary`).
        ValueError, TypeError: where :func:`bounds_from_ends` or :func:`sample_slice_index`
            raise them.

    Examples:
        >>> import torch, replay
        >>> index, truncated = replay.sample_slice_index_from_ends(
        ...     torch.tensor([4, 7]), 8, 8, [], torch.tensor([1, 0]), torch.tensor([0.0, 0.99]),
        ...     2, 8)
        >>> index.flatten().tolist(), truncated.flatten().tolist()
        ([5, 6, 3, 4], [False, True, False, True])
    """
    cdef const int64_t *ends_ptr = NULL
    cdef const int64_t *traj_ptr = NULL
    cdef int64_t *start_ptr = NULL
    cdef int64_t *length_ptr = NULL
    cdef int64_t *identity_ptr = NULL
    cdef int64_t forced_rows[RP_SLICE_MAX_FORCED]
    cdef int64_t small[3 * _SMALL_DRAWS]
    cdef int64_t[::1] scratch_view
    cdef int64_t n_ends, n_forced, n, k, c_limit = limit, c_length = length, bad = 0
    cdef int64_t count = 0, shortest = 0
    cdef int rc
    ends_owner = _int64_data(ends, "ends", &ends_ptr, &n_ends)
    n_forced = _forced_rows(forced, length, forced_rows)
    traj_owner = _int64_data(traj, "traj", &traj_ptr, &n)
    # the drawn trajectories' bounds (start, length), then the slices in them: trajectory k
    # is slice k's (identity); on the stack for a sampler's usual few slices
    if n <= _SMALL_DRAWS:
        start_ptr = small
    else:
        scratch = np.empty(3 * n, dtype=np.int64)
        scratch_view = scratch
        start_ptr = &scratch_view[0]
    length_ptr = start_ptr + n
    identity_ptr = start_ptr + 2 * n
    for k in range(n):
        identity_ptr[k] = k
    with nogil:
        rc = rp_slice_bounds_at(ends_ptr, n_ends, c_limit, c_length, forced_rows, n_forced,
                                traj_ptr, n, start_ptr, length_ptr, &bad)
    if rc == RP_ERR_INDEX:
        rp_slice_bounds_summary(ends_ptr, n_ends, c_limit, c_length, forced_rows, n_forced,
                                &count, &shortest, &bad)
        raise IndexError(
            f"traj value {traj_ptr[bad]} at position {bad} is out of range for {count} trajectories")
    if rc != RP_OK:
        raise ValueError(_forced_message(forced, length))
    return _slices_from_draws(start_ptr, length_ptr, n, 1, identity_ptr, n, uniform, seq_length,
                              storage_length, span, flags, traj, (n, 1))


def excluded_starts(lengths, tail, *, keep_first=False, offset=0, total=None):
    """The positions that cannot start a slice, sorted: what ``PrioritizedSliceSampler`` excludes.

    The trajectories of ``lengths`` lie end to end from position ``offset`` of a circular range
    of ``total`` positions (a full storage whose first trajectory starts at ``offset``); each
    excludes its last ``tail`` positions (all of them when shorter). One pass in C, in
    increasing order (the positions that wrap past ``total`` come first), where the torch
    ops build them with two ``repeat_interleave`` and a modulo.

    Args:
        lengths (1-D integers): the trajectory lengths, in storage order.
        tail (int): how many positions at the end of each trajectory cannot start a slice
            (``seq_length - 1 - span_right``, or 1 when ``span_right`` is True).

    Keyword Args:
        keep_first (bool, optional): never exclude a trajectory's first position (a short
            slice may start there: ``strict_length=False``). Defaults to ``False``.
        offset (int, optional): the position of the first trajectory's start. Defaults to 0.
        total (int, optional): the number of positions; defaults to ``sum(lengths)``.

    Returns:
        a strictly increasing int64 numpy array.

    Raises:
        ValueError: for a negative tail or length, an offset outside ``[0, total)`` or lengths
            summing past ``total``.

    Examples:
        >>> import replay
        >>> replay.excluded_starts([3, 4], 2).tolist()
        [1, 2, 5, 6]
        >>> replay.excluded_starts([3, 4], 2, offset=5).tolist()
        [0, 3, 4, 6]
    """
    cdef const int64_t *length_ptr = NULL
    cdef int64_t m = 0, n_out = 0, c_tail = tail, c_offset = offset, c_total, capacity
    cdef bint c_keep_first = keep_first
    cdef int64_t[::1] out_view
    cdef int rc
    owner = _int64_data(lengths, "lengths", &length_ptr, &m)
    if total is None:
        if m == 0:
            return np.empty(0, dtype=np.int64)
        total = int(np.asarray(owner).sum())
    c_total = total
    capacity = min(c_tail, c_total) * m if c_tail > 0 else 0
    out = np.empty(max(capacity, 1), dtype=np.int64)
    out_view = out
    with nogil:
        rc = rp_slice_excluded_starts(length_ptr, m, c_tail, c_keep_first, c_offset, c_total,
                                      &out_view[0], capacity, &n_out)
    if rc != RP_OK:
        raise ValueError(f"excluded_starts() got tail={tail}, offset={offset}, total={total} "
                         f"and lengths that are negative or sum past total")
    return out[:n_out]


# =====================================================================================
# Permutations
# =====================================================================================
# (permutation section)
import operator

_UINT64_MASK = 0xFFFFFFFFFFFFFFFF
# The lazy epoch keeps its sparse map while it holds at most n // _SPARSE_FRACTION positions
# (the map then stays within L2 for n = 2^20); past that, or for small n, one O(n) pass
# materialises the dense array, whose later steps cost a prefetched access each.
_SPARSE_FRACTION = 16
_DENSE_BELOW = 4096
_MIN_MAP_CAPACITY = 16


cdef uint64_t _draw_seed(object generator) except? 0:
    """64 random bits from ``generator`` (a ``torch.Generator``) or torch's global RNG."""
    import torch
    # randint's high bound is exclusive: this misses one of the 2^64 values, which is harmless.
    seed = torch.randint(-(2 ** 63), 2 ** 63 - 1, (), generator=generator, dtype=torch.int64)
    return <uint64_t>(int(seed) & _UINT64_MASK)


cdef int64_t _check_count(object n, str func, str name) except -1:
    """``n`` as a non-negative int64, with torch.randperm's exception types."""
    if isinstance(n, bool) or not hasattr(type(n), "__index__"):
        raise TypeError(f"{func}(): argument '{name}' must be int, not {type(n).__name__}")
    value = operator.index(n)
    if value < 0:
        raise RuntimeError(f"{func}(): {name} must be non-negative, got {name}={value}")
    if value > INT64_MAX:
        raise RuntimeError(f"{func}(): {name}={value} does not fit in int64")
    return value


cdef object _bucketed_shuffle(rp_prng_state *state, int64_t n, const int64_t *values,
                              int64_t bucket_bits=-1, int64_t bucket_capacity=-1):
    """A numpy int64 array of ``values[0..n)`` (of ``range(n)`` when ``values`` is NULL) in a
    uniformly random order, drawn from ``state`` by the bucketed shuffle (see perm.h)."""
    cdef int64_t bits, capacity, bad = 0, counts_len = 0, scratch_len = 0
    cdef int rc
    rp_perm_randperm_layout(n, &bits, &capacity)
    if bucket_bits >= 0:
        bits = bucket_bits
    if bucket_capacity >= 0:
        capacity = bucket_capacity
    out = np.empty(n, dtype=np.int64)
    if n == 0:
        return out
    cdef int64_t[::1] out_view = out
    cdef int64_t[::1] counts_view
    cdef int32_t[::1] scratch_view
    cdef int64_t *counts_ptr = NULL
    cdef int32_t *scratch_ptr = NULL
    if bits > 0:
        counts_len = 2 << bits
        scratch_len = max(n, capacity << bits)
        counts_view = np.empty(counts_len, dtype=np.int64)
        scratch_view = np.empty(scratch_len, dtype=np.int32)
        counts_ptr = &counts_view[0]
        scratch_ptr = &scratch_view[0]
    with nogil:
        if values == NULL:
            rc = rp_perm_randperm(state, n, bits, capacity, counts_ptr, counts_len, scratch_ptr,
                                  scratch_len, &out_view[0], &bad)
        else:
            rc = rp_perm_shuffle(state, n, values, bits, capacity, counts_ptr, counts_len,
                                 scratch_ptr, scratch_len, &out_view[0], &bad)
    if rc != RP_OK:
        names = ("n", "bucket_bits", "bucket_capacity", "counts_len", "scratch_len", "values")
        raise ValueError(f"the bucketed shuffle rejected {names[bad]} (n={n}, bucket_bits={bits}, "
                         f"bucket_capacity={capacity})")
    return out


cdef object _randperm_array(int64_t n, uint64_t seed, int64_t bucket_bits=-1,
                            int64_t bucket_capacity=-1):
    """A numpy int64 permutation of range(n) drawn from xoshiro256** seeded with ``seed``."""
    cdef rp_prng_state state
    rp_prng_seed(&state, seed)
    return _bucketed_shuffle(&state, n, NULL, bucket_bits, bucket_capacity)


def randperm(n, *, generator=None):
    """Returns a uniformly random permutation of ``range(n)``, like :func:`torch.randperm` on CPU.

    Every element is sent to one of about ``n / 4096`` uniformly random buckets, and each
    bucket, small enough for the L1 cache, is shuffled with Fisher-Yates (Rao-Sandelius);
    ``torch.randperm`` swaps at random over the whole output and misses the cache on almost
    every step.

    Args:
        n (int): the number of elements.

    Keyword Args:
        generator (torch.Generator, optional): 64 bits drawn from it seed the kernel's
            xoshiro256** generator. Defaults to ``None``, which draws them from torch's global
            RNG, so :func:`torch.manual_seed` reproduces the result.

    Returns:
        an int64 CPU tensor of shape ``[n]``.

    Examples:
        >>> import torch, replay
        >>> _ = torch.manual_seed(0)
        >>> perm = replay.randperm(5)
        >>> sorted(perm.tolist())
        [0, 1, 2, 3, 4]
        >>> perm.dtype
        torch.int64

    .. note:: The values differ from ``torch.randperm``'s for the same seed (a different
        generator); the distribution is the same.
    """
    cdef int64_t count = _check_count(n, "randperm", "n")
    import torch
    cdef uint64_t seed = _draw_seed(generator)
    return torch.from_numpy(_randperm_array(count, seed))


def _py_randperm(n, seed, bucket_bits=-1, bucket_capacity=-1):
    """Test hook: the permutation of ``range(n)`` for a raw 64-bit seed, as a numpy array.

    ``bucket_bits`` / ``bucket_capacity`` override the layout (-1 keeps the default), so tests
    can force the single-bucket path and the bucket-overflow replay.
    """
    return _randperm_array(_check_count(n, "_py_randperm", "n"), <uint64_t>(seed & _UINT64_MASK),
                           bucket_bits, bucket_capacity)


def _py_shuffle(values, seed, bucket_bits=-1, bucket_capacity=-1):
    """Test hook: ``values`` (int64) in the random order the bucketed shuffle gives for a raw
    64-bit seed, with the layout overridable as in :func:`_py_randperm`."""
    cdef rp_prng_state state
    cdef const int64_t *ptr = NULL
    cdef int64_t n = 0
    owner = _int64_data(values, "values", &ptr, &n)
    rp_prng_seed(&state, <uint64_t>(seed & _UINT64_MASK))
    return _bucketed_shuffle(&state, n, ptr, bucket_bits, bucket_capacity)


def _py_gnu_extensions():
    """Test hook: whether the kernels were built with GCC's extensions (False under MSVC or
    ``-DRP_PORTABLE``, where every fallback is compiled)."""
    return bool(RP_GNU_EXTENSIONS)


def _py_prng_u64(seed, count, bound=0):
    """Test hook: the first ``count`` xoshiro256** outputs after seeding with ``seed``, or with
    ``bound`` (1 to 2^64 - 1) the first ``count`` bounded draws in ``[0, bound)``."""
    cdef rp_prng_state state
    cdef int64_t i, m = count
    cdef uint64_t b = bound
    out = np.empty(m, dtype=np.uint64)
    cdef uint64_t[::1] view = out
    rp_prng_seed(&state, <uint64_t>(seed & _UINT64_MASK))
    for i in range(m):
        view[i] = rp_prng_bounded_u64(&state, b) if b else rp_prng_next_u64(&state)
    return out


def _rebuild_permutation_epoch():
    """Unpickling entry point: an epoch whose state ``__setstate__`` fills in (draws no seed)."""
    return PermutationEpoch.__new__(PermutationEpoch)


cdef class PermutationEpoch:
    """One epoch of a uniformly random permutation of ``range(n)``, drawn batch by batch.

    Batches come from a lazy Fisher-Yates shuffle: the ``k``-th element is drawn uniformly
    among the ones not handed out yet, so a batch costs O(batch), not O(n), and every element
    appears exactly once per epoch. While few positions have been displaced they live in a
    small hash map; once it would hold more than ``n / 16`` of them, one O(n) pass moves them
    to a dense array (``n`` int64).

    Args:
        n (int): the number of elements in an epoch.

    Keyword Args:
        generator (torch.Generator, optional): 64 bits drawn from it seed the epoch.
            Defaults to ``None``, which draws them from torch's global RNG, so
            :func:`torch.manual_seed` reproduces the epoch.

    Examples:
        >>> import torch, replay
        >>> _ = torch.manual_seed(0)
        >>> epoch = replay.PermutationEpoch(10)
        >>> first = epoch.next_batch(4)
        >>> rest = epoch.next_batch(100)  # only 6 left
        >>> len(first), len(rest), epoch.remaining
        (4, 6, 0)
        >>> sorted(torch.cat([first, rest]).tolist()) == list(range(10))
        True

    .. note:: Calls from several threads are serialised by a lock; each batch is taken
        atomically. Pickling saves the position in the epoch and the generator state, so a
        restored epoch continues with the same batches.
    """

    def __cinit__(self):
        self._lock = threading.Lock()
        self._n = 0
        self._reset_map()

    def __init__(self, n, *, generator=None):
        self._n = _check_count(n, "PermutationEpoch", "n")
        self.reset(generator=generator)

    def _reset_map(self):
        self._consumed = 0
        self._used = 0
        self._is_dense = False
        self._keys = np.full(_MIN_MAP_CAPACITY, -1, dtype=np.int64)
        self._vals = np.empty(_MIN_MAP_CAPACITY, dtype=np.int64)
        self._dense = None

    def reset(self, *, generator=None):
        """Starts a new epoch over the same ``n``, reseeded like the constructor.

        Keyword Args:
            generator (torch.Generator, optional): the seed's source. Defaults to ``None``
                (torch's global RNG).
        """
        cdef uint64_t seed = _draw_seed(generator)
        with self._lock:
            self._reset_map()
            rp_prng_seed(&self._state, seed)

    @property
    def n(self):
        """The number of elements in an epoch."""
        return self._n

    @property
    def remaining(self):
        """The number of elements not handed out yet in this epoch."""
        return self._n - self._consumed

    def __len__(self):
        return self._n

    def __repr__(self):
        return f"{type(self).__name__}(n={self._n}, remaining={self._n - self._consumed})"

    cdef int _reserve(self, int64_t extra) except -1:
        """Grows the sparse map so that ``extra`` more keys keep its load factor <= 1/2."""
        cdef int64_t capacity = self._keys.shape[0]
        cdef int64_t need = 2 * (self._used + extra)
        cdef int64_t new_capacity, bad = 0, used = 0
        cdef int rc = RP_OK
        if need <= capacity:
            return 0
        new_capacity = capacity
        while new_capacity < need:
            new_capacity *= 2
        cdef int64_t[::1] keys = np.full(new_capacity, -1, dtype=np.int64)
        cdef int64_t[::1] vals = np.empty(new_capacity, dtype=np.int64)
        with nogil:
            rc = rp_perm_map_rehash(&self._keys[0], &self._vals[0], capacity, self._consumed,
                                    &keys[0], &vals[0], new_capacity, &used, &bad)
        if rc != RP_OK:
            raise ValueError(f"cannot grow the permutation map from {capacity} to "
                             f"{new_capacity} slots (argument {bad})")
        self._keys = keys
        self._vals = vals
        self._used = used
        return 0

    cdef int _to_dense(self) except -1:
        """Moves the remaining positions from the sparse map to a dense array. O(n)."""
        cdef int64_t bad = 0
        cdef int rc = RP_OK
        cdef int64_t[::1] dense = np.empty(max(self._n, 1), dtype=np.int64)
        with nogil:
            rc = rp_perm_map_materialize(self._n, self._consumed, &self._keys[0], &self._vals[0],
                                         self._keys.shape[0], &dense[0], &bad)
        if rc != RP_OK:
            raise ValueError(f"corrupt permutation map (slot {bad})")
        self._dense = dense
        self._is_dense = True
        self._used = 0
        self._keys = np.full(1, -1, dtype=np.int64)
        self._vals = np.empty(1, dtype=np.int64)
        return 0

    @property
    def is_dense(self):
        """Whether the remaining positions live in the dense array (batches then cost a
        plain O(batch) Fisher-Yates step, with no hash-map probing)."""
        return bool(self._is_dense)

    def densify(self):
        """Move the remaining positions to the dense array now, in one O(n) pass.

        Batches are cheaper afterwards. A caller that wants a cheap first batch and cheap
        steady-state batches (``SamplerWithoutReplacement``) densifies after the first one.
        Idempotent; the permutation drawn is the same either way.
        """
        with self._lock:
            if not self._is_dense:
                self._to_dense()

    def shuffle_rest(self):
        """Returns every element not handed out yet, in a uniformly random order, and ends the
        epoch.

        One bucketed shuffle of the remaining elements (cache-friendly, O(remaining), as
        :func:`randperm`) instead of ``remaining`` lazy Fisher-Yates steps, each a cache miss
        on a large epoch: a caller that will read the whole epoch batch by batch can then
        slice the result. The order of the epoch stays uniformly random: the elements already
        handed out were drawn uniformly, and the rest is shuffled uniformly.

        Returns:
            an int64 CPU tensor of ``remaining`` elements (empty once the epoch is exhausted).
        """
        cdef int64_t m
        cdef const int64_t[::1] rest_view
        with self._lock:
            m = self._n - self._consumed
            if m == 0:
                return _from_numpy(np.empty(0, dtype=np.int64))
            if not self._is_dense:
                self._to_dense()
            rest_view = self._dense[self._consumed:self._n]
            out = _bucketed_shuffle(&self._state, m, &rest_view[0])
            self._consumed = self._n
        return _from_numpy(out)

    def next_batch(self, batch_size):
        """Returns the next ``min(batch_size, remaining)`` elements of the epoch.

        Args:
            batch_size (int): the number of elements wanted (>= 0).

        Returns:
            an int64 CPU tensor, empty once the epoch is exhausted.
        """
        cdef object wanted
        if PyLong_CheckExact(batch_size):  # the common case, without the generic checks
            wanted = batch_size
        else:
            if isinstance(batch_size, bool) or not hasattr(type(batch_size), "__index__"):
                raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
            wanted = operator.index(batch_size)
        if wanted < 0:
            raise ValueError(f"batch_size must be non-negative, got batch_size={wanted}")
        cdef int64_t batch, bad = 0
        cdef int rc = RP_OK
        cdef int64_t[::1] out_view
        with self._lock:
            batch = min(wanted, self._n - self._consumed)
            out = np.empty(batch, dtype=np.int64)
            if batch == 0:
                return _from_numpy(out)
            out_view = out
            if not self._is_dense and (self._n <= _DENSE_BELOW
                                       or self._used + batch > self._n // _SPARSE_FRACTION):
                self._to_dense()
            if self._is_dense:
                with nogil:
                    rc = rp_perm_dense_next_batch(&self._state, self._n, self._consumed,
                                                  &self._dense[0], batch, &out_view[0], &bad)
            else:
                self._reserve(batch)
                with nogil:
                    rc = rp_perm_sparse_next_batch(&self._state, self._n, self._consumed,
                                                   &self._keys[0], &self._vals[0],
                                                   self._keys.shape[0], &self._used, batch,
                                                   &out_view[0], &bad)
            if rc != RP_OK:
                raise ValueError(f"permutation kernel rejected argument {bad} "
                                 f"(n={self._n}, consumed={self._consumed}, batch={batch})")
            self._consumed += batch
        return _from_numpy(out)

    def __reduce__(self):
        return (_rebuild_permutation_epoch, (), self.__getstate__())

    def __getstate__(self):
        with self._lock:
            state = {
                "class": type(self).__name__,
                "n": self._n,
                "consumed": self._consumed,
                "prng": [int(self._state.s[i]) for i in range(4)],
                "dense": bool(self._is_dense),
            }
            if self._is_dense:
                state["values"] = np.asarray(self._dense)[self._consumed:self._n].copy()
            else:
                keys = np.asarray(self._keys)
                live = keys >= self._consumed
                state["keys"] = keys[live].copy()
                state["values"] = np.asarray(self._vals)[live].copy()
        return state

    def __setstate__(self, state):
        if not isinstance(state, dict) or state.get("class") != type(self).__name__:
            raise ValueError(f"state is not a {type(self).__name__} state: {state!r:.80}")
        n = _check_count(state["n"], "PermutationEpoch", "n")
        consumed = _check_count(state["consumed"], "PermutationEpoch", "consumed")
        if consumed > n:
            raise ValueError(f"consumed={consumed} exceeds n={n}")
        prng = [int(x) for x in state["prng"]]
        if len(prng) != 4 or any(x < 0 or x > _UINT64_MASK for x in prng) or not any(prng):
            raise ValueError(f"prng must hold 4 uint64 words, not all zero, got {prng}")
        values = np.asarray(state["values"])
        if values.dtype != np.int64 or values.ndim != 1:
            raise ValueError(f"values must be a 1-D int64 array, got dtype {values.dtype} "
                             f"and shape {values.shape}")
        if values.size and (values.min() < 0 or values.max() >= n):
            raise ValueError(f"values must lie in [0, {n}), got [{values.min()}, {values.max()}]")
        cdef int64_t i
        with self._lock:
            self._n = n
            self._reset_map()
            if state["dense"]:
                if values.shape[0] != n - consumed:
                    raise ValueError(f"values has shape {values.shape}, expected ({n - consumed},)")
                dense = np.empty(max(n, 1), dtype=np.int64)
                dense[consumed:n] = values
                self._dense = dense
                self._is_dense = True
            else:
                keys = np.asarray(state["keys"])
                if keys.dtype != np.int64 or keys.shape != values.shape:
                    raise ValueError(f"keys must be int64 with the shape of values {values.shape}, "
                                     f"got dtype {keys.dtype} and shape {keys.shape}")
                if keys.size and (keys.min() < consumed or keys.max() >= n):
                    raise ValueError(f"keys must lie in [{consumed}, {n}), "
                                     f"got [{keys.min()}, {keys.max()}]")
                capacity = _MIN_MAP_CAPACITY
                while capacity < 2 * keys.shape[0]:
                    capacity *= 2
                padded_keys = np.full(capacity, -1, dtype=np.int64)
                padded_vals = np.zeros(capacity, dtype=np.int64)
                padded_keys[:keys.shape[0]] = keys
                padded_vals[:keys.shape[0]] = values
                self._keys = padded_keys
                self._vals = padded_vals
                self._consumed = consumed
                # Claiming a full map makes _reserve rehash the entries into their slots.
                self._used = capacity // 2
                self._reserve(1)
            self._consumed = consumed
            for i in range(4):
                self._state.s[i] = <uint64_t>prng[i]


# =====================================================================================
# Row copies
# =====================================================================================
from libc.string cimport memcpy

# The most leaves copy_rows takes in one call (a buffer's transitions hold a handful).
cdef enum:
    _MAX_COPY_PAIRS = 64


cdef bint _plain_rows(object x) except -1:
    """Whether ``x`` is a CPU tensor whose rows can be copied byte for byte: C-contiguous, at
    least 1-D, reading as it is (no negative or conjugate bit), not requiring grad."""
    return (_is_tensor(x) and x.is_cpu and x.ndim >= 1 and not x.requires_grad and x.is_contiguous()
            and not x.is_neg() and not x.is_conj())


def copy_rows(destinations, sources, start, numel):
    """Copy the ``numel`` rows of each source into rows ``start, start + 1, ...`` of its
    destination, wrapping around at the destination's length: ``dest[(start + k) % len(dest)]
    = source[k]``, what a round-robin write does to each leaf of a storage.

    Every pair is checked before anything is copied; the copies are one or two ``memcpy`` a
    pair. The pairs this does not take (another kind, device, dtype or row shape, a
    non-contiguous or lazily negated / conjugated tensor, a tensor requiring grad, a source
    of other than ``numel`` rows or overlapping its destination) are left to the caller:
    nothing is copied then.

    Args:
        destinations (sequence of torch.Tensor): the buffers written, rows along dim 0.
        sources (sequence of torch.Tensor): as many sources, each of its destination's dtype
            and row shape.
        start (int): the first row written, in ``[0, len(destination))``.
        numel (int): the rows of each source, at most ``len(destination)``.

    Returns:
        ``True`` once copied; ``False``, having copied nothing, for pairs not of that kind.

    Raises:
        ValueError: for sequences of different lengths.

    Examples:
        >>> import torch, replay
        >>> dest = torch.zeros(4, 2)
        >>> replay.copy_rows([dest], [torch.ones(3, 2)], 2, 3)
        True
        >>> dest[:, 0].tolist()
        [1.0, 0.0, 1.0, 1.0]
        >>> replay.copy_rows([dest], [torch.ones(3, 2, dtype=torch.float64)], 0, 3)
        False
    """
    cdef Py_ssize_t m = len(destinations), k
    cdef int64_t first_rows, c_start, n, capacity, row_bytes
    cdef uintptr_t dst_at[_MAX_COPY_PAIRS]
    cdef uintptr_t src_at[_MAX_COPY_PAIRS]
    cdef int64_t rows_of[_MAX_COPY_PAIRS]
    cdef int64_t bytes_of[_MAX_COPY_PAIRS]
    if len(sources) != m:
        raise ValueError(f"copy_rows takes as many sources as destinations, got {len(sources)} and {m}")
    if m > _MAX_COPY_PAIRS or not _is_scalar_int(start) or not _is_scalar_int(numel) or numel < 0:
        return False
    c_start = start
    n = numel
    for k in range(m):
        dest, source = destinations[k], sources[k]
        if not (_plain_rows(dest) and _plain_rows(source)) or dest.dtype is not source.dtype:
            return False
        capacity = dest.shape[0]
        if source.shape[0] != n or n > capacity or not 0 <= c_start < capacity or source.shape[1:] != dest.shape[1:]:
            return False
        row_bytes = dest.element_size() * (dest.numel() // capacity)
        dst_at[k] = <uintptr_t>dest.data_ptr()
        src_at[k] = <uintptr_t>source.data_ptr()
        # memcpy of overlapping memory is undefined: the caller's copy handles the overlap
        if src_at[k] < dst_at[k] + <uintptr_t>(capacity * row_bytes) and dst_at[k] < src_at[k] + <uintptr_t>(n * row_bytes):
            return False
        rows_of[k] = capacity
        bytes_of[k] = row_bytes
    with nogil:
        for k in range(m):
            capacity, row_bytes = rows_of[k], bytes_of[k]
            first_rows = capacity - c_start if n > capacity - c_start else n
            memcpy(<char *>dst_at[k] + c_start * row_bytes, <const char *>src_at[k], first_rows * row_bytes)
            if n > first_rows:
                memcpy(<char *>dst_at[k], <const char *>src_at[k] + first_rows * row_bytes, (n - first_rows) * row_bytes)
    return True


# =====================================================================================
# Row gathers
# =====================================================================================
cimport numpy as cnp

cnp.import_array()

cdef enum:
    _MAX_TAKE_LEAVES = 64


def take_rows(arrays, rows):
    """The given ``rows`` of every array, in one pass: ``[a.take(rows, axis=0) for a in
    arrays]``, what a sampled batch reads from each leaf of a storage.

    The rows a sample picks are scattered over a large storage, so the copy waits on memory:
    here every leaf's rows are copied with the next rows prefetched, and all leaves in one
    call without the GIL, which numpy's ``take`` (one call a leaf) does not do.

    Args:
        arrays (sequence of np.ndarray): the leaves, C-contiguous, at least 1-D, of any
            number or boolean dtype in native byte order; rows along axis 0. At most 64.
        rows (np.ndarray or torch.Tensor): the rows to read, integers, each in
            ``[0, len(a))`` for every array ``a`` (no wrapping of negative rows).

    Returns:
        A list of new C-contiguous arrays, one a leaf: ``len(rows)`` rows, the leaf's row
        shape and dtype.

    Raises:
        TypeError: for an array that is not a numpy array, of another dtype, or rows that
            are not integers.
        ValueError: for a non-contiguous, 0-d or over 32-d array, or more than 64 arrays.
        IndexError: for a row outside an array's rows, naming it and its position.

    Examples:
        >>> import numpy as np, replay
        >>> a, b = np.arange(10).reshape(5, 2), np.arange(5, dtype=np.float32)
        >>> [x.tolist() for x in replay.take_rows([a, b], np.array([4, 0]))]
        [[[8, 9], [0, 1]], [4.0, 0.0]]
    """
    cdef Py_ssize_t m = len(arrays), j
    cdef const char *src_at[_MAX_TAKE_LEAVES]
    cdef char *dst_at[_MAX_TAKE_LEAVES]
    cdef int64_t bytes_of[_MAX_TAKE_LEAVES]
    cdef int64_t rows_of[_MAX_TAKE_LEAVES]
    cdef const int64_t[::1] idx
    cdef int64_t n, bad = 0
    cdef int rc, nd
    cdef cnp.ndarray array, out
    cdef cnp.npy_intp dims[32]
    if m > _MAX_TAKE_LEAVES:
        raise ValueError(f"take_rows takes at most {_MAX_TAKE_LEAVES} arrays, got {m}")
    index = _as_index_array(rows, "rows")
    idx = index
    n = idx.shape[0]
    outs = []
    for j in range(m):
        item = arrays[j]
        if type(item) is not np.ndarray:
            raise TypeError(f"take_rows reads numpy arrays, got {type(item).__name__} at position {j}")
        array = <cnp.ndarray>item
        nd = cnp.PyArray_NDIM(array)
        if not (cnp.PyArray_ISNUMBER(array) or cnp.PyArray_ISBOOL(array)) or not cnp.PyArray_ISNOTSWAPPED(array):
            raise TypeError(f"take_rows copies numbers and booleans in native byte order, "
                            f"got dtype {item.dtype!r} at position {j}")
        if nd < 1 or nd > 32 or not cnp.PyArray_IS_C_CONTIGUOUS(array):
            raise ValueError(f"array {j} must be C-contiguous and 1-D to 32-D, got shape "
                             f"{item.shape} with strides {item.strides}")
        dims[0] = n
        for k in range(1, nd):
            dims[k] = cnp.PyArray_DIM(array, k)
        out = cnp.PyArray_EMPTY(nd, dims, cnp.PyArray_TYPE(array), 0)
        outs.append(out)
        rows_of[j] = cnp.PyArray_DIM(array, 0)
        bytes_of[j] = cnp.PyArray_NBYTES(array) // rows_of[j] if rows_of[j] else 0
        src_at[j] = <const char *>cnp.PyArray_DATA(array)
        dst_at[j] = <char *>cnp.PyArray_DATA(out)
    with nogil:
        rc = rp_take_rows(m, src_at, dst_at, bytes_of, rows_of, &idx[0] if n else NULL, n, &bad)
    if rc == RP_ERR_INDEX:
        limit = min(rows_of[j] for j in range(m))
        raise IndexError(f"rows[{bad}] = {index[bad]} lies outside the arrays' rows [0, {limit})")
    return outs


# =====================================================================================
# Columns of Python objects
# =====================================================================================
# A batch stacked from a list of items (a list storage's TensorDicts) first reads the same
# attribute or dict entry of every item: one C loop here, where a Python pass over a few
# hundred items costs as much as the stack itself.
from cpython.dict cimport PyDict_CheckExact, PyDict_GetItemWithError, PyDict_Next, PyDict_Size
from cpython.list cimport PyList_GET_ITEM, PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE


cdef tuple _object_row(object objects, str func, str what):
    """``objects`` (a list or tuple) as a tuple of its own: the loops below hold borrowed
    references, and what they call (``__getattr__``, ``__eq__``) could resize the caller's list."""
    if not isinstance(objects, (list, tuple)):
        raise TypeError(f"{func} takes a list or tuple of {what}, got {type(objects).__name__}")
    return tuple(objects)


cdef inline void _put(list column, Py_ssize_t i, object value):
    """Sets slot ``i`` of a fresh list (``PyList_SET_ITEM`` steals the reference it is given)."""
    Py_INCREF(value)
    PyList_SET_ITEM(column, i, value)


def common_type(objects):
    """The exact type every object of ``objects`` has, or ``None`` where two differ (a subclass
    counts as another type) or there are no objects.

    Args:
        objects (list or tuple): the objects.

    Raises:
        TypeError: for ``objects`` neither a list nor a tuple.

    Examples:
        >>> import replay
        >>> replay.common_type([1, 2, 3])
        <class 'int'>
        >>> replay.common_type([1, True]) is None
        True
    """
    cdef Py_ssize_t n, i
    if not isinstance(objects, (list, tuple)):
        raise TypeError(f"common_type takes a list or tuple of objects, got {type(objects).__name__}")
    n = len(objects)
    if n == 0:
        return None
    # Read in place, each item fetched with its bounds checked: type() runs no Python code,
    # but a list subclass's __getitem__ could.
    kind = type(objects[0])
    for i in range(1, n):
        if type(objects[i]) is not kind:
            return None
    return kind


def gather_attribute(objects, str name, same=()):
    """The ``name`` attribute of every object of ``objects``, in their order, provided each
    object has the first one's value for each attribute named in ``same``; else ``None``.

    Values are the same when they are one object or compare equal (``==``). An object that
    lacks an attribute raises the ``AttributeError`` ``getattr`` raises.

    Args:
        objects (list or tuple): the objects.
        name (str): the attribute gathered.
        same (tuple or list of str, optional): attributes every object must share with the
            first. Defaults to ``()``.

    Returns:
        a list as long as ``objects``, or ``None``.

    Raises:
        TypeError: for ``objects`` neither a list nor a tuple, or attribute names that are not
            strings.

    Examples:
        >>> import replay
        >>> from types import SimpleNamespace as NS
        >>> items = [NS(x=1, unit="m"), NS(x=2, unit="m")]
        >>> replay.gather_attribute(items, "x", same=("unit",))
        [1, 2]
        >>> replay.gather_attribute([*items, NS(x=3, unit="s")], "x", same=("unit",)) is None
        True
    """
    cdef tuple row = _object_row(objects, "gather_attribute", "objects")
    cdef tuple shared = _object_row(same, "gather_attribute", "attribute names (same)")
    cdef Py_ssize_t n = PyTuple_GET_SIZE(row), m = PyTuple_GET_SIZE(shared), i, j
    cdef list gathered = PyList_New(n)
    for j in range(m):
        if not isinstance(<object>PyTuple_GET_ITEM(shared, j), str):
            raise TypeError(f"gather_attribute takes attribute names (str) in same, got "
                            f"{type(<object>PyTuple_GET_ITEM(shared, j)).__name__} at position {j}")
    if n == 0:
        return gathered
    first = <object>PyTuple_GET_ITEM(row, 0)
    expected = tuple([getattr(first, <str>PyTuple_GET_ITEM(shared, j)) for j in range(m)])
    _put(gathered, 0, getattr(first, name))
    for i in range(1, n):
        obj = <object>PyTuple_GET_ITEM(row, i)
        for j in range(m):
            value = getattr(obj, <str>PyTuple_GET_ITEM(shared, j))
            reference = <object>PyTuple_GET_ITEM(expected, j)
            if value is not reference and not value == reference:
                return None
        _put(gathered, i, getattr(obj, name))
    return gathered


def transpose_dicts(dicts):
    """The columns of a list of dicts that all have the same keys: one list per key of the
    first dict, in that dict's order, holding each dict's value for that key; ``None`` where a
    dict's keys are not the first one's (one more, one fewer, another one).

    ``[list(column) for column in zip(*(d.values() for d in dicts))]`` where the keys come in
    one order; a dict whose keys come in another order is read key by key, so its values still
    land in the first dict's columns.

    Args:
        dicts (list or tuple of dict): the rows, each a ``dict`` (not a subclass: an
            ``OrderedDict`` keeps an order of its own).

    Returns:
        a list of ``len(dicts[0])`` lists of ``len(dicts)`` values each (no columns for no
        dicts), or ``None``.

    Raises:
        TypeError: for ``dicts`` neither a list nor a tuple, or a row that is not a ``dict``.

    Examples:
        >>> import replay
        >>> replay.transpose_dicts([{"a": 1, "b": 2}, {"b": 4, "a": 3}])
        [[1, 3], [2, 4]]
        >>> replay.transpose_dicts([{"a": 1}, {"b": 2}]) is None
        True
    """
    cdef tuple row = _object_row(dicts, "transpose_dicts", "dicts")
    cdef Py_ssize_t n = PyTuple_GET_SIZE(row), n_keys, i, k, pos
    cdef PyObject *key
    cdef PyObject *value
    cdef PyObject *found
    cdef list columns
    for i in range(n):
        if not PyDict_CheckExact(<object>PyTuple_GET_ITEM(row, i)):
            raise TypeError(f"transpose_dicts takes dicts, got "
                            f"{type(<object>PyTuple_GET_ITEM(row, i)).__name__} at position {i}")
    if n == 0:
        return []
    first = <object>PyTuple_GET_ITEM(row, 0)
    keys = tuple(first)
    n_keys = PyTuple_GET_SIZE(keys)
    columns = [PyList_New(n) for k in range(n_keys)]
    for i in range(n):
        d = <object>PyTuple_GET_ITEM(row, i)
        if PyDict_Size(d) != n_keys:
            return None
        pos = 0
        k = 0
        # The first dict's keys in its order, met as the very same objects: no hashing, no
        # Python code run.
        while k < n_keys and PyDict_Next(d, &pos, &key, &value):
            if key != PyTuple_GET_ITEM(keys, k):
                break
            _put(<list>PyList_GET_ITEM(columns, k), i, <object>value)
            k += 1
        # Another order (or equal keys that are other objects): the remaining keys looked up.
        while k < n_keys:
            found = PyDict_GetItemWithError(d, <object>PyTuple_GET_ITEM(keys, k))
            if found is NULL:
                return None  # a key of the first dict missing here (errors raised above)
            _put(<list>PyList_GET_ITEM(columns, k), i, <object>found)
            k += 1
    return columns
