""":class:`PrioritizedSampler`: prioritized experience replay over sum and min segment trees."""
from __future__ import annotations

import json
import math
import warnings
from copy import deepcopy
from multiprocessing.context import get_spawning_popen
from pathlib import Path
from typing import Any

import numpy as np
import torch

import replay
from ..checkpointers._checks import (
    MetadataError,
    check_float64_leaves_file,
    read_float64_leaves,
    read_json_object,
    real_number,
)
from ..checkpointers._publish import write_aside
from ..checkpointers._priority_checks import check_max_priority_index, check_priority_leaves
from .._releases import keywords_since, since
from ._device import (
    default_priority as device_default_priority,
    device_uniforms,
    draw_nonblocking,
    initial_max_priority,
    sampleable_status,
    update_priority_nonblocking,
)
from ._priorities import (
    check_sampleable,
    check_update,
    draw_with_kernel,
    draw_with_torch,
    draw_zeroed_with_kernel,
    EpsOperand,
    generator_kept_on_failure,
    largest_leaf,
    MaxPriorityRecord,
    ravel_rows,
    stored_values,
    torchrl_masses,
)
from ._storage_reads import storage_device
from ._trees import (
    is_replay_tree,
    leaf_blocks,
    make_trees,
    moved_trees,
    read_leaves,
    tree_device,
    tree_dtype,
    trees_fit,
    write_at,
    write_leaf_range,
    write_leaves,
)
from .._torchrl_lookup import accepted_classes, torchrl_twin
from ..storages import Storage, TensorStorage, logger
from ..utils import _is_int, unravel_index
from ._common import _CPU, _EMPTY_STORAGE_ERROR, _rand
from .base import Sampler


# torchrl's module-level names of its segment trees: here ``replay``'s, which load on any torch.
SumSegmentTreeFp32, MinSegmentTreeFp32 = replay.SumSegmentTreeFp32, replay.MinSegmentTreeFp32


SumSegmentTreeFp64, MinSegmentTreeFp64 = replay.SumSegmentTreeFp64, replay.MinSegmentTreeFp64


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
        device (torch.device or str, optional): the device that holds the priority trees
            (from torchrl 0.13). Defaults to ``None``: the trees follow a CUDA storage, and
            stay where they are for a CPU one.

    New items get the default priority :attr:`default_priority`: from torchrl 0.13 on the raw
    largest priority (``1.0`` before any), stored as ``(max_p + eps) ** alpha`` as any update;
    torchrl 0.11 and 0.12 give ``(max_p + eps) ** alpha`` there, which the update raises to
    ``alpha`` once more. From torchrl 0.14 on, setting :attr:`alpha` re-transforms the stored
    values to the new exponent, and checkpoints carry a schema version.

    .. note:: On CPU, priorities live in ``replay``'s compiled segment trees (so prioritized
        replay works on any torch release, where torchrl 0.11 needs its trees compiled for
        torch 2.9). A batch is drawn by one fused kernel call (descents, priorities and, for
        fp64 trees, importance weights) that reads O(batch * log(size)) tree nodes, from
        masses drawn as torchrl draws them: ``np.random.uniform(0.0, p_sum, batch_size)``
        without a generator (so ``np.random.seed`` gives torchrl's batches), ``torch.rand``
        with the buffer's generator. An update makes one kernel call for both trees. When
        the sampler meets a storage on an accelerator (or is given ``device``), the
        priorities move to trees made of torch ops on that device, and sampling and updates
        then run there. There the device's ``pow`` computes the stored priorities and the
        weights, which can differ from torchrl's in the last bit. Unlike torchrl 0.13+, this
        needs no CUDA build of anything (torchrl raises without its CUDA wheel), and the
        priorities move with the trees (torchrl starts empty trees).

    .. note:: On the device's trees the steady state (``extend`` / ``mark_update``,
        ``sample``, ``update_priority``) makes no host synchronisation. Draws come from the
        buffer's generator when it has one, else from the device's default torch generator
        (torchrl 0.14's ``torch.rand(batch_size, device=...)``; numpy's global RNG on CPU
        tensors, as torchrl). What needs the device's data is checked there, and raised at
        a later call once the status has reached the host (usually the next one): an
        update with an index past the trees' capacity, or a NaN, negative or infinite
        priority, or one whose stored value ``(priority + eps) ** alpha`` does not fit the
        trees' dtype, is masked on the device (neither tree nor the largest priority
        changes); a draw with no positive priority (``p_sum`` or ``p_min`` not positive)
        has meaningless results and raises ``RuntimeError`` at the next call (its random
        numbers are taken). Until an update is accepted the largest priority reads
        ``(nan, -1)`` there (read as none). The sum's overflow check of the CPU trees is not
        made (the device trees sum in float64). On CPU tensors (the torch-op trees forced
        there) the same code runs, and its errors are raised by the call that made them,
        with the checked path's messages and before a refused draw takes random numbers.
        Left on the checked path, which synchronises once per call: multi-dimensional or
        non-tensor indices, integer or bool priorities, a priority dtype other than the
        largest priority's, ``max_priority_within_buffer=True``, and draws with excluded
        positions (:class:`PrioritizedSliceSampler`).

    .. note:: As torchrl's, the trees hold ``capacity`` leaves, the next power of two above
        ``max_capacity``: a storage longer than the sampler gets priorities and draws up to
        that index (the library's logger says so once). Unlike torchrl's, an index at or past
        the capacity (where torchrl writes outside its trees), a NaN, negative or infinite
        priority, one whose stored value ``(priority + eps) ** alpha`` overflows the trees'
        dtype, and priorities whose sum would overflow it (where torchrl's draws all land on
        one leaf) raise before anything changes, the largest priority included. So do a NaN
        ``alpha`` or ``beta`` and a non-finite ``eps`` (torchrl takes them, and then stores
        NaN or infinite values), and a state dict whose trees are of another capacity (torchrl
        takes its trees as they are).

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
        :meth:`loads` into the same sampler fails on ``float.copy_``). The leaves are written
        as they are; torchrl gathers them into a float32 tensor first, so a float64 sampler's
        checkpoint loses precision there and its empty min-tree leaves read back as ``inf``.

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
        device: torch.device | str | None = None,
    ) -> None:
        # (``not x >= 0``, which refuses NaN too: every stored priority would be NaN)
        if not alpha >= 0:
            raise ValueError(
                f"alpha must be greater or equal than 0, got alpha={alpha}"
            )
        if not beta >= 0:
            raise ValueError(f"beta must be greater or equal to 0, got beta={beta}")
        if not -math.inf < eps < math.inf:
            raise ValueError(f"eps must be a finite number, got eps={eps}")

        self._max_capacity = max_capacity
        self._alpha = alpha
        self._beta = beta
        self._eps = eps
        self.reduction = reduction
        self.dtype = dtype
        self._max_priority_within_buffer = max_priority_within_buffer
        self._requested_device = torch.device(device) if device is not None else None
        self._init()

    __init__ = keywords_since(__init__, device="prioritized_device_argument")

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
        if since("prioritized_device_argument") and value < 0:
            raise ValueError(f"alpha must be greater or equal than 0, got alpha={value}")
        old_alpha = self._alpha
        if (
            since("prioritized_alpha_change_warns")
            and not since("prioritized_alpha_retransforms")
            and value != old_alpha
            and self._max_priority_within_buffer
            and not self.__dict__.get("_warned_alpha_change")
            and self._max_priority[0] is not None
        ):
            self.__dict__["_warned_alpha_change"] = True
            warnings.warn(
                "Changing alpha on a PrioritizedSampler with max_priority_within_buffer=True does "
                f"not re-transform the (p + eps) ** alpha values already stored in the sum/min "
                f"trees (alpha {old_alpha} -> {value}), and the max-priority recomputation "
                "inverts tree values with the new alpha. This warning is emitted once per sampler."
            )
        self._alpha = value
        if since("prioritized_alpha_retransforms") and value != old_alpha:
            self._retransform_priority_trees(old_alpha, value)

    @property
    def device(self) -> torch.device:
        """The device that holds the priority trees."""
        return self._device

    def _retransform_priority_trees(self, old_alpha: float, new_alpha: float) -> None:
        """Rewrites the stored values from ``(p + eps) ** old_alpha`` to ``(p + eps) **
        new_alpha`` in one pass over the leaves; the raw largest priority needs no change.

        Leaves never written hold 0 and stay 0. From ``old_alpha == 0`` every written leaf
        holds 1 and the raw priorities are lost: the values are kept, with a warning.
        """
        values = read_leaves(self._sum_tree, self._max_capacity)
        written = values > 0
        if not bool(written.any()):
            return
        if old_alpha == 0:
            warnings.warn(
                "Changing alpha away from 0 on a PrioritizedSampler that already holds "
                "priorities cannot recover the raw priorities from the sum/min trees (alpha == 0 "
                "stores 1.0 for every written entry). Sampling stays uniform for those entries "
                "until their priority is next updated, so annealing away from exactly 0 is "
                "approximate."
            )
            return
        index = written.nonzero().reshape(-1)
        raw = (values[written].double() ** (1.0 / old_alpha) - self._eps).clamp_min(0)
        new_values = ((raw + self._eps) ** new_alpha).to(tree_dtype(self.dtype))
        write_at(self._sum_tree, index, new_values)
        write_at(self._min_tree, index, new_values)

    @property
    def beta(self):
        return self._beta

    @beta.setter
    def beta(self, value):
        self._beta = value

    def __getstate__(self):
        if get_spawning_popen() is not None:
            fix = (
                " Use TensorDictPrioritizedReplayBuffer(sync=False) instead: the writer process "
                "gets a uniform sampler and the learner keeps a local prioritized sampler."
            )
            raise RuntimeError(
                f"Samplers of type {type(self)} cannot be shared between processes."
                + (fix if since("multiprocess_errors_name_fix") else "")
            )
        return super().__getstate__()

    # ------------------------------------------------------------------ trees
    def _init(self) -> None:
        if "_sum_tree" in self.__dict__:
            device = tree_device(self._sum_tree)
        else:
            device = self.__dict__.get("_requested_device")
        self._sum_tree, self._min_tree = make_trees(
            self._max_capacity, tree_dtype(self.dtype), device, cpu_kernels=self._use_cpu_kernels
        )
        self._max_priority = None

    def _follow_storage(self, storage) -> None:
        """Puts the priorities in the trees chosen for the storage's device (kept where they
        are when the storage does not say, or is on neither the CPU nor CUDA): a CUDA storage
        is sampled on CUDA."""
        requested = self.__dict__.get("_requested_device")
        if requested is None:
            device = getattr(storage, "device", None)
            if (
                (device is None or (type(device) is torch.device and device.type == "cpu"))
                and self._use_cpu_kernels
                and is_replay_tree(self._sum_tree)
            ):
                return  # the common case, checked before building a torch.device
            device = storage_device(storage)
            if device is None or device.type not in ("cpu", "cuda"):
                # a storage on meta, or on an accelerator torchrl does not follow either, is
                # sampled from where the trees are
                device = self._device
        else:
            device = requested  # ``device=`` given: the trees stay there, whatever the storage
        if not trees_fit(self._sum_tree, device, self._use_cpu_kernels):
            self._sum_tree, self._min_tree = moved_trees(
                self._sum_tree, self._min_tree, tree_dtype(self.dtype), device,
                cpu_kernels=self._use_cpu_kernels,
            )

    @property
    def _device(self) -> torch.device:
        return tree_device(self._sum_tree)

    def _tree_device_from_storage(self, storage: Storage | None) -> torch.device | None:
        """The device the trees are asked to be on: ``device=`` when given, else that of a
        CUDA storage; ``None`` (stay) otherwise."""
        requested = self.__dict__.get("_requested_device")
        if requested is not None:
            return requested
        device = storage_device(storage) if storage is not None else None
        return device if device is not None and device.type == "cuda" else None

    def _maybe_init_from_storage(self, storage: Storage | None) -> None:
        """Puts the trees where :meth:`_tree_device_from_storage` says; unlike torchrl's (which
        starts empty trees there), the priorities move with them."""
        device = self._tree_device_from_storage(storage)
        if device is not None and not trees_fit(self._sum_tree, device, self._use_cpu_kernels):
            self._sum_tree, self._min_tree = moved_trees(
                self._sum_tree, self._min_tree, tree_dtype(self.dtype), device,
                cpu_kernels=self._use_cpu_kernels,
            )

    def _tree_argmax(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(value, index)`` of the largest stored value, in the dtype the followed release
        reads it in."""
        if since("prioritized_max_read_in_tree_dtype"):
            return largest_leaf(self._sum_tree, dtype=tree_dtype(self.dtype))
        return largest_leaf(self._sum_tree)

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
    def default_priority(self) -> float | torch.Tensor:
        mp = self._max_priority[0]
        if isinstance(mp, torch.Tensor) and not is_replay_tree(self._sum_tree):
            # The torch-op trees keep ``(nan, -1)`` until an update is accepted: read as None,
            # on the device (no host synchronisation).
            return device_default_priority(
                (mp.to(self._device, non_blocking=True), None), self._eps, self._alpha,
                raw=since("prioritized_raw_default_priority"),
            )
        if not since("prioritized_raw_default_priority"):
            if mp is None:
                mp = 1
            return (mp + self._eps) ** self._alpha
        # The raw largest priority: the update it goes through applies alpha once.
        if mp is None:
            return 1.0
        if isinstance(mp, torch.Tensor):
            mp = mp.to(self._device)
        return mp

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
        if exclude is None and not is_replay_tree(self._sum_tree):
            index, weight = self._draw_on_device(num_valid, batch_size)
            if storage.ndim > 1:
                index = unravel_index(index, storage.shape)
            return index, {"priority_weight": weight}
        if exclude is not None and is_replay_tree(self._sum_tree):
            # torchrl's draw on its trees with the excluded leaves zeroed, read in place.
            index, weight = draw_zeroed_with_kernel(
                self._sum_tree, self._min_tree, num_valid, self._beta, batch_size, exclude, self._rng
            )
        else:
            p_sum, p_min = check_sampleable(self._sum_tree, self._min_tree, num_valid)
            if exclude is None:
                index, weight = self._draw(num_valid, p_sum, p_min, batch_size)
            else:
                # With excluded leaves the draw can still find nothing to land on, once the
                # random numbers are taken: it gives them back then, as a refused call should.
                with generator_kept_on_failure(self._rng):
                    index, weight = self._draw(num_valid, p_sum, p_min, batch_size, exclude)
        if storage.ndim > 1:
            index = unravel_index(index, storage.shape)
        return index, {"priority_weight": weight}

    def _draw(self, num_valid: int, p_sum: float, p_min: float, batch_size: int, exclude=None):
        """``(index, weight)`` of ``batch_size`` draws, with the trees' own machinery."""
        if is_replay_tree(self._sum_tree):
            # torchrl's masses, to the bit: numpy's global RNG without a generator. (Draws
            # with excluded leaves take draw_zeroed_with_kernel.)
            mass = torchrl_masses(batch_size, p_sum, self._rng)
            return draw_with_kernel(self._sum_tree, num_valid, p_min, self._beta, mass=mass)
        uniform = _rand(batch_size, self._device, self._rng)
        return draw_with_torch(self._sum_tree, num_valid, p_min, self._beta, uniform, exclude)

    def _draw_on_device(self, num_valid: int, batch_size: int):
        """``(index, weight)`` of ``batch_size`` draws on the torch-op trees, with no host
        synchronisation: a draw with nothing to land on raises at a later call. On CPU tensors
        that status is on the host already: the call is refused at once, before it takes any
        random number, as the checked path refuses it."""
        sum_tree, min_tree = self._sum_tree, self._min_tree
        checks = sum_tree._checks
        if checks._on_host:
            checks.raise_ready()
            # ``numpy()`` reads host memory: no device op (the tensor is a CPU one).
            if not sampleable_status(sum_tree, min_tree, num_valid).numpy():
                check_sampleable(sum_tree, min_tree, num_valid)  # raises the checked path's error
        uniform = device_uniforms(batch_size, sum_tree.device, self._rng)
        index, weight = draw_nonblocking(sum_tree, min_tree, num_valid, self._beta, uniform)
        if checks._on_host:
            checks.raise_ready()
        return index, weight

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

        .. note:: The index of the largest priority is kept as a tensor of the sampler's own.
            torchrl keeps a view of the caller's ``index`` on some paths, which moves when the
            caller writes its next indices into the same tensor.
        """
        self._follow_storage(storage)
        if not is_replay_tree(self._sum_tree) and self._update_on_device(index, priority):
            return
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

    def _update_on_device(self, index, priority) -> bool:
        """The steady-state update on the torch-op trees (a 1-D integer index and a floating
        priority on the trees' device, or a float), with no host synchronisation: a bad batch
        is masked on the device and raised at a later call (at once on CPU tensors, where the
        status is on the host). Returns ``False``, having changed nothing, for any other input
        (the general path takes it)."""
        device = self._sum_tree.device
        if (
            self._max_priority_within_buffer
            or type(index) is not torch.Tensor
            or index.ndim != 1
            or index.dtype is torch.bool
            or index.is_floating_point()
            or index.is_complex()
            or not index.numel()  # nothing to write, or torchrl's shape error: the general path says
        ):
            return False
        # A host index or priority (a writer's cursor range) is copied without waiting.
        if index.device != device:
            index = index.to(device, non_blocking=True)
        if isinstance(priority, torch.Tensor):
            if not priority.is_floating_point():
                return False
            priority = priority.detach()
            if priority.device != device:
                priority = priority.to(device, non_blocking=True)
            if priority.numel() > 1 and priority.shape != index.shape:
                if priority.numel() != index.shape[0]:
                    return False
                priority = priority.reshape(index.shape)
            elif priority.numel() <= 1:
                priority = priority.reshape(())
        elif type(priority) is float:
            priority = torch.full((), priority, device=device)  # a fill: no host copy
        else:
            return False
        current = self._device_max_priority(device, priority.dtype)
        if current[0].dtype is not priority.dtype:
            # The largest priority takes the dtype of whichever wins, which only the device
            # knows: a change of priority dtype takes the general path (once).
            return False
        previous = self.__dict__.get("_max_priority")
        self._max_priority = update_priority_nonblocking(
            self._sum_tree, self._min_tree, index, priority, current, eps=self._eps, alpha=self._alpha
        )
        checks = self._sum_tree._checks
        if checks._on_host:
            try:
                checks.raise_ready()
            except (IndexError, ValueError, RuntimeError) as err:
                failure = err
            else:
                # On the host the pair is read for free: no accepted priority yet reads None,
                # as in torchrl (on an accelerator it stays ``(nan, -1)``).
                if int(self._max_priority[1].numpy()) < 0:
                    self._max_priority = None
                return True
            # The checked path names the bad value as it would have; nothing was written.
            self._max_priority = previous
            self._explain_rejected_update(index, priority)
            raise failure
        return True

    def _explain_rejected_update(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """Raises the checked path's error for an update the device refused (when it has one)."""
        keep = index >= 0
        index = index[keep]
        if priority.ndim:
            priority = priority[keep]
        check_update(index, priority, self._sum_tree.capacity, self._max_capacity)
        stored_values(priority, self._eps, self._alpha, tree_dtype(self.dtype))

    def _device_max_priority(self, device: torch.device, dtype: torch.dtype):
        """The largest-priority pair as device tensors (``(nan, -1)`` before any update),
        moved there once from wherever it was kept."""
        highest, position = self._max_priority
        if highest is None:
            return initial_max_priority(device, dtype)
        if not isinstance(highest, torch.Tensor):
            highest = torch.full((), highest, device=device)
        if not isinstance(position, torch.Tensor):
            position = torch.full((), -1 if position is None else position, dtype=torch.long, device=device)
        if highest.device != device or position.device != device:
            highest = highest.to(device, non_blocking=True)
            position = position.to(device, non_blocking=True)
        return highest.reshape(()), position.reshape(())

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
        # (a NaN largest priority: the device path's "none yet")
        if cur_max_priority is None or max_p > cur_max_priority or cur_max_priority != cur_max_priority:
            # Fresh tensors, never a view of the caller's: torchrl keeps ``index[max_p_idx]``,
            # a view of the caller's index tensor, which then moves when the caller reuses it.
            cur_max_priority, cur_max_priority_index = self._max_priority = (
                max_p,
                (index[max_p_idx] if index.ndim else index).clone(),
            )
        if self._max_priority_within_buffer and cur_max_priority_index is not None:
            self._rebuild_max_within_buffer(index, cur_max_priority_index)

    def _rebuild_max_within_buffer(self, index: torch.Tensor, max_index) -> None:
        """Rebuilds the largest priority from the trees when ``index`` overwrote its item.

        torchrl 0.11-0.12 keep the largest stored value ``(p + eps) ** alpha`` as it is; from
        0.13 on it is turned back into a raw priority, and kept as tracked when ``alpha`` is 0
        (every stored value is 1 then).
        """
        raw = since("prioritized_raw_max_within_buffer")
        if raw and self._alpha == 0:
            return
        if isinstance(max_index, torch.Tensor) and max_index.numel() == 1:
            max_index = int(max_index)
        if not bool((index == max_index).any()):
            return
        if not raw:
            self._max_priority = largest_leaf(self._sum_tree)
            return
        value, position = self._tree_argmax()
        self._max_priority = ((value ** (1.0 / self._alpha) - self._eps).clamp_min(0), position)

    def _recompute_max_priority_from_tree(self) -> None:
        """The raw largest priority rebuilt from the trees (for a checkpoint written before
        torchrl kept it raw); kept as loaded when ``alpha`` is 0, ``None`` for empty trees."""
        if self._alpha == 0:
            return
        value, position = self._tree_argmax()
        if not value > 0:
            self._max_priority = None
            return
        self._max_priority = ((value ** (1.0 / self._alpha) - self._eps).clamp_min(0), position)

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
        if self._max_priority_within_buffer and cur_max_priority_index is not None:
            self._rebuild_max_within_buffer(index, cur_max_priority_index)
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
    # Version of the state_dict / dumps schema (from torchrl 0.14 on): 1 marks a largest
    # priority kept raw; a checkpoint without it is read as written before that.
    _STATE_SCHEMA_VERSION: int = 1

    def state_dict(self) -> dict[str, Any]:
        versioned = {"_schema_version": self._STATE_SCHEMA_VERSION} if since("prioritized_state_schema") else {}
        return {
            **versioned,
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
        if since("prioritized_load_state_dict_copies"):
            # The caller's state dict is left as it is, and nothing of it is shared.
            self._max_priority = deepcopy(state_dict["_max_priority"])
        else:
            self._max_priority = state_dict["_max_priority"]
            state_dict.pop("_sum_tree")
            state_dict.pop("_min_tree")
        self._sum_tree, self._min_tree = trees
        self._after_loading(state_dict.get("_schema_version", 0))

    def _after_loading(self, version) -> None:
        """A checkpoint of a within-buffer sampler written before the largest priority was
        kept raw (schema version 0) may hold a stored value there: rebuilt from the trees."""
        if (
            since("prioritized_state_schema")
            and version < 1
            and self._max_priority_within_buffer
            and self._max_priority[0] is not None
        ):
            self._recompute_max_priority_from_tree()

    def _trees_holding(self, sum_leaves: torch.Tensor, min_leaves: torch.Tensor):
        """New trees of this sampler's kind holding those ``max_capacity`` leaves (the trees
        refuse NaN, negative or infinite sums, and a sum they cannot hold)."""
        trees = make_trees(self._max_capacity, tree_dtype(self.dtype), self._device, cpu_kernels=self._use_cpu_kernels)
        write_leaves(trees[0], sum_leaves)
        write_leaves(trees[1], min_leaves)
        return trees

    def _read_trees(self, path: Path):
        """New trees holding the leaves of ``path``'s two tree files, read, checked and written
        a block of leaves at a time: a tree of 2^30 leaves loads with no float64 copy of its
        files in memory. The first fault of each kind is kept and raised once every block is
        read, in the order the checks would find them on the whole files: values in the sum
        tree, in the min tree, what the trees refuse, then the two trees against each other."""
        files = {name: path / f"{name}.memmap" for name in ("sumtree", "mintree")}
        capacity = self._max_capacity
        for file in files.values():
            check_float64_leaves_file(file, capacity, what=f"max_capacity={capacity}")
        trees = make_trees(capacity, tree_dtype(self.dtype), self._device, cpu_kernels=self._use_cpu_kernels)
        faults = {}  # the first fault of each kind: values of either file, trees, pairs
        for lo, hi in leaf_blocks(capacity):
            block = {}
            for name, file in files.items():
                values = read_float64_leaves(file, hi, start=lo)
                bad = np.isnan(values) | (values < 0)
                if name == "sumtree":
                    bad |= ~np.isfinite(values)
                if name not in faults and bad.any():
                    pos = int(np.argmax(bad))
                    faults[name] = MetadataError(f"{file}: leaf {lo + pos} holds {values[pos]}, not a priority")
                block[name] = values
            if faults.keys() - {"pairs"}:
                continue  # nothing more is written; the files are still read for their first fault
            try:
                # the trees refuse what they cannot hold (a sum past the dtype's range)
                for tree, name in zip(trees, files):
                    write_leaf_range(tree, lo, torch.from_numpy(block[name]))
            except ValueError as err:
                # the tree counts positions from the first leaf it was given
                where = f"leaves [{lo}, {hi}): " if hi - lo < capacity else ""
                faults["trees"] = MetadataError(f"{files['sumtree']}: {where}{err}")
                continue
            if "pairs" not in faults:
                try:
                    check_priority_leaves(path, block["sumtree"], block["mintree"], tree_dtype(self.dtype), start=lo)
                except MetadataError as err:
                    faults["pairs"] = err
        for kind in ("sumtree", "mintree", "trees", "pairs"):
            if kind in faults:
                raise faults[kind]
        return trees

    def dumps(self, path):
        write_aside(path, self._write_checkpoint)

    def _write_checkpoint(self, directory: Path) -> None:
        directory = Path(directory)
        for name, tree in (("sumtree", self._sum_tree), ("mintree", self._min_tree)):
            with open(directory / f"{name}.memmap", "wb") as file:
                for lo, hi in leaf_blocks(self._max_capacity):
                    read_leaves(tree, hi, lo).to(torch.float64).cpu().numpy().tofile(file)

        def to_float(value):
            if value is None:
                return None
            if isinstance(value, (tuple, list)):
                return [to_float(v) for v in value]
            return float(value)

        metadata = {
            "_alpha": float(self._alpha),
            "_beta": float(self._beta),
            "_eps": float(self._eps),
            "_max_priority": to_float(tuple(self._max_priority)),
            "_max_capacity": float(self._max_capacity),
        }
        if since("prioritized_state_schema"):
            metadata["_schema_version"] = self._STATE_SCHEMA_VERSION
        with open(directory / "sampler_metadata.json", "w") as file:
            json.dump(metadata, file)

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
                f"max capacity of loaded metadata ({max_capacity}) differs from self._max_capacity "
                f"({self._max_capacity}) ({file})."
            )
        max_priority = metadata["_max_priority"]
        if not isinstance(max_priority, list) or len(max_priority) != 2:
            raise MetadataError(f"{file}: _max_priority must be a list [priority, index], got {max_priority!r}")
        max_priority = (
            real_number(file, "_max_priority[0]", max_priority[0], allow_none=True, at_least=0),
            real_number(file, "_max_priority[1]", max_priority[1], allow_none=True, at_least=0),
        )
        check_max_priority_index(file, max_priority[1], self._max_capacity)
        trees = self._read_trees(path)
        version = metadata.get("_schema_version", 0)
        if type(version) is not int:
            raise MetadataError(f"{file}: _schema_version must be an integer, got {version!r}")
        return {
            "_schema_version": version,
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
        self._after_loading(state["_schema_version"])


# The samplers a buffer gives priorities to: ours, and torchrl's when importable.
PRIORITIZED_SAMPLERS = accepted_classes(PrioritizedSampler, "samplers")
