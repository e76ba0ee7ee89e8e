""":class:`TensorDictReplayBuffer`: a replay buffer of TensorDicts that writes indices and priorities back."""
from __future__ import annotations

import warnings
from functools import partial

import torch
from tensordict import is_tensor_collection, is_tensorclass, TensorDict, TensorDictBase
from tensordict.nn.utils import _set_dispatch_td_nn_modules
from tensordict.utils import expand_as_right

from .._compile import is_compiling, opaque_to_compile
from ..samplers._priorities import check_new_priorities
from .._torchrl_lookup import torchrl_twin
from ..writers._rows import shallow_copy
from ..samplers import PrioritizedSampler
from ..utils import _is_int, _reduce, _to_torch
from ..writers import TensorDictRoundRobinWriter
from .base import PRIORITIZED_SAMPLERS, ReplayBuffer, _maybe_delay_init, _stacked


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

    _holds_tensordicts = True

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

    @opaque_to_compile
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

    @opaque_to_compile
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
        if (update_priority is None or update_priority) and isinstance(self._sampler, PRIORITIZED_SAMPLERS):
            # the batch's priorities are checked before it is written: a refused batch
            # leaves the buffer as it was (torchrl finds out once the rows are in)
            priority = self._entry(tensordicts, self.priority_key)
            if priority is not None:
                try:
                    check_new_priorities(priority, self._sampler, self.priority_key)
                except ValueError as err:
                    raise RuntimeError(
                        f"Failed to update priority of extended data: {err}. Nothing was written."
                    ) from None
        writer = self._writer
        if (
            type(tensordicts) is TensorDict
            and type(writer) is TensorDictRoundRobinWriter
            and self._dim_extend == 0
            and not self._has_transforms()
            and not is_compiling()
            and not self._is_consuming()
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
                    f"Failed to update priority of extended data ({type(e).__name__}: {e}). You can "
                    "try to set update_priority=False in the extend method and update the priority manually."
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
        if type(data) is TensorDict and self._sample_unit is None and self._update_item_priorities(data):
            return
        if data.ndim:
            priority = self._get_priority_vector(data)
            anchored = self._anchor_reduced_priority(data, priority)
            if anchored is not None:
                return self.update_priority(*anchored)
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
            # overrides are called, as the general path calls them (but for those that are
            # ReplayBuffer's while the buffer is synced, as the prioritized buffers' own)
            or not (
                cls.update_priority is ReplayBuffer.update_priority
                or getattr(cls.update_priority, "_replay_buffer_s_when_synced", False)
            )
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

    @opaque_to_compile
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

    def _anchor_reduced_priority(self, data: TensorDictBase, priority: torch.Tensor):
        """The priorities of a sample a ``Sequence`` sample unit expanded into windows,
        reduced to its anchors: ``(unique anchors, the largest priority of each anchor's
        valid records)``, so that an anchor drawn in several windows gets one update;
        ``None`` when ``data`` has no expansion (from torchrl 0.14, whose sample units these
        are).

        The anchors are read from ``"anchor_index"`` (coordinates for a storage with
        ``ndim > 1``), the valid records from ``"validity_mask"`` when present.
        """
        from ..sample_units import Sequence

        units = _sample_units()
        sequences = (Sequence,) if units is None else (Sequence, units.Sequence)
        if not isinstance(self._sample_unit, sequences):
            return None
        anchor = data.get("anchor_index", None)
        if anchor is None:
            return None
        validity = data.get("validity_mask", None)
        ndim = self._storage.ndim
        if ndim > 1:
            if anchor.ndim < 2 or anchor.shape[-1] != ndim:
                return None
            anchor = anchor.reshape(-1, ndim)
            priority = priority.reshape(-1)
            if anchor.shape[0] != priority.shape[0]:
                return None
            if validity is not None:
                keep = validity.reshape(-1)
                anchor, priority = anchor[keep], priority[keep]
            # coordinates -> flat rows (row-major), reduced, then back to coordinates
            shape = anchor.new_tensor(tuple(self._storage.shape))
            stride = torch.cat([shape.flip(0).cumprod(0).flip(0)[1:], shape.new_ones(1)])
            rows, reduced = _max_per_key((anchor * stride).sum(-1), priority)
            return (rows.unsqueeze(-1) // stride) % shape, reduced
        while anchor.shape != priority.shape and anchor.ndim > priority.ndim:
            anchor = anchor[..., 0]
            if validity is not None:
                validity = validity[..., 0]
        if anchor.shape != priority.shape:
            return None
        anchor, priority = anchor.reshape(-1), priority.reshape(-1)
        if validity is not None:
            # an anchor's own record is always valid: masking drops no anchor
            keep = validity.reshape(-1)
            anchor, priority = anchor[keep], priority[keep]
        return _max_per_key(anchor, priority)


def _max_per_key(keys: torch.Tensor, values: torch.Tensor):
    """``(unique keys, the largest value of each)``."""
    unique, inverse = torch.unique(keys, return_inverse=True)
    reduced = torch.zeros_like(unique, dtype=values.dtype)
    reduced.scatter_reduce_(0, inverse, values, reduce="amax", include_self=False)
    return unique, reduced


def _sample_units():
    """torchrl's sample-unit module (0.14), or ``None``."""
    try:
        from torchrl.data.replay_buffers import sample_units
    except ImportError:
        return None
    return sample_units
