/* Sequence windows and boundary distances: see sequences.h. Written from torchrl 0.14.1's
 * sample_units.py and replay_buffers/utils.py read as a specification. */
#include "sequences.h"

/* floor modulo, in [0, m) for m >= 1 (torch.remainder's sign convention) */
static inline int64_t floor_mod(int64_t x, int64_t m) {
    int64_t r = x % m;
    return r < 0 ? r + m : r;
}

/* The first position in [0, n) whose value is >= key, n when none: torch.searchsorted's
 * left-side binary search, probe for probe, so that an unsorted array gives its answer too. */
static inline int64_t lower_bound(const int64_t *sorted, int64_t n, int64_t key) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + ((hi - lo) >> 1);
        if (sorted[mid] >= key)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

int rp_sequence_distances(const int64_t *anchor, int64_t n, const int64_t *start,
                          const int64_t *stop, int64_t m, int64_t length, int64_t *from_start,
                          int64_t *to_stop, int64_t *bad) {
    if (m < 1 || length < 1) {
        *bad = -1;
        return RP_ERR_VALUE;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t j = lower_bound(stop, m, anchor[i]);
        if (j == m)
            j = 0; /* past the last stop: the first trajectory, which wraps */
        from_start[i] = floor_mod(anchor[i] - start[j], length);
        to_stop[i] = floor_mod(stop[j] - anchor[i], length);
    }
    return RP_OK;
}

/* torchrl's search key of an anchor of a storage with lanes: its lane (the flat index of its
 * coordinates past the first) times twice the time length, plus its time. */
static inline int64_t lane_key(const int64_t *a, int64_t ndim, const int64_t *lane_stride, int64_t length) {
    int64_t lane = 0;
    for (int64_t j = 1; j < ndim; j++)
        lane += a[j] * lane_stride[j - 1];
    return lane * 2 * length + a[0];
}

int rp_sequence_distances_nd(const int64_t *anchor, int64_t n, int64_t ndim, const int64_t *start,
                             const int64_t *stop, int64_t m, const int64_t *stop_key,
                             const int64_t *boundary_index, int64_t k, const int64_t *lane_stride,
                             int64_t length, int64_t *from_start, int64_t *to_stop, int64_t *bad) {
    if (ndim < 1 || m < 1 || length < 1) {
        *bad = -1;
        return RP_ERR_VALUE;
    }
    /* checked first, so that an error leaves the outputs as they were */
    for (int64_t i = 0; i < n; i++) {
        int64_t s = lower_bound(stop_key, k, lane_key(anchor + i * ndim, ndim, lane_stride, length));
        if (s == k || boundary_index[s] < 0 || boundary_index[s] >= m) {
            *bad = i;
            return RP_ERR_INDEX;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t *a = anchor + i * ndim;
        int64_t traj = boundary_index[lower_bound(stop_key, k, lane_key(a, ndim, lane_stride, length))];
        from_start[i] = floor_mod(a[0] - start[traj * ndim], length);
        to_stop[i] = floor_mod(stop[traj * ndim] - a[0], length);
    }
    return RP_OK;
}

/* The first k < count such that row (from + k) mod length of lane g holds an end flag, or -1.
 * A lane of a storage without lanes is contiguous: read 8 rows at a time there. O(count). */
static int64_t first_flag_forward(const uint8_t *end, int64_t length, int64_t groups, int64_t g,
                                  int64_t from, int64_t count) {
    int64_t k = 0;
    while (k < count) {
        int64_t t = from + k >= length ? from + k - length : from + k;
        int64_t run = length - t < count - k ? length - t : count - k; /* rows before a wrap */
        int64_t i = 0;
        if (groups == 1) {
            const uint8_t *row = end + t;
            for (; i + 8 <= run; i += 8) {
                uint64_t word;
                memcpy(&word, row + i, 8);
                if (word != 0)
                    break;
            }
            for (; i < run; i++)
                if (row[i])
                    return k + i;
        } else {
            /* one lane of many: a cache line per row, fetched a few rows ahead */
            const uint8_t *row = end + t * groups + g;
            for (; i < run; i++) {
                if (i + 8 < run)
                    RP_PREFETCH(row + (i + 8) * groups);
                if (row[i * groups])
                    return k + i;
            }
        }
        k += run;
    }
    return -1;
}

/* The first k < count such that row (from - k) mod length of lane g holds an end flag, or -1.
 * O(count). */
static int64_t first_flag_backward(const uint8_t *end, int64_t length, int64_t groups, int64_t g,
                                   int64_t from, int64_t count) {
    int64_t k = 0;
    while (k < count) {
        int64_t t = from - k < 0 ? from - k + length : from - k;
        int64_t run = t + 1 < count - k ? t + 1 : count - k; /* rows down to row 0 */
        int64_t i = 0;
        if (groups == 1) {
            const uint8_t *row = end + t; /* row[-i] is row t - i */
            for (; i + 8 <= run; i += 8) {
                uint64_t word;
                memcpy(&word, row - i - 7, 8);
                if (word != 0)
                    break;
            }
            for (; i < run; i++)
                if (row[-i])
                    return k + i;
        } else {
            const uint8_t *row = end + t * groups + g;
            for (; i < run; i++) {
                if (i + 8 < run)
                    RP_PREFETCH(row - (i + 8) * groups);
                if (row[-i * groups])
                    return k + i;
            }
        }
        k += run;
    }
    return -1;
}

static inline int64_t min_found(int64_t best, int64_t k) {
    return k >= 0 && k < best ? k : best;
}

int rp_sequence_windows(const uint8_t *end, int64_t length, int64_t groups, int64_t cursor,
                        bool close_last, const int64_t *anchor_time, const int64_t *anchor_group,
                        int64_t n, int64_t burn_in, int64_t seq_length, int64_t bootstrap,
                        int64_t dilation, int policy, int64_t newest, int64_t oldest,
                        int8_t *group_has_end, int64_t *index, uint8_t *validity,
                        int64_t *sequence_id, int64_t *step, uint8_t *learning, int64_t *anchor_repeat,
                        const int64_t *stops, const int64_t *stop_offsets, int64_t *bad) {
    const int64_t limit = (int64_t)1 << 62;
    *bad = -1;
    if (length < 1 || groups < 1 || seq_length < 1 || dilation < 1 || burn_in < 0 ||
        bootstrap < 0 || policy < RP_SEQUENCE_PAD || policy > RP_SEQUENCE_INCLUDE_RESET ||
        cursor < -1 || cursor >= length)
        return RP_ERR_VALUE;
    if (policy == RP_SEQUENCE_INCLUDE_RESET
            ? (newest < 0 || newest >= length || oldest < 0 || oldest >= length)
            : (end == NULL && stops == NULL))
        return RP_ERR_VALUE;
    if (burn_in > limit - seq_length || bootstrap > limit - burn_in - seq_length)
        return RP_ERR_VALUE;
    const int64_t total = burn_in + seq_length + bootstrap;
    if (total - 1 > limit / dilation)
        return RP_ERR_VALUE;
    for (int64_t g = 0; g < groups; g++) {
        group_has_end[g] = -1;
        if (stops != NULL && policy != RP_SEQUENCE_INCLUDE_RESET &&
            (stop_offsets[g] < 0 || stop_offsets[g + 1] <= stop_offsets[g]))
            return RP_ERR_VALUE; /* every lane has an end */
    }
    for (int64_t i = 0; i < n; i++) {
        if (anchor_time[i] < 0 || anchor_time[i] >= length ||
            (anchor_group != NULL && (anchor_group[i] < 0 || anchor_group[i] >= groups))) {
            *bad = i;
            return RP_ERR_INDEX;
        }
    }
    /* The furthest offsets a window reaches: a distance past them clamps nothing, so the scans
     * stop there (or after a whole turn of the lane). */
    const int64_t reach_forward = dilation * (seq_length + bootstrap - 1);
    const int64_t reach_back = dilation * burn_in;
    const int64_t cap_forward = reach_forward < length - 1 ? reach_forward : length - 1;
    const int64_t step_rows = dilation % length;
    /* the last row ends every lane when the storage is not full, and a lane without any
     * effective end otherwise: group_has_end caches whether a lane has one */
    for (int64_t i = 0; i < n; i++) {
        const int64_t a = anchor_time[i];
        const int64_t g = anchor_group != NULL ? anchor_group[i] : 0;
        int64_t to_stop, from_start, anchor = a;
        if (policy == RP_SEQUENCE_INCLUDE_RESET) {
            to_stop = floor_mod(newest - a, length);
            from_start = floor_mod(a - oldest, length);
        } else {
            if (stops != NULL) {
                /* the lane's effective ends, listed: its first at or after a, its last before a
                 * (wrapping around the lane) */
                const int64_t *lane = stops + stop_offsets[g];
                const int64_t count = stop_offsets[g + 1] - stop_offsets[g];
                const int64_t j = lower_bound(lane, count, a);
                to_stop = (j < count ? lane[j] : lane[0] + length) - a;
                from_start = a - (j > 0 ? lane[j - 1] : lane[count - 1] - length) - 1;
                if (to_stop < 0 || to_stop >= length || from_start < 0 || from_start >= length) {
                    *bad = i; /* not increasing rows of the storage: outputs partly written */
                    return RP_ERR_VALUE;
                }
                goto distances_known;
            }
            bool last_ends = close_last;
            if (!last_ends && cursor < 0) {
                if (group_has_end[g] < 0)
                    group_has_end[g] = first_flag_forward(end, length, groups, g, 0, length) >= 0;
                last_ends = group_has_end[g] == 0;
            }
            /* forward: rows a .. a + cap_forward */
            to_stop = min_found(cap_forward,
                                first_flag_forward(end, length, groups, g, a, cap_forward + 1));
            if (cursor >= 0)
                to_stop = min_found(to_stop, cursor >= a ? cursor - a : cursor - a + length);
            if (last_ends)
                to_stop = min_found(to_stop, length - 1 - a);
            /* backward: rows a - 1 .. a - 1 - cap_back, where cap_back covers the burn-in and
             * the shift RP_SEQUENCE_STOP makes (the window's start moves back with it) */
            int64_t cap_back = reach_back;
            if (policy == RP_SEQUENCE_STOP && reach_forward > to_stop)
                cap_back += reach_forward - to_stop;
            cap_back = cap_back < length - 1 ? cap_back : length - 1;
            from_start = min_found(cap_back, first_flag_backward(end, length, groups, g,
                                                                 a == 0 ? length - 1 : a - 1,
                                                                 cap_back + 1));
            if (cursor >= 0)
                from_start = min_found(from_start, cursor <= a - 1 ? a - 1 - cursor : a - 1 - cursor + length);
            if (last_ends)
                from_start = min_found(from_start, a);
        distances_known:
            if (policy == RP_SEQUENCE_STOP) {
                int64_t shift = reach_forward - to_stop;
                shift = shift < 0 ? 0 : shift;
                shift = shift > from_start ? from_start : shift;
                anchor -= shift;
                to_stop += shift;
                from_start -= shift;
            }
        }
        /* The offsets grow by dilation, so the records inside [-from_start, to_stop] are one
         * run [lo, hi]; those before it repeat the row from_start back, those after it the row
         * to_stop ahead. Rows step by dilation modulo length, without a division per record. */
        int64_t lo = burn_in - from_start / dilation, hi = burn_in + to_stop / dilation;
        lo = lo < 0 ? 0 : lo;
        hi = hi > total - 1 ? total - 1 : hi;
        int64_t *row_index = index + i * total;
        const int64_t before = floor_mod(anchor - from_start, length);
        const int64_t after = floor_mod(anchor + to_stop, length);
        int64_t s = 0;
        for (; s < lo; s++)
            row_index[s] = before;
        for (int64_t row = floor_mod(anchor + (lo - burn_in) * dilation, length); s <= hi; s++) {
            row_index[s] = row;
            row += step_rows;
            row = row >= length ? row - length : row;
        }
        for (; s < total; s++)
            row_index[s] = after;
        uint8_t *row_valid = validity + i * total;
        memset(row_valid, 0, (size_t)lo);
        memset(row_valid + lo, 1, (size_t)(hi - lo + 1));
        memset(row_valid + hi + 1, 0, (size_t)(total - hi - 1));
        if (sequence_id != NULL)
            for (int64_t r = 0; r < total; r++)
                sequence_id[i * total + r] = i;
        if (anchor_repeat != NULL)
            for (int64_t r = 0; r < total; r++)
                anchor_repeat[i * total + r] = a;
        if (step != NULL) {
            if (i == 0)
                for (int64_t r = 0; r < total; r++)
                    step[r] = r;
            else
                memcpy(step + i * total, step, (size_t)total * sizeof(int64_t));
        }
        if (learning != NULL) {
            memset(learning + i * total, 0, (size_t)burn_in);
            memset(learning + i * total + burn_in, 1, (size_t)seq_length);
            memset(learning + i * total + burn_in + seq_length, 0, (size_t)bootstrap);
        }
    }
    return RP_OK;
}

void rp_sequence_repeat_rows(const int64_t *rows, int64_t n, int64_t width, int64_t times,
                             int64_t *out) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t *row = rows + i * width;
        /* plain stores: a memcpy call per row of a few values costs more than the row */
        if (width == 1) {
            for (int64_t r = 0; r < times; r++)
                out[r] = row[0];
        } else if (width == 2) {
            for (int64_t r = 0; r < times; r++) {
                out[2 * r] = row[0];
                out[2 * r + 1] = row[1];
            }
        } else {
            for (int64_t r = 0; r < times; r++)
                for (int64_t c = 0; c < width; c++)
                    out[r * width + c] = row[c];
        }
        out += times * width;
    }
}
