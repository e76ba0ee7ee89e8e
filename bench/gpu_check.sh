#!/usr/bin/env bash
# The GPU run in two device calls (bench/GPU_RUN.md gives them), each one command that ends
# well inside its limit and writes its logs and results under OUT_DIR as it goes:
#
#   bash bench/gpu_check.sh tests --gpu|--cpu [--budget SECONDS] [OUT_DIR] [-- PYTEST_ARGS...]
#   bash bench/gpu_check.sh table --gpu|--cpu [--budget SECONDS] [OUT_DIR]
#
# tests: the CUDA tests (every test that skips without a device: `-m cuda`), file by file from
#   the cheapest so that a cut falls on the slowest, the CUDA graphs' file last, under
#   `-x --timeout 60`; then the device path's test files whole, on the device's Python, torch
#   and numpy. Writes gpu_env.txt, gpu_tests.log, gpu_tests_cuda.xml, gpu_tests_device.xml.
#   With `-- PYTEST_ARGS...` (a rerun of what failed: files or test ids), those alone, in one
#   phase named "only".
# table: bench/gpu_replay.py with its own time budget. Writes gpu_env.txt, gpu_replay.txt
#   (rewritten after every row) and gpu_replay.log.
#
# --gpu says the run is on a GPU machine: there, python3 (the interpreter that holds torch) runs
# everything, a missing CUDA device is an error, and so is a test skipped for want of one
# (REPLAY_REQUIRE_CUDA=1, see tests/conftest.py). --cpu runs the same here, with the project's
# .venv, to check the script before spending device time. REPLAY_PYTHON overrides the choice.
# Budgets (default 150 s for tests, 200 s for the table) count from the start of the command;
# OUT_DIR defaults to $OUT, else build/gpu-check.
#
# The carried packages and replay's extension for the device's Python 3.12 come from
# `bash bench/gpu_prepare.sh`, run here before the calls (it fills .whl/).
set -o pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD

usage() { echo "usage: bash bench/gpu_check.sh tests|table --gpu|--cpu [--budget SECONDS] [OUT_DIR] [-- PYTEST_ARGS...]" >&2; exit 2; }
mode=$1
[[ $mode == tests || $mode == table ]] || usage
shift
where= budget= out= only=()
while (($#)); do
    case $1 in
        --) shift; only=("$@"); break ;;
        --gpu|--cpu) where=${1#--} ;;
        --budget) budget=$2; shift ;;
        -*) usage ;;
        *) out=$1 ;;
    esac
    shift
done
[[ -n $where ]] || usage
out=${out:-${OUT:-build/gpu-check}}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
deadline=$((SECONDS + ${budget:-$([[ $mode == tests ]] && echo 150 || echo 200)}))

# ----------------------------------------------------------------------------- the interpreter
if [[ $where == cpu && -x $root/.venv/bin/python ]]; then default=$root/.venv/bin/python; else default=python3; fi
REPLAY_PYTHON=$(command -v "${REPLAY_PYTHON:-$default}") || { echo "gpu_check: no interpreter '${REPLAY_PYTHON:-$default}'" >&2; exit 2; }
[[ $REPLAY_PYTHON != "$root/bench/gpu/python" ]] || { echo "gpu_check: REPLAY_PYTHON must not be the wrapper itself" >&2; exit 2; }
export REPLAY_PYTHON
chmod +x bench/gpu/python 2>/dev/null  # in case a copy lost its mode bits
export PATH=$root/bench/gpu:$PATH
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[[ $where == gpu ]] && export REPLAY_REQUIRE_CUDA=1
python -c 'import sys' || { echo "gpu_check: the wrapper bench/gpu/python does not run $REPLAY_PYTHON" >&2; exit 2; }

# ----------------------------------------------------------------------------- replay's extension
# This checkout's build when it loads (here); else the one bench/gpu_prepare.sh built for the
# device's Python (.whl/replay<EXT_SUFFIX>); else one compiled now from the carried replay.c,
# with the compiler and the interpreter's and numpy's headers (no Cython or setuptools needed).
ensure_extension() {
    python -c 'import replay' 2>/dev/null && return 0
    local suffix src inc npinc
    suffix=$(python -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))') || return 1
    if [[ -f .whl/replay$suffix ]]; then
        cp .whl/replay"$suffix" . && python -c 'import replay' && { echo "replay: the carried build .whl/replay$suffix"; return 0; }
        rm -f replay"$suffix"
    fi
    src=.whl/replay.c
    [[ -f $src ]] || src=replay.c
    [[ -f $src ]] || { echo "gpu_check: no replay.c to build replay$suffix from (bash bench/gpu_prepare.sh makes .whl/replay.c)" >&2; return 1; }
    inc=$(python -c 'import sysconfig; print(sysconfig.get_paths()["include"])') || return 1
    npinc=$(python -c 'import numpy; print(numpy.get_include())') || return 1
    echo "replay: compiling $src for $suffix"
    ${CC:-cc} -shared -fPIC -O3 -DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION -I"$inc" -I"$npinc" -I. -Ickernels \
        "$src" ckernels/segtree.c ckernels/slices.c ckernels/perm.c ckernels/prng.c ckernels/rows.c -o replay"$suffix" \
        && python -c 'import replay'
}
ensure_extension || { echo "gpu_check: replay's extension does not load" >&2; exit 2; }

# ----------------------------------------------------------------------------- versions
{
    echo "$mode run, --$where, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), budget $((deadline - SECONDS)) s"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
    python - <<'EOF'
import platform, sys
print(f"python {platform.python_version()} at {sys.executable}")
import numpy, torch
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), numpy {numpy.__version__}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB, compute capability {p.major}.{p.minor}")
else:
    print("device: no CUDA device seen by torch")
for name in ("tensordict", "torchrl", "pytest", "pytest_timeout", "hypothesis"):
    try:
        module = __import__(name)
        print(f"{name} {getattr(module, '__version__', '?')} from {module.__file__}")
    except Exception as error:  # noqa: BLE001 - reported, not fatal here
        print(f"{name}: not importable ({type(error).__name__}: {error})")
import replay
print(f"replay from {replay.__file__}")
EOF
} 2>&1 | tee "$out/gpu_env.txt"

if [[ $where == gpu ]] && ! python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "gpu_check: --gpu, but torch sees no CUDA device (see $out/gpu_env.txt)" >&2
    exit 2
fi

left() { echo $((deadline - SECONDS)); }

# ----------------------------------------------------------------------------- tests
if [[ $mode == tests ]]; then
    # The CUDA tests, from the device path's own small loops to the files that build buffers
    # and compare with torchrl on the device; the CUDA graphs, never captured before, last.
    CUDA_FILES=(
        tests/test_device_replay.py tests/test_device_buffers.py tests/test_samplers_trees.py
        tests/test_slices.py tests/test_samplers_slices.py tests/test_segtree.py tests/test_samplers.py
        tests/test_samplers_releases.py tests/test_storages.py tests/test_replay_buffers.py
        tests/test_samplers_capacity.py tests/test_device_graphs.py
    )
    # Then the device path's files whole: the torch-op path against replay's kernels, on the
    # device machine's Python, torch and numpy.
    DEVICE_FILES=(
        tests/test_device_replay.py tests/test_device_buffers.py tests/test_samplers_trees.py
        tests/test_slices.py tests/test_samplers_slices.py tests/test_device_graphs.py
    )
    per_test=()
    if python -c 'import pytest_timeout' 2>/dev/null; then
        per_test=(--timeout 60)
    elif [[ $where == gpu ]]; then
        echo "gpu_check: pytest-timeout is missing on the GPU machine (its image has it): carry its wheel in .whl/" >&2
        exit 2
    else
        echo "gpu_check: pytest-timeout is not installed here: running without --timeout 60" | tee -a "$out/gpu_tests.log"
    fi
    status=0
    phase() {  # phase NAME MARKER ARGS... (an empty MARKER selects everything ARGS name)
        local name=$1 marker=(-m "$2") rc
        [[ -n $2 ]] || marker=()
        shift 2
        if (($(left) < 15)); then
            echo "== $name: not started, $(left) s of the budget left" | tee -a "$out/gpu_tests.log"
            status=1
            return
        fi
        echo "== $name: ${marker[*]} $*, $(left) s left" | tee -a "$out/gpu_tests.log"
        timeout -k 5 "$(left)" python -m pytest -x "${per_test[@]}" -q -p no:cacheprovider -rfEs "${marker[@]}" \
            --junitxml="$out/gpu_tests_$name.xml" "$@" 2>&1 | tee -a "$out/gpu_tests.log"
        rc=$?
        ((rc == 124 || rc == 137)) && echo "== $name: cut at the end of the budget" | tee -a "$out/gpu_tests.log"
        echo "== $name: exit $rc" | tee -a "$out/gpu_tests.log"
        ((rc == 0)) || status=1
    }
    if ((${#only[@]})); then
        phase only "" "${only[@]}"
    else
        phase cuda cuda "${CUDA_FILES[@]}"
        phase device "not cuda" "${DEVICE_FILES[@]}"
    fi
    echo "== tests: $([[ $status == 0 ]] && echo passed || echo FAILED) in $SECONDS s" | tee -a "$out/gpu_tests.log"
    exit $status
fi

# ----------------------------------------------------------------------------- table
args=(--budget "$(left)" --out "$out/gpu_replay.txt")
[[ $where == cpu ]] && args+=(--cpu)
# gpu_replay.py stops itself at the end of the budget; the timeout is the last resort.
timeout -k 5 "$(($(left) + 30))" python bench/gpu_replay.py "${args[@]}" 2>&1 | tee "$out/gpu_replay.log"
rc=$?
echo "== table: exit $rc in $SECONDS s" | tee -a "$out/gpu_replay.log"
exit $rc
