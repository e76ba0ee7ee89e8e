/* xoshiro256** pseudo-random generator, seeded through SplitMix64.
 * Must match replay.pxd (the "prng.h" extern block).
 *
 * xoshiro256** 1.0 and SplitMix64 by David Blackman and Sebastiano Vigna (2018), public
 * domain (CC0), https://prng.di.unimi.it/ ; written here from the published algorithm.
 * Bounded integers use Daniel Lemire's nearly-divisionless method ("Fast Random Integer
 * Generation in an Interval", ACM TOMACS 2019), as numpy's bounded_lemire_uint64 does. */
#ifndef RP_PRNG_H
#define RP_PRNG_H

#include "rp_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t s[4];
} rp_prng_state;

/* SplitMix64 step: advances *x and returns the next output. */
static inline uint64_t rp_splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static inline uint64_t rp_rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* Next 64 random bits. O(1). */
static inline uint64_t rp_prng_next_u64(rp_prng_state *st) {
    uint64_t *s = st->s;
    const uint64_t result = rp_rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rp_rotl64(s[3], 45);
    return result;
}

/* Uniform double in [0, 1) with 53 random bits. O(1). */
static inline double rp_prng_next_double(rp_prng_state *st) {
    return (double)(rp_prng_next_u64(st) >> 11) * (1.0 / 9007199254740992.0);
}

/* The 128-bit product x * y as its high and low 64 bits (*low). O(1). GCC and clang have a
 * 128-bit type; the fallback (MSVC, -DRP_PORTABLE) adds the four 32-bit partial products,
 * giving the same bits, so every build draws the same numbers from the same seed. */
static inline uint64_t rp_mul_u64_high(uint64_t x, uint64_t y, uint64_t *low) {
#if RP_GNU_EXTENSIONS && defined(__SIZEOF_INT128__)
    const __uint128_t m = (__uint128_t)x * y;
    *low = (uint64_t)m;
    return (uint64_t)(m >> 64);
#else
    const uint64_t x_lo = x & 0xFFFFFFFFu, x_hi = x >> 32;
    const uint64_t y_lo = y & 0xFFFFFFFFu, y_hi = y >> 32;
    const uint64_t lo_lo = x_lo * y_lo, hi_lo = x_hi * y_lo;
    const uint64_t lo_hi = x_lo * y_hi, hi_hi = x_hi * y_hi;
    /* at most (2^32 - 1)^2 + 2 (2^32 - 1) = 2^64 - 1: the middle column cannot overflow */
    const uint64_t middle = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFu) + lo_hi;
    *low = (middle << 32) | (lo_lo & 0xFFFFFFFFu);
    return hi_hi + (hi_lo >> 32) + (middle >> 32);
#endif
}

/* Uniform integer in [0, bound) without modulo bias (Lemire). Precondition: bound >= 1. */
static inline uint64_t rp_prng_bounded_u64(rp_prng_state *st, uint64_t bound) {
    uint64_t low;
    uint64_t high = rp_mul_u64_high(rp_prng_next_u64(st), bound, &low);
    if (RP_UNLIKELY(low < bound)) {
        const uint64_t threshold = (0 - bound) % bound;
        while (low < threshold) high = rp_mul_u64_high(rp_prng_next_u64(st), bound, &low);
    }
    return high;
}

/* Seed the state from 64 bits by expanding them with SplitMix64 (never all-zero). O(1). */
void rp_prng_seed(rp_prng_state *st, uint64_t seed);

/* Fill out[0..n) with uniform doubles in [0, 1). O(n). */
void rp_prng_fill_double(rp_prng_state *st, int64_t n, double *out);

#ifdef __cplusplus
}
#endif
#endif /* RP_PRNG_H */
