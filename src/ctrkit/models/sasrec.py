"""SASRec, self-attentive sequential recommendation (Kang & McAuley, "Self-Attentive Sequential
Recommendation", ICDM 2018). Beyond the seeds; the Transformer block (:class:`ctrkit.nn.attention.CausalTransformerBlock`)
follows seed 002's Transformer notes.

Idea: the user is their recent items read by causal self-attention; the hidden state at the most recent
behaviour is the query, scored against the same item embeddings (shared input / output table):

    x_t = e(item_t) · sqrt(D) + P[recency_t]           recency 0 = the most recent behaviour     (B, T, D)
    H = LayerNorm(TransformerBlock^L(Dropout(x), causal mask))    pre-norm blocks                 (B, T, D)
    q = H[len - 1]          (an empty history reads position 0, a pad: the model's cold-start query)
    s(q, j) = <q, e(item_j)> / τ

Histories are left-aligned (oldest first) and the mask is causal, so padding after a row's last behaviour
never reaches its query: a row alone and in a batch give the same vector.
"""

from __future__ import annotations

import math
from types import MappingProxyType

import torch
from torch import nn

from ctrkit.batch import Batch
from ctrkit.errors import ConfigError
from ctrkit.models._retrieval import RetrievalEmbedding, check_positive, retrieval_fields
from ctrkit.models.base import TwoTowerModel
from ctrkit.models.registry import register_model
from ctrkit.nn.attention import CausalTransformerBlock
from ctrkit.schema import Schema


@register_model("sasrec")
class SASRec(TwoTowerModel):
    """``num_layers`` / ``num_heads`` (must divide D) / ``ffn_dim`` (default D, the paper) / ``att_dropout``:
    the transformer (named as BST's / DSIN's); ``temperature``: τ. D is the item-id embedding dim; the history
    is the one declared for the item id (``shares`` its table)."""

    renamed_options = MappingProxyType({"dropout": "att_dropout"})

    def __init__(
        self,
        schema: Schema,
        *,
        num_layers: int = 2,
        num_heads: int = 1,
        ffn_dim: int | None = None,
        att_dropout: float = 0.2,
        temperature: float = 1.0,
    ) -> None:
        super().__init__()
        check_positive("sasrec", "temperature", temperature)
        check_positive("sasrec", "num_layers", num_layers)
        self.fields = retrieval_fields(schema, "sasrec")
        item = self.fields.item_id
        if item not in self.fields.history_items:
            raise ConfigError(f"sasrec needs a history of the item id {item!r}: an unpooled sequence (pooling 'none', "
                              f"role 'history') sharing its table, e.g. 'hist_{item}'; the schema has "
                              f"{self.fields.histories or 'none'}")
        self.history_key = self.fields.histories[self.fields.history_items.index(item)]
        self.item_features, self.item_id_feature = [item], item
        self.temperature = float(temperature)
        self.embedding = RetrievalEmbedding(schema, self.fields, init_std=0.02)
        d = self.embedding.item_id_dim
        if num_heads < 1 or d % num_heads:
            raise ConfigError(f"sasrec: num_heads={num_heads} must be >= 1 and divide the item embedding dim {d}")
        max_len = schema.feature(self.history_key).max_len
        self.position = nn.Parameter(torch.empty(max_len, d))
        nn.init.normal_(self.position, std=0.02)
        self.scale = math.sqrt(d)
        self.dropout = nn.Dropout(att_dropout)
        self.blocks = nn.ModuleList(CausalTransformerBlock(d, num_heads, ffn_dim or d, att_dropout)
                                    for _ in range(num_layers))
        self.norm = nn.LayerNorm(d)

    def encode_query(self, batch: Batch) -> torch.Tensor:
        hist, mask = self.embedding.history(batch.sparse, [self.history_key])  # (B, T, D), (B, T)
        B, T, _ = hist.shape
        lengths = mask.sum(1)  # (B,)
        t = torch.arange(T, device=hist.device)
        recency = (lengths.unsqueeze(1) - 1 - t).clamp(min=0)  # (B, T): 0 = the most recent behaviour
        x = self.dropout(hist * self.scale + self.position[recency]) * mask.unsqueeze(-1)  # (B, T, D)
        for block in self.blocks:
            x = block(x)  # (B, T, D)
        last = (lengths - 1).clamp(min=0)  # (B,)
        return self.norm(x[torch.arange(B, device=x.device), last])  # (B, D)

    def encode_item(self, batch: Batch) -> torch.Tensor:
        return self.embedding.items(batch.sparse, [self.item_id_feature])  # (B, D)
