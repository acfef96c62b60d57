"""The whole-column fast path of request validation (:mod:`ctrkit.data.pipeline.json_columns`) gives exactly
the canonical values of the per-value readers (:mod:`ctrkit.data.pipeline.values`), and never a column holding
a value those readers refuse; well-formed columns of the usual JSON types do take it."""

from __future__ import annotations

import numpy as np
from column_readers import same, slow
from hypothesis import given, settings
from hypothesis import strategies as st

from ctrkit.data.pipeline.json_columns import fast_columns
from ctrkit.data.pipeline.rules import CATEGORY, COUNT, DENSE, HEX, ID, ColumnRule, decode_hex8
from ctrkit.data.pipeline.values import NonFinite

RULES = [ColumnRule("i1", "I1", COUNT, "<f4", transform="log"), ColumnRule("i2", "I2", COUNT, "<f4", transform="log"),
         ColumnRule("c1", "C1", HEX, "<u4"), ColumnRule("c2", "C2", HEX, "<u4"),
         ColumnRule("x", "x", DENSE, "<f4"), ColumnRule("u", "u", CATEGORY, "<i8"),
         ColumnRule("a", "a", ID, "<i8", table_size=5), ColumnRule("b", "b", ID, "<i8", table_size=50)]

hex_keys = st.integers(0, 2**32 - 1).flatmap(lambda k: st.sampled_from([f"{k:08x}", f"{k:08X}"]))
odd = st.one_of(st.booleans(), st.floats(allow_nan=True), st.integers(), st.text(max_size=9),
                st.sampled_from([NonFinite("NaN"), [1], {"a": 1}, "", "0x12abcd", "68fd1e6g", "68fd1e6\u00e9",
                                 "\ud800abcdefg", 2**63, 2.0, "12345678", 1e39, "5"]))
near = {COUNT: st.sampled_from([10**18, -(10**18), 2.0, -1.5, "-1", True]),  # just beyond each kind's rule
        HEX: st.sampled_from(["68fd1e6", "68fd1e640", "68fd 1e6", "68FD1E6G", 12345678, " 68fd1e6"]),
        DENSE: st.sampled_from([1e39, -3.5e38, 2**1024, True, "3", NonFinite("Infinity")]),
        CATEGORY: st.sampled_from(["\ud800", "\u00e9t\u00e9", 3, 2.0, 2.5, False]),
        ID: st.sampled_from([5, 50, -1, 1.0, True, "1"])}
usual = {COUNT: st.one_of(st.none(), st.integers(-(10**18) + 1, 10**18 - 1)),
         HEX: st.one_of(st.none(), st.just(""), hex_keys),
         DENSE: st.one_of(st.none(), st.integers(-(2**40), 2**40), st.floats(-1e30, 1e30)),
         CATEGORY: st.one_of(st.none(), st.text("abc", max_size=3)),
         ID: st.one_of(st.none(), st.integers(0, 4))}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_fast_path_gives_the_per_value_readers_values(data):
    n = data.draw(st.integers(0, 5))
    values = {}
    for r in RULES:
        column = data.draw(st.lists(usual[r.kind], min_size=n, max_size=n))
        if n and data.draw(st.booleans()):  # one value that is not the usual well-formed kind
            column[data.draw(st.integers(0, n - 1))] = data.draw(st.one_of(near[r.kind], odd))
        values[r.column] = tuple(column)
    got = fast_columns(RULES, values)
    for r in RULES:
        expected = slow(r, list(values[r.column]))
        if r.column in got:
            assert expected is not None, (r.column, values[r.column])  # never a column holding a refused value
            assert len(got[r.column]) == n
            assert same(got[r.column], expected, r), (r.column, values[r.column], got[r.column], expected)


def test_well_formed_columns_take_the_fast_path():
    values = {"I1": (3, None, -2), "I2": (0, 7, 10**17), "C1": ("68fd1e64", None, ""), "C2": ("ABCDEF01", "0a0b0c0d",
              "ffffffff"), "x": (1, None, 2), "u": ("a", None, "b"), "a": (0, 4, None), "b": (49, None, 1)}
    got = fast_columns(RULES, values)
    assert set(got) == {r.column for r in RULES}
    assert got["I1"].tolist() == [3, 0, -2] and got["C1"].tolist() == [0x68FD1E64, -1, -1]
    assert got["C2"].tolist() == [0xABCDEF01, 0x0A0B0C0D, 0xFFFFFFFF] and got["b"].tolist() == [49, 0, 1]
    # one bad value leaves out its column only; the others of its kind stay on the fast path
    got = fast_columns(RULES, {**values, "C2": ("ABCDEF01", 12345678, "ffffffff"), "I1": (3, 2.5, 1)})
    assert "C2" not in got and "I1" not in got and {"C1", "I2"} <= set(got)
    # a float NaN (not JSON, but a caller's) is refused by the dense reader, so it never rides a null's NaN
    assert "x" not in fast_columns(RULES, {**values, "x": (float("nan"), None, 1.5)})
    assert fast_columns(RULES, {**values, "x": (2.5, None, 1.5)})["x"].tolist()[::2] == [2.5, 1.5]


def test_decode_hex8_names_the_keys_that_are_not_hex():
    raw = np.frombuffer(b"68fd1e64" b"68fd1e6g" b"ABCDEF01" b"68fd 1e6", np.uint8).reshape(-1, 8)
    keys, ok = decode_hex8(raw)
    assert ok.tolist() == [True, False, True, False]
    assert keys.tolist() == [int("68fd1e64", 16), -1, 0xABCDEF01, -1]
    assert decode_hex8(raw[[0, 2]])[0].tolist() == [int("68fd1e64", 16), 0xABCDEF01]
