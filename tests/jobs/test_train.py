"""What every training run leaves besides its checkpoints: summary.json, predictions.npz, and what
`ctrkit train` prints; ``train.threads``; callbacks through the Python API."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ctrkit.checkpoint import Checkpoint
from ctrkit.cli import main
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.storage.store import Store
from ctrkit.errors import TrainingError
from ctrkit.jobs.demo import SAMPLE
from ctrkit.jobs.scoring import evaluate_store, predict_store
from ctrkit.jobs.train import train_from_config
from ctrkit.metrics import roc_auc
from ctrkit.training.callbacks import Callback
from ctrkit.training.config import load_config

EPOCHS = 3


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("summary")
    return d, preprocess_criteo(SAMPLE, d / "criteo", split="0.8,0.1,0.1", seed=0, min_freq=8, embedding_dim=8)


def _cfg(d, stores, name, *extra):
    return load_config("configs/criteo/deepfm.yaml", [
        f"data.train={stores['train']}", f"data.valid={stores['valid']}", f"data.test={stores['test']}",
        f"run.dir={d / 'runs'}", f"run.name={name}", f"train.epochs={EPOCHS}", "train.progress=false",
        "train.early_stopping.patience=0", "data.batch_size=256", *extra])


@pytest.fixture(scope="module")
def run(stores):
    d, st = stores
    rc = main(["train", "--config", "configs/criteo/deepfm.yaml", "--quiet", f"--data.train={st['train']}",
               f"--data.valid={st['valid']}", f"--data.test={st['test']}", f"--run.dir={d / 'runs'}",
               "--run.name=cli", f"--train.epochs={EPOCHS}", "--train.early_stopping.patience=0",
               "--data.batch_size=256", "--train.lr=0.01"])  # a high lr: valid AUC peaks before the last epoch
    assert rc == 0
    run_dir = d / "runs" / "cli"
    return run_dir, json.loads((run_dir / "summary.json").read_text()), st


def test_summary_names_the_best_valid_evaluation(run):
    run_dir, s, _ = run
    evals = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    assert len(evals) == EPOCHS
    best = max(evals, key=lambda r: r["auc"])
    assert s["best"]["metric"] == "auc" and s["best"]["value"] == best["auc"]
    assert (s["best"]["step"], s["best"]["epoch"]) == (best["step"], best["epoch"])
    assert s["best"]["valid"] == {k: best[k] for k in ("auc", "logloss")}
    assert s["last_valid"] == {k: evals[-1][k] for k in ("auc", "logloss")}
    assert Checkpoint.load(run_dir / "best.pt").trainer.progress.step == best["step"]


def test_summary_test_metrics_are_the_best_checkpoints(run):
    run_dir, s, st = run
    model = Checkpoint.load(run_dir / "best.pt").build_model()
    ckpt = Checkpoint.load(run_dir / "best.pt")
    got = evaluate_store(model, Store(st["test"]), ckpt.feature_pipeline())
    assert s["test"]["auc"] == pytest.approx(got["auc"], abs=1e-9)
    assert s["test"]["logloss"] == pytest.approx(got["logloss"], abs=1e-6)


def test_summary_speed_and_size(run):
    run_dir, s, st = run
    n_train = Store(st["train"]).num_rows
    assert s["epochs"] == EPOCHS and s["samples"] == EPOCHS * n_train
    assert 0 < s["train_seconds"] < s["seconds"]
    assert s["seconds_per_epoch"] == pytest.approx(s["train_seconds"] / EPOCHS)
    assert s["samples_per_second"] == pytest.approx(s["samples"] / s["train_seconds"])
    state = Checkpoint.load(run_dir / "best.pt").weights
    assert s["model_size"]["parameters"] == sum(v.numel() for v in state.values() if v.is_floating_point())
    assert s["model_size"]["bytes"] == 4 * s["model_size"]["parameters"]  # fp32
    assert 0 < s["model_size"]["embedding_parameters"] < s["model_size"]["parameters"]
    assert s["data"] == {k: str(Path(v).resolve()) for k, v in st.items()}
    assert s["config"]["model"]["name"] == "deepfm" and s["model"] == "deepfm" and s["task"] == "ranking"
    assert s["environment"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    evals = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in evals if r["kind"] == "eval"][-1]
    assert last["samples"] == s["samples"] and last["train_seconds"] == pytest.approx(s["train_seconds"], abs=1e-3)


def test_predictions_are_the_best_checkpoints_test_scores(run):
    run_dir, s, st = run
    p = np.load(run_dir / "predictions.npz")
    model = Checkpoint.load(run_dir / "best.pt").build_model()
    pipeline = Checkpoint.load(run_dir / "best.pt").feature_pipeline()
    want = predict_store(model, Store(st["test"]), pipeline=pipeline)
    assert s["predictions"] == {"split": "test", "file": "predictions.npz", "rows": len(want)}
    np.testing.assert_allclose(p["score"], want, atol=1e-6)
    np.testing.assert_array_equal(p["label"], np.asarray(Store(st["test"])["label"]))
    assert roc_auc(p["score"], p["label"]) == pytest.approx(s["test"]["auc"], abs=1e-6)


def test_train_prints_the_best_valid_evaluation_beside_test(stores, capsys):
    d, st = stores
    rc = main(["train", "--config", "configs/criteo/deepfm.yaml", "--quiet", f"--data.train={st['train']}",
               f"--data.valid={st['valid']}", f"--data.test={st['test']}", f"--run.dir={d / 'runs'}",
               "--run.name=printed", "--train.epochs=2", "--data.batch_size=256"])
    out = capsys.readouterr().out
    s = json.loads((d / "runs/printed/summary.json").read_text())
    b = s["best"]
    assert rc == 0
    assert (f"best valid (epoch {b['epoch'] + 1} of 2, step {b['step']}): auc={b['valid']['auc']:.5f}  "
            f"logloss={b['valid']['logloss']:.5f}") in out
    assert f"test with best.pt: auc={s['test']['auc']:.5f}" in out
    assert "s/epoch" in out and "samples/s" in out


def test_threads_option_applies_to_the_run_only(stores):
    d, st = stores
    before = torch.get_num_threads()
    seen = []

    class Threads(Callback):
        def on_epoch_end(self, trainer, epoch):
            seen.append(torch.get_num_threads())

    s = train_from_config(_cfg(d, st, "threads", "train.threads=1", "train.epochs=1"), callbacks=[Threads()])
    assert seen == [1] and s["environment"]["threads"] == 1
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("enabled", [True, False])
def test_keep_freed_memory_is_the_jobs_option(stores, monkeypatch, enabled):
    from ctrkit.jobs import train as train_job

    d, st = stores
    calls = []
    monkeypatch.setattr(train_job, "keep_freed_memory", lambda: calls.append(1))
    train_from_config(_cfg(d, st, f"alloc{enabled}", "train.epochs=1", f"train.keep_freed_memory={enabled}"))
    assert calls == ([1] if enabled else [])


def test_the_callers_random_state_is_put_back(stores):
    """train.seed seeds the run, not the caller: python, numpy and torch draw after the job as they would have."""
    import random

    d, st = stores
    torch.manual_seed(123)
    np.random.seed(7)
    random.seed(5)
    want = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(123)
    np.random.seed(7)
    random.seed(5)
    train_from_config(_cfg(d, st, "rng", "train.epochs=1", "train.seed=99"))
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2]


def test_callbacks_see_every_record_as_written(stores):
    d, st = stores

    class Records(Callback):
        def __init__(self):
            self.records = []

        def on_record(self, trainer, record):
            self.records.append(record)

    cb = Records()
    s = train_from_config(_cfg(d, st, "callbacks", "train.epochs=2", "train.log_every=5"), callbacks=[cb])
    on_disk = [json.loads(ln) for ln in (d / "runs/callbacks/metrics.jsonl").read_text().splitlines()]
    assert cb.records == on_disk and sum(r["kind"] == "eval" for r in on_disk) == 2
    assert s["steps"] == on_disk[-1]["step"]


def test_a_callback_that_asks_to_stop_ends_the_run_with_its_summary(stores):
    d, st = stores

    class StopAtStep(Callback):
        def on_step(self, trainer, step, loss):
            if step == 3:
                trainer.stop("enough at step 3")

    s = train_from_config(_cfg(d, st, "asked", f"train.epochs={EPOCHS}"), callbacks=[StopAtStep()])
    records = [json.loads(ln) for ln in (d / "runs/asked/metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert s["steps"] == 3 and s["stopped_by"] == "enough at step 3" and not s["stopped_early"]
    assert [r["step"] for r in evals] == [3]  # the stopped step is evaluated, as the end of any run
    assert s["best"]["step"] == 3 and "test" in s
    assert (d / "runs/asked/last.pt").is_file() and (d / "runs/asked/report.html").is_file()
    assert json.loads((d / "runs/asked/summary.json").read_text())["stopped_by"] == "enough at step 3"


def test_a_raising_callback_stops_training_and_frees_the_run(stores):
    d, st = stores

    class Stop(Callback):
        def on_eval(self, trainer, metrics):
            raise TrainingError("stop here")

    with pytest.raises(TrainingError, match="stop here"):
        train_from_config(_cfg(d, st, "stopped"), callbacks=[Stop()])
    assert not (d / "runs/stopped/summary.json").exists()
    # the lock is released: the same run can be resumed at once
    s = train_from_config(_cfg(d, st, "stopped"), resume=str(d / "runs/stopped/last.pt"))
    assert s["epochs"] == EPOCHS


def test_a_run_cut_by_max_steps_prints_steps_and_the_fraction_of_an_epoch(stores, capsys):
    d, st = stores
    rc = main(["train", "--config", "configs/criteo/deepfm.yaml", "--quiet", f"--data.train={st['train']}",
               f"--data.valid={st['valid']}", f"--data.test={st['test']}", f"--run.dir={d / 'runs'}",
               "--run.name=capped", "--train.epochs=2", "--data.batch_size=256", "--train.max_steps=3"])
    out = capsys.readouterr().out
    s = json.loads((d / "runs/capped/summary.json").read_text())
    per_epoch = -(-Store(st["train"]).num_rows // 256)  # batches of the training store (drop_last off)
    assert rc == 0 and s["steps"] == 3 and s["steps_per_epoch"] == per_epoch > 3
    assert s["epochs_trained"] == pytest.approx(3 / per_epoch, abs=1e-4)
    assert s["seconds_per_epoch"] == pytest.approx(s["train_seconds"] / s["epochs_trained"], rel=1e-3)
    assert f"best valid (step 3 of 3, in epoch 1): auc={s['best']['valid']['auc']:.5f}" in out
    assert f"3 steps ({3 / per_epoch:.2f} epochs, stopped by train.max_steps), " in out
    assert " of 0" not in out and "0 epochs" not in out and "0.0 s/epoch" not in out


def test_summary_says_why_a_run_stopped_early_or_on_its_time_budget(stores, capsys):
    """summary.json of an early-stopped run said "stopped_by": null; train.max_seconds is the time budget of a long
    CPU run: it stops, evaluates and checkpoints as early stopping does, and the summary says why (issue 27, 7)."""
    d, st = stores
    s = train_from_config(_cfg(d, st, "es", "train.eval_every=3", "train.early_stopping.patience=1",
                               "train.early_stopping.min_delta=1.0"))  # nothing improves by 1.0: stops at step 6
    on_disk = json.loads((d / "runs/es/summary.json").read_text())
    assert s["stopped_early"] and s["steps"] == 6
    assert on_disk["stopped_by"] == s["stopped_by"] == ("early stopping: auc did not improve for 1 evaluations "
                                                        "(train.early_stopping.patience=1)")
    rc = main(["train", "--config", "configs/criteo/deepfm.yaml", "--quiet", f"--data.train={st['train']}",
               f"--data.valid={st['valid']}", f"--data.test={st['test']}", f"--run.dir={d / 'runs'}",
               "--run.name=budget", "--train.epochs=1000", "--train.max_seconds=0.5", "--data.batch_size=256"])
    assert rc == 0
    s = json.loads((d / "runs/budget/summary.json").read_text())
    assert s["stopped_by"].startswith("train.max_seconds=0.5 (time budget spent after") and not s["stopped_early"]
    assert 0 < s["steps"] < 1000 * s["steps_per_epoch"] and s["last_valid"] and "test" in s
    assert Checkpoint.load(d / "runs/budget/last.pt").trainer.progress.step == s["steps"]
    assert "stopped by train.max_seconds=0.5" in capsys.readouterr().out


def test_a_full_disk_while_training_is_one_line_and_keeps_the_run(stores, tmp_path):
    """A real write failure (RLIMIT_FSIZE below a checkpoint's size: EFBIG, as a full disk gives ENOSPC) in a
    resumed `ctrkit train`: exit 2, one line, and best.pt, last.pt and metrics.jsonl as they were (issue 27, 4)."""
    import resource
    import subprocess
    import sys

    _, st = stores
    base = ["--config", "configs/criteo/deepfm.yaml", "--quiet", f"--data.train={st['train']}",
            f"--data.valid={st['valid']}", f"--data.test={st['test']}", f"--run.dir={tmp_path}", "--run.name=full",
            "--data.batch_size=256"]
    assert main(["train", *base, "--train.epochs=1"]) == 0
    run = tmp_path / "full"
    before = {n: (run / n).read_bytes() for n in ("best.pt", "last.pt", "metrics.jsonl")}
    limit = (run / "last.pt").stat().st_size // 2

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    p = subprocess.run([sys.executable, "-m", "ctrkit", "train", *base, "--train.epochs=2", "--resume",
                        str(run / "last.pt")], capture_output=True, text=True, preexec_fn=small_files, timeout=300,
                       check=False)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("ERROR")]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "cannot write the checkpoint" in lines[0] and "File too large" in lines[0]
    assert {n: (run / n).read_bytes() for n in before} == before
    assert not [x for x in run.iterdir() if ".tmp-" in x.name or ".kept-" in x.name]


def test_launcher_refuses_a_global_batch_that_does_not_split_before_starting_workers(stores, caplog):
    """`ctrkit train --nproc-per-node 2` with data.batch_size=255: one line, exit 2, no worker started (no run
    directory)."""
    d, st = stores
    rc = main(["train", "--config", "configs/criteo/deepfm.yaml", "--quiet", "--nproc-per-node", "2",
               f"data.train={st['train']}", f"run.dir={d / 'runs'}", "run.name=unsplit", "data.batch_size=255"])
    assert rc == 2
    assert "does not split evenly over 2 processes" in caplog.text
    assert not (d / "runs" / "unsplit").exists()
