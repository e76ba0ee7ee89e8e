"""The installed torchrl's replay buffers (0.11 to 0.14) with ``torchrl_compat.install()``
in force, against torchrl.

Each case runs the same scenario on torchrl's own classes and on what torchrl's modules
expose after ``install()`` (see ``torchrl_matrix_support``), and compares every step.
Prioritized samplers run on ``replay``'s trees in both runs (torchrl's own trees do not load
on the CI torch); their draws match torchrl's bit for bit because both take their random
numbers from the buffer's generator. On torch 2.9.1, where torchrl's C++ trees load, the
prioritized cases of these files give the same records against torchrl's own trees, except
the sampler smaller than its storage (``test_sampler_smaller_than_storage``, which holds
torchrl's values from there).
"""
from __future__ import annotations

import pickle

import pytest
import torch

from torchrl_matrix_support import (
    BUFFERS,
    check_same,
    dumps_and_loads,
    first_item,
    is_prioritized,
    LIST_STORAGES,
    make_buffer,
    make_data,
    must_run,
    TD_BUFFERS,
    TENSOR_STORAGES,
    tree_leaves,
)
from torchrl_matrix_support import installed_for_the_module, known_gaps  # noqa: F401 (autouse fixtures)
from torchrl_matrix_support import WARNING_FILTERS

pytestmark = WARNING_FILTERS


# =============================================================================
# The life of a buffer: extend / add / sample / index / state_dict / pickle / dumps /
# loads / empty
# =============================================================================
@must_run(
    "len, new", "add", "extend again", "len", "rb[:]", "sample 0", "sample 1", "sample 3",
    "state_dict", "pickle", "sample, pickle", "empty", "extend after empty", "rb[:] after empty",
    must_raise=("sample, emptied",),
)
def lifecycle(record, C, *, buffer, storage, kind, ndim, sampler=None, writer=None, peer=None):
    def build():
        return make_buffer(C, record, buffer, storage, kind, ndim, sampler=sampler, writer=writer)

    rb = build()
    record("len, new", len(rb))
    record.call("sample, empty", rb.sample)
    if not record.succeeds("extend 5", rb.extend, make_data(kind, 5, ndim, start=0)):
        # A refused batch moves torchrl's writer on (its next write lands past the length);
        # ours stays where it was (test_replay_buffers_bad_input): both go on from a new
        # buffer.
        rb = build()
    record.call("add", rb.add, first_item(make_data(kind, 1, ndim, start=5), ndim))
    # 5 + 1 + 4 > CAP: the writer wraps around. torchrl's lazy ndim > 1 storages size
    # tensor and pytree leaves with their feature dims counted in, and their wrap-around
    # raises IndexError: those stop at capacity (test_ndim2_leaves_wrap_around).
    second = 2 if ndim == 2 and kind in ("tensor", "pytree") and storage != "TensorStorage" else 4
    record.call("extend again", rb.extend, make_data(kind, second, ndim, start=6))
    record("len", len(rb))
    record.call("rb[0]", rb.__getitem__, 0)
    record.call("rb[1:3]", rb.__getitem__, slice(1, 3))
    record.call("rb[:]", rb.__getitem__, slice(None))
    for k in range(2):
        sample = record.call(f"sample {k}", rb.sample, return_info=True)
    record.call("sample 3", rb.sample, 3)
    if is_prioritized(rb) and sample is not None:
        index = sample[1]["index"]  # a tuple of one tensor per dim when ndim == 2
        count = (index[0] if isinstance(index, tuple) else index).numel()
        record.call("update_priority", rb.update_priority, index, torch.arange(1.0, count + 1))
        record.call("sample after update_priority", rb.sample, return_info=True)
        if buffer in TD_BUFFERS:
            td = record.call("sample to update", rb.sample)
            if td is not None:
                # a tensorclass takes no new key: torchrl's update then raises
                record.call("new priorities", td.__setitem__, "p", torch.linspace(0.5, 4.0, td.numel()).reshape(td.shape))
                record.call("update_tensordict_priority", rb.update_tensordict_priority, td)
                record.call("sample after update_tensordict_priority", rb.sample, return_info=True)
        record("sum tree", tree_leaves(rb.sampler._sum_tree))

    # The state_dict layout itself: test_state_dict_layout.
    state = record.call_quietly("state_dict", rb.state_dict)
    if state is not None:
        fresh = build()
        record.call("load_state_dict", fresh.load_state_dict, state)
        record("len, state_dict", len(fresh))
        record.call("rb[:], state_dict", fresh.__getitem__, slice(None))
        record.call("sample, state_dict", fresh.sample, return_info=True)

    copied = record.call("pickle", lambda: pickle.loads(pickle.dumps(rb)))
    if copied is not None:
        record("len, pickle", len(copied))
        record.call("rb[:], pickle", copied.__getitem__, slice(None))
        # The generator's state travels with the buffer.
        record.call("sample, pickle", copied.sample, return_info=True)

    dumps_and_loads(record, rb, build, peer)

    record.call("empty", rb.empty)
    record("len, emptied", len(rb))
    record.call("sample, emptied", rb.sample)
    record.call("extend after empty", rb.extend, make_data(kind, 3, ndim, start=20))
    record.call("rb[:] after empty", rb.__getitem__, slice(None))


def _lifecycle_cases():
    for buffer in BUFFERS:
        # torchrl's TensorDict buffers refuse tensorclasses (ValueError): checked once.
        kinds = ("tensordict",) if buffer in TD_BUFFERS else ("tensor", "tensordict", "tensorclass", "pytree")
        for storage in LIST_STORAGES + TENSOR_STORAGES:
            for kind in kinds + (("tensorclass",) if buffer in TD_BUFFERS and storage == "ListStorage" else ()):
                for ndim in (1, 2) if storage in TENSOR_STORAGES else (1,):
                    yield pytest.param(buffer, storage, kind, ndim, id=f"{buffer}-{storage}-{kind}-ndim{ndim}")


def lifecycle_raises(buffer, storage, kind, ndim):
    """The decisive steps of a lifecycle that torchrl refuses, by design or by a bug of its
    own (ours do as torchrl does): label -> exception type."""
    raises = {}
    if kind == "pytree" and storage in LIST_STORAGES:
        # torchrl's list storages extend with a list, tuple, tensor or tensordict, not a dict;
        # their only item is then the one add() gave.
        raises.update({"extend again": "TypeError", "extend after empty": "TypeError"})
        raises["rb[:] after empty"] = "IndexError" if storage == "ListStorage" else "RuntimeError"
        if storage != "ListStorage":
            # torchrl stacks the items as tensordicts: "'dict' object has no attribute 'batch_size'"
            raises.update({"rb[:]": "AttributeError", "sample, pickle": "AttributeError"})
            raises.update({f"sample {k}": "AttributeError" for k in (0, 1, 3)})
    if kind == "tensorclass" and buffer in TD_BUFFERS:
        # torchrl's TensorDict buffers refuse tensorclasses; add() fails writing "index".
        raises.update({"add": "AttributeError", "extend again": "ValueError", "extend after empty": "ValueError", "rb[:] after empty": "IndexError"})
    if (kind == "pytree" and storage in TENSOR_STORAGES) or (kind == "tensorclass" and storage == "LazyMemmapStorage"):
        # "Objects of type <class 'dict'> are not supported by ... state_dict"
        raises["state_dict"] = "TypeError"
    if buffer in TD_BUFFERS and ndim == 2:
        # torchrl's add() of one time step to a 2-d storage: "expand_as_right requires the
        # destination tensor to have less dimensions than the input tensor"
        raises["add"] = "RuntimeError"
    return raises


@pytest.mark.parametrize("buffer,storage,kind,ndim", list(_lifecycle_cases()))
def test_lifecycle(tmp_path, buffer, storage, kind, ndim):
    # A list storage of tensorclass items loads their state dicts as tensordict's
    # TensorDict().load_state_dict reads them: KeyError '__batch_size' with tensordict 0.11,
    # TensorDicts from 0.15. torchrl and ours alike, whichever it is.
    raises = lifecycle_raises(buffer, storage, kind, ndim)
    check_same(lifecycle, tmp_path, raises=raises, buffer=buffer, storage=storage, kind=kind, ndim=ndim)
