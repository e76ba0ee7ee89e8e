"""Buffers used from several threads and processes, under torch.compile, and without torchrl.

Every item written is self-consistent (its fields are functions of one number), so a
sample holding a row written half-way, or rows of two different items, shows at once.
Children are joined with a timeout and killed if they overstay, so a hang fails the test
instead of blocking the suite.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from tensordict import TensorDict

import torchrl_compat as O
from torchrl_compat._releases import since

from test_storages_multiprocess import JOIN_TIMEOUT, join

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def items(values):
    """One item per value ``v``: ``obs = [v, v, v]``, ``reward = -v``, ``next.obs = v + 0.5``."""
    v = torch.as_tensor(values, dtype=torch.float32)
    return TensorDict(
        {"obs": v.unsqueeze(-1).expand(-1, 3).clone(), "reward": -v.unsqueeze(-1), ("next", "obs"): v + 0.5},
        [v.shape[0]],
    )


def assert_consistent(sample, rb=None):
    """Each sampled item is whole; with ``rb`` (only while nothing writes to it), the rows
    its ``"index"`` names hold these very items."""
    v = sample["obs"][:, 0]
    assert torch.equal(sample["obs"], v.unsqueeze(-1).expand(-1, 3))
    assert torch.equal(sample["reward"].squeeze(-1), -v)
    assert torch.equal(sample["next", "obs"], v + 0.5)
    if rb is not None:
        rows = rb.storage[sample["index"]]["obs"][:, 0]
        assert torch.equal(rows, v), f"index {sample['index'].tolist()} holds {rows.tolist()}, sampled {v.tolist()}"


def assert_rows_written(samples, writes):
    """Each ``(values, index)`` sampled pairs every value with the row it was written to.

    ``writes`` holds every ``(values, index)`` that ``extend`` returned. Values are never
    written twice, so this holds however the rows were overwritten after the sample: a
    sampled index pointing at another row than its data's (where priority updates would
    go) fails it.
    """
    row_of = {}
    for values, index in writes:
        row_of.update(zip(values.long().tolist(), index.tolist()))
    for values, index in samples:
        expected = [row_of[v] for v in values.long().tolist()]
        assert index.tolist() == expected, f"sampled values {values.long().tolist()} at index {index.tolist()}, written to rows {expected}"


# ------------------------------------------------------------------------ threads


@pytest.mark.parametrize("prioritized", [False, True])
def test_threads_extend_sample_update(prioritized):
    capacity, batch, rounds = 64, 24, 60
    if prioritized:
        rb = O.TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=O.LazyTensorStorage(capacity))
    else:
        rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(capacity))
    first = torch.arange(capacity)
    writes = [(first, rb.extend(items(first)).clone())]
    samples = []  # (values, index) of every batch sampled while the writers write
    errors = []
    barrier = threading.Barrier(4)

    def writer(offset):
        try:
            barrier.wait()
            for r in range(rounds):
                # every value written once: each writer writes its own range
                values = torch.arange(batch) + 100_000 * (offset + 1) + r * batch
                index = rb.extend(items(values))
                writes.append((values, index.clone()))
        except BaseException as err:  # noqa: B902 - reported below
            errors.append(err)

    def reader():
        try:
            barrier.wait()
            for _ in range(rounds):
                sample = rb.sample(16)
                assert_consistent(sample)
                samples.append((sample["obs"][:, 0].clone(), sample["index"].clone()))
                if prioritized:
                    sample["td_error"] = sample["obs"][:, 0].abs() / 1000 + 0.1
                    rb.update_tensordict_priority(sample)
        except BaseException as err:  # noqa: B902 - reported below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
        assert not thread.is_alive()
    assert not errors, errors
    assert len(samples) == 2 * rounds and len(writes) == 1 + 2 * rounds
    assert_rows_written(samples, writes)
    assert rb.write_count == capacity + 2 * rounds * batch
    assert len(rb) == capacity
    # every row holds a whole item, and the writer's index for it
    stored = rb[:]
    assert_consistent(stored)
    assert torch.equal(stored["index"], torch.arange(capacity))
    # once the writers are done, the rows of a sample's index hold it, and its priorities
    # go to those rows
    sample = rb.sample(32)
    assert_consistent(sample, rb)
    if prioritized:
        sample["td_error"] = sample["obs"][:, 0].abs() / 1000 + 0.1
        rb.update_tensordict_priority(sample)
        tree = rb.sampler._sum_tree
        expected = (rb[:]["obs"][:, 0].abs() / 1000 + 0.1 + rb.sampler._eps) ** 0.7
        index = sample["index"]
        torch.testing.assert_close(torch.as_tensor(tree[index]).float(), expected[index])


def test_prefetch_threads():
    rb = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(100), prefetch=3, batch_size=10)
    rb.extend(items(torch.arange(100)))
    for _ in range(20):
        sample = rb.sample()
        assert sample.shape == (10,)
        assert_consistent(sample, rb)
        assert torch.equal(sample["obs"][:, 0].long(), sample["index"])


class _HeldRandomSampler(O.RandomSampler):
    """A random sampler whose draws after the first wait for ``release``: prefetches stay in
    flight, their generator draws not yet made, for as long as a test wants."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.draws = 0

    def sample(self, storage, batch_size):
        self.draws += 1
        if self.draws > 1:
            assert self.release.wait(JOIN_TIMEOUT)
        return super().sample(storage, batch_size)


@pytest.mark.skipif(not since("buffer_prefetch_state"), reason="the release saves no prefetched batches")
def test_dumps_waits_for_prefetches_in_flight(tmp_path):
    # dumps read the generator before the prefetches still drawing had drawn: the restored
    # buffer then started from an earlier state and drew other batches (seen as a flake of
    # torchrl 0.14's test_replay_buffer_prefetch_dumps_roundtrip under load; caught here
    # with the dump's capture of the prefetch state moved back after the generator's)
    def make(sampler, seed):
        rb = O.ReplayBuffer(storage=O.LazyTensorStorage(20), sampler=sampler, batch_size=3, prefetch=2,
                            generator=torch.Generator().manual_seed(seed))
        rb.extend(torch.arange(20))
        return rb

    held = _HeldRandomSampler()
    source = make(held, 0)
    source.sample()  # the two prefetches now wait
    dump = threading.Thread(target=source.dumps, args=(tmp_path,))
    dump.start()
    dump.join(0.5)  # a dump that does not wait has read the generator by now
    held.release.set()
    dump.join(JOIN_TIMEOUT)
    assert not dump.is_alive()
    restored = make(O.RandomSampler(), 1)
    restored.loads(tmp_path)
    for _ in range(4):
        (a, info_a), (b, info_b) = source.sample(return_info=True), restored.sample(return_info=True)
        assert torch.equal(info_a["index"], info_b["index"])
        assert torch.equal(a, b)


class _SlowSecondDraw(O.RandomSampler):
    """A random sampler whose second draw (the first prefetched one) takes 0.3 s to start."""

    def __init__(self):
        super().__init__()
        self.draws = 0

    def sample(self, storage, batch_size):
        self.draws += 1
        if self.draws == 2:
            time.sleep(0.3)
        return super().sample(storage, batch_size)


def test_prefetched_samples_draw_in_the_order_they_were_queued():
    # with one thread per prefetched batch (torchrl's), the third draw ran while the second
    # slept and took the generator's next numbers: the batches came out swapped (and a buffer
    # restored from a checkpoint drew other batches than the one dumped, under load)
    def make(sampler, prefetch):
        rb = O.ReplayBuffer(storage=O.LazyTensorStorage(50), sampler=sampler, batch_size=3, prefetch=prefetch,
                            generator=torch.Generator().manual_seed(0))
        rb.extend(torch.arange(50))
        return rb

    prefetching, plain = make(_SlowSecondDraw(), 3), make(O.RandomSampler(), None)
    for _ in range(6):
        assert torch.equal(prefetching.sample(), plain.sample())


# ---------------------------------------------------------------------- processes


def _child_extend(rb, start, n, queue):
    rb.extend(items(torch.arange(start, start + n)))
    sample = rb.sample(8)
    assert_consistent(sample, rb)  # nothing else writes meanwhile: the parent waits
    queue.put((len(rb), rb.write_count))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_shared_buffer_across_processes(tmp_path, context):
    rb = O.TensorDictReplayBuffer(storage=O.LazyMemmapStorage(40, scratch_dir=tmp_path / "mm"), shared=True)
    rb.extend(items(torch.arange(5)))
    ctx = mp.get_context(context)
    queue = ctx.Queue()
    process = ctx.Process(target=_child_extend, args=(rb, 100, 7, queue))
    process.start()
    assert queue.get(timeout=JOIN_TIMEOUT) == (12, 12)
    assert join(process) == 0
    # the parent sees the child's items, length, cursor and write count
    assert len(rb) == 12 and rb.write_count == 12 and rb.writer._cursor == 12
    stored = rb[:]
    assert torch.equal(stored["obs"][:, 0], torch.cat([torch.arange(5), torch.arange(100, 107)]).float())
    rb.extend(items(torch.arange(200, 203)))
    assert len(rb) == 15 and rb.writer._cursor == 15


def test_shared_buffer_lock_is_a_process_lock():
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(4), shared=True)
    assert type(rb._write_lock._lock).__module__.startswith("multiprocessing")
    assert O.ReplayBuffer(storage=O.LazyTensorStorage(4))._write_lock.__enter__() is None


def _child_extend_reporting(rb, start, queue):
    try:
        rb.extend(items(torch.arange(start, start + 4)))
        queue.put("written")
    except RuntimeError as err:
        queue.put(str(err))


FORKED_WRITES_LOST = {
    # what a forked child would write into: (the buffer, laid out in the parent or not, message)
    "storage not initialized": (
        lambda path: O.TensorDictReplayBuffer(storage=O.LazyMemmapStorage(40, scratch_dir=path), shared=True),
        False,
        "Cowardly refusing to write, in process .* that has not been initialized yet",
    ),
    "storage in private memory": (
        lambda path: O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(40), shared=True),
        True,
        "its tensors are in the private memory of each process",
    ),
    "prioritized sampler": (
        lambda path: O.TensorDictPrioritizedReplayBuffer(
            alpha=0.7, beta=0.5, storage=O.LazyMemmapStorage(40, scratch_dir=path), shared=True
        ),
        True,
        "Samplers of type .*PrioritizedSampler.* cannot be shared between processes",
    ),
}


@pytest.mark.parametrize("case", list(FORKED_WRITES_LOST))
def test_forked_child_refuses_writes_that_would_stay_there(tmp_path, case):
    # torchrl's children write into what only they see, exit 0, and the rows (or their
    # priorities) never reach the parent, whose length counts them
    make, laid_out, message = FORKED_WRITES_LOST[case]
    rb = make(tmp_path / "mm")
    if laid_out:
        rb.extend(items(torch.arange(5)))
    before = (len(rb), rb.write_count)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    children = [ctx.Process(target=_child_extend_reporting, args=(rb, 100 * (i + 1), queue)) for i in range(2)]
    for child in children:
        child.start()
    reports = [queue.get(timeout=JOIN_TIMEOUT) for _ in children]
    assert [join(child) for child in children] == [0, 0]
    for report in reports:
        assert re.search(message, report, re.S), report
    assert (len(rb), rb.write_count) == before
    # the parent goes on writing
    rb.extend(items(torch.arange(50, 53)))
    assert len(rb) == before[0] + 3


def test_forked_children_write_a_shared_storage():
    # what is shared (here an anonymous memory map, laid out before the fork) is written
    rb = O.TensorDictReplayBuffer(storage=O.LazyMemmapStorage(40), shared=True)
    rb.extend(items(torch.arange(5)))
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    children = [ctx.Process(target=_child_extend_reporting, args=(rb, 100 * (i + 1), queue)) for i in range(2)]
    for child in children:
        child.start()
    assert [queue.get(timeout=JOIN_TIMEOUT) for _ in children] == ["written", "written"]
    assert [join(child) for child in children] == [0, 0]
    assert len(rb) == 13
    assert sorted(rb[:]["obs"][:, 0].long().tolist()) == list(range(5)) + list(range(100, 104)) + list(range(200, 204))


# ------------------------------------------------------------------ torch.compile


def _torchrl_compiles():
    """Whether torch.compile traces torchrl's own compilable buffer on this torch (torch 2.9's
    dynamo recurses without end in tensordict's attribute handling there)."""
    import torchrl.data as TD

    rb = TD.TensorDictReplayBuffer(
        storage=TD.LazyTensorStorage(8, compilable=True), compilable=True, batch_size=2
    )
    try:
        torch.compile(rb.extend, backend="eager")(items(torch.arange(3)))
    except Exception:  # noqa: BLE001 - any failure of the reference
        return False
    return True


def test_compilable_buffer_under_torch_compile():
    if not _torchrl_compiles():
        pytest.skip(f"torch {torch.__version__} cannot compile torchrl's own buffer either")
    eager = O.TensorDictReplayBuffer(
        storage=O.LazyTensorStorage(32, compilable=True), sampler=O.SamplerWithoutReplacement(shuffle=False),
        compilable=True, batch_size=6,
    )
    traced = O.TensorDictReplayBuffer(
        storage=O.LazyTensorStorage(32, compilable=True), sampler=O.SamplerWithoutReplacement(shuffle=False),
        compilable=True, batch_size=6,
    )
    extend = torch.compile(traced.extend, backend="eager")
    sample = torch.compile(traced.sample, backend="eager")
    for step in range(3):
        data = items(torch.arange(10) + 10 * step)
        assert torch.equal(extend(data.clone()), eager.extend(data.clone()))
        got, expected = sample(), eager.sample()
        assert torch.equal(got["obs"], expected["obs"]) and torch.equal(got["index"], expected["index"])
    assert len(traced) == len(eager) == 30 and traced.write_count == 30


# ------------------------------------------------------------------- standalone

_STANDALONE = """
import sys
sys.path.insert(0, {root!r})
{block}
import tempfile
import torch
from tensordict import TensorDict
import torchrl_compat as O

for name in ["ReplayBuffer", "TensorDictPrioritizedReplayBuffer", "RoundRobinWriter", "Writer"]:
    assert all(not c.__module__.startswith("torchrl.") for c in getattr(O, name).__mro__), name

def data(n, start=0):
    v = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({{"obs": v.unsqueeze(-1).expand(-1, 2).clone(), ("next", "done"): (v % 3 == 0).unsqueeze(-1)}}, [n])

rb = O.TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=O.LazyTensorStorage(16), batch_size=4,
                                         generator=torch.Generator().manual_seed(0))
rb.extend(data(20))
sample = rb.sample()
assert set(sample.keys()) == {{"obs", "next", "index", "priority_weight"}}
sample["td_error"] = torch.arange(4.0)
rb.update_tensordict_priority(sample)
with tempfile.TemporaryDirectory() as tmp:
    rb.dumps(tmp)
    copy = O.TensorDictPrioritizedReplayBuffer(alpha=0.1, beta=0.1, storage=O.LazyTensorStorage(16))
    copy.loads(tmp)
    assert torch.equal(copy[:]["obs"], rb[:]["obs"]) and copy._writer._cursor == 4
    assert torch.equal(copy.sample()["index"], rb.sample()["index"])

# transforms are callables on the sampled data; invert=True runs on writes
def double(td):
    td["obs"] = td["obs"] * 2
    return td
def shift(td):
    td["obs"] = td["obs"] + 100
    return td
plain = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(8), transform=double,
                                 sampler=O.SamplerWithoutReplacement(shuffle=False))
plain.append_transform(shift, invert=True)
plain.insert_transform(0, lambda td: td)
plain.extend(data(3))
assert plain.sample(3)["obs"][:, 0].tolist() == [200.0, 202.0, 204.0]
assert len(plain.transform) == 3 and plain.transform.state_dict() == {{}}

tensors = O.ReplayBuffer(storage=O.LazyTensorStorage(8), batch_size=3)
tensors.extend(torch.arange(10.0))
assert tensors.sample().shape == (3,) and len(tensors) == 8
pytree = O.ReplayBuffer(storage=O.LazyTensorStorage(8))
pytree.extend({{"a": torch.ones(3), "b": (torch.zeros(3, 2),)}})
assert pytree.sample(2)["b"][0].shape == (2, 2)
best = O.TensorDictReplayBuffer(storage=O.LazyTensorStorage(2), writer=O.TensorDictMaxValueWriter(rank_key="obs"))
best.extend(data(6))
assert sorted(best[:]["obs"][:, 0].tolist()) == [4.0, 5.0]
ens = O.ReplayBufferEnsemble(tensors, O.ReplayBuffer(storage=O.LazyTensorStorage(8)), sample_from_all=True)
ens[1].extend(torch.arange(5.0))
assert len(ens.sample(4)) == 2
print("TORCHRL" if any(m.split(".")[0] == "torchrl" for m in sys.modules) else "NO-TORCHRL")
"""

_BLOCK = """
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torchrl":
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
"""


@pytest.mark.parametrize("how", ["torchrl hidden", "TORCHRL_COMPAT_STANDALONE=1"])
def test_runs_without_torchrl(how):
    block = _BLOCK if how == "torchrl hidden" else ""
    env = dict(os.environ)
    if how != "torchrl hidden":
        env["TORCHRL_COMPAT_STANDALONE"] = "1"
    script = textwrap.dedent(_STANDALONE.format(root=ROOT, block=block))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-4000:]
    if how == "torchrl hidden":
        assert out.stdout.strip().splitlines()[-1] == "NO-TORCHRL"
