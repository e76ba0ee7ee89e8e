/* Segment trees: layout set-up here, the fp32 and fp64 kernels from one body, segtree_impl.h. */
#include <float.h>
#include <math.h>

#include "segtree.h"

int rp_segtree_layout_init(rp_segtree_layout *layout, int64_t size, bool with_prefix) {
    if (size < 0 || size > (INT64_MAX / 4)) return RP_ERR_VALUE;
    memset(layout, 0, sizeof(*layout));
    layout->size = size;
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
    return RP_OK;
}

#define SCALAR float
#define SUFFIX f32
#define SCALAR_MAX FLT_MAX
#include "segtree_impl.h"
#undef SCALAR
#undef SUFFIX
#undef SCALAR_MAX

#define SCALAR double
#define SUFFIX f64
#define SCALAR_MAX DBL_MAX
#include "segtree_impl.h"
#undef SCALAR
#undef SUFFIX
#undef SCALAR_MAX
