""":class:`ReplayBufferEnsemble`: several replay buffers sampled as one."""
from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import LazyStackedTensorDict, TensorDictBase
from tensordict.utils import expand_right

from torchrl_compat._ensemble import INDEX_ERROR, pick, select_members
from torchrl_compat._torchrl_lookup import torchrl_twin
from torchrl_compat.samplers import SamplerEnsemble
from torchrl_compat.storages import _stack_anything, StorageEnsemble
from torchrl_compat.writers import WriterEnsemble
from .base import ReplayBuffer, _default_collate


class ReplayBufferEnsemble(ReplayBuffer, *torchrl_twin("replay_buffers", "ReplayBufferEnsemble")):
    """An ensemble of replay buffers.

    This class allows to read and sample from multiple replay buffers at once.
    It automatically composes ensemble of storages (:class:`~torchrl_compat.StorageEnsemble`),
    writers (:class:`~torchrl_compat.WriterEnsemble`) and
    samplers (:class:`~torchrl_compat.SamplerEnsemble`).

    .. note::
      Writing directly to this class is forbidden, but it can be indexed to retrieve
      the nested nested-buffer and extending it.

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
        p (list of float or Tensor, optional): a list of floating numbers
            indicating the relative weight of each replay buffer.
        sample_from_all (bool, optional): if ``True``, each dataset will be sampled
            from. This is not compatible with the ``p`` argument. Defaults to ``False``.
        num_buffer_sampled (int, optional): the number of buffers to sample.
            if ``sample_from_all=True``, this has no effect, as it defaults to the
            number of buffers. If ``sample_from_all=False``, buffers will be
            sampled according to the probabilities ``p``.
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
        p: torch.Tensor = None,
        sample_from_all: bool = False,
        num_buffer_sampled: int | None = None,
        generator: torch.Generator | None = None,
        shared: bool = False,
        **kwargs,
    ):
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
            rbs = None
            if collate_fns is None:
                collate_fns = [_default_collate(storage) for storage in storages._storages]
        self._rbs = rbs
        self._collate_fns = collate_fns
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
        if self._rbs is not None:
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
