"""A watch over the torch calls a block makes, failing on any that would wait for an
accelerator: the proof, on CPU tensors, that a torch-op path makes no host synchronisation
when it runs on CUDA.

Two layers see every call: a ``TorchFunctionMode`` sees the Python-level tensor methods that
read device data on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``,
``float(t)``, ``int(t)``), which on CPU tensors never reach an aten op; a
``TorchDispatchMode`` sees the aten ops whose output needs device data on the host: a scalar
read (``_local_scalar_dense``, ``is_nonzero``, ``equal``), an output whose size depends on the
data (``nonzero``, ``masked_select``, ``unique``, boolean-mask indexing, ``repeat_interleave``
without ``output_size``), or a copy to another device without ``non_blocking``.
"""
from __future__ import annotations

import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_HOST_READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.cpu,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
}
_SYNCING_OPS = {
    "aten::_local_scalar_dense",
    "aten::is_nonzero",
    "aten::equal",
    "aten::allclose",
    "aten::nonzero",
    "aten::argwhere",
    "aten::masked_select",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::_assert_async",
}


def _where() -> str:
    """The innermost project line of the current stack (what made the call)."""
    for frame in reversed(traceback.extract_stack()):
        if "torchrl_compat" in frame.filename or "/tests/test_" in frame.filename:
            return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "?"


class _FunctionWatch(TorchFunctionMode):
    def __init__(self, found: list) -> None:
        super().__init__()
        self.found = found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS:
            self.found.append(f"Tensor.{func.__name__} at {_where()}")
        elif func is torch.Tensor.to and _to_other_device(args, kwargs):
            self.found.append(f"Tensor.to(another device) at {_where()}")
        return func(*args, **kwargs)


def _to_other_device(args, kwargs) -> bool:
    if kwargs.get("non_blocking"):
        return False
    tensor = args[0]
    for arg in (*args[1:], kwargs.get("device")):
        if isinstance(arg, (str, torch.device)) and torch.device(arg) != tensor.device:
            return True
    return False


class _DispatchWatch(TorchDispatchMode):
    def __init__(self, found: list, ops: list) -> None:
        super().__init__()
        self.found = found
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        self.ops.append(name)
        if name in _SYNCING_OPS:
            self.found.append(f"{name} at {_where()}")
        elif name in ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(i is not None and i.dtype == torch.bool for i in indices):
                self.found.append(f"{name} with a boolean mask at {_where()}")
        elif name == "aten::repeat_interleave" and kwargs.get("output_size") is None and (
            len(args) < 4 or args[3] is None
        ):
            self.found.append(f"aten::repeat_interleave without output_size at {_where()}")
        return func(*args, **kwargs)


class SyncWatch:
    """``with SyncWatch() as watch: ...``, then ``watch.found`` lists the syncing calls and
    ``watch.ops`` every aten op the block ran."""

    def __init__(self) -> None:
        self.found: list[str] = []
        self.ops: list[str] = []

    def __enter__(self):
        self._function = _FunctionWatch(self.found)
        self._dispatch = _DispatchWatch(self.found, self.ops)
        self._function.__enter__()
        self._dispatch.__enter__()
        return self

    def __exit__(self, *exc):
        self._dispatch.__exit__(*exc)
        self._function.__exit__(*exc)
        return False
