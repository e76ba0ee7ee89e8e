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

#ifdef __cplusplus
}
#endif
#endif /* RP_SLICES_H */
