/* Without-replacement permutations; see perm.h for the algorithms and their sources. */
#include "perm.h"

#include <math.h>
#include <string.h>

/* Mean bucket size targeted by rp_perm_randperm: a bucket (int32 source plus int64
 * destination, 12 bytes an element, 48 KiB) stays within L1/L2. Measured at n = 2^20, means
 * from 1024 to 8192 cost the same within noise; smaller ones slow the scatter (more write
 * streams), larger ones the shuffles. */
#define RP_PERM_BUCKET_TARGET 4096
/* Steps drawn ahead of their memory accesses in the lazy kernels (see the prefetch loops). */
#define RP_PERM_AHEAD 16

static inline bool rp_is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

/* Uniform integer in [0, bound) from 32 random bits x (Lemire); redraws from st on the rare
 * rejection. Precondition: 1 <= bound <= UINT32_MAX. */
static inline uint32_t rp_bounded_u32(rp_prng_state *st, uint32_t x, uint32_t bound) {
    uint64_t m = (uint64_t)x * bound;
    uint32_t low = (uint32_t)m;
    if (RP_UNLIKELY(low < bound)) {
        const uint32_t threshold = (uint32_t)(0u - bound) % bound;
        while (low < threshold) {
            m = (uint64_t)(uint32_t)rp_prng_next_u64(st) * bound;
            low = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

/* Inside-out Fisher-Yates of the m values src[0..m) into dst[0..m) (Durstenfeld; Knuth TAOCP
 * vol. 2, 3.4.2): step k puts src[k] at a uniform j in [0, k] and moves dst[j] to dst[k].
 * When j == k, dst[k] is read before it is written; the second store makes that harmless.
 * Two 32-bit draws per random word. Precondition: m <= UINT32_MAX. */
static void rp_shuffle_into(rp_prng_state *st, const int32_t *src, int64_t m, int64_t *dst) {
    if (m <= 0) return;
    dst[0] = src[0];
    int64_t k = 1;
    for (; k + 1 < m; k += 2) {
        const uint64_t w = rp_prng_next_u64(st);
        uint32_t j = rp_bounded_u32(st, (uint32_t)w, (uint32_t)(k + 1));
        dst[k] = dst[j];
        dst[j] = src[k];
        j = rp_bounded_u32(st, (uint32_t)(w >> 32), (uint32_t)(k + 2));
        dst[k + 1] = dst[j];
        dst[j] = src[k + 1];
    }
    if (k < m) {
        const uint32_t j = rp_bounded_u32(st, (uint32_t)rp_prng_next_u64(st), (uint32_t)(k + 1));
        dst[k] = dst[j];
        dst[j] = src[k];
    }
}

/* Inside-out Fisher-Yates of 0..n-1 directly in out, for any n >= 0. */
static void rp_shuffle_identity(rp_prng_state *st, int64_t n, int64_t *out) {
    if (n <= 0) return;
    out[0] = 0;
    int64_t k = 1;
    const int64_t small = n < (int64_t)UINT32_MAX ? n : (int64_t)UINT32_MAX;
    for (; k + 1 < small; k += 2) {
        const uint64_t w = rp_prng_next_u64(st);
        uint32_t j = rp_bounded_u32(st, (uint32_t)w, (uint32_t)(k + 1));
        out[k] = out[j];
        out[j] = k;
        j = rp_bounded_u32(st, (uint32_t)(w >> 32), (uint32_t)(k + 2));
        out[k + 1] = out[j];
        out[j] = k + 1;
    }
    for (; k < n; k++) { /* past 2^32 - 1 a bound needs 64 bits */
        const int64_t j = (int64_t)rp_prng_bounded_u64(st, (uint64_t)k + 1);
        out[k] = out[j];
        out[j] = k;
    }
}

void rp_perm_randperm_layout(int64_t n, int64_t *bucket_bits, int64_t *bucket_capacity) {
    int64_t bits = 0;
    if (n > 2 * RP_PERM_BUCKET_TARGET && n <= INT32_MAX) {
        while (bits < RP_PERM_MAX_BUCKET_BITS && (n >> bits) > RP_PERM_BUCKET_TARGET) bits++;
    }
    *bucket_bits = bits;
    if (bits == 0) {
        *bucket_capacity = 0;
        return;
    }
    /* Bucket sizes are Binomial(n, 2^-bits): mean mu, standard deviation below sqrt(mu).
     * Eight deviations above the mean overflow with probability under 1e-14 per bucket. */
    const int64_t mu = (n + ((int64_t)1 << bits) - 1) >> bits;
    *bucket_capacity = mu + 8 * (int64_t)sqrt((double)mu) + 64;
}

/* In-place Fisher-Yates of out[0..n) (any n >= 0), a random word per step. */
static void rp_shuffle_in_place(rp_prng_state *st, int64_t n, int64_t *out) {
    for (int64_t k = n - 1; k > 0; k--) {
        const int64_t j = (int64_t)rp_prng_bounded_u64(st, (uint64_t)k + 1);
        const int64_t v = out[k];
        out[k] = out[j];
        out[j] = v;
    }
}

/* rp_perm_randperm and rp_perm_shuffle: the bucketed shuffle of values[0..n), or of 0..n-1
 * when values is NULL. */
static int rp_bucketed_shuffle(rp_prng_state *st, int64_t n, const int64_t *values,
                               int64_t bucket_bits, int64_t bucket_capacity, int64_t *counts,
                               int64_t counts_len, int32_t *scratch, int64_t scratch_len,
                               int64_t *out, int64_t *bad);

int rp_perm_randperm(rp_prng_state *st, int64_t n, int64_t bucket_bits, int64_t bucket_capacity,
                     int64_t *counts, int64_t counts_len, int32_t *scratch, int64_t scratch_len,
                     int64_t *out, int64_t *bad) {
    return rp_bucketed_shuffle(st, n, NULL, bucket_bits, bucket_capacity, counts, counts_len,
                               scratch, scratch_len, out, bad);
}

int rp_perm_shuffle(rp_prng_state *st, int64_t n, const int64_t *values, int64_t bucket_bits,
                    int64_t bucket_capacity, int64_t *counts, int64_t counts_len,
                    int32_t *scratch, int64_t scratch_len, int64_t *out, int64_t *bad) {
    if (bucket_bits > 0) {
        /* The buckets hold int32: check the values fit before anything is written. */
        int32_t ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= (values[i] >= 0) & (values[i] <= INT32_MAX);
        if (!ok) {
            for (int64_t i = 0; i < n; i++) {
                if (values[i] < 0 || values[i] > INT32_MAX) {
                    *bad = 5;
                    return RP_ERR_VALUE;
                }
            }
        }
    }
    return rp_bucketed_shuffle(st, n, values, bucket_bits, bucket_capacity, counts, counts_len,
                               scratch, scratch_len, out, bad);
}

static int rp_bucketed_shuffle(rp_prng_state *st, int64_t n, const int64_t *values,
                               int64_t bucket_bits, int64_t bucket_capacity, int64_t *counts,
                               int64_t counts_len, int32_t *scratch, int64_t scratch_len,
                               int64_t *out, int64_t *bad) {
    if (n < 0) { *bad = 0; return RP_ERR_VALUE; }
    if (bucket_bits < 0 || bucket_bits > RP_PERM_MAX_BUCKET_BITS
        || (bucket_bits > 0 && n > INT32_MAX)) {
        *bad = 1;
        return RP_ERR_VALUE;
    }
    if (bucket_bits == 0) {
        if (values == NULL) {
            rp_shuffle_identity(st, n, out);
        } else {
            if (n > 0) memcpy(out, values, (size_t)n * sizeof *out);
            rp_shuffle_in_place(st, n, out);
        }
        return RP_OK;
    }
    const int64_t n_buckets = (int64_t)1 << bucket_bits;
    if (bucket_capacity < 0 || bucket_capacity > INT64_MAX / n_buckets) { *bad = 2; return RP_ERR_VALUE; }
    if (counts_len < 2 * n_buckets) { *bad = 3; return RP_ERR_VALUE; }
    const int64_t slots = bucket_capacity * n_buckets;
    if (scratch_len < n || scratch_len < slots) { *bad = 4; return RP_ERR_VALUE; }

    int64_t *fill = counts;             /* elements placed in bucket b so far */
    int64_t *start = counts + n_buckets; /* first scratch slot of bucket b */
    const int per_word = (int)(64 / bucket_bits);
    const uint64_t mask = (uint64_t)n_buckets - 1;
    const int shift = (int)bucket_bits;
    const rp_prng_state saved = *st;

    for (int64_t b = 0; b < n_buckets; b++) {
        fill[b] = 0;
        start[b] = b * bucket_capacity;
    }
    /* Pass 1: scatter each element into a fixed-capacity slot range of its bucket. */
    bool overflow = false;
    for (int64_t i = 0; i < n && !overflow;) {
        uint64_t w = rp_prng_next_u64(st);
        const int64_t stop = (n - i < per_word) ? n : i + per_word;
        for (; i < stop; i++) {
            const uint64_t b = w & mask;
            w >>= shift;
            const int64_t f = fill[b];
            if (RP_UNLIKELY(f == bucket_capacity)) { overflow = true; break; }
            scratch[start[b] + f] = (int32_t)(values != NULL ? values[i] : i);
            fill[b] = f + 1;
        }
    }
    if (RP_UNLIKELY(overflow)) {
        /* Replay the same bucket draws twice: count, then place at exact offsets. The
         * buckets hold the same elements in the same order, so the result is unchanged. */
        *st = saved;
        for (int64_t b = 0; b < n_buckets; b++) fill[b] = 0;
        for (int64_t i = 0; i < n;) {
            uint64_t w = rp_prng_next_u64(st);
            const int64_t stop = (n - i < per_word) ? n : i + per_word;
            for (; i < stop; i++, w >>= shift) fill[w & mask]++;
        }
        int64_t offset = 0;
        for (int64_t b = 0; b < n_buckets; b++) {
            start[b] = offset;
            offset += fill[b];
            fill[b] = 0;
        }
        *st = saved;
        for (int64_t i = 0; i < n;) {
            uint64_t w = rp_prng_next_u64(st);
            const int64_t stop = (n - i < per_word) ? n : i + per_word;
            for (; i < stop; i++, w >>= shift) {
                const uint64_t b = w & mask;
                scratch[start[b] + fill[b]++] = (int32_t)(values != NULL ? values[i] : i);
            }
        }
    }
    /* Pass 2: shuffle each bucket, now small enough for L1, into its place in out. */
    int64_t offset = 0;
    for (int64_t b = 0; b < n_buckets; b++) {
        rp_shuffle_into(st, scratch + start[b], fill[b], out + offset);
        offset += fill[b];
    }
    return RP_OK;
}

/* ---- lazy Fisher-Yates: sparse phase ------------------------------------------------------ */

static inline uint64_t rp_map_hash(int64_t key) {
    /* Fibonacci hashing, folded so that the low bits (the ones masked) depend on all of key. */
    uint64_t h = (uint64_t)key * UINT64_C(0x9E3779B97F4A7C15);
    return h ^ (h >> 32);
}

/* The slot holding key, or the empty slot where it would go. Precondition: the map has an
 * empty slot (the load factor is kept <= 1/2). */
static inline uint64_t rp_map_slot(const int64_t *keys, uint64_t mask, int64_t key) {
    uint64_t s = rp_map_hash(key) & mask;
    while (keys[s] != key && keys[s] != -1) s = (s + 1) & mask;
    return s;
}

int rp_perm_sparse_next_batch(rp_prng_state *st, int64_t n, int64_t consumed, int64_t *keys,
                              int64_t *vals, int64_t capacity, int64_t *used, int64_t batch,
                              int64_t *out, int64_t *bad) {
    if (n < 0) { *bad = 0; return RP_ERR_VALUE; }
    if (consumed < 0 || consumed > n) { *bad = 1; return RP_ERR_VALUE; }
    if (batch < 0 || batch > n - consumed) { *bad = 2; return RP_ERR_VALUE; }
    if (!rp_is_pow2(capacity)) { *bad = 3; return RP_ERR_VALUE; }
    if (*used < 0 || *used > capacity / 2 - batch) { *bad = 4; return RP_ERR_VALUE; }

    const uint64_t mask = (uint64_t)capacity - 1;
    int64_t target[RP_PERM_AHEAD];
    int64_t added = 0;
    for (int64_t t0 = 0; t0 < batch; t0 += RP_PERM_AHEAD) {
        const int64_t len = (batch - t0 < RP_PERM_AHEAD) ? batch - t0 : RP_PERM_AHEAD;
        /* The targets depend only on the random stream, not on the map: draw a few ahead and
         * prefetch their slots so their cache misses overlap. */
        for (int64_t t = 0; t < len; t++) {
            const int64_t i = consumed + t0 + t;
            target[t] = i + (int64_t)rp_prng_bounded_u64(st, (uint64_t)(n - i));
            RP_PREFETCH(&keys[rp_map_hash(target[t]) & mask]);
            RP_PREFETCH(&keys[rp_map_hash(i) & mask]);
        }
        for (int64_t t = 0; t < len; t++) {
            const int64_t i = consumed + t0 + t;
            const int64_t j = target[t];
            const uint64_t sj = rp_map_slot(keys, mask, j);
            out[t0 + t] = (keys[sj] == j) ? vals[sj] : j;
            if (j != i) {
                const uint64_t si = rp_map_slot(keys, mask, i);
                const int64_t vi = (keys[si] == i) ? vals[si] : i;
                if (keys[sj] == -1) {
                    keys[sj] = j;
                    added++;
                }
                vals[sj] = vi;
            }
        }
    }
    *used += added;
    return RP_OK;
}

int rp_perm_map_rehash(const int64_t *old_keys, const int64_t *old_vals, int64_t old_capacity,
                       int64_t min_key, int64_t *new_keys, int64_t *new_vals,
                       int64_t new_capacity, int64_t *used, int64_t *bad) {
    if (!rp_is_pow2(old_capacity)) { *bad = 0; return RP_ERR_VALUE; }
    if (min_key < 0) { *bad = 2; return RP_ERR_VALUE; }
    int64_t kept = 0;
    for (int64_t s = 0; s < old_capacity; s++) kept += (old_keys[s] >= min_key);
    if (!rp_is_pow2(new_capacity) || kept > new_capacity / 2) { *bad = 1; return RP_ERR_VALUE; }
    const uint64_t mask = (uint64_t)new_capacity - 1;
    for (int64_t s = 0; s < old_capacity; s++) {
        const int64_t key = old_keys[s];
        if (key < min_key) continue;
        const uint64_t slot = rp_map_slot(new_keys, mask, key);
        new_keys[slot] = key;
        new_vals[slot] = old_vals[s];
    }
    *used = kept;
    return RP_OK;
}

int rp_perm_map_materialize(int64_t n, int64_t consumed, const int64_t *keys,
                            const int64_t *vals, int64_t capacity, int64_t *dense,
                            int64_t *bad) {
    if (consumed < 0 || consumed > n) { *bad = 0; return RP_ERR_VALUE; }
    if (!rp_is_pow2(capacity)) { *bad = 1; return RP_ERR_VALUE; }
    for (int64_t s = 0; s < capacity; s++) {
        if (keys[s] >= n) { *bad = s; return RP_ERR_INDEX; }
    }
    for (int64_t p = consumed; p < n; p++) dense[p] = p;
    for (int64_t s = 0; s < capacity; s++) {
        if (keys[s] >= consumed) dense[keys[s]] = vals[s];
    }
    return RP_OK;
}

/* ---- lazy Fisher-Yates: dense phase ------------------------------------------------------- */

int rp_perm_dense_next_batch(rp_prng_state *st, int64_t n, int64_t consumed, int64_t *dense,
                             int64_t batch, int64_t *out, int64_t *bad) {
    if (n < 0) { *bad = 0; return RP_ERR_VALUE; }
    if (consumed < 0 || consumed > n) { *bad = 1; return RP_ERR_VALUE; }
    if (batch < 0 || batch > n - consumed) { *bad = 2; return RP_ERR_VALUE; }
    int64_t target[RP_PERM_AHEAD];
    for (int64_t t0 = 0; t0 < batch; t0 += RP_PERM_AHEAD) {
        const int64_t len = (batch - t0 < RP_PERM_AHEAD) ? batch - t0 : RP_PERM_AHEAD;
        for (int64_t t = 0; t < len; t++) {
            const int64_t i = consumed + t0 + t;
            target[t] = i + (int64_t)rp_prng_bounded_u64(st, (uint64_t)(n - i));
            RP_PREFETCH(&dense[target[t]]);
        }
        for (int64_t t = 0; t < len; t++) {
            const int64_t i = consumed + t0 + t;
            const int64_t j = target[t];
            out[t0 + t] = dense[j];
            dense[j] = dense[i];
        }
    }
    return RP_OK;
}
