# `make test` and `make demo` set everything up from a fresh clone, then run.
PYTHON ?= python
PIP_FLAGS ?= -q --disable-pip-version-check

.PHONY: setup build test test-debug demo bench clean

setup:
	$(PYTHON) -m pip install $(PIP_FLAGS) -r requirements-dev.txt

build:
	$(PYTHON) setup.py -q build_ext --inplace

test: setup build
	$(PYTHON) -m pytest tests -q
	$(MAKE) --no-print-directory test-debug

# The kernel tests again, against a build with Cython's bounds / wrap-around checks on
# (REPLAY_CYTHON_DEBUG=1), built aside so the in-place release build stays as it is.
DEBUG_DIR = build/debug-lib
test-debug:
	REPLAY_CYTHON_DEBUG=1 $(PYTHON) setup.py -q build_ext --force --build-temp build/debug-temp --build-lib $(DEBUG_DIR)
	REPLAY_EXTENSION_DIR=$(DEBUG_DIR) $(PYTHON) -m pytest -q -p no:cacheprovider \
		tests/test_segtree.py tests/test_slices.py tests/test_perm.py

demo: setup build
	$(PYTHON) demo.py

bench: setup build
	$(PYTHON) -m pytest bench -q --benchmark-columns=min,median,mean,rounds --benchmark-group-by=group

clean:
	rm -rf build replay.c replay*.so .pytest_cache .benchmarks
