/* Sum and min segment trees over fp32 / fp64 leaves, in a cache-friendly 16-ary layout.
 * Must match replay.pxd (the "segtree.h" extern block).
 *
 * Layout. All levels live in one caller-owned buffer of `rp_segtree_layout.total` scalars,
 * 64-byte aligned by the caller. Level 0 holds the leaves; entry j of level t+1 holds the
 * reduction (sum or min) of the 16 entries 16j .. 16j+15 of level t, which form one "node".
 * Each level is padded with the identity to a multiple of 16 entries, so a node is a 64-byte
 * (fp32) or 128-byte (fp64) run of memory, and the top level is a single node (the root).
 *
 *   level 2 (root)  [ r0                r1 ... r15 ]
 *                     |                  \
 *   level 1         [ n0 n1 ... n15 ] [ n16 ... n31 ] ...      n_j = reduce(leaves 16j..16j+15)
 *                     |  \
 *   level 0         [ x0 .. x15 ] [ x16 .. x31 ] ...           the leaves x_i (= `size` of them)
 *
 * A descent reads one node per level: log16(size) + 1 cache lines instead of the log2(size)
 * lines of the binary heap layout (`capacity + i`, parent `j / 2`), and the top levels stay
 * in L1/L2.
 *
 * torchrl's arithmetic, bit for bit. torchrl's sum tree is that binary heap: capacity the
 * smallest power of two above size, node j = values[2j] + values[2j + 1] in the tree's dtype,
 * the leaves past size 0. An entry of level t is exactly its binary node 4t levels above the
 * leaves: every parent entry is the balanced pairwise sum of its 16 children in the tree's
 * dtype, (((e0 + e1) + (e2 + e3)) + ((e4 + e5) + (e6 + e7))) + (...), the additions of the
 * four binary levels in between (the padding entries are 0, as torchrl's are, and x + 0 = x).
 * The tree is thus a pure function of its leaves, whatever the history of updates. Sums and
 * descents read torchrl's binary nodes from this layout, so they are torchrl's:
 *  - a sum tree keeps, for each node of the levels from RP_SEGTREE_PREFIX_FROM up, its binary
 *    mini-heap: the 15 binary nodes between its 16 entries and their parent, in heap order in
 *    16 slots (H below; slot 0 unused), recomputed with the entries. Below that level they are
 *    summed from the entries when read (the same additions, so the same bits);
 *
 *      level t entries  [ e0  e1  e2  e3  ...  e14  e15 ]
 *      its mini-heap H  [ -  total  o0 o1  q0 .. q3  p0 .. p7 ]   p_i = e_2i + e_2i+1,
 *                                                                 q_i = p_2i + p_2i+1, ...
 *  - scan_lower_bound is torchrl's ScanLowerBound: `size` past the root, else from torchrl's
 *    root (height log2(capacity): inside the root node, or its total) 4 binary steps a level,
 *    going right and subtracting the left child whenever the remainder exceeds it, compare and
 *    subtraction in the tree's dtype;
 *  - query(l, r) is torchrl's Query: the root for the whole tree, else its bottom-up loop over
 *    binary heap indices, adding each binary node in its order.
 * (Min trees keep no mini-heaps: a min is exact in any order.)
 *
 * Every function taking `index` checks 0 <= index < size first and writes nothing on error. */
#ifndef RP_SEGTREE_H
#define RP_SEGTREE_H

#include "rp_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RP_SEGTREE_FANOUT 16
#define RP_SEGTREE_MAX_LEVELS 17 /* 16^16 = 2^64 leaves */
#ifndef RP_SEGTREE_PREFIX_FROM
#define RP_SEGTREE_PREFIX_FROM 2 /* the lowest level that keeps mini-heaps */
#endif

typedef struct {
    int64_t size;                                 /* number of leaves */
    int64_t top;                                  /* index of the root level (0 when size <= 16) */
    int64_t capacity;                             /* torchrl's: the smallest power of two > size */
    int64_t height;                               /* log2(capacity): torchrl's root's height */
    int64_t total;                                /* scalars in the whole buffer */
    int64_t offset[RP_SEGTREE_MAX_LEVELS];        /* start of each level in the buffer */
    int64_t length[RP_SEGTREE_MAX_LEVELS];        /* entries of each level (a multiple of 16) */
    int64_t prefix[RP_SEGTREE_MAX_LEVELS];        /* start of each level's mini-heaps, or -1 */
    int64_t ready;                                /* leaves [0, ready) are in memory: the others
                                                     (a large min tree's, until first written)
                                                     are the identity, like every entry above
                                                     them, and no kernel reads them */
} rp_segtree_layout;

/* Fill *layout for `size` leaves (size >= 0), and torchrl's capacity and height for them. With
 * `with_prefix` (sum trees), every level from RP_SEGTREE_PREFIX_FROM up also keeps, beside its
 * entries, each node's binary mini-heap. Returns RP_OK, or RP_ERR_VALUE when size is negative
 * or too large. O(log size). */
int rp_segtree_layout_init(rp_segtree_layout *layout, int64_t size, bool with_prefix);

/* A sum tree seen with some leaves set to zero (Z), without writing it: for each level t,
 * the n[t] entries of Z that differ from the tree's, at the strictly increasing positions
 * index[t], with the values value[t] (NULL at level 0: the zeroed leaves themselves). Built by
 * rp_sumtree_zeroed_build_*, it points into the caller's exclude list and scratch, and holds
 * while the tree is not written. */
typedef struct {
    int64_t n[RP_SEGTREE_MAX_LEVELS];
    const int64_t *index[RP_SEGTREE_MAX_LEVELS];
    const double *value[RP_SEGTREE_MAX_LEVELS];
} rp_segtree_zeroed;

/* The scratch (int64 positions and as many doubles) rp_sumtree_zeroed_build_* needs for
 * n_exclude zeroed leaves: at most min(n_exclude, entries) changed entries a level. O(log size). */
int64_t rp_segtree_zeroed_scratch(const rp_segtree_layout *layout, int64_t n_exclude);

#define RP_SEGTREE_DECLARE(SCALAR, SUFFIX)                                                        \
    /* out[k] = leaf index[k]; RP_ERR_INDEX with *bad = k when out of range. O(n). */            \
    int rp_segtree_get_##SUFFIX(const rp_segtree_layout *layout, const SCALAR *tree,             \
                                const int64_t *index, int64_t n, SCALAR *out, int64_t *bad);     \
    /* Recompute every level above the leaves. O(size). */                                       \
    void rp_sumtree_build_##SUFFIX(const rp_segtree_layout *layout, SCALAR *tree);               \
    void rp_mintree_build_##SUFFIX(const rp_segtree_layout *layout, SCALAR *tree);               \
    /* Check leaves (sum: finite and >= 0; min: not NaN); RP_ERR_VALUE, *bad = position. O(n). */\
    int rp_sumtree_check_##SUFFIX(const SCALAR *value, int64_t n, int64_t *bad);                 \
    int rp_mintree_check_##SUFFIX(const SCALAR *value, int64_t n, int64_t *bad);                 \
    /* Set leaf index[k] to value[k * value_stride] for k < n (value_stride 0 broadcasts one     \
     * value; a repeated index keeps its last value), then refresh the parents, each once per    \
     * batch where the batch is dense. Consecutive leaves (index[k] == index[0] + k: a block of   \
     * priorities) are copied node by node and their parents refreshed once each, in one pass;  \
     * a small sparse batch prefetches every parent it will write on the large levels first.    \
     * Checks every index and value first: on error writes                                       \
     * nothing, sets *bad = k and returns RP_ERR_INDEX or RP_ERR_VALUE.                          \
     * O(n log16 size), and O(size) at most; O(n + 16 log16 size) for consecutive leaves.        \
     * A sum tree also refuses a batch after which its total would not be finite (each leaf      \
     * finite, their sum not: two fp32 leaves of 2e38): RP_ERR_TOTAL, *bad = -1, tree unchanged. \
     * When every new value is below (half the dtype's largest value - the current total) / n,  \
     * that cannot happen (checked in the validation pass); otherwise the old leaves are saved  \
     * in `saved` (n scalars, caller's scratch), the batch is written, and the old leaves are    \
     * put back if the total overflowed                                                          \
     * (parents are a pure function of the leaves, so the tree is then as it was, bit for bit).  \
     * The min-tree update has no `saved`: a min of finite values is finite. */                  \
    int rp_sumtree_update_##SUFFIX(const rp_segtree_layout *layout, SCALAR *tree,                \
                                   const int64_t *index, const SCALAR *value,                    \
                                   int64_t value_stride, int64_t n, SCALAR *saved, int64_t *bad); \
    int rp_mintree_update_##SUFFIX(const rp_segtree_layout *layout, SCALAR *tree,                \
                                   const int64_t *index, const SCALAR *value,                    \
                                   int64_t value_stride, int64_t n, int64_t *bad);               \
    /* Sum (min) of leaves [l, r); the identity when l >= r. A sum is torchrl's Query in the    \
     * tree's dtype (l, r clamped to [0, capacity]; the root when l <= 0 and r >= size),        \
     * O(log2 capacity); a min clamps r to size, O(16 log16 size). */                          \
    double rp_sumtree_query_##SUFFIX(const rp_segtree_layout *layout, const SCALAR *tree,        \
                                     int64_t l, int64_t r);                                      \
    double rp_mintree_query_##SUFFIX(const rp_segtree_layout *layout, const SCALAR *tree,        \
                                     int64_t l, int64_t r);                                      \
    /* Batched query: out[k] = query(l[k], r[k]). O(n log16 size). */                            \
    void rp_sumtree_query_batch_##SUFFIX(const rp_segtree_layout *layout, const SCALAR *tree,    \
                                         const int64_t *l, const int64_t *r, int64_t n,          \
                                         double *out);                                           \
    void rp_mintree_query_batch_##SUFFIX(const rp_segtree_layout *layout, const SCALAR *tree,    \
                                         const int64_t *l, const int64_t *r, int64_t n,          \
                                         double *out);                                           \
    /* out[k] = torchrl's ScanLowerBound(value[k]), bit for bit: `size` when value[k] exceeds   \
     * the root, 0 when value[k] <= 0, else its binary descent, which rounding can end on a      \
     * zero-valued leaf, or on a padding leaf in [size, capacity), as torchrl's does. NaN:       \
     * RP_ERR_VALUE with *bad = k, nothing written. Descents run interleaved, 32 at a time,      \
     * with prefetch, branch-free. O(n log2 capacity). */                                       \
    int rp_sumtree_scan_lower_bound_##SUFFIX(const rp_segtree_layout *layout, const SCALAR *tree, \
                                             const SCALAR *value, int64_t n, int64_t *out,       \
                                             int64_t *bad);                                      \
    /* Fused prioritized sampling: mass_k = uniform[k] * query(0, mass_end) in double, rounded  \
     * to the tree's dtype (numpy's uniform(0, p_sum) as torchrl's tree takes it), descend as    \
     * scan_lower_bound does, clamp to num_valid - 1, and move off a zero-valued leaf to the     \
     * nearest positive one on its left (else on its right, below num_valid), as torchrl's       \
     * PrioritizedSampler steps left. 1 <= num_valid <= mass_end <= size; the                    \
     * two differ when a storage is longer than torchrl's tree: the mass then spans every leaf  \
     * and the draws are clamped to the storage, as torchrl's PrioritizedSampler does.           \
     * Writes out_index[k], out_priority[k] and, when out_weight is not NULL,                    \
     * out_weight[k] = (priority / p_min) ** -beta. Returns RP_ERR_EMPTY when no leaf of          \
     * [0, num_valid) is positive, RP_ERR_INDEX when num_valid or mass_end is out of range       \
     * (*bad = num_valid), RP_ERR_VALUE when a draw is outside [0, 1] or NaN (*bad = k);         \
     * nothing written on error. O(n log2 capacity). */                                          \
    int rp_sumtree_sample_##SUFFIX(const rp_segtree_layout *layout, const SCALAR *tree,          \
                                   int64_t mass_end, int64_t num_valid, const double *uniform,   \
                                   int64_t n, double p_min, double beta, int64_t *out_index,     \
                                   SCALAR *out_priority, double *out_weight, int64_t *bad);      \
    /* rp_sumtree_sample from given prefix masses: draw k lands where mass[k] falls, mass[k]     \
     * being rounded to the tree's precision first (as scan_lower_bound takes its values), which \
     * lets the caller draw the masses as torchrl's PrioritizedSampler does (numpy's or torch's  \
     * RNG, scaled by the sum): torchrl's draws, bit for bit. A mass at or below 0 lands on     \
     * leaf 0, one past the root on `size` (then clamped and moved as in rp_sumtree_sample; where \
     * torchrl would step left of leaf 0, this takes the first positive leaf on the right). NaN: \
     * RP_ERR_VALUE with *bad = k; other return codes as rp_sumtree_sample; nothing written on   \
     * error. O(n log2 capacity). */                                                             \
    int rp_sumtree_sample_masses_##SUFFIX(const rp_segtree_layout *layout, const SCALAR *tree,   \
                                          int64_t mass_end, int64_t num_valid,                   \
                                          const double *mass, int64_t n, double p_min,           \
                                          double beta, int64_t *out_index, SCALAR *out_priority, \
                                          double *out_weight, int64_t *bad);                     \
    /* rp_sumtree_sample with the leaves exclude[0, n_exclude) treated as zero for this call      \
     * only (the tree is not modified): mass_k = uniform[k] * (sum of the other leaves of          \
     * [0, mass_end)), and a draw never lands on an excluded or zero-valued leaf. `exclude` is    \
     * strictly increasing in [0, mass_end); `scratch` holds at least 3 * n_exclude doubles      \
     * (two per run of consecutive excluded leaves, and the run's first position as an int64).    \
     * Returns RP_ERR_INDEX with *bad = r for a bad exclude[r] (*bad = -1 when num_valid or      \
     * mass_end is out of range), RP_ERR_VALUE for a bad draw (*bad = k) or a short scratch     \
     * (*bad = -1), RP_ERR_EMPTY when no allowed leaf of [0, num_valid) is positive; nothing      \
     * written on error.                                                                          \
     * O(n_exclude + runs * 16 log16 size + n * (log runs + 16 log16 size)), where runs is the    \
     * number of runs of consecutive excluded leaves; a draw stepping off a zero leaf may pay     \
     * O(log n_exclude * log16 size) per excluded leaf it passes.                                 \
     * Exclusion by mass offsets: with A_R the allowed mass before run R and X_R the excluded     \
     * mass up to its end, a draw in (A_{R-1}, A_R] lies between runs R-1 and R and is the        \
     * unmasked draw of mass + X_{R-1}. */                                                        \
    int rp_sumtree_sample_exclude_##SUFFIX(const rp_segtree_layout *layout, const SCALAR *tree, \
                                           int64_t mass_end, int64_t num_valid,                  \
                                           const int64_t *exclude,                               \
                                           int64_t n_exclude, const double *uniform, int64_t n,  \
                                           double p_min, double beta, double *scratch,           \
                                           int64_t scratch_len, int64_t *out_index,              \
                                           SCALAR *out_priority, double *out_weight, int64_t *bad); \
    /* Z, the tree with the leaves exclude[0, n_exclude) (strictly increasing, in [0, size))     \
     * set to zero, as its ancestors' entries: each changed parent is node_sum of its children   \
     * with the changes applied, as a write of zeros would store it. index_buf / value_buf hold   \
     * buf_len entries (rp_segtree_zeroed_scratch). RP_ERR_INDEX with *bad = r for a bad          \
     * exclude[r]; RP_ERR_VALUE (*bad = -1) for a short scratch. Reads the tree only.             \
     * O(n_exclude + 16 * changed entries).                                                      \
     * rp_sumtree_zeroed_query: query(l, r) of Z, bit for bit (O(16 log2 capacity log n_exclude)).\
     * rp_sumtree_zeroed_sample_masses: the draws torchrl's slice sampler makes on Z with the    \
     * prefix masses mass[0, n) (rounded to the tree's dtype as scan_lower_bound takes them):    \
     * scan_lower_bound's leaf (0 for a mass <= 0, size past Z's total), clamped to              \
     * num_valid - 1, moved left to the nearest positive leaf of Z (right when there is none).   \
     * Writes out_index and out_priority (the leaf values); RP_ERR_VALUE for a NaN mass          \
     * (*bad = k), RP_ERR_EMPTY when no positive leaf of Z lies below num_valid, RP_ERR_INDEX     \
     * when num_valid is outside [1, size]. O(n * 16 log16 size log n_exclude). */               \
    int rp_sumtree_zeroed_build_##SUFFIX(const rp_segtree_layout *layout, const SCALAR *tree,    \
                                         const int64_t *exclude, int64_t n_exclude,              \
                                         int64_t *index_buf, double *value_buf, int64_t buf_len, \
                                         rp_segtree_zeroed *z, int64_t *bad);                    \
    double rp_sumtree_zeroed_query_##SUFFIX(const rp_segtree_layout *layout, const SCALAR *tree, \
                                            const rp_segtree_zeroed *z, int64_t l, int64_t r);   \
    int rp_sumtree_zeroed_sample_masses_##SUFFIX(const rp_segtree_layout *layout,                \
                                                 const SCALAR *tree, const rp_segtree_zeroed *z, \
                                                 int64_t num_valid, const double *mass,          \
                                                 int64_t n, int64_t *out_index,                  \
                                                 SCALAR *out_priority, int64_t *bad);            \
    /* Check a prioritized-replay update before it is written: index[k] (k < n) is a leaf in      \
     * [0, size) or negative (an item to skip: writers mark those with -1), and priority[k *      \
     * priority_stride] (stride 0 broadcasts one value) is finite and >= 0 wherever index[k] is   \
     * kept. Sets *skipped to the number of negative indices and *argmax to the first kept k with  \
     * the largest priority (-1 when nothing is kept). Returns RP_OK, or RP_ERR_INDEX /           \
     * RP_ERR_VALUE with *bad = k. Reads only; O(n). */                                          \
    int rp_priority_scan_##SUFFIX(const int64_t *index, int64_t n, int64_t size,                 \
                                  const SCALAR *priority, int64_t priority_stride,               \
                                  int64_t *skipped, int64_t *argmax, int64_t *bad);              \
    /* Set the leaves of n_ranges ranges [bounds[2r], bounds[2r + 1]) to one value, then refresh  \
     * their parents, each once: the rows of a round-robin write (one range, two when it wraps)   \
     * given one priority, with no index array to scatter through. Checks every range            \
     * (0 <= start <= stop <= size) and the value (sum: finite and >= 0; min: not NaN) first: on  \
     * error writes nothing and returns RP_ERR_INDEX (*bad = r, the range) or RP_ERR_VALUE       \
     * (*bad = 0). A sum tree also refuses a fill after which its total would not be finite:      \
     * RP_ERR_TOTAL, *bad = -1, tree unchanged (when the value is near the dtype's limit, the old \
     * leaves are saved in `saved`, saved_len scalars of caller scratch, at least the ranges'    \
     * total length; RP_ERR_VALUE with *bad = -1 when it is shorter). Overlapping ranges are     \
     * written once each. O(total length + n_ranges * 16 log16 size): a range of m leaves        \
     * refreshes m / 16 + 1 nodes of level 1, m / 256 + 2 of level 2, and so on up. */           \
    int rp_sumtree_fill_ranges_##SUFFIX(const rp_segtree_layout *layout, SCALAR *tree,           \
                                        const int64_t *bounds, int64_t n_ranges, SCALAR value,   \
                                        SCALAR *saved, int64_t saved_len, int64_t *bad);         \
    int rp_mintree_fill_ranges_##SUFFIX(const rp_segtree_layout *layout, SCALAR *tree,           \
                                        const int64_t *bounds, int64_t n_ranges, SCALAR value,   \
                                        int64_t *bad);

/* Split index[0..n) into runs of consecutive values (index[k + 1] == index[k] + 1), writing
 * the [start, stop) bounds of run r to bounds[2r], bounds[2r + 1] (2 * max_runs int64, caller's)
 * and their number to *n_runs: a round-robin writer's rows are one run, or two when they wrap,
 * which rp_*tree_fill_ranges then writes without an index array. Returns RP_OK, or RP_ERR_INDEX
 * with *bad = k, the position where a run that does not fit starts (a run past the max_runs-th,
 * or one ending at INT64_MAX, whose stop cannot be written); *n_runs and bounds are then
 * unspecified. Reads only; O(n). */
int rp_segtree_index_runs(const int64_t *index, int64_t n, int64_t max_runs, int64_t *bounds,
                          int64_t *n_runs, int64_t *bad);

RP_SEGTREE_DECLARE(float, f32)
RP_SEGTREE_DECLARE(double, f64)

#undef RP_SEGTREE_DECLARE

#ifdef __cplusplus
}
#endif
#endif /* RP_SEGTREE_H */
