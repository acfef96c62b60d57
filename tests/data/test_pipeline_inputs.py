"""FeaturePipeline inputs as other libraries hand them over (pandas >= 3 / Polars large_string, Parquet
dictionaries and integer ids, numpy dicts), GAUC groups of new users, dense statistics with a large offset,
and the multi-hot stage beside multi-valued features: each case against the plain-string / naive answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ctrkit.data.pipeline.feature_pipeline import UNSEEN_GROUP_BASE, FeaturePipeline
from ctrkit.data.sources.table import preprocess_table
from ctrkit.data.storage.agree import check_same_vocabulary
from ctrkit.data.storage.fitted import pipeline_from_store
from ctrkit.data.storage.store import Store

CRITEO_ROWS = [
    {"label": 1, **{f"I{i}": i for i in range(1, 14)}, **{f"C{i}": f"{i:08x}" for i in range(1, 27)}},
    {"label": 0, **{f"I{i}": None for i in range(1, 14)}, **{f"C{i}": None for i in range(1, 27)}},
    {"label": 0, **{f"I{i}": 2 * i for i in range(1, 14)}, **{f"C{i}": "0000abcd" for i in range(1, 27)}},
]
TABLE_SPEC = {"label": "label", "dense": [{"name": "x", "transform": "standardize"}],
              "sparse": ["c", {"name": "tags", "multi_valued": True, "delimiter": "|"}],
              "sequence": [{"name": "hist", "shares": "c", "max_len": 3}]}
TABLE_ROWS = [{"label": 1, "x": 1.5, "c": "p", "tags": "a| b", "hist": "p|q"},
              {"label": 0, "x": None, "c": "q", "tags": "", "hist": ""},
              {"label": 1, "x": 4.0, "c": None, "tags": "b||c", "hist": "q|r|p|q"}]


def same_columns(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        if isinstance(v, tuple):
            assert [a.tolist() for a in got[k]] == [a.tolist() for a in v], k
        else:
            np.testing.assert_array_equal(got[k], v, err_msg=k)


def retyped(table: pa.Table, how: str) -> pa.Table:
    """``table`` with its string columns as large_string (pandas >= 3, Polars), dictionary-encoded
    (pandas categoricals, Parquet dictionaries) or split into several chunks."""
    cols = {}
    for name in table.column_names:
        c = table.column(name)
        if pa.types.is_string(c.type):
            if how == "large_string":
                c = c.cast(pa.large_string())
            elif how == "dictionary":
                c = pa.chunked_array([ch.dictionary_encode() for ch in c.chunks])
        if how == "chunked":
            c = pa.chunked_array([c.combine_chunks().slice(0, 1), c.combine_chunks().slice(1)])
        cols[name] = c
    return pa.table(cols)


@pytest.mark.parametrize("how", ["large_string", "dictionary", "chunked"])
def test_criteo_rows_of_any_string_layout_give_the_same_ids(how):
    pipe = FeaturePipeline.criteo().fit(CRITEO_ROWS)
    want = pipe.transform(pa.Table.from_pylist(CRITEO_ROWS))
    same_columns(pipe.transform(retyped(pa.Table.from_pylist(CRITEO_ROWS), how)), want)
    assert want["C2"].tolist() == [2, 0, 3]  # first appearance from 2, missing 0


@pytest.mark.parametrize("how", ["large_string", "dictionary", "chunked"])
def test_table_rows_of_any_string_layout_give_the_same_ids(how):
    pipe = FeaturePipeline.table(TABLE_SPEC).fit(TABLE_ROWS)
    want = pipe.transform(pa.Table.from_pylist(TABLE_ROWS))
    same_columns(pipe.transform(retyped(pa.Table.from_pylist(TABLE_ROWS), how)), want)
    values, lengths = want["tags"]
    assert values.tolist() == [2, 3, 3, 4] and lengths.tolist() == [2, 0, 2]  # trimmed, empty tokens dropped


def test_a_dict_of_numpy_columns_reads_like_the_rows():
    pipe = FeaturePipeline.table(TABLE_SPEC).fit(TABLE_ROWS)
    want = pipe.transform(TABLE_ROWS)
    cols = {"label": np.array([1, 0, 1]), "x": np.array([1.5, np.nan, 4.0]),
            "c": np.array(["p", "q", None], dtype=object), "tags": np.array(["a| b", "", "b||c"]),
            "hist": np.array(["p|q", "", "q|r|p|q"])}
    same_columns(pipe.transform(cols), want)
    ids = FeaturePipeline.table({"label": "label", "sparse": ["u"]}).fit([{"label": 0, "u": 5}, {"label": 1, "u": 6}])
    got = ids.transform({"u": np.array([5.0, np.nan, 6.0, 7.0])})["u"]  # float ids with NaN (a DataFrame column)
    assert got.tolist() == [2, 0, 3, 1]


def test_no_rows_is_zero_rows():
    pipe = FeaturePipeline.table(TABLE_SPEC).fit(TABLE_ROWS)
    cols = pipe.transform([])
    assert len(cols["c"]) == 0 and len(cols["x"]) == 0 and len(cols["tags"][1]) == 0
    assert len(pipe.to_batch(cols)) == 0


def test_integer_ids_fitted_on_parquet_are_found_from_text(tmp_path: Path):
    """A table fitted on Parquet integer ids, scored from a CSV read as text or from dict rows."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"label": [0, 1, 0, 1], "u": pa.array([5, 6, 7, None], pa.int64())}), path)
    stores = preprocess_table(path, {"label": "label", "sparse": ["u"]}, tmp_path / "st", split="1")
    pipe = pipeline_from_store(stores["train"])
    got = pipe.transform([{"u": "5"}, {"u": " 6 "}, {"u": ""}, {"u": "abc"}, {"u": "5.7"}, {"u": "8"}, {"u": None}])
    assert got["u"].tolist() == [2, 3, 0, 1, 1, 1, 0]  # text of a known id -> its id; empty -> 0; other -> 1
    assert pipe.transform([{"u": 5.0}, {"u": 7}])["u"].tolist() == [2, 4]


def test_new_users_keep_their_own_gauc_groups_under_vocab_from(tmp_path: Path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    pacsv.write_csv(pa.table({"label": [0, 1, 1, 0], "r": [0, 1, 2, 3], "g": ["u1", "u1", "u2", "u2"],
                              "c": ["p", "q", "p", "r"]}), a)
    raw = ["u2", "n1", "n1", "n2", "n3"]
    pacsv.write_csv(pa.table({"label": [1, 0, 1, 0, 1], "r": [0, 1, 2, 3, 4], "g": raw,
                              "c": ["q", "p", "p", "r", "q"]}), b)
    spec = {"label": "label", "group_id": "g", "dense": ["r"], "sparse": ["c"]}

    def groups(store: str) -> list[int]:  # in input order (a training store is shuffled)
        s = Store(store)
        return [g for _, g in sorted(zip(s["r"].tolist(), s[s.schema.group_id].tolist()))]

    first = preprocess_table(a, spec, tmp_path / "a_st", split="1")["train"]
    second = preprocess_table(b, spec, tmp_path / "b_st", split="1", vocab_from=first)["train"]
    got = groups(second)
    assert got[0] == groups(first)[2]  # a known user keeps the training id
    assert all(g >= UNSEEN_GROUP_BASE for g in got[1:])  # new users: ids apart from the vocabulary's
    assert got[1] == got[2] and len(set(got)) == len(set(raw))  # one group per user, as in the raw column
    again = preprocess_table(b, spec, tmp_path / "b_st2", split="1", vocab_from=first)["train"]
    assert groups(again) == got  # deterministic
    # stores whose group vocabularies differ still agree on what the model reads
    no_group = preprocess_table(b, {"label": "label", "dense": ["r"], "sparse": ["c"]}, tmp_path / "b_ng",
                                split="1", vocab_from=first)["train"]
    check_same_vocabulary(first, no_group, "data.valid")
    check_same_vocabulary(first, second, "data.valid")


def test_standardize_statistics_of_large_offsets_match_numpy():
    """Timestamps ~1.7e9 with a std of 5: E[x^2] - mean^2 cancels to nothing; the chunked update does not."""
    rng = np.random.default_rng(0)
    x = 1.7e9 + rng.normal(0, 5, 3000)
    pipe = FeaturePipeline.table({"label": "label", "dense": [{"name": "t", "transform": "standardize"}]})
    f = pipe.fitter()
    for chunk in np.array_split(x, 7):  # several chunks, as preprocessing streams them
        f.encode({"t": chunk})
        f.add_dense_stats(chunk[:, None])
    f.finish()
    assert pipe.mean_[0] == pytest.approx(x.mean(), rel=1e-15)
    assert pipe.std_[0] == pytest.approx(x.std(), rel=1e-9)
    y = pipe.transform({"t": x[:5]})["t"]
    np.testing.assert_allclose(y, (x[:5] - x.mean()) / x.std(), rtol=1e-5, atol=1e-5)


def test_multi_hot_leaves_multi_valued_features_as_they_are():
    rows = [{"label": i % 2, "u": f"u{i % 9}", "tags": "|".join(f"t{k}" for k in range(i % 6))} for i in range(40)]
    spec = {"label": "label", "sparse": ["u", {"name": "tags", "multi_valued": True}]}
    pipe = FeaturePipeline.table(spec).fit(rows).with_multi_hot(3, 5)
    assert pipe.batch_stage.expanded == [True, False]  # u (11 rows) expanded, tags (8 rows) kept
    batch = pipe.to_batch(pipe.transform(rows[:6]))
    lengths = batch.sparse.lengths.view(2, 6)
    assert lengths[0].tolist() == [3] * 6  # one id -> 3 ids
    assert lengths[1].tolist() == [0, 1, 2, 3, 4, 5]  # the tags as they were
