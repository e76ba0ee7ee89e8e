"""Writes a buffer refuses: a failed ``extend`` or ``add`` changes nothing.

torchrl 0.11 moves the writer's cursor and write count before the storage refuses a batch
(a trailing shape or dtype that does not fit): the next batch lands past the length, rows
never written become visible, and on a full buffer a tensordict batch refused at its second
entry leaves torn rows. A prioritized tensordict buffer checks the batch's priorities once
its rows are in. A max-value writer ranks a refused batch. A batch larger than the capacity
is scattered to repeated rows, entry by entry. Each case is compared here with the state
before the call, or with a model buffer fed only the writes that succeed.
"""
import numpy as np
import pytest
import torch
import torchrl.data as TD
from hypothesis import given, settings, strategies as st, HealthCheck
from tensordict import TensorDict

import torchrl_compat as O


def transitions(n, start=0, width=4):
    rows = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": rows.float().unsqueeze(-1).expand(n, width).clone(),
            "id": rows,
            ("next", "done"): (rows % 7 == 6).unsqueeze(-1),
        },
        [n],
    )


def state_of(rb):
    """Everything a write may change: counters, length, every stored row, priorities."""
    writer, storage, sampler = rb._writer, rb._storage, rb._sampler
    state = {
        "cursor": int(writer._cursor),
        "write_count": int(writer._write_count),
        "len": len(rb),
        # the rows within the length (the others were never written)
        "rows": storage._storage[: len(storage)].clone() if storage.initialized else None,
    }
    if hasattr(sampler, "_sum_tree"):
        n = sampler._max_capacity
        state["sum"] = np.asarray(sampler._sum_tree[np.arange(n)])
        state["min"] = np.asarray(sampler._min_tree[np.arange(n)])
        state["max_priority"] = [None if v is None else float(v) for v in sampler._max_priority]
    if hasattr(writer, "_current_top_values"):
        state["ranking"] = list(writer._current_top_values)
    return state


def assert_same_state(got, expected):
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if key == "rows":
            if value is None:
                assert got[key] is None
            elif isinstance(value, torch.Tensor):
                assert torch.equal(got[key], value)
            else:
                assert set(got[key].keys(True, True)) == set(value.keys(True, True))
                for leaf in value.keys(True, True):
                    assert torch.equal(got[key][leaf], value[leaf]), leaf
        elif key in ("sum", "min"):
            np.testing.assert_array_equal(got[key], value)
        else:
            assert got[key] == value, key


STORAGES = {
    "tensor": lambda cap: O.LazyTensorStorage(cap),
    "memmap": lambda cap: O.LazyMemmapStorage(cap),
}
BUFFERS = {
    "tensordict": lambda storage: O.TensorDictReplayBuffer(storage=storage, batch_size=4),
    "prioritized": lambda storage: O.TensorDictPrioritizedReplayBuffer(
        alpha=0.7, beta=0.5, storage=storage, batch_size=4
    ),
}
# batches a 16-row storage of ``transitions`` refuses: (batch, entry named, what the message says)
BAD_BATCHES = {
    "trailing shape": (lambda: transitions(4).set("obs", torch.zeros(4, 5)), "'obs'", r"shape \[4, 5\]"),
    "dtype": (lambda: transitions(4).set("id", torch.zeros(4, dtype=torch.float64)), "'id'", "dtype torch.float64"),
    "nested entry": (
        lambda: transitions(4).set(("next", "done"), torch.zeros(4, 2, dtype=torch.bool)),
        r"\('next', 'done'\)",
        r"shape \[4, 2\]",
    ),
}


@pytest.mark.parametrize("storage", list(STORAGES))
@pytest.mark.parametrize("buffer", list(BUFFERS))
@pytest.mark.parametrize("bad", list(BAD_BATCHES))
@pytest.mark.parametrize("filled", [8, 16, 20])
def test_refused_extend_changes_nothing(storage, buffer, bad, filled):
    rb = BUFFERS[buffer](STORAGES[storage](16))
    rb.extend(transitions(filled))
    before = state_of(rb)
    make_batch, entry, shape = BAD_BATCHES[bad]
    with pytest.raises(RuntimeError, match=f"entry {entry} has {shape}.*Nothing was written"):
        rb.extend(make_batch())
    assert_same_state(state_of(rb), before)
    # the next batch lands where it would have without the refused one
    rb.extend(transitions(4, start=100))
    expected = BUFFERS[buffer](STORAGES["tensor"](16))
    expected.extend(transitions(filled))
    expected.extend(transitions(4, start=100))
    assert len(rb) == len(expected) and int(rb._writer._cursor) == int(expected._writer._cursor)
    assert torch.equal(rb[:]["id"], expected[:]["id"])
    assert torch.equal(rb[:]["obs"], expected[:]["obs"])


def test_refused_extend_of_tensors_reproducer():
    # the failing write does not move the writer: the 7s land right after the 1s
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(16))
    rb.extend(torch.ones(8, 3))
    with pytest.raises(RuntimeError, match=r"the batch has shape \[4, 5\].*rows it is written to, of shape \[4, 3\]"):
        rb.extend(torch.zeros(4, 5))
    assert (int(rb._writer._cursor), int(rb._writer._write_count), len(rb)) == (8, 8, 8)
    rb.extend(torch.full((4, 3), 7.0))
    assert len(rb) == 12
    assert rb[:][:, 0].tolist() == [1.0] * 8 + [7.0] * 4


@pytest.mark.parametrize("lib", [O, TD], ids=["ours", "torchrl"])
def test_refused_dtype_extend_of_tensors(lib):
    rb = lib.ReplayBuffer(storage=lib.LazyTensorStorage(16))
    rb.extend(torch.ones(8, 3))
    with pytest.raises(RuntimeError):
        rb.extend(torch.ones(4, 3, dtype=torch.float64))
    if lib is O:
        # torchrl's cursor moved: 12, and len(rb) would reach 16 at the next write
        assert int(rb._writer._cursor) == 8
        rb.extend(torch.full((4, 3), 2.0))
        assert len(rb) == 12 and rb[:][8:, 0].tolist() == [2.0] * 4


def test_refused_add_changes_nothing():
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(16))
    rb.extend(torch.ones(8, 3))
    with pytest.raises(RuntimeError, match=r"Cannot add to the storage: the item has shape \[5\]"):
        rb.add(torch.zeros(5))
    assert (int(rb._writer._cursor), int(rb._writer._write_count), len(rb)) == (8, 8, 8)
    assert rb.add(torch.full((3,), 2.0)) == 8
    assert rb[8].tolist() == [2.0] * 3


def test_refused_extend_on_a_full_buffer_leaves_no_torn_row():
    rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(8))
    rb.extend(transitions(8))
    batch = transitions(4, start=50).set(("next", "done"), torch.zeros(4, 3, dtype=torch.bool))
    with pytest.raises(RuntimeError, match=r"\('next', 'done'\)"):
        rb.extend(batch)
    # every row still whole: obs and id from the same transition
    stored = rb[:]
    assert torch.equal(stored["obs"][:, 0].long(), stored["id"]) and stored["id"].tolist() == list(range(8))


# -----------------------------------------------------------------------------
# priorities checked before the rows are written
# -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value,alpha,shown",
    [(float("nan"), 0.7, "nan"), (-1.0, 0.7, "-1.0"), (-1.0, 1.0, "-1.0"), (float("inf"), 0.7, "inf"),
     (1e30, 2.0, r"1\.0\d*e\+30")],
)
def test_bad_priority_in_the_batch_writes_nothing(value, alpha, shown):
    # 1e30 ** 2 does not fit the float32 trees; with alpha=1 a negative priority's stored
    # value (-1 + eps) is finite, so only the sign check refuses it
    rb = O.TensorDictPrioritizedReplayBuffer(alpha=alpha, beta=0.5, storage=O.LazyTensorStorage(16), priority_key="td_error")
    rb.extend(transitions(4).set("td_error", torch.ones(4)))
    before = state_of(rb)
    batch = transitions(4, start=4).set("td_error", torch.tensor([1.0, 1.0, value, 1.0]))
    # the value and its position are in the message itself
    with pytest.raises(RuntimeError, match=rf"priority={shown} at position 2 .*'td_error' entry.*Nothing was written"):
        rb.extend(batch)
    assert_same_state(state_of(rb), before)
    # a retry with good priorities stores the rows once
    rb.extend(batch.set("td_error", torch.full((4,), 2.0)))
    assert len(rb) == 8 and rb[:]["id"].tolist() == list(range(8))


@pytest.mark.parametrize("name", ["alpha", "beta"])
def test_nan_alpha_or_beta_refused(name):
    kwargs = {"alpha": 0.7, "beta": 0.5, name: float("nan")}
    with pytest.raises(ValueError, match=f"got {name}=nan"):
        O.PrioritizedSampler(16, **kwargs)
    with pytest.raises(ValueError, match=f"got {name}=nan"):
        O.TensorDictPrioritizedReplayBuffer(storage=O.LazyTensorStorage(16), **kwargs)


def test_nan_eps_refused():
    with pytest.raises(ValueError, match="got eps=nan"):
        O.PrioritizedSampler(16, 0.7, 0.5, eps=float("nan"))


# -----------------------------------------------------------------------------
# the max-value writer's ranking
# -----------------------------------------------------------------------------
def ranked(n, ranks, width=3, start=0):
    return TensorDict({"r": torch.as_tensor(ranks, dtype=torch.float), "obs": torch.full((n, width), float(start))}, [n])


def test_refused_extend_leaves_the_ranking():
    rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(4), writer=O.TensorDictMaxValueWriter(rank_key="r"))
    rb.extend(ranked(4, [1.0, 2.0, 3.0, 4.0]))
    before = state_of(rb)
    with pytest.raises(RuntimeError, match=r"entry 'obs' has shape \[2, 5\]"):
        rb.extend(ranked(2, [10.0, 11.0], width=5))
    assert_same_state(state_of(rb), before)
    # the next batch evicts the lowest ranks, as if the refused one never came
    rb.extend(ranked(2, [5.0, 0.5]))
    assert sorted(rb[:]["r"].tolist()) == [2.0, 3.0, 4.0, 5.0]


def test_refused_add_leaves_the_ranking():
    rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(2), writer=O.TensorDictMaxValueWriter(rank_key="r"))
    rb.extend(ranked(2, [1.0, 2.0]))
    before = state_of(rb)
    with pytest.raises(RuntimeError, match=r"entry 'obs' has shape \[5\]"):
        rb.add(TensorDict({"r": torch.tensor(9.0), "obs": torch.zeros(5)}, []))
    assert_same_state(state_of(rb), before)


# -----------------------------------------------------------------------------
# a batch larger than the capacity
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("storage", list(STORAGES))
@pytest.mark.parametrize("start", [0, 100, 256])
def test_oversized_extend_writes_whole_rows(storage, start):
    capacity, n = 257, 600
    ours = O.TensorDictReplayBuffer(storage=STORAGES[storage](capacity))
    theirs = TD.TensorDictReplayBuffer(storage=TD.LazyTensorStorage(capacity))
    for rb in (ours, theirs):
        if start:
            rb.extend(transitions(start, start=-start, width=64))
    # (wide rows: an indexed write to repeated rows then keeps different items per entry)
    index = ours.extend(transitions(n, width=64))
    # the indices torchrl returns, for every item of the batch
    assert torch.equal(index, theirs.extend(transitions(n, width=64)))
    assert int(ours._writer._cursor) == int(theirs._writer._cursor) and len(ours) == len(theirs) == capacity
    assert int(ours._writer._write_count) == start + n
    # each row holds one whole item: the last one written there
    expected = torch.full((capacity,), -1)
    expected[index] = torch.arange(n)  # (a later item overwrites an earlier one)
    stored = ours._storage._storage
    assert torch.equal(stored["id"], expected)
    assert torch.equal(stored["obs"][:, 0].long(), expected)
    assert torch.equal(stored["next", "done"].squeeze(-1), expected % 7 == 6)
    assert torch.equal(stored["index"], torch.arange(capacity))


def test_oversized_extend_of_tensors():
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(5))
    rb.extend(torch.ones(3, 2))
    index = rb.extend(torch.arange(12.0).unsqueeze(-1).expand(12, 2))
    assert index.tolist() == [(3 + i) % 5 for i in range(12)]
    # item i lands in row (3 + i) % 5: the last five, 7 to 11, fill rows 0 to 4
    assert rb[:][:, 0].tolist() == [7.0, 8.0, 9.0, 10.0, 11.0]


def test_oversized_extend_into_a_list_storage_appends_in_order():
    # torchrl's own case: 5 rows into an empty ListStorage(3)
    rb = O.ReplayBuffer(storage=O.ListStorage(3))
    index = rb.extend(torch.arange(5))
    assert index.tolist() == [0, 1, 2, 0, 1]
    assert [int(x) for x in rb.storage._storage] == [3, 4, 2]


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 12),
    before=st.integers(0, 30),
    n=st.integers(1, 40),
    tensordict=st.booleans(),
)
def test_oversized_extend_into_a_list_storage_matches_torchrl(capacity, before, n, tensordict):
    # a ListStorage appends item by item, so every item of the batch goes in, in order: the
    # rows kept are the ones torchrl keeps, each whole
    def batch(count, start):
        if tensordict:
            return transitions(count, start=start)
        return torch.arange(start, start + count)

    make = (lambda m: m.TensorDictReplayBuffer) if tensordict else (lambda m: m.ReplayBuffer)
    ours, theirs = make(O)(storage=O.ListStorage(capacity)), make(TD)(storage=TD.ListStorage(capacity))
    for rb in (ours, theirs):
        if before:
            rb.extend(batch(before, -before))
    got, want = ours.extend(batch(n, 0)), theirs.extend(batch(n, 0))
    assert torch.equal(got, want)
    assert len(ours) == len(theirs) == min(capacity, before + n)
    assert int(ours._writer._cursor) == int(theirs._writer._cursor)
    for mine, reference in zip(ours.storage._storage, theirs.storage._storage, strict=True):
        if tensordict:
            assert int(mine["id"]) == int(reference["id"]) and torch.equal(mine["obs"], reference["obs"])
        else:
            assert int(mine) == int(reference)


# -----------------------------------------------------------------------------
# interleaved good and refused writes, compared with a model fed the good ones only
# -----------------------------------------------------------------------------
WRITE = st.one_of(
    st.tuples(st.just("good"), st.integers(1, 40)),
    st.tuples(st.just("bad shape"), st.integers(1, 12)),
    st.tuples(st.just("bad dtype"), st.integers(1, 12)),
    st.tuples(st.just("bad priority"), st.integers(1, 12)),
    st.tuples(st.just("sample"), st.integers(0, 1000)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(WRITE, min_size=1, max_size=14), capacity=st.integers(1, 24), prioritized=st.booleans())
def test_interleaved_writes_match_a_model(ops, capacity, prioritized):
    def make():
        storage = O.LazyTensorStorage(capacity)
        if prioritized:
            return O.TensorDictPrioritizedReplayBuffer(alpha=0.8, beta=0.4, storage=storage, batch_size=3, priority_key="p")
        return O.TensorDictReplayBuffer(storage=storage, batch_size=3)

    rb, model = make(), make()
    written = 0
    for kind, n in ops:
        if kind == "sample":
            if len(model):
                torch.manual_seed(n)
                np.random.seed(n)
                got = rb.sample()
                torch.manual_seed(n)
                np.random.seed(n)
                want = model.sample()
                assert torch.equal(got["id"], want["id"])
            continue
        batch = transitions(n, start=written).set("p", torch.rand(n) + 0.1)
        if kind == "good":
            rb.extend(batch.clone())
            model.extend(batch.clone())
            written += n
            continue
        if kind == "bad shape":
            batch.set("obs", torch.zeros(n, 2))
        elif kind == "bad dtype":
            batch.set("id", batch["id"].float())
        else:
            if not prioritized:
                continue
            batch["p"][n - 1] = float("nan")
        if not len(model):
            continue  # the first write lays the storage out: nothing to compare with
        with pytest.raises(RuntimeError):
            rb.extend(batch)
        assert_same_state(state_of(rb), state_of(model))
    assert_same_state(state_of(rb), state_of(model))
