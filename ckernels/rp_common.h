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

/* RP_GNU_EXTENSIONS (1 or 0): the kernels may use GCC's (and clang's) extensions: vector types
 * and lane shuffles (segtree.c), prefetch and branch hints (below), ctz (slices.c) and 128-bit
 * products (prng.h). Each has a plain C99 fallback, which MSVC, the compiler of Windows wheels,
 * builds. -DRP_PORTABLE forces every fallback on any compiler (setup.py: REPLAY_PORTABLE=1), so
 * that the code MSVC builds is tested: make test's debug build sets it (replay.pxd exposes the
 * value to the tests). */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(RP_PORTABLE)
#define RP_GNU_EXTENSIONS 1
#else
#define RP_GNU_EXTENSIONS 0
#endif

#if RP_GNU_EXTENSIONS
#define RP_PREFETCH(p) __builtin_prefetch((p), 0, 1)
#define RP_PREFETCH_W(p) __builtin_prefetch((p), 1, 1)
#define RP_LIKELY(x) __builtin_expect(!!(x), 1)
#define RP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
/* (void)(p): the address still counts as used, as without it -Wextra says it is not */
#define RP_PREFETCH(p) ((void)(p))
#define RP_PREFETCH_W(p) ((void)(p))
#define RP_LIKELY(x) (x)
#define RP_UNLIKELY(x) (x)
#endif

#ifdef __cplusplus
}
#endif
#endif /* RP_COMMON_H */
