"""Shared machinery of the torchrl matrix tests: data, records, and the two runs.

Every matrix case runs one scenario twice, from the same seeds: once with the installed
torchrl's own classes in torchrl's modules (``torchrl_compat`` uninstalled for the run), once with
``torchrl_compat.install()`` in force, each time taking every class from torchrl's modules
by name, as torchrl code does. The scenario records what each step returns (or the type and
message of the exception it raises); the two records must be equal, tensor for tensor. Two
equal failures prove nothing: each scenario declares (:func:`must_run`) the steps that must
return on torchrl's side, and each case the ones torchrl is meant to refuse there
(``check_same(..., raises=...)``); a scenario that itself raises fails the case. A case that
a feature of the installed torchrl ours lack so far fails is an expected failure (``GAPS``).
"""
from __future__ import annotations

import contextlib
import inspect
import os
import random
import re
import sys
import traceback

import numpy as np
import pytest
import torch
from tensordict import is_tensor_collection, tensorclass, TensorDict, TensorDictBase

import torchrl_compat
from torchrl_compat._install import STAND_IN_MODULES

CAP = 8  # capacity along the extended dim
COLS = 2  # size of the second batch dim when ndim == 2
BATCH = 4
SEED = 0


@tensorclass
class Transition:
    obs: torch.Tensor
    episode: torch.Tensor
    p: torch.Tensor


class Classes:
    """torchrl's classes, looked up by name in their torchrl modules when asked for."""

    def __getattr__(self, name):
        for module_name in STAND_IN_MODULES:
            module = sys.modules.get(module_name)  # sample_units: torchrl 0.14 only
            if module is not None and name in vars(module):
                return getattr(module, name)
        raise AttributeError(name)


CLASSES = Classes()


# What every matrix test module starts with (both imported there by name).
WARNING_FILTERS = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


@pytest.fixture(scope="module", autouse=True)
def installed_for_the_module():
    """``install()`` in force for a whole test module, undone after it."""
    replaced = torchrl_compat.install()
    assert replaced, "torchrl_compat.install() replaced nothing"
    yield replaced
    torchrl_compat.uninstall()


@contextlib.contextmanager
def torchrl_own_classes():
    """torchrl's own classes in torchrl's modules for the duration (install()ed after)."""
    torchrl_compat.uninstall()
    try:
        yield
    finally:
        torchrl_compat.install()


# =============================================================================
# Data
# =============================================================================
def batch_shape(n, ndim):
    # torchrl extends an ndim == 2 buffer along dim 1 (time), one row per environment.
    return (n,) if ndim == 1 else (COLS, n)


def make_data(kind, n, ndim, start=0):
    """``n`` items (time steps of ``COLS`` environments when ``ndim == 2``) numbered from
    ``start``; each value tells its item.

    ``episode`` runs in threes along time (per environment), ``p`` is a priority in [1, 5].
    """
    shape = batch_shape(n, ndim)
    step = torch.arange(start, start + n).expand(shape)
    env = torch.zeros(shape, dtype=torch.long) if ndim == 1 else torch.arange(COLS).unsqueeze(1).expand(shape)
    item = step * COLS + env if ndim == 2 else step
    obs = item.unsqueeze(-1) * 10.0 + torch.arange(3.0)
    episode = step // 3 + 1000 * env
    p = (item % 5 + 1).float()
    if kind == "tensor":
        return obs
    if kind == "tensordict":
        done = (step % 3 == 2).unsqueeze(-1)
        return TensorDict(
            {"obs": obs, "episode": episode, "p": p, ("next", "reward"): p.unsqueeze(-1), ("next", "done"): done},
            batch_size=shape,
        )
    if kind == "tensorclass":
        return Transition(obs=obs, episode=episode, p=p, batch_size=shape)
    return {"obs": obs, "extra": (p, {"episode": episode})}


def _leaves_map(fn, data):
    if isinstance(data, dict):
        return torch.utils._pytree.tree_map(fn, data)
    return fn(data)


def first_item(data, ndim):
    """The first item of ``data``: what ``add`` takes (one time step when ``ndim == 2``)."""
    return _leaves_map(lambda x: x[0] if ndim == 1 else x[:, 0], data)


def zeros_for_storage(kind, ndim):
    """Zeroed data filling a preallocated ``TensorStorage`` (time first, as stored)."""
    full = make_data(kind, CAP, ndim)
    if ndim == 2:
        full = _leaves_map(lambda x: x.transpose(0, 1), full)
    return _leaves_map(torch.zeros_like, full) if not is_tensor_collection(full) else full.clone().zero_()


def max_size(ndim):
    return CAP if ndim == 1 else CAP * COLS


# =============================================================================
# Records
# =============================================================================
def canon(value):
    """A comparable, detached copy of what a step returned."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach().cpu().clone())
    if isinstance(value, np.ndarray):
        return ("tensor", torch.as_tensor(value).clone())
    if is_tensor_collection(value):
        td = value if isinstance(value, TensorDictBase) else value.to_tensordict()
        leaves = [(str(key), canon(td.get(key))) for key in sorted(td.keys(True, True), key=str)]
        return ("collection", type(value).__name__, tuple(value.batch_size), leaves)
    if isinstance(value, dict):
        return ("dict", [(str(k), canon(value[k])) for k in sorted(value, key=str)])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [canon(v) for v in value])
    if isinstance(value, torch.Size):
        return ("size", tuple(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return ("object", type(value).__name__)


def _tensors_equal(x, y) -> bool:
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    if x.is_floating_point():
        return bool(torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num()))
    return bool(torch.equal(x, y))


def difference(a, b, path=""):
    """Where canonical values ``a`` and ``b`` first differ (``None`` when equal)."""
    if isinstance(a, tuple) and a and a[0] == "tensor":
        if not (isinstance(b, tuple) and b and b[0] == "tensor"):
            return f"{path}: {_short(a)} vs {_short(b)}"
        if not _tensors_equal(a[1], b[1]):
            return f"{path}: {_short(a[1])} vs {_short(b[1])}"
        return None
    if isinstance(a, (tuple, list)) and isinstance(b, type(a)) and len(a) == len(b):
        for k, (x, y) in enumerate(zip(a, b)):
            found = difference(x, y, f"{path}[{k}]")
            if found:
                return found
        return None
    if type(a) is type(b) and a == b:
        return None
    return f"{path}: {_short(a)} vs {_short(b)}"


class Record:
    """What one run of a scenario returned, step by step: ``(label, value, message)``.

    ``message`` is the last line of a raised exception's text, the run's directory and the
    modules of torchrl's and ours named alike (:func:`_same_words`): compared as well as the
    exception type.
    """

    def __init__(self, directory) -> None:
        self.steps = []
        self._directory = directory
        self._fresh_dirs = 0

    def __call__(self, label, value):
        self._add(label, canon(value), None)
        return value

    def _add(self, label, value, message):
        assert label not in {step[0] for step in self.steps}, f"step {label!r} recorded twice"
        self.steps.append((label, value, message))

    def call(self, label, fn, *args, **kwargs):
        """Records ``fn(*args, **kwargs)``, or the type of what it raises (then ``None``)."""
        return self._call(label, fn, args, kwargs, self)

    def succeeds(self, label, fn, *args, **kwargs) -> bool:
        """As :meth:`call`; ``True`` when ``fn`` returned (only a raise records a message)."""
        self.call(label, fn, *args, **kwargs)
        return self.steps[-1][2] is None

    def call_quietly(self, label, fn, *args, **kwargs):
        """As :meth:`call`, recording only the type of what ``fn`` returns."""
        return self._call(label, fn, args, kwargs, lambda label, value: self._add(label, ("returned", type(value).__name__), None) or value)

    def _call(self, label, fn, args, kwargs, keep):
        try:
            value = fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - the type is the record
            self.raised(label, err)
            return None
        return keep(label, value)

    def raised(self, label, err):
        message = "".join(traceback.format_exception_only(err)).strip()
        self._add(label, ("raises", type(err).__name__), _same_words(message, self._directory)[-500:])

    def dir(self, name):
        path = os.path.join(self._directory, name)
        os.makedirs(path, exist_ok=True)
        return path

    def fresh_dir(self, name):
        """A new directory ``name-<k>`` (each storage of a run writes in its own)."""
        self._fresh_dirs += 1
        return self.dir(f"{name}-{self._fresh_dirs}")

    def files(self, label, path):
        """Records the relative paths of the files under ``path``."""
        found = sorted(
            os.path.relpath(os.path.join(root, name), path)
            for root, _, names in os.walk(path)
            for name in names
        )
        return self(label, found)


@contextlib.contextmanager
def _filled_uninitialized_memory():
    """``torch.empty`` fills with NaN / the largest integer, so that the unwritten part of
    a storage (which ``state_dict`` returns too) compares equal between runs."""
    mode = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(mode[0], warn_only=mode[1])


def run(scenario, directory, **params) -> Record:
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    random.seed(SEED)
    record = Record(directory)
    with _filled_uninitialized_memory():
        try:
            scenario(record, CLASSES, **params)
        except Exception as err:  # noqa: BLE001
            record.raised("uncaught", err)
    return record


# torchrl's class paths and ours (torchrl.data.replay_buffers.storages.ListStorage,
# torchrl_compat.storages.ListStorage): the same class to a reader of an error message.
_MODULE_PATH = re.compile(r"\btorchrl(?:_compat)?(?:\.\w+)*\.(?=[A-Z_])")


def _same_words(message, directory):
    """What an error message says, without the directory of a run (its own or the other's,
    beside it) or the module of a class."""
    lines = message.strip().splitlines()
    last = lines[-1] if lines else ""
    last = re.sub(re.escape(os.path.dirname(os.path.abspath(directory))) + r"/[^/\s]+", "<run>", last)
    return _MODULE_PATH.sub("", last)


def _short(value, limit=600):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _raises_one_of(value, names) -> bool:
    names = (names,) if isinstance(names, str) else tuple(names)
    return isinstance(value, tuple) and len(value) == 2 and value[0] == "raises" and value[1] in names


def assert_records_equal(expected: Record, got: Record, torchrl_fails=None) -> None:
    """Fails listing every step where ``got`` (ours) differs from ``expected`` (torchrl).

    ``torchrl_fails`` maps the label of a step where torchrl raises on valid input (a bug
    of some torchrl release) to ``(exception type name, check)`` (or a tuple of names, one
    per release): where the installed torchrl raises that type there, ``check(value,
    message)`` must accept what ours did instead; where it does not (a release with the bug
    fixed), ours must match it.
    """
    torchrl_fails = torchrl_fails or {}
    theirs = {label: (value, message) for label, value, message in expected.steps}
    ours = {label: (value, message) for label, value, message in got.steps}
    problems = []
    for label, (value, message) in theirs.items():
        if label not in ours:
            problems.append(f"{label}: torchrl_compat never got there (torchrl: {_short(value)})")
            continue
        if label in torchrl_fails and _raises_one_of(value, torchrl_fails[label][0]):
            # A torchrl bug of the installed release: ours must do what the check accepts.
            # Where the installed release has it fixed, ours must do what torchrl does.
            if not torchrl_fails[label][1](*ours[label]):
                problems.append(f"{label}: torchrl_compat {_short(ours[label])} where torchrl raises {message}")
            continue
        found = difference(ours[label][0], value)
        if not found and message is not None and ours[label][1] != message:
            found = "the same exception type, another message"
        if found:
            notes = " ".join(f"[{who}: {m}]" for who, m in (("ours", ours[label][1]), ("torchrl", message)) if m)
            problems.append(f"{label}: ours vs torchrl {found} {notes}")
    problems += [f"{label}: only torchrl_compat got there" for label in ours if label not in theirs]
    if problems:
        raise AssertionError("\n".join(["torchrl_compat differs from torchrl:", *problems]))


def run_both(scenario, tmp_path, **params):
    """Runs ``scenario`` on torchrl's classes, then on ours; returns both records."""
    with torchrl_own_classes():
        expected = run(scenario, tmp_path / "torchrl", **params)
    got = run(scenario, tmp_path / "ours", peer=tmp_path / "torchrl", **params)
    return expected, got


def must_run(*labels, must_raise=()):
    """Declares a scenario's decisive steps: ``labels`` must return on torchrl's side (and,
    the records being equal, on ours), ``must_raise`` must raise there, in every case
    unless the case says otherwise (``check_same(..., raises=...)``).

    A label ending in ``*`` stands for every step whose label starts with the rest.
    """

    def declare(scenario):
        scenario.must_run = tuple(labels)
        scenario.must_raise = tuple(must_raise)
        return scenario

    return declare


def _matches(pattern, label):
    return label.startswith(pattern[:-1]) if pattern.endswith("*") else label == pattern


def assert_ran(scenario, record: Record, raises=None, torchrl_fails=None) -> None:
    """Fails where torchrl's run of ``scenario`` (``record``) proves nothing: the scenario
    raised itself (``"uncaught"``), a step of ``must_run`` is missing or raised, or one of
    ``must_raise`` returned, except as the case's ``raises`` (label -> exception type name:
    the decisive steps torchrl refuses in that case, meant to; a label ending in ``*`` stands
    for every step whose label starts with the rest; ``None``: a step that an earlier
    refusal keeps the scenario from) says, or a torchrl bug of
    ``torchrl_fails`` (see :func:`assert_records_equal`) that the installed release has."""
    steps = {label: value for label, value, _ in record.steps}
    messages = {label: message for label, _, message in record.steps}
    problems = []
    declared = {}  # label -> the exception type the case declares there
    for pattern, name in (raises or {}).items():
        found = [label for label in steps if _matches(pattern, label)]
        if name is None:  # a step an earlier refusal keeps the scenario from
            problems += [f"{label}: meant never to be reached" for label in found]
            declared[pattern] = None
            continue
        if not found:
            problems.append(f"{pattern}: meant to raise {name}, never got there")
        for label in found:
            declared[label] = name
            if steps[label] != ("raises", name):
                problems.append(f"{label}: meant to raise {name}, got {_short(steps[label])}")
    for label, (names, _) in (torchrl_fails or {}).items():
        if _raises_one_of(steps.get(label), names):
            declared.setdefault(label, steps[label][1])
    raises = declared
    if "uncaught" in steps and "uncaught" not in raises:
        problems.append(f"the scenario raised: {messages['uncaught']}")
    for pattern in getattr(scenario, "must_run", ()):
        found = [label for label in steps if _matches(pattern, label)]
        if not found and not (pattern in raises and raises[pattern] is None):
            problems.append(f"{pattern}: never got there")
        problems += [
            f"{label}: raised {messages[label]}" for label in found
            if messages[label] is not None and label not in raises
        ]
    for pattern in getattr(scenario, "must_raise", ()):
        found = [label for label in steps if _matches(pattern, label)]
        if not found:
            problems.append(f"{pattern}: never got there")
        problems += [f"{label}: returned where it must raise" for label in found if messages[label] is None]
    if problems:
        raise AssertionError("\n".join(["torchrl's run of the scenario proves nothing there:", *problems]))


def check_same(scenario, tmp_path, torchrl_fails=None, raises=None, **params):
    """Runs ``scenario`` on torchrl's classes and ours; fails where the records differ (see
    :func:`assert_records_equal`) or where torchrl's run proves nothing (:func:`assert_ran`).
    A scenario of the matrix files must declare its decisive steps (:func:`must_run`)."""
    if scenario.__module__.startswith("test_torchrl_matrix"):
        assert hasattr(scenario, "must_run"), f"{scenario.__name__} declares no must_run"
    expected, got = run_both(scenario, tmp_path, **params)
    assert_ran(scenario, expected, raises, torchrl_fails)
    assert_records_equal(expected, got, torchrl_fails)
    return expected, got


def raises_saying(pattern):
    """A ``torchrl_fails`` check: ours raised, with ``pattern`` in its message."""
    return lambda value, message: value[0] == "raises" and re.search(pattern, message or "") is not None


def returns(value, message):
    """A ``torchrl_fails`` check: ours returned."""
    return not (isinstance(value, tuple) and value and value[0] == "raises")


# =============================================================================
# Building buffers by name
# =============================================================================
TENSOR_STORAGES = ("TensorStorage", "LazyTensorStorage", "LazyMemmapStorage")
LIST_STORAGES = ("ListStorage", "LazyStackStorage", "CompressedListStorage")
BUFFERS = (
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "TensorDictReplayBuffer",
    "TensorDictPrioritizedReplayBuffer",
)
PRIORITIZED_BUFFERS = ("PrioritizedReplayBuffer", "TensorDictPrioritizedReplayBuffer")
TD_BUFFERS = ("TensorDictReplayBuffer", "TensorDictPrioritizedReplayBuffer")


def make_storage(C, record, name, kind, ndim):
    if name in LIST_STORAGES:
        return getattr(C, name)(CAP)
    if name == "TensorStorage":
        # Preallocated: the full capacity of zeroed items.
        return C.TensorStorage(zeros_for_storage(kind, ndim), ndim=ndim)
    if name == "LazyMemmapStorage":
        return C.LazyMemmapStorage(max_size(ndim), ndim=ndim, scratch_dir=record.fresh_dir("scratch"))
    return getattr(C, name)(max_size(ndim), ndim=ndim)


# name -> (class name, keyword arguments); max_capacity is added for prioritized samplers.
SLICE = dict(num_slices=2, traj_key="episode", strict_length=False)
SAMPLERS = {
    "RandomSampler": ("RandomSampler", {}),
    "SamplerWithoutReplacement": ("SamplerWithoutReplacement", {}),
    "SamplerWithoutReplacement-ordered": ("SamplerWithoutReplacement", dict(drop_last=True, shuffle=False)),
    "PrioritizedSampler": ("PrioritizedSampler", dict(alpha=0.7, beta=0.5)),
    "SliceSampler": ("SliceSampler", SLICE),
    "SliceSampler-end_key": ("SliceSampler", dict(slice_len=2, end_key=("next", "done"), strict_length=False)),
    "SliceSampler-strict": ("SliceSampler", dict(num_slices=2, traj_key="episode")),
    "SliceSampler-span": ("SliceSampler", dict(SLICE, span=True)),
    "SliceSamplerWithoutReplacement": ("SliceSamplerWithoutReplacement", SLICE),
    "SliceSamplerWithoutReplacement-ordered": ("SliceSamplerWithoutReplacement", dict(SLICE, shuffle=False)),
    "PrioritizedSliceSampler": ("PrioritizedSliceSampler", dict(SLICE, alpha=0.7, beta=0.5)),
}


def make_sampler(C, name, ndim):
    class_name, kwargs = SAMPLERS[name]
    if class_name.startswith("Prioritized"):
        kwargs = dict(kwargs, max_capacity=max_size(ndim))
    return getattr(C, class_name)(**kwargs)


def make_buffer(C, record, buffer, storage, kind, ndim, sampler=None, writer=None, **kwargs):
    kwargs.setdefault("batch_size", BATCH)
    generator = torch.Generator().manual_seed(7)
    if buffer != "PrioritizedReplayBuffer":  # which takes no generator= (set_rng below)
        kwargs["generator"] = generator
    kwargs["storage"] = make_storage(C, record, storage, kind, ndim)
    if buffer in TD_BUFFERS:
        kwargs.setdefault("priority_key", "p")
    if buffer in PRIORITIZED_BUFFERS:
        kwargs.update(alpha=0.7, beta=0.5)
    elif isinstance(sampler, str):
        kwargs["sampler"] = make_sampler(C, sampler, ndim)
    elif sampler is not None:
        kwargs["sampler"] = sampler
    if writer is not None:
        kwargs["writer"] = writer(C) if callable(writer) else writer
    rb = getattr(C, buffer)(**kwargs)
    if buffer == "PrioritizedReplayBuffer":
        rb.set_rng(generator)
    return rb


def dumps_and_loads(record, rb, build, peer) -> bool:
    """Dumps ``rb``, then loads its dump, and torchrl's (under ``peer``), into ``build()``
    buffers. ``False`` when ``dumps`` raised."""
    dump = record.dir("dump")
    if not record.succeeds("dumps", rb.dumps, dump):
        return False
    record.files("dumps files", dump)
    theirs = os.path.join(peer, "dump") if peer is not None else dump
    for label, source in (("own dump", dump), ("torchrl's dump", theirs)):
        fresh = build()
        if record.succeeds(f"loads, {label}", fresh.loads, source):
            record(f"len, {label}", len(fresh))
            record.call(f"rb[:], {label}", fresh.__getitem__, slice(None))
            record.call(f"sample, {label}", fresh.sample, return_info=True)
    return True


def tree_leaves(tree):
    """A segment tree's leaves, through the API torchrl's C++ trees and ``replay``'s share."""
    return torch.as_tensor(tree[torch.arange(len(tree))])


def is_prioritized(rb):
    return "Prioritized" in type(rb.sampler).__name__




# =============================================================================
# Features of the installed torchrl that ours lack so far
# =============================================================================
def torchrl_own(name):
    """torchrl's own class ``name`` (also while ours stand in for it in torchrl's modules)."""
    cls = getattr(CLASSES, name)
    return next(c for c in cls.__mro__ if c.__name__ == name and c.__module__.startswith("torchrl."))


def _source_of(name, member):
    return inspect.getsource(getattr(torchrl_own(name), member))


class Gap:
    """A feature of the installed torchrl that ours do not have yet, and the matrix cases
    (test node names, a regular expression) that fail without it.

    Args:
        reason (str): the feature, as the ``xfail`` reason gives it.
        torchrl_has (callable): whether the installed torchrl has the feature (found in
            torchrl's own classes, so a release without it runs the cases as they are).
        cases (str): the node names (``test_writers[RoundRobinWriter-ListStorage-ndim1]``)
            the feature fails, matched in full.
    """

    def __init__(self, reason, torchrl_has, cases) -> None:
        self.reason = reason
        self.torchrl_has = torchrl_has
        self.cases = re.compile(cases)


GAPS = ()


def gaps_of(node_name) -> list:
    """The reasons of the gaps of the installed torchrl that fail the case ``node_name``."""
    return [gap.reason for gap in GAPS if gap.cases.fullmatch(node_name) and gap.torchrl_has()]


@pytest.fixture(autouse=True)
def known_gaps(request):
    """Marks a matrix case ``xfail(strict=True)`` when a feature of the installed torchrl that
    ours lack fails it (``GAPS``): it fails for that reason, and passes (XPASS, a failure)
    once ours have the feature, which is when its entry goes."""
    reasons = gaps_of(request.node.name)
    if reasons:
        request.node.add_marker(pytest.mark.xfail(reason="; ".join(reasons), strict=True))
    yield
