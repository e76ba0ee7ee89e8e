/* Trajectory slice-start computation. Must match replay.pxd (the "slices.h" extern block). */
#ifndef RP_SLICES_H
#define RP_SLICES_H

#include "rp_common.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* RP_SLICES_H */
