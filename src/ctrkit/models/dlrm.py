"""DLRM (Naumov et al., 2019, "Deep Learning Recommendation Model for Personalization and
Recommendation Systems"), as walked through in seeds 000 (§3-6) and 001.

Idea: dense features go through a bottom MLP to one D-wide vector, every sparse feature is pooled
from its embedding table to a D-wide vector, an interaction arch combines the F + 1 vectors, and a
top MLP maps the result to one logit.

    dense  (B, Nd) --DenseArch--> (B, D) --\
                                            InteractionArch --> (B, N) --OverArch--> (B,)
    sparse KeyedJagged --SparseArch--> (B, F, D) --/

Interaction arches: ``dot`` (pairwise dot products, seed 001 §2), ``dcn`` (a cross net over the
flattened (F + 1)·D vector: ``cross_type`` = full | low_rank | vector | low_rank_mixture, seed 001 §3)
and ``projection`` (two MLP branches multiplied, seed 001 §4).

Without dense features there is no DenseArch: the interaction runs over the F sparse vectors alone and
the over arch reads its output alone (dot: the F(F-1)/2 pairwise dots, so F >= 2; dcn: the cross net over
F·D; projection: the F1·F2 products); see :mod:`ctrkit.nn.interaction`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Literal

from torch import nn

from ctrkit.batch import Batch
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.crossnet import CrossNet, LowRankCrossNet, LowRankMixtureCrossNet, VectorCrossNet
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.nn.interaction import DCNInteraction, DotInteraction, ProjectionInteraction
from ctrkit.nn.mlp import MLP
from ctrkit.schema import Schema

INTERACTIONS = ("dot", "dcn", "projection")
CROSS_TYPES = ("full", "low_rank", "vector", "low_rank_mixture")


def _crossnet(cross_type: str, n: int, layers: int, rank: int, experts: int, activation: str) -> nn.Module:
    if cross_type == "full":
        return CrossNet(n, num_layers=layers)
    if cross_type == "low_rank":
        return LowRankCrossNet(n, num_layers=layers, low_rank=rank)
    if cross_type == "vector":
        return VectorCrossNet(n, num_layers=layers)
    if cross_type == "low_rank_mixture":
        return LowRankMixtureCrossNet(n, num_layers=layers, low_rank=rank, num_experts=experts,
                                      activation=activation)
    raise ConfigError(f"dlrm: cross_type {cross_type!r} is not one of {CROSS_TYPES}")


@register_model("dlrm")
class DLRM(CTRModel):
    """DLRM with a choice of interaction arch (the cross net's options are named as DCN-V2's: ``cross_*``).

    ``dense_arch`` are the bottom MLP's hidden widths; its last layer is D (the embedding dim) so
    ``dense_arch=(512, 256)`` gives Nd-512-256-D. ``over_arch`` are the top MLP's hidden widths,
    followed by one output unit. Every sparse feature must use the same embedding dim D.
    """

    renamed_options = MappingProxyType({"dcn_type": "cross_type", "dcn_layers": "cross_layers",
                                        "dcn_rank": "cross_rank", "dcn_experts": "cross_experts",
                                        "dcn_activation": "cross_activation"})

    def __init__(
        self,
        schema: Schema,
        *,
        dense_arch: tuple[int, ...] = (512, 256),
        over_arch: tuple[int, ...] = (512, 256),
        interaction: Literal["dot", "dcn", "projection"] = "dot",
        cross_type: Literal["full", "low_rank", "vector", "low_rank_mixture"] = "low_rank",
        cross_layers: int = 3,
        cross_rank: int = 16,
        cross_experts: int = 4,
        cross_activation: str = "relu",
        projection_branch1: tuple[int, ...] = (256, 8),
        projection_branch2: tuple[int, ...] = (256, 8),
    ) -> None:
        super().__init__()
        if interaction not in INTERACTIONS:
            raise ConfigError(f"dlrm: interaction {interaction!r} is not one of {INTERACTIONS}")
        self.sparse_keys = schema.pooled_keys
        self.sparse_arch = make_embeddings(schema, self.sparse_keys)  # an EmbeddingBagCollection
        dims = {schema.embedding_dim(k) for k in self.sparse_keys}
        if len(dims) != 1:
            per = {k: schema.embedding_dim(k) for k in self.sparse_keys}
            raise ConfigError(f"dlrm needs one embedding dim for every sparse feature; the schema has {per}")
        D = dims.pop()
        F = len(self.sparse_keys)
        has_dense = schema.num_dense > 0
        if not has_dense and interaction == "dot" and F < 2:
            raise ConfigError(f"dlrm without dense features and interaction 'dot' needs at least two sparse "
                              f"features (one pair to multiply); the schema has {list(self.sparse_keys)}; add "
                              "a feature or use interaction 'dcn' or 'projection'")
        # (B, Nd) -> (B, D); None without dense features: the interaction then reads the sparse vectors alone
        self.dense_arch = MLP(schema.num_dense, [*dense_arch, D]) if has_dense else None
        if interaction == "dot":
            self.interaction_arch: nn.Module = DotInteraction(F, D, with_dense=has_dense)
        elif interaction == "dcn":
            cross = _crossnet(cross_type, (F + int(has_dense)) * D, cross_layers, cross_rank, cross_experts,
                              cross_activation)
            self.interaction_arch = DCNInteraction(F, D, cross, with_dense=has_dense)
        else:
            self.interaction_arch = ProjectionInteraction(
                F, D, list(projection_branch1), list(projection_branch2), with_dense=has_dense
            )
        self.over_arch = nn.Sequential(
            MLP(self.interaction_arch.out_features, list(over_arch)),
            nn.Linear(over_arch[-1] if over_arch else self.interaction_arch.out_features, 1),
        )

    def forward(self, batch: Batch) -> ModelOutput:
        dense = self.dense_arch(batch.dense) if self.dense_arch is not None else None  # (B, D) or None
        kj = batch.sparse if batch.sparse.keys == self.sparse_keys else batch.sparse.select(self.sparse_keys)
        # (B, F, D) as a view of the field-major (F, B, D) lookup: the interaction's cat with the dense row copies it
        # once (stacked() would copy it into (B, F, D) first)
        sparse = self.sparse_arch(kj).fields().transpose(0, 1)
        z = self.interaction_arch(dense, sparse)  # (B, N)
        return ModelOutput(self.over_arch(z).squeeze(-1), {})  # (B,)

