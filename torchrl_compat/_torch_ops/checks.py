"""Checks made on an accelerator and raised on the host later, without waiting for them.

A check whose outcome lives on the device (is an index in range, is a priority finite) would
cost a host synchronisation if read at once. Instead the device writes a small status
tensor, which is copied into pinned host memory with ``non_blocking=True`` behind an event;
the host reads it at a later call, once the event reports that the copy is done. On CPU
tensors the status is already on the host and is read at the next call.
"""
from __future__ import annotations

import collections
from typing import Callable

import torch

__all__ = ["DeferredChecks", "STATUS_OK"]

STATUS_OK = 0


class DeferredChecks:
    """A queue of device-side statuses, raised in order once they reach the host.

    A status is a float64 tensor ``[code, position, value]`` (``code == 0``: nothing wrong);
    ``describe(code, position, value)`` turns a non-zero one into the exception to raise.

    Args:
        device (torch.device): where the statuses are computed.
    """

    def __init__(self, device: torch.device) -> None:
        self._device = torch.device(device)
        self._on_host = self._device.type == "cpu"
        self._pending: collections.deque = collections.deque()

    def record(self, status: torch.Tensor, describe: Callable[[int, int, float], Exception]) -> None:
        """Queues ``status`` (no host synchronisation)."""
        if self._on_host:
            self._pending.append((status, None, describe))
            return
        host = torch.empty(status.shape, dtype=status.dtype, pin_memory=True)
        host.copy_(status, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending.append((host, event, describe))

    def raise_ready(self) -> None:
        """Raises the first failed status among those that reached the host (without
        waiting for the others); all queued statuses are dropped when one fails."""
        pending = self._pending
        while pending:
            host, event, describe = pending[0]
            if event is not None and not event.query():
                return
            pending.popleft()
            # ``numpy()`` reads host memory directly: no device op, no synchronisation.
            code, position, value = host.numpy().tolist()
            if code != STATUS_OK:
                pending.clear()
                raise describe(int(code), int(position), value)

    def wait(self) -> None:
        """Waits for every queued status, then raises the first failed one (a
        synchronisation: for explicit checks, never on the hot path)."""
        for _, event, _ in self._pending:
            if event is not None:
                event.synchronize()
        self.raise_ready()

    def __len__(self) -> int:
        return len(self._pending)
