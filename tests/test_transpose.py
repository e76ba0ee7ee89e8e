"""``replay``'s column helpers (``common_type``, ``gather_attribute``, ``transpose_dicts``)
against plain Python models, their refusals, and what they do when the objects they read run
Python code of their own."""
import gc
import sys
from collections import OrderedDict
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

import replay

KEYS = st.sampled_from(["a", "b", "c", "d", 1, 2.5, (1, 2)])
VALUES = st.one_of(st.integers(), st.text(max_size=3), st.none(), st.floats(allow_nan=False))


def _model_transpose(dicts):
    if not dicts:
        return []
    keys = list(dicts[0])
    if any(len(d) != len(keys) or any(k not in d for k in keys) for d in dicts):
        return None
    return [[d[k] for d in dicts] for k in keys]


# -----------------------------------------------------------------------------
# transpose_dicts
# -----------------------------------------------------------------------------
@given(
    rows=st.lists(st.dictionaries(KEYS, VALUES, max_size=5), max_size=8),
    same_keys=st.booleans(),
    shuffles=st.lists(st.randoms(use_true_random=False), min_size=8, max_size=8),
)
def test_transpose_matches_model(rows, same_keys, shuffles):
    if same_keys and rows:  # rows of one key set, in shuffled orders
        keys = list(rows[0])
        rows = [rows[0]] + [{k: i for k in shuffle.sample(keys, len(keys))} for i, shuffle in
                            zip(range(1, len(rows)), shuffles)]
    as_tuple = replay.transpose_dicts(tuple(rows))
    result = replay.transpose_dicts(rows)
    assert result == _model_transpose(rows) == as_tuple
    if result is not None:
        assert all(type(column) is list and len(column) == len(rows) for column in result)


@pytest.mark.parametrize(
    "rows, expected",
    [
        pytest.param([], [], id="no dicts"),
        pytest.param([{}], [], id="one empty dict"),
        pytest.param([{}, {}], [], id="empty dicts"),
        pytest.param([{"a": 1, "b": 2}], [[1], [2]], id="one dict"),
        pytest.param([{"a": 1, "b": 2}, {"b": 4, "a": 3}], [[1, 3], [2, 4]], id="another key order"),
        pytest.param([{"a": 1, "b": 2}, {"a": 3}], None, id="missing key"),
        pytest.param([{"a": 1}, {"a": 3, "b": 4}], None, id="extra key"),
        pytest.param([{"a": 1, "b": 2}, {"a": 3, "c": 4}], None, id="another key"),
        pytest.param([{"a": 1, "b": 2}, {"c": 3, "d": 4}], None, id="other keys"),
        pytest.param([{"a": 1}, {}], None, id="empty after"),
        pytest.param([{}, {"a": 1}], None, id="empty first"),
        pytest.param([{1: "x"}, {1.0: "y"}, {True: "z"}], [["x", "y", "z"]], id="equal keys of other types"),
    ],
)
def test_transpose_cases(rows, expected):
    assert replay.transpose_dicts(rows) == expected


def test_transpose_equal_keys_that_are_other_objects():
    """Keys met as other (equal) objects are looked up, in any position."""
    first = {"".join(["ke", "y"]): 1, "other": 2}
    second = {"other": 4, "".join(["k", "ey"]): 3}
    assert next(iter(first)) is not next(iter(second.keys() - {"other"}))
    assert replay.transpose_dicts([first, second]) == [[1, 3], [2, 4]]


def test_transpose_values_are_the_objects_themselves():
    values = [object() for _ in range(4)]
    columns = replay.transpose_dicts([{"a": values[0], "b": values[1]}, {"b": values[3], "a": values[2]}])
    assert columns[0][0] is values[0] and columns[0][1] is values[2]
    assert columns[1][0] is values[1] and columns[1][1] is values[3]


@pytest.mark.parametrize(
    "dicts, message",
    [
        pytest.param(3, "transpose_dicts takes a list or tuple of dicts, got int", id="int"),
        pytest.param({"a": 1}, "a list or tuple of dicts, got dict", id="one dict"),
        pytest.param(iter([{}]), "a list or tuple of dicts, got list_iterator", id="iterator"),
        pytest.param([{}, [("a", 1)]], "takes dicts, got list at position 1", id="list row"),
        pytest.param([{}, None], "takes dicts, got NoneType at position 1", id="None row"),
        pytest.param([OrderedDict(a=1)], "takes dicts, got OrderedDict at position 0", id="OrderedDict"),
        pytest.param([{"a": 1}, {"b": 1}, 5], "got int at position 2", id="refused before keys compared"),
    ],
)
def test_transpose_bad_input(dicts, message):
    with pytest.raises(TypeError, match=message):
        replay.transpose_dicts(dicts)


class _Key:
    """A key equal to its twin, whose comparisons run the callback given."""

    def __init__(self, name, on_eq=None):
        self.name, self.on_eq = name, on_eq

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        if self.on_eq is not None:
            self.on_eq()
        return isinstance(other, _Key) and other.name == self.name


def test_transpose_rows_emptied_while_keys_compared():
    """A key comparison that empties the caller's list: the rows read are those passed."""
    rows = []
    # a dict lookup compares with the stored key: the second row's runs the callback
    rows.extend([{_Key("k"): 0}, {_Key("k", on_eq=rows.clear): 1}, {_Key("k"): 2}])
    assert replay.transpose_dicts(rows) == [[0, 1, 2]]
    assert rows == []


def test_transpose_key_comparison_error_propagates():
    def fail():
        raise ValueError("no comparing")

    with pytest.raises(ValueError, match="no comparing"):
        replay.transpose_dicts([{_Key("k"): 0}, {_Key("k", on_eq=fail): 1}])


def test_transpose_keeps_no_references():
    value = object()
    start = sys.getrefcount(value)
    for rows in ([{"a": value}] * 5, [{"a": value}, {"b": value}], [{"a": value, "b": 1}, {"b": 2, "a": value}, {}]):
        replay.transpose_dicts(rows)
        del rows
    gc.collect()
    assert sys.getrefcount(value) == start


# -----------------------------------------------------------------------------
# gather_attribute
# -----------------------------------------------------------------------------
@given(
    records=st.lists(st.tuples(st.integers(), st.sampled_from([0, 1]), st.sampled_from(["m", "s"])), max_size=8),
    same=st.lists(st.sampled_from(["unit", "scale", "value"]), max_size=3),
)
def test_gather_matches_model(records, same):
    objects = [SimpleNamespace(value=v, scale=s, unit=u) for v, s, u in records]
    if objects and any(getattr(o, name) != getattr(objects[0], name) for o in objects for name in same):
        expected = None
    else:
        expected = [o.value for o in objects]
    assert replay.gather_attribute(objects, "value", same) == expected
    assert replay.gather_attribute(tuple(objects), "value", tuple(same)) == expected


def test_gather_compares_by_identity_then_equality():
    class NeverEqual:
        def __eq__(self, other):
            return False

    shared = NeverEqual()
    objects = [SimpleNamespace(x=i, tag=shared) for i in range(3)]
    assert replay.gather_attribute(objects, "x", ("tag",)) == [0, 1, 2]  # one object: the same
    objects[2].tag = NeverEqual()
    assert replay.gather_attribute(objects, "x", ("tag",)) is None
    assert replay.gather_attribute([SimpleNamespace(x=0, n=1), SimpleNamespace(x=1, n=1.0)], "x", ["n"]) == [0, 1]


def test_gather_cases():
    assert replay.gather_attribute([], "x") == []
    assert replay.gather_attribute([], "x", ("y",)) == []
    one = SimpleNamespace(x=5)
    assert replay.gather_attribute([one], "x", ("x",)) == [5]
    assert replay.gather_attribute([1, 2.5], "real") == [1, 2.5]


def test_gather_missing_attribute_raises_getattrs_error():
    objects = [SimpleNamespace(x=0, unit="m"), SimpleNamespace(x=1)]
    with pytest.raises(AttributeError, match="unit"):
        replay.gather_attribute(objects, "x", ("unit",))
    with pytest.raises(AttributeError, match="'y'"):
        replay.gather_attribute(objects, "y")


@pytest.mark.parametrize(
    "call, message",
    [
        pytest.param(lambda: replay.gather_attribute(5, "x"), "gather_attribute takes a list or tuple of objects, got int",
                     id="objects int"),
        pytest.param(lambda: replay.gather_attribute({1, 2}, "x"), "a list or tuple of objects, got set",
                     id="objects set"),
        pytest.param(lambda: replay.gather_attribute([], "x", "unit"), r"list or tuple of attribute names \(same\), got str",
                     id="same str"),
        pytest.param(lambda: replay.gather_attribute([], "x", ("unit", 3)), r"attribute names \(str\) in same, got int at position 1",
                     id="same int"),
        pytest.param(lambda: replay.gather_attribute([], 3), "'name' has incorrect type", id="name int"),
    ],
)
def test_gather_bad_input(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_gather_objects_emptied_while_read():
    """An attribute read that empties the caller's list: the objects read are those passed."""
    objects = []

    class Emptying:
        def __init__(self, x):
            self.x = x

        @property
        def tag(self):
            objects.clear()
            return "t"

    objects.extend(Emptying(i) for i in range(4))
    assert replay.gather_attribute(objects, "x", ("tag",)) == [0, 1, 2, 3]
    assert objects == []


def test_gather_keeps_no_references():
    value = object()
    start = sys.getrefcount(value)
    replay.gather_attribute([SimpleNamespace(x=value, t=0)] * 4, "x", ("t",))
    replay.gather_attribute([SimpleNamespace(x=value, t=0), SimpleNamespace(x=value, t=1)], "x", ("t",))
    gc.collect()
    assert sys.getrefcount(value) == start


# -----------------------------------------------------------------------------
# common_type
# -----------------------------------------------------------------------------
@given(st.lists(st.one_of(st.integers(), st.booleans(), st.text(max_size=2), st.none()), max_size=8))
def test_common_type_matches_model(objects):
    kinds = {type(o) for o in objects}
    expected = kinds.pop() if len(kinds) == 1 else None
    assert replay.common_type(objects) is expected
    assert replay.common_type(tuple(objects)) is expected


def test_common_type_cases():
    class Sub(dict):
        pass

    assert replay.common_type([]) is None
    assert replay.common_type(()) is None
    assert replay.common_type([{}]) is dict
    assert replay.common_type([{}, Sub()]) is None
    assert replay.common_type([Sub(), Sub()]) is Sub
    with pytest.raises(TypeError, match="common_type takes a list or tuple of objects, got str"):
        replay.common_type("ab")
