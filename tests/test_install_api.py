"""Every class install() stands in for torchrl's has the installed torchrl release's API.

``twin_checks.assert_api_matches`` compares each public member and signature with the
torchrl class of the same name, whichever release is installed (0.11 to 0.14), and asks that
each member be defined by one of our classes, not answered by the torchrl twin listed last in
our bases.

``API_GAPS`` names, per class, what torchrl 0.14.1 has and ours do not have yet: the case is
``xfail(strict=True)`` only where the installed torchrl's class has one of those members or
arguments, so it passes with torchrl 0.11 and turns into a failure (XPASS) once ours catch up,
which is when its entry goes.
"""
from __future__ import annotations

import inspect

import pytest

import torchrl
import torchrl.data.replay_buffers as T
import torchrl_compat as O
from twin_checks import LEFT_TO_TORCHRL, assert_api_matches

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# class -> the torchrl 0.14.1 members and constructor arguments ours lack.
API_GAPS = {
}
_FAMILY = {
    "Buffer": "buffers", "Sampler": "samplers", "Storage": "storages", "Writer": "writers",
}


def _torchrl_own(name):
    cls = getattr(T, name)
    return next(c for c in cls.__mro__ if c.__name__ == name and c.__module__.startswith("torchrl."))


def _stand_ins():
    """The classes install() puts in torchrl's place whose twins they derive from (the
    checkpointers, which torchrl never type-checks, derive from no twin)."""
    names = []
    for name in sorted(set(O.__all__) & set(dir(T))):
        ours = getattr(O, name)
        if isinstance(ours, type) and issubclass(ours, _torchrl_own(name)):
            names.append(name)
    return names


def _tensorclass_made(cls):
    """The members tensordict's tensorclass machinery wrote on ``cls`` (``batch_size``,
    ``device``, ``names`` of a tensorclass): tensordict's code, which a tensorclass of ours
    deriving from ``cls`` inherits rather than gets again, not torchrl's."""
    made = set()
    for member, attr in vars(cls).items():
        code = attr.fget if isinstance(attr, property) else attr
        if getattr(code, "__module__", "").startswith("tensordict."):
            made.add(member)
    return frozenset(made)


def _has_any(cls, members):
    parameters = inspect.signature(cls.__init__).parameters
    return any(hasattr(cls, m) or m in parameters for m in members)


def _case(name):
    gaps = API_GAPS.get(name, ())
    theirs = _torchrl_own(name)
    if not gaps or not _has_any(theirs, gaps):
        return name
    present = [m for m in gaps if hasattr(theirs, m) or m in inspect.signature(theirs.__init__).parameters]
    family = next((f for key, f in _FAMILY.items() if key in name), "buffers")
    reason = f"torchrl {torchrl.__version__}'s {name} has {', '.join(present)}: our {family} do not yet"
    return pytest.param(name, marks=pytest.mark.xfail(reason=reason, strict=True))


def test_every_stand_in_is_checked():
    names = _stand_ins()
    assert {"ReplayBuffer", "PrioritizedSampler", "LazyTensorStorage", "RoundRobinWriter"} <= set(names)
    assert set(API_GAPS) <= set(names)


@pytest.mark.parametrize("name", [_case(name) for name in _stand_ins()])
def test_api_matches_the_installed_torchrl(name):
    theirs = _torchrl_own(name)
    assert_api_matches(getattr(O, name), theirs, left_to_torchrl=LEFT_TO_TORCHRL | _tensorclass_made(theirs))
