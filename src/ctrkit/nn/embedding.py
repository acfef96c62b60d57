"""Pooled embedding lookups for ``KeyedJagged`` ids (the SparseArch of seed 000 §4-5).

Tables of the same embedding dim live in ONE fused weight ``[sum of their rows, D]``; table t starts
at row ``row_offset[t]``. A batch is one ``F.embedding_bag`` call per (dim, pooling) group, not one
per feature: ids are shifted by their feature's table offset (``values + repeat_interleave(offset
per key, ids per key)``) and the key-major KeyedJagged offsets are used as bag offsets directly, so
bag ``f*B + b`` is feature f of row b. The ``[F*B, D]`` result is viewed as ``[F, B, D]`` and
transposed to ``[B, F, D]``. When every bag holds exactly one id (single-valued features such as
Criteo's), the group is a plain ``F.embedding`` gather instead: same result for sum and mean, and
its sparse backward is the upstream gradient itself instead of a per-id gather.

Seed 000 §5: for one table, ``Y[n] = sum_k W[x_{n,k}]`` and ``dL/dW = P^T dL/dY`` with
``P[n, m] = count_k(x_{n,k} = m)``; with ``sparse_grad=True`` autograd returns exactly that as a
sparse gradient holding only the touched rows.

Init: torchrec's default, ``W ~ U(-sqrt(1/n), sqrt(1/n))`` per table with n = its number of rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ctrkit.batch import KeyedJagged
from ctrkit.errors import IdOutOfRangeError
from ctrkit.schema import Schema, SchemaError, SequenceFeature, SparseFeature, TableSpec

POOLINGS = ("sum", "mean")



class EmbeddingWeight(nn.Parameter):
    """A fused embedding weight. ``is_embedding`` is True so the trainer can put it in the
    sparse-aware optimizer group (kept as a class attribute so it survives ``copy.deepcopy``)."""

    is_embedding = True


def embedding_parameters(module: nn.Module) -> Iterator[nn.Parameter]:
    """Parameters of ``module`` marked ``is_embedding`` (rows updated from sparse gradients)."""
    for p in module.parameters():
        if getattr(p, "is_embedding", False):
            yield p


@dataclass(frozen=True)
class _Group:
    """Features pooled by one embedding_bag call: same dim (one fused weight) and same pooling."""

    dim: int
    pooling: str
    keys: tuple[str, ...]
    positions: tuple[int, ...]  # position of each key in the collection's output order


class PooledEmbeddings:
    """Pooled embeddings of F features for B rows, in the collection's key order.

    Holds one ``[F_g, B, D_g]`` tensor per (dim, pooling) group; the views below build what a model
    needs: ``stacked()`` [B, F, D] (all dims equal), ``concat()`` [B, sum D_k], ``to_dict()``.
    """

    def __init__(self, keys: Sequence[str], dims: Sequence[int], groups: Sequence[_Group],
                 tensors: Sequence[torch.Tensor]) -> None:
        self.keys: list[str] = list(keys)
        self.dims: list[int] = list(dims)
        self._groups = list(groups)
        self._tensors = list(tensors)  # each (F_g, B, D_g)

    @property
    def batch_size(self) -> int:
        return int(self._tensors[0].shape[1]) if self._tensors else 0

    def stacked(self) -> torch.Tensor:
        """All features as ``[B, F, D]``; an error names the features and dims if dims differ."""
        if len(set(self.dims)) > 1:
            by_dim: dict[int, list[str]] = {}
            for k, d in zip(self.keys, self.dims):
                by_dim.setdefault(d, []).append(k)
            raise ValueError(
                "stacked() needs one embedding dim for all features, but they differ: "
                + "; ".join(f"dim {d}: {ks}" for d, ks in by_dim.items())
                + ". Give these features the same embedding_dim in the schema, or use concat()/to_dict()."
            )
        # contiguous (B, F, D): the strided transpose view made every downstream broadcast op slow
        # (xDeepFM training step on the Criteo shapes: 230 -> 160 ms)
        if len(self._tensors) == 1:
            return self._tensors[0].transpose(0, 1).contiguous()  # (B, F, D)
        allf = torch.cat(self._tensors, 0)  # (F, B, D) in group order
        order = [p for g in self._groups for p in g.positions]
        if order != list(range(len(order))):
            inv = [0] * len(order)
            for i, p in enumerate(order):
                inv[p] = i
            allf = allf[inv]
        return allf.transpose(0, 1).contiguous()  # (B, F, D)

    def concat(self) -> torch.Tensor:
        """All features concatenated along the last dim: ``[B, sum_k D_k]`` in key order."""
        if len(set(self.dims)) <= 1:
            s = self.stacked()
            return s.reshape(s.shape[0], -1)
        d = self.to_dict()
        return torch.cat([d[k] for k in self.keys], 1)

    def to_dict(self) -> dict[str, torch.Tensor]:
        """``{key: [B, D_k]}``."""
        out: dict[str, torch.Tensor] = {}
        for g, t in zip(self._groups, self._tensors):
            for i, k in enumerate(g.keys):
                out[k] = t[i]
        return {k: out[k] for k in self.keys}

    def __getitem__(self, key: str) -> torch.Tensor:
        for g, t in zip(self._groups, self._tensors):
            if key in g.keys:
                return t[g.keys.index(key)]
        raise KeyError(f"no pooled embedding for {key!r}; keys: {self.keys}")

    def __repr__(self) -> str:
        return f"PooledEmbeddings(keys={self.keys}, dims={self.dims}, batch_size={self.batch_size})"


class EmbeddingBagCollection(nn.Module):
    """Pooled lookups of several features over several tables, fused per embedding dim.

    Args:
        tables: the embedding tables (``TableSpec(name, num_embeddings, embedding_dim, features)``).
        feature_to_table: pooled feature -> table name, in output order. Default: every feature listed
            in ``tables[i].features``, in table order.
        feature_pooling: pooled feature -> "sum" | "mean" (default "sum").
        lookup_keys: extra features (e.g. unpooled sequences) -> table, usable only with ``lookup``.
        sparse_grad: sparse gradients (only touched rows) for the fused weights.
        validate: check every id lies in ``[0, num_embeddings)`` of its table (cheap; one compare per id).
        init_std: initialise tables N(0, init_std^2) instead of torchrec's U(-sqrt(1/n), sqrt(1/n)).

    ``forward(kj)`` -> :class:`PooledEmbeddings` (``.stacked()`` is ``[B, F, D]``). ``kj`` may hold
    more keys than the collection pools; the extra keys are ignored.
    """

    def __init__(
        self,
        tables: Sequence[TableSpec],
        feature_to_table: Mapping[str, str] | None = None,
        feature_pooling: Mapping[str, str] | None = None,
        *,
        lookup_keys: Mapping[str, str] | None = None,
        sparse_grad: bool = True,
        validate: bool = True,
        init_std: float | None = None,
    ) -> None:
        super().__init__()
        self.init_std = init_std
        self.tables: dict[str, TableSpec] = {}
        for t in tables:
            if t.name in self.tables:
                raise ValueError(f"table {t.name!r} is given twice")
            if t.num_embeddings < 1 or t.embedding_dim < 1:
                raise ValueError(f"table {t.name!r} needs num_embeddings >= 1 and embedding_dim >= 1, got {t}")
            self.tables[t.name] = t
        if feature_to_table is None:
            feature_to_table = {f: t.name for t in tables for f in t.features}
        feature_pooling = dict(feature_pooling or {})
        for name, mapping in (("feature_to_table", feature_to_table), ("lookup_keys", lookup_keys or {})):
            for f, t in mapping.items():
                if t not in self.tables:
                    raise ValueError(f"{name}: feature {f!r} names table {t!r}, not one of {list(self.tables)}")
        unknown = set(feature_pooling) - set(feature_to_table)
        if unknown:
            raise ValueError(f"feature_pooling names features {sorted(unknown)} that are not pooled here")
        self.keys: list[str] = list(feature_to_table)
        self.feature_to_table: dict[str, str] = dict(feature_to_table)
        self.feature_pooling: dict[str, str] = {k: feature_pooling.get(k, "sum") for k in self.keys}
        for k, p in self.feature_pooling.items():
            if p not in POOLINGS:
                raise ValueError(f"feature {k!r}: pooling {p!r} is not one of {POOLINGS}")
        self._table_of: dict[str, str] = {**self.feature_to_table, **dict(lookup_keys or {})}
        self.sparse_grad = bool(sparse_grad)
        self.validate = bool(validate)
        self.dims: list[int] = [self.tables[self.feature_to_table[k]].embedding_dim for k in self.keys]

        # Fused weights: one per dim; tables in the given order, each at its row offset.
        self.row_offset: dict[str, int] = {}
        rows_per_dim: dict[int, int] = {}
        for t in tables:
            self.row_offset[t.name] = rows_per_dim.get(t.embedding_dim, 0)
            rows_per_dim[t.embedding_dim] = self.row_offset[t.name] + t.num_embeddings
        self.weights = nn.ParameterDict(
            {f"dim{d}": EmbeddingWeight(torch.empty(n, d)) for d, n in rows_per_dim.items()}
        )
        for p in self.weights.values():
            p.is_embedding = True  # also as instance attribute: survives pickling of the module

        groups: dict[tuple[int, str], list[int]] = {}
        for i, k in enumerate(self.keys):
            groups.setdefault((self.dims[i], self.feature_pooling[k]), []).append(i)
        self._groups = [
            _Group(d, p, tuple(self.keys[i] for i in pos), tuple(pos)) for (d, p), pos in groups.items()
        ]
        # per group: table row offset and table size of each key, as buffers (move with .to()).
        for gi, g in enumerate(self._groups):
            tabs = [self.tables[self.feature_to_table[k]] for k in g.keys]
            self.register_buffer(f"_offs{gi}", torch.tensor([self.row_offset[t.name] for t in tabs]),
                                 persistent=False)
            self.register_buffer(f"_size{gi}", torch.tensor([t.num_embeddings for t in tabs]), persistent=False)
        self.reset_parameters()

    # ---- construction from a schema ------------------------------------------------------------
    @classmethod
    def from_schema(
        cls,
        schema: Schema,
        keys: Sequence[str] | None = None,
        *,
        lookup_keys: Sequence[str] | None = None,
        sparse_grad: bool = True,
        validate: bool = True,
        init_std: float | None = None,
    ) -> EmbeddingBagCollection:
        """Collection pooling ``keys`` (default: every sparse feature and every sequence feature whose
        pooling is not "none"), with the schema's tables and poolings. ``lookup_keys`` (default: the
        sequences with pooling "none" whose table is already used) can only be embedded with
        ``lookup``. Only tables used by these keys are created."""
        if keys is None:
            keys = schema.pooled_keys
        pooling: dict[str, str] = {}
        for k in keys:
            f = schema.feature(k)
            if isinstance(f, SequenceFeature) and f.pooling == "none":
                raise SchemaError(
                    f"sequence feature {k!r} has pooling 'none', so it cannot be pooled by an "
                    "EmbeddingBagCollection; pass it in lookup_keys and embed it with lookup(key, ids)"
                )
            if not isinstance(f, (SparseFeature, SequenceFeature)):
                raise SchemaError(f"feature {k!r} is dense; an EmbeddingBagCollection pools sparse features")
            pooling[k] = f.pooling
        f2t = {k: schema.table_of(k) for k in keys}
        if lookup_keys is None:
            used = set(f2t.values())
            lookup_keys = [q.name for q in schema.sequence if q.pooling == "none" and schema.table_of(q.name) in used]
        l2t = {k: schema.table_of(k) for k in lookup_keys}
        needed = set(f2t.values()) | set(l2t.values())
        tables = [t for name, t in schema.tables().items() if name in needed]
        return cls(tables, f2t, pooling, lookup_keys=l2t, sparse_grad=sparse_grad, validate=validate,
                   init_std=init_std)

    # ---- parameters ----------------------------------------------------------------------------
    def reset_parameters(self) -> None:
        """torchrec's default: each table ~ U(-sqrt(1/n), sqrt(1/n)), n = its rows; with ``init_std``
        every table ~ N(0, init_std^2) instead (DeepCTR / FuxiCTR's start for FM-style models, whose
        pairwise products blow up from large initial vectors)."""
        with torch.no_grad():
            for t in self.tables.values():
                if self.init_std is not None:
                    self.table_weight(t.name).normal_(0.0, self.init_std)
                    continue
                bound = math.sqrt(1.0 / t.num_embeddings)
                self.table_weight(t.name).uniform_(-bound, bound)

    def table_weight(self, table: str) -> torch.Tensor:
        """The rows of ``table`` inside its fused weight, ``[num_embeddings, D]`` (a view)."""
        t = self.tables[table]
        o = self.row_offset[table]
        return self.weights[f"dim{t.embedding_dim}"][o : o + t.num_embeddings]

    @property
    def out_features(self) -> int:
        """Width of ``concat()``: sum of the pooled features' dims."""
        return sum(self.dims)

    @property
    def embedding_dim(self) -> int:
        """The common dim of all pooled features; an error if they differ."""
        if len(set(self.dims)) != 1:
            raise ValueError(f"features have different embedding dims: {dict(zip(self.keys, self.dims))}")
        return self.dims[0]

    # ---- forward -------------------------------------------------------------------------------
    def forward(self, kj: KeyedJagged) -> PooledEmbeddings:
        B = kj.stride
        tensors = []
        for gi, g in enumerate(self._groups):
            Fg = len(g.keys)
            values, offsets, weights, lengths = _group_input(kj, g.keys)
            if weights is not None and g.pooling != "sum":
                raise ValueError(
                    f"per-sample weights need pooling 'sum', but features {list(g.keys)} use {g.pooling!r}"
                )
            offs, size = getattr(self, f"_offs{gi}"), getattr(self, f"_size{gi}")
            weight = self.weights[f"dim{g.dim}"]
            n = values.numel()
            if n == Fg * B and B and not bool((lengths == 0).any()):
                # every bag holds exactly one id (e.g. Criteo): a plain gather, whose sparse backward
                # is the upstream gradient itself (no bag bookkeeping)
                v = values.view(Fg, B)
                if self.validate:
                    lo, hi = torch.aminmax(v, dim=1)
                    if bool(((lo < 0) | (hi >= size)).any()):
                        self._raise_bad_id(g.keys, values, lengths.view(Fg, B).sum(1), size)
                out = F.embedding((v + offs.unsqueeze(1)).view(-1), weight, sparse=self.sparse_grad)
                if weights is not None:
                    out = out * weights.unsqueeze(1)
            else:
                per_key = lengths.view(Fg, B).sum(1)  # (F_g,)
                if self.validate and n:
                    self._check_ids(g.keys, values, per_key, size)
                ids = values + offs.repeat_interleave(per_key, output_size=n) if n else values
                out = F.embedding_bag(
                    ids, weight, offsets, mode=g.pooling, sparse=self.sparse_grad,
                    per_sample_weights=weights, include_last_offset=True,
                )  # (F_g*B, D)
            tensors.append(out.view(Fg, B, g.dim))  # (F_g, B, D)
        return PooledEmbeddings(self.keys, self.dims, self._groups, tensors)

    def _check_ids(self, keys: Sequence[str], values: torch.Tensor, per_key: torch.Tensor,
                   size: torch.Tensor) -> None:
        bound = size.repeat_interleave(per_key, output_size=values.numel())
        if bool(((values < 0) | (values >= bound)).any()):
            self._raise_bad_id(keys, values, per_key, size)

    def lookup(self, key: str, ids: torch.Tensor) -> torch.Tensor:
        """Unpooled embeddings of ``ids`` (any shape, e.g. padded [B, T]) in ``key``'s table -> [..., D]."""
        if key not in self._table_of:
            raise KeyError(f"no table for feature {key!r}; known: {sorted(self._table_of)}")
        t = self.tables[self._table_of[key]]
        if self.validate and ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= t.num_embeddings:
                bad = lo if lo < 0 else hi
                raise IdOutOfRangeError(
                    f"feature {key!r}: id {bad} is outside table {t.name!r} of size {t.num_embeddings} "
                    f"(valid ids 0..{t.num_embeddings - 1})"
                )
        return F.embedding(ids + self.row_offset[t.name], self.weights[f"dim{t.embedding_dim}"],
                           sparse=self.sparse_grad)

    def _raise_bad_id(self, keys: Sequence[str], values: torch.Tensor, per_key: torch.Tensor,
                      size: torch.Tensor) -> None:
        bound = size.repeat_interleave(per_key, output_size=values.numel())
        pos = int(((values < 0) | (values >= bound)).nonzero()[0, 0])
        f = int((torch.cumsum(per_key, 0) <= pos).sum())
        key = keys[f]
        t = self.tables[self.feature_to_table[key]]
        raise IdOutOfRangeError(
            f"feature {key!r}: id {int(values[pos])} is outside table {t.name!r} of size {t.num_embeddings} "
            f"(valid ids 0..{t.num_embeddings - 1}); check the vocab_size in the schema or the preprocessing"
        )

    def extra_repr(self) -> str:
        ts = ", ".join(f"{t.name}({t.num_embeddings}x{t.embedding_dim})" for t in self.tables.values())
        return f"keys={self.keys}, tables=[{ts}], sparse_grad={self.sparse_grad}"


def _group_input(
    kj: KeyedJagged, keys: tuple[str, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(values, bag offsets [F_g*B + 1] from 0, weights or None, lengths [F_g*B]) of ``keys`` in
    ``kj``. A contiguous run of keys (the usual case: all of them) is sliced without copying."""
    B = kj.stride
    try:
        idx = [kj.keys.index(k) for k in keys]
    except ValueError:
        missing = [k for k in keys if k not in kj.keys]
        raise KeyError(f"sparse input lacks features {missing}; it has {kj.keys}") from None
    i0, n = idx[0], len(idx)
    if idx == list(range(i0, i0 + n)):
        if n == len(kj.keys):
            return kj.values, kj.offsets, kj.weights, kj.lengths
        lengths = kj.lengths[i0 * B : (i0 + n) * B]
        offsets = kj.offsets[i0 * B : (i0 + n) * B + 1]
        a, b = int(offsets[0]), int(offsets[-1])
        w = kj.weights[a:b] if kj.weights is not None else None
        return kj.values[a:b], offsets - a, w, lengths
    sub = kj.select(list(keys))
    return sub.values, sub.offsets, sub.weights, sub.lengths
