"""How a training ends besides its epochs, and what a failed write leaves (issue 27, items 4, 6 and 7).

* ``train.max_seconds``: a time budget; the run stops, evaluates and checkpoints as early stopping does, and
  ``stopped_by`` says why (as it now does for early stopping, which said null).
* A checkpoint or record that cannot be written (disk full; here a real EFBIG from RLIMIT_FSIZE, or a writer
  that fails after best.pt) is one TrainingError, and the run directory is left as it was after the last whole
  checkpoint: best.pt, last.pt and metrics.jsonl agree, and resuming from last.pt ends where a run that never
  failed ends.
"""

from __future__ import annotations

import errno
import json
import resource
import time

import pytest
import torch
from trainer_doubles import TinyCTR, tiny_cfg, tiny_loaders

from ctrkit.checkpoint import Checkpoint
from ctrkit.errors import CheckpointError, ConfigError, TrainingError
from ctrkit.training import rundir
from ctrkit.training.callbacks import Callback
from ctrkit.training.config import EarlyStoppingConfig, config_from_dict
from ctrkit.training.trainer import Trainer
from ctrkit.training.writer import CheckpointWriter


class Slow(Callback):
    def on_step(self, trainer, step, loss):
        time.sleep(0.01)  # steps of a known least length, so the budget ends the run long before its epochs


def test_max_seconds_stops_evaluates_and_checkpoints(tmp_path):
    train, valid = tiny_loaders()
    cfg = tiny_cfg(epochs=100, max_seconds=0.3)  # 100 epochs of >= 10 ms steps: >= 19 s without the budget
    t0 = time.monotonic()
    s = Trainer(TinyCTR(), train, cfg, valid_loader=valid, run_dir=tmp_path / "run", callbacks=[Slow()]).fit()
    assert time.monotonic() - t0 < 10
    assert s["stopped_by"].startswith("train.max_seconds=0.3 (time budget spent after")
    assert 0 < s["steps"] < 100 * len(train) and not s["stopped_early"]
    assert s["last_eval"]["step"] == s["steps"]  # evaluated where it stopped
    assert Checkpoint.load(tmp_path / "run" / "last.pt").trainer.progress.step == s["steps"]
    assert (tmp_path / "run" / "best.pt").is_file()
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=r"config key 'train.max_seconds' expects float > 0"):
            config_from_dict({"train": {"max_seconds": bad}})


def test_early_stopping_says_so_in_stopped_by():
    train, valid = tiny_loaders()
    es = EarlyStoppingConfig(metric="logloss", patience=2, min_delta=1.0)  # nothing improves by 1.0
    s = Trainer(TinyCTR(), train, tiny_cfg(epochs=5, eval_every=4, early_stopping=es), valid_loader=valid).fit()
    assert s["stopped_early"] and s["stopped_by"] == ("early stopping: logloss did not improve for 2 evaluations "
                                                      "(train.early_stopping.patience=2)")
    s = Trainer(TinyCTR(), train, tiny_cfg(epochs=1), valid_loader=valid).fit()
    assert s["stopped_by"] is None  # a run that trained all its epochs


def _files(run):
    return {n: (run / n).read_bytes() for n in ("best.pt", "last.pt", "metrics.jsonl") if (run / n).exists()}


class DiskFullAfterFirstEval(Callback):
    """After the first evaluation's checkpoints: files may not grow past ``limit`` bytes (RLIMIT_FSIZE; Python
    ignores SIGXFSZ, so a write past it fails with EFBIG, as a full disk fails with ENOSPC)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.saved, self.after_first = limit, None, None

    def on_eval(self, trainer, metrics):
        if self.saved is None:
            self.after_first = _files(trainer.run_dir)
            self.saved = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, self.saved[1]))

    def restore(self):
        if self.saved is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, self.saved)


def _run(run_dir, callbacks=(), resume=None):
    torch.manual_seed(0)
    train, valid = tiny_loaders(n_train=1000)
    return Trainer(TinyCTR(), train, tiny_cfg(epochs=3, eval_every=5), valid_loader=valid, run_dir=run_dir,
                   callbacks=callbacks, resume_from=resume)


def test_a_full_disk_while_checkpointing_keeps_the_last_whole_checkpoint(tmp_path):
    run = tmp_path / "cut"
    full = _run(tmp_path / "full")
    full.fit()
    size = (tmp_path / "full" / "last.pt").stat().st_size
    cut = DiskFullAfterFirstEval(limit=size // 2)  # metrics.jsonl stays far below; a checkpoint does not fit
    try:
        with pytest.raises(TrainingError) as e:
            _run(run, callbacks=[cut]).fit()
    finally:
        cut.restore()
    msg = str(e.value)
    assert "\n" not in msg and "cannot write the checkpoint" in msg and "File too large" in msg
    assert "kept as it was after step 5" in msg and "--resume" in msg
    assert _files(run) == cut.after_first  # best.pt, last.pt and the records of step 5, byte for byte
    assert sorted(p.name for p in run.iterdir()) == [".lock", "best.pt", "config.yaml", "last.pt", "metrics.jsonl"]
    resumed = _run(run, resume=run / "last.pt")
    resumed.fit()
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)  # consistent: it resumes to the run that never failed
    assert _records(run) == _records(tmp_path / "full")  # every step once, the same values


def _records(run):
    return [{k: v for k, v in json.loads(ln).items() if k != "train_seconds"}
            for ln in (run / "metrics.jsonl").read_text().splitlines()]


class FailsOnLastAfter(CheckpointWriter):
    """best.pt is written, then last.pt fails (disk full), at the second evaluation."""

    def __init__(self, run_dir) -> None:
        super().__init__(run_dir)
        self.at_10: list[str] = []

    def write(self, name, model, optimizer, state):
        if state.progress.step == 10:
            self.at_10.append(name)
        if name == "last.pt" and state.progress.step == 10:
            raise CheckpointError(f"cannot write the checkpoint {self.run_dir / name} (No space left on device)")
        return super().write(name, model, optimizer, state)


def test_best_written_then_last_failing_puts_best_back(tmp_path):
    run = tmp_path / "run"
    train, valid = tiny_loaders(n_train=1000)
    seen = {}

    class Keep(Callback):
        def on_eval(self, trainer, metrics):
            seen.setdefault("first", _files(run))

    es = EarlyStoppingConfig(metric="logloss")
    writer = FailsOnLastAfter(run)
    tr = Trainer(TinyCTR(), train, tiny_cfg(epochs=3, eval_every=5, early_stopping=es), valid_loader=valid,
                 run_dir=run, writer=writer, callbacks=[Keep()])
    with pytest.raises(TrainingError, match="No space left on device.*kept as it was after step 5"):
        tr.fit()
    assert writer.at_10 == ["best.pt", "last.pt"]  # step 10 improved: best.pt was rewritten, then last.pt failed
    assert _files(run) == seen["first"]
    assert not [p for p in run.iterdir() if ".kept-" in p.name or ".tmp-" in p.name]


def test_a_record_that_cannot_be_appended_rolls_back_to_the_checkpoint(tmp_path, monkeypatch):
    run = tmp_path / "run"
    calls = {"n": 0}
    real = rundir.append_record

    def append(run_dir, record):
        calls["n"] += 1
        if record["kind"] == "train" and record["step"] > 5:
            with open(run_dir / "metrics.jsonl", "a") as f:
                f.write('{"kind": "tra')  # a line cut short by the full disk
            raise OSError(errno.ENOSPC, "No space left on device")
        real(run_dir, record)

    monkeypatch.setattr(rundir, "append_record", append)
    train, valid = tiny_loaders(n_train=1000)
    tr = Trainer(TinyCTR(), train, tiny_cfg(epochs=3, eval_every=5, log_every=5), valid_loader=valid,
                 run_dir=run)
    with pytest.raises(TrainingError, match=r"cannot append to .*metrics.jsonl \(No space left on device\); the "
                                            r"run directory .* kept as it was after step 5"):
        tr.fit()
    records = (run / "metrics.jsonl").read_text().splitlines()
    assert records[-1].startswith('{"kind": "eval", "step": 5') and Checkpoint.load(
        run / "last.pt").trainer.progress.step == 5
