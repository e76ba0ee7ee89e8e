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


cdef object _randperm_array(int64_t n, uint64_t seed, int64_t bucket_bits=-1,
                            int64_t bucket_capacity=-1):
    """A numpy int64 permutation of range(n) drawn from xoshiro256** seeded with ``seed``."""
    cdef rp_prng_state state
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
    rp_prng_seed(&state, seed)
    with nogil:
        rc = rp_perm_randperm(&state, n, bits, capacity, counts_ptr, counts_len, scratch_ptr,
                              scratch_len, &out_view[0], &bad)
    if rc != RP_OK:
        names = ("n", "bucket_bits", "bucket_capacity", "counts_len", "scratch_len")
        raise ValueError(f"rp_perm_randperm rejected {names[bad]} (n={n}, bucket_bits={bits}, "
                         f"bucket_capacity={capacity})")
    return out


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


def _py_prng_u64(seed, count):
    """Test hook: the first ``count`` xoshiro256** outputs after seeding with ``seed``."""
    cdef rp_prng_state state
    cdef int64_t i, m = count
    out = np.empty(m, dtype=np.uint64)
    cdef uint64_t[::1] view = out
    rp_prng_seed(&state, <uint64_t>(seed & _UINT64_MASK))
    for i in range(m):
        view[i] = rp_prng_next_u64(&state)
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
        cdef int rc
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
        cdef int rc
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

    def next_batch(self, batch_size):
        """Returns the next ``min(batch_size, remaining)`` elements of the epoch.

        Args:
            batch_size (int): the number of elements wanted (>= 0).

        Returns:
            an int64 CPU tensor, empty once the epoch is exhausted.
        """
        if isinstance(batch_size, bool) or not hasattr(type(batch_size), "__index__"):
            raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
        cdef object wanted = operator.index(batch_size)
        if wanted < 0:
            raise ValueError(f"batch_size must be non-negative, got batch_size={wanted}")
        import torch
        cdef int64_t batch, bad = 0
        cdef int rc = RP_OK
        cdef int64_t[::1] out_view
        with self._lock:
            batch = min(wanted, self._n - self._consumed)
            out = np.empty(batch, dtype=np.int64)
            if batch == 0:
                return torch.from_numpy(out)
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
        return torch.from_numpy(out)

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
