"""``bench/scale.py`` (the billion-row benchmark) run at 2^16 rows: every figure it promises is
written, for our buffer and for torchrl's, and a bad ``--rows`` is refused."""
import csv
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "scale.py")
MEASURES = {"disk_write_bytes_per_s", "build_s", "fill_rows_per_s", "prioritized_step_s", "prioritized_draw_s",
            "slice_step_s", "slice_draw_s", "rss_gib", "rss_anon_gib", "peak_rss_gib", "dumps_s", "loads_s"}


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("lib", ["ours", "torchrl"])
def test_scale_runs_at_two_to_the_16(tmp_path, lib):
    out = tmp_path / "scale.csv"
    done = _run("--rows", "2**16", "--steps", "3", "--lib", lib, "--quiet",
                "--scratch-dir", str(tmp_path / "scratch"), "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert {row["measure"] for row in rows} == MEASURES
    assert {row["lib"] for row in rows} == {lib} and {row["capacity"] for row in rows} == {str(2**16)}
    for row in rows:
        assert float(row["value"]) > 0, row
    # the loops are timed once the storage is full (the loop's writes wrap around it)
    assert {row["rows"] for row in rows if row["measure"] == "slice_step_s"} == {str(2**16)}
    assert "prioritized step" in done.stdout and "of the disk's write rate" in done.stdout
    assert not any((tmp_path / "scratch").iterdir())  # its files are removed


def test_scale_runs_cpprb_at_two_to_the_16(tmp_path):
    """cpprb's prioritized buffer beside ours (``--lib cpprb``, where cpprb is installed: it is
    not among the project's requirements): its prioritized loop, fill, RSS, dumps and loads."""
    pytest.importorskip("cpprb")
    out = tmp_path / "scale.csv"
    done = _run("--rows", "2**16", "--steps", "3", "--lib", "cpprb", "--quiet",
                "--scratch-dir", str(tmp_path / "scratch"), "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert {row["measure"] for row in rows} == MEASURES - {"prioritized_draw_s", "slice_step_s", "slice_draw_s"}
    assert {row["lib"] for row in rows} == {"cpprb"}
    assert all(float(row["value"]) > 0 for row in rows)
    assert not any((tmp_path / "scratch").iterdir())


@pytest.mark.parametrize("rows", ["0", "2**-1", "many"])
def test_scale_refuses_a_bad_row_count(rows):
    done = _run("--rows", rows)
    assert done.returncode == 2 and "--rows" in done.stderr


def test_first_sample_on_disk_runs_at_two_to_the_20(tmp_path):
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "first_sample_on_disk.py"), "--rows", "2**20",
         "--scratch-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1,048,576 rows (0.01 GiB of int64 ids)" in done.stdout and "first sample" in done.stdout
    assert not any(tmp_path.iterdir())  # its files are removed


def test_trees_scale_runs_at_two_to_the_16(tmp_path):
    """``bench/trees_scale.py`` (the trees at 2^30) at 2^16 leaves: every figure written."""
    out = tmp_path / "trees.csv"
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "trees_scale.py"), "--rows", "2**16",
         "--reference-rows", "2**10", "--steps", "20", "--rounds", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    measures = {(row["rows"], row["measure"]) for row in rows}
    steps = {"sample_us", "update_us", "sample_kernel_us", "update_kernel_us"}
    assert {(str(2**10), m) for m in steps} <= measures
    figures = {"tree_bytes", "numpy_write_s", "kernel_build_fill_s", "build_s", "fill_s", "refill_index_s",
               "refill_values_s", "refill_kernels_s"}
    assert {(str(2**16), m) for m in steps | figures} <= measures
    assert all(float(row["value"]) >= 0 for row in rows)
    assert "build + fill" in done.stdout
