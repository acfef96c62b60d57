"""NFM (He & Chua, "Neural Factorization Machines for Sparse Predictive Analytics", SIGIR 2017;
seed 002 "NFM").

Idea: FM's second-order term kept as a D-wide vector (bi-interaction pooling) and fed to a DNN, so
the network models higher-order interactions on top of the pairwise ones; plus FM's linear part.

    bi     = Σ_{i<j} e_i ⊙ e_j = ½[(Σ_f e_f)² − Σ_f e_f²]                (B, D)
    z      = Dropout(BatchNorm([bi; dense]))                             (B, D + Nd)
    deep   = w_o^T MLP(z)                  output unit: no bias, no activation (seed)     (B,)
    linear = b + Σ_f w[id_f] + <w_d, dense>    with bias (seed)                            (B,)
    logit  = linear + deep

Dense features are concatenated at the bi-interaction output before the BatchNorm, as the seed
says ("对于连续型特征可以加入在Bi-Interaction pooling层的输出位置（concat拼接）"). Every field must
share one embedding dim D.
"""

from __future__ import annotations

import torch
from torch import nn
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._towers import DNNOptions, TowerHead, check_min
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.fm import BiInteractionPooling
from ctrkit.nn.inputs import ZOO_INIT_STD, FieldEmbedding, LinearTerm, field_and_linear
from ctrkit.schema import Schema


@register_model("nfm")
class NFM(CTRModel):
    """Linear part + DNN over BatchNorm'd (``bi_batch_norm``) bi-interaction pooling (dropout ``bi_dropout``
    after the BN)."""

    def __init__(
        self,
        schema: Schema,
        *,
        embedding_init_std: float | None = ZOO_INIT_STD,
        bi_dropout: float = 0.0,
        bi_batch_norm: bool = True,
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        self.embedding = FieldEmbedding(schema, model="nfm", init_std=embedding_init_std)
        d = self.embedding.embedding_dim  # ConfigError naming nfm when dims differ
        if self.embedding.num_fields < 2:
            raise ConfigError(f"nfm needs at least 2 sparse fields for bi-interaction pooling, "
                              f"the schema has {self.embedding.keys}")
        check_min("nfm", "bi_dropout", bi_dropout, 0.0)
        if bi_dropout >= 1.0:
            raise ConfigError(f"nfm: option bi_dropout must be in [0, 1), got {bi_dropout}")
        self.linear = LinearTerm(schema)  # (B,)
        self.bi = BiInteractionPooling(embedding_dim=d)  # (B, F, D) -> (B, D)
        n = self.bi.out_features + schema.num_dense
        # the paper's BatchNorm on the pooled vector; DeepCTR's NFM has none
        self.bn = nn.BatchNorm1d(n) if bi_batch_norm else nn.Identity()
        self.bi_dropout = nn.Dropout(bi_dropout)
        self.deep = TowerHead(self, n, dnn, bias=False)  # (B, D + Nd) -> (B,)

    def forward(self, batch: Batch) -> ModelOutput:
        pooled, first = field_and_linear(self.embedding, self.linear, batch)  # one lookup of both; first (B,)
        bi = self.bi(pooled.stacked())  # (B, F, D) -> (B, D)
        z = self.bi_dropout(self.bn(torch.cat([bi, batch.dense], dim=1)))  # (B, D + Nd)
        return ModelOutput(first + self.deep(z), {})  # (B,)
