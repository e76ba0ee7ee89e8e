import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_report_header(config):
    """The versions each side runs on, and whose trees torchrl's prioritized samplers use."""
    import tensordict
    import torch

    lines = [f"torch {torch.__version__}, tensordict {tensordict.__version__}"]
    try:
        import torchrl
        import torchrl.data.replay_buffers.samplers as samplers
    except ImportError:
        return lines + ["torchrl: not installed"]
    own = samplers.SumSegmentTreeFp32 is not None
    lines.append(
        f"torchrl {torchrl.__version__}, prioritized side on "
        + ("torchrl's compiled trees" if own else "replay's trees (install_segment_trees(): torchrl's do not load here)")
    )
    return lines
