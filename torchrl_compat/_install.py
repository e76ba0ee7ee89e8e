"""Stand ``torchrl_compat``'s classes in for the installed torchrl's own, in every torchrl module.

:func:`install` swaps, in every imported ``torchrl`` module, each reference to one of
torchrl's storage, checkpointer, sampler, writer and replay-buffer classes for the
``torchrl_compat`` class of the same name: module globals (``torchrl.data.ListStorage``,
the ``ListStorage`` that ``ReplayBuffer._maybe_make_storage`` calls, the
``PrioritizedSampler`` that ``update_tensordict_priority`` tests against), default argument
values bound when a function was defined, module-level dicts and lists, class attributes,
and the base classes of torchrl's other classes built on them (``RayReplayBuffer``,
the dataset buffers, ``_AtariStorage``; from torchrl 0.14 ``HERReplayBuffer``,
``StalenessAwareSampler``, ``StreamingSliceSampler``, ``StoreStorage`` and the others), so
that torchrl behaves as if its modules had defined our classes. torchrl's own classes of
those names are left as they are: ours derive from them, and :func:`uninstall` hands them
back.

torchrl 0.11 defines these classes in five modules (``storages.py``, ``samplers.py``, ...).
torchrl 0.14 keeps ``checkpointers.py`` and turns the four others into packages with one
module per family (``samplers/prioritized.py``, ``storages/tensor.py``,
``writers/round_robin.py``, ``replay_buffers/base.py``, ...), whose ``__init__`` re-exports
the classes and gives them the package as their ``__module__``. Both layouts are covered
the same way: the classes are found by name in the five modules or packages, and every
torchrl module, submodules included, is swapped.

An :class:`~torchrl_compat_trees.ImportWatcher` keeps it that way for the torchrl modules
imported afterwards, and makes sure that a ``torchrl_compat`` module executed while
installed (a reload) still finds torchrl's own classes as its twins.
"""
from __future__ import annotations

import abc
import importlib
import inspect
import sys
import threading
import types
import warnings

import torchrl_compat_trees

__all__ = ["install", "uninstall"]

# torchrl's modules defining the classes that install() stands ours in for: every public
# class defined in one of them whose name torchrl_compat also exports is covered (so each
# class added to torchrl_compat is covered as soon as it exists).
STAND_IN_MODULES = (
    "torchrl.data.replay_buffers.storages",
    "torchrl.data.replay_buffers.checkpointers",
    "torchrl.data.replay_buffers.samplers",
    "torchrl.data.replay_buffers.writers",
    "torchrl.data.replay_buffers.replay_buffers",
    "torchrl.data.replay_buffers.sample_units",  # torchrl 0.14
)
# Those a supported torchrl release may lack (skipped there).
_RELEASE_STAND_IN_MODULES = frozenset({"torchrl.data.replay_buffers.sample_units"})

# The modules torchrl_compat's own modules take torchrl's classes from (as base classes):
# they hold torchrl's classes again while a torchrl_compat module executes.
_TWIN_SOURCES = ("torchrl.data", "torchrl.data.replay_buffers", *STAND_IN_MODULES)

# (module name, class name) -> torchrl's class, recorded once: after install() the
# modules hold ours.
_ORIGINALS: dict[tuple, type] = {}

_installation: _Installation | None = None
# torchrl's own compiled trees where install() replaced them (they loaded), for uninstall().
_own_trees: types.ModuleType | None = None


def _is_compat_module(name: str) -> bool:
    return name == "torchrl_compat" or name.startswith("torchrl_compat.")


def _torchrl_modules() -> list:
    return [
        module
        for name, module in list(sys.modules.items())
        if (name == "torchrl" or name.startswith("torchrl."))
        and name != torchrl_compat_trees.EXTENSION_NAME
        and isinstance(module, types.ModuleType)
    ]


def _clear_abc_caches(classes) -> None:
    # ABCMeta caches isinstance / issubclass answers per class and only drops them on
    # register(): after a __bases__ change they would go on answering for the old bases.
    for cls in {c for k in classes for c in k.__mro__}:
        if isinstance(cls, abc.ABCMeta):
            cls._abc_caches_clear()


class _Swap:
    """Replaces one set of classes by another, wherever a torchrl module refers to them.

    Args:
        pairs (list of (type, type)): ``(old, new)`` class pairs.
        fixed (set of int): ids of the classes whose own namespace and bases stay as they
            are (torchrl's classes that ours stand in for, and ours).
    """

    def __init__(self, pairs, fixed) -> None:
        self._new_of = {id(old): (old, new) for old, new in pairs}
        self._fixed = fixed

    def new_of(self, value):
        entry = self._new_of.get(id(value))
        return entry[1] if entry is not None and entry[0] is value else None

    def module(self, module, *, globals_only: bool = False) -> int:
        """Swaps ``module``'s globals and what it defines; returns the number of changes."""
        changes = 0
        namespace = module.__dict__
        for name, value in list(namespace.items()):
            new = self.new_of(value)
            if new is not None:
                namespace[name] = new
                changes += 1
            elif globals_only or name.startswith("__"):
                continue
            elif isinstance(value, (dict, list)):
                changes += self._container(value)
            elif isinstance(value, type):
                if value.__dict__.get("__module__") == module.__name__:
                    changes += self._class(value)
            elif isinstance(value, types.FunctionType):
                if value.__module__ == module.__name__:
                    changes += self._function(value)
        return changes

    def _container(self, container) -> int:
        changes = 0
        keys = list(container) if isinstance(container, dict) else range(len(container))
        for key in keys:
            new = self.new_of(container[key])
            if new is not None:
                container[key] = new
                changes += 1
        if isinstance(container, dict):
            changes += self._keys(container)
        return changes

    def _keys(self, table: dict) -> int:
        # Dicts keyed by class (torchrl 0.14's sampler _REPLACEMENT_DISPATCH, which its
        # Sampler metaclass reads on `RandomSampler(replacement=False)`): rebuilt in place,
        # in the same order, so every module holding the dict sees the new keys.
        new_keys = [self.new_of(key) if isinstance(key, type) else None for key in table]
        if not any(new is not None for new in new_keys):
            return 0
        items = [(new or key, value) for new, (key, value) in zip(new_keys, list(table.items()))]
        table.clear()
        table.update(items)
        return sum(new is not None for new in new_keys)

    def _class(self, cls) -> int:
        if id(cls) in self._fixed:
            return 0
        changes = 0
        bases = cls.__bases__
        new_bases = tuple(self.new_of(base) or base for base in bases)
        if any(new is not old for new, old in zip(new_bases, bases)):
            try:
                cls.__bases__ = new_bases
            except TypeError as err:
                warnings.warn(
                    f"torchrl_compat.install(): {cls.__module__}.{cls.__qualname__} keeps its "
                    f"base classes {bases}: {err}",
                    RuntimeWarning,
                    stacklevel=4,
                )
            else:
                _clear_abc_caches(bases + new_bases)
                changes += 1
        for key, value in list(vars(cls).items()):
            function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if isinstance(function, types.FunctionType):
                changes += self._function(function)
            elif not key.startswith("__"):
                new = self.new_of(value)
                if new is not None:
                    setattr(cls, key, new)
                    changes += 1
        return changes

    def _function(self, function) -> int:
        changes = self._defaults(function)
        try:
            # functools.wraps decorators keep the real defaults on the wrapped function.
            inner = inspect.unwrap(function)
        except ValueError:  # a __wrapped__ cycle
            return changes
        if inner is not function and isinstance(inner, types.FunctionType):
            changes += self._defaults(inner)
        return changes

    def _defaults(self, function) -> int:
        changes = 0
        defaults = function.__defaults__
        if defaults:
            new_defaults = tuple(self.new_of(value) or value for value in defaults)
            if any(new is not old for new, old in zip(new_defaults, defaults)):
                function.__defaults__ = new_defaults
                changes += 1
        kwdefaults = function.__kwdefaults__
        if kwdefaults:
            # The dict a call reads its keyword-only defaults from: swapped in place.
            changes += self._container(kwdefaults)
        return changes


class _Installation:
    """What :func:`install` put in force; the import watcher's listener meanwhile.

    Args:
        pairs (list of (str, type, type)): ``(name, torchrl's class, our class)``.
    """

    def __init__(self, pairs, functions=()) -> None:
        self.pairs = pairs
        self.functions = list(functions)
        # torchrl's classes that ours stand in for stay as they are (ours derive from them).
        fixed = {id(cls) for _, theirs, ours in pairs for cls in (theirs, ours)}
        # functions are swapped as classes are, wherever torchrl's modules hold them
        swapped = [(theirs, ours) for _, theirs, ours in [*pairs, *self.functions]]
        self.forward = _Swap(swapped, fixed)
        self.backward = _Swap([(ours, theirs) for theirs, ours in swapped], fixed)
        self._lock = threading.Lock()
        self._suspended = 0
        self._imported_meanwhile = []

    def replaced(self) -> dict:
        return {name: theirs for name, theirs, _ in self.pairs}

    def apply(self, swap: _Swap, modules, *, globals_only: bool = False) -> int:
        return sum(swap.module(module, globals_only=globals_only) for module in modules)

    def _twin_sources(self) -> list:
        return [sys.modules[name] for name in _TWIN_SOURCES if name in sys.modules]

    # The import watcher's calls.
    def before_exec(self, name: str) -> None:
        if not _is_compat_module(name):
            return
        with self._lock:
            self._suspended += 1
            if self._suspended == 1:
                # torchrl_compat's classes list torchrl's as their last base, read from
                # these modules when the class statement runs: they must not find ours.
                # Other threads see torchrl's own classes there meanwhile; ours derive from
                # them, so torchrl's isinstance checks still accept both.
                self.apply(self.backward, self._twin_sources(), globals_only=True)

    def after_exec(self, module, succeeded: bool) -> None:
        with self._lock:
            if _is_compat_module(module.__name__):
                self._suspended -= 1
                if self._suspended == 0:
                    self.apply(self.forward, self._twin_sources(), globals_only=True)
                    self.apply(self.forward, self._imported_meanwhile)
                    self._imported_meanwhile.clear()
            elif succeeded:
                if self._suspended:
                    self._imported_meanwhile.append(module)
                else:
                    self.forward.module(module)


def _original(module, name: str):
    """torchrl's own class ``name`` defined in ``module`` (even where ours replaced it), or
    ``None`` when ``module`` does not define a class of that name."""
    key = (module.__name__, name)
    if key in _ORIGINALS:
        return _ORIGINALS[key]
    value = module.__dict__.get(name)
    if not isinstance(value, type):
        return None
    # Ours, when installed by an earlier copy of this module: ours derive from torchrl's.
    value = next(
        (c for c in value.__mro__ if c.__module__ == module.__name__ and c.__name__ == name),
        None,
    )
    if value is not None:
        _ORIGINALS[key] = value
    return value


# name -> torchrl's own function that install() replaced, recorded once.
_ORIGINAL_FUNCTIONS: dict[str, types.FunctionType] = {}


def _function_pairs() -> list:
    """``(name, torchrl's function, ours)`` for torchrl 0.14's trajectory-boundary queries
    (``torchrl.data.replay_buffers.utils``), which ``_ReplayBoundaryIndex`` calls."""
    from torchrl_compat._releases import since

    if not since("sample_units"):
        return []
    try:
        utils = importlib.import_module("torchrl.data.replay_buffers.utils")
    except ImportError:
        return []
    from torchrl_compat.samplers._boundary_queries import BOUNDARY_QUERIES

    pairs = []
    for name, ours in BOUNDARY_QUERIES.items():
        theirs = _ORIGINAL_FUNCTIONS.get(name, utils.__dict__.get(name))
        if isinstance(theirs, types.FunctionType) and theirs is not ours:
            _ORIGINAL_FUNCTIONS[name] = theirs
            pairs.append((name, theirs, ours))
    return pairs


def _our_classes() -> dict:
    """Our public classes by name, as the package exports them: each family's, the Ray
    buffer, and from torchrl 0.14 the sample units (a later module's name wins, as in the
    package's own star imports)."""
    from torchrl_compat import checkpointers, ray_buffer, replay_buffers, sample_units, samplers, storages, writers
    from torchrl_compat._releases import since

    classes = {}
    for module in (checkpointers, replay_buffers, samplers, storages, writers):
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type):
                classes[name] = value
    classes["RayReplayBuffer"] = ray_buffer.RayReplayBuffer
    if since("sample_units"):
        classes.update((name, getattr(sample_units, name)) for name in sample_units.__all__)
    return classes


def _stand_in_pairs() -> list:
    classes = _our_classes()
    pairs = []
    for module_name in STAND_IN_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # torchrl is not installed, or this release lacks the module
            if module_name in _RELEASE_STAND_IN_MODULES:
                continue
            return []
        for name in list(module.__dict__):
            theirs = None if name.startswith("_") else _original(module, name)
            ours = classes.get(name)
            if theirs is not None and ours is not None and ours is not theirs:
                pairs.append((name, theirs, ours))
    return pairs


def install() -> dict:
    """Makes the installed torchrl (0.11 to 0.14) use ``torchrl_compat``'s classes wherever it
    uses its own.

    From this call on, every imported ``torchrl`` module that exposes one of torchrl's
    storage, checkpointer, sampler, writer or replay-buffer classes (``torchrl.data``,
    ``torchrl.data.replay_buffers`` and its ``storages``, ``samplers``, ``checkpointers``,
    ``writers`` and ``replay_buffers`` modules or packages and their submodules, and every
    other module that imported them by name) exposes the ``torchrl_compat`` class of the same name instead, wherever
    ``torchrl_compat`` defines one. Default arguments bound when torchrl defined its
    functions, module-level dicts (their values and their class keys) and lists, class
    attributes and the base classes of
    torchrl's other classes (``RayReplayBuffer``, the dataset buffers) follow, so the
    defaults and ``isinstance`` checks inside torchrl's buffers use ours; torchrl modules
    imported later are treated the same way as they load. From torchrl 0.14, torchrl's sample
    units (``SampleUnit``, ``Transition``, ``Sequence``) and its trajectory-boundary queries
    (``_boundary_distances_1d``, ``_boundary_distances_nd``, ``_make_boundary_search_nd``) are
    replaced by ours (:mod:`torchrl_compat.sample_units`) in the same way. ``replay``'s segment
    trees are installed as by ``install_segment_trees(replace=True)``
    (:func:`~torchrl_compat.install_segment_trees`): where torchrl's own compiled trees load
    (torch 2.9 with torchrl 0.11, torch 2.15 with torchrl 0.14.1) ours replace them too, so
    that torchrl's code meets the same trees on every torch.

    Calling it again changes nothing. :func:`uninstall` undoes it.

    Returns:
        a dict mapping each replaced name to torchrl's own class (empty when torchrl is
        not installed). Our classes derive from those.

    .. note:: Only torchrl's modules change. Names that other code bound before the call
        (``from torchrl.data import ReplayBuffer`` in a module imported earlier) keep
        torchrl's classes, and torchrl's buffers refuse their storages, samplers and
        writers afterwards (``TypeError: storage must be either a Storage ...``): call
        ``install()`` first, or set ``TORCHRL_COMPAT_INSTALL=1`` so that the start-up hook
        does it before any of your code runs (child processes inherit it).

    .. note:: Objects built from torchrl's classes before the call stay torchrl's; while
        installed, pickling one fails (pickle finds our class under its name), and a
        torchrl buffer built before the call ignores ``update_tensordict_priority`` (its
        ``isinstance(sampler, PrioritizedSampler)`` check now names ours).

    Examples:
        >>> import torchrl_compat
        >>> replaced = torchrl_compat.install()
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> LazyTensorStorage is torchrl_compat.LazyTensorStorage
        True
        >>> issubclass(LazyTensorStorage, replaced["LazyTensorStorage"])
        True
        >>> type(ReplayBuffer()._storage) is torchrl_compat.ListStorage
        True
        >>> _ = torchrl_compat.uninstall()
    """
    global _installation, _own_trees

    pairs = _stand_in_pairs()  # imports torchrl's replay modules, and so its trees if they load
    own = torchrl_compat_trees.own_trees()
    torchrl_compat_trees.install_segment_trees(replace=True)
    _own_trees = own or _own_trees
    if not pairs:
        return {}
    functions = _function_pairs()
    installation = _installation
    if installation is None or installation.pairs != pairs or installation.functions != functions:
        installation = _Installation(pairs, functions)
    installation.apply(installation.forward, _torchrl_modules())
    torchrl_compat_trees.import_watcher().listener = installation
    _installation = installation
    return installation.replaced()


def uninstall() -> dict:
    """Puts torchrl's own classes back wherever :func:`install` put ours.

    Every reference that :func:`install` swapped (and every reference to our classes that
    torchrl modules imported while installed picked up) points at torchrl's class again,
    and the import watcher is removed; a pending ``TORCHRL_COMPAT_INSTALL`` request is
    withdrawn. torchrl's own segment trees come back where :func:`install` replaced them;
    where they failed to load, ``replay``'s stay. Calling it when nothing is installed
    changes nothing.

    Returns:
        the dict :func:`install` returned (name to torchrl's class), empty when nothing
        was installed.

    Examples:
        >>> import torchrl_compat
        >>> replaced = torchrl_compat.install()
        >>> restored = torchrl_compat.uninstall()
        >>> import torchrl.data
        >>> torchrl.data.ListStorage is restored["ListStorage"]
        True
    """
    global _installation, _own_trees

    watcher = torchrl_compat_trees.import_watcher(create=False)
    if watcher is not None:
        watcher.install_requested = False
        watcher.listener = None
        torchrl_compat_trees.remove_import_watcher()
    if _own_trees is not None:
        torchrl_compat_trees.restore_own_trees(_own_trees)
        _own_trees = None
    installation, _installation = _installation, None
    if installation is None:
        return {}
    installation.apply(installation.backward, _torchrl_modules())
    return installation.replaced()
