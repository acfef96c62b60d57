"""A run with sharded tables end to end: `ctrkit train --nproc-per-node 2` with the torchrec embedding backend, then
the single-process commands on its sharded best.pt (evaluate, predict, export), which read it as the fused
backend: evaluate gives the test metrics the run reported; then a warm start of a grown vocabulary from it on 2
ranks with another plan, keeping every optimizer state (the steps themselves: tests/training/
test_sharded_warm_start.py)."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from ctrkit.cli import main
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.jobs.demo import SAMPLE
from ctrkit.nn.embedding_torchrec import torchrec_available

pytestmark = pytest.mark.skipif(not torchrec_available(), reason="torchrec is not installed (ctrkit[distributed], "
                                "see the Makefile's install step)")


@pytest.mark.slow
def test_train_on_two_ranks_with_sharded_tables_then_evaluate_predict_export_warm_start(tmp_path, capfd):
    st = preprocess_criteo(SAMPLE, tmp_path / "store", split="0.8,0.1,0.1", seed=0, min_freq=8, embedding_dim=8,
                           progress=False)
    rc = main(["train", *sharded_run(st, tmp_path, "sharded", "column_wise")])
    assert rc == 0
    run = tmp_path / "runs" / "sharded"
    assert (run / "best.pt" / "weights").is_dir()
    test = json.loads((run / "summary.json").read_text())["test"]
    capfd.readouterr()
    assert main(["evaluate", "--checkpoint", str(run / "best.pt")]) == 0
    printed = capfd.readouterr().out
    assert f"auc={test['auc']:.5f}" in printed, (printed, test)
    rows = tmp_path / "rows.tsv"
    with gzip.open(SAMPLE, "rt") as f:
        rows.write_text("".join(next(f) for _ in range(20)))
    assert main(["predict", "--checkpoint", str(run / "best.pt"), "--input", str(rows),
                 "--out", str(tmp_path / "pred.csv")]) == 0
    assert len((tmp_path / "pred.csv").read_text().splitlines()) == 21
    assert main(["export", "--checkpoint", str(run / "best.pt"), "--format", "torchscript",
                 "--out", str(tmp_path / "export")]) == 0
    assert (tmp_path / "export" / "model.pt").is_file()
    # a grown vocabulary (min_freq 4 admits more values), warm-started on 2 ranks, table-wise: every state kept
    grown = preprocess_criteo(SAMPLE, tmp_path / "grown", split="0.8,0.1,0.1", seed=0, min_freq=4, embedding_dim=8,
                              progress=False, vocab_from=st["train"], grow=True)
    capfd.readouterr()
    assert main(["train", *sharded_run(grown, tmp_path, "warm", "table_wise"),
                 "--warm-start", str(run / "best.pt")]) == 0
    err = capfd.readouterr().err
    assert "start fresh" not in err and "starts with fresh state" not in err, err  # warnings: every rank's
    loaded = [int(m) for m in re.findall(r"(\d+) fused optimizer states of sharded tables grown", err)]
    assert loaded and 0 < loaded[0] <= 26, err  # rank 0's (info: rank 0 only) of the 26 tables of width 8


def sharded_run(st: dict, tmp_path, name: str, sharding: str) -> list[str]:
    return ["--config", "configs/criteo/deepfm.yaml", "--nproc-per-node", "2", "--quiet",
            f"--data.train={st['train']}", f"--data.valid={st['valid']}", f"--data.test={st['test']}",
            f"--run.dir={tmp_path / 'runs'}", f"--run.name={name}", "--train.epochs=1", "--data.batch_size=512",
            "--model.params.embedding_backend=torchrec", f"--train.distributed.sharding={sharding}",
            "--train.sparse_optimizer=rowwise_adagrad", "--train.distributed.timeout_s=60"]
