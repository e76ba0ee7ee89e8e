"""Segment trees: ``replay`` against torchrl 0.11's compiled trees, side by side.

torchrl's trees load only on torch 2.9.x: run this file in that environment to get both
columns (see bench/RESULTS.md); elsewhere only ``replay`` is measured. Every call draws a
fresh batch from a rotating pool, so caches do not flatter either side.
"""
import itertools

import numpy as np
import pytest
import torch

import replay

try:  # torchrl's compiled extension: only on the torch release it was built for
    from torchrl import _torchrl as torchrl_trees

    torchrl_trees.SumSegmentTreeFp32  # noqa: B018
except Exception:  # pragma: no cover - depends on the environment
    torchrl_trees = None

SIZE = 2**20
POOL = 64
IMPLS = ["torchrl", "replay"]


def _tree_classes(impl):
    if impl == "torchrl":
        if torchrl_trees is None:
            pytest.skip("torchrl's compiled segment trees do not load with this torch")
        return torchrl_trees.SumSegmentTreeFp32, torchrl_trees.MinSegmentTreeFp32
    return replay.SumSegmentTreeFp32, replay.MinSegmentTreeFp32


def _filled_sum_tree(impl):
    sum_cls, _ = _tree_classes(impl)
    tree = sum_cls(SIZE)
    gen = torch.Generator().manual_seed(0)
    tree[torch.arange(SIZE)] = torch.rand(SIZE, generator=gen) + 0.01
    return tree


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch", [256, 4096])
def test_scan_lower_bound(benchmark, impl, batch):
    benchmark.group = f"scan_lower_bound size=2^20 B={batch}"
    tree = _filled_sum_tree(impl)
    total = tree.query(0, SIZE)
    gen = torch.Generator().manual_seed(1)
    pool = itertools.cycle([torch.rand(batch, generator=gen) * total for _ in range(POOL)])
    benchmark(lambda: tree.scan_lower_bound(next(pool)))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("batch", [256, 4096])
def test_update(benchmark, impl, batch):
    benchmark.group = f"update size=2^20 B={batch}"
    tree = _filled_sum_tree(impl)
    gen = torch.Generator().manual_seed(2)
    pool = itertools.cycle(
        [(torch.randint(SIZE, (batch,), generator=gen), torch.rand(batch, generator=gen)) for _ in range(POOL)]
    )

    def update():
        index, value = next(pool)
        tree[index] = value

    benchmark(update)


@pytest.mark.parametrize("impl", IMPLS)
def test_set_all_leaves(benchmark, impl):
    benchmark.group = "set all 2^20 leaves"
    sum_cls, _ = _tree_classes(impl)
    tree = sum_cls(SIZE)
    index = torch.arange(SIZE)
    gen = torch.Generator().manual_seed(3)
    pool = itertools.cycle([torch.rand(SIZE, generator=gen) for _ in range(4)])

    def set_all():
        tree[index] = next(pool)

    benchmark.pedantic(set_all, rounds=20, warmup_rounds=2)


@pytest.mark.parametrize("impl", IMPLS)
def test_query_total(benchmark, impl):
    benchmark.group = "query(0, size) size=2^20"
    tree = _filled_sum_tree(impl)
    benchmark(lambda: tree.query(0, SIZE - 1))


@pytest.mark.parametrize("impl", ["torchrl-python-path", "replay-fused-numpy-masses", "replay-fused-internal-prng"])
def test_prioritized_sample_path(benchmark, impl):
    """The sampling step of PrioritizedSampler.sample (B=256): torchrl's sequence of tree
    calls and torch ops against replay's single fused call.

    ``replay-fused-numpy-masses`` is the path ``torchrl_compat``'s sampler takes: the masses
    drawn with ``np.random.uniform`` as torchrl draws them, then one fused descent + weights.
    ``replay-fused-internal-prng`` draws its uniforms inside the kernel (xoshiro256**): a path
    of ``replay``'s API that the sampler does not take (its draws would differ from torchrl's),
    kept to show what the numpy draw costs."""
    benchmark.group = "prioritized draw+descend+weights B=256"
    beta = 0.5
    if impl == "torchrl-python-path":
        sum_cls, min_cls = _tree_classes("torchrl")
        tree, min_tree = sum_cls(SIZE), min_cls(SIZE)
        values = torch.rand(SIZE, generator=torch.Generator().manual_seed(0)) + 0.01
        tree[torch.arange(SIZE)] = values
        min_tree[torch.arange(SIZE)] = values

        def sample():
            p_sum = tree.query(0, SIZE)
            p_min = min_tree.query(0, SIZE)
            mass = np.random.uniform(0.0, p_sum, size=256)
            index = torch.as_tensor(tree.scan_lower_bound(mass))
            index.clamp_max_(SIZE - 1)
            weight = torch.as_tensor(tree[index])
            while (weight == 0).any():  # pragma: no cover - positive leaves here
                break
            return index, torch.pow(weight / p_min, -beta)
    else:
        tree = _filled_sum_tree("replay")
        min_tree = replay.MinSegmentTreeFp32(SIZE)
        min_tree[torch.arange(SIZE)] = torch.as_tensor(tree.values())
        seeds = itertools.count()

        if impl == "replay-fused-numpy-masses":
            def sample():
                p_sum = tree.query(0, SIZE)
                p_min = min_tree.query(0, SIZE)
                mass = np.random.uniform(0.0, p_sum, size=256)
                return tree.sample_prioritized(SIZE, p_min=p_min, beta=beta, mass=mass)
        else:
            def sample():
                p_min = min_tree.query(0, SIZE)
                return tree.sample_prioritized(SIZE, batch_size=256, seed=next(seeds), p_min=p_min, beta=beta)

    benchmark(sample)
