"""One memmap cleanup registry: ours is torchrl's when torchrl is importable.

Each scenario runs in a fresh interpreter (all of them at once, to keep the suite fast):
storages of both libraries with ``auto_cleanup=True`` write files in their own ``scratch_dir``,
then the process exits, is stopped by a signal, or calls one library's cleanup function.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers.storages as trl

import torchrl_compat.storages as ours
from torchrl_compat import _directory_cleanup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 120

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    sys.path.insert(0, {root!r})
    import torch
    from tensordict import TensorDict
    import torchrl.data.replay_buffers.storages as trl
    import torchrl_compat.storages as ours
    from torchrl_compat import _directory_cleanup

    order, stop, tmp = sys.argv[1:4]
    libs = {{"torchrl": trl, "ours": ours}}
    data = TensorDict({{"obs": torch.zeros(2, 3)}}, [2])

    def make(prefix):
        storages = {{}}
        for name in order.split(",") if order else ():
            path = os.path.join(tmp, prefix + name)
            storages[name] = libs[name].LazyMemmapStorage(4, scratch_dir=path, auto_cleanup=True)
            storages[name].set(range(2), data)
        return storages

    def wait_for_a_signal():
        # not signal.pause(): a signal landing just before it blocks would wait for another
        while True:
            time.sleep(0.05)

    def exists(storages):
        return {{name: os.path.exists(s.scratch_dir) for name, s in storages.items()}}

    storages = make("")
    print("REPORT", json.dumps({{
        "dirs": {{name: s.scratch_dir for name, s in storages.items()}},
        "shared_registry": ours._MEMMAP_STORAGE_REGISTRY is trl._MEMMAP_STORAGE_REGISTRY,
        "registered": {{name: s in ours._MEMMAP_STORAGE_REGISTRY for name, s in storages.items()}},
    }}), flush=True)
    if stop == "signal":
        wait_for_a_signal()
    elif stop == "fork":
        # a forked child inherits the registry and both libraries' handlers; stopping it
        # removes its own files, not its parent's
        import multiprocessing as mp

        def child(queue):
            own = ours.LazyMemmapStorage(4, scratch_dir=os.path.join(tmp, "child"), auto_cleanup=True)
            own.set(range(2), data)
            queue.put(own.scratch_dir)
            wait_for_a_signal()

        context = mp.get_context("fork")
        queue = context.Queue()
        process = context.Process(target=child, args=(queue,))
        process.start()
        child_dir = queue.get(timeout=60)
        process.terminate()
        process.join(60)
        print("AFTER", json.dumps([
            {{"exitcode": process.exitcode, "child": os.path.exists(child_dir)}},
            exists(storages),
        ]), flush=True)
    elif stop == "functions":
        # each library's cleanup function alone, on storages of both
        trl._cleanup_all_memmap_storages()
        after_torchrl = exists(storages)
        storages = make("again-")
        _directory_cleanup._cleanup_all()
        print("AFTER", json.dumps([after_torchrl, exists(storages)]), flush=True)
        os._exit(0)  # no exit hooks: only the functions' work counts
    """
)

# name -> (order of creation, how the process ends, signal, standalone)
SCENARIOS = {
    "exit": ("ours,torchrl", "exit", None, False),
    "sigterm": ("torchrl,ours", "signal", signal.SIGTERM, False),
    "sigint": ("ours,torchrl", "signal", signal.SIGINT, False),
    "each library's cleanup function": ("torchrl,ours", "functions", None, False),
    "forked child stopped, then exit": ("ours,torchrl", "fork", None, False),
    "standalone, exit": ("ours", "exit", None, True),
    "standalone, sigterm": ("ours", "signal", signal.SIGTERM, True),
}
# The same libraries imported, no storage made (no cleanup handler chained): how this
# interpreter ends on SIGINT by itself, which the scenarios must not change.
BASELINE = "no storage, sigint"
RUNS = {**SCENARIOS, BASELINE: ("", "signal", signal.SIGINT, False)}


def _expected_code(outcomes, sig):
    if sig is None:
        return 0
    if sig == signal.SIGINT:
        return outcomes[BASELINE][1]  # -SIGINT: Python re-raises an uncaught KeyboardInterrupt
    return -sig


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Runs every scenario at once; returns name -> (report, exit code, what the cleanup
    functions left, stderr)."""
    script = SCRIPT.format(root=ROOT)
    processes = {}
    for name, (order, stop, _, standalone) in RUNS.items():
        env = dict(os.environ, TORCHRL_COMPAT_STANDALONE="1" if standalone else "0")
        tmp = tmp_path_factory.mktemp("cleanup")
        stderr = open(tmp / "stderr", "w+")
        process = subprocess.Popen(
            [sys.executable, "-c", script, order, stop, str(tmp)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            # a session of its own: the watchdog stops the forked child too, which holds
            # the stdout pipe open (the reads below would wait on it for ever)
            start_new_session=True,
        )
        processes[name] = (process, stderr)
    watchdog = threading.Timer(TIMEOUT, lambda: [_kill_group(p) for p, _ in processes.values()])
    watchdog.start()
    results = {}
    try:
        for name, (process, stderr) in processes.items():
            report = None
            for line in process.stdout:  # library log lines may come first
                if line.startswith("REPORT "):
                    report = json.loads(line[len("REPORT ") :])
                    break
            sig = RUNS[name][2]
            if sig is not None and report is not None:
                process.send_signal(sig)
            after = [line[len("AFTER ") :] for line in process.stdout if line.startswith("AFTER ")]
            process.wait()
            stderr.seek(0)
            err = stderr.read()
            assert report is not None, err
            results[name] = (report, process.returncode, json.loads(after[0]) if after else None, err)
    finally:
        watchdog.cancel()
        for process, stderr in processes.values():
            _kill_group(process)
            stderr.close()
    return results


def _kill_group(process):
    """Kills what is left of ``process``'s session (it, and a child it forked)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _exists(report):
    return {name: os.path.exists(path) for name, path in report["dirs"].items()}


def test_baseline_ends_as_python_does_on_sigint(outcomes):
    report, code, _, err = outcomes[BASELINE]
    assert report["registered"] == {} and code in (-signal.SIGINT, 1), err
    assert "KeyboardInterrupt" in err


@pytest.mark.parametrize("name", [n for n, s in SCENARIOS.items() if not s[3]])
def test_one_registry_for_both_libraries(outcomes, name):
    report, code, after, err = outcomes[name]
    assert report["shared_registry"] and report["registered"] == {"ours": True, "torchrl": True}
    assert code == _expected_code(outcomes, SCENARIOS[name][2]), err
    if SCENARIOS[name][1] == "functions":
        # one library's function removed the files of both libraries' storages
        assert after == [{"ours": False, "torchrl": False}] * 2
    if SCENARIOS[name][1] == "fork":
        # the child's files went with it; ours stayed (torchrl's handler, inherited by the
        # child, removes torchrl's storage's files: torchrl's behaviour)
        assert after[0] == {"exitcode": -signal.SIGTERM, "child": False}
        assert after[1]["ours"] is True
    assert _exists(report) == {"ours": False, "torchrl": False}


@pytest.mark.parametrize("name", [n for n, s in SCENARIOS.items() if s[3]])
def test_standalone_keeps_its_own_registry(outcomes, name):
    report, code, last, err = outcomes[name]
    assert not report["shared_registry"] and report["registered"] == {"ours": True}
    assert code == _expected_code(outcomes, SCENARIOS[name][2]), err
    assert _exists(report) == {"ours": False}


def test_registered_where_torchrl_looks(tmp_path):
    assert ours._MEMMAP_STORAGE_REGISTRY is trl._MEMMAP_STORAGE_REGISTRY
    mine = ours.LazyMemmapStorage(4, scratch_dir=tmp_path / "mine", auto_cleanup=True)
    kept = ours.LazyMemmapStorage(4, scratch_dir=tmp_path / "kept")
    reference = trl.LazyMemmapStorage(4, scratch_dir=tmp_path / "ref", auto_cleanup=True)
    init = ours.LazyTensorStorage(4, shared_init=True)
    assert mine in trl._MEMMAP_STORAGE_REGISTRY and reference in trl._MEMMAP_STORAGE_REGISTRY
    assert kept not in trl._MEMMAP_STORAGE_REGISTRY
    # a shared_init LazyTensorStorage is represented by the cleanup of its init directory
    assert init._init_cleanup in trl._MEMMAP_STORAGE_REGISTRY
    path = init._init_directory
    del init
    assert not os.path.exists(path)


def test_cleanup_skips_what_another_process_created(tmp_path, monkeypatch):
    storage = ours.LazyMemmapStorage(4, scratch_dir=tmp_path / "s", auto_cleanup=True)
    storage.set(range(2), TensorDict({"obs": torch.zeros(2, 3)}, [2]))
    monkeypatch.setattr(storage, "_owner_pid", os.getpid() + 1)
    assert storage.cleanup() is False and os.path.isdir(tmp_path / "s")
    monkeypatch.setattr(storage, "_owner_pid", os.getpid())
    assert storage.cleanup() is True and not os.path.exists(tmp_path / "s")
    assert _directory_cleanup.remove_tree(tmp_path / "s") is False


def test_a_copy_leaves_the_files_to_the_original(tmp_path):
    import gc
    import pickle

    storage = ours.LazyMemmapStorage(4, scratch_dir=tmp_path / "s", auto_cleanup=True)
    storage.set(range(2), TensorDict({"obs": torch.zeros(2, 3)}, [2]))
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.cleanup() is False
    del copy
    gc.collect()
    assert os.path.isfile(tmp_path / "s" / "obs.memmap")
    init = _directory_cleanup.InitDirectoryCleanup(str(tmp_path / "init"))
    (tmp_path / "init").mkdir()
    assert pickle.loads(pickle.dumps(init)).cleanup() is False and (tmp_path / "init").is_dir()
    assert init.cleanup() is True and not (tmp_path / "init").exists()
    assert storage.cleanup() is True and not (tmp_path / "s").exists()
