import os
import random
import sys

import numpy as np
import pytest
import torch
from hypothesis import Phase, settings

# No per-example deadline (a shared 2-core CI machine is slow at times); in CI the examples
# are derived from the test names, so a run can be repeated exactly.
settings.register_profile("default", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
# Mutation runs (pyproject.toml's [tool.mutmut] asks for it): a failing example is not shrunk,
# since shrinking a mutant's failure can outlast mutmut's time limit, which then counts a
# timeout where the test had already failed; and 25 examples, not 100, so that each of a
# module's hundreds of mutants runs in seconds (a mutant only a rarer example finds counts as
# a survivor: the score is a lower bound).
settings.register_profile(
    "mutation",
    deadline=None,
    derandomize=True,
    max_examples=25,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
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
    # ... with the kernels' plain C fallbacks, as MSVC builds them (REPLAY_PORTABLE=1)
    assert not replay._py_gnu_extensions(), "the debug build must force the portable kernels"


@pytest.fixture
def installed_package():
    """The package is installed in this interpreter (make setup: pip install -e .; make
    test-matrix: the wheel). Skipped where it is not, except in CI, whose make test installs it."""
    from importlib import metadata

    try:
        return metadata.distribution("replay-torchrl-compat")
    except metadata.PackageNotFoundError:
        if os.environ.get("CI"):
            raise AssertionError("the package is not installed, yet make test installs it") from None
        pytest.skip("the package is not installed in this interpreter (make setup installs it)")


# --------------------------------------------------------------------------- CUDA runs
# Every test that skips without a CUDA device carries a `skipif(..., reason="needs CUDA")` mark;
# each of them also gets the marker `cuda`, so that `-m cuda` selects exactly those.
# REPLAY_REQUIRE_CUDA=1 (bench/gpu_check.sh sets it on a GPU machine) turns a missing device
# into an error: the run stops at once when torch sees no CUDA device, and a test skipped for
# want of CUDA fails instead of passing as skipped.
REQUIRE_CUDA = os.environ.get("REPLAY_REQUIRE_CUDA", "0") == "1"
CUDA_SKIP_REASON = "needs CUDA"


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (set on every test skipped without one)")
    if REQUIRE_CUDA and not torch.cuda.is_available():
        raise pytest.UsageError(
            "REPLAY_REQUIRE_CUDA=1 says this run is on a GPU, but torch "
            f"{torch.__version__} sees no CUDA device (torch.version.cuda={torch.version.cuda})"
        )


def _needs_cuda(item) -> bool:
    return any(CUDA_SKIP_REASON in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _needs_cuda(item):
            item.add_marker(pytest.mark.cuda)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_CUDA and report.skipped and "CUDA" in str(report.longrepr):
        report.outcome = "failed"
        report.longrepr = f"skipped for want of CUDA on a GPU run (REPLAY_REQUIRE_CUDA=1): {report.longrepr}"


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
