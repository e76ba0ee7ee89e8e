"""The sharded Ray buffer's routing, without Ray: global indices, the write ring and its
plans, trajectory chunks, the split of a batch over the shards (masses, uniform draws,
counts), and the client's bookkeeping of reserved rows.

Each is checked against a reference written here (one buffer's round-robin order, numpy's
draws, exact enumerations) on random inputs.
"""
import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from tensordict import TensorDict

from ray_support import chi_square_p, reference_ring
from torchrl_compat import LazyTensorStorage, PrioritizedSampler
from torchrl_compat._ray import routing
from torchrl_compat._ray.writes import Reservations, describe_rows
from torchrl_compat.ray_buffer import _WriteRows

capacities_st = st.lists(st.integers(1, 12), min_size=1, max_size=4)


def test_shard_capacities_and_factories():
    assert routing.shard_capacities(10, 4) == [3, 3, 2, 2]
    factory = routing.shard_factory(functools.partial(LazyTensorStorage, 1_000_000), "storage", 250_000)
    assert factory().max_size == 250_000
    factory = routing.shard_factory(functools.partial(PrioritizedSampler, max_capacity=8, alpha=1, beta=1),
                                    "sampler", 2)
    assert factory().max_size == 2
    with pytest.raises(ValueError, match="as a factory"):
        routing.shard_factory(LazyTensorStorage(10), "storage", 5)
    with pytest.raises(ValueError, match="num_shards=4"):
        routing.shard_capacities(3, 4)


def test_route_global_index_names_the_bad_index():
    shard, local = routing.route_global_index(np.array([0, 5, 10, 13]), 10, [10, 4])
    assert shard.tolist() == [0, 0, 1, 1] and local.tolist() == [0, 5, 0, 3]
    with pytest.raises(IndexError, match="global index 14 at position 1 is held by no shard"):
        routing.route_global_index(np.array([3, 14]), 10, [10, 4])
    with pytest.raises(IndexError, match="global index -1 at position 0"):
        routing.route_global_index(np.array([-1]), 10, [10, 4])
    with pytest.raises(TypeError, match="float64"):
        routing.route_global_index(np.array([1.0]), 10, [10, 4])


# ----------------------------------------------------------------------------- write ring
@settings(max_examples=80)
@given(capacities=capacities_st, width=st.integers(1, 15))
def test_write_ring_is_one_buffers_round_robin_order_striped_over_the_shards(capacities, width):
    ring = routing.WriteRing(capacities, width)
    order = reference_ring(capacities, width)
    assert ring.capacity == sum(capacities) == len(order)
    assert sorted(order) == sorted((k, i) for k, c in enumerate(capacities) for i in range(c))  # a bijection
    for position, (shard, local) in enumerate(order):
        got_shard, got_local, left = ring.stripe(position)
        assert (got_shard, got_local) == (shard, local)
        assert ring.stripe(position + ring.capacity)[:2] == (shard, local)  # a ring
        # the run goes on for `left` rows on the same shard, rows in order, and stops there
        run = order[position:position + left]
        assert len(run) == left and run == [(shard, local + i) for i in range(left)]
        assert (local + left) % width == 0 or local + left == capacities[shard]
    # each shard's rows come in its own order: a client continuing from sum(next_k) writes each
    # shard from its cursor on
    for position in range(ring.capacity + 1):
        written = order[:position]
        next_sequence = [sum(1 for k, _ in written if k == shard) for shard in range(len(capacities))]
        assert ring.position(next_sequence) == position % ring.capacity
        if position < ring.capacity:
            shard, local = order[position]
            assert local == next_sequence[shard]


def test_write_ring_refuses_bad_sizes():
    with pytest.raises(ValueError, match="width=0"):
        routing.WriteRing([4], 0)
    with pytest.raises(ValueError, match=r"capacities=\[4, 0\]"):
        routing.WriteRing([4, 0], 2)


@settings(max_examples=80)
@given(capacities=capacities_st, width=st.integers(1, 15), position=st.integers(0, 60),
       num_rows=st.integers(1, 60), data=st.data())
def test_plan_write_follows_the_ring_and_never_overfills_a_shard(capacities, width, position, num_rows, data):
    ring = routing.WriteRing(capacities, width)
    pieces = routing.plan_write(ring, position, num_rows, None)
    assert sum(rows for _, rows in pieces) == num_rows
    order = reference_ring(capacities, width)
    at = position
    for shard, rows in pieces:
        for _ in range(rows):
            assert order[at % ring.capacity][0] == shard
            at += 1
    room = np.array(data.draw(st.lists(st.integers(0, 10), min_size=len(capacities), max_size=len(capacities))))
    pieces = routing.plan_write(ring, position, num_rows, room)
    assert sum(rows for _, rows in pieces) == num_rows
    taken = np.zeros(len(capacities), dtype=np.int64)
    for shard, rows in pieces:
        if taken.sum() < room.sum():  # while any shard has room, no piece goes past it
            assert taken[shard] + rows <= room[shard]
        taken[shard] += rows
    # the rows that fit go where there is room: as many as there is room for
    assert np.minimum(taken, room).sum() == min(num_rows, room.sum())


def test_plan_write_sends_a_piece_without_room_to_the_shard_with_most():
    ring = routing.WriteRing([4, 4, 4], 4)
    assert routing.plan_write(ring, 0, 6, np.array([0, 2, 5])) == [(2, 4), (1, 2)]
    assert routing.plan_write(ring, 0, 6, np.array([4, 4, 4])) == [(0, 4), (1, 2)]
    # overwriting, a shard to avoid passes its pieces to the next one
    assert routing.plan_write(ring, 0, 10, None, avoid={0}) == [(1, 8), (2, 2)]
    assert routing.plan_write(ring, 4, 6, None, avoid={1, 2}) == [(0, 6)]
    with pytest.raises(ValueError, match=r"every shard is avoided \(\[0, 1, 2\]\)"):
        routing.plan_write(ring, 0, 1, None, avoid={0, 1, 2})


# ----------------------------------------------------------------------------- trajectories
def test_trajectory_ends_from_done_flags_and_ids():
    done = torch.tensor([0, 0, 1, 0, 1, 0], dtype=torch.bool)
    data = TensorDict({"next": {"done": done.unsqueeze(-1)}, "episode": torch.tensor([3, 3, 3, 4, 4, 5])}, [6])
    ends = routing.trajectory_ends(data, [("end", ("next", "done")), ("traj", "episode")])
    assert ends.tolist() == [False, False, True, False, True, False]
    ends = routing.trajectory_ends(data, [("traj", "episode"), ("end", ("next", "done"))])
    assert ends.tolist() == [False, False, True, False, True, False]  # the last row stays open
    assert routing.trajectory_ends(data, [("traj", "missing")]) is None
    assert routing.trajectory_ends(torch.zeros(3), [("traj", "episode")]) is None


@settings(max_examples=80)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=12), last_open=st.booleans(),
       chunk_rows=st.integers(1, 20), room=st.lists(st.integers(0, 30), min_size=2, max_size=2),
       open_shard=st.sampled_from([None, 0, 1]))
def test_plan_trajectories_never_cuts_a_trajectory_between_shards(lengths, last_open, chunk_rows, room, open_shard):
    ends = np.zeros(sum(lengths), dtype=bool)
    ends[np.cumsum(lengths) - 1] = True
    if last_open:
        ends[-1] = False
    owner = np.repeat(np.arange(len(lengths)), lengths)
    chunks, left_open = routing.plan_trajectories(ends, chunk_rows, room, [0.0, 0.0], [40, 40], open_shard)
    assert [(start, stop) for _, start, stop in chunks] == list(zip(
        [c[1] for c in chunks], [c[1] for c in chunks][1:] + [len(ends)]))  # contiguous, in order
    assert chunks[0][1] == 0 and chunks[-1][2] == len(ends)
    shard_of = {}
    for shard, start, stop in chunks:
        assert stop - start <= chunk_rows
        for trajectory in np.unique(owner[start:stop]):
            assert shard_of.setdefault(int(trajectory), shard) == shard  # one shard per trajectory
        # a chunk starts a trajectory, or continues the one before it on the same shard
        if start and owner[start] == owner[start - 1]:
            assert shard_of[int(owner[start])] == shard
        elif start:
            assert stop - start <= chunk_rows
    if open_shard is not None:
        assert chunks[0][0] == open_shard
    assert left_open == (chunks[-1][0] if last_open else None)
    # while a shard has room for a whole chunk of trajectories, it takes it
    first_shard, first_start, _ = chunks[0]
    first_group = [c for c in chunks if shard_of.get(int(owner[c[1]])) == shard_of[int(owner[0])]]
    if open_shard is None and max(room) >= first_group[0][2] - first_start:
        assert room[first_shard] >= first_group[0][2] - first_start


# ----------------------------------------------------------------------------- draws
def fixed_draws(monkeypatch, values):
    monkeypatch.setattr(routing, "_rand", lambda batch_size, generator: np.asarray(values, dtype=np.float64))


def test_route_masses_routes_each_mass_to_its_shards_interval(monkeypatch):
    sums = np.array([2.0, 0.0, 1.0, 1.0])
    fixed_draws(monkeypatch, [0.0, 0.25, 0.49999, 0.5, 0.6, 0.75, 0.99999, 1.0])
    shard, fraction = routing.route_masses(sums, 8)
    # masses 0, 1, 2 - eps, 2, 2.4, 3, 4 - eps, 4 (rounded up to the end)
    assert shard.tolist() == [0, 0, 0, 2, 2, 3, 3, 3]
    np.testing.assert_allclose(fraction, [0.0, 0.5, 0.99998, 0.0, 0.4, 0.0, 0.99996, 1.0], atol=1e-12)
    # an empty shard is never drawn, a rounding that lands on it moves on
    fixed_draws(monkeypatch, [0.5])
    assert routing.route_masses(np.array([1.0, 0.0, 1.0]), 1)[0].tolist() == [2]
    with pytest.raises(RuntimeError, match="sum to 0.0"):
        routing.route_masses(np.zeros(3), 4)


def test_route_masses_draws_each_shard_by_its_mass():
    sums = np.array([1e-3, 0.0, 3.0, 1.0, 6.0])
    gen = torch.Generator().manual_seed(3)
    shard, fraction = routing.route_masses(sums, 400_000, gen)
    counts = np.bincount(shard, minlength=5)
    assert counts[1] == 0
    keep = sums > 0
    assert chi_square_p(counts[keep], sums[keep] / sums.sum() * 400_000) > 1e-3
    assert ((fraction >= 0) & (fraction <= 1)).all()
    # inside a shard the fraction is uniform
    inside = fraction[shard == 2]
    assert chi_square_p(np.histogram(inside, bins=20, range=(0, 1))[0], np.full(20, len(inside) / 20)) > 1e-3


@settings(max_examples=50)
@given(counts=st.lists(st.integers(0, 7), min_size=1, max_size=5).filter(lambda c: sum(c) > 0))
def test_route_uniform_maps_every_row_once(counts):
    """Row ``floor(fraction * count_k)`` of shard ``k`` for the global row ``r``: feeding the
    draws ``(r + 0.5) / total`` for every row shows each row of each shard drawn once."""
    total = sum(counts)
    draws = (np.arange(total) + 0.5) / total
    routing_rand = routing._rand
    try:
        routing._rand = lambda batch_size, generator: draws
        shard, fraction = routing.route_uniform(np.array(counts), total)
    finally:
        routing._rand = routing_rand
    rows = np.floor(fraction * np.array(counts)[shard]).astype(np.int64)
    got = sorted(zip(shard.tolist(), rows.tolist()))
    assert got == [(k, i) for k, c in enumerate(counts) for i in range(c)]
    with pytest.raises(RuntimeError, match="empty storage"):
        routing.route_uniform(np.zeros(2, dtype=np.int64), 3)


def test_split_by_counts_is_multinomial_or_hypergeometric():
    gen = torch.Generator().manual_seed(0)
    weights = np.array([1, 0, 3, 6])
    totals = np.array([routing.split_by_counts(weights, 10, gen) for _ in range(20_000)])
    assert (totals.sum(1) == 10).all() and (totals[:, 1] == 0).all()
    # each draw lands on shard k with probability w_k / sum(w)
    assert chi_square_p(totals.sum(0)[[0, 2, 3]], weights[[0, 2, 3]] / 10 * 200_000) > 1e-3
    # without replacement: never more than a shard's rows, all of them when asked for all
    splits = np.array([routing.split_by_counts(weights, 7, gen, without_replacement=True) for _ in range(5_000)])
    assert (splits <= weights).all() and (splits.sum(1) == 7).all()
    assert (routing.split_by_counts(weights, 10, gen, without_replacement=True) == weights).all()
    # the hypergeometric mean: 7 * w_k / 10
    np.testing.assert_allclose(splits.mean(0), 7 * weights / 10, atol=0.05)
    # the generator decides the split
    a = routing.split_by_counts(weights, 50, torch.Generator().manual_seed(5))
    b = routing.split_by_counts(weights, 50, torch.Generator().manual_seed(5))
    assert (a == b).all()


def test_groups_and_true_runs():
    shard = np.array([2, 0, 2, 1, 0])
    assert [g.tolist() for g in routing.groups(shard, 4)] == [[1, 4], [3], [0, 2], []]
    assert routing.true_runs(np.array([1, 1, 0, 1, 0, 0, 1], dtype=bool)) == [[0, 2], [3, 4], [6, 7]]
    assert routing.true_runs(np.zeros(3, dtype=bool)) == []


# ----------------------------------------------------------------------------- client bookkeeping
def test_reservations_fill_before_they_lap_and_row_descriptions():
    reservations = Reservations(2, block=10)
    reservations.add(0, "t", 0, 6, True)
    reservations.add(0, "t", 30, 40, False)
    assert reservations.held(0) == 16 and reservations.held(0, fills=True) == 6
    assert reservations.take(0, 4, fills=True) == [("t", 0, 4, True)]
    assert reservations.take(0, 8, fills=True) == [("t", 4, 2, True)]  # not past what fills
    assert reservations.take(0, 3) == [("t", 30, 3, False)]
    assert reservations.next_start(0) == 33 and reservations.next_start(1) is None
    assert reservations.take(1, 3) == []
    reservations.restore(0, "t", 4, 6, True)
    assert reservations.take(0, 3) == [("t", 4, 2, True), ("t", 33, 1, False)]
    reservations.trim(0, 36)  # lapped by other clients' writes
    assert reservations.drop() == [(0, "t", 36, 40)]
    assert describe_rows(np.array([100, 101, 102, 7, 9, 10])) == "100..102, 7, 9..10 (6 rows)"
    assert describe_rows(np.arange(0, 20, 2), limit=2).startswith("0, 2, ... (8 more runs)")


def test_a_write_never_takes_one_row_twice():
    taken = _WriteRows([10, 10])
    assert taken.admit(0, ("t", 0, 4, True)) == [("t", 0, 4, True)]
    assert taken.admit(0, ("t", 4, 3, True)) == [("t", 4, 3, True)]  # contiguous: as it is
    # a range a lap ahead (other clients wrote in between): rows 2..5 taken already
    assert taken.admit(0, ("t", 12, 6, False)) == [("t", 17, 1, False)]
    assert taken.admit(0, ("t", 27, 4, False)) == [("t", 28, 2, False)]
    assert taken.admit(1, ("t", 20, 10, False)) == [("t", 20, 10, False)]
    assert taken.full(0) and taken.full(1)  # each shard's 10 rows all taken
    fresh = _WriteRows([10])
    assert fresh.admit(0, ("t", 3, 4, True)) == [("t", 3, 4, True)] and not fresh.full(0)
    assert fresh.admit(0, ("t", 7, 6, False)) == [("t", 7, 6, False)] and fresh.full(0)  # a window of 10
