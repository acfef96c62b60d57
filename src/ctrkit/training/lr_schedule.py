"""Learning-rate schedules (``train.lr_schedule``): every optimizer's rates as one scale over the run.

Each optimizer parameter group g of the :class:`~ctrkit.training.optim.OptimizerSet` (dense, embedding: torch's
fused Adam, Adagrad, SGD, :class:`~ctrkit.training.optim.RowWiseAdagrad`, :class:`~ctrkit.training.optim.LazyAdam`)
keeps its configured rate ``base_g`` (``train.lr``, ``train.embedding_lr``); before every optimizer step its ``lr``
is set from the schedule, so each optimizer reads it where it reads its rate anyway (no optimizer is wrapped):

- ``linear``, with t the steps done so far, W = ``warmup_steps``, T the run's planned steps, e = ``end_factor``::

      lr_g(t) = base_g * (t + 1) / W                                  t < W   (warm-up)
      lr_g(t) = base_g * (1 - (1 - e) * min(t - W, T - W) / (T - W))  t >= W  (decay to e * base_g at t = T)

- ``plateau``: after every evaluation, an evaluation that did not improve the early-stopping metric (the same
  decision as early stopping's: metric, mode, min_delta) adds one to a count; when the count passes ``patience``
  every rate becomes ``max(lr_g * factor, floor_g)`` with ``floor_g = min(min_lr, base_g)`` and the count starts
  again (torch's ReduceLROnPlateau, FuxiCTR's reduce_lr_on_plateau). An improvement resets the count.
  Early stopping then counts only the evaluations made with every rate at its floor: a run reduces its rates while
  it can and stops after ``early_stopping.patience`` more evaluations without improvement at the floor. With
  ``min_lr: 0`` no rate reaches its floor, so plateau with early stopping needs ``min_lr > 0`` (refused otherwise).

The schedule's state (plateau: reductions made, the count; linear: the planned steps) rides in the checkpoint's
trainer state: a resume continues it, a warm start (a new run) begins a fresh one. FTRL (``train.wide_optimizer:
ftrl``) is refused: its alpha enters the closed-form weights, so changing it mid-run moves every weight at once.
Tables sharded by torchrec (stepped by fused optimizers in backward) are refused as well.
"""

from __future__ import annotations

import logging
from typing import Any

from ctrkit.errors import ConfigError, TrainingError

log = logging.getLogger(__name__)

SETTINGS = ("factor", "patience", "min_lr", "end_factor", "warmup_steps")  # LRScheduleConfig's fields but type


class LRSchedule:
    """The rates of an optimizer set's groups under ``config`` (a
    :class:`~ctrkit.training.config.LRScheduleConfig`); ``state_dict`` / ``load_state_dict`` for checkpoints."""

    def __init__(self, config: Any, optimizer: Any) -> None:
        self.config = config
        self.optimizer = optimizer  # its groups are looked up anew each time: load_state_dict replaces them
        self.base = [float(g["lr"]) for g in self.groups()]  # the configured rates
        self.floor = [min(config.min_lr, b) for b in self.base]
        self.total_steps: int | None = None  # linear: the run's planned steps, fixed by start()
        self.reductions = 0  # plateau: how many times the rates were multiplied by factor
        self.bad_evals = 0  # plateau: evaluations without improvement since the last improvement or reduction

    # ---- linear ---------------------------------------------------------------------------------------
    def start(self, total_steps: int) -> None:
        """At the start of fit(): the run's planned steps (a resumed run keeps the ones it started with)."""
        if self.total_steps is None:
            self.total_steps = int(total_steps)
        self.apply(None)

    def factor_at(self, step: int) -> float:
        """linear: the scale of the configured rates for the optimizer step after ``step`` steps."""
        cfg, total = self.config, self.total_steps or 0
        warm = cfg.warmup_steps
        if step < warm:
            return (step + 1) / warm
        if total <= warm:
            return 1.0
        return 1.0 - (1.0 - cfg.end_factor) * min(step - warm, total - warm) / (total - warm)

    @property
    def counts_for_early_stopping(self) -> bool:
        """Whether early stopping counts the next evaluation: always, except under plateau above the floor."""
        return self.config.type != "plateau" or self.at_floor

    def before_step(self, step: int) -> None:
        """Set the rates of the optimizer step after ``step`` steps (linear; plateau's move at evaluations)."""
        if self.config.type == "linear":
            self.apply(step)

    # ---- plateau --------------------------------------------------------------------------------------
    def rates(self, step: int | None = None) -> list[float]:
        """The rate of every group now (plateau) or for the step after ``step`` steps (linear)."""
        if self.config.type == "linear":
            scale = self.factor_at(step or 0)
            return [b * scale for b in self.base]
        scale = self.config.factor ** self.reductions
        return [max(b * scale, f) for b, f in zip(self.base, self.floor, strict=True)]

    @property
    def at_floor(self) -> bool:
        """plateau: every rate at its floor (no reduction can lower any)."""
        return all(r <= f for r, f in zip(self.rates(), self.floor, strict=True))

    def on_eval(self, improved: bool) -> None:
        """plateau: count an evaluation (``improved`` as early stopping decided) and reduce the rates when the
        count passes ``patience``."""
        if self.config.type != "plateau":
            return
        if improved:
            self.bad_evals = 0
            return
        self.bad_evals += 1
        if self.bad_evals > self.config.patience and not self.at_floor:
            self.reductions += 1
            self.bad_evals = 0
            self.apply(None)
            log.info("lr_schedule plateau: no improvement for %d evaluations, rates x %g -> %s",
                     self.config.patience + 1, self.config.factor, [f"{r:.3g}" for r in self.rates()])

    def groups(self) -> list[dict[str, Any]]:
        return [g for o in self.optimizer.optimizers for g in o.param_groups]

    def apply(self, step: int | None) -> None:
        if self.config.type == "none":
            return  # the rates as configured (or as a resumed checkpoint's optimizer state holds them), untouched
        for g, rate in zip(self.groups(), self.rates(step), strict=True):
            g["lr"] = rate

    # ---- checkpoints ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any] | None:
        if self.config.type == "none":
            return None
        return {"type": self.config.type, "total_steps": self.total_steps, "reductions": self.reductions,
                "bad_evals": self.bad_evals, "settings": self.settings()}

    def settings(self) -> dict[str, Any]:
        """The configured values besides the type (factor, patience, min_lr, end_factor, warmup_steps)."""
        return {k: getattr(self.config, k) for k in SETTINGS}

    def record(self) -> dict[str, float]:
        """The rates the last step used, for the train records of metrics.jsonl: ``lr`` (dense), ``embedding_lr``,
        ``wide_lr`` (the first group of each optimizer there is); nothing under type none (the configured rates)."""
        if self.config.type == "none":
            return {}
        opt = self.optimizer
        named = (("lr", opt.dense), ("embedding_lr", opt.sparse), ("wide_lr", opt.wide))
        return {k: float(o.param_groups[0]["lr"]) for k, o in named if o is not None and o.param_groups}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total_steps, self.reductions = state["total_steps"], int(state["reductions"])
        self.bad_evals = int(state["bad_evals"])
        self.apply(None)


def lr_schedule(train: Any, optimizer: Any, sharded: bool) -> LRSchedule:
    """The schedule of a :class:`~ctrkit.training.config.TrainConfig`'s ``lr_schedule`` over ``optimizer`` (``type:
    none``: one that touches nothing, the rates stay as configured); ``sharded``: the run has torchrec tables."""
    cfg = train.lr_schedule
    if cfg.type == "none":
        return LRSchedule(cfg, optimizer)
    if train.wide_optimizer == "ftrl":
        raise ConfigError(f"train.lr_schedule.type={cfg.type} cannot schedule FTRL (train.wide_optimizer=ftrl): its "
                          "alpha enters the closed-form weights, so changing it mid-run moves every weight at once; "
                          "set train.lr_schedule.type=none or train.wide_optimizer=default")
    if sharded:
        raise ConfigError(f"train.lr_schedule.type={cfg.type} is not supported with tables sharded by torchrec (their "
                          "optimizers are fused in backward); set train.lr_schedule.type=none or use the default "
                          "embedding backend")
    if cfg.type == "plateau" and cfg.warmup_steps:
        raise ConfigError(f"train.lr_schedule.warmup_steps={cfg.warmup_steps} is for type=linear; plateau has no "
                          "warm-up: set it to 0 or use type=linear")
    if cfg.type == "plateau" and cfg.min_lr == 0 and train.early_stopping.patience > 0:
        raise ConfigError(f"train.lr_schedule.min_lr=0 with type=plateau: early stopping (patience "
                          f"{train.early_stopping.patience}) counts only evaluations with every rate at min_lr, "
                          "which 0 never reaches; set train.lr_schedule.min_lr > 0 (e.g. 1e-6) or "
                          "train.early_stopping.patience=0")
    return LRSchedule(cfg, optimizer)


def restore_schedule(schedule: LRSchedule, state: dict[str, Any] | None, path: Any) -> None:
    """A checkpoint's schedule ``state`` into ``schedule``; a checkpoint of another schedule type, or of the same type
    with other settings (a checkpoint written before settings were saved is not checked), is refused."""
    saved, wanted = state["type"] if state is not None else "none", schedule.config.type
    if saved != wanted:
        raise TrainingError(f"cannot resume from {path}: it was trained with train.lr_schedule.type={saved} and this "
                            f"run asks for {wanted}; resume with train.lr_schedule.type={saved} (or start a new run)")
    ours = schedule.settings()
    changed = {k: v for k, v in (state or {}).get("settings", {}).items() if ours.get(k) != v}
    if changed:
        was = " ".join(f"train.lr_schedule.{k}={v}" for k, v in changed.items())
        now = ", ".join(f"{k}={ours.get(k)}" for k in changed)
        raise TrainingError(f"cannot resume from {path}: it was trained with {was} and this run asks for {now}; "
                            f"resume with {was} (or start a new run: --warm-start {path} begins a fresh schedule)")
    if state is not None:
        schedule.load_state_dict(state)
