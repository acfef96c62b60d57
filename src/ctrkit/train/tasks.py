"""Tasks: what a model is trained to do, i.e. its loss and its evaluation.

The :class:`~ctrkit.train.trainer.Trainer` knows nothing about labels or metrics: each step it calls
``task.loss(module, batch) -> (loss, logs)`` and at each evaluation ``task.evaluate(module, loader)``.
A task is bound once to the unwrapped model (``task.bind(model)``) to take what it needs from the
model's declarations (its penalised parameter groups); ``module`` is what the trainer steps (the
model itself, or a DDP / torchrec wrapper around it).

:class:`CTRTask`, click-through prediction::

    out    = model(batch)                       # logits (B,) or ModelOutput(logits, aux_losses)
    bce    = BCEWithLogits(logits, labels, weights)           (float32, outside autocast)
    loss   = bce + Σ aux_losses + Σ_groups penalty(group)
    logs   = {"bce", each aux loss by name, "penalty/<group>"}   (empty when loss is just bce)

evaluated with :class:`~ctrkit.metrics.MetricSet` on ``sigmoid(logits)`` (AUC, LogLoss, GAUC with
the batches' group ids, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from ctrkit.batch import Batch
from ctrkit.errors import ConfigError, TrainingError
from ctrkit.metrics import MetricSet
from ctrkit.models.base import CTRModel, ModelOutput, ParamGroup

PRECISIONS = ("fp32", "bf16")


class Task:
    """The loss and the evaluation of one learning problem (subclass and override all three)."""

    metric_names: list[str]

    def bind(self, model: CTRModel) -> Task:
        """Take what the task needs from the unwrapped model's declarations; returns self."""
        return self

    def loss(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(scalar loss to minimise, named parts to log: auxiliary losses, penalties, ...)."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, loader: Iterable[Batch]) -> dict[str, float]:
        """Metrics of ``model`` over every batch of ``loader``."""
        raise NotImplementedError


class CTRTask(Task):
    """Binary click prediction: BCE with logits (sample weights honoured) + the model's auxiliary
    losses + its parameter groups' penalties; metrics from :class:`~ctrkit.metrics.MetricSet`.

    ``precision="bf16"`` runs the model's forward under autocast; the loss stays float32.
    """

    def __init__(self, metrics: Sequence[str] = ("auc", "logloss"), *, precision: str = "fp32") -> None:
        if precision not in PRECISIONS:
            raise ConfigError(f"CTRTask: precision {precision!r} is not one of {PRECISIONS}")
        MetricSet(metrics)  # unknown metric names fail here, not at the first evaluation
        self.metric_names = list(metrics)
        self.precision = precision
        self._penalised: list[ParamGroup] | None = None  # set by bind()

    def bind(self, model: CTRModel) -> CTRTask:
        if not isinstance(model, CTRModel):
            raise ConfigError(f"CTRTask trains a ctrkit CTRModel; got {type(model).__name__} "
                              "(derive it from ctrkit.models.base.CTRModel)")
        self._penalised = [g for g in model.param_groups() if g.penalised]
        return self

    def _autocast(self, batch: Batch) -> Any:
        if self.precision == "bf16":
            return torch.autocast(device_type=batch.labels.device.type, dtype=torch.bfloat16)
        return nullcontext()

    def loss(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self._penalised is None:
            raise TrainingError("CTRTask.loss: call task.bind(model) first (it collects the model's penalties)")
        with self._autocast(batch):
            out = model(batch)  # (B,) or ModelOutput
        aux = out.aux_losses if isinstance(out, ModelOutput) else None
        logits = out.logits if aux is not None else out
        bce = nn.functional.binary_cross_entropy_with_logits(logits.float(), batch.labels, weight=batch.weights)
        if not aux and not self._penalised:
            return bce, {}
        loss = bce
        logs = {"bce": bce.detach()}
        for name, value in (aux or {}).items():
            loss = loss + value
            logs[name] = value.detach()
        for group in self._penalised:
            penalty = group.penalty()
            loss = loss + penalty
            logs[f"penalty/{group.name}"] = penalty.detach()
        return loss, logs

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Iterable[Batch]) -> dict[str, float]:
        """Metrics on ``loader`` (the model in eval mode, put back as it was afterwards)."""
        was_training = model.training
        model.eval()
        ms = MetricSet(self.metric_names)
        groups = "gauc" in self.metric_names
        try:
            for batch in loader:
                with self._autocast(batch):
                    out = model(batch)
                logits = out.logits if isinstance(out, ModelOutput) else out
                ms.update(torch.sigmoid(logits.float()), batch.labels, batch.weights,
                          batch.group_ids if groups else None)
        finally:
            model.train(was_training)
        if len(ms) == 0:
            raise TrainingError("evaluation data is empty: the loader yielded no rows")
        return ms.compute()
