""":class:`SamplerEnsemble`: one sampler per storage of a storage ensemble."""
from __future__ import annotations

import textwrap
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict

from ..checkpointers._publish import write_aside
from .._ensemble import INDEX_ERROR, members_rng, pick, select_members
from .._releases import since
from .._torchrl_lookup import torchrl_twin
from ._common import _STORAGE_ENSEMBLES, _randint
from .base import Sampler

if TYPE_CHECKING:
    from ..storages import StorageEnsemble


class SamplerEnsemble(Sampler, *torchrl_twin("samplers", "SamplerEnsemble")):
    """An ensemble of samplers.

    This class is designed to work with :class:`~torchrl.data.replay_buffers.replay_buffers.ReplayBufferEnsemble`.
    It contains the samplers as well as the sampling strategy hyperparameters.

    Args:
        samplers (sequence of Sampler): the samplers to make the composite sampler.

    Keyword Args:
        p (list or tensor of probabilities, optional): if provided, indicates the
            weights of each dataset during sampling.
        sample_from_all (bool, optional): if ``True``, each dataset will be sampled
            from. This is not compatible with the ``p`` argument. Defaults to ``False``.
        num_buffer_sampled (int, optional): the number of buffers to sample.
            if ``sample_from_all=True``, this has no effect, as it defaults to the
            number of buffers. If ``sample_from_all=False``, buffers will be
            sampled according to the probabilities ``p``.

    .. warning::
      The indices provided in the info dictionary are placed in a :class:`~tensordict.TensorDict` with
      keys ``index`` and ``buffer_ids`` that allow the upper :class:`~torchrl.data.ReplayBufferEnsemble`
      and :class:`~torchrl.data.StorageEnsemble` objects to retrieve the data.
      This format is different from with other samplers which usually return indices
      as regular tensors.

    .. note:: The buffers are drawn with the generator set by the buffer (``_rng``) also
        when ``p`` is given (torchrl then uses the global generator), so seeded runs repeat.
        Selecting several samplers (``ensemble[0:2]``, ``ensemble[[0, 2]]``) works without
        ``p`` too (torchrl then fails indexing ``None``). :meth:`dumps` publishes every
        member's checkpoint at once, and :meth:`loads` checks them all before any member
        changes.

    Examples:
        >>> ensemble = SamplerEnsemble(RandomSampler(), RandomSampler(), p=[1, 3])
        >>> ensemble.p.tolist(), len(ensemble), type(ensemble[0]).__name__
        ([0.25, 0.75], 2, 'RandomSampler')
    """

    def __init__(
        self, *samplers, p=None, sample_from_all=False, num_buffer_sampled=None
    ):
        self._rng_private = None
        self._samplers = samplers
        self.sample_from_all = sample_from_all
        if sample_from_all and p is not None:
            raise RuntimeError(
                "Cannot pass both `p` argument and `sample_from_all=True`."
            )
        self.p = p
        self.num_buffer_sampled = num_buffer_sampled

    _rng = members_rng("_samplers")

    if since("ensemble_sampleable_routing"):
        # torchrl 0.14 annotates the constructor (p may be "sampleable"); earlier releases do not
        __init__.__annotations__ = {
            "p": "list[float] | torch.Tensor | Literal['sampleable'] | None",
            "sample_from_all": "bool",
            "num_buffer_sampled": "int | None",
        }

    @property
    def p(self):
        return self._p

    @p.setter
    def p(self, value):
        if isinstance(value, str) and since("ensemble_sampleable_routing"):
            if value != "sampleable":
                raise ValueError(
                    "The only dynamic SamplerEnsemble probability is 'sampleable'."
                )
            self._p = value
            return
        if not isinstance(value, torch.Tensor) and value is not None:
            value = torch.tensor(value)
        if value is not None:
            value = value / value.sum().clamp_min(1e-6)
        self._p = value

    @property
    def num_buffer_sampled(self):
        value = self.__dict__.get("_num_buffer_sampled", None)
        if value is None:
            value = self.__dict__["_num_buffer_sampled"] = len(self._samplers)
        return value

    @num_buffer_sampled.setter
    def num_buffer_sampled(self, value):
        self.__dict__["_num_buffer_sampled"] = value

    def sample(self, storage, batch_size):
        if batch_size % self.num_buffer_sampled > 0:
            raise ValueError(
                f"The batch size must be divisible by the number of buffers sampled, got "
                f"batch_size={batch_size} and num_buffer_sampled={self.num_buffer_sampled}."
            )
        if not isinstance(storage, _STORAGE_ENSEMBLES):
            raise TypeError(
                f"SamplerEnsemble samples from a StorageEnsemble, got a storage of type "
                f"{type(storage).__name__}."
            )
        sub_batch_size = batch_size // self.num_buffer_sampled
        if self.sample_from_all:
            samples, infos = zip(
                *[
                    sampler.sample(sub_storage, sub_batch_size)
                    for sub_storage, sampler in zip(storage._storages, self._samplers)
                ]
            )
            buffer_ids = torch.arange(len(samples))
        elif since("ensemble_sampleable_routing"):
            return self._sample_by_member(storage, sub_batch_size)
        else:
            if self.p is None:
                buffer_ids = _randint(
                    len(self._samplers),
                    self.num_buffer_sampled,
                    getattr(storage, "device", None),
                    self._rng,
                )
            else:
                buffer_ids = torch.multinomial(
                    self.p, self.num_buffer_sampled, True, generator=self._rng
                )
            samples, infos = zip(
                *[
                    self._samplers[i].sample(storage._storages[i], sub_batch_size)
                    for i in buffer_ids.tolist()
                ]
            )
        samples = [
            sample if isinstance(sample, torch.Tensor) else torch.stack(sample, -1)
            for sample in samples
        ]
        if all(samples[0].shape == sample.shape for sample in samples[1:]):
            samples_stack = torch.stack(samples)
        else:
            samples_stack = torch.nested.nested_tensor(list(samples))

        samples = TensorDict(
            {
                "index": samples_stack,
                "buffer_ids": buffer_ids,
            },
            batch_size=[self.num_buffer_sampled],
        )
        infos = torch.stack(
            [
                TensorDict.from_dict(info, batch_dims=samples.ndim - 1)
                if info
                else TensorDict()
                for info in infos
            ]
        )
        return samples, infos

    def _member_weights(self, storage, sub_batch_size: int) -> torch.Tensor:
        """``p="sampleable"``: each member weighted by what it can draw from now."""
        counts = torch.tensor(
            [
                float(sampler._sampleable_count(member, sub_batch_size))
                for member, sampler in zip(storage._storages, self._samplers)
            ],
            dtype=torch.float,
            device=self._rng.device if self._rng is not None else "cpu",
        )
        if not counts.any():
            raise RuntimeError("None of the replay-buffer ensemble members can be sampled.")
        return counts / counts.sum()

    def _sample_by_member(self, storage, sub_batch_size: int):
        """The 0.14 draw: the buffers first, then one call per member drawn, for all the
        sub-batches it serves (repeated while the member returns fewer records)."""
        if isinstance(self.p, str):
            buffer_ids = torch.multinomial(
                self._member_weights(storage, sub_batch_size), self.num_buffer_sampled, True, generator=self._rng
            )
        elif self.p is None:
            buffer_ids = _randint(
                len(self._samplers), self.num_buffer_sampled, getattr(storage, "device", None), self._rng
            )
        else:
            buffer_ids = torch.multinomial(self.p, self.num_buffer_sampled, True, generator=self._rng)
        samples = [None] * self.num_buffer_sampled
        infos = [None] * self.num_buffer_sampled
        for member_id in buffer_ids.unique(sorted=True).tolist():
            positions = (buffer_ids == member_id).nonzero().flatten().tolist()
            wanted = sub_batch_size * len(positions)
            parts, part_infos, remaining = [], [], wanted
            while remaining:
                part, part_info = self._samplers[member_id].sample(storage._storages[member_id], remaining)
                if not isinstance(part, torch.Tensor):
                    part = torch.stack(part, -1)
                if not part.shape[0] or part.shape[0] > remaining:
                    raise RuntimeError(
                        f"Sampler {member_id} returned {part.shape[0]} "
                        f"records for a requested batch of {remaining}."
                    )
                parts.append(part)
                part_infos.append(part_info)
                remaining -= part.shape[0]
            member_info = _joined_infos(part_infos, [part.shape[0] for part in parts])
            member_info = TensorDict.from_dict(member_info, batch_dims=0) if member_info else TensorDict()
            chunks = torch.cat(parts).split(sub_batch_size, dim=0)
            for chunk_id, position in enumerate(positions):
                samples[position] = chunks[chunk_id]
                start = chunk_id * sub_batch_size
                chunk_info = member_info.clone(False)
                for key, value in member_info.items(include_nested=True, leaves_only=True):
                    if isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == wanted:
                        chunk_info.set(key, value[start : start + sub_batch_size])
                infos[position] = chunk_info
        if all(samples[0].shape == sample.shape for sample in samples[1:]):
            stacked = torch.stack(samples)
        else:
            stacked = torch.nested.nested_tensor(list(samples))
        index = TensorDict(
            {"index": stacked, "buffer_ids": buffer_ids}, batch_size=[self.num_buffer_sampled]
        )
        return index, torch.stack(infos)

    def _sampleable_count(self, storage, batch_size: int) -> int:
        return len(storage)

    def can_sample(self, storage: StorageEnsemble, batch_size: int) -> bool:
        """Returns whether the selected ensemble strategy can serve a batch."""
        if batch_size % self.num_buffer_sampled:
            return False
        sub_batch_size = batch_size // self.num_buffer_sampled
        ready = [
            sampler.can_sample(member, sub_batch_size)
            for member, sampler in zip(storage._storages, self._samplers)
        ]
        if self.sample_from_all:
            return all(ready)
        if isinstance(self.p, str) or self.p is None:
            return any(ready)
        return any(is_ready and weight > 0 for is_ready, weight in zip(ready, self.p.tolist()))

    def dumps(self, path: Path):
        # Every member's files are written aside and published together: an interrupted
        # dumps leaves the previous ensemble checkpoint whole.
        write_aside(path, self._write_checkpoint)

    def _write_checkpoint(self, directory: Path) -> None:
        for i, sampler in enumerate(self._samplers):
            sampler.dumps(Path(directory) / str(i))

    def loads(self, path: Path):
        self._apply_checkpoint(self._read_checkpoint(path))

    def _read_checkpoint(self, path) -> list:
        # Every member's checkpoint is read and checked before any member changes.
        path = Path(path).absolute()
        return [sampler._read_checkpoint(path / str(i)) for i, sampler in enumerate(self._samplers)]

    def _apply_checkpoint(self, states: list) -> None:
        for sampler, state in zip(self._samplers, states):
            sampler._apply_checkpoint(state)

    def state_dict(self) -> dict[str, Any]:
        state_dict = OrderedDict()
        for i, sampler in enumerate(self._samplers):
            state_dict[str(i)] = sampler.state_dict()
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for i, sampler in enumerate(self._samplers):
            sampler.load_state_dict(state_dict[str(i)])

    if since("ensemble_members_state"):

        def _empty(self):
            for sampler in self._samplers:
                sampler._empty()

    else:

        def _empty(self):
            raise NotImplementedError

    _INDEX_ERROR = INDEX_ERROR

    def __getitem__(self, index):
        return select_members(self, index, self._samplers, self._selection, kind="samplers")

    def _selection(self, selection) -> SamplerEnsemble:
        return SamplerEnsemble(
            *pick(self._samplers, selection),
            p=self._p[selection] if self._p is not None else None,
            sample_from_all=self.sample_from_all,
            num_buffer_sampled=self.num_buffer_sampled,
        )

    def __len__(self):
        return len(self._samplers)

    def __repr__(self):
        samplers = textwrap.indent(f"samplers={self._samplers}", " " * 4)
        return f"{self.__class__.__name__}(\n{samplers})"


def _joined_infos(infos: list, sizes: list) -> dict:
    """The infos of a member's successive draws as one: entries with one row per record
    concatenated, others taken from the last draw that has them."""
    if len(infos) == 1:
        return infos[0]
    joined = {}
    for key in set().union(*(info.keys() for info in infos)):
        values = [info.get(key) for info in infos]
        if all(
            isinstance(value, torch.Tensor) and value.ndim and value.shape[0] == size
            for value, size in zip(values, sizes)
        ):
            joined[key] = torch.cat(values)
        else:
            joined[key] = next(value for value in reversed(values) if value is not None)
    return joined

if not since("sampler_can_sample"):
    del SamplerEnsemble.can_sample
