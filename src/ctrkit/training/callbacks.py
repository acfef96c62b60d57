"""What the :class:`~ctrkit.training.trainer.Trainer` talks to besides the model: the loader protocol, the
:class:`Callback` hooks, and the running sums of the loss between two train records."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ctrkit.errors import TrainingError

if TYPE_CHECKING:
    from ctrkit.checkpoint import TrainProgress
    from ctrkit.training.config import EarlyStoppingConfig
    from ctrkit.training.trainer import Trainer

log = logging.getLogger(__name__)

# of a train record in metrics.jsonl (the rates under a train.lr_schedule: LRSchedule.record); loss parts join them
RECORD_FIELDS = ("kind", "step", "epoch", "loss", "lr", "embedding_lr", "wide_lr")


class Loader(Protocol):
    """What the trainer needs from a data loader (``ctrkit.data.storage.loader.BatchLoader`` has it)."""

    def __iter__(self) -> Any: ...
    def __len__(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Callback:
    """Hooks called by :class:`~ctrkit.training.trainer.Trainer`; override what you need. ``trainer.stop(reason)``
    ends the run the way early stopping does (checkpoints, summary and report written); raising aborts it."""

    def on_step(self, trainer: Trainer, step: int, loss: torch.Tensor) -> None: ...
    def on_eval(self, trainer: Trainer, metrics: dict[str, float]) -> None: ...
    def on_epoch_end(self, trainer: Trainer, epoch: int) -> None: ...
    def on_record(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """Every record written to metrics.jsonl (train and eval), as written; called without a run dir too."""


class RunningLoss:
    """Sums of the loss and of each logged part of it since the last train record, kept on the device (no host
    synchronisation per step); a part may come and go (e.g. a warm-up aux loss) and is averaged over its steps."""

    def __init__(self, device: torch.device) -> None:
        self.total = torch.zeros((), dtype=torch.float64, device=device)
        self.parts: dict[str, torch.Tensor] = {}
        self.part_n: dict[str, int] = {}
        self.n = 0

    def add(self, loss: torch.Tensor, logs: dict[str, torch.Tensor]) -> None:
        self.total += loss.detach().double()
        for k, v in logs.items():
            part = self.parts.get(k)
            if part is None and k in RECORD_FIELDS:
                raise TrainingError(f"the task logs a loss part named {k!r}, which is a field of the "
                                    f"metrics record {RECORD_FIELDS}; rename it (e.g. 'aux/{k}')")
            self.parts[k] = v.to(torch.float64, copy=True) if part is None else part.add_(v)
            self.part_n[k] = self.part_n.get(k, 0) + 1
        self.n += 1

    def pop(self) -> tuple[float, dict[str, float]]:
        """(mean loss, {part: mean}) since the last pop; the sums start again."""
        avg = float(self.total) / self.n
        parts = {k: float(v) / self.part_n[k] for k, v in self.parts.items()}
        self.total.zero_()
        self.parts.clear()
        self.part_n.clear()
        self.n = 0
        return avg, parts


def non_finite_error(model: nn.Module, loss: torch.Tensor, step: int, epoch: int) -> TrainingError:
    """The error of a non-finite loss at ``step`` (1-based), naming the first parameter whose gradient is
    non-finite."""
    culprit = None
    for name, p in model.named_parameters():
        g = p.grad
        if g is None:
            continue
        vals = g.coalesce().values() if g.is_sparse else g
        if not torch.isfinite(vals).all():
            culprit = name
            break
    where = f" first parameter with a non-finite gradient: {culprit!r}." if culprit else ""
    return TrainingError(
        f"loss is {float(loss.detach())} at step {step} (epoch {epoch}); training stopped "
        f"before applying it.{where} Lower train.lr, set train.grad_clip, or check the input "
        f"features for inf/NaN; resume from last.pt once fixed."
    )


def track_evaluation(p: TrainProgress, es: EarlyStoppingConfig, maximise: bool, metrics: dict[str, float],
                     counts: bool = True) -> bool:
    """Record an evaluation in the progress ``p`` (best metric, early stopping by ``es``); True when it improved.
    ``counts`` False: an evaluation without improvement does not count towards early stopping (the count stays 0;
    a plateau schedule that can still lower the rates). Under several processes every rank decides alike."""
    p.last_eval = {"step": p.step, **metrics}
    value = metrics.get(es.metric)
    improved = value is not None and not math.isnan(value) and (
        p.best_metric is None or (value > p.best_metric + es.min_delta if maximise
                                  else value < p.best_metric - es.min_delta))
    if improved:
        p.best_metric, p.best_step, p.bad_evals = float(value), p.step, 0
        p.best_eval = {"step": p.step, "epoch": p.epoch, **metrics}
    else:
        p.bad_evals = p.bad_evals + 1 if counts else 0
    if es.patience > 0 and p.bad_evals >= es.patience:
        p.stopped_early = True
        log.info("early stopping at step %d: %s did not improve for %d evaluations (best %.6g at %s)",
                 p.step, es.metric, p.bad_evals, p.best_metric or float("nan"), p.best_step)
    return improved


def stopped_by(reason: str | None, p: TrainProgress, es: EarlyStoppingConfig) -> str | None:
    """Why a run ended before its epochs (summary.json's ``stopped_by``): the reason given to ``Trainer.stop`` (a
    pruner, train.max_seconds), else early stopping by ``es``, else None."""
    if reason is None and p.stopped_early:
        return (f"early stopping: {es.metric} did not improve for {es.patience} evaluations "
                f"(train.early_stopping.patience={es.patience})")
    return reason
