"""Wide & Deep (Cheng et al., "Wide & Deep Learning for Recommender Systems", DLRS 2016; seed 002
"Wide & deep").

Idea: a wide linear model memorises raw and crossed features, a deep MLP over embeddings
generalises; their logits are summed (one sigmoid over both):

    wide  = b + Σ_f w_f[id_f] + <w_d, x_dense> + Σ_c w_c[cross_c(x)]      (B,)
    deep  = h^T MLP([e_1; ...; e_F; x_dense])                           (B,)
    logit = wide + deep

Cross features (option ``crosses``, pairs of single-valued sparse features) get their own table of
``cross_buckets`` rows each. The pair (a, b) has the exact index ``k = a·V_b + b`` (V_b = vocab of b);
when ``V_a·V_b ≤ cross_buckets`` that is the cross id (no collisions), otherwise the id is a Knuth
multiplicative hash of k: ``((k · 0x9E3779B97F4A7C15 mod 2⁶⁴) >> 16) mod cross_buckets``.

The paper trains the wide part with FTRL + L1 and the deep part with AdaGrad: the model declares
the wide part's parameters as the parameter group "wide" (optimizer "ftrl"); with
``train.wide_optimizer=ftrl`` the trainer gives them to :class:`ctrkit.training.ftrl.FTRL` and takes
them out of the dense / embedding optimizers.
"""

from __future__ import annotations

import torch
from typing_extensions import Unpack

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.models._towers import DNNOptions, TowerHead
from ctrkit.models.base import CTRModel, ModelOutput, ParamGroup
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.nn.inputs import ZOO_INIT_STD, FieldEmbedding, LinearTerm, field_and_linear
from ctrkit.schema import Schema, SparseFeature, TableSpec

_KNUTH = 0x9E3779B97F4A7C15 - (1 << 64)  # the golden-ratio multiplier as a signed int64
_LOW47 = (1 << 47) - 1


def first_ids(kj: KeyedJagged, key: str) -> torch.Tensor:
    """The first id of each row's bag of ``key`` (0 = missing for an empty bag) -> (B,) int64."""
    lengths, starts = kj.bags(key)  # (B,) each
    return kj.take(starts, lengths > 0)


def cross_ids(a: torch.Tensor, b: torch.Tensor, vocab_a: int, vocab_b: int, buckets: int) -> torch.Tensor:
    """Cross-feature id of the id pairs (a, b) in ``[0, buckets)`` (see the module docstring)."""
    k = a * vocab_b + b  # (B,) exact pair index
    if vocab_a * vocab_b <= buckets:
        return k
    h = k * _KNUTH  # wraps mod 2^64
    return ((h >> 16) & _LOW47) % buckets


@register_model("wide_deep")
class WideDeep(CTRModel):
    """``dnn_hidden`` / ``dnn_activation`` / ``dnn_dropout`` / ``dnn_batch_norm``: the deep MLP;
    ``crosses``: pairs of single-valued sparse features crossed in the wide part; ``cross_buckets``:
    rows of each cross table."""

    def __init__(
        self,
        schema: Schema,
        *,
        embedding_init_std: float | None = ZOO_INIT_STD,
        crosses: tuple[tuple[str, str], ...] = (),
        cross_buckets: int = 100_000,
        **dnn: Unpack[DNNOptions],
    ) -> None:
        super().__init__()
        if cross_buckets < 1:
            raise ConfigError(f"wide_deep: cross_buckets must be >= 1, got {cross_buckets}")
        single = {s.name: s for s in schema.sparse if isinstance(s, SparseFeature) and not s.multi_valued}
        self.crosses: list[tuple[str, str]] = []
        for pair in crosses:
            if len(pair) != 2 or any(f not in single for f in pair):
                raise ConfigError(
                    f"wide_deep: crosses entry {tuple(pair)!r} must be a pair of single-valued sparse "
                    f"features; valid names: {sorted(single)}"
                )
            if (pair[0], pair[1]) in self.crosses:
                raise ConfigError(f"wide_deep: crosses lists {tuple(pair)!r} twice")
            self.crosses.append((pair[0], pair[1]))
        self.vocab = {k: single[k].vocab_size for pair in self.crosses for k in pair}
        self.cross_buckets = int(cross_buckets)
        self.cross_keys = [f"{a}_x_{b}" for a, b in self.crosses]
        self.cross_weights = (
            make_embeddings(tables=[TableSpec(k, self.cross_buckets, 1, (k,)) for k in self.cross_keys],
                            init="zeros")
            if self.crosses else None
        )
        self.linear = LinearTerm(schema)
        self.embedding = FieldEmbedding(schema, model="wide_deep", init_std=embedding_init_std)
        self.deep = TowerHead(self, self.embedding.out_features + schema.num_dense, dnn,
                              bias=False)  # (B, ΣD + Nd) -> (B,); the bias lives in the wide part

    def param_groups(self) -> list[ParamGroup]:
        """The wide part (linear term and cross tables): "wide", meant for FTRL + L1."""
        params = list(self.linear.parameters())
        if self.cross_weights is not None:
            params += list(self.cross_weights.parameters())
        return [ParamGroup("wide", params, optimizer="ftrl")]

    def cross_features(self, batch: Batch) -> KeyedJagged:
        """One id per declared cross and row -> KeyedJagged over ``cross_keys``."""
        ids = [
            cross_ids(first_ids(batch.sparse, a), first_ids(batch.sparse, b), self.vocab[a], self.vocab[b],
                      self.cross_buckets)
            for a, b in self.crosses
        ]
        return KeyedJagged.from_dense(self.cross_keys, torch.stack(ids, dim=1))  # (B, C) ids

    def forward(self, batch: Batch) -> ModelOutput:
        pooled, wide = field_and_linear(self.embedding, self.linear, batch)  # one lookup of both; wide (B,)
        if self.cross_weights is not None:
            wide = wide + self.cross_weights(self.cross_features(batch)).stacked().sum(dim=(1, 2))  # (B,)
        deep = self.deep(torch.cat([pooled.concat(), batch.dense], dim=1))  # (B, ΣD + Nd) -> (B,)
        return ModelOutput(wide + deep, {})  # (B,)
