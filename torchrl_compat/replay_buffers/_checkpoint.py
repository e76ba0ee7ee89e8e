"""A replay buffer's checkpoint, published whole and loaded whole.

The layout is torchrl 0.11's: ``storage/``, ``sampler/`` and ``writer/`` (each written by that
component's ``dumps``), ``rng_state/`` when the buffer has a generator, ``transform.t`` when
the transforms have a state, and ``buffer_metadata.json``.

torchrl writes these one after the other into the target directory: a dump interrupted
between two of them leaves a new storage beside an old sampler and writer, which ``loads``
accepts. Here :func:`dump_buffer` has every component dump into one partial directory and
publishes it in one rename (:func:`~torchrl_compat.checkpointers._publish.write_aside`); what
else the target directory held is carried over. :func:`load_buffer` reads and checks every
part (component checkpoints through their ``_read_checkpoint``) before any part changes.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from tensordict import TensorDict

from torchrl_compat.checkpointers._checks import (
    MetadataError,
    load_module_states,
    read_checkpoint_state,
    read_count,
    read_json_object,
    read_memmapped_state,
    read_torch_file,
)
from torchrl_compat.checkpointers._publish import carry_over, published_path, reading, write_aside
from torchrl_compat.checkpointers._priority_checks import check_cursor_fits_length, check_no_priority_past
from torchrl_compat.samplers._trees import leaf_blocks, read_leaves, tree_dtype
from torchrl_compat.checkpointers._storage_checks import StorageCheckpoint

__all__ = ["dump_buffer", "load_buffer"]

STORAGE_DIR, SAMPLER_DIR, WRITER_DIR = "storage", "sampler", "writer"
RNG_STATE_DIR = "rng_state"
TRANSFORM_FILE = "transform.t"
BUFFER_METADATA_FILE = "buffer_metadata.json"
PREFETCH_FILE = "prefetch.pkl"
# every entry a buffer checkpoint may hold; the rest of the directory is not the buffer's
BUFFER_ENTRIES = (
    STORAGE_DIR, SAMPLER_DIR, WRITER_DIR, RNG_STATE_DIR, TRANSFORM_FILE, BUFFER_METADATA_FILE, PREFETCH_FILE,
)


def dump_buffer(buffer, path) -> None:
    """Writes the checkpoint of ``buffer`` aside and publishes it as ``path`` in one rename.

    The previous checkpoint at ``path`` stays whole until the new one replaces it; entries of
    ``path`` that are not part of a buffer checkpoint are carried into the new directory.
    """
    path = Path(path).absolute()
    # held still for the whole dump: a prefetch still drawing would otherwise move the
    # generator (and the sampler) after their states were read, and the restored buffer
    # would draw other batches than this one
    with buffer._held_for_dump() as dump_release_entries:
        rng = buffer._rng
        transform_state = buffer._transform.state_dict()
        metadata = {"batch_size": buffer._batch_size, **buffer._release_metadata()}
        previous = published_path(path)

        def write(directory: Path) -> None:
            carry_over(previous, directory, skip=BUFFER_ENTRIES)
            buffer._storage.dumps(directory / STORAGE_DIR)
            buffer._sampler.dumps(directory / SAMPLER_DIR)
            buffer._writer.dumps(directory / WRITER_DIR)
            if rng is not None:
                TensorDict(rng_state=rng.get_state().clone(), device=rng.device).memmap(directory / RNG_STATE_DIR)
            if transform_state:
                torch.save(transform_state, directory / TRANSFORM_FILE)
            with open(directory / BUFFER_METADATA_FILE, "w") as file:
                json.dump(metadata, file)
            dump_release_entries(directory)

        write_aside(path, write)


def _read_generator(directory: Path) -> torch.Generator | None:
    """The generator saved in ``directory`` (``rng_state/``), or ``None`` if there is none."""
    if not directory.exists():
        return None  # dumped without a generator: the buffer keeps its own
    state = read_memmapped_state(directory, ("rng_state",))["rng_state"]
    meta = directory / "meta.json"
    device = read_json_object(meta).get("device")
    try:
        generator = torch.Generator(device=device if device is not None else "cpu")
        generator.set_state(state)
    except (RuntimeError, TypeError, ValueError) as err:
        raise MetadataError(f"{directory / 'rng_state.memmap'}: not a state of a generator on {device}: {err}") from None
    return generator


def _read_batch_size(file: Path):
    value = read_json_object(file).get("batch_size", ...)
    if value is ...:
        raise MetadataError(f"{file}: no 'batch_size' entry")
    return None if value is None else read_count(file, "batch_size", value)


def _check_parts_agree(path: Path, buffer, storage_state, sampler_state, writer_state) -> None:
    """Checks the storage's, sampler's and writer's checkpoints against each other (those of
    our classes, whose states are known): the round-robin writer's cursor against the
    storage's length and capacity, the priorities against the storage's length."""
    from torchrl_compat.samplers import PrioritizedSampler
    from torchrl_compat.writers import RoundRobinWriter

    # (a storage with ndim > 1 counts its length as torchrl 0.11 does, which its cursor
    # does not follow: only 1-D storages are checked)
    if not isinstance(storage_state, StorageCheckpoint) or storage_state.rows is None or len(storage_state.rows) != 1:
        return
    length = storage_state.length
    cursor = writer_state.get("cursor") if isinstance(writer_state, dict) else writer_state
    if isinstance(buffer._writer, RoundRobinWriter) and isinstance(cursor, int):
        check_cursor_fits_length(
            path / WRITER_DIR / "metadata.json", cursor, length, storage_state.rows, storage_state.file
        )
    if isinstance(buffer._sampler, PrioritizedSampler) and isinstance(sampler_state, dict) and "trees" in sampler_state:
        sum_tree, min_tree = sampler_state["trees"]
        capacity = buffer._sampler._max_capacity
        for lo, hi in leaf_blocks(capacity):
            if hi <= length:
                continue  # leaves below the length may hold priorities
            leaves = [read_leaves(tree, hi, lo).to(torch.float64).cpu().numpy() for tree in (sum_tree, min_tree)]
            check_no_priority_past(
                path / SAMPLER_DIR, *leaves, tree_dtype(buffer._sampler.dtype), length, storage_state.file, start=lo
            )


def load_buffer(buffer, path) -> None:
    """Loads the checkpoint at ``path`` into ``buffer``, whole or not at all.

    Every part is read and checked first: the storage's, sampler's and writer's checkpoints
    (for components with ``_read_checkpoint``; torchrl's own are loaded unchecked), the
    generator state, the transform state and the metadata. A missing or damaged part raises,
    naming its file, with the buffer as it was. The checkpoint is only read.
    """
    path = Path(path).absolute()
    storage_state, load_storage = read_checkpoint_state(buffer._storage, path / STORAGE_DIR)
    sampler_state, load_sampler = read_checkpoint_state(buffer._sampler, path / SAMPLER_DIR)
    writer_state, load_writer = read_checkpoint_state(buffer._writer, path / WRITER_DIR)
    _check_parts_agree(path, buffer, storage_state, sampler_state, writer_state)
    generator = _read_generator(path / RNG_STATE_DIR)
    transform_file = path / TRANSFORM_FILE
    transform_loads = []
    if transform_file.exists():
        transform_loads.append((buffer._transform, read_torch_file(transform_file), transform_file))
    batch_size = _read_batch_size(path / BUFFER_METADATA_FILE)
    release_entries = buffer._read_release_entries(path)
    # held still while the parts change: a prefetch still drawing would otherwise draw from
    # the loaded generator (or sampler) and move it before the first sample after loads
    with buffer._held_still():
        # the transform may still refuse its state (load_state_dict checks it): first, undone
        # if what follows fails
        restore_transform = load_module_states(transform_loads)
        try:
            with reading(path):
                load_storage()
        except BaseException:
            restore_transform()
            raise
        load_sampler()
        load_writer()
        if generator is not None:
            buffer.set_rng(generator)
        buffer._batch_size = batch_size
        buffer._apply_release_entries(release_entries)
