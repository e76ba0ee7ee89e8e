"""Every code block of README.md and of the pages in docs/ runs as written; their links resolve.

Python blocks run one by one in a fresh interpreter, outside the clone, and every
``print(...)  # text`` line's text must appear in what the block prints. Shell blocks: ``make``
lines must name real targets (``make -n``), ``python -c`` lines run from another directory,
and the few lines that install from the network or into another environment are listed here.
Relative links must point at a file of the clone and, with ``#anchor``, at a heading (as GitHub
names it) or an ``<a id="...">`` of that file. The plot of bench/data/scale_steps.csv is drawn
again and must be the one committed.
"""
import csv
import glob
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import torchrl_compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))

# Shell lines that download packages or build another environment: not run by the tests.
NOT_RUN = {
    "pip install replay-torchrl-compat",
    "pip install torch --index-url https://download.pytorch.org/whl/cpu",
    "pip install .",
    "python3 -m venv /opt/ref291",
    "/opt/ref291/bin/pip install torch==2.9.1 'tensordict>=0.11,<0.12' torchrl==0.11.0 numpy pytest pytest-benchmark",
    "/opt/ref291/bin/python -m pytest bench -q --benchmark-group-by=group",
    # the multi-machine recipe of RayReplayBuffer: one line per machine of a Ray cluster
    "ray start --head --port=6379",
    "ray start --address=HEAD_IP:6379",
}


def _read(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as file:
        return file.read()


def _blocks(page):
    """(language, first line number, source) of every fenced block; indented blocks are refused."""
    lines = _read(page).splitlines()
    blocks, inside, start, language, body = [], False, 0, "", []
    for number, line in enumerate(lines, 1):
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and not inside:
            inside, start, language, body = True, number, fence.group(1), []
        elif line.startswith("```") and inside:
            blocks.append((language, start, "\n".join(body) + "\n"))
            inside = False
        elif inside:
            body.append(line)
        elif line.startswith("    ") and number > 1 and not lines[number - 2].strip():
            raise AssertionError(f"{page}:{number}: an indented code block; fence it (```sh / ```python)")
    assert not inside, f"{page}:{start}: unclosed code block"
    return blocks


BLOCKS = [(page, *block) for page in PAGES for block in _blocks(page)]
PYTHON_BLOCKS = [(page, start, source) for page, language, start, source in BLOCKS if language == "python"]
SHELL_LINES = [
    (page, start, line.split("  #")[0].strip())
    for page, language, start, source in BLOCKS if language == "sh"
    for line in source.splitlines() if line.strip()
]


def test_every_block_has_a_language():
    assert PYTHON_BLOCKS and SHELL_LINES
    assert {language for _, language, _, _ in BLOCKS} == {"python", "sh"}


@pytest.mark.parametrize("page,start,source", PYTHON_BLOCKS, ids=[f"{p}:{s}" for p, s, _ in PYTHON_BLOCKS])
def test_python_block_runs(page, start, source, tmp_path):
    if "RayReplayBuffer(" in source:
        pytest.importorskip("ray", reason="the Ray recipes need ray (the [ray] extra)")
    # the multi-machine recipe runs on a local cluster of its own, its shared folder in tmp_path
    source = source.replace('{"address": "auto"}', '{"address": "local", "num_cpus": 2, "include_dashboard": False}')
    source = source.replace('"/shared/replay-recovery"', repr(str(tmp_path / "replay-recovery")))
    env = dict(os.environ, PYTHONPATH=ROOT, RL_WARNINGS="0")
    env.pop("TORCHRL_COMPAT_INSTALL_TREES", None)
    proc = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{page}:{start}:\n{proc.stderr[-3000:]}"
    for expected in re.findall(r"print\(.*\)\s+#\s*(.+)$", source, flags=re.MULTILINE):
        expected = expected.split(": ...")[0].rstrip(". ")
        assert expected in proc.stdout, f"{page}:{start}: {expected!r} not in\n{proc.stdout}"


def _command(line):
    """The program a shell line runs: its first word past the ``NAME=value`` assignments."""
    return next(word for word in line.split() if not re.match(r"[A-Z_][A-Z0-9_]*=", word))


def test_shell_lines_are_known():
    runnable = {line for _, _, line in SHELL_LINES if _command(line) in ("make", "source", "python")}
    others = {line for _, _, line in SHELL_LINES} - runnable
    assert others == NOT_RUN


@pytest.mark.parametrize(
    "line", sorted({line for _, _, line in SHELL_LINES if line.startswith("make ")}),
)
def test_make_line_names_real_targets(line):
    proc = subprocess.run(["make", "-n", *line.split()[1:]], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "No rule to make target" not in proc.stderr


def test_python_line_runs_from_another_directory(installed_package, tmp_path):
    lines = [line for _, _, line in SHELL_LINES if line.startswith("python -c ")]
    assert lines
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    for line in lines:
        code = re.match(r'python -c "(.*)"$', line).group(1)
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # this clone's (pip install -e .), or the wheel's the tests run against (make test-matrix)
        assert os.path.realpath(proc.stdout.strip()) == os.path.realpath(torchrl_compat.__file__)


def test_activate_line_names_the_environment():
    lines = [line for _, _, line in SHELL_LINES if line.startswith("source ")]
    assert lines == ["source .venv/bin/activate"]
    # make creates .venv unless an environment is active; either way one has an activate script.
    venv = os.path.join(ROOT, ".venv")
    prefix = venv if os.path.isdir(venv) else sys.prefix
    assert os.path.isfile(os.path.join(prefix, "bin", "activate"))


# --------------------------------------------------------------------------- links


def _anchors(path):
    """The anchors GitHub gives a Markdown file: its headings' names and its ``<a id>`` tags."""
    text = re.sub(r"^```.*?^```", "", open(path, encoding="utf-8").read(), flags=re.MULTILINE | re.DOTALL)
    anchors, seen = set(re.findall(r'<a (?:id|name)="([^"]+)"', text)), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_readme_links_every_docs_page():
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", _read("README.md")))
    assert linked == {page for page in PAGES if page.startswith("docs/")}


@pytest.mark.parametrize("page", PAGES)
def test_links_resolve(page):
    text = re.sub(r"^```.*?^```", "", _read(page), flags=re.MULTILINE | re.DOTALL)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        target, _, anchor = link.partition("#")
        path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), target)) if target else os.path.join(ROOT, page)
        assert os.path.exists(path), f"{page}: {link} names no file"
        if anchor:
            assert anchor in _anchors(path), f"{page}: {link}: no such heading or <a id> in {target or page}"


# --------------------------------------------------------------------------- the plot


def test_scale_plot_draws_one_series_per_library(tmp_path):
    data = os.path.join(ROOT, "bench", "data", "scale_steps.csv")
    out = tmp_path / "scale_steps.svg"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "plot_scale.py"), "--csv", data,
                           "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    with open(data, newline="") as file:
        rows = [row for row in csv.DictReader(file) if row["measure"] == "prioritized_step"]
    sizes = {}
    for row in rows:
        sizes.setdefault(row["lib"], set()).add(int(row["rows"]))
    svg = ET.parse(out).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    series = {g.get("data-lib"): g for g in svg.iter(f"{ns}g") if g.get("class") == "series"}
    assert set(series) == set(sizes) == {"ours", "torchrl", "cpprb"}
    for lib, g in series.items():
        assert len(g.findall(f"{ns}polyline")) == 1
        assert len(g.findall(f"{ns}circle")) == len(sizes[lib])
    # the committed figure is the one the committed data draws
    with open(os.path.join(ROOT, "docs", "scale_steps.svg"), encoding="utf-8") as file:
        assert out.read_text(encoding="utf-8") == file.read()
