"""Keyword arguments that only some torchrl releases take.

A constructor written once with every release's keywords is narrowed, for a release that
lacks some of them, to that release's signature: ``inspect.signature`` shows it, and passing
one of the missing keywords raises the ``TypeError`` Python raises for an unknown keyword.
"""
from __future__ import annotations

import functools
import inspect

from ._releases import since

__all__ = ["keywords_since"]


def keywords_since(function, keywords: dict[str, str], *, name: str | None = None):
    """``function`` with the keywords of ``keywords`` (keyword -> behaviour of
    :data:`~torchrl_compat._releases.BEHAVIOURS`) the followed release lacks removed.

    Args:
        function (callable): the full function (every release's keywords).
        keywords (dict): each release-dependent keyword and the behaviour that brings it.

    Keyword Args:
        name (str, optional): the name the returned function takes (e.g. ``"__init__"`` for a
            constructor written as a private method). Defaults to ``function``'s.

    Examples:
        >>> def make(*, a=1, b=2):
        ...     return a, b
        >>> narrowed = keywords_since(make, {"b": "slice_end_keys_fragmented"})
        >>> narrowed(a=3)[0]
        3
    """
    missing = [keyword for keyword, behaviour in keywords.items() if not since(behaviour)]
    signature = inspect.signature(function)
    narrowed = signature.replace(
        parameters=[p for p in signature.parameters.values() if p.name not in missing]
    )

    @functools.wraps(function)
    def with_release_keywords(*args, **kwargs):
        for keyword in missing:
            if keyword in kwargs:
                raise TypeError(
                    f"{qualname}() got an unexpected keyword argument '{keyword}'"
                )
        return function(*args, **kwargs)

    if name is not None:
        with_release_keywords.__name__ = name
        owner, _, _ = function.__qualname__.rpartition(".")
        with_release_keywords.__qualname__ = f"{owner}.{name}" if owner else name
    qualname = with_release_keywords.__qualname__
    with_release_keywords.__signature__ = narrowed
    return with_release_keywords
