/* xoshiro256** seeding and bulk fills; see prng.h for the algorithm's origin. */
#include "prng.h"

void rp_prng_seed(rp_prng_state *st, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) st->s[i] = rp_splitmix64_next(&x);
    /* SplitMix64 is a bijection of a counter, so four outputs are never all zero. */
}

void rp_prng_fill_double(rp_prng_state *st, int64_t n, double *out) {
    for (int64_t i = 0; i < n; i++) out[i] = rp_prng_next_double(st);
}
