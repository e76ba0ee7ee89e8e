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

import functools
import inspect
import os
import re
from importlib import metadata

__all__ = ["BEHAVIOURS", "FOLLOWED", "OLDEST", "NEWEST", "followed_release", "keywords_since", "since"]

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
    # ``WriterEnsemble`` registers a storage ensemble on its members and reports their total
    # write count
    "writer_ensemble_members": (0, 14),
    # ---- prioritized samplers
    # PrioritizedSampler(device=...) and its ``device`` property: the trees follow a CUDA
    # storage (or the given device); the prioritized buffers take ``sampler_device`` and
    # ``sync``. The ``alpha`` setter refuses a negative value.
    "prioritized_device_argument": (0, 13),
    # ``default_priority`` is the raw largest priority (1.0 without one): new items get
    # ``(max_p + eps) ** alpha``, where 0.11-0.12 applied alpha twice.
    "prioritized_raw_default_priority": (0, 13),
    # With ``max_priority_within_buffer``, the largest priority rebuilt from the trees is
    # turned back into a raw priority (not kept as ``p ** alpha``); with alpha == 0 it is kept.
    "prioritized_raw_max_within_buffer": (0, 13),
    # That rebuild reads the stored values in the trees' dtype (0.11-0.13 gather them into a
    # tensor of torch's default dtype, a list of Python floats: fp64 trees round to fp32).
    "prioritized_max_read_in_tree_dtype": (0, 14),
    # ``load_state_dict`` copies the trees and the largest priority (0.11-0.12 alias them).
    "prioritized_load_state_dict_copies": (0, 13),
    # Setting ``alpha`` on a within-buffer sampler holding priorities warns, once (0.13 only:
    # replaced by the re-transform below).
    "prioritized_alpha_change_warns": (0, 13),
    # Setting ``alpha`` re-transforms the stored ``(p + eps) ** alpha`` to the new exponent.
    "prioritized_alpha_retransforms": (0, 14),
    # state_dict / dumps carry ``_schema_version`` (1); an older checkpoint of a within-buffer
    # sampler gets its largest priority rebuilt from the trees on load.
    "prioritized_state_schema": (0, 14),
    # PrioritizedSliceSampler.load_state_dict loads the priorities (0.11-0.12: a no-op).
    "prioritized_slice_loads_state_dict": (0, 13),
    # The prioritized buffers take ``sample_unit``, ``transport`` and ``transport_options``.
    "prioritized_buffer_transport": (0, 14),
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
    # a lazy stack (LazyStackedTensorDict) is written into a tensordict storage as it is,
    # without a dense copy first: ``update_at_`` at an index, ``_stack_onto_`` at a slice
    "storage_lazy_stack_direct_write": (0, 12),
    # ---- replay buffers
    # ``set_at_``, ``set_`` and ``update_`` write into the stored tensordict in place
    "buffer_in_place_writes": (0, 12),
    # ``read_all_in_order`` and ``write_all`` read and write the storage in physical order
    "buffer_write_all": (0, 13),
    # ``update_if_present`` / ``submit_update_if_present`` patch the records whose slot
    # generation still matches, returning a ``ConditionalUpdateResult``
    "buffer_conditional_update": (0, 14),
    # constructor: sample_unit, consume_after_n_samples, service_backend(_options),
    # transport(_options); the direct service API (start, client, shutdown, synchronize...)
    "buffer_service_arguments": (0, 14),
    # stats(), can_sample(), query()
    "buffer_stats_query": (0, 14),
    # the prefetch queue is kept full after each sample and saved by state_dict, dumps and
    # pickling (``_prefetch_state``, ``prefetch.pkl``)
    "buffer_prefetch_state": (0, 14),
    # the refusals to share a prioritized sampler or a prefetching buffer between processes
    # say what to do instead (sync=False; prefetch=0 or shared=False)
    "multiprocess_errors_name_fix": (0, 13),
    # transforms of a shared buffer share their state (``share_memory_``)
    "buffer_shared_transforms": (0, 14),
    # sample units: torchrl_compat exports SampleUnit, Transition and Sequence
    # (torchrl_compat.sample_units, importable in every release), and install() stands them,
    # and torchrl's boundary queries (_boundary_distances_1d / _nd, _make_boundary_search_nd),
    # in for torchrl's
    "sample_units": (0, 14),
    # ReplayBufferEnsemble: p="sampleable", routing_key, end_streams, stats
    "ensemble_sampleable_routing": (0, 14),
    # consume_after_n_samples / ConsumingSampler: items sampled n times leave the buffer
    # (len() counts the live ones) and writes fill their slots first
    "buffer_consume_after_n_samples": (0, 14),
    # ReplayBufferEnsemble members built from components are buffers too (``rb[0]`` is one)
    "ensemble_members_from_components": (0, 14),
    # StorageEnsemble and WriterEnsemble save and load their members' ``state_dict``s (one
    # entry per member, ``"0"``, ``"1"``, ...; SamplerEnsemble always has), and the three
    # ensembles empty their members, so ReplayBufferEnsemble.state_dict / empty work
    "ensemble_members_state": (0, 14),
    # StorageEnsemble.max_size: the sum of its storages' (0.11-0.13: no such attribute)
    "storage_ensemble_max_size": (0, 14),
    # StorageEnsembleCheckpointer writes metadata.json ({"empty_members": [...]}), skips
    # dumping the empty members and empties them on load
    "ensemble_checkpoint_empty_members": (0, 14),
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


def keywords_since(function, keywords: dict[str, str] | None = None, *, name: str | None = None,
                   **behaviour_of_keyword: str):
    """``function`` with the signature of the followed release: a function written once with
    every release's keywords loses those whose behaviour (a key of :data:`BEHAVIOURS`) does
    not apply. ``inspect.signature`` then shows the release's signature, and passing one of
    the dropped keywords raises the ``TypeError`` Python raises for an unknown keyword, as
    that release's torchrl does.

    Args:
        function (callable): the full function (every release's keywords).
        keywords (dict, optional): keyword -> behaviour; may also be given as keyword
            arguments (``keywords_since(f, device="prioritized_device_argument")``).

    Keyword Args:
        name (str, optional): the name the returned function takes (``"__init__"`` for a
            constructor written as a private method). Defaults to ``function``'s.

    Examples:
        >>> def make(size, *, device=None):
        ...     return size, device
        >>> make = keywords_since(make, device="prioritized_device_argument")
        >>> make(3)
        (3, None)
    """
    behaviours = {**(keywords or {}), **behaviour_of_keyword}
    signature = inspect.signature(function)
    unknown = set(behaviours) - set(signature.parameters)
    if unknown:
        raise ValueError(f"{function.__qualname__} has no parameter(s) {sorted(unknown)}")
    missing = frozenset(keyword for keyword, behaviour in behaviours.items() if not since(behaviour))

    @functools.wraps(function)
    def with_release_keywords(*args, **kwargs):
        refused = missing.intersection(kwargs)
        if refused:
            raise TypeError(f"{qualname}() got an unexpected keyword argument {min(refused)!r}")
        return function(*args, **kwargs)

    if name is not None:
        with_release_keywords.__name__ = name
        owner, _, _ = function.__qualname__.rpartition(".")
        with_release_keywords.__qualname__ = f"{owner}.{name}" if owner else name
    qualname = with_release_keywords.__qualname__
    with_release_keywords.__signature__ = signature.replace(
        parameters=[p for p in signature.parameters.values() if p.name not in missing]
    )
    return with_release_keywords
