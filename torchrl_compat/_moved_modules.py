"""The names the private modules had before each moved into its family's package.

A pickle names the module of each class it holds: a prioritized sampler pickled by an earlier
version names ``torchrl_compat._sampler_priorities``, a live home ``torchrl_compat.
_storage_live_home``. Those names are served here, each as the module it became (the same
module object, its own name and spec unchanged), so that what was pickled before the move
loads after it.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

__all__ = ["MOVED_MODULES", "OldNameFinder", "install_old_names"]

# old name -> the module it became
MOVED_MODULES = {
    f"torchrl_compat.{old}": f"torchrl_compat.{new}"
    for old, new in {
        "_buffer_checkpoint": "replay_buffers._checkpoint",
        "_buffer_gather": "replay_buffers._gather",
        "_buffer_prefetch": "replay_buffers._prefetch",
        "_buffer_processes": "replay_buffers._processes",
        "_buffer_transforms": "replay_buffers._transforms",
        "_conditional_update": "replay_buffers._conditional_update",
        "_sampler_device": "samplers._device",
        "_sampler_priorities": "samplers._priorities",
        "_sampler_storage": "samplers._storage_reads",
        "_sampler_trees": "samplers._trees",
        "_trajectory_ends": "samplers._trajectory_ends",
        "_fragmented_runs": "samplers._fragmented_runs",
        "_boundary_queries": "samplers._boundary_queries",
        "_cuda_graphs": "samplers._cuda_graphs",
        "_storage_counters": "storages._counters",
        "_storage_first_write": "storages._first_write",
        "_storage_index": "storages._index",
        "_storage_journal": "storages._journal",
        "_tensordict_build": "storages._tensordict_build",
        "_storage_cleanup": "_directory_cleanup",
        "_storage_live_home": "checkpointers._live_home",
        "_checkpoint_checks": "checkpointers._checks",
        "_checkpoint_publish": "checkpointers._publish",
        "_priority_checkpoint_checks": "checkpointers._priority_checks",
        "_storage_checkpoint_checks": "checkpointers._storage_checks",
        "_writer_checks": "writers._checks",
        "_writer_rows": "writers._rows",
        "_torch_sumtree": "_torch_ops.sumtree",
        "_torch_slices": "_torch_ops.slices",
        "_device_checks": "_torch_ops.checks",
        "_ray_routing": "_ray.routing",
        "_ray_shard": "_ray.shard",
        "_ray_wire": "_ray.wire",
        "_ray_writes": "_ray.writes",
    }.items()
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the module it became."""

    def __init__(self, target: str):
        self._target = target
        self._spec = None

    def create_module(self, spec):
        module = importlib.import_module(self._target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # the import system gave the module the old name's spec in between: it keeps its own
        module.__spec__ = self._spec


class OldNameFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of :data:`MOVED_MODULES` (and only those)."""

    _replay_old_names = True

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install_old_names() -> None:
    """Puts an :class:`OldNameFinder` on ``sys.meta_path`` (once)."""
    if not any(getattr(finder, "_replay_old_names", False) for finder in sys.meta_path):
        sys.meta_path.append(OldNameFinder())
