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

# The kernel tests again, against a build with Cython's bounds / wrap-around checks on.
test-debug: setup
	REPLAY_CYTHON_DEBUG=1 $(PYTHON) setup.py -q build_ext --inplace --force
	$(PYTHON) -m pytest tests -q -k "not slow"
	$(PYTHON) setup.py -q build_ext --inplace --force

demo: setup build
	$(PYTHON) demo.py

bench: setup build
	$(PYTHON) -m pytest bench -q --benchmark-columns=min,median,mean,rounds --benchmark-group-by=group

clean:
	rm -rf build replay.c replay*.so .pytest_cache .benchmarks
