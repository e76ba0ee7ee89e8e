"""The package's layout: each family's private modules inside its package, no import circle,
and what an earlier layout pickled or dumped still loads.

Import circles are looked for in every import statement of the package (function-level ones
too: a circle broken only by importing inside a function is still a circle), between modules
and between the packages they belong to.
"""
from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import pytest
import torch

import torchrl_compat
from torchrl_compat._moved_modules import MOVED_MODULES

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "torchrl_compat"
BEFORE = Path(__file__).parent / "data" / "before_layout"

FAMILIES = {"storages", "samplers", "writers", "replay_buffers", "checkpointers"}
PRIVATE_PACKAGES = {"_torch_ops", "_ray"}
# What belongs to the whole package, at its root.
ROOT_MODULES = {
    "__init__", "_install", "_releases", "_torchrl_lookup", "_ensemble", "_compile",
    "_directory_cleanup", "_moved_modules", "utils", "ray_buffer", "sample_units",
}
FAMILY_PREFIXES = ("_storage", "_sampler", "_buffer", "_writer", "_checkpoint", "_priority", "_ray_", "_torch_")


def module_files() -> dict[str, Path]:
    files = {"torchrl_compat_trees": ROOT / "torchrl_compat_trees.py"}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its code."""
    files = module_files()
    graph = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names if alias.name in files}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module
                for alias in node.names:
                    if f"{source}.{alias.name}" in files:
                        graph[name].add(f"{source}.{alias.name}")
                    elif source in files:
                        graph[name].add(source)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (or with a self-loop)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def package_of(module: str) -> str:
    """The family (or private package) a module belongs to; a root module is its own."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FAMILIES | PRIVATE_PACKAGES else module


def test_each_family_s_private_modules_live_in_its_package():
    at_root = {path.stem for path in PACKAGE.glob("*.py")}
    assert at_root == ROOT_MODULES, f"unexpected at the root: {sorted(at_root - ROOT_MODULES)}"
    assert not [name for name in at_root if name.startswith(FAMILY_PREFIXES)]
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert packages == FAMILIES | PRIVATE_PACKAGES


def test_no_import_circle_between_modules():
    graph = import_graph()
    assert len(graph) > 60  # every module was read
    assert circles(graph) == []


def test_no_import_circle_between_packages():
    graph = import_graph()
    families: dict[str, set[str]] = {}
    for module, imported in graph.items():
        if module == "torchrl_compat":  # the package's __init__ gathers every family
            continue
        source = package_of(module)
        families.setdefault(source, set())
        families[source] |= {package_of(other) for other in imported if other != "torchrl_compat"} - {source}
    for targets in families.values():
        for target in targets:
            families.setdefault(target, set())
    assert circles(families) == []


def test_the_circle_finder_finds_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"a"}}) == [["a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_module_name_is_the_module_it_became(old):
    import importlib

    module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED_MODULES[old])
    assert module.__name__ == module.__spec__.name == MOVED_MODULES[old]


MANIFEST = json.loads((BEFORE / "manifest.json").read_text())


def _new_name(qualified: str) -> str:
    module, _, name = qualified.rpartition(".")
    return f"{MOVED_MODULES.get(module, module)}.{name}"


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_what_the_earlier_layout_pickled_loads(name):
    entry = MANIFEST[name]
    obj = pickle.loads((BEFORE / f"{name}.pkl").read_bytes())
    qualified = f"{type(obj).__module__}.{type(obj).__qualname__}"
    assert qualified == _new_name(entry["type"])
    if "len" in entry:
        assert len(obj) == entry["len"]
    if isinstance(obj, torchrl_compat.ReplayBuffer):
        assert 0 < len(obj.sample(4)) <= 4  # a sampler without replacement may end its epoch
        if "ids" in entry:
            assert obj[: len(obj)]["id"].tolist() == entry["ids"]


@pytest.mark.parametrize("name", sorted(n for n, entry in MANIFEST.items() if "dumps" in entry))
def test_what_the_earlier_layout_dumped_loads(name, tmp_path):
    entry = MANIFEST[name]
    rb = pickle.loads((BEFORE / f"{name}.pkl").read_bytes())
    rb.empty()
    assert len(rb) == 0
    rb.loads(BEFORE / entry["dumps"])
    assert rb[: len(rb)]["id"].tolist() == entry["ids"]
    torch.manual_seed(0)
    assert len(rb.sample(4)) == 4
