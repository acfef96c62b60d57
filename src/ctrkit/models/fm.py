"""Factorization Machine (Rendle, "Factorization Machines", ICDM 2010; seeds 002 "FM" and 003).

Idea: every feature gets a weight and a latent vector v; a pair of features interacts through the
inner product of their latent vectors, which generalises to pairs never seen together:

    logit = b + Σ_i w_i x_i + Σ_{i<j} <v_i, v_j> x_i x_j
          = linear + ½ Σ_d [ (Σ_f e_{f,d})² − Σ_f e_{f,d}² ]          (e_f = v_f x_f, O(F·D))

Sparse fields (one-hot / multi-hot, x = 1 or pooled) give ``e_f = v[id_f]``; each dense feature j
is a field too with ``e_j = v_j · x_j`` (seed 002: FM takes continuous and categorical features
together), unless ``dense_interaction=False``. The first-order part covers sparse and dense features.
"""

from __future__ import annotations

import torch
from torch import nn

from ctrkit.batch import Batch
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.fm import FMInteraction
from ctrkit.nn.inputs import ZOO_INIT_STD, FieldEmbedding, LinearTerm
from ctrkit.schema import Schema


@register_model("fm")
class FM(CTRModel):
    """FM over the schema's pooled sparse fields (+ dense fields). Needs one embedding dim D."""

    def __init__(
        self, schema: Schema, *, dense_interaction: bool = True, embedding_init_std: float | None = ZOO_INIT_STD
    ) -> None:
        super().__init__()
        self.linear = LinearTerm(schema)
        self.embedding = FieldEmbedding(schema, model="fm", init_std=embedding_init_std)
        D = self.embedding.embedding_dim
        n_dense = schema.num_dense if dense_interaction else 0
        if self.embedding.num_fields + n_dense < 2:
            raise ConfigError(
                "fm needs at least two fields for its pairwise term; the schema has "
                f"{self.embedding.num_fields} sparse field(s) and dense_interaction={dense_interaction}"
            )
        # latent vector of each dense value: e_j = v_j * x_j
        self.dense_vectors = nn.Parameter(torch.empty(n_dense, D)) if n_dense else None
        if self.dense_vectors is not None:
            nn.init.normal_(self.dense_vectors, std=embedding_init_std or ZOO_INIT_STD)
        self.interaction = FMInteraction()

    def field_embeddings(self, batch: Batch) -> torch.Tensor:
        """All fields' ``e_f = v_f x_f`` -> (B, F + Nd, D)."""
        emb = self.embedding(batch)  # (B, F, D)
        if self.dense_vectors is not None:
            dense = batch.dense.unsqueeze(2) * self.dense_vectors  # (B, Nd, D)
            emb = torch.cat([emb, dense], dim=1)  # (B, F + Nd, D)
        return emb

    def forward(self, batch: Batch) -> ModelOutput:
        pairwise = self.interaction(self.field_embeddings(batch)).squeeze(1)  # (B,)
        return ModelOutput(self.linear(batch) + pairwise, {})  # (B,)
