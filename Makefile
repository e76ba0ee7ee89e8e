# `make test` and `make demo` set everything up from a fresh clone, then run.
#
# The environment: the active virtual environment ($VIRTUAL_ENV) or the interpreter named with
# `make PYTHON=...` if there is one, else the project's own, $(VENV), made with
# `$(BASE_PYTHON) -m venv` (so a system Python that refuses pip installs is never touched).
# The pinned development requirements and the package itself (editable: pip install -e .) go
# into it, so scripts anywhere import this clone's code and the start-up hooks are installed.
BASE_PYTHON ?= python3
VENV ?= .venv
# -qq: pip's progress and its notes on index locations stay out of the output; errors do not.
PIP_FLAGS ?= -qq --disable-pip-version-check
PIP_EDITABLE = --no-build-isolation -e .

ifeq ($(origin PYTHON)$(VIRTUAL_ENV),undefined)
PYTHON := $(VENV)/bin/python
# The project environment is set up again only when what it is made from changes.
ENV_READY := $(VENV)/.setup-done
else
PYTHON ?= python
ENV_READY := setup
endif

# make test's runs against torchrl 0.14 and against the newest tensordict have environments of
# their own.
TORCHRL14_VENV = build/venv-torchrl-0.14
LATEST_VENV = build/venv-tensordict-latest
LATEST_PYTHON = $(LATEST_VENV)/bin/python
SETUP_INPUTS = requirements-test.txt pyproject.toml setup.py $(wildcard *.pth)
TORCHRL_PIN = $(shell grep '^torchrl==' requirements-dev.txt)

.PHONY: setup build test test-debug test-tensordict-latest test-torchrl-suites demo bench clean

# $(call make_venv,DIR): a virtual environment with pip in DIR, or one line saying what is missing.
define make_venv
	@test -x $(1)/bin/python || $(BASE_PYTHON) -m venv $(1) || { rm -rf $(1); false; } \
		&& $(1)/bin/python -m pip --version >/dev/null 2>&1 \
		|| { rm -rf $(1); echo "make: '$(BASE_PYTHON) -m venv' gives no pip here: install your system's venv package (Debian/Ubuntu: apt install python3-venv) or pick another Python with 'make BASE_PYTHON=/path/to/python3'"; exit 1; }
endef

$(VENV)/bin/python:
	$(call make_venv,$(VENV))

define install_dev
	$(PYTHON) -m pip install $(PIP_FLAGS) -r requirements-dev.txt
	$(PYTHON) -m pip install $(PIP_FLAGS) $(PIP_EDITABLE)
endef

$(VENV)/.setup-done: requirements-dev.txt $(SETUP_INPUTS) | $(VENV)/bin/python
	$(install_dev)
	@touch $@

setup:
	$(install_dev)

build: $(ENV_READY)
	$(PYTHON) setup.py -q build_ext --inplace

# The whole check, what CI runs: the suite (torchrl 0.11), the kernel tests against the debug
# build, the suite again against torchrl 0.14.1, and torchrl's own suites under install() where
# they are found; then one line counting every run.
# (The run against the newest tensordict, make test-tensordict-latest, is left out of it: the
# runs already take about as long as CI allows.)
JUNIT_DIR = build/junit
JUNIT_REPORTS = $(JUNIT_DIR)/suite.xml $(JUNIT_DIR)/debug-build.xml $(JUNIT_DIR)/torchrl-0.14.xml
# Two lanes, one per core (each pytest runs on one): the suite; beside it torchrl's suites,
# the run against torchrl 0.14.1 and the debug build's kernel tests, whose output is kept in a
# log and follows the first lane's (about 17 min each, by the last CI run's timings). Each run's
# failures are counted at the end. The suite's 20 slowest tests are listed, to show where
# CI's time goes.
SECOND_LANE_LOG = $(JUNIT_DIR)/second-lane.log
test: build $(TORCHRL14_VENV)/.setup-done
	@rm -rf $(JUNIT_DIR) && mkdir -p $(JUNIT_DIR)
	-( ($(TORCHRL_SUITE_RUNS)); \
		$(TORCHRL14_TESTS) $(addprefix --ignore=,$(RELEASE_FREE_TESTS)) --junitxml=$(JUNIT_DIR)/torchrl-0.14.xml; \
		$(DEBUG_BUILD) && $(DEBUG_TESTS) --junitxml=$(JUNIT_DIR)/debug-build.xml \
	) > $(SECOND_LANE_LOG) 2>&1 & \
		$(PYTHON) -m pytest tests -q --durations=20 --junitxml=$(JUNIT_DIR)/suite.xml; \
		wait; cat $(SECOND_LANE_LOG)
	@$(PYTHON) -c "$$JUNIT_TOTAL" $(JUNIT_REPORTS) $(TORCHRL_SUITE_REPORTS)

# torchrl's own replay-buffer suites (test data, never copied into the project), each run in
# the environment of its torchrl release with every torchrl replay class replaced by ours
# (tests/torchrl_suite_plugin.py: install(), and the tests torchrl's own classes fail expected
# to fail). Each run works on a fresh copy under build/, so nothing is written beside the
# suites. 0.14's rb/test_rb_distributed.py needs Ray and torch RPC in that environment, and
# is left out.
TORCHRL_SUITES ?= ../shared/torchrl-suites
SUITE_COPIES = build/torchrl-suites
SUITE_ARGS = -q -p no:cacheprovider -p no:randomly -p torchrl_suite_plugin -o addopts= -W ignore --timeout 120
# $(call suite_run,PYTHON,FOLDER,TARGETS,REPORT,EXTRA): a fresh copy of FOLDER, then its tests
suite_run = rm -rf $(SUITE_COPIES)/$(2) && mkdir -p $(SUITE_COPIES) && cp -r $(TORCHRL_SUITES)/$(2) $(SUITE_COPIES)/ \
	&& $(call versions_line,$(1)) \
	&& interpreter=$$($(1) -c "import sys; print(sys.executable)") \
	&& cd $(SUITE_COPIES)/$(2) && PYTHONPATH=$(CURDIR)/tests $$interpreter -m pytest $(3) $(SUITE_ARGS) $(5) \
		--junitxml=$(CURDIR)/$(4)
ifneq ($(wildcard $(TORCHRL_SUITES)/torchrl-0.11.0/test_rb.py),)
TORCHRL_SUITE_REPORTS = $(JUNIT_DIR)/torchrl-0.11.0-suite.xml $(JUNIT_DIR)/torchrl-0.14-suite.xml
# (one shell command: each run in a subshell of its own, as each changes folder)
TORCHRL_SUITE_RUNS = ($(call suite_run,$(PYTHON),torchrl-0.11.0,test_rb.py,$(JUNIT_DIR)/torchrl-0.11.0-suite.xml)); \
	($(call suite_run,$(TORCHRL14_VENV)/bin/python,torchrl-0.14,rb,$(JUNIT_DIR)/torchrl-0.14-suite.xml,--ignore=rb/test_rb_distributed.py))
else
TORCHRL_SUITE_RUNS = echo "torchrl's own suites not found in $(TORCHRL_SUITES) (set TORCHRL_SUITES): not run"
endif
test-torchrl-suites: build $(TORCHRL14_VENV)/.setup-done
	-$(TORCHRL_SUITE_RUNS)
	@$(PYTHON) -c "$$JUNIT_TOTAL" $(TORCHRL_SUITE_REPORTS)

# The kernel tests again, against a build with Cython's bounds / wrap-around checks on
# (REPLAY_CYTHON_DEBUG=1) and every GCC-extension fallback of the kernels forced
# (REPLAY_PORTABLE=1: the code MSVC builds for Windows wheels), built aside so the in-place
# release build stays as it is. The release build runs the extensions' paths in the suite.
DEBUG_DIR = build/debug-lib
DEBUG_BUILD = REPLAY_CYTHON_DEBUG=1 REPLAY_PORTABLE=1 $(PYTHON) setup.py -q build_ext --force \
	--build-temp build/debug-temp --build-lib $(DEBUG_DIR)
KERNEL_TESTS = tests/test_segtree.py tests/test_segtree_large.py tests/test_segtree_binary.py tests/test_segtree_exclude.py tests/test_segtree_zeroed.py \
	tests/test_segtree_fill.py tests/test_copy_rows.py tests/test_take_rows.py tests/test_transpose.py \
	tests/test_slices.py tests/test_perm.py tests/test_samplers_trees.py tests/test_sample_units.py
DEBUG_TESTS = REPLAY_EXTENSION_DIR=$(DEBUG_DIR) $(PYTHON) -m pytest -q -p no:cacheprovider $(KERNEL_TESTS)
test-debug: $(ENV_READY)
	$(DEBUG_BUILD)
	$(DEBUG_TESTS)

# The suite against another torchrl release and its tensordict, each in an environment of its own
# made from requirements-torchrl-<release>.txt: make test-torchrl-0.14 (part of make test), and
# make test-torchrl-0.12 / make test-torchrl-0.13, run by hand.
# (precious: make would otherwise delete the marker of an environment it made on the way)
.PRECIOUS: build/venv-torchrl-%/.setup-done
build/venv-torchrl-%/.setup-done: requirements-torchrl-%.txt $(SETUP_INPUTS)
	$(call make_venv,build/venv-torchrl-$*)
	build/venv-torchrl-$*/bin/python -m pip install $(PIP_FLAGS) -r requirements-torchrl-$*.txt
	build/venv-torchrl-$*/bin/python -m pip install $(PIP_FLAGS) --no-deps $(PIP_EDITABLE)
	@touch $@

# $(call release_tests,RELEASE): the suite run in that release's environment.
release_tests = $(call versions_line,build/venv-torchrl-$(1)/bin/python) \
	&& build/venv-torchrl-$(1)/bin/python -m pytest tests -q -p no:cacheprovider
TORCHRL14_TESTS = $(call release_tests,0.14)
# What make test's run against 0.14.1 leaves out: tests that no torchrl release changes (the
# kernels, which the debug build runs again; the build, the README, the demo, the benchmark
# scripts' smoke runs), run once already.
RELEASE_FREE_TESTS = $(KERNEL_TESTS) tests/test_build.py tests/test_readme.py tests/test_demo.py tests/test_bench_scale.py
# (no .PHONY: make skips pattern rules for phony targets)
test-torchrl-%: build build/venv-torchrl-%/.setup-done
	$(call release_tests,$*)

# $(call versions_line,PYTHON): prints the torch, tensordict and torchrl versions a run uses.
versions_line = $(1) -c "import tensordict, torch, torchrl; print(f'torch {torch.__version__}, tensordict {tensordict.__version__}, torchrl {torchrl.__version__}')"

# The suite against the newest tensordict torch 2.13 installs with, in an environment of its
# own (torchrl 0.11.0 with --no-deps: it asks for tensordict<0.12 but runs on it).
$(LATEST_VENV)/.setup-done: requirements-tensordict-latest.txt $(SETUP_INPUTS) requirements-dev.txt
	$(call make_venv,$(LATEST_VENV))
	$(LATEST_PYTHON) -m pip install $(PIP_FLAGS) -r requirements-tensordict-latest.txt
	$(LATEST_PYTHON) -m pip install $(PIP_FLAGS) --no-deps $(TORCHRL_PIN)
	$(LATEST_PYTHON) -m pip install $(PIP_FLAGS) --no-deps $(PIP_EDITABLE)
	@touch $@

LATEST_TESTS = $(call versions_line,$(LATEST_PYTHON)) && $(LATEST_PYTHON) -m pytest tests -q -p no:cacheprovider
test-tensordict-latest: build $(LATEST_VENV)/.setup-done
	$(LATEST_TESTS)

demo: build
	$(PYTHON) demo.py

# Every test file alone, each in a fresh interpreter (not part of make test: the imports alone
# take about as long as the suite): a file that passes only after another has run fails here.
# The files that failed are listed at the end.
.PHONY: test-each-file
test-each-file: build
	@failed=""; for file in tests/test_*.py; do \
		$(PYTHON) -m pytest $$file -q -p no:cacheprovider >build/each-file.log 2>&1 \
			&& echo "passed alone: $$file" || { failed="$$failed $$file"; echo "FAILED alone: $$file"; tail -5 build/each-file.log; }; \
	done; test -z "$$failed" || { echo "failed alone:$$failed"; exit 1; }

# ---------------------------------------------------------------------------------------------
# Wheels (none of this is part of make test): the packaging tools in an environment of their
# own, made from requirements-wheel.txt.
.PHONY: wheel check-kernels-cross test-matrix test-matrix-pythons
WHEEL_VENV = build/venv-wheel
WHEEL_TOOLS = $(WHEEL_VENV)/.setup-done
DIST_DIR = build/dist
WHEELHOUSE = build/wheelhouse
SMOKE_VENV = build/venv-smoke

$(WHEEL_TOOLS): requirements-wheel.txt
	$(call make_venv,$(WHEEL_VENV))
	$(WHEEL_VENV)/bin/python -m pip install $(PIP_FLAGS) -r requirements-wheel.txt
	@touch $@

# A Python built with a run path (pyenv's) links extensions with it: the wheel would look for
# libraries in this machine's Python first (manylinux images, where cibuildwheel builds, have
# none). $$(python -c "$(LDSHARED_NO_RPATH)"): that Python's link command without it
# (matrix/run.py does the same for the other Pythons' wheels).
LDSHARED_NO_RPATH = import re, sysconfig; print(re.sub(r'\s*-Wl,-rpath,\S+', '', sysconfig.get_config_var('LDSHARED') or ''))

# python -m build makes the sdist, then the wheel from the unpacked sdist in an isolated
# environment holding only [build-system]'s requirements; auditwheel gives the Linux wheel the
# manylinux tag of the oldest glibc its symbols need, and strips its debug symbols. Then a
# fresh environment installs that wheel and its requirements (torch as pinned for the tests)
# with nothing built (--only-binary :all:) and runs tests/wheel_smoke.py outside the clone.
wheel: $(WHEEL_TOOLS)
	rm -rf $(DIST_DIR) $(WHEELHOUSE) $(SMOKE_VENV)
	LDSHARED="$$($(WHEEL_VENV)/bin/python -c "$(LDSHARED_NO_RPATH)")" \
		$(WHEEL_VENV)/bin/python -m build --quiet --outdir $(DIST_DIR) .
	PATH=$(CURDIR)/$(WHEEL_VENV)/bin:$$PATH auditwheel repair --strip --wheel-dir $(WHEELHOUSE) $(DIST_DIR)/*.whl
	$(WHEEL_VENV)/bin/auditwheel show $(WHEELHOUSE)/*.whl
	$(WHEEL_VENV)/bin/python -m twine check --strict $(DIST_DIR)/*.tar.gz $(WHEELHOUSE)/*.whl
	$(call make_venv,$(SMOKE_VENV))
	$(SMOKE_VENV)/bin/python -m pip install $(PIP_FLAGS) --only-binary :all: -c requirements-test.txt $(WHEELHOUSE)/*.whl
	cd $(SMOKE_VENV) && bin/python $(CURDIR)/tests/wheel_smoke.py

# make test-matrix (not part of make test nor CI: its torch releases are several GB of
# downloads, kept in build/matrix-wheels): the repaired wheel in a fresh environment for each
# torch from 2.9.1 to 2.15.0 with torchrl 0.11 / 0.14.1 (matrix/*.txt), each running our suite
# (from a copy of the clone without its sources) and torchrl's own replay suite of that release
# as make test runs it (TORCHRL_SUITES, SUITE_ARGS: tests/torchrl_suite_plugin.py); their
# counts go into the README's supported-versions table (matrix/run.py).
# make test-matrix-pythons: the same on Python 3.10, 3.12 and 3.13, each with a wheel that pip
# builds for it from the sdist (in isolation, with only its build requirements), repaired.
MATRIX_RUN = $(WHEEL_VENV)/bin/python matrix/run.py --wheelhouse $(WHEELHOUSE) \
	--suites $(TORCHRL_SUITES) --suite-args="$(SUITE_ARGS)" --readme README.md
test-matrix: wheel
	$(MATRIX_RUN)

test-matrix-pythons: wheel
	$(MATRIX_RUN) --pythons --sdist $(DIST_DIR)/*.tar.gz

# make test-native-trees (not part of make test nor CI, like test-matrix): our trees and
# samplers against torchrl's own compiled trees, in the two environments where those load:
# torch 2.15.0 + torchrl 0.14.1 and torch 2.9.1 + torchrl 0.11.0 (matrix/<cell>.txt), each made
# once under build/native-trees/ by matrix/native_trees.sh, offline, from MATRIX_WHEELS (what
# make test-matrix downloads) and the repaired wheel in WHEELHOUSE (make wheel), then the
# differential tests and the ones that compare with torchrl's trees, run from this clone.
# Elsewhere: make test-native-trees MATRIX_WHEELS="<folder> ..." (several folders: spaces).
.PHONY: test-native-trees
MATRIX_WHEELS ?= build/matrix-wheels
NATIVE_TREES_CELLS = torch2.15.0-torchrl0.14 torch2.9.1-torchrl0.11
NATIVE_TREES_TESTS = tests/test_native_tree_differential.py tests/test_install_segment_trees.py \
	tests/test_samplers_capacity.py tests/test_samplers_prioritized_slices.py tests/test_samplers_releases.py
test-native-trees:
	@failed=""; for cell in $(NATIVE_TREES_CELLS); do \
		MATRIX_WHEELS="$(MATRIX_WHEELS)" WHEELHOUSE="$(WHEELHOUSE)" BASE_PYTHON="$(BASE_PYTHON)" \
		NATIVE_TREES_TESTS="$(NATIVE_TREES_TESTS)" matrix/native_trees.sh $$cell -rxf \
			|| failed="$$failed $$cell"; \
	done; test -z "$$failed" || { echo "test-native-trees failed in:$$failed"; exit 1; }

# The kernels cross-compiled with zig cc (PyPI's ziglang) for x86_64 and aarch64 Linux, macOS
# and Windows, each with GCC's extensions and with every fallback forced (-DRP_PORTABLE, what
# MSVC builds), warnings as errors.
ZIG_TARGETS = x86_64-linux-gnu aarch64-linux-gnu x86_64-macos aarch64-macos x86_64-windows-gnu aarch64-windows-gnu
CROSS_DIR = build/cross
check-kernels-cross: $(WHEEL_TOOLS)
	@mkdir -p $(CROSS_DIR)
	@for target in $(ZIG_TARGETS); do for flags in "" -DRP_PORTABLE; do \
		for source in $(wildcard ckernels/*.c); do \
			$(WHEEL_VENV)/bin/python -m ziglang cc -target $$target -std=c99 -pedantic -Wall -Wextra \
				-Werror -O2 $$flags -c $$source -o $(CROSS_DIR)/kernel.o || exit 1; \
		done; echo "kernels for $$target $${flags:-(GCC extensions)}: no warning"; \
	done; done

bench: build
	$(PYTHON) -m pytest bench -q --benchmark-columns=min,median,mean,rounds --benchmark-group-by=group

# Keeps the environments ($(VENV), and make test-tensordict-latest's under build/ goes):
# rm -rf $(VENV) to start over.
clean:
	rm -rf build replay.c replay*.so .pytest_cache .benchmarks *.egg-info

# Adds up pytest's JUnit reports into one closing line; exits 1 if any test failed or a run
# left no report (it crashed, or never started).
define JUNIT_TOTAL
import sys, xml.etree.ElementTree as ET
counts = dict(passed=0, failed=0, skipped=0)
missing = []
for path in sys.argv[1:]:
    try:
        suites = ET.parse(path).getroot().iter("testsuite")
    except (OSError, ET.ParseError):
        missing.append(path)
        continue
    for s in suites:
        failed, skipped = int(s.get("failures")) + int(s.get("errors")), int(s.get("skipped"))
        counts["failed"] += failed
        counts["skipped"] += skipped
        counts["passed"] += int(s.get("tests")) - failed - skipped
for path in missing:
    print(f"no test report in {path}: that run did not finish")
print("total: {passed} passed, {failed} failed, {skipped} skipped".format(**counts))
sys.exit(1 if counts["failed"] or missing else 0)
endef
export JUNIT_TOTAL

# Mutation score of the writers, trajectory ends, prioritized sampler and tensor storages
# (tests/MUTATION.md): mutmut 3 on one core, config in pyproject.toml ([tool.mutmut]); takes
# hours on 2 cores. `$(VENV)/bin/mutmut results` lists the survivors afterwards.
.PHONY: mutation
mutation:
	$(PYTHON) -m pip install -q -r requirements-mutation.txt
	$(VENV)/bin/mutmut run --max-children 1
	$(VENV)/bin/mutmut results
