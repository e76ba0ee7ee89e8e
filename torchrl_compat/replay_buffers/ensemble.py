""":class:`ReplayBufferEnsemble`: several replay buffers sampled as one."""
from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import Any

import numpy as np
import torch
from tensordict import is_tensor_collection, LazyStackedTensorDict, TensorDict, TensorDictBase, unravel_key
from tensordict.nn.utils import _set_dispatch_td_nn_modules
from tensordict.utils import expand_right

from .._ensemble import INDEX_ERROR, pick, select_members
from .._releases import since
from .._torchrl_lookup import torchrl_twin
from ..samplers import SamplerEnsemble, SliceSampler
from ..storages import _stack_anything, StorageEnsemble
from ..writers import RoundRobinWriter, WriterEnsemble
from .base import ReplayBuffer, _default_collate


class ReplayBufferEnsemble(ReplayBuffer, *torchrl_twin("replay_buffers", "ReplayBufferEnsemble")):
    """An ensemble of replay buffers.

    This class allows to read and sample from multiple replay buffers at once.
    It automatically composes ensemble of storages (:class:`~torchrl_compat.StorageEnsemble`),
    writers (:class:`~torchrl_compat.WriterEnsemble`) and
    samplers (:class:`~torchrl_compat.SamplerEnsemble`).

    .. note::
      Writing directly to this class is disabled by default. From torchrl 0.14 on, pass
      exactly one of ``routing_key`` or ``routing_dim`` to enable routed writes; before,
      index the ensemble to retrieve a nested buffer and extend it.

    Args:
        rbs (sequence of ReplayBuffer instances, optional): the replay buffers to ensemble.
        storages (StorageEnsemble, optional): the ensemble of storages, if the replay
            buffers are not passed.
        samplers (SamplerEnsemble, optional): the ensemble of samplers, if the replay
            buffers are not passed.
        writers (WriterEnsemble, optional): the ensemble of writers, if the replay
            buffers are not passed.
        transform (Transform, optional): if passed, this will be the transform
            of the ensemble of replay buffers. Individual transforms for each
            replay buffer is retrieved from its parent replay buffer, or directly
            written in the :class:`~torchrl_compat.StorageEnsemble` object.
        batch_size (int, optional): the batch-size to use during sampling.
        collate_fn (callable, optional): the function to use to collate the
            data after each individual collate_fn has been called and the data
            is placed in a list (along with the buffer id).
        collate_fns (list of callables, optional): collate_fn of each nested
            replay buffer. Retrieved from the :class:`~ReplayBuffer` instances
            if not provided.
        p (list of float, Tensor, or ``"sampleable"``, optional): relative
            weights of each replay buffer. ``"sampleable"`` (torchrl 0.14) dynamically
            weights members by their available records or slice windows and
            excludes members that are not ready.
        sample_from_all (bool, optional): if ``True``, each dataset will be sampled
            from. This is not compatible with the ``p`` argument. Defaults to ``False``.
        num_buffer_sampled (int, optional): the number of buffers to sample.
            if ``sample_from_all=True``, this has no effect, as it defaults to the
            number of buffers. If ``sample_from_all=False``, buffers will be
            sampled according to the probabilities ``p``.
        routing_key (NestedKey, optional): key containing a member id for each
            record. Routed input is flattened, grouped stably by member and
            written to the corresponding nested replay buffer (torchrl 0.14).
        routing_dim (int, optional): batch dimension whose entries correspond
            to ensemble members. The dimension size must equal the number of
            members. Exclusive with ``routing_key`` (torchrl 0.14).
        generator (torch.Generator, optional): a generator to use for sampling.
            Defaults to ``None`` (global default generator).
        shared (bool, optional): whether the buffer will be shared using multiprocessing or not.
            Defaults to ``False``.

    .. note:: A selection of the members (``rb[[0, 2]]``) of an ensemble that samples from
        all of them samples from all of its own (torchrl hands it the parent's member count,
        and its ``sample`` then fails).

    .. note:: :meth:`dumps` writes torchrl's layout (``storage/<i>``, ``sampler/<i>``,
        ``writer/<i>``, ...) and publishes it whole, as :meth:`ReplayBuffer.dumps` does;
        torchrl 0.11's fails on the ``storage/`` directory it does not create. :meth:`loads`
        checks every member's files before any member changes.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyTensorStorage, ReplayBufferEnsemble, TensorDictReplayBuffer
        >>> rb0 = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
        >>> rb1 = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
        >>> _ = rb0.extend(TensorDict({"obs": torch.zeros(10, 2)}, [10]))
        >>> _ = rb1.extend(TensorDict({"obs": torch.ones(10, 2)}, [10]))
        >>> rb = ReplayBufferEnsemble(rb0, rb1, sample_from_all=True, batch_size=8)
        >>> sample = rb.sample()
        >>> sample.batch_size, sample["obs"][:, :, 0].mean(1).tolist()
        (torch.Size([2, 4]), [0.0, 1.0])
    """

    _collate_fn_val = None

    def __init__(
        self,
        *rbs,
        storages: StorageEnsemble | None = None,
        samplers: SamplerEnsemble | None = None,
        writers: WriterEnsemble | None = None,
        transform: Any | None = None,  # noqa: F821
        batch_size: int | None = None,
        collate_fn: Callable | None = None,
        collate_fns: list[Callable] | None = None,
        p: torch.Tensor | list[float] | str | None = None,
        sample_from_all: bool = False,
        num_buffer_sampled: int | None = None,
        routing_key: Any | None = None,
        routing_dim: int | None = None,
        generator: torch.Generator | None = None,
        shared: bool = False,
        **kwargs,
    ):
        routing_key, routing_dim = _checked_routing(routing_key, routing_dim)
        if collate_fn is None:
            collate_fn = _stack_anything
        if rbs:
            if storages is not None or samplers is not None or writers is not None:
                raise RuntimeError(
                    "ReplayBufferEnsemble takes either replay buffers or storages, samplers "
                    "and writers, not both."
                )
            for rb in rbs:
                if getattr(rb, "_delayed_init", False) and not rb.initialized:
                    rb._init()
            storages = StorageEnsemble(*[rb._storage for rb in rbs], transforms=[rb._transform for rb in rbs])
            samplers = SamplerEnsemble(
                *[rb._sampler for rb in rbs],
                p=p,
                sample_from_all=sample_from_all,
                num_buffer_sampled=num_buffer_sampled,
            )
            writers = WriterEnsemble(*[rb._writer for rb in rbs])
            if collate_fns is None:
                collate_fns = [rb._collate_fn for rb in rbs]
        else:
            if collate_fns is None:
                collate_fns = [_default_collate(storage) for storage in storages._storages]
            rbs = _members_of(storages, samplers, writers, collate_fns)
        self._rbs = rbs
        self._collate_fns = collate_fns
        if since("ensemble_sampleable_routing"):
            self.routing_key = routing_key
            self.routing_dim = routing_dim
        super().__init__(
            storage=storages,
            sampler=samplers,
            writer=writers,
            transform=transform,
            batch_size=batch_size,
            collate_fn=collate_fn,
            generator=generator,
            shared=shared,
            **kwargs,
        )

    def _sample(self, *args, **kwargs):
        sample, info = super()._sample(*args, **kwargs)
        if isinstance(sample, TensorDictBase):
            buffer_ids = info.get(("index", "buffer_ids"))
            info.set(("index", "buffer_ids"), expand_right(buffer_ids, sample.batch_size))
            if isinstance(info, LazyStackedTensorDict):
                for _info, _sample in zip(info.unbind(info.stack_dim), sample.unbind(info.stack_dim)):
                    _info.batch_size = _sample.batch_size
                info = torch.stack(info.tensordicts, info.stack_dim)
            else:
                info.batch_size = sample.batch_size
            sample.update(info)
        return sample, info

    @property
    def _collate_fn(self):
        def new_collate(samples):
            samples = [self._collate_fns[i](sample) for (i, sample) in samples]
            return self._collate_fn_val(samples)

        return new_collate

    @_collate_fn.setter
    def _collate_fn(self, value):
        self._collate_fn_val = value

    _INDEX_ERROR = INDEX_ERROR

    def __getitem__(self, index: int | torch.Tensor | tuple | np.ndarray | list | slice | Any) -> Any:
        return select_members(
            self,
            index,
            self._rbs,
            self._selection,
            kind="replay buffers",
            index_each=self._index_each_storage,
            ensemble_class=ReplayBufferEnsemble,
        )

    def _index_each_storage(self, rest):
        # ``rb[:, *rest]``: every storage indexed with ``rest``, collated as a sample
        return self._collate_fn([(i, storage[rest]) for i, storage in enumerate(self._storage._storages)])

    def _selection(self, selection) -> ReplayBufferEnsemble:
        """The ensemble of the members at ``selection`` (a list of positions or a slice; also a
        position when the ensemble was made of components rather than of buffers)."""
        if self._rbs is not None and (self._rbs or not since("ensemble_members_from_components")):
            rbs, components = pick(self._rbs, selection), {}
        else:
            rbs = ()
            try:
                components = dict(
                    samplers=self._sampler[selection],
                    writers=self._writer[selection],
                    storages=self._storage[selection],
                )
            except IndexError:
                raise IndexError(self._INDEX_ERROR.format(type(selection))) from None
        return ReplayBufferEnsemble(
            *rbs,
            **components,
            transform=self._transform,
            batch_size=self._batch_size,
            collate_fn=self._collate_fn_val,
            collate_fns=pick(self._collate_fns, selection),
            sample_from_all=self._sampler.sample_from_all,
            num_buffer_sampled=self._sub_num_buffer_sampled(),
            p=self._member_p(selection),
        )

    def _sub_num_buffer_sampled(self):
        # sampling from all the members of a selection samples each of them once (torchrl
        # passes on this ensemble's count, and the selection then fails to sample)
        return None if self._sampler.sample_from_all else self._sampler.num_buffer_sampled

    def _member_p(self, selection):
        p = self._sampler._p
        return None if p is None else p[selection]

    def __len__(self):
        return len(self._storage)

    def __repr__(self):
        storages = textwrap.indent(f"storages={self._storage}", " " * 4)
        writers = textwrap.indent(f"writers={self._writer}", " " * 4)
        samplers = textwrap.indent(f"samplers={self._sampler}", " " * 4)
        return f"ReplayBufferEnsemble(\n{storages}, \n{samplers}, \n{writers}, \nbatch_size={self._batch_size}, \ntransform={self._transform}, \ncollate_fn={self._collate_fn_val})"

    # ------------------------------------------------------------------------------------
    # From torchrl 0.14: routed writes (routing_key / routing_dim), conditional updates
    # routed to the members, end_streams and the ensemble's stats.
    if since("ensemble_sampleable_routing"):

        def _route(self, data: TensorDictBase) -> tuple[TensorDictBase, torch.Tensor]:
            """``(data flattened, the member id of each record)``, after the ensemble's
            inverse transforms; the ids checked."""
            if not isinstance(data, TensorDictBase):
                raise TypeError("Routed replay writes require a TensorDict input.")
            if self._has_transforms():
                with _set_dispatch_td_nn_modules(is_tensor_collection(data)):
                    data = self._transform.inv(data)
            flat = data.reshape(-1)
            members = len(self._storage._storages)
            if self.routing_key is not None:
                buffer_ids = flat.get(self.routing_key)
                while buffer_ids.ndim > 1 and buffer_ids.shape[-1] == 1:
                    buffer_ids = buffer_ids.squeeze(-1)
                if buffer_ids.shape != flat.batch_size:
                    raise ValueError(
                        f"routing_key {self.routing_key!r} must contain one member id "
                        f"per record, got shape {tuple(buffer_ids.shape)} for "
                        f"batch size {tuple(flat.batch_size)}."
                    )
            elif self.routing_dim is not None:
                if not data.ndim:
                    raise ValueError("routing_dim requires batched input.")
                dim = self.routing_dim % data.ndim
                if data.shape[dim] != members:
                    raise ValueError(
                        f"routing_dim {self.routing_dim} has size {data.shape[dim]}, "
                        f"expected {members} ensemble members."
                    )
                shape = [1] * data.ndim
                shape[dim] = members
                buffer_ids = (
                    torch.arange(members, device=data.device or "cpu").reshape(shape).expand(data.batch_size).reshape(-1)
                )
            else:
                raise RuntimeError(
                    "ReplayBufferEnsemble writes are disabled. Configure routing_key "
                    "or routing_dim to enable routed writes."
                )
            if buffer_ids.dtype == torch.bool or buffer_ids.is_floating_point():
                raise TypeError("ReplayBufferEnsemble member ids must be integers.")
            buffer_ids = buffer_ids.to(torch.long)
            if buffer_ids.numel() and ((buffer_ids < 0).any() or (buffer_ids >= members).any()):
                raise ValueError(f"ReplayBufferEnsemble member ids must lie in [0, {members - 1}].")
            return flat, buffer_ids

        def extend(self, data: TensorDictBase, *, update_priority: bool | None = None) -> TensorDictBase:
            """Routes and writes a batch, returning member-local write metadata.

            The returned tensordict is flat and aligned with ``data.reshape(-1)``.
            It contains ``"buffer_ids"`` and member-local ``"index"`` entries,
            plus ``"index_generation"`` when every member writer tracks
            generations.
            """
            if update_priority is not None:
                raise NotImplementedError("update_priority is not supported by routed ensemble writes.")
            flat, buffer_ids = self._route(data)
            if not buffer_ids.numel():
                return TensorDict(
                    {"buffer_ids": buffer_ids, "index": torch.empty(0, dtype=torch.long, device=buffer_ids.device)},
                    batch_size=[0],
                )
            local_index = local_generation = None
            track = _tracks_generations(self._rbs)
            with self._replay_lock, self._write_lock:
                for member_id, member in enumerate(self._rbs):
                    rows = (buffer_ids == member_id).nonzero().flatten()
                    if not rows.numel():
                        continue
                    index = _as_index_rows(member.extend(flat[rows]), buffer_ids.device)
                    if local_index is None:
                        local_index = torch.empty(
                            (buffer_ids.numel(), *index.shape[1:]), dtype=index.dtype, device=buffer_ids.device
                        )
                    elif index.shape[1:] != local_index.shape[1:]:
                        raise RuntimeError("All routed replay-buffer members must use compatible index shapes.")
                    local_index[rows] = index
                    if track:
                        generation = _handed_out_generations(member, index).to(buffer_ids.device)
                        if local_generation is None:
                            local_generation = torch.empty(
                                buffer_ids.numel(), dtype=generation.dtype, device=buffer_ids.device
                            )
                        local_generation[rows] = generation
            metadata = TensorDict({"buffer_ids": buffer_ids, "index": local_index}, batch_size=[buffer_ids.numel()])
            if local_generation is not None:
                metadata.set("index_generation", local_generation)
            return metadata

        def add(self, data: TensorDictBase) -> TensorDictBase:
            """Routes one record through ``routing_key`` and returns its metadata."""
            if self.routing_dim is not None:
                raise RuntimeError("Use extend() for routing_dim writes.")
            if data.ndim:
                raise ValueError("add() expects a scalar TensorDict record.")
            return self.extend(data.unsqueeze(0))[0]

        def _conditional_update_device(self) -> torch.device | None:
            devices = {member._conditional_update_device() for member in self._rbs}
            return devices.pop() if len(devices) == 1 else None

        def update_if_present(
            self,
            *,
            index: TensorDictBase,
            generation: torch.Tensor,
            patch: Mapping | TensorDictBase,
            version_key: Any | None = None,
            version: int | torch.Tensor | None = None,
            require_newer: bool = False,
        ):
            """Routes a conditional update to the member named by each handle.

            ``index`` is the routed metadata :meth:`extend` returns (``"buffer_ids"`` and
            member-local ``"index"``); the records are grouped by member (in submission
            order within each) and each member applies its part with its own
            ``update_if_present``. The patch moves to the members' common storage device
            once, before the grouping.

            Returns:
                A ``ConditionalUpdateResult`` whose ``updated`` (and ``version_rejected``)
                masks have the shape of ``index["buffer_ids"]``.
            """
            if not isinstance(index, TensorDictBase):
                raise TypeError("ReplayBufferEnsemble conditional updates require routed index metadata.")
            buffer_ids = index.get("buffer_ids")
            local_index = index.get("index")
            shape = buffer_ids.shape
            if local_index.shape[: len(shape)] != shape:
                raise ValueError(
                    "Member-local indices must start with the buffer-id shape, got "
                    f"{tuple(local_index.shape)} and {tuple(shape)}."
                )
            if buffer_ids.dtype == torch.bool or buffer_ids.is_floating_point():
                raise TypeError("ReplayBufferEnsemble member ids must be integers.")
            count = buffer_ids.numel()
            flat_ids = buffer_ids.reshape(-1)
            if count and ((flat_ids < 0).any() or (flat_ids >= len(self._rbs)).any()):
                raise ValueError(f"ReplayBufferEnsemble member ids must lie in [0, {len(self._rbs) - 1}].")
            if (version_key is None) != (version is None):
                raise ValueError("version_key and version must be provided together.")
            if not _tracks_generations(self._rbs):
                raise RuntimeError(
                    "Conditional updates require every ensemble member writer to track slot generations."
                )
            if any(not getattr(member.storage, "supports_conditional_update", False) for member in self._rbs):
                raise RuntimeError(
                    "Conditional updates require every ensemble member storage to support conditional patches."
                )
            flat_index = local_index.reshape(count, *local_index.shape[len(shape):])
            flat_generation = generation.reshape(-1)
            if flat_generation.numel() != count:
                raise ValueError(
                    "generation and routed index metadata must address the same number of records."
                )
            flat_patch = _flat_patch(patch, shape, count, self._conditional_update_device())
            updated = torch.zeros(count, dtype=torch.bool, device=flat_ids.device)
            rejected = torch.zeros_like(updated) if version_key is not None else None
            # one stable sort groups the records by member, in submission order within each
            order = flat_ids.argsort(stable=True)
            counts = torch.bincount(flat_ids, minlength=len(self._rbs)).tolist()
            result_type = None
            with self._replay_lock, self._write_lock:
                start = 0
                for member, size in zip(self._rbs, counts):
                    if not size:
                        continue
                    rows = order[start : start + size]
                    start += size
                    if isinstance(flat_patch, TensorDictBase):
                        member_patch = flat_patch[rows.to(flat_patch.device or "cpu")]
                    else:
                        member_patch = {key: value[rows.to(value.device)] for key, value in flat_patch.items()}
                    member_version = version
                    if isinstance(version, torch.Tensor) and version.numel() > 1:
                        member_version = version.reshape(count, *version.shape[len(shape):])[rows.to(version.device)]
                    result = member.update_if_present(
                        index=flat_index[rows.to(flat_index.device)],
                        generation=flat_generation[rows.to(flat_generation.device)],
                        patch=member_patch,
                        version_key=version_key,
                        version=member_version,
                        require_newer=require_newer,
                    )
                    result_type = type(result)
                    updated[rows] = result.updated.to(updated.device)
                    if rejected is not None:
                        rejected[rows] = result.version_rejected.to(rejected.device)
            if result_type is None:
                result_type = _conditional_update_result()
            return result_type(
                updated=updated.reshape(shape),
                version_rejected=None if rejected is None else rejected.reshape(shape),
                batch_size=shape,
            )

        def end_streams(
            self,
            *,
            end_key: Any = ("next", "done"),
            terminated_key: Any | None = ("next", "terminated"),
            truncated_key: Any | None = ("next", "truncated"),
        ) -> None:
            """Close each member's current stream before restarted producers append.

            Each member must hold one chronological stream in a one-dimensional tensor
            storage, with a generation-tracking round-robin writer and a slice sampler
            configured to read ``end_key``. A sampler with a ``traj_key`` is accepted only
            when every record of the member carries the same trajectory id. The last
            record of each non-empty member becomes done and, when the field exists and
            the record is not terminal, truncated; write counts and slot generations are
            kept. Pending samples finish first; unsupported members are refused before
            any record changes.

            Keyword Args:
                end_key (NestedKey, optional): Stored boolean boundary field and
                    sampler end key. Defaults to ``("next", "done")``.
                terminated_key (NestedKey or None, optional): Stored terminal field,
                    never modified. Missing fields are treated as false. Defaults
                    to ``("next", "terminated")``.
                truncated_key (NestedKey or None, optional): Existing boolean field
                    to set for unfinished nonterminal tails. ``None`` disables this
                    patch. Defaults to ``("next", "truncated")``.
            """
            end_key = unravel_key(end_key)
            terminated_key = None if terminated_key is None else unravel_key(terminated_key)
            truncated_key = None if truncated_key is None else unravel_key(truncated_key)
            keys = [key for key in (end_key, terminated_key, truncated_key) if key is not None]
            if len(set(keys)) != len(keys):
                raise ValueError("end, terminated and truncated keys must be distinct.")
            with self._futures_lock, ExitStack() as locks:
                self._synchronize_futures_locked()
                for member in self._rbs:
                    locks.enter_context(member._futures_lock)
                    member._synchronize_futures_locked()
                locks.enter_context(self._replay_lock)
                locks.enter_context(self._write_lock)
                for member in self._rbs:
                    locks.enter_context(member._replay_lock)
                    locks.enter_context(member._write_lock)
                # every member checked, every patch built, before any record changes
                patches = [
                    patch
                    for patch in (_tail_patch(member, end_key, terminated_key, truncated_key) for member in self._rbs)
                    if patch is not None
                ]
                for member, index, generation, patch in patches:
                    member.update_if_present(index=index, generation=generation, patch=patch)
                    member.sampler._end_stream(index, storage=member.storage)

        def stats(self) -> dict[str, int | float | bool]:
            """Returns aggregate scalar statistics across ensemble members."""
            if not self.initialized:
                return {
                    "size": 0,
                    "write_count": 0,
                    "prefetch_queue_size": 0,
                    "initialized": False,
                    "num_buffers": len(self._init_storage._storages),
                }
            with self._replay_lock:
                storages = self._storage._storages
                size = sum(len(storage) for storage in storages)
                capacity = sum(storage.max_size for storage in storages)
                write_count = sum(getattr(writer, "_write_count", 0) for writer in self._writer._writers)
                queued = len(self._prefetch_queue)
            return {
                "size": int(size),
                "write_count": int(write_count),
                "prefetch_queue_size": int(queued),
                "initialized": True,
                "capacity": int(capacity),
                "utilization": float(size) / capacity if capacity else 0.0,
                "num_buffers": len(storages),
            }


def _checked_routing(routing_key, routing_dim):
    """The routing arguments checked (before 0.14 the constructor has none)."""
    if not since("ensemble_sampleable_routing"):
        for name, value in (("routing_key", routing_key), ("routing_dim", routing_dim)):
            if value is not None:
                raise TypeError(f"ReplayBufferEnsemble.__init__() got an unexpected keyword argument '{name}'")
        return None, None
    if routing_key is not None and routing_dim is not None:
        raise ValueError("routing_key and routing_dim are mutually exclusive.")
    if routing_key is not None:
        routing_key = unravel_key(routing_key)
    if routing_dim is not None and not isinstance(routing_dim, int):
        raise TypeError("routing_dim must be an integer.")
    return routing_key, routing_dim


def _members_of(storages, samplers, writers, collate_fns):
    """The member buffers of an ensemble built from components: from 0.14, one
    :class:`ReplayBuffer` per storage, sampler and writer (with the storage's transform and
    checkpointer); before, none."""
    if not since("ensemble_members_from_components"):
        return None
    transforms = storages._transforms or [None] * len(storages._storages)
    return tuple(
        ReplayBuffer(
            storage=storage, sampler=sampler, writer=writer, transform=transform,
            collate_fn=collate_fn, checkpointer=storage.checkpointer,
        )
        for storage, sampler, writer, transform, collate_fn in zip(
            storages._storages, samplers._samplers, writers._writers, transforms, collate_fns
        )
    )


def _tracks_generations(members) -> bool:
    """Whether every member's writer tracks slot generations."""
    return all(bool(getattr(member._writer, "_track_generations", False)) for member in members)


def _as_index_rows(index, device) -> torch.Tensor:
    """A member's write indices as rows of a tensor on ``device`` (coordinates stacked)."""
    if isinstance(index, tuple):
        index = torch.stack(index, -1)
    else:
        index = torch.as_tensor(index, device=device)
    if index.ndim == 0:
        index = index.unsqueeze(0)
    return index.to(device)


def _handed_out_generations(member, index: torch.Tensor) -> torch.Tensor:
    """The generation each written record got: a slot written several times by one batch
    holds the last write's, so earlier writes to it get one less per later write."""
    generation = member.writer.generations_of(index)
    slots = (index[..., 0] if member.storage.ndim > 1 else index).reshape(-1)
    if slots.unique().numel() == slots.numel():
        return generation.reshape(-1)
    later = torch.empty_like(slots)
    seen: dict[int, int] = {}
    for position in range(slots.numel() - 1, -1, -1):
        slot = int(slots[position].cpu())
        later[position] = seen.get(slot, 0)
        seen[slot] = seen.get(slot, 0) + 1
    return generation.reshape(-1) - later.to(generation.device)


def _flat_patch(patch, shape, count: int, device):
    """``patch`` with its leading ``shape`` flattened to ``count`` records, on ``device``
    when the members share one."""
    if isinstance(patch, TensorDictBase):
        if patch.batch_size != shape:
            raise ValueError("The patch batch size must match the routed index metadata.")
        flat = patch.reshape(-1)
        return flat if device is None else flat.to(device)
    flat = {}
    for key, value in patch.items():
        if value.shape[: len(shape)] != shape:
            raise ValueError(f"Patch entry {key!r} must start with shape {tuple(shape)}, got {tuple(value.shape)}.")
        value = value.reshape(count, *value.shape[len(shape):])
        flat[key] = value if device is None else value.to(device)
    return flat


def _conditional_update_result():
    """The class conditional updates return (ours when the package has it, else torchrl's)."""
    try:
        from ._conditional_update import ConditionalUpdateResult
    except ImportError:
        from torchrl.data.replay_buffers.replay_buffers import ConditionalUpdateResult
    return ConditionalUpdateResult


def _tail_patch(member, end_key, terminated_key, truncated_key):
    """``(member, index, generation, patch)`` closing ``member``'s stream at its last record,
    or ``None`` for an empty member; raises for a member end_streams cannot close."""
    storage, writer, sampler = member.storage, member.writer, member.sampler
    if (
        storage.ndim != 1
        or not getattr(storage, "supports_conditional_update", False)
        or not isinstance(writer, RoundRobinWriter)
        or not getattr(writer, "_track_generations", False)
        or not isinstance(sampler, SliceSampler)
        or end_key not in (getattr(sampler, "end_keys", None) or [sampler.end_key])
    ):
        raise RuntimeError(
            "end_streams requires one-dimensional conditional-update storage, "
            "generation-tracking round-robin writers and end-key slice samplers."
        )
    if not len(member):
        return None
    if sampler.traj_key is not None:
        # one trajectory id per member (a per-stream key such as the environment index):
        # restarted producers may reuse distinct ids, which a tail patch cannot separate
        data = storage._storage
        trajectory = data.get(sampler.traj_key, default=None) if is_tensor_collection(data) else None
        if trajectory is None or not bool((trajectory[: len(member)] == trajectory[0]).all()):
            raise RuntimeError(
                "end_streams supports trajectory-keyed slice samplers only "
                "when every record of a member carries the same trajectory "
                "id (a per-stream key such as the environment index); "
                "restarted producers may otherwise reuse old ids."
            )
    index = torch.tensor([(int(writer._cursor) - 1) % len(member)], device=storage.device)
    last = storage.get(index)
    done = last.get(end_key)
    if done.dtype != torch.bool:
        raise TypeError("end_streams requires a boolean end_key field.")
    patch = {end_key: torch.ones_like(done)}
    if truncated_key is not None and truncated_key in last.keys(True):
        terminated = last.get(terminated_key, None) if terminated_key is not None else None
        unfinished = ~done if terminated is None else ~done & ~terminated
        patch[truncated_key] = last.get(truncated_key) | unfinished
    return member, index, writer.generations_of(index), patch


def _release_signature(init):
    """The constructor's signature as the followed release has it (no routing before 0.14)."""
    signature = inspect.signature(init)
    if since("ensemble_sampleable_routing"):
        return signature
    return signature.replace(
        parameters=[p for name, p in signature.parameters.items() if name not in ("routing_key", "routing_dim")]
    )


ReplayBufferEnsemble.__init__.__signature__ = _release_signature(ReplayBufferEnsemble.__init__)
