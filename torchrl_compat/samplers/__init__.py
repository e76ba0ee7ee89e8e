"""Samplers for composable replay buffers: a drop-in for ``torchrl.data.replay_buffers.samplers``.

The classes have the followed torchrl release's names, signatures, defaults, properties, info dictionaries,
``state_dict`` / ``dumps`` / ``loads`` formats and error messages, and work with any
storage that follows torchrl's storage API (duck typing, as torchrl's samplers do).

On CPU the index computations run in ``replay``'s kernels; on an accelerator they run as
torch ops on the storage's device (:mod:`torchrl_compat._torch_ops.slices`). :class:`PrioritizedSampler` keeps
its priorities in segment trees chosen by device (:mod:`torchrl_compat.samplers._trees`): ``replay``'s
compiled trees on CPU, trees made of torch ops on accelerators.
"""
from __future__ import annotations

from .._releases import since

from ._common import (
    _EMPTY_STORAGE_ERROR as _EMPTY_STORAGE_ERROR,
    _CPU as _CPU,
    _TENSOR_STORAGES as _TENSOR_STORAGES,
    _STORAGE_ENSEMBLES as _STORAGE_ENSEMBLES,
    _PLAIN_RAND_GIVEN_NDIM as _PLAIN_RAND_GIVEN_NDIM,
    _replace_last as _replace_last,
    _on_cpu as _on_cpu,
    _gen_device as _gen_device,
    _rand as _rand,
    _randint as _randint,
    _as_long as _as_long,
    _randperm as _randperm,
)
from .base import (
    Sampler,
)
from .random import (
    _random_sample_outside_graph as _random_sample_outside_graph,
    RandomSampler,
    SamplerWithoutReplacement,
    ConsumingSampler,
)
from .prioritized import (
    SumSegmentTreeFp32,
    MinSegmentTreeFp32,
    SumSegmentTreeFp64,
    MinSegmentTreeFp64,
    PrioritizedSampler,
)
from .slice import (
    _SLICE_SAMPLING_STEPS as _SLICE_SAMPLING_STEPS,
    _PLAIN_SLICE_SAMPLING as _PLAIN_SLICE_SAMPLING,
    _plain_slice_sampling as _plain_slice_sampling,
    SliceSampler,
)
from .slice_without_replacement import (
    SliceSamplerWithoutReplacement,
)
from .prioritized_slice import (
    PrioritizedSliceSampler,
)
from .ensemble import (
    SamplerEnsemble,
)
from .base import _REPLACEMENT_DISPATCH, _SamplerMeta as _SamplerMeta

_REPLACEMENT_DISPATCH.update({
    RandomSampler: SamplerWithoutReplacement,
    SliceSampler: SliceSamplerWithoutReplacement,
})

__all__ = [
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "RandomSampler",
    "Sampler",
    "SamplerEnsemble",
    "SamplerWithoutReplacement",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
]
# torchrl 0.14 adds the sampler behind ``consume_after_n_samples``
if since("buffer_consume_after_n_samples"):
    __all__.append("ConsumingSampler")

# Classes and functions keep the module path they had before the split, so pickles and
# torchrl-style ``__module__`` lookups find them here.
for _export in (
    _EMPTY_STORAGE_ERROR,
    _CPU,
    _TENSOR_STORAGES,
    _STORAGE_ENSEMBLES,
    _PLAIN_RAND_GIVEN_NDIM,
    _replace_last,
    _on_cpu,
    _gen_device,
    _rand,
    _randint,
    _as_long,
    _randperm,
    Sampler,
    _random_sample_outside_graph,
    RandomSampler,
    SamplerWithoutReplacement,
    ConsumingSampler,
    SumSegmentTreeFp32,
    MinSegmentTreeFp32,
    SumSegmentTreeFp64,
    MinSegmentTreeFp64,
    PrioritizedSampler,
    _SLICE_SAMPLING_STEPS,
    _PLAIN_SLICE_SAMPLING,
    _plain_slice_sampling,
    SliceSampler,
    SliceSamplerWithoutReplacement,
    PrioritizedSliceSampler,
    SamplerEnsemble,
):
    if getattr(_export, "__module__", "").startswith(__name__ + "."):
        _export.__module__ = __name__
del _export
