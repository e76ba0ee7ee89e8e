"""Where torch.compile meets a replay buffer: the buffer's calls run as opaque eager blocks.

A buffer call does host-side bookkeeping (cursors, lengths, journals, locks) around a few
copies. Traced, that bookkeeping is what costs: dynamo guards on every counter it reads and
recompiles as they change, and breaks the graph wherever a counter lives in shared memory.
So a buffer's ``add`` / ``extend`` / ``sample`` reached from a compiled function run
outside the graph, as one call each: under compile they cost what they cost eagerly, plus
dynamo's frame switch (a few microseconds), and never recompile.
"""
from __future__ import annotations

import functools

try:
    from torch.compiler import disable as compile_disable, is_compiling
except ImportError:  # pragma: no cover - torch < 2.3
    from torch._dynamo import disable as compile_disable, is_compiling

try:
    from torch._C._dynamo.eval_frame import get_eval_frame_callback as _eval_frame_callback
except ImportError:  # pragma: no cover - older torch: assume dynamo may be watching

    def _eval_frame_callback():
        return True


__all__ = ["compile_disable", "dynamo_active", "is_compiling", "opaque_to_compile"]


def dynamo_active() -> bool:
    """Whether dynamo may intercept the frames called from here: while it traces, and while
    it runs a compiled function's frames eagerly (after a graph break), whose callees it
    would compile on their own. False in plain eager code and inside a disabled block."""
    return is_compiling() or _eval_frame_callback() is not None


def opaque_to_compile(method):
    """Runs a buffer ``method`` reached from a compiled function eagerly, outside the graph
    (a graph break at the call, no tracing into its callees, even where dynamo runs the
    calling frame eagerly); plain eager calls go straight to it."""
    disabled = compile_disable()(method)

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        if dynamo_active():
            return disabled(*args, **kwargs)
        return method(*args, **kwargs)

    return wrapper
