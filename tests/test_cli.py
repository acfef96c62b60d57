"""End to end through the CLI: preprocess -> train -> evaluate -> predict, and its error handling."""

from __future__ import annotations

import csv
import gzip

import numpy as np
import pytest
import torch

from ctrkit.checkpoint import Checkpoint
from ctrkit.cli import main
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.storage.store import Store
from ctrkit.jobs.demo import SAMPLE
from ctrkit.jobs.scoring import predict_store
from ctrkit.models.base import logits_of
from ctrkit.nn.embedding import IdOutOfRangeError


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    assert main(["preprocess", "criteo", str(SAMPLE), "--out", str(d / "criteo"), "--min-freq", "8",
                 "--embedding-dim", "8"]) == 0
    rc = main(["train", "--config", "configs/criteo/dlrm.yaml", "--quiet",
               f"--data.train={d / 'criteo/train'}", f"--data.valid={d / 'criteo/valid'}",
               f"--data.test={d / 'criteo/test'}", f"--run.dir={d / 'runs'}", "--run.name=r",
               "--train.epochs=1", "--model.params.dense_arch=[16]", "--model.params.over_arch=[16]"])
    assert rc == 0
    return d


def test_train_writes_run_directory(trained):
    run = trained / "runs" / "r"
    assert (run / "best.pt").is_file() and (run / "last.pt").is_file() and (run / "config.yaml").is_file()
    assert (run / "metrics.jsonl").read_text().strip()


def test_train_prints_valid_and_test_metrics(trained, capsys):
    rc = main(["train", "--config", "configs/criteo/dlrm.yaml", "--quiet",
               f"--data.train={trained / 'criteo/train'}", f"--data.valid={trained / 'criteo/valid'}",
               f"--data.test={trained / 'criteo/test'}", f"--run.dir={trained / 'runs'}", "--run.name=p",
               "--train.epochs=1", "--model.params.dense_arch=[8]", "--model.params.over_arch=[8]"])
    out = capsys.readouterr().out
    assert rc == 0 and "best valid (epoch 1 of 1, step " in out and "test with best.pt: auc=" in out


def test_evaluate(trained, capsys):
    assert main(["evaluate", "--checkpoint", str(trained / "runs/r/best.pt"),
                 "--data", str(trained / "criteo/test")]) == 0
    out = capsys.readouterr().out
    assert "auc=" in out and "logloss=" in out


def test_predict_scores_raw_rows_with_the_training_vocabulary(trained, tmp_path):
    with gzip.open(SAMPLE, "rt") as f:
        lines = [next(f) for _ in range(40)]
    raw = tmp_path / "rows.tsv"
    raw.write_text("".join(lines))
    out = tmp_path / "scores.csv"
    ckpt = trained / "runs/r/best.pt"
    assert main(["predict", "--checkpoint", str(ckpt), "--input", str(raw), "--out", str(out)]) == 0
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["line"]) for r in rows] == list(range(1, 41))
    got = np.array([float(r["score"]) for r in rows])
    # reference: the same rows mapped with the training store's vocabularies, in order, scored directly
    ref_store = preprocess_criteo(raw, tmp_path / "ref", split="1,0", shuffle=False,
                                  vocab_from=trained / "criteo/train", embedding_dim=8)["train"]
    model = Checkpoint.load(ckpt).build_model()
    want = predict_store(model, Store(ref_store))
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert len(np.unique(got)) > 1


def test_predict_refuses_malformed_rows(trained, tmp_path, caplog):
    raw = tmp_path / "bad.tsv"
    raw.write_text("1\t2\n")
    rc = main(["predict", "--checkpoint", str(trained / "runs/r/best.pt"), "--input", str(raw),
               "--out", str(tmp_path / "s.csv")])
    assert rc == 2
    assert "line 1: expected 40 tab-separated fields" in caplog.text
    assert not (tmp_path / "s.csv").exists()


@pytest.mark.parametrize("argv, message", [
    (["--model.name=dlrmm"], "unknown model 'dlrmm' (did you mean 'dlrm'?)"),
    (["--train.lrr=1"], "unknown config key 'train.lrr' in train (did you mean 'lr'?)"),
    (["--model.params.interaction=dott", "--data.train={train}"],
     "dlrm: unknown interaction='dott' (did you mean 'dot'?); valid: dot, dcn, projection"),
    # a bad parameter value is a ConfigError naming model, parameter, type and value, before any data is read
    (["--model.params.dense_arch=abc", "--data.train=/nonexistent/store"],
     "dlrm: parameter 'dense_arch' expects tuple[int, ...], got 'abc' (give a list, e.g. [64, 32])"),
    (["--model.params.over_arch=[16,x]", "--data.train={train}"],
     "dlrm: parameter 'over_arch' expects tuple[int, ...], got [16, 'x'] (item 1: 'x' is not int)"),
    (["--data.train=/nonexistent/store"], "store /nonexistent/store does not exist"),
])
def test_train_errors_are_one_line(trained, caplog, argv, message):
    argv = [a.format(train=trained / "criteo/train") for a in argv]
    rc = main(["train", "--config", "configs/criteo/dlrm.yaml", "--quiet", f"--run.dir={trained / 'bad'}", *argv])
    assert rc == 2
    assert message in caplog.text
    assert "Traceback" not in caplog.text and len([r for r in caplog.records if r.levelname == "ERROR"]) == 1


@pytest.fixture(scope="module")
def other_stores(trained, tmp_path_factory):
    """Rows of the sample preprocessed on their own (other vocabularies) and with --vocab-from the training store."""
    d = tmp_path_factory.mktemp("other")
    with gzip.open(SAMPLE, "rt") as f:
        (d / "rows.tsv").write_text("".join(next(f) for _ in range(300)))
    own = preprocess_criteo(d / "rows.tsv", d / "own", split="1,0", embedding_dim=8, progress=False)["train"]
    mapped = preprocess_criteo(d / "rows.tsv", d / "mapped", split="1,0", embedding_dim=8, progress=False,
                               vocab_from=trained / "criteo/train")["train"]
    return {"own": own, "mapped": mapped}


@pytest.mark.parametrize("split", ["valid", "test"])
def test_train_refuses_a_valid_or_test_store_with_other_vocabularies(trained, other_stores, caplog, split):
    train = trained / "criteo/train"
    rc = main(["train", "--config", "configs/criteo/dlrm.yaml", "--quiet", f"--data.train={train}",
               f"--data.valid={trained / 'criteo/valid'}", f"--data.test={trained / 'criteo/test'}",
               f"--data.{split}={other_stores['own']}", f"--run.dir={trained / 'refused'}", "--run.name=x"])
    assert rc == 2
    assert (f"data.{split}: store {other_stores['own']} was preprocessed with other vocabularies than store {train}"
            in caplog.text)
    assert f"`ctrkit preprocess ... --vocab-from {train}`" in caplog.text
    assert not (trained / "refused").exists()  # refused before training started


def test_evaluate_refuses_a_store_with_other_vocabularies(trained, other_stores, caplog, capsys):
    ckpt = trained / "runs/r/best.pt"
    loaded = Checkpoint.load(ckpt)  # its vocabularies once: the pipeline's arrays, no copy of vocab/ files
    assert loaded.vocab_files is None and loaded.vocab_path is None
    assert loaded.pipeline["meta"]["vocabularies"] and loaded.pipeline["meta"]["table_fingerprints"]
    assert main(["evaluate", "--checkpoint", str(ckpt), "--data", str(other_stores["own"])]) == 2
    assert f"--data: store {other_stores['own']} was preprocessed with other vocabularies than checkpoint {ckpt}" \
        in caplog.text
    assert f"--vocab-from {trained / 'criteo/train'}" in caplog.text
    assert main(["evaluate", "--checkpoint", str(ckpt), "--data", str(other_stores["mapped"])]) == 0
    assert "auc=" in capsys.readouterr().out


def test_resume_refuses_a_training_store_with_other_vocabularies(trained, other_stores, caplog):
    rc = main(["train", "--config", "configs/criteo/dlrm.yaml", "--quiet", f"--data.train={other_stores['own']}",
               "--data.valid=", "--data.test=", f"--run.dir={trained / 'resumed'}", "--run.name=x",
               "--resume", str(trained / "runs/r/last.pt"), "--model.params.dense_arch=[16]",
               "--model.params.over_arch=[16]"])
    assert rc == 2
    assert "data.train (--resume): store" in caplog.text and "than checkpoint" in caplog.text


def test_empty_training_store_is_a_clear_error(trained, tmp_path, caplog):
    raw = tmp_path / "one.tsv"
    with gzip.open(SAMPLE, "rt") as f:
        raw.write_text(next(f))
    stores = preprocess_criteo(raw, tmp_path / "s", split="1,0", shuffle=False, embedding_dim=8)
    rc = main(["train", "--config", "configs/criteo/dlrm.yaml", "--quiet", f"--data.train={stores['train']}",
               "--data.valid=", "--data.test=", f"--run.dir={tmp_path}", "--data.drop_last=true",
               "--data.batch_size=64"])
    assert rc == 2
    assert "training data is empty" in caplog.text


def test_nan_dense_values_stop_dlrm_training_with_the_step(trained):
    from conftest import ListLoader, contract_schema, make_batch, planted_data

    from ctrkit.models.registry import create_model
    from ctrkit.training.config import TrainConfig
    from ctrkit.training.trainer import Trainer, TrainingError

    data = planted_data(256)
    data["dense"][2 * 64 + 1, 0] = float("nan")  # third batch
    loader = ListLoader(make_batch(data, slice(s, s + 64)) for s in range(0, 256, 64))
    model = create_model("dlrm", contract_schema(), dense_arch=(8,), over_arch=(8,))
    with pytest.raises(TrainingError, match=r"step 3 \(epoch 0\)"):
        Trainer(model, loader, TrainConfig(epochs=1, progress=False)).fit()


def test_out_of_range_id_names_the_feature():
    from conftest import contract_schema, make_batch, planted_data

    from ctrkit.models.registry import create_model

    model = create_model("dlrm", contract_schema(), dense_arch=(8,), over_arch=(8,))
    data = planted_data(8)
    data["item"][3] = 40  # the item table has 40 rows: ids 0..39
    with pytest.raises(IdOutOfRangeError, match="feature 'item': id 40 is outside table 'item' of size 40"):
        model(make_batch(data, slice(0, 8)))


# ---- predict / evaluate apply the training pipeline (issue 8 regressions) --------------------------------
TABLE_SPEC = {"label": "label", "dense": [{"name": "x", "transform": "standardize"}, {"name": "rid"}],
              "sparse": [{"name": "u", "embedding_dim": 8},
                         {"name": "tags", "multi_valued": True, "delimiter": "|", "embedding_dim": 8}]}


@pytest.fixture(scope="module")
def table_run(tmp_path_factory):
    """A DLRM trained on a CSV through `preprocess table`; rows carry their index (dense 'rid')."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from ctrkit.data.sources.table import preprocess_table

    d = tmp_path_factory.mktemp("table")
    rng = np.random.default_rng(0)
    n = 900
    u = rng.integers(0, 40, n)
    table = pa.table({"label": (rng.random(n) < np.where(u % 3 == 0, 0.8, 0.2)).astype(np.int64),
                      "rid": np.arange(n), "x": rng.normal(5, 2, n).round(3), "u": [f"user{k}" for k in u],
                      "tags": ["|".join(f"t{t}" for t in rng.integers(0, 9, rng.integers(0, 4))) for _ in range(n)]})
    pacsv.write_csv(table, d / "rows.csv")
    stores = preprocess_table(d / "rows.csv", TABLE_SPEC, d / "st", split="0.6,0.2,0.2")
    assert main(["train", "--config", "configs/criteo/dlrm.yaml", "--quiet", f"--data.train={stores['train']}",
                 f"--data.valid={stores['valid']}", f"--data.test={stores['test']}", f"--run.dir={d / 'runs'}",
                 "--run.name=t", "--train.epochs=2", "--model.params.dense_arch=[8]",
                 "--model.params.over_arch=[8]"]) == 0
    return {"dir": d, "table": table, "stores": stores, "ckpt": d / "runs/t/best.pt"}


def _scores(path, first_line=1):
    """Scores of a predict output, checking each row's line number (CSV input: the header is line 1)."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["line"]) for r in rows] == list(range(first_line, first_line + len(rows)))
    return np.array([float(r["score"]) for r in rows])


def test_predict_a_table_checkpoint_reads_csv_and_parquet_with_or_without_label(table_run, tmp_path):
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from ctrkit.checkpoint import Checkpoint

    test = Store(table_run["stores"]["test"])  # test keeps input order: these raw rows, in this order
    raw = table_run["table"].take(pa.array(np.asarray(test["rid"]).astype(np.int64)))
    model = Checkpoint.load(table_run["ckpt"]).build_model()
    want = predict_store(model, test, pipeline=Checkpoint.load(table_run["ckpt"]).feature_pipeline())
    pacsv.write_csv(raw, tmp_path / "with_label.csv")
    pacsv.write_csv(raw.drop_columns(["label"]), tmp_path / "no_label.csv")
    pq.write_table(raw.drop_columns(["label"]), tmp_path / "rows.parquet")
    for name in ("with_label.csv", "no_label.csv", "rows.parquet"):
        out = tmp_path / f"{name}.scores.csv"
        assert main(["predict", "--checkpoint", str(table_run["ckpt"]), "--input", str(tmp_path / name),
                     "--out", str(out), "--batch-size", "50"]) == 0, name
        first = 2 if name.endswith(".csv") else 1
        np.testing.assert_allclose(_scores(out, first), want, atol=1e-6, err_msg=name)
    assert len(np.unique(want)) > 1


def test_predict_a_table_checkpoint_names_a_malformed_line(table_run, tmp_path, caplog):
    (tmp_path / "bad.csv").write_text("label,rid,x,u,tags\n1,0,1.5,user1,t1\n0,1,abc,user2,\n")
    rc = main(["predict", "--checkpoint", str(table_run["ckpt"]), "--input", str(tmp_path / "bad.csv"),
               "--out", str(tmp_path / "s.csv")])
    assert rc == 2 and "line 3: dense 'x' is not a number" in caplog.text
    assert not (tmp_path / "s.csv").exists()


@pytest.fixture(scope="module")
def multi_hot_run(trained):
    from ctrkit.jobs.train import train_from_config
    from ctrkit.training.config import load_config

    cfg = load_config("configs/criteo/dlrm.yaml", [
        f"data.train={trained / 'criteo/train'}", f"data.valid={trained / 'criteo/valid'}",
        f"data.test={trained / 'criteo/test'}", f"run.dir={trained / 'runs'}", "run.name=mh", "train.epochs=1",
        "model.params.dense_arch=[16]", "model.params.over_arch=[16]", "data.multi_hot_size=3",
        "data.multi_hot_min_table_size=20"])
    return cfg, train_from_config(cfg, progress=False)


def test_evaluate_applies_the_multi_hot_stage_training_used(trained, multi_hot_run, capsys):
    from ctrkit.checkpoint import Checkpoint
    from ctrkit.jobs.scoring import evaluate_store

    cfg, summary = multi_hot_run
    ckpt = trained / "runs/mh/best.pt"
    pipe = Checkpoint.load(ckpt).feature_pipeline()
    assert pipe.multi_hot["size"] == 3 and sum(pipe.batch_stage.expanded) > 0
    model = Checkpoint.load(ckpt).build_model()
    test = Store(trained / "criteo/test")
    got = evaluate_store(model, test, pipe, cfg.data.eval_batch_size)
    assert got["auc"] == pytest.approx(summary["test"]["auc"], abs=1e-12)
    assert evaluate_store(model, test, None, cfg.data.eval_batch_size)["auc"] != got["auc"]  # the old defect
    assert main(["evaluate", "--checkpoint", str(ckpt), "--data", str(test.path)]) == 0
    assert f"auc={summary['test']['auc']:.5f}" in capsys.readouterr().out


def test_predict_applies_the_multi_hot_stage_and_reads_unlabelled_criteo(trained, multi_hot_run, tmp_path):
    from ctrkit.data.pipeline.multihot import MultiHot
    from ctrkit.data.storage.loader import BatchLoader

    with gzip.open(SAMPLE, "rt") as f:
        lines = [next(f) for _ in range(300)]
    (tmp_path / "rows.tsv").write_text("".join(lines))
    (tmp_path / "unlabelled.tsv").write_text("".join(ln.split("\t", 1)[1] for ln in lines))
    ckpt = trained / "runs/mh/best.pt"
    saved = Checkpoint.load(ckpt)
    model, schema = saved.build_model(), saved.schema
    # reference: the rows mapped by the training store's vocabularies, expanded by a MultiHot built by hand
    ref = preprocess_criteo(tmp_path / "rows.tsv", tmp_path / "ref", split="1,0", shuffle=False, embedding_dim=8,
                            vocab_from=trained / "criteo/train", progress=False)["train"]
    mh = MultiHot.from_schema(schema, 3, 20)
    want = []
    with torch.no_grad():
        for b in BatchLoader(ref, 128, shuffle=False, prefetch=0):
            b.sparse = mh(b.sparse)
            want.append(torch.sigmoid(logits_of(model(b))).numpy())
    want = np.concatenate(want)
    for name in ("rows.tsv", "unlabelled.tsv"):
        out = tmp_path / f"{name}.csv"
        assert main(["predict", "--checkpoint", str(ckpt), "--input", str(tmp_path / name), "--out", str(out),
                     "--batch-size", "64"]) == 0
        np.testing.assert_allclose(_scores(out), want, atol=1e-6, err_msg=name)


def test_evaluate_on_a_store_of_another_schema_names_the_features(trained, table_run, caplog):
    rc = main(["evaluate", "--checkpoint", str(trained / "runs/r/best.pt"), "--data", str(table_run["stores"]["test"])])
    assert rc == 2
    assert "has other features than checkpoint" in caplog.text
    assert "missing from the store: I1, I2" in caplog.text and "not read by the model: x, rid, u, tags" in caplog.text
    assert "--vocab-from" in caplog.text


def test_predict_numbers_csv_rows_by_their_line_across_blank_lines(table_run, tmp_path, caplog):
    import pyarrow.csv as pacsv

    pacsv.write_csv(table_run["table"].slice(0, 6), tmp_path / "plain.csv")
    head, *rows = (tmp_path / "plain.csv").read_text().splitlines(keepends=True)
    (tmp_path / "gappy.csv").write_text(head + rows[0] + "\n" + "".join(rows[1:4]) + "\r\n\n" + "".join(rows[4:]))
    for name in ("plain.csv", "gappy.csv"):
        assert main(["predict", "--checkpoint", str(table_run["ckpt"]), "--input", str(tmp_path / name),
                     "--out", str(tmp_path / f"{name}.out")]) == 0
    with open(tmp_path / "gappy.csv.out") as f:
        got = list(csv.DictReader(f))
    assert [int(r["line"]) for r in got] == [2, 4, 5, 6, 9, 10]
    np.testing.assert_array_equal([float(r["score"]) for r in got], _scores(tmp_path / "plain.csv.out", 2))
    assert "skipped 3 blank lines" in caplog.text


def test_scoring_batches_default_to_what_the_run_evaluated_with(trained, tmp_path, monkeypatch):
    """evaluate / predict without --batch-size: data.eval_batch_size of the checkpoint's config, else 4 x
    data.batch_size (what the run's valid and test evaluations used)."""
    from ctrkit.jobs import tasks
    from ctrkit.serving.predictor import Predictor

    ckpt = trained / "runs/r/best.pt"
    d = Checkpoint.load(ckpt).data_config
    rows = d["eval_batch_size"] or 4 * d["batch_size"]
    assert Checkpoint.load(ckpt).scoring_batch_size == rows != 8192  # not the flag's former default
    seen = []
    real_evaluate, real_predict = tasks.evaluate_store, Predictor.predict_file
    monkeypatch.setattr(tasks, "evaluate_store", lambda m, s, p, rows: seen.append(rows) or real_evaluate(m, s, p, rows))
    monkeypatch.setattr(Predictor, "predict_file", lambda self, *a: seen.append(self.batch_size) or real_predict(self, *a))
    raw = tmp_path / "rows.tsv"
    with gzip.open(SAMPLE, "rt") as f:
        raw.write_text("".join(next(f) for _ in range(10)))
    assert main(["evaluate", "--checkpoint", str(ckpt), "--data", str(trained / "criteo/test")]) == 0
    assert main(["evaluate", "--checkpoint", str(ckpt), "--data", str(trained / "criteo/test"), "--batch-size", "77"]) == 0
    assert main(["predict", "--checkpoint", str(ckpt), "--input", str(raw), "--out", str(tmp_path / "a.csv")]) == 0
    assert main(["predict", "--checkpoint", str(ckpt), "--input", str(raw), "--out", str(tmp_path / "b.csv"),
                 "--batch-size", "5"]) == 0
    assert seen == [rows, 77, rows, 5]
    assert Predictor.from_checkpoint(ckpt).batch_size == rows


def test_scoring_batch_size_rule():
    from ctrkit.checkpoint import DEFAULT_SCORING_BATCH_SIZE, scoring_batch_size

    assert scoring_batch_size(256, None) == 1024 and scoring_batch_size(256, 1000) == 1000
    assert scoring_batch_size(None, None) == DEFAULT_SCORING_BATCH_SIZE
    assert Checkpoint(None, {}, config={"data": {"batch_size": 100, "eval_batch_size": None}}).scoring_batch_size == 400
    assert Checkpoint(None, {}).scoring_batch_size == DEFAULT_SCORING_BATCH_SIZE  # no config
