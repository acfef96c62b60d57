"""Embedding tables: the interface every model embeds ids through, its fused backend, and the factory.

- :class:`EmbeddingCollection` — the interface (DESIGN §6): ``pooled(kj)`` -> :class:`PooledEmbeddings`
  (one D-wide vector per feature and row), ``sequence(kj, key)`` -> ``(emb (B, T, D), mask (B, T))`` for
  an unpooled history, ``lookup(table, ids)`` -> ``(..., D)``, ``embedding_parameters()``, ``tables``.
  Its state dict names tables: ``<prefix>tables.<table>`` -> ``[rows, D]``, whatever the backend.
  (Defined in :mod:`ctrkit.nn.embedding_interface` with :class:`PooledEmbeddings`, re-exported here.)
- :class:`EmbeddingBagCollection` — the ``fused`` backend (the SparseArch of seed 000 §4-5).
- :func:`~ctrkit.nn.embedding_factory.make_embeddings` — the one factory models build their tables with, from what the model asks
  for (keys, sequences, dims, init). Its ``backend`` defaults to the one chosen for the model being built
  (:func:`embedding_backend`, set by ``create_model`` from ``model.params.embedding_backend``), so a
  sharded backend is a drop-in for every model without a change to any model file.

Fused backend: tables of the same embedding dim live in ONE weight ``[sum of their rows, D]``; table t
starts at row ``row_offset[t]``. A batch is one ``F.embedding_bag`` call per (dim, pooling) group, not
one per feature: ids are shifted by their feature's table offset (``values + repeat_interleave(offset
per key, ids per key)``) and the key-major KeyedJagged offsets are used as bag offsets directly, so bag
``f*B + b`` is feature f of row b. The ``[F*B, D]`` result is viewed as ``[F, B, D]`` and transposed to
``[B, F, D]``. When every bag holds exactly one id (single-valued features such as Criteo's), the group
is a plain ``F.embedding`` gather instead: same result for sum and mean, and its sparse backward is the
upstream gradient itself instead of a per-id gather.

Seed 000 §5: for one table, ``Y[n] = sum_k W[x_{n,k}]`` and ``dL/dW = P^T dL/dY`` with
``P[n, m] = count_k(x_{n,k} = m)``; with ``sparse_grad=True`` autograd returns exactly that as a sparse
gradient holding only the touched rows.

Under ``torch.export`` (:mod:`ctrkit.serving.export`) lookups have no host syncs or branches on the data: every
id is looked up (other features' as row 0, zeroed) and summed into its bag (``KeyedJagged.bag_sums``), ids are
not validated, and unpooled sequences are looked up at every padded position, the padding zeroed.

Init (per table, in table order): ``uniform`` — torchrec's default ``U(-sqrt(1/n), sqrt(1/n))``, n = its
rows; ``normal`` — ``N(0, std^2)``; ``zeros``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ctrkit.batch import KeyedJagged
from ctrkit.errors import IdOutOfRangeError, LayerConfigError, UnknownKeyError
from ctrkit.nn.embedding_grad import DENSE_GRAD_MAX_ROWS, bag_rows, gather_rows
from ctrkit.nn.embedding_interface import (
    EmbeddingCollection,
    PooledEmbeddings,
    PoolGroup,
    embedding_backend,
    group_input,
)
from ctrkit.nn.table_memory import check_tables_fit
from ctrkit.schema import TableSpec

__all__ = ["EmbeddingBagCollection", "EmbeddingCollection", "PooledEmbeddings", "embedding_backend"]

POOLINGS = ("sum", "mean")
INITS = ("uniform", "normal", "zeros")

class EmbeddingBagCollection(EmbeddingCollection):
    """The ``fused`` backend: pooled lookups of several features over several tables, one weight per dim.

    Args:
        tables: the embedding tables (``TableSpec(name, num_embeddings, embedding_dim, features)``).
        feature_to_table: pooled feature -> table name, in output order. Default: every feature listed
            in ``tables[i].features``, in table order.
        feature_pooling: pooled feature -> "sum" | "mean" (default "sum").
        sequence_keys: unpooled sequence feature -> (table, max_len), embedded by ``sequence``.
        sparse_grad: sparse gradients (only touched rows) for the fused weights larger than
            ``dense_grad_max_rows``; False: dense gradients for every fused weight.
        dense_grad_max_rows: a fused weight of at most this many rows gets a dense gradient even with
            ``sparse_grad`` (built by ``index_add_``, :mod:`ctrkit.nn.embedding_grad`: cheaper than sparse
            gradients on a table that most batches touch throughout). 0: sparse gradients for every weight.
        validate: check every id lies in ``[0, num_embeddings)`` of its table (cheap; one compare per id).
        init: "uniform" (torchrec's default) | "normal" (N(0, std^2)) | "zeros".
        std: the standard deviation of ``init="normal"``.

    The fused weights are internal: the state dict holds one ``tables.<name>`` entry per table (views
    of the fused weight, so a saved file stores each row once) and loading fills the fused weight.
    """

    def __init__(
        self,
        tables: Sequence[TableSpec],
        feature_to_table: Mapping[str, str] | None = None,
        feature_pooling: Mapping[str, str] | None = None,
        *,
        sequence_keys: Mapping[str, tuple[str, int]] | None = None,
        sparse_grad: bool = True,
        validate: bool = True,
        init: str = "uniform",
        std: float | None = None,
        dense_grad_max_rows: int = DENSE_GRAD_MAX_ROWS,
    ) -> None:
        super().__init__()
        self.init, self.std = _checked_init(init, std)
        self.tables: dict[str, TableSpec] = _table_map(tables)
        if feature_to_table is None:
            feature_to_table = {f: t.name for t in tables for f in t.features}
        feature_pooling = dict(feature_pooling or {})
        sequence_keys = dict(sequence_keys or {})
        _check_features(self.tables, feature_to_table, feature_pooling, sequence_keys)
        self.keys: list[str] = list(feature_to_table)
        self.feature_to_table: dict[str, str] = dict(feature_to_table)
        self.feature_pooling: dict[str, str] = {k: feature_pooling.get(k, "sum") for k in self.keys}
        for k, p in self.feature_pooling.items():
            if p not in POOLINGS:
                raise LayerConfigError(f"feature {k!r}: pooling {p!r} is not one of {POOLINGS}")
        self.sequence_keys: dict[str, tuple[str, int]] = {k: (t, int(n)) for k, (t, n) in sequence_keys.items()}
        self.sparse_grad = bool(sparse_grad)
        self.dense_grad_max_rows = int(dense_grad_max_rows)
        self.validate = bool(validate)
        self.dims: list[int] = [self.tables[self.feature_to_table[k]].embedding_dim for k in self.keys]
        self._allocate(tables)
        # the dims whose fused weight gets sparse gradients: large ones, when sparse gradients are asked for
        self._sparse_dims = {d for d in self._fused_dims() if self.sparse_grad
                             and self._fused(d).shape[0] > self.dense_grad_max_rows}
        self._group_keys()
        self.reset_parameters()

    def _allocate(self, tables: Sequence[TableSpec]) -> None:
        """Fused weights: one per dim ("fused_dim<D>"); tables in the given order, each at its row offset."""
        self.row_offset: dict[str, int] = {}
        rows_per_dim: dict[int, int] = {}
        for t in tables:
            self.row_offset[t.name] = rows_per_dim.get(t.embedding_dim, 0)
            rows_per_dim[t.embedding_dim] = self.row_offset[t.name] + t.num_embeddings
        check_tables_fit(tables)  # before allocating: a clear error instead of an allocator failure / OOM kill
        for d, n in rows_per_dim.items():
            self.register_parameter(_fused_name(d), nn.Parameter(torch.empty(n, d)))

    def _group_keys(self) -> None:
        """Keys pooled together: one group per (dim, pooling), with each key's table row offset and table size
        as buffers (they move with ``.to()``)."""
        groups: dict[tuple[int, str], list[int]] = {}
        for i, k in enumerate(self.keys):
            groups.setdefault((self.dims[i], self.feature_pooling[k]), []).append(i)
        self._groups = [
            PoolGroup(d, p, tuple(self.keys[i] for i in pos), tuple(pos)) for (d, p), pos in groups.items()
        ]
        for gi, g in enumerate(self._groups):
            tabs = [self.tables[self.feature_to_table[k]] for k in g.keys]
            self.register_buffer(f"_offs{gi}", torch.tensor([self.row_offset[t.name] for t in tabs]),
                                 persistent=False)
            self.register_buffer(f"_size{gi}", torch.tensor([t.num_embeddings for t in tabs]), persistent=False)

    # ---- parameters ----------------------------------------------------------------------------
    def reset_parameters(self) -> None:
        """Every table by ``init``, in table order. ``normal`` is DeepCTR / FuxiCTR's start for FM-style
        models, whose pairwise products blow up from large initial vectors. ``zeros`` draws the uniform
        values first and discards them, so the parameters created after the table start from the same
        random values as when ctrkit zeroed a uniform-initialised table (same results for the same seeds)."""
        with torch.no_grad():
            for t in self.tables.values():
                w = self.table_weight(t.name)
                if self.init == "normal":
                    w.normal_(0.0, self.std)
                    continue
                bound = math.sqrt(1.0 / t.num_embeddings)
                w.uniform_(-bound, bound)
                if self.init == "zeros":
                    w.zero_()

    def table_weight(self, table: str) -> torch.Tensor:
        """The rows of ``table`` inside its fused weight, ``[num_embeddings, D]`` (a view)."""
        t = self.tables[table]
        o = self.row_offset[table]
        return self._fused(t.embedding_dim)[o : o + t.num_embeddings]

    def table_rows(self) -> list[tuple[nn.Parameter, dict[str, int]]]:
        return [(self._fused(d), {n: self.row_offset[n] for n, t in self.tables.items() if t.embedding_dim == d})
                for d in self._fused_dims()]

    def _fused(self, dim: int) -> nn.Parameter:
        return self._parameters[_fused_name(dim)]  # type: ignore[return-value]

    def _fused_dims(self) -> list[int]:
        return list(dict.fromkeys(t.embedding_dim for t in self.tables.values()))

    def embedding_parameters(self) -> Iterator[nn.Parameter]:
        yield from self._parameters.values()  # type: ignore[misc]

    def sparse_grad_parameters(self) -> list[nn.Parameter]:
        """The fused weights whose gradients are sparse COO tensors (the rest get dense ones)."""
        return [self._fused(d) for d in self._fused_dims() if d in self._sparse_dims]

    # ---- state dict: one entry per table ---------------------------------------------------------
    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        for name in self.tables:
            w = self.table_weight(name)
            destination[f"{prefix}tables.{name}"] = w if keep_vars else w.detach()

    def _load_from_state_dict(self, state_dict: Mapping[str, Any], prefix: str, local_metadata: Any,
                              strict: bool, missing_keys: list[str], unexpected_keys: list[str],
                              error_msgs: list[str]) -> None:
        expected = {f"{prefix}tables.{name}": name for name in self.tables}
        for key, name in expected.items():
            if key not in state_dict:
                missing_keys.append(key)
                continue
            value, target = state_dict[key], self.table_weight(name)
            if not isinstance(value, torch.Tensor) or value.shape != target.shape:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {shape} from "
                                  f"checkpoint, the shape in current model is {tuple(target.shape)}.")
                continue
            with torch.no_grad():
                target.copy_(value)
        if strict:
            unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in expected)

    # ---- forward -------------------------------------------------------------------------------
    def pooled(self, kj: KeyedJagged) -> PooledEmbeddings:
        B = kj.stride
        tensors = []
        for gi, g in enumerate(self._groups):
            if torch.compiler.is_exporting():
                tensors.append(self._pooled_exported(kj, gi, g))
                continue
            Fg = len(g.keys)
            values, offsets, weights, lengths = group_input(kj, g.keys)
            if weights is not None and g.pooling != "sum":
                raise LayerConfigError(
                    f"per-sample weights need pooling 'sum', but features {list(g.keys)} use {g.pooling!r}"
                )
            offs, size = getattr(self, f"_offs{gi}"), getattr(self, f"_size{gi}")
            n = values.numel()
            if n == Fg * B and B and not bool((lengths == 0).any()):
                # every bag holds exactly one id (e.g. Criteo): a plain gather, whose sparse backward
                # is the upstream gradient itself (no bag bookkeeping)
                v = values.view(Fg, B)
                if self.validate:
                    lo, hi = torch.aminmax(v, dim=1)
                    if bool(((lo < 0) | (hi >= size)).any()):
                        self._raise_bad_id(g.keys, values, lengths.view(Fg, B).sum(1), size)
                out = self._gather(g.dim, (v + offs.unsqueeze(1)).view(-1))
                if weights is not None:
                    out = out * weights.unsqueeze(1)
            else:
                per_key = lengths.view(Fg, B).sum(1)  # (F_g,)
                if self.validate and n:
                    self._check_ids(g.keys, values, per_key, size)
                ids = values + offs.repeat_interleave(per_key, output_size=n) if n else values
                out = self._bag(g.dim, ids, offsets, g.pooling, weights)  # (F_g*B, D)
            tensors.append(out.view(Fg, B, g.dim))  # (F_g, B, D)
        return PooledEmbeddings(self.keys, self.dims, self._groups, tensors)

    def _pooled_exported(self, kj: KeyedJagged, gi: int, g: PoolGroup) -> torch.Tensor:
        """Group ``g``'s pooled embeddings (F_g, B, D) with fixed-shape ops only (the module docstring)."""
        F_all, offs = len(kj.keys), getattr(self, f"_offs{gi}")
        idx = torch.tensor([kj.keys.index(k) for k in g.keys], device=offs.device)  # (F_g,) in kj's key order
        key = torch.div(kj.bag_index(), kj.stride, rounding_mode="floor")  # (nnz,) each id's key; F after offsets[-1]
        member = torch.zeros(F_all + 1, dtype=torch.bool, device=offs.device).index_fill(0, idx, True)[key]  # (nnz,)
        row_offset = offs.new_zeros(F_all + 1).index_copy(0, idx, offs)[key]  # (nnz,) 0 outside the group
        rows = F.embedding(torch.where(member, kj.values + row_offset, 0), self._fused(g.dim))  # (nnz, D)
        scale = member.to(rows.dtype) if kj.weights is None else member * kj.weights  # 0 for other keys' ids
        out = kj.bag_sums(rows * scale.unsqueeze(1))[idx]  # (F_g, B, D)
        if g.pooling == "mean":
            out = out / kj.lengths_2d()[idx].clamp(min=1).unsqueeze(2).to(out.dtype)
        return out

    def sequence(self, kj: KeyedJagged, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        if key not in self.sequence_keys:
            raise UnknownKeyError(f"no unpooled sequence feature {key!r}; known: {sorted(self.sequence_keys)}")
        table, max_len = self.sequence_keys[key]
        ids, mask = kj.to_padded(key, max_len)  # (B, T) each, the last max_len ids of each row
        if torch.compiler.is_exporting():  # every position looked up (pads read id 0), the padding zeroed
            return torch.where(mask.unsqueeze(2), self.lookup(table, ids, key=key), 0.0), mask  # (B, T, D)
        rows = self.lookup(table, ids[mask], key=key)  # (n, D): only real ids, so pads get no gradient
        emb = rows.new_zeros(*mask.shape, rows.shape[-1])  # (B, T, D)
        emb[mask] = rows
        return emb, mask

    def lookup(self, table: str, ids: torch.Tensor, *, key: str | None = None) -> torch.Tensor:
        """Rows of ``table`` for ``ids`` -> ``(*ids.shape, D)``; ``key`` names the feature in errors."""
        if table not in self.tables:
            raise UnknownKeyError(f"no table {table!r}; tables: {list(self.tables)}")
        t = self.tables[table]
        if self.validate and not torch.compiler.is_exporting() and ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= t.num_embeddings:
                bad = lo if lo < 0 else hi
                who = f"feature {key!r}" if key is not None else f"table {t.name!r} lookup"
                raise IdOutOfRangeError(
                    f"{who}: id {bad} is outside table {t.name!r} of size {t.num_embeddings} "
                    f"(valid ids 0..{t.num_embeddings - 1})"
                )
        return self._gather(t.embedding_dim, ids + self.row_offset[t.name])

    def _gather(self, dim: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the fused weight of ``dim`` for fused-row ``ids`` -> ``(*ids.shape, D)``."""
        if dim in self._sparse_dims:
            return F.embedding(ids, self._fused(dim), sparse=True)
        return gather_rows(self._fused(dim), ids)

    def _bag(self, dim: int, ids: torch.Tensor, offsets: torch.Tensor, pooling: str,
             weights: torch.Tensor | None) -> torch.Tensor:
        """Pooled bags of fused-row ``ids`` (offsets include the last) -> ``(len(offsets) - 1, D)``."""
        weight = self._fused(dim)
        if dim in self._sparse_dims or (weights is not None and weights.requires_grad):
            return F.embedding_bag(ids, weight, offsets, mode=pooling, sparse=dim in self._sparse_dims,
                                   per_sample_weights=weights, include_last_offset=True)
        return bag_rows(weight, ids, offsets, pooling, weights)

    def _check_ids(self, keys: Sequence[str], values: torch.Tensor, per_key: torch.Tensor,
                   size: torch.Tensor) -> None:
        bound = size.repeat_interleave(per_key, output_size=values.numel())
        if bool(((values < 0) | (values >= bound)).any()):
            self._raise_bad_id(keys, values, per_key, size)

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
        return f"keys={self.keys}, tables=[{ts}], init={self.init}, sparse_grad={self.sparse_grad}, dense_grad_max_rows={self.dense_grad_max_rows}"


def _fused_name(dim: int) -> str:
    return f"fused_dim{dim}"


def _checked_init(init: str, std: float | None) -> tuple[str, float | None]:
    if init not in INITS:
        raise LayerConfigError(f"embedding init {init!r} is not one of {INITS}")
    if init == "normal" and (std is None or std <= 0):
        raise LayerConfigError(f"embedding init 'normal' needs a positive std, got {std}")
    return init, std


def _table_map(tables: Sequence[TableSpec]) -> dict[str, TableSpec]:
    out: dict[str, TableSpec] = {}
    for t in tables:
        if t.name in out:
            raise LayerConfigError(f"table {t.name!r} is given twice")
        if t.num_embeddings < 1 or t.embedding_dim < 1:
            raise LayerConfigError(f"table {t.name!r} needs num_embeddings >= 1 and embedding_dim >= 1, got {t}")
        out[t.name] = t
    return out


def _check_features(tables: Mapping[str, TableSpec], feature_to_table: Mapping[str, str],
                    feature_pooling: Mapping[str, str], sequence_keys: Mapping[str, tuple[str, int]]) -> None:
    for name, mapping in (("feature_to_table", feature_to_table),
                          ("sequence_keys", {k: t for k, (t, _) in sequence_keys.items()})):
        for f, t in mapping.items():
            if t not in tables:
                raise LayerConfigError(f"{name}: feature {f!r} names table {t!r}, not one of {list(tables)}")
    unknown = set(feature_pooling) - set(feature_to_table)
    if unknown:
        raise LayerConfigError(f"feature_pooling names features {sorted(unknown)} that are not pooled here")
