"""Schema-driven input blocks shared by the model zoo.

``FieldEmbedding``: the pooled embedding of every sparse (and pooled sequence) feature, one field
each -> (B, F, D), or (B, sum D_f) concatenated when dims differ.
``LinearTerm``: the first-order (logistic-regression) part ``b + sum_f w[id_f] + <w_d, x_dense>``
-> (B,), with one scalar weight per id (dim-1 tables mirroring the schema's tables, so shared
tables share their first-order weights too).
"""

from __future__ import annotations

import torch
from torch import nn

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.errors import ConfigError
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.nn.embedding_interface import PooledEmbeddings
from ctrkit.nn.embedding_joint import pooled_pair
from ctrkit.schema import Schema


def _select(kj: KeyedJagged, keys: list[str]) -> KeyedJagged:
    return kj if kj.keys == keys else kj.select(keys)


# Zoo models start their field embeddings at N(0, 0.01^2) (DeepCTR and FuxiCTR use N(0, 1e-4^2)):
# FM-style pairwise products of torchrec's U(±sqrt(1/n)) start vectors are large for small tables
# and measured worse (DeepFM on the Criteo sample, 3 seeds: test AUC .7314 with U, .7484 with N(0, .01)).
ZOO_INIT_STD = 0.01


class FieldEmbedding(nn.Module):
    """Pooled field embeddings of ``keys`` (default: ``schema.pooled_keys``), initialised N(0, init_std^2)
    (``init_std=None``: torchrec's uniform start). The zoo models expose ``init_std`` as their
    ``embedding_init_std`` parameter.

    ``forward(batch)`` -> (B, F, D); needs one embedding dim across the fields (``model`` names the
    caller in the error). ``concat(batch)`` -> (B, sum of dims) works for any dims.
    """

    def __init__(
        self, schema: Schema, *, keys: list[str] | None = None, model: str = "model",
        init_std: float | None = ZOO_INIT_STD,
    ) -> None:
        super().__init__()
        self.keys = list(keys) if keys is not None else schema.pooled_keys
        if not self.keys:
            raise ConfigError(f"{model} needs at least one sparse feature in the schema")
        if init_std is not None and not init_std > 0:
            raise ConfigError(f"{model}: embedding_init_std must be > 0 (or null for torchrec's uniform "
                              f"U(±sqrt(1/rows)) start), got {init_std}")
        self.ebc = make_embeddings(schema, self.keys, init="uniform" if init_std is None else "normal",
                                   std=init_std)
        self.dims = dict(zip(self.ebc.keys, self.ebc.dims))
        self.model = model
        self.num_fields = len(self.keys)
        self.out_features = self.ebc.out_features  # width of concat(): sum of the fields' dims

    @property
    def embedding_dim(self) -> int:
        """The common dim D; a ConfigError naming the fields when dims differ."""
        dims = set(self.dims.values())
        if len(dims) != 1:
            raise ConfigError(
                f"{self.model} needs one embedding dim for every field, but the fields have {self.dims}; "
                "give every table the same dim (the model's embedding_dim sets one for all)"
            )
        return dims.pop()

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.ebc(_select(batch.sparse, self.keys)).stacked()  # (B, F, D)

    def concat(self, batch: Batch) -> torch.Tensor:
        return self.ebc(_select(batch.sparse, self.keys)).concat()  # (B, sum D_f)


class LinearTerm(nn.Module):
    """First-order part ``b + sum_f w[id_f] + <w_d, dense>`` -> (B,).

    Multi-valued features and pooled sequences contribute their pooled (sum/mean) weight.
    """

    def __init__(
        self, schema: Schema, *, keys: list[str] | None = None, use_dense: bool = True, bias: bool = True
    ) -> None:
        super().__init__()
        self.keys = list(keys) if keys is not None else schema.pooled_keys
        self.ebc = make_embeddings(schema, self.keys, dim=1, init="zeros") if self.keys else None
        self.dense = nn.Linear(schema.num_dense, 1, bias=False) if use_dense and schema.num_dense else None
        if self.dense is not None:
            # zero start, like the id weights: nn.Linear's U(±1/sqrt(Nd)) start times raw dense values
            # (Criteo's ln(x+3) reaches ~14) gave seed-dependent starting logits of several units and
            # test AUCs from .658 to .733 for plain LR on the Criteo sample
            nn.init.zeros_(self.dense.weight)
        self.bias = nn.Parameter(torch.zeros(1)) if bias else None

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.combine(self.ebc(_select(batch.sparse, self.keys)) if self.ebc is not None else None, batch)

    def combine(self, pooled: PooledEmbeddings | None, batch: Batch) -> torch.Tensor:
        """The term from the pooled id weights ``pooled`` (this term's ``ebc`` looked up, or None without ids)."""
        out = batch.labels.new_zeros(batch.batch_size)  # (B,)
        if pooled is not None:
            out = out + pooled.stacked().sum(dim=(1, 2))
        if self.dense is not None:
            out = out + self.dense(batch.dense).squeeze(-1)
        if self.bias is not None:
            out = out + self.bias
        return out


def field_and_linear(embedding: FieldEmbedding, linear: LinearTerm, batch: Batch) -> tuple[PooledEmbeddings, torch.Tensor]:
    """(``embedding``'s pooled field embeddings, ``linear(batch)`` (B,)) of a model with both over the same
    features: one lookup of both tables where they mirror each other (:mod:`ctrkit.nn.embedding_joint`, the
    same values bit for bit), else each on its own. ``.stacked()`` / ``.concat()`` of the first give
    ``embedding(batch)`` / ``embedding.concat(batch)``."""
    pair = None
    if linear.ebc is not None and linear.keys == embedding.keys:
        pair = pooled_pair(embedding.ebc, linear.ebc, _select(batch.sparse, embedding.keys))
    if pair is None:
        return embedding.ebc(_select(batch.sparse, embedding.keys)), linear(batch)
    return pair[0], linear.combine(pair[1], batch)
