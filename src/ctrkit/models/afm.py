"""AFM (Xiao et al., "Attentional Factorization Machines: Learning the Weight of Feature
Interactions via Attention Networks", IJCAI 2017; seed 002 "AFM").

Idea: FM where each pairwise interaction gets an input-dependent importance from a small
attention network, instead of all pairs counting equally.

    p_ij   = e_i ⊙ e_j                          pairs i < j of sparse fields       (B, P, D)
    a_ij   = softmax_{ij}( h^T ReLU(W p_ij + b) )                                  (B, P)
    second = p^T Dropout(Σ_{i<j} a_ij p_ij)                                       (B,)
    linear = b_0 + Σ_f w[id_f] + <w_d, dense>                                      (B,)
    logit  = linear + second

Pairwise products use sparse fields only (seed: "embedding的元素积只在稀疏的列别特征中展开");
dense features enter through the linear part. Needs >= 2 sparse fields sharing one dim D.
"""

from __future__ import annotations

from types import MappingProxyType

from ctrkit.batch import Batch
from ctrkit.models._towers import check_min, layer_options
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.attention import AFMAttention
from ctrkit.nn.inputs import ZOO_INIT_STD, FieldEmbedding, LinearTerm, field_and_linear
from ctrkit.schema import Schema


@register_model("afm")
class AFM(CTRModel):
    """Linear part + attention-pooled pairwise interactions (``att_dim`` A, ``att_dropout``)."""

    renamed_options = MappingProxyType({"attention_dim": "att_dim", "attention_dropout": "att_dropout"})

    def __init__(
        self, schema: Schema, *, att_dim: int = 16, att_dropout: float = 0.0,
        embedding_init_std: float | None = ZOO_INIT_STD,
    ) -> None:
        super().__init__()
        self.embedding = FieldEmbedding(schema, model="afm", init_std=embedding_init_std)
        d = self.embedding.embedding_dim  # ConfigError naming afm when dims differ
        f = self.embedding.num_fields
        if f < 2:
            raise ConfigError(
                f"afm needs at least 2 sparse fields to form a pair, the schema has {f}: {self.embedding.keys}; "
                "add a sparse feature or use model 'lr'/'wide_deep'"
            )
        check_min("afm", "att_dim", att_dim, 1)
        self.linear = LinearTerm(schema)  # (B,)
        with layer_options("afm", "att_dropout"):
            self.attention = AFMAttention(d, attention_dim=att_dim, dropout=att_dropout,
                                          num_fields=f)  # (B, F, D) -> (B, 1)

    def forward(self, batch: Batch) -> ModelOutput:
        pooled, first = field_and_linear(self.embedding, self.linear, batch)  # one lookup of both; first (B,)
        second = self.attention(pooled.stacked()).squeeze(-1)  # (B, F, D) -> (B,)
        return ModelOutput(first + second, {})  # (B,)
