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
        RP_ERR_TOTAL
        RP_GNU_EXTENSIONS

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
cdef extern from "ckernels/segtree.h" nogil:
    enum:
        RP_SEGTREE_FANOUT
        RP_SEGTREE_MAX_LEVELS
    ctypedef struct rp_segtree_layout:
        int64_t size
        int64_t top
        int64_t capacity
        int64_t height
        int64_t total
        int64_t offset[17]
        int64_t length[17]
        int64_t prefix[17]
        int64_t ready
    int rp_segtree_layout_init(rp_segtree_layout *layout, int64_t size, bint with_prefix)

    ctypedef struct rp_segtree_zeroed:
        int64_t n[17]
        const int64_t *index[17]
        const double *value[17]
    int64_t rp_segtree_zeroed_scratch(const rp_segtree_layout *layout, int64_t n_exclude)

    int rp_segtree_get_f32(const rp_segtree_layout *layout, const float *tree, const int64_t *index, int64_t n, float *out, int64_t *bad)
    int rp_segtree_get_f64(const rp_segtree_layout *layout, const double *tree, const int64_t *index, int64_t n, double *out, int64_t *bad)
    void rp_sumtree_build_f32(const rp_segtree_layout *layout, float *tree)
    void rp_sumtree_build_f64(const rp_segtree_layout *layout, double *tree)
    void rp_mintree_build_f32(const rp_segtree_layout *layout, float *tree)
    void rp_mintree_build_f64(const rp_segtree_layout *layout, double *tree)
    int rp_sumtree_check_f32(const float *value, int64_t n, int64_t *bad)
    int rp_sumtree_check_f64(const double *value, int64_t n, int64_t *bad)
    int rp_mintree_check_f32(const float *value, int64_t n, int64_t *bad)
    int rp_mintree_check_f64(const double *value, int64_t n, int64_t *bad)
    int rp_priority_scan_f32(const int64_t *index, int64_t n, int64_t size, const float *priority,
                             int64_t priority_stride, int64_t *skipped, int64_t *argmax, int64_t *bad)
    int rp_priority_scan_f64(const int64_t *index, int64_t n, int64_t size, const double *priority,
                             int64_t priority_stride, int64_t *skipped, int64_t *argmax, int64_t *bad)
    int rp_segtree_index_runs(const int64_t *index, int64_t n, int64_t max_runs, int64_t *bounds,
                              int64_t *n_runs, int64_t *bad)
    int rp_sumtree_fill_ranges_f32(const rp_segtree_layout *layout, float *tree, const int64_t *bounds, int64_t n_ranges, float value, float *saved, int64_t saved_len, int64_t *bad)
    int rp_sumtree_fill_ranges_f64(const rp_segtree_layout *layout, double *tree, const int64_t *bounds, int64_t n_ranges, double value, double *saved, int64_t saved_len, int64_t *bad)
    int rp_mintree_fill_ranges_f32(const rp_segtree_layout *layout, float *tree, const int64_t *bounds, int64_t n_ranges, float value, int64_t *bad)
    int rp_mintree_fill_ranges_f64(const rp_segtree_layout *layout, double *tree, const int64_t *bounds, int64_t n_ranges, double value, int64_t *bad)
    int rp_sumtree_update_f32(const rp_segtree_layout *layout, float *tree, const int64_t *index, const float *value, int64_t value_stride, int64_t n, float *saved, int64_t *bad)
    int rp_sumtree_update_f64(const rp_segtree_layout *layout, double *tree, const int64_t *index, const double *value, int64_t value_stride, int64_t n, double *saved, int64_t *bad)
    int rp_mintree_update_f32(const rp_segtree_layout *layout, float *tree, const int64_t *index, const float *value, int64_t value_stride, int64_t n, int64_t *bad)
    int rp_mintree_update_f64(const rp_segtree_layout *layout, double *tree, const int64_t *index, const double *value, int64_t value_stride, int64_t n, int64_t *bad)
    double rp_sumtree_query_f32(const rp_segtree_layout *layout, const float *tree, int64_t l, int64_t r)
    double rp_sumtree_query_f64(const rp_segtree_layout *layout, const double *tree, int64_t l, int64_t r)
    double rp_mintree_query_f32(const rp_segtree_layout *layout, const float *tree, int64_t l, int64_t r)
    double rp_mintree_query_f64(const rp_segtree_layout *layout, const double *tree, int64_t l, int64_t r)
    void rp_sumtree_query_batch_f32(const rp_segtree_layout *layout, const float *tree, const int64_t *l, const int64_t *r, int64_t n, double *out)
    void rp_sumtree_query_batch_f64(const rp_segtree_layout *layout, const double *tree, const int64_t *l, const int64_t *r, int64_t n, double *out)
    void rp_mintree_query_batch_f32(const rp_segtree_layout *layout, const float *tree, const int64_t *l, const int64_t *r, int64_t n, double *out)
    void rp_mintree_query_batch_f64(const rp_segtree_layout *layout, const double *tree, const int64_t *l, const int64_t *r, int64_t n, double *out)
    int rp_sumtree_scan_lower_bound_f32(const rp_segtree_layout *layout, const float *tree, const float *value, int64_t n, int64_t *out, int64_t *bad)
    int rp_sumtree_scan_lower_bound_f64(const rp_segtree_layout *layout, const double *tree, const double *value, int64_t n, int64_t *out, int64_t *bad)
    int rp_sumtree_sample_f32(const rp_segtree_layout *layout, const float *tree, int64_t mass_end, int64_t num_valid, const double *uniform, int64_t n, double p_min, double beta, int64_t *out_index, float *out_priority, double *out_weight, int64_t *bad)
    int rp_sumtree_sample_f64(const rp_segtree_layout *layout, const double *tree, int64_t mass_end, int64_t num_valid, const double *uniform, int64_t n, double p_min, double beta, int64_t *out_index, double *out_priority, double *out_weight, int64_t *bad)
    int rp_sumtree_sample_masses_f32(const rp_segtree_layout *layout, const float *tree, int64_t mass_end, int64_t num_valid, const double *mass, int64_t n, double p_min, double beta, int64_t *out_index, float *out_priority, double *out_weight, int64_t *bad)
    int rp_sumtree_sample_masses_f64(const rp_segtree_layout *layout, const double *tree, int64_t mass_end, int64_t num_valid, const double *mass, int64_t n, double p_min, double beta, int64_t *out_index, double *out_priority, double *out_weight, int64_t *bad)
    int rp_sumtree_sample_exclude_f32(const rp_segtree_layout *layout, const float *tree, int64_t mass_end, int64_t num_valid, const int64_t *exclude, int64_t n_exclude, const double *uniform, int64_t n, double p_min, double beta, double *scratch, int64_t scratch_len, int64_t *out_index, float *out_priority, double *out_weight, int64_t *bad)
    int rp_sumtree_sample_exclude_f64(const rp_segtree_layout *layout, const double *tree, int64_t mass_end, int64_t num_valid, const int64_t *exclude, int64_t n_exclude, const double *uniform, int64_t n, double p_min, double beta, double *scratch, int64_t scratch_len, int64_t *out_index, double *out_priority, double *out_weight, int64_t *bad)
    int rp_sumtree_zeroed_build_f32(const rp_segtree_layout *layout, const float *tree, const int64_t *exclude, int64_t n_exclude, int64_t *index_buf, double *value_buf, int64_t buf_len, rp_segtree_zeroed *z, int64_t *bad)
    int rp_sumtree_zeroed_build_f64(const rp_segtree_layout *layout, const double *tree, const int64_t *exclude, int64_t n_exclude, int64_t *index_buf, double *value_buf, int64_t buf_len, rp_segtree_zeroed *z, int64_t *bad)
    double rp_sumtree_zeroed_query_f32(const rp_segtree_layout *layout, const float *tree, const rp_segtree_zeroed *z, int64_t l, int64_t r)
    double rp_sumtree_zeroed_query_f64(const rp_segtree_layout *layout, const double *tree, const rp_segtree_zeroed *z, int64_t l, int64_t r)
    int rp_sumtree_zeroed_sample_masses_f32(const rp_segtree_layout *layout, const float *tree, const rp_segtree_zeroed *z, int64_t num_valid, const double *mass, int64_t n, int64_t *out_index, float *out_priority, int64_t *bad)
    int rp_sumtree_zeroed_sample_masses_f64(const rp_segtree_layout *layout, const double *tree, const rp_segtree_zeroed *z, int64_t num_valid, const double *mass, int64_t n, int64_t *out_index, double *out_priority, int64_t *bad)


cdef class _SegmentTree:
    cdef rp_segtree_layout _layout  # level offsets and lengths of the 16-ary layout
    cdef int64_t _size               # the size asked for (torchrl's ``size``)
    cdef int64_t _capacity           # torchrl's ``capacity``: leaves [0, _capacity) are addressable
    cdef object _storage             # numpy array owning the buffer (over-allocated to align)
    cdef object _tree                # 64-byte aligned numpy view: every level, leaves first
    cdef float *_t32                 # _tree's data when the tree is fp32, else NULL
    cdef double *_t64                # _tree's data when the tree is fp64, else NULL
    cdef bint _fp64                  # scalar type of the leaves
    cdef bint _is_min                # min tree (else sum tree)
    cdef object _dtype               # numpy dtype of the leaves
    cdef object _lock                # serialises every kernel call (they run without the GIL)
    cdef object _saved               # scratch of the sum-tree update's overflow check, or None
    cdef void *_saved_ptr            # _saved's data (NULL while it is None)
    cdef int64_t _saved_len          # _saved's number of elements

    cdef _setup(self, object size, bint fp64, bint is_min)
    cdef _allocate(self, int64_t leaves)
    cdef void _reach(self, int64_t stop) noexcept nogil
    cdef void _reach_leaves(self, const int64_t *index, int64_t n) noexcept nogil
    cdef bint _grow_for(self, int64_t index) except -1
    cdef void _rebuild(self) noexcept nogil
    cdef void _draw_range(self, int64_t num_valid, int64_t *mass_end, int64_t *limit) noexcept
    cdef _read_past_layout(self, object arr)
    cdef int _write(self, const int64_t *iptr, const void *vptr, int64_t stride, int64_t n,
                    int64_t *bad) except? -100
    cdef void *_saved_scratch(self, int64_t n) except NULL
    cdef _raise_write_error(self, int rc, int64_t bad, const int64_t *iptr, const void *vptr,
                            int64_t stride, int64_t n, object value)
    cdef str _kind(self)
    cdef _raise_value_error(self, object stored, object value, int64_t position)
    cdef double _query_one(self, int64_t l, int64_t r) noexcept


cdef class _SumSegmentTree(_SegmentTree):
    cdef object _scratch             # numpy float64 scratch of the exclusion kernel, or None
    cdef object _zeroed_scratch      # (int64 positions, float64 values) of the zeroed view, or None


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
    enum:
        RP_SPAN_NONE
        RP_SPAN_ALL
    int rp_slice_sample_index(const int64_t *start, const int64_t *lengths, int64_t m,
                              int64_t ndim, const int64_t *traj, const float *uniform_f32,
                              const double *uniform_f64, int64_t n, const int64_t *seq_length,
                              bint uniform_length, int64_t span_left, int64_t span_right,
                              int64_t storage_length, int64_t *out, uint8_t *truncated,
                              int64_t *rows, int64_t *bad)
    int rp_slice_gather_flags(const uint8_t *flags, int64_t length, const int64_t *rows,
                              int64_t n, uint8_t *out, int64_t *bad)
    int rp_slice_patch_ends(const int64_t *ends, int64_t n_ends, const int64_t *rows,
                            const uint8_t *flags, int64_t n_rows, int64_t *out, int64_t *n_out,
                            int *changed)
    enum:
        RP_SLICE_MAX_FORCED
    int rp_slice_bounds_from_ends(const int64_t *ends, int64_t n_ends, int64_t limit,
                                  int64_t length, const int64_t *forced, int64_t n_forced,
                                  int64_t *start, int64_t *stop, int64_t *lengths, int64_t *n_out)
    int rp_slice_patch_ends_run(const int64_t *ends, int64_t n_ends, int64_t lo, int64_t hi,
                                const uint8_t *flags, int64_t *out, int64_t *n_out,
                                int *changed)
    int rp_slice_bounds_summary(const int64_t *ends, int64_t n_ends, int64_t limit,
                                int64_t length, const int64_t *forced, int64_t n_forced,
                                int64_t *count, int64_t *shortest, int64_t *bad)
    int rp_slice_bounds_at(const int64_t *ends, int64_t n_ends, int64_t limit, int64_t length,
                           const int64_t *forced, int64_t n_forced, const int64_t *traj,
                           int64_t n, int64_t *start, int64_t *lengths, int64_t *bad)
    int rp_slice_excluded_starts(const int64_t *lengths, int64_t m, int64_t tail, bint keep_first,
                                 int64_t offset, int64_t total, int64_t *out, int64_t out_len,
                                 int64_t *n_out)
    int rp_slice_short_trajectories(const int64_t *ends, int64_t n_ends, int64_t limit,
                                    int64_t length, const int64_t *forced, int64_t n_forced,
                                    int64_t min_length, int64_t *out, int64_t room,
                                    int64_t *n_out, int64_t *bad)
    int64_t rp_slice_scan_ends(const void *signal, int64_t length, int64_t stride, int width,
                               uint64_t mask, bint from_ids, int64_t start, int64_t *out,
                               int64_t room, int64_t *n_out)

# (sequence windows: torchrl 0.14's sample units)
from libc.stdint cimport int8_t

cdef extern from "ckernels/sequences.h" nogil:
    enum:
        RP_SEQUENCE_PAD
        RP_SEQUENCE_STOP
        RP_SEQUENCE_INCLUDE_RESET
    int rp_sequence_distances(const int64_t *anchor, int64_t n, const int64_t *start,
                              const int64_t *stop, int64_t m, int64_t length, int64_t *from_start,
                              int64_t *to_stop, int64_t *bad)
    int rp_sequence_distances_nd(const int64_t *anchor, int64_t n, int64_t ndim,
                                 const int64_t *start, const int64_t *stop, int64_t m,
                                 const int64_t *stop_key, const int64_t *boundary_index, int64_t k,
                                 const int64_t *lane_stride, int64_t length, int64_t *from_start,
                                 int64_t *to_stop, int64_t *bad)
    int rp_sequence_windows(const uint8_t *end, int64_t length, int64_t groups, int64_t cursor,
                            bint close_last, const int64_t *anchor_time,
                            const int64_t *anchor_group, int64_t n, int64_t burn_in,
                            int64_t seq_length, int64_t bootstrap, int64_t dilation, int policy,
                            int64_t newest, int64_t oldest, int8_t *group_has_end, int64_t *index,
                            uint8_t *validity, int64_t *sequence_id, int64_t *step,
                            uint8_t *learning, int64_t *anchor_repeat, const int64_t *stops,
                            const int64_t *stop_offsets, int64_t *bad)
    void rp_sequence_repeat_rows(const int64_t *rows, int64_t n, int64_t width, int64_t times,
                                 int64_t *out)


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
    int rp_perm_shuffle(rp_prng_state *st, int64_t n, const int64_t *values, int64_t bucket_bits,
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



cdef extern from "ckernels/rows.h" nogil:
    int rp_take_rows(int64_t m, const char *const *src, char *const *dst, const int64_t *row_bytes,
                     const int64_t *rows, const int64_t *index, int64_t n, int64_t *bad)
