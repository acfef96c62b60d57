"""What the retrieval models (two_tower, youtube_dnn, sasrec) read from a schema, and the embedding block they
share. Not a model module (leading underscore: not auto-imported).

Roles, as the schema declares them (groups, ``shares``, sequence roles and ``item_id``; never a name):

- **item features**: the single-valued sparse features of group "item" (``item``, ``cate``); the item id is
  the schema's ``item_id``, first. An item catalogue supplies exactly these, so the item tower never
  reads a user-side key. Multi-valued item features (tags) are not read: a catalogue holds one id per feature.
- **histories**: unpooled sequences (pooling "none") of role "history" embedded by an item feature's table
  (``hist_item``, ``hist_cate``), in the item features' order; DIEN's negatives and DSIN's sessions are not read.
- **search histories**: unpooled sequences of role "search" (YouTubeDNN's search tokens), any table.
- **query fields**: every other pooled key (user id, user attributes, pooled sequences, context) and all
  dense features (e.g. ``example_age``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.errors import ConfigError
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.nn.sequence import masked_mean
from ctrkit.retrieval.catalogue import item_feature_names
from ctrkit.schema import Schema, SequenceFeature, SparseFeature

SIMILARITIES = ("dot", "cosine")


@dataclass
class RetrievalFields:
    """The roles of a schema's features for a retrieval model (see the module docstring)."""

    item_features: list[str] = field(default_factory=list)  # item id first
    histories: list[str] = field(default_factory=list)  # aligned with history_items
    history_items: list[str] = field(default_factory=list)  # the item feature whose table each history shares
    search: list[str] = field(default_factory=list)
    query_pooled: list[str] = field(default_factory=list)
    dense: list[str] = field(default_factory=list)

    @property
    def item_id(self) -> str:
        return self.item_features[0]


def retrieval_fields(schema: Schema, model: str) -> RetrievalFields:
    """Find the item features, histories, search histories and query fields of ``schema``."""
    items = item_feature_names(schema)  # item id first
    if not items:
        raise ConfigError(
            f"{model}: a retrieval model needs the item's features: single-valued sparse features of group "
            f"'item' (e.g. 'item', 'cate'); the schema's sparse features are "
            f"{[(s.name, s.group) for s in schema.sparse] or 'none'} (behaviour stores have them)"
        )
    out = RetrievalFields(item_features=items)
    table_item = {}
    for name in reversed(items):  # the first item feature of a table wins
        table_item[schema.table_of(name)] = name
    out.search = schema.sequences("search")
    for name in schema.sequences("history"):
        if schema.table_of(name) in table_item:
            out.histories.append(name)
            out.history_items.append(table_item[schema.table_of(name)])
    order = sorted(range(len(out.histories)), key=lambda j: items.index(out.history_items[j]))
    out.histories = [out.histories[j] for j in order]
    out.history_items = [out.history_items[j] for j in order]
    out.query_pooled = [k for k in schema.pooled_keys if k not in items
                        and not (isinstance(f := schema.feature(k), SparseFeature) and f.group == "item")]
    out.dense = schema.dense_names
    return out


def check_choice(model: str, option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{model}: {option}={value!r} is not one of {choices}")


def check_positive(model: str, option: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{model}: {option} must be > 0, got {value}")


class RetrievalEmbedding(nn.Module):
    """One embedding collection for a retrieval model: item features by table lookup (so catalogue batches
    without user keys work), the query's pooled fields, and unpooled histories."""

    def __init__(self, schema: Schema, fields: RetrievalFields, *, init_std: float) -> None:
        super().__init__()
        self.fields = fields
        seq = [*fields.histories, *fields.search]
        self.embedding = make_embeddings(schema, [*fields.item_features, *fields.query_pooled], sequence_keys=seq,
                                         init="normal", std=init_std)
        self.tables = {k: schema.table_of(k) for k in [*fields.item_features, *seq]}
        self.item_dim = sum(schema.embedding_dim(k) for k in fields.item_features)
        self.item_id_dim = schema.embedding_dim(fields.item_id)
        self.query_dim = sum(schema.embedding_dim(k) for k in fields.query_pooled)
        self.history_dim = sum(schema.embedding_dim(k) for k in fields.history_items)
        self.search_dims = [self._seq_dim(schema, k) for k in fields.search]

    @staticmethod
    def _seq_dim(schema: Schema, key: str) -> int:
        q = schema.feature(key)
        assert isinstance(q, SequenceFeature)
        return schema.embedding_dim(q.shares)

    def item_ids(self, kj: KeyedJagged, key: str) -> torch.Tensor:
        if torch.compiler.is_exporting():  # the first id of each row, without the host-side check
            lengths, starts = kj.bags(key)
            return kj.take(starts, lengths > 0)  # (B,)
        values = kj[key][0]
        if values.numel() != kj.stride:
            raise ConfigError(f"item feature {key!r} must hold exactly one id per row; got {values.numel()} ids "
                              f"for {kj.stride} rows")
        return values  # (B,)

    def items(self, kj: KeyedJagged, keys: list[str] | None = None) -> torch.Tensor:
        """[e(item); e(cate); ...] of the rows' items -> (B, Di)."""
        keys = self.fields.item_features if keys is None else keys
        parts = [self.embedding.lookup(self.tables[k], self.item_ids(kj, k), key=k) for k in keys]
        return torch.cat(parts, 1) if len(parts) > 1 else parts[0]

    def query_fields(self, batch: Batch) -> torch.Tensor:
        """The pooled query fields and the dense features, concatenated -> (B, Do + Nd)."""
        parts = []
        if self.fields.query_pooled:
            d = self.embedding.pooled(batch.sparse).to_dict()  # the item features' tables are pooled too (cheap)
            parts += [d[k] for k in self.fields.query_pooled]
        if batch.dense.shape[1]:
            parts.append(batch.dense)
        return torch.cat(parts, 1) if parts else batch.dense.new_zeros(batch.batch_size, 0)

    def history(self, kj: KeyedJagged, keys: list[str] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Behaviours ``(emb (B, T, Dh), mask (B, T))``, each step [e(item_t); e(cate_t)], trimmed to the batch's
        longest history (rows are left-aligned, oldest first)."""
        keys = self.fields.histories if keys is None else keys
        parts, mask = [], None
        for k in keys:
            e, m = self.embedding.sequence(kj, k)
            parts.append(e)
            mask = m if mask is None else mask
        assert mask is not None
        emb = torch.cat(parts, -1) if len(parts) > 1 else parts[0]
        if torch.compiler.is_exporting():  # the full max_len: a program's shapes cannot depend on the ids
            return emb, mask
        n = max(int(mask.sum(1).max()) if mask.numel() else 0, 1)
        return emb[:, :n], mask[:, :n]

    def mean_history(self, kj: KeyedJagged, keys: list[str]) -> torch.Tensor:
        """Masked mean of the sequences ``keys`` (an empty history gives zeros) -> (B, sum D)."""
        if not keys:
            return kj.values.new_zeros(kj.stride, 0, dtype=torch.float32)
        emb, mask = self.history(kj, keys)
        return masked_mean(emb, mask)


def similarity_vectors(x: torch.Tensor, similarity: str) -> torch.Tensor:
    """``x`` for a dot product, or L2-normalised for cosine similarity."""
    return nn.functional.normalize(x, dim=-1) if similarity == "cosine" else x
