"""Storages and RandomSampler under torch.compile: recompiles counted for torchrl 0.11's classes
and ours, in the same way, on the same compiled functions.

A counting backend (``CompileCounter``, which runs each graph eagerly) counts the graphs
compiled: every recompile of a frame, and every new frame after a graph break, adds one.
"""
import pytest
import torch
import torch._dynamo
from tensordict import TensorDict
from torch._dynamo.testing import CompileCounter

import torchrl.data as trl_data
import torchrl.data.replay_buffers.samplers as trl_samplers
import torchrl.data.replay_buffers.storages as trl_storages

import torchrl_compat.samplers as our_samplers
import torchrl_compat.storages as our_storages

LIBS = {
    "torchrl": (trl_storages, trl_samplers),
    "ours": (our_storages, our_samplers),
}
WARMUP = 3
CALLS = 8


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def make_data(kind, n, step):
    values = torch.arange(n, dtype=torch.float32) + 100 * step
    if kind == "tensor":
        return values
    return {"a": values, "b": (values.clone(), {"c": values.long()})}


def sampled_values(kind, sample):
    return sample if kind == "tensor" else sample["a"]


def extend_and_sample_recompiles(lib, size, kind):
    """Recompiles over ``CALLS`` compiled extend + sample calls of a compilable torchrl
    ReplayBuffer on ``lib``'s storage and sampler, after ``WARMUP`` calls."""
    storages, samplers = LIBS[lib]
    counter = CompileCounter()
    buffer = trl_data.ReplayBuffer(
        storage=storages.LazyTensorStorage(size, compilable=True),
        sampler=samplers.RandomSampler(),
        batch_size=3,
        compilable=True,
    )

    def extend_and_sample(data):
        buffer.extend(data)
        return buffer.sample()

    compiled = torch.compile(extend_and_sample, backend=counter)
    written = set()
    frames = []
    for step in range(WARMUP + CALLS):
        data = make_data(kind, 3, step)
        sample = compiled(data)
        frames.append(counter.frame_count)
        # the sample holds values written so far, and the buffer counts every write
        written.update(make_data("tensor", 3, step).tolist())
        assert set(sampled_values(kind, sample).tolist()) <= written
        assert len(buffer) == min(3 * (step + 1), size)
    return frames[-1] - frames[WARMUP - 1]


@pytest.mark.parametrize("kind", ["tensor", "pytree"])
@pytest.mark.parametrize("size", [3, 5, 100])
def test_compiled_extend_and_sample_recompiles_no_more_than_torchrl(size, kind):
    reference = extend_and_sample_recompiles("torchrl", size, kind)
    torch._dynamo.reset()
    ours = extend_and_sample_recompiles("ours", size, kind)
    assert ours <= reference, (ours, reference)
    assert ours == 0


def set_and_sample_recompiles(lib, kind):
    storages, samplers = LIBS[lib]
    counter = CompileCounter()
    storage = storages.LazyTensorStorage(100, compilable=True)
    sampler = samplers.RandomSampler()

    def set_and_sample(data):
        storage.set(torch.arange(2) + len(storage), data)
        return sampler.sample(storage, 4)

    compiled = torch.compile(set_and_sample, backend=counter)
    for step in range(20):
        data = make_data("tensor", 2, step)
        if kind == "tensordict":
            data = TensorDict({"a": data}, [2])
        index, info = compiled(data)
        assert info == {} and len(storage) == 2 * (step + 1)
        assert bool(((index >= 0) & (index < len(storage))).all())
    return counter.frame_count


# The graphs torchrl 0.11 compiles for set_and_sample on torch 2.13: the bound where its own
# storage cannot be traced (torch 2.9's dynamo recurses into its _storage_keys property).
TORCHRL_SET_AND_SAMPLE_GRAPHS = {"tensor": 6, "tensordict": 10}


@pytest.mark.parametrize("kind", ["tensor", "tensordict"])
def test_compiled_set_and_sample_compiles_no_more_than_torchrl(kind):
    try:
        reference = set_and_sample_recompiles("torchrl", kind)
    except torch._dynamo.exc.InternalTorchDynamoError:
        reference = TORCHRL_SET_AND_SAMPLE_GRAPHS[kind]
    torch._dynamo.reset()
    ours = set_and_sample_recompiles("ours", kind)
    assert ours <= reference, (ours, reference)


def test_random_sampler_draws_as_torchrl_eagerly_and_compiled():
    """The eager fast path and the compiled path draw what torchrl's storage draws."""
    data = TensorDict({"a": torch.arange(10)}, [10])
    ours, reference = our_storages.LazyTensorStorage(10), trl_storages.LazyTensorStorage(10)
    for storage in (ours, reference):
        storage.set(torch.arange(7), data[:7])
    compiled = torch.compile(lambda storage: our_samplers.RandomSampler().sample(storage, 16)[0], backend="eager")
    for draw in (lambda s: our_samplers.RandomSampler().sample(s, 16)[0], compiled):
        torch.manual_seed(3)
        expected = trl_samplers.RandomSampler().sample(reference, 16)[0]
        torch.manual_seed(3)
        assert torch.equal(draw(ours), expected)
    empty = our_storages.LazyTensorStorage(10)
    with pytest.raises(RuntimeError, match="empty"):
        compiled(empty)


@pytest.mark.parametrize("cls_name", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_compilable_storage_bookkeeping_under_compile(cls_name, tmp_path):
    """Length, write count and journal follow compiled writes, as eager ones."""
    kwargs = {"scratch_dir": tmp_path} if cls_name == "LazyMemmapStorage" else {}
    storage = getattr(our_storages, cls_name)(6, compilable=True, **kwargs)
    storage.set(torch.arange(2), TensorDict({"a": torch.zeros(2)}, [2]))
    before, _ = storage._writes_since(None)
    write = torch.compile(
        lambda start: storage.set(torch.arange(start, start + 2) % 6, TensorDict({"a": torch.ones(2) * start}, [2])),
        backend="eager",
    )
    for start in (2, 4, 6):
        write(start)
    assert len(storage) == 6 and storage._is_full
    assert torch.equal(storage[:]["a"], torch.tensor([6.0, 6, 2, 2, 4, 4]))
    now, cursors = storage._writes_since(before)
    assert now == before + 3
    assert [c.tolist() for c in cursors] == [[2, 3], [4, 5], [0, 1]]


def _batch(step, rows=4):
    values = torch.arange(rows, dtype=torch.float32) + 100 * step
    return TensorDict(
        {"a": values.unsqueeze(-1).expand(rows, 5).clone(), "b": {"c": (values.view(rows, 1, 1) % 255).to(torch.uint8).expand(rows, 3, 4).clone()}},
        [rows],
    )


@pytest.mark.parametrize("buffer_cls", ["ReplayBuffer", "TensorDictReplayBuffer"])
@pytest.mark.parametrize("size", [6, 100])
def test_our_buffer_compiled_matches_torchrl_eager_without_recompiles(buffer_cls, size):
    """Our buffer on our classes, compiled extend + sample: each batch equals torchrl's
    buffer's, eager, with the same seed (wrap-around included), and after the warm-up
    dynamo compiles nothing more (no recompile, no new frame)."""
    import torchrl_compat

    def make(lib):
        return getattr(lib, buffer_cls)(
            storage=lib.LazyTensorStorage(size, compilable=True),
            sampler=lib.RandomSampler(),
            batch_size=5,
            compilable=True,
        )

    ours, reference = make(torchrl_compat), make(trl_data)

    def extend_and_sample(buffer, data):
        buffer.extend(data)
        return buffer.sample()

    compiled = torch.compile(extend_and_sample)
    frames = torch._dynamo.utils.counters["frames"]
    for step in range(3 * WARMUP + 3 * CALLS):
        if step == WARMUP:
            seen = dict(frames)
        torch.manual_seed(step)
        got = compiled(ours, _batch(step))
        torch.manual_seed(step)
        expected = extend_and_sample(reference, _batch(step))
        assert len(ours) == len(reference) == min(4 * (step + 1), size)
        for key in (("a",), ("b", "c")):
            assert torch.equal(got[key], expected[key]), (step, key)
        if buffer_cls == "TensorDictReplayBuffer":
            assert torch.equal(got["index"], expected["index"])
    assert seen["total"] > 0 and dict(frames) == seen


@pytest.mark.parametrize("first_write_compiled", [False, True])
@pytest.mark.parametrize("kind", ["tensor", "tensordict"])
def test_compilable_storage_set_traces_whole(first_write_compiled, kind):
    """A compilable storage's ``set`` of tensors goes into one graph (fullgraph=True, as
    torchrl 0.14's; the first write, which creates the storage, and tensordict's own
    assignment break it), with its length, write count and last cursor kept as in eager
    code, and no recompile once warm."""
    storage = our_storages.LazyTensorStorage(100, compilable=True)
    counter = CompileCounter()

    def batch(start):
        rows = torch.arange(start, start + 25).unsqueeze(-1)
        return TensorDict({"a": rows}, [25]) if kind == "tensordict" else rows

    if not first_write_compiled:
        storage.set(torch.arange(25), batch(0))
    write = torch.compile(
        lambda cursor, value: storage.set(cursor, value), backend=counter, fullgraph=kind == "tensor" and not first_write_compiled
    )
    start = 25 if not first_write_compiled else 0
    frames = []
    for start in range(start, 100, 25):
        write(torch.arange(start, start + 25), batch(start))
        frames.append(counter.frame_count)
    assert len(storage) == 100 and storage._is_full
    assert storage._mutation_revision == 4
    assert storage._last_cursor_index == 99
    stored = storage[:]["a"] if kind == "tensordict" else storage[:]
    assert torch.equal(stored.squeeze(-1), torch.arange(100))
    assert frames[-1] == frames[1], frames  # nothing compiled after the first two writes
