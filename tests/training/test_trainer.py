"""Trainer: learns a planted signal, early stopping, NaN guard, exact resume, run directory; trains
through a Task, logs every part of the loss by name, keeps the model apart from the module it steps.
The model, loader and config doubles (shared with test_rundir.py and test_averaging.py) are in trainer_doubles.py."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from trainer_doubles import MemLoader, TinyCTR, make_data, resume_after_kill, tiny_cfg, tiny_loaders

from ctrkit.batch import Batch
from ctrkit.checkpoint import Checkpoint
from ctrkit.errors import ConfigError, TrainingError
from ctrkit.metrics import roc_auc
from ctrkit.models.base import ModelOutput, ParamGroup, logits_of
from ctrkit.training.callbacks import Callback
from ctrkit.training.config import EarlyStoppingConfig
from ctrkit.training.distributed import TaskStep
from ctrkit.training.tasks import CTRTask
from ctrkit.training.trainer import Trainer


def test_learns_planted_signal_and_writes_run_dir(tmp_path):
    torch.manual_seed(0)
    train, valid = tiny_loaders()
    tr = Trainer(TinyCTR(), train, tiny_cfg(epochs=3, sparse_optimizer="rowwise_adagrad"), valid_loader=valid,
                 run_dir=tmp_path / "run", metrics=("auc", "logloss", "gauc"))
    summary = tr.fit()
    assert summary["last_eval"]["auc"] > 0.7 and summary["steps"] == 3 * len(train)
    # the trainer's AUC is the same as the metric function on the model's predictions
    preds, labels = [], []
    tr.model.eval()
    with torch.no_grad():
        for b in valid:
            preds.append(torch.sigmoid(logits_of(tr.model(b))))
            labels.append(b.labels)
    assert summary["last_eval"]["auc"] == pytest.approx(roc_auc(torch.cat(preds), torch.cat(labels)), abs=1e-9)
    run = tmp_path / "run"
    assert {p.name for p in run.iterdir()} >= {"config.yaml", "metrics.jsonl", "best.pt", "last.pt"}
    lines = [json.loads(s) for s in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in lines if r["kind"] == "eval"]
    assert len(evals) == 3 and all("gauc" in r for r in evals)
    assert any(r["kind"] == "train" and math.isfinite(r["loss"]) for r in lines)
    ck = Checkpoint.load(run / "last.pt")
    assert ck.trainer.progress.step == summary["steps"] and ck.trainer.progress.epoch_complete


def test_early_stopping_triggers():
    train, valid = tiny_loaders()
    es = EarlyStoppingConfig(metric="logloss", patience=2, min_delta=1.0)  # nothing improves by 1.0
    summary = Trainer(TinyCTR(), train, tiny_cfg(epochs=5, eval_every=4, early_stopping=es), valid_loader=valid).fit()
    assert summary["stopped_early"] and summary["steps"] == 12 and summary["best_step"] == 4


def test_nan_guard_names_step_and_parameter():
    data = make_data(640)
    data["dense"][3 * 64 + 5, 1] = float("inf")  # in the 4th batch (no shuffle)
    model = TinyCTR(dropout=0.0)
    with pytest.raises(TrainingError, match=r"step 4 \(epoch 0\).*'(emb|lin)\.weight'"):
        Trainer(model, MemLoader(data, 64), tiny_cfg(epochs=1)).fit()
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the bad step was not applied


class AuxNaN(TinyCTR):
    def forward(self, batch: Batch) -> ModelOutput:
        return ModelOutput(super().forward(batch), {"bad": self.lin.weight.sum() * float("nan")})


def test_aux_losses_are_added():
    with pytest.raises(TrainingError, match="step 1"):
        Trainer(AuxNaN(), tiny_loaders()[0], tiny_cfg()).fit()


class WithAux(TinyCTR):
    """An auxiliary loss (0.1 * the logits' mean square) and an L1/L2/L2,1-penalised group (the Linear)."""

    def forward(self, batch: Batch) -> ModelOutput:
        logits = super().forward(batch)
        return ModelOutput(logits, {"aux_sq": 0.1 * logits.pow(2).mean()})

    def param_groups(self) -> list[ParamGroup]:
        return [ParamGroup("head", [self.lin.weight], l1=1e-3, l2=1e-2, l21=1e-3)]


def test_every_part_of_the_loss_is_logged_by_name(tmp_path):
    torch.manual_seed(0)
    train, valid = tiny_loaders(n_train=640)
    seen = []

    class Parts(Callback):
        def on_step(self, trainer, step, loss):
            seen.append(float(loss))

    tr = Trainer(WithAux(dropout=0.0), train, tiny_cfg(epochs=1, log_every=4), valid_loader=valid,
                 run_dir=tmp_path / "run", callbacks=[Parts()])
    tr.fit()
    records = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    assert len(train_records) == len(train) // 4 == 2
    for r in train_records:
        assert set(r) == {"kind", "step", "epoch", "loss", "bce", "aux_sq", "penalty/head"}
        assert r["aux_sq"] > 0 and r["penalty/head"] > 0 and r["bce"] > 0
        assert r["loss"] == pytest.approx(r["bce"] + r["aux_sq"] + r["penalty/head"], rel=1e-6)
    # "loss" is the mean of the per-step losses of the last log_every steps
    assert train_records[0]["loss"] == pytest.approx(sum(seen[:4]) / 4, rel=1e-6)
    assert train_records[1]["loss"] == pytest.approx(sum(seen[4:8]) / 4, rel=1e-6)


class WarmupAux(TinyCTR):
    """An auxiliary loss of 1.0 on odd calls only (a part that comes and goes, e.g. after a warm-up)."""

    def __init__(self, name: str = "aux_odd") -> None:
        super().__init__(dropout=0.0)
        self.name, self.calls = name, 0

    def forward(self, batch: Batch):
        logits = super().forward(batch)
        self.calls += 1
        if self.calls % 2:
            return ModelOutput(logits, {self.name: logits.new_ones(())})
        return logits


def test_a_part_is_averaged_over_the_steps_that_logged_it(tmp_path):
    train, _ = tiny_loaders(n_train=512)
    Trainer(WarmupAux(), train, tiny_cfg(epochs=1, log_every=4), run_dir=tmp_path / "run").fit()
    records = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    parts = [r["aux_odd"] for r in records if r["kind"] == "train"]
    assert parts == [1.0, 1.0]  # logged in 2 of every 4 steps, each time 1.0 (not 2/4)


@pytest.mark.parametrize("name", ["loss", "step"])
def test_a_part_named_like_a_record_field_is_refused(tmp_path, name):
    train, _ = tiny_loaders(n_train=128)
    with pytest.raises(TrainingError, match=f"loss part named {name!r}.*rename it"):
        Trainer(WarmupAux(name), train, tiny_cfg(epochs=1), run_dir=tmp_path / "run").fit()


def test_plain_logits_log_only_the_loss(tmp_path):
    train, _ = tiny_loaders(n_train=320)
    Trainer(TinyCTR(), train, tiny_cfg(epochs=1, log_every=5), run_dir=tmp_path / "run").fit()
    records = [json.loads(s) for s in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {tuple(sorted(r)) for r in records if r["kind"] == "train"} == {("epoch", "kind", "loss", "step")}


class CountingWrapper(nn.Module):
    """Stands in for a DDP / torchrec wrapper: forwards to the model and counts the calls."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model
        self.calls = 0

    def forward(self, batch: Batch):
        self.calls += 1
        return self.inner(batch)


def test_module_is_stepped_model_is_checkpointed(tmp_path):
    train, valid = tiny_loaders(n_train=320)
    tr = Trainer(TinyCTR(), train, tiny_cfg(epochs=1), valid_loader=valid, run_dir=tmp_path / "run")
    assert isinstance(tr.module, TaskStep) and tr.module.model is tr.model  # one process: no DDP wrapper
    tr.module = CountingWrapper(tr.module)
    summary = tr.fit()
    assert tr.module.calls == summary["steps"]  # every train step goes through the module; evaluation does not
    state = Checkpoint.load(tmp_path / "run" / "last.pt").weights
    assert set(state) == set(tr.model.state_dict())  # the unwrapped model's keys, no "inner." prefix
    assert all(not k.startswith("inner.") for k in state)


def test_trainer_needs_a_ctr_model():
    class Plain(nn.Module):
        def forward(self, batch):
            return batch.dense[:, 0]

    with pytest.raises(ConfigError, match="derive it from ctrkit.models.base.CTRModel"):
        Trainer(Plain(), tiny_loaders()[0], tiny_cfg())


def test_given_task_is_used_and_must_have_the_early_stopping_metric():
    train, valid = tiny_loaders(n_train=320)
    tr = Trainer(TinyCTR(), train, tiny_cfg(epochs=1), valid_loader=valid, task=CTRTask(["logloss", "accuracy"]))
    assert tr.metric_names == ["logloss", "accuracy"]
    assert set(tr.fit()["last_eval"]) == {"step", "logloss", "accuracy"}
    es = EarlyStoppingConfig(metric="auc", patience=2)
    with pytest.raises(ConfigError, match="early_stopping.metric 'auc' is not one of the task's metrics"):
        Trainer(TinyCTR(), train, tiny_cfg(early_stopping=es), task=CTRTask(["logloss"]))
    with pytest.raises(ConfigError, match="metrics= or task="):
        Trainer(TinyCTR(), train, tiny_cfg(), metrics=["auc"], task=CTRTask(["logloss"]))



class GradNorm(Callback):
    def __init__(self) -> None:
        self.norms = []

    def on_step(self, trainer, step, loss):
        g = torch.cat([p.grad.reshape(-1) for p in trainer.optimizer.dense_params])
        self.norms.append(float(g.norm()))




@pytest.mark.parametrize("kill_at", [7, 25])  # mid-epoch 0, and mid-epoch 1 after an eval
def test_resume_is_exact(tmp_path, kill_at):
    cfg = tiny_cfg(epochs=2, eval_every=10, checkpoint_every=1, sparse_optimizer="adagrad")
    full, full_summary, resumed, summary, run = resume_after_kill(tmp_path, cfg, kill_at)
    assert summary["steps"] == full_summary["steps"] == 2 * 16
    for (name, p), q in zip(full.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name
    assert summary["best_metric"] == full_summary["best_metric"]
    # without RNG / loader restore the weights would differ: a fresh run from another seed does
    other = run(tmp_path / "other", init_seed=99)
    assert not torch.equal(other.model.emb.weight, full.model.emb.weight)


def test_max_steps_and_grad_clip():
    cb = GradNorm()
    train, valid = tiny_loaders()
    summary = Trainer(TinyCTR(), train, tiny_cfg(max_steps=9, grad_clip=0.05, lr=0.5), valid_loader=valid,
                      callbacks=[cb]).fit()
    assert summary["steps"] == 9 and len(cb.norms) == 9
    assert max(cb.norms) <= 0.05 + 1e-6


def test_the_trainer_leaves_the_allocator_alone(monkeypatch):
    """Allocator tuning is the train job's option (train.keep_freed_memory), not something the Trainer does to the
    process of a program that uses it."""
    from ctrkit import memory

    calls = []
    monkeypatch.setattr(memory, "keep_freed_memory", lambda *a, **k: calls.append(1))
    train, _ = tiny_loaders(n_train=128, bs=64)
    Trainer(TinyCTR(), train, tiny_cfg(epochs=1, keep_freed_memory=True)).fit()
    assert calls == []


def test_bf16_autocast_trains():
    train, valid = tiny_loaders(n_train=640)
    summary = Trainer(TinyCTR(), train, tiny_cfg(precision="bf16"), valid_loader=valid).fit()
    assert math.isfinite(summary["last_eval"]["logloss"])


def test_empty_training_data_is_a_clear_error():
    empty = MemLoader({k: v[:0] for k, v in make_data(10).items()}, 64)
    with pytest.raises(TrainingError, match="training data is empty"):
        Trainer(TinyCTR(), empty, tiny_cfg()).fit()
