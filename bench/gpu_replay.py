"""GPU-resident replay: our device path against torchrl on the same accelerator.

Run as ``python bench/gpu_replay.py --budget 200`` on a machine with one GPU, or
``python bench/gpu_replay.py --cpu`` for a small run on CPU tensors (checks the script end to
end). Prints one table (and rewrites ``--out`` after every row, so that a run cut short
leaves what it measured):

* the targets' rows first: an update of 4,096 priorities and a draw of 4,096 through the
  device functions (both trees, the largest priority and the weights), eager and as CUDA
  graphs (``torchrl_compat.samplers._cuda_graphs``); then one tree alone (update of ``k`` leaves, draw
  of ``batch``);
* the prioritized loop (extend ``batch`` rows of 64 floats with the default priority, sample
  ``batch``, update ``batch`` priorities): our ``ReplayBuffer`` + ``PrioritizedSampler`` on a
  device storage (what users run; the sampler takes the device path by itself), torchrl's
  buffer in its two GPU configurations (its ``PrioritizedSampler`` keeps its trees on the
  host: a device storage with ``device="cpu"`` trees, or a host storage whose batch is moved
  to the device), the device functions alone (no buffer: the floor the buffer adds to),
  eager and as CUDA graphs, and our own CPU buffer;
* the slice loop (extend ``batch`` rows, sample ``batch // 64`` slices of 64 from
  trajectories of 1,000 steps): our ``TensorDictReplayBuffer`` + ``SliceSampler`` and
  torchrl's on the same device storage, and our device functions alone.

Each loop row gives the time of each part of the step. Capacities run smallest first (on a
GPU 2^20, then 2^24 last); within one, the targets' rows first. ``--budget SECONDS`` bounds
the whole run: a row that would start too close to the end is skipped, and at the end of the
budget the run stops where it is, prints and writes what it has, and exits 0.

With ``--cpu`` our buffers are forced onto the torch-op path (``_use_cpu_kernels = False``)
and the "CUDA graph" rows replay their recorded calls eagerly (there is no capture on CPU),
so that the script runs the device code end to end.

Times are medians over repeated steps after a warm-up, from CUDA events on a GPU (the span of
each part on the stream, host gaps included) and ``time.perf_counter`` on CPU.
"""
from __future__ import annotations

import time

STARTED = time.monotonic()  # --budget counts from here, imports included

import argparse
import gc
import os
import platform
import signal
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torchrl_compat_trees  # noqa: E402

# Before torchrl is imported: its own compiled trees are used when they load, ours otherwise.
torchrl_compat_trees.install_segment_trees()

from torchrl_compat.samplers import _device  # noqa: E402
from torchrl_compat._torch_ops import slices as torch_slices  # noqa: E402
from torchrl_compat.samplers._cuda_graphs import GraphedPriorityOps  # noqa: E402
from torchrl_compat._torch_ops.sumtree import TorchMinSegmentTreeFp32, TorchSumSegmentTreeFp32  # noqa: E402

ALPHA, BETA, EPS = 0.7, 0.5, 1e-8
OBS = 64
TRAJ = 1000
SLICE = 64
FILL_CHUNK = 1 << 16  # rows per extend while a buffer is filled before timing
TARGET_K = 4096  # the update and draw sizes of the targets
TARGET_CAPACITY = 1 << 20


class BudgetSpent(Exception):
    """Raised by the alarm at the end of ``--budget``."""


@dataclass
class Row:
    what: str
    capacity: int
    us: float | None  # None: skipped or failed (see note)
    parts: dict = field(default_factory=dict)
    role: str | None = None  # "ours" / "torchrl": the rows a ratio is read from
    group: str | None = None  # "prioritized" / "slices"
    note: str = ""


class Run:
    """Rows measured so far, the clock of the budget, and where the table goes."""

    def __init__(self, device, batch, timing, budget, out) -> None:
        self.device, self.batch, self.timing = device, batch, timing
        self.start = STARTED
        self.budget = budget
        self.out = out
        self.rows: list[Row] = []
        self.notes: list[str] = []

    def left(self) -> float:
        return float("inf") if self.budget is None else self.budget - (time.monotonic() - self.start)

    def measure(self, what, capacity, fn, *, reserve, role=None, group=None):
        """Appends ``fn()``'s row (``fn`` returns ``(us, parts)``), unless fewer than
        ``reserve`` seconds of the budget are left, or it fails (the row says why)."""
        if self.left() < reserve:
            row = Row(what, capacity, None, role=role, group=group, note=f"skipped: under {reserve:.0f} s of the budget left")
        else:
            try:
                us, parts = fn()
                row = Row(what, capacity, us, parts or {}, role, group)
            except BudgetSpent:
                raise
            except Exception as error:  # noqa: BLE001 - one row's failure must not stop the table
                row = Row(what, capacity, None, role=role, group=group, note=f"failed: {type(error).__name__}: {error}"[:300])
        self.rows.append(row)
        print(render_row(row), flush=True)
        self.write()
        return row

    def write(self) -> None:
        if self.out is None:
            return
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(render(self) + "\n")
        os.replace(tmp, self.out)


# ----------------------------------------------------------------------------- timing
def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_parts(parts, device, *, warmup: int, repeat: int):
    """Medians in us of a whole step and of each of its parts (``[(name, fn), ...]``, run
    in order each step)."""
    for _ in range(warmup):
        for _, fn in parts:
            fn()
    _sync(device)
    steps, per_part = [], {name: [] for name, _ in parts}
    for _ in range(repeat):
        if device.type == "cuda":
            events = [torch.cuda.Event(enable_timing=True) for _ in range(len(parts) + 1)]
            events[0].record()
            for (_, fn), event in zip(parts, events[1:]):
                fn()
                event.record()
            events[-1].synchronize()
            marks = [0.0] + [events[0].elapsed_time(e) * 1e3 for e in events[1:]]
        else:
            start = time.perf_counter()
            marks = [0.0]
            for _, fn in parts:
                fn()
                marks.append((time.perf_counter() - start) * 1e6)
        steps.append(marks[-1])
        for (name, _), a, b in zip(parts, marks, marks[1:]):
            per_part[name].append(b - a)
    parts_us = {name: statistics.median(v) for name, v in per_part.items()} if len(parts) > 1 else {}
    return statistics.median(steps), parts_us


def free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- device functions
def filled_trees(capacity, device):
    sum_tree = TorchSumSegmentTreeFp32(capacity, device=device)
    min_tree = TorchMinSegmentTreeFp32(capacity, device=device)
    highest = _device.initial_max_priority(device)
    for start in range(0, capacity, FILL_CHUNK):
        index = torch.arange(start, min(start + FILL_CHUNK, capacity), device=device)
        highest = _device.update_priority_nonblocking(
            sum_tree, min_tree, index, torch.rand(index.numel(), device=device) + 0.01, highest, eps=EPS, alpha=ALPHA)
    return sum_tree, min_tree, highest


def sampler_rows(run: Run, capacity: int, *, graphs: bool) -> None:
    """Update of TARGET_K priorities and draw of TARGET_K through the device functions (both
    trees, largest priority, weights), eager or recorded as CUDA graphs."""
    device = run.device
    label = "CUDA graph" if device.type == "cuda" else "recorded, replayed eagerly (no CUDA)"
    how = label if graphs else "eager"
    state = {}

    def prepare():
        if "trees" not in state:
            state["trees"] = filled_trees(capacity, device)
        sum_tree, min_tree, highest = state["trees"]
        ops = GraphedPriorityOps(sum_tree, min_tree, eps=EPS, alpha=ALPHA, beta=BETA) if graphs else None
        return sum_tree, min_tree, highest, ops

    def update():
        sum_tree, min_tree, highest, ops = prepare()
        index = torch.randint(0, capacity, (TARGET_K,), device=device)
        priority = torch.rand(TARGET_K, device=device) + 0.01
        box = [highest]
        if ops is None:
            def step():
                box[0] = _device.update_priority_nonblocking(
                    sum_tree, min_tree, index, priority, box[0], eps=EPS, alpha=ALPHA)
        else:
            def step():
                box[0] = ops.update(index, priority, box[0])
        result = time_parts([("update", step)], device, **run.timing)
        sum_tree.check_errors()
        return result

    def draw():
        sum_tree, min_tree, _, ops = prepare()
        uniform = torch.rand(TARGET_K, device=device)
        if ops is None:
            def step():
                _device.draw_nonblocking(sum_tree, min_tree, capacity, BETA, uniform)
        else:
            def step():
                ops.draw(capacity, uniform)
        result = time_parts([("draw", step)], device, **run.timing)
        sum_tree.check_errors()
        return result

    reserve = reserve_for(capacity, 4)
    run.measure(f"sampler update k={TARGET_K}: {how}", capacity, update, reserve=reserve, group="update")
    run.measure(f"sampler draw B={TARGET_K}: {how}", capacity, draw, reserve=reserve, group="draw")
    state.clear()
    free(device)


def tree_rows(run: Run, capacity: int, ks) -> None:
    device, batch = run.device, run.batch
    state = {}

    def tree():
        if "tree" not in state:
            tree = TorchSumSegmentTreeFp32(capacity, device=device)
            tree.update_nonblocking(torch.arange(capacity, device=device), torch.rand(capacity, device=device) + 0.01)
            state["tree"] = tree
        return state["tree"]

    def update(k):
        def measure():
            t = tree()
            index = torch.randint(0, capacity, (k,), device=device)
            value = torch.rand(k, device=device) + 0.01
            result = time_parts([("update", lambda: t.update_nonblocking(index, value))], device, **run.timing)
            t.check_errors()
            return result
        return measure

    def draw():
        t = tree()
        uniform = torch.rand(batch, device=device)
        result = time_parts([("draw", lambda: t.draw_nonblocking(uniform, capacity))], device, **run.timing)
        t.check_errors()
        return result

    reserve = reserve_for(capacity, 3)
    for k in ks:
        run.measure(f"sum tree alone: update k={k}", capacity, update(k), reserve=reserve)
    run.measure(f"sum tree alone: draw B={batch}", capacity, draw, reserve=reserve)
    state.clear()
    free(device)


# ----------------------------------------------------------------------------- prioritized loop
class OursDeviceLoop:
    """The sampler's steady state through the device functions alone (no buffer, no
    sampler): storage rows, both trees, the largest priority, all on the device; host state
    is two ints. With ``graphs``, the updates and the draw go through GraphedPriorityOps."""

    def __init__(self, capacity: int, batch: int, device, *, graphs: bool = False) -> None:
        self.obs = torch.zeros(capacity, OBS, device=device)
        self.sum_tree, self.min_tree, self.max_priority = filled_trees(capacity, device)
        self.ops = GraphedPriorityOps(self.sum_tree, self.min_tree, eps=EPS, alpha=ALPHA, beta=BETA) if graphs else None
        self.offsets = torch.arange(batch, device=device)
        self.capacity, self.batch, self.device = capacity, batch, device
        self.cursor = 0
        self.new_rows = torch.randn(batch, OBS, device=device)
        self.state = {}

    def _update(self, index, priority):
        if self.ops is None:
            return _device.update_priority_nonblocking(
                self.sum_tree, self.min_tree, index, priority, self.max_priority, eps=EPS, alpha=ALPHA)
        return self.ops.update(index, priority, self.max_priority)

    def write(self):
        rows = (self.offsets + self.cursor) % self.capacity
        self.obs.index_copy_(0, rows, self.new_rows)
        self.cursor = (self.cursor + self.batch) % self.capacity
        default = _device.default_priority(self.max_priority, EPS, ALPHA)
        self.max_priority = self._update(rows, default)

    def sample(self):
        uniform = torch.rand(self.batch, device=self.device)
        if self.ops is None:
            index, weight = _device.draw_nonblocking(self.sum_tree, self.min_tree, self.capacity, BETA, uniform)
        else:
            index, weight = self.ops.draw(self.capacity, uniform)
        self.state = {"index": index, "weight": weight, "sample": self.obs[index]}

    def update(self):
        # stands for the learner's new priorities
        priority = self.state["sample"][:, 0].abs() + self.state["weight"]
        self.max_priority = self._update(self.state["index"], priority)

    def parts(self):
        return [("extend", self.write), ("sample", self.sample), ("update", self.update)]


def buffer_parts(rb, new_rows, *, to_device=None):
    state = {}

    def extend():
        rb.extend(new_rows)

    def sample():
        sample, info = rb.sample(return_info=True)
        if to_device is not None:
            sample = sample.to(to_device, non_blocking=True)
        state["sample"], state["index"] = sample, info["index"]

    def update():
        rb.update_priority(state["index"], state["sample"][:, 0].abs() + 0.01)

    return [("extend", extend), ("sample", sample), ("update", update)]


def fill_buffer(rb, capacity, device):
    chunk = torch.randn(min(FILL_CHUNK, capacity), OBS, device=device)
    for start in range(0, capacity, FILL_CHUNK):
        rb.extend(chunk[: capacity - start])


def _forced_on_cpu(sampler, device):
    """On CPU tensors our sampler would take the CPU kernels: forced onto the device path."""
    if device.type == "cpu":
        sampler._use_cpu_kernels = False
        if hasattr(sampler, "_init"):
            sampler._init()
    return sampler


def prioritized_rows(run: Run, capacity: int) -> None:
    import torchrl_compat as compat

    device, batch = run.device, run.batch
    cpu = torch.device("cpu")
    reserve = reserve_for(capacity, 8)

    def ours_buffer():
        sampler = _forced_on_cpu(compat.PrioritizedSampler(capacity, ALPHA, BETA, eps=EPS), device)
        rb = compat.ReplayBuffer(storage=compat.LazyTensorStorage(capacity, device=device), sampler=sampler, batch_size=batch)
        fill_buffer(rb, capacity, device)
        result = time_parts(buffer_parts(rb, torch.randn(batch, OBS, device=device)), device, **run.timing)
        sampler._sum_tree.check_errors()
        run.notes.append(f"our prioritized sampler's trees: {type(sampler._sum_tree).__name__} on {sampler._sum_tree.device}")
        return result

    run.measure("prioritized loop: ours, buffer on the device", capacity, ours_buffer, reserve=reserve, role="ours", group="prioritized")
    free(device)

    torchrl = _torchrl(run.notes)
    if torchrl is not None:
        from torchrl.data import LazyTensorStorage, PrioritizedSampler, ReplayBuffer

        def theirs(storage_device, to_device):
            def measure():
                sampler = PrioritizedSampler(capacity, ALPHA, BETA, eps=EPS, **({"device": "cpu"} if _takes_device() else {}))
                rb = ReplayBuffer(storage=LazyTensorStorage(capacity, device=storage_device), sampler=sampler, batch_size=batch)
                fill_buffer(rb, capacity, device)
                result = time_parts(buffer_parts(rb, torch.randn(batch, OBS, device=device), to_device=to_device), device, **run.timing)
                trees = type(sampler._sum_tree).__module__
                run.notes.append(f"torchrl's priority trees: {trees}" + ("" if trees.startswith("torchrl") else " (torchrl's own did not load: replaced through torchrl_compat.install_segment_trees(), as a user must)"))
                return result
            return measure

        version = torchrl.__version__
        run.measure(f"prioritized loop: torchrl {version}, storage on the device, trees on CPU", capacity,
                    theirs(device, None), reserve=reserve, role="torchrl", group="prioritized")
        free(device)
        if device.type == "cuda":
            run.measure(f"prioritized loop: torchrl {version}, storage on CPU, batch moved to the device", capacity,
                        theirs(cpu, device), reserve=reserve, role="torchrl", group="prioritized")
            free(device)

    for graphs in (False, True):
        def functions(graphs=graphs):
            loop = OursDeviceLoop(capacity, batch, device, graphs=graphs)
            result = time_parts(loop.parts(), device, **run.timing)
            loop.sum_tree.check_errors()
            return result

        how = "eager" if not graphs else ("CUDA graphs" if device.type == "cuda" else "recorded, replayed eagerly")
        run.measure(f"prioritized loop: ours, device functions only, {how}", capacity, functions, reserve=reserve)
        free(device)

    def ours_cpu():
        rb = compat.ReplayBuffer(storage=compat.LazyTensorStorage(capacity), sampler=compat.PrioritizedSampler(capacity, ALPHA, BETA, eps=EPS), batch_size=batch)
        fill_buffer(rb, capacity, cpu)
        return time_parts(buffer_parts(rb, torch.randn(batch, OBS)), cpu, **run.timing)

    run.measure("prioritized loop: ours, CPU buffer (kernels)", capacity, ours_cpu, reserve=reserve)
    free(device)


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
        self.done = (torch.arange(capacity, device=device) % TRAJ) == TRAJ - 1
        self.offsets = torch.arange(batch, device=device)
        self.capacity, self.batch, self.device = capacity, batch, device
        self.cursor, self.step_count = 0, capacity
        self.new_rows = torch.randn(batch, OBS, device=device)

    def write(self):
        rows = (self.offsets + self.cursor) % self.capacity
        self.obs.index_copy_(0, rows, self.new_rows)
        self.done.index_copy_(0, rows, (self.offsets + self.step_count) % TRAJ == TRAJ - 1)
        self.step_count += self.batch
        self.last = (self.cursor + self.batch - 1) % self.capacity
        self.cursor = (self.cursor + self.batch) % self.capacity

    def sample(self):
        flags = torch_slices.end_flags(end=self.done, at_capacity=True, cursor=self.last)
        draws = torch.rand(2, self.batch // SLICE, device=self.device)
        index, _, _ = torch_slices.sample_slices_from_ends(flags, SLICE, draws[0], draws[1])
        return self.obs[index]

    def parts(self):
        return [("extend", self.write), ("sample", self.sample)]


def slice_parts(module, capacity: int, batch: int, device, *, force: bool = False):
    """extend + slice sample through ``module``'s ``TensorDictReplayBuffer`` and
    ``SliceSampler`` on a device storage, filled first."""
    from tensordict import TensorDict

    sampler = module.SliceSampler(slice_len=SLICE, end_key=("next", "done"))
    if force:
        _forced_on_cpu(sampler, device)
    rb = module.TensorDictReplayBuffer(storage=module.LazyTensorStorage(capacity, device=device), sampler=sampler, batch_size=batch)
    state = {"steps": 0}

    obs = torch.randn(min(FILL_CHUNK, capacity), OBS, device=device)

    def rows(count):
        offsets = torch.arange(count, device=device)
        done = ((offsets + state["steps"]) % TRAJ == TRAJ - 1).unsqueeze(-1)
        state["steps"] += count
        return TensorDict({"obs": obs[:count], "next": {"done": done}}, batch_size=[count], device=device)

    for start in range(0, capacity, FILL_CHUNK):
        rb.extend(rows(min(FILL_CHUNK, capacity - start)))
    return [("extend", lambda: rb.extend(rows(batch))), ("sample", rb.sample)]


def slice_rows(run: Run, capacity: int) -> None:
    import torchrl_compat as compat

    device, batch = run.device, run.batch
    reserve = reserve_for(capacity, 6)

    def ours():
        return time_parts(slice_parts(compat, capacity, batch, device, force=True), device, **run.timing)

    run.measure("slice loop: ours, buffer on the device", capacity, ours, reserve=reserve, role="ours", group="slices")
    free(device)
    torchrl = _torchrl([])
    if torchrl is not None:
        import torchrl.data as torchrl_data

        def theirs():
            return time_parts(slice_parts(torchrl_data, capacity, batch, device), device, **run.timing)

        run.measure(f"slice loop: torchrl {torchrl.__version__} SliceSampler, same storage", capacity, theirs,
                    reserve=reserve, role="torchrl", group="slices")
        free(device)

    def functions():
        return time_parts(OursSliceLoop(capacity, batch, device).parts(), device, **run.timing)

    run.measure("slice loop: ours, device functions only", capacity, functions, reserve=reserve)
    free(device)


def reserve_for(capacity: int, seconds: float) -> float:
    """Seconds of budget a row needs before it starts: ``seconds`` up to 2^20, three times
    that above (filling a buffer is O(capacity), though in chunks of FILL_CHUNK rows)."""
    return seconds if capacity <= TARGET_CAPACITY else 3 * seconds


# ----------------------------------------------------------------------------- table
def render_row(row: Row) -> str:
    us = f"{row.us:,.1f}" if row.us is not None else "-"
    parts = ", ".join(f"{name} {v:,.1f}" for name, v in row.parts.items())
    capacity = f"2^{row.capacity.bit_length() - 1}"
    return f"| {row.what:<74} | {capacity:<5} | {us:>10} | {parts or row.note} |"


def render(run: Run) -> str:
    device = run.device
    if device.type == "cuda":
        name = torch.cuda.get_device_name()
        where = f"{name}, CUDA {torch.version.cuda}"
    else:
        where = f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} intra-op thread(s))"
    lines = [
        f"GPU-resident replay on {where}: torch {torch.__version__}, Python {platform.python_version()}, batch {run.batch}",
        f"({time.monotonic() - run.start:.0f} s" + (f" of a {run.budget:.0f} s budget)" if run.budget else ")"),
        "",
        f"| {'what':<74} | {'cap.':<5} | {'us / step':>10} | parts (us) or note |",
        f"|{'-' * 76}|-------|{'-' * 12}|----|",
    ]
    lines += [render_row(row) for row in run.rows]
    lines += ["", *targets(run)]
    lines += [f"Note: {note}" for note in dict.fromkeys(run.notes)]
    return "\n".join(lines)


def targets(run: Run) -> list[str]:
    """Each target against the rows that bear on it, capacity by capacity."""
    lines = ["Targets (met / missed; on CPU they only show the script's arithmetic):"]
    capacities = sorted({row.capacity for row in run.rows})
    for capacity in capacities:
        rows = [row for row in run.rows if row.capacity == capacity and row.us is not None]
        tag = f"2^{capacity.bit_length() - 1}"
        for group, target in (("update", 50.0), ("draw", 50.0)):
            for row in (r for r in rows if r.group == group):
                verdict = "met" if row.us < target else "missed"
                lines.append(f"- {row.what} at {tag}: {row.us:,.1f} us, target < {target:.0f} us: {verdict}")
        for group in ("prioritized", "slices"):
            ours = [r for r in rows if r.group == group and r.role == "ours"]
            theirs = [r for r in rows if r.group == group and r.role == "torchrl"]
            if ours and theirs:
                best = min(theirs, key=lambda r: r.us)
                ratio = best.us / ours[0].us
                verdict = "met" if ratio >= 10 else "missed"
                lines.append(f"- {group} loop at {tag}: ours {ours[0].us:,.1f} us, torchrl's best "
                             f"({best.what.split(': ', 1)[1]}) {best.us:,.1f} us: {ratio:.1f}x, target >= 10x: {verdict}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="small sizes on CPU tensors (checks the script)")
    parser.add_argument("--out", type=Path, help="also write the table to this file (rewritten after every row)")
    parser.add_argument("--budget", type=float, help="seconds for the whole run: stop cleanly, with what was measured, when spent")
    args = parser.parse_args(argv)
    if args.cpu:
        torch.set_num_threads(1)  # a shared machine: intra-op threads only add noise here
        device, capacities, batch, ks = torch.device("cpu"), [1 << 12, 1 << 14], 512, [16, 256, 1024]
        timing = {"warmup": 2, "repeat": 7}
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: run with --cpu")
        device, capacities, batch, ks = torch.device("cuda"), [TARGET_CAPACITY, 1 << 24], 4096, [256, 4096, 65536]
        timing = {"warmup": 5, "repeat": 30}
    torch.manual_seed(0)
    run = Run(device, batch, timing, args.budget, args.out)
    if args.budget is not None:
        def spent(signum, frame):
            raise BudgetSpent()

        signal.signal(signal.SIGALRM, spent)
        signal.alarm(max(1, int(run.left())))
    try:
        for capacity in capacities:
            sampler_rows(run, capacity, graphs=False)
            sampler_rows(run, capacity, graphs=True)
            prioritized_rows(run, capacity)
            slice_rows(run, capacity)
            tree_rows(run, capacity, ks)
    except BudgetSpent:
        run.notes.append(f"the {args.budget:.0f} s budget was spent during the row after the last one above: the run stopped there")
    finally:
        signal.alarm(0)
    table = render(run)
    print()
    print(table)
    run.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
