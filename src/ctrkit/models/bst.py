"""BST, Behavior Sequence Transformer (Chen et al., "Behavior Sequence Transformer for E-commerce
Recommendation in Alibaba", DLP-KDD 2019; seed 002 "Transformer" for the block).

Idea: put the target after the behaviours and let a Transformer layer attend across all of them, so every
behaviour is read in the context of the others and of the candidate:

    S = [e_1; ...; e_T; e_a] + P       P: learned position embeddings, counted from the most recent
                                      behaviour (the paper embeds the time gap; the stores keep order only)
    Z = TransformerLayer^L(S, mask)     post-norm, multi-head, masked padding              (B, T+1, Dt)
    logit = MLP([others; Z_target; mean_t Z_t; dense])

The paper concatenates every position's output; here the target position and the masked mean of the
behaviour positions (2·Dt wide whatever T is).
"""

from __future__ import annotations

import torch
from torch import nn
from typing_extensions import Unpack

from ctrkit.batch import Batch
from ctrkit.models._behaviour import BehaviourEmbedding, behaviour_fields
from ctrkit.models._towers import DNNOptions, TowerHead, check_min, layer_options
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import register_model
from ctrkit.nn.attention import TransformerEncoderLayer
from ctrkit.nn.sequence import masked_mean
from ctrkit.schema import Schema


@register_model("bst")
class BST(CTRModel):
    """``num_layers`` / ``num_heads`` (must divide Dt) / ``ffn_dim`` / ``att_dropout``: the transformer;
    ``dnn_*``: the MLP (the paper: 1024, 512, 256 with LeakyReLU)."""

    def __init__(
        self,
        schema: Schema,
        *,
        num_layers: int = 1,
        num_heads: int = 2,
        ffn_dim: int | None = None,
        att_dropout: float = 0.0,
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        check_min("bst", "num_layers", num_layers, 1)
        self.fields = behaviour_fields(schema, "bst")
        self.embedding = BehaviourEmbedding(schema, self.fields, self.fields.histories)
        dt = self.embedding.target_dim
        self.position = nn.Parameter(torch.empty(self.fields.max_len + 1, dt))  # index 0 = the target
        nn.init.normal_(self.position, std=0.01)
        with layer_options("bst", "num_heads / ffn_dim / att_dropout"):
            self.layers = nn.ModuleList(
                TransformerEncoderLayer(dt, num_heads=num_heads, ffn_dim=ffn_dim, dropout=att_dropout)
                for _ in range(num_layers))
        z = self.layers[-1].out_features  # Z_target and mean_t Z_t, each (B, z)
        self.head = TowerHead(self, self.embedding.other_dim + 2 * z + schema.num_dense, dnn)

    def forward(self, batch: Batch) -> ModelOutput:
        target, others = self.embedding.pooled(batch)  # (B, Dt), (B, Do)
        hist, mask = self.embedding.sequence(batch.sparse, self.fields.histories)  # (B, T, Dt), (B, T)
        lengths = mask.sum(1, keepdim=True)  # (B, 1)
        t = torch.arange(hist.shape[1], device=hist.device)
        recency = (lengths - t).clamp(min=1, max=self.fields.max_len)  # (B, T): 1 = the most recent behaviour
        x = torch.cat([hist + self.position[recency], (target + self.position[0]).unsqueeze(1)], 1)  # (B, T+1, Dt)
        full = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)  # (B, T+1)
        for layer in self.layers:
            x = layer(x, full)  # (B, T+1, Dt)
        z_target, z_hist = x[:, -1], masked_mean(x[:, :-1], mask)  # (B, Dt) each
        return ModelOutput(self.head(torch.cat([others, z_target, z_hist, batch.dense], 1)), {})  # (B,)
