"""Logistic regression, the baseline of every CTR comparison (and the "wide" part of many models).

Idea: one weight per id of every sparse feature and one per dense value, summed with a bias:

    logit = b + Σ_f w_f[id_f] + <w_d, x_dense - μ>          -> (B,)

Multi-valued features and pooled sequences contribute their pooled (sum / mean) weight. Sparse
weights are dim-1 embedding tables (``embedding_parameters()``), so the trainer updates them from sparse
gradients; they start at zero.

Centring: ``prefit`` (one pass over the training batches, run by ``train_from_config``) sets μ to the
training mean of the dense values and starts b at the logit of the label rate. ``b - <w_d, μ>`` is just
another bias, so the model and its optimum are those of plain LR on the raw values; but raw dense values with large means
(Criteo's ln(x+3), means 1-7 for stds 0.15-3) tie the bias to the dense weights and gradient steps crawl
along that valley: full-batch Adam on the Criteo sample ended 0.097 (RMS of the logits) from
scikit-learn's optimum after 150 steps without centring, 0.002 with it. Without ``prefit`` μ = 0.

Regularisation: ``l2`` > 0 adds to the mean log-loss of every batch (task penalty ``penalty/weights``)::

    loss = mean_b BCE(logit_b, y_b) + l2 · (Σ w_ids² + Σ w_d²)          (the bias is not penalised)

the objective of scikit-learn's ``LogisticRegression(C)`` on the same one-hot design divided by C·n
(n training rows), so ``l2 = 1 / (2·C·n)`` (benchmarks/lr_vs_sklearn.py compares the two). The penalty
walks the whole first-order table every step: cheap for these tables (one float per id), but for tables
of millions of ids prefer the trainer's mini-batch-aware ``train.embedding_l2`` and leave ``l2`` at 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ctrkit.batch import Batch
from ctrkit.models.base import CTRModel, ModelOutput, ParamGroup
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.inputs import LinearTerm
from ctrkit.schema import Schema


@register_model("lr")
class LogisticRegression(CTRModel):
    """``use_dense``: include the dense features' linear term (default True); ``l2``: the L2 penalty of
    the weights (not the bias) added to the loss (default 0: none)."""

    needs_prefit = True  # the dense means μ and the starting bias (module docstring)

    def __init__(self, schema: Schema, *, use_dense: bool = True, l2: float = 0.0) -> None:
        super().__init__()
        if l2 < 0:
            raise ConfigError(f"lr: l2 must be >= 0, got {l2}")
        self.l2 = float(l2)
        self.linear = LinearTerm(schema, use_dense=use_dense)
        nd = schema.num_dense if self.linear.dense is not None else 0
        self.register_buffer("dense_mean", torch.zeros(nd))  # μ (Nd,)

    @torch.no_grad()
    def prefit(self, batches: Iterable[Batch]) -> LogisticRegression:
        """μ = the mean dense values of ``batches``; the bias starts at the logit of their label rate."""
        n, positives = 0, 0.0
        total = torch.zeros(self.dense_mean.numel(), dtype=torch.float64)
        for b in batches:
            n += len(b)
            positives += float(b.labels.double().sum())
            if total.numel():
                total += b.dense.double().sum(0).cpu()
        if n:
            self.dense_mean.copy_(total / n)
            if self.linear.bias is not None:
                rate = min(max(positives / n, 1e-6), 1 - 1e-6)
                self.linear.bias.fill_(math.log(rate / (1 - rate)))
        return self

    def forward(self, batch: Batch) -> ModelOutput:
        logit = self.linear(batch)  # (B,)  b + Σ_f w_f[id_f] + <w_d, x>
        if self.linear.dense is not None:
            logit = logit - self.linear.dense(self.dense_mean)  # - <w_d, μ>  (1,)
        return ModelOutput(logit, {})

    def param_groups(self) -> list[ParamGroup]:
        """"weights" (id tables [R, 1] and the dense weight [1, Nd]) with the L2 penalty; none when l2 = 0."""
        if not self.l2:
            return []
        params = list(self.linear.ebc.embedding_parameters()) if self.linear.ebc is not None else []
        if self.linear.dense is not None:
            params.append(self.linear.dense.weight)
        return [ParamGroup("weights", params, l2=self.l2)]

    def _load_from_state_dict(self, state_dict: Mapping[str, Any], prefix: str, *args: Any) -> None:
        # checkpoints written before centring have no μ; their weights were fitted on uncentred values: μ = 0
        if prefix + "dense_mean" not in state_dict:
            state_dict = {**state_dict, prefix + "dense_mean": torch.zeros_like(self.dense_mean)}
        super()._load_from_state_dict(state_dict, prefix, *args)
