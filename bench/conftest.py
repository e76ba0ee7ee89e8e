import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_report_header(config):
    """The versions each side runs on, and whose trees torchrl's prioritized samplers use."""
    import tensordict
    import torch

    lines = [f"torch {torch.__version__}, tensordict {tensordict.__version__}"]
    try:
        import torchrl
        import torchrl.data.replay_buffers.samplers as samplers
    except ImportError:
        return lines + ["torchrl: not installed"]
    own = samplers.SumSegmentTreeFp32 is not None
    lines.append(
        f"torchrl {torchrl.__version__}, prioritized side on "
        + ("torchrl's compiled trees" if own else "replay's trees (install_segment_trees(): torchrl's do not load here)")
    )
    return lines


# ------------------------------------------------------------------ equal rounds per group
#
# A group's ratios compare its sides' minimum (and median) times. A side given fewer rounds has
# fewer chances to reach its floor on a shared machine, so its minimum is biased up, and the ratio
# with it. Every side of a group therefore runs the same number of rounds: pytest-benchmark's
# automatic calibration (which gives a faster side more rounds) is replaced by a fixed count, and
# a ``pedantic`` call whose rounds differ from another side's in the same group is refused.

import time

import pytest

#: Rounds of a call timed with ``benchmark(fn)`` (no ``pedantic``), on every side alike.
CALIBRATED_ROUNDS = 500
#: Each round of such a call lasts at least this long (iterations are added to reach it), so the
#: timer's resolution does not weigh on calls of a few microseconds.
MIN_ROUND_SECONDS = 20e-6

_rounds_by_group: dict = {}


from pytest_benchmark.fixture import BenchmarkFixture


class _EqualRounds(BenchmarkFixture):
    """pytest-benchmark's fixture, holding every side of a group to the same rounds (the
    fixture below gives its instance this class: pytest-benchmark accepts only its own)."""

    def _claim(self, rounds):
        group = self.group or self._fallback_group
        first = _rounds_by_group.setdefault(group, (rounds, self.name))
        if first[0] != rounds:
            raise ValueError(
                f"benchmark group {group!r}: {self.name} asks for {rounds} rounds, "
                f"{first[1]} ran {first[0]}; every side of a group runs the same rounds"
            )

    def pedantic(self, target, args=(), kwargs=None, setup=None, teardown=None, rounds=1, warmup_rounds=0,
                 iterations=1):
        self._claim(rounds)
        return super().pedantic(target, args=args, kwargs=kwargs, setup=setup, teardown=teardown,
                                rounds=rounds, warmup_rounds=warmup_rounds, iterations=iterations)

    def __call__(self, function, *args, **kwargs):
        once = time.perf_counter()
        function(*args, **kwargs)
        once = time.perf_counter() - once
        iterations = int(MIN_ROUND_SECONDS / max(once, 1e-9)) + 1 if once < MIN_ROUND_SECONDS else 1
        return self.pedantic(function, args=args, kwargs=kwargs, rounds=CALIBRATED_ROUNDS,
                             warmup_rounds=2, iterations=iterations)


@pytest.fixture
def benchmark(benchmark, request):
    benchmark.__class__ = _EqualRounds
    benchmark._fallback_group = f"{request.node.module.__name__}::{request.node.originalname}"
    return benchmark
