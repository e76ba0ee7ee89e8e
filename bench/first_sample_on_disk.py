"""The first ``SliceSampler`` sample over a ``LazyMemmapStorage`` whose id column is larger than RAM.

A ``LazyMemmapStorage(rows, scratch_dir=...)`` holding one int64 ``"episode"`` column (episodes of
500 steps: 32 GiB at 2^32 rows) is filled through a ``RoundRobinWriter`` (a buffer's writer would add
an ``"index"`` column as large), then a ``SliceSampler(num_slices=256, traj_key="episode",
strict_length=True)`` draws: the first draw reads the whole column from disk to find the
trajectories, the next ones follow the writes. It prints the fill time, the first draw's time and
read rate, the steady draw and the anonymous RSS (the column is read in place, never copied).

    python bench/first_sample_on_disk.py --rows 2**32 --scratch-dir /big/disk
"""
from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

CHUNK = 2**22
EPISODE = 500


def run(argv=None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from scale import _anon_rss_gib, _count

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=_count, default=2**24, help="the storage's capacity, filled")
    parser.add_argument("--scratch-dir", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch
    from tensordict import TensorDict

    import torchrl_compat as lib

    scratch = Path(tempfile.mkdtemp(prefix="replay-column-", dir=args.scratch_dir))
    try:
        storage = lib.LazyMemmapStorage(args.rows, scratch_dir=scratch)
        writer = lib.RoundRobinWriter()
        writer.register_storage(storage)
        sampler = lib.SliceSampler(num_slices=256, traj_key="episode", strict_length=True)
        start = time.perf_counter()
        for row in range(0, args.rows, CHUNK):
            count = min(CHUNK, args.rows - row)
            writer.extend(TensorDict({"episode": torch.arange(row, row + count) // EPISODE}, [count]))
        fill = time.perf_counter() - start
        start = time.perf_counter()
        sampler.sample(storage, 1024)
        first = time.perf_counter() - start
        steady = []
        for _ in range(10):
            start = time.perf_counter()
            sampler.sample(storage, 1024)
            steady.append(time.perf_counter() - start)
        column = args.rows * 8 / 2**30
        print(
            f"{args.rows:,} rows ({column:.2f} GiB of int64 ids): fill {fill:.1f} s, first sample "
            f"{first:.2f} s ({column / first:.2f} GiB/s), steady {min(steady) * 1e3:.2f} ms, anonymous RSS "
            f"{_anon_rss_gib():.2f} GiB, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB",
            flush=True,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(run())
