/* Trajectory slice starts and stops; see slices.h. */
#include "slices.h"
