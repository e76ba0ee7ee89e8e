"""Runs mutants in one process through mutmut's trampoline, each against the tests mutmut's
stats run lists for its function (fastest first, ``-x``), with a time limit. A run past the
limit is recorded as ``timeout``, not as killed. Used where ``mutmut run``'s forked workers sit
idle until their time limit (see ``tests/MUTATION.md``).

Run from mutmut's ``mutants/`` directory, once a ``mutmut run`` has made it and its
``mutmut-stats.json``::

    python tests/mutation/trampoline.py MODULE OUT.jsonl [--tests T... | --extra T...] -- NAMES...

``MODULE`` is the mutated module (``torchrl_compat.storages.tensor``), ``NAMES`` the mutants'
names within it (``xǁTensorStorageǁget__mutmut_7``). ``--tests`` replaces the stats' tests;
``--extra`` runs the given tests first. One JSON line per mutant is appended to ``OUT.jsonl``, and
a rerun skips the mutants already there. The run with no mutant comes first: it must pass.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import time
import tomllib


class _Timeout(BaseException):
    """Raised by the alarm; a BaseException, so that no test's ``except Exception`` eats it."""


def _pytest_arguments() -> list[str]:
    """mutmut's own pytest arguments from pyproject.toml (the profile and the deselections)."""
    with open("pyproject.toml", "rb") as file:
        config = tomllib.load(file)["tool"]["mutmut"]
    return ["-x", "-q", "-p", "no:randomly", *config["pytest_add_cli_args"]]


def _split(argv: list[str]) -> tuple[str, str, list[str] | None, list[str], list[str]]:
    module, out_path, rest = argv[0], argv[1], argv[2:]
    options, names = rest[: rest.index("--")], rest[rest.index("--") + 1 :]
    fixed = options[1:] if options[:1] == ["--tests"] else None
    extra = options[1:] if options[:1] == ["--extra"] else []
    return module, out_path, fixed, extra, names


def main(argv: list[str]) -> None:
    import pytest

    module, out_path, fixed, extra, names = _split(argv)
    with open("mutmut-stats.json") as file:
        stats = json.load(file)
    tests_of, duration = stats["tests_by_mangled_function_name"], stats["duration_by_test"]
    arguments = _pytest_arguments()

    alarms = []

    def on_alarm(signum, frame):
        # pytest reports the exception as the running test's failure: the note says why
        alarms.append(time.time())
        raise _Timeout()

    signal.signal(signal.SIGALRM, on_alarm)
    done = set()
    if os.path.exists(out_path):
        with open(out_path) as file:
            done = {json.loads(line)["name"] for line in file}
    with open(out_path, "a") as out:
        for name in [""] + names:  # "": the run with no mutant
            if name in done:
                continue
            function = (name or names[0]).rsplit("__mutmut_", 1)[0]
            listed = sorted(tests_of.get(f"{module}.{function}", []), key=lambda t: duration.get(t, 1.0))
            tests = fixed or extra + listed
            if not tests:
                out.write(json.dumps({"name": name, "status": "no tests"}) + "\n")
                continue
            limit = int(max(60, 8 * sum(duration.get(t, 1.0) for t in tests) + 30))
            if name:
                os.environ["MUTANT_UNDER_TEST"] = f"{module}.{name}"
            else:
                os.environ.pop("MUTANT_UNDER_TEST", None)
            started, printed = time.time(), io.StringIO()
            alarms.clear()
            signal.alarm(limit)
            try:
                with contextlib.redirect_stdout(printed):
                    code = int(pytest.main(arguments + tests))
            except _Timeout:
                code = -24
            finally:
                signal.alarm(0)
            timed_out = bool(alarms)
            lines = [line for line in printed.getvalue().splitlines() if line.strip()]
            failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
            status = "timeout" if timed_out else {0: "survived", 1: "killed"}.get(code, f"rc={code}")
            detail = (failed[:1] or lines[-1:] or [""])[0][:200]
            seconds = round(time.time() - started, 1)
            print(f"{name or '(none)'}: {status} {seconds}s | {detail}", file=sys.stderr, flush=True)
            if not name:
                if status != "survived":
                    raise SystemExit(f"the run with no mutant did not pass: {detail}")
                continue
            out.write(json.dumps({"name": name, "status": status, "secs": seconds, "detail": detail}) + "\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
