# cython: language_level=3
"""C declarations of the replay kernels and the cdef classes of ``replay``.

Each ``cdef extern`` block mirrors one header of ``ckernels/`` and keeps its parameter
names, so that other Cython code can ``cimport replay``.
"""
from libc.stdint cimport int64_t, uint64_t, uint32_t

ctypedef float float32_t
ctypedef double float64_t

cdef extern from "ckernels/rp_common.h" nogil:
    enum:
        RP_OK
        RP_ERR_INDEX
        RP_ERR_VALUE
        RP_ERR_EMPTY

cdef extern from "ckernels/prng.h" nogil:
    ctypedef struct rp_prng_state:
        uint64_t s[4]
    uint64_t rp_prng_next_u64(rp_prng_state *st)
    double rp_prng_next_double(rp_prng_state *st)
    uint64_t rp_prng_bounded_u64(rp_prng_state *st, uint64_t bound)
    void rp_prng_seed(rp_prng_state *st, uint64_t seed)
    void rp_prng_fill_double(rp_prng_state *st, int64_t n, double *out)

# =====================================================================================
# Segment trees
# =====================================================================================
# (segment-tree declarations)


# =====================================================================================
# Slices
# =====================================================================================
# (slice declarations)


# =====================================================================================
# Permutations
# =====================================================================================
# (permutation declarations)
from libc.stdint cimport int32_t

cdef extern from "ckernels/perm.h" nogil:
    enum:
        RP_PERM_MAX_BUCKET_BITS
    void rp_perm_randperm_layout(int64_t n, int64_t *bucket_bits, int64_t *bucket_capacity)
    int rp_perm_randperm(rp_prng_state *st, int64_t n, int64_t bucket_bits,
                         int64_t bucket_capacity, int64_t *counts, int64_t counts_len,
                         int32_t *scratch, int64_t scratch_len, int64_t *out, int64_t *bad)
    int rp_perm_sparse_next_batch(rp_prng_state *st, int64_t n, int64_t consumed,
                                  int64_t *keys, int64_t *vals, int64_t capacity,
                                  int64_t *used, int64_t batch, int64_t *out, int64_t *bad)
    int rp_perm_map_rehash(const int64_t *old_keys, const int64_t *old_vals,
                           int64_t old_capacity, int64_t min_key, int64_t *new_keys,
                           int64_t *new_vals, int64_t new_capacity, int64_t *used,
                           int64_t *bad)
    int rp_perm_map_materialize(int64_t n, int64_t consumed, const int64_t *keys,
                                const int64_t *vals, int64_t capacity, int64_t *dense,
                                int64_t *bad)
    int rp_perm_dense_next_batch(rp_prng_state *st, int64_t n, int64_t consumed,
                                 int64_t *dense, int64_t batch, int64_t *out, int64_t *bad)


cdef class PermutationEpoch:
    cdef int64_t _n              # number of elements in an epoch
    cdef int64_t _consumed       # elements handed out so far in this epoch
    cdef int64_t _used           # occupied slots of the sparse map (dead ones included)
    cdef bint _is_dense          # True once the remaining positions live in _dense
    cdef rp_prng_state _state    # xoshiro256** state of this epoch
    cdef int64_t[::1] _keys      # sparse map keys (displaced positions; -1 marks empty)
    cdef int64_t[::1] _vals      # sparse map values (the element now at that position)
    cdef int64_t[::1] _dense     # dense phase: current element at each position >= _consumed
    cdef object _lock            # threading.Lock serialising every kernel call

    cdef int _reserve(self, int64_t extra) except -1
    cdef int _to_dense(self) except -1

