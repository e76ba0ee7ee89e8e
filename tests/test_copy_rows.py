"""``replay.copy_rows`` (a round-robin write's row copies, every leaf in one call) against a
numpy model, and the pairs it leaves to the caller (nothing copied then)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import replay

DTYPES = [torch.float32, torch.float64, torch.float16, torch.int64, torch.uint8, torch.bool, torch.complex64]


def _random(shape, dtype, gen):
    if dtype is torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(0, 200, shape, generator=gen, dtype=dtype)


@settings(max_examples=150, deadline=None)
@given(
    capacity=st.integers(1, 12),
    start=st.integers(0, 11),
    numel=st.integers(0, 12),
    row_shapes=st.lists(st.sampled_from([(), (3,), (2, 2), (1,)]), min_size=1, max_size=4),
    dtype_picks=st.lists(st.integers(0, len(DTYPES) - 1), min_size=4, max_size=4),
    seed=st.integers(0, 2**31),
)
def test_copies_match_model(capacity, start, numel, row_shapes, dtype_picks, seed):
    start %= capacity
    numel = min(numel, capacity)
    gen = torch.Generator().manual_seed(seed)
    dests, sources = [], []
    for k, row in enumerate(row_shapes):
        dtype = DTYPES[dtype_picks[k]]
        dests.append(_random((capacity, *row), dtype, gen))
        sources.append(_random((numel, *row), dtype, gen))
    expected = [d.numpy().copy() for d in dests]
    rows = (start + np.arange(numel)) % capacity
    for model, source in zip(expected, sources):
        model[rows] = source.numpy()
    assert replay.copy_rows(dests, sources, start, numel) is True
    for dest, model in zip(dests, expected):
        np.testing.assert_array_equal(dest.numpy(), model)


def _refused():
    dest = torch.zeros(6, 3)
    complex_dest = torch.zeros(6, 3, dtype=torch.complex64)
    return [
        ("another dtype", [dest], [torch.ones(2, 3, dtype=torch.float64)], 0, 2),
        ("another row shape", [dest], [torch.ones(2, 1)], 0, 2),
        ("a non-contiguous source", [dest], [torch.ones(3, 2).t()], 0, 3),
        ("a non-contiguous destination", [torch.zeros(3, 6).t()], [torch.ones(2, 3)], 0, 2),
        ("a lazily negated source", [dest], [torch._neg_view(torch.ones(2, 3))], 0, 2),
        ("a lazily conjugated source", [complex_dest], [torch.ones(2, 3, dtype=torch.complex64).conj()], 0, 2),
        ("a source requiring grad", [dest], [torch.ones(2, 3, requires_grad=True)], 0, 2),
        ("a destination requiring grad", [torch.zeros(6, 3, requires_grad=True)], [torch.ones(2, 3)], 0, 2),
        ("fewer source rows than numel", [dest], [torch.ones(1, 3)], 0, 2),
        ("more rows than the destination", [torch.zeros(2, 3)], [torch.ones(3, 3)], 0, 3),
        ("a start past the destination", [dest], [torch.ones(2, 3)], 6, 2),
        ("a negative start", [dest], [torch.ones(2, 3)], -1, 2),
        ("a source inside its destination", [dest], [dest[1:3]], 3, 2),
        ("a 0-d tensor", [torch.zeros(())], [torch.ones(())], 0, 0),
        ("numpy arrays", [np.zeros((6, 3), np.float32)], [np.ones((2, 3), np.float32)], 0, 2),
        ("a bool start", [dest], [torch.ones(2, 3)], True, 2),
        ("too many pairs", [torch.zeros(6, 3) for _ in range(65)], [torch.ones(2, 3) for _ in range(65)], 0, 2),
    ]


@pytest.mark.parametrize("case", range(len(_refused())), ids=[case[0] for case in _refused()])
def test_pairs_left_to_the_caller_copy_nothing(case):
    _, dests, sources, start, numel = _refused()[case]
    good_dest, good_source = torch.zeros(4, 3), torch.ones(2, 3)
    # a good pair first: nothing is copied there either
    dests, sources = [good_dest, *dests], [good_source, *sources]
    before = [d.clone() if isinstance(d, torch.Tensor) else d.copy() for d in dests]
    assert replay.copy_rows(dests, sources, start, numel) is False
    for dest, old in zip(dests, before):
        if isinstance(dest, torch.Tensor):
            assert torch.equal(dest.detach(), old.detach())
        else:
            np.testing.assert_array_equal(dest, old)


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError, match="as many sources as destinations, got 1 and 2"):
        replay.copy_rows([torch.zeros(2), torch.zeros(2)], [torch.ones(1)], 0, 1)


def test_empty_and_whole_copies():
    dest = torch.arange(5.0)
    assert replay.copy_rows([], [], 0, 3) is True
    assert replay.copy_rows([dest], [torch.ones(0)], 4, 0) is True
    assert dest.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert replay.copy_rows([dest], [torch.arange(10.0, 15.0)], 3, 5) is True
    assert dest.tolist() == [12.0, 13.0, 14.0, 10.0, 11.0]


def test_docstring_example_runs():
    import doctest

    test = doctest.DocTestParser().get_doctest(replay.copy_rows.__doc__, {}, "copy_rows", None, 0)
    runner = doctest.DocTestRunner()
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0 and test.examples
