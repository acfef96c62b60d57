"""run.log=[tensorboard]: the event files hold exactly the scalars of metrics.jsonl, a resumed run included."""

from __future__ import annotations

import gzip
import json
import shutil
import sys

import pytest

from ctrkit.cli import main
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.errors import ConfigError
from ctrkit.jobs.demo import SAMPLE
from ctrkit.jobs.train import train_from_config
from ctrkit.training.config import load_config
from ctrkit.training.tensorboard import TensorBoardLogger, scalars_of

pytest.importorskip("tensorboard")

CONFIG = "configs/criteo/deepfm.yaml"


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("tb")
    with gzip.open(SAMPLE, "rt") as f:
        (d / "rows.tsv").write_text("".join(next(f) for _ in range(1500)))
    return preprocess_criteo(d / "rows.tsv", d / "criteo", split="0.6,0.2,0.2", seed=0, min_freq=4, embedding_dim=4,
                             progress=False)


def _overrides(stores, run_dir, name):
    return [f"--data.train={stores['train']}", f"--data.valid={stores['valid']}", "--data.test=null",
            f"--run.dir={run_dir}", f"--run.name={name}", "--model.params.dnn_hidden=[8]", "--train.log_every=1",
            "--train.threads=1"]


def _events(log_dir):
    """{tag: [(step, value), ...]} of every event file under ``log_dir``, as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _from_records(run_dir):
    """The same, built from metrics.jsonl by hand."""
    want: dict[str, list] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "train":
            fields = {k: v for k, v in rec.items() if k not in ("kind", "step", "epoch")}
            prefix = "train"
        else:
            fields = {k: rec[k] for k in ("auc", "logloss")}
            prefix = "valid"
        for k, v in fields.items():
            want.setdefault(f"{prefix}/{k}", []).append((rec["step"], v))
    return want


def _assert_same(got, want):
    assert sorted(got) == sorted(want)
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag  # float32 events


def test_train_log_tensorboard_writes_the_scalars_of_metrics_jsonl(stores, tmp_path, capsys):
    rc = main(["train", "--config", CONFIG, "--quiet", "--log", "tensorboard", "--train.epochs=2",
               *_overrides(stores, tmp_path, "r")])
    assert rc == 0
    run = tmp_path / "r"
    got, want = _events(run / "tensorboard"), _from_records(run)
    assert "valid/auc" in want and "train/loss" in want and len(want["train/loss"]) == 8
    _assert_same(got, want)


def test_a_resumed_run_hides_the_events_of_the_steps_it_trains_again(stores, tmp_path):
    def run(epochs, resume=None):
        cfg = load_config(CONFIG, [o.removeprefix("--") for o in _overrides(stores, tmp_path, "r")]
                          + [f"train.epochs={epochs}", "run.log=[tensorboard]"])
        return train_from_config(cfg, resume=resume, progress=False)

    run(1)
    d = tmp_path / "r"
    shutil.copy(d / "last.pt", d / "epoch1.pt")  # the state after epoch 1
    run(2, resume=str(d / "last.pt"))  # epoch 2: its records and events
    steps_2 = [s for s, _ in _events(d / "tensorboard")["train/loss"]]
    run(2, resume=str(d / "epoch1.pt"))  # as after a crash in epoch 2: epoch 2 is trained (and logged) again
    got = _events(d / "tensorboard")
    assert len(list((d / "tensorboard").iterdir())) == 3  # one event file per process
    assert [s for s, _ in got["train/loss"]] == steps_2  # no step twice
    _assert_same(got, _from_records(d))


def test_scalars_of_a_record():
    assert scalars_of({"kind": "train", "step": 4, "epoch": 0, "loss": 0.5, "bce": 0.25}) == {
        "train/loss": 0.5, "train/bce": 0.25}
    ev = {"kind": "eval", "step": 4, "epoch": 1, "auc": 0.75, "logloss": 0.4, "best": 0.75, "stopped_early": True,
          "train_seconds": 1.5, "samples": 512}
    assert scalars_of(ev) == {"valid/auc": 0.75, "valid/logloss": 0.4}
    assert scalars_of({"kind": "other", "step": 1, "x": 1.0}) == {}


def test_missing_tensorboard_is_a_config_error_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'ctrkit\[tensorboard\]'"):
        TensorBoardLogger(tmp_path / "tb")
    assert not (tmp_path / "tb").exists()
