/* Row gathers (see rows.h). */
#include "rows.h"

/* How many rows ahead the prefetch reads: enough to cover a miss at a few ns a row. */
#define RP_ROWS_AHEAD 8

/* One leaf's gather with rows of a fixed size B: memcpy of a constant size compiles to moves. */
#define RP_TAKE_FIXED(B)                                                                  \
    static void take_fixed_##B(const char *src, char *dst, const int64_t *index, int64_t n) { \
        for (int64_t k = 0; k < n; k++) {                                                 \
            if (k + RP_ROWS_AHEAD < n) RP_PREFETCH(src + index[k + RP_ROWS_AHEAD] * B);   \
            memcpy(dst + k * B, src + index[k] * B, B);                                   \
        }                                                                                 \
    }
RP_TAKE_FIXED(1)
RP_TAKE_FIXED(2)
RP_TAKE_FIXED(4)
RP_TAKE_FIXED(8)
RP_TAKE_FIXED(16)
RP_TAKE_FIXED(32)

static void take_any(const char *src, char *dst, int64_t b, const int64_t *index, int64_t n) {
    for (int64_t k = 0; k < n; k++) {
        const char *row = src + index[k] * b;
        if (k + RP_ROWS_AHEAD < n) {
            const char *ahead = src + index[k + RP_ROWS_AHEAD] * b;
            /* every cache line of the row ahead (64-byte lines) */
            for (int64_t at = 0; at < b; at += 64) RP_PREFETCH(ahead + at);
        }
        memcpy(dst + k * b, row, (size_t)b);
    }
}

int rp_take_rows(int64_t m, const char *const *src, char *const *dst, const int64_t *row_bytes,
                 const int64_t *rows, const int64_t *index, int64_t n, int64_t *bad) {
    int64_t limit = INT64_MAX;
    for (int64_t j = 0; j < m; j++)
        if (rows[j] < limit) limit = rows[j];
    for (int64_t k = 0; k < n; k++) {
        if (RP_UNLIKELY(index[k] < 0 || index[k] >= limit)) {
            *bad = k;
            return RP_ERR_INDEX;
        }
    }
    for (int64_t j = 0; j < m; j++) {
        const char *s = src[j];
        char *d = dst[j];
        switch (row_bytes[j]) {
        case 0: break;
        case 1: take_fixed_1(s, d, index, n); break;
        case 2: take_fixed_2(s, d, index, n); break;
        case 4: take_fixed_4(s, d, index, n); break;
        case 8: take_fixed_8(s, d, index, n); break;
        case 16: take_fixed_16(s, d, index, n); break;
        case 32: take_fixed_32(s, d, index, n); break;
        default: take_any(s, d, row_bytes[j], index, n);
        }
    }
    return RP_OK;
}
