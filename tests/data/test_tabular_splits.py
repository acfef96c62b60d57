"""`preprocess table` fits its pipeline on the train rows only: with split fractions (valid / test rows are mapped
with the train-fitted vocabularies and statistics) and with explicit --valid / --test files (the same stores as
preprocessing train alone, then each file with --vocab-from). References: naive Python over the raw rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from ctrkit.cli import main
from ctrkit.data.pipeline.persist import load_pipeline
from ctrkit.data.sources.table import preprocess_table
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError

SPEC = {"label": "label", "group_id": "u",
        "dense": [{"name": "row", "transform": "none"}, {"name": "z", "transform": "standardize"},
                  {"name": "cnt", "transform": "log"}],
        "sparse": [{"name": "rid"}, {"name": "c"}, {"name": "d", "min_freq": 2},
                   {"name": "tags", "multi_valued": True, "delimiter": "|"}],
        "sequence": [{"name": "hist", "shares": "c", "max_len": 3, "delimiter": "|"}]}


def _rows(n: int, seed: int, prefix: str = "") -> dict[str, list]:
    """Raw columns: 'row' is the row index (a dense column passed through, so a store row names its input row);
    'rid' is unique per row, 'c' / 'd' / 'tags' / 'hist' repeat."""
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 60, n)
    return {"label": rng.integers(0, 2, n).tolist(), "row": list(range(n)),
            "z": rng.normal(40, 7, n).round(3).tolist(), "cnt": rng.integers(0, 50, n).tolist(),
            "rid": [f"{prefix}r{i}" for i in range(n)], "c": [f"c{k}" for k in c],
            "d": [f"d{k}" for k in rng.integers(0, 150, n)], "u": [f"u{k % 17}" for k in c],
            "tags": ["|".join(f"t{t}" for t in rng.integers(0, 30, rng.integers(0, 4))) for _ in range(n)],
            "hist": ["|".join(f"c{t}" for t in rng.integers(0, 70, rng.integers(0, 5))) for _ in range(n)]}


def _write(path: Path, cols: dict[str, list]) -> Path:
    pacsv.write_csv(pa.table(cols), path)
    return path


def _first_ids(values: list[str], min_freq: int = 1) -> dict[str, int]:
    """Naive vocabulary: values seen >= min_freq times, ids from 2 in order of first appearance."""
    counts: dict[str, int] = {}
    for v in values:
        if v:
            counts[v] = counts.get(v, 0) + 1
    ids: dict[str, int] = {}
    for v, k in counts.items():
        if k >= min_freq:
            ids[v] = len(ids) + 2
    return ids


def _tokens(cells: list[str]) -> list[str]:
    return [t for cell in cells for t in cell.split("|") if t]


# ---- (a) split fractions: the train part alone fits the pipeline ------------------------------------------
def test_fraction_split_fits_vocabularies_and_statistics_on_the_train_rows_only(tmp_path: Path) -> None:
    n = 1200
    raw = _rows(n, 0)
    raw["c"][::10] = [f"cx{i}" for i in range(0, n, 10)]  # values seen once: in train, or only in valid / test
    lines = [",".join(map(str, r)) for r in zip(*raw.values())]
    bad = {300: "2" + lines[300][1:], 700: lines[700].replace(f",{raw['z'][700]},", ",abc,", 1)}  # label, dense
    src = tmp_path / "t.csv"
    src.write_text(",".join(raw) + "\n" + "\n".join(bad.get(i, ln) for i, ln in enumerate(lines)) + "\n")
    good = [i for i in range(n) if i not in bad]
    res = preprocess_table(src, SPEC, tmp_path / "o", split="0.6,0.2,0.2", seed=3, block_rows=250,
                           max_bad_fraction=0.01)
    st = {k: Store(p) for k, p in res.items()}
    rows = {k: np.asarray(s["row"]).astype(int) for k, s in st.items()}
    # nothing lost: the splits partition the good rows; the bad rows are reported with their lines
    np.testing.assert_array_equal(np.sort(np.concatenate(list(rows.values()))), good)
    assert st["train"].stats["bad_rows"] == 2 and st["train"].stats["input_rows"] == n
    assert sorted(b["line"] for b in st["test"].stats["first_bad_lines"]) == [302, 702]  # header = line 1
    assert all(len(r) > 150 for r in rows.values())
    train = sorted(rows["train"])  # input order
    vocabs = load_pipeline(res["train"]).vocabs_
    # naive vocabularies over the train rows only, in input order (a chunk's single-valued columns first)
    want = {"rid": _first_ids([raw["rid"][i] for i in train]),
            "d": _first_ids([raw["d"][i] for i in train], min_freq=2),
            "tags": _first_ids(_tokens([raw["tags"][i] for i in train]))}
    for name, w in want.items():
        assert dict(zip(vocabs[name].keys.tolist(), vocabs[name].ids.tolist())) == w, name
    c_keys = set(vocabs["c"].keys.tolist())
    train_c = {raw["c"][i] for i in train} | set(_tokens([raw["hist"][i] for i in train]))
    assert c_keys == train_c
    c_ids = dict(zip(vocabs["c"].keys.tolist(), vocabs["c"].ids.tolist()))
    for k, s in st.items():  # every split mapped with the train vocabularies; unseen values -> 1
        r = rows[k]
        assert np.asarray(s["rid"]).tolist() == [want["rid"].get(raw["rid"][i], 1) for i in r]
        assert np.asarray(s["d"]).tolist() == [want["d"].get(raw["d"][i], 1) for i in r]
        assert np.asarray(s["c"]).tolist() == [c_ids.get(raw["c"][i], 1) for i in r]
        hv, ho = s["hist"]
        for j, i in enumerate(r):  # the sequence shares c's vocabulary and keeps its last 3 tokens
            assert hv[ho[j]:ho[j + 1]].tolist() == [c_ids.get(t, 1) for t in raw["hist"][i].split("|") if t][-3:]
    # an id seen only in valid / test is OOV there and absent from the vocabulary
    assert set(np.asarray(st["valid"]["rid"]).tolist()) == {1} == set(np.asarray(st["test"]["rid"]).tolist())
    only_vt = {raw["c"][i] for i in (*rows["valid"], *rows["test"])} - train_c
    assert len(only_vt) > 10 and not only_vt & c_keys  # ... and their rows read 1 (checked above)
    # standardization: mean / std of the train rows only (numpy), applied to every split
    z = np.array(raw["z"])
    mean, std = z[train].mean(), z[train].std()
    ds = st["valid"].preprocessing["dense_stats"]["z"]
    assert ds["mean"] == pytest.approx(mean, rel=1e-12) and ds["std"] == pytest.approx(std, rel=1e-12)
    assert abs(mean - z[good].mean()) > 1e-6  # the whole file's mean would differ
    for k, s in st.items():
        np.testing.assert_allclose(s["z"], ((z[rows[k]] - mean) / std).astype(np.float32), rtol=1e-6)
        np.testing.assert_allclose(s["cnt"], np.log(np.array(raw["cnt"])[rows[k]] + 3), rtol=1e-6)
    # valid / test keep input order
    assert np.all(np.diff(rows["valid"]) > 0) and np.all(np.diff(rows["test"]) > 0)
    assert st["train"].preprocessing["options"]["split"] == "0.6,0.2,0.2"


def test_fraction_split_assigns_the_same_rows_with_or_without_a_fitted_pipeline(tmp_path: Path) -> None:
    """The split is a function of the line numbers and the seed: fitting (rows routed before parsing) and
    --vocab-from (rows split after parsing) put every row in the same split."""
    src = _write(tmp_path / "t.csv", _rows(900, 1))
    fitted = preprocess_table(src, SPEC, tmp_path / "a", split="0.7,0.1,0.2", seed=5, block_rows=128)
    reused = preprocess_table(src, SPEC, tmp_path / "b", split="0.7,0.1,0.2", seed=5, vocab_from=fitted["train"])
    for k in fitted:
        np.testing.assert_array_equal(np.sort(Store(fitted[k])["row"]), np.sort(Store(reused[k])["row"]))
        if k != "train":  # same pipeline, same rows in the same order -> the same store
            for col in Store(fitted[k]).columns():
                _assert_same(Store(fitted[k])[col], Store(reused[k])[col], col)


# ---- (b) explicit --valid / --test -------------------------------------------------------------------------
def _assert_same(a: object, b: object, name: str) -> None:
    if isinstance(a, tuple):  # jagged: (values, offsets)
        for x, y in zip(a, b):
            assert np.asarray(x).dtype == np.asarray(y).dtype, name
            np.testing.assert_array_equal(x, y, err_msg=name)
    else:
        assert np.asarray(a).dtype == np.asarray(b).dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)


def _in_input_order(s: Store) -> dict[str, object]:
    """Every column of a store with its rows sorted by the input row ('row'): a train store is shuffled."""
    order = np.argsort(np.asarray(s["row"]), kind="stable")
    out: dict[str, object] = {}
    for col in s.columns():
        a = s[col]
        if isinstance(a, tuple):
            v, off = a
            lens = np.diff(off)[order]
            v = np.concatenate([v[off[i]:off[i + 1]] for i in order]) if len(v) else v
            out[col] = (v.astype(a[0].dtype), np.concatenate([[0], np.cumsum(lens)]).astype(off.dtype))
        else:
            out[col] = np.asarray(a)[order]
    return out


def _three_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    return (_write(tmp_path / "train.csv", _rows(700, 10)), _write(tmp_path / "valid.csv", _rows(160, 11, "v")),
            _write(tmp_path / "test.csv", _rows(190, 12, "t")))


def test_explicit_valid_and_test_equal_train_alone_then_vocab_from(tmp_path: Path) -> None:
    tr, va, te = _three_files(tmp_path)
    got = preprocess_table(tr, SPEC, tmp_path / "o", valid=va, test=te, seed=2, block_rows=100)
    assert set(got) == {"train", "valid", "test"}
    alone = preprocess_table(tr, SPEC, tmp_path / "alone", split="1", seed=2, block_rows=100)["train"]
    want = {"train": alone,
            "valid": preprocess_table(va, SPEC, tmp_path / "v", split="1", vocab_from=alone)["train"],
            "test": preprocess_table(te, SPEC, tmp_path / "t", split="1", vocab_from=alone)["train"]}
    for k in ("train", "valid", "test"):
        a, b = Store(got[k]), Store(want[k])
        assert a.columns() == b.columns() and a.num_rows == b.num_rows > 0
        if k == "train":  # the same shuffle
            for col in a.columns():
                _assert_same(a[col], b[col], f"{k}/{col}")
        else:  # valid / test keep input order; --vocab-from wrote a shuffled train store of the same rows
            np.testing.assert_array_equal(a["row"], np.arange(a.num_rows))
            for col, x in _in_input_order(b).items():
                _assert_same(a[col], x, f"{k}/{col}")
        assert a.schema.to_dict() == b.schema.to_dict()
        assert a.preprocessing["dense_stats"] == b.preprocessing["dense_stats"]
        assert a.preprocessing["input"] == str({"train": tr, "valid": va, "test": te}[k])
    assert json.loads((Path(got["test"]) / "pipeline" / "pipeline.json").read_text())["vocab_fingerprint"] == \
        json.loads((Path(alone) / "pipeline" / "pipeline.json").read_text())["vocab_fingerprint"]
    # valid rows whose values train never saw map to 1 (rid is unique per file)
    assert set(np.asarray(Store(got["valid"])["rid"]).tolist()) == {1}
    assert Store(got["valid"]).preprocessing["options"]["valid"] == str(va)
    # with --vocab-from as well, every file (train included) is mapped with that store's pipeline
    reused = preprocess_table(tr, SPEC, tmp_path / "r", test=te, vocab_from=alone, seed=2, block_rows=100)
    assert set(reused) == {"train", "test"}
    for col in Store(alone).columns():
        _assert_same(Store(reused["train"])[col], Store(alone)[col], f"reused train/{col}")
        _assert_same(Store(reused["test"])[col], Store(got["test"])[col], f"reused test/{col}")


def test_explicit_valid_only_with_bad_rows_reported_per_file(tmp_path: Path) -> None:
    tr, va, _ = _three_files(tmp_path)
    text = va.read_text().splitlines()
    text[5] = "7" + text[5][1:]  # label 7: line 6 of the valid file
    va.write_text("\n".join(text) + "\n")
    got = preprocess_table(tr, SPEC, tmp_path / "o", valid=va, max_bad_fraction=0.01)
    assert set(got) == {"train", "valid"}
    v, t = Store(got["valid"]), Store(got["train"])
    assert v.num_rows == 159 and v.stats["bad_rows"] == 1 and v.stats["input_rows"] == 160
    assert v.stats["first_bad_lines"] == [{"file": str(va), "line": 6, "reason": "label 'label' is not 0 or 1"}]
    assert t.num_rows == 700 and t.stats["bad_rows"] == 0
    # too many bad rows in the valid file: an error naming it, and `out` as it was
    before = {p.name for p in (tmp_path / "o").iterdir()}
    with pytest.raises(DataError, match=r"valid\.csv: 1 of 160 rows are malformed"):
        preprocess_table(tr, SPEC, tmp_path / "o", valid=va, overwrite=True, max_bad_fraction=0.001)
    assert {p.name for p in (tmp_path / "o").iterdir()} == before
    np.testing.assert_array_equal(Store(got["valid"])["row"], v["row"])


# ---- (d) mixing explicit files with fractions, and bad explicit files ------------------------------------
def test_explicit_files_refuse_split_fractions_and_a_split_column(tmp_path: Path) -> None:
    tr, va, te = _three_files(tmp_path)
    with pytest.raises(DataError, match=r"--split.*cannot be combined with explicit valid / test files"):
        preprocess_table(tr, SPEC, tmp_path / "o", split="0.8,0.1,0.1", valid=va)
    with pytest.raises(DataError, match="split_column 'label' cannot be combined"):
        preprocess_table(tr, {**SPEC, "split_column": "label"}, tmp_path / "o", test=te)
    with pytest.raises(DataError, match=r"test file .*nope\.csv \(--test\) does not exist"):
        preprocess_table(tr, SPEC, tmp_path / "o", valid=va, test=tmp_path / "nope.csv")
    _write(tmp_path / "short.csv", {"label": [1], "row": [0]})
    with pytest.raises(DataError, match=r"valid file .*short\.csv \(--valid\): columns \['u', 'z'"):
        preprocess_table(tr, SPEC, tmp_path / "o", valid=tmp_path / "short.csv")
    (tmp_path / "header_only.csv").write_text(va.read_text().splitlines()[0] + "\n")
    with pytest.raises(DataError, match=r"header_only\.csv contains no rows"):
        preprocess_table(tr, SPEC, tmp_path / "o", valid=tmp_path / "header_only.csv")
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
    # "1" (all of the input is train) agrees with explicit files
    assert set(preprocess_table(tr, SPEC, tmp_path / "ok", split="1", test=te)) == {"train", "test"}


# ---- (c) the command line ----------------------------------------------------------------------------------
def test_cli_valid_test_end_to_end_and_the_mixing_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tr, va, te = _three_files(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps(SPEC))  # JSON is YAML
    out = tmp_path / "out"
    assert main(["preprocess", "table", str(tr), "--schema", str(spec), "--out", str(out), "--valid", str(va),
                 "--test", str(te), "--seed", "4"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["test", "train", "valid"]
    alone = preprocess_table(tr, SPEC, tmp_path / "alone", split="1", seed=4)["train"]
    for k, f in (("valid", va), ("test", te)):
        want = Store(preprocess_table(f, SPEC, tmp_path / k, split="1", vocab_from=alone)["train"])
        for col, x in _in_input_order(want).items():
            _assert_same(Store(out / k)[col], x, f"{k}/{col}")
    np.testing.assert_array_equal(Store(out / "train")["c"], Store(alone)["c"])
    rc = main(["preprocess", "table", str(tr), "--schema", str(spec), "--out", str(tmp_path / "o2"),
               "--split", "0.8,0.1,0.1", "--valid", str(va)])
    assert rc == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "--split" in errors[0] and "--valid / --test" in errors[0]
    assert not (tmp_path / "o2").exists() or not any((tmp_path / "o2").iterdir())
