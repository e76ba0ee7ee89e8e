"""Prioritized trees at scale: a ``PrioritizedSampler`` of ``--rows`` leaves built, filled and stepped.

Each figure comes from a fresh process (a page's first touch is what building and filling a
tree of 2^30 leaves costs, so nothing may reuse memory another measure touched):

- ``build``: ``PrioritizedSampler(rows, alpha=0.7, beta=0.5)``;
- ``fill``: ``update_priority`` of every leaf, in blocks of 2^22 (a ``torch.arange`` index and
  float32 priorities, as a user loading a dataset writes them);
- ``numpy``: as many bytes as both trees hold, written into a fresh numpy allocation
  (``np.empty(...).fill(1)``): the reference for build + fill;
- ``kernels``: the kernels alone building and filling both trees (``update_priority_pair`` by
  blocks, each block's index and values made beforehand, untimed);
- the fill again once its pages are in memory, by parts: the index, torch's stored values, the
  kernels (the rest of the first fill is the first touch of the trees' pages);
- ``sample(256)`` and ``update_priority(256)`` (random leaves, random priorities), the medians of
  ``--steps`` calls, at ``--rows`` and at ``--reference-rows`` (2^20), and the kernels' own part
  of each (``sample_prioritized`` from given masses, ``update_priority_pair``);
- the RSS and the anonymous huge pages the process holds.

The sampler is asked for a storage only for its length: a ``ListStorage`` whose length is the
row count stands for it (the whole buffer loop on disk at 2^30 rows is ``bench/scale.py``).
Rounds alternate the numpy reference and the trees (``--rounds``); every figure goes to a CSV
file (``--out``: library, capacity, rows filled, measure, value, unit).

    python bench/trees_scale.py --rows 2**30 --out bench/trees_scale.csv
    python bench/trees_scale.py --rows 2**30 --no-huge-pages   # numpy's madvise(MADV_HUGEPAGE) off

CI runs it at 2^16 rows as a smoke test (``tests/test_bench_scale.py``).
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scale import _anon_rss_gib, _count, _rss_gib  # (bench/, this script's folder)

BLOCK = 2**22
BATCH = 256


def _memory() -> dict:
    """The RSS, its anonymous part and the anonymous huge pages of this process, in GiB."""
    figures = {"VmRSS": _rss_gib(), "RssAnon": _anon_rss_gib()}
    try:
        with open("/proc/self/smaps_rollup") as file:
            for line in file:
                if line.startswith("AnonHugePages:"):
                    figures["AnonHugePages"] = int(line.split()[1]) / 2**20
    except OSError:
        pass
    return figures


def _median_us(step, steps: int) -> float:
    times = []
    for _ in range(steps):
        start = time.perf_counter_ns()
        step()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def child_numpy(nbytes: int) -> dict:
    """Seconds to write ``nbytes`` bytes into a fresh numpy allocation."""
    import numpy as np

    start = time.perf_counter()
    array = np.empty(nbytes, dtype=np.uint8)
    array.fill(1)
    return {"numpy_write_s": time.perf_counter() - start}


def child_kernel_fill(rows: int) -> dict:
    """Seconds the kernels take to build and fill both trees from fresh memory, the index and
    values of each block made beforehand (what writing the trees costs, beside numpy's write)."""
    import numpy as np

    import replay

    values = (np.random.default_rng(0).random(min(BLOCK, rows)) + 0.1).astype(np.float32)
    start = time.perf_counter()
    sum_tree, min_tree = replay.SumSegmentTreeFp32(rows), replay.MinSegmentTreeFp32(rows)
    seconds = time.perf_counter() - start
    for first in range(0, rows, BLOCK):
        last = min(rows, first + BLOCK)
        index = np.arange(first, last)
        start = time.perf_counter()
        replay.update_priority_pair(sum_tree, min_tree, index, values[: last - first], values[: last - first])
        seconds += time.perf_counter() - start
    return {"kernel_build_fill_s": seconds}


def child_trees(rows: int, steps: int, fill: bool) -> dict:
    """Build (and fill) a sampler of ``rows`` leaves, then time its steps."""
    import numpy as np
    import torch

    import replay
    from torchrl_compat.samplers import PrioritizedSampler
    from torchrl_compat.storages import ListStorage

    class Filled(ListStorage):
        """A storage of ``rows`` items, for the length the sampler reads."""

        def __len__(self):
            return rows

    torch.manual_seed(0)
    np.random.seed(0)
    out = {}
    start = time.perf_counter()
    sampler = PrioritizedSampler(rows, alpha=0.7, beta=0.5)
    out["build_s"] = time.perf_counter() - start
    out["tree_bytes"] = sampler._sum_tree.nbytes + sampler._min_tree.nbytes
    if not fill:
        return out
    priorities = torch.rand(min(BLOCK, rows)) + 0.1
    start = time.perf_counter()
    for first in range(0, rows, BLOCK):
        last = min(rows, first + BLOCK)
        sampler.update_priority(torch.arange(first, last), priorities[: last - first])
    out["fill_s"] = time.perf_counter() - start
    # The same fill again, its pages now in memory, by parts: the index, the stored values
    # (torch computes (priority + eps) ** alpha, as torchrl does, for the same bits) and the
    # kernels writing both trees; fill_s less their sum is the first touch of the trees' pages.
    parts = {"refill_index_s": 0.0, "refill_values_s": 0.0, "refill_kernels_s": 0.0}
    for first in range(0, rows, BLOCK):
        last = min(rows, first + BLOCK)
        start = time.perf_counter()
        index = torch.arange(first, last)
        middle = time.perf_counter()
        value = priorities[: last - first].add(1e-8).pow_(0.7)
        end = time.perf_counter()
        replay.update_priority_pair(sampler._sum_tree, sampler._min_tree, index, value, priorities[: last - first])
        parts["refill_index_s"] += middle - start
        parts["refill_values_s"] += end - middle
        parts["refill_kernels_s"] += time.perf_counter() - end
    out.update(parts)
    storage = Filled(rows)
    sampler.sample(storage, BATCH)
    out["sample_us"] = _median_us(lambda: sampler.sample(storage, BATCH), steps)
    batch = torch.rand(BATCH) + 0.1
    out["update_us"] = _median_us(lambda: sampler.update_priority(torch.randint(rows, (BATCH,)), batch), steps)
    sum_tree, min_tree = sampler._sum_tree, sampler._min_tree
    total, smallest = sum_tree.query(0, rows), min_tree.query(0, rows)
    masses = [np.random.uniform(0.0, total, BATCH) for _ in range(64)]
    leaves = [np.random.randint(0, rows, BATCH) for _ in range(64)]
    values = batch.numpy()
    turn = iter(range(10**9))
    out["sample_kernel_us"] = _median_us(
        lambda: sum_tree.sample_prioritized(rows, None, mass=masses[next(turn) % 64], relative_to=smallest), steps)
    out["update_kernel_us"] = _median_us(
        lambda: replay.update_priority_pair(sum_tree, min_tree, leaves[next(turn) % 64], values, values), steps)
    out.update(_memory())
    return out


def _run_child(args, *child_args) -> dict:
    command = [sys.executable, __file__, "--child", *child_args]
    if args.no_huge_pages:
        command.append("--no-huge-pages")
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=_count, default=2**30, help="leaves of the trees (2**30 accepted)")
    parser.add_argument("--reference-rows", type=_count, default=2**20,
                        help="the size the steps at --rows are compared with")
    parser.add_argument("--steps", type=int, default=3000, help="calls per step median")
    parser.add_argument("--rounds", type=int, default=2, help="numpy / trees rounds, alternated")
    parser.add_argument("--no-huge-pages", action="store_true",
                        help="turn numpy's madvise(MADV_HUGEPAGE) of large arrays off")
    parser.add_argument("--out", type=Path, help="CSV file the figures are appended to")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.no_huge_pages:
            import numpy as np

            np._core.multiarray._set_madvise_hugepage(False)
        kind, *rest = args.child
        if kind == "numpy":
            figures = child_numpy(int(rest[0]))
        elif kind == "kernels":
            figures = child_kernel_fill(int(rest[0]))
        else:
            figures = child_trees(int(rest[0]), int(rest[1]), rest[2] == "fill")
        print(json.dumps(figures))
        return

    rows_done = []

    def record(rows, measure, value, unit, text):
        rows_done.append(("ours", args.rows, rows, measure, value, unit))
        if text is not None:
            print(text, flush=True)

    pages = "off" if args.no_huge_pages else "on"
    nbytes = _run_child(args, "trees", str(args.rows), "0", "build")["tree_bytes"]
    record(args.rows, "tree_bytes", nbytes, "B", f"{args.rows:,} leaves: trees of {nbytes / 2**30:.2f} GiB "
           f"(huge pages {pages})")
    reference = _run_child(args, "trees", str(args.reference_rows), str(args.steps), "fill")
    for name in ("sample_us", "update_us", "sample_kernel_us", "update_kernel_us"):
        record(args.reference_rows, name, reference[name], "us",
               f"  {args.reference_rows:,} leaves: {name} {reference[name]:.1f} us")
    for round_ in range(args.rounds):
        numpy_s = _run_child(args, "numpy", str(nbytes))["numpy_write_s"]
        record(args.rows, "numpy_write_s", numpy_s, "s", f"round {round_ + 1}: numpy writes them in {numpy_s:.2f} s")
        kernels_s = _run_child(args, "kernels", str(args.rows))["kernel_build_fill_s"]
        record(args.rows, "kernel_build_fill_s", kernels_s, "s",
               f"  the kernels build and fill both trees in {kernels_s:.2f} s = {kernels_s / numpy_s:.2f}x numpy's write")
        big = _run_child(args, "trees", str(args.rows), str(args.steps), "fill")
        built = big["build_s"] + big["fill_s"]
        record(args.rows, "build_s", big["build_s"], "s", f"  build {big['build_s']:.2f} s")
        record(args.rows, "fill_s", big["fill_s"], "s",
               f"  fill {big['fill_s']:.2f} s: build + fill = {built / numpy_s:.2f}x numpy's write")
        parts = ("refill_index_s", "refill_values_s", "refill_kernels_s")
        for name in parts:
            record(args.rows, name, big[name], "s", None)
        print("  the fill again, pages in memory: index {:.2f} s (torch.arange), values {:.2f} s "
              "(torch's (p + eps) ** alpha), kernels {:.2f} s; first touch of the pages {:.2f} s".format(
                  *(big[name] for name in parts), big["fill_s"] - sum(big[name] for name in parts)), flush=True)
        for name in ("sample_us", "update_us", "sample_kernel_us", "update_kernel_us"):
            record(args.rows, name, big[name], "us",
                   f"  {name} {big[name]:.1f} us = {big[name] / reference[name]:.2f}x its {args.reference_rows:,}-leaf time")
        for name in ("VmRSS", "RssAnon", "AnonHugePages"):
            if name in big:
                record(args.rows, f"{name}_gib", big[name], "GiB", f"  {name} {big[name]:.2f} GiB")
    if args.out:
        new = not args.out.exists()
        with args.out.open("a", newline="") as file:
            writer = csv.writer(file)
            if new:
                writer.writerow(("lib", "capacity", "rows", "measure", "value", "unit"))
            writer.writerows(rows_done)


if __name__ == "__main__":
    main()
