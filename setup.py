"""Build the ``replay`` extension: ``replay.pyx`` over the C99 kernels in ``ckernels/``.

The extension is compiled against numpy only. It never includes a torch header nor links
against libtorch / libc10, so one build serves every torch release.

``REPLAY_CYTHON_DEBUG=1`` turns Cython's bounds, wrap-around and initialisation checks back
on for a debug test run; ``REPLAY_PORTABLE=1`` builds the kernels without GCC's extensions.
"""
import os
import sys

import setuptools

# pyproject.toml's SPDX `license` string is read from setuptools 77 on (PEP 639); an older one
# stops with a long schema error instead, so say in one line what to upgrade.
MIN_SETUPTOOLS = 77
if int(setuptools.__version__.split(".")[0]) < MIN_SETUPTOOLS:
    sys.exit(
        f"setup.py needs setuptools>={MIN_SETUPTOOLS} (this environment has {setuptools.__version__}): "
        f"python -m pip install -U 'setuptools>={MIN_SETUPTOOLS}' Cython numpy"
    )

import numpy as np  # noqa: E402
from Cython.Build import cythonize  # noqa: E402
from setuptools import Extension, setup  # noqa: E402
from setuptools.command.build_ext import build_ext  # noqa: E402
from setuptools.command.build_py import build_py  # noqa: E402

# Start-up hooks: site-packages/*.pth files run at interpreter start. Each one is opt-in,
# acting only when its environment variable is set (torchrl_compat_trees.pth: see
# torchrl_compat_trees.py). data_files would put them under sys.prefix, where site never
# looks, so build_py copies them to the root of the pure-Python tree instead; an editable
# install (pip install -e .) maps that tree to the sources, so there they go straight into
# the wheel, which pip unpacks into site-packages.
STARTUP_HOOKS = [
    "torchrl_compat_trees.pth",
]


class BuildPyWithStartupHooks(build_py):
    def run(self):
        super().run()
        if self.editable_mode:
            # setuptools points install_lib at the unpacked editable wheel: what lies there
            # is installed as it is, next to the finder that maps the sources.
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        for hook in STARTUP_HOOKS:
            self.copy_file(hook, os.path.join(target, hook), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        return [*outputs, *(os.path.join(self.build_lib, hook) for hook in STARTUP_HOOKS)]


KERNEL_SOURCES = [
    "ckernels/segtree.c",
    "ckernels/slices.c",
    "ckernels/sequences.c",
    "ckernels/perm.c",
    "ckernels/prng.c",
    "ckernels/rows.c",
]
# Headers too: an edit to one of them (segtree_impl.h holds the tree kernels) rebuilds the
# extension, which setuptools otherwise decides from the sources alone.
KERNEL_HEADERS = sorted(
    os.path.join("ckernels", name) for name in os.listdir("ckernels") if name.endswith(".h")
)

DEBUG = os.environ.get("REPLAY_CYTHON_DEBUG", "0") == "1"
# RP_PORTABLE builds the kernels as a compiler without GCC's extensions would (MSVC, the
# compiler of Windows wheels): no vector types, lane shuffles, prefetch hints, ctz or 128-bit
# products (see ckernels/rp_common.h). make test's debug build sets it, so the fallbacks are
# tested.
PORTABLE = os.environ.get("REPLAY_PORTABLE", "0") == "1"

DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": not DEBUG,
    "binding": True,
    "embedsignature": True,
    # The debug build turns the checks back on, and Cython then (rightly) says they cost time.
    "show_performance_hints": not DEBUG,
}

# -O3 without -march=native: the binary must run on any x86-64 / aarch64 CPU. MSVC (Windows
# wheels) takes its own spelling, and /std:c11: without it MSVC defines no __STDC_VERSION__ and
# rp_common.h refuses to compile.
COMPILE_ARGS = {
    "unix": ["-O0", "-g"] if DEBUG else ["-O3"],
    "msvc": ["/Od", "/Zi", "/std:c11"] if DEBUG else ["/O2", "/std:c11"],
}


class BuildExtForCompiler(build_ext):
    """Gives each extension the arguments of the compiler that builds it."""

    def build_extensions(self):
        args = COMPILE_ARGS.get(self.compiler.compiler_type, COMPILE_ARGS["unix"])
        for extension in self.extensions:
            extension.extra_compile_args = [*args, *extension.extra_compile_args]
        super().build_extensions()


extensions = [
    Extension(
        "replay",
        sources=["replay.pyx", *KERNEL_SOURCES],
        depends=["replay.pxd", *KERNEL_HEADERS],
        include_dirs=[np.get_include(), "ckernels"],
        define_macros=[
            ("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
            *([("RP_PORTABLE", "1")] if PORTABLE else []),
        ],
    )
]

setup(
    cmdclass={"build_py": BuildPyWithStartupHooks, "build_ext": BuildExtForCompiler},
    # The debug build generates its C aside, so it never stands in for the release one.
    # quiet: no "Cythonizing ..." status lines; compile errors are still printed.
    ext_modules=cythonize(
        extensions, compiler_directives=DIRECTIVES, build_dir="build/debug-c" if DEBUG else None,
        quiet=True,
    ),
)
