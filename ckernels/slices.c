/* Trajectory slice starts and stops; see slices.h.
 *
 * The layout follows a counting sort: one pass counts the ends of every group, the caller
 * sizes the outputs, and a second sequential pass over the same rows scatters each end to
 * its group's next output row. Both passes read the signal in memory order, whatever the
 * number of groups, and skip runs of 32 zero bytes with one word test, since ends are
 * sparse in replay buffers (one per episode). */
#include "slices.h"

#include <string.h>

/* Rows forced to be ends (the cursor row and, with close_last, the last row), sorted and
 * without duplicates. Returns how many there are (0 to 2). */
static int forced_rows(int64_t length, int64_t cursor, bool close_last, int64_t rows[2]) {
    int n = 0;
    if (cursor >= 0) rows[n++] = cursor;
    if (close_last && cursor != length - 1) rows[n++] = length - 1;
    return n;
}

/* Index of the first nonzero byte of p[i..n), or n. */
static inline int64_t next_nonzero(const uint8_t *p, int64_t i, int64_t n) {
    while (i + 32 <= n) {
        uint64_t w[4];
        memcpy(w, p + i, sizeof w);
        if ((w[0] | w[1] | w[2] | w[3]) != 0) break;
        i += 32;
    }
    for (; i < n; ++i) {
        if (p[i]) return i;
    }
    return n;
}

/* Number of nonzero bytes of p[0..n). Written as a plain loop so that -O3 vectorises it. */
static int64_t count_nonzero(const uint8_t *p, int64_t n) {
    int64_t total = 0;
    int64_t i = 0;
    /* 8-bit lanes overflow after 255 steps: accumulate in blocks into a wider sum. */
    while (i < n) {
        int64_t block = n - i < 4080 ? n - i : 4080;
        uint32_t acc = 0;
        for (int64_t j = 0; j < block; ++j) acc += (uint32_t)(p[i + j] != 0);
        total += acc;
        i += block;
    }
    return total;
}

/* group_count[g] += number of nonzero bytes in column g of the row-major [rows, groups]
 * block. */
static void count_block(const uint8_t *block, int64_t rows, int64_t groups, int64_t *group_count) {
    if (groups == 1) {
        group_count[0] += count_nonzero(block, rows);
        return;
    }
    for (int64_t t = 0; t < rows; ++t) {
        const uint8_t *row = block + t * groups;
        for (int64_t g = 0; g < groups; ++g) group_count[g] += (row[g] != 0);
    }
}

int rp_slice_ends_from_ids(const int64_t *ids, int64_t length, int64_t groups, bool at_capacity,
                           uint8_t *end, int64_t *bad) {
    if (length < 1 || groups < 1) {
        *bad = length;
        return RP_ERR_VALUE;
    }
    const int64_t inner = (length - 1) * groups;
    for (int64_t i = 0; i < inner; ++i) end[i] = (uint8_t)(ids[i] != ids[i + groups]);
    for (int64_t g = 0; g < groups; ++g) {
        end[inner + g] = at_capacity ? (uint8_t)(ids[inner + g] != ids[g]) : (uint8_t)1;
    }
    return RP_OK;
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

int rp_slice_count_ends(const uint8_t *end, int64_t length, int64_t groups, int64_t cursor,
                        bool close_last, int64_t *group_count, int64_t *total, int64_t *bad) {
    int rc = check_signal(length, groups, cursor, bad);
    if (rc != RP_OK) return rc;
    int64_t rows[2];
    const int nforced = forced_rows(length, cursor, close_last, rows);
    memset(group_count, 0, (size_t)groups * sizeof *group_count);
    int64_t t = 0;
    for (int f = 0; f <= nforced; ++f) {
        const int64_t until = f < nforced ? rows[f] : length;
        count_block(end + t * groups, until - t, groups, group_count);
        if (f < nforced) {
            for (int64_t g = 0; g < groups; ++g) group_count[g] += 1;
            t = until + 1;
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

/* Scatter the stop time of every nonzero byte of the row-major [rows, groups] block (whose
 * first row is time step t0; every byte when forced) to column 0 of its group's next output
 * row. next[g] is that row, limit[g] the group's end. Returns the group that overflowed, or
 * -1. */
static int64_t scatter_block(const uint8_t *block, int64_t t0, int64_t rows, int64_t groups,
                             bool forced, int64_t ndim, int64_t *next, const int64_t *limit,
                             int64_t *stop) {
    if (forced) {
        for (int64_t g = 0; g < groups; ++g) {
            if (next[g] >= limit[g]) return g;
            stop[next[g]++ * ndim] = t0;
        }
        return -1;
    }
    const int64_t n = rows * groups;
    if (groups == 1) {
        int64_t k = next[0];
        const int64_t lim = limit[0];
        for (int64_t i = next_nonzero(block, 0, n); i < n; i = next_nonzero(block, i + 1, n)) {
            if (k >= lim) return 0;
            stop[k++ * ndim] = t0 + i;
        }
        next[0] = k;
        return -1;
    }
    for (int64_t i = next_nonzero(block, 0, n); i < n; i = next_nonzero(block, i + 1, n)) {
        const int64_t g = i % groups;
        if (next[g] >= limit[g]) return g;
        stop[next[g]++ * ndim] = t0 + i / groups;
    }
    return -1;
}

int rp_slice_starts(const uint8_t *end, int64_t length, int64_t groups, int64_t cursor,
                    bool close_last, const int64_t *group_count, int64_t ndim,
                    const int64_t *group_coord, int64_t *scratch, int64_t *start, int64_t *stop,
                    int64_t *lengths, int64_t *bad) {
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
    int64_t t = 0;
    for (int f = 0; f <= nforced; ++f) {
        const int64_t until = f < nforced ? rows[f] : length;
        int64_t over = scatter_block(end + t * groups, t, until - t, groups, false, ndim, next,
                                     limit, stop);
        if (over < 0 && f < nforced) {
            over = scatter_block(NULL, until, 1, groups, true, ndim, next, limit, stop);
            t = until + 1;
        }
        if (over >= 0) {
            *bad = over;
            return RP_ERR_VALUE;
        }
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
            const int64_t start_t = previous + 1 == length ? 0 : previous + 1;
            int64_t span = stop_t - start_t + 1;
            if (span <= 0) span += length;
            start[k * ndim] = start_t;
            lengths[k] = span;
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
        /* Floor modulo, so that negative starts wrap like torch's `%`. */
        int64_t t = first[0] % storage_length;
        if (t < 0) t += storage_length;
        int64_t *dst = out + row * ndim;
        if (ndim == 1) {
            for (int64_t i = 0; i < steps; ++i) {
                dst[i] = t;
                if (++t == storage_length) t = 0;
            }
        } else {
            for (int64_t i = 0; i < steps; ++i) {
                dst[i * ndim] = t;
                memcpy(dst + i * ndim + 1, first + 1, (size_t)(ndim - 1) * sizeof *first);
                if (++t == storage_length) t = 0;
            }
        }
        row += steps;
    }
    return RP_OK;
}
