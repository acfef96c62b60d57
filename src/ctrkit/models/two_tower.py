"""Two-tower (DSSM-style) retrieval (Huang et al., "Learning Deep Structured Semantic Models for Web Search
using Clickthrough Data", CIKM 2013; Yi et al., "Sampling-Bias-Corrected Neural Modeling for Large Corpus
Item Recommendations", RecSys 2019, for the in-batch softmax with log-Q correction it is trained with).

Idea: embed the query (user) and the item by two independent MLPs into one space, so every item vector can
be computed once and searched with an ANN index (seed 002, 召回 / 向量召回):

    q = MLP_q([e(user); mean_t e(hist_t); dense])           (B, D)     the user's feature group
    v = MLP_v([e(item); e(cate)])                             (B, D)     the item's feature group
    s(q, v) = <q, v> / τ     (dot)    or    <q/|q|, v/|v|> / τ   (cosine)
"""

from __future__ import annotations

from types import MappingProxyType

import torch

from ctrkit.batch import Batch
from ctrkit.models._retrieval import (
    SIMILARITIES,
    RetrievalEmbedding,
    check_choice,
    check_positive,
    retrieval_fields,
    similarity_vectors,
)
from ctrkit.models._towers import layer_options
from ctrkit.models.base import TwoTowerModel
from ctrkit.models.registry import register_model
from ctrkit.nn.inputs import ZOO_INIT_STD
from ctrkit.nn.mlp import MLP
from ctrkit.schema import Schema


@register_model("two_tower")
class TwoTower(TwoTowerModel):
    """``dnn_hidden``: hidden widths of both towers; ``out_dim``: D; ``similarity``: dot | cosine;
    ``temperature``: τ; ``dnn_dropout`` / ``dnn_activation``: of the hidden layers (named as every deep tower)."""

    renamed_options = MappingProxyType({"tower_hidden": "dnn_hidden", "activation": "dnn_activation",
                                        "dropout": "dnn_dropout"})

    def __init__(
        self,
        schema: Schema,
        *,
        dnn_hidden: tuple[int, ...] = (256, 128),
        out_dim: int = 64,
        similarity: str = "cosine",
        temperature: float = 0.05,
        dnn_activation: str = "relu",
        dnn_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_choice("two_tower", "similarity", similarity, SIMILARITIES)
        check_positive("two_tower", "temperature", temperature)
        check_positive("two_tower", "out_dim", out_dim)
        self.fields = retrieval_fields(schema, "two_tower")
        self.item_features, self.item_id_feature = self.fields.item_features, self.fields.item_id
        self.similarity, self.temperature = similarity, float(temperature)
        self.embedding = RetrievalEmbedding(schema, self.fields, init_std=ZOO_INIT_STD)
        e = self.embedding
        q_in = e.query_dim + schema.num_dense + e.history_dim + sum(e.search_dims)
        with layer_options("two_tower", "dnn_hidden / dnn_activation / dnn_dropout"):
            self.query_tower = MLP(max(q_in, 1), [*dnn_hidden, out_dim], activation=dnn_activation,
                                   dropout=dnn_dropout, final_activation=False)
            self.item_tower = MLP(e.item_dim, [*dnn_hidden, out_dim], activation=dnn_activation,
                                  dropout=dnn_dropout, final_activation=False)

    def encode_query(self, batch: Batch) -> torch.Tensor:
        e = self.embedding
        x = torch.cat([e.query_fields(batch), e.mean_history(batch.sparse, self.fields.histories),
                       *(e.mean_history(batch.sparse, [k]) for k in self.fields.search)], 1)  # (B, q_in)
        if x.shape[1] == 0:  # a schema with no user side: one constant input
            x = x.new_ones(batch.batch_size, 1)
        return similarity_vectors(self.query_tower(x), self.similarity)  # (B, D)

    def encode_item(self, batch: Batch) -> torch.Tensor:
        return similarity_vectors(self.item_tower(self.embedding.items(batch.sparse)), self.similarity)  # (B, D)
