#!/usr/bin/env bash
# Fills .whl/ (git ignores it) with what the GPU machine's two calls carry (bench/GPU_RUN.md):
#
#  * the wheels its Python 3.12 lacks for torchrl 0.14.1, pinned below (torch 2.11, numpy,
#    cloudpickle, packaging, zipp, pytest, pytest-timeout and hypothesis are on its image);
#  * replay's extension built for CPython 3.12 (replay.cpython-312-x86_64-linux-gnu.so: it
#    needs numpy's ABI only, no torch), and replay.c, from which bench/gpu_check.sh compiles
#    it there if the carried build does not load.
#
#   bash bench/gpu_prepare.sh            # here, in the checkout the device calls are made from
#
# Needs pip's access to PyPI, `make build` done (replay.c), and a Python 3.12 for the
# extension (PY312, else python3.12 on PATH, else pyenv's); without one the extension is
# left to the device machine's compiler. Prints what .whl/ holds and its size (a call carries
# 64 MiB at most, the checkout included).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.whl
WHEELS=(
    torchrl==0.14.1
    tensordict==0.14.3      # torchrl 0.14.1: tensordict>=0.14.3,<0.15
    pyvers==0.2.3           # both: pyvers>=0.2.3 (torchrl), <0.3 (tensordict)
    hoptorch==0.1.4         # torchrl: hoptorch>=0.1.4
    orjson==3.13.0          # tensordict, Python < 3.13
    importlib_metadata==10.2.0  # tensordict
    lazy-importer==0.1.0    # importlib_metadata 10
)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)

git check-ignore -q "$dest/x.whl" || { echo "gpu_prepare: git does not ignore $dest/ (.gitignore lists it)" >&2; exit 1; }
mkdir -p "$dest"
rm -f "$dest"/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]/#/--platform=}" -d "$dest" "${WHEELS[@]}"

# Every requirement of the carried wheels is either carried or on the device's image.
python3 - "$dest" <<'EOF'
import re, sys, zipfile
from pathlib import Path

ON_THE_IMAGE = {"torch", "numpy", "cloudpickle", "packaging", "zipp"}
wheels = sorted(Path(sys.argv[1]).glob("*.whl"))
carried = {re.split(r"-\d", w.name)[0].lower().replace("_", "-") for w in wheels}
missing = []
for wheel in wheels:
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    for line in meta.splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            name = re.match(r"Requires-Dist:\s*([A-Za-z0-9_.\-]+)", line).group(1).lower().replace("_", "-")
            if name not in carried and name not in ON_THE_IMAGE:
                missing.append(f"{wheel.name}: {line}")
if missing:
    sys.exit("gpu_prepare: requirements neither carried nor on the device's image:\n" + "\n".join(missing))
EOF

# replay's extension for CPython 3.12, built in a Python 3.12 environment of its own.
[[ -f replay.c ]] || { echo "gpu_prepare: no replay.c: run make build first" >&2; exit 1; }
cp replay.c "$dest/replay.c"
py312=
for candidate in ${PY312:-} python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
        py312=$candidate
        break
    fi
done
if [[ -n $py312 ]]; then
    venv=build/venv-py312
    [[ -x $venv/bin/python ]] || "$py312" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check numpy==2.4.6 Cython==3.3.1 setuptools==84.2.1
    "$venv/bin/python" setup.py -q build_ext --force --build-temp build/py312-temp --build-lib build/py312-lib
    cp build/py312-lib/replay.cpython-312-x86_64-linux-gnu.so "$dest/"
    strip --strip-debug "$dest/replay.cpython-312-x86_64-linux-gnu.so" 2>/dev/null || true  # its debug sections are most of it
    (cd build/py312-lib && ../../"$venv"/bin/python -c 'import replay; print("built", replay.__file__)')
else
    echo "gpu_prepare: no Python 3.12 here (set PY312): the device machine compiles replay.c itself"
fi
ls -l "$dest"
du -sh "$dest"
