"""The extension is built against numpy only, and the kernels are plain C99."""
import glob
import os
import shutil
import subprocess
import sys

import pytest

import replay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dynamic_info(path):
    readelf = shutil.which("readelf")
    nm = shutil.which("nm")
    if readelf is None or nm is None:
        pytest.skip("binutils (readelf, nm) not installed")
    needed = subprocess.run([readelf, "-d", path], capture_output=True, text=True, check=True).stdout
    undefined = subprocess.run([nm, "-D", "--undefined-only", path], capture_output=True, text=True, check=True).stdout
    return needed, undefined


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF inspection")
def test_extension_does_not_link_torch():
    needed, undefined = _dynamic_info(replay.__file__)
    for lib in ("torch", "c10"):
        assert lib not in needed, f"replay links against {lib}: {needed}"
    # C++ symbols of libtorch / libc10 would be mangled into the _ZN3c10 / _ZN2at namespaces.
    for prefix in ("_ZN3c10", "_ZN2at", "_ZN5torch"):
        assert prefix not in undefined


def test_import_does_not_import_torch():
    code = "import sys, replay; assert 'torch' not in sys.modules, 'replay imported torch'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# With -DRP_PORTABLE too: every GCC-extension fallback, the code MSVC builds.
@pytest.mark.parametrize("flags", [[], ["-DRP_PORTABLE"]], ids=["extensions", "portable"])
@pytest.mark.parametrize("source", sorted(glob.glob(os.path.join(ROOT, "ckernels", "*.c"))))
def test_kernels_are_plain_c99(source, flags, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    result = subprocess.run(
        [cc, "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-O2", *flags, "-c", source,
         "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    with open(source) as f:
        text = f.read()
    assert "Python.h" not in text and "numpy" not in text


# -----------------------------------------------------------------------------
# The installed package (make setup: pip install --no-build-isolation -e .)
# -----------------------------------------------------------------------------
def _outside_the_clone(tmp_path, code, **env_update):
    env = dict(os.environ, **env_update)
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_installed_package_is_the_one_tested(installed_package, tmp_path):
    """From any directory the installed package is the code these tests import: this clone's
    (make setup: pip install -e .), or the wheel's where the tests run against one (make
    test-matrix, from a copy of the clone without its sources)."""
    import torchrl_compat
    import torchrl_compat_trees

    code = "import replay, torchrl_compat, torchrl_compat_trees as t; print(replay.__file__, torchrl_compat.__file__, t.__file__)"
    proc = _outside_the_clone(tmp_path, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tested = [os.path.realpath(m.__file__) for m in (replay, torchrl_compat, torchrl_compat_trees)]
    assert [os.path.realpath(path) for path in proc.stdout.split()] == tested
    assert os.path.dirname(tested[0]) == os.path.dirname(tested[2])  # replay beside the hook module


def test_installed_startup_hooks(installed_package, tmp_path):
    import ast
    import sysconfig

    with open(os.path.join(ROOT, "setup.py")) as file:
        tree = ast.parse(file.read())
    hooks = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and [t.id for t in node.targets] == ["STARTUP_HOOKS"])
    assert "torchrl_compat_trees.pth" in hooks
    site_packages = sysconfig.get_paths()["purelib"]
    for hook in hooks:
        with open(os.path.join(ROOT, hook), "rb") as source, open(os.path.join(site_packages, hook), "rb") as installed:
            assert installed.read() == source.read(), hook
    pytest.importorskip("torchrl")
    from native_trees import torchrl_trees_load

    # each variable set at start-up: replay's trees in torchrl (where torchrl's own fail to
    # load; where they load, 1 keeps them), then the whole install()
    trees = "torchrl._torchrl" if torchrl_trees_load() else "replay"
    checks = [
        ("TORCHRL_COMPAT_INSTALL_TREES", "import sys; assert 'torchrl_compat_trees' in sys.modules\n"
         "from torchrl.data import PrioritizedSampler\n"
         "print(type(PrioritizedSampler(10, 0.7, 0.9)._sum_tree).__module__)\n", trees),
        ("TORCHRL_COMPAT_INSTALL", "import torchrl.data, torchrl_compat\n"
         "assert torchrl.data.ReplayBuffer is torchrl_compat.ReplayBuffer\n"
         "print(type(torchrl.data.ReplayBuffer().storage).__module__)\n", "torchrl_compat.storages"),
    ]
    for variable, code, expected in checks:
        proc = _outside_the_clone(tmp_path, code, **{variable: "1", "RL_WARNINGS": "0"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split()[-1] == expected, variable


def test_venv_without_pip_says_what_to_install(tmp_path):
    """make's own environment, from an interpreter whose venv makes no pip (as Debian's python3
    without python3-venv): one line says what to install, and nothing is left behind."""
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    base = tmp_path / "python3"
    base.write_text(f'#!/bin/sh\nexec {sys.executable} "$@" --without-pip\n')
    base.chmod(0o755)
    venv = tmp_path / "venv"
    env = dict(os.environ)
    env.pop("MAKEFLAGS", None)
    proc = subprocess.run(["make", "-s", f"{venv}/bin/python", f"VENV={venv}", f"BASE_PYTHON={base}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stdout.splitlines()[-1] == (
        f"make: '{base} -m venv' gives no pip here: install your system's venv package "
        "(Debian/Ubuntu: apt install python3-venv) or pick another Python with "
        "'make BASE_PYTHON=/path/to/python3'"
    )
    assert not venv.exists()


def test_setup_py_with_an_old_setuptools_says_what_to_upgrade(tmp_path):
    """``python setup.py build_ext --inplace`` in a fresh environment whose setuptools predates
    the SPDX license string (Python 3.11's venv brings 65): one line says what to upgrade."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "setuptools==65.5.0"],
        capture_output=True, text=True, timeout=300,
    )
    if install.returncode != 0 and not os.environ.get("CI"):  # CI reaches the package index
        pytest.skip(f"setuptools 65.5.0 could not be installed here: {install.stderr[-300:]}")
    assert install.returncode == 0, install.stderr[-2000:]
    proc = subprocess.run([python, "setup.py", "build_ext", "--inplace"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "setup.py needs setuptools>=77 (this environment has 65.5.0): "
        "python -m pip install -U 'setuptools>=77' Cython numpy"
    ]
