"""torchrl_compat.install() / uninstall() and the TORCHRL_COMPAT_INSTALL start-up hook.

In-process tests install and uninstall around themselves (the ``installed`` fixture); what
depends on import order (before / after ``import torchrl``, modules imported while
installed, reloads, the start-up hook) runs in fresh interpreters.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import types

import pytest
import torch

import replay
import torchrl.data
import torchrl_compat
import torchrl_compat_trees
from install_support import (
    classes_defined_in,
    defining_module,
    import_holders,
    references,
    site_dir_like_pip,
    snapshot,
)
from torchrl_compat._install import STAND_IN_MODULES

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_VARS = (torchrl_compat_trees.ENV_VAR, torchrl_compat_trees.INSTALL_ENV_VAR)



@pytest.fixture
def installed():
    import_holders()
    replaced = torchrl_compat.install()
    yield replaced
    torchrl_compat.uninstall()


# =============================================================================
# In this process
# =============================================================================
def test_returns_what_it_replaced(installed):
    # Every class torchrl's source defines in these modules (torchrl 0.14: in the modules of
    # these packages) that torchrl_compat has too.
    expected = {
        name: module_name
        for module_name in STAND_IN_MODULES
        for name in classes_defined_in(module_name)
        if isinstance(getattr(torchrl_compat, name, None), type)
    }
    assert set(installed) == set(expected)
    # The storages, checkpointers and samplers (buffers and writers once they exist here).
    assert {"Storage", "LazyMemmapStorage", "H5StorageCheckpointer", "SamplerEnsemble"} <= set(installed)
    assert len(installed) >= 24
    for name, theirs in installed.items():
        assert theirs.__module__ == expected[name] and theirs.__name__ == name
        ours = getattr(torchrl_compat, name)
        assert ours is not theirs
        if "Checkpointer" not in name:  # torchrl never tests checkpointers' types
            assert issubclass(ours, theirs), name  # ours keep deriving from torchrl's own


def test_every_torchrl_module_exposes_ours(installed):
    import torchrl.data.replay_buffers as rbs

    for name, theirs in installed.items():
        ours = getattr(torchrl_compat, name)
        for module in (torchrl.data, rbs, sys.modules[theirs.__module__], defining_module(theirs)):
            if name in vars(module):
                assert getattr(module, name) is ours, (module.__name__, name)
    # Names other modules imported: the buffer's defaults and checks, the writers' base
    # (torchrl 0.11: its five modules; 0.14: the modules of its packages).
    def module_of(name):
        return defining_module(installed[name])

    assert module_of("ReplayBuffer").ListStorage is torchrl_compat.ListStorage
    assert module_of("ReplayBuffer").PrioritizedSampler is torchrl_compat.PrioritizedSampler
    assert module_of("Writer").Storage is torchrl_compat.Storage
    assert module_of("SliceSampler").TensorStorage is torchrl_compat.TensorStorage
    assert module_of("TensorStorage").TensorStorageCheckpointer is torchrl_compat.TensorStorageCheckpointer
    assert sys.modules["torchrl.data.map.tdstorage"].LazyTensorStorage is torchrl_compat.LazyTensorStorage
    assert sys.modules["torchrl.trainers.helpers.replay_buffer"].LazyMemmapStorage is torchrl_compat.LazyMemmapStorage
    # Nowhere in torchrl is one of torchrl's replaced classes left.
    assert references({id(c): c for c in installed.values()}) == []
    # The segment trees: ours, even where torchrl's own load (install() replaces them).
    assert module_of("PrioritizedSampler").SumSegmentTreeFp32 is replay.SumSegmentTreeFp32
    assert rbs.samplers.SumSegmentTreeFp32 is replay.SumSegmentTreeFp32
    assert sys.modules[torchrl_compat_trees.EXTENSION_NAME].SumSegmentTreeFp64 is replay.SumSegmentTreeFp64


def _tree_globals() -> dict:
    """Every torchrl module global named like a tree: ``{(module name, name): value}``."""
    return {
        (module_name, key): vars(module)[key]
        for module_name, module in list(sys.modules.items())
        if module is not None and module_name.startswith("torchrl.")
        for key in torchrl_compat_trees.TREE_NAMES
        if key in vars(module)
    }


def test_torchrls_own_trees_are_replaced_then_given_back():
    """Where torchrl's own compiled trees load (torch 2.9 with torchrl 0.11, torch 2.15 with
    0.14.1; faked here on the CI torch, where they do not), install() puts replay's in their
    place everywhere, as where they fail to load, and uninstall() gives torchrl's back."""
    import_holders()
    extension = torchrl_compat_trees.EXTENSION_NAME
    samplers = sys.modules["torchrl.data.replay_buffers.samplers"]
    globals_before, extension_before, meta_path = _tree_globals(), sys.modules.get(extension), list(sys.meta_path)
    own = torchrl_compat_trees.own_trees()
    try:
        if own is None:
            own = types.ModuleType(extension)
            for name in torchrl_compat_trees.TREE_NAMES:
                setattr(own, name, type(name, (), {}))
                setattr(samplers, name, getattr(own, name))
            sys.modules[extension] = torchrl._torchrl = own
        torchrl_compat.install()
        for name in torchrl_compat_trees.TREE_NAMES:
            assert getattr(samplers, name) is getattr(sys.modules[extension], name) is getattr(replay, name)
        assert torchrl._torchrl is sys.modules[extension] is not own
        torchrl_compat.uninstall()
        assert torchrl._torchrl is sys.modules[extension] is own
        for name in torchrl_compat_trees.TREE_NAMES:
            assert getattr(samplers, name) is getattr(own, name)
        assert torchrl_compat_trees.install_segment_trees() is False  # torchrl's own are kept
    finally:
        torchrl_compat.uninstall()
        sys.meta_path[:] = meta_path
        if extension_before is None:
            sys.modules.pop(extension, None)
            vars(torchrl).pop("_torchrl", None)
        else:
            sys.modules[extension] = torchrl._torchrl = extension_before
        for (module_name, key), value in globals_before.items():
            setattr(sys.modules[module_name], key, value)


def test_subclasses_defined_before_install_are_rebased(installed):
    atari = sys.modules["torchrl.data.datasets.atari_dqn"]
    openx = sys.modules["torchrl.data.datasets.openx"]
    assert atari._AtariStorage.__bases__ == (torchrl_compat.Storage,)
    assert openx._StreamingSampler.__bases__ == (torchrl_compat.Sampler,)
    assert issubclass(openx._StreamingSampler, torchrl_compat.Sampler)
    torchrl_compat.uninstall()
    assert atari._AtariStorage.__bases__ == (installed["Storage"],)
    # ABCMeta's cache must not keep answering for the old bases.
    assert not issubclass(openx._StreamingSampler, torchrl_compat.Sampler)
    torchrl_compat.install()
    assert issubclass(openx._StreamingSampler, torchrl_compat.Sampler)


def test_defaults_and_isinstance_checks_use_ours(installed):
    from tensordict import TensorDict

    rb = torchrl.data.ReplayBuffer()
    assert type(rb._storage) is torchrl_compat.ListStorage
    assert type(rb._sampler) is torchrl_compat.RandomSampler
    assert type(rb._writer) is torchrl.data.RoundRobinWriter
    # update_tensordict_priority acts only when isinstance(sampler, PrioritizedSampler).
    rb = torchrl.data.TensorDictReplayBuffer(
        storage=torchrl.data.LazyTensorStorage(4),
        sampler=torchrl.data.PrioritizedSampler(4, alpha=1.0, beta=1.0), priority_key="p",
    )
    data = TensorDict({"x": torch.arange(4.0), "p": torch.ones(4)}, [4])
    data["index"] = rb.extend(data)
    data["p"] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    rb.update_tensordict_priority(data)
    assert rb.sampler._sum_tree[torch.arange(4)].tolist() == pytest.approx([1.0, 2.0, 3.0, 4.0])
    # Default values bound when torchrl defined its functions, and its module-level dicts.
    ray_buffer = sys.modules["torchrl.data.replay_buffers.ray_buffer"]
    kwdefault = ray_buffer.RayReplayBuffer.__init__.__kwdefaults__["replay_buffer_cls"]
    assert kwdefault is torchrl.data.ReplayBuffer
    trainers = sys.modules["torchrl.trainers.trainers"]
    assert trainers.REPLAY_BUFFER_CLASS["circular"] is torchrl.data.TensorDictReplayBuffer


# torchrl's classes built on the ones install() replaces (torchrl 0.14): name -> the base
# they take from torchrl's modules.
BUILT_ON_OURS = {
    "HERReplayBuffer": "TensorDictReplayBuffer",
    "RemoteTensorDictReplayBuffer": "TensorDictReplayBuffer",
    "StalenessAwareSampler": "Sampler",
    "PromptGroupSampler": "Sampler",
    "StreamingSliceSampler": "SliceSampler",
    "StoreStorage": "Storage",
}


@pytest.mark.parametrize("name", sorted(BUILT_ON_OURS))
def test_torchrls_classes_built_on_replaced_ones_derive_from_ours(name):
    import torchrl.data.replay_buffers as rbs

    cls = getattr(rbs, name, None)
    if cls is None:
        pytest.skip(f"torchrl {torchrl.__version__} has no {name}")
    base = BUILT_ON_OURS[name]
    theirs = getattr(rbs, base)
    assert cls.__bases__ == (theirs,)
    replaced = torchrl_compat.install()
    try:
        assert replaced[base] is theirs
        assert cls.__bases__ == (getattr(torchrl_compat, base),)
        assert issubclass(cls, getattr(torchrl_compat, base)) and issubclass(cls, theirs)
        # The names its module reads at run time (defaults, isinstance checks) are ours.
        module = defining_module(cls)
        for held in ("RandomSampler", "TensorStorage", "Storage", "SliceSampler", "Sampler"):
            if held in vars(module) and held in replaced:
                assert getattr(module, held) is getattr(torchrl_compat, held), (module.__name__, held)
    finally:
        torchrl_compat.uninstall()
    assert cls.__bases__ == (theirs,)
    assert not issubclass(cls, getattr(torchrl_compat, base))


def test_modules_building_torchrls_buffers_use_ours(installed):
    """torchrl 0.14's offline-to-online buffer builds its online buffer from the module's
    ``ReplayBuffer`` and ``LazyTensorStorage``; the sample units test storages against
    ``TensorStorage``."""
    import torchrl.data.replay_buffers as rbs

    if not hasattr(rbs, "OfflineToOnlineReplayBuffer"):
        pytest.skip(f"torchrl {torchrl.__version__} has no OfflineToOnlineReplayBuffer")
    offline = torchrl.data.ReplayBuffer(storage=torchrl.data.LazyTensorStorage(4))
    rb = rbs.OfflineToOnlineReplayBuffer(offline, online_capacity=3)
    assert type(rb.online_buffer) is torchrl_compat.ReplayBuffer
    assert type(rb.online_buffer.storage) is torchrl_compat.LazyTensorStorage
    assert sys.modules["torchrl.data.replay_buffers.sample_units"].TensorStorage is torchrl_compat.TensorStorage


def test_sampler_dispatch_table_keys_are_swapped():
    """torchrl 0.14's ``RandomSampler(replacement=False)`` looks the class up in a dict keyed
    by class: its keys follow install() and uninstall() too."""
    base = sys.modules.get("torchrl.data.replay_buffers.samplers.base")
    table = getattr(base, "_REPLACEMENT_DISPATCH", None)
    if table is None:
        pytest.skip(f"torchrl {torchrl.__version__} has no sampler dispatch table")
    theirs = dict(table)
    replaced = torchrl_compat.install()
    try:
        assert sys.modules["torchrl.data.replay_buffers.samplers"]._REPLACEMENT_DISPATCH is table
        assert table == {
            getattr(torchrl_compat, key.__name__): getattr(torchrl_compat, value.__name__)
            for key, value in theirs.items()
        }
        assert type(torchrl.data.RandomSampler(replacement=False)) is torchrl_compat.SamplerWithoutReplacement
        sampler = torchrl.data.SliceSampler(replacement=False, num_slices=2)
        assert type(sampler) is torchrl_compat.SliceSamplerWithoutReplacement
        assert type(torchrl.data.RandomSampler(replacement=True)) is torchrl_compat.RandomSampler
    finally:
        torchrl_compat.uninstall()
    assert table == theirs and list(table) == list(theirs)
    assert all(replaced[key.__name__] is key for key in table)
    assert type(torchrl.data.RandomSampler(replacement=False)) is replaced["SamplerWithoutReplacement"]


def test_torchrls_instances_are_refused(installed):
    """What the docstring's note says: objects of torchrl's own classes, built from names
    bound before install(), are not ours."""
    # torchrl.data.ReplayBuffer is ours now: it refuses them as torchrl's own buffer would
    # while torchrl's modules name our classes
    theirs = installed["LazyTensorStorage"](3)
    for name, component in [
        ("storage", theirs),
        ("sampler", installed["RandomSampler"]()),
        ("writer", installed["RoundRobinWriter"]()),
    ]:
        with pytest.raises(TypeError, match=f"{name} must be either a {name.capitalize()}"):
            torchrl.data.ReplayBuffer(**{name: component})
    # once uninstalled, our buffers take torchrl's classes again (see test_replay_buffers)
    torchrl_compat.uninstall()
    try:
        rb = torchrl_compat.ReplayBuffer(storage=theirs, batch_size=2)
        rb.extend(torch.arange(5))
        assert sorted(rb[:].tolist()) == [2, 3, 4]
    finally:
        torchrl_compat.install()
    with pytest.raises(pickle.PicklingError, match="not the same object"):
        pickle.dumps(installed["ListStorage"](3))
    storage = pickle.loads(pickle.dumps(torchrl_compat.ListStorage(3)))
    assert type(storage) is torchrl_compat.ListStorage


def test_stand_in_mechanism_on_a_module_of_each_kind():
    """Globals, dicts, lists, defaults, decorated functions, class attributes and bases, on
    a torchrl module that holds torchrl's ListStorage in each way."""
    import functools

    theirs = torchrl.data.ListStorage
    assert theirs.__module__ == "torchrl.data.replay_buffers.storages", "installed already"
    module = types.ModuleType("torchrl._install_probe")

    def make(storage_cls=theirs, *, other=theirs):
        return storage_cls, other

    @functools.wraps(make)
    def wrapped(*args, **kwargs):
        return make(*args, **kwargs)

    class Holder(theirs):
        storage_cls = theirs

        def build(self, storage_cls=theirs):
            return storage_cls

    for value in (make, wrapped, Holder):
        value.__module__ = module.__name__
    module.__dict__.update(
        Alias=theirs, table={"list": theirs}, row=[theirs], make=make, wrapped=wrapped, Holder=Holder
    )
    sys.modules[module.__name__] = module
    try:
        torchrl_compat.install()
        ours = torchrl_compat.ListStorage
        assert module.Alias is ours and module.table["list"] is ours and module.row == [ours]
        assert make() == (ours, ours) and wrapped() == (ours, ours)
        assert Holder.__bases__ == (ours,) and Holder.storage_cls is ours
        assert Holder().build() is ours and isinstance(Holder(), torchrl_compat.Storage)
        torchrl_compat.uninstall()
        assert module.Alias is theirs and module.table["list"] is theirs and module.row == [theirs]
        assert make() == (theirs, theirs) and wrapped() == (theirs, theirs)
        assert Holder.__bases__ == (theirs,) and Holder.storage_cls is theirs
        assert not isinstance(Holder(), torchrl_compat.Storage)
    finally:
        torchrl_compat.uninstall()
        del sys.modules[module.__name__]


def test_idempotent(installed):
    before = snapshot()
    meta_path = list(sys.meta_path)
    assert torchrl_compat.install() == installed
    assert snapshot() == before
    assert sys.meta_path == meta_path
    watchers = [f for f in sys.meta_path if type(f).__name__ == "ImportWatcher"]
    assert len(watchers) == 1 and watchers[0].listener is not None


def test_uninstall_restores_torchrls_classes_exactly():
    import_holders()
    assert torchrl.data.ListStorage.__module__.startswith("torchrl."), "installed already"
    before = snapshot()
    replaced = torchrl_compat.install()
    assert snapshot() != before
    assert torchrl_compat.uninstall() == replaced
    assert snapshot() == before
    assert not any(type(f).__name__ == "ImportWatcher" for f in sys.meta_path)
    assert torchrl_compat.uninstall() == {}


# =============================================================================
# Fresh interpreters
# =============================================================================
def _python(*parts, env_update=None, cwd=ROOT, timeout=300):
    """Runs the joined, dedented ``parts`` in a fresh interpreter; returns its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    if cwd == ROOT:
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["RL_WARNINGS"] = "0"
    env.update(env_update or {})
    proc = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", "\n".join(textwrap.dedent(p) for p in parts)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr


# Checks shared by the fresh-interpreter tests, run once torchrl uses our classes.
_CHECK_INSTALLED = """
import importlib, inspect, sys
import torch
import torchrl_compat, replay
import torchrl.data
from torchrl.data.replay_buffers import samplers, storages
assert torchrl.data.ReplayBuffer().storage.__class__ is torchrl_compat.ListStorage
assert storages.LazyTensorStorage is torchrl_compat.LazyTensorStorage
assert samplers.SumSegmentTreeFp32 is replay.SumSegmentTreeFp32
# Ours derive from torchrl's own classes, not from ours.
for name in ("LazyTensorStorage", "PrioritizedSampler", "TensorStorageCheckpointer"):
    ours = getattr(torchrl_compat, name)
    assert not any(c is not ours and c.__module__.startswith("torchrl_compat.") and c.__name__ == name for c in ours.__mro__), ours.__mro__
assert torchrl_compat.LazyTensorStorage.__mro__[-3].__module__ == "torchrl.data.replay_buffers.storages"
# A torchrl module imported now: it takes our classes, keeps its own loader.
atari = importlib.import_module("torchrl.data.datasets.atari_dqn")
assert atari._AtariStorage.__bases__ == (torchrl_compat.Storage,)
assert atari.TensorStorage is torchrl_compat.TensorStorage
assert type(atari.__loader__).__name__ == "SourceFileLoader", atari.__loader__
assert type(atari.__spec__.loader).__name__ == "SourceFileLoader"
assert "class _AtariStorage" in inspect.getsource(atari)
rb = torchrl.data.ReplayBuffer(
    storage=torchrl.data.LazyTensorStorage(4),
    sampler=torchrl.data.PrioritizedSampler(4, alpha=1.0, beta=1.0), batch_size=8,
)
rb.extend(torch.arange(4))
rb.update_priority(torch.arange(4), torch.tensor([0.0, 0.0, 5.0, 0.0]))
print("SAMPLE", sorted(set(rb.sample().tolist())))
# Nowhere in torchrl, submodules and the modules holding its classes included, is one of
# torchrl's replaced classes left.
sys.path.insert(0, %r)
from install_support import import_holders, references
import_holders()
replaced_now = torchrl_compat.install()  # changes nothing: the dict of what is in force
left = references({id(c): c for c in replaced_now.values()})
assert left == [], left
""" % os.path.join(ROOT, "tests")

_CHECK_UNINSTALL = """
replaced = torchrl_compat.uninstall()
assert storages.LazyTensorStorage is replaced["LazyTensorStorage"]
assert torchrl.data.ReplayBuffer().storage.__class__ is replaced["ListStorage"]
# The module imported while installed is handed torchrl's classes too.
assert atari._AtariStorage.__bases__ == (replaced["Storage"],)
assert atari.TensorStorage is replaced["TensorStorage"]
assert not any(type(f).__name__ == "ImportWatcher" for f in sys.meta_path)
ours = [getattr(torchrl_compat, name) for name in replaced]
assert references({id(c): c for c in ours}) == []
print("UNINSTALLED")
"""


def test_install_before_importing_torchrl():
    out = _python(
        """
        import sys
        import torchrl_compat
        replaced = torchrl_compat.install()
        assert "torchrl.data.datasets.atari_dqn" not in sys.modules
        from torchrl.data import LazyMemmapStorage, ReplayBuffer
        assert LazyMemmapStorage is torchrl_compat.LazyMemmapStorage
        """,
        _CHECK_INSTALLED,
        _CHECK_UNINSTALL,
    )
    assert "SAMPLE [2]" in out and "UNINSTALLED" in out


def test_install_after_importing_torchrl_and_reimporting_ours():
    out = _python(
        """
        import importlib, sys
        import torch
        from torchrl.data import LazyTensorStorage as bound_before
        import torchrl.data
        import torchrl.data.datasets.atari_dqn as atari
        import torchrl_compat
        replaced = torchrl_compat.install()
        # Names bound outside torchrl before the call stay torchrl's (docs/torchrl.md).
        assert bound_before is replaced["LazyTensorStorage"]
        assert torchrl.data.LazyTensorStorage is torchrl_compat.LazyTensorStorage
        # Classes torchrl defined on its own before the call now derive from ours.
        assert atari._AtariStorage.__bases__ == (torchrl_compat.Storage,)
        # A torchrl_compat module executed while installed still finds torchrl's own
        # classes as its twins (reload, then a fresh import).
        import torchrl_compat.storages.list as ours
        first = ours.ListStorage
        importlib.reload(ours)
        assert ours.ListStorage is not first
        assert ours.ListStorage.__mro__[2] is replaced["ListStorage"], ours.ListStorage.__mro__
        for name in [m for m in sys.modules if m.startswith("torchrl_compat")]:
            del sys.modules[name]
        import torchrl_compat as again
        assert again.PrioritizedSampler.__mro__[2] is replaced["PrioritizedSampler"]
        assert again.LazyTensorStorage.__mro__[3] is replaced["LazyTensorStorage"]
        # torchrl still holds the classes install() put there, and they work.
        assert torchrl.data.ListStorage is first
        rb = torchrl.data.ReplayBuffer(storage=torchrl.data.LazyTensorStorage(3), batch_size=2)
        rb.extend(torch.arange(5))
        assert sorted(rb[:].tolist()) == [2, 3, 4]
        print("REIMPORTED")
        """
    )
    assert "REIMPORTED" in out


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory):
    """What pip installs, start-up hook included."""
    site = tmp_path_factory.mktemp("site")
    site_dir_like_pip(site)
    return site


def _start_up(site_dir):
    # site.addsitedir processes the .pth exactly as start-up does for site-packages. The
    # variable is set only then: with it set at start-up, a hook installed in this
    # interpreter's site-packages (pip install -e .) would run first.
    return f"""
    import os, site, sys
    assert "torchrl_compat_trees" not in sys.modules
    os.environ[{torchrl_compat_trees.INSTALL_ENV_VAR!r}] = "1"
    site.addsitedir({str(site_dir)!r})
    assert "torch" not in sys.modules and "torchrl" not in sys.modules
    assert sys.modules["torchrl_compat_trees"].__file__.startswith({str(site_dir)!r})
    watcher = sys.meta_path[0]
    assert type(watcher).__name__ == "ImportWatcher" and watcher.install_requested
    """


def test_hook_installs_when_torchrl_is_imported(site_dir):
    out = _python(
        _start_up(site_dir),
        """
        import torchrl
        assert watcher.install_requested  # torchrl's buffers are not imported yet
        from torchrl.data import LazyTensorStorage, ReplayBuffer
        assert not watcher.install_requested
        assert "torchrl_compat" in sys.modules
        assert LazyTensorStorage is sys.modules["torchrl_compat"].LazyTensorStorage
        """,
        _CHECK_INSTALLED,
        _CHECK_UNINSTALL,
        cwd=site_dir,
    )
    assert "SAMPLE [2]" in out and "UNINSTALLED" in out


def test_hook_installs_when_torchrl_compat_is_imported_first(site_dir):
    out = _python(
        _start_up(site_dir),
        """
        import torchrl_compat
        # Installed once torchrl_compat (which imports torchrl) finished importing.
        assert not watcher.install_requested
        import torchrl.data
        assert torchrl.data.SliceSampler is torchrl_compat.SliceSampler
        """,
        _CHECK_INSTALLED,
        cwd=site_dir,
    )
    assert "SAMPLE [2]" in out


@pytest.mark.parametrize("value", [None, "", "0", "off", "False"])
def test_hook_off_imports_nothing(site_dir, value):
    out = _python(
        f"""
        import site, sys
        site.addsitedir({str(site_dir)!r})
        print("TORCH", "torch" in sys.modules, "HOOK", "torchrl_compat_trees" in sys.modules)
        print("FINDERS", [type(f).__name__ for f in sys.meta_path if "replay" in repr(type(f)) or type(f).__name__ in ("ImportWatcher", "_TreesFinder")])
        """,
        env_update={} if value is None else {torchrl_compat_trees.INSTALL_ENV_VAR: value},
        cwd=site_dir,
    )
    assert "TORCH False HOOK False" in out
    assert "FINDERS []" in out


def test_hook_failure_warns_and_leaves_torchrl_working(site_dir):
    out = _python(
        _start_up(site_dir),
        """
        import warnings
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "torchrl_compat":
                    raise ModuleNotFoundError("No module named 'torchrl_compat'")
        sys.meta_path.insert(1, Block())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torchrl.data
        messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert any("TORCHRL_COMPAT_INSTALL: torchrl_compat.install() failed" in m for m in messages), messages
        assert torchrl.data.ListStorage.__module__ == "torchrl.data.replay_buffers.storages"
        assert type(torchrl.data.ReplayBuffer().storage).__module__ == "torchrl.data.replay_buffers.storages"
        print("TORCHRL OK")
        """,
        cwd=site_dir,
    )
    assert "TORCHRL OK" in out


def test_install_from_env_after_start_up():
    out = _python(
        """
        import os, sys
        import torchrl.data
        import torchrl_compat_trees
        os.environ["TORCHRL_COMPAT_INSTALL"] = "1"
        assert torchrl_compat_trees.install_from_env() is True
        import torchrl_compat
        assert torchrl.data.ListStorage is torchrl_compat.ListStorage
        print("INSTALLED AT ONCE")
        """
    )
    assert "INSTALLED AT ONCE" in out


def test_without_torchrl_there_is_nothing_to_install():
    out = _python(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "torchrl":
                    raise ModuleNotFoundError(f"No module named {name!r}")
        sys.meta_path.insert(0, Block())
        import torchrl_compat
        assert torchrl_compat.install() == {}
        assert torchrl_compat.uninstall() == {}
        assert "torchrl" not in sys.modules
        print("NOTHING TO INSTALL")
        """
    )
    assert "NOTHING TO INSTALL" in out


def test_docstring_examples_run():
    import doctest

    from torchrl_compat import _install

    assert torchrl.data.ListStorage.__module__.startswith("torchrl."), "installed already"
    result = doctest.testmod(_install, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 10 and result.failed == 0
    assert torchrl.data.ListStorage.__module__.startswith("torchrl.")
