"""The embedding interface (DESIGN §6): what a model may ask of its tables, whatever the backend.

:class:`EmbeddingCollection` (``pooled``, ``sequence``, ``lookup``, ``embedding_parameters``, ``tables``)
and the result of ``pooled``, :class:`PooledEmbeddings` (one ``[F_g, B, D_g]`` tensor per
:class:`PoolGroup` of features a backend pools together). The fused backend and the factory
``make_embeddings`` live in :mod:`ctrkit.nn.embedding`, which re-exports these classes. The backends a
factory may build (:data:`BACKENDS`) and the one chosen for the model being built (:func:`embedding_backend`)
are declared here.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ctrkit.batch import KeyedJagged
from ctrkit.errors import LayerConfigError, UnknownKeyError
from ctrkit.schema import TableSpec

BACKENDS = ("fused", "torchrec")  # torchrec: nn/embedding_torchrec.py, shardable by training/sharding.py
_BACKEND: ContextVar[str] = ContextVar("ctrkit_embedding_backend", default="fused")


def current_backend() -> str:
    """The backend :func:`make_embeddings` uses when not told one (see :func:`embedding_backend`)."""
    return _BACKEND.get()


def check_backend(backend: str) -> None:
    """A LayerConfigError unless ``backend`` is one of :data:`BACKENDS`."""
    if backend not in BACKENDS:
        raise LayerConfigError(f"embedding backend {backend!r} is not available; supported: {', '.join(BACKENDS)}")


@contextmanager
def embedding_backend(backend: str) -> Iterator[None]:
    """Within the block, :func:`make_embeddings` builds its tables with ``backend`` unless told otherwise
    (``create_model`` wraps a model's construction in it)."""
    check_backend(backend)
    token = _BACKEND.set(backend)
    try:
        yield
    finally:
        _BACKEND.reset(token)


@dataclass(frozen=True)
class PoolGroup:
    """Features a backend pools in one call: same dim and same pooling (the fused backend: one
    embedding_bag call over one fused weight)."""

    dim: int
    pooling: str
    keys: tuple[str, ...]
    positions: tuple[int, ...]  # position of each key in the collection's output order


class PooledEmbeddings:
    """Pooled embeddings of F features for B rows, in the collection's key order.

    Holds one ``[F_g, B, D_g]`` tensor per (dim, pooling) group; the views below build what a model
    needs: ``stacked()`` [B, F, D] (all dims equal), ``concat()`` [B, sum D_k], ``to_dict()``.
    """

    def __init__(self, keys: Sequence[str], dims: Sequence[int], groups: Sequence[PoolGroup],
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
            raise LayerConfigError(
                "stacked() needs one embedding dim for all features, but they differ: "
                + "; ".join(f"dim {d}: {ks}" for d, ks in by_dim.items())
                + ". Give these features the same embedding_dim in the schema, or use concat()/to_dict()."
            )
        # contiguous (B, F, D): the strided transpose view made every downstream broadcast op slow
        # (xDeepFM training step on the Criteo shapes: 230 -> 160 ms)
        return self.fields().transpose(0, 1).contiguous()  # (B, F, D)

    def fields(self) -> torch.Tensor:
        """All features field-major, ``[F, B, D]`` in key order (``stacked()`` is its contiguous transpose; a layer
        that reorders the fields itself saves that copy). Same dim check as ``stacked()``."""
        if len(set(self.dims)) > 1:
            return self.stacked()  # raises, naming the features and dims
        if len(self._tensors) == 1:
            return self._tensors[0]  # (F, B, D)
        allf = torch.cat(self._tensors, 0)  # (F, B, D) in group order
        order = [p for g in self._groups for p in g.positions]
        if order != list(range(len(order))):
            inv = [0] * len(order)
            for i, p in enumerate(order):
                inv[p] = i
            allf = allf[inv]
        return allf  # (F, B, D)

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
        raise UnknownKeyError(f"no pooled embedding for {key!r}; keys: {self.keys}")

    def __repr__(self) -> str:
        return f"PooledEmbeddings(keys={self.keys}, dims={self.dims}, batch_size={self.batch_size})"


class EmbeddingCollection(nn.Module, abc.ABC):
    """The embedding interface: what a model may ask of its tables (any backend).

    Attributes a backend sets: ``tables`` (name -> :class:`TableSpec`), ``keys`` (the pooled features,
    in output order), ``dims`` (their embedding dims), ``sequence_keys`` (unpooled sequence feature ->
    (table, max_len)). ``forward(kj)`` is ``pooled(kj)``.
    """

    tables: dict[str, TableSpec]
    keys: list[str]
    dims: list[int]
    sequence_keys: dict[str, tuple[str, int]]

    def forward(self, kj: KeyedJagged) -> PooledEmbeddings:
        return self.pooled(kj)

    @abc.abstractmethod
    def pooled(self, kj: KeyedJagged) -> PooledEmbeddings:
        """Pooled embeddings of ``keys`` (``kj`` may hold more keys; they are ignored)."""

    @abc.abstractmethod
    def sequence(self, kj: KeyedJagged, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Unpooled sequence ``key`` -> ``(emb (B, T, D), mask (B, T) bool)`` with T = its max_len.

        Row b's ids fill positions ``0 .. len_b - 1`` in stored order (histories: oldest first); a
        row longer than T keeps its last T ids (the most recent), as the data path does. Padding
        positions are zero vectors with ``mask`` False, and no table row receives a gradient from them.
        """

    @abc.abstractmethod
    def lookup(self, table: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows of ``table`` for ``ids`` of any shape -> ``(*ids.shape, D)``."""

    @abc.abstractmethod
    def embedding_parameters(self) -> Iterator[nn.Parameter]:
        """The table weights (rows updated from sparse gradients), for the sparse optimizer group."""

    @abc.abstractmethod
    def table_weight(self, table: str) -> torch.Tensor:
        """The rows of ``table``, ``[num_embeddings, D]`` (a view into the parameter that holds them)."""

    @abc.abstractmethod
    def table_rows(self) -> list[tuple[nn.Parameter, dict[str, int]]]:
        """Each table parameter with the tables it holds -> the first row of each in it (the fused backend: all
        tables of one dim in one weight; torchrec: one weight per table). Optimizer states are laid out alike."""

    @torch.no_grad()
    def load_grown(self, weights: Mapping[str, torch.Tensor], prefix: str = "",
                   reset: Mapping[str, Sequence[int]] | None = None) -> dict[str, tuple[int, int]]:
        """Warm start: each table's rows from ``weights[prefix + "tables.<table>"]``, a table of the same dim with as
        many or fewer rows (a parent vocabulary's: its ids kept, new ids appended), copied into the first rows; the
        rows after them, and the rows ``reset[table]`` (ids whose value expiry changed), keep the values this
        collection holds (its fresh initial values). Returns {table: (old rows, new rows)}; a table missing, of
        another dim or with more rows is a LayerConfigError naming it."""
        sizes: dict[str, tuple[int, int]] = {}
        for name, spec in self.tables.items():
            key = f"{prefix}tables.{name}"
            old = weights.get(key)
            if old is None:
                raise LayerConfigError(f"table {name!r}: the checkpoint has no {key!r}; it is of another model")
            n, d = spec.num_embeddings, spec.embedding_dim
            if old.dim() != 2 or old.shape[1] != d or old.shape[0] > n:
                what = (f"{old.shape[0]} rows, more than the {n} of the new vocabulary: the table shrank"
                        if old.dim() == 2 and old.shape[1] == d else f"shape {tuple(old.shape)}, not (rows, {d})")
                raise LayerConfigError(f"table {name!r}: the checkpoint's {key!r} has {what}")
            w = self.table_weight(name)
            ids = torch.as_tensor(np.asarray((reset or {}).get(name, ()), np.int64), device=w.device)
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= n):
                raise LayerConfigError(f"table {name!r}: rows to reset {ids.min()}..{ids.max()} outside its {n} rows")
            fresh = w[ids].clone()  # (R, D)
            w[: old.shape[0]].copy_(old)
            w[ids] = fresh
            sizes[name] = (int(old.shape[0]), n)
        return sizes

    @property
    def out_features(self) -> int:
        """Width of ``pooled(kj).concat()``: sum of the pooled features' dims."""
        return sum(self.dims)

    @property
    def embedding_dim(self) -> int:
        """The common dim of all pooled features; an error if they differ."""
        if len(set(self.dims)) != 1:
            raise LayerConfigError(
                f"features have different embedding dims: {dict(zip(self.keys, self.dims))}"
            )
        return self.dims[0]


def group_input(
    kj: KeyedJagged, keys: tuple[str, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """A backend's input for one :class:`PoolGroup`: (values, bag offsets [F_g*B + 1] from 0, weights or
    None, lengths [F_g*B]) of ``keys`` in ``kj``. A contiguous run of keys (the usual case: all of them) is sliced without copying."""
    B = kj.stride
    try:
        idx = [kj.keys.index(k) for k in keys]
    except ValueError:
        missing = [k for k in keys if k not in kj.keys]
        raise UnknownKeyError(f"sparse input lacks features {missing}; it has {kj.keys}") from None
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
