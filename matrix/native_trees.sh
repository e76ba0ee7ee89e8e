#!/bin/sh
# make test-native-trees: our trees against torchrl's own compiled trees, in the two
# environments where those load (torch 2.15.0 + torchrl 0.14.1, torch 2.9.1 + torchrl 0.11.0).
#
# Usage: matrix/native_trees.sh CELL [PYTEST ARGS...]
#   CELL: a matrix/<CELL>.txt (its torch / tensordict / torchrl pins).
# Makes build/native-trees/CELL/venv once (again when matrix/CELL.txt or requirements-test.txt
# is newer than it), offline, from the wheel cache (MATRIX_WHEELS, default build/matrix-wheels,
# what make test-matrix downloads; several folders separated by spaces) and the repaired wheel
# (WHEELHOUSE, default build/wheelhouse, make wheel's): the cell's pins, requirements-test.txt
# less torch and the build tools, and replay-torchrl-compat (for its start-up hooks; the tests
# import this clone's sources and in-place build, as make test does). setup.py's build tools
# (setuptools>=77, Cython: the start-up hook tests build the package) come from the same folders
# when they hold them, at whatever release they hold. Then runs pytest from the repository
# root with NATIVE_TREES_TESTS (the test files) and the arguments given.
set -eu
cell=$1
shift
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
wheels=${MATRIX_WHEELS:-build/matrix-wheels}
wheelhouse=${WHEELHOUSE:-build/wheelhouse}
base_python=${BASE_PYTHON:-python3}
find_links="-f $wheelhouse"
for folder in $wheels; do find_links="$find_links -f $folder"; done
pip_offline="-m pip install -qq --disable-pip-version-check --no-index --only-binary :all: $find_links"
pins=matrix/$cell.txt
test -f "$pins" || { echo "native-trees: no $pins" >&2; exit 2; }
work=build/native-trees/$cell
venv=$work/venv
stamp=$venv/.setup-done
if ! test -f "$stamp" || test "$pins" -nt "$stamp" || test requirements-test.txt -nt "$stamp"; then
    rm -rf "$venv"
    mkdir -p "$work"
    "$base_python" -m venv "$venv"
    grep -v -E '^(torch|setuptools|Cython)==' requirements-test.txt > "$work/test-requirements.txt"
    # Offline: everything from the cache, nothing built.
    "$venv/bin/python" $pip_offline -r "$pins" -r "$work/test-requirements.txt" replay-torchrl-compat \
        || { echo "native-trees: installing $cell from $wheels and $wheelhouse failed (make wheel, and MATRIX_WHEELS=<the folder make test-matrix downloaded into>)" >&2; exit 1; }
    touch "$stamp"
fi
if ! "$venv/bin/python" -c "import sys, Cython, setuptools; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" 2>/dev/null; then
    "$venv/bin/python" $pip_offline "setuptools>=77" Cython \
        || echo "native-trees: no setuptools>=77 / Cython wheel in $wheels: the tests that build the package will error" >&2
fi
"$venv/bin/python" -c "import sys, torch, torchrl; print('native-trees:', '$cell', 'python', sys.version.split()[0], 'torch', torch.__version__, 'torchrl', torchrl.__version__)"
exec "$venv/bin/python" -m pytest ${NATIVE_TREES_TESTS:-tests/test_native_tree_differential.py} -q -p no:cacheprovider "$@"
