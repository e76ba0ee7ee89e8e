"""Slice samplers reading a storage that another process writes at the same time.

The trajectory scan reads the end signal (or the trajectory ids) more than once: counting,
then filling. Over memory another process writes, the two reads disagree unless the scan
works on a copy of its own. Each test runs a real writer process against a sampling loop
until enough calls have overlapped a write to catch the race (it showed in 0.1-5% of the calls
without the copy). Calls are counted, not timed: a slow machine takes longer, and a writer that
never runs during the sampling fails the test instead of passing it unseen.
"""
import multiprocessing as mp

import pytest
import torch
import torchrl.data.replay_buffers.storages as trl_storages
from tensordict import TensorDict

import torchrl_compat.samplers as ours
import torchrl_compat.storages as our_storages

SIZE = 1 << 15
# calls during which the writer completed at least one write (the storage changed under them)
OVERLAPPED_CALLS = 150
MAX_CALLS = 50 * OVERLAPPED_CALLS  # a guard against a writer that never runs, not a timing
JOIN_TIMEOUT = 60


def _data(rows, generator, episode_start=0):
    n = rows.numel()
    done = torch.rand(n, 1, generator=generator) < 0.02
    episode = done.view(-1).long().cumsum(0) + episode_start
    return TensorDict({"obs": rows.float(), ("next", "done"): done, "episode": episode}, [n])


def _writer(storage, stop, ready, writes, seed):
    generator = torch.Generator().manual_seed(seed)
    episode = 1 << 20
    ready.set()
    while not stop.is_set():
        start = int(torch.randint(0, SIZE, (), generator=generator))
        rows = (torch.arange(512) + start) % SIZE
        storage.set(rows, _data(rows, generator, episode))
        episode += 1000
        writes.value += 1  # the one writer: no lock needed


def _shared_full_storage(kind):
    storage = {"ours": our_storages.LazyTensorStorage, "torchrl": trl_storages.LazyTensorStorage}[kind](SIZE)
    rows = torch.arange(SIZE)
    storage.set(rows, _data(rows, torch.Generator().manual_seed(0)))
    storage._storage.share_memory_()  # the forked writer then writes into these pages
    return storage


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
@pytest.mark.parametrize("kind", ["ours", "torchrl"])
@pytest.mark.parametrize("key", ["end_key", "traj_key"])
@pytest.mark.parametrize("sampler_cls", ["SliceSampler", "PrioritizedSliceSampler"])
def test_slice_sampling_while_another_process_writes(kind, key, sampler_cls):
    storage = _shared_full_storage(kind)
    keys = {"end_key": ("next", "done")} if key == "end_key" else {"traj_key": "episode"}
    if sampler_cls == "SliceSampler":
        sampler = ours.SliceSampler(slice_len=4, **keys)
    else:
        sampler = ours.PrioritizedSliceSampler(SIZE, 0.7, 0.5, slice_len=4, **keys)
        sampler.update_priority(torch.arange(SIZE), torch.rand(SIZE) + 0.1)
    context = mp.get_context("fork")
    stop, ready = context.Event(), context.Event()
    writes = context.Value("q", 0, lock=False)
    writer = context.Process(target=_writer, args=(storage, stop, ready, writes, 1), daemon=True)
    writer.start()
    errors, calls, overlapped = [], 0, 0
    try:
        assert ready.wait(JOIN_TIMEOUT)
        while overlapped < OVERLAPPED_CALLS and calls < MAX_CALLS:
            calls += 1
            before = writes.value
            try:
                (index,), info = sampler.sample(storage, 64)
            except Exception as err:  # every failure is counted, then reported below
                errors.append(repr(err))
                continue
            finally:
                overlapped += writes.value != before
            assert index.shape == (64,) and bool(((index >= 0) & (index < SIZE)).all())
    finally:
        stop.set()
        writer.join(JOIN_TIMEOUT)
        if writer.is_alive():
            writer.kill()
    assert not errors, f"{len(errors)} of {calls} calls failed ({overlapped} overlapped a write), e.g. {errors[0]}"
    assert overlapped >= OVERLAPPED_CALLS, (
        f"only {overlapped} of {calls} calls overlapped a write ({writes.value} writes in all)"
    )
