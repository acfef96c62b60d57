"""train.lr_schedule (training/lr_schedule.py): linear warm-up + decay step by step against a hand computation,
plateau's reductions and early stopping against scripted metrics, every optimizer reading the scheduled rate,
resume continuing the schedule, a warm start beginning a fresh one, bad values refused, type none touching nothing."""

from __future__ import annotations

import json

import pytest
import torch
from trainer_doubles import TinyCTR, resume_after_kill, tiny_cfg, tiny_loaders

from ctrkit.checkpoint import Checkpoint
from ctrkit.errors import ConfigError, TrainingError
from ctrkit.training.callbacks import Callback
from ctrkit.training.config import LRScheduleConfig, config_from_dict
from ctrkit.training.lr_schedule import LRSchedule, lr_schedule
from ctrkit.training.optim import build_optimizers
from ctrkit.training.tasks import CTRTask
from ctrkit.training.trainer import Trainer
from ctrkit.training.warm_start import load_grown_optimizer


class Rates(Callback):
    """Every group's rate after each step (the rate that step used) and after each evaluation."""

    def __init__(self) -> None:
        self.steps: list[list[float]] = []
        self.evals: list[list[float]] = []

    def on_step(self, trainer, step, loss):
        self.steps.append([g["lr"] for o in trainer.optimizer.optimizers for g in o.param_groups])

    def on_eval(self, trainer, metrics):
        self.evals.append([g["lr"] for o in trainer.optimizer.optimizers for g in o.param_groups])


class ScriptedAUC(CTRTask):
    """A CTRTask whose evaluations return the given AUCs in turn (the model is not evaluated)."""

    def __init__(self, aucs: list[float]) -> None:
        super().__init__(["auc"])
        self.aucs = list(aucs)

    def evaluate(self, model, loader, gather=None):
        return {"auc": self.aucs.pop(0)}


def test_linear_rates_follow_warmup_then_decay_step_by_step():
    train, _ = tiny_loaders(n_train=640)  # 10 batches of 64 -> 10 planned steps
    rates = Rates()
    cfg = tiny_cfg(lr=0.02, embedding_lr=0.1, lr_schedule=LRScheduleConfig("linear", warmup_steps=3, end_factor=0.1))
    Trainer(TinyCTR(), train, cfg, callbacks=[rates]).fit()
    # by hand: steps 1-3 at 1/3, 2/3, 1 of the rates; then from 1 at t = 3 down to 0.1 at t = T = 10 (never reached)
    hand = [1 / 3, 2 / 3, 1.0] + [1 - 0.9 * k / 7 for k in range(7)]
    assert [round(h, 12) for h in hand[3:6]] == [1.0, round(1 - 0.9 / 7, 12), round(1 - 1.8 / 7, 12)]
    assert len(rates.steps) == 10
    for got, f in zip(rates.steps, hand, strict=True):
        assert got == pytest.approx([0.02 * f, 0.1 * f], rel=1e-12)


@pytest.mark.parametrize("dense,sparse,sparse_grad", [
    ("adam", "adagrad", True), ("adamw", "rowwise_adagrad", True), ("sgd", "sparse_adam", True),
    ("adagrad", "sgd", True), ("adam", "sparse_adam", False)])  # dense table gradient: LazyAdam's native CPU kernel
def test_every_optimizer_steps_with_the_scheduled_rate(dense, sparse, sparse_grad):
    """One step at a quarter of the rates (warm-up step 1 of 4) is bit for bit one step of optimizers built with a
    quarter of the rates: torch's fused Adam, Adagrad, SGD, RowWiseAdagrad and LazyAdam (sparse and dense
    gradients, the latter through the native kernel where it is built) all read the group's lr."""
    def one_step(**kw):
        torch.manual_seed(0)
        train, _ = tiny_loaders(n_train=64)
        model = TinyCTR()
        model.emb.sparse = sparse_grad
        tr = Trainer(model, train, tiny_cfg(dense_optimizer=dense, sparse_optimizer=sparse, max_steps=1, **kw))
        tr.fit()
        return [p.detach().clone() for p in tr.model.parameters()]

    scheduled = one_step(lr=0.02, embedding_lr=0.1, lr_schedule=LRScheduleConfig("linear", warmup_steps=4))
    quarter = one_step(lr=0.005, embedding_lr=0.025)
    full = one_step(lr=0.02, embedding_lr=0.1)
    for a, b, c in zip(scheduled, quarter, full, strict=True):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, c) for a, c in zip(scheduled, full, strict=True))


def test_plateau_reduces_exactly_when_the_metric_stalls():
    model = TinyCTR()
    opt = build_optimizers(model, tiny_cfg(lr=0.02, embedding_lr=0.1))
    sched = LRSchedule(LRScheduleConfig("plateau", factor=0.5, patience=1, min_lr=0.01), opt)
    dense, emb = opt.dense.param_groups[0], opt.sparse.param_groups[0]
    seen = []
    for improved in [True, False, False, True, False, False, False, False, False, False]:
        sched.on_eval(improved)
        seen.append((dense["lr"], emb["lr"], sched.at_floor))
    assert seen == [(0.02, 0.1, False), (0.02, 0.1, False),
                    (0.01, 0.05, False),  # 2nd evaluation without improvement (patience 1): halved
                    (0.01, 0.05, False), (0.01, 0.05, False),
                    (0.01, 0.025, False),  # dense held at min_lr
                    (0.01, 0.025, False), (0.01, 0.0125, False), (0.01, 0.0125, False),
                    (0.01, 0.01, True)]  # 0.00625 -> min_lr: both at their floor


def test_plateau_then_early_stopping_counts_only_at_the_floor():
    """AUCs 0.6, 0.7, then stalled: two reductions (0.1 -> 0.05 -> 0.025 = min_lr, both rates), then early
    stopping's patience 2 counted at the floor only."""
    train, valid = tiny_loaders(n_train=640)
    rates = Rates()
    sched = LRScheduleConfig("plateau", factor=0.5, patience=0, min_lr=0.025)
    cfg = tiny_cfg(lr=0.1, embedding_lr=0.1, eval_every=1, epochs=3, lr_schedule=sched)
    cfg.early_stopping.patience = 2
    aucs = [0.6, 0.7] + [0.65] * 20
    tr = Trainer(TinyCTR(), train, cfg, valid_loader=valid, task=ScriptedAUC(aucs), callbacks=[rates])
    summary = tr.fit()
    # evaluations 3, 4 halve the rates (0.1 -> 0.05 -> 0.025 = floor); 5 and 6 count; early stopping after 6
    assert [r[0] for r in rates.evals] == [0.1, 0.1, 0.05, 0.025, 0.025, 0.025]
    assert summary["steps"] == 6 and summary["stopped_early"] and tr.schedule.reductions == 2
    plain = tiny_cfg(lr=0.1, embedding_lr=0.1, eval_every=1, epochs=3)
    plain.early_stopping.patience = 2
    no_schedule = Trainer(TinyCTR(), train, plain, valid_loader=valid, task=ScriptedAUC(aucs)).fit()
    assert no_schedule["steps"] == 4  # without the schedule: stopped at the 2nd evaluation without improvement


@pytest.mark.parametrize("kind", ["linear", "plateau"])
def test_resume_continues_the_schedule(tmp_path, kind):
    sched = (LRScheduleConfig("linear", warmup_steps=5, end_factor=0.2) if kind == "linear"
             else LRScheduleConfig("plateau", factor=0.5, patience=0, min_lr=1e-4))
    cfg = tiny_cfg(epochs=2, eval_every=10, checkpoint_every=1, lr_schedule=sched)
    cfg.early_stopping.min_delta = 1.0  # plateau: no evaluation after the first improves -> a reduction at each
    full, full_summary, resumed, summary, _ = resume_after_kill(tmp_path, cfg, 25)
    assert summary["steps"] == full_summary["steps"] == 32
    assert resumed.schedule.state_dict() == full.schedule.state_dict()
    if kind == "plateau":
        assert full.schedule.reductions == 3  # evaluations at steps 20, 30, 32
    for p, q in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)
    rate = [g["lr"] for o in resumed.optimizer.optimizers for g in o.param_groups]
    assert rate == [g["lr"] for o in full.optimizer.optimizers for g in o.param_groups]


def test_resume_refuses_another_schedule_and_warm_start_begins_a_fresh_one(tmp_path):
    train, valid = tiny_loaders(n_train=640)
    sched = LRScheduleConfig("plateau", factor=0.5, patience=0, min_lr=1e-4)
    cfg = tiny_cfg(eval_every=2, lr_schedule=sched)
    cfg.early_stopping.min_delta = 1.0
    first = Trainer(TinyCTR(), train, cfg, valid_loader=valid, run_dir=tmp_path / "a")
    first.fit()
    assert first.schedule.reductions == 4
    with pytest.raises(TrainingError, match=r"lr_schedule.type=plateau and this run asks for none"):
        Trainer(TinyCTR(), train, tiny_cfg(epochs=2), resume_from=tmp_path / "a" / "last.pt")
    ckpt = Checkpoint.load(tmp_path / "a" / "last.pt")
    assert ckpt.optimizer["dense"]["param_groups"][0]["lr"] == pytest.approx(0.02 / 16)
    warm = Trainer(TinyCTR(), train, cfg, valid_loader=valid)  # a new run: its optimizer states from the checkpoint
    assert load_grown_optimizer(warm.optimizer, ckpt, {}, {"dense": True, "sparse": True}) == ["dense", "sparse"]
    assert warm.optimizer.sparse.state  # the states are the checkpoint's...
    assert [warm.optimizer.dense.param_groups[0]["lr"], warm.optimizer.sparse.param_groups[0]["lr"]] == [0.02, 0.1]
    assert warm.schedule.state_dict() == {"type": "plateau", "total_steps": None, "reductions": 0, "bad_evals": 0,
                                          "settings": {"factor": 0.5, "patience": 0, "min_lr": 1e-4,
                                                       "end_factor": 0.0, "warmup_steps": 0}}


@pytest.mark.parametrize("changed,match", [
    ({"factor": 0.25}, r"train.lr_schedule.factor=0.5 and this run asks for factor=0.25"),
    ({"min_lr": 1e-3, "patience": 1}, (r"train.lr_schedule.patience=0 train.lr_schedule.min_lr=0.0001 and this run "
                                      r"asks for patience=1, min_lr=0.001")),
])
def test_resume_refuses_the_same_type_with_other_settings(tmp_path, changed, match):
    train, valid = tiny_loaders(n_train=640)
    sched = {"factor": 0.5, "patience": 0, "min_lr": 1e-4}
    Trainer(TinyCTR(), train, tiny_cfg(eval_every=2, lr_schedule=LRScheduleConfig("plateau", **sched)),
            valid_loader=valid, run_dir=tmp_path / "a").fit()
    other = tiny_cfg(eval_every=2, lr_schedule=LRScheduleConfig("plateau", **{**sched, **changed}))
    with pytest.raises(TrainingError, match=match):
        Trainer(TinyCTR(), train, other, valid_loader=valid, resume_from=tmp_path / "a" / "last.pt")
    same = tiny_cfg(eval_every=2, lr_schedule=LRScheduleConfig("plateau", **sched))  # the same settings resume
    assert Trainer(TinyCTR(), train, same, valid_loader=valid, resume_from=tmp_path / "a" / "last.pt").step == 10


def test_train_records_carry_the_rates_each_step_used(tmp_path):
    train, _ = tiny_loaders(n_train=640)  # 10 steps, a train record every 5
    rates = Rates()
    cfg = tiny_cfg(lr=0.02, embedding_lr=0.1, lr_schedule=LRScheduleConfig("linear", warmup_steps=3, end_factor=0.1))
    Trainer(TinyCTR(), train, cfg, run_dir=tmp_path / "r", callbacks=[rates]).fit()
    records = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    logged = [(r["step"], r["lr"], r["embedding_lr"]) for r in records if r["kind"] == "train"]
    assert logged == [(s, *rates.steps[s - 1]) for s in (5, 10)]
    assert logged[0][1] != logged[1][1]  # the decay shows
    Trainer(TinyCTR(), train, tiny_cfg(), run_dir=tmp_path / "none").fit()  # type none: the records as before
    plain = [json.loads(line) for line in (tmp_path / "none" / "metrics.jsonl").read_text().splitlines()]
    assert all("lr" not in r and "embedding_lr" not in r for r in plain if r["kind"] == "train")


def test_type_none_touches_no_rate_and_checkpoints_no_state(tmp_path):
    train, valid = tiny_loaders(n_train=320)
    torch.manual_seed(0)
    tr = Trainer(TinyCTR(), train, tiny_cfg(), valid_loader=valid, run_dir=tmp_path / "r")
    groups = [g for o in tr.optimizer.optimizers for g in o.param_groups]
    before = [id(g["lr"]) for g in groups]
    tr.fit()
    assert [id(g["lr"]) for g in groups] == before  # the very same float objects: never assigned
    assert Checkpoint.load(tmp_path / "r" / "last.pt").trainer.lr_schedule is None
    torch.manual_seed(0)  # a linear schedule at factor 1 throughout trains the same weights bit for bit
    flat = Trainer(TinyCTR(), train, tiny_cfg(lr_schedule=LRScheduleConfig("linear", end_factor=1.0)),
                   valid_loader=valid)
    flat.fit()
    for p, q in zip(tr.model.parameters(), flat.model.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("override,match", [
    ({"factor": -0.5}, r"train.lr_schedule.factor"),
    ({"factor": 1.0}, r"train.lr_schedule.factor"),
    ({"type": "cosine"}, r"train.lr_schedule.type"),
    ({"end_factor": 1.5}, r"train.lr_schedule.end_factor"),
    ({"min_lr": -1e-3}, r"train.lr_schedule.min_lr"),
    ({"warmup_steps": -1}, r"train.lr_schedule.warmup_steps"),
])
def test_bad_values_are_refused_naming_the_option(override, match):
    with pytest.raises(ConfigError, match=match):
        config_from_dict({"train": {"lr_schedule": override}})


def test_combinations_the_schedule_cannot_honour_are_refused():
    train, _ = tiny_loaders(n_train=64)
    plateau = LRScheduleConfig("plateau", factor=0.5)
    cfg = tiny_cfg(lr_schedule=plateau)
    cfg.early_stopping.patience = 2
    with pytest.raises(ConfigError, match=r"train.lr_schedule.min_lr=0 with type=plateau.*min_lr > 0"):
        Trainer(TinyCTR(), train, cfg)
    with pytest.raises(ConfigError, match=r"warmup_steps=3 is for type=linear"):
        Trainer(TinyCTR(), train, tiny_cfg(lr_schedule=LRScheduleConfig("plateau", warmup_steps=3)))


def test_ftrl_and_torchrec_sharded_tables_are_refused_naming_the_option():
    linear = LRScheduleConfig("linear")
    with pytest.raises(ConfigError, match=r"cannot schedule FTRL \(train.wide_optimizer=ftrl\).*lr_schedule.type=none"):
        lr_schedule(tiny_cfg(wide_optimizer="ftrl", lr_schedule=linear), None, sharded=False)
    with pytest.raises(ConfigError, match=r"train.lr_schedule.type=linear is not supported with tables sharded"):
        lr_schedule(tiny_cfg(lr_schedule=linear), None, sharded=True)
