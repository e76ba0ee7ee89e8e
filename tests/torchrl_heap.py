"""A plain numpy model of torchrl's compiled sum tree (``torchrl/csrc/segment_tree.h``), every
addition and comparison in the tree's dtype, step by step.

torchrl's tree is a binary heap: ``capacity`` is the smallest power of two strictly greater
than ``size``, leaf ``i`` sits at ``capacity + i``, node ``j`` holds ``values[2j] +
values[2j + 1]`` (in the dtype), and the leaves past ``size`` are 0. ``query(l, r)`` returns the
root when ``l <= 0`` and ``r >= size``, else sums bottom-up; ``scan_lower_bound(v)`` gives
``size`` when ``v`` exceeds the root, else walks down, going right (and subtracting the left
child) whenever the remainder exceeds the left child. Written from that description, not from
torchrl's code.
"""
import numpy as np


class BinaryHeapSumTree:
    def __init__(self, leaves, size=None, dtype=np.float32):
        leaves = np.asarray(leaves)
        self.dtype = np.dtype(dtype)
        self.size = len(leaves) if size is None else size
        self.capacity = 1
        while self.capacity <= self.size:
            self.capacity <<= 1
        assert len(leaves) <= self.capacity
        self.values = np.zeros(2 * self.capacity, dtype=self.dtype)
        self.values[self.capacity:self.capacity + len(leaves)] = leaves.astype(self.dtype)
        # level by level: node j = values[2j] + values[2j + 1], an elementwise dtype addition
        lo = self.capacity // 2
        while lo >= 1:
            self.values[lo:2 * lo] = self.values[2 * lo:4 * lo:2] + self.values[2 * lo + 1:4 * lo:2]
            lo //= 2

    @property
    def root(self):
        return self.values[1]

    def leaf(self, i):
        return self.values[self.capacity + i]

    def query(self, l, r):
        """torchrl's Query(l, r), with r clamped to capacity (indices formed with +)."""
        l, r = max(l, 0), min(r, self.capacity)
        if l >= r:
            return self.dtype.type(0)
        if l <= 0 and r >= self.size:
            return self.values[1]
        ret = self.dtype.type(0)
        l += self.capacity
        r += self.capacity
        while l < r:
            if l & 1:
                ret = ret + self.values[l]
                l += 1
            if r & 1:
                r -= 1
                ret = ret + self.values[r]
            l >>= 1
            r >>= 1
        return ret

    def scan_lower_bound(self, values):
        """torchrl's ScanLowerBound of every value (cast to the dtype first), vectorised over
        the values: each lane takes the same steps as the scalar loop."""
        cur = np.asarray(values).astype(self.dtype).reshape(-1).copy()
        index = np.ones(cur.shape, dtype=np.int64)
        past = cur > self.values[1]
        while index[0] < self.capacity if index.size else False:
            index <<= 1
            left = self.values[index]
            right = cur > left
            cur = np.where(right, cur - left, cur)
            index |= right
        out = index ^ self.capacity
        out[past] = self.size
        return out

    def draws(self, masses, num_valid):
        """torchrl's PrioritizedSampler steps after its masses: scan, clamp to num_valid - 1,
        step left while the leaf is 0 (-1 where it runs off the left end)."""
        index = np.minimum(self.scan_lower_bound(masses), num_valid - 1)
        for k in range(index.shape[0]):
            while index[k] >= 0 and self.leaf(int(index[k])) == 0:
                index[k] -= 1
        return index
