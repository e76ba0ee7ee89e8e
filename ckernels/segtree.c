/* Segment trees: layout set-up here, the fp32 and fp64 kernels from one body, segtree_impl.h. */
#include <float.h>
#include <math.h>

#include "segtree.h"

int rp_segtree_layout_init(rp_segtree_layout *layout, int64_t size, bool with_prefix) {
    if (size < 0 || size > (INT64_MAX / 4)) return RP_ERR_VALUE;
    memset(layout, 0, sizeof(*layout));
    layout->size = size;
    layout->capacity = 1;
    while (layout->capacity <= size) {
        layout->capacity <<= 1;
        layout->height++;
    }
    int64_t entries = size > 0 ? size : 1;
    int64_t offset = 0;
    int64_t t = 0;
    for (;;) {
        const int64_t length = (entries + RP_SEGTREE_FANOUT - 1) / RP_SEGTREE_FANOUT * RP_SEGTREE_FANOUT;
        layout->offset[t] = offset;
        layout->length[t] = length;
        offset += length;
        if (length == RP_SEGTREE_FANOUT) break;
        entries = length / RP_SEGTREE_FANOUT;
        t++;
    }
    layout->top = t;
    layout->prefix[0] = -1;
    for (int64_t level = 1; level <= t; level++) {
        const bool keep = with_prefix && level >= RP_SEGTREE_PREFIX_FROM;
        layout->prefix[level] = keep ? offset : -1;
        if (keep) offset += layout->length[level];
    }
    layout->total = offset;
    layout->ready = layout->length[0];
    return RP_OK;
}

int64_t rp_segtree_zeroed_scratch(const rp_segtree_layout *layout, int64_t n_exclude) {
    int64_t total = 0, bound = n_exclude > 0 ? n_exclude : 0;
    for (int64_t t = 1; t <= layout->top; t++) {
        if (bound > layout->length[t]) bound = layout->length[t];
        total += bound;
    }
    return total;
}

int rp_segtree_index_runs(const int64_t *index, int64_t n, int64_t max_runs, int64_t *bounds,
                          int64_t *n_runs, int64_t *bad) {
    int64_t runs = 0;
    for (int64_t k = 0; k < n;) {
        const int64_t start = index[k];
        /* index[j] == start + (j - k) along the run: compares that do not depend on each other */
        int64_t j = k + 1;
        while (j < n && start <= INT64_MAX - (j - k) && index[j] == start + (j - k)) j++;
        const int64_t last = index[j - 1];
        if (RP_UNLIKELY(runs == max_runs || last == INT64_MAX)) {
            *bad = k;
            return RP_ERR_INDEX;
        }
        bounds[2 * runs] = start;
        bounds[2 * runs + 1] = last + 1;
        runs++;
        k = j;
    }
    *n_runs = runs;
    return RP_OK;
}

/* 16-byte vectors for the descent's branch-free steps (see step in segtree_impl.h); other
 * compilers (and -DRP_PORTABLE) take the scalar select. */
#if RP_GNU_EXTENSIONS
typedef float rp_v4f __attribute__((vector_size(16)));
typedef int32_t rp_v4i __attribute__((vector_size(16)));
typedef double rp_v2d __attribute__((vector_size(16)));
typedef int64_t rp_v2l __attribute__((vector_size(16)));
#define RP_HAVE_VECTORS 1
#endif

#define SCALAR float
#define SUFFIX f32
#define SCALAR_MAX FLT_MAX
#ifdef RP_HAVE_VECTORS
#define RP_SEGTREE_VECTOR rp_v4f
#define RP_SEGTREE_MASK rp_v4i
#endif
#include "segtree_impl.h"
#undef SCALAR
#undef SUFFIX
#undef SCALAR_MAX
#undef RP_SEGTREE_VECTOR
#undef RP_SEGTREE_MASK

#define SCALAR double
#define SUFFIX f64
#define SCALAR_MAX DBL_MAX
#ifdef RP_HAVE_VECTORS
#define RP_SEGTREE_VECTOR rp_v2d
#define RP_SEGTREE_MASK rp_v2l
#endif
#include "segtree_impl.h"
#undef SCALAR
#undef SUFFIX
#undef SCALAR_MAX
#undef RP_SEGTREE_VECTOR
#undef RP_SEGTREE_MASK
