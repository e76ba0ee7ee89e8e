"""Dumps killed with SIGKILL at spread-out moments never lose the previous checkpoint.

A forked child writes version after version of a storage's content and dumps each to the same
path; the parent kills it at moments spread over a dump's duration. Whatever the moment, the
path then loads, with every item of one version: the one dumped before the kill or the one
being dumped. The partial directories of killed dumps are removed by the next dump, but never
the one a live concurrent dump is writing.

Where a kill lands does not depend on the machine's speed: the parent stops the child
(SIGSTOP) some time after it reports that a dump started (or ended), reads from shared memory
whether it is inside ``dumps``, and kills it only if that is the phase the trial wants (else
lets it go on and stops it again at a later dump). Two thirds of the kills land inside a dump,
the others while the child writes the next version.
"""
import multiprocessing as mp
import os
import shutil
import signal
import time

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers.storages as trl

import torchrl_compat.checkpointers as ck
import torchrl_compat.storages as ours
from torchrl_compat.checkpointers import _publish

CAPACITY = 4096
TRIALS = 8
TIMEOUT = 60
# stops of the child before a kill lands in the phase a trial wants (a dump is a large part of
# each version's time, so a few stops are usually enough): a guard, not a timing
MAX_STOPS = 500
FORK = mp.get_context("fork")
# the parent reads the child's state (stopped or not) from /proc
pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (Linux)")


def version_td(n, version):
    values = torch.full((n, 8), float(version))
    return TensorDict({"obs": values, ("next", "done"): values[:, :1] > 0, "v": values[:, 0].long()}, [n])


def length_of(version):
    return 2048 + 64 * (version % 16)


# -----------------------------------------------------------------------------
# one entry per kind of checkpoint: make, write version k, load, read the version back
# -----------------------------------------------------------------------------
class TensorDictCase:
    lib_classes = ("LazyTensorStorage",)

    def make(self, path, lib=ours):
        return lib.LazyTensorStorage(CAPACITY)

    def write(self, storage, version):
        n = length_of(version)
        storage._empty()
        storage.set(range(n), version_td(n, version))

    def fresh(self, path, lib):
        return self.make(path, lib)

    def version(self, storage):
        assert len(storage) == storage[:]["v"].shape[0]
        versions = storage[:]["v"].unique().tolist()
        assert len(versions) == 1, versions  # never mixed
        (version,) = versions
        assert len(storage) == length_of(version)
        assert bool((storage[:]["obs"] == version).all())
        return version


class PytreeCase(TensorDictCase):
    def write(self, storage, version):
        n = length_of(version)
        storage._empty()
        td = version_td(n, version)
        storage.set(range(n), {"obs": td["obs"], "v": [td["v"], (td["next", "done"],)], 7: td["v"] * 2})

    def fresh(self, path, lib):
        storage = self.make(path, lib)
        storage.set(0, {"obs": torch.zeros(8), "v": [torch.zeros((), dtype=torch.long), (torch.zeros(1, dtype=torch.bool),)], 7: torch.zeros((), dtype=torch.long)})
        return storage

    def version(self, storage):
        data = storage[:]
        versions = torch.cat([data["v"][0], data[7] // 2]).unique().tolist()
        assert len(versions) == 1, versions
        (version,) = versions
        assert len(storage) == length_of(version) and bool((data["obs"] == version).all())
        return version


class MemmapCase(TensorDictCase):
    def make(self, path, lib=ours):
        return lib.LazyMemmapStorage(CAPACITY, scratch_dir=path.parent / f"scratch-{os.getpid()}")

    def fresh(self, path, lib):
        return lib.LazyMemmapStorage(CAPACITY)


class MemmapInPlaceCase(TensorDictCase):
    """The storage lives in the checkpoint directory (its ``scratch_dir``): a dump links its
    files into the checkpoint, and each version rewrites the rows the previous checkpoint
    holds. A kill during a dump, or during the writes after it, must leave that checkpoint
    as it was published."""

    def make(self, path, lib=ours):
        return lib.LazyMemmapStorage(CAPACITY, scratch_dir=path)

    def fresh(self, path, lib):
        return lib.LazyMemmapStorage(CAPACITY)


class CompressedCase(TensorDictCase):
    def make(self, path, lib=ours):
        return lib.CompressedListStorage(64)

    def write(self, storage, version):
        n = 16 + version % 8
        storage._empty()
        storage.set(range(n), version_td(n, version).exclude("next"))

    def version(self, storage):
        versions = {int(storage[i]["v"]) for i in range(len(storage))}
        assert len(versions) == 1, versions
        (version,) = versions
        assert len(storage) == 16 + version % 8
        return version


class EnsembleCase(TensorDictCase):
    def make(self, path, lib=ours):
        return lib.StorageEnsemble(lib.LazyTensorStorage(CAPACITY), lib.LazyTensorStorage(CAPACITY))

    def write(self, storage, version):
        for sub in storage._storages:
            TensorDictCase.write(self, sub, version)

    def version(self, storage):
        versions = {TensorDictCase.version(self, sub) for sub in storage._storages}
        assert len(versions) == 1, versions
        return versions.pop()

    def load(self, storage, path):
        ck.StorageEnsembleCheckpointer.loads(storage, path)


CASES = {
    "tensordict": TensorDictCase(),
    "pytree": PytreeCase(),
    "memmap": MemmapCase(),
    "memmap in place": MemmapInPlaceCase(),
    "compressed": CompressedCase(),
    "ensemble": EnsembleCase(),
}
TORCHRL_READS = ("tensordict", "pytree", "memmap", "memmap in place", "compressed")


def _dump_versions(case, path, conn, dumping):
    """The child: versions 1, 2, ... each written, then dumped to ``path``. ``dumping`` holds
    the version being dumped while ``dumps`` runs, 0 otherwise."""
    torch.set_num_threads(1)  # a forked child must not enter the parent's OpenMP pool
    storage = case.make(path)
    version = 0
    while True:
        version += 1
        case.write(storage, version)
        conn.send(("start", version, time.monotonic()))
        dumping.value = version
        storage.dumps(path)
        dumping.value = 0
        conn.send(("done", version, time.monotonic()))


def _load(case, path, lib=ours):
    storage = case.fresh(path, lib)
    getattr(case, "load", lambda s, p: s.loads(p))(storage, path)
    return case.version(storage)


def _wait_stopped(pid):
    """Returns once process ``pid`` is stopped (state T in /proc), not reaping it."""
    for _ in range(TIMEOUT * 1000):
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state in ("T", "t"):
            return
        if state in ("Z", "X"):
            raise AssertionError(f"the dumping child {pid} exited (state {state})")
        time.sleep(0.001)
    raise AssertionError(f"the dumping child {pid} did not stop")


def kill_during(case, path, delays, version_to_kill, inside=True):
    """Runs the child until it dumps ``version_to_kill``; then, for each of ``delays`` in turn,
    waits for the child's next report that a dump started (``inside``) or ended (not
    ``inside``), stops it that many seconds later, and kills it there if it is inside a dump
    (``inside``) or outside one; else lets it go on. Returns (last version started, last
    version done, whether the kill landed inside a dump)."""
    parent, child = FORK.Pipe()
    dumping = FORK.Value("q", 0, lock=False)
    process = FORK.Process(target=_dump_versions, args=(case, path, child, dumping), daemon=True)
    process.start()
    started = done = 0
    anchor = "start" if inside else "done"

    def receive():
        nonlocal started, done
        assert parent.poll(TIMEOUT), "the dumping child stopped reporting"
        event, version, _ = parent.recv()
        if event == "start":
            started = version
        else:
            done = version
        return event, version

    try:
        for stops, delay in enumerate(delays):
            assert stops < MAX_STOPS, f"no stop of {MAX_STOPS} landed {'inside' if inside else 'outside'} a dump"
            while True:  # the newest report of the anchor event, from version_to_kill on
                event, version = receive()
                if event == anchor and version >= version_to_kill and not parent.poll():
                    break
            time.sleep(delay)
            os.kill(process.pid, signal.SIGSTOP)
            _wait_stopped(process.pid)
            in_dump = dumping.value != 0
            if in_dump == inside:
                os.kill(process.pid, signal.SIGKILL)
                break
            os.kill(process.pid, signal.SIGCONT)
        process.join(TIMEOUT)
        while parent.poll():
            receive()
    finally:
        if process.is_alive():
            process.kill()
            process.join(TIMEOUT)
    assert process.exitcode == -signal.SIGKILL
    return started, done, in_dump


def phase_durations(case, path):
    """How long a dump, and the write of a version between two dumps, take in the child (the
    medians of a few): the scales of the delays."""
    parent, child = FORK.Pipe()
    process = FORK.Process(target=_dump_versions, args=(case, path, child, FORK.Value("q", 0)), daemon=True)
    process.start()
    dumps, writes, last = [], [], None
    try:
        while len(dumps) < 5 or len(writes) < 5:
            assert parent.poll(TIMEOUT)
            event, _, at = parent.recv()
            if last is not None:
                (dumps if event == "done" else writes).append(at - last)
            last = at
    finally:
        process.kill()
        process.join(TIMEOUT)
    return sorted(dumps)[len(dumps) // 2], sorted(writes)[len(writes) // 2]


def spread_delays(duration, trial, trials):
    """The delays of one trial's stops after their anchor event: the first spread over
    ``duration`` by trial, the next ones anywhere in it (seeded, so a run repeats)."""
    np.random.seed(trial)
    yield duration * (trial + 0.5) / trials
    while True:
        yield duration * np.random.uniform()


def kill_spread(case, path, timing_path, trials, check):
    """Kills a child dumping ``case`` to ``path`` ``trials`` times, two thirds of them inside a
    dump and the others while it writes the next version, at moments spread over each phase;
    ``check(trial, started, done)`` after each kill (the last version started and the last
    one done)."""
    dump, write = phase_durations(case, timing_path)
    mid_dump = 0
    for trial in range(trials):
        inside = trial % 3 != 2
        delays = spread_delays(dump if inside else write, trial, trials)
        started, done, in_dump = kill_during(case, path, delays, version_to_kill=2 + trial % 3, inside=inside)
        assert in_dump == inside
        if in_dump:
            # killed inside dumps: the version it was dumping never reported done
            assert done < started, (trial, done, started)
            mid_dump += 1
        check(trial, started, done)
    assert mid_dump == len([t for t in range(trials) if t % 3 != 2])


@pytest.mark.parametrize("name", list(CASES))
def test_killed_dumps_keep_a_complete_checkpoint(tmp_path, name):
    case = CASES[name]
    path = tmp_path / "ckpt"

    def check(trial, started, done):
        for lib in (ours, trl) if name in TORCHRL_READS else (ours,):
            version = _load(case, path, lib)
            # the version dumped before the kill, or the one being dumped
            assert done <= version <= started, (trial, version, done, started)
        if name == "memmap in place":
            # the next child's live files start over from version 1
            shutil.rmtree(path)

    kill_spread(case, path, tmp_path / "timing", TRIALS, check)


def test_killed_dumps_leave_nothing_once_dumped_again(tmp_path):
    case = CASES["tensordict"]
    path = tmp_path / "ckpt"
    # (the timing dumps are killed at any moment: their partials stay inside "timing")
    (tmp_path / "timing").mkdir()
    dump, _ = phase_durations(case, tmp_path / "timing" / "ckpt")
    for trial in range(4):
        kill_during(case, path, spread_delays(dump, trial, 4), version_to_kill=2, inside=True)
    storage = case.make(path)
    case.write(storage, 9)
    storage.dumps(path)
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "timing"]
    assert _load(case, path) == 9


def dump_stopping_in_hook(make, path, conn, release):
    """Dumps what ``make()`` builds to ``path``, stopping in its save hook (while writing its
    partial directory, whose path it sends) until ``release`` is set."""
    torch.set_num_threads(1)  # a forked child must not enter the parent's OpenMP pool
    dumped = make()

    def hook(data, path=None):
        conn.send(str(path))
        release.wait(TIMEOUT)
        return data

    dumped.register_save_hook(hook)
    dumped.dumps(path)
    conn.send("done")


def _storage_of_version_5():
    storage = ours.LazyTensorStorage(CAPACITY)
    storage.set(range(4), version_td(4, 5))
    return storage


def test_next_dump_removes_killed_partials_but_not_a_live_one(tmp_path):
    path = tmp_path / "ckpt"
    parent, child = FORK.Pipe()
    # a live dump, stopped in the middle of writing
    release = FORK.Event()
    live = FORK.Process(target=dump_stopping_in_hook, args=(_storage_of_version_5, path, child, release), daemon=True)
    live.start()
    assert parent.poll(TIMEOUT)
    live_partial = parent.recv()
    # a dump killed while it writes (it left the live one alone): its partial stays
    never = FORK.Event()
    killed = FORK.Process(target=dump_stopping_in_hook, args=(_storage_of_version_5, path, child, never), daemon=True)
    killed.start()
    assert parent.poll(TIMEOUT)
    dead_partial = parent.recv()
    killed.kill()
    killed.join(TIMEOUT)
    assert {str(p) for p in _publish.partial_siblings(path)} == {dead_partial, live_partial}
    # this process dumps meanwhile: the dead partial goes, the live one stays
    storage = ours.LazyTensorStorage(CAPACITY)
    storage.set(range(3), version_td(3, 1))
    storage.dumps(path)
    assert [str(p) for p in _publish.partial_siblings(path)] == [live_partial]
    loaded = ours.LazyTensorStorage(CAPACITY)
    loaded.loads(path)
    assert loaded[:]["v"].tolist() == [1, 1, 1]
    # the live dump completes and publishes over it
    release.set()
    assert parent.poll(TIMEOUT) and parent.recv() == "done"
    live.join(TIMEOUT)
    assert live.exitcode == 0
    assert _publish.partial_siblings(path) == []
    loaded = ours.LazyTensorStorage(CAPACITY)
    loaded.loads(path)
    assert loaded[:]["v"].tolist() == [5] * 4
