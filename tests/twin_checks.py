"""Checks that a class of ours stands in for its torchrl twin: the same API, and none of
torchrl's code running on it."""
from __future__ import annotations

import inspect

# Attributes every class has (or torchrl's ABCs and generics add), which hold no code of theirs.
_CLASS_METADATA = frozenset({
    "__dict__", "__weakref__", "__module__", "__doc__", "__annotations__", "__qualname__",
    "__firstlineno__", "__static_attributes__", "__abstractmethods__", "_abc_impl",
    "__parameters__", "__orig_bases__",
})


def params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


# torchrl's Ray hook (its ray_buffer module): it wraps whatever class it is called on, so
# the buffers inherit it from their twins (see docs/torchrl_compat.md).
LEFT_TO_TORCHRL = frozenset({"as_remote"})


def own_attribute(cls, member):
    """``member`` as ``cls``'s own classes define it: looked up along its MRO without the
    torchrl twins (which every class of ours lists last, and which would answer for any
    member torchrl has); ``None`` when none of ours defines it."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("torchrl.") or klass is object:
            continue
        if member in vars(klass):
            return vars(klass)[member]
    return None


def assert_api_matches(ours, ref, left_to_torchrl=LEFT_TO_TORCHRL):
    """Same constructor and public members (kinds, property setters, parameter names, kinds
    and defaults) as torchrl's class, the installed release's; our own bases in torchrl's
    order, its twin after.

    Each public member of the installed torchrl's class must be defined by one of our own
    classes (the twin, listed last in our bases, would otherwise answer with torchrl's), but
    those in ``left_to_torchrl``."""
    assert params(ours) == params(ref)
    public = {m for m in dir(ref) if not m.startswith("_")}
    public |= {"__init__", "__len__", "__getitem__", "__setitem__", "__iter__"}
    for member in sorted(public - set(left_to_torchrl)):
        if not hasattr(ref, member) or inspect.getattr_static(ref, member) is vars(object).get(member):
            continue
        our_attr = own_attribute(ours, member)
        assert our_attr is not None, f"{ours.__name__}.{member} is torchrl's, not ours"
        ref_attr = inspect.getattr_static(ref, member)
        assert isinstance(our_attr, property) == isinstance(ref_attr, property), member
        if isinstance(ref_attr, property):
            assert (our_attr.fset is None) == (ref_attr.fset is None), member
        elif callable(ref_attr):
            expected = params(getattr(ref, member))
            if [kind for _, kind, _ in expected[1:]] == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]:
                continue  # a torchrl decorator without functools.wraps hides the signature
            assert params(getattr(ours, member)) == expected, member
    assert issubclass(ours, ref)
    own = [b.__name__ for b in ours.__mro__[1:-1] if not b.__module__.startswith("torchrl.")]
    assert own == [b.__name__ for b in ref.__mro__[1:-1]]


def assert_no_torchrl_code(cls, owner_module: str = "torchrl_compat", left_to_torchrl=frozenset()):
    """The torchrl twins in ``cls``'s bases only answer isinstance checks: every attribute
    they define, but those named in ``left_to_torchrl``, resolves, on ``cls``, to a class of
    ``owner_module`` (or a module inside it)."""
    twins = [c for c in cls.__mro__ if c.__module__.startswith("torchrl.")]
    assert twins, cls
    for twin in twins:
        for attr in set(vars(twin)) - _CLASS_METADATA - left_to_torchrl:
            owner = next(c for c in cls.__mro__ if attr in vars(c))
            module = owner.__module__
            assert module == owner_module or module.startswith(owner_module + "."), (cls.__name__, attr, owner)
