"""Run directories: one training at a time (a lock), a new run does not mix into an old one, a resumed run
continues in its own directory with one train record per step, and scores its test split with best.pt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_doubles import Crash, TinyCTR, tiny_cfg, tiny_loaders

from ctrkit.checkpoint import Checkpoint
from ctrkit.cli import main
from ctrkit.errors import ConfigError, TrainingError
from ctrkit.jobs.common import resolve_device
from ctrkit.jobs.demo import SAMPLE
from ctrkit.jobs.scoring import evaluate_store
from ctrkit.training.callbacks import Callback
from ctrkit.training.rundir import RunLock
from ctrkit.training.trainer import Trainer


def _records(run: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


class StartAnother(Callback):
    """At its first step, tries a second training into the same run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.error = run_dir, None

    def on_step(self, trainer, step, loss):
        if step == 1:
            train, _ = tiny_loaders(n_train=128)
            try:
                Trainer(TinyCTR(), train, tiny_cfg(epochs=1), run_dir=self.run_dir).fit()
            except TrainingError as e:
                self.error = str(e)


def test_a_second_training_in_a_running_directory_is_refused(tmp_path):
    run = tmp_path / "run"
    train, valid = tiny_loaders(n_train=256)
    other = StartAnother(run)
    Trainer(TinyCTR(), train, tiny_cfg(epochs=2, log_every=1), valid_loader=valid, run_dir=run,
            callbacks=[other]).fit()
    assert other.error and "is in use by another training" in other.error
    steps = [r["step"] for r in _records(run) if r["kind"] == "train"]
    assert steps == list(range(1, 9))  # only the first training's records: 2 epochs x 4 batches
    lock = RunLock(run).acquire()  # released when fit() ended
    lock.release()


def test_a_killed_training_leaves_no_lock(tmp_path):
    train, _ = tiny_loaders(n_train=256)
    with pytest.raises(KeyboardInterrupt):
        Trainer(TinyCTR(), train, tiny_cfg(epochs=1), run_dir=tmp_path / "run", callbacks=[Crash(2)]).fit()
    RunLock(tmp_path / "run").acquire().release()


def test_a_new_run_refuses_an_old_runs_directory_unless_overwrite(tmp_path):
    run = tmp_path / "run"
    train, valid = tiny_loaders(n_train=256)
    Trainer(TinyCTR(), train, tiny_cfg(epochs=1), valid_loader=valid, run_dir=run).fit()
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(TrainingError, match=r"already holds a run \(metrics.jsonl, best.pt, last.pt"):
        Trainer(TinyCTR(), train, tiny_cfg(epochs=1), valid_loader=valid, run_dir=run).fit()
    assert (run / "metrics.jsonl").read_text() == before
    Trainer(TinyCTR(), train, tiny_cfg(epochs=1), valid_loader=valid, run_dir=run, overwrite=True).fit()
    assert len(_records(run)) == len(before.splitlines())  # replaced, not appended
    fresh = tmp_path / "stopped_early_on"  # a run that stopped before any record leaves only config.yaml
    fresh.mkdir()
    (fresh / "config.yaml").write_text("train: {}\n")
    Trainer(TinyCTR(), train, tiny_cfg(epochs=1), valid_loader=valid, run_dir=fresh).fit()
    assert (fresh / "best.pt").is_file()


def test_a_resumed_run_writes_one_train_record_per_step(tmp_path):
    cfg = tiny_cfg(epochs=2, eval_every=10, log_every=1)  # last.pt at steps 10, 20, ...; killed at 15

    def run(run_dir, **kw):
        torch.manual_seed(0)
        train, valid = tiny_loaders(n_train=1000)
        return Trainer(TinyCTR(), train, cfg, valid_loader=valid, run_dir=run_dir, **kw)

    run(tmp_path / "full").fit()
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut", callbacks=[Crash(15)]).fit()
    assert max(r["step"] for r in _records(tmp_path / "cut")) == 15
    run(tmp_path / "cut", resume_from=tmp_path / "cut" / "last.pt").fit()
    got, want = _records(tmp_path / "cut"), _records(tmp_path / "full")
    train_steps = [r["step"] for r in got if r["kind"] == "train"]
    assert train_steps == list(range(1, 33))  # steps 11..15 trained twice, recorded once
    assert [r["step"] for r in got if r["kind"] == "eval"] == [r["step"] for r in want if r["kind"] == "eval"]
    assert [r["loss"] for r in got if r["kind"] == "train"] == [r["loss"] for r in want if r["kind"] == "train"]


def test_resume_continues_in_its_run_and_tests_with_best_weights(tmp_path, capsys):
    from ctrkit.data.sources.criteo import preprocess_criteo
    from ctrkit.data.storage.store import Store

    stores = preprocess_criteo(SAMPLE, tmp_path / "st", min_freq=8, embedding_dim=8, progress=False)
    base = ["train", "--config", "configs/criteo/dlrm.yaml", "--quiet", f"--data.train={stores['train']}",
            f"--data.valid={stores['valid']}", f"--data.test={stores['test']}", f"--run.dir={tmp_path / 'runs'}",
            "--model.params.dense_arch=[8]", "--model.params.over_arch=[8]", "--train.lr=0.05"]
    assert main([*base, "--run.name=x", "--train.epochs=2"]) == 0
    capsys.readouterr()
    run = tmp_path / "runs" / "x"
    n_records = len(_records(run))
    # resume without --run.name: today's CLI would start a new timestamped run and test the last weights
    assert main([*base, "--train.epochs=4", "--resume", str(run / "last.pt")]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["x"]
    assert f"run: {run}" in out
    recs = _records(run)
    assert len(recs) > n_records and [r["epoch"] for r in recs if r["kind"] == "eval"] == [0, 1, 2, 3]
    best = Checkpoint.load(run / "best.pt").trainer.progress
    evals = [r for r in recs if r["kind"] == "eval"]
    assert best.step == max(evals, key=lambda r: r["auc"])["step"]
    ckpt = Checkpoint.load(run / "best.pt")
    want = evaluate_store(ckpt.build_model(), Store(stores["test"]), ckpt.feature_pipeline())
    assert f"auc={want['auc']:.5f}" in out.split("test with best.pt:")[1]


def test_a_device_this_machine_lacks_is_a_clear_error(tmp_path):
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="train.device=cuda but this machine has no usable CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(ConfigError, match="not a device name"):
        resolve_device("gpu0")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_train_on_cuda_without_a_gpu_is_one_clear_line(tmp_path, caplog):
    rc = main(["train", "--config", "configs/criteo/dlrm.yaml", "--quiet", "--data.train=nowhere",
               "--train.device=cuda"])
    assert rc == 2 and "train.device=cuda but this machine has no usable CUDA GPU" in caplog.text
