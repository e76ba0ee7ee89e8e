"""Uniform samplers: :class:`RandomSampler` (with replacement), :class:`SamplerWithoutReplacement`
and :class:`ConsumingSampler` (items leave once sampled ``max_sample_count`` times)."""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from ..checkpointers._checks import MetadataError, read_memmapped_state
from ..checkpointers._publish import write_aside
from ._storage_reads import storage_device
from ..storages._counters import compile_disable as _compile_disable
from .._releases import since
from .._torchrl_lookup import torchrl_twin
from ..storages import Storage
from ..utils import _is_int, unravel_index
from ._common import _EMPTY_STORAGE_ERROR, _PLAIN_RAND_GIVEN_NDIM, _randperm
from .base import Sampler

try:
    from torch.compiler import is_compiling as _is_compiling
except ImportError:  # pragma: no cover - torch < 2.3
    from torch._dynamo import is_compiling as _is_compiling


@_compile_disable()
def _random_sample_outside_graph(storage, batch_size: int):
    """``RandomSampler.sample``'s draw, run by torch.compile as one eager frame."""
    if len(storage) == 0:
        raise RuntimeError(_EMPTY_STORAGE_ERROR)
    return storage._rand_given_ndim(batch_size)


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

    .. note:: Each epoch is torchrl's ``torch.randperm`` of the storage's length, drawn from
        the buffer's generator (or torch's global RNG) at the same calls as torchrl draws
        it, so the same seeds give torchrl's batches. Batches are then handed out by
        moving a position along the stored permutation (torchrl slices off the remainder
        at every batch); the remainder is cut only when ``_sample_list`` is read.
        (``replay.PermutationEpoch`` draws a first batch in O(batch) instead of a whole
        permutation, but from other numbers than ``torch.randperm``: it is not used here.)

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

    # ``_sample_list`` (torchrl's state) is a property: batches handed out from the stored
    # permutation advance ``_sample_pos`` instead of slicing off the remainder at every
    # batch; the remainder is cut when read.
    @property
    def _sample_list(self):
        d = self.__dict__
        value = d.get("_sample_list_value")
        position = d.get("_sample_pos", 0)
        if position and value is not None:
            value = d["_sample_list_value"] = value[position:]
            d["_sample_pos"] = 0
        return value

    @_sample_list.setter
    def _sample_list(self, value):
        self.__dict__["_sample_list_value"] = value
        self.__dict__["_sample_pos"] = 0

    def _has_sample_list(self) -> bool:
        return self.__dict__.get("_sample_list_value") is not None

    def _remaining_in_epoch(self) -> int:
        return self.__dict__["_sample_list_value"].numel() - self.__dict__.get("_sample_pos", 0)

    def _get_sample_list(self, storage: Storage, len_storage: int, batch_size: int):
        if storage is None:
            device = self.__dict__["_sample_list_value"].device
        else:
            device = storage_device(storage)
        if self.shuffle:
            self._sample_list = _randperm(len_storage, device, self._rng)
        else:
            self._sample_list = torch.arange(len_storage, device=device)
        self._remaining_batches = self._count_batches(self._remaining_in_epoch(), batch_size)

    def _count_batches(self, remaining: int, batch_size: int) -> int:
        if self.drop_last:
            return remaining // batch_size
        return -(remaining // -batch_size)

    def _single_sample(self, len_storage, batch_size):
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

    def can_sample(self, storage: Storage, batch_size: int) -> bool:
        """Returns whether the storage can provide the requested batch."""
        return len(storage) >= batch_size if self.drop_last else len(storage) > 0

    def sample(self, storage: Storage, batch_size: int) -> tuple[Any, dict]:  # noqa: F811
        len_storage = self._storage_len(storage)
        # Steady state (a stored permutation with at least one more full batch after this
        # one, the same storage length, 1-D indices): a slice and a position, nothing else.
        d = self.__dict__
        sample_list = d.get("_sample_list_value")
        if (
            sample_list is not None
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
        sample_list = state_dict["_sample_list"]
        if isinstance(sample_list, torch.Tensor) and since("load_state_dict_clones"):
            # the sampler must not change with the caller's tensor
            sample_list = sample_list.clone()
        self._sample_list = sample_list
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

if not since("sampler_can_sample"):
    del SamplerWithoutReplacement.can_sample


class ConsumingSampler(Sampler, *torchrl_twin("samplers", "ConsumingSampler")):
    """A random sampler that consumes entries after they have been sampled.

    Each storage index counts the batches it was returned in; once an index has been
    returned ``max_sample_count`` times it is consumed: it leaves the sampleable set until
    a write fills its slot again. Consumed slots wait in a free list, in the order they
    were consumed, which :class:`~torchrl_compat.ReplayBuffer` writes into before moving
    its writer's cursor. A batch draws, without replacement, from the live indices only.

    Args:
        max_sample_count (int, optional): number of returned samples after which
            an item is consumed. Defaults to ``1``.

    Examples:
        >>> import torch
        >>> from torchrl_compat import ListStorage, ReplayBuffer
        >>> from torchrl_compat.samplers import ConsumingSampler
        >>> rb = ReplayBuffer(storage=ListStorage(10), sampler=ConsumingSampler(), batch_size=3)
        >>> rb.extend([torch.tensor(i) for i in range(4)])
        tensor([0, 1, 2, 3])
        >>> len(rb.sample()), len(rb)
        (3, 1)

    .. note::
        ``ConsumingSampler`` only supports 1-dimensional storages and uniform
        random sampling without replacement within each sampled batch.
        Prefetching and prioritized replay are not supported.
    """

    def __init__(self, max_sample_count: int = 1):
        if isinstance(max_sample_count, bool) or not isinstance(max_sample_count, (int, np.integer)):
            raise TypeError("max_sample_count must be a positive integer.")
        if max_sample_count < 1:
            raise ValueError("max_sample_count must be a positive integer.")
        self.max_sample_count = int(max_sample_count)
        self._empty()

    @staticmethod
    def _storage_device(storage: Storage | None):
        """The device the counters live on: the storage's (``None`` when it says "auto")."""
        if storage is None:
            return None
        device = getattr(storage, "device", None)
        return None if device == "auto" else device

    # ------------------------------------------------------------------ state
    # _sample_count[i]: batches slot i was returned in since it was written; _live_mask[i]:
    # whether it can be drawn; _known_storage_len: the storage length last seen;
    # _free_indices[_free_head:]: consumed slots, oldest first (entries may be stale: a slot
    # written again since it was consumed is skipped when popped).
    def _ensure_state(self, storage: Storage | None = None, *, min_capacity: int = 0) -> None:
        """Sizes the counters for ``storage`` (and ``min_capacity`` slots), on its device, and
        follows its length: slots it grew by are live and fresh, slots it lost are dead."""
        if storage is not None:
            if storage.ndim != 1:
                raise ValueError(
                    f"{type(self).__name__} only supports 1-dimensional storages, "
                    f"got storage.ndim={storage.ndim}."
                )
            length = len(storage)
            min_capacity = max(min_capacity, length)
            device = self._storage_device(storage)
        else:
            length = self._known_storage_len
            device = None if self._sample_count is None else self._sample_count.device
        held = 0 if self._sample_count is None else self._sample_count.numel()
        capacity = max(held, int(min_capacity))
        moved = (
            self._sample_count is not None and device is not None and self._sample_count.device != torch.device(device)
        )
        if self._sample_count is None or self._live_mask is None or held < capacity or moved:
            self._reallocate(capacity, device)
        if storage is not None:
            known = self._known_storage_len
            if length != known:
                low, high = sorted((known, length))
                self._sample_count[low:high] = 0
                self._live_mask[low:high] = length > known
                self._known_storage_len = length
        self._live_mask &= self._sample_count < self.max_sample_count

    def _reallocate(self, capacity: int, device) -> None:
        counts, live = self._sample_count, self._live_mask
        self._sample_count = torch.zeros(capacity, dtype=torch.long, device=device)
        self._live_mask = torch.zeros(capacity, dtype=torch.bool, device=device)
        if counts is not None and live is not None:
            kept = min(counts.numel(), capacity)
            self._sample_count[:kept] = counts[:kept].to(self._sample_count.device)
            self._live_mask[:kept] = live[:kept].to(self._live_mask.device)
        if self._free_indices is not None:
            self._free_indices = self._free_indices.to(self._sample_count.device)

    def _num_sampleable(self, storage: Storage | None = None) -> int:
        self._ensure_state(storage)
        if self._live_mask is None:
            return 0
        return int(self._live_mask[: self._known_storage_len].sum().item())

    def _sampleable_count(self, storage: Storage, batch_size: int) -> int:
        return self._num_sampleable(storage)

    # -------------------------------------------------------------- free list
    def _compact_free_indices(self) -> None:
        if self._free_indices is not None and self._free_head:
            self._free_indices = self._free_indices[self._free_head :]
        self._free_head = 0
        if self._free_indices is not None and not self._free_indices.numel():
            self._free_indices = None

    def _append_free_indices(self, index: torch.Tensor) -> None:
        if not index.numel():
            return
        index = index.to(self._sample_count.device, dtype=torch.long).reshape(-1)
        self._compact_free_indices()
        self._free_indices = index.clone() if self._free_indices is None else torch.cat([self._free_indices, index])

    def _consumed_mask(self) -> torch.Tensor:
        known = self._known_storage_len
        return ~self._live_mask[:known] & (self._sample_count[:known] >= self.max_sample_count)

    def _rebuild_free_indices(self) -> None:
        """The free list of a state saved without one: the consumed slots, in slot order."""
        self._free_head = 0
        if self._live_mask is None or self._sample_count is None:
            self._free_indices = None
            return
        free = torch.nonzero(self._consumed_mask(), as_tuple=False).flatten()
        self._free_indices = free if free.numel() else None

    def _pop_consumed_indices(self, storage: Storage | None = None, max_count: int | None = None) -> torch.Tensor:
        """Takes up to ``max_count`` (all when ``None``) consumed slots off the free list,
        oldest first: the slots a consuming buffer writes into next."""
        self._ensure_state(storage)
        if self._free_indices is None:
            return torch.zeros(0, dtype=torch.long)
        if max_count is not None and max_count <= 0:
            return torch.zeros(0, dtype=torch.long, device=self._sample_count.device)
        free = self._free_indices
        start = self._free_head
        pending = free[start:]
        # a listed slot is still free if it is filled, not live and used up
        in_range = pending < self._known_storage_len
        clamped = pending.clamp(max=max(self._known_storage_len - 1, 0))
        usable = in_range & ~self._live_mask[clamped] & (self._sample_count[clamped] >= self.max_sample_count)
        positions = torch.nonzero(usable, as_tuple=False).flatten()
        if max_count is not None and positions.numel() >= max_count:
            positions = positions[:max_count]
            # the entries up to the last one taken are used up; the rest stay listed
            self._free_head = start + int(positions[-1].item()) + 1
        else:
            self._free_head = free.numel()
        if self._free_head >= free.numel():
            self._free_indices, self._free_head = None, 0
        return pending[positions].clone()

    # ----------------------------------------------------------------- writes
    def _index_to_tensor(self, index) -> torch.Tensor:
        if isinstance(index, tuple):
            raise ValueError(f"{type(self).__name__} only supports flat 1-dimensional indices.")
        if _is_int(index):
            self._ensure_state(min_capacity=int(index) + 1)
            return torch.as_tensor([int(index)], dtype=torch.long, device=self._sample_count.device)
        index = torch.as_tensor(index, dtype=torch.long)
        self._ensure_state(min_capacity=int(index.max().item()) + 1 if index.numel() else 0)
        return index.to(self._sample_count.device).reshape(-1)

    def _mark_indices_live(self, index) -> None:
        index = self._index_to_tensor(index)
        if not index.numel():
            return
        self._sample_count[index] = 0
        self._live_mask[index] = True
        self._known_storage_len = max(self._known_storage_len, int(index.max().item()) + 1)
        self._ran_out = False

    def add(self, index: int) -> None:
        self._mark_indices_live(index)

    def extend(self, index: torch.Tensor) -> None:
        self._mark_indices_live(index)

    def mark_update(self, index: int | torch.Tensor | tuple, *, storage: Storage | None = None) -> None:
        if storage is not None:
            min_capacity = len(storage)
            if _is_int(index):
                min_capacity = max(min_capacity, int(index) + 1)
            elif not isinstance(index, tuple):
                flat = torch.as_tensor(index).reshape(-1)
                if flat.numel():
                    min_capacity = max(min_capacity, int(flat.max().item()) + 1)
            self._ensure_state(storage, min_capacity=min_capacity)
        self._mark_indices_live(index)

    # ---------------------------------------------------------------- samples
    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        self._ensure_state(storage)
        if len(storage) == 0 or self._num_sampleable(storage) == 0:
            self._ran_out = True
            self._remaining_batches = 0
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        live = torch.nonzero(self._live_mask[: self._known_storage_len], as_tuple=False).flatten()
        # torchrl's draw: a permutation of the live indices, cut to the batch
        order = torch.randperm(live.numel(), generator=self._rng, device=live.device)
        index = live[order[: min(batch_size, live.numel())]]
        self._sample_count[index] += 1
        still_live = self._sample_count[index] < self.max_sample_count
        self._live_mask[index] = still_live
        self._append_free_indices(index[~still_live])
        self._update_remaining_batches(batch_size, storage)
        return index, {}

    def _update_remaining_batches(self, batch_size: int, storage: Storage) -> None:
        left = self._num_sampleable(storage)
        self._remaining_batches = -(left // -batch_size)
        self._ran_out = left == 0

    @property
    def ran_out(self):
        return self._ran_out

    @ran_out.setter
    def ran_out(self, value):
        self._ran_out = value

    def _empty(self):
        self._sample_count = None
        self._live_mask = None
        self._known_storage_len = 0
        self._free_indices = None
        self._free_head = 0
        self._ran_out = False
        self._remaining_batches = 0

    # ------------------------------------------------------------ persistence
    def dumps(self, path):
        write_aside(path, lambda directory: torch.save(self.state_dict(), directory / CONSUMING_SAMPLER_FILE))

    def loads(self, path):
        self._apply_checkpoint(self._read_checkpoint(path))

    def _read_checkpoint(self, path) -> dict:
        """The state saved at ``path`` by :meth:`dumps` (or torchrl's), read and checked
        without changing anything."""
        from ..checkpointers._checks import read_torch_file

        file = Path(path) / CONSUMING_SAMPLER_FILE
        state = read_torch_file(file)
        missing = [key for key in ("max_sample_count", "_sample_count", "_live_mask", "_known_storage_len", "_ran_out")
                   if not isinstance(state, dict) or key not in state]
        if missing:
            raise MetadataError(f"{file}: not a ConsumingSampler state (no {', '.join(missing)})")
        return state

    def _apply_checkpoint(self, state: dict) -> None:
        self.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        free = None if self._free_indices is None else self._free_indices[self._free_head :]
        return OrderedDict(
            max_sample_count=self.max_sample_count,
            _sample_count=self._sample_count,
            _live_mask=self._live_mask,
            _known_storage_len=self._known_storage_len,
            _free_indices=free,
            _free_head=0,
            _ran_out=self._ran_out,
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # copies: the source may be a checkpoint's memory-mapped tensors, or the caller's
        def copied(value):
            return value.clone() if isinstance(value, torch.Tensor) else value

        self.max_sample_count = int(state_dict["max_sample_count"])
        self._sample_count = copied(state_dict["_sample_count"])
        self._live_mask = copied(state_dict["_live_mask"])
        self._known_storage_len = int(state_dict["_known_storage_len"])
        self._free_indices = copied(state_dict.get("_free_indices"))
        self._free_head = int(state_dict.get("_free_head", 0))
        self._ran_out = bool(state_dict["_ran_out"])
        if "_free_indices" not in state_dict:
            self._rebuild_free_indices()
        # torchrl counts the sampleable items here, not batches
        self._remaining_batches = (
            0 if self._live_mask is None else int(self._live_mask[: self._known_storage_len].sum().item())
        )

    def __repr__(self):
        return f"{self.__class__.__name__}(max_sample_count={self.max_sample_count}, sampleable={self._num_sampleable()})"


# the file ConsumingSampler.dumps writes (torchrl's name)
CONSUMING_SAMPLER_FILE = "consuming_sampler.pt"
