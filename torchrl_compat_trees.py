"""Serve ``replay``'s segment trees to torchrl (0.11 to 0.14) as ``torchrl._torchrl``, and run
``torchrl_compat.install()`` from the start-up hook.

torchrl (0.11.0 to 0.14.1) ships its segment trees in a C++ extension, ``torchrl._torchrl``,
built against one torch release. On any other torch the extension fails to load,
``torchrl.data.replay_buffers.samplers`` (torchrl 0.14: its ``prioritized`` module too) keeps
``SumSegmentTreeFp32 = None`` (and the three other tree names), and every prioritized sampler
raises ``"SumSegmentTreeFp32 is not
available"``. :func:`install_segment_trees` puts ``replay``'s four trees, which have the same
API and load on every torch, wherever torchrl looks for its own.

This module is importable without torch, numpy or torchrl: it is what the
``torchrl_compat_trees.pth`` start-up hook imports when ``TORCHRL_COMPAT_INSTALL_TREES`` or
``TORCHRL_COMPAT_INSTALL`` is set, and it is the way to install the trees before anything
imports torchrl (``import torchrl_compat`` imports torchrl itself).
``torchrl_compat.install_segment_trees`` is the same function. With
``TORCHRL_COMPAT_INSTALL=1`` the hook also asks for ``torchrl_compat.install()``, which runs
as soon as torchrl's replay-buffer modules are imported (see :func:`install_from_env`).

Examples:
    >>> import torchrl_compat_trees
    >>> torchrl_compat_trees.install_segment_trees()
    True
    >>> from torchrl.data import PrioritizedSampler
    >>> PrioritizedSampler(max_capacity=10, alpha=0.7, beta=0.9)._sum_tree
    SumSegmentTreeFp32(size=10)
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
import warnings

ENV_VAR = "TORCHRL_COMPAT_INSTALL_TREES"
# Asks the start-up hook for torchrl_compat.install() (classes and trees).
INSTALL_ENV_VAR = "TORCHRL_COMPAT_INSTALL"
# The package whose install() TORCHRL_COMPAT_INSTALL runs once torchrl is imported.
INSTALLER_PACKAGE = "torchrl_compat"
EXTENSION_NAME = "torchrl._torchrl"
TREE_NAMES = (
    "MinSegmentTreeFp32",
    "MinSegmentTreeFp64",
    "SumSegmentTreeFp32",
    "SumSegmentTreeFp64",
)
# Values of ENV_VAR and INSTALL_ENV_VAR that leave the hook off. Keep in step with
# torchrl_compat_trees.pth.
_OFF_VALUES = ("", "0", "false", "no", "off")

# Marks our stand-in module and finder, so a reloaded copy of this file still recognises
# what an earlier copy installed (class identity would not survive a reload).
_STAND_IN_MARK = "__replay_stand_in__"
_FINDER_MARK = "_replay_trees_finder"


def _is_stand_in(module) -> bool:
    return module is not None and getattr(module, _STAND_IN_MARK, False)


def _stand_in_module(spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
    """A module holding ``replay``'s four trees, named and specced as ``torchrl._torchrl``."""
    import replay

    module = types.ModuleType(
        EXTENSION_NAME,
        "replay's segment trees standing in for torchrl's C++ extension "
        "(see torchrl_compat.install_segment_trees).",
    )
    for name in TREE_NAMES:
        setattr(module, name, getattr(replay, name))
    # importlib.util.find_spec() returns sys.modules[name].__spec__ and raises ValueError
    # when it is None; torchrl's _init_extension() probes the extension that way.
    module.__spec__ = spec
    module.__loader__ = spec.loader
    module.__package__ = "torchrl"
    setattr(module, _STAND_IN_MARK, True)
    return module


class _TreesLoader(importlib.abc.Loader):
    """Loads torchrl's own extension when it works (and may be kept), else the stand-in."""

    def __init__(self, finder: "_TreesFinder", path) -> None:
        self._finder = finder
        self._path = path
        self._own_spec = None

    def create_module(self, spec):
        if not self._finder.replace:
            own = self._load_own_extension()
            if own is not None:
                return own
        return _stand_in_module(spec)

    def _load_own_extension(self):
        own_spec = importlib.machinery.PathFinder.find_spec(EXTENSION_NAME, self._path)
        if own_spec is None or own_spec.loader is None:
            return None
        try:
            # module_from_spec, not create_module alone: pybind11's init needs the
            # module attributes it sets.
            module = importlib.util.module_from_spec(own_spec)
            own_spec.loader.exec_module(module)
        except (ImportError, OSError):
            # The usual failure: built against another torch ("undefined symbol ...").
            return None
        self._own_spec = own_spec
        return module

    def exec_module(self, module) -> None:
        # Both modules are complete once created. The import system set our spec on the
        # real extension: give it its own back so it still reports its .so file.
        if self._own_spec is not None and not _is_stand_in(module):
            module.__spec__ = self._own_spec
            module.__loader__ = self._own_spec.loader


class _TreesFinder(importlib.abc.MetaPathFinder):
    """Answers for ``torchrl._torchrl`` only; every other name goes to the next finder."""

    _replay_trees_finder = True

    def __init__(self, replace: bool = False) -> None:
        self.replace = replace

    def find_spec(self, fullname, path=None, target=None):
        if fullname != EXTENSION_NAME:
            return None
        return importlib.machinery.ModuleSpec(
            EXTENSION_NAME, _TreesLoader(self, path), origin="replay"
        )


def _installed_finder():
    for finder in sys.meta_path:
        if getattr(type(finder), _FINDER_MARK, False):
            return finder
    return None


def _install_finder(replace: bool):
    finder = _installed_finder()
    if finder is None:
        # First in line: torchrl's .so sits in torchrl/ where PathFinder would find it.
        finder = _TreesFinder(replace)
        sys.meta_path.insert(0, finder)
    else:
        finder.replace = finder.replace or replace
    return finder


def _is_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        # ValueError: an entry in sys.modules without a __spec__; ImportError: sys.modules
        # holds None for the name, which is how a blocked import is spelt.
        return name in sys.modules and sys.modules[name] is not None


def _patch_torchrl_modules(module, old_classes) -> list:
    """Point every imported ``torchrl.*`` global named like a tree at ``module``'s class.

    A global is replaced when it is ``None`` (torchrl's placeholder after a failed import)
    or one of ``old_classes`` (torchrl's own trees, when replacing them). Returns the names
    of the patched modules.
    """
    patched = []
    for modname, mod in list(sys.modules.items()):
        if mod is None or not (modname == "torchrl" or modname.startswith("torchrl.")):
            continue
        namespace = getattr(mod, "__dict__", None)
        if namespace is None:
            continue
        changed = False
        for name in TREE_NAMES:
            if name not in namespace:
                continue
            value = namespace[name]
            if value is None or any(value is old for old in old_classes):
                new = getattr(module, name)
                if value is not new:
                    setattr(mod, name, new)
                    changed = True
        if changed:
            patched.append(modname)
    return patched


def install_segment_trees(*, replace: bool = False, strict: bool = False) -> bool:
    """Makes torchrl (0.11 to 0.14) use ``replay``'s segment trees wherever it looks for its own.

    ``replay.SumSegmentTreeFp32``, ``SumSegmentTreeFp64``, ``MinSegmentTreeFp32`` and
    ``MinSegmentTreeFp64`` become the module ``torchrl._torchrl`` (with a proper
    ``__spec__``, so ``importlib.util.find_spec("torchrl._torchrl")`` finds it), and the
    torchrl modules already imported that hold ``None`` in place of the tree classes
    (``torchrl.data.replay_buffers.samplers``) get the classes. torchrl's
    ``PrioritizedSampler``, ``PrioritizedSliceSampler``, ``PrioritizedReplayBuffer`` and
    ``TensorDictPrioritizedReplayBuffer`` then work on any torch.

    Called before ``import torchrl``, it registers a meta-path finder for
    ``torchrl._torchrl`` and imports nothing (not even torch): when torchrl later imports
    its extension, the finder first tries torchrl's own ``.so`` and serves ``replay``'s
    trees only if that fails to load (always, with ``replace=True``). Called after, it does
    the same at once. Calling it again changes nothing.

    Keyword Args:
        replace (bool, optional): if ``True``, ``replay``'s trees replace torchrl's own even
            when those load (modules holding torchrl's classes are re-pointed; samplers
            already built keep the trees they hold). Defaults to ``False``.
        strict (bool, optional): if ``True``, raise :class:`ImportError` when torchrl or
            ``replay`` cannot be imported instead of returning ``False``.
            Defaults to ``False``.

    Returns:
        ``True`` when torchrl uses ``replay``'s trees (or, before torchrl is imported, will
        fall back to them); ``False`` when torchrl is not installed, ``replay`` is not
        importable, or torchrl's own trees loaded and ``replace`` is ``False``.

    Raises:
        ImportError: with ``strict=True``, when torchrl or ``replay`` is not importable.

    .. note:: ``replay``'s trees are stricter than torchrl's: an out-of-range index raises
        :class:`IndexError` and a NaN (or, in a sum tree, a negative or infinite) value
        raises :class:`ValueError`, where torchrl's trees write outside their buffer or
        silently corrupt sampling. torchrl's samplers never send such values on valid
        use (``update_priority`` drops the ``-1`` indices that ``MaxValueWriter`` writes).

    Examples:
        >>> import torchrl_compat
        >>> torchrl_compat.install_segment_trees()
        True
        >>> import torchrl._torchrl
        >>> torchrl._torchrl.SumSegmentTreeFp32
        <class 'replay.SumSegmentTreeFp32'>
    """
    if not _is_available("torchrl"):
        if strict:
            raise ImportError(
                "install_segment_trees(strict=True): torchrl is not installed, so there are "
                "no torchrl segment trees to provide; install torchrl (0.11 to 0.14) "
                "or call it with strict=False."
            )
        return False
    if not _is_available("replay"):
        if strict:
            raise ImportError(
                "install_segment_trees(strict=True): the 'replay' extension is not "
                "importable; build it with `python setup.py build_ext --inplace` or "
                "`pip install .`."
            )
        return False

    current = sys.modules.get(EXTENSION_NAME)
    own_classes = ()
    if current is not None and not _is_stand_in(current):
        # torchrl's own extension loaded.
        if not replace:
            return False
        own_classes = tuple(
            cls for cls in (getattr(current, n, None) for n in TREE_NAMES) if cls is not None
        )

    _install_finder(replace)
    torchrl = sys.modules.get("torchrl")
    if torchrl is None:
        # Before `import torchrl`: the finder serves torchrl's own import.
        return True

    if own_classes:
        del sys.modules[EXTENSION_NAME]
    try:
        # Through the finder: torchrl's own extension or the stand-in.
        module = importlib.import_module(EXTENSION_NAME)
    except ImportError as err:
        if own_classes:
            sys.modules[EXTENSION_NAME] = current
        if strict:
            raise ImportError(
                f"install_segment_trees(strict=True): cannot import {EXTENSION_NAME}: {err}"
            ) from err
        return False
    # The import binds the parent attribute only on a fresh load; set it for replacements.
    setattr(torchrl, "_torchrl", module)
    _patch_torchrl_modules(module, own_classes)
    return _is_stand_in(module)


def own_trees():
    """torchrl's own compiled extension, where it loaded and stands as ``torchrl._torchrl``
    (torch 2.9 with torchrl 0.11, torch 2.15 with torchrl 0.14.1); else ``None``."""
    module = sys.modules.get(EXTENSION_NAME)
    return None if module is None or _is_stand_in(module) else module


def restore_own_trees(own) -> None:
    """Undoes ``install_segment_trees(replace=True)``: ``own`` (what :func:`own_trees` returned
    before) is ``torchrl._torchrl`` again, every torchrl global holding one of ``replay``'s
    trees holds torchrl's own, and torchrl's extension is no longer replaced on import."""
    import replay

    finder = _installed_finder()
    if finder is not None:
        finder.replace = False
    sys.modules[EXTENSION_NAME] = own
    torchrl = sys.modules.get("torchrl")
    if torchrl is not None:
        torchrl._torchrl = own
    _patch_torchrl_modules(own, tuple(getattr(replay, name) for name in TREE_NAMES))


# =============================================================================
# Import watcher: torchrl_compat.install() before and after torchrl's modules load
# =============================================================================
# The package torchrl_compat.install() waits for when the start-up hook asks for it: every
# class it stands in for is defined once this package has been imported.
REPLAY_BUFFERS_PACKAGE = "torchrl.data.replay_buffers"
_WATCHER_MARK = "_replay_import_watcher"


def _is_watched(name: str) -> bool:
    if name == EXTENSION_NAME:  # the trees finder's business
        return False
    return any(
        name == root or name.startswith(root + ".") for root in ("torchrl", "torchrl_compat")
    )


class _WatchedLoader(importlib.abc.Loader):
    """Runs a module through its own loader, between the watcher's two calls."""

    def __init__(self, watcher: "ImportWatcher", loader) -> None:
        self._watcher = watcher
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        # The module keeps its own loader (inspect.getsource, importlib.resources and
        # reload read it), so this wrapper is gone once the module is loaded.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._watcher.run(module, self._loader.exec_module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class ImportWatcher(importlib.abc.MetaPathFinder):
    """Calls back around the execution of every ``torchrl`` and ``torchrl_compat`` module.

    It finds nothing itself: it asks the finders after it, then wraps the loader of what
    they found. While ``torchrl_compat`` is installed, ``listener`` (an object with
    ``before_exec(name)`` and ``after_exec(module)``) keeps newly imported torchrl modules
    on our classes; while ``install_requested`` is set (the start-up hook), the first point
    at which torchrl's replay-buffer modules are loaded and no watched module is
    half-executed runs ``torchrl_compat.install()``.
    """

    _replay_import_watcher = True

    def __init__(self) -> None:
        self.listener = None
        self.install_requested = False
        self._executing = 0
        self._lock = threading.Lock()

    def find_spec(self, fullname, path=None, target=None):
        if not _is_watched(fullname):
            return None
        spec = None
        for finder in list(sys.meta_path):
            if getattr(type(finder), _WATCHER_MARK, False):
                continue
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        if spec is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _WatchedLoader(self, spec.loader)
        return spec

    def run(self, module, exec_module) -> None:
        listener = self.listener
        if listener is not None:
            listener.before_exec(module.__name__)
        with self._lock:
            self._executing += 1
        succeeded = False
        try:
            exec_module(module)
            succeeded = True
        finally:
            with self._lock:
                self._executing -= 1
            if listener is not None:
                listener.after_exec(module, succeeded)
        self.run_requested_install()

    def run_requested_install(self) -> bool:
        """Runs the requested ``install()`` if torchrl's buffers are fully imported now."""
        if not self.install_requested or REPLAY_BUFFERS_PACKAGE not in sys.modules:
            return False
        with self._lock:
            if self._executing:
                # A half-executed torchrl (or torchrl_compat) module: the outermost one
                # to finish tries again.
                return False
            self.install_requested = False
        try:
            # by name: the hook starts the package that installs it, and imports nothing of
            # it until then
            importlib.import_module(INSTALLER_PACKAGE).install()
        except Exception as err:  # noqa: BLE001
            warnings.warn(
                f"{INSTALL_ENV_VAR}: torchrl_compat.install() failed: {err!r}",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        return True


def import_watcher(create: bool = True):
    """The :class:`ImportWatcher` on ``sys.meta_path`` (first in line), created if asked."""
    for finder in sys.meta_path:
        if getattr(type(finder), _WATCHER_MARK, False):
            return finder
    if not create:
        return None
    watcher = ImportWatcher()
    sys.meta_path.insert(0, watcher)
    return watcher


def remove_import_watcher() -> None:
    """Takes every :class:`ImportWatcher` off ``sys.meta_path``."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(type(f), _WATCHER_MARK, False)]


def _env_switch(name: str) -> str:
    """The value of environment variable ``name``, ``""`` when it leaves the hook off."""
    value = os.environ.get(name, "").strip().lower()
    return "" if value in _OFF_VALUES else value


def install_from_env() -> bool:
    """Runs what ``TORCHRL_COMPAT_INSTALL_TREES`` and ``TORCHRL_COMPAT_INSTALL`` ask for.

    Called by ``torchrl_compat_trees.pth`` at interpreter start-up. For either variable,
    unset, empty, ``0``, ``false``, ``no`` or ``off`` leave torchrl alone.

    * ``TORCHRL_COMPAT_INSTALL_TREES``: ``replace`` replaces torchrl's own trees even when
      those load; any other value (``1``) installs ``replay``'s trees where torchrl's fail
      to load.
    * ``TORCHRL_COMPAT_INSTALL``: any other value (``1``) runs ``torchrl_compat.install()``
      (which installs the trees too). Before torchrl is imported this imports nothing: an
      import watcher runs it as soon as ``torchrl.data.replay_buffers`` and the modules
      being imported with it are loaded, before the code that imported them goes on.

    Never raises: a start-up hook must not break the interpreter, so a failure becomes a
    :class:`RuntimeWarning`.

    Returns:
        ``True`` when something was installed or is set to be installed on import.
    """
    trees, full = _env_switch(ENV_VAR), _env_switch(INSTALL_ENV_VAR)
    if not (trees or full):
        return False
    done = False
    try:
        if "torchrl" not in sys.modules:
            # site runs .pth files while it is still building sys.path (a venv's own
            # site-packages come before the system ones), so torchrl and replay may not be
            # findable yet: register the finder without looking for them. It acts only when
            # torchrl imports its extension, and that import proves torchrl is there.
            _install_finder(trees == "replace")
            done = True
        else:
            done = install_segment_trees(replace=trees == "replace")
        if full:
            watcher = import_watcher()
            watcher.install_requested = True
            # Already imported (a call after start-up): install at once.
            watcher.run_requested_install()
            done = True
    except Exception as err:  # noqa: BLE001
        warnings.warn(
            f"{ENV_VAR}={trees!r}, {INSTALL_ENV_VAR}={full!r}: installing torchrl_compat "
            f"failed: {err!r}",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return done
