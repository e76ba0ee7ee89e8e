"""The storage side of ``update_if_present`` (torchrl 0.14): which fields a patch may name,
and how its values are checked and written for indices of every shape, compared with
torchrl's own buffers and storages."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers as T
import torchrl.data.replay_buffers.storages as TS
import torchrl.data.replay_buffers.writers as TW

import torchrl_compat as O
from torchrl_compat._releases import since

pytestmark = pytest.mark.skipif(
    not since("buffer_conditional_update"), reason="conditional updates come with torchrl 0.14"
)


def outcome(call):
    """What ``call`` returns (the updated mask), or the type and text of what it raises."""
    try:
        result = call()
    except Exception as error:  # noqa: BLE001 - compared with torchrl's
        return type(error), str(error)
    return "returned", result.updated.tolist()


def assert_same_rows(ours, ref):
    a, b = ours[:], ref[:]
    if isinstance(b, torch.Tensor):
        assert torch.equal(a, b)
        return
    assert sorted(a.keys(True, True), key=str) == sorted(b.keys(True, True), key=str)
    for key in b.keys(True, True):
        assert torch.equal(a[key], b[key]), key


def td_buffers(capacity=6, ndim=1):
    extra = {"ndim": ndim} if ndim > 1 else {}
    return (
        O.TensorDictReplayBuffer(
            storage=O.LazyTensorStorage(capacity, **extra), writer=O.TensorDictRoundRobinWriter(track_generations=True)
        ),
        T.TensorDictReplayBuffer(
            storage=TS.LazyTensorStorage(capacity, **extra), writer=TW.TensorDictRoundRobinWriter(track_generations=True)
        ),
    )


def records(shape):
    n = torch.Size(shape).numel()
    return TensorDict(
        {
            "obs": torch.arange(n * 2, dtype=torch.float32).reshape(*shape, 2),
            "v": torch.zeros(shape, dtype=torch.long),
            ("nested", "x"): torch.arange(n, dtype=torch.float32).reshape(shape),
        },
        list(shape),
    )


def test_patch_of_a_tensor_storage_names_no_field_as_torchrl():
    # a storage of plain tensors has no fields a patch could name
    ours = O.ReplayBuffer(storage=O.LazyTensorStorage(4), writer=O.RoundRobinWriter(track_generations=True))
    ref = T.ReplayBuffer(storage=TS.LazyTensorStorage(4), writer=TW.RoundRobinWriter(track_generations=True))
    for rb in (ours, ref):
        rb.extend(torch.arange(6.0).reshape(3, 2))
    index = torch.arange(3)
    generation = ours._writer.generations_of(index)
    call = dict(index=index, generation=generation, patch={"obs": torch.zeros(3, 2)})
    got, want = outcome(lambda: ours.update_if_present(**call)), outcome(lambda: ref.update_if_present(**call))
    assert got == want and want[0] is KeyError
    assert "does not exist in the storage" in want[1]
    assert_same_rows(ours._storage, ref._storage)


def test_patch_of_a_storage_loaded_before_its_first_write_is_refused_as_torchrl():
    # the state of a storage never written loads as an empty tensordict, not initialized
    outcomes = []
    for rb_lib, st_lib, wr_lib in ((O, O, O), (T, TS, TW)):
        empty = st_lib.LazyTensorStorage(4)
        storage = st_lib.LazyTensorStorage(4)
        storage.load_state_dict(empty.state_dict())
        assert storage._storage is not None and not storage.initialized
        rb = rb_lib.TensorDictReplayBuffer(storage=storage, writer=wr_lib.TensorDictRoundRobinWriter(track_generations=True))
        call = dict(index=torch.arange(1), generation=torch.zeros(1, dtype=torch.long), patch={"v": torch.ones(1, dtype=torch.long)})
        outcomes.append(outcome(lambda: rb.update_if_present(**call)))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] is RuntimeError and "require an initialized storage" in outcomes[0][1]


@pytest.mark.parametrize("n_cells", [1, 3, 4])
def test_patch_of_cells_of_a_two_dim_storage_with_feature_dims_matches_torchrl(n_cells):
    # rows of (row, column) coordinates: the feature shape of "obs" is what follows the two
    # storage dims
    ours, ref = td_buffers(capacity=12, ndim=2)
    data = records((2, 4))
    index_o, index_r = ours.extend(data.clone()), ref.extend(data.clone())
    assert torch.equal(index_o, index_r)
    cells = index_o[torch.tensor([5, 0, 7, 2])[:n_cells]]
    generation = ours._writer.generations_of(cells)
    patch = {"obs": -torch.arange(n_cells * 2.0).reshape(n_cells, 2) - 1, ("nested", "x"): torch.full((n_cells,), 7.0)}
    got = outcome(lambda: ours.update_if_present(index=cells, generation=generation, patch=patch))
    want = outcome(lambda: ref.update_if_present(index=cells, generation=generation, patch=patch))
    assert got == want == ("returned", [True] * n_cells)
    assert_same_rows(ours._storage, ref._storage)
    # the model: each addressed cell holds its patch row
    for i, (row, col) in enumerate(cells.tolist()):
        assert ours._storage._storage["obs"][row, col].tolist() == patch["obs"][i].tolist()
        assert ours._storage._storage["nested", "x"][row, col].item() == 7.0


def test_patch_addressed_by_a_scalar_index_matches_torchrl():
    ours, ref = td_buffers()
    for rb in (ours, ref):
        rb.extend(records((4,)))
    index = torch.tensor(2)
    generation = ours._writer.generations_of(index.reshape(1))
    patch = {"obs": torch.tensor([5.0, 6.0]), "v": torch.tensor(3)}
    got = outcome(lambda: ours.update_if_present(index=index, generation=generation, patch=patch))
    want = outcome(lambda: ref.update_if_present(index=index, generation=generation, patch=patch))
    # (torchrl 0.14.1 checks the patch for one record, then fails to pick the live rows
    # of a 0-d index: an IndexError, with nothing written)
    assert got == want
    assert_same_rows(ours._storage, ref._storage)
    assert torch.equal(ours._storage._storage["obs"][:4], records((4,))["obs"])


def test_patch_addressed_by_a_three_dim_index_matches_torchrl():
    # an index of shape [2, 3, 2] on a two-dim storage: the coordinates are its last dim
    ours, ref = td_buffers(capacity=12, ndim=2)
    data = records((3, 4))
    for rb in (ours, ref):
        rb.extend(data.clone())
    index = torch.tensor([[[0, 1], [1, 2], [2, 3]], [[0, 0], [1, 1], [2, 2]]])
    generation = ours._writer.generations_of(index.reshape(-1, 2))
    for value in (torch.zeros(2, 2), torch.zeros(6, 2), torch.zeros(2, 3, 2), torch.zeros(2)):
        patch = {"obs": value}
        got = outcome(lambda: ours.update_if_present(index=index, generation=generation, patch=patch))
        want = outcome(lambda: ref.update_if_present(index=index, generation=generation, patch=patch))
        assert got == want, value.shape
        assert_same_rows(ours._storage, ref._storage)


@pytest.mark.parametrize("ndim", [1, 2])
def test_patch_is_one_write_of_the_patched_items(ndim):
    # torchrl counts a patch as one change of the storage (its mutation revision); readers
    # following the writes learn which items it changed: reading the storage at the
    # journaled cursor gives the patched values
    ours, ref = td_buffers(capacity=12 if ndim == 2 else 6, ndim=ndim)
    data = records((3, 4) if ndim == 2 else (5,))
    index_o = ours.extend(data.clone())
    ref.extend(data.clone())
    index = index_o[torch.tensor([4, 1, 9])] if ndim == 2 else torch.tensor([3, 0, 4])
    generation = ours._writer.generations_of(index)
    storage = ours._storage
    start, _ = storage._writes_since(None)
    revisions = (storage._mutation_revision, ref._storage._mutation_revision)
    patch = {"obs": -torch.arange(6.0).reshape(3, 2) - 1}
    for rb in (ours, ref):
        assert rb.update_if_present(index=index, generation=generation, patch=patch).updated.all()
    assert storage._mutation_revision - revisions[0] == ref._storage._mutation_revision - revisions[1] == 1
    now, cursors = storage._writes_since(start)
    assert now == start + 1 and len(cursors) == 1
    assert torch.equal(storage._storage["obs"][cursors[0]], patch["obs"])
    if ndim == 1:
        # the rows themselves, as for a write at an index tensor (a reader follows them
        # without reading the whole storage again)
        assert np.asarray(cursors[0]).tolist() == index.tolist()
    assert_same_rows(storage, ref._storage)
