"""``replay.take_rows`` (a sampled batch's rows, every leaf in one call) against numpy's
``take``, and the inputs it refuses with a clear error (nothing read then)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import replay

DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.int8, np.bool_, np.complex64, np.complex128]
# row sizes that take the fixed-size copies (1 to 32 bytes) and the general one (longer, odd)
ROW_SHAPES = [(), (1,), (2,), (3,), (4,), (8,), (2, 2), (5, 7), (33,), (3, 32, 32)]


def _random(shape, dtype, rng):
    if dtype is np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.complexfloating):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 100, shape).astype(dtype)


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(1, 40),
    numel=st.integers(0, 60),
    picks=st.lists(st.tuples(st.integers(0, len(ROW_SHAPES) - 1), st.integers(0, len(DTYPES) - 1)), min_size=0, max_size=6),
    seed=st.integers(0, 2**31),
)
def test_rows_match_numpy_take(length, numel, picks, seed):
    rng = np.random.default_rng(seed)
    arrays = [_random((length, *ROW_SHAPES[s]), DTYPES[d], rng) for s, d in picks]
    rows = rng.integers(0, length, numel)
    gathered = replay.take_rows(arrays, rows)
    assert len(gathered) == len(arrays)
    for out, array in zip(gathered, arrays):
        expected = array.take(rows, axis=0)
        assert out.dtype == array.dtype and out.shape == expected.shape and out.flags.c_contiguous
        np.testing.assert_array_equal(out, expected)
        assert not np.shares_memory(out, array)


def test_rows_from_a_tensor_and_leaves_of_different_lengths():
    import torch

    a, b = np.arange(20.0).reshape(10, 2), np.arange(4)
    out_a, out_b = replay.take_rows([a, b], torch.tensor([3, 0, 3]))
    np.testing.assert_array_equal(out_a, a[[3, 0, 3]])
    np.testing.assert_array_equal(out_b, b[[3, 0, 3]])
    # a row the shorter leaf does not have
    with pytest.raises(IndexError, match=r"rows\[1\] = 5 lies outside the arrays' rows \[0, 4\)"):
        replay.take_rows([a, b], np.array([0, 5]))


def test_empty_inputs():
    assert replay.take_rows([], np.array([1, 2])) == []
    (out,) = replay.take_rows([np.zeros((0, 3))], np.array([], dtype=np.int64))
    assert out.shape == (0, 3)
    # rows of zero bytes
    (out,) = replay.take_rows([np.zeros((4, 0))], np.array([3, 1]))
    assert out.shape == (2, 0)


@pytest.mark.parametrize(
    "arrays, rows, error, match",
    [
        ([np.zeros(4)], np.array([-1]), IndexError, r"rows\[0\] = -1 lies outside"),
        ([np.zeros(4)], np.array([2, 4]), IndexError, r"rows\[1\] = 4 lies outside the arrays' rows \[0, 4\)"),
        ([np.zeros(4)], np.array([0.5]), TypeError, "rows must hold integers"),
        ([[1.0, 2.0]], np.array([0]), TypeError, "reads numpy arrays, got list at position 0"),
        ([np.array(["a", "b"], dtype=object)], np.array([0]), TypeError, "dtype"),
        ([np.zeros(4, dtype=">f8")], np.array([0]), TypeError, "native byte order"),
        ([np.zeros(3, dtype="U2")], np.array([0]), TypeError, "numbers and booleans"),
        ([np.zeros((3, 4)).T], np.array([0]), ValueError, "C-contiguous"),
        ([np.array(1.0)], np.array([0]), ValueError, "1-D"),
        ([np.zeros(2)] * 65, np.array([0]), ValueError, "at most 64"),
    ],
)
def test_bad_input_raises(arrays, rows, error, match):
    before = [np.array(a, copy=True) for a in arrays[:2] if isinstance(a, np.ndarray)]
    with pytest.raises(error, match=match):
        replay.take_rows(arrays, rows)
    for kept, array in zip(before, arrays):
        np.testing.assert_array_equal(kept, array)
