"""Every code block in README.md runs as written.

Python blocks run one by one in a fresh interpreter, outside the clone, and every
``print(...)  # text`` line's text must appear in what the block prints. Shell blocks: ``make``
lines must name real targets (``make -n``), ``python -c`` lines run from another directory,
and the few lines that install from the network or into another environment are listed here.
"""
import os
import re
import subprocess
import sys

import pytest

import torchrl_compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

# Shell lines that download packages or build another environment: not run by the tests.
NOT_RUN = {
    "pip install replay-torchrl-compat",
    "pip install torch --index-url https://download.pytorch.org/whl/cpu",
    "pip install .",
    "python3 -m venv /opt/ref291",
    "/opt/ref291/bin/pip install torch==2.9.1 'tensordict>=0.11,<0.12' torchrl==0.11.0 numpy pytest pytest-benchmark",
    "/opt/ref291/bin/python -m pytest bench -q --benchmark-group-by=group",
    # the multi-machine recipe of RayReplayBuffer: one line per machine of a Ray cluster
    "ray start --head --port=6379",
    "ray start --address=HEAD_IP:6379",
}


def _blocks():
    """(language, first line number, source) of every fenced block; indented blocks are refused."""
    with open(README, encoding="utf-8") as file:
        lines = file.read().splitlines()
    blocks, inside, start, language, body = [], False, 0, "", []
    for number, line in enumerate(lines, 1):
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and not inside:
            inside, start, language, body = True, number, fence.group(1), []
        elif line.startswith("```") and inside:
            blocks.append((language, start, "\n".join(body) + "\n"))
            inside = False
        elif inside:
            body.append(line)
        elif line.startswith("    ") and number > 1 and not lines[number - 2].strip():
            raise AssertionError(f"README.md:{number}: an indented code block; fence it (```sh / ```python)")
    assert not inside, f"README.md:{start}: unclosed code block"
    return blocks


BLOCKS = _blocks()
PYTHON_BLOCKS = [(start, source) for language, start, source in BLOCKS if language == "python"]
SHELL_LINES = [
    (start, line.split("  #")[0].strip())
    for language, start, source in BLOCKS if language == "sh"
    for line in source.splitlines() if line.strip()
]


def test_every_block_has_a_language():
    assert PYTHON_BLOCKS and SHELL_LINES
    assert {language for language, _, _ in BLOCKS} == {"python", "sh"}


@pytest.mark.parametrize("start,source", PYTHON_BLOCKS, ids=[f"line{s}" for s, _ in PYTHON_BLOCKS])
def test_python_block_runs(start, source, tmp_path):
    if "RayReplayBuffer(" in source:
        pytest.importorskip("ray", reason="the Ray recipe needs ray (the [ray] extra)")
    # the multi-machine recipe runs on a local cluster of its own, its shared folder in tmp_path
    source = source.replace('{"address": "auto"}', '{"num_cpus": 2, "include_dashboard": False}')
    source = source.replace('"/shared/replay-recovery"', repr(str(tmp_path / "replay-recovery")))
    env = dict(os.environ, PYTHONPATH=ROOT, RL_WARNINGS="0")
    env.pop("TORCHRL_COMPAT_INSTALL_TREES", None)
    proc = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"README.md:{start}:\n{proc.stderr[-3000:]}"
    for expected in re.findall(r"print\(.*\)\s+#\s*(.+)$", source, flags=re.MULTILINE):
        expected = expected.split(": ...")[0].rstrip(". ")
        assert expected in proc.stdout, f"README.md:{start}: {expected!r} not in\n{proc.stdout}"


def test_shell_lines_are_known():
    runnable = {line for _, line in SHELL_LINES if line.split()[0] in ("make", "source", "python")}
    others = {line for _, line in SHELL_LINES} - runnable
    assert others == NOT_RUN


@pytest.mark.parametrize(
    "line", sorted({line for _, line in SHELL_LINES if line.startswith("make ")}),
)
def test_make_line_names_real_targets(line):
    proc = subprocess.run(["make", "-n", *line.split()[1:]], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "No rule to make target" not in proc.stderr


def test_python_line_runs_from_another_directory(installed_package, tmp_path):
    lines = [line for _, line in SHELL_LINES if line.startswith("python -c ")]
    assert lines
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    for line in lines:
        code = re.match(r'python -c "(.*)"$', line).group(1)
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # this clone's (pip install -e .), or the wheel's the tests run against (make test-matrix)
        assert os.path.realpath(proc.stdout.strip()) == os.path.realpath(torchrl_compat.__file__)


def test_activate_line_names_the_environment():
    lines = [line for _, line in SHELL_LINES if line.startswith("source ")]
    assert lines == ["source .venv/bin/activate"]
    # make creates .venv unless an environment is active; either way one has an activate script.
    venv = os.path.join(ROOT, ".venv")
    prefix = venv if os.path.isdir(venv) else sys.prefix
    assert os.path.isfile(os.path.join(prefix, "bin", "activate"))
