"""Property-based fuzzing of the raw-input paths: the Criteo block parser and preprocessor on malformed lines,
and the FeaturePipeline on malformed rows. Bad input may only ever raise DataError; every well-formed line /
row comes out exactly as it does without the malformed ones around it; no dense value is ever non-finite."""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ctrkit.data.pipeline.criteo_parse import NUM_DENSE, NUM_FIELDS, parse_block
from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.pipeline.rows import BadRows
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ_FILES = settings(FUZZ, max_examples=40)  # two preprocessing runs per example


# ---- Criteo lines ---------------------------------------------------------------------------------------------
@st.composite
def good_line(draw: st.DrawFn) -> bytes:
    """A well-formed Criteo line (40 fields), with either line ending."""
    label = draw(st.sampled_from(["0", "1"]))
    dense = draw(st.lists(st.one_of(st.just(""), st.integers(-(10**17), 10**17).map(str)),
                          min_size=NUM_DENSE, max_size=NUM_DENSE))
    hexes = st.text("0123456789abcdefABCDEF", min_size=8, max_size=8)
    cats = draw(st.lists(st.one_of(st.just(""), hexes, st.sampled_from(["68fd1e64", "80e26c9b", "0000000a"])),
                         min_size=NUM_FIELDS - 1 - NUM_DENSE, max_size=NUM_FIELDS - 1 - NUM_DENSE))
    return "\t".join([label, *dense, *cats]).encode()


@st.composite
def bad_line(draw: st.DrawFn) -> bytes:
    """A line that is malformed by construction: a wrong field count, random bytes, or one bad field."""
    how = draw(st.sampled_from(["count", "bytes", "label", "dense", "cat", "bom"]))
    if how == "bytes":
        b = draw(st.binary(min_size=1, max_size=120)).replace(b"\n", b"")
        b = b or b"\x00"
        return b + b"\t" if b.count(b"\t") == NUM_FIELDS - 1 else b
    if how == "count":
        n = draw(st.integers(1, 60).filter(lambda k: k != NUM_FIELDS))
        line = b"\t".join(draw(st.lists(st.sampled_from([b"", b"1", b"abc", b"68fd1e64", b"-5"]), min_size=n,
                                        max_size=n)))
        return line or b"1"  # an empty line is blank, not bad
    fields = draw(good_line()).rstrip(b"\r").split(b"\t")
    if how == "bom":
        fields[0] = b"\xef\xbb\xbf" + fields[0]  # a BOM anywhere but the start of the file is bad
    elif how == "label":
        fields[0] = draw(st.sampled_from([b"", b"2", b"-1", b"01", b"x", b"1.0", b"\xff"]))
    elif how == "dense":
        j = draw(st.integers(1, NUM_DENSE))
        fields[j] = draw(st.sampled_from([b"1e400", b"1.5", b"abc", b"-", b"+3", b"--2", b"0x10", b"inf", b"nan",
                                          b"1" * 19, b"9" * 30, b"-" + b"9" * 25, b" 1", b"\xc3\xa9"]))
    else:
        j = draw(st.integers(NUM_DENSE + 1, NUM_FIELDS - 1))
        fields[j] = draw(st.sampled_from([b"68fd1e6", b"68fd1e645", b"68fd1e6g", b"0x68fd1e", b"-1234567",
                                          b"68fd 1e6", b"\xe2\x82\xac1234567"[:8]]))
    return b"\t".join(fields)


lines_st = st.lists(st.one_of(good_line().map(lambda b: ("good", b)),
                              good_line().map(lambda b: ("good", b + b"\r")),
                              bad_line().map(lambda b: ("bad", b)),
                              st.just(("blank", b""))), min_size=1, max_size=40)


_DENSE_RE = re.compile(rb"-?[0-9]{1,18}")
_HEX_RE = re.compile(rb"[0-9a-fA-F]{8}")


def naive_kind(line: bytes) -> str:
    """'blank', 'good' or 'bad' by the rules of criteo_parse, one field at a time."""
    if not line:
        return "blank"
    f = line.removesuffix(b"\r").split(b"\t")
    ok = (len(f) == NUM_FIELDS and f[0] in (b"0", b"1")
          and all(not v or _DENSE_RE.fullmatch(v) for v in f[1:1 + NUM_DENSE])
          and all(not v or _HEX_RE.fullmatch(v) for v in f[1 + NUM_DENSE:]))
    return "good" if ok else "bad"


def naive_parse(line: bytes) -> tuple[float, list[int], list[int]]:
    f = line.rstrip(b"\r").decode().split("\t")
    return (float(f[0]), [int(v) if v else 0 for v in f[1:1 + NUM_DENSE]],
            [int(v, 16) if v else -1 for v in f[1 + NUM_DENSE:]])


@FUZZ
@given(lines=lines_st)
def test_parse_block_keeps_exactly_the_well_formed_lines(lines: list[tuple[str, bytes]]) -> None:
    assert [kind for kind, _ in lines] == [naive_kind(b) for _, b in lines]  # the generators do what they say
    blk = parse_block(b"\n".join(b for _, b in lines) + b"\n")
    good = [i for i, (kind, _) in enumerate(lines) if kind == "good"]
    assert blk.line.tolist() == good
    bad_idx = sorted(int(i) for idx, _ in blk.bad for i in idx)
    assert bad_idx == [i for i, (kind, _) in enumerate(lines) if kind == "bad"]
    assert blk.empty_lines == sum(kind == "blank" for kind, _ in lines) and blk.n_lines == len(lines)
    for row, i in enumerate(good):
        label, dense, keys = naive_parse(lines[i][1])
        assert blk.label[row] == label
        assert blk.raw_dense[row].tolist() == dense and blk.keys[row].tolist() == keys


@FUZZ_FILES
@given(lines=lines_st, bom=st.booleans(), gz=st.booleans())
def test_preprocess_criteo_keeps_the_well_formed_lines(lines: list[tuple[str, bytes]], bom: bool, gz: bool) -> None:
    import gzip

    data = (b"\xef\xbb\xbf" if bom else b"") + b"\n".join(b for _, b in lines) + b"\n"
    body = data.removeprefix(b"\xef\xbb\xbf").split(b"\n")[:-1]  # one BOM at the start is stripped
    kinds = [naive_kind(b) for b in body]
    good = [b for kind, b in zip(kinds, body) if kind == "good"]
    n_bad = kinds.count("bad")
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "mixed.tsv"
        src.write_bytes(gzip.compress(data) if gz else data)
        try:
            res = preprocess_criteo(src, Path(d) / "o", split="1,0,0", max_bad_fraction=1.0, shuffle=False,
                                    progress=False)
        except DataError as e:
            assert not good and "no rows" in str(e)
            return
        if not good:
            assert res == {}
            return
        ref_src = Path(d) / "good.tsv"
        ref_src.write_bytes(b"\n".join(good) + b"\n")
        ref = preprocess_criteo(ref_src, Path(d) / "r", split="1,0,0", shuffle=False, progress=False)
        got, want = Store(res["train"]), Store(ref["train"])
        assert got.num_rows == len(good) and got.stats["bad_rows"] == n_bad
        for c in want.columns():
            np.testing.assert_array_equal(np.asarray(got[c]), np.asarray(want[c]), err_msg=c)
            if c in want.columns("dense"):
                assert np.isfinite(np.asarray(got[c])).all()


# ---- FeaturePipeline rows -----------------------------------------------------------------------------------------
SPEC = {"label": "y", "weight": "w", "group_id": "g", "split_column": "part",
        "dense": [{"name": "x"}, {"name": "l", "transform": "log"}, {"name": "s", "transform": "standardize"}],
        "sparse": [{"name": "c"}, {"name": "n"}, {"name": "tags", "multi_valued": True, "delimiter": "|"}],
        "sequence": [{"name": "hist", "shares": "c", "max_len": 3, "delimiter": "|"}]}
KEYS = ["y", "w", "g", "part", "x", "l", "s", "c", "n", "tags", "hist"]
WORDS = ["a", "b", "c", "dd", "é", "日本"]
words = st.sampled_from(WORDS)
finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@st.composite
def good_row(draw: st.DrawFn) -> dict[str, Any]:
    return {"y": draw(st.sampled_from([0, 1])), "w": draw(st.floats(0.1, 10.0)), "g": draw(words),
            "part": draw(st.sampled_from(["train", "valid", "test"])), "x": draw(finite),
            "l": draw(st.one_of(st.integers(0, 10**6), st.floats(0, 1e6))), "s": draw(finite),
            "c": draw(words), "n": draw(st.integers(0, 50)),
            "tags": "|".join(draw(st.lists(words, max_size=4))), "hist": "|".join(draw(st.lists(words, max_size=5)))}


junk = st.one_of(
    st.none(), st.just(math.nan), st.just(math.inf), st.just(-math.inf), st.just(1e400), st.just(-3.5e38),
    st.integers(-(10**30), 10**30), st.floats(), st.booleans(), st.text(max_size=12), st.binary(max_size=8),
    st.sampled_from(["nan", "NaN", "inf", "-Infinity", "1e400", "1e39", " 7 ", "", "train ", "0x1f", "ﬁ", "\x00",
                     "a|b||c", "|", "1,5"]),
    st.lists(st.one_of(st.integers(-5, 5), st.text(max_size=3)), max_size=3),
    st.lists(st.lists(st.integers(0, 3), max_size=2), max_size=2),
    st.dictionaries(st.sampled_from(["k", "v"]), st.integers(0, 3), max_size=2),
)


@st.composite
def bad_row(draw: st.DrawFn) -> dict[str, Any]:
    """A row with some keys missing and some values replaced by junk."""
    row = draw(good_row())
    for k in draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=5, unique=True)):
        if draw(st.booleans()):
            del row[k]
        else:
            row[k] = draw(junk)
    return row


def fitted() -> FeaturePipeline:
    rows = [{"y": i % 2, "w": 1.0, "g": f"u{i % 3}", "part": "train", "x": float(i), "l": i * 10, "s": i * 0.5,
             "c": WORDS[i % 4], "n": i % 7, "tags": "a|b" if i % 2 else "c", "hist": "a|b|c|dd"} for i in range(12)]
    return FeaturePipeline.table(SPEC).fit(rows)


PIPE = fitted()


def assert_finite(out: dict[str, Any]) -> None:
    for e in (*SPEC["dense"], {"name": "w"}):
        if e["name"] in out:
            a = np.asarray(out[e["name"]])
            assert a.dtype == np.float32 and np.isfinite(a).all(), e["name"]


@FUZZ
@given(rows=st.lists(st.one_of(good_row().map(lambda r: ("good", r)), bad_row().map(lambda r: ("bad", r))),
                     min_size=1, max_size=12))
def test_pipeline_on_malformed_rows(rows: list[tuple[str, dict[str, Any]]]) -> None:
    raw = [r for _, r in rows]
    good = [i for i, (kind, _) in enumerate(rows) if kind == "good"]
    bad = BadRows("rows")
    try:
        enc = PIPE.encode(raw, bad=bad)
    except DataError as e:  # a column no row holds is an error, never a crash
        assert "lack the columns" in str(e)
        assume(False)
    assert bad.bad == len(raw) - len(enc) and len({n for n, _ in bad.first}) == len(bad.first)
    out = PIPE.finalize(enc.parts())
    assert_finite(out)
    kept = enc.keep.tolist()
    assert set(good) <= set(kept)
    if good:
        want = PIPE.finalize(PIPE.encode([raw[i] for i in good]).parts())
        pos = [kept.index(i) for i in good]
        for k, v in want.items():
            if isinstance(v, tuple):  # jagged: compare row by row
                offs = np.concatenate([[0], np.cumsum(out[k][1])])
                got_rows = [out[k][0][offs[p]:offs[p + 1]].tolist() for p in pos]
                woffs = np.concatenate([[0], np.cumsum(v[1])])
                assert got_rows == [v[0][woffs[j]:woffs[j + 1]].tolist() for j in range(len(good))], k
            else:
                np.testing.assert_array_equal(np.asarray(out[k])[pos], v, err_msg=k)
    try:  # strict mode: the first bad row is an error naming it
        assert_finite(PIPE.transform(raw))
    except DataError as e:
        assert "row" in str(e)


@FUZZ
@given(rows=st.lists(bad_row(), min_size=1, max_size=8), kind=st.sampled_from(["list", "frame", "columns"]))
def test_pipeline_inputs_of_every_form_raise_only_data_errors(rows: list[dict[str, Any]], kind: str) -> None:
    import pandas as pd

    if kind == "list":
        raw: Any = rows
    else:
        frame = pd.DataFrame(rows)
        raw = frame if kind == "frame" else {c: frame[c].to_numpy() for c in frame.columns}
    try:
        enc = PIPE.encode(raw, bad=BadRows("rows"))
    except DataError:
        return
    assert_finite(PIPE.finalize(enc.parts()))


@pytest.mark.parametrize("column, value", [("part", 0), ("tags", 0), ("hist", 7)])
def test_integer_numpy_columns_read_as_text_where_text_is_expected(column: str, value: int) -> None:
    """Crashes the fuzzer found: a dict of numpy columns keeps an integer column as numpy (the Criteo fast
    path), which the split column's and the multi-valued columns' text readers took for a pyarrow array."""
    rows = [{**clean_row(i), column: value} for i in range(3)]
    cols = {k: np.asarray([r[k] for r in rows]) for k in rows[0]}
    assert cols[column].dtype.kind == "i"
    bad = BadRows("rows")
    try:
        enc = PIPE.encode(cols, bad=bad)
    except DataError as e:  # the split column's integer is no split name: named, not a crash
        assert column == "part" and "part" in str(e)
        return
    assert_finite(PIPE.finalize(enc.parts()))
    assert len(enc) + bad.bad == 3


def clean_row(i: int) -> dict[str, Any]:
    return {"y": i % 2, "w": 1.0, "g": "u0", "part": "train", "x": 1.0, "l": 3, "s": 0.5, "c": "a", "n": 2,
            "tags": "a|b", "hist": "a|b"}


@pytest.mark.parametrize("value", [{"k": 1}, [1, 2], [[1]], b"\xff"])
def test_nested_values_in_every_column_are_bad_rows(value: Any) -> None:
    """Crashes the fuzzer found (pyarrow cannot cast a list or struct column to text): a column whose only
    values are lists, mappings or bytes. A list is a value only in a multi-valued or sequence column."""
    for k in KEYS:
        bad = BadRows("rows")
        enc = PIPE.encode([{**clean_row(i), k: value} for i in range(2)], bad=bad)
        assert_finite(PIPE.finalize(enc.parts()))
        fine = k in ("tags", "hist") and value == [1, 2]
        assert bad.bad == (0 if fine else 2), (k, bad.first)
        assert fine or f"'{k}'" in bad.first[0][1]


CRITEO_KEYS = ["label", *(f"I{j}" for j in range(1, 14)), *(f"C{j}" for j in range(1, 27))]


@FUZZ
@given(rows=st.lists(st.dictionaries(st.sampled_from(CRITEO_KEYS), st.one_of(junk, st.just("68fd1e64"), st.just("7")),
                                     min_size=1), min_size=1, max_size=6))
def test_criteo_pipeline_on_malformed_rows(rows: list[dict[str, Any]]) -> None:
    row = {"label": "1", **{f"I{j}": str(j) for j in range(1, 14)}, **{f"C{j}": "68fd1e64" for j in range(1, 27)}}
    raw = [row, *({**row, **r} for r in rows)]
    try:
        enc = CRITEO_PIPE.encode(raw, bad=BadRows("rows"))
    except DataError:
        return
    out = CRITEO_PIPE.finalize(enc.parts())
    assert 0 in enc.keep.tolist() and all(np.isfinite(out[f"I{j}"]).all() for j in range(1, 14))


CRITEO_PIPE = FeaturePipeline.criteo().fit([{"label": "0", **{f"I{j}": "1" for j in range(1, 14)},
                                             **{f"C{j}": "68fd1e64" for j in range(1, 27)}}])
