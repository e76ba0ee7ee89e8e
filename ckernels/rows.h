/* Row gathers: the rows a sample picked, copied out of each leaf of a storage in one pass.
 * Must match replay.pxd (the "rows.h" extern block).
 *
 * A sampled batch reads rows scattered over a large storage: the copy waits on memory, not
 * on arithmetic. Each leaf's rows are read in index order with the row a few steps ahead
 * prefetched, so several misses are in flight at once, and the copy of a row of 1, 2, 4, 8,
 * 16 or 32 bytes is a fixed-size move rather than a call to memcpy. */
#ifndef RP_ROWS_H
#define RP_ROWS_H

#include "rp_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* For each of the m leaves j: dst[j] row k = src[j] row index[k], for k in [0, n); rows are
 * row_bytes[j] bytes, contiguous, and every index lies in [0, rows[j]). Checks the indices
 * first: on one outside its leaf's rows, writes its position to *bad, copies nothing and
 * returns RP_ERR_INDEX. O(m * n). */
int rp_take_rows(int64_t m, const char *const *src, char *const *dst, const int64_t *row_bytes,
                 const int64_t *rows, const int64_t *index, int64_t n, int64_t *bad);

#ifdef __cplusplus
}
#endif
#endif /* RP_ROWS_H */
