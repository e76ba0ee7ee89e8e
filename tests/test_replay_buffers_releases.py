"""The buffers' sample side as the followed torchrl release has it: 0.14's constructor
arguments, stats / can_sample, prefetch state, ``replacement=`` dispatch, storages' and
samplers' ``load_state_dict`` copies and mutation revision, ``p="sampleable"``; compared with
torchrl's own classes on the same operations and seeds where torchrl is installed."""
from __future__ import annotations

import inspect
import pickle

import pytest
import torch
from tensordict import TensorDict

import torchrl_compat as O
from torchrl_compat._releases import since

T = pytest.importorskip("torchrl.data")

needs_014 = pytest.mark.skipif(not since("buffer_service_arguments"), reason="a torchrl 0.14 behaviour")
before_014 = pytest.mark.skipif(since("buffer_service_arguments"), reason="a torchrl 0.11 behaviour")


def _data(n, start=0):
    return TensorDict({"obs": torch.arange(start, start + n, dtype=torch.float32), "a": torch.arange(n)}, [n])


def test_constructor_signature_follows_release():
    ours = inspect.signature(O.ReplayBuffer.__init__).parameters
    theirs = inspect.signature(T.ReplayBuffer.__init__).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == [
        (p.name, p.kind, p.default) for p in theirs.values()
    ]


@before_014
def test_newer_arguments_refused_before_014():
    with pytest.raises(TypeError, match="unexpected keyword argument 'consume_after_n_samples'"):
        O.ReplayBuffer(consume_after_n_samples=2)


@needs_014
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"transport": "ray"}, ValueError, "transport='auto' or 'direct'"),
        ({"transport_options": {"backend": "gloo"}}, ValueError, "transport_options"),
        ({"consume_after_n_samples": 0}, ValueError, "positive integer"),
        ({"consume_after_n_samples": True}, TypeError, "positive integer"),
        ({"consume_after_n_samples": 1, "prefetch": 2, "batch_size": 2}, ValueError, "Prefetching"),
        ({"sample_unit": object()}, TypeError, "SampleUnit instance"),
    ],
)
def test_constructor_errors_match_torchrl(kwargs, error, match):
    with pytest.raises(error, match=match):
        T.ReplayBuffer(**kwargs)
    with pytest.raises(error, match=match):
        O.ReplayBuffer(**kwargs)


@needs_014
def test_direct_service_api():
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(10), batch_size=2, prefetch=2)
    assert rb.start() is rb and rb.client() is rb and rb.service_backend == "direct" and rb.is_alive
    rb.extend(torch.arange(5))
    rb.sample()
    rb.synchronize()
    assert all(f.done() for f in rb._prefetch_queue)
    rb.shutdown()
    rb.shutdown()
    assert not rb.is_alive
    with pytest.raises(RuntimeError, match="cannot be restarted"):
        rb.start()


@needs_014
@pytest.mark.parametrize("prefetch", [None, 3])
def test_stats_and_can_sample_match_torchrl(prefetch):
    rbs = [
        cls(storage=storage(8), batch_size=4, prefetch=prefetch)
        for cls, storage in ((O.ReplayBuffer, O.LazyTensorStorage), (T.ReplayBuffer, T.LazyTensorStorage))
    ]
    for rb in rbs:
        assert rb.stats()["size"] == 0 and not rb.can_sample()
        rb.extend(torch.arange(11))
    torch.manual_seed(0)
    ours = rbs[0].sample()
    torch.manual_seed(0)
    theirs = rbs[1].sample()
    assert (ours == theirs).all()
    rbs[0].synchronize(), rbs[1].synchronize()
    assert rbs[0].stats() == rbs[1].stats()
    assert rbs[0].can_sample(100) == rbs[1].can_sample(100)
    delayed = [cls(storage=storage(6), delayed_init=True) for cls, storage in
               ((O.ReplayBuffer, O.LazyTensorStorage), (T.ReplayBuffer, T.LazyTensorStorage))]
    assert delayed[0].stats() == delayed[1].stats()
    assert not delayed[0].initialized


@needs_014
def test_prefetch_state_round_trips_as_torchrl():
    """state_dict, pickling and dumps carry the batches sampled ahead: the restored buffer
    hands out the same batches next, and torchrl's restores ours and ours torchrl's."""
    def make(ns):
        # one batch ahead: with several, the worker threads draw from the global generator
        # in no fixed order
        rb = ns.TensorDictReplayBuffer(storage=ns.LazyTensorStorage(20), batch_size=4, prefetch=1)
        rb.extend(_data(15))
        return rb

    torch.manual_seed(1)
    ours, theirs = make(O), make(T)
    torch.manual_seed(2)
    ours.sample()
    ours.synchronize()  # the batch ahead is drawn before the generator is seeded again
    torch.manual_seed(2)
    theirs.sample()
    theirs.synchronize()
    sd_ours, sd_theirs = ours.state_dict(), theirs.state_dict()
    assert list(sd_ours) == list(sd_theirs)
    assert len(sd_ours["_prefetch_state"]["queue"]) == len(sd_theirs["_prefetch_state"]["queue"]) == 1
    for a, b in zip(sd_ours["_prefetch_state"]["queue"], sd_theirs["_prefetch_state"]["queue"]):
        assert (a[0]["a"] == b[0]["a"]).all()
    expected = [q[0]["a"] for q in sd_ours["_prefetch_state"]["queue"]]
    for restored in (make(O), make(T)):
        restored.load_state_dict(sd_ours)
        assert all((restored.sample()["a"] == e).all() for e in expected)
    crossed = make(O)
    crossed.load_state_dict(sd_theirs)
    assert (crossed.sample()["a"] == sd_theirs["_prefetch_state"]["queue"][0][0]["a"]).all()
    unpickled = pickle.loads(pickle.dumps(ours))
    assert (unpickled.sample()["a"] == expected[0]).all()


@needs_014
def test_prefetch_checkpoint_crosses_with_torchrl(tmp_path):
    def make(ns):
        rb = ns.TensorDictReplayBuffer(storage=ns.LazyTensorStorage(20), batch_size=4, prefetch=2)
        rb.extend(_data(12))
        return rb

    ours = make(O)
    ours.sample()
    ahead = [f.result()[0]["a"] for f in ours._prefetch_queue]
    ours.dumps(tmp_path / "ours")
    assert (tmp_path / "ours" / "prefetch.pkl").exists()
    theirs = make(T)
    theirs.loads(tmp_path / "ours")
    assert all((theirs.sample()["a"] == e).all() for e in ahead)
    theirs.dumps(tmp_path / "theirs")
    ahead = [f.result()[0]["a"] for f in theirs._prefetch_queue]
    back = make(O)
    back.loads(tmp_path / "theirs")
    assert all((back.sample()["a"] == e).all() for e in ahead)
    with pytest.raises(RuntimeError, match="capacity 2 into a replay buffer with capacity 3"):
        O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(20), batch_size=4, prefetch=3).loads(tmp_path / "theirs")


@pytest.mark.skipif(not since("sampler_replacement_argument"), reason="a torchrl 0.13 behaviour")
def test_replacement_dispatch_matches_torchrl():
    for ns in (O, T):
        assert type(ns.RandomSampler(replacement=False, drop_last=True)).__name__ == "SamplerWithoutReplacement"
        assert type(ns.RandomSampler(replacement=True)).__name__ == "RandomSampler"
        assert type(ns.SamplerWithoutReplacement(replacement=False)).__name__ == "SamplerWithoutReplacement"
        with pytest.raises(TypeError, match="no without-replacement variant"):
            ns.PrioritizedSampler(10, 0.7, 0.5, replacement=False)
    assert isinstance(O.RandomSampler(replacement=False), O.SamplerWithoutReplacement)


@pytest.mark.parametrize("storage", ["LazyTensorStorage", "ListStorage"])
def test_storage_load_state_dict_copies(storage):
    source = getattr(O, storage)(10)
    source.set(range(3), [torch.ones(2) * i for i in range(3)] if storage == "ListStorage" else torch.ones(3, 2))
    state = source.state_dict()
    target = getattr(O, storage)(10)
    target.load_state_dict(state)
    leaf = state["_storage"][0] if storage == "ListStorage" else state["_storage"]
    leaf.fill_(7)
    aliased = bool((target[0] == 7).all())
    reference = getattr(T, storage)(10)
    reference.load_state_dict(getattr(T, storage)(10).state_dict() if False else _torchrl_state(storage))
    assert aliased == (not since("load_state_dict_clones"))


def _torchrl_state(storage):
    source = getattr(T, storage)(10)
    source.set(range(3), [torch.ones(2) * i for i in range(3)] if storage == "ListStorage" else torch.ones(3, 2))
    return source.state_dict()


def test_sampler_load_state_dict_copies():
    sampler = O.SamplerWithoutReplacement()
    storage = O.LazyTensorStorage(10)
    storage.set(range(10), torch.arange(10))
    sampler.sample(storage, 3)
    state = sampler.state_dict()
    other = O.SamplerWithoutReplacement()
    other.load_state_dict(state)
    state["_sample_list"].fill_(-1)
    assert bool((other._sample_list == -1).all()) == (not since("load_state_dict_clones"))


def test_mutation_revision_counts_changes():
    for storage in (O.LazyTensorStorage(4), O.ListStorage(4)):
        seen = [storage._mutation_revision]
        storage.set(range(2), [torch.zeros(1), torch.ones(1)] if isinstance(storage, O.ListStorage) else torch.zeros(2))
        seen.append(storage._mutation_revision)
        storage._empty()
        seen.append(storage._mutation_revision)
        storage._bump_mutation_revision()
        seen.append(storage._mutation_revision)
        assert seen == sorted(set(seen)), seen
        revision = storage._mutation_revision
        assert pickle.loads(pickle.dumps(storage))._mutation_revision == revision


@pytest.mark.parametrize("cursor, expected", [(3, 3), (torch.tensor([5, 6, 0]), 0), (slice(2, 5), 4), (range(0), None)])
def test_last_cursor_index_as_torchrl(cursor, expected):
    ours = O.LazyTensorStorage(8)
    ours._set_last_cursor(cursor)
    assert ours._last_cursor_index == expected
    if since("storage_mutation_revision"):
        theirs = T.LazyTensorStorage(8)
        theirs._set_last_cursor(cursor)
        assert theirs._last_cursor_index == expected


@pytest.mark.skipif(not since("ensemble_sampleable_routing"), reason="a torchrl 0.14 behaviour")
@pytest.mark.parametrize("p", [None, [0.2, 0.8], "sampleable"])
def test_sampler_ensemble_draws_as_torchrl(p):
    def make(ns, sizes=(6, 9)):
        storages = []
        for size in sizes:
            storage = ns.LazyTensorStorage(10)
            storage.set(range(size), torch.arange(size))
            storages.append(storage)
        return ns.StorageEnsemble(*storages), ns.SamplerEnsemble(ns.RandomSampler(), ns.RandomSampler(), p=p, num_buffer_sampled=4)

    results = []
    for ns in (O, T):
        storage, sampler = make(ns)
        torch.manual_seed(3)
        results.append(sampler.sample(storage, 12)[0])
        assert sampler.can_sample(storage, 12) and not sampler.can_sample(storage, 10)
    assert (results[0]["index"] == results[1]["index"]).all()
    assert (results[0]["buffer_ids"] == results[1]["buffer_ids"]).all()


@pytest.mark.skipif(not since("ensemble_sampleable_routing"), reason="a torchrl 0.14 behaviour")
def test_sampleable_ensemble_skips_empty_members():
    storages = [O.LazyTensorStorage(10), O.LazyTensorStorage(10)]
    storages[1].set(range(4), torch.arange(4))
    sampler = O.SamplerEnsemble(O.RandomSampler(), O.RandomSampler(), p="sampleable", num_buffer_sampled=2)
    index, _ = sampler.sample(O.StorageEnsemble(*storages), 4)
    assert (index["buffer_ids"] == 1).all()
    with pytest.raises(ValueError, match="'sampleable'"):
        O.SamplerEnsemble(O.RandomSampler(), p="uniform")


@needs_014
def test_sample_unit_sequence_matches_torchrl():
    from torchrl.data.replay_buffers.sample_units import Sequence

    def make(ns):
        rb = ns.TensorDictReplayBuffer(storage=ns.LazyTensorStorage(50), sample_unit=Sequence(length=4), batch_size=3)
        data = _data(30)
        data["next", "done"] = (torch.arange(30) % 10 == 9).unsqueeze(-1)
        rb.extend(data)
        return rb

    torch.manual_seed(4)
    ours = make(O).sample(return_info=True)
    torch.manual_seed(4)
    theirs = make(T).sample(return_info=True)
    assert (ours[0]["a"] == theirs[0]["a"]).all()
    assert set(ours[1]) == set(theirs[1])


@needs_014
@pytest.mark.parametrize("cls", ["TensorDictPrioritizedReplayBuffer", "TensorDictReplayBuffer"])
def test_sequence_priorities_reduced_to_anchors_as_torchrl(cls):
    """A Sequence sample's per-record priorities go to its anchors (the largest of each
    anchor's valid records), as torchrl 0.14 updates them."""
    import numpy as np
    from torchrl.data.replay_buffers.sample_units import Sequence

    O.install_segment_trees()
    leaves = []
    for ns in (O, T):
        kwargs = {"alpha": 0.7, "beta": 0.5} if "Prioritized" in cls else {"sampler": ns.PrioritizedSampler(30, 0.7, 0.5)}
        rb = getattr(ns, cls)(storage=ns.LazyTensorStorage(30), sample_unit=Sequence(length=3), batch_size=5, **kwargs)
        data = _data(20)
        data["next", "done"] = (torch.arange(20) % 7 == 6).unsqueeze(-1)
        rb.extend(data)
        torch.manual_seed(0)
        np.random.seed(0)
        sample = rb.sample()
        sample["td_error"] = torch.arange(sample.numel(), dtype=torch.float).reshape(sample.shape) + 1
        rb.update_tensordict_priority(sample)
        leaves.append(torch.as_tensor(rb._sampler._sum_tree[np.arange(20)]))
    assert not torch.equal(leaves[0], torch.ones(20))
    torch.testing.assert_close(leaves[0], leaves[1])


@needs_014
@pytest.mark.parametrize("generations", [False, True], ids=["plain-writer", "tracking-writer"])
@pytest.mark.parametrize("cls", ["TensorDictPrioritizedReplayBuffer", "PrioritizedReplayBuffer"])
def test_unsynchronized_prioritized_sample_units_as_torchrl(cls, generations):
    """``sync=False``: the learner's local prioritized sampler draws anchors that the buffer's
    ``Sequence`` sample unit expands into windows, with the slots' ``"index_generation"``
    when the writer tracks them, and a tensordict buffer's priority update goes to the
    anchors (each one's largest valid priority), as torchrl 0.14 does."""
    import numpy as np
    from torchrl.data.replay_buffers.sample_units import Sequence

    O.install_segment_trees()
    results = []
    for ns in (O, T):
        rb = getattr(ns, cls)(
            alpha=0.7, beta=0.5, storage=ns.LazyTensorStorage(30), sample_unit=Sequence(length=3),
            batch_size=5, sync=False,
        )
        if generations:
            # (the prioritized buffers take no writer: the tracking one is put in place)
            rb._writer = ns.TensorDictRoundRobinWriter(track_generations=True)
            rb._writer.register_storage(rb._storage)
        data = _data(34)
        data["next", "done"] = (torch.arange(34) % 7 == 6).unsqueeze(-1)
        rb.extend(data[:20])
        rb.extend(data[20:])  # wraps around: slots 0-3 written twice
        batches = []
        for seed in range(3):
            torch.manual_seed(seed)
            np.random.seed(seed)
            sample, info = rb.sample(return_info=True)
            batches.append((sample["a"], info))
            if cls == "TensorDictPrioritizedReplayBuffer":
                sample["td_error"] = torch.arange(sample.numel(), dtype=torch.float).reshape(sample.shape) + 1
                rb.update_tensordict_priority(sample)
        leaves = torch.as_tensor(rb.prioritized_sampler._sum_tree[np.arange(30)])
        results.append((batches, leaves))
    (ours, our_leaves), (theirs, their_leaves) = results
    for (a, info), (want_a, want_info) in zip(ours, theirs):
        assert torch.equal(a, want_a)
        assert set(info) == set(want_info)
        assert ("index_generation" in info) == generations
        for key in want_info:
            torch.testing.assert_close(torch.as_tensor(info[key]), torch.as_tensor(want_info[key]), msg=key)
    torch.testing.assert_close(our_leaves, their_leaves)
    if cls == "TensorDictPrioritizedReplayBuffer":
        assert not torch.equal(our_leaves[:30], torch.ones(30))


def _revision_steps(ns, storage):
    """The mutation revision after each write path of a buffer, as ``ns`` (``O`` or torchrl's
    ``T``) counts them: one step a write, the first (which initializes the storage) included."""
    rb = ns.TensorDictReplayBuffer(storage=storage, batch_size=2)
    steps = [storage._mutation_revision]

    def step(call):
        call()
        steps.append(storage._mutation_revision)

    step(lambda: rb.extend(TensorDict({"obs": torch.arange(4)}, [4])))
    step(lambda: rb.extend(TensorDict({"obs": torch.arange(3)}, [3])))
    step(lambda: rb.add(TensorDict({"obs": torch.tensor(7)}, [])))
    step(lambda: rb.__setitem__(0, TensorDict({"obs": torch.tensor(10)}, [])))
    if since("buffer_in_place_writes") and not isinstance(storage, ns.ListStorage):
        # (on a tensordict storage only: a list has no set_at_)
        step(lambda: rb.set_at_("obs", torch.tensor([11]), torch.tensor([1])))
        step(lambda: rb.set_("obs", torch.arange(len(rb)) + 20))
        step(lambda: rb.update_(TensorDict({"obs": torch.arange(len(rb)) + 30}, [len(rb)])))
    step(lambda: rb.sample())  # a read: no step
    state = rb.state_dict()
    step(lambda: rb.load_state_dict(state))
    step(lambda: rb.empty())
    return steps


@pytest.mark.parametrize("make", [
    lambda ns: ns.LazyTensorStorage(8),
    lambda ns: ns.LazyTensorStorage(8, compilable=True),
    lambda ns: ns.LazyMemmapStorage(8),
    lambda ns: ns.ListStorage(8),
], ids=["lazy", "compilable", "memmap", "list"])
def test_mutation_revision_one_step_per_buffer_write(make):
    storage = make(O)
    steps = _revision_steps(O, storage)
    # extend (4 rows), extend (3), add, [] =, (set_at_, set_, update_,) sample,
    # load_state_dict, empty: one step each but the sample, which reads; a list storage, which
    # torchrl writes item by item, one step per item of an extend
    rows = (4, 3) if isinstance(storage, O.ListStorage) else (1, 1)
    expected = [*rows] + [1] * (len(steps) - 6) + [0, 1, 1]
    assert [b - a for a, b in zip(steps, steps[1:])] == expected, steps
    if since("storage_mutation_revision"):
        assert steps == _revision_steps(T, make(T))


def _transform_classes():
    from torchrl_compat.replay_buffers._transforms import Transform

    class SharedState(Transform):
        """A transform with write state it can put in shared memory."""

        def __init__(self):
            super().__init__()
            self.shared = False

        def share_memory_(self):
            self.shared = True
            return self

        def forward(self, data):
            return data

    class Unshareable(Transform):
        requires_shared_write_state = True

        def forward(self, data):
            return data

    return SharedState, Unshareable


@pytest.mark.parametrize("add", ["append", "insert"])
@pytest.mark.parametrize("invert", [False, True])
def test_transform_added_to_a_shared_buffer_is_shared(add, invert):
    SharedState, Unshareable = _transform_classes()

    def added(rb, transform):
        if add == "append":
            return rb.append_transform(transform, invert=invert)
        return rb.insert_transform(0, transform, invert=invert)

    # as in torchrl, an inverted transform is shared through its wrapper, which has no state
    # of its own to share, so neither shared nor refused
    shares = since("buffer_shared_transforms") and not invert
    transform = SharedState()
    added(O.ReplayBuffer(storage=O.ListStorage(10), shared=True), transform)
    assert transform.shared == shares
    # an unshared buffer leaves it alone
    transform = SharedState()
    added(O.ReplayBuffer(storage=O.ListStorage(10)), transform)
    assert not transform.shared

    rb = O.ReplayBuffer(storage=O.ListStorage(10), shared=True)
    if shares:
        with pytest.raises(RuntimeError, match="Unshareable keeps replay-buffer write state"):
            added(rb, Unshareable())
        assert len(rb._transform) == 0  # refused, not added
    else:
        added(rb, Unshareable())
        assert len(rb._transform) == 1


def test_refusals_to_share_say_what_to_do_as_torchrl():
    # torchrl 0.13 on names the fix in both messages; ours follows the installed release
    def messages(ns):
        with pytest.raises(ValueError) as prefetch:
            ns.TensorDictReplayBuffer(storage=ns.LazyTensorStorage(10), batch_size=2, prefetch=1, shared=True)
        # (not constructed: torchrl's compiled trees may not load on this torch)
        sampler = ns.PrioritizedSampler.__new__(ns.PrioritizedSampler)
        import multiprocessing.context as context

        # what pickling for a spawned child sees
        spawning = context._tls.__dict__.get("spawning_popen")
        context.set_spawning_popen(object())
        try:
            with pytest.raises(RuntimeError) as shared:
                sampler.__getstate__()
        finally:
            context.set_spawning_popen(spawning)
        return str(prefetch.value), str(shared.value).replace(type(sampler).__module__, "")

    ours = messages(O)
    assert ours[0].startswith("Cannot share prefetched replay buffers.")
    assert ("prefetch=0 or shared=False" in ours[0]) == since("multiprocess_errors_name_fix")
    assert ("sync=False" in ours[1]) == since("multiprocess_errors_name_fix")
    theirs = messages(T)
    assert ours[0] == theirs[0]
    # (the class path differs: torchrl_compat's against torchrl's)
    assert ours[1].split("cannot be shared")[1] == theirs[1].split("cannot be shared")[1]


@pytest.mark.parametrize("name", ["ReplayBuffer", "TensorDictReplayBuffer", "PrioritizedReplayBuffer", "TensorDictPrioritizedReplayBuffer"])
def test_update_priority_is_defined_where_torchrl_defines_it(name):
    # a call missing its priority names the class whose method it is, as torchrl's error does
    # (the prioritized buffers have their own from torchrl 0.13 on)
    def defining_class(ns):
        return next(cls.__name__ for cls in getattr(ns, name).__mro__ if "update_priority" in vars(cls))

    ours = defining_class(O)
    assert ours == defining_class(T)
    assert ours == (name if since("prioritized_device_argument") and "Prioritized" in name else "ReplayBuffer")
    rb = getattr(O, name)(**({"alpha": 0.7, "beta": 0.5} if "Prioritized" in name else {}))
    with pytest.raises(TypeError, match=rf"^{ours}\.update_priority\(\) missing 1 required positional argument: 'priority'"):
        rb.update_priority(torch.arange(2))
