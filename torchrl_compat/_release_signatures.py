"""Keyword arguments that only some torchrl releases take.

A method is written once with every release's keywords. :func:`keywords_since` gives it the
signature of the followed release: the keywords whose behaviour (a key of
:data:`~torchrl_compat._releases.BEHAVIOURS`) does not apply leave its ``__signature__``, and
passing one raises the ``TypeError`` Python raises for an unknown keyword, as that release's
torchrl does.

Examples:
    >>> def make(size, *, device=None):
    ...     return size, device
    >>> make = keywords_since(make, device="prioritized_device_argument")
    >>> make(3)
    (3, None)
"""
from __future__ import annotations

import functools
import inspect

from ._releases import since

__all__ = ["keywords_since"]


def keywords_since(func, **behaviour_of_keyword: str):
    """``func`` as the followed release has it: each keyword named here is kept only when its
    behaviour applies; otherwise it is dropped from the signature and refused when passed."""
    missing = frozenset(name for name, behaviour in behaviour_of_keyword.items() if not since(behaviour))
    if not missing:
        return func
    signature = inspect.signature(func)
    unknown = missing - set(signature.parameters)
    if unknown:
        raise ValueError(f"{func.__qualname__} has no parameter(s) {sorted(unknown)}")

    @functools.wraps(func)
    def release_method(*args, **kwargs):
        refused = missing.intersection(kwargs)
        if refused:
            raise TypeError(
                f"{func.__qualname__}() got an unexpected keyword argument {min(refused)!r}"
            )
        return func(*args, **kwargs)

    release_method.__signature__ = signature.replace(
        parameters=[p for name, p in signature.parameters.items() if name not in missing]
    )
    return release_method
