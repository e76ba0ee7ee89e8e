"""Ratios of one benchmark run, per group: the reference side's time over each other side's.

Reads the JSON that ``pytest bench --benchmark-json=FILE`` writes and prints one Markdown row
per side that is not the reference: the group, the side, its minimum and median, the rounds,
and the ratios of minimums and of medians (above 1: that side is faster). The reference of a
group is its side whose parameter id starts with ``torchrl`` (or, for the permutation groups,
whose test times ``torch.randperm``); a group without one is listed without ratios. A group
whose sides ran unequal rounds is marked: its ratio of minimums is biased (``bench/conftest.py``
refuses such runs; an older file may hold them).

    python bench/ratios.py build/bench/run1.json [build/bench/run2.json ...]

Several files: the ratios of each run, ``/``-separated, in the order given.
"""
from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict

_PARAM = re.compile(r"\[(.*)\]$")


def _side(name: str) -> str:
    found = _PARAM.search(name)
    return found.group(1) if found else name


def _is_reference(name: str) -> bool:
    return any(part.startswith("torchrl") for part in _side(name).split("-")) or name.startswith("test_torch_")


def load(path: str) -> dict:
    """``{group: {name: stats}}`` of one run."""
    with open(path) as handle:
        data = json.load(handle)
    groups: dict = defaultdict(dict)
    for bench in data["benchmarks"]:
        groups[bench["group"] or bench["name"]][bench["name"]] = bench["stats"]
    return groups


def _fmt_time(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:,.2f} ms"
    return f"{seconds * 1e6:,.1f} us"


def rows(runs: list[dict]) -> list[str]:
    lines = ["| group | side | min | median | rounds | ratio of mins | ratio of medians |",
             "|---|---|---|---|---|---|---|"]
    for group in sorted(set().union(*runs)):
        names = sorted(set().union(*(run.get(group, {}) for run in runs)))
        refs = [n for n in names if _is_reference(n)]
        others = [n for n in names if n not in refs]
        for name in others:
            cells = {"min": [], "median": [], "rounds": [], "rmin": [], "rmed": []}
            for run in runs:
                stats = run.get(group, {}).get(name)
                if stats is None:
                    continue
                cells["min"].append(_fmt_time(stats["min"]))
                cells["median"].append(_fmt_time(stats["median"]))
                ref = next((run[group][r] for r in refs if r in run.get(group, {})), None)
                rounds = f"{stats['rounds']}"
                if ref is not None:
                    if ref["rounds"] != stats["rounds"]:
                        rounds += f" (reference {ref['rounds']}: unequal)"
                    cells["rmin"].append(f"{ref['min'] / stats['min']:.2f}x")
                    cells["rmed"].append(f"{ref['median'] / stats['median']:.2f}x")
                cells["rounds"].append(rounds)
            lines.append(f"| {group} | {_side(name)} | " + " | ".join(
                " / ".join(cells[key]) or "-" for key in ("min", "median", "rounds", "rmin", "rmed")) + " |")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="pytest-benchmark JSON files")
    args = parser.parse_args(argv)
    print("\n".join(rows([load(path) for path in args.runs])))


if __name__ == "__main__":
    main()
