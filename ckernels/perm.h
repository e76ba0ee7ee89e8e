/* Without-replacement permutations. Must match replay.pxd (the "perm.h" extern block). */
#ifndef RP_PERM_H
#define RP_PERM_H

#include "rp_common.h"
#include "prng.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* RP_PERM_H */
