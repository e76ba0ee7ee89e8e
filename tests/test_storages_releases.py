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
