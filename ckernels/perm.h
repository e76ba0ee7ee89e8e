/* Without-replacement permutations. Must match replay.pxd (the "perm.h" extern block).
 *
 * Two families:
 *   - rp_perm_randperm*: a whole uniform permutation of range(n) at once, by the
 *     Rao-Sandelius scheme (C. R. Rao, "Generation of random permutations of given number of
 *     elements using random sampling numbers", Sankhya A 23, 1961; M. Sandelius, "A simple
 *     randomization procedure", JRSS B 24, 1962): every element goes to one of K uniformly
 *     random buckets, and each bucket, small enough to stay in L1/L2, is shuffled with
 *     Fisher-Yates. The concatenation of independently shuffled buckets is uniform. Random
 *     swaps over the whole output would miss the cache on almost every step.
 *   - rp_perm_sparse_* / rp_perm_dense_*: a lazy Fisher-Yates (Durstenfeld's forward form)
 *     whose batches are drawn on demand. While few positions have been displaced they live
 *     in an open-addressing hash map (linear probing, keys are positions, -1 marks an empty
 *     slot); once the map grows, the caller materialises the remaining positions into a
 *     dense array and continues there. Each step draws j uniformly in [i, n), so every epoch
 *     is a uniform permutation whichever phase produced it.
 *
 * Random bits come from xoshiro256** (prng.h); bounded draws use Lemire's method. */
#ifndef RP_PERM_H
#define RP_PERM_H

#include "rp_common.h"
#include "prng.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest bucket-count exponent rp_perm_randperm accepts (K = 2^bits buckets). */
#define RP_PERM_MAX_BUCKET_BITS 16

/* Choose the bucket layout for rp_perm_randperm(n): *bucket_bits (0 means a single
 * in-place Fisher-Yates, used for small n and for n > INT32_MAX where the int32 scratch
 * cannot hold the values) and *bucket_capacity (slots per bucket in the scratch: the mean
 * bucket size plus a binomial tail margin, so overflow is astronomically rare; it is still
 * handled). The caller then provides counts of 2 << bits int64 and a scratch of
 * max(n, capacity << bits) int32. Precondition: n >= 0. O(1). */
void rp_perm_randperm_layout(int64_t n, int64_t *bucket_bits, int64_t *bucket_capacity);

/* Fill out[0..n) with a uniformly random permutation of 0..n-1, drawing from *st.
 * With bucket_bits = b >= 1: one pass draws a b-bit bucket for each element and writes it
 * into its bucket's slot range of `scratch` (bucket_capacity slots each); if a bucket
 * overflows, the draws are replayed from the saved state into exact, counted offsets, so the
 * result is the same either way. A second pass shuffles each bucket from scratch into `out`
 * with an inside-out Fisher-Yates. With b = 0, out is shuffled in place (no scratch used;
 * counts and scratch may be NULL).
 * Preconditions: n >= 0; 0 <= b <= RP_PERM_MAX_BUCKET_BITS; if b >= 1: n <= INT32_MAX,
 * bucket_capacity >= 0, counts_len >= 2 << b, scratch_len >= max(n, bucket_capacity << b).
 * Returns RP_OK, or RP_ERR_VALUE with *bad = the position (0-based) of the offending argument
 * among (n, bucket_bits, bucket_capacity, counts_len, scratch_len), writing nothing.
 * O(n) time: one random word per two elements for the shuffles, plus one per 64 / b elements
 * for the buckets (twice that after an overflow). */
int rp_perm_randperm(rp_prng_state *st, int64_t n, int64_t bucket_bits, int64_t bucket_capacity,
                     int64_t *counts, int64_t counts_len, int32_t *scratch, int64_t scratch_len,
                     int64_t *out, int64_t *bad);

/* rp_perm_randperm for given values: fill out[0..n) with values[0..n) in a uniformly random
 * order, with the same buckets and passes. With bucket_bits >= 1 every value must lie in
 * [0, INT32_MAX] (the buckets hold int32); otherwise RP_ERR_VALUE with *bad = 5, writing
 * nothing. With bucket_bits = 0, out is a copy of values shuffled in place. Other arguments
 * and return codes as rp_perm_randperm's. O(n). */
int rp_perm_shuffle(rp_prng_state *st, int64_t n, const int64_t *values, int64_t bucket_bits,
                    int64_t bucket_capacity, int64_t *counts, int64_t counts_len,
                    int32_t *scratch, int64_t scratch_len, int64_t *out, int64_t *bad);

/* Draw the next `batch` elements of the lazy Fisher-Yates over range(n) whose first
 * `consumed` steps are done, with displaced positions kept in the hash map (keys, vals) of
 * `capacity` slots (a power of two; empty slots have key -1). Writes out[0..batch), inserts or
 * updates at most `batch` keys and adds the number of new keys to *used.
 * Preconditions: 0 <= consumed, 0 <= batch <= n - consumed, capacity a power of two with
 * 2 * (*used + batch) <= capacity (the load factor stays <= 1/2, so probes stay short).
 * Returns RP_OK, or RP_ERR_VALUE with *bad = the position of the offending argument among
 * (n, consumed, batch, capacity, used), writing nothing. O(batch) expected. */
int rp_perm_sparse_next_batch(rp_prng_state *st, int64_t n, int64_t consumed, int64_t *keys,
                              int64_t *vals, int64_t capacity, int64_t *used, int64_t batch,
                              int64_t *out, int64_t *bad);

/* Re-insert every entry of the map (old_keys, old_vals, old_capacity) whose key is >= min_key
 * into the empty map (new_keys, new_vals, new_capacity), whose keys must all be -1, and set
 * *used to their number. Keys below min_key (positions already consumed, never read again)
 * are dropped. Preconditions: both capacities powers of two, min_key >= 0, and
 * new_capacity >= 2 * (kept entries). Returns RP_OK, or RP_ERR_VALUE with *bad = 0
 * (old_capacity), 1 (new_capacity, also when too small) or 2 (min_key), writing nothing.
 * O(old_capacity + kept) expected. */
int rp_perm_map_rehash(const int64_t *old_keys, const int64_t *old_vals, int64_t old_capacity,
                       int64_t min_key, int64_t *new_keys, int64_t *new_vals,
                       int64_t new_capacity, int64_t *used, int64_t *bad);

/* Write the current value of every position p in [consumed, n) into dense[p]: p itself, or
 * the map's value when p is a key. dense[0..consumed) is left untouched.
 * Preconditions: 0 <= consumed <= n, capacity a power of two, dense has n slots, and every
 * key is < n. Returns RP_OK, or RP_ERR_VALUE (*bad = 0 for consumed, 1 for capacity) or
 * RP_ERR_INDEX (*bad = the slot of a key >= n), writing nothing. O(n - consumed + capacity). */
int rp_perm_map_materialize(int64_t n, int64_t consumed, const int64_t *keys,
                            const int64_t *vals, int64_t capacity, int64_t *dense,
                            int64_t *bad);

/* Like rp_perm_sparse_next_batch, over the dense array of current values (dense[p] for
 * p >= consumed, as rp_perm_map_materialize leaves it). Draws the targets of a few steps
 * ahead and prefetches them, because on a large array every target is a cache miss.
 * Preconditions: 0 <= consumed, 0 <= batch <= n - consumed. Returns RP_OK, or RP_ERR_VALUE
 * with *bad = the position of the offending argument among (n, consumed, batch).
 * O(batch). */
int rp_perm_dense_next_batch(rp_prng_state *st, int64_t n, int64_t consumed, int64_t *dense,
                             int64_t batch, int64_t *out, int64_t *bad);

#ifdef __cplusplus
}
#endif
#endif /* RP_PERM_H */
