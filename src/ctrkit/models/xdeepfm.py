"""xDeepFM (Lian et al., "xDeepFM: Combining Explicit and Implicit Feature Interactions for
Recommender Systems", KDD 2018; seed 002 "XDeepFM").

Idea: three parts summed into one logit — a linear part (memorisation), a Compressed Interaction
Network building explicit vector-wise interactions of bounded order, and a DNN for implicit ones.

    linear = b + Σ_f w[id_f] + <w_d, dense>                                           (B,)
    cin    = w_c^T [p^1; ...; p^L],  p^k_h = Σ_d X^k_{h,d}  (sum pooling per layer)    (B,)
    dnn    = w_o^T MLP([e_1; ...; e_F; dense])                                         (B,)
    logit  = linear + cin + dnn

CIN works on the sparse field embeddings only (seed: "只针对sparse feature 的 embedding"); with
``split_half`` every CIN layer but the last sends half of its maps to the output (xDeepFM's code).
The CIN and DNN output units have no bias (the linear part holds the one bias), as DeepCTR-Torch.
With the identity activation, ``CIN.logit`` folds the output unit into the maps that only feed the
output (exact, same parameters and gradients), which is most of xDeepFM's cost.
"""

from __future__ import annotations

import torch
from torch import nn
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._towers import DNNOptions, TowerHead, layer_options
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import register_model
from ctrkit.nn.cin import CIN
from ctrkit.nn.inputs import ZOO_INIT_STD, FieldEmbedding, LinearTerm, field_and_linear
from ctrkit.schema import Schema


@register_model("xdeepfm")
class XDeepFM(CTRModel):
    """Linear + CIN (``cin_layer_sizes``, ``split_half``, ``cin_activation``) + DNN (``dnn_hidden``)."""

    def __init__(
        self,
        schema: Schema,
        *,
        embedding_init_std: float | None = ZOO_INIT_STD,
        cin_layer_sizes: tuple[int, ...] = (128, 128),
        split_half: bool = True,
        cin_activation: str = "identity",
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        self.embedding = FieldEmbedding(schema, model="xdeepfm", init_std=embedding_init_std)
        d = self.embedding.embedding_dim  # ConfigError naming xdeepfm when dims differ
        f = self.embedding.num_fields
        self.linear = LinearTerm(schema)  # (B,)
        with layer_options("xdeepfm", "cin_layer_sizes / split_half / cin_activation"):
            self.cin = CIN(f, d, layer_sizes=cin_layer_sizes, split_half=split_half, activation=cin_activation)
        self.cin_out = nn.Linear(self.cin.out_features, 1, bias=False)
        n = self.embedding.out_features + schema.num_dense
        self.deep = TowerHead(self, n, dnn, bias=False)  # (B, N) -> (B,)

    def forward(self, batch: Batch) -> ModelOutput:
        pooled, first = field_and_linear(self.embedding, self.linear, batch)  # one lookup of both; first (B,)
        emb = pooled.stacked()  # (B, F, D)
        cin = self.cin.logit(emb, self.cin_out.weight)  # = cin_out(cin(emb)), (B,); folded when identity
        deep = self.deep(torch.cat([emb.flatten(1), batch.dense], dim=1))  # (B, F*D + Nd) -> (B,)
        return ModelOutput(first + cin + deep, {})  # (B,)
