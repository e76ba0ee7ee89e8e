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

/* Sum of one node in a fixed order, accumulated in double: the same function builds and
 * refreshes every parent, which is what makes the tree a pure function of its leaves. The
 * even and the odd entries are summed pairwise apart and added last, the order of two-lane
 * double vectors: 22 -> 16 ns per updated leaf at B=256, where gcc had left the pairwise
 * order of adjacent entries scalar. */
static inline double FN(node_sum)(const SCALAR *e) {
#if defined(RP_HAVE_VECTORS)
    rp_v2d d[8];
    for (int k = 0; k < 8; k++) {
        d[k] = (rp_v2d){(double)e[2 * k], (double)e[2 * k + 1]};
    }
    const rp_v2d s = ((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7]));
    return s[0] + s[1];
#else
    const double even = (((double)e[0] + (double)e[2]) + ((double)e[4] + (double)e[6]))
                      + (((double)e[8] + (double)e[10]) + ((double)e[12] + (double)e[14]));
    const double odd = (((double)e[1] + (double)e[3]) + ((double)e[5] + (double)e[7]))
                     + (((double)e[9] + (double)e[11]) + ((double)e[13] + (double)e[15]));
    return even + odd;
#endif
}

/* Inclusive prefix sums of one node's 16 entries, accumulated in SCALAR as four running sums
 * of four plus their offsets (short dependency chains). Rounding is monotone, so the sums stay
 * non-decreasing, which is all the descent needs (its fallback absorbs the last-bit mismatch
 * with the parent entry). Levels that keep prefix sums store exactly these. */
static inline void FN(scalar_prefix)(const SCALAR *e, SCALAR *out) {
    SCALAR quad[4];
    for (int k = 0; k < 4; k++) {
        const SCALAR *x = e + 4 * k;
        SCALAR *o = out + 4 * k;
        o[0] = x[0];
        o[1] = o[0] + x[1];
        o[2] = o[1] + x[2];
        o[3] = o[2] + x[3];
        quad[k] = o[3];
    }
    const SCALAR o1 = quad[0], o2 = o1 + quad[1], o3 = o2 + quad[2];
    for (int i = 0; i < 4; i++) {
        out[4 + i] += o1;
        out[8 + i] += o2;
        out[12 + i] += o3;
    }
}

/* Recompute the stored prefix sums of node j of level t (t >= 1) from its entries. */
static inline void FN(store_prefix)(const rp_segtree_layout *layout, SCALAR *tree, int64_t t, int64_t j) {
    FN(scalar_prefix)(tree + layout->offset[t] + RP_SEGTREE_FANOUT * j,
                      tree + layout->prefix[t] + RP_SEGTREE_FANOUT * j);
}

/* The largest SCALAR <= x: comparing prefix sums against it never takes a child whose prefix
 * is >= x, which keeps the remaining mass strictly positive on the way down. */
static inline SCALAR FN(round_down)(double x) {
    SCALAR s = (SCALAR)x;
    if (sizeof(SCALAR) < sizeof(double) && (double)s > x) {
        float f = (float)s;
        if (f > 0) {
            /* The next float down of a positive float is one less in its bit pattern: no libm
             * call on the descent's path (a positive mass is all it ever rounds). */
            uint32_t bits;
            memcpy(&bits, &f, sizeof bits);
            bits -= 1;
            memcpy(&f, &bits, sizeof f);
        } else {
            f = nextafterf(f, -INFINITY);
        }
        s = (SCALAR)f;
    }
    return s;
}

static inline SCALAR FN(node_min)(const SCALAR *e) {
    SCALAR m = e[0];
    for (int j = 1; j < RP_SEGTREE_FANOUT; j++) m = e[j] < m ? e[j] : m;
    return m;
}

static inline SCALAR FN(node_reduce)(const SCALAR *e, bool is_min) {
    return is_min ? FN(node_min)(e) : (SCALAR)FN(node_sum)(e);
}

/* Total of the root node accumulated exactly as the descent does, so that a value <= this
 * total never runs off the right end of the root. */
static inline double FN(root_total)(const rp_segtree_layout *layout, const SCALAR *tree) {
    if (layout->prefix[layout->top] >= 0) return (double)tree[layout->prefix[layout->top] + RP_SEGTREE_FANOUT - 1];
    SCALAR prefix[RP_SEGTREE_FANOUT];
    FN(scalar_prefix)(tree + layout->offset[layout->top], prefix);
    return (double)prefix[RP_SEGTREE_FANOUT - 1];
}

void FN(rp_segtree_fill)(const rp_segtree_layout *layout, SCALAR *tree, SCALAR identity) {
    for (int64_t i = 0; i < layout->total; i++) tree[i] = identity;
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

/* Recompute the parents of the leaves index[0..n) level by level. A level whose node count
 * is small next to the batch is recomputed whole, which visits each parent once, in index
 * order; otherwise each touched parent is recomputed (once per run of equal parents). */
static void FN(refresh)(const rp_segtree_layout *layout, SCALAR *tree, const int64_t *index,
                        int64_t n, bool is_min, bool level1_done) {
    for (int64_t t = 1; t <= layout->top; t++) {
        const SCALAR *lo = tree + layout->offset[t - 1];
        SCALAR *hi = tree + layout->offset[t];
        const int64_t nodes = layout->length[t - 1] / RP_SEGTREE_FANOUT;
        const bool with_prefix = layout->prefix[t] >= 0;
        if (t == 1 && level1_done) {
            /* the entries of the parents of leaves 0..n-1 are there, not their prefix sums */
            const int64_t touched = (n + RP_SEGTREE_FANOUT * RP_SEGTREE_FANOUT - 1) / (RP_SEGTREE_FANOUT * RP_SEGTREE_FANOUT);
            if (with_prefix)
                for (int64_t j = 0; j < touched; j++) FN(store_prefix)(layout, tree, t, j);
            continue;
        }
        if (n * 4 >= nodes) {
            for (int64_t j = 0; j < nodes; j++) hi[j] = FN(node_reduce)(lo + RP_SEGTREE_FANOUT * j, is_min);
            if (with_prefix)
                for (int64_t j = 0; j < layout->length[t] / RP_SEGTREE_FANOUT; j++) FN(store_prefix)(layout, tree, t, j);
            continue;
        }
        const int shift = (int)(4 * t);
        int64_t prev = -1;
        for (int64_t k = 0; k < n; k++) {
            if (k + 8 < n) {
                const int64_t ahead = index[k + 8] >> shift;
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
        for (int64_t k = 0; k < n; k++) {
            const int64_t j = index[k] >> (shift + 4);
            if (j != prev) {
                FN(store_prefix)(layout, tree, t, j);
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
            for (int64_t j = 0; j < layout->length[t] / RP_SEGTREE_FANOUT; j++) FN(store_prefix)(layout, tree, t, j);
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
/* *in_order is set to whether index[k] == k for every k (a write of leaves 0..n-1 in order,
 * which then needs no scatter), found in the same pass. */
static int64_t FN(first_bad_index)(const int64_t *index, int64_t n, int64_t size, bool *in_order) {
    int64_t shifted = 0; /* nonzero once some index[k] != k */
    for (int64_t k0 = 0; k0 < n; k0 += RP_CHECK_CHUNK) {
        const int64_t k1 = k0 + RP_CHECK_CHUNK < n ? k0 + RP_CHECK_CHUNK : n;
        int flag = 0;
        /* One unsigned comparison covers both ends: a negative index wraps past size. */
        for (int64_t k = k0; k < k1; k++) {
            flag |= (uint64_t)index[k] >= (uint64_t)size;
            shifted |= index[k] ^ k;
        }
        if (RP_UNLIKELY(flag))
            for (int64_t k = k0; k < k1; k++)
                if ((uint64_t)index[k] >= (uint64_t)size) return k;
    }
    *in_order = shifted == 0;
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

/* Write the checked batch: leaves, then their parents. */
static void FN(write_batch)(const rp_segtree_layout *layout, SCALAR *tree, const int64_t *index,
                            const SCALAR *value, int64_t value_stride, int64_t n, bool in_order,
                            bool is_min) {
    if (in_order && value_stride == 1) {
        /* Leaves 0..n-1, e.g. a dense rewrite: copied node by node, each node reduced into
         * level 1 while its leaves are in L1 (one pass over the leaves instead of two). */
        const int64_t whole = n / RP_SEGTREE_FANOUT;
        SCALAR *parents = layout->top >= 1 ? tree + layout->offset[1] : NULL;
        for (int64_t j = 0; j < whole; j++) {
            SCALAR *node = tree + RP_SEGTREE_FANOUT * j;
            memcpy(node, value + RP_SEGTREE_FANOUT * j, RP_SEGTREE_FANOUT * sizeof *tree);
            if (parents != NULL) parents[j] = FN(node_reduce)(node, is_min);
        }
        const int64_t rest = n - RP_SEGTREE_FANOUT * whole;
        if (rest > 0) {
            SCALAR *node = tree + RP_SEGTREE_FANOUT * whole;
            memcpy(node, value + RP_SEGTREE_FANOUT * whole, (size_t)rest * sizeof *tree);
            if (parents != NULL) parents[whole] = FN(node_reduce)(node, is_min);
        }
        FN(refresh)(layout, tree, index, n, is_min, true);
        return;
    }
    if (n * 16 < layout->size) /* a sparse batch: bring its leaves in before the writes */
        for (int64_t k = 0; k < n; k++) RP_PREFETCH_W(tree + index[k]);
    for (int64_t k = 0; k < n; k++) tree[index[k]] = value[k * value_stride];
    FN(refresh)(layout, tree, index, n, is_min, false);
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
    bool in_order = false, above = false;
    const int64_t bad_index = FN(first_bad_index)(index, n, size, &in_order);
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
        FN(write_batch)(layout, tree, index, value, value_stride, n, in_order, is_min);
        return RP_OK;
    }
    /* Near the dtype's limit: write, look at the total, and put the old leaves back if it
     * overflowed (in reverse, so a repeated index gets its first saved value, the original). */
    for (int64_t k = 0; k < n; k++) saved[k] = tree[index[k]];
    FN(write_batch)(layout, tree, index, value, value_stride, n, in_order, false);
    if (FN(total_is_finite)(layout, tree)) return RP_OK;
    for (int64_t k = n - 1; k >= 0; k--) tree[index[k]] = saved[k];
    FN(refresh)(layout, tree, index, n, false, false);
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

/* Recompute the parents of the leaves [first, last] (first <= last), each once: at level t the
 * entries first >> 4t .. last >> 4t. O((last - first) / 16 + 16 log16 size). */
static void FN(refresh_range)(const rp_segtree_layout *layout, SCALAR *tree, int64_t first,
                              int64_t last, bool is_min) {
    for (int64_t t = 1; t <= layout->top; t++) {
        const SCALAR *lo = tree + layout->offset[t - 1];
        SCALAR *hi = tree + layout->offset[t];
        const int shift = (int)(4 * t);
        const int64_t a = first >> shift, b = last >> shift;
        for (int64_t j = a; j <= b; j++) hi[j] = FN(node_reduce)(lo + RP_SEGTREE_FANOUT * j, is_min);
        if (layout->prefix[t] >= 0)
            for (int64_t j = a >> 4; j <= (b >> 4); j++) FN(store_prefix)(layout, tree, t, j);
    }
}

/* Leaves, then parents, of every non-empty range. */
static void FN(write_ranges)(const rp_segtree_layout *layout, SCALAR *tree, const int64_t *bounds,
                             int64_t n_ranges, SCALAR value, bool is_min) {
    for (int64_t r = 0; r < n_ranges; r++) {
        const int64_t start = bounds[2 * r], stop = bounds[2 * r + 1];
        if (start == stop) continue;
        for (int64_t i = start; i < stop; i++) tree[i] = value;
        FN(refresh_range)(layout, tree, start, stop - 1, is_min);
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
            FN(refresh_range)(layout, tree, bounds[2 * r], bounds[2 * r + 1] - 1, false);
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

static double FN(query)(const rp_segtree_layout *layout, const SCALAR *tree, int64_t l, int64_t r,
                        bool is_min) {
    const int64_t size = layout->size;
    if (l < 0) l = 0;
    if (r > size) r = size;
    double acc = is_min ? (double)SCALAR_MAX : 0.0;
    if (l >= r) return acc;
    if (l == 0 && r == size) {
        if (is_min) return (double)FN(node_min)(tree + layout->offset[layout->top]);
        return FN(root_total)(layout, tree);
    }
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

/* The number of the 16 prefix sums p[j] below `bound`: the child a descent takes. A loop of its
 * own, so that the compiler turns it into four vector compares (inside the descent it did not). */
static inline int FN(count_below)(const SCALAR *p, SCALAR bound) {
#if defined(RP_SEGTREE_VECTOR)
    /* GCC / clang vector extensions: 16-byte vectors, SSE2 on x86-64 and NEON on aarch64 (both
     * baseline), so no -march flag is needed. A true compare is -1 in every bit of its lane. */
    RP_SEGTREE_VECTOR b;
    for (int i = 0; i < RP_SEGTREE_LANES; i++) b[i] = bound;
    RP_SEGTREE_MASK below = b < b; /* all lanes 0 */
    for (int k = 0; k < RP_SEGTREE_FANOUT; k += RP_SEGTREE_LANES) {
        RP_SEGTREE_VECTOR x;
        memcpy(&x, p + k, sizeof x);
        below += (RP_SEGTREE_MASK)(x < b);
    }
    int count = 0;
    for (int i = 0; i < RP_SEGTREE_LANES; i++) count -= (int)below[i];
    return count;
#else
    int below = 0;
    for (int j = 0; j < RP_SEGTREE_FANOUT; j++) below += p[j] < bound;
    return below;
#endif
}

#if defined(RP_SEGTREE_SHUFFLE)
/* count_below over the prefix sums of the node e computed in registers, bit for bit those of
 * scalar_prefix: the four quads are transposed into the lanes of four vectors, so three
 * vector additions give every quad's running sums in scalar_prefix's order, and one vector
 * of quad offsets finishes them. The comparisons do not need the natural order, so the sums
 * are left transposed in `out` (entry j at RP_COMPUTED_AT(j)). At 2^20 leaves, where two of
 * the five levels compute their prefix sums: 41 -> 29 ns per descent (C probe, B=256). */
#define RP_COMPUTED_AT(j) (4 * ((j) & 3) + ((j) >> 2))
static inline int FN(count_below_computed)(const SCALAR *e, SCALAR bound, SCALAR *out) {
    RP_SEGTREE_VECTOR x0, x1, x2, x3;
    memcpy(&x0, e, sizeof x0);
    memcpy(&x1, e + 4, sizeof x1);
    memcpy(&x2, e + 8, sizeof x2);
    memcpy(&x3, e + 12, sizeof x3);
    const RP_SEGTREE_VECTOR t0 = RP_SEGTREE_SHUFFLE(x0, x1, 0, 4, 1, 5);
    const RP_SEGTREE_VECTOR t1 = RP_SEGTREE_SHUFFLE(x2, x3, 0, 4, 1, 5);
    const RP_SEGTREE_VECTOR t2 = RP_SEGTREE_SHUFFLE(x0, x1, 2, 6, 3, 7);
    const RP_SEGTREE_VECTOR t3 = RP_SEGTREE_SHUFFLE(x2, x3, 2, 6, 3, 7);
    /* lane k of p_i: entry i of quad k, then the running sum of quad k up to entry i */
    RP_SEGTREE_VECTOR p0 = RP_SEGTREE_SHUFFLE(t0, t1, 0, 1, 4, 5);
    RP_SEGTREE_VECTOR p1 = p0 + RP_SEGTREE_SHUFFLE(t0, t1, 2, 3, 6, 7);
    RP_SEGTREE_VECTOR p2 = p1 + RP_SEGTREE_SHUFFLE(t2, t3, 0, 1, 4, 5);
    RP_SEGTREE_VECTOR p3 = p2 + RP_SEGTREE_SHUFFLE(t2, t3, 2, 3, 6, 7);
    const SCALAR o1 = p3[0], o2 = o1 + p3[1], o3 = o2 + p3[2];
    const RP_SEGTREE_VECTOR offset = {0, o1, o2, o3};
    p0 += offset;
    p1 += offset;
    p2 += offset;
    p3 += offset;
    memcpy(out, &p0, sizeof p0);
    memcpy(out + 4, &p1, sizeof p1);
    memcpy(out + 8, &p2, sizeof p2);
    memcpy(out + 12, &p3, sizeof p3);
    RP_SEGTREE_VECTOR b = {bound, bound, bound, bound};
    const RP_SEGTREE_MASK below = (RP_SEGTREE_MASK)(p0 < b) + (RP_SEGTREE_MASK)(p1 < b)
                                + (RP_SEGTREE_MASK)(p2 < b) + (RP_SEGTREE_MASK)(p3 < b);
    return -(int)(below[0] + below[1] + below[2] + below[3]);
}
#elif defined(RP_SEGTREE_SHUFFLE2)
/* The same for fp64 in two-lane vectors: quads 0 and 1 share the lanes of four vectors, quads 2
 * and 3 those of four others (entry j = 4k + i at RP_COMPUTED_AT(j): vector i of pair k / 2,
 * lane k % 2). Bit for bit scalar_prefix's sums, as above. */
#define RP_COMPUTED_AT(j) (8 * ((j) >> 3) + 2 * ((j) & 3) + (((j) >> 2) & 1))
static inline int FN(count_below_computed)(const SCALAR *e, SCALAR bound, SCALAR *out) {
    RP_SEGTREE_VECTOR x[8], p[8];
    for (int k = 0; k < 8; k++) memcpy(&x[k], e + 2 * k, sizeof x[k]);
    for (int h = 0; h < 2; h++) { /* quads 2h and 2h + 1: entries 8h .. 8h + 7 */
        const RP_SEGTREE_VECTOR *q = x + 4 * h;
        RP_SEGTREE_VECTOR *r = p + 4 * h;
        r[0] = RP_SEGTREE_SHUFFLE2(q[0], q[2], 0, 2);
        r[1] = r[0] + RP_SEGTREE_SHUFFLE2(q[0], q[2], 1, 3);
        r[2] = r[1] + RP_SEGTREE_SHUFFLE2(q[1], q[3], 0, 2);
        r[3] = r[2] + RP_SEGTREE_SHUFFLE2(q[1], q[3], 1, 3);
    }
    const SCALAR o1 = p[3][0], o2 = o1 + p[3][1], o3 = o2 + p[7][0];
    const RP_SEGTREE_VECTOR low = {0, o1}, high = {o2, o3};
    RP_SEGTREE_VECTOR b = {bound, bound};
    RP_SEGTREE_MASK below = b < b; /* all lanes 0 */
    for (int i = 0; i < 4; i++) {
        p[i] += low;
        p[4 + i] += high;
        below += (RP_SEGTREE_MASK)(p[i] < b);
        below += (RP_SEGTREE_MASK)(p[4 + i] < b);
    }
    memcpy(out, p, sizeof p);
    return -(int)(below[0] + below[1]);
}
#else
#define RP_COMPUTED_AT(j) (j)
static inline int FN(count_below_computed)(const SCALAR *e, SCALAR bound, SCALAR *out) {
    FN(scalar_prefix)(e, out);
    return FN(count_below)(out, bound);
}
#endif

/* Descend g <= RP_DESCENT_GROUP masses v[q] > 0 level by level, interleaved so that the cache
 * misses of one descent overlap the arithmetic of the others. At each node the child taken is
 * the first whose running prefix (in double) reaches v. Where rounding makes v exceed the sum
 * of a node, the last positive child is taken with all of its mass: every descent therefore
 * ends on a positive leaf below `size`. */
#define RP_DESCENT_GROUP 32
static void FN(descend)(const rp_segtree_layout *layout, const SCALAR *tree, double *v, int64_t g,
                        int64_t *leaf) {
    int64_t node[RP_DESCENT_GROUP];
    for (int64_t q = 0; q < g; q++) node[q] = 0;
    for (int64_t t = layout->top; t >= 0; t--) {
        const SCALAR *lvl = tree + layout->offset[t];
        const SCALAR *pre = t > 0 && layout->prefix[t] >= 0 ? tree + layout->prefix[t] : NULL;
        const SCALAR *below = t == 0 ? NULL
                              : layout->prefix[t - 1] >= 0 ? tree + layout->prefix[t - 1]
                                                           : tree + layout->offset[t - 1];
        for (int64_t q = 0; q < g; q++) {
            const double target = v[q];
            int child = 0;
            double before = 0.0;
            /* Stored prefix sums where the level keeps them, else computed the same way. */
            const SCALAR bound = FN(round_down)(target);
            if (pre != NULL) {
                const SCALAR *p = pre + RP_SEGTREE_FANOUT * node[q];
                child = FN(count_below)(p, bound);
                if (child > 0 && child < RP_SEGTREE_FANOUT) before = (double)p[child - 1];
            } else {
                SCALAR computed[RP_SEGTREE_FANOUT];
                child = FN(count_below_computed)(lvl + RP_SEGTREE_FANOUT * node[q], bound, computed);
                if (child > 0 && child < RP_SEGTREE_FANOUT)
                    before = (double)computed[RP_COMPUTED_AT(child - 1)];
            }
            if (RP_UNLIKELY(child == RP_SEGTREE_FANOUT)) {
                const SCALAR *e = lvl + RP_SEGTREE_FANOUT * node[q];
                child = RP_SEGTREE_FANOUT - 1;
                while (child > 0 && !(e[child] > 0)) child--;
                v[q] = (double)e[child];
            } else {
                v[q] = target - before;
            }
            node[q] = RP_SEGTREE_FANOUT * node[q] + child;
            if (t > 0) FN(prefetch_node)(below + RP_SEGTREE_FANOUT * node[q]);
        }
    }
    for (int64_t q = 0; q < g; q++) leaf[q] = node[q];
}

int FN(rp_sumtree_scan_lower_bound)(const rp_segtree_layout *layout, const SCALAR *tree,
                                    const SCALAR *value, int64_t n, int64_t *out, int64_t *bad) {
    for (int64_t k = 0; k < n; k++) {
        if (RP_UNLIKELY(isnan(value[k]))) {
            *bad = k;
            return RP_ERR_VALUE;
        }
    }
    const double total = FN(root_total)(layout, tree);
    double v[RP_DESCENT_GROUP];
    int64_t pos[RP_DESCENT_GROUP], leaf[RP_DESCENT_GROUP];
    for (int64_t k0 = 0; k0 < n; k0 += RP_DESCENT_GROUP) {
        const int64_t k1 = k0 + RP_DESCENT_GROUP < n ? k0 + RP_DESCENT_GROUP : n;
        int64_t g = 0;
        for (int64_t k = k0; k < k1; k++) {
            const double x = (double)value[k];
            if (x <= 0) {
                out[k] = 0; /* the first leaf's prefix is >= any non-positive value */
            } else if (x > total) {
                out[k] = layout->size;
            } else {
                v[g] = x;
                pos[g++] = k;
            }
        }
        FN(descend)(layout, tree, v, g, leaf);
        for (int64_t q = 0; q < g; q++) out[pos[q]] = leaf[q];
    }
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

/* Draws k0..k0+g of a prioritized sample whose prefix masses are v[0, g): descend, clamp to
 * num_valid - 1, move off a zero-valued leaf (nearest positive on the left, else on the right,
 * below num_valid) and read the leaf's value. O(g * 16 log16 size). */
static void FN(land_group)(const rp_segtree_layout *layout, const SCALAR *tree, int64_t num_valid,
                           double *v, int64_t g, int64_t *out_index, SCALAR *out_priority) {
    FN(descend)(layout, tree, v, g, out_index);
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
    double v[RP_DESCENT_GROUP];
    for (int64_t k0 = 0; k0 < n; k0 += RP_DESCENT_GROUP) {
        const int64_t g = k0 + RP_DESCENT_GROUP < n ? RP_DESCENT_GROUP : n - k0;
        for (int64_t q = 0; q < g; q++) {
            const double mass = uniform[k0 + q] * p_sum;
            /* A zero draw still has to land on a positive leaf: aim just above zero. */
            v[q] = mass > 0 ? mass : 4.9406564584124654e-324;
        }
        FN(land_group)(layout, tree, num_valid, v, g, out_index + k0, out_priority + k0);
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
    double v[RP_DESCENT_GROUP];
    for (int64_t k0 = 0; k0 < n; k0 += RP_DESCENT_GROUP) {
        const int64_t g = k0 + RP_DESCENT_GROUP < n ? RP_DESCENT_GROUP : n - k0;
        for (int64_t q = 0; q < g; q++) {
            /* Rounded to the tree's precision, as scan_lower_bound takes its values. */
            const double m = (double)(SCALAR)mass[k0 + q];
            v[q] = m > 0 ? m : 4.9406564584124654e-324;
        }
        FN(land_group)(layout, tree, num_valid, v, g, out_index + k0, out_priority + k0);
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

    double v[RP_DESCENT_GROUP];
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
            v[q] = mass + (a > 0 ? cut[a - 1] : 0.0);
        }
        FN(descend)(layout, tree, v, g, out_index + k0);
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

double FN(rp_sumtree_zeroed_query)(const rp_segtree_layout *layout, const SCALAR *tree,
                                   const rp_segtree_zeroed *z, int64_t l, int64_t r) {
    const int64_t size = layout->size;
    SCALAR e[RP_SEGTREE_FANOUT];
    if (l < 0) l = 0;
    if (r > size) r = size;
    if (l >= r) return 0.0;
    if (l == 0 && r == size) { /* root_total: the root's prefix sums, stored or not, are these */
        SCALAR prefix[RP_SEGTREE_FANOUT];
        FN(zeroed_node)(layout, tree, z, layout->top, 0, e);
        FN(scalar_prefix)(e, prefix);
        return (double)prefix[RP_SEGTREE_FANOUT - 1];
    }
    /* FN(query)'s climb, each partial node read from Z (range_sum's order relative to its start) */
    double acc = 0.0;
    int64_t a = l, b = r;
    for (int64_t t = 0; a < b; t++) {
        if (t == layout->top || (a >> 4) == ((b - 1) >> 4)) {
            FN(zeroed_node)(layout, tree, z, t, a >> 4, e);
            acc += FN(range_sum)(e, a & 15, (a & 15) + (b - a));
            break;
        }
        if (a & 15) {
            FN(zeroed_node)(layout, tree, z, t, a >> 4, e);
            acc += FN(range_sum)(e, a & 15, RP_SEGTREE_FANOUT);
            a = (a >> 4) + 1;
        } else {
            a >>= 4;
        }
        if (b & 15) {
            FN(zeroed_node)(layout, tree, z, t, b >> 4, e);
            acc += FN(range_sum)(e, 0, b & 15);
        }
        b >>= 4;
    }
    return acc;
}

/* FN(descend) of one mass v > 0 in Z: the same comparisons on the same prefix sums. */
static int64_t FN(zeroed_descend)(const rp_segtree_layout *layout, const SCALAR *tree,
                                  const rp_segtree_zeroed *z, double v) {
    int64_t node = 0;
    for (int64_t t = layout->top; t >= 0; t--) {
        SCALAR e[RP_SEGTREE_FANOUT], computed[RP_SEGTREE_FANOUT];
        FN(zeroed_node)(layout, tree, z, t, node, e);
        const SCALAR bound = FN(round_down)(v);
        int child = FN(count_below_computed)(e, bound, computed);
        if (RP_UNLIKELY(child == RP_SEGTREE_FANOUT)) {
            child = RP_SEGTREE_FANOUT - 1;
            while (child > 0 && !(e[child] > 0)) child--;
            v = (double)e[child];
        } else if (child > 0) {
            v = v - (double)computed[RP_COMPUTED_AT(child - 1)];
        }
        node = RP_SEGTREE_FANOUT * node + child;
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
    const double total = FN(rp_sumtree_zeroed_query)(layout, tree, z, 0, layout->size);
    const int64_t *exclude = z->index[0];
    const int64_t m = z->n[0];
    for (int64_t k = 0; k < n; k++) {
        /* scan_lower_bound's rule on the mass rounded to the tree's dtype */
        const double x = (double)(SCALAR)mass[k];
        int64_t i = x <= 0 ? 0 : x > total ? layout->size : FN(zeroed_descend)(layout, tree, z, x);
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
#undef RP_COMPUTED_AT
#undef FN
#undef RP_CAT
#undef RP_CAT_
