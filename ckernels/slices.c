/* Trajectory slice starts and stops; see slices.h.
 *
 * The layout follows a counting sort: one pass counts the ends of every group, the caller
 * sizes the outputs, and a second pass scatters each end to its group's next output row.
 * Ends are sparse in replay buffers (one per episode), so the count pass, the only one that
 * reads the whole signal (a vectorised byte count per 64-byte block), also leaves a count
 * per block, and everything after it reads only the blocks that hold an end. */
#include "slices.h"

#include <math.h>
#include <string.h>

/* Rows forced to be ends (the cursor row and, with close_last, the last row), sorted and
 * without duplicates. Returns how many there are (0 to 2). */
static int forced_rows(int64_t length, int64_t cursor, bool close_last, int64_t rows[2]) {
    int n = 0;
    if (cursor >= 0) rows[n++] = cursor;
    if (close_last && cursor != length - 1) rows[n++] = length - 1;
    return n;
}

static int check_signal(int64_t length, int64_t groups, int64_t cursor, int64_t *bad) {
    if (length < 1 || groups < 1) {
        *bad = length;
        return RP_ERR_VALUE;
    }
    if (cursor < -1 || cursor >= length) {
        *bad = cursor;
        return RP_ERR_INDEX;
    }
    return RP_OK;
}

/* The trajectory that ends at row stop_t after one ending at row previous: its first row
 * (one past previous, wrapping from the last row to 0) into *start_t, and its length (wrapping
 * when it runs from the end of the signal to its start) as the return value. */
static inline int64_t trajectory_after(int64_t previous, int64_t stop_t, int64_t length,
                                       int64_t *start_t) {
    *start_t = previous + 1 == length ? 0 : previous + 1;
    const int64_t span = stop_t - *start_t + 1;
    return span <= 0 ? span + length : span;
}

/* Number of nonzero bytes in a full block: a fixed trip count that -O3 vectorises. */
static inline uint8_t block_nonzero(const uint8_t *restrict p) {
    uint8_t c = 0;
    for (int j = 0; j < RP_SLICE_BLOCK; ++j) c += (uint8_t)(p[j] != 0);
    return c;
}

/* Position (in memory order) of the first nonzero byte of the 8 bytes loaded into *word with
 * memcpy, which is then cleared. Precondition: *word != 0. Finding it without a branch per
 * byte matters: ends sit at random places, so per-byte tests mispredict. */
static inline int64_t pop_nonzero_byte(uint64_t *word) {
#if RP_GNU_EXTENSIONS && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const int k = __builtin_ctzll(*word) >> 3;
    *word &= ~((uint64_t)0xFF << (8 * k));
    return k;
#else
    unsigned char bytes[8];
    memcpy(bytes, word, sizeof bytes);
    int k = 0;
    while (bytes[k] == 0) ++k;
    bytes[k] = 0;
    memcpy(word, bytes, sizeof bytes);
    return k;
#endif
}

/* Load up to 8 bytes (fewer at the end of an array) as one word, zero-padded. */
static inline uint64_t load_word(const uint8_t *p, int64_t available) {
    uint64_t word = 0;
    memcpy(&word, p, (size_t)(available < 8 ? available : 8));
    return word;
}

/* Visit every nonzero byte of end[lo..hi) (flat positions of the [length, groups] array) in
 * order, reading only the blocks whose count is not zero (8 counts per word test) and
 * within those only the nonzero words. For each, `VISIT` runs with `t` and `g` set (a macro
 * rather than a callback so that the visit inlines). */
#define RP_FOR_EACH_END(end, block_count, groups, lo, hi, VISIT)                              \
    do {                                                                                      \
        const int64_t rp_lo_ = (lo), rp_hi_ = (hi);                                           \
        if (rp_lo_ < rp_hi_) {                                                                \
            const int64_t rp_b_end_ = (rp_hi_ - 1) / RP_SLICE_BLOCK + 1;                      \
            for (int64_t rp_win_ = rp_lo_ / RP_SLICE_BLOCK; rp_win_ < rp_b_end_; rp_win_ += 8) { \
                uint64_t rp_c_ = load_word((block_count) + rp_win_, rp_b_end_ - rp_win_);     \
                while (rp_c_ != 0) {                                                          \
                    const int64_t rp_first_ =                                                 \
                        (rp_win_ + pop_nonzero_byte(&rp_c_)) * RP_SLICE_BLOCK;                \
                    for (int64_t rp_w_ = rp_first_;                                           \
                         rp_w_ < rp_first_ + RP_SLICE_BLOCK && rp_w_ < rp_hi_; rp_w_ += 8) {  \
                        uint64_t rp_word_ = load_word((end) + rp_w_, rp_hi_ - rp_w_);         \
                        while (rp_word_ != 0) {                                               \
                            const int64_t rp_i_ = rp_w_ + pop_nonzero_byte(&rp_word_);        \
                            if (rp_i_ < rp_lo_) continue;                                     \
                            const int64_t t = (groups) == 1 ? rp_i_ : rp_i_ / (groups);       \
                            const int64_t g = rp_i_ - t * (groups);                           \
                            VISIT;                                                            \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    } while (0)

int64_t rp_slice_block_count_size(int64_t length, int64_t groups) {
    if (length < 1 || groups < 1) return 0;
    return (length * groups + RP_SLICE_BLOCK - 1) / RP_SLICE_BLOCK;
}

int rp_slice_ends_from_ids(const int64_t *ids, int64_t length, int64_t groups, bool at_capacity,
                           uint8_t *end, int64_t *bad) {
    if (length < 1 || groups < 1) {
        *bad = length;
        return RP_ERR_VALUE;
    }
    const int64_t inner = (length - 1) * groups;
    const int64_t *restrict next = ids + groups;
    const int64_t *restrict here = ids;
    uint8_t *restrict out = end;
    for (int64_t i = 0; i < inner; ++i) out[i] = (uint8_t)(here[i] != next[i]);
    for (int64_t g = 0; g < groups; ++g) {
        out[inner + g] = at_capacity ? (uint8_t)(here[inner + g] != here[g]) : (uint8_t)1;
    }
    return RP_OK;
}

int rp_slice_count_ends(const uint8_t *end, int64_t length, int64_t groups, int64_t cursor,
                        bool close_last, uint8_t *block_count, int64_t *group_count,
                        int64_t *total, int64_t *bad) {
    int rc = check_signal(length, groups, cursor, bad);
    if (rc != RP_OK) return rc;
    const int64_t n = length * groups;
    const int64_t full_blocks = n / RP_SLICE_BLOCK;
    for (int64_t b = 0; b < full_blocks; ++b) block_count[b] = block_nonzero(end + b * RP_SLICE_BLOCK);
    if (full_blocks * RP_SLICE_BLOCK < n) {
        uint8_t c = 0;
        for (int64_t i = full_blocks * RP_SLICE_BLOCK; i < n; ++i) c += (uint8_t)(end[i] != 0);
        block_count[full_blocks] = c;
    }

    int64_t rows[2];
    const int nforced = forced_rows(length, cursor, close_last, rows);
    if (groups == 1) {
        /* The block counts already sum to the answer, bar forced rows that hold no end. */
        int64_t sum = 0;
        for (int64_t b = 0; b < rp_slice_block_count_size(length, 1); ++b) sum += block_count[b];
        for (int f = 0; f < nforced; ++f) sum += end[rows[f]] == 0;
        group_count[0] = *total = sum > 0 ? sum : 1;
        return RP_OK;
    }
    memset(group_count, 0, (size_t)groups * sizeof *group_count);
    int64_t t0 = 0;
    for (int f = 0; f <= nforced; ++f) {
        const int64_t until = f < nforced ? rows[f] : length;
        RP_FOR_EACH_END(end, block_count, groups, t0 * groups, until * groups,
                        (void)t; group_count[g] += 1);
        if (f < nforced) {
            for (int64_t g = 0; g < groups; ++g) group_count[g] += 1;
            t0 = until + 1;
        }
    }
    int64_t sum = 0;
    for (int64_t g = 0; g < groups; ++g) {
        /* A group without any end holds a single trajectory that ends at the last row. */
        if (group_count[g] == 0) group_count[g] = 1;
        sum += group_count[g];
    }
    *total = sum;
    return RP_OK;
}

int rp_slice_starts(const uint8_t *end, int64_t length, int64_t groups, int64_t cursor,
                    bool close_last, const uint8_t *block_count, const int64_t *group_count,
                    int64_t ndim, const int64_t *group_coord, int64_t *scratch, int64_t *start,
                    int64_t *stop, int64_t *lengths, int64_t *bad) {
    int rc = check_signal(length, groups, cursor, bad);
    if (rc != RP_OK) return rc;
    if (ndim < 1 || (group_coord == NULL && ndim > 2) || (ndim == 1 && groups != 1)) {
        *bad = ndim;
        return RP_ERR_VALUE;
    }
    int64_t *next = scratch;
    int64_t *limit = scratch + groups;
    int64_t offset = 0;
    for (int64_t g = 0; g < groups; ++g) {
        next[g] = offset;
        offset += group_count[g];
        limit[g] = offset;
    }

    int64_t rows[2];
    const int nforced = forced_rows(length, cursor, close_last, rows);
    int64_t t0 = 0;
    int64_t overflow = -1;
    for (int f = 0; f <= nforced && overflow < 0; ++f) {
        const int64_t until = f < nforced ? rows[f] : length;
        /* Each write is bounds-checked: the signal may have changed since it was counted. */
#define RP_SCATTER_STOP                \
    {                                  \
        if (next[g] >= limit[g]) {     \
            overflow = g;              \
            break;                     \
        }                              \
        stop[next[g]++ * ndim] = t;    \
    }
        if (groups == 1) { /* a literal 1: no division per end */
            RP_FOR_EACH_END(end, block_count, 1, t0, until, RP_SCATTER_STOP);
        } else {
            RP_FOR_EACH_END(end, block_count, groups, t0 * groups, until * groups, RP_SCATTER_STOP);
        }
#undef RP_SCATTER_STOP
        if (overflow < 0 && f < nforced) {
            for (int64_t g = 0; g < groups; ++g) {
                if (next[g] >= limit[g]) {
                    overflow = g;
                    break;
                }
                stop[next[g]++ * ndim] = until;
            }
            t0 = until + 1;
        }
    }
    if (overflow >= 0) {
        *bad = overflow;
        return RP_ERR_VALUE;
    }

    const int64_t ncoord = ndim - 1;
    int64_t first = 0;
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t last = limit[g] - 1;
        if (next[g] == first && group_count[g] == 1) {
            stop[first * ndim] = length - 1; /* no end in this group: it ends at the last row */
        } else if (next[g] != limit[g]) {
            *bad = g;
            return RP_ERR_VALUE;
        }
        /* The first trajectory of a group starts after the group's last end (wrapping). */
        int64_t previous = stop[last * ndim];
        for (int64_t k = first; k <= last; ++k) {
            const int64_t stop_t = stop[k * ndim];
            lengths[k] = trajectory_after(previous, stop_t, length, &start[k * ndim]);
            previous = stop_t;
            if (ncoord == 1 && group_coord == NULL) {
                start[k * ndim + 1] = g;
                stop[k * ndim + 1] = g;
            } else {
                for (int64_t c = 0; c < ncoord; ++c) {
                    const int64_t value = group_coord[g * ncoord + c];
                    start[k * ndim + 1 + c] = value;
                    stop[k * ndim + 1 + c] = value;
                }
            }
        }
        first = limit[g];
    }
    return RP_OK;
}

/* The rows of one slice: (t0 + i, coord[1], ..., coord[ndim - 1]) for i < steps, the time
 * column taken modulo storage_length. O(steps * ndim). */
static void write_slice(const int64_t *coord, int64_t t0, int64_t steps, int64_t ndim,
                        int64_t storage_length, int64_t *dst) {
    /* Floor modulo, so that starts past either end of the storage wrap like torch's `%`. */
    int64_t t = t0 % storage_length;
    if (t < 0) t += storage_length;
    if (ndim == 1) {
        for (int64_t i = 0; i < steps; ++i) {
            dst[i] = t;
            if (++t == storage_length) t = 0;
        }
        return;
    }
    for (int64_t i = 0; i < steps; ++i) {
        dst[i * ndim] = t;
        memcpy(dst + i * ndim + 1, coord + 1, (size_t)(ndim - 1) * sizeof *coord);
        if (++t == storage_length) t = 0;
    }
}

int rp_slice_indices(const int64_t *start, int64_t n, int64_t ndim, const int64_t *seq_length,
                     bool uniform, int64_t storage_length, int64_t *out, int64_t *bad) {
    if (storage_length < 1 || ndim < 1) {
        *bad = -1;
        return RP_ERR_VALUE;
    }
    for (int64_t k = 0; k < (uniform ? (n > 0 ? 1 : 0) : n); ++k) {
        if (seq_length[k] < 0) {
            *bad = k;
            return RP_ERR_VALUE;
        }
    }
    int64_t row = 0;
    for (int64_t k = 0; k < n; ++k) {
        const int64_t steps = uniform ? seq_length[0] : seq_length[k];
        const int64_t *first = start + k * ndim;
        write_slice(first, first[0], steps, ndim, storage_length, out + row * ndim);
        row += steps;
    }
    return RP_OK;
}

/* The relative first step of one slice (see rp_slice_sample_index). */
static inline int64_t slice_relative_start(double u, bool single, int64_t lo, int64_t hi) {
    const int64_t width = hi - lo;
    int64_t r;
    if (single) {
        r = (int64_t)floorf((float)u * (float)width) + lo;
    } else {
        r = (int64_t)floor(u * (double)width) + lo;
    }
    const int64_t last = hi - 1 > lo ? hi - 1 : lo;
    return r < last ? r : last;
}

int rp_slice_sample_index(const int64_t *start, const int64_t *lengths, int64_t m, int64_t ndim,
                          const int64_t *traj, const float *uniform_f32,
                          const double *uniform_f64, int64_t n, const int64_t *seq_length,
                          bool uniform_length, int64_t span_left, int64_t span_right,
                          int64_t storage_length, int64_t *out, uint8_t *truncated,
                          int64_t *rows, int64_t *bad) {
    if (storage_length < 1 || ndim < 1 || (uniform_f32 == NULL) == (uniform_f64 == NULL)) {
        *bad = -1;
        return RP_ERR_VALUE;
    }
    int64_t capacity = 0;
    for (int64_t k = 0; k < n; ++k) {
        if (traj[k] < 0 || traj[k] >= m) {
            *bad = k;
            return RP_ERR_INDEX;
        }
        const int64_t requested = seq_length[uniform_length ? 0 : k];
        if (requested < 0) {
            *bad = k;
            return RP_ERR_VALUE;
        }
        capacity += requested;
    }
    memset(truncated, 0, (size_t)capacity);
    const bool single = uniform_f32 != NULL;
    bool unmarked = false; /* a slice ended with no row written yet */
    int64_t row = 0;
    for (int64_t k = 0; k < n; ++k) {
        const int64_t requested = seq_length[uniform_length ? 0 : k];
        const int64_t *first = start + traj[k] * ndim;
        const int64_t traj_length = lengths[traj[k]];
        const int64_t hi = span_right == RP_SPAN_NONE ? traj_length - requested + 1
                           : span_right == RP_SPAN_ALL ? traj_length + 1
                                                       : traj_length - span_right;
        const int64_t lo = span_left == RP_SPAN_NONE ? 0
                           : span_left == RP_SPAN_ALL ? 1 - requested
                                                      : -span_left;
        int64_t r = slice_relative_start(single ? (double)uniform_f32[k] : uniform_f64[k], single,
                                         lo, hi);
        int64_t steps = requested;
        if (span_left != RP_SPAN_NONE && r < 0) {
            steps += r; /* fewer steps when the slice starts before the trajectory */
            r = 0;
        }
        if (span_right != RP_SPAN_NONE && r + steps > traj_length) {
            steps = traj_length - r; /* cut at the trajectory's end */
        }
        if (steps < 0) { /* a left span wider than this slice's own length */
            *bad = k;
            return RP_ERR_VALUE;
        }
        write_slice(first, first[0] + r, steps, ndim, storage_length, out + row * ndim);
        row += steps;
        if (row > 0) {
            truncated[row - 1] = 1;
        } else {
            unmarked = true;
        }
    }
    *rows = row;
    if (unmarked) {
        /* torch's truncated[cumsum - 1] reads index -1 there: the batch's last row. */
        if (row == 0) return RP_ERR_EMPTY;
        truncated[row - 1] = 1;
    }
    return RP_OK;
}

int rp_slice_patch_ends(const int64_t *ends, int64_t n_ends, const int64_t *rows,
                        const uint8_t *flags, int64_t n_rows, int64_t *out, int64_t *n_out,
                        int *changed) {
    for (int64_t k = 1; k < n_rows; ++k) {
        if (rows[k] <= rows[k - 1]) {
            *n_out = k;
            return RP_ERR_VALUE;
        }
    }
    int64_t i = 0, k = 0, o = 0;
    bool differs = false;
    while (i < n_ends || k < n_rows) {
        if (k == n_rows || (i < n_ends && ends[i] < rows[k])) {
            out[o++] = ends[i++]; /* an end no write touched */
            continue;
        }
        const bool was_end = i < n_ends && ends[i] == rows[k];
        const bool is_end = flags[k] != 0;
        if (is_end) out[o++] = rows[k];
        differs |= was_end != is_end;
        i += was_end;
        ++k;
    }
    *n_out = o;
    *changed = differs;
    return RP_OK;
}

/* The forced rows of rp_slice_bounds_from_ends, checked, sorted and without duplicates (-1
 * entries dropped) into extra; returns how many, or -1 for bad arguments. O(n_forced^2). */
static int64_t sorted_forced(int64_t length, const int64_t *forced, int64_t n_forced,
                             int64_t extra[RP_SLICE_MAX_FORCED]) {
    if (length < 1 || n_forced < 0 || n_forced > RP_SLICE_MAX_FORCED) return -1;
    for (int64_t f = 0; f < n_forced; ++f) {
        if (forced[f] < -1 || forced[f] >= length) return -1;
    }
    int64_t n_extra = 0;
    for (int64_t f = 0; f < n_forced; ++f) {
        const int64_t r = forced[f];
        if (r < 0) continue;
        int64_t p = 0;
        while (p < n_extra && extra[p] < r) ++p;
        if (p < n_extra && extra[p] == r) continue;
        for (int64_t q = n_extra; q > p; --q) extra[q] = extra[q - 1];
        extra[p] = r;
        ++n_extra;
    }
    return n_extra;
}

/* First position in the sorted values[0..n) holding a value >= key. O(log n). */
static int64_t lower_bound(const int64_t *values, int64_t n, int64_t key) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (values[mid] < key) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

int rp_slice_bounds_from_ends(const int64_t *ends, int64_t n_ends, int64_t limit, int64_t length,
                              const int64_t *forced, int64_t n_forced, int64_t *start,
                              int64_t *stop, int64_t *lengths, int64_t *n_out) {
    int64_t extra[RP_SLICE_MAX_FORCED];
    const int64_t n_extra = sorted_forced(length, forced, n_forced, extra);
    if (n_extra < 0) {
        *n_out = -1;
        return RP_ERR_VALUE;
    }
    /* Merge the ends below limit with the forced rows. */
    int64_t i = 0, e = 0, o = 0;
    while ((i < n_ends && ends[i] < limit) || e < n_extra) {
        int64_t r;
        if (e == n_extra || (i < n_ends && ends[i] < limit && ends[i] <= extra[e])) {
            r = ends[i++];
            if (e < n_extra && extra[e] == r) ++e;
        } else {
            r = extra[e++];
        }
        stop[o++] = r;
    }
    if (o == 0) stop[o++] = length - 1; /* no end at all: one trajectory to the last row */
    int64_t previous = stop[o - 1];
    for (int64_t k = 0; k < o; ++k) {
        lengths[k] = trajectory_after(previous, stop[k], length, &start[k]);
        previous = stop[k];
    }
    *n_out = o;
    return RP_OK;
}

int rp_slice_patch_ends_run(const int64_t *ends, int64_t n_ends, int64_t lo, int64_t hi,
                            const uint8_t *flags, int64_t *out, int64_t *n_out, int *changed) {
    if (lo < 0 || hi < lo) {
        *n_out = -1;
        return RP_ERR_VALUE;
    }
    /* ends[first..past) are the old ends in the run; the new ones are written at out + first,
     * and the ends around the run are copied only when something changed. */
    const int64_t first = lower_bound(ends, n_ends, lo);
    const int64_t past = first + lower_bound(ends + first, n_ends - first, hi);
    int64_t *mid = out + first;
    int64_t o = 0;
    const int64_t steps = hi - lo;
    int64_t j = 0;
    /* ends are sparse: skip 8 flag bytes at a time while they are all zero */
    for (; j + 8 <= steps; j += 8) {
        uint64_t word;
        memcpy(&word, flags + j, sizeof word);
        if (word == 0) continue;
        for (int64_t b = 0; b < 8; ++b) {
            if (flags[j + b]) mid[o++] = lo + j + b;
        }
    }
    for (; j < steps; ++j) {
        if (flags[j]) mid[o++] = lo + j;
    }
    const bool differs =
        o != past - first || (o > 0 && memcmp(mid, ends + first, (size_t)o * sizeof *ends) != 0);
    *changed = differs;
    if (!differs) {
        *n_out = n_ends;
        return RP_OK;
    }
    memcpy(out, ends, (size_t)first * sizeof *ends);
    memcpy(mid + o, ends + past, (size_t)(n_ends - past) * sizeof *ends);
    *n_out = first + o + (n_ends - past);
    return RP_OK;
}

/* The trajectories of rp_slice_bounds_from_ends, listed by stop row: the ends below limit
 * merged with the forced rows that are not ends already. */
typedef struct {
    const int64_t *ends;
    int64_t n_ends;                        /* ends below limit */
    int64_t length;                        /* rows of the signal */
    int64_t n_extra;                       /* forced rows that are not ends */
    int64_t extra[RP_SLICE_MAX_FORCED];    /* those rows, increasing */
    int64_t at[RP_SLICE_MAX_FORCED];       /* the position of each in the merged list */
    int64_t count;                         /* trajectories (1 when there is no end at all) */
} stop_list;

static int stop_list_init(stop_list *s, const int64_t *ends, int64_t n_ends, int64_t limit,
                          int64_t length, const int64_t *forced, int64_t n_forced) {
    int64_t sorted[RP_SLICE_MAX_FORCED];
    const int64_t n_sorted = sorted_forced(length, forced, n_forced, sorted);
    if (n_sorted < 0) return RP_ERR_VALUE;
    s->ends = ends;
    s->n_ends = lower_bound(ends, n_ends, limit);
    s->length = length;
    s->n_extra = 0;
    for (int64_t f = 0; f < n_sorted; ++f) {
        const int64_t p = lower_bound(ends, s->n_ends, sorted[f]);
        if (p < s->n_ends && ends[p] == sorted[f]) continue; /* an end already */
        s->extra[s->n_extra] = sorted[f];
        s->at[s->n_extra] = p + s->n_extra; /* p ends and the earlier extras come first */
        ++s->n_extra;
    }
    s->count = s->n_ends + s->n_extra;
    if (s->count == 0) s->count = 1;
    return RP_OK;
}

/* The stop row of trajectory k < s->count. O(n_extra). */
static inline int64_t stop_list_at(const stop_list *s, int64_t k) {
    if (s->n_ends + s->n_extra == 0) return s->length - 1; /* no end: one trajectory */
    int64_t j = 0;
    while (j < s->n_extra && s->at[j] < k) ++j;
    if (j < s->n_extra && s->at[j] == k) return s->extra[j];
    return s->ends[k - j];
}

/* The length (and into *start_t the first row) of trajectory k < s->count. O(n_extra). */
static inline int64_t stop_list_length(const stop_list *s, int64_t k, int64_t *start_t) {
    const int64_t previous = stop_list_at(s, k == 0 ? s->count - 1 : k - 1);
    return trajectory_after(previous, stop_list_at(s, k), s->length, start_t);
}

int rp_slice_bounds_summary(const int64_t *ends, int64_t n_ends, int64_t limit, int64_t length,
                            const int64_t *forced, int64_t n_forced, int64_t *count,
                            int64_t *shortest, int64_t *bad) {
    stop_list s;
    if (stop_list_init(&s, ends, n_ends, limit, length, forced, n_forced) != RP_OK) {
        *bad = -1;
        return RP_ERR_VALUE;
    }
    /* Every trajectory but the first that neither ends at nor follows a forced row runs
     * between two consecutive ends. The gap between two ends with a forced row in between
     * is longer than both trajectories it holds, so taking it into the minimum too is
     * harmless, and the loop stays branch-free. */
    int64_t low = INT64_MAX;
    for (int64_t i = 1; i < s.n_ends; ++i) {
        const int64_t gap = ends[i] - ends[i - 1];
        low = gap < low ? gap : low;
    }
    int64_t start_t, k;
    for (int64_t j = 0; j <= s.n_extra; ++j) {
        /* the first trajectory, then those ending at and following each forced row */
        for (int64_t side = 0; side < (j == 0 ? 1 : 2); ++side) {
            k = j == 0 ? 0 : s.at[j - 1] + side;
            if (k >= s.count) k = 0;
            const int64_t steps = stop_list_length(&s, k, &start_t);
            low = steps < low ? steps : low;
        }
    }
    *count = s.count;
    *shortest = low;
    return RP_OK;
}

int rp_slice_short_trajectories(const int64_t *ends, int64_t n_ends, int64_t limit, int64_t length,
                                const int64_t *forced, int64_t n_forced, int64_t min_length,
                                int64_t *out, int64_t room, int64_t *n_out, int64_t *bad) {
    stop_list s;
    *n_out = 0;
    if (stop_list_init(&s, ends, n_ends, limit, length, forced, n_forced) != RP_OK) {
        *bad = -1;
        return RP_ERR_VALUE;
    }
    int64_t n = 0, start_t;
    int64_t j = 0; /* the forced rows listed before position k */
    for (int64_t k = 0; k < s.count; ++k) {
        while (j < s.n_extra && s.at[j] < k) ++j;
        int64_t steps;
        const bool near_forced = (j < s.n_extra && s.at[j] == k) || (j > 0 && s.at[j - 1] == k - 1);
        if (k == 0 || near_forced) {
            steps = stop_list_length(&s, k, &start_t); /* wraps, or a forced row at either side */
        } else {
            /* trajectories k - 1 and k both stop at ends: the gap between the two */
            steps = s.ends[k - j] - s.ends[k - 1 - j];
        }
        if (steps < min_length) {
            if (n < room) out[n] = k;
            ++n;
        }
    }
    *n_out = n;
    return RP_OK;
}

int rp_slice_bounds_at(const int64_t *ends, int64_t n_ends, int64_t limit, int64_t length,
                       const int64_t *forced, int64_t n_forced, const int64_t *traj, int64_t n,
                       int64_t *start, int64_t *lengths, int64_t *bad) {
    stop_list s;
    if (stop_list_init(&s, ends, n_ends, limit, length, forced, n_forced) != RP_OK) {
        *bad = -1;
        return RP_ERR_VALUE;
    }
    for (int64_t k = 0; k < n; ++k) {
        if (traj[k] < 0 || traj[k] >= s.count) {
            *bad = k;
            return RP_ERR_INDEX;
        }
    }
    for (int64_t k = 0; k < n; ++k) lengths[k] = stop_list_length(&s, traj[k], &start[k]);
    return RP_OK;
}

int rp_slice_gather_flags(const uint8_t *flags, int64_t length, const int64_t *rows, int64_t n,
                          uint8_t *out, int64_t *bad) {
    for (int64_t i = 0; i < n; ++i) {
        if ((uint64_t)rows[i] >= (uint64_t)length) {
            *bad = i;
            return RP_ERR_INDEX;
        }
    }
    for (int64_t i = 0; i < n; ++i) out[i] = flags[rows[i]] != 0;
    return RP_OK;
}

static inline int64_t excluded_count(int64_t length, int64_t tail, bool keep_first) {
    const int64_t limit = keep_first ? (length > 0 ? length - 1 : 0) : length;
    return limit < tail ? limit : tail;
}

int rp_slice_excluded_starts(const int64_t *lengths, int64_t m, int64_t tail, bool keep_first,
                             int64_t offset, int64_t total, int64_t *out, int64_t out_len,
                             int64_t *n_out) {
    if (tail < 0 || total < 1 || offset < 0 || offset >= total) {
        *n_out = -1;
        return RP_ERR_VALUE;
    }
    /* First pass: check, count, and count the positions that wrap (p + offset >= total). As the
     * positions grow with k, those are the last ones: they go first in the output. */
    int64_t end = 0, n = 0, wrapped = 0;
    const int64_t threshold = total - offset;
    for (int64_t k = 0; k < m; ++k) {
        if (lengths[k] < 0 || lengths[k] > total - end) {
            *n_out = -1;
            return RP_ERR_VALUE;
        }
        end += lengths[k];
        const int64_t c = excluded_count(lengths[k], tail, keep_first);
        n += c;
        /* the excluded positions of k are [end - c, end) */
        const int64_t first_wrapped = end - c > threshold ? end - c : threshold;
        if (end > first_wrapped) wrapped += end - first_wrapped;
    }
    if (out_len < n) {
        *n_out = -2;
        return RP_ERR_VALUE;
    }
    int64_t *front = out, *back = out + wrapped;
    end = 0;
    for (int64_t k = 0; k < m; ++k) {
        end += lengths[k];
        const int64_t c = excluded_count(lengths[k], tail, keep_first);
        for (int64_t p = end - c; p < end; ++p) {
            const int64_t q = p + offset;
            if (q >= total) *front++ = q - total;
            else *back++ = q;
        }
    }
    *n_out = n;
    return RP_OK;
}

/* rp_slice_scan_ends for elements of type T: `row` is the first row to examine and `stop` one
 * past the last; ends are written while there is room. With ids the previous element stays in a
 * register, so each element is read once. */
#define RP_SCAN_ENDS(T)                                                                      \
    do {                                                                                     \
        const T m = (T)mask;                                                                 \
        if (from_ids) {                                                                      \
            T prev;                                                                          \
            memcpy(&prev, base + row * stride, sizeof prev);                                 \
            for (; row < stop && n < room; ++row) {                                          \
                T next;                                                                      \
                memcpy(&next, base + (row + 1) * stride, sizeof next);                       \
                if ((prev ^ next) & m) out[n++] = row;                                       \
                prev = next;                                                                 \
            }                                                                                \
        } else {                                                                             \
            for (; row < stop && n < room; ++row) {                                          \
                T value;                                                                     \
                memcpy(&value, base + row * stride, sizeof value);                           \
                if (value & m) out[n++] = row;                                               \
            }                                                                                \
        }                                                                                    \
    } while (0)

int64_t rp_slice_scan_ends(const void *signal, int64_t length, int64_t stride, int width,
                           uint64_t mask, bool from_ids, int64_t from, int64_t *out, int64_t room,
                           int64_t *n_out) {
    *n_out = 0;
    if (from < 0 || room < 0 || (width != 1 && width != 2 && width != 4 && width != 8)) return -1;
    const char *base = (const char *)signal;
    const int64_t stop = from_ids ? length - 1 : length;
    int64_t row = from, n = 0;
    if (row >= stop) return row;
    if (width == 1 && stride == 1 && !from_ids && (uint8_t)mask == 0xFF) {
        /* bool columns: ends are sparse, so skip 8 zero bytes at a time */
        const uint8_t *bytes = (const uint8_t *)base;
        while (row < stop && n < room) {
            if (row + 8 <= stop) {
                uint64_t word;
                memcpy(&word, bytes + row, sizeof word);
                if (word == 0) {
                    row += 8;
                    continue;
                }
            }
            if (bytes[row]) out[n++] = row;
            ++row;
        }
    } else if (width == 1) {
        RP_SCAN_ENDS(uint8_t);
    } else if (width == 2) {
        RP_SCAN_ENDS(uint16_t);
    } else if (width == 4) {
        RP_SCAN_ENDS(uint32_t);
    } else {
        RP_SCAN_ENDS(uint64_t);
    }
    *n_out = n;
    return row;
}
#undef RP_SCAN_ENDS
