"""The Arrow columns' fast path of request validation (:mod:`ctrkit.data.pipeline.arrow_columns`) gives exactly
the canonical values the per-value readers (:mod:`ctrkit.data.pipeline.values`) give for the column's Python
values, and never a column holding a value those readers refuse; columns of the usual Arrow types take it."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
from column_readers import same, slow
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrkit.data.pipeline.arrow_columns import arrow_columns
from ctrkit.data.pipeline.rules import COUNT, DENSE, HEX, ID, ColumnRule

RULES = [ColumnRule("i1", "I1", COUNT, "<f4", transform="log"), ColumnRule("i2", "I2", COUNT, "<f4", transform="log"),
         ColumnRule("c1", "C1", HEX, "<u4"), ColumnRule("c2", "C2", HEX, "<u4"),
         ColumnRule("x", "x", DENSE, "<f4"), ColumnRule("y", "y", DENSE, "<f4"),
         ColumnRule("a", "a", ID, "<i8", table_size=5)]

INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64()]
hex_keys = st.integers(0, 2**32 - 1).flatmap(lambda k: st.sampled_from([f"{k:08x}", f"{k:08X}"]))
texts = st.one_of(st.none(), st.just(""), hex_keys, st.sampled_from(["68fd1e6", "68fd1e6g", "68fd1e640", " 68fd1e6",
                                                                       "12345678", "\u00e968fd1e6"]))


@st.composite
def arrays(draw, n: int) -> pa.Array:
    """An Arrow array of n values of any of the types a client may send for these rules."""
    kind = draw(st.sampled_from(["int", "float", "string", "large_string", "bool", "null"]))
    if kind == "int":
        t = draw(st.sampled_from(INT_TYPES))
        unsigned = pa.types.is_unsigned_integer(t)
        lo, hi = (0, 2**t.bit_width - 1) if unsigned else (-(2 ** (t.bit_width - 1)), 2 ** (t.bit_width - 1) - 1)
        small = st.integers(max(lo, -10), min(hi, 10))
        vals = draw(st.lists(st.one_of(st.none(), small, st.integers(lo, hi)), min_size=n, max_size=n))
        return pa.array(vals, t)
    if kind == "float":
        vals = draw(st.lists(st.one_of(st.none(), st.floats(-10, 10), st.floats(allow_nan=True), st.just(3.0),
                                       st.just(1e39)),
                             min_size=n, max_size=n))
        return pa.array(vals, draw(st.sampled_from([pa.float64(), pa.float32()])))
    if kind in ("string", "large_string"):
        return pa.array(draw(st.lists(texts, min_size=n, max_size=n)), getattr(pa, kind)())
    if kind == "bool":
        return pa.array(draw(st.lists(st.one_of(st.none(), st.booleans()), min_size=n, max_size=n)), pa.bool_())
    return pa.nulls(n)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_arrow_fast_path_gives_the_per_value_readers_values(data):
    n = data.draw(st.integers(0, 5))
    columns = {r.column: data.draw(arrays(n)) for r in RULES}
    got = arrow_columns(RULES, columns)
    for r in RULES:
        expected = slow(r, columns[r.column].to_pylist())
        if r.column in got:
            assert expected is not None, (r.column, columns[r.column])  # never a column holding a refused value
            assert len(got[r.column]) == n
            assert same(got[r.column], expected, r), (r.column, columns[r.column], got[r.column], expected)


def test_usual_columns_take_the_fast_path():
    columns = {"I1": pa.array([3, None, -2]), "I2": pa.array([0, 7, 10**17]),
               "C1": pa.array(["68fd1e64", None, ""]), "C2": pa.array(["ABCDEF01", "0a0b0c0d", "ffffffff"]),
               "x": pa.array([1.5, None, 2.0]), "y": pa.array([1, None, 2], pa.int16()), "a": pa.array([0, 4, None])}
    got = arrow_columns(RULES, columns)
    assert set(got) == {r.column for r in RULES}
    assert got["I1"].tolist() == [3, 0, -2] and got["C1"].tolist() == [0x68FD1E64, -1, -1]
    assert got["C2"].tolist() == [0xABCDEF01, 0x0A0B0C0D, 0xFFFFFFFF] and got["a"].tolist() == [0, 4, 0]
    assert got["x"].dtype == np.float64 and math.isnan(got["x"][1]) and got["y"].tolist() == [1, 0, 2]
    # one bad value leaves out its column only: the hex columns decoded together fall back to one at a time
    got = arrow_columns(RULES, {**columns, "C2": pa.array(["ABCDEF01", "1234567", None]), "y": pa.array([1.0, 1e39, None])})
    assert "C2" not in got and "y" not in got and {"C1", "I1", "x"} <= set(got)
    # a float NaN (a value, not a null) is refused by the dense reader, so it never rides a null's NaN
    assert "x" not in arrow_columns(RULES, {**columns, "x": pa.array([float("nan"), None, 1.5])})
    # text counts, float counts and a uint64 beyond int64 go value by value
    for odd in (pa.array(["3", "", "4"]), pa.array([3.0, None, 4.0]), pa.array([2**64 - 1, 0, 1], pa.uint64())):
        assert "I1" not in arrow_columns(RULES, {**columns, "I1": odd})


def test_a_null_holding_bytes_is_still_missing():
    """Arrow lets a writer leave bytes under a null string; such a column is read value by value (null: -1)."""
    data = pa.py_buffer(b"68fd1e64" b"ABCDEF01" b"00000001")
    offsets = pa.py_buffer(np.array([0, 8, 16, 24], np.int32).tobytes())
    validity = pa.py_buffer(np.packbits([1, 0, 1], bitorder="little").tobytes())
    col = pa.Array.from_buffers(pa.string(), 3, [validity, offsets, data], null_count=1)
    assert col.to_pylist() == ["68fd1e64", None, "00000001"]
    got = arrow_columns(RULES[2:3], {"C1": col})
    assert "C1" not in got  # left to the per-value readers, which give -1 for the null
    assert slow(RULES[2], col.to_pylist()) == [0x68FD1E64, -1, 1]
