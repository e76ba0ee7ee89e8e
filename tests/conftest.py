import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# `make test` runs the kernel tests a second time against a build with Cython's bounds and
# wrap-around checks on, placed in this directory (ahead of the in-place release build).
DEBUG_BUILD = os.environ.get("REPLAY_EXTENSION_DIR")
if DEBUG_BUILD:
    sys.path.insert(0, os.path.abspath(DEBUG_BUILD))
    import replay  # noqa: E402

    assert os.path.abspath(replay.__file__).startswith(os.path.abspath(DEBUG_BUILD)), replay.__file__
