"""Storage behaviours that depend on the followed torchrl release, compared with the
installed torchrl's storages."""
from __future__ import annotations

import warnings

import pytest
import torch

import torchrl_compat as O
from torchrl_compat._releases import since

T = pytest.importorskip("torchrl.data")


@pytest.mark.skipif(not since("storage_shared_init_cpu"), reason="a torchrl 0.14 behaviour")
@pytest.mark.parametrize("device", ["meta", "cpu", None, "auto"])
def test_shared_init_device_reset_to_cpu_as_torchrl(device):
    outcome = []
    for ns in (O, T):
        storage = ns.LazyTensorStorage(4)
        storage.device = device
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            storage._reconcile_shared_init_device()
        outcome.append((storage.device, [str(w.message) for w in caught]))
    assert outcome[0] == outcome[1]
    assert outcome[0][0] == torch.device("cpu")
    assert bool(outcome[0][1]) == (device == "meta")


@pytest.mark.skipif(not since("storage_shared_init_cpu"), reason="a torchrl 0.14 behaviour")
def test_shared_init_storage_ends_on_cpu():
    storage = O.LazyTensorStorage(6, shared_init=True)
    storage.set(torch.arange(3), torch.ones(3, 2))
    assert storage.device == torch.device("cpu")
    assert torch.equal(storage.get(torch.arange(3)), torch.ones(3, 2))
    storage._cleanup_init_directory()


@pytest.mark.parametrize("storage_cls", ["LazyTensorStorage", "LazyMemmapStorage"])
@pytest.mark.parametrize("cursor", ["index", "slice"])
def test_lazy_stack_written_as_torchrl_writes_it(storage_cls, cursor):
    # from torchrl 0.12 on, a lazy stack goes into the stored rows without a dense copy
    # (update_at_ at an index, _stack_onto_ at a slice); the rows are the same either way
    from unittest import mock

    from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

    def items(seed):
        g = torch.Generator().manual_seed(seed)
        return [TensorDict({"obs": torch.rand(4, 8, generator=g), "a": torch.rand(2, generator=g)}, []) for _ in range(10)]

    stored = []
    for ns in (O, T):
        storage = getattr(ns, storage_cls)(20)
        storage.set(range(10), torch.stack(items(0)))  # initialized by a dense batch
        lazy = LazyStackedTensorDict.lazy_stack(items(1), dim=0)
        where = torch.arange(5, 15) if cursor == "index" else slice(5, 15)
        calls = {"update_at_": 0, "_stack_onto_": 0}
        # (the stored rows are a TensorDict, which has its own _stack_onto_)
        owners = {"update_at_": TensorDictBase, "_stack_onto_": TensorDict}
        originals = {name: getattr(owners[name], name) for name in calls}

        def counting(name):
            def method(self, *args, **kwargs):
                calls[name] += 1
                return originals[name](self, *args, **kwargs)
            return method

        with mock.patch.object(TensorDictBase, "update_at_", counting("update_at_")), mock.patch.object(
            TensorDict, "_stack_onto_", counting("_stack_onto_")
        ):
            storage.set(where, lazy)
        stored.append((calls, storage[:15].to_dict()))
    (ours_calls, ours_rows), (theirs_calls, theirs_rows) = stored
    direct = "update_at_" if cursor == "index" else "_stack_onto_"
    assert (ours_calls[direct] > 0) == since("storage_lazy_stack_direct_write")
    assert (ours_calls[direct] > 0) == (theirs_calls[direct] > 0)
    expected = torch.stack(items(0))[:5]
    torch.testing.assert_close(ours_rows["obs"][:5], expected["obs"])
    torch.testing.assert_close(ours_rows["obs"][5:], torch.stack(items(1))["obs"])
    for key in ("obs", "a"):
        torch.testing.assert_close(ours_rows[key], theirs_rows[key])


def test_lazy_stack_first_extend_into_a_buffer():
    from tensordict import LazyStackedTensorDict, TensorDict

    items = [TensorDict({"obs": torch.full((4,), float(i))}, []) for i in range(10)]
    rb = O.ReplayBuffer(storage=O.LazyTensorStorage(100), batch_size=4)
    rb.extend(LazyStackedTensorDict.lazy_stack(items, dim=0))
    assert len(rb) == 10
    assert rb[:]["obs"][:, 0].tolist() == [float(i) for i in range(10)]


@pytest.mark.parametrize("storage_cls", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_storages_log_through_torchrls_logger(storage_cls, tmp_path):
    # a user who configures logging.getLogger("torchrl") configures what our storages say
    import logging

    from tensordict import TensorDict

    class Records(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.messages = []

        def emit(self, record):
            self.messages.append((record.name, record.levelname, record.getMessage()))

    logger = logging.getLogger("torchrl")
    seen = []
    for ns in (O, T):
        handler = Records()
        logger.addHandler(handler)
        level = logger.level
        logger.setLevel(logging.INFO)
        try:
            kwargs = {"scratch_dir": tmp_path / ns.__name__} if storage_cls == "LazyMemmapStorage" else {}
            getattr(ns, storage_cls)(10, **kwargs).set(range(3), TensorDict({"obs": torch.zeros(3, 2)}, [3]))
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        seen.append([m for m in handler.messages if m[2].startswith("Initialized")])
    assert seen[0] == seen[1] and len(seen[0]) == 1
    assert seen[0][0][:2] == ("torchrl", "INFO")
