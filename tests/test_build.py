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


@pytest.mark.parametrize("source", sorted(glob.glob(os.path.join(ROOT, "ckernels", "*.c"))))
def test_kernels_are_plain_c99(source, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    result = subprocess.run(
        [cc, "-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-O2", "-c", source,
         "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    with open(source) as f:
        text = f.read()
    assert "Python.h" not in text and "numpy" not in text
