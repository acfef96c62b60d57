"""DeepFM (Guo et al., "DeepFM: A Factorization-Machine based Neural Network for CTR Prediction",
IJCAI 2017; seed 002 "DeepFM").

Idea: Wide & Deep with the wide part replaced by a factorization machine; the FM and the DNN share
the same field embeddings, so no feature engineering is needed for the wide part.

    first  = Σ_f w[id_f] + <w_d, dense>              no bias (seed: "no bias, no activation")  (B,)
    second = Σ_{i<j} <e_i, e_j>                       over the sparse field embeddings          (B,)
    dnn    = w_o^T MLP([e_1; ...; e_F; dense])        output unit without bias                  (B,)
    logit  = first + second + dnn + b                 b: one global bias (option ``bias``)

Seed 002 ("实现细节") puts no bias in the first-order part nor in the DNN output unit; we keep a
single global scalar ``b`` (``bias=True``, zero-initialised) so the model can fit the base rate —
``bias=False`` gives the seed's form exactly. Every field must share one embedding dim D.
"""

from __future__ import annotations

import torch
from torch import nn
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._towers import DNNOptions, TowerHead
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import register_model
from ctrkit.nn.fm import FMInteraction
from ctrkit.nn.inputs import ZOO_INIT_STD, FieldEmbedding, LinearTerm, field_and_linear
from ctrkit.schema import Schema


@register_model("deepfm")
class DeepFM(CTRModel):
    """FM (first + second order) plus a DNN over the shared embeddings and the dense features."""

    def __init__(
        self,
        schema: Schema,
        *,
        embedding_init_std: float | None = ZOO_INIT_STD,
        bias: bool = True,
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        self.embedding = FieldEmbedding(schema, model="deepfm", init_std=embedding_init_std)
        _ = self.embedding.embedding_dim  # a ConfigError naming deepfm when dims differ (the FM needs one D)
        self.linear = LinearTerm(schema, bias=False)  # (B,)
        self.fm = FMInteraction()  # (B, F, D) -> (B, 1)
        n = self.embedding.out_features + schema.num_dense
        self.deep = TowerHead(self, n, dnn, bias=False)  # (B, N) -> (B,)
        self.bias = nn.Parameter(torch.zeros(1)) if bias else None

    def forward(self, batch: Batch) -> ModelOutput:
        pooled, first = field_and_linear(self.embedding, self.linear, batch)  # one lookup of both; first (B,)
        emb = pooled.stacked()  # (B, F, D)
        second = self.fm(emb).squeeze(-1)  # (B,)
        deep = self.deep(torch.cat([emb.flatten(1), batch.dense], dim=1))  # (B, F*D + Nd) -> (B,)
        logit = first + second + deep  # (B,)
        if self.bias is not None:
            logit = logit + self.bias
        return ModelOutput(logit, {})
