/* Segment trees; see segtree.h. */
#include "segtree.h"
