"""What the install() tests look at in torchrl's modules: where they refer to a set of
classes, and a snapshot of everything install() may change.

Importable from a fresh interpreter (``sys.path`` holding ``tests/``), so the tests that
install before ``import torchrl`` run the same checks.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import pkgutil
import shutil
import subprocess
import sys
import types

import replay
import torchrl_compat
import torchrl_compat_trees

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# torchrl modules that hold torchrl's classes by name, or subclass them, or bind them as
# default values or in module-level dicts (found by scanning torchrl 0.11 and 0.14.1), those
# the installed release has.
HOLDERS = (
    "torchrl.data.replay_buffers.ray_buffer",  # RayReplayBuffer(ReplayBuffer), replay_buffer_cls=ReplayBuffer
    "torchrl.data.datasets.atari_dqn",  # _AtariStorage(Storage)
    "torchrl.data.datasets.openx",  # _StreamingSampler(Sampler), _StreamingStorage(Storage)
    "torchrl.data.map.tdstorage",  # LazyTensorStorage, TensorStorage
    "torchrl.trainers.trainers",  # REPLAY_BUFFER_CLASS = {"prioritized": ..., "circular": ...}
    "torchrl.trainers.helpers.replay_buffer",  # make_replay_buffer()'s classes
    # torchrl 0.14: classes built on ours, and the sampler dispatch table keyed by class.
    "torchrl.data.replay_buffers.her",  # HERReplayBuffer(TensorDictReplayBuffer), RandomSampler()
    "torchrl.data.replay_buffers.offline_to_online",  # LazyTensorStorage, ReplayBuffer
    "torchrl.data.replay_buffers.sample_units",  # Sequence: isinstance(storage, TensorStorage)
    "torchrl.data.replay_buffers.query",
    "torchrl.data.replay_buffers.samplers.base",  # _REPLACEMENT_DISPATCH {RandomSampler: ...}
    "torchrl.data.replay_buffers.samplers.staleness",  # StalenessAwareSampler(Sampler)
    "torchrl.data.replay_buffers.samplers.llm",  # PromptGroupSampler(Sampler)
    "torchrl.data.replay_buffers.samplers.streaming_slice",  # StreamingSliceSampler(SliceSampler)
    "torchrl.data.replay_buffers.storages.store",  # StoreStorage(Storage)
)


def _exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent that is a module, not a package (torchrl 0.11)
        return False


def import_holders() -> list:
    return [importlib.import_module(name) for name in HOLDERS if _exists(name)]


def torchrl_modules() -> dict:
    return {
        name: module
        for name, module in list(sys.modules.items())
        if (name == "torchrl" or name.startswith("torchrl.")) and isinstance(module, types.ModuleType)
    }


def defining_module(cls) -> types.ModuleType:
    """The module whose source defines ``cls`` (torchrl 0.14 gives its classes the package as
    ``__module__``; their functions keep the module they are written in)."""
    function = next(v for v in vars(cls).values() if isinstance(getattr(v, "__func__", v), types.FunctionType))
    return sys.modules[getattr(function, "__func__", function).__module__]


def classes_defined_in(module_name: str) -> dict:
    """``{class name: module name}`` for every class whose ``class`` statement is in the
    source of ``module_name`` or, for a package, of one of its modules (none where the
    installed torchrl has no such module: sample_units before 0.14)."""
    if not _exists(module_name):
        return {}
    module = importlib.import_module(module_name)
    names = [module_name]
    if hasattr(module, "__path__"):
        names += [info.name for info in pkgutil.iter_modules(module.__path__, module_name + ".")]
    found = {}
    for name in names:
        tree = ast.parse(inspect.getsource(importlib.import_module(name)))
        found.update({node.name: name for node in tree.body if isinstance(node, ast.ClassDef)})
    return found


def references(targets) -> list:
    """Where torchrl's modules refer to one of ``targets`` (a dict id -> class): globals,
    module-level dicts (values and keys) and lists, default values, class attributes and
    base classes."""
    fixed = {id(c) for c in vars(torchrl_compat).values() if isinstance(c, type)} | set(targets)
    found = []

    def look(value, where):
        if id(value) in targets and targets[id(value)] is value:
            found.append(where)

    for name, module in torchrl_modules().items():
        for key, value in list(vars(module).items()):
            look(value, f"{name}.{key}")
            if key.startswith("__"):
                continue
            if isinstance(value, dict):
                for k, v in list(value.items()):
                    look(k, f"{name}.{key} key")
                    look(v, f"{name}.{key}[{k!r}]")
            elif isinstance(value, list):
                for k, v in enumerate(value):
                    look(v, f"{name}.{key}[{k}]")
            functions = []
            if isinstance(value, types.FunctionType) and value.__module__ == name:
                functions.append((f"{name}.{key}", value))
            elif isinstance(value, type) and value.__dict__.get("__module__") == name and id(value) not in fixed:
                for base in value.__bases__:
                    look(base, f"{name}.{key}.__bases__")
                for attr, member in vars(value).items():
                    member = getattr(member, "__func__", member)
                    if isinstance(member, types.FunctionType):
                        functions.append((f"{name}.{key}.{attr}", member))
                    elif not attr.startswith("__"):
                        look(member, f"{name}.{key}.{attr}")
            for where, function in functions:
                for default in function.__defaults__ or ():
                    look(default, f"{where} default")
                for k, default in (function.__kwdefaults__ or {}).items():
                    look(default, f"{where} default {k}")
    return found


def snapshot() -> dict:
    """Everything install() may change, by identity."""
    state = {}
    for name, module in torchrl_modules().items():
        for key, value in list(vars(module).items()):
            state[(name, key)] = id(value)
            if isinstance(value, type) and value.__dict__.get("__module__") == name:
                state[(name, key, "__bases__")] = tuple(id(b) for b in value.__bases__)
                for attr, member in vars(value).items():
                    member = getattr(member, "__func__", member)
                    if isinstance(member, types.FunctionType):
                        state[(name, key, attr)] = (
                            tuple(map(id, member.__defaults__ or ())),
                            tuple((k, id(v)) for k, v in (member.__kwdefaults__ or {}).items()),
                        )
            elif isinstance(value, dict) and not key.startswith("__"):
                state[(name, key, "items")] = tuple((id(k), id(v)) for k, v in list(value.items()))
    return state


def site_dir_like_pip(target) -> None:
    """Lays out in ``target`` what ``pip install`` puts in site-packages: ``torchrl_compat/``,
    ``torchrl_compat_trees.py``, the ``torchrl_compat_trees.pth`` start-up hook and ``replay``'s
    extension. From this clone, by setup.py's build_py; where the tests run against an
    installed wheel (make test-matrix: a copy of the clone without its sources), from where
    the wheel put them."""
    installed = os.path.dirname(os.path.realpath(torchrl_compat_trees.__file__))
    if installed == os.path.realpath(ROOT):
        proc = subprocess.run(
            [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(target)],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        shutil.copytree(os.path.dirname(torchrl_compat.__file__), os.path.join(target, "torchrl_compat"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("torchrl_compat_trees.py", "torchrl_compat_trees.pth"):
            shutil.copy(os.path.join(installed, name), target)
    shutil.copy(replay.__file__, target)  # as pip puts it next to the .pth
