"""Smoke test of an installed wheel, run as a script (not collected by pytest).

``make wheel`` runs it in a fresh environment that installs the repaired wheel and nothing
built (``pip install --only-binary :all:``); ``cibuildwheel`` runs it after each wheel it
builds (``[tool.cibuildwheel]`` in pyproject.toml). It checks that every module comes from the
installed distribution, never from a source tree, and that the compiled kernels answer: the
trees, a permutation and a row gather on numpy arrays, then
``torchrl_compat``'s prioritized buffer where torch is installed.
"""
import importlib.metadata
import os
import sys

import numpy as np

DISTRIBUTION = "replay-torchrl-compat"


def check_installed(module, site) -> None:
    path = os.path.realpath(module.__file__)
    assert path.startswith(site + os.sep), f"{module.__name__} comes from {path}, not from {site}"


def check_kernels(replay) -> None:
    values = np.array([0.5, 0.0, 2.0, 1.5, 3.0, 0.25, 0.75, 1.0])
    for tree_class, dtype in ((replay.SumSegmentTreeFp32, np.float32), (replay.SumSegmentTreeFp64, np.float64)):
        tree = tree_class(len(values))
        tree[np.arange(len(values))] = values.astype(dtype)
        assert tree.query(0, len(values)) == values.sum()
        assert tree.scan_lower_bound(np.array([0.1, 2.6, 8.9])).tolist() == [0, 3, 7]
    low = replay.MinSegmentTreeFp64(len(values))
    low[np.arange(len(values))] = values
    assert low.query(0, len(values)) == 0.0
    # the same seed gives the same permutation on every platform (Lemire's draws, xoshiro256**)
    perm = replay._py_randperm(1000, 7)
    assert sorted(perm.tolist()) == list(range(1000))
    assert np.array_equal(perm, replay._py_randperm(1000, 7))
    rows = np.arange(40, dtype=np.float64).reshape(10, 4)
    (taken,) = replay.take_rows([rows], np.array([7, 0, 7]))
    assert np.array_equal(taken, rows[[7, 0, 7]])


def check_buffer() -> None:
    import torch

    from torchrl_compat import LazyTensorStorage, PrioritizedReplayBuffer

    buffer = PrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(100), batch_size=16)
    index = buffer.extend(torch.arange(50.0))
    buffer.update_priority(index, torch.rand(50) + 0.1)
    sample, info = buffer.sample(return_info=True)
    assert sample.shape == (16,) and info["index"].max() < 50


def main() -> None:
    distribution = importlib.metadata.distribution(DISTRIBUTION)
    site = os.path.realpath(str(distribution.locate_file("")))
    import replay
    import torchrl_compat_trees

    for module in (replay, torchrl_compat_trees):
        check_installed(module, site)
    check_kernels(replay)
    assert os.path.isfile(os.path.join(site, "torchrl_compat_trees.pth")), "the start-up hook is missing"
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"{DISTRIBUTION} {distribution.version}: kernels ok (no torch here: torchrl_compat not run)")
        return
    import torchrl_compat

    check_installed(torchrl_compat, site)
    check_buffer()
    print(f"{DISTRIBUTION} {distribution.version} on Python {sys.version.split()[0]}: kernels and buffer ok")


if __name__ == "__main__":
    main()
