"""Samplers for composable replay buffers: a drop-in for ``torchrl.data.replay_buffers.samplers``.

The classes have torchrl 0.11's names, signatures, defaults, properties, info dictionaries,
``state_dict`` / ``dumps`` / ``loads`` formats and error messages, and work with any
storage that follows torchrl's storage API (duck typing, as torchrl's samplers do).

On CPU the index computations run in ``replay``'s kernels; on an accelerator they run as
torch ops on the storage's device (:mod:`._torch_slices`). :class:`PrioritizedSampler` keeps
its priorities in segment trees chosen by device (:mod:`._sampler_trees`): ``replay``'s
compiled trees on CPU, trees made of torch ops on accelerators.
"""
from __future__ import annotations

import json
import textwrap
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict
from copy import copy, deepcopy
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey

import replay

from . import _torch_slices
from ._checkpoint_checks import (
    MetadataError,
    read_float64_leaves,
    read_json_object,
    read_memmapped_state,
    real_number,
)
from ._checkpoint_publish import write_aside
from ._ensemble import INDEX_ERROR, members_rng, pick, select_members
from ._sampler_priorities import (
    check_sampleable,
    check_update,
    draw_with_kernel,
    draw_with_torch,
    EpsOperand,
    generator_kept_on_failure,
    kernel_seed,
    largest_leaf,
    MaxPriorityRecord,
    ravel_rows,
    stored_values,
)
from ._sampler_storage import flag_columns, gather_fields, ravel, snapshot, storage_device
from ._sampler_trees import (
    is_replay_tree,
    make_trees,
    moved_trees,
    read_leaves,
    tree_device,
    tree_dtype,
    trees_fit,
    write_leaves,
)
from ._storage_counters import compile_disable as _compile_disable
from ._torchrl_lookup import accepted_classes, torchrl_twin, with_torchrl_namesakes
from ._trajectory_ends import TrajectoryEnds
from .storages import Storage, StorageEnsemble, TensorStorage, logger
from .utils import _auto_device, _is_int, unravel_index

__all__ = [
    "PrioritizedSampler",
    "PrioritizedSliceSampler",
    "RandomSampler",
    "Sampler",
    "SamplerEnsemble",
    "SamplerWithoutReplacement",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
]

_EMPTY_STORAGE_ERROR = "Cannot sample from an empty storage."
_CPU = torch.device("cpu")

# The samplers take any storage that follows torchrl's storage API (duck typing, as torchrl's
# samplers do); where they branch on a storage class, torchrl's own counts as ours.
_TENSOR_STORAGES = accepted_classes(TensorStorage, "storages")
_STORAGE_ENSEMBLES = accepted_classes(StorageEnsemble, "storages")
# The ``TensorStorage._rand_given_ndim`` of ours and torchrl's (when importable): for a 1-D
# storage, ``torch.randint(len(storage))`` behind dynamo-disabled wrappers.
_PLAIN_RAND_GIVEN_NDIM = frozenset(cls._rand_given_ndim for cls in with_torchrl_namesakes(TensorStorage))

# torchrl's module-level names of its segment trees: here ``replay``'s, which load on any torch.
SumSegmentTreeFp32, MinSegmentTreeFp32 = replay.SumSegmentTreeFp32, replay.MinSegmentTreeFp32
SumSegmentTreeFp64, MinSegmentTreeFp64 = replay.SumSegmentTreeFp64, replay.MinSegmentTreeFp64

try:
    from torch.compiler import is_compiling as _is_compiling
except ImportError:  # pragma: no cover - torch < 2.3
    from torch._dynamo import is_compiling as _is_compiling


def _replace_last(key, new_ending):
    """``key`` with its last element replaced (a string key is replaced whole)."""
    if isinstance(key, str):
        return new_ending
    return key[:-1] + (new_ending,)


def _on_cpu(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"


# ---------------------------------------------------------------------------- random draws
# Draws are made on the generator's own device (a CPU generator cannot fill a CUDA tensor)
# and moved afterwards, so a seeded buffer repeats its samples whatever the storage device.


def _gen_device(generator, device):
    return generator.device if generator is not None else device


def _rand(num: int, device, generator) -> torch.Tensor:
    if generator is None or device is None or generator.device == device:
        return torch.rand(num, generator=generator, device=_gen_device(generator, device))
    return torch.rand(num, generator=generator, device=generator.device).to(device)


def _randint(high: int, num: int, device, generator) -> torch.Tensor:
    if generator is None or device is None or generator.device == device:
        return torch.randint(high, (num,), generator=generator, device=_gen_device(generator, device))
    return torch.randint(high, (num,), generator=generator, device=generator.device).to(device)


def _as_long(index: torch.Tensor) -> torch.Tensor:
    return index if index.dtype is torch.long else index.to(torch.long)


def _randperm(num: int, device, generator) -> torch.Tensor:
    out = torch.randperm(num, generator=generator, device=_gen_device(generator, device))
    return out.to(device) if device is not None else out




@_compile_disable()
def _random_sample_outside_graph(storage, batch_size: int):
    """``RandomSampler.sample``'s draw, run by torch.compile as one eager frame."""
    if len(storage) == 0:
        raise RuntimeError(_EMPTY_STORAGE_ERROR)
    return storage._rand_given_ndim(batch_size)


class Sampler(*(torchrl_twin("samplers", "Sampler") or (ABC,))):
    """A generic sampler base class for composable Replay Buffers."""

    # Some samplers - mainly those without replacement -
    # need to keep track of the number of remaining batches
    _remaining_batches = int(torch.iinfo(torch.int64).max)

    # The RNG is set by the replay buffer
    _rng: torch.Generator | None = None

    # Private switch: ``False`` sends CPU samplers through the torch-op paths (those used on
    # accelerators) so that tests can compare them with the ``replay`` kernels.
    _use_cpu_kernels = True

    @abstractmethod
    def sample(self, storage: Storage, batch_size: int) -> tuple[Any, dict]:
        ...

    def add(self, index: int) -> None:
        return

    def extend(self, index: torch.Tensor) -> None:
        return

    def update_priority(
        self,
        index: int | torch.Tensor,
        priority: float | torch.Tensor,
        *,
        storage: Storage | None = None,
    ) -> dict | None:
        warnings.warn(
            f"Calling update_priority() on a sampler {type(self).__name__} that is not prioritized. Make sure this is the indented behavior."
        )
        return

    def mark_update(
        self, index: int | torch.Tensor, *, storage: Storage | None = None
    ) -> None:
        return

    @property
    def default_priority(self) -> float:
        return 1.0

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        ...

    @abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ...

    @property
    def ran_out(self) -> bool:
        # by default, samplers never run out
        return False

    @abstractmethod
    def _empty(self):
        ...

    @abstractmethod
    def dumps(self, path):
        ...

    @abstractmethod
    def loads(self, path):
        ...

    # ``loads`` in two steps, so that a sampler ensemble checks every member's checkpoint
    # before any member changes. Samplers with state on disk read and check it in
    # ``_read_checkpoint`` (changing nothing) and take it in ``_apply_checkpoint``.
    def _read_checkpoint(self, path):
        return path

    def _apply_checkpoint(self, state) -> None:
        self.loads(state)

    def __repr__(self):
        return f"{self.__class__.__name__}()"

    def __getstate__(self):
        # A generator cannot be pickled; the buffer sets it again after loading.
        state = copy(self.__dict__)
        state["_rng"] = None
        # Per-call caches, rebuilt on first use (they may hold a storage's tensors).
        for name in ("_shortest", "_trajectory_ends", "_preceding_of", "_info_keys_of", "_max_priority_record"):
            state.pop(name, None)
        return state


class RandomSampler(Sampler, *torchrl_twin("samplers", "RandomSampler")):
    """A uniformly random sampler for composable replay buffers.

    Indices are drawn by the storage (``storage._rand_given_ndim``), uniformly over its
    filled part, on the storage's device, with the buffer's generator when one is set.

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers import LazyTensorStorage
        >>> storage = LazyTensorStorage(10)
        >>> storage.set(torch.arange(5), torch.arange(5))
        >>> index, info = RandomSampler().sample(storage, 4)
        >>> bool(((index >= 0) & (index < 5)).all()), info
        (True, {})
    """

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        if _is_compiling():
            # one frame outside the graph: traced, the length check and the draw guard on
            # the length and recompile at every write
            return _random_sample_outside_graph(storage, batch_size), {}
        length = len(storage)
        if length == 0:
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        if type(storage)._rand_given_ndim in _PLAIN_RAND_GIVEN_NDIM and storage.ndim == 1:
            # the storage would draw exactly this, behind a dynamo-disabled wrapper (about
            # half a microsecond; it only matters under torch.compile)
            index = torch.randint(
                0, length, (batch_size,), generator=storage._rng, device=getattr(storage, "device", None)
            )
        else:
            index = storage._rand_given_ndim(batch_size)
        return index, {}

    def _empty(self):
        pass

    def dumps(self, path):
        # Nothing to save: the sampler has no state.
        ...

    def loads(self, path):
        ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return


class SamplerWithoutReplacement(Sampler, *torchrl_twin("samplers", "SamplerWithoutReplacement")):
    """A data-consuming sampler that ensures that the same sample is not present in consecutive batches.

    Each epoch visits a fresh permutation of the storage's indices (or the indices in
    order when ``shuffle=False``), drawn on the storage's device.

    .. note:: torchrl draws a full ``torch.randperm`` (O(storage)) before the first batch of
        every epoch. On CPU the first batch here is drawn lazily by
        ``replay.PermutationEpoch`` in O(batch); the second call shuffles the rest of the
        epoch at once with a cache-friendly bucketed shuffle (about half a
        ``torch.randperm``), and later batches are slices of it, as torchrl's are. The seed
        comes from the buffer's generator or from torch's global RNG, so seeded runs repeat,
        though with other permutations than torchrl's. The ``_sample_list`` tensor of
        torchrl's ``state_dict`` / ``dumps`` is materialised (O(remaining)) only when read.

    .. note:: :meth:`dumps` writes torchrl's files aside and publishes them in one rename (an
        interrupted call leaves the previous checkpoint whole); :meth:`loads` reads them
        read-only and checks them before the sampler changes (torchrl's
        ``TensorDict.load_memmap`` extends a truncated file and skips a missing one). The
        loaded values are plain ints, bools and a tensor, not memory-mapped tensors. An
        empty ``_sample_list`` (saved without a file) loads back empty, where torchrl's
        :meth:`loads` raises a ``KeyError``.

    Args:
        drop_last (bool, optional): if ``True``, the last incomplete sample (if any) will be dropped.
            If ``False``, this last sample will be kept and (unlike with torch dataloaders)
            completed with other samples from a fresh indices permutation.
            Defaults to ``False``.
        shuffle (bool, optional): if ``False``, the items are not randomly
            permuted. This enables to iterate over the replay buffer in the
            order the data was collected. Defaults to ``True``.

    *Caution*: If the size of the storage changes in between two calls, the samples will be re-shuffled
    (as we can't generally keep track of which samples have been sampled before and which haven't).

    Similarly, it is expected that the storage content remains the same in between two calls,
    but this is not enforced.

    When the sampler reaches the end of the list of available indices, a new sample order
    will be generated and the resulting indices will be completed with this new draw, which
    can lead to duplicated indices, unless the :obj:`drop_last` argument is set to ``True``.

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers import LazyTensorStorage
        >>> storage = LazyTensorStorage(6)
        >>> storage.set(torch.arange(6), torch.arange(6))
        >>> sampler = SamplerWithoutReplacement(drop_last=True)
        >>> first, _ = sampler.sample(storage, 3)
        >>> second, _ = sampler.sample(storage, 3)
        >>> sorted(torch.cat([first, second]).tolist()), sampler.ran_out
        ([0, 1, 2, 3, 4, 5], True)
    """

    def __init__(self, drop_last: bool = False, shuffle: bool = True):
        self._sample_list = None
        self.len_storage = 0
        self.drop_last = drop_last
        self._ran_out = False
        self.shuffle = shuffle

    def dumps(self, path):
        write_aside(path, self._write_checkpoint)

    def _write_checkpoint(self, directory: Path) -> None:
        TensorDict(self.state_dict()).memmap(directory)

    def loads(self, path):
        self._apply_checkpoint(self._read_checkpoint(path))

    def _read_checkpoint(self, path) -> dict:
        """The state dict saved at ``path`` by :meth:`dumps` (or torchrl's), read and checked
        without changing anything."""
        path = Path(path)
        state = read_memmapped_state(path, ("len_storage", "_sample_list", "drop_last", "_ran_out"))
        meta = path / "meta.json"

        def scalar(key, kinds):
            value = state[key]
            if value is None or value.ndim != 0 or value.dtype not in kinds:
                raise MetadataError(f"{meta}: {key} must be a 0-d tensor of {kinds}, got {value!r}")
            return value.item()

        integers = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
        len_storage = scalar("len_storage", integers)
        if len_storage < 0:
            raise MetadataError(f"{meta}: len_storage must be non-negative, got {len_storage}")
        sample_list = state["_sample_list"]
        if sample_list is not None:
            if sample_list.ndim != 1 or sample_list.dtype not in integers:
                raise MetadataError(
                    f"{path / '_sample_list.memmap'}: expected a 1-d integer tensor, got "
                    f"shape {tuple(sample_list.shape)} and dtype {sample_list.dtype}"
                )
            outside = (sample_list < 0) | (sample_list >= len_storage)
            if bool(outside.any()):
                pos = int(outside.nonzero()[0, 0])
                raise MetadataError(
                    f"{path / '_sample_list.memmap'}: index {int(sample_list[pos])} at position "
                    f"{pos} is out of range for len_storage={len_storage}"
                )
            sample_list = sample_list.to(torch.long)
        return OrderedDict(
            len_storage=len_storage,
            _sample_list=sample_list,
            drop_last=scalar("drop_last", (torch.bool,)),
            _ran_out=scalar("_ran_out", (torch.bool,)),
        )

    def _apply_checkpoint(self, state: dict) -> None:
        self.load_state_dict(state)

    # ``_sample_list`` (torchrl's state) is a property: on CPU the first batch of an epoch is
    # drawn by ``replay.PermutationEpoch`` (O(batch)) and the rest of the permutation is only
    # materialised as a tensor at the second batch or when it is read, e.g. by
    # ``state_dict`` / ``dumps``; sampling then continues from that tensor.
    # Batches handed out from the stored permutation advance ``_sample_pos`` instead of
    # slicing off the remainder at every batch; the remainder is cut when read.
    @property
    def _sample_list(self):
        self._materialize_epoch()
        d = self.__dict__
        value = d.get("_sample_list_value")
        position = d.get("_sample_pos", 0)
        if position and value is not None:
            value = d["_sample_list_value"] = value[position:]
            d["_sample_pos"] = 0
        return value

    def _materialize_epoch(self) -> None:
        """Stores the rest of a lazy epoch as a tensor, as sampling goes on: once the lazy
        first batch is out, the rest is shuffled at once (so reading the state leaves the
        samples as they were). An epoch read before its first batch (at an epoch boundary)
        draws that batch lazily with the batch size of the call that opened the epoch, then
        shuffles the rest: the same samples as unread while the batch size stays the same."""
        d = self.__dict__
        epoch = d.get("_epoch")
        if epoch is None:
            return
        if epoch.remaining < epoch.n:
            rest = epoch.shuffle_rest()
        else:
            first = d.get("_epoch_batch_size", 0)
            if 0 < first < epoch.n:
                rest = torch.cat([epoch.next_batch(first), epoch.shuffle_rest()])
            else:
                rest = epoch.next_batch(epoch.n)
        d["_sample_list_value"] = rest
        d["_epoch"] = None
        d["_sample_pos"] = 0

    @_sample_list.setter
    def _sample_list(self, value):
        self.__dict__["_epoch"] = None
        self.__dict__["_sample_list_value"] = value
        self.__dict__["_sample_pos"] = 0

    def _has_sample_list(self) -> bool:
        return (
            self.__dict__.get("_epoch") is not None
            or self.__dict__.get("_sample_list_value") is not None
        )

    def _remaining_in_epoch(self) -> int:
        epoch = self.__dict__.get("_epoch")
        if epoch is not None:
            return epoch.remaining
        return self.__dict__["_sample_list_value"].numel() - self.__dict__.get("_sample_pos", 0)

    def _get_sample_list(self, storage: Storage, len_storage: int, batch_size: int):
        if storage is None:
            if self.__dict__.get("_epoch") is not None:
                device = torch.device("cpu")
            else:
                device = self.__dict__["_sample_list_value"].device
        else:
            device = storage_device(storage)
        if (
            self.shuffle
            and self._use_cpu_kernels
            and (device is None or device.type == "cpu")
            and (self._rng is None or self._rng.device.type == "cpu")
        ):
            # Seeded from the buffer's generator (or torch's global RNG): seeded runs repeat,
            # with other permutations than torch.randperm's.
            epoch = replay.PermutationEpoch(len_storage, generator=self._rng)
            self._sample_list = None
            self.__dict__["_epoch"] = epoch
            self.__dict__["_epoch_batch_size"] = batch_size
        elif self.shuffle:
            self._sample_list = _randperm(len_storage, device, self._rng)
        else:
            self._sample_list = torch.arange(len_storage, device=device)
        self._remaining_batches = self._count_batches(self._remaining_in_epoch(), batch_size)

    def _count_batches(self, remaining: int, batch_size: int) -> int:
        if self.drop_last:
            return remaining // batch_size
        return -(remaining // -batch_size)

    def _single_sample(self, len_storage, batch_size):
        epoch = self.__dict__.get("_epoch")
        if epoch is not None and epoch.remaining < epoch.n:
            # The first batch came from the lazy shuffle (O(batch)); the rest of the epoch is
            # now shuffled at once, cache-friendly (about half a torch.randperm), and later
            # batches are slices of it, as torchrl's are.
            self._materialize_epoch()
            epoch = None
        if epoch is not None:
            index = epoch.next_batch(batch_size)
            remaining = epoch.remaining
        else:
            d = self.__dict__
            sample_list = d["_sample_list_value"]
            position = d.get("_sample_pos", 0)
            end = min(position + batch_size, sample_list.shape[0])
            index = sample_list[position:end]
            d["_sample_pos"] = end
            remaining = sample_list.shape[0] - end
        self._remaining_batches = self._count_batches(remaining, batch_size)
        # Whether one more batch of the same size can be drawn from this epoch: the
        # buffer reads ``ran_out`` to stop its iterator.
        if remaining == 0 or (self.drop_last and remaining < batch_size):
            self.ran_out = True
            self._get_sample_list(
                storage=None, len_storage=len_storage, batch_size=batch_size
            )
        else:
            self.ran_out = False
        return index

    def _storage_len(self, storage):
        return len(storage)

    def sample(self, storage: Storage, batch_size: int) -> tuple[Any, dict]:  # noqa: F811
        len_storage = self._storage_len(storage)
        # Steady state (a stored permutation with at least one more full batch after this
        # one, the same storage length, 1-D indices): a slice and a position, nothing else.
        d = self.__dict__
        sample_list = d.get("_sample_list_value")
        if (
            sample_list is not None
            and d.get("_epoch") is None
            and len_storage == self.len_storage
            and type(batch_size) is int
        ):
            position = d.get("_sample_pos", 0)
            end = position + batch_size
            remaining = sample_list.shape[0] - end
            if remaining >= batch_size > 0 and storage.ndim == 1:
                d["_sample_pos"] = end
                self._remaining_batches = self._count_batches(remaining, batch_size)
                self.ran_out = False
                return sample_list[position:end], {}
        if len_storage == 0:
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        if self.len_storage != len_storage or not self._has_sample_list():
            self._get_sample_list(storage, len_storage, batch_size=batch_size)
        if len_storage < batch_size and self.drop_last:
            raise ValueError(
                f"The batch size ({batch_size}) is greater than the storage capacity ({len_storage}). "
                "This makes it impossible to return a sample without repeating indices. "
                "Consider changing the sampler class or turn the 'drop_last' argument to False."
            )
        self.len_storage = len_storage
        index = self._single_sample(len_storage, batch_size)
        if storage.ndim > 1:
            index = unravel_index(index, storage.shape)
        # The indices are always returned: drop_last only makes ``ran_out`` turn True
        # whenever the next sample would be too short.
        return index, {}

    @property
    def ran_out(self):
        return self._ran_out

    @ran_out.setter
    def ran_out(self, value):
        self._ran_out = value

    def _empty(self):
        self._sample_list = None
        self.len_storage = 0
        self._ran_out = False

    def state_dict(self) -> dict[str, Any]:
        return OrderedDict(
            len_storage=self.len_storage,
            _sample_list=self._sample_list,
            drop_last=self.drop_last,
            _ran_out=self._ran_out,
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.len_storage = state_dict["len_storage"]
        self._sample_list = state_dict["_sample_list"]
        self.drop_last = state_dict["drop_last"]
        self._ran_out = state_dict["_ran_out"]

    def __repr__(self):
        return f"{self.__class__.__name__}({self._percent_left(0.0): 4.4f}% sampled)"

    def _percent_left(self, before_first_epoch):
        """The share of the epoch not drawn yet, in percent (torchrl's ``repr`` calls it
        "sampled"); ``before_first_epoch`` until an epoch starts."""
        if not self._has_sample_list():
            return before_first_epoch
        return self._remaining_in_epoch() / self.len_storage * 100


class PrioritizedSampler(Sampler, *torchrl_twin("samplers", "PrioritizedSampler")):
    r"""Prioritized sampler for replay buffer.

    This sampler implements Prioritized Experience Replay (PER) as presented in
    "Schaul, T.; Quan, J.; Antonoglou, I.; and Silver, D. 2015. Prioritized experience replay."
    (https://arxiv.org/abs/1511.05952)

    Item :math:`i` is drawn with probability :math:`P(i) = \frac{p_i^\alpha}{\sum_j p_j^\alpha}`
    (where :math:`p_i` is its priority plus ``eps``) and comes with the importance weight
    :math:`w_i = (p_i^\alpha / \min_j p_j^\alpha)^{-\beta}`, returned under
    ``"priority_weight"`` in the info dictionary.

    Args:
        max_capacity (int): maximum capacity of the buffer.
        alpha (:obj:`float`): exponent :math:`\alpha` determines how much prioritization is used,
            with :math:`\alpha = 0` corresponding to the uniform case.
        beta (:obj:`float`): importance sampling negative exponent :math:`\beta`.
        eps (:obj:`float`, optional): small constant added to priorities to ensure
            no experience has zero priority. Defaults to 1e-8.
        dtype (torch.dtype, optional): the precision of the priority trees,
            ``torch.float`` or ``torch.double``. Defaults to ``torch.float``.
        reduction (str, optional): the reduction method for multidimensional
            tensordicts (ie stored trajectory). Can be one of "max", "min",
            "median" or "mean". Defaults to ``"max"``.
        max_priority_within_buffer (bool, optional): if ``True``, the max-priority
            is tracked within the buffer. When ``False``, the max-priority tracks
            the maximum value since the instantiation of the sampler. Defaults to ``False``.

    .. note:: On CPU, priorities live in ``replay``'s compiled segment trees (so prioritized
        replay works on any torch release, where torchrl 0.11 needs its trees compiled for
        torch 2.9). A batch is drawn by one fused kernel call (draws, descents, priorities
        and, for fp64 trees, importance weights) that reads O(batch * log(size)) tree nodes,
        and an update makes one kernel call for both trees; without a buffer generator the
        kernel's stream is seeded from torch's global RNG. When the sampler meets a storage
        on an accelerator, the priorities move to trees made of torch ops on that device,
        and sampling and updates then run there; each sample and each update synchronises
        with the host once (to check the priorities and indices). There the device's ``pow``
        computes the stored priorities and the weights, which can differ from torchrl's (whose
        trees stay on CPU) in the last bit.

    .. note:: As torchrl's, the trees hold ``capacity`` leaves, the next power of two above
        ``max_capacity``: a storage longer than the sampler gets priorities and draws up to
        that index (the library's logger says so once). Unlike torchrl's, an index at or past
        the capacity (where torchrl writes outside its trees), a NaN, negative or infinite
        priority, one whose stored value ``(priority + eps) ** alpha`` overflows the trees'
        dtype, and priorities whose sum would overflow it (where torchrl's draws all land on
        one leaf) raise before anything changes, the largest priority included.

    .. note:: torchrl's fp64 trees take float64 values only: its fp64 sampler fails on the
        float32 priorities of ``mark_update`` (so inside any replay buffer) and on the float32
        masses of a seeded draw. Here any real priority dtype is accepted (bool and integer
        priorities as torchrl takes them), and the largest priority is rebuilt with one
        reduction rather than a Python loop over the capacity.

    .. note:: :meth:`dumps` writes torchrl's files aside and publishes them in one rename, so
        an interrupted call leaves the previous checkpoint whole (torchrl rewrites the files
        in place, one after the other). :meth:`loads` reads them read-only and checks them
        all (sizes, JSON keys and types, leaf values) before the sampler changes, and names
        the damaged file. A sampler loads any number of checkpoints (torchrl's second
        :meth:`loads` into the same sampler fails on ``float.copy_``).

    Examples:
        >>> import torch
        >>> from torchrl.data.replay_buffers import LazyTensorStorage
        >>> storage = LazyTensorStorage(10)
        >>> storage.set(torch.arange(2), torch.arange(2))
        >>> sampler = PrioritizedSampler(max_capacity=10, alpha=1.0, beta=1.0)
        >>> sampler.update_priority(torch.tensor([0, 1]), torch.tensor([0.0, 1000.0]))
        >>> index, info = sampler.sample(storage, 10)
        >>> index.tolist()
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
        >>> sorted(info)
        ['priority_weight']
    """

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        max_priority_within_buffer: bool = False,
    ) -> None:
        if alpha < 0:
            raise ValueError(
                f"alpha must be greater or equal than 0, got alpha={alpha}"
            )
        if beta < 0:
            raise ValueError(f"beta must be greater or equal to 0, got beta={beta}")

        self._max_capacity = max_capacity
        self._alpha = alpha
        self._beta = beta
        self._eps = eps
        self.reduction = reduction
        self.dtype = dtype
        self._max_priority_within_buffer = max_priority_within_buffer
        self._init()

    def __repr__(self):
        return f"{self.__class__.__name__}(alpha={self._alpha}, beta={self._beta}, eps={self._eps}, reduction={self.reduction})"

    @property
    def max_size(self):
        return self._max_capacity

    @property
    def alpha(self):
        return self._alpha

    @alpha.setter
    def alpha(self, value):
        self._alpha = value

    @property
    def beta(self):
        return self._beta

    @beta.setter
    def beta(self, value):
        self._beta = value

    def __getstate__(self):
        if get_spawning_popen() is not None:
            raise RuntimeError(
                f"Samplers of type {type(self)} cannot be shared between processes."
            )
        return super().__getstate__()

    # ------------------------------------------------------------------ trees
    def _init(self) -> None:
        device = tree_device(self._sum_tree) if "_sum_tree" in self.__dict__ else None
        self._sum_tree, self._min_tree = make_trees(
            self._max_capacity, tree_dtype(self.dtype), device, cpu_kernels=self._use_cpu_kernels
        )
        self._max_priority = None

    def _follow_storage(self, storage) -> None:
        """Puts the priorities in the trees chosen for the storage's device (kept where they
        are when the storage does not say): a CUDA storage is sampled on CUDA."""
        device = getattr(storage, "device", None)
        if (
            (device is None or (type(device) is torch.device and device.type == "cpu"))
            and self._use_cpu_kernels
            and is_replay_tree(self._sum_tree)
        ):
            return  # the common case, checked before building a torch.device
        device = storage_device(storage) or self._device
        if not trees_fit(self._sum_tree, device, self._use_cpu_kernels):
            self._sum_tree, self._min_tree = moved_trees(
                self._sum_tree, self._min_tree, tree_dtype(self.dtype), device,
                cpu_kernels=self._use_cpu_kernels,
            )

    @property
    def _device(self) -> torch.device:
        return tree_device(self._sum_tree)

    def _note_storage_length(self, length: int) -> None:
        """Says once, through the library's logger, that the storage is longer than the sampler."""
        if not self.__dict__.get("_said_smaller"):
            self.__dict__["_said_smaller"] = True
            logger.warning(
                f"{type(self).__name__}(max_capacity={self._max_capacity}) samples a storage of "
                f"{length} items. As in torchrl, its priority trees hold "
                f"{self._sum_tree.capacity} leaves (the next power of two): items up to "
                f"{self._sum_tree.capacity - 1} get priorities and can be drawn, later ones never "
                f"are (an index past them raises IndexError). Give the sampler the storage's "
                f"capacity to prioritise every item."
            )

    def _empty(self) -> None:
        self._init()

    @property
    def _max_priority(self) -> tuple[float | None, int | None]:
        max_priority_index = self.__dict__.get("_max_priority")
        if max_priority_index is None:
            return (None, None)
        return max_priority_index

    @_max_priority.setter
    def _max_priority(self, value: tuple[float | None, int | None]) -> None:
        self.__dict__["_max_priority"] = value

    def _maybe_erase_max_priority(
        self, index: torch.Tensor | int | slice | tuple
    ) -> None:
        if not self._max_priority_within_buffer:
            return
        max_priority_index = self._max_priority[1]
        if max_priority_index is None:
            return

        def check_index(index=index, max_priority_index=max_priority_index):
            if isinstance(index, torch.Tensor):
                mpi = torch.as_tensor(max_priority_index, device=index.device)
                # index can be 1d or 2d
                if index.ndim == 1:
                    is_overwritten = (index == mpi).any()
                else:
                    is_overwritten = (index == mpi).all(-1).any()
            elif isinstance(index, int):
                is_overwritten = index == max_priority_index
            elif isinstance(index, slice):
                is_overwritten = int(max_priority_index) in range(
                    *index.indices(self._max_capacity)
                )
            elif isinstance(index, tuple):
                is_overwritten = isinstance(max_priority_index, tuple)
                if is_overwritten:
                    for idx, mpi in zip(index, max_priority_index):
                        is_overwritten &= check_index(idx, mpi)
            else:
                raise TypeError(f"index of type {type(index)} is not recognized.")
            return is_overwritten

        if check_index():
            self._max_priority = None

    @property
    def default_priority(self) -> float:
        mp = self._max_priority[0]
        if mp is None:
            mp = 1
        return (mp + self._eps) ** self._alpha

    # ------------------------------------------------------------------ sampling
    def _prioritized_sample(self, storage, batch_size: int, exclude=None):
        """``(index, info)`` of ``batch_size`` prioritized draws; the leaves ``exclude`` (for the
        slice sampler: the positions that cannot start a slice) count as zero, for this call."""
        # len() once: a torchrl storage's __len__ goes through a torch.compile guard.
        num_valid = len(storage)
        if num_valid == 0:
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        self._follow_storage(storage)
        if num_valid > self._max_capacity:
            self._note_storage_length(num_valid)
        p_min = check_sampleable(self._sum_tree, self._min_tree, num_valid)
        if exclude is None:
            index, weight = self._draw(num_valid, p_min, batch_size)
        else:
            # With excluded leaves the draw can still find nothing to land on, once the
            # random numbers are taken: it gives them back then, as a refused call should.
            with generator_kept_on_failure(self._rng):
                index, weight = self._draw(num_valid, p_min, batch_size, exclude)
        if storage.ndim > 1:
            index = unravel_index(index, storage.shape)
        return index, {"priority_weight": weight}

    def _draw(self, num_valid: int, p_min: float, batch_size: int, exclude=None):
        """``(index, weight)`` of ``batch_size`` draws, with the trees' own machinery."""
        if is_replay_tree(self._sum_tree):
            # The buffer generator's draws when there is one (so a seeded buffer draws what
            # the torch path draws), else the kernel's stream seeded from torch's RNG.
            uniform = None if self._rng is None else _rand(batch_size, _CPU, self._rng).numpy()
            return draw_with_kernel(
                self._sum_tree, num_valid, p_min, self._beta,
                uniform=uniform,
                seed=kernel_seed(None) if uniform is None else None,
                batch_size=batch_size,
                exclude=exclude,
            )
        uniform = _rand(batch_size, self._device, self._rng)
        return draw_with_torch(self._sum_tree, num_valid, p_min, self._beta, uniform, exclude)

    def sample(self, storage: Storage, batch_size: int) -> torch.Tensor:
        return self._prioritized_sample(storage, batch_size)

    def add(self, index: torch.Tensor | int) -> None:
        super().add(index)
        self._maybe_erase_max_priority(index)

    def extend(self, index: torch.Tensor | tuple) -> None:
        super().extend(index)
        self._maybe_erase_max_priority(index)

    # ------------------------------------------------------------------ updates
    def update_priority(
        self,
        index: int | torch.Tensor,
        priority: float | torch.Tensor,
        *,
        storage: TensorStorage | None = None,
    ) -> None:  # noqa: D417
        """Updates the priority of the data pointed by the index.

        Args:
            index (int or torch.Tensor): indexes of the priorities to be
                updated. Negative indices (``-1`` marks items a writer skipped) are ignored.
            priority (Number or torch.Tensor): new priorities of the
                indexed elements.

        Keyword Args:
            storage (Storage, optional): a storage used to map the Nd index size to
                the 1d size of the sum_tree and min_tree. Only required whenever
                ``index.ndim > 2``.

        .. note:: Bad input (an index past the trees' capacity, a NaN, negative or infinite
            priority, one whose stored value ``(priority + eps) ** alpha`` does not fit the
            trees' dtype, priorities whose sum would overflow it, mismatched shapes) raises
            before the sampler changes: its trees and its largest priority stay as they were.
        """
        self._follow_storage(storage)
        if (
            isinstance(index, torch.Tensor)
            and index.ndim == 1
            and index.device.type == "cpu"
            and not index.is_floating_point()
            and index.dtype != torch.bool
            and is_replay_tree(self._sum_tree)
            and self._update_with_kernels(index, priority)
        ):
            return
        # torchrl decorates update_priority with no_grad; only the general path needs it
        # (the kernel path reads detached numpy views), and entering it costs microseconds.
        with torch.no_grad():
            self._update_priority_general(index, priority, storage)

    def _update_priority_general(self, index, priority, storage) -> None:
        device = self._device
        if isinstance(index, tuple):
            index = torch.stack([torch.as_tensor(i) for i in index], -1)
        priority = torch.as_tensor(priority, device=device).detach()
        index = torch.as_tensor(index, dtype=torch.long, device=device)
        # we need to reshape priority if it has more than one element or if it has
        # a different shape than index
        if priority.numel() > 1 and priority.shape != index.shape:
            try:
                priority = priority.reshape(index.shape[:1])
            except Exception as err:
                raise RuntimeError(
                    "priority should be a number or an iterable of the same "
                    f"length as index. Got priority of shape {priority.shape} and index "
                    f"{index.shape}."
                ) from err
        elif priority.numel() <= 1:
            priority = priority.squeeze()

        # MaxValueWriter sets -1 for the items of the data that must not be updated, so
        # only the non-negative indices are kept.
        if _is_int(index):
            if index == -1:
                return
        else:
            if index.ndim > 1:
                if storage is None:
                    raise RuntimeError(
                        "storage should be provided to Sampler.update_priority when the storage has more "
                        "than one dimension."
                    )
                try:
                    shape = storage.shape
                except AttributeError:
                    raise AttributeError(
                        "Could not retrieve the storage shape. If your storage is not a TensorStorage subclass "
                        "or its shape isn't accessible via the shape attribute, submit an issue on GitHub."
                    )
                index = ravel_rows(index, shape)
            valid_index = index >= 0
            if not valid_index.any():
                return  # nothing to update (an empty index too)
            if not valid_index.all():
                index = index[valid_index]
                if priority.ndim:
                    priority = priority[valid_index]
        check_update(index, priority, self._sum_tree.capacity, self._max_capacity)
        value = stored_values(priority, self._eps, self._alpha, tree_dtype(self.dtype))
        max_p, max_p_idx = priority.max(dim=0)
        # The trees first: each refuses a bad batch whole (priorities whose sum would
        # overflow), and the largest priority moves only once they hold the update.
        self._sum_tree[index] = value
        self._min_tree[index] = value
        cur_max_priority, cur_max_priority_index = self._max_priority
        if cur_max_priority is None or max_p > cur_max_priority:
            # Fresh tensors, as torchrl's priority.max gives: never a view of the caller's.
            cur_max_priority, cur_max_priority_index = self._max_priority = (
                max_p,
                index[max_p_idx] if index.ndim else index.clone(),
            )
        if (
            self._max_priority_within_buffer
            and cur_max_priority_index is not None
            and (index == cur_max_priority_index).any()
        ):
            # As torchrl does, the max is taken over the stored values p ** alpha.
            self._max_priority = largest_leaf(self._sum_tree)

    def _update_with_kernels(self, index: torch.Tensor, priority) -> bool:
        """The common update (a 1-D CPU index) in one ``replay`` call for both trees.

        ``replay.update_priority_pair`` checks the indices, priorities and stored values,
        skips the ``-1`` indices and finds the largest priority in one pass, then writes both
        trees (or neither). Returns ``False``, having changed nothing, when the input needs the
        general path (which also produces every error message).
        """
        if not isinstance(priority, torch.Tensor):
            if type(priority) is not float:
                return False  # an int priority keeps its dtype in the largest priority
            priority = torch.tensor(priority)
        if priority.requires_grad:
            priority = priority.detach()
        if not priority.is_cpu or not priority.is_floating_point() or not index.numel():
            return False
        if priority.numel() > 1 and priority.shape != index.shape:
            if priority.numel() != index.shape[0]:
                return False
            priority = priority.reshape(index.shape)
        elif priority.numel() <= 1:
            priority = priority.reshape(())
        # torch computes the stored values, so that they match torchrl's to the last bit
        value = priority.add(self._eps_operand(self._eps, priority.dtype)).pow_(self._alpha)
        try:
            argmax = replay.update_priority_pair(self._sum_tree, self._min_tree, index, value, priority)
        except (IndexError, ValueError, TypeError):
            return False
        if argmax < 0:
            return True  # every index was -1
        if not priority.ndim:
            highest = float(priority)
        elif priority.dtype is torch.float32 or priority.dtype is torch.float64:
            highest = float(priority.numpy()[argmax])  # indexing the tensor costs a microsecond
        else:
            highest = float(priority[argmax])
        cur_max_priority, cur_max_priority_index = self._max_priority
        if cur_max_priority is None or highest > self._max_record().highest:
            # A fresh tensor: the caller may reuse its priority buffer.
            cur_max_priority, cur_max_priority_index = self._max_priority = (
                priority[argmax].clone() if priority.ndim else priority.clone(),
                torch.tensor(int(index[argmax])),
            )
        if (
            self._max_priority_within_buffer
            and cur_max_priority_index is not None
            and bool((index == int(cur_max_priority_index)).any())
        ):
            self._max_priority = largest_leaf(self._sum_tree)
        return True

    @property
    def _eps_operand(self) -> EpsOperand:
        operand = self.__dict__.get("_eps_operand_cache")
        if operand is None:
            operand = self.__dict__["_eps_operand_cache"] = EpsOperand()
        return operand

    def _max_record(self) -> MaxPriorityRecord:
        """The largest priority as the hot paths read it (see :class:`MaxPriorityRecord`),
        derived again only when it, ``alpha`` or ``eps`` changed."""
        state = self.__dict__.get("_max_priority")
        record = self.__dict__.get("_max_priority_record")
        if record is None or not record.describes(state, self._alpha, self._eps):
            record = self.__dict__["_max_priority_record"] = MaxPriorityRecord(state, self._alpha, self._eps)
        return record

    def mark_update(
        self, index: int | torch.Tensor, *, storage: Storage | None = None
    ) -> None:
        """Gives the items at ``index`` the default priority (:attr:`default_priority`).

        .. note:: When ``index`` is one or two runs of consecutive items (what a round-robin
            writer writes: the rows from its cursor on, wrapping once), they are filled as
            ranges of leaves in one kernel call for both trees, with the default priority
            and its stored value derived once per value of the largest priority rather than
            at every call; the trees and the largest priority end as the update below
            leaves them.
        """
        if not self._mark_ranges(index, storage):
            self.update_priority(index, self.default_priority, storage=storage)

    def _mark_ranges(self, index, storage) -> bool:
        """:meth:`mark_update` for an index of runs of consecutive items, with ``replay``'s
        trees: ``True`` once done; ``False``, having changed nothing, when the general path
        is to do it (which also raises torchrl's errors)."""
        cls = type(self)
        if (
            type(index) is not torch.Tensor
            or index.ndim != 1
            or index.dtype is not torch.int64
            or not index.is_cpu
            or not index.numel()
            or self._max_priority_within_buffer
            # an override of either is called, as torchrl's mark_update calls them
            or cls.update_priority is not PrioritizedSampler.update_priority
            or cls.default_priority is not PrioritizedSampler.default_priority
        ):
            return False
        self._follow_storage(storage)
        if not is_replay_tree(self._sum_tree):
            return False
        record = self._max_record()
        default = record.default_write(lambda: self.default_priority, self._eps_operand)
        if default is None:
            return False
        priority, as_float, stored = default
        try:
            if not replay.fill_priority_pair(self._sum_tree, self._min_tree, index, stored):
                return False
        except (IndexError, ValueError):
            return False  # nothing written: the general path raises torchrl's error
        if record.highest is None or as_float > record.highest:
            # as the update does: a fresh tensor, and the first item's index
            self._max_priority = (priority.clone(), torch.tensor(int(index[0])))
        return True

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        return {
            "_alpha": self._alpha,
            "_beta": self._beta,
            "_eps": self._eps,
            "_max_priority": self._max_priority,
            "_sum_tree": deepcopy(self._sum_tree),
            "_min_tree": deepcopy(self._min_tree),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sum_tree = state_dict["_sum_tree"]
        min_tree = state_dict["_min_tree"]
        for tree in (sum_tree, min_tree):
            if len(tree) != self._max_capacity:
                raise RuntimeError(
                    f"max capacity of loaded trees ({len(tree)}) differs from self._max_capacity ({self._max_capacity})."
                )
        # Trees of any class following torchrl's API are accepted (a state dict written by
        # torchrl holds its own); their values move into trees of this sampler's kind, filled
        # (and so checked) before anything changes.
        trees = self._trees_holding(read_leaves(sum_tree, self._max_capacity), read_leaves(min_tree, self._max_capacity))
        self._alpha = state_dict["_alpha"]
        self._beta = state_dict["_beta"]
        self._eps = state_dict["_eps"]
        self._max_priority = state_dict["_max_priority"]
        state_dict.pop("_sum_tree")
        state_dict.pop("_min_tree")
        self._sum_tree, self._min_tree = trees

    def _trees_holding(self, sum_leaves: torch.Tensor, min_leaves: torch.Tensor):
        """New trees of this sampler's kind holding those ``max_capacity`` leaves (the trees
        refuse NaN, negative or infinite sums, and a sum they cannot hold)."""
        trees = make_trees(self._max_capacity, tree_dtype(self.dtype), self._device, cpu_kernels=self._use_cpu_kernels)
        write_leaves(trees[0], sum_leaves)
        write_leaves(trees[1], min_leaves)
        return trees

    def dumps(self, path):
        write_aside(path, self._write_checkpoint)

    def _write_checkpoint(self, directory: Path) -> None:
        directory = Path(directory)
        for name, tree in (("sumtree", self._sum_tree), ("mintree", self._min_tree)):
            leaves = read_leaves(tree, self._max_capacity).to(torch.float64).cpu().numpy()
            leaves.tofile(directory / f"{name}.memmap")

        def to_float(value):
            if value is None:
                return None
            if isinstance(value, (tuple, list)):
                return [to_float(v) for v in value]
            return float(value)

        with open(directory / "sampler_metadata.json", "w") as file:
            json.dump(
                {
                    "_alpha": float(self._alpha),
                    "_beta": float(self._beta),
                    "_eps": float(self._eps),
                    "_max_priority": to_float(tuple(self._max_priority)),
                    "_max_capacity": float(self._max_capacity),
                },
                file,
            )

    def loads(self, path):
        self._apply_checkpoint(self._read_checkpoint(path))

    def _read_checkpoint(self, path) -> dict:
        """Everything :meth:`loads` takes from ``path``, read and checked (read-only, nothing
        changes here): each error names the file and what is wrong with it."""
        path = Path(path).absolute()
        file = path / "sampler_metadata.json"
        metadata = read_json_object(file)
        for key in ("_alpha", "_beta", "_eps", "_max_priority", "_max_capacity"):
            if key not in metadata:
                raise MetadataError(f"{file}: no {key!r} entry")
        max_capacity = real_number(file, "_max_capacity", metadata["_max_capacity"])
        if max_capacity != self._max_capacity:
            raise RuntimeError(
                f"max capacity of loaded metadata ({max_capacity}) differs from self._max_capacity ({self._max_capacity})."
            )
        max_priority = metadata["_max_priority"]
        if not isinstance(max_priority, list) or len(max_priority) != 2:
            raise MetadataError(f"{file}: _max_priority must be a list [priority, index], got {max_priority!r}")
        max_priority = (
            real_number(file, "_max_priority[0]", max_priority[0], allow_none=True, at_least=0),
            real_number(file, "_max_priority[1]", max_priority[1], allow_none=True, at_least=0),
        )
        leaves = {}
        for name in ("sumtree", "mintree"):
            leaf_file = path / f"{name}.memmap"
            values = read_float64_leaves(leaf_file, self._max_capacity, what=f"max_capacity={self._max_capacity}")
            bad = np.isnan(values) | (values < 0)
            if name == "sumtree":
                bad |= ~np.isfinite(values)
            if bad.any():
                pos = int(np.argmax(bad))
                raise MetadataError(f"{leaf_file}: leaf {pos} holds {values[pos]}, not a priority")
            leaves[name] = torch.from_numpy(values)
        try:
            trees = self._trees_holding(leaves["sumtree"], leaves["mintree"])
        except ValueError as err:
            raise MetadataError(f"{path / 'sumtree.memmap'}: {err}") from None
        return {
            "_alpha": real_number(file, "_alpha", metadata["_alpha"], at_least=0),
            "_beta": real_number(file, "_beta", metadata["_beta"], at_least=0),
            "_eps": real_number(file, "_eps", metadata["_eps"]),
            "_max_priority": max_priority,
            "trees": trees,
        }

    def _apply_checkpoint(self, state: dict) -> None:
        self._alpha, self._beta, self._eps = state["_alpha"], state["_beta"], state["_eps"]
        # Existing tensors are updated in place, as torchrl does; numbers (read by an earlier
        # loads) are replaced, where torchrl's copy_ fails on them.
        self._max_priority = tuple(
            dest.copy_(torch.as_tensor(orig)) if isinstance(dest, torch.Tensor) and orig is not None else orig
            for dest, orig in zip(tuple(self._max_priority), state["_max_priority"])
        )
        self._sum_tree, self._min_tree = state["trees"]


# The methods SliceSampler.sample's general path goes through, which _sample_from_ends
# replaces: a subclass (or an instance) overriding one of them takes the general path.
_SLICE_SAMPLING_STEPS = frozenset({
    "_get_stop_and_length", "_trajectory_bounds", "_tracked_bounds", "_find_start_stop_traj",
    "_check_signal_ndim", "_sample_slices", "_has_shorter", "_get_index", "_kernel_slices",
    "_slices_with_torch",
})
_PLAIN_SLICE_SAMPLING: dict = {}


def _plain_slice_sampling(cls) -> bool:
    """Whether ``cls`` samples as :class:`SliceSampler` does, step by step (worked out once
    per class)."""
    plain = _PLAIN_SLICE_SAMPLING.get(cls)
    if plain is None:
        plain = _PLAIN_SLICE_SAMPLING[cls] = all(
            getattr(cls, name) is getattr(SliceSampler, name) for name in _SLICE_SAMPLING_STEPS
        )
    return plain


class SliceSampler(Sampler, *torchrl_twin("samplers", "SliceSampler")):
    """Samples slices of data along the first dimension, given start and stop signals.

    This class samples sub-trajectories with replacement. For a version without
    replacement, see :class:`~torchrl_compat.samplers.SliceSamplerWithoutReplacement`.

    Keyword Args:
        num_slices (int): the number of slices to be sampled. The batch-size
            must be greater or equal to the ``num_slices`` argument. Exclusive
            with ``slice_len``.
        slice_len (int): the length of the slices to be sampled. The batch-size
            must be greater or equal to the ``slice_len`` argument and divisible
            by it. Exclusive with ``num_slices``.
        end_key (NestedKey, optional): the key indicating the end of a
            trajectory (or episode). Defaults to ``("next", "done")``.
        traj_key (NestedKey, optional): the key indicating the trajectories.
            Defaults to ``"episode"`` (commonly used across datasets in TorchRL).
        ends (torch.Tensor, optional): a 1d boolean tensor containing the end of run signals.
            Must be used with ``cache_values=True`` and cannot be used in conjunction with
            ``end_key`` or ``traj_key``. If provided, it is assumed that the storage is at
            capacity and that if the last element of the ``ends`` tensor is ``False``,
            the same trajectory spans across end and beginning.
        trajectories (torch.Tensor, optional): a 1d integer tensor containing the run ids.
            Must be used with ``cache_values=True`` and cannot be used in conjunction with
            ``end_key`` or ``traj_key``. If provided, it is assumed that the storage is at
            capacity and that if the last element of the trajectory tensor is identical to
            the first, the same trajectory spans across end and beginning.
        cache_values (bool, optional): to be used with static datasets.
            Will cache the start and end signal of the trajectory. This can be safely used even
            if the trajectory indices change during calls to :meth:`extend`
            as this operation will erase the cache. Defaults to ``False``.
        truncated_key (NestedKey, optional): If not ``None``, this argument
            indicates where a truncated signal should be written in the output
            data. Defaults to ``("next", "truncated")``.
        strict_length (bool, optional): if ``False``, trajectories of length
            shorter than `slice_len` (or `batch_size // num_slices`) will be
            allowed to appear in the batch. If ``True``, trajectories shorted
            than required will be filtered out. Defaults to ``True``.
        compile (bool or dict of kwargs, optional): if ``True``, the bottleneck of
            the :meth:`~sample` method will be compiled with :func:`~torch.compile`.
            Keyword arguments can also be passed to torch.compile with this arg.
            Defaults to ``False``.
        span (bool, int, Tuple[bool | int, bool | int], optional): if provided, the sampled
            trajectory will span across the left and/or the right. A boolean value means
            that at least one element will be sampled per trajectory. An integer `i` means
            that at least `slice_len - i` samples will be gathered for each sampled trajectory.
            Using tuples allows a fine grained control over the span on the left and on
            the right. Defaults to ``False``.
        use_gpu (bool or torch.device): if ``True`` (or is a device is passed), an accelerator
            will be used to retrieve the indices of the trajectory starts.
            Defaults to ``False``.

    .. note:: To recover the trajectory splits in the storage, the sampler first
        attempts to find the ``traj_key`` entry in the storage. If it cannot be
        found, the ``end_key`` is used to reconstruct the episodes.

    .. note:: On CPU, trajectory starts and stops and the slice indices come from
        ``replay``'s C kernels (GIL released): the draws become storage indices and
        truncation flags in one pass (``replay.sample_slice_index``). On an accelerator
        (the end signal's device, or ``use_gpu``) they are computed with a few vectorised
        torch ops there; only the checks that can raise synchronise with the host.

    .. note:: Without ``cache_values``, torchrl reads the whole end signal (or the
        trajectory ids) at every call: O(capacity), milliseconds at a million steps. On
        ``torchrl_compat``'s tensor storages, which journal their writes, the trajectory
        ends are instead kept up to date by reading only the rows written since the last
        call (O(trajectories + rows written)), with the same results, and while no
        trajectory is shorter than a slice only the drawn trajectories' bounds are read
        from them (the start, stop and length of every trajectory are not listed). Other
        storages, and writes made in another process, are read whole as torchrl does, from
        a copy (the scan reads twice, and another process may write in between). Editing
        the end signal in place behind the storage's back is not seen until the next whole
        read.

    .. note:: With ``strict_length=False`` and an integer ``span``, torchrl fails
        ("Boolean value of Tensor with more than one value is ambiguous"); here the span is
        checked against the requested slice length and the slices are drawn.

    .. note:: An empty (or emptied) storage raises ``RuntimeError: Cannot sample from an
        empty storage.``, as the other samplers do, before anything is drawn from the
        generator (torchrl fails with "random_ expects 'from' to be less than 'to'" on an
        emptied storage, or with an error about a non-initialized one).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data.replay_buffers import LazyTensorStorage
        >>> storage = LazyTensorStorage(12)
        >>> episode = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
        >>> storage.set(torch.arange(12), TensorDict({"episode": episode}, [12]))
        >>> sampler = SliceSampler(num_slices=3, traj_key="episode", truncated_key=None)
        >>> (index,), info = sampler.sample(storage, 6)
        >>> [len(set(episode[index[k:k + 2]].tolist())) for k in range(0, 6, 2)]
        [1, 1, 1]
    """

    # We use this whenever we need to sample N times too many transitions to then select only a 1/N fraction of them
    _batch_size_multiplier: int | None = 1

    def __init__(
        self,
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        end_key: NestedKey | None = None,
        traj_key: NestedKey | None = None,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        cache_values: bool = False,
        truncated_key: NestedKey | None = ("next", "truncated"),
        strict_length: bool = True,
        compile: bool | dict = False,
        span: bool | int | tuple[bool | int, bool | int] = False,
        use_gpu: torch.device | bool = False,
    ):
        self.num_slices = num_slices
        self.slice_len = slice_len
        self.end_key = end_key
        self.traj_key = traj_key
        self.truncated_key = truncated_key
        self.cache_values = cache_values
        self._fetch_traj = True
        self.strict_length = strict_length
        self._cache = {}
        self.use_gpu = bool(use_gpu)
        if not self.use_gpu:
            self._gpu_device = None
        elif isinstance(use_gpu, bool):
            self._gpu_device = _auto_device()
        else:
            self._gpu_device = torch.device(use_gpu)

        if isinstance(span, (bool, int)):
            span = (span, span)
        self.span = span

        if trajectories is not None or ends is not None:
            # A static signal given up front (trajectory ids first): its bounds are cached.
            given = "trajectories" if trajectories is not None else "ends"
            if traj_key is not None or end_key:
                raise RuntimeError(
                    f"`{given}` and `end_key` or `traj_key` are exclusive arguments."
                )
            if trajectories is not None and ends is not None:
                raise RuntimeError("trajectories and ends are exclusive arguments.")
            if not cache_values:
                raise RuntimeError(
                    f"To be used, {given} requires `cache_values` to be set to `True`."
                )
            self._cache["stop-and-length"] = self._find_start_stop_traj(
                trajectory=trajectories, end=ends, at_capacity=True
            )

        else:
            if traj_key is not None:
                self._fetch_traj = True
            elif end_key is not None:
                self._fetch_traj = False
            if end_key is None:
                end_key = ("next", "done")
            if traj_key is None:
                traj_key = "episode"
            self.end_key = end_key
            self.traj_key = traj_key

        if not ((num_slices is None) ^ (slice_len is None)):
            raise TypeError(
                "Either num_slices or slice_len must be not None, and not both. "
                f"Got num_slices={num_slices} and slice_len={slice_len}."
            )
        self.compile = bool(compile)
        if self.compile:
            kwargs = compile if isinstance(compile, dict) else {}
            self._get_index = torch.compile(self._get_index, **kwargs)

    def __getstate__(self):
        if get_spawning_popen() is not None and self.cache_values:
            logger.warning(
                f"It seems you are sharing a {type(self).__name__} across processes with "
                f"cache_values=True. "
                f"While this isn't forbidden and could perfectly work if your dataset "
                f"is unaltered on both processes, remember that calling extend/add on "
                f"one process will NOT erase the cache on another process's sampler, "
                f"which will cause synchronization issues."
            )
        state = super().__getstate__()
        state["_cache"] = {}
        return state

    def extend(self, index: torch.Tensor) -> None:
        super().extend(index)
        if self.cache_values:
            self._cache.clear()

    def add(self, index: torch.Tensor) -> None:
        super().add(index)
        if self.cache_values:
            self._cache.clear()

    def __repr__(self):
        return f"{self._repr_head()})"

    def _repr_head(self) -> str:
        """The part of torchrl's slice-sampler reprs they all share (each adds its tail)."""
        return (
            f"{self.__class__.__name__}(num_slices={self.num_slices}, "
            f"slice_len={self.slice_len}, "
            f"end_key={self.end_key}, "
            f"traj_key={self.traj_key}, "
            f"truncated_key={self.truncated_key}, "
            f"strict_length={self.strict_length}"
        )

    # ------------------------------------------------------------------ trajectories
    def _find_start_stop_traj(
        self, *, trajectory=None, end=None, at_capacity: bool, cursor=None
    ):
        signal = trajectory if trajectory is not None else end
        device = None
        if self.use_gpu and signal is not None and signal.device != self._gpu_device:
            device = signal.device
            if trajectory is not None:
                trajectory = trajectory.to(self._gpu_device)
            else:
                end = end.to(self._gpu_device)
        if device is None and self._use_cpu_kernels and _on_cpu(signal):
            # One C pass over the signal, GIL released (the torch ops below take several).
            return replay.find_start_stop_traj(
                trajectory=trajectory, end=end, at_capacity=at_capacity, cursor=cursor
            )
        start_idx, stop_idx, lengths = _torch_slices.find_start_stop_traj(
            trajectory=trajectory, end=end, at_capacity=at_capacity, cursor=cursor
        )
        if device is not None:
            return start_idx.to(device), stop_idx.to(device), lengths.to(device)
        return start_idx, stop_idx, lengths

    def _start_to_end(self, st: torch.Tensor, length: int) -> torch.Tensor:
        """The ``length`` indices of a slice starting at ``st`` (time on the first column)."""
        width = st.shape[-1] if st.ndim else 1
        offsets = torch.zeros((length, width), dtype=st.dtype, device=st.device)
        offsets[:, 0] = torch.arange(length, dtype=st.dtype, device=st.device)
        return offsets + st

    def _end_to_start_stop(self, end, length):
        device = None
        if self.use_gpu and end.device != self._gpu_device:
            device = end.device
            end = end.to(self._gpu_device)
        start_idx, stop_idx, lengths = _torch_slices.end_to_start_stop(end, length)
        if device is not None:
            return start_idx.to(device), stop_idx.to(device), lengths.to(device)
        return start_idx, stop_idx, lengths

    def _tensor_slices_from_startend(self, seq_length, start, storage_length):
        if (
            self._use_cpu_kernels
            and _on_cpu(start)
            and (not isinstance(seq_length, torch.Tensor) or _on_cpu(seq_length))
        ):
            index = replay.slice_indices(start, seq_length, storage_length)
        else:
            index = _torch_slices.slice_indices(start, seq_length, storage_length)
        return index if index.dtype == start.dtype else index.to(start.dtype)

    def _trajectory_bounds(self, storage):
        """``(start_idx, stop_idx, lengths)`` of the trajectories in ``storage``, where every
        slice sampler's ``sample`` starts.

        An empty storage is refused first, before any draw: the trajectory bookkeeping has
        nothing to work on there, and torchrl fails in it ("random_ expects 'from' to be
        less than 'to'", "IndexError: index -1 is out of bounds", or a complaint about a
        non-initialized storage).
        """
        if len(storage) == 0:
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        return self._get_stop_and_length(storage)

    @staticmethod
    def _check_signal_ndim(start_idx: torch.Tensor, storage) -> None:
        # The start / stop rows index the storage, so they need its number of dims.
        if start_idx.shape[1] != storage.ndim:
            raise RuntimeError(
                f"Expected the end-of-trajectory signal to be "
                f"{storage.ndim}-dimensional. Got a tensor with shape[1]={start_idx.shape[1]} "
                "instead."
            )

    def _get_stop_and_length(self, storage, fallback=True):
        if self.cache_values and "stop-and-length" in self._cache:
            return self._cache.get("stop-and-length")

        if self._fetch_traj:
            # We first try with the traj_key
            try:
                vals = self._tracked_bounds(storage, self._used_traj_key, from_ids=True)
                if vals is not None:
                    return self._keep_bounds(vals)
                if isinstance(storage, _TENSOR_STORAGES):
                    trajectory = storage[:][self._used_traj_key]
                else:
                    try:
                        trajectory = storage[:][self.traj_key]
                    except Exception:
                        raise RuntimeError(
                            "Could not get a tensordict out of the storage, which is required for SliceSampler to compute the trajectories."
                        )
                vals = self._find_start_stop_traj(
                    trajectory=snapshot(trajectory),
                    at_capacity=storage._is_full,
                    cursor=getattr(storage, "_last_cursor", None),
                )
                return self._keep_bounds(vals)
            except KeyError:
                if fallback:
                    self._fetch_traj = False
                    return self._get_stop_and_length(storage, fallback=False)
                raise

        else:
            vals = self._tracked_bounds(storage, self.end_key, from_ids=False)
            if vals is not None:
                return self._keep_bounds(vals)
            try:
                try:
                    done = storage[:][self.end_key]
                except Exception:
                    raise RuntimeError(
                        "Could not get a tensordict out of the storage, which is required for SliceSampler to compute the trajectories."
                    )
                vals = self._find_start_stop_traj(
                    end=snapshot(done.squeeze()[: len(storage)]),
                    at_capacity=storage._is_full,
                    cursor=getattr(storage, "_last_cursor", None),
                )
                return self._keep_bounds(vals)
            except KeyError:
                if fallback:
                    self._fetch_traj = True
                    return self._get_stop_and_length(storage, fallback=False)
                raise

    def _keep_bounds(self, vals):
        """``vals`` (start, stop, lengths), cached first with ``cache_values``."""
        if self.cache_values:
            self._cache["stop-and-length"] = vals
        return vals

    def _tracked_bounds(self, storage, key, *, from_ids: bool):
        """``(start_idx, stop_idx, lengths)`` from trajectory ends kept up to date with the
        storage's writes (:class:`._trajectory_ends.TrajectoryEnds`): O(trajectories + rows
        written) instead of a read of the whole signal. ``None`` for storages that do not
        journal their writes (torchrl's own, N-D ones...) or a missing key: the caller then
        reads the whole signal, which also raises its errors."""
        if not self._use_cpu_kernels or not TrajectoryEnds.supports(storage):
            return None
        try:
            return self._tracker(key, from_ids).bounds(storage)
        except KeyError:
            return None

    def _tracker(self, key, from_ids: bool) -> TrajectoryEnds:
        """The :class:`._trajectory_ends.TrajectoryEnds` following ``key`` (one per key)."""
        trackers = self.__dict__.setdefault("_trajectory_ends", {})
        tracker = trackers.get((key, from_ids))
        if tracker is None:
            tracker = trackers[(key, from_ids)] = TrajectoryEnds(key, from_ids=from_ids)
        return tracker

    def _adjusted_batch_size(self, batch_size):
        if self.num_slices is not None:
            if batch_size % self.num_slices != 0:
                raise RuntimeError(
                    f"The batch-size must be divisible by the number of slices, got "
                    f"batch_size={batch_size} and num_slices={self.num_slices}."
                )
            seq_length = batch_size // self.num_slices
            num_slices = self.num_slices
        else:
            if batch_size % self.slice_len != 0:
                raise RuntimeError(
                    f"The batch-size must be divisible by the slice length, got "
                    f"batch_size={batch_size} and slice_len={self.slice_len}."
                )
            seq_length = self.slice_len
            num_slices = batch_size // self.slice_len
        return seq_length, num_slices

    # ------------------------------------------------------------------ sampling
    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        if self._batch_size_multiplier is not None:
            batch_size = batch_size * self._batch_size_multiplier
        if _plain_slice_sampling(type(self)) and _SLICE_SAMPLING_STEPS.isdisjoint(self.__dict__):
            sampled = self._sample_from_ends(storage, batch_size)
            if sampled is not None:
                return sampled
        start_idx, stop_idx, lengths = self._trajectory_bounds(storage)
        self._check_signal_ndim(start_idx, storage)
        seq_length, num_slices = self._adjusted_batch_size(batch_size)
        storage_length = storage.shape[0]
        return self._sample_slices(
            lengths,
            start_idx,
            stop_idx,
            seq_length,
            num_slices,
            storage_length=storage_length,
            storage=storage,
        )

    def _sample_from_ends(self, storage, batch_size: int):
        """:meth:`sample`'s result in the common case, read from the trajectory ends kept by a
        :class:`._trajectory_ends.TrajectoryEnds`; ``None`` (nothing drawn) for any other case,
        which the general path then handles.

        The common case: a 1-D storage of ours followed through its write journal, CPU
        kernels, no ``cache_values``, ``compile`` or ``use_gpu``, a span the kernel takes, and
        every trajectory at least one slice long (so nothing is filtered out or shortened).
        The same draws are made in the same order (the trajectories, then the starts), and
        only the drawn trajectories' bounds are read (``replay.sample_slice_index_from_ends``),
        where the general path lists the start, stop and length of every trajectory (three
        arrays as long as the number of trajectories, at every write).
        """
        if (
            self.cache_values
            or self.compile
            or self.use_gpu
            or not self._use_cpu_kernels
            or not len(storage)  # the general path raises the empty-storage error first
            or not TrajectoryEnds.supports(storage)
        ):
            return None
        if self._fetch_traj:
            tracker = self._tracker(self._used_traj_key, True)
        else:
            tracker = self._tracker(self.end_key, False)
        try:
            stops = tracker.stops(storage)
        except KeyError:
            return None  # the general path falls back to the other key, or raises
        if stops is None:
            return None
        seq_length, num_slices = self._adjusted_batch_size(batch_size)
        if not num_slices or not self._kernel_span(seq_length):
            return None
        ends, limit, length, forced = stops
        count, shortest = replay.bounds_summary(ends, limit, length, forced)
        if shortest < seq_length:
            return None  # trajectories to filter out (strict_length) or slices to shorten
        traj_idx = _randint(count, num_slices, _CPU, self._rng)
        uniform = _rand(num_slices, _CPU, self._rng)
        flags = self._kernel_flags(storage)
        storage_length = storage.shape[0]
        try:
            out = replay.sample_slice_index_from_ends(
                ends, limit, length, forced, traj_idx, uniform, seq_length, storage_length,
                span=self.span, flags=flags,
            )
        except ValueError:
            # a degenerate span: the torch ops go on (or fail) as torchrl's do, same draws
            start_idx, _, lengths = (
                torch.from_numpy(array) for array in replay.bounds_from_ends(ends, limit, length, forced)
            )
            return self._index_with_torch(
                lengths, start_idx, seq_length, num_slices, storage_length, traj_idx, uniform, storage
            )
        return self._index_and_info(storage, out[0], out[1], out[2] if flags is not None else None)

    def _kernel_span(self, seq_length: int) -> bool:
        """Whether ``span`` is one the index kernel takes and :meth:`_get_index` accepts for
        slices of ``seq_length`` (no error to raise)."""
        left, right = self.span
        for span in (left, right):
            if type(span) not in (bool, int) or span < 0:
                return False
            if span is not True and span and span >= seq_length:
                return False
        return True

    def _sample_slices(
        self,
        lengths: torch.Tensor,
        start_idx: torch.Tensor,
        stop_idx: torch.Tensor,
        seq_length: int,
        num_slices: int,
        storage_length: int,
        traj_idx: torch.Tensor | None = None,
        *,
        storage,
    ) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
        # start_idx and stop_idx are 2d tensors organized like a non-zero

        def get_traj_idx(maxval):
            return _randint(maxval, num_slices, lengths.device, self._rng)

        if self._has_shorter(lengths, seq_length):
            if self.strict_length:
                idx = lengths >= seq_length
                if not idx.any():
                    raise RuntimeError(
                        f"Did not find a single trajectory with sufficient length (length range: {lengths.min()} - {lengths.max()} / required={seq_length}))."
                    )
                if (
                    isinstance(seq_length, torch.Tensor)
                    and seq_length.shape == lengths.shape
                ):
                    seq_length = seq_length[idx]
                lengths_idx = lengths[idx]
                start_idx = start_idx[idx]
                stop_idx = stop_idx[idx]

                if traj_idx is None:
                    traj_idx = get_traj_idx(lengths_idx.shape[0])
                else:
                    # traj_idx points into the unfiltered trajectories: map it to the kept
                    # ones through a mask (which may leave nothing to sample).
                    idx_mask = torch.zeros_like(idx)
                    idx_mask[traj_idx] = True
                    traj_idx = idx_mask[idx].nonzero().squeeze(-1)
                    if not traj_idx.numel():
                        raise RuntimeError(
                            "None of the provided indices pointed to a trajectory of "
                            "sufficient length. Consider using strict_length=False for the "
                            "sampler instead."
                        )
                    num_slices = traj_idx.shape[0]

                del idx
                lengths = lengths_idx
            else:
                if traj_idx is None:
                    traj_idx = get_traj_idx(lengths.shape[0])
                else:
                    num_slices = traj_idx.shape[0]

                # make seq_length a tensor with values clamped by lengths
                seq_length = lengths[traj_idx].clamp_max(seq_length)
        else:
            if traj_idx is None:
                traj_idx = get_traj_idx(lengths.shape[0])
            else:
                num_slices = traj_idx.shape[0]
        return self._get_index(
            lengths=lengths,
            start_idx=start_idx,
            stop_idx=stop_idx,
            num_slices=num_slices,
            seq_length=seq_length,
            storage_length=storage_length,
            traj_idx=traj_idx,
            storage=storage,
        )

    def _has_shorter(self, lengths: torch.Tensor, seq_length) -> bool:
        """Whether a trajectory is shorter than ``seq_length`` (the shortest length is kept for
        as long as the same ``lengths`` tensor comes back, as it does from the cache)."""
        if isinstance(seq_length, torch.Tensor):
            return bool((lengths < seq_length).any())
        cached = self.__dict__.get("_shortest")
        if cached is None or cached[0] is not lengths:
            shortest = int(lengths.min()) if lengths.numel() else None
            cached = self.__dict__["_shortest"] = (lengths, shortest)
        return cached[1] is not None and cached[1] < seq_length

    def _get_index(
        self,
        lengths: torch.Tensor,
        start_idx: torch.Tensor,
        stop_idx: torch.Tensor,
        seq_length: int,
        num_slices: int,
        storage_length: int,
        traj_idx: torch.Tensor | None = None,
        *,
        storage,
    ) -> tuple[torch.Tensor, dict]:
        # With strict_length=False seq_length is a tensor clamped by the trajectory lengths,
        # where torchrl fails on an integer span: check the span against the requested length.
        requested = seq_length if isinstance(seq_length, int) else int(seq_length.max())
        for span in self.span:
            if span is not True and span and span >= requested:
                raise ValueError(
                    "The right and left span must be strictly lower than the sequence length"
                )
        uniform = _rand(num_slices, lengths.device, self._rng)
        index = truncated = gathered = None
        if num_slices and self._kernel_slices(start_idx):
            # The done / terminated columns are read at the sampled rows in the same call.
            flags = self._kernel_flags(storage) if start_idx.shape[1] == 1 else None
            try:
                out = replay.sample_slice_index(
                    start_idx, lengths, traj_idx, uniform, seq_length, storage_length,
                    span=self.span, flags=flags,
                )
            except ValueError:
                pass  # a degenerate span: the torch ops below fail as torchrl's do
            else:
                index, truncated = out[0], out[1]
                gathered = out[2] if flags is not None else None
        if index is None:
            return self._index_with_torch(
                lengths, start_idx, seq_length, num_slices, storage_length, traj_idx, uniform, storage
            )
        return self._index_and_info(storage, index, truncated, gathered)

    def _index_with_torch(
        self, lengths, start_idx, seq_length, num_slices, storage_length, traj_idx, uniform, storage
    ):
        """:meth:`_get_index`'s result computed with torch ops from its draws."""
        index, seq_length = self._slices_with_torch(
            lengths, start_idx, seq_length, storage_length, traj_idx, uniform
        )
        truncated = None
        if self.truncated_key is not None:
            truncated = self._truncated(index.shape[0], seq_length, num_slices, index.device)
        return self._index_and_info(storage, index, truncated)

    def _index_and_info(self, storage, index, truncated, gathered=None):
        """``(index, info)`` as :meth:`sample` returns them, from the ``[rows, ndim]`` slice
        indices and their truncation flags (and the done / terminated columns read there)."""
        index = _as_long(index).unbind(-1)
        if self.truncated_key is None:
            return index, {}
        return index, self._truncation_info(storage, index, truncated, gathered)

    def _truncation_info(self, storage, index, truncated, gathered=None) -> dict:
        """The ``truncated`` / ``done`` / ``terminated`` entries of the info dictionary: the
        storage's done (or-ed with the truncation flags) and terminated at ``index``, from
        ``gathered`` when the index kernel already read them."""
        truncated_key, done_key, terminated_key = self._info_keys()
        if gathered is not None:
            done, terminated = gathered
            if done is not None:
                done.logical_or_(truncated)  # a fresh tensor of the kernel's
        else:
            done, terminated = gather_fields(storage, index, (done_key, terminated_key))
            if done is not None:
                done = done | truncated
        if done is None:
            done = truncated.clone()
        if terminated is None:
            terminated = torch.zeros_like(truncated)
        return {truncated_key: truncated, done_key: done, terminated_key: terminated}

    def _kernel_flags(self, storage):
        """The done / terminated columns ``replay.sample_slice_index`` reads for the info
        dictionary, or ``None`` (no info dictionary, or columns it cannot read)."""
        if self.truncated_key is None:
            return None
        return flag_columns(storage, self._info_keys()[1:])

    def _info_keys(self) -> tuple:
        """``(truncated_key, done_key, terminated_key)`` of the info dictionary."""
        keys = self.__dict__.get("_info_keys_of")
        if keys is None or keys[0] != self.truncated_key:
            truncated_key = self.truncated_key
            keys = (
                truncated_key,
                _replace_last(truncated_key, "done"),
                _replace_last(truncated_key, "terminated"),
            )
            self.__dict__["_info_keys_of"] = keys
        return keys

    def _kernel_slices(self, start_idx: torch.Tensor) -> bool:
        """Whether the slice indices come from ``replay``'s fused kernel (CPU, not compiled)."""
        if not self._use_cpu_kernels or self.compile or not _on_cpu(start_idx):
            return False
        left, right = self.span
        return type(left) in (bool, int) and type(right) in (bool, int) and left >= 0 and right >= 0

    def _slices_with_torch(self, lengths, start_idx, seq_length, storage_length, traj_idx, uniform):
        """``(index, seq_length)`` of the slices in torch ops (the accelerator path)."""
        traj_lengths = lengths[traj_idx]
        # end_point is one past the last possible start of a slice
        if not self.span[1]:
            end_point = traj_lengths - seq_length + 1
        elif self.span[1] is True:
            end_point = traj_lengths + 1
        else:
            end_point = traj_lengths - self.span[1]

        if not self.span[0]:
            start_point = 0
        elif self.span[0] is True:
            start_point = -seq_length + 1
        else:
            start_point = -self.span[0]

        relative_starts = (uniform * (end_point - start_point)).floor().to(
            start_idx.dtype
        ) + start_point
        # float32 rounding can reach end_point itself for very long trajectories
        relative_starts = torch.minimum(
            relative_starts, torch.as_tensor(end_point - 1).clamp_min(start_point)
        )

        if self.span[0]:
            out_of_traj = relative_starts < 0
            if out_of_traj.any():
                # a negative start means sampling fewer elements
                seq_length = torch.where(
                    ~out_of_traj, seq_length, seq_length + relative_starts
                )
                relative_starts = torch.where(~out_of_traj, relative_starts, 0)
        if self.span[1]:
            out_of_traj = relative_starts + seq_length > traj_lengths
            if out_of_traj.any():
                # a slice running past the trajectory's end is cut there (torchrl fails
                # here with an int seq_length)
                seq_length = torch.minimum(
                    torch.as_tensor(seq_length, device=traj_lengths.device),
                    traj_lengths - relative_starts,
                )

        starts = torch.cat(
            [
                (start_idx[traj_idx, 0] + relative_starts).unsqueeze(1),
                start_idx[traj_idx, 1:],
            ],
            1,
        )
        return self._tensor_slices_from_startend(seq_length, starts, storage_length), seq_length

    @staticmethod
    def _truncated(numel: int, seq_length, num_slices: int, device) -> torch.Tensor:
        # The last step of every slice is marked truncated.
        truncated = torch.zeros((numel, 1), dtype=torch.bool, device=device)
        if isinstance(seq_length, int):
            truncated.view(num_slices, -1)[:, -1] = 1
        else:
            truncated[seq_length.cumsum(0) - 1] = 1
        return truncated

    @property
    def _used_traj_key(self):
        return self.__dict__.get("__used_traj_key", self.traj_key)

    @_used_traj_key.setter
    def _used_traj_key(self, value):
        self.__dict__["__used_traj_key"] = value

    @property
    def _used_end_key(self):
        return self.__dict__.get("__used_end_key", self.end_key)

    @_used_end_key.setter
    def _used_end_key(self, value):
        self.__dict__["__used_end_key"] = value

    def _empty(self):
        pass

    def dumps(self, path):
        # Nothing to save: the cache is rebuilt from the storage.
        ...

    def loads(self, path):
        ...

    # Nothing on disk (a SliceSamplerWithoutReplacement's epoch included, as in torchrl).
    _read_checkpoint = Sampler._read_checkpoint
    _apply_checkpoint = Sampler._apply_checkpoint

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ...


class SliceSamplerWithoutReplacement(SliceSampler, SamplerWithoutReplacement, *torchrl_twin("samplers", "SliceSamplerWithoutReplacement")):
    """Samples slices of data along the first dimension, given start and stop signals, without replacement.

    In this context, ``without replacement`` means that the same element (NOT trajectory) will not be sampled twice
    before the counter is automatically reset. Within a single sample, however, only one slice of a given trajectory
    will appear. Each epoch draws every trajectory once.

    This class is to be used with static replay buffers or in between two
    replay buffer extensions. Extending the replay buffer will reset the
    the sampler, and continuous sampling without replacement is currently not
    allowed.

    Keyword Args:
        drop_last (bool, optional): if ``True``, the last incomplete sample (if any) will be dropped.
            If ``False``, this last sample will be kept. Defaults to ``False``.
        num_slices (int): the number of slices to be sampled. The batch-size
            must be greater or equal to the ``num_slices`` argument. Exclusive
            with ``slice_len``.
        slice_len (int): the length of the slices to be sampled. The batch-size
            must be greater or equal to the ``slice_len`` argument and divisible
            by it. Exclusive with ``num_slices``.
        end_key (NestedKey, optional): the key indicating the end of a
            trajectory (or episode). Defaults to ``("next", "done")``.
        traj_key (NestedKey, optional): the key indicating the trajectories.
            Defaults to ``"episode"``.
        ends (torch.Tensor, optional): a 1d boolean tensor containing the end of run signals.
            Cannot be used in conjunction with ``end_key`` or ``traj_key``.
        trajectories (torch.Tensor, optional): a 1d integer tensor containing the run ids.
            Cannot be used in conjunction with ``end_key`` or ``traj_key``.
        truncated_key (NestedKey, optional): If not ``None``, this argument
            indicates where a truncated signal should be written in the output
            data. Defaults to ``("next", "truncated")``.
        strict_length (bool, optional): if ``False``, trajectories of length
            shorter than `slice_len` (or `batch_size // num_slices`) will be
            allowed to appear in the batch. If ``True``, trajectories shorted
            than required will be filtered out. Defaults to ``True``.
        shuffle (bool, optional): if ``False``, the order of the trajectories
            is not shuffled. Defaults to ``True``.
        compile (bool or dict of kwargs, optional): if ``True``, the bottleneck of
            the :meth:`~sample` method will be compiled with :func:`~torch.compile`.
            Defaults to ``False``.
        use_gpu (bool or torch.device): if ``True`` (or is a device is passed), an accelerator
            will be used to retrieve the indices of the trajectory starts.
            Defaults to ``False``.

    .. note:: An empty (or uninitialized) storage raises ``RuntimeError: Cannot sample from
        an empty storage.``, as an emptied one does in torchrl, before anything is drawn
        from the generator (torchrl complains about a non-initialized storage).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data.replay_buffers import LazyTensorStorage
        >>> storage = LazyTensorStorage(12)
        >>> episode = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
        >>> storage.set(torch.arange(12), TensorDict({"episode": episode}, [12]))
        >>> sampler = SliceSamplerWithoutReplacement(num_slices=3, traj_key="episode")
        >>> (index,), _ = sampler.sample(storage, 6)
        >>> sorted(set(episode[index].tolist())), sampler.ran_out
        ([0, 1, 2], True)
    """

    def __init__(
        self,
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        drop_last: bool = False,
        end_key: NestedKey | None = None,
        traj_key: NestedKey | None = None,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        truncated_key: NestedKey | None = ("next", "truncated"),
        strict_length: bool = True,
        shuffle: bool = True,
        compile: bool | dict = False,
        use_gpu: bool | torch.device = False,
    ):
        SliceSampler.__init__(
            self,
            num_slices=num_slices,
            slice_len=slice_len,
            end_key=end_key,
            traj_key=traj_key,
            cache_values=True,
            truncated_key=truncated_key,
            strict_length=strict_length,
            ends=ends,
            trajectories=trajectories,
            compile=compile,
            use_gpu=use_gpu,
        )
        SamplerWithoutReplacement.__init__(self, drop_last=drop_last, shuffle=shuffle)

    def __repr__(self):
        return f"{self._repr_head()},{self._percent_left(0)}% sampled)"

    def _empty(self):
        self._cache = {}
        SamplerWithoutReplacement._empty(self)

    def _storage_len(self, storage):
        return self._storage_len_buffer

    def sample(
        self, storage: Storage, batch_size: int
    ) -> tuple[tuple[torch.Tensor, ...], dict]:
        if self._batch_size_multiplier is not None:
            batch_size = batch_size * self._batch_size_multiplier
        start_idx, stop_idx, lengths = self._trajectory_bounds(storage)
        self._check_signal_ndim(start_idx, storage)
        # The permutation runs over trajectories, not items.
        self._storage_len_buffer = len(start_idx)
        seq_length, num_slices = self._adjusted_batch_size(batch_size)
        indices, _ = SamplerWithoutReplacement.sample(self, storage, num_slices)
        storage_length = storage.shape[0]

        # For a storage with ndim > 1 the trajectory ids come back unravelled: ravel them.
        if isinstance(indices, tuple):
            indices = torch.arange(len(storage), device=lengths.device).view(
                storage.shape
            )[indices]

        return self._sample_slices(
            lengths,
            start_idx,
            stop_idx,
            seq_length,
            num_slices,
            storage_length,
            traj_idx=indices,
            storage=storage,
        )

    def state_dict(self) -> dict[str, Any]:
        return SamplerWithoutReplacement.state_dict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return SamplerWithoutReplacement.load_state_dict(self, state_dict)


class PrioritizedSliceSampler(SliceSampler, PrioritizedSampler, *torchrl_twin("samplers", "PrioritizedSliceSampler")):
    r"""Samples slices of data along the first dimension, given start and stop signals, using prioritized sampling.

    Slice starts are drawn with :class:`PrioritizedSampler`'s rule among the positions
    that can start a slice of the requested length (with ``span`` and
    ``strict_length=False`` allowing shorter slices at the end of a trajectory), and every
    step of a slice carries its start's importance weight.

    Args:
        max_capacity (int): maximum capacity of the buffer.
        alpha (:obj:`float`): exponent :math:`\alpha` determines how much prioritization is used.
        beta (:obj:`float`): importance sampling negative exponent :math:`\beta`.
        eps (:obj:`float`, optional): small constant added to priorities to ensure
            no transition has zero priority. Defaults to 1e-8.
        dtype (torch.dtype, optional): the precision of the priority trees.
            Defaults to ``torch.float``.
        reduction (str, optional): the reduction method for multidimensional
            tensordicts (i.e., stored trajectory). Can be one of "max", "min",
            "median" or "mean". Defaults to ``"max"``.

    Keyword Args:
        num_slices (int): the number of slices to be sampled. Exclusive with ``slice_len``.
        slice_len (int): the length of the slices to be sampled. Exclusive with ``num_slices``.
        end_key (NestedKey, optional): the key indicating the end of a
            trajectory (or episode). Defaults to ``("next", "done")``.
        traj_key (NestedKey, optional): the key indicating the trajectories.
            Defaults to ``"episode"``.
        ends (torch.Tensor, optional): a 1d boolean tensor containing the end of run signals.
            Must be used with ``cache_values=True``.
        trajectories (torch.Tensor, optional): a 1d integer tensor containing the run ids.
            Must be used with ``cache_values=True``.
        cache_values (bool, optional): to be used with static datasets: caches the
            trajectory starts and stops (erased by :meth:`extend`). Defaults to ``False``.
        truncated_key (NestedKey, optional): where a truncated signal is written in the
            output. Defaults to ``("next", "truncated")``.
        strict_length (bool, optional): if ``False``, slices shorter than required may be
            returned. Defaults to ``True``.
        compile (bool or dict of kwargs, optional): accepted for compatibility.
            Defaults to ``False``.
        span (bool, int, Tuple[bool | int, bool | int], optional): right span of the
            slices (left spanning is disabled, as in torchrl). Defaults to ``False``.
        max_priority_within_buffer (bool, optional): if ``True``, the max-priority
            is tracked within the buffer. Defaults to ``False``.

    .. note:: torchrl zeroes the sum-tree leaves that cannot start a slice while it
        samples, then restores them, which races with a concurrent :meth:`update_priority`
        (and, when the draw fails, leaves them zeroed), and needs an ``[M, N, ndim]`` tensor
        to find each slice's stop. Here the trees are never modified while sampling: on
        CPU, ``replay``'s kernel excludes those leaves itself
        (``sample_prioritized_excluding``: no pass over, nor copy of, the leaves); on an
        accelerator they are zeroed in a masked copy of the priorities. The stops are found
        by binary search. A draw that fails gives the random numbers it took back to the
        generator, as torchrl's (which fails before drawing) leaves it.

    .. note:: Where torchrl fails or errs, this sampler differs on purpose:

        - one-step slices (``slice_len=1``, ``batch_size == num_slices``, or
          ``span[1] == slice_len - 1``): a one-step slice may start at any step, so none is
          excluded and every step is drawn in proportion to its priority. torchrl's mask of
          the steps that cannot start a slice, ``pad[:, -seq_length + 1:]``, is
          ``pad[:, 0:]`` (every step) when ``seq_length == 1``: with
          ``strict_length=True`` it raises "non-positive p_sum", with
          ``strict_length=False`` (which puts the trajectory starts back) it draws only
          trajectory starts;
        - a slice whose right span runs past its trajectory's end is cut there (torchrl
          fails on an integer ``seq_length``);
        - for a start in the part of a trajectory that wraps around the end of the storage,
          the trajectory's own stop bounds the slice (torchrl picks the next stop of any
          trajectory, too far);
        - an empty (or emptied) storage raises ``RuntimeError: Cannot sample from an empty
          storage.``, as the other samplers do (torchrl fails with an ``IndexError``).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data.replay_buffers import LazyTensorStorage
        >>> storage = LazyTensorStorage(9)
        >>> episode = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
        >>> storage.set(torch.arange(9), TensorDict({"episode": episode}, [9]))
        >>> sampler = PrioritizedSliceSampler(9, alpha=0.7, beta=0.9, num_slices=3, traj_key="episode")
        >>> sampler.update_priority(torch.arange(9), torch.ones(9))
        >>> (index,), info = sampler.sample(storage, 6)
        >>> [len(set(episode[index[k:k + 2]].tolist())) for k in range(0, 6, 2)]
        [1, 1, 1]
        >>> info["priority_weight"].tolist()
        [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    """

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        *,
        num_slices: int | None = None,
        slice_len: int | None = None,
        end_key: NestedKey | None = None,
        traj_key: NestedKey | None = None,
        ends: torch.Tensor | None = None,
        trajectories: torch.Tensor | None = None,
        cache_values: bool = False,
        truncated_key: NestedKey | None = ("next", "truncated"),
        strict_length: bool = True,
        compile: bool | dict = False,
        span: bool | int | tuple[bool | int, bool | int] = False,
        max_priority_within_buffer: bool = False,
    ):
        SliceSampler.__init__(
            self,
            num_slices=num_slices,
            slice_len=slice_len,
            end_key=end_key,
            traj_key=traj_key,
            cache_values=cache_values,
            truncated_key=truncated_key,
            strict_length=strict_length,
            ends=ends,
            trajectories=trajectories,
            compile=compile,
            span=span,
        )
        PrioritizedSampler.__init__(
            self,
            max_capacity=max_capacity,
            alpha=alpha,
            beta=beta,
            eps=eps,
            dtype=dtype,
            reduction=reduction,
            max_priority_within_buffer=max_priority_within_buffer,
        )
        if self.span[0]:
            # Starts are drawn by the prioritized rule, which knows nothing of
            # trajectories, so 'negative' starts (left spanning) cannot be drawn.
            warnings.warn(
                f"Left spanning is disabled for {type(self).__name__} and will be automatically turned off. "
                f"If this feature is required, please file an issue on torchrl GitHub repo."
            )
            self.span = (0, self.span[1])

    def __repr__(self):
        # torchrl's, closing parenthesis missing included
        return f"{self._repr_head()},alpha={self._alpha}, beta={self._beta}, eps={self._eps}"

    def __getstate__(self):
        state = SliceSampler.__getstate__(self)
        state.update(PrioritizedSampler.__getstate__(self))
        state["_cache"] = {}
        return state

    def mark_update(
        self, index: int | torch.Tensor, *, storage: Storage | None = None
    ) -> None:
        return PrioritizedSampler.mark_update(self, index, storage=storage)

    def _padded_indices(self, shapes, arange) -> torch.Tensor:
        """A left-padded table: row ``g`` ends with the ``shapes[g]`` next values of ``arange``,
        after ``-1`` padding. One masked assignment, where torchrl loops over the rows."""
        max_len = int(shapes.max())
        pad = torch.full((shapes.shape[0], max_len), -1, dtype=arange.dtype, device=arange.device)
        columns = torch.arange(max_len, device=shapes.device)
        valid = columns.unsqueeze(0) >= (max_len - shapes).unsqueeze(1)
        pad[valid.to(pad.device)] = arange[: int(shapes.sum())]
        return pad

    def _preceding_stop_idx(self, storage, lengths, seq_length, start_idx):
        """Flat storage positions that cannot start a slice of ``seq_length`` (cached with ``cache_values``)."""
        key = (seq_length, self.strict_length, self.span[1])
        cached = self._cache.get("preceding_stop_idx")
        if cached is not None and cached[0] == key:
            return cached[1]
        # Without cache_values, the bounds of a storage that journals its writes come back
        # as the same tensors while no trajectory changed: so do the excluded positions.
        full = storage._is_full
        last = self.__dict__.get("_preceding_of")
        if (
            last is not None
            and last[0] is lengths
            and last[1] is start_idx
            and last[2] == (key, full)
        ):
            return last[3]
        numel = storage.shape.numel()
        if int(lengths.sum()) != numel:
            raise RuntimeError("Wrong shapes / arange configuration")
        if storage.ndim == 1 and self._kernel_slices(lengths):
            # One C pass, sorted (the exclusion kernel then takes them as they are); the torch
            # ops below take two repeat_interleave and a modulo (0.4 ms at 2^20 steps).
            offset = int(start_idx[0, 0]) if full else 0
            preceding_stop_idx = torch.from_numpy(
                replay.excluded_starts(
                    lengths,
                    _torch_slices.excluded_tail(seq_length, self.span[1]),
                    keep_first=not self.strict_length,
                    offset=offset,
                    total=numel,
                )
            )
        else:
            preceding_stop_idx = self._excluded_with_torch(storage, lengths, seq_length, start_idx, full)
        if self.cache_values:
            self._cache["preceding_stop_idx"] = (key, preceding_stop_idx)
        else:
            self.__dict__["_preceding_of"] = (lengths, start_idx, (key, full), preceding_stop_idx)
        return preceding_stop_idx

    def _excluded_with_torch(self, storage, lengths, seq_length, start_idx, full):
        """The excluded start positions in torch ops (any device, any ndim)."""
        preceding_stop_idx = _torch_slices.excluded_start_positions(
            lengths, seq_length, self.span[1], self.strict_length
        )
        if full:
            # At capacity the first trajectory starts at start_idx[0], not at 0.
            total_shape = storage._total_shape
            offset = ravel(start_idx[0].tolist(), total_shape)
            preceding_stop_idx = (preceding_stop_idx + offset) % total_shape.numel()
        return preceding_stop_idx

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        start_idx, stop_idx, lengths = self._trajectory_bounds(storage)
        seq_length, num_slices = self._adjusted_batch_size(batch_size)

        preceding_stop_idx = self._preceding_stop_idx(
            storage, lengths, seq_length, start_idx
        )
        if storage.ndim > 1:
            # The positions follow the trajectory order (trailing dims first): map them to
            # positions of the flat (not permuted) storage.
            shape = storage.shape
            coords = unravel_index(preceding_stop_idx, (shape[-1], *shape[:-1]))
            coords = (coords[-1], *coords[:-1])
            preceding_stop_idx = ravel(coords, shape)

        starts, info = self._prioritized_sample(
            storage, batch_size // seq_length, exclude=preceding_stop_idx
        )
        # The slices are cut at the end of their trajectory with span[1] or strict_length=False.
        if self.span[1] or not self.strict_length:
            if not isinstance(starts, torch.Tensor):
                starts_tensor = torch.stack(list(starts), dim=-1).to(stop_idx.device)
            else:
                starts_tensor = starts.unsqueeze(1).to(stop_idx.device)
            stops = _torch_slices.stops_after_starts(
                starts_tensor, start_idx, stop_idx, storage._len_along_dim0
            )
            seq_length = (stops - starts_tensor[:, 0] + 1).clamp_max(seq_length)
            if (seq_length <= 0).any():
                raise RuntimeError(
                    "failed to compute seq_length, please report this bug"
                )

        if isinstance(starts, tuple):
            starts = torch.stack(starts, -1)
        info["priority_weight"] = torch.as_tensor(
            info["priority_weight"], device=lengths.device
        )
        if (
            isinstance(seq_length, int)
            and starts.ndim == 1
            and self._kernel_slices(starts)
        ):
            return self._expand_with_kernel(storage, starts, seq_length, info)
        # every step of a slice, from its start
        index = self._tensor_slices_from_startend(
            seq_length, starts, storage_length=storage.shape[0]
        )
        # every step of a slice carries the weight of its start
        if isinstance(seq_length, torch.Tensor):
            seq_length = seq_length.to(lengths.device)
        info["priority_weight"] = torch.repeat_interleave(
            info["priority_weight"], seq_length
        )

        truncated = None
        if self.truncated_key is not None:
            truncated = self._truncated(index.shape[0], seq_length, num_slices, index.device)
        index = _as_long(index).unbind(-1)
        if truncated is not None:
            info.update(self._truncation_info(storage, index, truncated))
        return index, info

    def _expand_with_kernel(self, storage, starts, seq_length: int, info):
        """The slices of ``seq_length`` steps from ``starts`` (1-D CPU storage), their truncation
        flags and ``done`` / ``terminated`` columns in one ``replay.sample_slice_index`` call:
        each start is a trajectory of its own, entered at its first step."""
        n = starts.shape[0]
        flags = self._kernel_flags(storage)
        out = replay.sample_slice_index(
            starts.reshape(n, 1),
            np.full(n, seq_length, dtype=np.int64),
            np.arange(n, dtype=np.int64),
            np.zeros(n, dtype=np.float32),
            seq_length,
            storage.shape[0],
            flags=flags,
        )
        index, truncated = out[0], out[1]
        info["priority_weight"] = info["priority_weight"].repeat_interleave(seq_length)
        index = (index.reshape(-1),)
        if self.truncated_key is not None:
            info.update(self._truncation_info(storage, index, truncated, out[2] if flags is not None else None))
        return index, info

    def _empty(self):
        PrioritizedSampler._empty(self)

    def dumps(self, path):
        PrioritizedSampler.dumps(self, path)

    def loads(self, path):
        return PrioritizedSampler.loads(self, path)

    # The priorities are the state on disk, as torchrl's dumps / loads take them.
    _read_checkpoint = PrioritizedSampler._read_checkpoint
    _apply_checkpoint = PrioritizedSampler._apply_checkpoint

    def state_dict(self):
        return PrioritizedSampler.state_dict(self)

    def add(self, index: torch.Tensor) -> None:
        PrioritizedSampler.add(self, index)
        return SliceSampler.add(self, index)

    def extend(self, index: torch.Tensor) -> None:
        PrioritizedSampler.extend(self, index)
        return SliceSampler.extend(self, index)


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

    @property
    def p(self):
        return self._p

    @p.setter
    def p(self, value):
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
