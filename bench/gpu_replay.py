"""GPU-resident replay: our device path against torchrl on the same accelerator.

Run as ``python bench/gpu_replay.py`` on a machine with one GPU (a few minutes), or
``python bench/gpu_replay.py --cpu`` for a small run on CPU tensors (checks the script end to
end). Prints one table (and writes it to ``--out`` when given):

* tree rows: one non-blocking update of ``k`` priorities and one draw of ``batch`` leaves of
  our sum tree, per capacity;
* the prioritized loop (extend ``batch`` rows of 64 floats with the default priority, sample
  ``batch``, update ``batch`` priorities): our ``ReplayBuffer`` + ``PrioritizedSampler`` on a
  device storage (what users run; the sampler takes the device path by itself), torchrl's
  buffer on the same device storage with its sampler on CPU (``device="cpu"``), our own CPU
  buffer, and the device functions alone (no buffer: the floor the buffer adds to);
* the slice loop (extend ``batch`` rows, sample ``batch // 64`` slices of 64 from
  trajectories of 1,000 steps): our ``TensorDictReplayBuffer`` + ``SliceSampler`` and
  torchrl's on the same device storage, and our device functions alone.

With ``--cpu`` our buffers are forced onto the torch-op path (``_use_cpu_kernels = False``),
so that the script runs the device code end to end.

Times are medians over repeated calls after a warm-up, from CUDA events on a GPU (the span of
each call on the stream, host gaps included) and ``time.perf_counter`` on CPU.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torchrl_compat_trees  # noqa: E402

# Before torchrl is imported: its own compiled trees are used when they load, ours otherwise.
torchrl_compat_trees.install_segment_trees()

from torchrl_compat import _sampler_device, _torch_slices  # noqa: E402
from torchrl_compat._torch_sumtree import TorchMinSegmentTreeFp32, TorchSumSegmentTreeFp32  # noqa: E402

ALPHA, BETA, EPS = 0.7, 0.5, 1e-8
OBS = 64
TRAJ = 1000
SLICE = 64
TARGETS = {
    "prioritized": "ours >= 10x torchrl's best",
    "update 4096 @ 2^20": "< 50 us",
    "sample 4096": "< 50 us",
    "slices": "ours >= 10x torchrl's",
}


def median_us(fn, device: torch.device, *, warmup: int, repeat: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
    else:
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


# ----------------------------------------------------------------------------- trees
def tree_rows(capacity: int, device, ks, batch: int, timing) -> list:
    tree = TorchSumSegmentTreeFp32(capacity, device=device)
    tree.update_nonblocking(torch.arange(capacity, device=device), torch.rand(capacity, device=device) + 0.01)
    rows = []
    for k in ks:
        index = torch.randint(0, capacity, (k,), device=device)
        value = torch.rand(k, device=device) + 0.01
        rows.append((f"tree update k={k}", capacity, median_us(lambda: tree.update_nonblocking(index, value), device, **timing), None, None))
    uniform = torch.rand(batch, device=device)
    rows.append((f"tree draw B={batch}", capacity, median_us(lambda: tree.draw_nonblocking(uniform, capacity), device, **timing), None, None))
    tree.check_errors()
    return rows


# ----------------------------------------------------------------------------- prioritized loop
class OursDeviceLoop:
    """The sampler's steady state through the device functions alone (no buffer, no
    sampler): storage rows, both trees, the largest priority, all on the device; host state
    is two ints."""

    def __init__(self, capacity: int, batch: int, device) -> None:
        self.obs = torch.zeros(capacity, OBS, device=device)
        self.sum_tree = TorchSumSegmentTreeFp32(capacity, device=device)
        self.min_tree = TorchMinSegmentTreeFp32(capacity, device=device)
        self.max_priority = _sampler_device.initial_max_priority(device)
        self.offsets = torch.arange(batch, device=device)
        self.capacity, self.batch, self.device = capacity, batch, device
        self.cursor = self.filled = 0
        self.new_rows = torch.randn(batch, OBS, device=device)

    def step(self):
        rows = (self.offsets + self.cursor) % self.capacity
        self.obs.index_copy_(0, rows, self.new_rows)
        self.cursor = (self.cursor + self.batch) % self.capacity
        self.filled = min(self.filled + self.batch, self.capacity)
        default = _sampler_device.default_priority(self.max_priority, EPS, ALPHA)
        self.max_priority = _sampler_device.update_priority_nonblocking(
            self.sum_tree, self.min_tree, rows, default, self.max_priority, eps=EPS, alpha=ALPHA)
        uniform = torch.rand(self.batch, device=self.device)
        index, weight = _sampler_device.draw_nonblocking(self.sum_tree, self.min_tree, self.filled, BETA, uniform)
        sample = self.obs[index]
        priority = sample[:, 0].abs() + weight  # stands for the learner's new priorities
        self.max_priority = _sampler_device.update_priority_nonblocking(
            self.sum_tree, self.min_tree, index, priority, self.max_priority, eps=EPS, alpha=ALPHA)


def buffer_loop(rb_cls, storage, sampler, batch: int, device):
    rb = rb_cls(storage=storage, sampler=sampler, batch_size=batch)
    new_rows = torch.randn(batch, OBS, device=device)

    def step():
        rb.extend(new_rows)
        sample, info = rb.sample(return_info=True)
        rb.update_priority(info["index"], sample[:, 0].abs() + 0.01)

    return step


def _forced_on_cpu(sampler, device):
    """On CPU tensors our sampler would take the CPU kernels: forced onto the device path."""
    if device.type == "cpu":
        sampler._use_cpu_kernels = False
        if hasattr(sampler, "_init"):
            sampler._init()
    return sampler


def prioritized_rows(capacity: int, batch: int, device, timing, notes: list) -> list:
    rows = []
    import torchrl_compat as compat

    sampler = _forced_on_cpu(compat.PrioritizedSampler(capacity, ALPHA, BETA, eps=EPS), device)
    step = buffer_loop(compat.ReplayBuffer, compat.LazyTensorStorage(capacity, device=device), sampler, batch, device)
    for _ in range(-(-capacity // batch)):  # a full buffer: the steady state
        step()
    rows.append(("prioritized loop: ours, buffer on the device", capacity, median_us(step, device, **timing), None, "ours"))
    sampler._sum_tree.check_errors()
    notes.append(f"our prioritized sampler's trees: {type(sampler._sum_tree).__name__} on {sampler._sum_tree.device}")

    functions = OursDeviceLoop(capacity, batch, device)
    for _ in range(-(-capacity // batch)):
        functions.step()
    rows.append(("prioritized loop: ours, device functions only", capacity, median_us(functions.step, device, **timing), None, None))
    functions.sum_tree.check_errors()

    cpu = torch.device("cpu")
    step = buffer_loop(compat.ReplayBuffer, compat.LazyTensorStorage(capacity), compat.PrioritizedSampler(capacity, ALPHA, BETA, eps=EPS), batch, cpu)
    for _ in range(-(-capacity // batch)):
        step()
    rows.append(("prioritized loop: ours, CPU buffer", capacity, median_us(step, cpu, **timing), None, None))

    torchrl = _torchrl(notes)
    if torchrl is not None:
        from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer

        sampler = PrioritizedSampler(capacity, ALPHA, BETA, eps=EPS, **({"device": "cpu"} if _takes_device() else {}))
        step = buffer_loop(ReplayBuffer, LazyTensorStorage(capacity, device=device), sampler, batch, device)
        for _ in range(-(-capacity // batch)):
            step()
        trees = type(sampler._sum_tree).__module__
        rows.append((f"prioritized loop: torchrl {torchrl.__version__}, sampler on CPU", capacity, median_us(step, device, **timing), None, "torchrl"))
        notes.append(f"torchrl's priority trees: {trees}" + ("" if trees.startswith("torchrl") else " (torchrl's own did not load: replaced through torchrl_compat.install_segment_trees(), as a user must)"))
    return rows


def _torchrl(notes):
    try:
        import torchrl
    except Exception as error:  # noqa: BLE001 - any failure means no reference
        notes.append(f"torchrl not importable ({type(error).__name__}: {error}): its rows are missing")
        return None
    return torchrl


def _takes_device() -> bool:
    import inspect

    from torchrl.data import PrioritizedSampler

    return "device" in inspect.signature(PrioritizedSampler).parameters


# ----------------------------------------------------------------------------- slice loop
class OursSliceLoop:
    def __init__(self, capacity: int, batch: int, device) -> None:
        self.obs = torch.zeros(capacity, OBS, device=device)
        self.done = torch.zeros(capacity, dtype=torch.bool, device=device)
        self.offsets = torch.arange(batch, device=device)
        self.capacity, self.batch, self.device = capacity, batch, device
        self.cursor = self.filled = self.step_count = 0
        self.new_rows = torch.randn(batch, OBS, device=device)

    def step(self):
        rows = (self.offsets + self.cursor) % self.capacity
        self.obs.index_copy_(0, rows, self.new_rows)
        self.done.index_copy_(0, rows, (self.offsets + self.step_count) % TRAJ == TRAJ - 1)
        self.step_count += self.batch
        last = (self.cursor + self.batch - 1) % self.capacity
        self.cursor = (self.cursor + self.batch) % self.capacity
        self.filled = min(self.filled + self.batch, self.capacity)
        full = self.filled == self.capacity
        flags = _torch_slices.end_flags(end=self.done if full else self.done[: self.filled], at_capacity=full, cursor=last if full else None)
        draws = torch.rand(2, self.batch // SLICE, device=self.device)
        index, _, _ = _torch_slices.sample_slices_from_ends(flags, SLICE, draws[0], draws[1])
        return self.obs[index]


def slice_buffer_loop(module, capacity: int, batch: int, device, *, force: bool = False):
    """extend + slice sample through ``module``'s ``TensorDictReplayBuffer`` and
    ``SliceSampler`` on a device storage."""
    from tensordict import TensorDict

    sampler = module.SliceSampler(slice_len=SLICE, end_key=("next", "done"))
    if force:
        _forced_on_cpu(sampler, device)
    rb = module.TensorDictReplayBuffer(storage=module.LazyTensorStorage(capacity, device=device), sampler=sampler, batch_size=batch)
    offsets = torch.arange(batch, device=device)
    state = {"steps": 0}

    def step():
        done = ((offsets + state["steps"]) % TRAJ == TRAJ - 1).unsqueeze(-1)
        state["steps"] += batch
        rb.extend(TensorDict({"obs": torch.randn(batch, OBS, device=device), "next": {"done": done}}, batch_size=[batch], device=device))
        return rb.sample()

    return step


def slice_rows(capacity: int, batch: int, device, timing, notes: list) -> list:
    import torchrl_compat as compat

    rows = []
    step = slice_buffer_loop(compat, capacity, batch, device, force=True)
    for _ in range(-(-capacity // batch)):
        step()
    rows.append(("slice loop: ours, buffer on the device", capacity, median_us(step, device, **timing), None, "ours"))
    functions = OursSliceLoop(capacity, batch, device)
    for _ in range(-(-capacity // batch)):
        functions.step()
    rows.append(("slice loop: ours, device functions only", capacity, median_us(functions.step, device, **timing), None, None))
    torchrl = _torchrl([])
    if torchrl is None:
        return rows
    import torchrl.data as torchrl_data

    step = slice_buffer_loop(torchrl_data, capacity, batch, device)
    for _ in range(-(-capacity // batch)):
        step()
    rows.append((f"slice loop: torchrl {torchrl.__version__} SliceSampler", capacity, median_us(step, device, **timing), None, "torchrl"))
    return rows


# ----------------------------------------------------------------------------- table
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="small sizes on CPU tensors (checks the script)")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.cpu:
        torch.set_num_threads(1)  # a shared machine: intra-op threads only add noise here
        device, capacities, batch, ks = torch.device("cpu"), [1 << 12, 1 << 14], 512, [16, 256, 1024]
        timing = {"warmup": 2, "repeat": 7}
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: run with --cpu")
        device, capacities, batch, ks = torch.device("cuda"), [1 << 20, 1 << 24], 4096, [256, 4096, 65536]
        timing = {"warmup": 10, "repeat": 50}
    torch.manual_seed(0)
    notes: list[str] = []
    rows = []
    for capacity in capacities:
        rows += tree_rows(capacity, device, ks, batch, timing)
        rows += prioritized_rows(capacity, batch, device, timing, notes)
        rows += slice_rows(capacity, batch, device, timing, notes)
    table = render(rows, device, batch, notes)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")
    return 0


def render(rows, device, batch, notes) -> str:
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    lines = [
        f"GPU-resident replay on {name}: torch {torch.__version__}, batch {batch}",
        "",
        f"| {'what':<52} | {'capacity':>9} | {'us / call':>10} | {'ours / it':>9} |",
        f"|{'-' * 54}|{'-' * 11}|{'-' * 12}|{'-' * 11}|",
    ]
    ours_by_group = {}
    for what, capacity, us, _, role in rows:
        if role == "ours":
            ours_by_group[(what.split(":")[0], capacity)] = us
    for what, capacity, us, _, role in rows:
        ratio = ""
        if role == "torchrl":
            ours = ours_by_group.get((what.split(":")[0], capacity))
            ratio = f"{us / ours:.1f}x" if ours else ""
        lines.append(f"| {what:<52} | 2^{capacity.bit_length() - 1:<7} | {us:>10.1f} | {ratio:>9} |")
    lines += ["", "Targets (on an H200): " + "; ".join(f"{k}: {v}" for k, v in TARGETS.items())]
    lines += [f"Note: {note}" for note in dict.fromkeys(notes)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
