"""SASRec, self-attentive sequential recommendation (Kang & McAuley, "Self-Attentive Sequential
Recommendation", ICDM 2018). Beyond the seeds; the Transformer block (:class:`ctrkit.nn.attention.CausalTransformerBlock`)
follows seed 002's Transformer notes.

Idea: the user is their recent items read by causal self-attention; the hidden state at the most recent
behaviour is the query, scored against the same item embeddings (shared input / output table):

    x_t = e(item_t) · sqrt(D) + P[r_t]      r_t = recency (0 = the most recent behaviour), or t ("absolute")  (B, T, D)
    H = LayerNorm(TransformerBlock^L(Dropout(x), causal mask))    pre-norm blocks                 (B, T, D)
    q = H[len - 1]          (an empty history reads position 0, a pad: the model's cold-start query)
    s(q, j) = <q, e(item_j)> / τ

Histories are left-aligned (oldest first) and the mask is causal, so padding after a row's last behaviour
never reaches its query: a row alone and in a batch give the same vector.

Per-position training (the paper's protocol, on sequence rows: ``ctrkit preprocess behaviour --train-rows
sequence``): :meth:`SASRec.encode_positions` returns H at every position, and position t is the query of the
item after step t. With ``positions="absolute"`` (r_t = t), H[t] of a row equals ``encode_query`` of the row
cut after step t (the causal mask: position t sees steps <= t only), so one forward trains every prefix; recency
positions (today's default) depend on where the query sits, so they train on per-prefix rows only.
"""

from __future__ import annotations

import math
from types import MappingProxyType

import torch
from torch import nn

from ctrkit.batch import Batch
from ctrkit.errors import ConfigError
from ctrkit.models._retrieval import RetrievalEmbedding, check_choice, check_positive, retrieval_fields
from ctrkit.models.base import TwoTowerModel
from ctrkit.models.registry import register_model
from ctrkit.nn.attention import CausalTransformerBlock
from ctrkit.schema import Schema

POSITIONS = ("recency", "absolute")


@register_model("sasrec")
class SASRec(TwoTowerModel):
    """``num_layers`` / ``num_heads`` (must divide D) / ``ffn_dim`` (default D, the paper) / ``att_dropout``:
    the transformer (named as BST's / DSIN's); ``temperature``: τ; ``positions``: "recency" (0 = the most recent
    behaviour) or "absolute" (0 = the oldest kept; needed to train on sequence rows). D is the item-id embedding
    dim; the history is the one declared for the item id (``shares`` its table)."""

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
        positions: str = "recency",
    ) -> None:
        super().__init__()
        check_positive("sasrec", "temperature", temperature)
        check_choice("sasrec", "positions", positions, POSITIONS)
        self.positions = positions
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

    def _hidden(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The blocks' output at every position and the history's mask -> ((B, T, D), (B, T))."""
        hist, mask = self.embedding.history(batch.sparse, [self.history_key])  # (B, T, D), (B, T)
        T = hist.shape[1]
        t = torch.arange(T, device=hist.device)
        if self.positions == "absolute":
            pos = self.position[:T].unsqueeze(0)  # (1, T, D): 0 = the oldest kept behaviour
        else:
            recency = (mask.sum(1, keepdim=True) - 1 - t).clamp(min=0)  # (B, T): 0 = the most recent behaviour
            pos = self.position[recency]  # (B, T, D)
        x = self.dropout(hist * self.scale + pos) * mask.unsqueeze(-1)  # (B, T, D)
        for block in self.blocks:
            x = block(x)  # (B, T, D)
        return x, mask

    def encode_query(self, batch: Batch) -> torch.Tensor:
        x, mask = self._hidden(batch)  # (B, T, D), (B, T)
        last = (mask.sum(1) - 1).clamp(min=0)  # (B,)
        return self.norm(x[torch.arange(x.shape[0], device=x.device), last])  # (B, D)

    def encode_positions(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Query vectors at every position of the item history and its mask -> ((B, T, D), (B, T)): H[t] is the
        query of the item after step t (sequence rows' per-position training; needs ``positions="absolute"``)."""
        if self.positions != "absolute":
            raise ConfigError(self.position_training_error() or "")
        x, mask = self._hidden(batch)
        return self.norm(x), mask  # (B, T, D), (B, T)

    def position_training_error(self) -> str | None:
        if self.positions == "absolute":
            return None
        return ("sasrec with positions='recency' trains on per-prefix rows only: a step's recency depends on where "
                "the query sits, so one forward cannot serve every position; set model.params.positions=absolute "
                "to train on sequence rows (or build the train store with --train-rows prefix)")

    def encode_item(self, batch: Batch) -> torch.Tensor:
        return self.embedding.items(batch.sparse, [self.item_id_feature])  # (B, D)
