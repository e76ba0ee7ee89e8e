"""The prioritized sampler's steady state, replayed as CUDA graphs.

On a GPU, an update of ``k`` priorities through :func:`torchrl_compat.samplers._device.update_priority_nonblocking`
is about 30 small kernels and a draw through :func:`torchrl_compat.samplers._device.draw_nonblocking` about
50, each with a few microseconds of work: their launches, not their work, set the time of a
step. A CUDA graph records such a sequence once and replays it with one launch.
:class:`GraphedPriorityOps` does that for the fixed shapes of a training loop (an update of a
given count, a draw of a given batch size from a given number of items), and runs the eager
functions for everything else.

What a graph cannot replay is kept out of the recorded calls:

* host-side work (the checks of shapes, dtypes and devices, the raise of an earlier call's
  error, the trees' cache invalidation) runs at every call, around the replay;
* the device-side checks, which the eager path copies to a fresh pinned host buffer per call
  (:class:`torchrl_compat._torch_ops.checks.DeferredChecks`), go into one status tensor of the graph (the first
  failure of the call kept); after each replay that status is queued like an eager one, so a
  bad update is masked on the device and raised by a later call, as on the eager path;
* the recorded calls create no tensor from host data (a copy from pageable host memory
  cannot be captured): ``tests/test_device_graphs.py`` watches them on CPU tensors.

The largest-priority pair returned by :meth:`GraphedPriorityOps.update` is the graphs' own
state, updated in place by later updates; the draws are returned as fresh tensors.

Without a CUDA device (``capture=False``), the same calls run with the same static buffers
and statuses, each "replay" running the recorded function eagerly: what the tests compare
with the eager path on CPU tensors, everything but the capture itself.
"""
from __future__ import annotations

import contextlib

import torch

from torchrl_compat.samplers._device import draw_nonblocking, update_priority_nonblocking
from torchrl_compat._torch_ops.sumtree import _TorchMinSegmentTree, _TorchSumSegmentTree

__all__ = ["GraphedPriorityOps"]


class _StatusSink:
    """Stands in for a tree's checks while a call is recorded: each status goes into one
    device tensor ``[code, position, value]``, which keeps the first failed one."""

    def __init__(self, status: torch.Tensor) -> None:
        self.status = status
        self.describe = None

    def raise_ready(self) -> None:
        """Nothing to raise while recording: the caller raised the earlier calls' errors."""

    def record(self, status: torch.Tensor, describe) -> None:
        self.describe = describe
        self.status.copy_(torch.where(self.status[0] != 0, self.status, status.to(self.status.dtype)))


class _Recorded:
    """One recorded call: its static inputs, the status its checks write, its outputs, and
    how to run it again (a CUDA graph's replay, or the recorded function itself)."""

    def __init__(self, inputs: tuple, status: torch.Tensor, describe, outputs, replay) -> None:
        self.inputs = inputs
        self.status = status
        self.describe = describe
        self.outputs = outputs
        self.replay = replay


class GraphedPriorityOps:
    """``update_priority_nonblocking`` and ``draw_nonblocking`` on one pair of torch-op
    trees, each fixed shape recorded once as a CUDA graph and replayed after.

    Args:
        sum_tree, min_tree: the sampler's trees (see :mod:`torchrl_compat._torch_ops.sumtree`), on one device.

    Keyword Args:
        eps (float): added to every priority before the power.
        alpha (float): the power.
        beta (float): the importance weights' exponent.
        capture (bool, optional): record CUDA graphs. Defaults to ``True`` on a CUDA device
            and ``False`` elsewhere, where each "replay" runs the recorded call eagerly.

    A shape is recorded at its first call, which runs the eager function (its result is the
    call's) and then records the same call into a graph; later calls of that shape copy their
    input into the graph's and replay it. An update is recorded per ``(count, priority shape,
    priority dtype)``, a draw per ``(batch size, num_valid)``.

    Examples:
        >>> import torch
        >>> from torchrl_compat._torch_ops.sumtree import TorchMinSegmentTreeFp32, TorchSumSegmentTreeFp32
        >>> from torchrl_compat.samplers._device import initial_max_priority
        >>> sum_tree, min_tree = TorchSumSegmentTreeFp32(64), TorchMinSegmentTreeFp32(64)
        >>> ops = GraphedPriorityOps(sum_tree, min_tree, eps=1e-8, alpha=0.7, beta=0.5)
        >>> highest = ops.update(torch.arange(64), torch.rand(64) + 0.1, initial_max_priority("cpu"))
        >>> index, weight = ops.draw(64, torch.rand(8))
        >>> index.shape, bool((weight > 0).all())
        (torch.Size([8]), True)
    """

    def __init__(
        self,
        sum_tree: _TorchSumSegmentTree,
        min_tree: _TorchMinSegmentTree,
        *,
        eps: float,
        alpha: float,
        beta: float,
        capture: bool | None = None,
    ) -> None:
        if sum_tree.device != min_tree.device or sum_tree.capacity != min_tree.capacity:
            raise ValueError(
                f"the trees must share a device and a capacity, got {sum_tree.device} / "
                f"{min_tree.device} and {sum_tree.capacity} / {min_tree.capacity}"
            )
        on_cuda = sum_tree.device.type == "cuda"
        if capture is None:
            capture = on_cuda
        if capture and not on_cuda:
            raise ValueError(f"capture=True needs trees on a CUDA device, got {sum_tree.device}")
        self.sum_tree, self.min_tree = sum_tree, min_tree
        self.eps, self.alpha, self.beta = eps, alpha, beta
        self.capture = capture
        self._recorded: dict[tuple, _Recorded] = {}
        # The largest-priority pair every update graph of one dtype reads and writes.
        self._highest: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._stores = (sum_tree._leaf_store, min_tree._leaf_store)

    # ----------------------------------------------------------------- the two calls
    def update(self, index: torch.Tensor, priority: torch.Tensor, max_priority):
        """:func:`update_priority_nonblocking` (``eps`` and ``alpha`` of this object): stores
        ``(priority + eps) ** alpha`` at ``index`` in both trees and returns the new
        largest-priority pair (this object's own tensors, updated in place by later updates)."""
        key = self._update_key(index, priority)
        if key is None:
            return update_priority_nonblocking(
                self.sum_tree, self.min_tree, index, priority, max_priority, eps=self.eps, alpha=self.alpha
            )
        recorded = self._recorded.get(key)
        if recorded is None:
            result = update_priority_nonblocking(
                self.sum_tree, self.min_tree, index, priority, max_priority, eps=self.eps, alpha=self.alpha
            )
            highest = self._highest_state(result)
            self._recorded[key] = self._record(
                (index.clone(), priority.clone()),
                lambda inputs: self._update_body(inputs, highest),
                outputs=highest,
            )
            return highest
        self.sum_tree._checks.raise_ready()
        index_in, priority_in = recorded.inputs
        highest = recorded.outputs
        if max_priority[0] is not highest[0]:
            highest[0].copy_(max_priority[0])
        if max_priority[1] is not highest[1]:
            highest[1].copy_(max_priority[1])
        index_in.copy_(index)
        priority_in.copy_(priority)
        self._replay(recorded)
        self.sum_tree._invalidate()
        self.min_tree._invalidate()
        return highest

    def draw(self, num_valid: int, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`draw_nonblocking` (``beta`` of this object): ``(index, weight)`` of
        prioritized draws among the first ``num_valid`` items, as new tensors."""
        num_valid = int(num_valid)
        key = self._draw_key(num_valid, uniform)
        if key is None:
            return draw_nonblocking(self.sum_tree, self.min_tree, num_valid, self.beta, uniform)
        recorded = self._recorded.get(key)
        if recorded is None:
            result = draw_nonblocking(self.sum_tree, self.min_tree, num_valid, self.beta, uniform)
            self._recorded[key] = self._record(
                (uniform.clone(),), lambda inputs: self._draw_body(inputs, num_valid)
            )
            return result
        self.sum_tree._checks.raise_ready()
        recorded.inputs[0].copy_(uniform)
        self._replay(recorded)
        index, weight = recorded.outputs
        return index.clone(), weight.clone()

    def check_errors(self) -> None:
        """Waits for the device checks of earlier calls and raises the first failed one (a
        host synchronisation: for explicit checks, not for the hot path)."""
        self.sum_tree.check_errors()

    # ----------------------------------------------------------------- recorded functions
    def _update_body(self, inputs, highest):
        index, priority = inputs
        new = update_priority_nonblocking(
            self.sum_tree, self.min_tree, index, priority, highest, eps=self.eps, alpha=self.alpha
        )
        highest[0].copy_(new[0])
        highest[1].copy_(new[1])
        return highest

    def _draw_body(self, inputs, num_valid: int):
        return draw_nonblocking(self.sum_tree, self.min_tree, num_valid, self.beta, inputs[0])

    # ----------------------------------------------------------------- keys
    def _current(self) -> bool:
        """Whether the trees still hold the tensors the recorded calls read (a tree loaded from
        a state dict or moved reallocates them): if not, every recording is dropped."""
        if self._stores[0] is self.sum_tree._leaf_store and self._stores[1] is self.min_tree._leaf_store:
            return True
        self._recorded.clear()
        self._highest.clear()
        self._stores = (self.sum_tree._leaf_store, self.min_tree._leaf_store)
        return False

    def _update_key(self, index, priority):
        """The recording of an update like this one, or ``None`` for the eager path (what the
        eager path refuses, raises there; an empty update changes nothing)."""
        self._current()
        device = self.sum_tree.device
        if not (
            isinstance(index, torch.Tensor) and isinstance(priority, torch.Tensor)
            and index.ndim == 1 and index.dtype == torch.long and index.numel() > 0
            and priority.is_floating_point() and priority.numel() in (1, index.numel())
            and index.device == device and priority.device == device
        ):
            return None
        return ("update", index.numel(), tuple(priority.shape), priority.dtype)

    def _draw_key(self, num_valid: int, uniform):
        self._current()
        if not (
            isinstance(uniform, torch.Tensor) and uniform.is_floating_point()
            and uniform.device == self.sum_tree.device and uniform.numel() > 0 and num_valid > 0
        ):
            return None
        return ("draw", tuple(uniform.shape), uniform.dtype, num_valid)

    def _highest_state(self, result):
        """This object's largest-priority pair for the dtype of ``result``, set to it."""
        highest = self._highest.get(result[0].dtype)
        if highest is None:
            highest = self._highest[result[0].dtype] = (result[0].clone(), result[1].clone())
        else:
            highest[0].copy_(result[0])
            highest[1].copy_(result[1])
        return highest

    # ----------------------------------------------------------------- recording
    @contextlib.contextmanager
    def _statuses_to(self, sink: _StatusSink):
        saved = self.sum_tree._checks, self.min_tree._checks
        self.sum_tree._checks = self.min_tree._checks = sink
        try:
            yield
        finally:
            self.sum_tree._checks, self.min_tree._checks = saved

    def _record(self, inputs: tuple, body, outputs=None) -> _Recorded:
        """Records ``body(inputs)`` (the eager call of the same shape has just run): returns
        what replays it, and its outputs (``outputs``, when the body writes into them)."""
        status = torch.zeros(3, dtype=torch.float64, device=self.sum_tree.device)
        sink = _StatusSink(status)

        def recorded_call():
            status.zero_()
            return body(inputs)

        with self._statuses_to(sink):
            if not self.capture:
                # Once now (an update writes what the eager call wrote: the same again), to
                # learn the outputs and the function that describes a failed status; each
                # replay then writes its results into these outputs, as a graph's replay does.
                result = recorded_call()
                outputs = outputs or tuple(t.clone() for t in result)

                def replay():
                    for output, result in zip(outputs, recorded_call()):
                        if output is not result:
                            output.copy_(result)

                return _Recorded(inputs, status, sink.describe, outputs, replay)
            # torch's recipe: a warm-up on a side stream (lazy initialisations stay out of
            # the graph), then the capture, which runs nothing.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                recorded_call()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                result = recorded_call()
        self.sum_tree._invalidate()
        self.min_tree._invalidate()
        return _Recorded(inputs, status, sink.describe, outputs or result, graph.replay)

    def _replay(self, recorded: _Recorded) -> None:
        if self.capture:
            recorded.replay()
        else:
            sink = _StatusSink(recorded.status)
            with self._statuses_to(sink):
                recorded.replay()
        # The call's status reaches the host as an eager call's does (read at a later call).
        # On CUDA it is copied from the device at once; on CPU the queue keeps the tensor
        # itself, which the next replay would overwrite.
        status = recorded.status if self.capture else recorded.status.clone()
        self.sum_tree._checks.record(status, recorded.describe)
