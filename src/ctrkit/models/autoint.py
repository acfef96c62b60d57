"""AutoInt / AutoInt+ (Song et al., "AutoInt: Automatic Feature Interaction Learning via
Self-Attentive Neural Networks", CIKM 2019; seed 002 "AutoInt").

Idea: treat every feature as a field vector and let stacked multi-head self-attention layers with
residual connections learn which fields to combine, giving explicit high-order interactions.

    e_f = embedding of sparse field f;  e_m = v_m x_m for dense feature m (paper §4.2)   (B, M, D)
    X^0 = [e_1..e_M],   X^l = ReLU(MHSA(X^{l-1}) + X^{l-1} W_res)                      (B, M, H·d')
    AutoInt:  logit = w^T flat(X^L) + b
    AutoInt+: logit = w^T [flat(X^L); MLP([e_1; ...; e_F; dense])] + b    (a parallel DNN)

Every dense feature m becomes one more field through its own learned vector v_m (``M = F + Nd``),
as the paper embeds numerical features; attention is unscaled (the paper) unless ``scaled``.
Every sparse field must share one embedding dim D.
"""

from __future__ import annotations

from types import MappingProxyType

import torch
from torch import nn
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._towers import DNNOptions, TowerHead, check_min, dnn_options, layer_options
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.attention import MultiHeadSelfAttention, SelfAttentionStack
from ctrkit.nn.inputs import ZOO_INIT_STD, FieldEmbedding
from ctrkit.schema import Schema


@register_model("autoint")
class AutoInt(CTRModel):
    """``num_layers`` interacting layers (``num_heads`` × ``head_dim``, default D // num_heads),
    a Linear over their flattened output, and with ``autoint_plus`` a parallel DNN (``dnn_hidden``)."""

    renamed_options = MappingProxyType({"attention_layers": "num_layers"})

    def __init__(
        self,
        schema: Schema,
        *,
        embedding_init_std: float | None = ZOO_INIT_STD,
        num_layers: int = 3,
        num_heads: int = 2,
        head_dim: int | None = None,
        use_residual: bool = True,
        scaled: bool = False,
        autoint_plus: bool = False,
        dense_as_fields: bool = True,
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        tower = dnn_options(self, dnn)  # checked even when autoint_plus=False leaves them unused
        check_min("autoint", "num_layers", num_layers, 1)
        check_min("autoint", "num_heads", num_heads, 1)
        self.embedding = FieldEmbedding(schema, model="autoint", init_std=embedding_init_std)
        d = self.embedding.embedding_dim  # ConfigError naming autoint when dims differ
        f = self.embedding.num_fields
        nd = schema.num_dense
        # dense_as_fields (the paper, §4.2): one learned vector per dense feature, e_m = v_m x_m, attended
        # like the sparse fields; otherwise (DeepCTR's AutoInt) dense values feed the DNN / the head only.
        na = nd if dense_as_fields else 0
        self.dense_vectors = nn.Parameter(torch.randn(na, d) * d**-0.5) if na else None
        self.attention = SelfAttentionStack()
        width = d
        with layer_options("autoint", "num_heads / head_dim"):
            for _ in range(num_layers):
                layer = MultiHeadSelfAttention(width, num_heads=num_heads, head_dim=head_dim,
                                               use_residual=use_residual, scaled=scaled)
                self.attention.append(layer)
                width = layer.out_features
        n_att = (f + na) * width
        self.autoint_plus = bool(autoint_plus)
        self.dense_to_head = nd > 0 and not dense_as_fields and not autoint_plus
        if autoint_plus:  # w^T [flat(X^L); MLP([e_1; ...; e_F; dense])] + b
            if not tower["dnn_hidden"]:
                raise ConfigError("autoint: autoint_plus=True needs a non-empty dnn_hidden")
            self.head = TowerHead(self, self.embedding.out_features + nd, tower, side_features=n_att)
        else:  # w^T [flat(X^L); dense if dense_to_head] + b
            self.head = TowerHead(self, n_att + (nd if self.dense_to_head else 0))

    def forward(self, batch: Batch) -> ModelOutput:
        emb = self.embedding(batch)  # (B, F, D)
        x = emb
        if self.dense_vectors is not None:
            dense_fields = batch.dense.unsqueeze(2) * self.dense_vectors  # (B, Nd, 1) * (Nd, D) -> (B, Nd, D)
            x = torch.cat([emb, dense_fields], dim=1)  # (B, M, D)
        x = self.attention(x)  # (B, M, H*d'): the layers in turn
        att = x.flatten(1)  # (B, M*H*d')
        if self.autoint_plus:
            return ModelOutput(self.head(torch.cat([emb.flatten(1), batch.dense], dim=1), side=att), {})  # (B,)
        if self.dense_to_head:
            att = torch.cat([att, batch.dense], dim=1)  # (B, M*H*d' + Nd)
        return ModelOutput(self.head(att), {})  # (B,)
