/* Sequence windows around sampled anchors, and the boundary distances they are made of (torchrl
 * 0.14's sample units). Must match replay.pxd (the "sequences.h" extern block).
 *
 * A storage's time axis is circular: row t's neighbours are t - 1 and t + 1 modulo `length`.
 * The effective end signal is that of slices.h,
 *     end[t, g] != 0  or  t == cursor  or  (close_last and t == length - 1),
 * over a row-major [length, groups] byte array (one column per lane), and a lane with no
 * effective end at all ends at its last row. For an anchor at row a of lane g:
 *     to_stop    = the least k >= 0 such that row (a + k) mod length ends a trajectory,
 *     from_start = the least k >= 0 such that row (a - k - 1) mod length does,
 * which is what torchrl's searchsorted over the sorted stops gives (the trajectory holding a
 * runs from a - from_start to a + to_stop, wrapping).
 */
#ifndef RP_SEQUENCES_H
#define RP_SEQUENCES_H

#include "rp_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Boundary policies of rp_sequence_windows (torchrl's episode_boundary). */
enum {
    RP_SEQUENCE_PAD = 0,          /* clamp the window at its trajectory's ends */
    RP_SEQUENCE_STOP = 1,         /* shift it back so that it ends at its trajectory's stop */
    RP_SEQUENCE_INCLUDE_RESET = 2 /* cross trajectory ends; clamp at the oldest and newest rows */
};

/* Distances of anchors to the bounds of the trajectories listed by (start, stop), as torchrl
 * 0.14's _boundary_distances_1d: for anchor[i], j = the first position with stop[j] >=
 * anchor[i] (binary search, as torch.searchsorted; stop sorted for a meaningful answer), taken
 * modulo m; from_start[i] = (anchor[i] - start[j]) mod length and to_stop[i] = (stop[j] -
 * anchor[i]) mod length, floor modulo (in [0, length)). Returns RP_OK, or RP_ERR_VALUE
 * (nothing written, *bad = -1) when m < 1 or length < 1. O(n log m). */
int rp_sequence_distances(const int64_t *anchor, int64_t n, const int64_t *start,
                          const int64_t *stop, int64_t m, int64_t length, int64_t *from_start,
                          int64_t *to_stop, int64_t *bad);

/* The lane-aware form, as torchrl 0.14's _boundary_distances_nd: anchor is [n, ndim]
 * row-major (time first), start and stop are [m, ndim] row-major, stop_key[0..k) sorted keys
 * and boundary_index[0..k) the trajectory of each key, lane_stride[0..ndim - 1) the lane
 * strides. For anchor i: lane = sum_j anchor[i, 1 + j] * lane_stride[j], key = lane * 2 * length
 * + anchor[i, 0], s = the first position with stop_key[s] >= key, j = boundary_index[s]; the
 * distances are those of rp_sequence_distances on the time column. Returns RP_OK; RP_ERR_VALUE
 * (*bad = -1) when ndim < 1, m < 1 or length < 1; RP_ERR_INDEX with *bad = i when s == k or j
 * is outside [0, m) (nothing written either way). O(n (ndim + log k)). */
int rp_sequence_distances_nd(const int64_t *anchor, int64_t n, int64_t ndim, const int64_t *start,
                             const int64_t *stop, int64_t m, const int64_t *stop_key,
                             const int64_t *boundary_index, int64_t k, const int64_t *lane_stride,
                             int64_t length, int64_t *from_start, int64_t *to_stop, int64_t *bad);

/* The windows torchrl 0.14's Sequence sample unit expands anchors into. Anchor i sits at row
 * anchor_time[i] of lane anchor_group[i] (lane 0 for every anchor when anchor_group is NULL);
 * its window has total = burn_in + seq_length + bootstrap records, record s at offset
 * o = (s - burn_in) * dilation from the anchor. With RP_SEQUENCE_PAD, o is clamped into
 * [-from_start, to_stop] (see the top of this file); RP_SEQUENCE_STOP first moves the anchor
 * back by min(max(dilation * (seq_length + bootstrap - 1) - to_stop, 0), from_start);
 * RP_SEQUENCE_INCLUDE_RESET ignores end (may be NULL) and clamps into
 * [-((a - oldest) mod length), (newest - a) mod length]. Writes, for record s of anchor i at
 * r = i * total + s: index[r] = (anchor + clamped offset) mod length, validity[r] = whether o
 * was inside the range; and, each when not NULL, sequence_id[r] = i, step[r] = s, learning[r] =
 * burn_in <= s < burn_in + seq_length, anchor_repeat[r] = anchor_time[i] (before any shift).
 * When stops is not NULL, the effective ends of lane g are not read from end (which may then
 * be NULL) but listed:
 * stops[stop_offsets[g] .. stop_offsets[g + 1]), increasing rows, at least one a lane
 * (stop_offsets holds groups + 1 entries); the distances then cost O(log ends) an anchor,
 * and RP_ERR_VALUE with *bad = i (outputs partly written) says that anchor i's lane lists rows
 * that are not increasing rows of the storage. group_has_end holds `groups` bytes of scratch (used
 * when cursor < 0 and !close_last). Only the rows within
 * dilation * (total - 1) of an anchor are read. Returns RP_OK; RP_ERR_INDEX with *bad = i
 * (nothing written) when anchor_time[i] is outside [0, length) or anchor_group[i] outside
 * [0, groups); RP_ERR_VALUE (*bad = -1) for length, groups, seq_length or dilation < 1, a
 * negative burn_in or bootstrap, an unknown policy, a cursor outside [-1, length), newest or
 * oldest outside [0, length), or offsets past 2^62. O(n * (total + min(dilation * total,
 * length))) (O(n * (total + log ends)) with stops), plus O(length) per lane without an
 * effective end at its last row. */
int rp_sequence_windows(const uint8_t *end, int64_t length, int64_t groups, int64_t cursor,
                        bool close_last, const int64_t *anchor_time, const int64_t *anchor_group,
                        int64_t n, int64_t burn_in, int64_t seq_length, int64_t bootstrap,
                        int64_t dilation, int policy, int64_t newest, int64_t oldest,
                        int8_t *group_has_end, int64_t *index, uint8_t *validity,
                        int64_t *sequence_id, int64_t *step, uint8_t *learning, int64_t *anchor_repeat,
                        const int64_t *stops, const int64_t *stop_offsets, int64_t *bad);

/* Repeat each row of a row-major [n, width] array `times` times: out[(i * times + r) * width + c]
 * = rows[i * width + c] (the records' anchor coordinates, as repeat_interleave along dim 0).
 * out holds n * times * width entries. O(n * times * width). */
void rp_sequence_repeat_rows(const int64_t *rows, int64_t n, int64_t width, int64_t times,
                             int64_t *out);

#ifdef __cplusplus
}
#endif
#endif /* RP_SEQUENCES_H */
