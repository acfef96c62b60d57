"""The embedding interface (DESIGN §6): what a model may ask of its tables, whatever the backend.

:class:`EmbeddingCollection` (``pooled``, ``sequence``, ``lookup``, ``embedding_parameters``, ``tables``).
The fused backend, the result type :class:`~ctrkit.nn.embedding.PooledEmbeddings` and the factory
``make_embeddings`` live in :mod:`ctrkit.nn.embedding`, which re-exports this class.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from ctrkit.batch import KeyedJagged
from ctrkit.errors import LayerConfigError
from ctrkit.schema import TableSpec

if TYPE_CHECKING:
    from ctrkit.nn.embedding import PooledEmbeddings


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
