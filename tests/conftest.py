import os
import random
import sys

import numpy as np
import pytest
import torch
from hypothesis import settings

# No per-example deadline (a shared 2-core CI machine is slow at times); in CI the examples
# are derived from the test names, so a run can be repeated exactly.
settings.register_profile("default", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(autouse=True)
def _seed_global_rngs():
    """Every test starts from the same global RNG states, so a statistical assertion on
    unseeded draws does not depend on which tests ran before it."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# `make test` runs the kernel tests a second time against a build with Cython's bounds and
# wrap-around checks on, placed in this directory (ahead of the in-place release build).
DEBUG_BUILD = os.environ.get("REPLAY_EXTENSION_DIR")
if DEBUG_BUILD:
    sys.path.insert(0, os.path.abspath(DEBUG_BUILD))
    import replay  # noqa: E402

    assert os.path.abspath(replay.__file__).startswith(os.path.abspath(DEBUG_BUILD)), replay.__file__


@pytest.fixture
def installed_package():
    """The package is installed in this interpreter (make setup: pip install -e .). Skipped
    where it is not, except in CI, whose make test installs it."""
    from importlib import metadata

    try:
        return metadata.distribution("replay")
    except metadata.PackageNotFoundError:
        if os.environ.get("CI"):
            raise AssertionError("the package is not installed, yet make test installs it") from None
        pytest.skip("the package is not installed in this interpreter (make setup installs it)")


@pytest.fixture
def ray_cluster():
    """The Ray cluster the Ray modules share (``tests/ray_support.py``), started on first use."""
    import ray_support

    return ray_support.cluster()


def pytest_runtest_teardown(item, nextitem):
    """The Ray cluster stops as the run leaves the Ray modules (their tests run one after the
    other: one cluster serves them all, and none idles through the rest of the suite)."""
    if "ray_support" not in sys.modules:
        return
    prefix = sys.modules["ray_support"].RAY_MODULE_PREFIX
    if nextitem is None or not os.path.basename(str(nextitem.fspath)).startswith(prefix):
        sys.modules["ray_support"].shutdown()
