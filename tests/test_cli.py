"""End to end through the CLI: preprocess -> train -> evaluate -> predict, and its error handling."""

from __future__ import annotations

import csv
import gzip

import numpy as np
import pytest

from ctrkit.cli import main
from ctrkit.data.criteo import preprocess_criteo
from ctrkit.data.store import Store
from ctrkit.nn.embedding import IdOutOfRangeError
from ctrkit.runner import SAMPLE, predict_store
from ctrkit.train.checkpoint import load_model


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
    assert rc == 0 and "valid: auc=" in out and "test:  auc=" in out


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
    assert main(["predict", "--checkpoint", str(ckpt), "--input", str(raw), "--output", str(out)]) == 0
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["row"]) for r in rows] == list(range(40))
    got = np.array([float(r["score"]) for r in rows])
    # reference: the same rows mapped with the training store's vocabularies, in order, scored directly
    ref_store = preprocess_criteo(raw, tmp_path / "ref", split="1,0", shuffle=False,
                                  vocab_from=trained / "criteo/train", embedding_dim=8)["train"]
    model, _, _ = load_model(ckpt)
    want = predict_store(model, Store(ref_store))
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert len(np.unique(got)) > 1


def test_predict_refuses_malformed_rows(trained, tmp_path, caplog):
    raw = tmp_path / "bad.tsv"
    raw.write_text("1\t2\n")
    rc = main(["predict", "--checkpoint", str(trained / "runs/r/best.pt"), "--input", str(raw),
               "--output", str(tmp_path / "s.csv")])
    assert rc == 2
    assert "line 1: expected 40 tab-separated fields" in caplog.text
    assert not (tmp_path / "s.csv").exists()


@pytest.mark.parametrize("argv, message", [
    (["--model.name=dlrmm"], "unknown model 'dlrmm' (did you mean 'dlrm'?)"),
    (["--train.lrr=1"], "unknown config key 'train.lrr' in train (did you mean 'lr'?)"),
    (["--model.params.interaction=dott", "--data.train={train}"], "interaction 'dott' is not one of"),
    (["--data.train=/nonexistent/store"], "store /nonexistent/store does not exist"),
])
def test_train_errors_are_one_line(trained, caplog, argv, message):
    argv = [a.format(train=trained / "criteo/train") for a in argv]
    rc = main(["train", "--config", "configs/criteo/dlrm.yaml", "--quiet", f"--run.dir={trained / 'bad'}", *argv])
    assert rc == 2
    assert message in caplog.text


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
    from conftest import contract_schema, make_batch, planted_data

    from ctrkit.models.registry import create_model
    from ctrkit.train.config import TrainConfig
    from ctrkit.train.trainer import Trainer, TrainingError

    class ListLoader(list):
        def set_epoch(self, epoch):
            pass

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

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
