"""torchrl's own compiled segment trees: where they load.

They load only with the torch release torchrl was built against: torch 2.9 for torchrl 0.11,
torch 2.15 for torchrl 0.14.1 (make test-matrix); not with make test's torch 2.13, where
torchrl's samplers run on ``replay``'s trees.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys

import torchrl_compat_trees


@functools.lru_cache(maxsize=None)
def torchrl_trees_load() -> bool:
    """Whether torchrl's own compiled trees load with this torch, asked of a fresh interpreter
    in which nothing of ours is installed."""
    env = {k: v for k, v in os.environ.items()
           if k not in (torchrl_compat_trees.ENV_VAR, torchrl_compat_trees.INSTALL_ENV_VAR)}
    code = "from torchrl._torchrl import SumSegmentTreeFp32"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=300).returncode == 0
