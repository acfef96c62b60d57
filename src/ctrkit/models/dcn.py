"""Deep & Cross Network (Wang et al., "Deep & Cross Network for Ad Click Predictions", ADKDD 2017;
seed 002 "Deep & cross", seed 001 §3 VectorCrossNet).

Idea: replace the wide part of Wide & Deep by a cross network that builds bounded-degree feature
crosses in O(N) parameters per layer, run it in parallel with a DNN over the same input, and feed
the concatenation of both outputs to one logistic unit.

    x_0 = [e_1; ...; e_F; dense]                                   (B, N),  N = sum D_f + Nd
    cross:  x_{l+1} = x_0 (x_l · w_l) + b_l + x_l                  w_l, b_l ∈ R^N     -> (B, N)
    deep:   h = MLP(x_0)                                                              -> (B, H)
    logit = w_out^T [x_L; h] + b_out                                                  -> (B,)

Field embeddings may have different dims (they are concatenated). ``dnn_hidden=()`` gives the
cross-only network.
"""

from __future__ import annotations

import torch
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._towers import DNNOptions, TowerHead, check_min, dnn_options
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import register_model
from ctrkit.nn.crossnet import VectorCrossNet
from ctrkit.nn.inputs import ZOO_INIT_STD, FieldEmbedding
from ctrkit.schema import Schema


@register_model("dcn")
class DCN(CTRModel):
    """DCN v1: ``cross_layers`` vector cross layers in parallel with a ``dnn_hidden`` MLP."""

    def __init__(
        self,
        schema: Schema,
        *,
        embedding_init_std: float | None = ZOO_INIT_STD,
        cross_layers: int = 3,
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        check_min("dcn", "cross_layers", cross_layers, 1)
        self.embedding = FieldEmbedding(schema, model="dcn", init_std=embedding_init_std)
        n = self.embedding.out_features + schema.num_dense
        self.cross = VectorCrossNet(n, num_layers=cross_layers)  # (B, N) -> (B, N)
        # logit = w^T [cross(x0); MLP(x0)] + b, or over the cross net alone for dnn_hidden=()
        self.head = TowerHead(self, n, dnn, side_features=n if dnn_options(self, dnn)["dnn_hidden"] else 0)

    def forward(self, batch: Batch) -> ModelOutput:
        x0 = torch.cat([self.embedding.concat(batch), batch.dense], dim=1)  # (B, N)
        if self.head.tower is None:
            return ModelOutput(self.head(self.cross(x0)), {})  # (B,)
        return ModelOutput(self.head(x0, side=self.cross(x0)), {})  # (B,)
