"""Predictor: raw rows (dicts, DataFrame, pyarrow Table) -> the checkpoint's pipeline -> the scores `ctrkit evaluate`
computes for the same rows after preprocessing; Criteo (multi-hot) and a table-trained MovieLens checkpoint."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from ctrkit.checkpoint import Checkpoint
from ctrkit.cli import main
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.sources.table import preprocess_table
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError, JobError
from ctrkit.jobs.demo import SAMPLE
from ctrkit.jobs.scoring import evaluate_store, predict_store
from ctrkit.jobs.train import train_from_config
from ctrkit.metrics import gauc, log_loss, roc_auc
from ctrkit.serving.predictor import Predictor
from ctrkit.training.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["model.params.dense_arch=[16]", "model.params.over_arch=[16]", "train.epochs=1"]


def _train(d: Path, stores: dict[str, Path], name: str, extra: list[str]) -> Path:
    cfg = load_config(ROOT / "configs/criteo/dlrm.yaml", [
        f"data.train={stores['train']}", f"data.valid={stores['valid']}", f"data.test={stores['test']}",
        f"run.dir={d / 'runs'}", f"run.name={name}", *SMALL, *extra])
    train_from_config(cfg, progress=False)
    return d / "runs" / name / "best.pt"


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    """DLRM with a multi-hot stage trained on the bundled sample; 600 raw lines and their store (same ids, in order)."""
    d = tmp_path_factory.mktemp("pred_criteo")
    stores = preprocess_criteo(SAMPLE, d / "st", min_freq=8, embedding_dim=8, progress=False)
    ckpt = _train(d, stores, "mh", ["data.multi_hot_size=3", "data.multi_hot_min_table_size=20"])
    with gzip.open(SAMPLE, "rt") as f:
        lines = [next(f) for _ in range(600)]
    (d / "rows.tsv").write_text("".join(lines))
    ref = preprocess_criteo(d / "rows.tsv", d / "ref", split="1,0", shuffle=False, vocab_from=stores["train"],
                            embedding_dim=8, progress=False)["train"]
    return {"ckpt": ckpt, "lines": lines, "ref": ref, "dir": d}


def criteo_dicts(lines: list[str], label: bool = True) -> list[dict]:
    """Raw Criteo rows as JSON-like dicts: integers for I1..I13 (None when empty), hex strings for C1..C26."""
    out = []
    for ln in lines:
        f = ln.rstrip("\n").split("\t")
        row = {"label": int(f[0])} if label else {}
        row.update({f"I{i}": int(f[i]) if f[i] else None for i in range(1, 14)})
        row.update({f"C{j}": f[13 + j] for j in range(1, 27)})
        out.append(row)
    return out


def test_criteo_rows_score_as_evaluate_scores_their_store(criteo):
    p = Predictor.from_checkpoint(criteo["ckpt"], batch_size=128)
    assert p.pipeline.multi_hot["size"] == 3  # the checkpoint's multi-hot stage is part of what it applies
    rows = criteo_dicts(criteo["lines"])
    got = p.predict(rows)
    ref = Store(criteo["ref"])
    model = Checkpoint.load(criteo["ckpt"]).build_model()
    pipe = Checkpoint.load(criteo["ckpt"]).feature_pipeline()
    np.testing.assert_allclose(got, predict_store(model, ref, 128, pipe), atol=1e-6)
    want = evaluate_store(model, ref, pipe)  # what `ctrkit evaluate --data ref` prints
    labels = np.array([r["label"] for r in rows])
    assert roc_auc(got, labels) == pytest.approx(want["auc"], abs=1e-9)
    assert log_loss(got, labels) == pytest.approx(want["logloss"], abs=1e-6)
    # every input form gives the same scores; the label column is optional
    table = pa.Table.from_pylist(rows)
    np.testing.assert_array_equal(p.predict(table), got)
    np.testing.assert_array_equal(p.predict(table.to_pandas()), got)
    np.testing.assert_array_equal(p.predict(criteo_dicts(criteo["lines"], label=False)), got)
    assert p.predict([]).shape == (0,) and p.score([]).scores.shape == (0,)
    assert len(np.unique(got)) > 100


def test_a_malformed_row_is_named_by_predict_and_skipped_by_score(criteo):
    p = Predictor.from_checkpoint(criteo["ckpt"])
    rows = criteo_dicts(criteo["lines"][:20])
    want = p.predict(rows)
    rows[6] = {**rows[6], "C3": "zz12"}
    rows[11] = {**rows[11], "I2": "many"}
    with pytest.raises(DataError, match="row 7: categorical 'C3' is not empty or 8 hex digits"):
        p.predict(rows)
    s = p.score(rows)
    assert [(p.row, p.field) for p in s.bad] == [(7, "C3"), (12, "I2")] and "'I2'" in s.bad[1].reason
    ok = np.ones(20, bool)
    ok[[6, 11]] = False
    np.testing.assert_array_equal(s.ok, ok)
    # the valid rows keep their scores (to float rounding: a matmul over 18 rows may round unlike one over 20)
    np.testing.assert_allclose(s.scores[ok], want[ok], rtol=0, atol=1e-6)


def test_rows_without_a_feature_column_are_refused_naming_it(criteo):
    p = Predictor.from_checkpoint(criteo["ckpt"])
    rows = [{k: v for k, v in r.items() if k != "C5"} for r in criteo_dicts(criteo["lines"][:3])]
    with pytest.raises(DataError, match=r"lack the columns \['C5'\]"):
        p.predict(rows)
    with pytest.raises(DataError, match="row 2 is a str"):
        p.predict([{"I1": 1}, "not a row"])
    assert "C26" in p.input_columns and "label" not in p.input_columns


def test_predictor_refuses_a_retrieval_model():
    from conftest import contract_schema

    from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
    from ctrkit.models.registry import create_model

    s = contract_schema()
    with pytest.raises(JobError, match="ctrkit recall"):
        Predictor(create_model("two_tower", s), FeaturePipeline.from_schema(s))


def test_metadata_names_model_schema_training_and_checksum(criteo):
    import hashlib

    m = Predictor.from_checkpoint(criteo["ckpt"]).metadata()
    assert m["model"] == "dlrm" and m["schema"]["sparse"][0]["name"] == "C1"
    assert m["checkpoint_sha256"] == "sha256:" + hashlib.sha256(criteo["ckpt"].read_bytes()).hexdigest()
    assert 0.5 < m["training"]["best_metric"] < 1 and "auc" in m["training"]["last_eval"]


# ---- ctrkit predict: line numbers, blank lines, overwrite ------------------------------------------------------
def _read_scores(path: Path) -> tuple[list[int], np.ndarray]:
    rows = [ln.split(",") for ln in path.read_text().splitlines()[1:]]
    return [int(r[0]) for r in rows], np.array([float(r[1]) for r in rows])


def test_predict_keeps_input_line_numbers_across_blank_lines(criteo, tmp_path, caplog):
    lines = criteo["lines"][:30]
    text = "".join(lines[:10]) + "\n" + "".join(lines[10:20]) + "\n\n" + "".join(lines[20:])
    (tmp_path / "gappy.tsv").write_text(text)
    out = tmp_path / "s.csv"
    assert main(["predict", "--checkpoint", str(criteo["ckpt"]), "--input", str(tmp_path / "gappy.tsv"),
                 "--out", str(out)]) == 0
    got_lines, got = _read_scores(out)
    assert got_lines == [*range(1, 11), *range(12, 22), *range(24, 34)]
    np.testing.assert_allclose(got, Predictor.from_checkpoint(criteo["ckpt"]).predict(criteo_dicts(lines)),
                               atol=1e-6)
    assert "skipped 3 blank lines" in caplog.text


def test_predict_refuses_to_overwrite_its_input_or_an_existing_file(criteo, tmp_path, caplog):
    src = tmp_path / "rows.tsv"
    src.write_text("".join(criteo["lines"][:5]))
    before = src.read_bytes()
    args = ["predict", "--checkpoint", str(criteo["ckpt"]), "--input", str(src)]
    assert main([*args, "--out", str(src)]) == 2
    assert "is the --input file" in caplog.text and src.read_bytes() == before
    out = tmp_path / "s.csv"
    out.write_text("keep me")
    assert main([*args, "--out", str(out)]) == 2 and out.read_text() == "keep me"
    assert "already exists; choose another --out or pass --overwrite" in caplog.text
    assert main([*args, "--out", str(out), "--overwrite"]) == 0 and _read_scores(out)[0] == [1, 2, 3, 4, 5]
    assert main([*args, "--out", str(tmp_path)]) == 2 and "is a directory" in caplog.text
    assert main([*args, "--out", str(src / "x.csv")]) == 2 and f"{src} is a file" in caplog.text
    assert not list(tmp_path.glob(".*tmp*"))


# ---- a table-trained MovieLens checkpoint (multi-valued genres, a history sequence, standardized age, GAUC) ---
def _movielens_csv(raw: Path, out: Path) -> Path:
    spec = importlib.util.spec_from_file_location("make_movielens_csv", ROOT / "examples" / "make_movielens_csv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.make_movielens_csv(raw, out)


def test_movielens_table_rows_score_as_evaluate_scores_their_store(tmp_path, shared_data):
    csv = _movielens_csv(shared_data("movielens_100k"), tmp_path / "ml.csv")
    spec = ROOT / "examples" / "movielens_100k.yaml"
    stores = preprocess_table(csv, spec, tmp_path / "st", split="0.8,0.1,0.1", embedding_dim=8)
    ckpt = _train(tmp_path, stores, "ml", ["data.multi_hot_size=2", "data.multi_hot_min_table_size=500",
                                           "data.batch_size=1024"])
    p = Predictor.from_checkpoint(ckpt, batch_size=700)
    assert any(p.pipeline.batch_stage.expanded)
    text = pacsv.read_csv(csv, convert_options=pacsv.ConvertOptions(
        column_types={c: pa.string() for c in ("user_id", "item_id", "zip_prefix", "year", "genres", "hist_items")}))
    raw = text.slice(50_000, 3000)
    pacsv.write_csv(raw, tmp_path / "piece.csv")
    ref = Store(preprocess_table(tmp_path / "piece.csv", spec, tmp_path / "ref", split="1",
                                 vocab_from=stores["train"])["train"])
    model = Checkpoint.load(ckpt).build_model()
    want = evaluate_store(model, ref, Checkpoint.load(ckpt).feature_pipeline())
    # raw dicts with lists for the multi-valued and sequence features (the store was made from "|" strings)
    rows = raw.to_pylist()
    for r in rows:
        r["genres"] = [g for g in (r["genres"] or "").split("|") if g]
        r["hist_items"] = [h for h in (r["hist_items"] or "").split("|") if h]
    got = p.predict(rows)
    labels = np.array([r["label"] for r in rows])
    assert roc_auc(got, labels) == pytest.approx(want["auc"], abs=1e-9)
    assert log_loss(got, labels) == pytest.approx(want["logloss"], abs=1e-6)
    assert gauc(got, labels, np.array([int(r["user_id"]) for r in rows]))[0] == pytest.approx(want["gauc"], abs=1e-9)
    np.testing.assert_allclose(p.predict(raw), got, atol=1e-6)  # the delimited strings as read from the CSV
    assert main(["evaluate", "--checkpoint", str(ckpt), "--data", str(ref.path)]) == 0
