"""Replay buffers (stand-in for ``torchrl.data.replay_buffers.replay_buffers``).

A replay buffer composes a storage (where items live), a writer (where new items go), a
sampler (which items a batch holds) and a transform chain. The classes have torchrl
0.11's names, signatures, defaults, ``state_dict`` / ``dumps`` / ``loads`` layouts,
return values and errors, and work with our storages, samplers and writers as with
torchrl's; checkpoints cross between torchrl's buffers and ours in both directions.

What a user calls in a training loop runs on short paths (see the ``.. note::`` blocks of
:class:`ReplayBuffer` and :class:`TensorDictReplayBuffer`): round-robin writes copy each
leaf into at most two row slices, samples are gathered leaf by leaf with the info
entries already in place, and nothing the constructor knows is recomputed per call.

.. note:: When torchrl is importable (and ``TORCHRL_COMPAT_STANDALONE`` is not ``"1"``)
    every buffer class also lists its torchrl twin as its last base, and the transform
    chain is torchrl's ``Compose``, so that torchrl transforms behave as in torchrl's
    buffers. Without torchrl, transforms are callables on the sampled data (see
    :meth:`ReplayBuffer.append_transform`). ``RemoteTensorDictReplayBuffer`` (torch RPC)
    and ``RayReplayBuffer`` are not provided.
"""
from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import textwrap
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial, wraps
from typing import Any

import numpy as np
import torch
from tensordict import (
    is_tensor_collection,
    is_tensorclass,
    LazyStackedTensorDict,
    TensorDict,
    TensorDictBase,
    unravel_key,
)
from tensordict.nn.utils import _set_dispatch_td_nn_modules
from tensordict.utils import expand_as_right, expand_right
from torch.utils._pytree import tree_map

from torchrl_compat import _buffer_transforms as _transforms, storages as _storages
from torchrl_compat._buffer_checkpoint import dump_buffer, load_buffer
from torchrl_compat._buffer_gather import gather_rows, plain_storage
from torchrl_compat._ensemble import INDEX_ERROR, pick, select_members
from torchrl_compat._torchrl_lookup import accepted_classes, torchrl_module, torchrl_twin
from torchrl_compat._writer_rows import shallow_copy
from torchrl_compat.samplers import (
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    Sampler,
    SamplerEnsemble,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl_compat.storages import _stack_anything, ListStorage, StorageEnsemble
from torchrl_compat.utils import (
    _is_int,
    _pin_memory,
    _reduce,
    _to_numpy,
    _to_torch,
    INT_CLASSES,
)
from torchrl_compat.writers import (
    RoundRobinWriter,
    TensorDictRoundRobinWriter,
    Writer,
    WriterEnsemble,
)

try:
    from torch.compiler import is_compiling
except ImportError:  # pragma: no cover - torch < 2.3
    from torch._dynamo import is_compiling

__all__ = [
    "InPlaceSampler",
    "PrioritizedReplayBuffer",
    "ReplayBuffer",
    "ReplayBufferEnsemble",
    "TensorDictPrioritizedReplayBuffer",
    "TensorDictReplayBuffer",
    "stack_tensors",
]

_RL_WARNINGS = os.environ.get("RL_WARNINGS", "1").lower() in ("1", "y", "yes", "t", "true", "on")

_NO_LOCK = contextlib.nullcontext()
_COMPOSE_LEN = _transforms.Compose.__len__
_EMPTY_STORAGE_ERROR = "Cannot sample from an empty storage."
_PLAIN_RAND_GIVEN_NDIM = _storages.TensorStorage._rand_given_ndim
# The samplers the buffers give priorities to: ours, and torchrl's when importable.
PRIORITIZED_SAMPLERS = accepted_classes(PrioritizedSampler, "samplers")


def _identity_collates() -> frozenset:
    """The storages' do-nothing collate functions (ours and torchrl's): skipped on samples."""
    found = {_storages._collate_id}
    theirs = torchrl_module("storages")
    if theirs is not None and hasattr(theirs, "_collate_id"):
        found.add(theirs._collate_id)
    return frozenset(found)


_IDENTITY_COLLATES = _identity_collates()

# Samplers whose indices are always within the filled part of a 1-D storage (the slice
# samplers' are taken modulo the filled length): their batches are gathered without checking
# the indices first.
_IN_RANGE_SAMPLERS = frozenset({
    RandomSampler, SamplerWithoutReplacement, PrioritizedSampler,
    SliceSampler, SliceSamplerWithoutReplacement, PrioritizedSliceSampler,
})


class _ReadPlan:
    """What :meth:`ReplayBuffer.sample` may skip with the current sampler, storage and
    collate function: worked out once for them, not at every call."""

    __slots__ = ("sampler", "storage", "collate_fn", "uniform", "trusted", "gather", "collate")

    def __init__(self, sampler, storage, collate_fn):
        self.sampler, self.storage, self.collate_fn = sampler, storage, collate_fn
        # our RandomSampler on one of our 1-D storages draws torch.randint(len(storage))
        self.uniform = (
            type(sampler) is RandomSampler
            and type(storage)._rand_given_ndim is _PLAIN_RAND_GIVEN_NDIM
            and storage.ndim == 1
        )
        self.trusted = type(sampler) in _IN_RANGE_SAMPLERS
        self.gather = plain_storage(storage)
        self.collate = collate_fn not in _IDENTITY_COLLATES


def _default_collate(storage, is_tensordict: bool = False):
    """torchrl's default collate function for ``storage`` (ours or torchrl's)."""
    try:
        return _storages._get_default_collate(storage, _is_tensordict=is_tensordict)
    except NotImplementedError:
        theirs = torchrl_module("storages")
        if theirs is None:
            raise
        return theirs._get_default_collate(storage, _is_tensordict=is_tensordict)


def _component(value, base: type, module: str):
    """``value`` if it is a ``base`` (ours, or the class torchrl's ``module`` names so, see
    :func:`~torchrl_compat._torchrl_lookup.accepted_classes`), else what calling it builds
    (checked too)."""
    kinds = accepted_classes(base, module)
    if isinstance(value, kinds):
        return value
    name = base.__name__.lower()
    if callable(value):
        value = value()
    if not isinstance(value, kinds):
        raise TypeError(
            f"{name} must be either a {name.capitalize()} or a callable returning a {name} instance."
        )
    return value


def _maybe_delay_init(func):
    @wraps(func)
    def wrapper(self, *args, **kwargs):
        if self._delayed_init and not self._initialized:
            self._init()
        return func(self, *args, **kwargs)

    return wrapper


def _on_cpu(value) -> bool:
    if type(value) is torch.Tensor:
        return value.is_cpu
    return type(value) is tuple and all(type(part) is torch.Tensor and part.is_cpu for part in value)


def _stacked(index: tuple) -> torch.Tensor:
    """``torch.stack(index, -1)``: for the one index of a 1-D storage (a slice sampler's), a
    copy of it as a column, without stack's generic machinery (a few microseconds)."""
    if len(index) == 1 and type(index[0]) is torch.Tensor and index[0].ndim == 1:
        return index[0].unsqueeze(-1).clone(memory_format=torch.contiguous_format)
    return torch.stack(index, -1)


def _info_to(info, device):
    """``info`` with its tensors on ``device`` (a new dict, as torchrl's ``tree_map`` gives)."""
    if type(info) is dict and type(device) is torch.device and device.type == "cpu":
        # the common case: CPU tensors (or tuples of them), which .to() returns as they are
        if all(_on_cpu(value) for value in info.values()):
            return dict(info)
    if type(info) is dict:
        moved = {}
        for key, value in info.items():
            if type(value) is torch.Tensor:
                moved[key] = value.to(device)
            elif type(value) is tuple and all(type(part) is torch.Tensor for part in value):
                moved[key] = tuple(part.to(device) for part in value)
            else:
                break
        else:
            return moved
    return tree_map(lambda x: x.to(device) if hasattr(x, "to") else x, info)


class ReplayBuffer(*torchrl_twin("replay_buffers", "ReplayBuffer")):
    """A generic, composable replay buffer class.

    Keyword Args:
        storage (Storage, Callable[[], Storage], optional): the storage to be used.
            If a callable is passed, it is used as constructor for the storage.
            If none is provided a default :class:`~torchrl_compat.ListStorage` with
            ``max_size`` of ``1_000`` will be created.
        sampler (Sampler, Callable[[], Sampler], optional): the sampler to be used.
            If a callable is passed, it is used as constructor for the sampler.
            If none is provided, a default :class:`~torchrl_compat.RandomSampler`
            will be used.
        writer (Writer, Callable[[], Writer], optional): the writer to be used.
            If a callable is passed, it is used as constructor for the writer.
            If none is provided a default :class:`~torchrl_compat.RoundRobinWriter`
            will be used.
        collate_fn (callable, optional): merges a list of samples to form a
            mini-batch of Tensor(s)/outputs. The default value will be decided
            based on the storage type.
        pin_memory (bool): whether pin_memory() should be called on the rb
            samples.
        prefetch (int, optional): number of next batches to be prefetched
            using multithreading. Defaults to None (no prefetching).
        transform (Transform or Callable[[Any], Any], optional): Transform to be executed when
            :meth:`sample` is called. A callable on the sampled data (a tensordict,
            tensor or pytree) is accepted; with torchrl installed, so is any torchrl
            ``Transform`` (chain them with ``Compose``).
        transform_factory (Callable[[], Callable], optional): a factory for the
            transform. Exclusive with :attr:`transform`.
        batch_size (int, optional): the batch size to be used when sample() is
            called. It can also be passed to :meth:`sample`; it must be given here
            when prefetching or with a sampler that has ``drop_last=True``.
        dim_extend (int, optional): indicates the dim to consider for
            extension when calling :meth:`extend`. Defaults to ``storage.ndim-1``.
            It has no effect on :meth:`add`.
        checkpointer (StorageCheckpointerBase, Callable[[], StorageCheckpointerBase], optional):
            the storage's checkpointer (used by :meth:`dumps` and :meth:`loads`).
            Defaults to the storage's own.
        generator (torch.Generator, optional): a generator to use for sampling.
            Defaults to ``None`` (global default generator).

            .. warning:: As of now, the generator has no effect on the transforms.
        shared (bool, optional): whether the buffer will be shared using multiprocessing or not.
            Defaults to ``False``.
        compilable (bool, optional): whether the writer is compilable.
            If ``True``, the writer cannot be shared between multiple processes.
            Defaults to ``False``.
        delayed_init (bool, optional): whether to initialize storage, writer, sampler and transform
            the first time the buffer is used rather than during construction.
            If not specified, defaults to ``True`` when ``transform_factory`` is provided,
            and ``False`` otherwise.

    Examples:
        >>> import torch
        >>> from torchrl_compat import LazyTensorStorage, ReplayBuffer
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
        >>> rb.extend(torch.arange(6))
        tensor([0, 1, 2, 3, 4, 5])
        >>> len(rb), rb.sample().shape
        (6, torch.Size([4]))
        >>> sample, info = rb.sample(return_info=True)
        >>> bool((sample == info["index"]).all())
        True

    .. note:: The calls made in a training loop take short paths, with the same
        results: a round-robin :meth:`extend` copies each leaf of a tensor or
        tensordict batch into at most two row slices of one of our tensor storages
        (torchrl scatters it through an index tensor and the generic tensordict
        assignment); :meth:`sample` gathers each leaf of such a storage on its own,
        with ``numpy.take`` on CPU (torchrl slices the filled part, then indexes the
        whole tensordict); our ``RandomSampler`` on one of our 1-D storages draws its
        ``torch.randint`` directly; what the sampler, storage and collate function allow
        is worked out once for them, not at every call; the default collate function
        and an empty transform chain are skipped. A batch of 256 from a 2^20-item buffer
        of tensors costs about a third of torchrl's time, a loop step on transitions a
        quarter to a fifth; see ``bench/RESULTS.md``. ``len()`` reads the storage's
        length without taking the buffer's lock (torchrl takes it).

    .. note:: :meth:`set_storage` registers the new storage with the writer and
        attaches the buffer to it (torchrl keeps writing into the previous storage
        while sampling from the new one). :meth:`insert_transform` accepts a plain
        callable, as :meth:`append_transform` does (torchrl fails on its ``eval()``).
    """

    def __init__(
        self,
        *,
        storage: Any | Callable[[], Any] | None = None,
        sampler: Any | Callable[[], Any] | None = None,
        writer: Any | Callable[[], Any] | None = None,
        collate_fn: Callable | None = None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        transform: Any | Callable | None = None,  # noqa-F821
        transform_factory: Callable[[], Any | Callable] | None = None,  # noqa-F821
        batch_size: int | None = None,
        dim_extend: int | None = None,
        checkpointer: Any | Callable[[], Any] | None = None,  # noqa: F821
        generator: torch.Generator | None = None,
        shared: bool = False,
        compilable: bool | None = None,
        delayed_init: bool | None = None,
    ) -> None:
        self._delayed_init = delayed_init
        self._initialized = False
        self._init_storage = storage
        self._init_sampler = sampler
        self._init_writer = writer
        self._init_collate_fn = collate_fn
        self._init_transform = transform
        self._init_transform_factory = transform_factory
        self._init_checkpointer = checkpointer
        self._init_generator = generator
        self._init_compilable = compilable

        if transform is not None and transform_factory is not None:
            raise TypeError(
                f"transform and transform_factory are mutually exclusive. "
                f"Got transform={transform} and transform_factory={transform_factory}."
            )
        if delayed_init is None:
            delayed_init = transform_factory is not None
        self._delayed_init = delayed_init

        self._pin_memory = pin_memory
        self._prefetch = bool(prefetch)
        self._prefetch_cap = prefetch or 0
        self._prefetch_queue = collections.deque()
        self._batch_size = batch_size
        if batch_size is None and prefetch:
            raise ValueError(
                "Dynamic batch-size specification is incompatible "
                "with multithreaded sampling. "
                "When using prefetch, the batch-size must be specified in "
                "advance. "
            )
        if dim_extend is not None and dim_extend < 0:
            raise ValueError("dim_extend must be a positive value.")
        self._dim_extend = dim_extend
        if self._prefetch_cap:
            self._prefetch_executor = ThreadPoolExecutor(max_workers=self._prefetch_cap)
        if shared and prefetch:
            raise ValueError("Cannot share prefetched replay buffers.")
        self.shared = shared
        self.share(self.shared)
        self._replay_lock = threading.RLock()
        self._futures_lock = threading.RLock()
        # numpy views of the storage's leaves, made once for the gathers of sample()
        self._leaf_arrays = {}
        self._plan = None
        if not self._delayed_init:
            self._init()

    # ------------------------------------------------------------------ setup
    def _init(self) -> None:
        """Builds the storage, sampler, writer, collate function and transform.

        Called at construction, or on first use with ``delayed_init=True``.
        """
        if self._initialized:
            return
        self._initialized = True
        try:
            self._storage = self._maybe_make_storage(self._init_storage, compilable=self._init_compilable)
            self._storage.attach(self)
            self._sampler = self._maybe_make_sampler(self._init_sampler)
            self._writer = self._maybe_make_writer(self._init_writer)
            self._writer.register_storage(self._storage)
            self._get_collate_fn(self._init_collate_fn)
            self._transform = self._maybe_make_transform(self._init_transform, self._init_transform_factory)
            if self._batch_size is None and getattr(self._sampler, "drop_last", False):
                raise ValueError(
                    "Samplers with drop_last=True must work with a predictable batch-size. "
                    "Please pass the batch-size to the ReplayBuffer constructor."
                )
            if self._dim_extend is None:
                self._dim_extend = self._storage.ndim - 1 if self._storage is not None else 1
            self._storage.checkpointer = self._init_checkpointer
            self.set_rng(generator=self._init_generator)
            self._initialize_prioritized_sampler()
            for name in (
                "_init_storage", "_init_sampler", "_init_writer", "_init_collate_fn",
                "_init_transform", "_init_transform_factory", "_init_checkpointer",
                "_init_generator", "_init_compilable",
            ):
                setattr(self, name, None)
        except Exception:
            self._initialized = False
            raise

    @property
    def initialized(self) -> bool:
        """Whether the replay buffer has been initialized."""
        return self._initialized

    def _initialize_prioritized_sampler(self) -> None:
        """Gives the items already in the storage the sampler's default priority."""
        if isinstance(self._sampler, PRIORITIZED_SAMPLERS) and len(self._storage) > 0:
            length = len(self._storage)
            self._sampler.update_priority(
                torch.arange(length, dtype=torch.long),
                torch.full((length,), self._sampler.default_priority, dtype=torch.float),
            )

    def _maybe_make_storage(self, storage, compilable):
        if storage is None:
            return ListStorage(max_size=1_000, compilable=compilable)
        return _component(storage, _storages.Storage, "storages")

    def _maybe_make_sampler(self, sampler):
        return RandomSampler() if sampler is None else _component(sampler, Sampler, "samplers")

    def _maybe_make_writer(self, writer):
        return RoundRobinWriter() if writer is None else _component(writer, Writer, "writers")

    def _maybe_make_transform(self, transform, transform_factory):
        if transform_factory is not None:
            if transform is not None:
                raise TypeError("transform and transform_factory cannot be used simultaneously")
            transform = transform_factory()
        if transform is None:
            transform = _transforms.Compose()
        elif not isinstance(transform, _transforms.Compose):
            if not isinstance(transform, _transforms.Transform) and callable(transform):
                transform = _transforms.CallableTransform(transform)
            elif not isinstance(transform, _transforms.Transform):
                raise RuntimeError("transform must be either a Transform instance or a callable.")
            transform = _transforms.Compose(transform)
        transform.eval()
        return transform

    def share(self, shared: bool = True):
        self.shared = shared
        self._write_lock = multiprocessing.Lock() if shared else _NO_LOCK
        return self

    @_maybe_delay_init
    def set_rng(self, generator) -> None:
        self._rng = generator
        self._storage._rng = generator
        self._sampler._rng = generator
        self._writer._rng = generator

    @property
    def dim_extend(self):
        return self._dim_extend

    @dim_extend.setter
    def dim_extend(self, value):
        if getattr(self, "_dim_extend", None) is not None and self._dim_extend != value:
            raise RuntimeError("dim_extend cannot be reset. Please create a new replay buffer.")
        if value is None:
            value = self._storage.ndim - 1 if self._initialized and self._storage is not None else 1
        self._dim_extend = value

    @property
    def batch_size(self):
        """The batch size of the replay buffer.

        The batch size can be overriden by setting the `batch_size` parameter in the :meth:`sample` method.

        It defines both the number of samples returned by :meth:`sample` and the number of samples that are
        yielded by the :class:`ReplayBuffer` iterator.
        """
        return self._batch_size

    def _transpose(self, data):
        if is_tensor_collection(data):
            return data.transpose(self.dim_extend, 0)
        return tree_map(lambda x: x.transpose(self.dim_extend, 0), data)

    def _get_collate_fn(self, collate_fn):
        self._collate_fn = (
            collate_fn
            if collate_fn is not None
            else _default_collate(self._storage, isinstance(self, TensorDictReplayBuffer))
        )

    @_maybe_delay_init
    def set_storage(self, storage, collate_fn: Callable | None = None):
        """Sets a new storage in the replay buffer and returns the previous storage.

        Args:
            storage (Storage): the new storage for the buffer.
            collate_fn (callable, optional): if provided, the collate_fn is set to this
                value. Otherwise it is reset to a default value.
        """
        prev_storage = self._storage
        self._storage = storage
        storage.attach(self)
        self._writer.register_storage(storage)
        self._get_collate_fn(collate_fn)
        return prev_storage

    @_maybe_delay_init
    def set_writer(self, writer):
        """Sets a new writer in the replay buffer and returns the previous writer."""
        prev_writer = self._writer
        self._writer = writer
        self._writer.register_storage(self._storage)
        return prev_writer

    @_maybe_delay_init
    def set_sampler(self, sampler):
        """Sets a new sampler in the replay buffer and returns the previous sampler."""
        prev_sampler = self._sampler
        self._sampler = sampler
        return prev_sampler

    def __len__(self) -> int:
        if self._delayed_init and not self._initialized:
            self._init()
        # our storages read their length atomically; torchrl's lock their own counter
        return len(self._storage)

    def _getattr(self, attr):
        return getattr(self, attr)

    def _setattr(self, attr, value):
        setattr(self, attr, value)
        return None

    @property
    @_maybe_delay_init
    def write_count(self) -> int:
        """The total number of items written so far in the buffer through add and extend."""
        return self._writer._write_count

    def __repr__(self) -> str:
        storage = textwrap.indent(f"storage={getattr(self, '_storage', None)}", " " * 4)
        writer = textwrap.indent(f"writer={getattr(self, '_writer', None)}", " " * 4)
        sampler = textwrap.indent(f"sampler={getattr(self, '_sampler', None)}", " " * 4)
        chain = getattr(self, "_transform", None)
        if chain is not None and not (isinstance(chain, _transforms.Compose) and not len(chain)):
            transform = f"\n{chain}, "
        else:
            transform = ""
        batch_size = textwrap.indent(f"batch_size={getattr(self, '_batch_size', None)}", " " * 4)
        collate_fn = textwrap.indent(f"collate_fn={getattr(self, '_collate_fn', None)}", " " * 4)
        return f"{self.__class__.__name__}(\n{storage}, \n{sampler}, \n{writer}, {transform}\n{batch_size}, \n{collate_fn})"

    # ------------------------------------------------------------- indexing
    def _has_transforms(self) -> bool:
        chain = self._transform
        if chain is None:
            return False
        if type(chain).__len__ is _COMPOSE_LEN:
            # len(Compose) goes through nn.Module's attribute lookup: read the list directly
            return len(chain._modules["transforms"]._modules) > 0
        return len(chain) > 0

    @_maybe_delay_init
    def __getitem__(self, index: int | torch.Tensor | Any) -> Any:
        if isinstance(index, str) or (isinstance(index, tuple) and unravel_key(index)):
            return self[:][index]
        if isinstance(index, tuple):
            if len(index) == 1:
                return self[index[0]]
            return self[:][index]
        index = _to_numpy(index)
        if self.dim_extend > 0:
            index = (slice(None),) * self.dim_extend + (index,)
            with self._replay_lock:
                data = self._storage[index]
            data = self._transpose(data)
        else:
            with self._replay_lock:
                data = self._storage[index]
        if not isinstance(index, INT_CLASSES):
            data = self._collate_fn(data)
        if self._has_transforms():
            with data.unlock_() if is_tensor_collection(data) else contextlib.nullcontext():
                data = self._transform(data)
        return _pin_memory(data) if self._pin_memory else data

    @_maybe_delay_init
    def __setitem__(self, index, value) -> None:
        if isinstance(index, str) or (isinstance(index, tuple) and unravel_key(index)):
            self[:][index] = value
            return
        if isinstance(index, tuple):
            if len(index) == 1:
                self[index[0]] = value
            else:
                self[:][index] = value
            return
        index = _to_numpy(index)
        if self._has_transforms():
            value = self._transform.inv(value)
        if self.dim_extend > 0:
            index = (slice(None),) * self.dim_extend + (index,)
            with self._replay_lock:
                self._storage[index] = self._transpose(value)
        else:
            with self._replay_lock:
                self._storage[index] = value

    # ---------------------------------------------------------- persistence
    @_maybe_delay_init
    def state_dict(self) -> dict[str, Any]:
        return {
            "_storage": self._storage.state_dict(),
            "_sampler": self._sampler.state_dict(),
            "_writer": self._writer.state_dict(),
            "_transforms": self._transform.state_dict(),
            "_batch_size": self._batch_size,
            "_rng": (self._rng.get_state().clone(), str(self._rng.device))
            if self._rng is not None
            else None,
        }

    @_maybe_delay_init
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._storage.load_state_dict(state_dict["_storage"])
        self._sampler.load_state_dict(state_dict["_sampler"])
        self._writer.load_state_dict(state_dict["_writer"])
        self._transform.load_state_dict(state_dict["_transforms"])
        self._batch_size = state_dict["_batch_size"]
        rng = state_dict.get("_rng")
        if rng is not None:
            state, device = rng
            rng = torch.Generator(device=device)
            rng.set_state(state)
            self.set_rng(generator=rng)

    @_maybe_delay_init
    def dumps(self, path):
        """Saves the replay buffer on disk at the specified path.

        The layout is torchrl's: ``storage/``, ``sampler/``, ``writer/`` (each written
        by that component's ``dumps``), ``rng_state/`` when the buffer has a generator,
        ``transform.t`` when the transforms have a state, and ``buffer_metadata.json``.

        .. note:: The whole checkpoint is written into a sibling directory
            (``.<name>.partial-<id>``), every component dumping into it, and published over
            ``path`` in one atomic rename (torchrl writes the parts one after the other
            into ``path``). A dump interrupted at any moment, even killed, leaves the
            previous checkpoint whole, never a new storage beside an old sampler or writer;
            the next ``dumps`` to the same path removes what killed dumps left beside it,
            never the directory of a dump still running. Entries of ``path`` that are not
            part of the checkpoint are carried into the new directory (as hard links), so
            don't let other programs create files in ``path`` while it is dumped. A
            :class:`~torchrl_compat.LazyMemmapStorage` whose ``scratch_dir`` is
            ``path / "storage"`` keeps its files: they are hard-linked into the new
            checkpoint, and stay its live data under the same names.

        Args:
            path (Path or str): path where to save the replay buffer.

        Examples:
            >>> import tempfile
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl_compat import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
            >>> def make():
            ...     return TensorDictPrioritizedReplayBuffer(
            ...         alpha=0.7, beta=0.5, storage=LazyTensorStorage(100), batch_size=8)
            >>> rb = make()
            >>> _ = rb.extend(TensorDict({"obs": torch.randn(20, 3)}, [20]))
            >>> with tempfile.TemporaryDirectory() as tmpdir:
            ...     rb.dumps(tmpdir)
            ...     rb_load = make()
            ...     rb_load.loads(tmpdir)
            >>> len(rb_load), bool((rb_load[:]["obs"] == rb[:]["obs"]).all())
            (20, True)
        """
        dump_buffer(self, path)

    @_maybe_delay_init
    def loads(self, path):
        """Loads a replay buffer state at the given path.

        The buffer should have matching components and be saved using :meth:`dumps`.

        .. note:: Every part of the checkpoint is read and checked before any part of the
            buffer changes: the storage's, sampler's and writer's files (as their own
            :meth:`loads` check them), the generator state, the transform state and
            ``buffer_metadata.json``. A missing, truncated or otherwise damaged file raises
            an error naming it and leaves the buffer as it was (torchrl loads the parts one
            after the other, and a damaged sampler file found after the storage was loaded
            leaves the buffer half old, half new). The checkpoint is only read, never
            written. Components of torchrl's own are loaded as torchrl loads them, after
            the checks.

        Args:
            path (Path or str): path where the replay buffer was saved.

        See :meth:`dumps` for more info.
        """
        load_buffer(self, path)

    @_maybe_delay_init
    def save(self, *args, **kwargs):
        """Alias for :meth:`dumps`."""
        return self.dumps(*args, **kwargs)

    @_maybe_delay_init
    def dump(self, *args, **kwargs):
        """Alias for :meth:`dumps`."""
        return self.dumps(*args, **kwargs)

    @_maybe_delay_init
    def load(self, *args, **kwargs):
        """Alias for :meth:`loads`."""
        return self.loads(*args, **kwargs)

    @_maybe_delay_init
    def register_save_hook(self, hook: Callable[[Any], Any]):
        """Registers a save hook for the storage.

        .. note:: Hooks are currently not serialized when saving a replay buffer: they must
            be manually re-initialized every time the buffer is created.
        """
        self._storage.register_save_hook(hook)

    @_maybe_delay_init
    def register_load_hook(self, hook: Callable[[Any], Any]):
        """Registers a load hook for the storage.

        .. note:: Hooks are currently not serialized when saving a replay buffer: they must
            be manually re-initialized every time the buffer is created.
        """
        self._storage.register_load_hook(hook)

    # ---------------------------------------------------------------- write
    @_maybe_delay_init
    def add(self, data: Any) -> int:
        """Add a single element to the replay buffer.

        Args:
            data (Any): data to be added to the replay buffer

        Returns:
            index where the data lives in the replay buffer.
        """
        if self._has_transforms():
            is_tc = is_tensor_collection(data)
            with _set_dispatch_td_nn_modules(is_tc):
                # transforms expect a time dimension inside a buffer: add one for the call
                unsqueezed = data.unsqueeze(-1) if is_tc else contextlib.nullcontext(data)
                with unsqueezed as data_unsq:
                    result = self._transform.inv(data_unsq)
                    if is_tc and result is not None:
                        data = result.squeeze(-1)
                    elif result is None:
                        data = None
        if data is None:
            return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        if _RL_WARNINGS and is_tensor_collection(data) and data.ndim:
            warnings.warn(
                f"Using `add()` with a TensorDict that has batch_size={data.batch_size}. "
                f"Use `extend()` to add multiple elements, or `add()` with a single element (batch_size=torch.Size([])). "
                "You can silence this warning by setting the `RL_WARNINGS` environment variable to `'0'`."
            )
        return self._add(data)

    def _add(self, data):
        with self._replay_lock, self._write_lock:
            index = self._writer.add(data)
            self._sampler.add(index)
        return index

    def _extend(self, data: Sequence, *, update_priority: bool = True) -> torch.Tensor:
        if is_compiling():
            return self._extend_unlocked(data)
        with self._replay_lock, self._write_lock:
            return self._extend_unlocked(data)

    def _extend_unlocked(self, data) -> torch.Tensor:
        if self._dim_extend > 0:
            data = self._transpose(data)
        index = self._writer.extend(data)
        self._sampler.extend(index)
        return index

    def extend(self, data: Sequence, *, update_priority: bool | None = None) -> torch.Tensor:
        """Extends the replay buffer with one or more elements contained in an iterable.

        If present, the inverse transforms will be called.

        Args:
            data (iterable): collection of data to be added to the replay
                buffer. A tuple is read as one pytree whose leaves hold the items; a
                list (at the root) as the items themselves.

        Keyword Args:
            update_priority (bool, optional): Whether to update the priority of the data. Defaults to True.
                Without effect in this class. See :meth:`~torchrl_compat.TensorDictReplayBuffer.extend` for more details.

        Returns:
            Indices of the data added to the replay buffer.
        """
        if self._delayed_init and not self._initialized:
            self._init()
        if update_priority is not None:
            raise NotImplementedError(
                "update_priority is not supported in this class. See :meth:`~torchrl.data.TensorDictReplayBuffer.extend` for more details."
            )
        if self._has_transforms():
            with _set_dispatch_td_nn_modules(is_tensor_collection(data)):
                data = self._transform.inv(data)
        if data is None:
            return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        return self._extend(data, update_priority=update_priority)

    def update_priority(
        self,
        index: int | torch.Tensor | tuple[torch.Tensor],
        priority: int | torch.Tensor,
    ) -> None:
        if self._delayed_init and not self._initialized:
            self._init()
        if isinstance(index, tuple):
            index = torch.stack(index, -1)
        priority = torch.as_tensor(priority)
        if self._dim_extend > 0 and priority.ndim > 1:
            priority = self._transpose(priority).flatten()
        with self._replay_lock, self._write_lock:
            self._sampler.update_priority(index, priority, storage=self._storage)

    @_maybe_delay_init
    def empty(self, empty_write_count: bool = True):
        """Empties the replay buffer and reset cursor to 0.

        Args:
            empty_write_count (bool, optional): Whether to empty the write_count attribute. Defaults to `True`.
        """
        self._writer._empty(empty_write_count=empty_write_count)
        self._sampler._empty()
        self._storage._empty()

    def mark_update(self, index: int | torch.Tensor) -> None:
        # called by the writer at every write: the delayed-init check inline, not decorated
        if self._delayed_init and not self._initialized:
            self._init()
        self._sampler.mark_update(index, storage=self._storage)

    # ----------------------------------------------------------------- read
    def _info_in_batch(self, info: dict, numel: int) -> dict | None:
        """The info entries to assemble into a gathered batch (none for plain buffers)."""
        return None

    def _read_plan(self) -> _ReadPlan:
        plan = self._plan
        if (
            plan is None
            or plan.sampler is not self._sampler
            or plan.storage is not self._storage
            or plan.collate_fn is not self._collate_fn
        ):
            plan = self._plan = _ReadPlan(self._sampler, self._storage, self._collate_fn)
        return plan

    def _sample(self, batch_size: int) -> tuple[Any, dict]:
        if is_compiling():
            index, info = self._sampler.sample(self._storage, batch_size)
            info["index"] = index
            data = self._storage.get(index)
            plan = None
        else:
            plan = self._read_plan()
            storage = self._storage
            with self._replay_lock, self._write_lock:
                rows = None
                if plan.uniform:
                    index, rows = self._uniform_index(storage, batch_size)
                    info = {"index": index}
                else:
                    index, info = self._sampler.sample(storage, batch_size)
                    info["index"] = index
                data = None
                if plan.gather:
                    data = gather_rows(
                        storage,
                        index,
                        trusted=plan.trusted,
                        info=self._info_in_batch(info, batch_size),
                        arrays=self._leaf_arrays,
                        numpy_index=rows,
                    )
                if data is None:
                    data = storage.get(index)
        if (plan is None or plan.collate) and not isinstance(index, INT_CLASSES):
            data = self._collate_fn(data)
        if self._has_transforms():
            data = self._apply_transform(data)
        if self._pin_memory:
            data = _pin_memory(data)
        return data, info

    @staticmethod
    def _uniform_index(storage, batch_size):
        """What our ``RandomSampler`` draws from one of our 1-D storages (``torch.randint``
        over the filled part), without the two calls in between; with a numpy view of it
        for the gather when on CPU: ``(index, rows or None)``."""
        length = len(storage)
        if length == 0:
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        device = storage.device
        if type(device) is torch.device and device.type == "cpu" and type(batch_size) is int and batch_size >= 0:
            # randint fills an empty tensor with random_(0, length): the same draws, here
            # into numpy-owned memory, which spares the gather a conversion
            rows = np.empty(batch_size, dtype=np.int64)
            return torch.from_numpy(rows).random_(0, length, generator=storage._rng), rows
        return torch.randint(0, length, (batch_size,), generator=storage._rng, device=device), None

    def _apply_transform(self, data):
        is_td = is_tensor_collection(data)
        with data.unlock_() if is_td else contextlib.nullcontext(), _set_dispatch_td_nn_modules(is_td):
            return self._transform(data)

    def sample(self, batch_size: int | None = None, return_info: bool = False) -> Any:
        """Samples a batch of data from the replay buffer.

        Uses Sampler to sample indices, and retrieves them from Storage.

        Args:
            batch_size (int, optional): size of data to be collected. If none
                is provided, this method will sample a batch-size as indicated
                by the sampler.
            return_info (bool): whether to return info. If True, the result
                is a tuple (data, info). If False, the result is the data.

        Returns:
            A batch of data selected in the replay buffer.
            A tuple containing this batch and info if return_info flag is set to True.
        """
        result = self._batch_and_info(batch_size)
        if return_info:
            return result[0], self._info_on_storage_device(result[1])
        return result[0]

    def _batch_and_info(self, batch_size: int | None) -> tuple[Any, dict]:
        """:meth:`sample`'s ``(data, info)``, the info as the sampler gave it."""
        if self._delayed_init and not self._initialized:
            self._init()
        if batch_size is None:
            batch_size = self._batch_size
            if batch_size is None:
                raise RuntimeError(
                    "batch_size not specified. You can specify the batch_size when "
                    "constructing the replay buffer, or pass it to the sample method. "
                    "Refer to the ReplayBuffer documentation "
                    "for a proper usage of the batch-size arguments."
                )
        elif self._batch_size is not None and batch_size != self._batch_size:
            warnings.warn(
                f"Got conflicting batch_sizes in constructor ({self._batch_size}) "
                f"and `sample` ({batch_size}). Refer to the ReplayBuffer documentation "
                "for a proper usage of the batch-size arguments. "
                "The batch-size provided to the sample method "
                "will prevail."
            )
        if not self._prefetch:
            return self._sample(batch_size)
        with self._futures_lock:
            while (
                len(self._prefetch_queue)
                < min(self._sampler._remaining_batches, self._prefetch_cap)
                and not self._sampler.ran_out
            ) or not len(self._prefetch_queue):
                self._prefetch_queue.append(self._prefetch_executor.submit(self._sample, batch_size))
            return self._prefetch_queue.popleft().result()

    def _info_on_storage_device(self, info: dict) -> dict:
        """The info handed to the caller: its tensors on the storage's device, as torchrl's
        ``tree_map`` moves them (a new dict)."""
        device = getattr(self._storage, "device", None)
        return info if device is None else _info_to(info, device)

    # ----------------------------------------------------------- transforms
    @_maybe_delay_init
    def append_transform(self, transform, *, invert: bool = False):  # noqa: D417
        """Appends transform at the end.

        Transforms are applied in order when `sample` is called.

        Args:
            transform (Transform or callable): The transform to be appended.

        Keyword Args:
            invert (bool, optional): if ``True``, the transform will be inverted (forward calls will be called
                during writing and inverse calls during reading). Defaults to ``False``.

        Examples:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from torchrl_compat import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10), batch_size=4)
            >>> data = TensorDict({"a": torch.zeros(10)}, [10])
            >>> def t(data):
            ...     data += 1
            ...     return data
            >>> _ = rb.append_transform(t, invert=True)
            >>> _ = rb.extend(data)
            >>> bool((data == 1).all())
            True
        """
        transform = self._as_transform(transform)
        if invert:
            transform = _transforms.InvertTransform(transform)
        transform.eval()
        self._transform.append(transform)
        return self

    @staticmethod
    def _as_transform(transform):
        if not isinstance(transform, _transforms.Transform) and callable(transform):
            return _transforms.CallableTransform(transform)
        return transform

    @_maybe_delay_init
    def insert_transform(self, index: int, transform, *, invert: bool = False):  # noqa: D417
        """Inserts transform.

        Transforms are executed in order when `sample` is called.

        Args:
            index (int): Position to insert the transform.
            transform (Transform or callable): The transform to be inserted.

        Keyword Args:
            invert (bool, optional): if ``True``, the transform will be inverted (forward calls will be called
                during writing and inverse calls during reading). Defaults to ``False``.
        """
        transform = self._as_transform(transform)
        transform.eval()
        if invert:
            transform = _transforms.InvertTransform(transform)
        self._transform.insert(index, transform)
        return self

    # ------------------------------------------------------------ iteration
    _iterator = None

    @_maybe_delay_init
    def next(self):
        """Returns the next item in the replay buffer.

        This method is used to iterate over the replay buffer in contexts where __iter__ is not available.
        """
        try:
            if self._iterator is None:
                self._iterator = iter(self)
            out = next(self._iterator)
            if out is not None and (out.device != "cpu"):
                out = out.copy().clear_device_()
            return out
        except StopIteration:
            self._iterator = None
            return None

    @_maybe_delay_init
    def __iter__(self):
        if self._sampler.ran_out:
            self._sampler.ran_out = False
        if self._batch_size is None:
            raise RuntimeError(
                "Cannot iterate over the replay buffer. "
                "Batch_size was not specified during construction of the replay buffer."
            )
        while not self._sampler.ran_out or (self._prefetch and len(self._prefetch_queue)):
            yield self.sample()

    # -------------------------------------------------------------- pickling
    @_maybe_delay_init
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if getattr(self, "_rng", None) is not None:
            state["_rng"] = TensorDict(rng_state=self._rng.get_state().clone(), device=self._rng.device)
        for name in ("_replay_lock", "_futures_lock", "_prefetch_queue", "_prefetch_executor"):
            if state.pop(name, None) is not None:
                state[f"{name}_placeholder"] = None
        state["_leaf_arrays"] = {}
        state["_plan"] = None
        state.pop("_stacked_index", None)
        return state

    def __setstate__(self, state: dict[str, Any]):
        state.setdefault("_leaf_arrays", {})
        state.setdefault("_plan", None)
        rng = None
        rng_state = state.get("_rng")
        if rng_state is not None:
            rng = torch.Generator(device=rng_state.device)
            rng.set_state(rng_state["rng_state"])
        if state.pop("_replay_lock_placeholder", 0) is None:
            state["_replay_lock"] = threading.RLock()
        if state.pop("_futures_lock_placeholder", 0) is None:
            state["_futures_lock"] = threading.RLock()
        if state.pop("_prefetch_queue_placeholder", 0) is None:
            state["_prefetch_queue"] = collections.deque()
        if state.pop("_prefetch_executor_placeholder", 0) is None:
            state["_prefetch_executor"] = ThreadPoolExecutor(max_workers=state["_prefetch_cap"])
        self.__dict__.update(state)
        if rng is not None:
            self.set_rng(rng)

    # ----------------------------------------------------------- components
    @property
    @_maybe_delay_init
    def sampler(self):
        """The sampler of the replay buffer."""
        return self._sampler

    @property
    @_maybe_delay_init
    def writer(self):
        """The writer of the replay buffer."""
        return self._writer

    @property
    @_maybe_delay_init
    def storage(self):
        """The storage of the replay buffer."""
        return self._storage

    @property
    @_maybe_delay_init
    def transform(self):
        """The transform of the replay buffer (a ``Compose``)."""
        return self._transform


class PrioritizedReplayBuffer(ReplayBuffer, *torchrl_twin("replay_buffers", "PrioritizedReplayBuffer")):
    """Prioritized replay buffer.

    All arguments are keyword-only arguments.

    Presented in "Schaul, T.; Quan, J.; Antonoglou, I.; and Silver, D. 2015.
    Prioritized experience replay." (https://arxiv.org/abs/1511.05952)

    Args:
        alpha (:obj:`float`): exponent α determines how much prioritization is used,
            with α = 0 corresponding to the uniform case.
        beta (:obj:`float`): importance sampling negative exponent.
        eps (:obj:`float`): delta added to the priorities to ensure that the buffer
            does not contain null priorities.
        dtype (torch.dtype): the precision of the priority trees. Defaults to ``torch.float``.
        storage (Storage, optional): the storage to be used. If none is provided
            a default :class:`~torchrl_compat.ListStorage` with
            ``max_size`` of ``1_000`` will be created.
        sampler (Sampler, optional): the sampler to be used. If none is provided,
            a default :class:`~torchrl_compat.PrioritizedSampler` with
            ``alpha``, ``beta``, and ``eps`` will be created.
        collate_fn (callable, optional): merges a list of samples to form a
            mini-batch of Tensor(s)/outputs. The default value will be decided
            based on the storage type.
        pin_memory (bool): whether pin_memory() should be called on the rb
            samples.
        prefetch (int, optional): number of next batches to be prefetched
            using multithreading. Defaults to None (no prefetching).
        transform (Transform, optional): Transform to be executed when
            sample() is called.
        batch_size (int, optional): the batch size to be used when sample() is
            called.
        dim_extend (int, optional): indicates the dim to consider for
            extension when calling :meth:`extend`. Defaults to ``storage.ndim-1``.
        delayed_init (bool, optional): whether to initialize storage, writer, sampler and transform
            the first time the buffer is used rather than during construction.
            Defaults to ``False``.

    .. note::
        Generic prioritized replay buffers (ie. non-tensordict backed) require
        calling :meth:`~.sample` with the ``return_info`` argument set to
        ``True`` to have access to the indices, and hence update the priority.

    Examples:
        >>> import torch
        >>> from torchrl_compat import ListStorage, PrioritizedReplayBuffer
        >>> rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.9, storage=ListStorage(10))
        >>> _ = rb.extend(torch.arange(10))
        >>> sample, info = rb.sample(5, return_info=True)
        >>> sorted(info)
        ['index', 'priority_weight']
        >>> rb.update_priority(info["index"], torch.full((5,), 5.0))
    """

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        storage: Any | None = None,
        sampler: Any | None = None,
        collate_fn: Callable | None = None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        transform: Any | None = None,  # noqa-F821
        batch_size: int | None = None,
        dim_extend: int | None = None,
        delayed_init: bool = False,
    ) -> None:
        if storage is None:
            storage = ListStorage(max_size=1_000)
        if sampler is None:
            sampler = PrioritizedSampler(storage.max_size, alpha, beta, eps, dtype)
        super().__init__(
            storage=storage,
            sampler=sampler,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            prefetch=prefetch,
            transform=transform,
            batch_size=batch_size,
            dim_extend=dim_extend,
            delayed_init=delayed_init,
        )


class TensorDictReplayBuffer(ReplayBuffer, *torchrl_twin("replay_buffers", "TensorDictReplayBuffer")):
    """TensorDict-specific wrapper around the :class:`~torchrl_compat.ReplayBuffer` class.

    Samples are tensordicts that carry the storage index of each item under ``"index"``
    (and, with a prioritized sampler, its importance weight under ``"priority_weight"``),
    so that :meth:`update_tensordict_priority` needs nothing but the sample.

    Keyword Args:
        priority_key (str, optional): the key at which priority is assumed to
            be stored within TensorDicts added to this ReplayBuffer.
            This is to be used when the sampler is of type
            :class:`~torchrl_compat.PrioritizedSampler`.
            Defaults to ``"td_error"``.
        **kwargs: the keyword arguments of :class:`~torchrl_compat.ReplayBuffer`;
            the default writer is a :class:`~torchrl_compat.TensorDictRoundRobinWriter`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyTensorStorage, TensorDictReplayBuffer
        >>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=5)
        >>> data = TensorDict({"a": torch.ones(10, 3), ("b", "c"): torch.zeros(10, 1, 1)}, [10])
        >>> _ = rb.extend(data)
        >>> sample = rb.sample()
        >>> set(sample.keys(True, True)) == {"a", ("b", "c"), "index"}
        True
        >>> bool((sample["a"] == 1).all()), sample.batch_size
        (True, torch.Size([5]))

    .. note:: A sample from a 1-D tensor storage is assembled once, with ``"index"``
        and the sampler's info (``priority_weight``, a slice sampler's ``("next",
        "truncated")``...) in place of the stored leaves of the same keys, which are not
        gathered; torchrl gathers every leaf, then sets each info entry with
        ``TensorDict.set``. torchrl's :meth:`extend` runs even an empty transform chain,
        whose inverse hands the writer a shallow clone of the data (so the caller's
        tensordict never gets an ``"index"`` entry); here the tensordict writer writes
        the index beside the caller's data instead, and no clone is made.
        :meth:`update_tensordict_priority` reads a priority with one value per item
        without a reduction.
    """

    def __init__(self, *, priority_key: str = "td_error", **kwargs) -> None:
        if kwargs.get("writer", None) is None:
            kwargs["writer"] = partial(TensorDictRoundRobinWriter, compilable=kwargs.get("compilable"))
        super().__init__(**kwargs)
        self.priority_key = priority_key

    def _get_priority_item(self, tensordict: TensorDictBase) -> float:
        """The priority of one item (a 0-d tensordict): its ``priority_key`` entry,
        reduced to one number, or the sampler's default priority."""
        priority = tensordict.get(self.priority_key, None)
        if priority is None:
            return self._sampler.default_priority
        ndim = self._storage.ndim
        if ndim > 1:
            priority = priority.flatten(0, ndim - 1)
        try:
            if priority.numel() > 1:
                return _reduce(priority, self._sampler.reduction)
            return priority.item()
        except ValueError:
            raise ValueError(
                f"Found a priority key of size"
                f" {tensordict.get(self.priority_key).shape} but expected "
                f"scalar value"
            )

    def _get_priority_vector(self, tensordict: TensorDictBase) -> torch.Tensor:
        """One priority per item of a batch: the ``priority_key`` entry reduced over its
        trailing dimensions with the sampler's reduction, or the default priority."""
        priority = self._entry(tensordict, self.priority_key)
        if priority is None:
            # as_tensor: the default priority may be a (fresh) tensor, which torch.tensor
            # copies with a warning
            return torch.as_tensor(
                self._sampler.default_priority, dtype=torch.float, device=tensordict.device
            ).expand(tensordict.shape[0])
        ndim = self._storage.ndim
        if ndim == 1 and type(priority) is torch.Tensor and priority.is_floating_point() and priority.ndim:
            numel = priority.shape[0]
            if priority.numel() == numel and priority.ndim <= 2:
                # one value per item: every reduction returns it as it is
                return priority.reshape(numel).clone()
        if ndim > 1 and priority.ndim >= ndim:
            priority = priority.flatten(0, ndim - 1)
        priority = priority.reshape(priority.shape[0], -1)
        priority = _reduce(priority, self._sampler.reduction, dim=1)
        if ndim > 1:
            priority = priority.unflatten(0, tensordict.shape[:ndim])
        return priority

    @_maybe_delay_init
    def add(self, data: TensorDictBase) -> int:
        with _set_dispatch_td_nn_modules(is_tensor_collection(data)):
            data = self._inverse(data)
        if data is None:
            return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        index = super()._add(data)
        if index is not None:
            if is_tensor_collection(data):
                self._set_index_in_td(data, index)
            self.update_tensordict_priority(data)
        return index

    def _inverse(self, data):
        """The inverse transform chain applied to written data.

        Even an empty chain hands back a shallow copy (so the writer's ``"index"`` entry
        lands on the copy, not on the caller's data); a plain tensordict is copied
        directly.
        """
        if type(data) is TensorDict and not self._has_transforms():
            return shallow_copy(data)
        return self._transform.inv(data)

    def extend(self, tensordicts: TensorDictBase, *, update_priority: bool | None = None) -> torch.Tensor:
        """Extends the replay buffer with a batch of data.

        Args:
            tensordicts (TensorDictBase): The data to extend the replay buffer with.

        Keyword Args:
            update_priority (bool, optional): Whether to update the priority of the data. Defaults to True.

        Returns:
            The indices of the data that were added to the replay buffer.
        """
        if self._delayed_init and not self._initialized:
            self._init()
        if not isinstance(tensordicts, TensorDictBase):
            raise ValueError(
                f"{self.__class__.__name__} only accepts TensorDictBase subclasses. tensorclasses "
                f"and other types are not compatible with that class. "
                "Please use a regular `ReplayBuffer` instead."
            )
        writer = self._writer
        if (
            type(tensordicts) is TensorDict
            and type(writer) is TensorDictRoundRobinWriter
            and self._dim_extend == 0
            and not self._has_transforms()
            and not is_compiling()
        ):
            # what torchrl does through a shallow copy (see _inverse), without making it:
            # the writer writes the "index" entry beside the data
            with self._replay_lock, self._write_lock:
                index = writer._extend_leaving_data(tensordicts)
                self._sampler.extend(index)
        else:
            tensordicts = self._inverse(tensordicts)
            if tensordicts is None:
                return torch.zeros((0, self._storage.ndim), dtype=torch.long)
            index = super()._extend(tensordicts)
            # the writer already set it (a plain tensordict holds the very tensor)
            if not (type(tensordicts) is TensorDict and tensordicts._tensordict.get("index") is index):
                self._set_index_in_td(tensordicts, index)
        if update_priority is None or update_priority:
            try:
                vector = self._entry(tensordicts, self.priority_key)
                if vector is not None:
                    self.update_priority(index, vector)
            except Exception as e:
                raise RuntimeError(
                    "Failed to update priority of extended data. You can try to set update_priority=False in the extend method and update the priority manually."
                ) from e
        return index

    @staticmethod
    def _entry(tensordict, key):
        """``tensordict.get(key, None)`` (a plain tensordict's string key read directly)."""
        if type(tensordict) is TensorDict and type(key) is str:
            return tensordict._tensordict.get(key)
        return tensordict.get(key, None)

    def _set_index_in_td(self, tensordict, index):
        if index is None:
            return
        if _is_int(index):
            index = torch.as_tensor(index, device=tensordict.device)
        elif index.ndim == 2 and index.shape[:1] != tensordict.shape[:1]:
            for dim in range(2, tensordict.ndim + 1):
                if index.shape[:1].numel() == tensordict.shape[:dim].numel():
                    # a 2-d index in non-zero format: one row per element of the data
                    index = index.unflatten(0, tensordict.shape[:dim])
                    break
            else:
                raise RuntimeError(
                    f"could not find how to reshape index with shape {index.shape} to fit in tensordict with shape {tensordict.shape}"
                )
            tensordict.set("index", index)
            return
        tensordict.set("index", expand_as_right(index, tensordict))

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        if self._delayed_init and not self._initialized:
            self._init()
        if not isinstance(self._sampler, PRIORITIZED_SAMPLERS):
            return
        if type(data) is TensorDict and self._update_item_priorities(data):
            return
        if data.ndim:
            priority = self._get_priority_vector(data)
        else:
            priority = torch.as_tensor(self._get_priority_item(data))
        index = self._entry(data, "index")
        if self._storage.ndim > 1 and index.ndim == 2:
            index = index.unbind(-1)
        else:
            while index.shape != priority.shape:
                index = index[..., 0]
        return self.update_priority(index, priority)

    def _update_item_priorities(self, data: TensorDict) -> bool:
        """:meth:`update_tensordict_priority` for a batch of a 1-D storage holding one
        priority per item, with our prioritized sampler: its ``"index"`` and priority entries
        go to the sampler as they are (views, no reduction), which is what the general path
        hands it once it has reduced each item's single value to itself and copied the
        result (the sampler keeps no reference to them). ``False``, having done nothing, for
        anything else."""
        key = self.priority_key
        sampler = self._sampler
        cls = type(self)
        if (
            type(key) is not str
            or not isinstance(sampler, PrioritizedSampler)
            or self._storage.ndim != 1
            # overrides are called, as the general path calls them
            or cls.update_priority is not ReplayBuffer.update_priority
            or cls._get_priority_vector is not TensorDictReplayBuffer._get_priority_vector
        ):
            return False
        priority = data._tensordict.get(key)
        index = data._tensordict.get("index")
        if type(priority) is not torch.Tensor or type(index) is not torch.Tensor or index.ndim != 1:
            return False
        numel = index.shape[0]
        if (
            not priority.is_floating_point()
            or not 1 <= priority.ndim <= 2
            or priority.shape[0] != numel
            or priority.numel() != numel
            or data._batch_size[:1] != index.shape
        ):
            return False
        if priority.ndim == 2:
            priority = priority.reshape(numel)
        with self._replay_lock, self._write_lock:
            sampler.update_priority(index, priority, storage=self._storage)
        return True

    def _info_in_batch(self, info: dict, numel: int) -> dict | None:
        # transforms see the batch without the info, which is set after them
        if self._has_transforms():
            return None
        index = info.get("index")
        if type(index) is tuple:
            # one index per storage dimension: the batch holds them stacked, as _set_info
            # sets them; remembered so that _set_info knows the entry is in place
            stacked = _stacked(index)
            self._stacked_index = (index, stacked)
            info = dict(info)
            info["index"] = stacked
        return info

    def sample(
        self,
        batch_size: int | None = None,
        return_info: bool = False,
        include_info: bool | None = None,
    ) -> TensorDictBase:
        """Samples a batch of data from the replay buffer.

        Uses Sampler to sample indices, and retrieves them from Storage.

        Args:
            batch_size (int, optional): size of data to be collected. If none
                is provided, this method will sample a batch-size as indicated
                by the sampler.
            return_info (bool): whether to return info. If True, the result
                is a tuple (data, info). If False, the result is the data.
            include_info (bool, optional): deprecated: the info is always set in
                the sample.

        Returns:
            A tensordict containing a batch of data selected in the replay buffer.
            A tuple containing this tensordict and info if return_info flag is set to True.
        """
        if include_info is not None:
            warnings.warn(
                "include_info is going to be deprecated soon."
                "The default behavior has changed to `include_info=True` "
                "to avoid bugs linked to wrongly preassigned values in the "
                "output tensordict."
            )
        data, info = self._batch_and_info(batch_size)
        if return_info:
            # moved before it is set, so that the batch holds the very tensors returned
            info = self._info_on_storage_device(info)
        plain = type(data) is TensorDict
        is_tc = plain or is_tensor_collection(data)
        if is_tc and (plain or not is_tensorclass(data)) and include_info in (True, None):
            self._set_info(data, info)
        elif not is_tc and include_info in (True, None):
            raise RuntimeError("Cannot include info in non-tensordict data")
        if return_info:
            return data, info
        return data

    def _in_place(self, data, key, value) -> bool:
        """Whether ``data`` already holds what :meth:`_set_info` would set at ``key``: the
        very tensor (or the stacked index the gather put there)."""
        if type(data) is not TensorDict:
            return False
        if type(key) is str:
            entry = data._tensordict.get(key)
        elif type(key) is tuple and key and all(type(part) is str for part in key):
            node = data
            for part in key[:-1]:
                node = node._tensordict.get(part) if type(node) is TensorDict else None
            entry = node._tensordict.get(key[-1]) if type(node) is TensorDict else None
        else:
            return False
        if entry is value:
            return True
        memo = self.__dict__.get("_stacked_index")
        return key == "index" and memo is not None and memo[0] is value and entry is memo[1]

    def _set_info(self, data, info) -> None:
        """Sets each info entry in the sampled tensordict (entries already there are kept)."""
        pending = [key for key, value in info.items() if not self._in_place(data, key, value)]
        if not pending:
            return
        is_locked = data.is_locked
        if is_locked:
            data.unlock_()
        for key in pending:
            val = info[key]
            if key == "index" and isinstance(val, tuple):
                val = torch.stack(val, -1)
            try:
                val = _to_torch(val, data.device)
                if val.ndim < data.ndim:
                    val = expand_as_right(val, data)
                data.set(key, val)
            except RuntimeError:
                raise RuntimeError(
                    "Failed to set the metadata (e.g., indices or weights) in the sampled tensordict within TensorDictReplayBuffer.sample. "
                    "This is probably caused by a shape mismatch (one of the transforms has probably modified "
                    "the shape of the output tensordict). "
                    "You can always recover these items from the `sample` method from a regular ReplayBuffer "
                    "instance with the 'return_info' flag set to True."
                )
        if is_locked:
            data.lock_()

    def _apply_transform(self, data):
        with data.unlock_(), _set_dispatch_td_nn_modules(True):
            return self._transform(data)


class TensorDictPrioritizedReplayBuffer(
    TensorDictReplayBuffer, *torchrl_twin("replay_buffers", "TensorDictPrioritizedReplayBuffer")
):
    """TensorDict-specific wrapper around the :class:`~torchrl_compat.PrioritizedReplayBuffer` class.

    This class returns tensordicts with a new key ``"index"`` that represents
    the index of each element in the replay buffer, and ``"priority_weight"``, the
    importance weight of each element. It also provides the
    :meth:`~.update_tensordict_priority` method that only requires for the
    tensordict to be passed to it with its new priority value.

    Keyword Args:
        alpha (:obj:`float`): exponent α determines how much prioritization is used,
            with α = 0 corresponding to the uniform case.
        beta (:obj:`float`): importance sampling negative exponent.
        priority_key (str, optional): the key at which priority is assumed to
            be stored within TensorDicts added to this ReplayBuffer.
            Defaults to ``"td_error"``.
        eps (:obj:`float`): delta added to the priorities to ensure that the buffer
            does not contain null priorities.
        storage (Storage, Callable[[], Storage], optional): the storage to be used.
            If none is provided a default :class:`~torchrl_compat.ListStorage` with
            ``max_size`` of ``1_000`` will be created.
        collate_fn (callable, optional): merges a list of samples to form a
            mini-batch of Tensor(s)/outputs.
        pin_memory (bool): whether pin_memory() should be called on the rb
            samples.
        prefetch (int, optional): number of next batches to be prefetched
            using multithreading. Defaults to None (no prefetching).
        transform (Transform or Callable[[Any], Any], optional): Transform to be executed when
            :meth:`sample` is called.
        reduction (str, optional): the reduction method for multidimensional
            tensordicts (ie stored trajectories). Can be one of "max", "min",
            "median" or "mean".
        batch_size (int, optional): the batch size to be used when sample() is
            called.
        dim_extend (int, optional): indicates the dim to consider for
            extension when calling :meth:`~.extend`. Defaults to ``storage.ndim-1``.
        generator (torch.Generator, optional): a generator to use for sampling.
            Defaults to ``None`` (global default generator).
        shared (bool, optional): whether the buffer will be shared using multiprocessing or not.
            Defaults to ``False``.
        compilable (bool, optional): whether the writer is compilable.
            If ``True``, the writer cannot be shared between multiple processes.
            Defaults to ``False``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_compat import LazyTensorStorage, TensorDictPrioritizedReplayBuffer
        >>> rb = TensorDictPrioritizedReplayBuffer(
        ...     alpha=0.7, beta=1.1, storage=LazyTensorStorage(10), batch_size=5)
        >>> data = TensorDict({"a": torch.ones(10, 3), ("b", "c"): torch.zeros(10, 3, 1)}, [10])
        >>> _ = rb.extend(data)
        >>> sample = rb.sample()
        >>> sorted(sample.keys())
        ['a', 'b', 'index', 'priority_weight']
        >>> # give a high priority to these samples...
        >>> _ = sample.set("td_error", 100 * torch.ones(sample.shape))
        >>> rb.update_tensordict_priority(sample)
        >>> # ...which the next batch is mostly made of
        >>> bool(torch.isin(rb.sample()["index"], sample["index"]).any())
        True
    """

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        priority_key: str = "td_error",
        eps: float = 1e-8,
        storage: Any | None = None,
        collate_fn: Callable | None = None,
        pin_memory: bool = False,
        prefetch: int | None = None,
        transform: Any | None = None,  # noqa-F821
        reduction: str = "max",
        batch_size: int | None = None,
        dim_extend: int | None = None,
        generator: torch.Generator | None = None,
        shared: bool = False,
        compilable: bool = False,
    ) -> None:
        storage = self._maybe_make_storage(storage, compilable=compilable)
        sampler = PrioritizedSampler(storage.max_size, alpha, beta, eps, reduction=reduction)
        super().__init__(
            priority_key=priority_key,
            storage=storage,
            sampler=sampler,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            prefetch=prefetch,
            transform=transform,
            batch_size=batch_size,
            dim_extend=dim_extend,
            generator=generator,
            shared=shared,
            compilable=compilable,
        )


class InPlaceSampler(*torchrl_twin("replay_buffers", "InPlaceSampler")):
    """[Deprecated] A sampler to write tennsordicts in-place (removed, as in torchrl).

    Args:
        device (torch.device, optional): unused.
    """

    def __init__(self, device: Any | None = None):
        raise RuntimeError(
            "This class has been removed without replacement. In-place sampling should be avoided."
        )


def stack_tensors(list_of_tensor_iterators: list) -> tuple[torch.Tensor]:
    """Zips a list of iterables containing tensor-like objects and stacks the resulting lists of tensors together.

    Args:
        list_of_tensor_iterators (list): Sequence containing similar iterators,
            where each element of the nested iterator is a tensor whose
            shape match the tensor of other iterators that have the same index.

    Returns:
         Tuple of stacked tensors.

    Examples:
         >>> import torch
         >>> stacked = stack_tensors([[torch.ones(3), torch.zeros(1, 2)] for _ in range(4)])
         >>> [tuple(t.shape) for t in stacked]
         [(4, 3), (4, 1, 2)]
    """
    return tuple(torch.stack(tensors, 0) for tensors in zip(*list_of_tensor_iterators))


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
