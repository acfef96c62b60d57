"""CSV / Parquet + YAML spec preprocessing: MovieLens-100K against naive Python, Parquet lists, bad rows."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ctrkit.data.pipeline.persist import load_pipeline
from ctrkit.data.sources.table import load_spec, preprocess_table
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError

ROOT = Path(__file__).resolve().parents[2]


def _make_csv_module():
    spec = importlib.util.spec_from_file_location("make_movielens_csv", ROOT / "examples" / "make_movielens_csv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def first_ids(values: list[str]) -> dict[str, int]:
    ids: dict[str, int] = {}
    for v in values:
        if v and v not in ids:
            ids[v] = len(ids) + 2
    return ids


def test_movielens_100k_store_matches_naive(tmp_path: Path, shared_data) -> None:
    csv = _make_csv_module().make_movielens_csv(shared_data("movielens_100k"), tmp_path / "ml.csv")
    res = preprocess_table(csv, ROOT / "examples" / "movielens_100k.yaml", tmp_path / "st", split="1",
                           block_rows=200_000)
    s = Store(res["train"])
    t = pacsv.read_csv(csv, convert_options=pacsv.ConvertOptions(
        column_types={c: pa.string() for c in ("user_id", "item_id", "gender", "genres", "hist_items", "year")},
        strings_can_be_null=False)).to_pydict()
    n = len(t["label"])
    assert s.num_rows == n == 100_000
    # naive first-appearance vocabularies; item_id's table also holds the history tokens (item first, then hist)
    users, genders = first_ids(t["user_id"]), first_ids(t["gender"])
    hist_tokens = [tok for h in t["hist_items"] for tok in h.split("|") if tok]
    items = first_ids(t["item_id"] + hist_tokens)
    genres = first_ids([g for gs in t["genres"] for g in gs.split("|") if g])
    years = first_ids(t["year"])
    want = sorted(zip(t["label"], (users[u] for u in t["user_id"]), (items[i] for i in t["item_id"]),
                      (genders[g] for g in t["gender"]), (years.get(y, 0) for y in t["year"])))
    got = sorted(zip(s["label"].astype(int).tolist(), s["user_id"].tolist(), s["item_id"].tolist(),
                     s["gender"].tolist(), s["year"].tolist()))
    assert got == want
    assert s.schema.feature("item_id").vocab_size == len(items) + 2
    assert s.stats["label_rate"] == pytest.approx(np.mean(t["label"]))
    # jagged columns row by row: genres ids and last-20 history ids through item_id's vocabulary
    vocabs = load_pipeline(res["train"]).vocabs_
    assert vocabs["item_id"].keys.tolist()[:5] == list(items)[:5]
    gv, go = s["genres"]
    hv, ho = s["hist_items"]
    uid = s["user_id"]
    inv_user = {v: k for k, v in users.items()}
    row_of = {}  # (user raw, item raw) is unique in MovieLens -> find the input row of each store row
    for i, (u, it) in enumerate(zip(t["user_id"], t["item_id"])):
        row_of[(u, it)] = i
    inv_item = {v: k for k, v in items.items()}
    for r in range(0, n, 997):
        i = row_of[(inv_user[int(uid[r])], inv_item[int(s["item_id"][r])])]
        want_g = [genres[g] for g in t["genres"][i].split("|") if g]
        assert gv[go[r]:go[r + 1]].tolist() == want_g
        want_h = [items[h] for h in t["hist_items"][i].split("|") if h][-20:]
        assert hv[ho[r]:ho[r + 1]].tolist() == want_h
    # standardized age: mean / std of the (train = all) rows
    age = np.array(t["age"], np.float64)
    ds = s.preprocessing["dense_stats"]["age"]
    assert ds["mean"] == pytest.approx(age.mean()) and ds["std"] == pytest.approx(age.std())
    assert abs(float(np.mean(s["age"]))) < 1e-4 and float(np.std(s["age"])) == pytest.approx(1.0, abs=1e-4)
    assert s.kinds["group"] == "group" and s.schema.group_id == "group"
    tables = s.schema.tables()
    assert "hist_items" in tables["item_id"].features


def test_movielens_ratio_split_and_seed(tmp_path: Path) -> None:
    df = pa.table({"label": [i % 2 for i in range(3000)], "u": [f"u{i % 50}" for i in range(3000)],
                   "x": [float(i) for i in range(3000)]})
    src = tmp_path / "t.csv"
    pacsv.write_csv(df, src)
    spec = {"label": "label", "dense": [{"name": "x"}], "sparse": [{"name": "u"}]}
    a = preprocess_table(src, spec, tmp_path / "a", split="0.7,0.15,0.15", seed=1)
    b = preprocess_table(src, spec, tmp_path / "b", split="0.7,0.15,0.15", seed=1, block_rows=333)
    sizes = {k: Store(p).num_rows for k, p in a.items()}
    assert sum(sizes.values()) == 3000 and abs(sizes["train"] - 2100) < 5 * math.sqrt(3000 * 0.21)
    for k in a:
        np.testing.assert_array_equal(Store(a[k])["x"], Store(b[k])["x"])
    xs = np.sort(np.concatenate([np.asarray(Store(p)["x"]) for p in a.values()]))
    np.testing.assert_array_equal(xs, np.arange(3000, dtype=np.float32))  # a partition of the input
    assert not np.all(np.diff(Store(a["train"])["x"]) > 0)  # train shuffled
    assert np.all(np.diff(Store(a["test"])["x"]) > 0)  # test keeps input order


def test_parquet_lists_split_column_weight_and_log(tmp_path: Path) -> None:
    tbl = pa.table({
        "y": pa.array([1, 0, 1, 0, 1, 0], pa.int64()),
        "w": pa.array([1.0, 2.0, 0.5, 1.0, 1.0, 3.0]),
        "cnt": pa.array([0, -3, 10, None, 5, -1], pa.int64()),
        "item": pa.array([10, 20, 10, 30, None, 40], pa.int64()),
        "hist": pa.array([[20, 30], [], None, [10, 10, 20, 50], [40], [60]], pa.list_(pa.int64())),
        "part": ["train", "train", "train", "train", "test", "test"],
    })
    src = tmp_path / "t.parquet"
    pq.write_table(tbl, src)
    spec = {"label": "y", "weight": "w", "split_column": "part",
            "dense": [{"name": "cnt", "transform": "log"}],
            "sparse": [{"name": "item", "embedding_dim": 4}],
            "sequence": [{"name": "hist", "shares": "item", "max_len": 3}]}
    res = preprocess_table(src, spec, tmp_path / "o", seed=0)
    assert set(res) == {"train", "test"}
    te = Store(res["test"])
    assert te["label"].tolist() == [1.0, 0.0] and te["weight"].tolist() == [1.0, 3.0]
    # item vocab (int keys) of the train rows only: items 10, 20, 30 and hist tokens, first appearance in feed
    # order (the chunk's item column, then its hist tokens); 40 and 60 appear only in test rows -> id 1 (unseen)
    v = load_pipeline(res["test"]).vocabs_["item"]
    assert dict(zip(v.keys.tolist(), v.ids.tolist())) == {10: 2, 20: 3, 30: 4, 50: 5}
    assert te["item"].tolist() == [0, 1]
    hv, ho = te["hist"]
    assert hv.tolist() == [1, 1] and ho.tolist() == [0, 1, 2]
    tr = Store(res["train"])
    rows = sorted(zip(tr["weight"].tolist(), tr["cnt"].tolist()))
    want = sorted([(1.0, math.log(3)), (2.0, -2.0), (0.5, math.log(13)), (1.0, math.log(3))])
    np.testing.assert_allclose(np.array(rows), np.array(want), rtol=1e-6)
    assert tr.stats["clamped_dense"]["cnt"] == 1
    lens = np.diff(tr["hist"][1])
    assert sorted(lens.tolist()) == [0, 0, 2, 3]  # [10,10,20,50] keeps its last 3


def _csv(tmp_path: Path, lines: list[bytes]) -> Path:
    p = tmp_path / "bad.csv"
    p.write_bytes(b"label,x,c\n" + b"\n".join(lines) + b"\n")
    return p


def test_bad_rows_counted_with_line_numbers(tmp_path: Path) -> None:
    good = [f"{i % 2},{i},c{i % 7}".encode() for i in range(200)]
    lines = good[:5] + [b"1,2"] + good[5:50] + [b"1,abc,c1"] + good[50:90] + [b"2,3,c1"] + good[90:] + [b"0,1,\xff\xfe"]
    src = _csv(tmp_path, lines)
    spec = {"label": "label", "dense": [{"name": "x"}], "sparse": [{"name": "c"}]}
    res = preprocess_table(src, spec, tmp_path / "o", split="1", max_bad_fraction=0.05)
    s = Store(res["train"])
    assert s.num_rows == 200 and s.stats["bad_rows"] == 4
    got = {b["line"]: b["reason"] for b in s.stats["first_bad_lines"]}
    assert sorted(got) == [7, 53, 94, 205]  # header is line 1
    assert "field count" in got[7] and "not a number" in got[53] and "not 0 or 1" in got[94]
    assert "UTF-8" in got[205]
    assert sorted(s["x"].tolist()) == list(range(200))
    with pytest.raises(DataError, match=r"bad\.csv: 4 of 204 rows.*line 7"):
        preprocess_table(src, spec, tmp_path / "o2", split="1", max_bad_fraction=0.001)
    assert not (tmp_path / "o2" / "train").exists()


def test_vocab_from_and_spec_errors(tmp_path: Path) -> None:
    a = tmp_path / "a.csv"
    pacsv.write_csv(pa.table({"label": [0, 1, 1], "c": ["x", "y", "x"]}), a)
    b = tmp_path / "b.csv"
    pacsv.write_csv(pa.table({"label": [1, 0], "c": ["y", "new"]}), b)
    spec = {"label": "label", "sparse": ["c"]}
    first = preprocess_table(a, spec, tmp_path / "a_st", split="1")
    second = preprocess_table(b, spec, tmp_path / "b_st", split="1", vocab_from=first["train"])
    got = sorted(zip(Store(second["train"])["label"].tolist(), Store(second["train"])["c"].tolist()))
    assert got == [(0.0, 1), (1.0, 3)]
    with pytest.raises(DataError, match="unknown keys"):
        load_spec({"label": "y", "sparse": [{"name": "c", "embeding_dim": 4}]})
    with pytest.raises(DataError, match="transform"):
        load_spec({"label": "y", "dense": [{"name": "c", "transform": "sqrt"}]})
    with pytest.raises(DataError, match="not in the CSV header"):
        preprocess_table(a, {"label": "label", "sparse": ["zz"]}, tmp_path / "e")
    with pytest.raises(DataError, match="does not exist"):
        preprocess_table(tmp_path / "nope.csv", spec, tmp_path / "e")


def test_vocab_from_reuses_the_pipeline_with_its_dense_statistics(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    pacsv.write_csv(pa.table({"label": [0, 1, 1, 0], "x": [1.0, 2.0, 3.0, 6.0], "c": ["p", "q", "p", "r"]}), a)
    pacsv.write_csv(pa.table({"label": [1, 0, 1], "x": [100.0, 200.0, 4.0], "c": ["q", "new", "p"]}), b)
    spec = {"label": "label", "dense": [{"name": "x", "transform": "standardize"}], "sparse": ["c"]}
    first = preprocess_table(a, spec, tmp_path / "a_st", split="1")["train"]
    second = preprocess_table(b, spec, tmp_path / "b_st", split="1", vocab_from=first)["train"]
    mean, std = np.mean([1.0, 2.0, 3.0, 6.0]), np.std([1.0, 2.0, 3.0, 6.0])  # of the training file, not of b
    got = sorted(zip(Store(second)["c"].tolist(), Store(second)["x"].tolist()))
    want = sorted(zip([3, 1, 2], ((np.array([100.0, 200.0, 4.0]) - mean) / std).astype(np.float32).tolist()))
    assert got == want
    assert Store(second).preprocessing["dense_stats"] == Store(first).preprocessing["dense_stats"]
    assert (Path(second) / "pipeline" / "pipeline.json").is_file()


@pytest.mark.parametrize("option, flag, spec_value, cli_value", [
    ("max_vocab_mode", "--max-vocab-mode", "cap", "hash"),
    ("max_vocab_mode", "--max-vocab-mode", "hash", "cap"),
    ("min_freq", "--min-freq", 3, "1"),
    ("max_vocab", "--max-vocab", 4, "6"),
    ("embedding_dim", "--embedding-dim", 4, "8"),
])
def test_a_command_line_option_wins_over_the_spec_options(tmp_path: Path, option, flag, spec_value,
                                                          cli_value) -> None:
    """Every table option: the flag when given, else the spec's ``options:``, else the built-in default."""
    from ctrkit.cli import main

    src = tmp_path / "t.csv"
    pacsv.write_csv(pa.table({"label": [i % 2 for i in range(40)], "c": [f"v{i % 9}" for i in range(40)]}), src)
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"label": "label", "sparse": ["c"], "options": {"max_vocab": 5, option: spec_value}}))
    base = ["preprocess", "table", str(src), "--schema", str(spec), "--split", "1"]
    assert main([*base, "--out", str(tmp_path / "spec")]) == 0
    assert main([*base, "--out", str(tmp_path / "cli"), flag, cli_value]) == 0
    from_spec = Store(tmp_path / "spec" / "train").preprocessing["options"][option]
    from_cli = Store(tmp_path / "cli" / "train").preprocessing["options"][option]
    assert str(from_spec) == str(spec_value) and str(from_cli) == cli_value


def test_a_table_spec_declares_the_retrieval_item_id(tmp_path):
    """item_id in the spec names the catalogue's item id (no feature called "item" needed); one that is not a
    sparse feature is refused with the features there are."""
    csv = tmp_path / "r.csv"
    csv.write_text("label,user,movie,genre\n" + "".join(f"{i % 2},u{i % 7},m{i % 11},g{i % 3}\n" for i in range(60)))
    spec = {"label": "label", "item_id": "movie",
            "sparse": [{"name": "user", "group": "user"}, {"name": "genre", "group": "item"},
                       {"name": "movie", "group": "item"}]}
    stores = preprocess_table(csv, spec, tmp_path / "out", split="0.8,0.1,0.1")
    schema = Store(stores["train"]).schema
    assert schema.item_id == "movie" and schema.item_features()[0] == "movie"
    undeclared = dict(spec)
    del undeclared["item_id"]
    again = preprocess_table(csv, undeclared, tmp_path / "out2", split="0.8,0.1,0.1")
    assert Store(again["train"]).schema.item_id == "genre"  # the compatibility rule: the first item feature
    with pytest.raises(DataError, match=r"item_id 'film' is not one of the sparse features \['user', 'genre', "):
        preprocess_table(csv, {**spec, "item_id": "film"}, tmp_path / "out3", split="0.8,0.1,0.1")
