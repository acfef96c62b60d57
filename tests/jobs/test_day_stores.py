"""``data.train`` naming day stores: per-day Criteo stores sharing one vocabulary (``--vocab-from``), the last day
halved into valid / test (``--valid-from-test``), a training run over the days, and the checks that refuse day
stores of other vocabularies or day stores where one store is expected."""

from __future__ import annotations

import json

import pytest

from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.sources.synthetic import write_criteo_tsv
from ctrkit.data.storage.days import DayStreamLoader
from ctrkit.data.storage.store import Store
from ctrkit.errors import ConfigError, JobError, StoreError
from ctrkit.jobs.common import config_loader
from ctrkit.jobs.train import eval_cadence, train_from_config
from ctrkit.training.config import load_config

DAYS, ROWS = 4, 1500


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """Raw day_0 .. day_3; one run over all of them (the vocabularies, valid / test = day_3 halved); then one store
    per training day with those vocabularies."""
    d = tmp_path_factory.mktemp("days")
    raw = [write_criteo_tsv(d / "raw" / f"day_{k}", ROWS, seed=k, scale=0.0005) for k in range(DAYS)]
    full = preprocess_criteo(raw, d / "full", valid_from_test=True, embedding_dim=8, progress=False)
    for k in range(DAYS - 1):
        preprocess_criteo(raw[k], d / "days" / f"day_{k}", split="1,0,0", vocab_from=full["train"],
                          embedding_dim=8, progress=False)
    return d, raw, full


def test_last_day_halved_into_valid_and_test(days):
    _, _, full = days
    valid, test, train = Store(full["valid"]), Store(full["test"]), Store(full["train"])
    assert train.num_rows == (DAYS - 1) * ROWS and valid.num_rows + test.num_rows == ROWS
    assert abs(valid.num_rows - ROWS / 2) < 4 * (ROWS / 4) ** 0.5  # halved at random: within 4 sigma
    assert valid.preprocessing["options"]["valid_from_test"] is True


def _cfg(d, full, *extra):
    return load_config("configs/criteo/dlrm.yaml", [
        f"data.train={d / 'days' / 'day_*' / 'train'}", f"data.valid={full['valid']}", f"data.test={full['test']}",
        f"run.dir={d / 'runs'}", "train.progress=false", "train.epochs=1", "data.batch_size=256", *extra])


def test_training_reads_the_days_in_order(days):
    d, _, full = days
    cfg = _cfg(d, full, "run.name=days", "train.evals_per_epoch=4")
    loader = config_loader(cfg.data.train, cfg, train=True, what="train")
    assert isinstance(loader, DayStreamLoader) and [s.path.parent.name for s in loader.stores] == [
        f"day_{k}" for k in range(DAYS - 1)]
    assert loader.num_rows == (DAYS - 1) * ROWS
    summary = train_from_config(cfg)
    assert summary["steps"] == summary["steps_per_epoch"] == -(-(DAYS - 1) * ROWS // 256)
    assert len(summary["train_days"]) == DAYS - 1 and summary["data"]["train"].endswith("day_0/train") and "auc" in summary["test"]
    saved = json.loads((d / "runs" / "days" / "summary.json").read_text())
    assert saved["config"]["data"]["train"] == str(d / "days" / "day_*" / "train")
    records = [json.loads(line) for line in (d / "runs" / "days" / "metrics.jsonl").read_text().splitlines()]
    steps = summary["steps"]  # 18: evaluations every 18 // 4 = 4 steps and at the end of the epoch (MLPerf's rule)
    assert [r["step"] for r in records if r["kind"] == "eval"] == [*range(steps // 4, steps + 1, steps // 4), steps]


def test_evals_per_epoch_and_eval_every_exclude_each_other(days):
    d, _, full = days
    with pytest.raises(JobError, match="keep one"):
        train_from_config(_cfg(d, full, "train.evals_per_epoch=4", "train.eval_every=3"))
    with pytest.raises(ConfigError, match="'train.evals_per_epoch' expects int >= 1"):
        _cfg(d, full, "train.evals_per_epoch=0")
    cfg = _cfg(d, full, "train.evals_per_epoch=20")
    assert eval_cadence(cfg, 64013).train.eval_every == 3200  # MLPerf: 4195197692 rows / 65536 per step, 20 evals
    assert eval_cadence(cfg, 7).train.eval_every == 1


def test_day_stores_of_another_vocabulary_are_refused(days):
    d, raw, full = days
    own = preprocess_criteo(raw[DAYS - 2], d / "own", split="1,0,0", embedding_dim=8, progress=False)  # its own ids
    cfg = _cfg(d, full)
    with pytest.raises(StoreError, match="--vocab-from"):
        config_loader([str(d / "days" / "day_0" / "train"), str(own["train"])], cfg, train=True, what="train")
    with pytest.raises(ConfigError, match="data.valid takes one store"):
        config_loader([str(full["valid"])], cfg, train=False, what="valid")
