"""A short tour of ``replay``: what it computes, and how fast against the reference paths that
load in this environment (torchrl 0.11's compiled trees load only on torch 2.9.x; its Python
slice code and torch.randperm load everywhere)."""
import time

import numpy as np
import torch

import replay

SIZE = 2**20
BATCH = 256


def best_of(fn, repeat=50):
    """Best wall time of ``fn`` in microseconds."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e6


def reference_trees():
    try:
        from torchrl import _torchrl

        return _torchrl.SumSegmentTreeFp32
    except Exception:
        return None


def row(name, ours, reference, ref_name):
    if reference is None:
        print(f"  {name:<42} {ours:10.1f} us   ({ref_name}: not loadable here)")
    else:
        print(f"  {name:<42} {ours:10.1f} us   {ref_name} {reference:10.1f} us   x{reference / ours:5.1f}")


def slice_sampler_loop(label, prioritized=False, rounds=20):
    """torchrl's slice sampler on its storage against ours on ours, with a write of 256 steps
    (and, for the prioritized one, ``extend``) before each sample: our storage journals its
    writes, so the sampler re-reads only the written rows instead of the whole end signal."""
    from tensordict import TensorDict
    from torchrl.data.replay_buffers import LazyTensorStorage as TorchrlStorage
    from torchrl.data.replay_buffers import samplers as torchrl_samplers

    import torchrl_compat

    def steps(start, n):
        step = torch.arange(start, start + n)
        return TensorDict({"obs": step, ("next", "done"): (step % 1000 == 999).unsqueeze(-1)}, [n])

    name = "PrioritizedSliceSampler" if prioritized else "SliceSampler"
    timings = {}
    for side, storage_cls, module in (
        ("torchrl", TorchrlStorage, torchrl_samplers),
        ("ours", torchrl_compat.LazyTensorStorage, torchrl_compat),
    ):
        storage = storage_cls(SIZE)
        storage.set(torch.arange(SIZE), steps(0, SIZE))
        if prioritized:
            sampler = module.PrioritizedSliceSampler(SIZE, 0.7, 0.5, slice_len=32, end_key=("next", "done"))
            sampler.update_priority(torch.arange(SIZE), torch.rand(SIZE) + 0.01)
        else:
            sampler = module.SliceSampler(slice_len=32, end_key=("next", "done"))
        written, best = SIZE, float("inf")
        for _ in range(rounds if side == "ours" or not prioritized else 5):
            index = torch.arange(written, written + BATCH) % SIZE
            storage.set(index, steps(written, BATCH))
            if prioritized:
                sampler.extend(index)
            written += BATCH
            start = time.perf_counter()
            (index,), info = sampler.sample(storage, BATCH)
            best = min(best, time.perf_counter() - start)
        episodes = storage[index]["obs"].view(-1, 32) // 1000
        assert (episodes == episodes[:, :1]).all(), "a slice crossed an episode boundary"
        timings[side] = best * 1e6
    row(label, timings["ours"], timings["torchrl"], "torchrl")


def main():
    torch.manual_seed(0)
    print(f"torch {torch.__version__}; replay built against numpy only\n")

    print("Segment trees (2^20 fp32 leaves):")
    priorities = torch.rand(SIZE) + 0.01
    tree = replay.SumSegmentTreeFp32(SIZE)
    tree[torch.arange(SIZE)] = priorities
    print(f"  total {tree.query(0, SIZE):.2f} (float64 sum {priorities.double().sum().item():.2f})")
    masses = [torch.rand(BATCH) * tree.query(0, SIZE) for _ in range(32)]
    updates = [(torch.randint(SIZE, (BATCH,)), torch.rand(BATCH)) for _ in range(32)]
    it = iter(range(10**9))

    ref_cls = reference_trees()
    ref = None
    if ref_cls is not None:
        ref = ref_cls(SIZE)
        ref[torch.arange(SIZE)] = priorities
    ours = best_of(lambda: tree.scan_lower_bound(masses[next(it) % 32]))
    theirs = None if ref is None else best_of(lambda: ref.scan_lower_bound(masses[next(it) % 32]))
    row(f"scan_lower_bound B={BATCH}", ours, theirs, "torchrl")

    def upd(t):
        index, value = updates[next(it) % 32]
        t[index] = value

    row(f"update B={BATCH}", best_of(lambda: upd(tree)), None if ref is None else best_of(lambda: upd(ref)), "torchrl")
    index = torch.arange(SIZE)
    row("set all 2^20 leaves", best_of(lambda: tree.update(index, priorities), 10),
        None if ref is None else best_of(lambda: ref.update(index, priorities), 10), "torchrl")
    idx, prio, weight = tree.sample_prioritized(SIZE, torch.rand(BATCH), p_min=0.01, beta=0.5)
    print(f"  fused prioritized sample: {tuple(idx.shape)} indices, priorities in [{prio.min():.3f}, {prio.max():.3f}]")
    try:
        tree[SIZE] = 1.0
    except IndexError as err:
        print(f"  out-of-range write -> IndexError: {err}")
    try:
        tree[torch.tensor([1, 2])] = torch.tensor([1.0, float("nan")])
    except ValueError as err:
        print(f"  NaN priority -> ValueError: {err}")

    print("\nPermutations (n = 2^20):")
    row("full permutation", best_of(lambda: replay.randperm(SIZE), 10), best_of(lambda: torch.randperm(SIZE), 10), "torch.randperm")
    row("first batch of 256 of a lazy epoch", best_of(lambda: replay.PermutationEpoch(SIZE).next_batch(BATCH), 20),
        best_of(lambda: torch.randperm(SIZE)[:BATCH], 10), "randperm[:256]")

    print("\nTrajectory slice starts (2^20 steps, episodes of 1000):")
    done = torch.zeros(SIZE, dtype=torch.bool)
    done[999::1000] = True
    from torchrl.data.replay_buffers.samplers import SliceSampler

    reference = SliceSampler(num_slices=1)
    start, stop, lengths = replay.find_start_stop_traj(end=done, at_capacity=True, cursor=SIZE - 1)
    print(f"  {start.shape[0]} trajectories, lengths {lengths.min().item()}..{lengths.max().item()}")
    row("find_start_stop_traj",
        best_of(lambda: replay.find_start_stop_traj(end=done, at_capacity=True, cursor=SIZE - 1), 20),
        best_of(lambda: reference._find_start_stop_traj(end=done, at_capacity=True, cursor=SIZE - 1), 20),
        "torchrl")

    print("\nSlice samplers in a training loop (2^20 steps, a write of 256 steps before each sample):")
    slice_sampler_loop("SliceSampler.sample after a write")
    import torchrl_compat

    # torchrl's prioritized samplers need segment trees: its own on torch 2.9.x, replay's here
    installed = torchrl_compat.install_segment_trees()
    slice_sampler_loop("PrioritizedSliceSampler after a write", prioritized=True)

    print("\ntorchrl's own prioritized replay on this torch:")
    from torchrl.data import PrioritizedReplayBuffer, LazyTensorStorage

    rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.9, storage=LazyTensorStorage(1000), batch_size=8)
    rb.extend(torch.arange(100))
    sample, info = rb.sample(return_info=True)
    rb.update_priority(info["index"], torch.rand(8) + 0.1)
    print(f"  install_segment_trees() -> {installed}; PrioritizedReplayBuffer sampled {sample.tolist()}")


if __name__ == "__main__":
    main()
