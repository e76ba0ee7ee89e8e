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
from libc.stdint cimport uint8_t

cdef extern from "ckernels/slices.h" nogil:
    int rp_slice_ends_from_ids(const int64_t *ids, int64_t length, int64_t groups,
                               bint at_capacity, uint8_t *end, int64_t *bad)
    enum:
        RP_SLICE_BLOCK
    int64_t rp_slice_block_count_size(int64_t length, int64_t groups)
    int rp_slice_count_ends(const uint8_t *end, int64_t length, int64_t groups, int64_t cursor,
                            bint close_last, uint8_t *block_count, int64_t *group_count,
                            int64_t *total, int64_t *bad)
    int rp_slice_starts(const uint8_t *end, int64_t length, int64_t groups, int64_t cursor,
                        bint close_last, const uint8_t *block_count, const int64_t *group_count,
                        int64_t ndim, const int64_t *group_coord, int64_t *scratch,
                        int64_t *start, int64_t *stop, int64_t *lengths, int64_t *bad)
    int rp_slice_indices(const int64_t *start, int64_t n, int64_t ndim,
                         const int64_t *seq_length, bint uniform, int64_t storage_length,
                         int64_t *out, int64_t *bad)


# =====================================================================================
# Permutations
# =====================================================================================
# (permutation declarations)

