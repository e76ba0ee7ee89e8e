"""Build the ``replay`` extension: ``replay.pyx`` over the C99 kernels in ``ckernels/``.

The extension is compiled against numpy only. It never includes a torch header nor links
against libtorch / libc10, so one build serves every torch release.

``REPLAY_CYTHON_DEBUG=1`` turns Cython's bounds, wrap-around and initialisation checks back
on for a debug test run.
"""
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

# Start-up hook: site-packages/*.pth files run at interpreter start. It installs replay's
# segment trees into torchrl only when TORCHRL_COMPAT_INSTALL_TREES is set (see
# torchrl_compat_trees.py). data_files would put it under sys.prefix, where site never
# looks, so build_py copies it to the root of the pure-Python tree instead.
STARTUP_HOOK = "torchrl_compat_trees.pth"


class BuildPyWithStartupHook(build_py):
    def run(self):
        super().run()
        self.copy_file(STARTUP_HOOK, os.path.join(self.build_lib, STARTUP_HOOK), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, STARTUP_HOOK)]


KERNEL_SOURCES = [
    "ckernels/segtree.c",
    "ckernels/slices.c",
    "ckernels/perm.c",
    "ckernels/prng.c",
]
# Headers too: an edit to one of them (segtree_impl.h holds the tree kernels) rebuilds the
# extension, which setuptools otherwise decides from the sources alone.
KERNEL_HEADERS = sorted(
    os.path.join("ckernels", name) for name in os.listdir("ckernels") if name.endswith(".h")
)

DEBUG = os.environ.get("REPLAY_CYTHON_DEBUG", "0") == "1"

DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": not DEBUG,
    "binding": True,
    "embedsignature": True,
}

# -O3 without -march=native: the binary must run on any x86-64 / aarch64 CPU.
COMPILE_ARGS = ["-O0", "-g"] if DEBUG else ["-O3"]

extensions = [
    Extension(
        "replay",
        sources=["replay.pyx", *KERNEL_SOURCES],
        depends=["replay.pxd", *KERNEL_HEADERS],
        include_dirs=[np.get_include(), "ckernels"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=COMPILE_ARGS,
    )
]

setup(
    cmdclass={"build_py": BuildPyWithStartupHook},
    # The debug build generates its C aside, so it never stands in for the release one.
    ext_modules=cythonize(
        extensions, compiler_directives=DIRECTIVES, build_dir="build/debug-c" if DEBUG else None
    ),
)
