"""Slice samplers reading a storage that another process writes at the same time.

The trajectory scan reads the end signal (or the trajectory ids) more than once: counting,
then filling. Over memory another process writes, the two reads disagree unless the scan
works on a copy of its own. Each test runs a real writer process against a sampling loop,
long enough to catch the race (it showed in 0.1-5% of the calls without the copy).
"""
import multiprocessing as mp
import time

import pytest
import torch
import torchrl.data.replay_buffers.storages as trl_storages
from tensordict import TensorDict

import torchrl_compat.samplers as ours
import torchrl_compat.storages as our_storages

SIZE = 1 << 15
SECONDS = 1.0
JOIN_TIMEOUT = 60


def _data(rows, generator, episode_start=0):
    n = rows.numel()
    done = torch.rand(n, 1, generator=generator) < 0.02
    episode = done.view(-1).long().cumsum(0) + episode_start
    return TensorDict({"obs": rows.float(), ("next", "done"): done, "episode": episode}, [n])


def _writer(storage, stop, ready, seed):
    generator = torch.Generator().manual_seed(seed)
    episode = 1 << 20
    ready.set()
    while not stop.is_set():
        start = int(torch.randint(0, SIZE, (), generator=generator))
        rows = (torch.arange(512) + start) % SIZE
        storage.set(rows, _data(rows, generator, episode))
        episode += 1000


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
    writer = context.Process(target=_writer, args=(storage, stop, ready, 1), daemon=True)
    writer.start()
    errors, calls = [], 0
    try:
        assert ready.wait(JOIN_TIMEOUT)
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            calls += 1
            try:
                (index,), info = sampler.sample(storage, 64)
            except Exception as err:  # every failure is counted, then reported below
                errors.append(repr(err))
                continue
            assert index.shape == (64,) and bool(((index >= 0) & (index < SIZE)).all())
    finally:
        stop.set()
        writer.join(JOIN_TIMEOUT)
        if writer.is_alive():
            writer.kill()
    assert calls > 20
    assert not errors, f"{len(errors)} of {calls} calls failed, e.g. {errors[0]}"
