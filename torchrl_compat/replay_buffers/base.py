""":class:`ReplayBuffer`, the composable replay buffer, and what the buffers share."""
from __future__ import annotations

import collections
import contextlib
import inspect
import os
import pickle
import textwrap
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial, wraps
from typing import Any

import numpy as np
import torch
from tensordict import is_tensor_collection, LazyStackedTensorDict, NestedKey, TensorDict, TensorDictBase, unravel_key
from tensordict.nn.utils import _set_dispatch_td_nn_modules
from tensordict.utils import expand_as_right, is_tensorclass
from torch.utils._pytree import tree_leaves, tree_map

from torchrl_compat import storages as _storages
from torchrl_compat.replay_buffers import _conditional_update as _conditional, _prefetch, _transforms
from torchrl_compat.replay_buffers._checkpoint import dump_buffer, load_buffer, PREFETCH_FILE
from torchrl_compat._releases import since
from torchrl_compat.replay_buffers._gather import gather_rows, plain_storage
from torchrl_compat.replay_buffers._processes import SharedWriteLock
from torchrl_compat.samplers.prioritized import PRIORITIZED_SAMPLERS
from torchrl_compat._torchrl_lookup import accepted_classes, torchrl_module, torchrl_twin
from torchrl_compat.samplers import (
    ConsumingSampler,
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    Sampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl_compat.storages import ListStorage
from torchrl_compat.utils import _is_int, _pin_memory, _to_numpy, INT_CLASSES
from torchrl_compat.writers import RoundRobinWriter, Writer

from torchrl_compat._compile import is_compiling, opaque_to_compile


_RL_WARNINGS = os.environ.get("RL_WARNINGS", "1").lower() in ("1", "y", "yes", "t", "true", "on")


_NO_LOCK = contextlib.nullcontext()


_COMPOSE_LEN = _transforms.Compose.__len__


_EMPTY_STORAGE_ERROR = "Cannot sample from an empty storage."


_PLAIN_RAND_GIVEN_NDIM = _storages.TensorStorage._rand_given_ndim

# The service backends other than "direct", by name: each builds the buffer that serves a
# buffer class (``build(cls, *args, **kwargs)``). torchrl_compat.ray_buffer registers "ray"
# when the package imports it, so that the buffers never import the Ray machinery that holds
# them.
SERVICE_BACKENDS: dict[str, Callable] = {}


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


# Where the followed release takes service_backend, torchrl 0.14's metaclass (inherited from
# the twin) routes it to _ServiceClass; without torchrl a __new__ of ours does. Never both: a
# __new__ in the class would stay in the type slots of torchrl's subclasses that install()
# moves onto our bases and back (HERReplayBuffer then fails to build on torchrl's classes).
_TWIN = torchrl_twin("replay_buffers", "ReplayBuffer")
_ROUTES_SERVICES = since("buffer_service_arguments") and not (
    _TWIN and type(_TWIN[0]).__call__ is not type.__call__
)


def _prefetch_executor() -> ThreadPoolExecutor:
    """The threads prefetched samples run in: one, so that they draw from the generator in the
    order they were queued (torchrl runs ``prefetch`` threads, and two samples queued back to back
    may draw in either order: a batch then differs from run to run, and a buffer restored from a
    checkpoint draws other batches than the one saved). Samples hold the replay lock throughout,
    so more threads would not run them side by side anyway."""
    return ThreadPoolExecutor(max_workers=1)


class ReplayBuffer(*_TWIN):
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

    .. note:: Reached from a function compiled with :func:`torch.compile`, :meth:`add`,
        :meth:`extend` and :meth:`sample` run eagerly, outside the graph (one graph
        break each, no tracing into the buffer): they cost what they cost eagerly plus
        dynamo's frame switch, and never recompile as the cursor and length change.
        torchrl traces into them (for a tensordict ``extend`` + ``sample``, 24 graphs
        over 135 frames compiled while warming up). ``fullgraph=True`` fails on both.

    .. note:: :meth:`set_storage` registers the new storage with the writer and
        attaches the buffer to it (torchrl keeps writing into the previous storage
        while sampling from the new one). :meth:`insert_transform` accepts a plain
        callable, as :meth:`append_transform` does (torchrl fails on its ``eval()``).
    """

    # TensorDictReplayBuffer's is True: the default collate function is chosen for it
    _holds_tensordicts = False

    if _ROUTES_SERVICES:

        def __new__(cls, *args, **kwargs):
            # service_backend="ray" builds a RayReplayBuffer serving this class.
            if kwargs.get("service_backend", "direct") != "direct":
                backend = kwargs.pop("service_backend")
                return cls._ServiceClass(backend, *args, **kwargs)
            return super().__new__(cls)

    @classmethod
    def _ServiceClass(cls, service_backend, *args, **kwargs):
        """The buffer ``service_backend`` asks for, serving this class: for ``"ray"``, a
        :class:`~torchrl_compat.RayReplayBuffer` whose shards hold buffers of this class (see
        :func:`torchrl_compat.ray_buffer.serve_buffer_class` for its options)."""
        build = SERVICE_BACKENDS.get(service_backend)
        if build is None:
            named = " or ".join(repr(name) for name in ("direct", *SERVICE_BACKENDS))
            raise ValueError(f"ReplayBuffer supports service_backend={named}, not {service_backend!r}.")
        return build(cls, *args, **kwargs)

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
        consume_after_n_samples: int | None = None,
        shared: bool = False,
        compilable: bool | None = None,
        delayed_init: bool | None = None,
        service_backend: str = "direct",
        service_backend_options: dict[str, Any] | None = None,
        transport: str = "auto",
        transport_options: dict[str, Any] | None = None,
        sample_unit: Any | None = None,
    ) -> None:
        if not since("buffer_service_arguments"):
            _refuse_newer_arguments(
                consume_after_n_samples=consume_after_n_samples, service_backend=service_backend,
                service_backend_options=service_backend_options, transport=transport,
                transport_options=transport_options, sample_unit=sample_unit,
            )
        _check_service_arguments(service_backend, transport, transport_options)
        consume_after_n_samples = _checked_consume_count(consume_after_n_samples)
        if sample_unit is not None and not _is_sample_unit(sample_unit):
            raise TypeError(
                f"sample_unit must be a SampleUnit instance, got {type(sample_unit).__name__}."
            )
        self._sample_unit = sample_unit
        self._service_shutdown = False
        self._init_consume_after_n_samples = consume_after_n_samples
        self._consume_after_n_samples = consume_after_n_samples
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

        _transforms.check_transform_arguments(transform, transform_factory)
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
        if consume_after_n_samples is not None and prefetch:
            raise ValueError("Prefetching is not supported when consume_after_n_samples is set.")
        if dim_extend is not None and dim_extend < 0:
            raise ValueError("dim_extend must be a positive value.")
        self._dim_extend = dim_extend
        if self._prefetch_cap:
            self._prefetch_executor = _prefetch_executor()
        if shared and prefetch:
            fix = " Pass prefetch=0 or shared=False." if since("multiprocess_errors_name_fix") else ""
            raise ValueError("Cannot share prefetched replay buffers." + fix)
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
            self._maybe_make_consuming_sampler()
            self._writer = self._maybe_make_writer(self._init_writer)
            self._writer.register_storage(self._storage)
            self._validate_consuming_writer()
            self._get_collate_fn(self._init_collate_fn)
            self._transform = self._maybe_make_transform(self._init_transform, self._init_transform_factory)
            if self.shared:
                self._share_replay_buffer_transform()
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
                "_init_generator", "_init_compilable", "_init_consume_after_n_samples",
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
        return _transforms.make_transform(transform, transform_factory)

    def share(self, shared: bool = True):
        self.shared = shared
        # taken by every write; in a forked child it first refuses writes that would stay there
        self._write_lock = SharedWriteLock(self) if shared else _NO_LOCK
        if shared and getattr(self, "_initialized", False):
            self._share_replay_buffer_transform()
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
            else _default_collate(self._storage, self._holds_tensordicts)
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
        self._validate_consuming_sampler()
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
        self._follow_consuming_sampler(prev_sampler)
        return prev_sampler

    def __len__(self) -> int:
        if self._delayed_init and not self._initialized:
            self._init()
        if self._is_consuming():
            with self._replay_lock:
                return self._sampler._num_sampleable(self._storage)
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
        if since("buffer_prefetch_state"):
            with self._capture_prefetch_state() as prefetch_state:
                return self._state_dict(prefetch_state)
        return self._state_dict(None)

    def _state_dict(self, prefetch_state) -> dict[str, Any]:
        state = {
            "_storage": self._storage.state_dict(),
            "_sampler": self._sampler.state_dict(),
            "_writer": self._writer.state_dict(),
            "_transforms": self._transform.state_dict(),
            "_batch_size": self._batch_size,
            "_rng": (self._rng.get_state().clone(), str(self._rng.device))
            if self._rng is not None
            else None,
        }
        if since("buffer_prefetch_state"):
            state["_consume_after_n_samples"] = self._consume_after_n_samples
            # torchrl's order: the generator state, then the prefetch state
            state["_rng"] = state.pop("_rng")
            state["_prefetch_state"] = prefetch_state
        return state

    @_maybe_delay_init
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not since("buffer_prefetch_state"):
            self._load_state_dict(state_dict)
            return
        prefetch_state = state_dict.get("_prefetch_state")
        self._validate_prefetch_state(prefetch_state)
        self.synchronize()
        with self._futures_lock:
            self._clear_prefetch_queue_locked()
            with self._replay_lock:
                self._load_state_dict(state_dict)
                self._consume_after_n_samples = state_dict.get("_consume_after_n_samples")
                self._restore_prefetch_queue_locked(prefetch_state)

    def _load_state_dict(self, state_dict: dict[str, Any]) -> None:
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
    @opaque_to_compile
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
            if self._is_consuming():
                # a consumed slot, if any, before the cursor's
                consumed = self._sampler._pop_consumed_indices(self._storage, 1)
                if consumed.numel():
                    index = self._write_at(int(consumed.item()), data)
                    self._sampler.add(index)
                    return index
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
        if self._is_consuming():
            index = self._extend_into_consumed(data)
            if index is not None:
                return index
        index = self._writer.extend(data)
        self._sampler.extend(index)
        return index

    @opaque_to_compile
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
            data = self._apply_inverse_transform(data)
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
            if getattr(self._writer, "tracks_generations", False):
                info["index_generation"] = self._writer.generations_of(index)
            data = self._storage.get(index)
            plan = None
        else:
            plan = self._read_plan()
            storage = self._storage
            with self._replay_lock, self._write_lock:
                if self._sample_unit is not None:
                    index, info, data = self._sample_expanded(storage, batch_size)
                    plan = None
                    if getattr(self._writer, "tracks_generations", False):
                        info["index_generation"] = self._writer.generations_of(index)
                else:
                    rows = None
                    if plan.uniform:
                        index, rows = self._uniform_index(storage, batch_size)
                        info = {"index": index}
                    else:
                        index, info = self._sampler.sample(storage, batch_size)
                        info["index"] = index
                    if getattr(self._writer, "tracks_generations", False):
                        info["index_generation"] = self._writer.generations_of(index)
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

    def _sample_expanded(self, storage, batch_size: int):
        """The sampler's anchors expanded by the sample unit: ``(index, info, data)``."""
        index, info = self._sampler.sample(storage, batch_size)
        index, info = self._sample_unit.expand(index, info, storage)
        info["index"] = index
        return index, info, storage.get(index)

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

    def _apply_inverse_transform(self, data):
        """``data`` as the transform chain writes it (its inverse), as :meth:`extend` does."""
        with _set_dispatch_td_nn_modules(is_tensor_collection(data)):
            return self._transform.inv(data)

    @opaque_to_compile
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
            self._wait_for_submitted_updates()
            return self._sample(batch_size)
        if since("buffer_prefetch_state"):
            return self._prefetched_sample(batch_size)
        with self._futures_lock:
            while (
                len(self._prefetch_queue)
                < min(self._sampler._remaining_batches, self._prefetch_cap)
                and not self._sampler.ran_out
            ) or not len(self._prefetch_queue):
                self._prefetch_queue.append(self._submit_sample(batch_size))
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
        self._share_new_transform(transform)
        self._transform.append(transform)
        return self

    def _share_new_transform(self, transform) -> None:
        """A transform added to a shared buffer shares its state (or is refused) as those the
        buffer had when it was shared (torchrl 0.14)."""
        if self.shared and since("buffer_shared_transforms"):
            self._share_transform_state(transform)

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
        self._share_new_transform(transform)
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
        if self._prefetch:
            # The prefetches in flight draw before the epoch starts over, so that the end of an
            # epoch one of them reaches is reset with it, whatever the thread's timing (torchrl's
            # threads have drawn by then on an idle machine; on a busy one the end could land
            # after the reset and stop the iteration at its first batch).
            with self._futures_lock:
                in_flight = tuple(self._prefetch_queue)
            if in_flight:
                wait(in_flight)
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
        if since("buffer_prefetch_state"):
            with self._capture_prefetch_state() as prefetch_state:
                state = self._pickled_state()
                state["_update_executor_placeholder"] = None
                state["_prefetch_state"] = prefetch_state
                return state
        return self._pickled_state()

    def _pickled_state(self) -> dict[str, Any]:
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
        prefetch_state = state.pop("_prefetch_state", None)
        state.pop("_update_executor_placeholder", None)
        state.setdefault("_sample_unit", None)
        state.setdefault("_consume_after_n_samples", None)
        state.setdefault("_service_shutdown", False)
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
            state["_prefetch_executor"] = _prefetch_executor()
        self.__dict__.update(state)
        if rng is not None:
            self.set_rng(rng)
        if prefetch_state is not None:
            with self._futures_lock:
                # the unpickled queue is this buffer's alone: no copy needed
                self._prefetch_queue.extend(_prefetch.completed_futures(prefetch_state["queue"], clone=False))

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

    # ------------------------------------------------------------------------------------
    # From torchrl 0.14: the direct service API, stats / can_sample / query, the prefetch
    # state, consumed items and shared transforms.
    _accepts_transport_backend = True
    _is_tensordict = False

    def start(self):
        """Return this already-started direct replay buffer."""
        if self._service_shutdown:
            raise RuntimeError("A shut down replay buffer cannot be restarted.")
        return self

    @property
    def is_alive(self) -> bool:
        """Whether this direct replay buffer remains available."""
        return not self._service_shutdown

    @property
    def service_backend(self) -> str:
        """The canonical deployment backend for this replay buffer."""
        return "direct"

    def client(self):
        """Return ``self`` for the zero-overhead direct backend."""
        return self

    def shutdown(self, timeout: float | None = None) -> None:
        """Wait for pending replay work and close this direct replay buffer.

        Pending prefetched samples are allowed to finish before the executor is closed;
        an exception raised while sampling ahead is raised here. Repeated calls are safe.
        """
        del timeout
        with self._futures_lock:
            if self._service_shutdown:
                return
            self._service_shutdown = True
        try:
            self.synchronize()
        finally:
            with self._futures_lock:
                executor = getattr(self, "_prefetch_executor", None)
                self._prefetch_executor = None
            if executor is not None:
                executor.shutdown(wait=True)

    def synchronize(self) -> None:
        """Wait for pending samples.

        Prefetched results remain queued and are returned by subsequent calls to
        :meth:`sample` in the same order. Background exceptions are propagated to the caller.
        """
        with self._futures_lock:
            self._synchronize_futures_locked()

    def _synchronize_futures_locked(self) -> None:
        futures = tuple(self._prefetch_queue)
        if futures:
            wait(futures)
        for future in futures:
            future.result()
        updates = self.__dict__.get("_update_queue")
        if updates is not None:
            updates.wait()  # the submitted updates too; the first error is raised

    def stats(self) -> dict[str, int | float | bool]:
        """Returns a cheap, serializable snapshot of the buffer's operational state.

        Scalars only (``size``, ``write_count``, ``prefetch_queue_size``, ``initialized``,
        and ``capacity`` / ``utilization`` when the storage has a ``max_size``); the buffer
        is neither changed nor initialized.

        Examples:
            >>> import torch
            >>> from torchrl_compat import LazyTensorStorage, ReplayBuffer
            >>> rb = ReplayBuffer(storage=LazyTensorStorage(10))
            >>> _ = rb.extend(torch.arange(5))
            >>> snapshot = rb.stats()
            >>> snapshot["size"], snapshot["write_count"], snapshot["capacity"]
            (5, 5, 10)
        """
        if not self.initialized:
            stats = {"size": 0, "write_count": 0, "prefetch_queue_size": 0, "initialized": False}
            storage = getattr(self, "_storage", None) or getattr(self, "_init_storage", None)
            capacity = getattr(storage, "max_size", None)
            if isinstance(capacity, int):
                stats["capacity"] = capacity
                stats["utilization"] = 0.0
            return stats
        with self._replay_lock:
            size = len(self)
            capacity = getattr(self._storage, "max_size", None)
            write_count = getattr(self._writer, "_write_count", 0)
            queued = len(self._prefetch_queue)
        stats = {
            "size": int(size),
            "write_count": int(write_count),
            "prefetch_queue_size": int(queued),
            "initialized": True,
        }
        if capacity is not None:
            stats["capacity"] = int(capacity)
            stats["utilization"] = float(size) / capacity if capacity else 0.0
        return stats

    @_maybe_delay_init
    def can_sample(self, batch_size: int | None = None) -> bool:
        """Returns whether the replay buffer can serve a sample batch.

        Args:
            batch_size (int, optional): requested batch size. Defaults to the
                batch size configured on the replay buffer.
        """
        if batch_size is None:
            batch_size = self._batch_size
        if batch_size is None:
            raise RuntimeError(
                "batch_size not specified. Configure it on the replay buffer "
                "or pass it to can_sample()."
            )
        with self._replay_lock, self._write_lock:
            return self._sampler.can_sample(self._storage, batch_size)

    @_maybe_delay_init
    def query(self, predicate: Callable | None = None, *, trajectory_key=None) -> list:
        """Filters the stored trajectories with a query predicate.

        The trajectories are those torchrl's ``query`` module finds in the stored
        (untransformed) content, followed through the wrap point; predicates and results
        see the transformed values, as sampled batches do.

        Args:
            predicate (Callable[[Trajectory], bool], optional): a ``TrajectoryPredicate``
                built from ``torchrl.data.traj``, or any callable mapping a trajectory to a
                boolean. Defaults to None (return all trajectories).

        Keyword Args:
            trajectory_key (NestedKey, optional): entry holding per-transition trajectory
                ids. Defaults to None (found as torchrl finds it).

        Returns:
            A list of matching trajectory views, oldest first.

        .. note:: The trajectory views and predicates are torchrl's (``torchrl.data.
            replay_buffers.query``): this method needs torchrl installed.
        """
        storage = self._storage
        if not len(storage):
            return []
        with self._replay_lock:
            source = storage[:]
        if isinstance(source, (list, tuple)):
            if not source:
                return []
            if not all(is_tensor_collection(item) for item in source):
                raise TypeError(
                    "ReplayBuffer.query requires a tensordict-backed storage, "
                    f"got items of type {type(source[0])}."
                )
            if any(item.batch_dims for item in source):
                raise TypeError(
                    "ReplayBuffer.query on a list-based storage expects "
                    "single-transition (scalar) items."
                )
            source = LazyStackedTensorDict.lazy_stack(list(source))
        elif not is_tensor_collection(source):
            raise TypeError(
                "ReplayBuffer.query requires a tensordict-backed storage, "
                f"got content of type {type(source)}."
            )
        query_module = torchrl_query_module()
        transforms = list(self._transform.transforms) if self._has_transforms() else []
        return query_module._query_source(
            source,
            transforms=transforms,
            predicate=predicate,
            trajectory_key=trajectory_key,
            at_capacity=bool(storage._is_full),
            cursor=getattr(storage, "_last_cursor_index", None),
        )

    # ---- prefetch state
    def _prefetched_sample(self, batch_size: int):
        """0.14's prefetching: the oldest batch sampled ahead (or one sampled now), then the
        queue filled up to ``prefetch`` batches again."""
        with self._futures_lock:
            if self._prefetch_queue:
                result = self._prefetch_queue.popleft().result()
            else:
                self._wait_for_submitted_updates()
                result = self._sample(batch_size)
            while (
                len(self._prefetch_queue) < min(self._sampler._remaining_batches, self._prefetch_cap)
                and not self._sampler.ran_out
            ):
                self._prefetch_queue.append(self._submit_sample(batch_size))
        return result

    @contextlib.contextmanager
    def _capture_prefetch_state(self, *, clone_queue: bool = True):
        """The prefetch state, with the buffer held still (futures settled, the replay lock
        taken) while the caller saves the other parts."""
        with self._held_still():
            results = tuple(future.result() for future in self._prefetch_queue) if self._prefetch else ()
            queue = tuple(_prefetch.clone_result(result) for result in results) if clone_queue else results
            yield {"version": _prefetch.PREFETCH_STATE_VERSION, "capacity": int(self._prefetch_cap), "queue": queue}

    def _clear_prefetch_queue_locked(self) -> None:
        futures = tuple(self._prefetch_queue)
        for future in futures:
            future.cancel()
        if futures:
            wait(futures)
        self._prefetch_queue.clear()

    # torchrl's names for the steps of saving and restoring the queue (the other parts of
    # torchrl call them on a buffer)
    def _clone_prefetch_result(self, result: tuple[Any, dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
        """A copy of one prefetched ``(batch, info)`` that shares no tensor with it."""
        return _prefetch.clone_result(result)

    def _validate_prefetch_state(self, prefetch_state: dict[str, Any] | None) -> None:
        """Refuses a saved prefetch state this buffer cannot take (version, capacity, size)."""
        _prefetch.check_prefetch_state(prefetch_state, self._prefetch_cap, self._prefetch)

    def _restore_prefetch_queue_locked(self, prefetch_state: dict[str, Any] | None, *, clone_queue: bool = True) -> None:
        """Queues the saved batches as completed futures (the futures lock held)."""
        self._validate_prefetch_state(prefetch_state)
        if prefetch_state is not None:
            self._prefetch_queue.extend(_prefetch.completed_futures(prefetch_state["queue"], clone=clone_queue))

    def _dump_prefetch_state(self, path, prefetch_state: dict[str, Any]) -> None:
        with open(path / PREFETCH_FILE, "wb") as file:
            pickle.dump(prefetch_state, file)

    def _load_prefetch_state(self, path) -> dict[str, Any] | None:
        prefetch_file = path / PREFETCH_FILE
        if not prefetch_file.exists():
            return None
        with open(prefetch_file, "rb") as file:
            return pickle.load(file)

    def _torchrl_checkpoint_detach_from_load_path(self):
        """Lets the storage stop reading from the checkpoint it was loaded from, when its
        checkpointer can."""
        detach = getattr(self._storage.checkpointer, "_detach_from_load_path", None)
        if detach is not None:
            detach(self._storage)

    # ---- what dumps / loads add to torchrl 0.11's layout (see _checkpoint)
    def _release_metadata(self) -> dict:
        if since("buffer_prefetch_state"):
            return {"consume_after_n_samples": self._consume_after_n_samples}
        return {}

    @contextlib.contextmanager
    def _held_still(self):
        """Holds the buffer still (the prefetches in flight and the submitted updates settled,
        the replay lock taken): while ``loads`` changes its parts, or its state is read."""
        with self._futures_lock:
            self._synchronize_futures_locked()
            with self._replay_lock:
                yield

    @contextlib.contextmanager
    def _held_for_dump(self):
        """Holds the buffer still (prefetches settled, the replay lock taken) while ``dumps``
        reads its parts, where the release saves the prefetched batches; yields what writes
        the release's own entries into a directory."""
        if not since("buffer_prefetch_state"):
            # the release saves no prefetched batches: its dumps holds nothing still
            yield lambda directory: None
            return
        with self._capture_prefetch_state(clone_queue=False) as prefetch_state:
            yield lambda directory: self._dump_prefetch_state(directory, prefetch_state)

    def _read_release_entries(self, path) -> dict | None:
        if not since("buffer_prefetch_state"):
            return None
        from torchrl_compat.checkpointers._checks import read_json_object

        prefetch_state = self._load_prefetch_state(path)
        self._validate_prefetch_state(prefetch_state)
        metadata = read_json_object(path / "buffer_metadata.json")
        return {"prefetch": prefetch_state, "consume": metadata.get("consume_after_n_samples")}

    def _apply_release_entries(self, entries: dict | None) -> None:
        if entries is None:
            return
        self._consume_after_n_samples = entries["consume"]
        with self._futures_lock:
            self._clear_prefetch_queue_locked()
            # the queue read from the checkpoint is this buffer's alone: no copy needed
            self._restore_prefetch_queue_locked(entries["prefetch"], clone_queue=False)

    # ---- consumed items (consume_after_n_samples, ConsumingSampler)
    def _maybe_make_consuming_sampler(self) -> None:
        """Puts a :class:`~torchrl_compat.ConsumingSampler` in place of the default sampler
        when ``consume_after_n_samples`` is given, and checks it against the components."""
        count = getattr(self, "_init_consume_after_n_samples", None)
        consuming = _consuming_sampler_classes()
        if count is None:
            if isinstance(self._sampler, consuming):
                self._consume_after_n_samples = self._sampler.max_sample_count
        elif isinstance(self._sampler, consuming):
            if self._sampler.max_sample_count != count:
                raise ValueError(
                    "consume_after_n_samples conflicts with the provided "
                    "ConsumingSampler.max_sample_count."
                )
        elif not isinstance(self._sampler, accepted_classes(RandomSampler, "samplers")):
            raise ValueError(
                "consume_after_n_samples only supports the default RandomSampler "
                "or an explicit ConsumingSampler. Prioritized, slice and "
                "without-replacement samplers are not supported."
            )
        else:
            self._sampler = ConsumingSampler(max_sample_count=count)
        self._validate_consuming_sampler()

    def _is_consuming(self) -> bool:
        consuming = _CONSUMING_SAMPLERS
        return bool(consuming) and isinstance(self._sampler, consuming)

    def _validate_consuming_sampler(self) -> None:
        if not self._is_consuming():
            return
        if self._prefetch:
            raise ValueError("Prefetching is not supported with ConsumingSampler.")
        if self._storage.ndim != 1:
            raise ValueError(
                "ConsumingSampler only supports 1-dimensional storages. "
                f"Got storage.ndim={self._storage.ndim}."
            )
        if not isinstance(self._storage, _ROW_STORAGES):
            raise TypeError(
                "ConsumingSampler only supports ListStorage, TensorStorage, "
                "LazyTensorStorage and LazyMemmapStorage."
            )

    def _validate_consuming_writer(self) -> None:
        if not self._is_consuming():
            return
        # a round-robin writer is written through without write_at (which ours lack before
        # torchrl 0.14), unless a subclass took it away
        write_at = getattr(self._writer, "write_at", _NO_WRITE_AT)
        taken_away = write_at is not _NO_WRITE_AT and not callable(write_at)
        if taken_away or not (_own_write_at(self._writer) or isinstance(self._writer, RoundRobinWriter)):
            raise TypeError(
                "ConsumingSampler requires a writer with a callable "
                "write_at(index, data) method."
            )

    def _follow_consuming_sampler(self, prev_sampler) -> None:
        """After :meth:`set_sampler`: ``consume_after_n_samples`` is the new sampler's count."""
        if self._is_consuming():
            self._consume_after_n_samples = self._sampler.max_sample_count
        elif isinstance(prev_sampler, _CONSUMING_SAMPLERS or ()):
            self._consume_after_n_samples = None
        self._validate_consuming_sampler()

    def _get_batch_size(self, data) -> int:
        if is_tensor_collection(data) or isinstance(data, (torch.Tensor, list)):
            return len(data)
        return len(tree_leaves(data)[0])

    def _extend_into_consumed(self, data):
        """Writes a batch into consumed slots first (oldest consumed first), the rest from the
        writer's cursor on, skipping those slots; ``None`` when no slot is consumed (the
        writer's ``extend`` then writes the whole batch)."""
        batch_size = self._get_batch_size(data)
        consumed = self._sampler._pop_consumed_indices(self._storage, batch_size)
        if not consumed.numel():
            return None
        index = consumed
        if consumed.numel() < batch_size:
            index = self._cat_write_indices(
                consumed, self._cursor_write_indices(data, batch_size - consumed.numel(), consumed)
            )
        index = self._write_at(index, data)
        self._sampler.extend(index)
        return index

    def _cat_write_indices(self, first, second):
        if _is_int(first):
            first = torch.as_tensor([first], dtype=torch.long)
        if _is_int(second):
            second = torch.as_tensor([second], dtype=torch.long)
        if isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor):
            return torch.cat([first.reshape(-1), second.to(first.device).reshape(-1)])
        raise RuntimeError(
            "Cannot concatenate write indices with different structures in "
            "a consuming replay buffer."
        )

    def _cursor_write_indices(self, data, batch_size: int, skip_index: torch.Tensor) -> torch.Tensor:
        """``batch_size`` rows from the writer's cursor on, past the rows of ``skip_index``
        (unless every row was scanned), moving the cursor past them."""
        device = data.device if hasattr(data, "device") else skip_index.device
        max_size = self._storage._max_size_along_dim0(batched_data=data)
        skip = set(skip_index.cpu().tolist())
        cursor = int(self._writer._cursor)
        rows = []
        scanned = 0
        while len(rows) < batch_size:
            if cursor not in skip or scanned >= max_size:
                rows.append(cursor)
            cursor = (cursor + 1) % max_size
            scanned += 1
        self._writer._cursor = cursor
        return torch.as_tensor(rows, dtype=torch.long, device=device)

    def _write_at(self, index, data):
        """The writer's ``write_at`` (rows written without moving the cursor); for a
        round-robin writer without one, the same write done here: the rows set, the write
        count and the storage length grown, ``"index"`` recorded by a tensordict writer,
        the writes reported to the sampler."""
        writer, storage = self._writer, self._storage
        if _own_write_at(writer):
            return writer.write_at(index, data)
        device = getattr(data, "device", None)
        index = torch.as_tensor(index, dtype=torch.long, device=device)
        writer._write_count += max(index.numel(), 1)
        if _records_index(writer) and not is_tensorclass(data):
            data.set("index", expand_as_right(index, data))
        storage.set(index if index.ndim else int(index), data, set_cursor=False)
        if index.numel() and hasattr(storage, "_len"):
            storage._len = min(max(len(storage), int(index.max().item()) + 1), storage.max_size)
        written = writer._replicate_index(index if index.ndim else int(index))
        writer._mark_update_entities(written)
        return written

    # ---- shared transforms
    def _share_replay_buffer_transform(self) -> None:
        if not since("buffer_shared_transforms"):
            return
        transform = getattr(self, "_transform", None)
        if transform is not None:
            self._share_transform_state(transform)

    @classmethod
    def _share_transform_state(cls, transform) -> None:
        """Puts the state of ``transform`` (each one of a ``Compose``) in shared memory, so that
        processes writing into a shared buffer update one state."""
        if isinstance(transform, _transforms.Compose) or type(transform).__name__ == "Compose":
            for part in transform:
                cls._share_transform_state(part)
            return
        share_memory = getattr(transform, "share_memory_", None)
        if callable(share_memory):
            share_memory()
            return
        if getattr(transform, "requires_shared_write_state", False):
            raise RuntimeError(
                f"{type(transform).__name__} keeps replay-buffer write state "
                "but does not implement share_memory_(). Use a centralized "
                "writer, a Ray-backed transform, or a transform that supports "
                "shared replay-buffer write state."
            )

    # ------------------------------------------- in-place and conditional writes
    # Writes that bypass the writer: in place into the stored items (torchrl 0.12), in
    # physical order (0.13), or only into the records still live (0.14).
    def _storage_view(self):
        # what ``storage[:]`` gives: the filled items, a view the in-place writes go through
        return self._storage[:]

    def _conditional_update_device(self) -> torch.device | None:
        """Returns the device conditional patches are written to, when known."""
        device = getattr(self._storage, "device", None)
        return device if isinstance(device, torch.device) else None

    def _stage_conditional_update(self, index, generation, patch, version):
        """Copies CUDA inputs of a submitted update to a CPU storage without blocking
        (see :func:`~torchrl_compat.replay_buffers._conditional_update.stage_on_host`)."""
        return _conditional.stage_on_host(self._conditional_update_device(), index, generation, patch, version)

    def _submit_sample(self, batch_size: int):
        """Submits a prefetched sample, to run after the updates submitted before it."""
        updates = self.__dict__.get("_update_queue")
        dependency = None if updates is None else updates.sample_dependency()
        if dependency is None:
            return self._prefetch_executor.submit(self._sample, batch_size)
        return self._prefetch_executor.submit(_conditional._run_after, (dependency,), partial(self._sample, batch_size))

    def _wait_for_submitted_updates(self) -> None:
        updates = self.__dict__.get("_update_queue")
        dependency = None if updates is None else updates.sample_dependency()
        if dependency is not None:
            dependency.result()

    if since("buffer_in_place_writes"):

        @_maybe_delay_init
        def set_at_(self, key, value, index):
            """Sets the value of a key at specified indices in the replay buffer.

            Args:
                key (NestedKey): the key to set.
                value (torch.Tensor): the value to write.
                index: the indices where to write the value.

            Returns:
                self

            """
            index = _to_numpy(index)
            with self._replay_lock:
                self._storage_view().set_at_(key, value, index)
                _conditional.storage_changed(self._storage)
            return self

        @_maybe_delay_init
        def set_(self, key, value):
            """Sets the value of a key across the entire replay buffer in-place.

            Args:
                key (NestedKey): the key to set.
                value (torch.Tensor): the value to write.

            Returns:
                self

            """
            with self._replay_lock:
                self._storage_view().set_(key, value)
                _conditional.storage_changed(self._storage)
            return self

        @_maybe_delay_init
        def update_(self, input_dict_or_td, clone=False, *, keys_to_update=None):
            """Updates the replay buffer in-place with the given dict or TensorDict.

            Args:
                input_dict_or_td (dict or TensorDictBase): the data to update with.
                clone (bool, optional): whether to clone the values before writing.
                    Defaults to ``False``.
                keys_to_update (sequence of NestedKey, optional): if provided, only
                    these keys will be updated.

            Returns:
                self

            """
            with self._replay_lock:
                self._storage_view().update_(input_dict_or_td, clone=clone, keys_to_update=keys_to_update)
                _conditional.storage_changed(self._storage)
            return self

    if since("buffer_write_all"):

        @_maybe_delay_init
        def read_all_in_order(self, end: int | None = None) -> Any:
            """Read storage contents in physical order.

            This is equivalent to ``rb[:]`` when ``end`` is ``None``.

            Args:
                end (int, optional): Number of leading storage entries to read.
                    Defaults to the entire storage slice.

            Returns:
                A storage slice containing entries ``[:end]``.
            """
            if end is None:
                return self[:]
            return self[:end]

        @_maybe_delay_init
        def write_all(self, data: Any, end: int | None = None) -> None:
            """Write data back to storage in physical order.

            This is equivalent to ``rb[:end] = data``. If ``end`` is ``None``, ``end``
            defaults to ``data.shape[0]`` for tensor collections and ``len(data)``
            otherwise. If ``data`` spans the full storage, this is equivalent to
            ``rb[:] = data``.

            Args:
                data: Data to write to storage.
                end (int, optional): Number of leading storage entries to update.
                    Defaults to ``data.shape[0]`` for tensor collections and
                    ``len(data)`` otherwise.
            """
            if end is None:
                max_size = getattr(self._storage, "max_size", None)
                if max_size is not None and len(self) == max_size:
                    self[:] = data
                    return
                end = data.shape[0] if is_tensor_collection(data) else len(data)
            self[:end] = data

    if since("buffer_conditional_update"):

        @_maybe_delay_init
        def submit_update_if_present(
            self,
            *,
            index: torch.Tensor,
            generation: torch.Tensor,
            patch: Mapping[NestedKey, torch.Tensor] | TensorDictBase,
            version_key: NestedKey | None = None,
            version: int | torch.Tensor | None = None,
            require_newer: bool = False,
        ) -> Future:
            """Submits an ordered conditional update on a background thread.

            The update runs after every sample already prefetched when this method is
            called; samples taken (or prefetched) afterwards wait for it, and updates run
            one at a time in submission order. An error raised by an update is raised by
            its future, and by the next sample or submission.

            Inputs are retained by reference until the returned future completes: do not
            mutate ``index``, ``generation``, ``patch`` or ``version`` in that interval
            (clone values backed by static CUDA-graph output buffers before submitting).
            CUDA inputs bound for a CPU storage are copied to the host on their current
            stream at submission, and the update waits only for those copies.

            Keyword arguments have the same meaning as in :meth:`update_if_present`.

            Returns:
                A :class:`concurrent.futures.Future` whose result is the
                :class:`~torchrl_compat.ConditionalUpdateResult` returned by
                :meth:`update_if_present`.

            Examples:
                >>> import torch
                >>> from tensordict import TensorDict
                >>> from torchrl_compat import LazyTensorStorage, TensorDictReplayBuffer, TensorDictRoundRobinWriter
                >>> rb = TensorDictReplayBuffer(
                ...     storage=LazyTensorStorage(4), writer=TensorDictRoundRobinWriter(track_generations=True)
                ... )
                >>> index = rb.extend(TensorDict({"value": torch.zeros(4)}, batch_size=[4]))
                >>> future = rb.submit_update_if_present(
                ...     index=index, generation=rb.writer.generations_of(index), patch={"value": torch.ones(4)}
                ... )
                >>> future.result().updated_count
                4
            """
            index, generation, patch, version, events = self._stage_conditional_update(
                index, generation, patch, version
            )
            operation = partial(
                self.update_if_present,
                index=index,
                generation=generation,
                patch=patch,
                version_key=version_key,
                version=version,
                require_newer=require_newer,
            )
            with self._futures_lock:
                if getattr(self, "_service_shutdown", False):
                    raise RuntimeError("A shut down replay buffer cannot accept updates.")
                updates = self.__dict__.get("_update_queue")
                if updates is None:
                    updates = self.__dict__["_update_queue"] = _conditional.UpdateQueue()
                return updates.submit(_conditional.after_events(events, operation), tuple(self._prefetch_queue))

        def update_if_present(
            self,
            *,
            index: torch.Tensor,
            generation: torch.Tensor,
            patch: Mapping[NestedKey, torch.Tensor] | TensorDictBase,
            version_key: NestedKey | None = None,
            version: int | torch.Tensor | None = None,
            require_newer: bool = False,
        ) -> _conditional.ConditionalUpdateResult:
            """Conditionally updates stored records that are still live.

            Round-robin writers recycle slots, so an index captured at sampling time can
            name another record by the time an asynchronous computation writes back. This
            method applies ``patch`` only to the records whose ``(index, generation)``
            pair still matches the writer's slot generation, skipping (never modifying)
            those whose slot was reused or emptied since.

            The whole patch is checked (keys, shapes, dtypes) before anything is written:
            a failed check leaves the storage untouched. Updating a record refreshes its
            content, not its identity: the same handle keeps working until the slot is
            rewritten by ``add``, ``extend``, ``write_at`` or ``empty``. The buffer's
            writer must track slot generations (``RoundRobinWriter(track_generations=True)``)
            and its storage must hold tensordicts (a :class:`~torchrl_compat.TensorStorage`).

            Keyword Args:
                index (torch.Tensor): storage indices, as returned by :meth:`extend` or
                    found in the sample under ``"index"``.
                generation (torch.Tensor): slot generations captured with the indices, as
                    found in the sample under ``"index_generation"``.
                patch (mapping of NestedKey to torch.Tensor, or TensorDictBase): the
                    fields to overwrite for live records; the leading dimension matches
                    the number of records addressed by ``index``.
                version_key (NestedKey, optional): a stored per-record scalar field
                    holding each record's version. With ``version``, a live record is
                    patched only if the incoming version compares favourably with the
                    stored one, and the accepted version is written to ``version_key``
                    with the patch. It may not appear in ``patch``; nested keys are
                    tuples (dotted strings are refused). Defaults to ``None``.
                version (int or torch.Tensor, optional): the incoming version, a scalar
                    or one entry per record; passed together with ``version_key``.
                require_newer (bool, optional): if ``True``, a record is patched only
                    when ``version > stored``; else ties are accepted. Of several rows
                    naming one record, only the one carrying the highest incoming version
                    (the last such row on ties) is applied, the others are reported in
                    ``version_rejected``. Defaults to ``False``.

            Returns:
                A :class:`~torchrl_compat.ConditionalUpdateResult` whose ``updated`` mask
                follows the input order; with ``version_key``, its ``version_rejected``
                mask marks the live records the version comparison rejected.

            Raises:
                RuntimeError: the storage does not support conditional updates (a
                    :class:`~torchrl_compat.ListStorage`) or the writer does not track
                    slot generations.
                KeyError: a patch key (or ``version_key``) is not in the storage.
                ValueError: a patch entry has the wrong shape or dtype; only one of
                    ``version_key`` / ``version`` is given; ``version_key`` is in
                    ``patch``, names a non-scalar field or is a dotted string.

            Examples:
                >>> import torch
                >>> from tensordict import TensorDict
                >>> from torchrl_compat import LazyTensorStorage, TensorDictReplayBuffer, TensorDictRoundRobinWriter
                >>> rb = TensorDictReplayBuffer(
                ...     storage=LazyTensorStorage(10),
                ...     writer=TensorDictRoundRobinWriter(track_generations=True),
                ...     batch_size=4,
                ... )
                >>> _ = rb.extend(TensorDict({"obs": torch.zeros(10, 3)}, batch_size=[10]))
                >>> sample = rb.sample()
                >>> result = rb.update_if_present(
                ...     index=sample["index"], generation=sample["index_generation"], patch={"obs": torch.ones(4, 3)}
                ... )
                >>> print(result.updated_count, result.stale_count)
                4 0
            """
            return _conditional.update_if_present(
                self, index, generation, patch, version_key, version, require_newer
            )


_SERVICE_ARGUMENTS = (
    "consume_after_n_samples", "service_backend", "service_backend_options",
    "transport", "transport_options", "sample_unit",
)


def _release_signature(init):
    """``init``'s signature as the followed release has it: before 0.14, without the service
    arguments, sample units and consumed items; from 0.14, in torchrl's order."""
    signature = inspect.signature(init)
    params = signature.parameters
    if not since("buffer_service_arguments"):
        kept = [p for name, p in params.items() if name not in _SERVICE_ARGUMENTS]
        return signature.replace(parameters=kept)
    names = list(params)
    names.remove("sample_unit")
    names.insert(names.index("sampler") + 1, "sample_unit")
    return signature.replace(parameters=[params[name] for name in names])


_NEWER_DEFAULTS = {
    "consume_after_n_samples": None, "service_backend": "direct", "service_backend_options": None,
    "transport": "auto", "transport_options": None, "sample_unit": None,
}


def _refuse_newer_arguments(**values) -> None:
    """Before 0.14 the constructor has none of these arguments: refuse them as Python would."""
    for name, value in values.items():
        if value is not _NEWER_DEFAULTS[name] and value != _NEWER_DEFAULTS[name]:
            raise TypeError(f"ReplayBuffer.__init__() got an unexpected keyword argument '{name}'")


def _check_service_arguments(service_backend, transport, transport_options) -> None:
    if service_backend == "direct" and transport not in ("auto", "direct"):
        raise ValueError("A direct ReplayBuffer only supports transport='auto' or 'direct'.")
    if service_backend == "direct" and transport_options:
        raise ValueError("transport_options are only valid for a remote ReplayBuffer.")
    if service_backend not in ("direct", "ray"):
        raise ValueError(
            f"ReplayBuffer supports service_backend='direct' or 'ray', not {service_backend!r}."
        )
    if service_backend == "ray":
        raise ValueError(
            "service_backend='ray' builds a Ray replay buffer: it is not available here "
            "(torchrl_compat's direct buffers only)."
        )


def _consuming_sampler_classes() -> tuple:
    """Ours, and torchrl's ``ConsumingSampler`` where it has one."""
    return accepted_classes(ConsumingSampler, "samplers")


_CONSUMING_SAMPLERS = _consuming_sampler_classes()

# the storages a consuming buffer writes rows of (ours and torchrl's)
_ROW_STORAGES = (*accepted_classes(ListStorage, "storages"), *accepted_classes(_storages.TensorStorage, "storages"))


_NO_WRITE_AT = object()


def _own_write_at(writer) -> bool:
    """Whether ``writer`` has a ``write_at`` of its own library: torchrl's, inherited by one of
    our writers from its torchrl twin, would run torchrl's code on our writer."""
    method = getattr(type(writer), "write_at", None)
    if not callable(method):
        return False
    return not (isinstance(writer, Writer) and getattr(method, "__module__", "").startswith("torchrl."))


def _records_index(writer) -> bool:
    """Whether ``writer`` writes each item's row under its ``"index"`` key."""
    return any(cls.__name__ == "TensorDictRoundRobinWriter" for cls in type(writer).__mro__)


def _checked_consume_count(count):
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, INT_CLASSES):
        raise TypeError("consume_after_n_samples must be a positive integer.")
    if count < 1:
        raise ValueError("consume_after_n_samples must be a positive integer.")
    return int(count)


def _is_sample_unit(value) -> bool:
    """Whether ``value`` is a sample unit: ours, torchrl's (``SampleUnit``), or, without
    torchrl's, an object that quacks like one."""
    from torchrl_compat.sample_units import SampleUnit

    if isinstance(value, SampleUnit):
        return True
    units = torchrl_sample_units()
    if units is not None:
        return isinstance(value, units.SampleUnit)
    return callable(getattr(value, "expand", None))


def torchrl_sample_units():
    try:
        from torchrl.data.replay_buffers import sample_units
    except ImportError:
        return None
    return sample_units


def torchrl_query_module():
    try:
        from torchrl.data.replay_buffers import query
    except ImportError as err:
        raise ImportError(
            "ReplayBuffer.query builds torchrl's trajectory views: it needs torchrl >= 0.14 installed."
        ) from err
    return query


ReplayBuffer.__init__.__signature__ = _release_signature(ReplayBuffer.__init__)
if _ROUTES_SERVICES:
    # inspect reads a class's signature from its own __new__ before its __init__: the hook
    # above takes the constructor's arguments.
    vars(ReplayBuffer)["__new__"].__func__.__signature__ = ReplayBuffer.__init__.__signature__

# Before 0.14 the buffers have none of these public members.
if not since("buffer_stats_query"):
    for _name in ("stats", "can_sample", "query"):
        delattr(ReplayBuffer, _name)
if not since("buffer_service_arguments"):
    for _name in ("start", "is_alive", "service_backend", "client", "shutdown", "synchronize"):
        delattr(ReplayBuffer, _name)
