/* Body of the segment-tree kernels, written once for both scalar types: segtree.c includes
 * this file twice, with SCALAR (float / double), SUFFIX (f32 / f64) and SCALAR_MAX defined.
 * See segtree.h for the layout and the contract of each function. */

#define RP_CAT_(a, b) a##_##b
#define RP_CAT(a, b) RP_CAT_(a, b)
#define FN(name) RP_CAT(name, SUFFIX)

/* Scalars per cache line: a node of 16 spans 1 (fp32) or 2 (fp64) lines. */
#define NODE_LINES ((int)((RP_SEGTREE_FANOUT * sizeof(SCALAR) + 63) / 64))

static inline void FN(prefetch_node)(const SCALAR *node) {
    RP_PREFETCH(node);
    if (NODE_LINES > 1) RP_PREFETCH(node + RP_SEGTREE_FANOUT / 2);
}

/* The binary sums inside one node of 16 entries e, as torchrl's binary heap holds them above
 * those entries, each in SCALAR: h[8 + p] = e[2p] + e[2p + 1] (the pairs), then h[k] = h[2k] +
 * h[2k + 1] for k = 7 .. 1 (quads at 4..7, octets at 2..3, the node's total at 1); h[0] = 0.
 * A heap of its own: the children of h[k] are h[2k] and h[2k + 1], those of a pair h[8 + p] the
 * entries e[2p] and e[2p + 1] (heap positions 16 + 2p and 17 + 2p). The entry of level t holds
 * the binary node 4t levels above the leaves, and h[1] = ((e0 + e1) + (e2 + e3)) + ... is how
 * torchrl sums those 16 nodes into the one 4 levels up: the same additions, so the same bits.
 * IEEE addition is commutative, so torchrl's `right + left` at odd children changes nothing. */
static inline void FN(node_heap)(const SCALAR *e, SCALAR *h) {
    for (int p = 0; p < 8; p++) h[8 + p] = e[2 * p] + e[2 * p + 1];
    for (int k = 7; k >= 1; k--) h[k] = h[2 * k] + h[2 * k + 1];
    h[0] = 0;
}

/* The total of one node, h[1] of node_heap: what every parent entry holds. */
static inline SCALAR FN(node_sum)(const SCALAR *e) {
    SCALAR p[8];
    for (int k = 0; k < 8; k++) p[k] = e[2 * k] + e[2 * k + 1];
    const SCALAR q0 = p[0] + p[1], q1 = p[2] + p[3], q2 = p[4] + p[5], q3 = p[6] + p[7];
    return (q0 + q1) + (q2 + q3);
}

/* The sum of the 2^s entries e[0, 2^s) (s <= 4, e aligned to 2^s within its node), paired as
 * node_heap pairs them: the binary node s levels above those entries. */
static inline SCALAR FN(block_sum)(const SCALAR *e, int s) {
    SCALAR b[8];
    if (s == 0) return e[0];
    int n = 1 << (s - 1);
    for (int i = 0; i < n; i++) b[i] = e[2 * i] + e[2 * i + 1];
    for (; n > 1; n >>= 1)
        for (int i = 0; i < n / 2; i++) b[i] = b[2 * i] + b[2 * i + 1];
    return b[0];
}

/* Recompute the stored mini-heap of node j of level t (t >= 1, a level that keeps them). */
static inline void FN(store_heap)(const rp_segtree_layout *layout, SCALAR *tree, int64_t t, int64_t j) {
    FN(node_heap)(tree + layout->offset[t] + RP_SEGTREE_FANOUT * j,
                  tree + layout->prefix[t] + RP_SEGTREE_FANOUT * j);
}

/* torchrl's binary node at height h (0: the leaves) and position m (its leaves are
 * [m 2^h, (m + 1) 2^h)), read from this layout: an entry of level h / 4 when 4 divides h, else
 * a mini-heap entry of a node of level h / 4 (stored, or summed from the node's entries). A node
 * past the stored ones holds only padding: 0. O(1); O(8) where summed. */
static inline SCALAR FN(binary_node)(const rp_segtree_layout *layout, const SCALAR *tree, int64_t h,
                                     int64_t m) {
    int64_t t = h >> 2;
    int s = (int)(h & 3);
    if (s == 0) {
        if (t <= layout->top) return m < layout->length[t] ? tree[layout->offset[t] + m] : (SCALAR)0;
        t -= 1; /* the total of a node of the root level */
        s = 4;
    }
    if (t > layout->top) return (SCALAR)0; /* above the root node: never read (see root_value) */
    const int64_t first = m << s; /* its first entry of level t */
    if (first >= layout->length[t]) return (SCALAR)0;
    if (layout->prefix[t] >= 0)
        return tree[layout->prefix[t] + first + (RP_SEGTREE_FANOUT >> s) - (first & 15)
                    + ((first & 15) >> s)];
    return FN(block_sum)(tree + layout->offset[t] + first, s);
}

/* torchrl's root, values[1]: the binary node at height log2(capacity). Where torchrl's root lies
 * above the root node's total (size a power of 16), it is that total plus zeros. O(1). */
static inline SCALAR FN(root_value)(const rp_segtree_layout *layout, const SCALAR *tree) {
    const int64_t top_height = 4 * (layout->top + 1);
    if (layout->height <= top_height) return FN(binary_node)(layout, tree, layout->height, 0);
    return FN(binary_node)(layout, tree, top_height, 0) + (SCALAR)0;
}

static inline SCALAR FN(node_min)(const SCALAR *e) {
    SCALAR m = e[0];
    for (int j = 1; j < RP_SEGTREE_FANOUT; j++) m = e[j] < m ? e[j] : m;
    return m;
}

static inline SCALAR FN(node_reduce)(const SCALAR *e, bool is_min) {
    return is_min ? FN(node_min)(e) : FN(node_sum)(e);
}

/* torchrl's root as a double (the total sampling and the overflow checks read). */
static inline double FN(root_total)(const rp_segtree_layout *layout, const SCALAR *tree) {
    return (double)FN(root_value)(layout, tree);
}

int FN(rp_segtree_get)(const rp_segtree_layout *layout, const SCALAR *tree, const int64_t *index,
                       int64_t n, SCALAR *out, int64_t *bad) {
    const int64_t size = layout->size;
    for (int64_t k = 0; k < n; k++) {
        const int64_t i = index[k];
        if (RP_UNLIKELY(i < 0 || i >= size)) {
            *bad = k;
            return RP_ERR_INDEX;
        }
        out[k] = tree[i];
    }
    return RP_OK;
}

/* How many indices ahead a walk up the tree prefetches the nodes it will read: enough misses in
 * flight to cover a memory access (a tree of 2^30 leaves misses every cache at its two lowest
 * levels). */
#ifndef RP_WALK_AHEAD
#define RP_WALK_AHEAD 32
#endif
#ifndef RP_WALK_UPFRONT
#define RP_WALK_UPFRONT 512
#endif
#define RP_WALK_LARGE_LEVEL (1 << 16)

/* Recompute the parents of the leaves index[0..n) level by level. A level whose node count
 * is small next to the batch is recomputed whole, which visits each parent once, in index
 * order; otherwise each touched parent is recomputed (once per run of equal parents). */
static void FN(refresh)(const rp_segtree_layout *layout, SCALAR *tree, const int64_t *index,
                        int64_t n, bool is_min) {
    for (int64_t t = 1; t <= layout->top; t++) {
        const SCALAR *lo = tree + layout->offset[t - 1];
        SCALAR *hi = tree + layout->offset[t];
        /* (at level 1, the nodes of leaves in memory: past them nothing was written) */
        const int64_t nodes = (t == 1 ? layout->ready : layout->length[t - 1]) / RP_SEGTREE_FANOUT;
        const bool with_prefix = layout->prefix[t] >= 0;
        if (n * 4 >= nodes) {
            for (int64_t j = 0; j < nodes; j++) hi[j] = FN(node_reduce)(lo + RP_SEGTREE_FANOUT * j, is_min);
            if (with_prefix)
                for (int64_t j = 0; j < layout->length[t] / RP_SEGTREE_FANOUT; j++) FN(store_heap)(layout, tree, t, j);
            continue;
        }
        const int shift = (int)(4 * t);
        int64_t prev = -1;
        for (int64_t k = 0; k < n; k++) {
            if (k + RP_WALK_AHEAD < n) {
                const int64_t ahead = index[k + RP_WALK_AHEAD] >> shift;
                FN(prefetch_node)(lo + RP_SEGTREE_FANOUT * ahead);
                RP_PREFETCH_W(hi + ahead);
            }
            const int64_t j = index[k] >> shift;
            if (j != prev) {
                hi[j] = FN(node_reduce)(lo + RP_SEGTREE_FANOUT * j, is_min);
                prev = j;
            }
        }
        if (!with_prefix) continue;
        /* A second pass, so that no prefix reads an entry stored a few instructions earlier
         * (a store-forwarding stall per node when fused with the pass above). */
        prev = -1;
        SCALAR *heaps = tree + layout->prefix[t];
        for (int64_t k = 0; k < n; k++) {
            if (k + RP_WALK_AHEAD < n) RP_PREFETCH_W(heaps + RP_SEGTREE_FANOUT * (index[k + RP_WALK_AHEAD] >> (shift + 4)));
            const int64_t j = index[k] >> (shift + 4);
            if (j != prev) {
                FN(store_heap)(layout, tree, t, j);
                prev = j;
            }
        }
    }
}

static void FN(build)(const rp_segtree_layout *layout, SCALAR *tree, bool is_min) {
    for (int64_t t = 1; t <= layout->top; t++) {
        const SCALAR *lo = tree + layout->offset[t - 1];
        SCALAR *hi = tree + layout->offset[t];
        const int64_t nodes = layout->length[t - 1] / RP_SEGTREE_FANOUT;
        for (int64_t j = 0; j < nodes; j++) hi[j] = FN(node_reduce)(lo + RP_SEGTREE_FANOUT * j, is_min);
        if (layout->prefix[t] >= 0)
            for (int64_t j = 0; j < layout->length[t] / RP_SEGTREE_FANOUT; j++) FN(store_heap)(layout, tree, t, j);
    }
}

void FN(rp_sumtree_build)(const rp_segtree_layout *layout, SCALAR *tree) { FN(build)(layout, tree, false); }
void FN(rp_mintree_build)(const rp_segtree_layout *layout, SCALAR *tree) { FN(build)(layout, tree, true); }

/* Chunk size of the validation passes: each chunk is checked without branches (so the loop
 * vectorises), and only a chunk that holds a bad element is scanned again to find it. */
#define RP_CHECK_CHUNK 256

static inline int FN(bad_value)(SCALAR v, bool is_min) {
    /* A sum tree takes finite non-negative values: both comparisons are false for NaN.
     * Bitwise operators keep the test branch-free. */
    return is_min ? v != v : !((v >= 0) & (v <= SCALAR_MAX));
}

/* The position of the first bad value in value[0..n), or n; *above is set when a value
 * exceeds `limit` (found in the same branch-free pass: one more compare per value). O(n). */
static int64_t FN(first_bad_value_above)(const SCALAR *value, int64_t n, bool is_min,
                                         SCALAR limit, bool *above) {
    int big = 0;
    for (int64_t k0 = 0; k0 < n; k0 += RP_CHECK_CHUNK) {
        const int64_t k1 = k0 + RP_CHECK_CHUNK < n ? k0 + RP_CHECK_CHUNK : n;
        int flag = 0;
        for (int64_t k = k0; k < k1; k++) {
            flag |= FN(bad_value)(value[k], is_min);
            big |= value[k] > limit;
        }
        if (RP_UNLIKELY(flag))
            for (int64_t k = k0; k < k1; k++)
                if (FN(bad_value)(value[k], is_min)) return k;
    }
    *above = big != 0;
    return n;
}

static int64_t FN(first_bad_value)(const SCALAR *value, int64_t n, bool is_min) {
    bool above;
    return FN(first_bad_value_above)(value, n, is_min, SCALAR_MAX, &above);
}

/* The position of the first index outside [0, size) in index[0..n), or n. O(n). */
/* *run is set to whether index[k] == index[0] + k for every k (consecutive leaves, which then
 * need no scatter), found in the same pass. */
static int64_t FN(first_bad_index)(const int64_t *index, int64_t n, int64_t size, bool *run) {
    const int64_t first = n > 0 ? index[0] : 0;
    uint64_t shifted = 0; /* nonzero once some index[k] != index[0] + k */
    for (int64_t k0 = 0; k0 < n; k0 += RP_CHECK_CHUNK) {
        const int64_t k1 = k0 + RP_CHECK_CHUNK < n ? k0 + RP_CHECK_CHUNK : n;
        int flag = 0;
        /* One unsigned comparison covers both ends: a negative index wraps past size. */
        for (int64_t k = k0; k < k1; k++) {
            flag |= (uint64_t)index[k] >= (uint64_t)size;
            shifted |= (uint64_t)index[k] ^ ((uint64_t)first + (uint64_t)k);
        }
        if (RP_UNLIKELY(flag))
            for (int64_t k = k0; k < k1; k++)
                if ((uint64_t)index[k] >= (uint64_t)size) return k;
    }
    *run = shifted == 0;
    return n;
}

int FN(rp_sumtree_check)(const SCALAR *value, int64_t n, int64_t *bad) {
    *bad = FN(first_bad_value)(value, n, false);
    return *bad < n ? RP_ERR_VALUE : RP_OK;
}

int FN(rp_mintree_check)(const SCALAR *value, int64_t n, int64_t *bad) {
    *bad = FN(first_bad_value)(value, n, true);
    return *bad < n ? RP_ERR_VALUE : RP_OK;
}

/* Recompute the parents of the leaves [first, last] (first <= last), each once, at the levels
 * from `from` up: at level t the entries first >> 4t .. last >> 4t, and the mini-heaps of the
 * nodes holding them. O((last - first) / 16^from + 16 log16 size). */
static void FN(refresh_range_from)(const rp_segtree_layout *layout, SCALAR *tree, int64_t first,
                                   int64_t last, bool is_min, int64_t from) {
    for (int64_t t = from; t <= layout->top; t++) {
        const SCALAR *lo = tree + layout->offset[t - 1];
        SCALAR *hi = tree + layout->offset[t];
        const int shift = (int)(4 * t);
        const int64_t a = first >> shift, b = last >> shift;
        for (int64_t j = a; j <= b; j++) hi[j] = FN(node_reduce)(lo + RP_SEGTREE_FANOUT * j, is_min);
        if (layout->prefix[t] >= 0)
            for (int64_t j = a >> 4; j <= (b >> 4); j++) FN(store_heap)(layout, tree, t, j);
    }
}

/* Write value[0..n) to the consecutive leaves first .. first + n - 1 (a block of priorities, a
 * dense rewrite): copied node by node, each node reduced into level 1 while its leaves are in
 * L1 (one pass over the leaves), then every parent above refreshed once. The parents are a
 * pure function of the leaves, so the tree is bit for bit the one a leaf-by-leaf walk gives.
 * O(n + 16 log16 size). */
static void FN(write_run)(const rp_segtree_layout *layout, SCALAR *tree, int64_t first,
                          const SCALAR *value, int64_t n, bool is_min) {
    const int64_t last = first + n - 1;
    SCALAR *parents = layout->top >= 1 ? tree + layout->offset[1] : NULL;
    for (int64_t j = first / RP_SEGTREE_FANOUT; j <= last / RP_SEGTREE_FANOUT; j++) {
        SCALAR *node = tree + RP_SEGTREE_FANOUT * j;
        const int64_t lo = RP_SEGTREE_FANOUT * j > first ? RP_SEGTREE_FANOUT * j : first;
        const int64_t hi = RP_SEGTREE_FANOUT * (j + 1) <= last ? RP_SEGTREE_FANOUT * (j + 1) : last + 1;
        memcpy(tree + lo, value + (lo - first), (size_t)(hi - lo) * sizeof *tree);
        if (parents != NULL) parents[j] = FN(node_reduce)(node, is_min);
    }
    if (layout->top >= 1 && layout->prefix[1] >= 0)
        for (int64_t j = first >> 8; j <= (last >> 8); j++) FN(store_heap)(layout, tree, 1, j);
    FN(refresh_range_from)(layout, tree, first, last, is_min, 2);
}

/* Write the checked batch: leaves, then their parents. `run`: index[k] == index[0] + k. */
static void FN(write_batch)(const rp_segtree_layout *layout, SCALAR *tree, const int64_t *index,
                            const SCALAR *value, int64_t value_stride, int64_t n, bool run,
                            bool is_min) {
    if (run && value_stride == 1) {
        FN(write_run)(layout, tree, index[0], value, n, is_min);
        return;
    }
    if (n * 16 < layout->size) { /* a sparse batch: bring its leaves in before the writes */
        for (int64_t k = 0; k < n; k++) RP_PREFETCH_W(tree + index[k]);
#if RP_WALK_UPFRONT
        /* and, for a batch small enough to stay in cache, the parents of every level that does
         * not fit in cache: all the walk's misses in flight at once */
        if (n <= RP_WALK_UPFRONT)
            for (int64_t t = 1; t <= layout->top && layout->length[t] >= RP_WALK_LARGE_LEVEL; t++) {
                SCALAR *hi = tree + layout->offset[t];
                SCALAR *heaps = layout->prefix[t] >= 0 ? tree + layout->prefix[t] : NULL;
                const int shift = (int)(4 * t);
                for (int64_t k = 0; k < n; k++) {
                    RP_PREFETCH_W(hi + (index[k] >> shift));
                    if (heaps != NULL) RP_PREFETCH_W(heaps + RP_SEGTREE_FANOUT * (index[k] >> (shift + 4)));
                }
            }
#endif
    }
    for (int64_t k = 0; k < n; k++) tree[index[k]] = value[k * value_stride];
    FN(refresh)(layout, tree, index, n, is_min);
}

/* Whether a sum tree's total, as sampling reads it, is finite. Every entry of the tree is at
 * most its root's (non-negative sums, rounded monotonically), so this covers them all. */
static inline bool FN(total_is_finite)(const rp_segtree_layout *layout, const SCALAR *tree) {
    return FN(root_total)(layout, tree) <= (double)SCALAR_MAX;
}

/* The largest value a batch of n values may hold and surely leave a sum tree's total finite:
 * the current total plus n of them stays below half the dtype's largest value (far above any
 * rounding of the sums). Negative when the total is already that high. */
static inline SCALAR FN(safe_value_limit)(const rp_segtree_layout *layout, const SCALAR *tree, int64_t n) {
    const double room = (0.5 * (double)SCALAR_MAX - FN(root_total)(layout, tree)) / (double)(n > 0 ? n : 1);
    return room < 0 ? (SCALAR)-1 : (SCALAR)(room < (double)SCALAR_MAX ? room : (double)SCALAR_MAX);
}

static int FN(update)(const rp_segtree_layout *layout, SCALAR *tree, const int64_t *index,
                      const SCALAR *value, int64_t value_stride, int64_t n, SCALAR *saved,
                      int64_t *bad, bool is_min) {
    const int64_t size = layout->size;
    /* Check everything before writing anything; the first bad position wins, an index error
     * before a value error at the same position. A sum tree's values are also compared with
     * the limit that surely keeps its total finite, in the same pass. */
    const SCALAR limit = is_min ? SCALAR_MAX : FN(safe_value_limit)(layout, tree, n);
    bool run = false, above = false;
    const int64_t bad_index = FN(first_bad_index)(index, n, size, &run);
    int64_t bad_value = n;
    if (value_stride == 0) {
        if (FN(bad_value)(value[0], is_min)) bad_value = 0;
        above = value[0] > limit;
    } else {
        bad_value = FN(first_bad_value_above)(value, bad_index, is_min, limit, &above);
    }
    if (RP_UNLIKELY(bad_index < n || bad_value < n)) {
        const bool index_first = bad_index <= bad_value;
        *bad = index_first ? bad_index : bad_value;
        return index_first ? RP_ERR_INDEX : RP_ERR_VALUE;
    }
    if (is_min || RP_LIKELY(!above)) {
        FN(write_batch)(layout, tree, index, value, value_stride, n, run, is_min);
        return RP_OK;
    }
    /* Near the dtype's limit: write, look at the total, and put the old leaves back if it
     * overflowed (in reverse, so a repeated index gets its first saved value, the original). */
    for (int64_t k = 0; k < n; k++) saved[k] = tree[index[k]];
    FN(write_batch)(layout, tree, index, value, value_stride, n, run, false);
    if (FN(total_is_finite)(layout, tree)) return RP_OK;
    for (int64_t k = n - 1; k >= 0; k--) tree[index[k]] = saved[k];
    FN(refresh)(layout, tree, index, n, false);
    *bad = -1;
    return RP_ERR_TOTAL;
}

int FN(rp_sumtree_update)(const rp_segtree_layout *layout, SCALAR *tree, const int64_t *index,
                          const SCALAR *value, int64_t value_stride, int64_t n, SCALAR *saved,
                          int64_t *bad) {
    return FN(update)(layout, tree, index, value, value_stride, n, saved, bad, false);
}

int FN(rp_mintree_update)(const rp_segtree_layout *layout, SCALAR *tree, const int64_t *index,
                          const SCALAR *value, int64_t value_stride, int64_t n, int64_t *bad) {
    return FN(update)(layout, tree, index, value, value_stride, n, NULL, bad, true);
}

/* Leaves, then parents, of every non-empty range. */
static void FN(write_ranges)(const rp_segtree_layout *layout, SCALAR *tree, const int64_t *bounds,
                             int64_t n_ranges, SCALAR value, bool is_min) {
    for (int64_t r = 0; r < n_ranges; r++) {
        const int64_t start = bounds[2 * r], stop = bounds[2 * r + 1];
        if (start == stop) continue;
        for (int64_t i = start; i < stop; i++) tree[i] = value;
        FN(refresh_range_from)(layout, tree, start, stop - 1, is_min, 1);
    }
}

static int FN(fill_ranges)(const rp_segtree_layout *layout, SCALAR *tree, const int64_t *bounds,
                           int64_t n_ranges, SCALAR value, SCALAR *saved, int64_t saved_len,
                           int64_t *bad, bool is_min) {
    int64_t total = 0;
    for (int64_t r = 0; r < n_ranges; r++) {
        const int64_t start = bounds[2 * r], stop = bounds[2 * r + 1];
        if (RP_UNLIKELY(start < 0 || start > stop || stop > layout->size)) {
            *bad = r;
            return RP_ERR_INDEX;
        }
        total += stop - start;
    }
    if (RP_UNLIKELY(FN(bad_value)(value, is_min))) {
        *bad = 0;
        return RP_ERR_VALUE;
    }
    if (is_min || RP_LIKELY(value <= FN(safe_value_limit)(layout, tree, total))) {
        FN(write_ranges)(layout, tree, bounds, n_ranges, value, is_min);
        return RP_OK;
    }
    /* Near the dtype's limit: save every old leaf before anything is written (so overlapping
     * ranges save originals), write, and put them back if the total overflowed. */
    if (saved_len < total) {
        *bad = -1;
        return RP_ERR_VALUE;
    }
    int64_t k = 0;
    for (int64_t r = 0; r < n_ranges; r++)
        for (int64_t i = bounds[2 * r]; i < bounds[2 * r + 1]; i++) saved[k++] = tree[i];
    FN(write_ranges)(layout, tree, bounds, n_ranges, value, false);
    if (FN(total_is_finite)(layout, tree)) return RP_OK;
    k = 0;
    for (int64_t r = 0; r < n_ranges; r++)
        for (int64_t i = bounds[2 * r]; i < bounds[2 * r + 1]; i++) tree[i] = saved[k++];
    for (int64_t r = 0; r < n_ranges; r++)
        if (bounds[2 * r] < bounds[2 * r + 1])
            FN(refresh_range_from)(layout, tree, bounds[2 * r], bounds[2 * r + 1] - 1, false, 1);
    *bad = -1;
    return RP_ERR_TOTAL;
}

int FN(rp_sumtree_fill_ranges)(const rp_segtree_layout *layout, SCALAR *tree, const int64_t *bounds,
                               int64_t n_ranges, SCALAR value, SCALAR *saved, int64_t saved_len,
                               int64_t *bad) {
    return FN(fill_ranges)(layout, tree, bounds, n_ranges, value, saved, saved_len, bad, false);
}

int FN(rp_mintree_fill_ranges)(const rp_segtree_layout *layout, SCALAR *tree, const int64_t *bounds,
                               int64_t n_ranges, SCALAR value, int64_t *bad) {
    return FN(fill_ranges)(layout, tree, bounds, n_ranges, value, NULL, 0, bad, true);
}

/* Sum of lvl[a..b) in double, four running sums (a chain of dependent additions was most of a
 * range query: 15 entries a level on each side). */
static inline double FN(range_sum)(const SCALAR *lvl, int64_t a, int64_t b) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int64_t j = a;
    for (; j + 4 <= b; j += 4) {
        s0 += (double)lvl[j];
        s1 += (double)lvl[j + 1];
        s2 += (double)lvl[j + 2];
        s3 += (double)lvl[j + 3];
    }
    for (; j < b; j++) s0 += (double)lvl[j];
    return (s0 + s1) + (s2 + s3);
}

/* Reduction of entries [a, b) of level t (a < b, both in one node or at the root). */
static inline double FN(range_reduce)(const SCALAR *lvl, int64_t a, int64_t b, bool is_min) {
    if (!is_min) return FN(range_sum)(lvl, a, b);
    double acc = (double)SCALAR_MAX;
    for (int64_t j = a; j < b; j++) {
        const double x = (double)lvl[j];
        acc = x < acc ? x : acc;
    }
    return acc;
}

/* torchrl's Query(l, r) of a sum tree, in SCALAR: with l, r clamped to [0, capacity], 0 when
 * l >= r, the root when l <= 0 and r >= size, else the bottom-up loop over the binary heap's
 * indices (l + capacity, r + capacity, one level up per round, adding the node at l when l is
 * odd, then the one before r when r is odd), each binary node read from this layout. The same
 * additions in the same order: the same bits. (torchrl forms the indices with `|`, the same
 * below capacity; at r == capacity its loop adds nothing, where this sums up to the capacity.)
 * O(log2 capacity), 16 additions at most per node read from a level without stored mini-heaps. */
static SCALAR FN(sum_query)(const rp_segtree_layout *layout, const SCALAR *tree, int64_t l, int64_t r) {
    const int64_t capacity = layout->capacity;
    if (l < 0) l = 0;
    if (r > capacity) r = capacity;
    if (l >= r) return (SCALAR)0;
    if (l == 0 && r >= layout->size) return FN(root_value)(layout, tree);
    SCALAR acc = 0;
    int64_t a = l + capacity, b = r + capacity;
    for (int64_t h = 0; a < b; h++, a >>= 1, b >>= 1) {
        const int64_t base = capacity >> h; /* the heap index of position 0 at height h */
        if (a & 1) acc = acc + FN(binary_node)(layout, tree, h, (a++) - base);
        if (b & 1) acc = acc + FN(binary_node)(layout, tree, h, (--b) - base);
    }
    return acc;
}

static double FN(query)(const rp_segtree_layout *layout, const SCALAR *tree, int64_t l, int64_t r,
                        bool is_min) {
    if (!is_min) return (double)FN(sum_query)(layout, tree, l, r);
    const int64_t size = layout->size;
    if (l < 0) l = 0;
    if (r > size) r = size;
    double acc = is_min ? (double)SCALAR_MAX : 0.0;
    if (l >= r) return acc;
    if (l == 0 && r == size) return (double)FN(node_min)(tree + layout->offset[layout->top]);
    /* Climb from both ends, reducing the partial nodes at each level. */
    int64_t a = l, b = r;
    for (int64_t t = 0; a < b; t++) {
        const SCALAR *lvl = tree + layout->offset[t];
        double part;
        if (t == layout->top || (a >> 4) == ((b - 1) >> 4)) {
            part = FN(range_reduce)(lvl, a, b, is_min);
            acc = is_min ? (part < acc ? part : acc) : acc + part;
            break;
        }
        if (a & 15) {
            part = FN(range_reduce)(lvl, a, (a | 15) + 1, is_min);
            acc = is_min ? (part < acc ? part : acc) : acc + part;
            a = (a >> 4) + 1;
        } else {
            a >>= 4;
        }
        if (b & 15) {
            part = FN(range_reduce)(lvl, b & ~(int64_t)15, b, is_min);
            acc = is_min ? (part < acc ? part : acc) : acc + part;
        }
        b >>= 4;
    }
    return acc;
}

double FN(rp_sumtree_query)(const rp_segtree_layout *layout, const SCALAR *tree, int64_t l, int64_t r) {
    return FN(query)(layout, tree, l, r, false);
}

double FN(rp_mintree_query)(const rp_segtree_layout *layout, const SCALAR *tree, int64_t l, int64_t r) {
    return FN(query)(layout, tree, l, r, true);
}

void FN(rp_sumtree_query_batch)(const rp_segtree_layout *layout, const SCALAR *tree, const int64_t *l,
                                const int64_t *r, int64_t n, double *out) {
    for (int64_t k = 0; k < n; k++) out[k] = FN(query)(layout, tree, l[k], r[k], false);
}

void FN(rp_mintree_query_batch)(const rp_segtree_layout *layout, const SCALAR *tree, const int64_t *l,
                                const int64_t *r, int64_t n, double *out) {
    for (int64_t k = 0; k < n; k++) out[k] = FN(query)(layout, tree, l[k], r[k], true);
}

/* One binary step of torchrl's ScanLowerBound: whether the remainder *c exceeds the left
 * child `left` (then go right, with `left` subtracted: in SCALAR, as torchrl does). Without a
 * branch: half the steps of a random mass go right, and a mispredicted branch per step made the
 * descent three times slower. c - 0 is c, so subtracting a masked `left` is exact. */
#if defined(RP_SEGTREE_VECTOR)
typedef RP_SEGTREE_VECTOR FN(rp_lane);
static inline int FN(step)(SCALAR left, FN(rp_lane) *c) {
    /* lane 0 holds the remainder, the other lanes 0 (never right: 0 > 0 is false) */
    const FN(rp_lane) l = {left};
    const RP_SEGTREE_MASK right = *c > l;
    *c -= (FN(rp_lane))((RP_SEGTREE_MASK)l & right);
    return (int)-right[0];
}
#define RP_LANE_LOAD(x) ((FN(rp_lane)){(x)})
#define RP_LANE_VALUE(v) ((v)[0])
#else
typedef SCALAR FN(rp_lane);
static inline int FN(step)(SCALAR left, FN(rp_lane) *c) {
    const int right = *c > left;
    *c = right ? *c - left : *c;
    return right;
}
#define RP_LANE_LOAD(x) (x)
#define RP_LANE_VALUE(v) (v)
#endif

/* The binary steps of torchrl's ScanLowerBound through one node: from position k0 of the
 * node's mini-heap h (1: its total; 2, 4, 8 for a root that starts lower), `steps` times: go to
 * the left child; when the remaining value *cur exceeds it, subtract it and go to the right
 * child instead. The last step reads the entries e. Returns the entry (0..15) reached.
 * O(steps). */
static inline int FN(node_steps)(const SCALAR *h, const SCALAR *e, int k, int steps, SCALAR *cur) {
    FN(rp_lane) c = RP_LANE_LOAD(*cur);
    if (steps == 4) { /* every level but the root's: unrolled */
        k = 2 + FN(step)(h[2], &c);
        k = 2 * k + FN(step)(h[2 * k], &c);
        k = 2 * k + FN(step)(h[2 * k], &c);
    } else {
        for (int i = 1; i < steps; i++) {
            k <<= 1;
            k |= FN(step)(h[k], &c);
        }
    }
    k = 2 * k - RP_SEGTREE_FANOUT;
    k += FN(step)(e[k], &c);
    *cur = RP_LANE_VALUE(c);
    return k;
}

/* torchrl's ScanLowerBound of g <= RP_DESCENT_GROUP values v[q] in (0, root], interleaved level
 * by level so that the cache misses of one descent overlap the arithmetic of the others. Each
 * descent starts at torchrl's root (the mini-heap entry of the root node at height
 * log2(capacity), or the node's total when that lies higher: the zero-padded levels above it
 * would always send it left) and takes 4 binary steps per level, reading the stored mini-heaps
 * or summing them from the node's entries (levels below RP_SEGTREE_PREFIX_FROM). A descent sent
 * into a padding entry (no node stored below it, all zeros) goes right down to the entry's last
 * leaf, as torchrl's does with a positive remainder: leaf[q] may lie past `size` (below
 * torchrl's capacity), and may hold 0. O(g * (4 + 16) log16 size). */
#ifndef RP_DESCENT_GROUP
#define RP_DESCENT_GROUP 32
#endif
static void FN(descend)(const rp_segtree_layout *layout, const SCALAR *tree, const SCALAR *v, int64_t g,
                        int64_t *leaf) {
    int64_t node[RP_DESCENT_GROUP];
    SCALAR cur[RP_DESCENT_GROUP];
    const int64_t top = layout->top;
    if (layout->height == 0) { /* one leaf, which is the root */
        for (int64_t q = 0; q < g; q++) leaf[q] = 0;
        return;
    }
    const int64_t over = layout->height - 4 * top;
    const int top_steps = over < 4 ? (int)over : 4;
    for (int64_t q = 0; q < g; q++) {
        node[q] = 0;
        cur[q] = v[q];
    }
    for (int64_t t = top; t >= 0; t--) {
        const SCALAR *lvl = tree + layout->offset[t];
        const SCALAR *heap = layout->prefix[t] >= 0 ? tree + layout->prefix[t] : NULL;
        const int steps = t == top ? top_steps : 4;
        const int k0 = RP_SEGTREE_FANOUT >> steps;
        /* the nodes stored at level t - 1: entries at or past it are padding */
        const int64_t below_nodes = t > 0 ? layout->length[t - 1] / RP_SEGTREE_FANOUT : 0;
        const SCALAR *below = t == 0 ? NULL : tree + layout->offset[t - 1];
        const SCALAR *below_heap = t > 0 && layout->prefix[t - 1] >= 0 ? tree + layout->prefix[t - 1] : NULL;
        for (int64_t q = 0; q < g; q++) {
            if (RP_UNLIKELY(node[q] < 0)) continue; /* settled in padding */
            const SCALAR *e = lvl + RP_SEGTREE_FANOUT * node[q];
            int child;
            if (heap != NULL) {
                child = FN(node_steps)(heap + RP_SEGTREE_FANOUT * node[q], e, k0, steps, &cur[q]);
            } else {
                SCALAR h[RP_SEGTREE_FANOUT];
                FN(node_heap)(e, h);
                child = FN(node_steps)(h, e, k0, steps, &cur[q]);
            }
            const int64_t j = RP_SEGTREE_FANOUT * node[q] + child;
            if (t == 0) {
                node[q] = j;
            } else if (RP_UNLIKELY(j >= below_nodes)) {
                leaf[q] = ((j + 1) << (4 * t)) - 1;
                node[q] = -1;
            } else {
                node[q] = j;
                FN(prefetch_node)(below + RP_SEGTREE_FANOUT * j);
                if (below_heap != NULL) FN(prefetch_node)(below_heap + RP_SEGTREE_FANOUT * j);
            }
        }
    }
    for (int64_t q = 0; q < g; q++)
        if (node[q] >= 0) leaf[q] = node[q];
}

/* torchrl's ScanLowerBound of each x[k] (k < n, none NaN) against the root value `root`: `size`
 * past the root, 0 at or below 0 (every step then goes left), else the descent. O(n log). */
static void FN(scan_values)(const rp_segtree_layout *layout, const SCALAR *tree, SCALAR root,
                            const SCALAR *x, int64_t n, int64_t *out) {
    SCALAR v[RP_DESCENT_GROUP];
    int64_t pos[RP_DESCENT_GROUP], leaf[RP_DESCENT_GROUP];
    for (int64_t k0 = 0; k0 < n; k0 += RP_DESCENT_GROUP) {
        const int64_t k1 = k0 + RP_DESCENT_GROUP < n ? k0 + RP_DESCENT_GROUP : n;
        int64_t g = 0;
        for (int64_t k = k0; k < k1; k++) {
            const SCALAR value = x[k];
            if (value > root) {
                out[k] = layout->size;
            } else if (!(value > 0)) {
                out[k] = 0;
            } else {
                v[g] = value;
                pos[g++] = k;
            }
        }
        FN(descend)(layout, tree, v, g, leaf);
        for (int64_t q = 0; q < g; q++) out[pos[q]] = leaf[q];
    }
}

int FN(rp_sumtree_scan_lower_bound)(const rp_segtree_layout *layout, const SCALAR *tree,
                                    const SCALAR *value, int64_t n, int64_t *out, int64_t *bad) {
    for (int64_t k = 0; k < n; k++) {
        if (RP_UNLIKELY(isnan(value[k]))) {
            *bad = k;
            return RP_ERR_VALUE;
        }
    }
    FN(scan_values)(layout, tree, FN(root_value)(layout, tree), value, n, out);
    return RP_OK;
}

/* The last leaf <= i with a positive value, or -1; climbs to the first level with a positive
 * entry on the left, then descends its right-most positive path. O(16 log16 size). */
static int64_t FN(last_positive_at_or_before)(const rp_segtree_layout *layout, const SCALAR *tree,
                                               int64_t i) {
    for (int64_t j = i; j >= (i & ~(int64_t)15); j--)
        if (tree[j] > 0) return j;
    int64_t p = i >> 4;
    for (int64_t t = 1; t <= layout->top; t++, p >>= 4) {
        const SCALAR *lvl = tree + layout->offset[t];
        for (int64_t j = p - 1; j >= (p & ~(int64_t)15); j--) {
            if (!(lvl[j] > 0)) continue;
            for (int64_t s = t - 1; s >= 0; s--) {
                const SCALAR *e = tree + layout->offset[s] + RP_SEGTREE_FANOUT * j;
                int c = RP_SEGTREE_FANOUT - 1;
                while (c > 0 && !(e[c] > 0)) c--;
                j = RP_SEGTREE_FANOUT * j + c;
            }
            return j;
        }
    }
    return -1;
}

/* The first leaf in [i, limit) with a positive value, or -1. O(16 log16 size). */
static int64_t FN(first_positive_at_or_after)(const rp_segtree_layout *layout, const SCALAR *tree,
                                               int64_t i, int64_t limit) {
    for (int64_t j = i; j <= (i | 15); j++)
        if (tree[j] > 0) return j < limit ? j : -1;
    int64_t p = i >> 4;
    for (int64_t t = 1; t <= layout->top; t++, p >>= 4) {
        const SCALAR *lvl = tree + layout->offset[t];
        for (int64_t j = p + 1; j <= (p | 15); j++) {
            if (!(lvl[j] > 0)) continue;
            for (int64_t s = t - 1; s >= 0; s--) {
                const SCALAR *e = tree + layout->offset[s] + RP_SEGTREE_FANOUT * j;
                int c = 0;
                while (c < RP_SEGTREE_FANOUT - 1 && !(e[c] > 0)) c++;
                j = RP_SEGTREE_FANOUT * j + c;
            }
            return j < limit ? j : -1;
        }
    }
    return -1;
}

/* Draws of a prioritized sample whose prefix masses are x[0, g) (in SCALAR): torchrl's
 * ScanLowerBound against `root`, the leaf clamped to num_valid - 1 and moved off a zero-valued
 * leaf (the nearest positive on the left, else on the right, below num_valid), and its value.
 * O(g log size). */
static void FN(land_group)(const rp_segtree_layout *layout, const SCALAR *tree, SCALAR root,
                           int64_t num_valid, const SCALAR *x, int64_t g, int64_t *out_index,
                           SCALAR *out_priority) {
    FN(scan_values)(layout, tree, root, x, g, out_index);
    for (int64_t k = 0; k < g; k++) {
        int64_t i = out_index[k];
        if (i >= num_valid) i = num_valid - 1;
        if (!(tree[i] > 0)) {
            const int64_t left = FN(last_positive_at_or_before)(layout, tree, i);
            i = left >= 0 ? left : FN(first_positive_at_or_after)(layout, tree, i, num_valid);
        }
        out_index[k] = i;
        out_priority[k] = tree[i];
    }
}

/* The checks shared by the fused draws: the ranges, then a positive mass to draw from. */
static int FN(check_draw)(const rp_segtree_layout *layout, const SCALAR *tree, int64_t mass_end,
                          int64_t num_valid, int64_t *bad, double *p_sum) {
    if (num_valid < 1 || mass_end < num_valid || mass_end > layout->size) {
        *bad = num_valid;
        return RP_ERR_INDEX;
    }
    *p_sum = FN(query)(layout, tree, 0, mass_end, false);
    if (!(*p_sum > 0)) return RP_ERR_EMPTY;
    /* The mass may lie past num_valid only: then no draw can be moved onto a positive leaf. */
    if (mass_end > num_valid && !(FN(query)(layout, tree, 0, num_valid, false) > 0)) return RP_ERR_EMPTY;
    return RP_OK;
}

static void FN(weigh)(const SCALAR *priority, int64_t n, double p_min, double beta, double *out_weight) {
    if (out_weight != NULL) {
        for (int64_t k = 0; k < n; k++) out_weight[k] = pow((double)priority[k] / p_min, -beta);
    }
}

int FN(rp_sumtree_sample)(const rp_segtree_layout *layout, const SCALAR *tree, int64_t mass_end,
                          int64_t num_valid, const double *uniform, int64_t n, double p_min,
                          double beta, int64_t *out_index, SCALAR *out_priority,
                          double *out_weight, int64_t *bad) {
    double p_sum = 0.0;
    if (num_valid < 1 || mass_end < num_valid || mass_end > layout->size) {
        *bad = num_valid;
        return RP_ERR_INDEX;
    }
    for (int64_t k = 0; k < n; k++) {
        if (RP_UNLIKELY(!(uniform[k] >= 0 && uniform[k] <= 1))) {
            *bad = k;
            return RP_ERR_VALUE;
        }
    }
    const int rc = FN(check_draw)(layout, tree, mass_end, num_valid, bad, &p_sum);
    if (rc != RP_OK) return rc;
    /* The mass of a draw is uniform * p_sum in double, then rounded to SCALAR: numpy's
     * uniform(0, p_sum) as torchrl's tree takes it. A draw at 0 lands on leaf 0, and is then
     * moved to the first positive leaf. */
    const SCALAR root = FN(root_value)(layout, tree);
    SCALAR v[RP_DESCENT_GROUP];
    for (int64_t k0 = 0; k0 < n; k0 += RP_DESCENT_GROUP) {
        const int64_t g = k0 + RP_DESCENT_GROUP < n ? RP_DESCENT_GROUP : n - k0;
        for (int64_t q = 0; q < g; q++) v[q] = (SCALAR)(uniform[k0 + q] * p_sum);
        FN(land_group)(layout, tree, root, num_valid, v, g, out_index + k0, out_priority + k0);
    }
    FN(weigh)(out_priority, n, p_min, beta, out_weight);
    return RP_OK;
}

int FN(rp_sumtree_sample_masses)(const rp_segtree_layout *layout, const SCALAR *tree,
                                 int64_t mass_end, int64_t num_valid, const double *mass, int64_t n,
                                 double p_min, double beta, int64_t *out_index,
                                 SCALAR *out_priority, double *out_weight, int64_t *bad) {
    double p_sum = 0.0;
    if (num_valid < 1 || mass_end < num_valid || mass_end > layout->size) {
        *bad = num_valid;
        return RP_ERR_INDEX;
    }
    for (int64_t k = 0; k < n; k++) {
        if (RP_UNLIKELY(isnan(mass[k]))) {
            *bad = k;
            return RP_ERR_VALUE;
        }
    }
    const int rc = FN(check_draw)(layout, tree, mass_end, num_valid, bad, &p_sum);
    if (rc != RP_OK) return rc;
    const SCALAR root = FN(root_value)(layout, tree);
    SCALAR v[RP_DESCENT_GROUP];
    for (int64_t k0 = 0; k0 < n; k0 += RP_DESCENT_GROUP) {
        const int64_t g = k0 + RP_DESCENT_GROUP < n ? RP_DESCENT_GROUP : n - k0;
        /* Rounded to the tree's precision, as scan_lower_bound takes its values. */
        for (int64_t q = 0; q < g; q++) v[q] = (SCALAR)mass[k0 + q];
        FN(land_group)(layout, tree, root, num_valid, v, g, out_index + k0, out_priority + k0);
    }
    FN(weigh)(out_priority, n, p_min, beta, out_weight);
    return RP_OK;
}

/* Whether leaf i is listed in the strictly increasing exclude[0, m). O(log m). */
/* The first position in the sorted a[0..m) whose value is >= x, or m. O(log m). */
static inline int64_t FN(first_at_least)(const int64_t *a, int64_t m, int64_t x) {
    int64_t lo = 0, hi = m;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static inline bool FN(is_excluded)(const int64_t *exclude, int64_t m, int64_t i) {
    const int64_t at = FN(first_at_least)(exclude, m, i);
    return at < m && exclude[at] == i;
}

/* The last positive, not excluded leaf <= i, or -1 (rare path: only after a zero-valued leaf). */
static int64_t FN(last_allowed_at_or_before)(const rp_segtree_layout *layout, const SCALAR *tree,
                                              const int64_t *exclude, int64_t m, int64_t i) {
    while (i >= 0) {
        const int64_t j = FN(last_positive_at_or_before)(layout, tree, i);
        if (j < 0 || !FN(is_excluded)(exclude, m, j)) return j;
        i = j - 1;
    }
    return -1;
}

/* The first positive, not excluded leaf in [i, limit), or -1 (rare path). */
static int64_t FN(first_allowed_at_or_after)(const rp_segtree_layout *layout, const SCALAR *tree,
                                              const int64_t *exclude, int64_t m, int64_t i,
                                              int64_t limit) {
    while (i < limit) {
        const int64_t j = FN(first_positive_at_or_after)(layout, tree, i, limit);
        if (j < 0 || !FN(is_excluded)(exclude, m, j)) return j;
        i = j + 1;
    }
    return -1;
}

int FN(rp_sumtree_sample_exclude)(const rp_segtree_layout *layout, const SCALAR *tree,
                                  int64_t mass_end, int64_t num_valid, const int64_t *exclude,
                                  int64_t n_exclude, const double *uniform, int64_t n,
                                  double p_min, double beta, double *scratch, int64_t scratch_len,
                                  int64_t *out_index, SCALAR *out_priority, double *out_weight,
                                  int64_t *bad) {
    if (num_valid < 1 || mass_end < num_valid || mass_end > layout->size || n_exclude < 0) {
        *bad = -1;
        return RP_ERR_INDEX;
    }
    if (scratch_len < 3 * n_exclude) {
        *bad = -1;
        return RP_ERR_VALUE;
    }
    /* The runs of consecutive excluded leaves (run R starts at exclude[first[R]]), found in one
     * pass that also checks the order: within a run it holds, so only each run's first entry
     * needs comparing. Once sorted, the range is checked at the two ends. */
    int64_t *first = (int64_t *)(scratch + 2 * n_exclude);
    int64_t runs = 0, bad_order = n_exclude;
    for (int64_t r = 0; r < n_exclude;) {
        if (r > 0 && exclude[r] <= exclude[r - 1]) {
            bad_order = r;
            break;
        }
        first[runs++] = r;
        int64_t r_end = r + 1;
        while (r_end < n_exclude && exclude[r_end] == exclude[r_end - 1] + 1) r_end++;
        r = r_end;
    }
    /* the first entry outside [0, mass_end) among the sorted exclude[0, bad_order) */
    int64_t bad_range = bad_order;
    if (bad_order > 0 && exclude[0] < 0) {
        bad_range = 0;
    } else if (bad_order > 0 && exclude[bad_order - 1] >= mass_end) {
        bad_range = FN(first_at_least)(exclude, bad_order, mass_end);
    }
    if (bad_range < n_exclude) {
        *bad = bad_range;
        return RP_ERR_INDEX;
    }
    for (int64_t k = 0; k < n; k++) {
        if (RP_UNLIKELY(!(uniform[k] >= 0 && uniform[k] <= 1))) {
            *bad = k;
            return RP_ERR_VALUE;
        }
    }
    /* Per run of consecutive excluded leaves R (the first at exclude[first[R]]): before[R], the
     * allowed mass on its left, and cut[R], the excluded mass up to its end. Both are running
     * sums, hence non-decreasing. A run's leaves are summed at once, and the allowed gap before
     * it with one range query. */
    double *before = scratch, *cut = scratch + n_exclude;
    double allowed = 0.0, excluded = 0.0;
    int64_t pos = 0;
    for (int64_t R = 0; R < runs; R++) {
        const int64_t e = exclude[first[R]];
        const int64_t count = (R + 1 < runs ? first[R + 1] : n_exclude) - first[R];
        if (e - pos == 1) allowed += (double)tree[pos];
        else if (e > pos) allowed += FN(query)(layout, tree, pos, e, false);
        excluded += FN(range_sum)(tree, e, e + count);
        before[R] = allowed;
        cut[R] = excluded;
        pos = e + count;
    }
    if (mass_end > pos) allowed += FN(query)(layout, tree, pos, mass_end, false);
    if (!(allowed > 0)) return RP_ERR_EMPTY;
    if (FN(first_allowed_at_or_after)(layout, tree, exclude, n_exclude, 0, num_valid) < 0)
        return RP_ERR_EMPTY;

    const SCALAR root = FN(root_value)(layout, tree);
    SCALAR v[RP_DESCENT_GROUP];
    int64_t lo[RP_DESCENT_GROUP], hi[RP_DESCENT_GROUP];
    for (int64_t k0 = 0; k0 < n; k0 += RP_DESCENT_GROUP) {
        const int64_t g = k0 + RP_DESCENT_GROUP < n ? RP_DESCENT_GROUP : n - k0;
        for (int64_t q = 0; q < g; q++) {
            double mass = uniform[k0 + q] * allowed;
            /* A zero draw still has to land on a positive leaf: aim just above zero. */
            if (!(mass > 0)) mass = 4.9406564584124654e-324;
            /* The gap of allowed leaves holding the draw: before run a, where a counts the
             * before[R] < mass. */
            int64_t a = 0, b = runs;
            while (a < b) {
                const int64_t mid = a + (b - a) / 2;
                if (before[mid] < mass) a = mid + 1;
                else b = mid;
            }
            const int64_t next = a < runs ? first[a] : n_exclude; /* first exclusion after it */
            lo[q] = next > 0 ? exclude[next - 1] + 1 : 0;
            hi[q] = a < runs ? exclude[next] : mass_end;
            /* The same draw in the unmasked tree: add the excluded mass on its left. */
            v[q] = (SCALAR)(mass + (a > 0 ? cut[a - 1] : 0.0));
        }
        FN(scan_values)(layout, tree, root, v, g, out_index + k0);
        for (int64_t q = 0; q < g; q++) {
            int64_t i = out_index[k0 + q];
            /* Rounding of the internal sums can end a descent just outside its gap. */
            if (i >= hi[q]) i = hi[q] - 1;
            if (i < lo[q]) i = lo[q];
            if (i >= num_valid) i = num_valid - 1; /* past the storage: clamped, as torchrl does */
            if (RP_UNLIKELY(lo[q] >= hi[q]) || !(tree[i] > 0) || FN(is_excluded)(exclude, n_exclude, i)) {
                const int64_t left = FN(last_allowed_at_or_before)(layout, tree, exclude, n_exclude, i);
                i = left >= 0 ? left
                              : FN(first_allowed_at_or_after)(layout, tree, exclude, n_exclude, i, num_valid);
            }
            out_index[k0 + q] = i;
            out_priority[k0 + q] = tree[i];
        }
    }
    if (out_weight != NULL) {
        for (int64_t k = 0; k < n; k++) out_weight[k] = pow((double)out_priority[k] / p_min, -beta);
    }
    return RP_OK;
}

/* --- The tree with some leaves zeroed, read without writing it -----------------------------
 * torchrl's PrioritizedSliceSampler sets the leaves that cannot start a slice to zero, draws,
 * and puts them back. Since every parent is the node_sum of its 16 children, that tree (Z) is a
 * pure function of its leaves: `rp_segtree_zeroed` lists, level by level, the entries of Z that
 * differ from the tree's (the ancestors of the zeroed leaves), and the reads below substitute
 * them. Z's sums, descents and leaves are thus those of the zeroed tree to the bit. */

/* The 16 entries of node j of level t in Z (t = 0: leaves). */
static inline void FN(zeroed_node)(const rp_segtree_layout *layout, const SCALAR *tree,
                                   const rp_segtree_zeroed *z, int64_t t, int64_t j, SCALAR *e) {
    memcpy(e, tree + layout->offset[t] + RP_SEGTREE_FANOUT * j, RP_SEGTREE_FANOUT * sizeof *e);
    const int64_t *ix = z->index[t];
    const double *val = z->value[t];
    const int64_t n = z->n[t], first = RP_SEGTREE_FANOUT * j;
    for (int64_t at = FN(first_at_least)(ix, n, first); at < n && ix[at] < first + RP_SEGTREE_FANOUT; at++)
        e[ix[at] & 15] = val != NULL ? (SCALAR)val[at] : (SCALAR)0;
}

int FN(rp_sumtree_zeroed_build)(const rp_segtree_layout *layout, const SCALAR *tree,
                                const int64_t *exclude, int64_t n_exclude, int64_t *index_buf,
                                double *value_buf, int64_t buf_len, rp_segtree_zeroed *z,
                                int64_t *bad) {
    if (n_exclude < 0 || buf_len < rp_segtree_zeroed_scratch(layout, n_exclude)) {
        *bad = -1;
        return RP_ERR_VALUE;
    }
    memset(z, 0, sizeof *z);
    z->n[0] = n_exclude;
    z->index[0] = exclude;
    z->value[0] = NULL; /* the zeroed leaves */
    /* exclude is checked (strictly increasing within [0, size)) as it is read, each entry
     * before its position is used: only the scratch is written before an error. */
    int64_t prev = -1;
    if (layout->top == 0) {
        for (int64_t k = 0; k < n_exclude; k++) {
            if ((uint64_t)exclude[k] >= (uint64_t)layout->size || exclude[k] <= prev) {
                *bad = k;
                return RP_ERR_INDEX;
            }
            prev = exclude[k];
        }
        return RP_OK;
    }
    /* Level 1: the parents of the zeroed leaves, each from a mask of its zeroed children
     * (no scattered stores for node_sum to read back); a parent whose 16 leaves are all
     * zeroed is 0 without reading them. */
    int64_t on = 0;
    for (int64_t k = 0; k < n_exclude;) {
        const int64_t p = exclude[k] >> 4;
        /* the leaves a few parents ahead (a miss each where the runs lie far apart) */
        if (k + 64 < n_exclude && (uint64_t)exclude[k + 64] < (uint64_t)layout->size)
            RP_PREFETCH(tree + (exclude[k + 64] & ~(int64_t)15));
        uint32_t mask = 0;
        do {
            const int64_t i = exclude[k];
            if (RP_UNLIKELY((uint64_t)i >= (uint64_t)layout->size || i <= prev)) {
                *bad = k;
                return RP_ERR_INDEX;
            }
            if ((i >> 4) != p) break;
            mask |= 1u << (i & 15);
            prev = i;
            k++;
        } while (k < n_exclude);
        double sum = 0.0;
        if (mask != 0xFFFFu) {
            const SCALAR *lo = tree + RP_SEGTREE_FANOUT * p;
            SCALAR e[RP_SEGTREE_FANOUT];
            for (int j = 0; j < RP_SEGTREE_FANOUT; j++) e[j] = (mask >> j) & 1u ? (SCALAR)0 : lo[j];
            sum = (double)(SCALAR)FN(node_sum)(e); /* as refresh stores it */
        }
        index_buf[on] = p;
        value_buf[on] = sum;
        on++;
    }
    z->n[1] = on;
    z->index[1] = index_buf;
    z->value[1] = value_buf;
    int64_t used = on;
    for (int64_t t = 2; t <= layout->top; t++) {
        const int64_t *pi = z->index[t - 1];
        const double *pv = z->value[t - 1];
        const int64_t pn = z->n[t - 1];
        const SCALAR *lo = tree + layout->offset[t - 1];
        int64_t *oi = index_buf + used;
        double *ov = value_buf + used;
        on = 0;
        for (int64_t k = 0; k < pn;) {
            const int64_t p = pi[k] >> 4;
            if (k + 16 < pn) FN(prefetch_node)(lo + (pi[k + 16] & ~(int64_t)15));
            SCALAR e[RP_SEGTREE_FANOUT];
            memcpy(e, lo + RP_SEGTREE_FANOUT * p, sizeof e);
            do {
                e[pi[k] & 15] = (SCALAR)pv[k];
                k++;
            } while (k < pn && (pi[k] >> 4) == p);
            oi[on] = p;
            ov[on] = (double)(SCALAR)FN(node_sum)(e);
            on++;
        }
        z->n[t] = on;
        z->index[t] = oi;
        z->value[t] = ov;
        used += on;
    }
    return RP_OK;
}

/* binary_node of Z: the binary node at height h, position m, summed from Z's entries of level
 * h / 4 (or the entry itself when 4 divides h). O(log n_exclude + 16). */
static SCALAR FN(zeroed_binary_node)(const rp_segtree_layout *layout, const SCALAR *tree,
                                     const rp_segtree_zeroed *z, int64_t h, int64_t m) {
    int64_t t = h >> 2;
    int s = (int)(h & 3);
    if (s == 0 && t <= layout->top) {
        if (m >= layout->length[t]) return (SCALAR)0;
        const int64_t at = FN(first_at_least)(z->index[t], z->n[t], m);
        if (at < z->n[t] && z->index[t][at] == m) return z->value[t] != NULL ? (SCALAR)z->value[t][at] : (SCALAR)0;
        return tree[layout->offset[t] + m];
    }
    if (s == 0) {
        t -= 1;
        s = 4;
    }
    if (t > layout->top) return (SCALAR)0;
    const int64_t first = m << s;
    if (first >= layout->length[t]) return (SCALAR)0;
    SCALAR e[RP_SEGTREE_FANOUT];
    FN(zeroed_node)(layout, tree, z, t, first >> 4, e);
    return FN(block_sum)(e + (first & 15), s);
}

/* root_value of Z. */
static SCALAR FN(zeroed_root)(const rp_segtree_layout *layout, const SCALAR *tree, const rp_segtree_zeroed *z) {
    const int64_t top_height = 4 * (layout->top + 1);
    if (layout->height <= top_height) return FN(zeroed_binary_node)(layout, tree, z, layout->height, 0);
    return FN(zeroed_binary_node)(layout, tree, z, top_height, 0) + (SCALAR)0;
}

double FN(rp_sumtree_zeroed_query)(const rp_segtree_layout *layout, const SCALAR *tree,
                                   const rp_segtree_zeroed *z, int64_t l, int64_t r) {
    /* sum_query's loop, each binary node read from Z */
    const int64_t capacity = layout->capacity;
    if (l < 0) l = 0;
    if (r > capacity) r = capacity;
    if (l >= r) return 0.0;
    if (l == 0 && r >= layout->size) return (double)FN(zeroed_root)(layout, tree, z);
    SCALAR acc = 0;
    int64_t a = l + capacity, b = r + capacity;
    for (int64_t h = 0; a < b; h++, a >>= 1, b >>= 1) {
        const int64_t base = capacity >> h;
        if (a & 1) acc = acc + FN(zeroed_binary_node)(layout, tree, z, h, (a++) - base);
        if (b & 1) acc = acc + FN(zeroed_binary_node)(layout, tree, z, h, (--b) - base);
    }
    return (double)acc;
}

/* FN(descend) of one value v in (0, root of Z] in Z: each node's mini-heap summed from Z's
 * entries. O(log size * (16 + log n_exclude)). */
static int64_t FN(zeroed_descend)(const rp_segtree_layout *layout, const SCALAR *tree,
                                  const rp_segtree_zeroed *z, SCALAR v) {
    const int64_t top = layout->top;
    if (layout->height == 0) return 0;
    const int64_t over = layout->height - 4 * top;
    int64_t node = 0;
    for (int64_t t = top; t >= 0; t--) {
        SCALAR e[RP_SEGTREE_FANOUT], h[RP_SEGTREE_FANOUT];
        const int steps = t == top ? (over < 4 ? (int)over : 4) : 4;
        FN(zeroed_node)(layout, tree, z, t, node, e);
        FN(node_heap)(e, h);
        const int64_t j = RP_SEGTREE_FANOUT * node + FN(node_steps)(h, e, RP_SEGTREE_FANOUT >> steps, steps, &v);
        if (t > 0 && j >= layout->length[t - 1] / RP_SEGTREE_FANOUT) return ((j + 1) << (4 * t)) - 1;
        node = j;
    }
    return node;
}

int FN(rp_sumtree_zeroed_sample_masses)(const rp_segtree_layout *layout, const SCALAR *tree,
                                        const rp_segtree_zeroed *z, int64_t num_valid,
                                        const double *mass, int64_t n, int64_t *out_index,
                                        SCALAR *out_priority, int64_t *bad) {
    if (num_valid < 1 || num_valid > layout->size) {
        *bad = -1;
        return RP_ERR_INDEX;
    }
    for (int64_t k = 0; k < n; k++) {
        if (RP_UNLIKELY(isnan(mass[k]))) {
            *bad = k;
            return RP_ERR_VALUE;
        }
    }
    const SCALAR root = FN(zeroed_root)(layout, tree, z);
    const int64_t *exclude = z->index[0];
    const int64_t m = z->n[0];
    for (int64_t k = 0; k < n; k++) {
        /* scan_lower_bound's rule on the mass rounded to the tree's dtype */
        const SCALAR x = (SCALAR)mass[k];
        int64_t i = x > root ? layout->size : !(x > 0) ? 0 : FN(zeroed_descend)(layout, tree, z, x);
        if (i >= num_valid) i = num_valid - 1;
        if (!(tree[i] > 0) || FN(is_excluded)(exclude, m, i)) {
            /* torchrl steps left to the first positive leaf of Z; it raises where there is none
             * (a draw of exactly 0 with leaf 0 zero), where this takes the first on the right */
            const int64_t left = FN(last_allowed_at_or_before)(layout, tree, exclude, m, i);
            i = left >= 0 ? left : FN(first_allowed_at_or_after)(layout, tree, exclude, m, i, num_valid);
            if (i < 0) {
                *bad = k;
                return RP_ERR_EMPTY;
            }
        }
        out_index[k] = i;
        out_priority[k] = tree[i];
    }
    return RP_OK;
}

int FN(rp_priority_scan)(const int64_t *index, int64_t n, int64_t size, const SCALAR *priority,
                         int64_t priority_stride, int64_t *skipped, int64_t *argmax, int64_t *bad) {
    int64_t negative = 0, best = -1;
    SCALAR highest = 0;
    for (int64_t k = 0; k < n; k++) {
        const int64_t i = index[k];
        if (i < 0) {
            negative++;
            continue;
        }
        if (RP_UNLIKELY(i >= size)) {
            *bad = k;
            return RP_ERR_INDEX;
        }
        const SCALAR p = priority[k * priority_stride];
        if (RP_UNLIKELY(FN(bad_value)(p, false))) { /* NaN, negative or infinite */
            *bad = k;
            return RP_ERR_VALUE;
        }
        if (best < 0 || p > highest) {
            highest = p;
            best = k;
        }
    }
    *skipped = negative;
    *argmax = best;
    return RP_OK;
}

#undef NODE_LINES
#undef RP_LANE_LOAD
#undef RP_LANE_VALUE
#undef FN
#undef RP_CAT
#undef RP_CAT_
