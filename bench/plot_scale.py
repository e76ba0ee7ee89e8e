"""Time per prioritized buffer step against the rows in the buffer, one line per library, as an SVG.

Reads the measured steps of ``bench/data/scale_steps.csv`` (columns ``lib, rows, measure,
value, unit, row_bytes, source``; the rows whose ``measure`` is ``prioritized_step``: one
``extend`` of 1,024 rows, one ``sample`` of 256 and the priority update, as ``bench/scale.py``
times them) and writes a plot of plain SVG text, with no dependency: rows on a log2 axis, the
microseconds per step on a log axis, one line with markers per library (the median where a size
was run several times), a legend and the axis labels. A point measured with rows of another
width than most of the file's is drawn hollow, and the legend says so.

    python bench/plot_scale.py                      # bench/data/scale_steps.csv -> docs/scale_steps.svg
    python bench/plot_scale.py --csv runs.csv --out steps.svg
"""
from __future__ import annotations

import argparse
import collections
import csv
import math
import statistics
import sys
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parent.parent
MEASURE = "prioritized_step"
TO_US = {"s": 1e6, "ms": 1e3, "us": 1.0}
# Fixed colours and names for the libraries bench/scale.py runs; any other gets the next colour.
STYLE = {
    "ours": ("#1f77b4", "torchrl_compat"),
    "torchrl": ("#d62728", "torchrl 0.11.0"),
    "cpprb": ("#2ca02c", "cpprb 11.0.0"),
}
OTHER_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
WIDTH, HEIGHT = 760, 460
LEFT, RIGHT, TOP, BOTTOM = 78, 200, 48, 62


def read_steps(path: Path):
    """``{lib: {rows: [microseconds, ...]}}`` and ``{(lib, rows): {row_bytes, ...}}`` from the CSV."""
    steps = collections.defaultdict(lambda: collections.defaultdict(list))
    widths = collections.defaultdict(set)
    with open(path, newline="") as file:
        for row in csv.DictReader(file):
            if row["measure"] != MEASURE:
                continue
            if row["unit"] not in TO_US:
                raise ValueError(f"{path}: unit {row['unit']!r} is not one of {sorted(TO_US)}")
            rows = int(row["rows"])
            steps[row["lib"]][rows].append(float(row["value"]) * TO_US[row["unit"]])
            widths[row["lib"], rows].add(int(row["row_bytes"]))
    if not steps:
        raise ValueError(f"{path}: no {MEASURE!r} rows")
    return steps, widths


def _decades(low: float, high: float):
    return math.floor(math.log10(low)), math.ceil(math.log10(high))


def _us_label(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:g} s"
    if us >= 1e3:
        return f"{us / 1e3:g} ms"
    return f"{us:g} us"


def render(steps, widths) -> str:
    """The SVG text of the plot."""
    all_rows = sorted({rows for series in steps.values() for rows in series})
    all_us = [statistics.median(v) for series in steps.values() for v in series.values()]
    x_low, x_high = math.floor(math.log2(all_rows[0])), math.ceil(math.log2(all_rows[-1]))
    if x_high == x_low:
        x_high += 1
    y_low, y_high = _decades(min(all_us), max(all_us))
    if y_high == y_low:
        y_high += 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(rows):
        return LEFT + (math.log2(rows) - x_low) / (x_high - x_low) * plot_w

    def y_of(us):
        return TOP + plot_h - (math.log10(us) - y_low) / (y_high - y_low) * plot_h

    count = collections.Counter(w for ws in widths.values() for w in ws)
    usual = count.most_common(1)[0][0]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="Helvetica, Arial, sans-serif" font-size="13">',
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT + plot_w / 2:.1f}" y="24" text-anchor="middle" font-size="15">'
        "Prioritized buffer step: extend 1,024 + sample 256 + priority update</text>",
    ]
    # grid and ticks: every even power of two on x, decades (and 2, 5 between) on y
    out.append('<g class="grid" stroke="#dddddd" stroke-width="1">')
    for e in range(x_low, x_high + 1):
        if e % 2 == 0:
            out.append(f'<line x1="{x_of(2**e):.1f}" y1="{TOP}" x2="{x_of(2**e):.1f}" y2="{TOP + plot_h}"/>')
    for d in range(y_low, y_high + 1):
        for m in (1, 2, 5):
            if d == y_high and m > 1:
                break
            y = y_of(m * 10**d)
            dash = "" if m == 1 else ' stroke-dasharray="2,3"'
            out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}"{dash}/>')
    out.append("</g>")
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333333"/>')
    out.append('<g class="x-ticks" text-anchor="middle">')
    for e in range(x_low, x_high + 1):
        if e % 2 == 0:
            out.append(f'<text x="{x_of(2**e):.1f}" y="{TOP + plot_h + 20}">2<tspan dy="-6" '
                       f'font-size="10">{e}</tspan></text>')
    out.append("</g>")
    out.append('<g class="y-ticks" text-anchor="end">')
    for d in range(y_low, y_high + 1):
        out.append(f'<text x="{LEFT - 8}" y="{y_of(10**d) + 4:.1f}">{_us_label(10**d)}</text>')
    out.append("</g>")
    out.append(f'<text class="x-label" x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 16}" text-anchor="middle">'
               "rows in the buffer (log2 scale)</text>")
    out.append(f'<text class="y-label" transform="translate(18,{TOP + plot_h / 2:.1f}) rotate(-90)" '
               'text-anchor="middle">time per step (log scale)</text>')
    # one line with markers per library
    others = iter(OTHER_COLOURS)
    legend = []
    order = [lib for lib in STYLE if lib in steps] + sorted(lib for lib in steps if lib not in STYLE)
    for lib in order:
        colour, name = STYLE.get(lib, (None, lib))
        colour = colour or next(others, "#000000")
        points = sorted((rows, statistics.median(values)) for rows, values in steps[lib].items())
        path = " ".join(f"{x_of(rows):.1f},{y_of(us):.1f}" for rows, us in points)
        out.append(f'<g class="series" data-lib="{escape(lib)}">')
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for rows, us in points:
            hollow = widths[lib, rows] != {usual}
            fill = "white" if hollow else colour
            out.append(f'<circle cx="{x_of(rows):.1f}" cy="{y_of(us):.1f}" r="4" fill="{fill}" '
                       f'stroke="{colour}" stroke-width="2"><title>{escape(name)}: 2^{math.log2(rows):g} rows, '
                       f'{_us_label(float(f"{us:.3g}"))}</title></circle>')
        out.append("</g>")
        legend.append((colour, name))
    x0, y0 = LEFT + plot_w + 18, TOP + 12
    out.append('<g class="legend">')
    for i, (colour, name) in enumerate(legend):
        y = y0 + 22 * i
        out.append(f'<line x1="{x0}" y1="{y}" x2="{x0 + 24}" y2="{y}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<circle cx="{x0 + 12}" cy="{y}" r="4" fill="{colour}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{x0 + 32}" y="{y + 4}">{escape(name)}</text>')
    odd = sorted({w for ws in widths.values() for w in ws} - {usual})
    y = y0 + 22 * len(legend) + 8
    out.append(f'<text x="{x0}" y="{y}" font-size="11">filled: rows of {usual} bytes</text>')
    if odd:
        out.append(f'<circle cx="{x0 + 4}" cy="{y + 14}" r="4" fill="white" stroke="#333333" stroke-width="2"/>')
        out.append(f'<text x="{x0 + 14}" y="{y + 18}" font-size="11">hollow: rows of '
                   f'{", ".join(map(str, odd))} bytes</text>')
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", type=Path, default=ROOT / "bench" / "data" / "scale_steps.csv")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "scale_steps.svg")
    args = parser.parse_args(argv)
    steps, widths = read_steps(args.csv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(steps, widths))
    print(f"{args.out}: {', '.join(f'{lib} ({len(series)} sizes)' for lib, series in steps.items())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
