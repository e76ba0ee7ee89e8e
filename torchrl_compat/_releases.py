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
    # ---- prioritized samplers
    # ---- slice samplers
    # without traj_key / end_key, the trajectory key is looked up in the storage at the
    # first sample: ("collector", "traj_ids"), then "episode", else the end key
    "slice_traj_key_auto": (0, 13),
    # the first step of every slice is marked in the stored is_init entry, when there is one
    "slice_init_marker": (0, 13),
    # pad_output=True pads short slices to the requested length, with a ("collector", "mask")
    "slice_pad_output": (0, 13),
    # SliceSamplerWithoutReplacement.dumps / loads write and read its permutation state
    "slice_without_replacement_dumps": (0, 13),
    # end_keys (OR-ed end signals), init_key, fragmented / step_key, can_sample
    # (_sampleable_count), mark_update / _end_stream, the wider repr
    "slice_end_keys_fragmented": (0, 14),
    # the trajectory bounds read from a storage are cached by its _mutation_revision, and
    # the cursor is read from _last_cursor_index
    "slice_mutation_revision": (0, 14),
    # torchrl.data.replay_buffers.utils.find_start_stop_traj: a public function (one-step
    # trajectory-id signals hold one trajectory; an empty signal or cursor raises)
    "find_start_stop_traj_public": (0, 14),
    # ---- random samplers, storages
    # ``Sampler(replacement=False)`` dispatches to the without-replacement variant
    "sampler_replacement_argument": (0, 13),
    # a storage's / sampler's load_state_dict copies the tensors it is given
    "load_state_dict_clones": (0, 13),
    # storages count their mutations (``_mutation_revision``) and expose the last written
    # time coordinate (``_last_cursor_index``); samplers answer ``can_sample``
    "storage_mutation_revision": (0, 14),
    "sampler_can_sample": (0, 14),
    # a shared_init LazyTensorStorage sets its device to the CPU (its memory maps') once
    # initialized, warning when another was asked for
    "storage_shared_init_cpu": (0, 14),
    # ---- replay buffers
    # constructor: sample_unit, consume_after_n_samples, service_backend(_options),
    # transport(_options); the direct service API (start, client, shutdown, synchronize...)
    "buffer_service_arguments": (0, 14),
    # stats(), can_sample(), query()
    "buffer_stats_query": (0, 14),
    # the prefetch queue is kept full after each sample and saved by state_dict, dumps and
    # pickling (``_prefetch_state``, ``prefetch.pkl``)
    "buffer_prefetch_state": (0, 14),
    # transforms of a shared buffer share their state (``share_memory_``)
    "buffer_shared_transforms": (0, 14),
    # ReplayBufferEnsemble: p="sampleable", routing_key, end_streams, stats
    "ensemble_sampleable_routing": (0, 14),
    # consume_after_n_samples / ConsumingSampler: items sampled n times leave the buffer
    # (len() counts the live ones) and writes fill their slots first
    "buffer_consume_after_n_samples": (0, 14),
    # ReplayBufferEnsemble members built from components are buffers too (``rb[0]`` is one)
    "ensemble_members_from_components": (0, 14),
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
