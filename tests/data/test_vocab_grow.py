"""Growing vocabularies (``--vocab-from PARENT --grow``) against a naive reference: known ids unchanged, new ids
appended in first-appearance order of the new data, admission by counts kept across versions, the lineage, the
same stores for any number of Criteo workers, and the bad inputs (schema changes, caps)."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctrkit.cli import main
from ctrkit.data.pipeline.persist import load_pending
from ctrkit.data.pipeline.vocab import VocabBuilder, Vocabulary, hash_keys
from ctrkit.data.pipeline.vocab_grow import grow_vocabulary, pending_of
from ctrkit.data.sources.behaviour import preprocess_behaviour
from ctrkit.data.sources.criteo import SPARSE_NAMES, preprocess_criteo
from ctrkit.data.sources.table import preprocess_table
from ctrkit.data.storage.fitted import fitted_at
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError
from tests.conftest import two_behaviour_days

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "data" / "criteo_sample.tsv.gz"
SPEC = {"label": "label", "dense": [{"name": "price", "transform": "standardize"}],
        "sparse": [{"name": "user"}, {"name": "item"}]}


def _grow_reference(versions: list[list[str]], min_freq: int) -> tuple[dict[str, int], list[int]]:
    """Naive growth of one column over ``versions`` (each the column's values in order, '' = missing) ->
    ({value: id} after the last, vocabulary size after each): a value gets the next id in the version where its
    count over every version so far reaches ``min_freq``, in the order it first appears there."""
    counts: dict[str, int] = {}
    ids: dict[str, int] = {}
    sizes = []
    for part in versions:
        for v in (x for x in part if x):
            counts[v] = counts.get(v, 0) + 1
        for v in dict.fromkeys(x for x in part if x):
            if v not in ids and counts[v] >= min_freq:
                ids[v] = 2 + len(ids)
        sizes.append(2 + len(ids))
    return ids, sizes


# ---- Criteo: two day stores ------------------------------------------------------------------------------
def _sample(n: int) -> list[str]:
    with gzip.open(SAMPLE, "rt") as f:
        return f.read().splitlines()[:n]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _label_and_ids(store: Path) -> np.ndarray:
    """Rows [n, 27] of a Criteo store (label, C1..C26), sorted (train is shuffled: compare multisets)."""
    s = Store(store)
    a = np.stack([np.asarray(s[c], np.int64) for c in ["label", *SPARSE_NAMES]], axis=1)
    return a[np.lexsort(a.T[::-1])]


def test_criteo_day_grown_from_the_previous_day_matches_the_reference(tmp_path: Path) -> None:
    lines = _sample(1200)
    day0, day1 = lines[:700], lines[700:]
    f0, f1 = _write(tmp_path / "day_0.tsv", day0), _write(tmp_path / "day_1.tsv", day1)
    parent = preprocess_criteo(f0, tmp_path / "d0", split="1,0,0", min_freq=2, progress=False)["train"]
    grown = preprocess_criteo(f1, tmp_path / "d1", split="1,0,0", min_freq=2, vocab_from=parent, grow=True,
                              progress=False)
    want = np.zeros((len(day1), 27), np.int64)
    want[:, 0] = [int(ln.split("\t")[0]) for ln in day1]
    pv, gv = fitted_at(parent).vocabs_, fitted_at(grown["train"]).vocabs_
    n_new = 0
    for j, c in enumerate(SPARSE_NAMES):
        col0, col1 = [ln.split("\t")[14 + j] for ln in day0], [ln.split("\t")[14 + j] for ln in day1]
        ids, (size, _) = _grow_reference([col0, col1], 2)
        assert pv[c].size == size
        np.testing.assert_array_equal(gv[c].lookup(pv[c].keys), pv[c].ids)  # known ids unchanged
        assert gv[c].size == 2 + len(ids)
        assert gv[c].keys[len(pv[c].keys):].tolist() == [int(v, 16) for v in ids][len(pv[c].keys):]
        want[:, 1 + j] = [0 if not v else ids.get(v, 1) for v in col1]
        n_new += gv[c].size - size
    assert n_new > 50  # the second day really brought values admitted only with the first day's counts
    np.testing.assert_array_equal(_label_and_ids(grown["train"]), want[np.lexsort(want.T[::-1])])
    lineage = json.loads((grown["train"] / "manifest.json").read_text())["preprocessing"]["vocab_lineage"]
    assert lineage["version"] == 2 and lineage["parent_fingerprint"] == fitted_at(parent).vocab_fingerprint()
    assert lineage["tables"]["C3"] == {"parent_size": pv["C3"].size, "size": gv["C3"].size}
    assert Store(grown["train"]).schema.sparse[2].vocab_size == gv["C3"].size

    two = preprocess_criteo(f1, tmp_path / "w2", split="1,0,0", min_freq=2, vocab_from=parent, grow=True,
                            progress=False, workers=2, task_bytes=40_000)
    files = sorted(str(p.relative_to(grown["train"])) for p in grown["train"].rglob("*") if p.suffix == ".npy"
                   or (p.is_file() and p.suffix != ".json"))
    assert len(files) > 27 + 26 * 2  # the columns, the vocabularies and their pending counts
    for f in files:
        assert (grown["train"] / f).read_bytes() == (two["train"] / f).read_bytes(), f  # --workers 2 == one process
    assert fitted_at(two["train"]).lineage_ == fitted_at(grown["train"]).lineage_


def test_criteo_grow_of_a_hashed_vocabulary_keeps_the_formula(tmp_path: Path) -> None:
    lines = _sample(600)
    parent = preprocess_criteo(_write(tmp_path / "a.tsv", lines[:300]), tmp_path / "a", split="1,0,0", min_freq=2,
                               max_vocab=64, progress=False)["train"]
    grown = preprocess_criteo(_write(tmp_path / "b.tsv", lines[300:]), tmp_path / "b", split="1,0,0", min_freq=2,
                              vocab_from=parent, grow=True, progress=False)["train"]
    pv, gv = fitted_at(parent).vocabs_["C3"], fitted_at(grown).vocabs_["C3"]
    assert gv.size == pv.size == 64 and len(gv.keys) > len(pv.keys)
    np.testing.assert_array_equal(gv.ids, gv.keys % 64)  # MLPerf's formula for old and new keys alike
    with pytest.raises(DataError, match="max_vocab=64"):  # another rule would move known ids
        preprocess_criteo(_write(tmp_path / "b.tsv", lines[300:]), tmp_path / "c", split="1,0,0", min_freq=2,
                          max_vocab=128, vocab_from=parent, grow=True, progress=False)


# ---- table stores: admission across versions, dense statistics, lineage chain -----------------------------
def _csv(path: Path, rows: list[tuple[int, str, str, float]]) -> Path:
    path.write_text("label,user,item,price\n" + "".join(f"{a},{b},{c},{d}\n" for a, b, c, d in rows))
    return path


def test_table_min_freq_admission_counts_across_versions(tmp_path: Path) -> None:
    v1 = [(1, "u1", "a", 1.0), (0, "u1", "b", 2.0), (1, "u2", "x", 3.0), (0, "u3", "a", 4.0)]
    v2 = [(1, "u4", "y", 5.0), (0, "u2", "c", 6.0), (1, "u4", "x", 7.0), (0, "u5", "c", 8.0)]
    v3 = [(1, "u3", "b", 9.0), (0, "u6", "d", 1.0), (1, "u5", "z", 2.0)]
    s1 = preprocess_table(_csv(tmp_path / "1.csv", v1), SPEC, tmp_path / "s1", split="1", min_freq=2)["train"]
    s2 = preprocess_table(_csv(tmp_path / "2.csv", v2), SPEC, tmp_path / "s2", split="1", min_freq=2,
                          vocab_from=s1, grow=True)["train"]
    s3 = preprocess_table(_csv(tmp_path / "3.csv", v3), SPEC, tmp_path / "s3", split="1", min_freq=2,
                          vocab_from=s2, grow=True)["train"]
    p1, p2, p3 = (fitted_at(s) for s in (s1, s2, s3))
    # item: "a" kept in v1; "c" (twice in v2) and "x" (once in v1, once in v2) admitted in v2, in v2's order;
    # "b" (once in v1, absent from v2, once in v3) admitted in v3: its v1 count was kept through v2
    assert p1.vocabs_["item"].keys.tolist() == ["a"]
    assert p2.vocabs_["item"].keys.tolist() == ["a", "c", "x"]
    assert p3.vocabs_["item"].keys.tolist() == ["a", "c", "x", "b"]
    assert p3.vocabs_["item"].ids.tolist() == [2, 3, 4, 5]
    assert p3.vocabs_["user"].keys.tolist() == ["u1", "u4", "u2", "u3", "u5"]
    for j, v in ((1, "user"), (2, "item")):
        ids, sizes = _grow_reference([[r[j] for r in x] for x in (v1, v2, v3)], 2)
        assert [p.vocabs_[v].size for p in (p1, p2, p3)] == sizes
        assert dict(zip(p3.vocabs_[v].keys.tolist(), p3.vocabs_[v].ids.tolist())) == ids
    pend = load_pending(s3)["item"]
    assert dict(zip(pend[0].tolist(), pend[1].tolist())) == {"y": 1, "d": 1, "z": 1}
    assert p3.lineage_["version"] == 3 and p3.lineage_["parent_fingerprint"] == p2.vocab_fingerprint()
    assert p3.lineage_["tables"]["item"] == {"parent_size": 5, "size": 6}
    np.testing.assert_array_equal(p3.mean_, p1.mean_)  # the parent's scaling: a warm-started model reads the same
    st = Store(s3)
    assert sorted(st["item"].tolist()) == sorted([5, 1, 1])  # b -> its new id, d and z still rare
    again = preprocess_table(_csv(tmp_path / "3.csv", v3), SPEC, tmp_path / "s3b", split="1", min_freq=2,
                             vocab_from=s2, grow=True, block_rows=1)["train"]
    assert fitted_at(again).vocab_fingerprint() == p3.vocab_fingerprint()  # deterministic, any block size


def test_lowered_min_freq_admits_pending_values_after_those_of_the_new_data(tmp_path: Path) -> None:
    b = VocabBuilder("t", "str")
    b.add(np.array(["a", "b", "a", "c"]))
    parent, _ = b.finish(min_freq=2)
    new = VocabBuilder("t", "str")
    new.add(np.array(["d", "c"]))
    grown, lut, left, _ = grow_vocabulary(parent, (np.array(["b", "c"]), np.array([1, 1])), new, min_freq=1)
    assert grown.keys.tolist() == ["a", "d", "c", "b"] and grown.ids.tolist() == [2, 3, 4, 5]
    assert lut.tolist() == [0, 1, 3, 4] and len(left[0]) == 0


# ---- behaviour stores --------------------------------------------------------------------------------------
def test_behaviour_store_grows_items_and_users(tmp_path: Path) -> None:
    first, second = two_behaviour_days(tmp_path)
    s1 = preprocess_behaviour(first, tmp_path / "s1", negatives="none", max_len=4)["train"]
    s2 = preprocess_behaviour(second, tmp_path / "s2", negatives="none", max_len=4, vocab_from=s1, grow=True)
    p1, p2 = fitted_at(s1), fitted_at(s2["train"])
    for t, v in p1.vocabs_.items():
        np.testing.assert_array_equal(p2.vocabs_[t].lookup(v.keys), v.ids)
    new_items = p2.vocabs_["item"].keys[len(p1.vocabs_["item"].keys):].tolist()
    assert new_items and set(new_items) <= {"i7", "i8", "i9"}
    assert p2.vocabs_["item"].ids[len(p1.vocabs_["item"].keys):].tolist() == list(
        range(p1.vocabs_["item"].size, p2.vocabs_["item"].size))
    assert p2.lineage_["tables"]["item"]["parent_size"] == p1.vocabs_["item"].size
    with pytest.raises(DataError, match="hist_item"):  # another history length: a retyped column
        preprocess_behaviour(second, tmp_path / "s3", negatives="none", max_len=6, vocab_from=s1, grow=True)


# ---- bad input ---------------------------------------------------------------------------------------------
@pytest.fixture
def parent(tmp_path: Path) -> Path:
    rows = [(1, "u1", "a", 1.0), (0, "u2", "b", 2.0), (1, "u3", "c", 3.0)]
    return preprocess_table(_csv(tmp_path / "p.csv", rows), SPEC, tmp_path / "p", split="1")["train"]


@pytest.mark.parametrize("spec, names", [
    ({**SPEC, "sparse": [*SPEC["sparse"], {"name": "price2", "column": "price"}]}, "added: price2"),
    ({**SPEC, "sparse": [{"name": "user"}]}, "removed: item"),
    ({**SPEC, "dense": [{"name": "price", "transform": "log"}]}, "retyped: price"),
    ({**SPEC, "sparse": [{"name": "user"}, {"name": "item", "multi_valued": True}]}, "retyped: item .*multi-valued"),
])
def test_a_schema_change_is_refused_naming_the_columns(tmp_path: Path, parent: Path, spec: dict, names: str) -> None:
    new = _csv(tmp_path / "n.csv", [(1, "u9", "z", 1.0)])
    with pytest.raises(DataError, match=names):
        preprocess_table(new, spec, tmp_path / "n", split="1", vocab_from=parent, grow=True)
    assert not (tmp_path / "n" / "train").exists()


def test_a_column_of_other_values_is_refused_naming_it(tmp_path: Path) -> None:
    cols = {"label": [1, 0], "item": ["a", "b"], "price": [1.0, 2.0]}
    pq.write_table(pa.table({**cols, "user": pa.array([1, 2], pa.int64())}), tmp_path / "p.parquet")
    pq.write_table(pa.table({**cols, "user": ["u1", "u9"]}), tmp_path / "n.parquet")
    parent = preprocess_table(tmp_path / "p.parquet", SPEC, tmp_path / "p", split="1")["train"]
    new = tmp_path / "n.parquet"
    with pytest.raises(DataError, match="'user'.*int keys but the new data holds str"):
        preprocess_table(new, SPEC, tmp_path / "n", split="1", vocab_from=parent, grow=True)


def test_growing_past_max_vocab_is_an_error_never_an_overflow(tmp_path: Path, parent: Path) -> None:
    new = _csv(tmp_path / "n.csv", [(1, "u4", "d", 1.0), (0, "u5", "e", 2.0)])
    with pytest.raises(DataError, match="7 ids .*over max_vocab=6"):
        preprocess_table(new, SPEC, tmp_path / "n", split="1", vocab_from=parent, grow=True, max_vocab=6)
    ok = preprocess_table(new, SPEC, tmp_path / "ok", split="1", vocab_from=parent, grow=True, max_vocab=7)
    assert fitted_at(ok["train"]).vocabs_["item"].size == 7


def test_hashed_table_vocabulary_grows_by_its_hash(tmp_path: Path) -> None:
    rows = [(1, "u1", "a", 1.0), (0, "u2", "b", 2.0)]
    parent = preprocess_table(_csv(tmp_path / "p.csv", rows), SPEC, tmp_path / "p", split="1", max_vocab=11)
    new = _csv(tmp_path / "n.csv", [(1, "u4", "d", 1.0), (0, "u1", "e", 2.0)])
    grown = preprocess_table(new, SPEC, tmp_path / "n", split="1", vocab_from=parent["train"], grow=True)
    v = fitted_at(grown["train"]).vocabs_["item"]
    assert v.size == 11 and v.keys.tolist() == ["a", "b", "d", "e"]
    np.testing.assert_array_equal(v.ids, 2 + hash_keys(v.keys) % np.uint64(9))


def test_cli_grow_needs_a_parent_and_reports_errors_in_one_line(tmp_path: Path, parent: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    new = _csv(tmp_path / "n.csv", [(1, "u4", "d", 1.0)])
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    base = ["preprocess", "table", str(new), "--schema", str(tmp_path / "spec.json"), "--split", "1"]
    with caplog.at_level(logging.ERROR, logger="ctrkit"):
        assert main([*base, "--out", str(tmp_path / "x"), "--grow"]) == 2
        assert "--vocab-from" in caplog.text and not (tmp_path / "x").exists()
        assert main([*base, "--out", str(tmp_path / "y"), "--grow", "--vocab-from", str(parent)]) == 0
        assert fitted_at(tmp_path / "y" / "train").vocabs_["item"].keys.tolist() == ["a", "b", "c", "d"]
        caplog.clear()
        assert main(["preprocess", "criteo", str(new), "--out", str(tmp_path / "z"), "--grow", "--vocab-from",
                     str(parent), "--vocab-memory-mb", "1"]) == 2
        assert "--vocab-memory-mb" in caplog.text


def test_open_modulo_parent_grows_to_itself() -> None:
    parent = Vocabulary.modulo("C1", 50)
    b = VocabBuilder("C1", "int")
    b.add(np.array([7, 99, 7]))
    grown, lut, _, _ = grow_vocabulary(parent, None, b, min_freq=1)
    assert grown is parent and lut is None


@pytest.mark.parametrize("max_vocab, mode", [(None, "hash"), (4, "cap"), (5, "hash")])
def test_pending_counts_are_the_counted_keys_without_an_id(max_vocab: int | None, mode: str) -> None:
    b = VocabBuilder("t", "str")
    b.add(np.array(["a", "b", "a", "c", "c", "d", "d", "e"]))
    vocab, _ = b.finish(min_freq=2, max_vocab=max_vocab, mode=mode)
    keys, counts = pending_of(b, vocab)
    held = set(vocab.keys.tolist())
    want = [(k, n) for k, n in zip(b.keys().tolist(), b.counts().tolist()) if k not in held]
    assert list(zip(keys.tolist(), counts.tolist())) == want
    # below min_freq: b and e; a cap of 4 ids (2 kept values) also leaves d, counted twice, without an id
    assert [k for k, _ in want] == (["b", "d", "e"] if mode == "cap" else ["b", "e"])
