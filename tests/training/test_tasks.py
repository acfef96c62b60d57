"""CTRTask: the loss is BCE (sample weights) + the model's aux losses + its groups' penalties, logged by
name; evaluation equals the metric functions on the model's probabilities (GAUC with group ids)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.errors import ConfigError, MetricError, TrainingError
from ctrkit.metrics import evaluate_predictions
from ctrkit.models.base import CTRModel, ModelOutput, ParamGroup, logits_of
from ctrkit.training.tasks import CTRTask


def batch(n: int = 32, seed: int = 0, weights: bool = True) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch(
        dense=torch.randn(n, 3, generator=g),
        sparse=KeyedJagged.from_dense(["c"], torch.randint(0, 5, (n, 1), generator=g)),
        labels=torch.randint(0, 2, (n,), generator=g).float(),
        weights=torch.rand(n, generator=g) + 0.5 if weights else None,
        group_ids=torch.randint(0, 4, (n,), generator=g),
    )


class Linear(CTRModel):
    def __init__(self, aux: bool = False, penalty: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 1)
        self.aux, self.penalty = aux, penalty

    def forward(self, b: Batch) -> torch.Tensor | ModelOutput:
        logits = self.lin(b.dense).squeeze(1)
        if not self.aux:
            return logits
        return ModelOutput(logits, {"aux_a": 0.3 * logits.pow(2).mean(), "aux_b": self.lin.bias.abs().sum()})

    def param_groups(self) -> list[ParamGroup]:
        return [ParamGroup("head", [self.lin.weight], l1=0.1, l21=0.2)] if self.penalty else []


def test_plain_logits_loss_is_weighted_bce_and_logs_nothing():
    torch.manual_seed(0)
    model, b = Linear(), batch()
    loss, logs = CTRTask().bind(model).loss(model, b)
    logits = logits_of(model(b))
    manual = -(b.weights * (b.labels * torch.log(torch.sigmoid(logits))
                            + (1 - b.labels) * torch.log(1 - torch.sigmoid(logits)))).mean()
    torch.testing.assert_close(loss, manual)
    assert logs == {}


def test_watch_time_weighted_loss_weights_positives_only():
    """YouTubeDNN ranking (seed 002, 加权交叉熵): positives weighted by watch time, negatives by 1, by a loop."""
    torch.manual_seed(0)
    model, b = Linear(), batch(seed=3)
    loss, _ = CTRTask(sample_weight="positives").bind(model).loss(model, b)
    p = torch.sigmoid(logits_of(model(b))).tolist()
    total = 0.0
    for pi, y, w in zip(p, b.labels.tolist(), b.weights.tolist()):
        total += -w * torch.log(torch.tensor(pi)).item() if y == 1 else -torch.log(torch.tensor(1 - pi)).item()
    assert float(loss) == pytest.approx(total / len(p), rel=1e-5)
    with pytest.raises(ConfigError, match="sample_weight"):
        CTRTask(sample_weight="negatives")


def test_aux_losses_and_penalties_are_added_and_logged_by_name():
    torch.manual_seed(0)
    model, b = Linear(aux=True, penalty=True), batch()
    loss, logs = CTRTask().bind(model).loss(model, b)
    out = model(b)
    bce = nn.functional.binary_cross_entropy_with_logits(out.logits, b.labels, weight=b.weights)
    w = model.lin.weight
    penalty = 0.1 * w.abs().sum() + 0.2 * (w.pow(2).sum() + 1e-12).sqrt()  # one row: the (1, 3) weight
    torch.testing.assert_close(loss, bce + out.aux_losses["aux_a"] + out.aux_losses["aux_b"] + penalty)
    assert set(logs) == {"bce", "aux_a", "aux_b", "penalty/head"}
    torch.testing.assert_close(logs["bce"], bce)
    torch.testing.assert_close(logs["penalty/head"], penalty)
    assert all(not v.requires_grad for v in logs.values())
    loss.backward()
    assert model.lin.bias.grad is not None


def test_loss_needs_bind_and_a_ctr_model():
    model = Linear()
    with pytest.raises(TrainingError, match="call task.bind"):
        CTRTask().loss(model, batch())
    with pytest.raises(ConfigError, match="derive it from ctrkit.models.base.CTRModel"):
        CTRTask().bind(nn.Linear(3, 1))


def test_bad_metric_or_precision_fails_at_construction():
    with pytest.raises(MetricError, match="unknown metric 'acu'"):
        CTRTask(["acu"])
    with pytest.raises(ConfigError, match="precision 'fp16'"):
        CTRTask(precision="fp16")


@pytest.mark.parametrize("aux", [False, True])
def test_evaluate_equals_the_metric_functions(aux):
    torch.manual_seed(0)
    model = Linear(aux=aux).train()
    batches = [batch(40, seed=s) for s in range(3)]
    names = ["auc", "logloss", "gauc"]
    metrics = CTRTask(names).evaluate(model, batches)
    assert model.training  # mode restored
    with torch.no_grad():
        p = torch.cat([torch.sigmoid(model.lin(b.dense).squeeze(1)) for b in batches])
    expected = evaluate_predictions(names, p, torch.cat([b.labels for b in batches]),
                                    torch.cat([b.weights for b in batches]),
                                    torch.cat([b.group_ids for b in batches]))
    assert metrics == pytest.approx(expected, abs=1e-9)


def test_evaluate_empty_loader_is_a_training_error():
    with pytest.raises(TrainingError, match="evaluation data is empty"):
        CTRTask().evaluate(Linear(), [])


def test_bf16_runs_the_forward_under_autocast_and_keeps_the_loss_float32():
    model, b = Linear(), batch(weights=False)
    task = CTRTask(precision="bf16").bind(model)
    loss, _ = task.loss(model, b)
    assert loss.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = logits_of(model(b))
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(loss, nn.functional.binary_cross_entropy_with_logits(logits.float(), b.labels))
