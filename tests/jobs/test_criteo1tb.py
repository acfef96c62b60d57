"""The scaled-down twin of the MLPerf DLRM-DCNv2 config (configs/criteo1tb_small/dlrm.yaml) end to end: 24 synthetic
Criteo days, the vocabularies fitted on all of them (capped, hashed), day_23 halved into valid / test, one store per
training day with those vocabularies, then `ctrkit train` over the day stores with MLPerf's multi-hot sizes and 20
evaluations per epoch. The full config is checked for the MLPerf values it states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctrkit.cli import main
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.sources.synthetic import write_criteo_tsv
from ctrkit.data.storage.store import Store
from ctrkit.training.config import load_config

REPO = Path(__file__).resolve().parents[2]
DAYS, ROWS = 24, 2000


def test_full_config_states_mlperf_dlrm_dcnv2():
    cfg = load_config(REPO / "configs" / "criteo1tb" / "dlrm.yaml")
    p = cfg.model.params
    assert (cfg.model.name, p["embedding_dim"], p["dense_arch"], p["over_arch"]) == (
        "dlrm", 128, [512, 256], [1024, 1024, 512, 256])
    assert (p["interaction"], p["cross_type"], p["cross_layers"], p["cross_rank"]) == ("dcn", "low_rank", 3, 512)
    assert cfg.data.multi_hot_size == [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3,
                                       1, 1]
    assert (cfg.data.multi_hot_distribution, cfg.data.batch_size, cfg.train.evals_per_epoch) == ("uniform", 65536, 20)
    t = cfg.train
    assert (t.dense_optimizer, t.sparse_optimizer, t.lr, t.embedding_lr, t.epochs) == (
        "adagrad", "adagrad", 0.005, 0.005, 1)
    text = (REPO / "configs" / "criteo1tb" / "dlrm.yaml").read_text()
    assert "0.80275" in text and "--max-vocab 40000000 --max-vocab-mode hash" in text


@pytest.mark.slow
def test_scaled_twin_runs_end_to_end(tmp_path, monkeypatch):
    raw = [write_criteo_tsv(tmp_path / "raw" / f"day_{k}", ROWS, seed=k, scale=0.001) for k in range(DAYS)]
    root = tmp_path / "data" / "criteo1tb_small"
    full = preprocess_criteo(raw, root / "full", max_vocab=4000, max_vocab_mode="hash", valid_from_test=True,
                             embedding_dim=16, progress=False)
    for k in range(DAYS - 1):
        preprocess_criteo(raw[k], root / "days" / f"day_{k}", split="1,0,0", vocab_from=full["train"],
                          embedding_dim=16, progress=False)
    sizes = Store(full["train"]).stats["vocab_sizes"]
    assert max(sizes.values()) == 4000  # the cap binds, as 40M does on the real log
    monkeypatch.chdir(tmp_path)  # the config's relative paths
    rc = main(["train", "--config", str(REPO / "configs" / "criteo1tb_small" / "dlrm.yaml"), "--quiet",
               "--run.dir=runs"])
    assert rc == 0
    run = tmp_path / "runs" / "criteo1tb-small-dlrm-dcnv2"
    summary = json.loads((run / "summary.json").read_text())
    steps = -(-(DAYS - 1) * ROWS // 1024)
    assert summary["steps"] == steps and len(summary["train_days"]) == DAYS - 1
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r["step"] for r in evals if r["kind"] == "eval"]
    assert evals[:20] == [(j + 1) * (steps // 20) for j in range(20)] and evals[-1] == steps
    assert summary["test"]["auc"] > 0.55  # the planted signal is learnt through the multi-hot DCN
