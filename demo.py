"""A short tour of ``replay`` and ``torchrl_compat``: what they compute, and how fast against
the reference paths that load in this environment.

torchrl 0.11's compiled segment trees load only on torch 2.9.x; its Python slice code, its
replay buffers and ``torch.randperm`` load everywhere torchrl is installed. Without torchrl the
demo runs our side of each section it can and says what it skips.

Every timing runs on one intra-op thread, ours and the reference's alike
(``torch.set_num_threads(1)``): torch's thread pool otherwise competes with whatever else runs
on the machine and makes the reference side swing by an order of magnitude from run to run.
Each ratio is the median over interleaved repeats (ours, reference, ours, ...; the best of a
few calls each), printed with the range of the per-repeat ratios.

``python demo.py --fast`` (or ``REPLAY_DEMO_FAST=1``) runs every section on small sizes with
few repeats: a check that it works, not a measurement.
"""
import argparse
import logging
import os
import statistics
import sys
import time

import torch

import replay
import torchrl_compat

BATCH = 256


class Settings:
    """Sizes and repeat counts: full for a measurement, small for a quick check."""

    def __init__(self, fast):
        self.fast = fast
        self.size = 2**14 if fast else 2**20
        self.repeats = 3 if fast else 15
        self.calls = 2 if fast else 10
        self.loop_capacity = 2**12 if fast else 2**17
        self.loop_steps = 40 if fast else 800
        self.loop_chunk = 10 if fast else 50


def load_torchrl():
    """Import torchrl if it is installed, with its INFO log lines (which carry colour escapes)
    kept out of the tables; None otherwise."""
    try:
        import torchrl
    except ImportError:
        return None
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    return torchrl


def torchrl_trees():
    """torchrl's own compiled sum tree, where it loads (torch 2.9.x), else None."""
    try:
        from torchrl import _torchrl
    except Exception:  # noqa: BLE001  (an ImportError or the extension's own load error)
        return None
    if getattr(_torchrl, "__replay_stand_in__", False):
        return None
    return _torchrl.SumSegmentTreeFp32


class Table:
    """Rows of ``name | ours | reference | ratio (range)``, printed as they come."""

    def __init__(self, settings):
        self.settings = settings
        self.skipped = []

    def section(self, title):
        print(f"\n{title}")

    def skip(self, name, why):
        print(f"  {name:<44} skipped: {why}")
        self.skipped.append(f"{name}: {why}")

    def compare(self, name, ours, reference, ref_name, calls=None):
        """Time ``ours`` and ``reference`` (callables returning the seconds they measured) in
        interleaved repeats; print the medians and the median ratio with its range."""
        calls = calls or self.settings.calls
        ours_times, ref_times, ratios = [], [], []
        for repeat in range(self.settings.repeats):
            # Alternate which side goes first, so neither always runs on a warmer cache.
            sides = (ours, reference) if repeat % 2 == 0 else (reference, ours)
            best = {}
            for fn in sides:
                best[fn] = min(fn() for _ in range(calls))
            ours_times.append(best[ours])
            ref_times.append(best[reference])
            ratios.append(best[reference] / best[ours])
        print(
            f"  {name:<44} {_us(statistics.median(ours_times))}   {ref_name:<15}"
            f" {_us(statistics.median(ref_times))}   x{statistics.median(ratios):<6.1f}"
            f"(x{min(ratios):.1f}-x{max(ratios):.1f})"
        )
        return statistics.median(ratios)

    def ours_only(self, name, ours, why):
        calls = self.settings.calls
        times = [min(ours() for _ in range(calls)) for _ in range(self.settings.repeats)]
        print(f"  {name:<44} {_us(statistics.median(times))}   (no reference: {why})")
        self.skipped.append(f"{name}, reference side: {why}")


def _us(seconds):
    return f"{seconds * 1e6:10.1f} us"


def timed(fn, *args):
    """A callable that runs ``fn(*args)`` and returns the seconds it took."""

    def run():
        start = time.perf_counter()
        fn(*args)
        return time.perf_counter() - start

    return run


def cycling(items):
    """The next item of ``items`` at each call, round and round."""
    state = {"i": -1}

    def next_item():
        state["i"] = (state["i"] + 1) % len(items)
        return items[state["i"]]

    return next_item


# -----------------------------------------------------------------------------
# Sections
# -----------------------------------------------------------------------------
def segment_trees(table, settings):
    size = settings.size
    table.section(f"Segment trees ({size} fp32 leaves, batches of {BATCH}):")
    priorities = torch.rand(size) + 0.01
    tree = replay.SumSegmentTreeFp32(size)
    tree[torch.arange(size)] = priorities
    print(f"  total {tree.query(0, size):.2f} (float64 sum {priorities.double().sum().item():.2f})")
    masses = cycling([torch.rand(BATCH) * tree.query(0, size) for _ in range(32)])
    updates = cycling([(torch.randint(size, (BATCH,)), torch.rand(BATCH)) for _ in range(32)])

    def update(t):
        index, value = updates()
        start = time.perf_counter()
        t[index] = value
        return time.perf_counter() - start

    def scan(t):
        mass = masses()
        start = time.perf_counter()
        t.scan_lower_bound(mass)
        return time.perf_counter() - start

    everything = torch.arange(size)
    reference_cls = torchrl_trees()
    if reference_cls is None:
        why = "torchrl's compiled trees need torch 2.9.x"
        table.ours_only("scan_lower_bound", lambda: scan(tree), why)
        table.ours_only("update", lambda: update(tree), why)
        table.ours_only(f"set all {size} leaves", timed(tree.update, everything, priorities), why)
    else:
        reference = reference_cls(size)
        reference[everything] = priorities
        table.compare("scan_lower_bound", lambda: scan(tree), lambda: scan(reference), "torchrl")
        table.compare("update", lambda: update(tree), lambda: update(reference), "torchrl")
        table.compare(f"set all {size} leaves", timed(tree.update, everything, priorities),
                      timed(reference.update, everything, priorities), "torchrl")
    index, priority, _ = tree.sample_prioritized(size, torch.rand(BATCH), p_min=0.01, beta=0.5)
    print(f"  fused prioritized sample: {tuple(index.shape)} indices, "
          f"priorities in [{priority.min():.3f}, {priority.max():.3f}]")
    try:
        tree[size] = 1.0
    except IndexError as err:
        print(f"  out-of-range write -> IndexError: {err}")
    try:
        tree[torch.tensor([1, 2])] = torch.tensor([1.0, float("nan")])
    except ValueError as err:
        print(f"  NaN priority -> ValueError: {err}")


def permutations(table, settings):
    size = settings.size
    table.section(f"Permutations (n = {size}):")
    table.compare("full permutation", timed(replay.randperm, size), timed(torch.randperm, size),
                  "torch.randperm")
    table.compare(f"first batch of {BATCH} of a lazy epoch",
                  timed(lambda: replay.PermutationEpoch(size).next_batch(BATCH)),
                  timed(lambda: torch.randperm(size)[:BATCH]), "randperm[:256]")


def slice_starts(table, settings, torchrl):
    size = settings.size
    table.section(f"Trajectory slice starts ({size} steps, episodes of 1000):")
    done = torch.zeros(size, dtype=torch.bool)
    done[999::1000] = True
    kwargs = dict(end=done, at_capacity=True, cursor=size - 1)
    start, stop, lengths = replay.find_start_stop_traj(**kwargs)
    print(f"  {start.shape[0]} trajectories, lengths {lengths.min().item()}..{lengths.max().item()}")
    if torchrl is None:
        table.ours_only("find_start_stop_traj", timed(lambda: replay.find_start_stop_traj(**kwargs)),
                        "needs torchrl")
        return
    from torchrl.data.replay_buffers.samplers import SliceSampler

    reference = SliceSampler(num_slices=1)
    table.compare("find_start_stop_traj", timed(lambda: replay.find_start_stop_traj(**kwargs)),
                  timed(lambda: reference._find_start_stop_traj(**kwargs)), "torchrl")


def _steps(start, n):
    from tensordict import TensorDict

    step = torch.arange(start, start + n)
    return TensorDict({"obs": step, ("next", "done"): (step % 1000 == 999).unsqueeze(-1)}, [n])


class SliceLoop:
    """One side of a slice-sampler training loop: each call writes 256 steps (and, for the
    prioritized sampler, extends it) untimed, then times one ``sample``. Our storage journals
    its writes, so our sampler re-reads only the written rows, not the whole end signal."""

    def __init__(self, storage_cls, samplers, size, prioritized):
        self.size = size
        self.storage = storage_cls(size)
        self.storage.set(torch.arange(size), _steps(0, size))
        if prioritized:
            self.sampler = samplers.PrioritizedSliceSampler(size, 0.7, 0.5, slice_len=32,
                                                            end_key=("next", "done"))
            self.sampler.update_priority(torch.arange(size), torch.rand(size) + 0.01)
        else:
            self.sampler = samplers.SliceSampler(slice_len=32, end_key=("next", "done"))
        self.prioritized = prioritized
        self.written = size

    def __call__(self):
        index = torch.arange(self.written, self.written + BATCH) % self.size
        self.storage.set(index, _steps(self.written, BATCH))
        if self.prioritized:
            self.sampler.extend(index)
        self.written += BATCH
        start = time.perf_counter()
        (index,), _ = self.sampler.sample(self.storage, BATCH)
        elapsed = time.perf_counter() - start
        episodes = self.storage[index]["obs"].view(-1, 32) // 1000
        assert (episodes == episodes[:, :1]).all(), "a slice crossed an episode boundary"
        return elapsed


def slice_samplers(table, settings, torchrl):
    size = settings.size
    table.section(f"Slice samplers in a training loop ({size} steps, a write of {BATCH} steps "
                  "before each sample; each side on its own storage):")
    if torchrl is None:
        for name, prioritized in (("SliceSampler", False), ("PrioritizedSliceSampler", True)):
            table.ours_only(f"{name}.sample after a write",
                            SliceLoop(torchrl_compat.LazyTensorStorage, torchrl_compat, size, prioritized),
                            "needs torchrl")
        return
    from torchrl.data.replay_buffers import LazyTensorStorage as TorchrlStorage
    from torchrl.data.replay_buffers import samplers as torchrl_samplers

    for name, prioritized in (("SliceSampler", False), ("PrioritizedSliceSampler", True)):
        ours = SliceLoop(torchrl_compat.LazyTensorStorage, torchrl_compat, size, prioritized)
        reference = SliceLoop(TorchrlStorage, torchrl_samplers, size, prioritized)
        # torchrl's prioritized slice sampler writes its whole tree at every sample: a
        # few calls per repeat are enough to see it.
        table.compare(f"{name}.sample after a write", ours, reference, "torchrl",
                      calls=min(3, settings.calls) if prioritized else None)


# -----------------------------------------------------------------------------
# Prioritized replay in a training loop
# -----------------------------------------------------------------------------
class Progress:
    """A plain-text progress bar, redrawn in place on a terminal and printed once otherwise."""

    def __init__(self, total, label, width=30):
        self.total, self.label, self.width = total, label, width
        self.live = sys.stdout.isatty()
        self.start = time.perf_counter()

    def show(self, done, note=""):
        if not self.live and done < self.total:
            return
        filled = self.width * done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        end = "\n" if done >= self.total else ""
        print(f"\r  {self.label} [{bar}] {done}/{self.total} steps, {elapsed:5.1f} s {note}",
              end=end, flush=True)


def _transitions(start, n):
    from tensordict import TensorDict

    step = torch.arange(start, start + n)
    return TensorDict({"obs": torch.randn(n, 8), "action": step % 4, "reward": torch.randn(n)}, [n])


class PrioritizedLoop:
    """One side of a prioritized training loop: each step extends the buffer with 64
    transitions, samples a batch and writes back the batch's new priorities (|TD error|)."""

    def __init__(self, buffer, capacity):
        self.buffer = buffer
        buffer.extend(_transitions(0, capacity // 2))  # half full before the loop starts
        self.written = capacity // 2

    def run(self, steps):
        start = time.perf_counter()
        for _ in range(steps):
            self.buffer.extend(_transitions(self.written, 64))
            self.written += 64
            batch = self.buffer.sample()
            batch["td_error"] = batch["reward"].abs() + 0.01
            self.buffer.update_tensordict_priority(batch)
        return time.perf_counter() - start


def prioritized_buffers(torchrl, capacity):
    """(ours, reference, how ours is built), each None where it cannot be built here."""
    kwargs = dict(alpha=0.7, beta=0.5, batch_size=BATCH, priority_key="td_error")
    own_buffer = getattr(torchrl_compat, "TensorDictPrioritizedReplayBuffer", None)
    if own_buffer is not None:
        ours = own_buffer(storage=torchrl_compat.LazyTensorStorage(capacity), **kwargs)
        how = "torchrl_compat.TensorDictPrioritizedReplayBuffer"
    elif torchrl is not None:
        from torchrl.data import TensorDictReplayBuffer

        sampler = torchrl_compat.PrioritizedSampler(capacity, alpha=0.7, beta=0.5)
        ours = TensorDictReplayBuffer(storage=torchrl_compat.LazyTensorStorage(capacity), sampler=sampler,
                                      batch_size=BATCH, priority_key="td_error")
        how = "torchrl's TensorDictReplayBuffer on torchrl_compat's storage and PrioritizedSampler"
    else:
        ours, how = None, None
    reference = None
    if torchrl is not None:
        from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer

        reference = TensorDictPrioritizedReplayBuffer(storage=LazyTensorStorage(capacity), **kwargs)
    return ours, reference, how


def prioritized_training_loop(table, settings, torchrl):
    capacity, steps, chunk = settings.loop_capacity, settings.loop_steps, settings.loop_chunk
    table.section(f"Prioritized replay in a training loop (capacity {capacity}, half full; each step "
                  f"extends by 64, samples {BATCH}, updates their priorities):")
    ours, reference, how = prioritized_buffers(torchrl, capacity)
    if ours is None:
        table.skip("prioritized training loop", "needs torchrl (or torchrl_compat's own buffers)")
        return None
    trees = torchrl_trees()
    print(f"  ours: {how}")
    if reference is not None:
        where = ("torchrl's compiled segment trees" if trees is not None
                 else "replay's trees (install_segment_trees(): torchrl's do not load on this torch)")
        print(f"  reference: torchrl's TensorDictPrioritizedReplayBuffer on its own storage and "
              f"PrioritizedSampler, with {where}")
    sides = {"ours": PrioritizedLoop(ours, capacity)}
    if reference is not None:
        sides["torchrl"] = PrioritizedLoop(reference, capacity)
    for loop in sides.values():
        loop.run(chunk)  # warm-up: first-call costs stay out of the table
    seconds = {name: [] for name in sides}
    progress = Progress(steps * len(sides), "training loop")
    done = 0
    for repeat in range(steps // chunk):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for name in order:
            seconds[name].append(sides[name].run(chunk))
            done += chunk
            progress.show(done)
    return seconds, chunk


def throughput_table(table, loop):
    print("\nThroughput of the training loop (steps per second, median over chunks; range):")
    if loop is None:
        print("  (not run)")
        return
    seconds, chunk = loop
    for name, times in seconds.items():
        rates = [chunk / t for t in times]
        print(f"  {name:<10} {statistics.median(rates):9.0f} steps/s   "
              f"({min(rates):.0f}-{max(rates):.0f}, {len(rates)} chunks of {chunk})")
    if "torchrl" in seconds:
        ratios = [t_ref / t_ours for t_ours, t_ref in zip(seconds["ours"], seconds["torchrl"])]
        print(f"  ours / torchrl: x{statistics.median(ratios):.1f} (x{min(ratios):.1f}-x{max(ratios):.1f})")
    else:
        table.skipped.append("training loop, reference side: needs torchrl")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast", action="store_true", default=os.environ.get("REPLAY_DEMO_FAST") == "1",
                        help="small sizes and few repeats: checks that every section runs")
    settings = Settings(parser.parse_args(argv).fast)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    torchrl = load_torchrl()
    if torchrl is not None:
        # torchrl's prioritized samplers need segment trees: its own on torch 2.9.x (left in
        # place), replay's elsewhere.
        torchrl_compat.install_segment_trees()
    table = Table(settings)
    versions = f"torch {torch.__version__}, " + (f"torchrl {torchrl.__version__}" if torchrl else "no torchrl")
    print(f"{versions}; one intra-op thread (torch.set_num_threads(1)) on both sides; "
          f"ratio = reference time / ours, median of {settings.repeats} interleaved repeats "
          f"(range){'; FAST MODE: sizes too small to measure' if settings.fast else ''}")

    segment_trees(table, settings)
    permutations(table, settings)
    slice_starts(table, settings, torchrl)
    slice_samplers(table, settings, torchrl)
    loop = prioritized_training_loop(table, settings, torchrl)
    throughput_table(table, loop)

    if table.skipped:
        print("\nSkipped here:")
        for line in table.skipped:
            print(f"  - {line}")


if __name__ == "__main__":
    main()
