/* Sum and min segment trees over fp32 / fp64 leaves. Must match replay.pxd. */
#ifndef RP_SEGTREE_H
#define RP_SEGTREE_H

#include "rp_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* RP_SEGTREE_H */
