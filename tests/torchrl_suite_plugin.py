"""A pytest plugin that runs torchrl's own replay-buffer test suites against torchrl_compat.

``make test-torchrl-suites`` runs torchrl's ``test/test_rb.py`` (0.11.0) and ``test/rb/`` (0.14)
with ``-p torchrl_suite_plugin``: every torchrl replay class is replaced by ours
(:func:`torchrl_compat.install`) before the suite imports torchrl, and the tests that fail for
torchrl itself, listed below with the reason, are expected to fail (``xfail``, not strict:
they may pass too). Anything else that fails is a failure of ours.
"""
from __future__ import annotations

import pytest

import torchrl_compat

torchrl_compat.install()

# node id (from the suite's folder) -> why torchrl's own classes fail it as well
TORCHRL_OWN_FAILURES = {
    # 0.14: the suite comes from the prepare-0.14 branch, a little ahead of the 0.14.1 wheel,
    # whose samplers package has no get_spawning_popen to patch
    "rb/test_writers.py::TestMultiProc::test_prioritized_sampler_shared_error_mentions_sync_false": (
        "torchrl 0.14.1's samplers package has no get_spawning_popen (the suite is ahead of the wheel)"
    ),
    # 0.11: asserts on exact draws of torch's global RNG, which depend on what ran before
    "test_rb.py::TestSamplers::test_sampler_without_rep_state_dict": (
        "passes in torchrl only for some seeds (exact draws of the global RNG)"
    ),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        # parametrized ids share their function's entry
        reason = TORCHRL_OWN_FAILURES.get(item.nodeid.split("[", 1)[0])
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=f"fails with torchrl's own classes: {reason}", strict=False))
