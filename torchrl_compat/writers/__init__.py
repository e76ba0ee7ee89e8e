"""Writers for composable replay buffers (stand-in for ``torchrl.data.replay_buffers.writers``).

A writer decides where each new item goes in the storage, writes it there and tells the
entities attached to the storage (the buffers, hence their samplers) which indices
changed. The classes have the followed torchrl release's names, signatures, defaults,
``state_dict`` / ``dumps`` / ``loads`` formats and errors (see :mod:`torchrl_compat._releases`:
from torchrl 0.14 on, round-robin writers save their write count and can track slot
generations), and work with our storages and torchrl's.

.. note:: When torchrl is importable (and ``TORCHRL_COMPAT_STANDALONE`` is not ``"1"``)
    every class here also lists its torchrl twin as its last base, so that torchrl's
    buffers accept it; no torchrl code runs on it.
"""
from __future__ import annotations

from .base import (
    _notify as _notify,
    _notify_outside_graph as _notify_outside_graph,
    _mark_updated as _mark_updated,
    _counter as _counter,
    _Counter as _Counter,
    WRITER_METADATA_FILE,
    TOP_VALUES_FILE,
    _dump_json as _dump_json,
    _read_metadata as _read_metadata,
    _batch_len as _batch_len,
    Writer,
    ImmutableDatasetWriter,
)
from .round_robin import (
    RoundRobinWriter,
    TensorDictRoundRobinWriter,
)
from .max_value import (
    TensorDictMaxValueWriter,
)
from .ensemble import (
    WriterEnsemble,
)

__all__ = [
    "ImmutableDatasetWriter",
    "RoundRobinWriter",
    "TensorDictMaxValueWriter",
    "TensorDictRoundRobinWriter",
    "Writer",
    "WriterEnsemble",
]

# Classes and functions keep the module path they had before the split, so pickles and
# torchrl-style ``__module__`` lookups find them here.
for _export in (
    _notify,
    _notify_outside_graph,
    _mark_updated,
    _counter,
    _Counter,
    WRITER_METADATA_FILE,
    TOP_VALUES_FILE,
    _dump_json,
    _read_metadata,
    _batch_len,
    Writer,
    ImmutableDatasetWriter,
    RoundRobinWriter,
    TensorDictRoundRobinWriter,
    TensorDictMaxValueWriter,
    WriterEnsemble,
):
    if getattr(_export, "__module__", "").startswith(__name__ + "."):
        _export.__module__ = __name__
del _export
