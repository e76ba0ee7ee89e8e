"""demo.py runs (in its fast mode) with torchrl and without it, and keeps log lines out."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A fresh interpreter in which `import torchrl` fails as it does where torchrl is not installed.
_BLOCK_TORCHRL = textwrap.dedent(
    """
    import runpy, sys

    class BlockTorchrl:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "torchrl":
                raise ModuleNotFoundError(f"No module named {name!r}")

    sys.meta_path.insert(0, BlockTorchrl())
    sys.argv = ["demo.py", "--fast"]
    runpy.run_path("demo.py", run_name="__main__")
    """
)

RATIO = r"x\d+\.\d\s*\(x\d+\.\d-x\d+\.\d\)"


def _run_demo(*args):
    env = dict(os.environ, PYTHONPATH=ROOT, RL_LOGGING_LEVEL="INFO")
    env.pop("TORCHRL_COMPAT_INSTALL_TREES", None)
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # torchrl's INFO lines (with colour escapes) never reach the output
    assert "\x1b[" not in proc.stdout + proc.stderr
    assert "[torchrl]" not in proc.stdout + proc.stderr
    return proc.stdout


def _line(out, name):
    lines = [line for line in out.splitlines() if line.strip().startswith(name)]
    assert len(lines) == 1, (name, out)
    return lines[0]


def test_demo_with_torchrl():
    pytest.importorskip("torchrl")
    out = _run_demo("demo.py", "--fast")
    assert "one intra-op thread (torch.set_num_threads(1))" in out
    for name in ("full permutation", "find_start_stop_traj", "SliceSampler.sample after a write",
                 "PrioritizedSliceSampler.sample after a write"):
        assert re.search(RATIO, _line(out, name)), _line(out, name)
    assert "training loop [" + "#" * 30 + "]" in out
    assert re.search(r"ours\s+\d+ steps/s", out) and re.search(r"torchrl\s+\d+ steps/s", out)
    assert re.search(r"ours / torchrl: " + RATIO, out)
    assert "needs torchrl" not in out


def test_demo_without_torchrl():
    out = _run_demo("-c", _BLOCK_TORCHRL)
    assert "no torchrl" in out.splitlines()[0]
    # our side still runs and is timed; the reference side is named as skipped
    assert re.search(r"\d+\.\d us\s+\(no reference: needs torchrl\)", _line(out, "find_start_stop_traj"))
    assert re.search(RATIO, _line(out, "full permutation"))  # torch.randperm needs no torchrl
    skipped = out.split("Skipped here:")[1]
    assert "find_start_stop_traj, reference side: needs torchrl" in skipped
    assert "PrioritizedSliceSampler.sample after a write, reference side: needs torchrl" in skipped
    import torchrl_compat

    if hasattr(torchrl_compat, "TensorDictPrioritizedReplayBuffer"):
        assert re.search(r"ours\s+\d+ steps/s", out)
        assert "training loop, reference side: needs torchrl" in skipped
    else:
        assert "prioritized training loop: needs torchrl" in skipped
