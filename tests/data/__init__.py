"""Golden files written by torchrl 0.11, and the scripts that wrote them.

A package, so that the tests import what a script builds by name (the tests directory is on
``sys.path`` while they run): ``from data.make_golden_buffers import golden_transitions``.
Each script still runs on its own (``python tests/data/make_golden_buffers.py``).
"""
