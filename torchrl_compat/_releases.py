"""The torchrl release the package follows, and every behaviour that differs between releases.

``torchrl_compat`` behaves as the torchrl release installed beside it (0.11.x to 0.14.x: a
release outside that range is followed as the nearest one). Without torchrl it behaves as the
newest, 0.14. The ``TORCHRL_COMPAT_RELEASE`` environment variable (``"0.11"``, ``"0.12"``,
``"0.13"`` or ``"0.14"``), read at import, asks for a release explicitly, with or without torchrl.

The code never compares version strings: it asks :func:`since` whether a behaviour applies,
and :data:`BEHAVIOURS` is the one table that says from which release each one does.

Examples:
    >>> from torchrl_compat._releases import NEWEST, OLDEST, followed_release
    >>> OLDEST <= followed_release() <= NEWEST
    True
"""
from __future__ import annotations

import os
import re
from importlib import metadata

__all__ = ["BEHAVIOURS", "FOLLOWED", "OLDEST", "NEWEST", "followed_release", "since"]

OLDEST = (0, 11)
NEWEST = (0, 14)

# behaviour -> the first torchrl release (major, minor) that has it. Grouped by family; each
# entry says what changes from that release on.
BEHAVIOURS: dict[str, tuple[int, int]] = {
    # ---- writers
    # round-robin writers save their write count: ``_write_count`` in ``state_dict``,
    # ``write_count`` in the ``dumps`` metadata (the max-value writer's too), and load it back
    "writer_write_count_checkpoint": (0, 14),
    # ``track_generations=True`` stamps each storage slot with a write generation (kept on
    # the storage, saved by the writer); ``generations_of``, ``tracks_generations`` and
    # ``write_at``; samples carry ``"index_generation"`` when the writer tracks them
    "writer_slot_generations": (0, 14),
    # ``WriterEnsemble`` registers a storage ensemble on its members, empties them, saves
    # their ``state_dict``s and reports their total write count
    "writer_ensemble_members": (0, 14),
    # ---- prioritized samplers
    # ---- slice samplers
    # ---- random samplers, storages
    # ---- replay buffers
    # ``set_at_``, ``set_`` and ``update_`` write into the stored tensordict in place
    "buffer_in_place_writes": (0, 12),
    # ``read_all_in_order`` and ``write_all`` read and write the storage in physical order
    "buffer_write_all": (0, 13),
    # ``update_if_present`` / ``submit_update_if_present`` patch the records whose slot
    # generation still matches, returning a ``ConditionalUpdateResult``
    "buffer_conditional_update": (0, 14),
}


def _parse(text: str) -> tuple[int, int] | None:
    match = re.match(r"\s*(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def _installed_torchrl() -> tuple[int, int] | None:
    if os.environ.get("TORCHRL_COMPAT_STANDALONE", "0") == "1":
        return None
    try:
        return _parse(metadata.version("torchrl"))
    except metadata.PackageNotFoundError:
        return None


def followed_release() -> tuple[int, int]:
    """The release followed: ``TORCHRL_COMPAT_RELEASE`` if set, else the installed torchrl's
    (clamped to ``[OLDEST, NEWEST]``), else :data:`NEWEST`.

    Raises:
        ValueError: ``TORCHRL_COMPAT_RELEASE`` is set to something other than a release
            between :data:`OLDEST` and :data:`NEWEST`.
    """
    asked = os.environ.get("TORCHRL_COMPAT_RELEASE", "").strip()
    if asked:
        release = _parse(asked)
        if release is None or not OLDEST <= release <= NEWEST:
            raise ValueError(
                f"TORCHRL_COMPAT_RELEASE={asked!r} is not a torchrl release torchrl_compat follows: "
                f"use one of 0.11, 0.12, 0.13, 0.14"
            )
        return release
    release = _installed_torchrl()
    if release is None:
        return NEWEST
    return min(max(release, OLDEST), NEWEST)


FOLLOWED = followed_release()


def since(behaviour: str) -> bool:
    """Whether ``behaviour`` (a key of :data:`BEHAVIOURS`) applies to the followed release."""
    return FOLLOWED >= BEHAVIOURS[behaviour]
