/* Shared definitions for the replay kernels: return codes and the C99 guard.
 * Must match replay.pxd (the "rp_common.h" extern block). */
#ifndef RP_COMMON_H
#define RP_COMMON_H

#if !defined(__STDC_VERSION__) || __STDC_VERSION__ < 199901L
#error "the replay kernels need C99 inline semantics (compile with -std=c99 or later)"
#endif

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every kernel returns RP_OK or a negative RP_ERR_* code; on error it writes the position
 * of the offending element to its `bad` out-parameter and leaves its outputs untouched. */
enum {
    RP_OK = 0,
    RP_ERR_INDEX = -1, /* an index outside its valid range */
    RP_ERR_VALUE = -2, /* a NaN, infinite or negative value where it is not allowed */
    RP_ERR_EMPTY = -3, /* nothing to sample from (no positive mass, no element) */
    RP_ERR_TOTAL = -4  /* a write that would leave a sum tree's total infinite */
};

#if defined(__GNUC__) || defined(__clang__)
#define RP_PREFETCH(p) __builtin_prefetch((p), 0, 1)
#define RP_PREFETCH_W(p) __builtin_prefetch((p), 1, 1)
#define RP_LIKELY(x) __builtin_expect(!!(x), 1)
#define RP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define RP_PREFETCH(p) ((void)0)
#define RP_PREFETCH_W(p) ((void)0)
#define RP_LIKELY(x) (x)
#define RP_UNLIKELY(x) (x)
#endif

#ifdef __cplusplus
}
#endif
#endif /* RP_COMMON_H */
