"""How big can it go: a prioritized buffer on disk filled to ``--rows`` rows, its loops timed as it grows.

A ``TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyMemmapStorage(rows,
scratch_dir=...), batch_size=256)`` of small rows (16 uint8 of observation by default,
``--obs-bytes``, an int8 action, a float reward, an int32 episode id: 25 bytes) is filled by
extends of 2^16 rows of episodes of 1,000 steps. When the fill passes 2^20, 2^24, 2^27 and 2^30 rows (those below ``--rows``) and at
the end, it times ``--steps`` steps of two loops:

- prioritized: ``extend`` 1,024 rows, ``sample`` 256, ``update_tensordict_priority``;
- slices: ``sample`` 256 rows (8 slices of 32) through a ``SliceSampler(traj_key="episode")`` on
  the same storage, after the prioritized loop's writes.

Then ``dumps`` and ``loads`` (into a fresh buffer, once the first is gone) are timed; the storage
lives in the checkpoint's folder (``scratch_dir=<checkpoint>/storage``), so that ``dumps`` links
its files instead of copying them and ``loads`` reads them in place; the storage then moves out
of the published checkpoint into a copy of its own, so ``dumps`` needs the storage's size again
plus 16 bytes per row for the trees on the disk (it is skipped, and said so, when they are not
free). It prints the fill rate beside the
disk's write rate (1 GiB written and synced to the scratch directory first), the RSS, and each
time per step, and appends every figure to a CSV file (``--out``: library, capacity, rows
filled, measure, value, unit) that a plot of time per step against rows can be drawn from; runs
of several sizes and libraries go into one file.

    python bench/scale.py --rows 1073741824 --scratch-dir /big/disk --out bench/scale.csv
    python bench/scale.py --rows 134217728 --lib torchrl --out bench/scale.csv

``--lib torchrl`` runs torchrl's own classes (its segment trees served by ``replay`` when its
compiled ones do not load on the installed torch: ``torchrl_compat_trees``); ``--lib cpprb``
runs cpprb's ``PrioritizedReplayBuffer`` on memory-mapped columns (``pip install cpprb``; it has
no slice sampler, so the slice loop and the draws apart are left out). CI runs it at 2^16
rows as a smoke test (``tests/test_bench_scale.py``).
"""
from __future__ import annotations

import argparse
import csv
import gc
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 2**16
EPISODE = 1_000
OTHER_BYTES = 1 + 4 + 4  # the action, reward and episode id beside the observation
STOPS = (2**20, 2**24, 2**27, 2**30)
LOOP_WRITE = 1_024
BATCH = 256


def _count(text: str) -> int:
    """A row count written as digits or as a power (``2**30``)."""
    base, _, exponent = text.partition("**")
    value = int(base) ** int(exponent) if exponent else int(base)
    if value < 1:
        raise argparse.ArgumentTypeError(f"a row count must be at least 1, got {text}")
    return value


def _parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=_count, default=2**20,
                        help="the storage's capacity, filled to the end (2**30 accepted)")
    parser.add_argument("--lib", choices=("ours", "torchrl", "cpprb"), default="ours")
    parser.add_argument("--scratch-dir", type=Path, default=None,
                        help="where the storage's files go (default: a temporary directory)")
    parser.add_argument("--out", type=Path, default=Path("bench/scale.csv"))
    parser.add_argument("--steps", type=int, default=100, help="loop steps timed at each size")
    parser.add_argument("--slice-steps", type=int, default=None,
                        help="slice loop steps (default: --steps; torchrl rescans the column at each)")
    parser.add_argument("--obs-bytes", type=int, default=16, help="uint8 of observation per row")
    parser.add_argument("--no-dumps", action="store_true", help="skip the dumps / loads timing")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def _library(name):
    if name == "cpprb":
        return None  # _CpprbBuffer
    if name == "torchrl":
        import torchrl_compat_trees

        torchrl_compat_trees.install_segment_trees()  # only where torchrl's own do not load
        import torchrl.data as lib
    else:
        import torchrl_compat as lib
    return lib


def _rss_gib() -> float:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def _anon_rss_gib() -> float:
    """The anonymous part of the RSS (the trees, the tensors): what the memory-mapped storage's
    pages, which the kernel can drop, do not count in."""
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def disk_write_rate(directory: Path, size: int = 2**30) -> float:
    """Bytes per second of ``size`` bytes written to a new file in ``directory`` and synced."""
    block = os.urandom(2**20) * 64
    path = directory / ".write-rate"
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as file:
        for _ in range(0, size, len(block)):
            file.write(block)
        os.fsync(file.fileno())
    seconds = time.perf_counter() - start
    path.unlink()
    return size / seconds


def _rows(torch, TensorDict, start: int, count: int, obs_bytes: int):
    step = torch.arange(start, start + count)
    return TensorDict(
        {
            "obs": torch.zeros(count, obs_bytes, dtype=torch.uint8),
            "action": torch.zeros(count, dtype=torch.int8),
            "reward": torch.ones(count),
            "episode": (step // EPISODE).to(torch.int32),
        },
        [count],
    )


class _Record:
    """Appends figures to the CSV file and prints them."""

    def __init__(self, path: Path, lib: str, capacity: int):
        self.path, self.lib, self.capacity = path, lib, capacity
        path.parent.mkdir(parents=True, exist_ok=True)
        self._new = not path.exists() or path.stat().st_size == 0

    def __call__(self, filled: int, measure: str, value: float, unit: str, text: str):
        with open(self.path, "a", newline="") as file:
            writer = csv.writer(file)
            if self._new:
                writer.writerow(["lib", "capacity", "rows", "measure", "value", "unit"])
                self._new = False
            writer.writerow([self.lib, self.capacity, filled, measure, f"{value:.6g}", unit])
        print(f"[{self.lib} {filled:>13,} rows] {text}", flush=True)


def _time_loops(torch, TensorDict, rb, rb_slice, filled, args, slice_steps, record):
    steps = args.steps
    prioritized = []
    for _ in range(steps):
        rows = _rows(torch, TensorDict, filled, LOOP_WRITE, args.obs_bytes)
        start = time.perf_counter()
        rb.extend(rows)
        sample = rb.sample()
        if rb_slice is None:  # cpprb: a dict of columns, priorities set by its indexes
            rb.update_priority(sample, torch.rand(BATCH))
        else:
            sample.set("td_error", torch.rand(sample.shape[0]))
            rb.update_tensordict_priority(sample)
        prioritized.append(time.perf_counter() - start)
        filled += LOOP_WRITE
    size = len(rb)
    if rb_slice is None:
        p = statistics.median(prioritized)
        record(size, "prioritized_step_s", p, "s", f"prioritized step {p * 1e6:,.0f} us (median of {steps})")
        record(size, "rss_gib", _rss_gib(), "GiB", f"RSS {_rss_gib():.2f} GiB")
        record(size, "rss_anon_gib", _anon_rss_gib(), "GiB", f"  of which anonymous {_anon_rss_gib():.2f} GiB")
        return filled
    slices = []
    for _ in range(slice_steps):
        start = time.perf_counter()
        rb_slice.sample()
        slices.append(time.perf_counter() - start)
    # the samplers' part alone (the indices drawn, no row read): what is left of a step is
    # the storage's (rows read from memory or, past the page cache, from disk)
    draws = {}
    for name, buffer, count in (("prioritized", rb, steps), ("slice", rb_slice, slice_steps)):
        times = []
        for _ in range(count):
            start = time.perf_counter()
            buffer._sampler.sample(buffer._storage, BATCH)
            times.append(time.perf_counter() - start)
        draws[name] = statistics.median(times) if times else float("nan")
    p, s = statistics.median(prioritized), statistics.median(slices) if slices else float("nan")
    record(size, "prioritized_step_s", p, "s", f"prioritized step {p * 1e6:,.0f} us (median of {steps})")
    record(size, "prioritized_draw_s", draws["prioritized"], "s",
           f"  of which the sampler's draw {draws['prioritized'] * 1e6:,.0f} us")
    record(size, "slice_step_s", s, "s", f"slice step {s * 1e6:,.0f} us (median of {slice_steps})")
    record(size, "slice_draw_s", draws["slice"], "s", f"  of which the sampler's draw {draws['slice'] * 1e6:,.0f} us")
    record(size, "rss_gib", _rss_gib(), "GiB", f"RSS {_rss_gib():.2f} GiB")
    record(size, "rss_anon_gib", _anon_rss_gib(), "GiB", f"  of which anonymous {_anon_rss_gib():.2f} GiB")
    return filled


class _CpprbBuffer:
    """cpprb's ``PrioritizedReplayBuffer(alpha=0.7)``, its columns in memory-mapped files
    (``mmap_prefix``), behind the calls this script makes on a buffer. cpprb has no slice
    sampler and no draw apart from the gather of the rows (``sample`` does both), and it
    checkpoints its transitions and priorities to one ``.npz`` file (``save_transitions`` /
    ``load_transitions``)."""

    def __init__(self, capacity, obs_bytes, directory):
        import numpy as np
        from cpprb import PrioritizedReplayBuffer

        directory.mkdir(parents=True, exist_ok=True)
        columns = {"obs": {"shape": obs_bytes, "dtype": np.uint8}, "action": {"dtype": np.int8},
                   "reward": {"dtype": np.float32}, "episode": {"dtype": np.int32}}
        self._rb = PrioritizedReplayBuffer(capacity, columns, alpha=0.7, mmap_prefix=str(directory / "cpprb"))

    def extend(self, rows):
        self._rb.add(**{key: rows[key].numpy() for key in ("obs", "action", "reward", "episode")})

    def sample(self):
        return self._rb.sample(BATCH, beta=0.5)

    def update_priority(self, sample, td_error):
        self._rb.update_priorities(sample["indexes"], td_error.numpy())

    def __len__(self):
        return self._rb.get_stored_size()

    def dumps(self, path):
        path.mkdir(parents=True, exist_ok=True)
        self._rb.save_transitions(str(path / "transitions.npz"))

    def loads(self, path):
        self._rb.load_transitions(str(path / "transitions.npz"))


def _make(lib, torch, capacity, directory):
    storage = lib.LazyMemmapStorage(capacity, scratch_dir=directory)
    rb = lib.TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=storage, batch_size=BATCH,
                                               priority_key="td_error")
    return rb


def run(argv=None) -> int:
    args = _parse_args(argv)
    import torch
    from tensordict import TensorDict

    lib = _library(args.lib)
    torch.manual_seed(0)
    capacity = args.rows
    row_bytes = args.obs_bytes + OTHER_BYTES
    slice_steps = args.steps if args.slice_steps is None else args.slice_steps
    scratch = args.scratch_dir or Path(tempfile.mkdtemp(prefix="replay-scale-"))
    scratch.mkdir(parents=True, exist_ok=True)
    home = scratch / f"{args.lib}-{capacity}"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir()
    record = _Record(args.out, args.lib, capacity)
    try:
        disk = disk_write_rate(home, min(2**30, max(capacity * row_bytes, 2**26)))
        record(0, "disk_write_bytes_per_s", disk, "B/s", f"disk writes {disk / 2**30:.2f} GiB/s")

        start = time.perf_counter()
        # the storage lives in the checkpoint's own folder: dumps links its files there instead
        # of copying them (a second copy of 25 GiB at 2^30 rows), and the buffer loaded later
        # reads them in place
        live = home / "checkpoint" / "storage"
        if lib is None:
            rb, rb_slice = _CpprbBuffer(capacity, args.obs_bytes, live), None
        else:
            rb = _make(lib, torch, capacity, live)
            rb_slice = lib.TensorDictReplayBuffer(
                storage=rb._storage, sampler=lib.SliceSampler(slice_len=32, traj_key="episode"), batch_size=BATCH
            )
        built = time.perf_counter() - start
        record(0, "build_s", built, "s", f"buffer built in {built:.2f} s, RSS {_rss_gib():.2f} GiB")
        stops = [stop for stop in STOPS if stop < capacity] + [capacity]
        filled = 0
        fill_seconds = 0.0
        last_print = 0.0
        for stop in stops:
            while filled < stop:
                count = min(CHUNK, stop - filled)
                rows = _rows(torch, TensorDict, filled, count, args.obs_bytes)
                begin = time.perf_counter()
                rb.extend(rows)
                fill_seconds += time.perf_counter() - begin
                filled += count
                if not args.quiet and time.perf_counter() - last_print > 0.5:
                    last_print = time.perf_counter()
                    rate = filled * row_bytes / fill_seconds / 2**30
                    bar = "#" * int(40 * filled / capacity)
                    print(f"\rfill [{bar:<40}] {filled / capacity:6.1%} {rate:.2f} GiB/s", end="",
                          file=sys.stderr, flush=True)
            if not args.quiet:
                print(file=sys.stderr)
            rate = filled / fill_seconds
            record(filled, "fill_rows_per_s", rate, "rows/s",
                   f"filled at {rate / 1e6:.1f} M rows/s = {rate * row_bytes / 2**30:.2f} GiB/s "
                   f"({rate * row_bytes / disk:.0%} of the disk's write rate)")
            filled = _time_loops(torch, TensorDict, rb, rb_slice, filled, args, slice_steps, record)
        record(len(rb), "peak_rss_gib", _peak_rss_gib(), "GiB", f"peak RSS {_peak_rss_gib():.2f} GiB")
        # dumps writes the trees (two float64 files) and the storage moves out of the published
        # checkpoint into a copy of its own
        needed = 16 * capacity + row_bytes * capacity
        free = shutil.disk_usage(home).free
        if not args.no_dumps and free < needed * 1.05:
            record(len(rb), "dumps_skipped_free_bytes", free, "B",
                   f"dumps / loads skipped: {free / 2**30:.1f} GiB free, they need {needed / 2**30:.1f} GiB")
        elif not args.no_dumps:
            start = time.perf_counter()
            rb.dumps(home / "checkpoint")
            seconds = time.perf_counter() - start
            record(len(rb), "dumps_s", seconds, "s", f"dumps {seconds:.2f} s")
            # as a new process would: the buffer dumped is gone (its trees alone take 9 GiB at
            # 2^30 rows) before another is built and loaded
            length = len(rb)
            last = None if lib is None else rb[len(rb) - 1]["episode"].clone()
            del rb, rb_slice
            gc.collect()
            if lib is None:
                restored = _CpprbBuffer(capacity, args.obs_bytes, home / "restored")
            else:
                restored = _make(lib, torch, capacity, live)
            start = time.perf_counter()
            restored.loads(home / "checkpoint")
            seconds = time.perf_counter() - start
            record(len(restored), "loads_s", seconds, "s", f"loads {seconds:.2f} s")
            record(len(restored), "peak_rss_gib", _peak_rss_gib(), "GiB", f"peak RSS {_peak_rss_gib():.2f} GiB")
            assert len(restored) == length
            if lib is None:
                assert restored.sample()["obs"].shape[0] == BATCH
            else:
                assert torch.equal(restored[length - 1]["episode"], last)
                assert restored.sample().batch_size == (BATCH,)
    finally:
        if args.scratch_dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(run())
