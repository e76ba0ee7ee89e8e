/* Trajectory slice starts and stops. Must match replay.pxd (the "slices.h" extern block).
 *
 * The end-of-trajectory signal is a row-major [length, groups] array of bytes (0 = not an end,
 * anything else = an end): row t is time step t of the storage and each group (column) is one
 * independent trajectory stream (a batch element of an N-D storage, flattened in the order the
 * caller wants results listed). For every group, the result lists one trajectory per end, in
 * time order: it stops at the end, starts one step after the previous end of the same group,
 * and the first trajectory of a group starts one step after the group's last end, wrapping
 * from the end of the storage to its beginning.
 *
 * Two calls compute it: rp_slice_count_ends sizes the outputs, rp_slice_starts fills them.
 * Inputs are const and never aliased by outputs.
 * The effective end signal both use is
 *     end[t, g] != 0  or  t == cursor  or  (close_last and t == length - 1),
 * and a group with no effective end at all ends at its last row (length - 1).
 */
#ifndef RP_SLICES_H
#define RP_SLICES_H

#include "rp_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* End-of-trajectory signal from trajectory ids: end[t, g] = ids[t, g] != ids[t + 1, g] for
 * t < length - 1, and for the last row ids[length - 1, g] != ids[0, g] when at_capacity (a
 * trajectory may run on from the last row to the first), 1 otherwise. ids and end are
 * row-major [length, groups]. Precondition: length >= 1, groups >= 1. Returns RP_OK, or
 * RP_ERR_VALUE (writing nothing, *bad = length) when length or groups is < 1.
 * O(length * groups). */
int rp_slice_ends_from_ids(const int64_t *ids, int64_t length, int64_t groups, bool at_capacity,
                           uint8_t *end, int64_t *bad);

/* Bytes of the signal summarised by one entry of block_count. */
#define RP_SLICE_BLOCK 64

/* Entries of the block_count scratch for a [length, groups] signal: ceil(length * groups /
 * RP_SLICE_BLOCK), 0 when the signal is empty. O(1). */
int64_t rp_slice_block_count_size(int64_t length, int64_t groups);

/* Count the trajectories of each group of the effective end signal (see the top of this
 * file): group_count[g] >= 1 for every g, and *total is their sum. cursor is a row in
 * [0, length) forced to be an end in every group, or -1 for none. block_count
 * (rp_slice_block_count_size entries) receives the number of nonzero bytes of each
 * RP_SLICE_BLOCK-byte block of end, for rp_slice_starts. Returns RP_OK, or RP_ERR_VALUE
 * (length or groups < 1, *bad = length) / RP_ERR_INDEX (cursor outside [-1, length),
 * *bad = cursor) writing nothing. O(length * groups): one vectorised pass over end, then
 * only the blocks that hold an end. */
int rp_slice_count_ends(const uint8_t *end, int64_t length, int64_t groups, int64_t cursor,
                        bool close_last, uint8_t *block_count, int64_t *group_count,
                        int64_t *total, int64_t *bad);

/* Fill the trajectories counted by rp_slice_count_ends (same end, length, groups, cursor and
 * close_last; block_count and group_count are its outputs). Row k of the [total, ndim]
 * row-major outputs start and stop is (t, coord...) where t is the time step and coord the
 * ndim - 1 coordinates of the trajectory's group: group_coord[g * (ndim - 1) ...] when
 * group_coord is not NULL, else g itself (allowed only when ndim == 2; with ndim == 1 there
 * is no coordinate and groups must be 1). lengths[k] = stop_t - start_t + 1, plus length
 * when that is <= 0 (a trajectory that wraps). Rows are grouped by g in increasing order,
 * then by time. scratch holds 2 * groups int64_t. Returns RP_OK; RP_ERR_VALUE with *bad =
 * the group when end changed since it was counted (outputs are then partly written, never
 * past their size) or *bad = ndim for a bad ndim; RP_ERR_INDEX as rp_slice_count_ends.
 * O(groups + total * ndim + 64 * blocks holding an end). */
int rp_slice_starts(const uint8_t *end, int64_t length, int64_t groups, int64_t cursor,
                    bool close_last, const uint8_t *block_count, const int64_t *group_count,
                    int64_t ndim, const int64_t *group_coord, int64_t *scratch, int64_t *start,
                    int64_t *stop, int64_t *lengths, int64_t *bad);

/* Expand slices into storage indices: for slice k (k < n) of seq_length[k] steps (the same
 * seq_length[0] for every slice when uniform is true) starting at row k of the row-major
 * [n, ndim] array start, write the rows start[k] + (i, 0, ..., 0) for i < seq_length[k] to
 * out, in order, with the first column taken modulo storage_length (into
 * [0, storage_length)). out holds sum(seq_length) (or n * seq_length[0]) rows of ndim.
 * Returns RP_OK; RP_ERR_VALUE with *bad = the slice when a length is negative, *bad = -1
 * when storage_length < 1 or ndim < 1; nothing written on error. O(n + rows * ndim). */
int rp_slice_indices(const int64_t *start, int64_t n, int64_t ndim, const int64_t *seq_length,
                     bool uniform, int64_t storage_length, int64_t *out, int64_t *bad);

/* Span codes of rp_slice_sample_index: no span, a whole-slice span (torchrl's `True`), or
 * a positive int i (at least seq_length - i steps kept). */
#define RP_SPAN_NONE 0
#define RP_SPAN_ALL (-1)

/* The slices of a slice sampler from its random draws (the index step of torchrl's
 * SliceSampler._get_index). Slice k (k < n) lies in trajectory traj[k] of the m
 * trajectories whose first rows are the row-major [m, ndim] start and whose lengths are
 * lengths[m]. With S its requested length (seq_length[k], or seq_length[0] for every slice
 * when uniform_length) and L its trajectory's length, its first step relative to the
 * trajectory's start is
 *     r = floor(u[k] * (hi - lo)) + lo, then r = min(r, max(hi - 1, lo)),
 * computed as torch computes rand() * int64 tensor: the product in the precision of the
 * draws (uniform_f32, else uniform_f64; exactly one is not NULL), the difference converted
 * to it first. hi = L - S + 1 (span_right = RP_SPAN_NONE), L + 1 (RP_SPAN_ALL) or
 * L - span_right; lo = 0 (span_left = RP_SPAN_NONE), 1 - S (RP_SPAN_ALL) or -span_left.
 * With a left span a negative r shortens the slice to S + r and starts it at 0; with a right
 * span a slice running past L is cut to L - r steps. Its rows start[traj[k]] + (r + i, 0, ...)
 * (first column modulo storage_length, into [0, storage_length)) are written to out, one
 * slice after the other, and truncated[c - 1] = 1 for every slice's cumulative row count c
 * (torch's negative index: the last row when c is 0), every other truncated byte 0.
 * out and truncated hold sum(S) rows (slices only ever shrink); *rows receives how many
 * were written. Returns RP_OK; RP_ERR_INDEX with *bad = k when traj[k] is outside [0, m);
 * RP_ERR_VALUE with *bad = k for a negative seq_length, *bad = -1 when storage_length < 1,
 * ndim < 1 or both / neither draw arrays are given; RP_ERR_EMPTY when no row is left to
 * mark (every slice empty). Nothing is written when traj or seq_length fails its check;
 * RP_ERR_VALUE with *bad = k when a left span leaves slice k a negative length (outputs
 * then partly written). O(n + rows * ndim). */
int rp_slice_sample_index(const int64_t *start, const int64_t *lengths, int64_t m, int64_t ndim,
                          const int64_t *traj, const float *uniform_f32,
                          const double *uniform_f64, int64_t n, const int64_t *seq_length,
                          bool uniform_length, int64_t span_left, int64_t span_right,
                          int64_t storage_length, int64_t *out, uint8_t *truncated,
                          int64_t *rows, int64_t *bad);

/* Merge re-read rows into a sorted list of end rows: ends[0..n_ends) is strictly increasing;
 * rows[0..n_rows) is strictly increasing and flags[k] != 0 when rows[k] is an end now, 0 when
 * it is not. out (room for n_ends + n_rows) receives the updated strictly increasing ends and
 * *n_out their count; *changed is set to 1 when they differ from ends, else 0 (out then need
 * not be used). Returns RP_OK, or RP_ERR_VALUE with *n_out = k when rows is not strictly increasing
 * at k (nothing meaningful written). O(n_ends + n_rows). */
int rp_slice_patch_ends(const int64_t *ends, int64_t n_ends, const int64_t *rows,
                        const uint8_t *flags, int64_t n_rows, int64_t *out, int64_t *n_out,
                        int *changed);

/* Forced rows rp_slice_bounds_from_ends takes at most. */
#define RP_SLICE_MAX_FORCED 8

/* Trajectories of a 1-D signal of `length` rows whose ends are the sorted rows ends[0..n_ends)
 * that are < limit, plus the rows forced[0..n_forced) (each in [0, length), any order, -1
 * entries skipped; duplicates of ends allowed). As rp_slice_starts computes them for one group:
 * stop[k] are the effective ends in increasing order; start[k] is one past the previous end,
 * the first one past the last end (wrapping to 0); lengths[k] = stop - start + 1, plus length
 * when <= 0; no effective end at all gives one trajectory ending at length - 1. The outputs
 * hold n_ends + n_forced + 1 entries; *n_out receives how many were written. Returns RP_OK, or
 * RP_ERR_VALUE (*n_out = -1) for length < 1, more than RP_SLICE_MAX_FORCED forced rows or a
 * forced row outside [-1, length).
 * O(n_ends + n_forced^2). */
int rp_slice_bounds_from_ends(const int64_t *ends, int64_t n_ends, int64_t limit, int64_t length,
                              const int64_t *forced, int64_t n_forced, int64_t *start,
                              int64_t *stop, int64_t *lengths, int64_t *n_out);

/* Replace the ends within rows [lo, hi) of the strictly increasing ends[0..n_ends) by the rows
 * lo + j (j < hi - lo) with flags[j] != 0: the end signal read again over one run of rows (a
 * round-robin write). out (room for n_ends + hi - lo) receives the updated strictly increasing
 * ends and *n_out their count; *changed is set to 1 when they differ from ends, else 0 (out then
 * need not be used). Returns RP_OK, or RP_ERR_VALUE (nothing written, *n_out = -1) when
 * lo < 0 or hi < lo. O(log n_ends + (hi - lo)), plus O(n_ends) copied when changed. */
int rp_slice_patch_ends_run(const int64_t *ends, int64_t n_ends, int64_t lo, int64_t hi,
                            const uint8_t *flags, int64_t *out, int64_t *n_out, int *changed);

/* The trajectories rp_slice_bounds_from_ends would list, read without listing them. Both
 * functions below take its (ends, n_ends, limit, length, forced, n_forced) arguments and
 * return RP_ERR_VALUE (*bad = -1, nothing written) where it does. */

/* How many trajectories rp_slice_bounds_from_ends lists (*count) and the length of the
 * shortest (*shortest). O(n_ends + n_forced^2). */
int rp_slice_bounds_summary(const int64_t *ends, int64_t n_ends, int64_t limit, int64_t length,
                            const int64_t *forced, int64_t n_forced, int64_t *count,
                            int64_t *shortest, int64_t *bad);

/* The positions k (in increasing order) of the trajectories rp_slice_bounds_from_ends lists
 * whose length is below min_length: what a slice sampler with strict_length leaves out. Writes
 * the first `room` of them to out and their number to *n_out (past room: call again with more).
 * Returns RP_OK, or RP_ERR_VALUE as above. O(n_ends + n_forced^2). */
int rp_slice_short_trajectories(const int64_t *ends, int64_t n_ends, int64_t limit, int64_t length,
                                const int64_t *forced, int64_t n_forced, int64_t min_length,
                                int64_t *out, int64_t room, int64_t *n_out, int64_t *bad);

/* The first row start[k] and the length lengths[k] of trajectory traj[k] of those
 * rp_slice_bounds_from_ends lists (its start[traj[k]] and lengths[traj[k]]), for k < n.
 * Returns RP_OK; RP_ERR_INDEX with *bad = k (nothing written) when traj[k] is outside
 * [0, count); RP_ERR_VALUE as above. O(n_forced^2 + log n_ends + n * n_forced). */
int rp_slice_bounds_at(const int64_t *ends, int64_t n_ends, int64_t limit, int64_t length,
                       const int64_t *forced, int64_t n_forced, const int64_t *traj, int64_t n,
                       int64_t *start, int64_t *lengths, int64_t *bad);

/* Gather one byte flag per row: out[i] = flags[rows[i]] != 0 for i < n, where flags holds
 * `length` rows of one byte (a bool column). Returns RP_OK, or RP_ERR_INDEX with *bad = i when
 * rows[i] is outside [0, length) (nothing written). O(n). */
int rp_slice_gather_flags(const uint8_t *flags, int64_t length, const int64_t *rows, int64_t n,
                          uint8_t *out, int64_t *bad);

/* The positions that cannot start a slice (PrioritizedSliceSampler's excluded starts), in
 * increasing order. Trajectories of lengths[0..m) lie end to end from position `offset` of a
 * circular range of `total` positions; trajectory k excludes its last min(tail, L_k) positions,
 * or its last min(tail, L_k - 1) when keep_first (its first position may still start a short
 * slice). Positions at or past `total` wrap to the front. Writes the n excluded positions to
 * out[0..n) and n to *n_out. Returns RP_OK; RP_ERR_VALUE with *n_out = -1 (nothing written)
 * when tail < 0, total < 1, offset is outside [0, total), a length is negative or the lengths
 * sum past total, or *n_out = -2 when out_len < n. O(m + n). */
int rp_slice_excluded_starts(const int64_t *lengths, int64_t m, int64_t tail, bool keep_first,
                             int64_t offset, int64_t total, int64_t *out, int64_t out_len,
                             int64_t *n_out);

/* The rows of a 1-D signal that end a trajectory, read in one pass with no copy: the signal
 * holds `length` elements of `width` bytes (1, 2, 4 or 8) `stride` bytes apart, compared under
 * `mask` (every bit for integers and bools; every bit but the sign for floats, so that -0.0 is
 * zero and NaN is not, as numpy's nonzero reads them). Without from_ids an end is a row whose
 * element is nonzero; with from_ids (trajectory ids, integers) a row t < length - 1 whose id
 * differs from row t + 1's. Scans from row `from`, writes the ends found in increasing order to
 * out[0..room), their count to *n_out, and returns the row where it stopped: the scan's end
 * (length, or length - 1 with from_ids) or, when out filled, the first row not examined (call
 * again from there; a `from` at or past the scan's end is returned as it is). Each element is read once: a signal written meanwhile by another thread or
 * process gives a mix of old and new rows, never an error. Returns -1 (nothing written,
 * *n_out = 0) for a width other than 1, 2, 4 or 8 or a negative from or room. O(rows scanned). */
int64_t rp_slice_scan_ends(const void *signal, int64_t length, int64_t stride, int width,
                           uint64_t mask, bool from_ids, int64_t from, int64_t *out, int64_t room,
                           int64_t *n_out);

#ifdef __cplusplus
}
#endif
#endif /* RP_SLICES_H */
