"""Writes the pickles and checkpoints that ``tests/test_layout.py`` loads: objects of every
family after some use, pickled (``pickle`` and ``torch.save``), and buffers' ``dumps``.

The files in ``tests/data/before_layout/`` were written by this script before the private
modules moved into their families' packages (commit f871134 plus one test fix): the test
checks that what an earlier version pickled or dumped still loads. Run again, it writes the
same objects with the code of the day (``python tests/data/make_before_layout.py [DIR]``).
"""
from __future__ import annotations

import json
import pickle
import pickletools
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict

import torchrl_compat as rc

OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "before_layout"


def data(n: int, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + n)
    return TensorDict(
        {"obs": ids.float().unsqueeze(-1).expand(n, 3).clone(), "id": ids,
         ("next", "done"): (ids % 5 == 4).unsqueeze(-1), "episode": ids // 5},
        batch_size=[n],
    )


def used_buffers() -> dict:
    """Buffers of each kind, written past their capacity (wrap-around), sampled, updated."""
    torch.manual_seed(0)
    np.random.seed(0)
    buffers = {
        "rb_lazy_tensor_random": rc.TensorDictReplayBuffer(storage=rc.LazyTensorStorage(16), batch_size=4),
        "rb_list_without_replacement": rc.ReplayBuffer(storage=rc.ListStorage(16), sampler=rc.SamplerWithoutReplacement(), batch_size=4),
        "rb_prioritized": rc.TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=rc.LazyTensorStorage(16), batch_size=4),
        "rb_slice": rc.TensorDictReplayBuffer(storage=rc.LazyTensorStorage(16), sampler=rc.SliceSampler(num_slices=2, traj_key="episode"), batch_size=4),
        "rb_slice_without_replacement": rc.TensorDictReplayBuffer(storage=rc.LazyTensorStorage(16), sampler=rc.SliceSamplerWithoutReplacement(num_slices=2, traj_key="episode"), batch_size=4),
        "rb_prioritized_slice": rc.TensorDictReplayBuffer(storage=rc.LazyTensorStorage(16), sampler=rc.PrioritizedSliceSampler(max_capacity=16, alpha=0.7, beta=0.5, num_slices=2, traj_key="episode"), batch_size=4),
        "rb_max_value": rc.TensorDictReplayBuffer(storage=rc.LazyTensorStorage(16), writer=rc.TensorDictMaxValueWriter(rank_key="id"), batch_size=4),
    }
    for name, rb in buffers.items():
        if name == "rb_list_without_replacement":
            for k in range(20):
                rb.add(torch.tensor([k]))
        else:
            rb.extend(data(12))
            rb.extend(data(8, 12))
        sample = rb.sample()
        if isinstance(rb._sampler, (rc.PrioritizedSampler,)):
            index = sample["index"] if isinstance(sample, TensorDict) else torch.arange(4)
            rb.update_priority(index, torch.arange(1.0, 5.0))
    return buffers


def used_parts() -> dict:
    """Storages, samplers and writers on their own, used."""
    storage = rc.LazyTensorStorage(16)
    storage.set(torch.arange(10), data(10))
    stack = rc.LazyStackStorage(8)
    stack.set(torch.arange(3), [data(1)[0], data(1, 1)[0], data(1, 2)[0]])
    sampler = rc.PrioritizedSampler(16, alpha=0.6, beta=0.4)
    sampler.extend(torch.arange(10))
    sampler.update_priority(torch.arange(10), torch.rand(10) + 0.1)
    without = rc.SamplerWithoutReplacement(drop_last=True)
    without.sample(storage, 4)
    slice_sampler = rc.SliceSampler(num_slices=2, traj_key="episode")
    slice_sampler.sample(storage, 4)
    writer = rc.RoundRobinWriter()
    return {"storage_lazy_tensor": storage, "storage_lazy_stack": stack, "sampler_prioritized": sampler,
            "sampler_without_replacement": without, "sampler_slice": slice_sampler, "writer_round_robin": writer,
            "storage_list": rc.ListStorage(4)}


def private_parts(scratch: Path) -> dict:
    """Objects of the private modules that a pickle of a storage, sampler or Ray buffer can hold."""
    from torchrl_compat._ray_routing import ShardTotals
    from torchrl_compat._storage_cleanup import InitDirectoryCleanup
    from torchrl_compat._storage_live_home import LiveHome
    from torchrl_compat._torch_sumtree import TorchMinSegmentTreeFp64, TorchSumSegmentTreeFp32

    sum_tree, min_tree = TorchSumSegmentTreeFp32(8), TorchMinSegmentTreeFp64(8)
    sum_tree[torch.arange(5)] = torch.arange(1.0, 6.0)
    min_tree[torch.arange(5)] = torch.arange(1.0, 6.0).double()
    totals = ShardTotals(2)
    (scratch / "checkpoint").mkdir(parents=True, exist_ok=True)
    return {"private_init_directory_cleanup": InitDirectoryCleanup(str(scratch / "init")),
            "private_live_home": LiveHome(scratch / "checkpoint"),
            "private_torch_sum_tree": sum_tree, "private_torch_min_tree": min_tree,
            "private_shard_totals": totals}


def module_names(blob: bytes) -> list[str]:
    """The ``torchrl_compat`` modules a pickle names (from its GLOBAL / STACK_GLOBAL opcodes)."""
    names, strings = set(), []
    for opcode, arg, _ in pickletools.genops(blob):
        if opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            names.add(strings[-2])
        elif opcode.name == "GLOBAL":
            names.add(arg.split(" ")[0])
    return sorted(n for n in names if n.startswith("torchrl_compat"))


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    manifest = {}
    scratch = Path(tempfile.mkdtemp(prefix="before-layout-"))
    objects = {**used_buffers(), **used_parts(), **private_parts(scratch)}
    for name, obj in objects.items():
        blob = pickle.dumps(obj)
        (OUT / f"{name}.pkl").write_bytes(blob)
        entry = {"type": f"{type(obj).__module__}.{type(obj).__qualname__}", "modules": module_names(blob)}
        if hasattr(obj, "__len__"):
            try:
                entry["len"] = len(obj)
            except Exception:  # noqa: BLE001 - a sampler or writer has no length
                pass
        manifest[name] = entry
    for name in ("rb_lazy_tensor_random", "rb_prioritized", "rb_slice", "rb_max_value"):
        rb = objects[name]
        rb.dumps(OUT / f"{name}.dumps")
        manifest[name]["dumps"] = f"{name}.dumps"
        manifest[name]["ids"] = rb[: len(rb)]["id"].tolist()
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
