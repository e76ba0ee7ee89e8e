/* Without-replacement permutations; see perm.h. */
#include "perm.h"
