"""The torch-op twins of ``replay``'s kernels: what runs where the data is on an accelerator.

Each module here computes what a Cython kernel computes on CPU tensors, with plain torch ops
on the tensors' device, and runs on CPU tensors too, where the tests check it against the
kernels: :mod:`.sumtree` (sum and min trees), :mod:`.slices` (trajectory starts, stops and
slices) and :mod:`.checks` (input checks deferred on the device until a later call reads them).
"""
