"""Field-aware Factorization Machine (Juan et al., "Field-aware Factorization Machines for CTR
Prediction", RecSys 2016; seed 002 "FFM").

Idea: a feature keeps one latent vector per *other* field, and uses the one of its partner's field:

    logit = b + Σ_i w_i x_i + Σ_{i<j} <v_{i,f_j}, v_{j,f_i}> x_i x_j                  O(F²·D)

Field embeddings: every embedding table of the schema is re-created with width ``F·D`` (so shared
tables, e.g. item and its history, stay shared); the F fields' pooled lookups (B, F, F·D) are
reshaped to (B, F, F, D) with ``E[b, i, j] = v_{i, f_j}`` and fed to :class:`FFMInteraction`.
Each dense feature j is a field too (``dense_interaction=True``): its F vectors ``v_{j,·}`` are
scaled by ``x_j``. The first-order part covers sparse and dense features.
"""

from __future__ import annotations

import torch
from torch import nn

from ctrkit.batch import Batch
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.nn.fm import FFMInteraction
from ctrkit.nn.inputs import ZOO_INIT_STD, LinearTerm
from ctrkit.schema import Schema


@register_model("ffm")
class FFM(CTRModel):
    """D of every field-aware vector: the tables' common dim (the option every model takes,
    ``embedding_dim``, sets it when the store's dims differ). Needs at least 2 sparse fields."""

    def __init__(
        self, schema: Schema, *, dense_interaction: bool = True
    ) -> None:
        super().__init__()
        self.keys = schema.pooled_keys
        if len(self.keys) < 2:
            raise ConfigError(
                f"ffm needs at least 2 sparse fields to form a field pair; the schema has {self.keys}"
            )
        dims = {k: schema.embedding_dim(k) for k in self.keys}
        if len(set(dims.values())) != 1:
            raise ConfigError(
                f"ffm needs one embedding dim for every field, but the tables have {dims}; "
                "set the option embedding_dim to choose D"
            )
        D = self.embedding_dim = next(iter(dims.values()))
        n_dense = schema.num_dense if dense_interaction else 0
        F = self.num_fields = len(self.keys) + n_dense
        # (B, Fs, F*D): the schema's tables, F*D wide
        self.embedding = make_embeddings(schema, self.keys, dim=F * D, init="normal", std=ZOO_INIT_STD)
        # F field-aware vectors of each dense value, scaled by x_j
        self.dense_vectors = nn.Parameter(torch.empty(n_dense, F, D)) if n_dense else None
        if self.dense_vectors is not None:
            nn.init.normal_(self.dense_vectors, std=ZOO_INIT_STD)
        self.linear = LinearTerm(schema)
        self.interaction = FFMInteraction(F)

    def field_aware_embeddings(self, batch: Batch) -> torch.Tensor:
        """``E[b, i, j] = v_{i, f_j} x_i`` -> (B, F, F, D)."""
        kj = batch.sparse if batch.sparse.keys == self.keys else batch.sparse.select(self.keys)
        emb = self.embedding(kj).stacked()  # (B, Fs, F*D)
        B, Fs = emb.shape[:2]
        emb = emb.reshape(B, Fs, self.num_fields, self.embedding_dim)  # (B, Fs, F, D)
        if self.dense_vectors is not None:
            dense = batch.dense[:, :, None, None] * self.dense_vectors  # (B, Nd, F, D)
            emb = torch.cat([emb, dense], dim=1)  # (B, F, F, D)
        return emb

    def forward(self, batch: Batch) -> ModelOutput:
        pairwise = self.interaction(self.field_aware_embeddings(batch)).squeeze(1)  # (B,)
        return ModelOutput(self.linear(batch) + pairwise, {})  # (B,)
