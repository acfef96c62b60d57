"""YouTubeDNN candidate generation (Covington et al., "Deep Neural Networks for YouTube Recommendations",
RecSys 2016; seed 002 "YoutubeDNN / 召回模块").

Idea: next-watch prediction as extreme multi-class classification. The user vector is a ReLU tower over the
average-pooled watch history, the average-pooled search history, the user's features and "example age"; the
softmax weights are the item vectors (seed 002: the sampled-softmax weights double as the item embeddings),
here the item-id embedding table that also embeds the history:

    u = Linear(ReLU-MLP([mean_t e(watch_t); mean_t e(search_t); e(user); dense incl. example_age]))   (B, D)
    v_j = e(item_j)                                                                                  (D,)
    P(next = j | u) = softmax_j(<u, v_j>)      trained with sampled / in-batch softmax (train.retrieval)

Example age (the builder's ``--example-age``): the end of the training window minus the time the sample was
logged, as a fraction of the window; valid / test / serving rows carry 0 ("now"), as the seed prescribes.
Sequences named ``search_*`` are the search history; without them the tower reads the watch history alone.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import torch

from ctrkit.batch import Batch
from ctrkit.models._retrieval import RetrievalEmbedding, check_positive, retrieval_fields
from ctrkit.models._towers import layer_options
from ctrkit.models.base import TwoTowerModel
from ctrkit.models.registry import register_model
from ctrkit.nn.inputs import ZOO_INIT_STD
from ctrkit.nn.mlp import MLP
from ctrkit.schema import Schema


@register_model("youtube_dnn")
class YouTubeDNN(TwoTowerModel):
    """``dnn_hidden``: the ReLU tower (the paper: 1024, 512, 256); ``dnn_dropout``; ``temperature``: τ of the
    softmax. D is the item-id embedding dim."""

    renamed_options = MappingProxyType({"tower_hidden": "dnn_hidden", "dropout": "dnn_dropout"})

    def __init__(
        self,
        schema: Schema,
        *,
        dnn_hidden: tuple[int, ...] = (256, 128),
        dnn_dropout: float = 0.0,
        temperature: float = 1.0,
    ) -> None:
        super().__init__()
        check_positive("youtube_dnn", "temperature", temperature)
        self.fields = retrieval_fields(schema, "youtube_dnn")
        self.item_features, self.item_id_feature = [self.fields.item_id], self.fields.item_id
        self.temperature = float(temperature)
        # item attributes enter through the histories only: no pooled attribute table of its own
        self.embedding = RetrievalEmbedding(schema, replace(self.fields, item_features=[self.fields.item_id]),
                                            init_std=ZOO_INIT_STD)
        e = self.embedding
        q_in = e.history_dim + sum(e.search_dims) + e.query_dim + schema.num_dense
        with layer_options("youtube_dnn", "dnn_hidden / dnn_dropout"):
            self.tower = MLP(max(q_in, 1), dnn_hidden, activation="relu", dropout=dnn_dropout)
        self.out = torch.nn.Linear(self.tower.out_features, e.item_id_dim)

    def encode_query(self, batch: Batch) -> torch.Tensor:
        e, kj = self.embedding, batch.sparse
        x = torch.cat([e.mean_history(kj, self.fields.histories),
                       *(e.mean_history(kj, [k]) for k in self.fields.search), e.query_fields(batch)], 1)
        if x.shape[1] == 0:
            x = x.new_ones(batch.batch_size, 1)
        return self.out(self.tower(x))  # (B, D)

    def encode_item(self, batch: Batch) -> torch.Tensor:
        return self.embedding.items(batch.sparse, [self.fields.item_id])  # (B, D): the softmax weights
