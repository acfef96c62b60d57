"""Logistic regression, the baseline of every CTR comparison (and the "wide" part of many models).

Idea: one weight per id of every sparse feature and one per dense value, summed with a bias:

    logit = b + Σ_f w_f[id_f] + <w_d, x_dense>          -> (B,)

Multi-valued features and pooled sequences contribute their pooled (sum / mean) weight. Sparse
weights are dim-1 embedding tables (``embedding_parameters()``), so the trainer updates them from sparse
gradients; they start at zero.
"""

from __future__ import annotations

import torch

from ctrkit.batch import Batch
from ctrkit.models.base import CTRModel
from ctrkit.models.registry import register_model
from ctrkit.nn.inputs import LinearTerm
from ctrkit.schema import Schema


@register_model("lr")
class LogisticRegression(CTRModel):
    """``use_dense``: include the dense features' linear term (default True)."""

    def __init__(self, schema: Schema, *, use_dense: bool = True) -> None:
        super().__init__()
        self.linear = LinearTerm(schema, use_dense=use_dense)

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.linear(batch)  # (B,)
