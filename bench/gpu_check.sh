#!/usr/bin/env bash
# One device call: the CUDA tests of the device path, then the GPU table.
#   bash bench/gpu_check.sh [OUT_DIR]
set -o pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-.}}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python -m pytest -q -p no:cacheprovider -rs tests/test_device_replay.py tests/test_device_buffers.py tests/test_samplers_trees.py \
    tests/test_slices.py tests/test_samplers_slices.py 2>&1 | tee "$out/gpu_tests.log"
tests=$?
python bench/gpu_replay.py --out "$out/gpu_replay.txt" 2>&1 | tee "$out/gpu_replay.log"
bench=$?
exit $(( tests || bench ))
