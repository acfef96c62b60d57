"""The server's request validation and the pipeline's encoder read values by the same column rules
(:mod:`ctrkit.data.pipeline.rules`): a row the server accepts encodes without error, and a row the encoder
refuses as bad is refused by the server at the same (row, field). Property tests over JSON-like values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctrkit.data.pipeline.feature_pipeline import DENSE_NAMES, SPARSE_NAMES, FeaturePipeline
from ctrkit.data.pipeline.rows import BadRows
from ctrkit.data.pipeline.rules import F32_MAX, HEX, ColumnRule, compile_rules
from ctrkit.data.pipeline.values import NonFinite
from ctrkit.errors import RowErrors
from ctrkit.serving.validation import RowValidator, to_arrays

SPEC = {"label": "label", "dense": ["x", {"name": "y", "transform": "log"}, {"name": "z", "transform": "standardize"}],
        "sparse": ["u", {"name": "tags", "multi_valued": True}]}

numbers = st.one_of(st.integers(-10**6, 10**6), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([1e39, -1e39, F32_MAX, 3.5e38, 1e308]))
numeric_text = st.one_of(
    numbers.map(str), st.from_regex(r"\A[ \t]?[-+]?[0-9]{0,3}\.?[0-9]{0,3}([eE][-+]?[0-9]{1,3})?[ \t]?\Z"),
    st.sampled_from(["", " ", "nan", "inf", "1e400", "0x10", "1_000", "\u0663", "\x0b", "\x1c", "1 2", "\ud800"]))
hex_text = st.one_of(st.from_regex(r"\A[0-9a-fA-F]{8}\Z"), st.from_regex(r"\A[0-9a-gA-G+ -]{6,9}\Z"),
                     st.sampled_from(["", "\u0668\u0668fd1e64", "68fd1e6\u00e9"]))
text = st.text(max_size=6)
scalars = st.one_of(st.none(), st.booleans(), numbers, numeric_text, text,
                    st.sampled_from([NonFinite("NaN"), NonFinite("Infinity")]))
values = st.one_of(scalars, st.lists(st.one_of(st.none(), st.integers(-5, 5), text, st.floats(0, 3)), max_size=3),
                   st.just({"a": 1}))


def fitted_table() -> FeaturePipeline:
    rows = [{"label": i % 2, "x": i, "y": i, "z": i / 2, "u": f"u{i % 3}", "tags": "a|b" if i % 2 else "c"}
            for i in range(12)]
    return FeaturePipeline.table(SPEC).fit(rows)


def fitted_criteo() -> FeaturePipeline:
    rows = [{"label": i % 2, **{n: i for n in DENSE_NAMES}, **{c: f"{i * 7919:08x}" for c in SPARSE_NAMES}}
            for i in range(8)]
    return FeaturePipeline.criteo().fit(rows)


PIPELINES = {"table": fitted_table(), "criteo": fitted_criteo()}


def server_errors(validator: RowValidator, rows: list[dict]) -> tuple[set[tuple[int, str | None]], dict | None]:
    """(the (row, field) the server refuses, its canonical columns when it accepts every row)."""
    try:
        checked = validator.check(rows, max_errors=10**6)
    except RowErrors as e:
        return {(p.row, p.field) for p in e.problems}, None
    return set(), checked.columns


def encoder_errors(pipeline: FeaturePipeline, rows: list[dict]) -> set[tuple[int, str | None]]:
    """(0-based row, raw column) of every problem the encoder finds reading each raw row itself (alone: in a
    chunk, a column of mixed JSON types is read as text, which is why the server sends canonical values)."""
    found = set()
    for i, row in enumerate(rows):
        bad = BadRows("rows")
        pipeline.encode([row], bad=bad)
        found |= {(i, p.field) for p in bad.problems}
    return found


def check_agreement(kind: str, fields: list[str], data: st.DataObject) -> None:
    pipeline = PIPELINES[kind]
    validator = RowValidator(pipeline)
    n = data.draw(st.integers(1, 4))
    base = {r.column: None for r in validator.rules}
    rows = [{**base, **{f: data.draw(values) for f in fields}} for _ in range(n)]
    refused, columns = server_errors(validator, rows)
    if columns is not None:  # accepted: the canonical columns encode without a bad row
        pipeline.encode(to_arrays(validator.rules, columns))
    found = encoder_errors(pipeline, [{k: (math.nan if isinstance(v, NonFinite) else v) for k, v in r.items()}
                                      for r in rows])
    assert found <= refused, f"the encoder refuses {sorted(found - refused)} that the server accepts: {rows}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_table_rules_agree(data):
    check_agreement("table", ["x", "y", "z", "u", "tags"], data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_criteo_rules_agree(data):
    fields = ["I1", "I2", "C1", "C2"]
    pipeline = PIPELINES["criteo"]
    validator = RowValidator(pipeline)
    n = data.draw(st.integers(1, 4))
    base = {r.column: None for r in validator.rules}
    rows = [{**base, **{f: data.draw(st.one_of(values, hex_text) if f[0] == "C" else values) for f in fields}}
            for _ in range(n)]
    refused, columns = server_errors(validator, rows)
    if columns is not None:
        pipeline.encode(to_arrays(validator.rules, columns))
    raw = [{k: (math.nan if isinstance(v, NonFinite) else v) for k, v in r.items()} for r in rows]
    # the encoder takes integers in a Criteo key column as keys already decoded (the block parser's output)
    found = {(r, f) for r, f in encoder_errors(pipeline, raw) if f}
    assert found <= refused, f"the encoder refuses {sorted(found - refused)} that the server accepts: {rows}"


def test_the_rules_are_compiled_once_from_the_spec():
    p = PIPELINES["table"]
    assert p.rules is p.rules
    assert [(r.name, r.column, r.kind, r.dtype, r.transform) for r in p.rules.dense] == [
        ("x", "x", "dense", "<f4", "none"), ("y", "y", "dense", "<f4", "log"), ("z", "z", "dense", "<f8", "standardize")]
    assert p.rules.single[0].kind == "category" and p.rules.multi[0].kind == "tokens"
    assert [r.column for r in RowValidator(p).rules] == p.input_columns(optional=False)
    assert all(r.kind == HEX for r in PIPELINES["criteo"].rules.single)
    assert p.rules.dense[1].bound == math.inf and p.rules.dense[0].bound == F32_MAX


def test_a_strict_encode_raises_structured_problems():
    p = PIPELINES["table"]
    rows = [{"label": 1, "x": "1", "y": 0, "z": 0, "u": "a", "tags": "b"},
            {"label": 5, "x": "one", "y": 0, "z": 0, "u": "a", "tags": "b"}]
    with pytest.raises(RowErrors, match="row 2: label 'label' is not 0 or 1; dense 'x' is not a number") as e:
        p.encode(rows)
    assert [(q.row, q.field) for q in e.value.problems] == [(2, "label"), (2, "x")]


def test_ids_rules_carry_table_sizes():
    from conftest import contract_schema

    schema = contract_schema()
    p = FeaturePipeline.from_schema(schema)
    sizes = {t: s.num_embeddings for t, s in schema.tables().items()}
    assert compile_rules(p.spec, "ids", p.table_of, sizes) == p.rules
    assert all(isinstance(r, ColumnRule) and r.table_size == sizes[r.table] for r in p.rules.single)
    assert np.all([r.kind in ("id", "id_tokens") for r in p.rules.inputs if r.kind != "dense"])
