"""FiBiNET (Huang et al., "FiBiNET: Combining Feature Importance and Bilinear feature Interaction
for Click-Through Rate Prediction", RecSys 2019; seed 002 "FIBINET").

Idea: learn a per-sample importance for every field (SENET re-weighting), then model pairwise
interactions with a learned bilinear form (finer than inner or Hadamard products), on both the raw
and the re-weighted embeddings, and let a DNN combine them.

    E      = [e_1, ..., e_F]                                    sparse field embeddings  (B, F, D)
    V      = SENET(E) = E ⊙ a(E)                                 mean|max squeeze, ratio r (B, F, D)
    p      = Bilinear_p(E),  q = Bilinear_q(V)                   p_ij = (v_i W_·) ⊙ v_j   (B, P, D) each
    deep   = w_o^T MLP([flat p; flat q; dense])                  output unit without bias  (B,)
    linear = b + Σ_f w[id_f] + <w_d, dense>                                                (B,)
    logit  = linear + deep

The two bilinear layers have their own weights (the paper's figure, FuxiCTR) unless ``bilinear_shared``
(DeepCTR-Torch's form: one layer for both); shared, ``q_ij = a_i a_j p_ij`` exactly (a = SENET's field
weights), which is how it is computed: no second bilinear pass. ``bilinear_type`` 'field_all' (one W),
'field_each' (W_i per left field), 'field_interaction' (W_ij per pair). Needs >= 2 sparse fields sharing one
dim D.
"""

from __future__ import annotations

from typing import Literal

from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._towers import DNNOptions, TowerHead, check_choice, layer_options
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.inputs import ZOO_INIT_STD, FieldEmbedding, LinearTerm, field_and_linear
from ctrkit.nn.senet import SENET, BilinearInteraction, bilinear_concat, senet_bilinear_shared_concat
from ctrkit.schema import Schema

BILINEAR_TYPES = ("field_all", "field_each", "field_interaction")
POOLINGS = ("mean", "max")


@register_model("fibinet")
class FiBiNET(CTRModel):
    """Linear part + DNN over bilinear interactions of raw and SENET-re-weighted embeddings."""

    def __init__(
        self,
        schema: Schema,
        *,
        embedding_init_std: float | None = ZOO_INIT_STD,
        bilinear_type: Literal["field_all", "field_each", "field_interaction"] = "field_interaction",
        reduction_ratio: float = 3.0,
        senet_pooling: Literal["mean", "max"] = "mean",
        bilinear_shared: bool = False,
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        check_choice("fibinet", "bilinear_type", bilinear_type, BILINEAR_TYPES)
        check_choice("fibinet", "senet_pooling", senet_pooling, POOLINGS)
        self.embedding = FieldEmbedding(schema, model="fibinet", init_std=embedding_init_std)
        d = self.embedding.embedding_dim  # ConfigError naming fibinet when dims differ
        f = self.embedding.num_fields
        if f < 2:
            raise ConfigError(f"fibinet needs at least 2 sparse fields for bilinear interactions, "
                              f"the schema has {f}: {self.embedding.keys}")
        self.linear = LinearTerm(schema)  # (B,)
        with layer_options("fibinet", "reduction_ratio"):
            self.senet = SENET(f, reduction_ratio=reduction_ratio, pooling=senet_pooling)  # (B, F, D)
        self.bilinear_raw = BilinearInteraction(f, d, bilinear_type=bilinear_type)  # (B, P, D)
        self.bilinear_senet = None if bilinear_shared else BilinearInteraction(f, d, bilinear_type=bilinear_type)
        n = 2 * self.bilinear_raw.out_features + schema.num_dense
        self.deep = TowerHead(self, n, dnn, bias=False)  # (B, N) -> (B,)

    def forward(self, batch: Batch) -> ModelOutput:
        pooled, first = field_and_linear(self.embedding, self.linear, batch)  # one lookup of both; first (B,)
        # [flat p; flat q; dense]: p = Bilinear_p(E), q = Bilinear_q(SENET(E)), (B, P*D) each
        if self.bilinear_senet is None:  # one layer for both: q_ij = a_i a_j p_ij, a = SENET's weights (B, F)
            emb = pooled.fields().transpose(0, 1)  # (B, F, D) view: the bilinear node reorders it itself
            x = senet_bilinear_shared_concat(self.senet, self.bilinear_raw, emb, batch.dense)  # SENET in the node
        else:
            emb = pooled.stacked()  # (B, F, D)
            x = bilinear_concat([self.bilinear_raw, self.bilinear_senet], [emb, self.senet(emb)], batch.dense)
        deep = self.deep(x)  # (B, 2*P*D + Nd) -> (B,)
        return ModelOutput(first + deep, {})  # (B,)
