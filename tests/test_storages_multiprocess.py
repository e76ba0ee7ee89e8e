"""Storages across processes: shared length, ``shared_init``, pickling rules and memmap cleanup.

Every child is joined with a timeout and killed if it overstays, so a hang fails the test
instead of blocking the suite.
"""
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from tensordict import TensorDict

import torchrl.data.replay_buffers.storages as trl

import torchrl_compat.storages as ours

JOIN_TIMEOUT = 60
CONTEXTS = ["fork", "spawn"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_td(n, offset=0):
    obs = torch.arange(n * 4, dtype=torch.float32).reshape(n, 4) + offset
    return TensorDict({"obs": obs, ("next", "done"): obs[:, :1] > 10}, batch_size=[n])


def join(process):
    process.join(JOIN_TIMEOUT)
    if process.is_alive():
        process.kill()
        process.join(5)
        pytest.fail(f"child process {process.pid} did not finish within {JOIN_TIMEOUT}s")
    return process.exitcode


def get(queue):
    return queue.get(timeout=JOIN_TIMEOUT)


# -----------------------------------------------------------------------------
# children (module level so that spawn can import them)
# -----------------------------------------------------------------------------
def _child_fill(storage, start, n, queue):
    storage.set(range(start, start + n), make_td(n, offset=start))
    queue.put(len(storage))


def _child_read_len(storage, queue):
    queue.put(len(storage))


def _child_fill_and_wait(cls_name, kwargs, n, queue):
    # Creates a memmap storage, reports where its files are, then waits to be terminated.
    storage = getattr(ours, cls_name)(16, **kwargs)
    storage.set(range(n), make_td(n))
    queue.put(storage.scratch_dir)
    wait_for_a_signal()


def wait_for_a_signal():
    # Not signal.pause(): a signal that lands after the last check for pending signals and
    # before pause() blocks leaves its handler waiting for a second signal (the parent sends
    # SIGTERM as soon as it has the path). A sleep ends and lets the handler run.
    while True:
        time.sleep(0.05)


def _child_fill_and_return(cls_name, kwargs, n, queue):
    storage = getattr(ours, cls_name)(16, **kwargs)
    storage.set(range(n), make_td(n))
    queue.put(storage.scratch_dir)


# -----------------------------------------------------------------------------
# Length sharing
# -----------------------------------------------------------------------------
def _initialized(cls_name, tmp_path):
    if cls_name == "LazyMemmapStorage":
        storage = ours.LazyMemmapStorage(64, scratch_dir=tmp_path / "mm")
    else:
        storage = ours.LazyTensorStorage(64)
    storage.set(range(2), make_td(2))
    if cls_name == "LazyTensorStorage":
        # a forked child writes into the parent's pages only if they are shared
        storage._storage.share_memory_()
    return storage


@pytest.mark.parametrize("ctx", CONTEXTS)
@pytest.mark.parametrize("cls_name", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_child_writes_are_seen_by_parent(tmp_path, ctx, cls_name):
    storage = _initialized(cls_name, tmp_path)
    context = mp.get_context(ctx)
    queue = context.Queue()
    process = context.Process(target=_child_fill, args=(storage, 2, 10, queue))
    process.start()
    assert join(process) == 0
    assert get(queue) == 12
    assert len(storage) == 12
    torch.testing.assert_close(storage[2:12]["obs"], make_td(10, offset=2)["obs"])
    torch.testing.assert_close(storage[:2]["obs"], make_td(2)["obs"])


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_parent_writes_are_seen_by_child(tmp_path, ctx):
    storage = _initialized("LazyTensorStorage", tmp_path)
    context = mp.get_context(ctx)
    queue = context.Queue()
    process = context.Process(target=_child_read_len, args=(storage, queue))
    storage.set(range(2, 7), make_td(5))
    process.start()
    assert join(process) == 0
    assert get(queue) == 7


def _child_write_at(storage, cursor, queue):
    storage.set(cursor, make_td(len(cursor)))
    queue.put((storage._mutation_revision, storage._last_cursor_index))


@pytest.mark.parametrize("ctx", CONTEXTS)
@pytest.mark.parametrize("cls_name", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_child_writes_move_the_parent_revision_and_last_cursor(tmp_path, ctx, cls_name):
    # what a reader in the parent derived from the items (a slice sampler's trajectory ends)
    # must see that a child wrote, and where it wrote last
    storage = _initialized(cls_name, tmp_path)
    revision = storage._mutation_revision
    assert storage._last_cursor_index == 1
    context = mp.get_context(ctx)
    queue = context.Queue()
    process = context.Process(target=_child_write_at, args=(storage, torch.tensor([5, 6, 3]), queue))
    process.start()
    assert join(process) == 0
    assert get(queue) == (revision + 1, 3)
    assert storage._mutation_revision == revision + 1
    assert storage._last_cursor_index == 3
    storage.set(range(7, 9), make_td(2))
    assert (storage._mutation_revision, storage._last_cursor_index) == (revision + 2, 8)


def test_last_cursor_not_shared_through_plain_pickle():
    import pickle

    storage = ours.LazyTensorStorage(16)
    storage.set(range(3), make_td(3))
    copy = pickle.loads(pickle.dumps(storage))
    assert copy._last_cursor_index == 2
    copy.set([9], make_td(1))
    assert (copy._last_cursor_index, storage._last_cursor_index) == (9, 2)


def test_length_not_shared_through_plain_pickle():
    # Outside a spawning context (plain pickle, e.g. a copy), the copy gets its own length.
    import pickle

    storage = ours.LazyTensorStorage(16)
    storage.set(range(3), make_td(3))
    copy = pickle.loads(pickle.dumps(storage))
    assert len(copy) == 3
    storage.set(range(3, 5), make_td(2))
    assert len(storage) == 5
    assert len(copy) == 3


def _child_write_rows(storage, start, count, row, started):
    started.wait(JOIN_TIMEOUT)
    for i in range(start, start + count):
        storage.set(i, row)


def _child_read_shape_until(storage, stop, started):
    started.set()
    while not stop.is_set():
        # as a fresh reader (SliceSampler.sample in another process) reads it the first time
        storage.__dict__.pop("_total_shape_value", None)
        storage.shape


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("cls_name", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_no_length_increment_lost_to_a_first_shape_read(tmp_path, cls_name, ndim):
    """One process writes row by row while another reads ``storage.shape`` for the first
    time, over and over: the length ends at exactly what was written (a plain count)."""
    writes, inner = 1500, 3
    context = mp.get_context("fork")
    for trial in range(3):
        kwargs = {"scratch_dir": tmp_path / f"mm{ndim}-{trial}"} if cls_name == "LazyMemmapStorage" else {}
        capacity = (writes + 2) * (inner if ndim == 2 else 1)
        storage = getattr(ours, cls_name)(capacity, ndim=ndim, **kwargs)
        batch = make_td(2) if ndim == 1 else make_td(2 * inner).reshape(2, inner)
        storage.set(range(2), batch)
        storage.__dict__.pop("_total_shape_value", None)
        started, stop = context.Event(), context.Event()
        reader = context.Process(target=_child_read_shape_until, args=(storage, stop, started))
        writer = context.Process(target=_child_write_rows, args=(storage, 2, writes, batch[0], started))
        reader.start()
        writer.start()
        assert join(writer) == 0
        stop.set()
        assert join(reader) == 0
        per_row = inner if ndim == 2 else 1
        assert len(storage) == (2 + writes) * per_row, f"trial {trial}"


# -----------------------------------------------------------------------------
# shared_init
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("ctx", CONTEXTS)
@pytest.mark.parametrize("cls_name", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_shared_init_children_initialize(ctx, cls_name):
    storage = getattr(ours, cls_name)(32, shared_init=True)
    assert not storage.initialized
    context = mp.get_context(ctx)
    queue = context.Queue()
    # the first child becomes the coordinator and builds the memmap; the second finds it ready
    first = context.Process(target=_child_fill, args=(storage, 0, 4, queue))
    first.start()
    assert join(first) == 0
    assert get(queue) == 4
    second = context.Process(target=_child_fill, args=(storage, 4, 6, queue))
    second.start()
    assert join(second) == 0
    assert get(queue) == 10
    # the parent never wrote: it loads the shared memmap on first read
    data = storage.get(slice(0, 10))
    assert storage.initialized
    assert len(storage) == 10
    torch.testing.assert_close(data["obs"][:4], make_td(4)["obs"])
    torch.testing.assert_close(data["obs"][4:], make_td(6, offset=4)["obs"])
    assert os.path.isfile(os.path.join(storage._init_directory, "obs.memmap"))


def test_shared_init_concurrent_writers():
    storage = ours.LazyMemmapStorage(32, shared_init=True)
    context = mp.get_context("fork")
    queue = context.Queue()
    children = [
        context.Process(target=_child_fill, args=(storage, start, 8, queue))
        for start in (0, 8, 16)
    ]
    for child in children:
        child.start()
    assert [join(child) for child in children] == [0, 0, 0]
    for _ in children:
        get(queue)
    data = storage.get(slice(0, 24))
    for start in (0, 8, 16):
        torch.testing.assert_close(data["obs"][start : start + 8], make_td(8, offset=start)["obs"])


def test_shared_init_compilable_refused():
    with pytest.raises(RuntimeError, match="Cannot share a compilable storage between processes."):
        ours.LazyTensorStorage(8, shared_init=True, compilable=True)


# -----------------------------------------------------------------------------
# What may be sent to a spawned process
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("lib", [trl, ours], ids=["torchrl", "ours"])
@pytest.mark.parametrize("cls_name", ["ListStorage", "LazyStackStorage"])
def test_list_storage_refuses_spawn(lib, cls_name):
    storage = getattr(lib, cls_name)(8)
    storage.set(range(2), torch.zeros(2, 3))
    context = mp.get_context("spawn")
    process = context.Process(target=_child_read_len, args=(storage, context.Queue()))
    with pytest.raises(RuntimeError, match=rf"Cannot share a storage of type .*{cls_name}'> between processes\."):
        process.start()
    assert process.pid is None or join(process) is not None


def test_list_storage_fork_reads_a_copy():
    storage = ours.ListStorage(8)
    storage.set(range(3), torch.zeros(3, 2))
    context = mp.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=_child_read_len, args=(storage, queue))
    process.start()
    assert join(process) == 0
    assert get(queue) == 3


@pytest.mark.parametrize("lib", [trl, ours], ids=["torchrl", "ours"])
def test_uninitialized_tensor_storage_refuses_spawn(lib):
    context = mp.get_context("spawn")
    process = context.Process(target=_child_read_len, args=(lib.LazyTensorStorage(8), context.Queue()))
    with pytest.raises(RuntimeError, match="Cowardly refusing to share a storage of type .*LazyTensorStorage"):
        process.start()


# -----------------------------------------------------------------------------
# Memmap cleanup
# -----------------------------------------------------------------------------
def _start_and_get(context, target, args):
    queue = context.Queue()
    process = context.Process(target=target, args=(*args, queue))
    process.start()
    try:
        path = get(queue)
    except BaseException:
        process.kill()
        join(process)
        raise
    return process, path


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_temp_memmap_removed_after_sigterm(ctx):
    context = mp.get_context(ctx)
    process, path = _start_and_get(
        context, _child_fill_and_wait, ("LazyMemmapStorage", {"shared_init": True}, 3)
    )
    assert os.path.isfile(os.path.join(path, "obs.memmap"))
    process.terminate()
    assert join(process) == -signal.SIGTERM
    assert not os.path.exists(path)


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_temp_memmap_removed_after_normal_exit(ctx):
    context = mp.get_context(ctx)
    process, path = _start_and_get(
        context, _child_fill_and_return, ("LazyMemmapStorage", {"shared_init": True}, 3)
    )
    assert join(process) == 0
    assert not os.path.exists(path)


@pytest.mark.parametrize("ctx", CONTEXTS)
@pytest.mark.parametrize("stop", ["sigterm", "exit"])
def test_user_directory_kept(tmp_path, ctx, stop):
    context = mp.get_context(ctx)
    user_dir = tmp_path / "mine"
    target = _child_fill_and_wait if stop == "sigterm" else _child_fill_and_return
    process, path = _start_and_get(context, target, ("LazyMemmapStorage", {"scratch_dir": user_dir}, 3))
    if stop == "sigterm":
        process.terminate()
        assert join(process) == -signal.SIGTERM
    else:
        assert join(process) == 0
    assert os.path.isfile(user_dir / "obs.memmap")
    assert os.path.isfile(user_dir / "next" / "done.memmap")


def test_forked_child_sigterm_keeps_parent_files():
    # The child inherits the parent's cleanup registry and signal handler; terminating it must
    # remove only what the child created.
    parent = ours.LazyMemmapStorage(16, shared_init=True)
    parent.set(range(2), make_td(2))
    parent_dir = parent.scratch_dir
    context = mp.get_context("fork")
    process, child_dir = _start_and_get(
        context, _child_fill_and_wait, ("LazyMemmapStorage", {"shared_init": True}, 3)
    )
    process.terminate()
    assert join(process) == -signal.SIGTERM
    assert not os.path.exists(child_dir)
    assert os.path.isfile(os.path.join(parent_dir, "obs.memmap"))
    torch.testing.assert_close(parent[:2]["obs"], make_td(2)["obs"])
    assert parent.cleanup() is True
    assert not os.path.exists(parent_dir)


def test_temp_memmap_removed_at_interpreter_exit(tmp_path):
    # A storage still referenced at exit is removed by the atexit hook.
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {ROOT!r})
        import torch
        from tensordict import TensorDict
        from torchrl_compat.storages import LazyMemmapStorage
        STORAGE = LazyMemmapStorage(8, shared_init=True)
        STORAGE.set(range(2), TensorDict({{"obs": torch.zeros(2, 3)}}, [2]))
        print(STORAGE.scratch_dir, flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=JOIN_TIMEOUT
    )
    assert out.returncode == 0, out.stderr
    path = out.stdout.strip().splitlines()[-1]
    assert path.startswith("/") and "torchrl_storage_init_" in path
    assert not os.path.exists(path)


# -----------------------------------------------------------------------------
# existsok
# -----------------------------------------------------------------------------
@pytest.mark.parametrize("lib", [trl, ours], ids=["torchrl", "ours"])
def test_existsok_false_refuses_existing_files(tmp_path, lib):
    first = lib.LazyMemmapStorage(8, scratch_dir=tmp_path)
    first.set(range(3), make_td(3))
    second = lib.LazyMemmapStorage(8, scratch_dir=tmp_path)
    with pytest.raises(RuntimeError, match=r"The file .*obs.memmap already exists"):
        second.set(range(3), make_td(3, offset=100))
    torch.testing.assert_close(first[:3]["obs"], make_td(3)["obs"])


@pytest.mark.parametrize("lib", [trl, ours], ids=["torchrl", "ours"])
def test_existsok_true_reuses_files(tmp_path, lib):
    first = lib.LazyMemmapStorage(8, scratch_dir=tmp_path)
    first.set(range(3), make_td(3))
    second = lib.LazyMemmapStorage(8, scratch_dir=tmp_path, existsok=True)
    second.set(range(3), make_td(3, offset=100))
    assert len(second) == 3
    torch.testing.assert_close(second[:3]["obs"], make_td(3, offset=100)["obs"])
    assert os.path.isfile(tmp_path / "obs.memmap")


@pytest.mark.parametrize("lib", [trl, ours], ids=["torchrl", "ours"])
def test_existing_pytree_files_refused(tmp_path, lib):
    first = lib.LazyMemmapStorage(8, scratch_dir=tmp_path)
    first.set(range(3), {"a": torch.zeros(3)})
    second = lib.LazyMemmapStorage(8, scratch_dir=tmp_path, existsok=True)
    with pytest.raises(RuntimeError, match=r"The storage of tensor .*a.memmap already exists"):
        second.set(range(3), {"a": torch.ones(3)})
