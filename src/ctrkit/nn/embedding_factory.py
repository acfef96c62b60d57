"""The one factory every model builds its embedding tables with (:func:`make_embeddings`), from what the model
asks for: keys to pool, unpooled sequences, dims, init; the backend is the one chosen for the model being built
(:func:`~ctrkit.nn.embedding_interface.embedding_backend`), so a sharded backend is a drop-in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ctrkit.errors import LayerConfigError
from ctrkit.nn.embedding import EmbeddingBagCollection
from ctrkit.nn.embedding_interface import EmbeddingCollection, check_backend, current_backend
from ctrkit.schema import Schema, SchemaError, SequenceFeature, SparseFeature, TableSpec

__all__ = ["make_embeddings"]


def _schema_tables(schema: Schema, keys: Sequence[str] | None, sequence_keys: Sequence[str] | None
                   ) -> tuple[dict[str, str], dict[str, str], dict[str, tuple[str, int]], list[TableSpec]]:
    """(feature -> table, pooling and (table, max_len) of each unpooled sequence key, the tables they use in
    schema order) of :func:`make_embeddings` from a schema."""
    keys = schema.pooled_keys if keys is None else keys
    pooling: dict[str, str] = {}
    for k in keys:
        f = schema.feature(k)
        if isinstance(f, SequenceFeature) and f.pooling == "none":
            raise SchemaError(f"sequence feature {k!r} has pooling 'none', so it cannot be pooled; pass it in "
                              "sequence_keys and embed it with sequence(kj, key)")
        if not isinstance(f, (SparseFeature, SequenceFeature)):
            raise SchemaError(f"feature {k!r} is dense; embedding tables embed sparse features")
        pooling[k] = f.pooling
    f2t = {k: schema.table_of(k) for k in keys}
    if sequence_keys is None:
        used = set(f2t.values())
        sequence_keys = [q.name for q in schema.sequence if q.pooling == "none" and schema.table_of(q.name) in used]
    seq: dict[str, tuple[str, int]] = {}
    for k in sequence_keys:
        q = schema.feature(k)
        if not isinstance(q, SequenceFeature):
            raise SchemaError(f"sequence_keys: {k!r} is not a sequence feature")
        seq[k] = (schema.table_of(k), q.max_len)
    needed = set(f2t.values()) | {t for t, _ in seq.values()}
    return f2t, pooling, seq, [t for name, t in schema.tables().items() if name in needed]


def make_embeddings(
    schema: Schema | None = None,
    keys: Sequence[str] | None = None,
    *,
    tables: Sequence[TableSpec] | None = None,
    sequence_keys: Sequence[str] | None = None,
    dim: int | None = None,
    init: str = "uniform",
    std: float | None = None,
    backend: str | None = None,
    sparse_grad: bool = True,
    validate: bool = True,
) -> EmbeddingCollection:
    """The one way a model builds embedding tables.

    From a ``schema``: pools ``keys`` (default ``schema.pooled_keys``) with the schema's tables and
    poolings; ``sequence_keys`` (default: the sequences with pooling "none" whose table is used) are
    embedded unpooled by ``sequence()``. Only the tables these keys use are created, in schema order.
    From explicit ``tables`` (GBDT+LR's leaves, Wide&Deep's crosses, NCF's role tables): every feature
    a table lists is pooled with "sum".

    ``dim`` overrides every table's width (1 for first-order weights, 2m for MLR, F·D for FFM);
    ``init`` is "uniform" (torchrec's default), "normal" (N(0, std^2)) or "zeros"; ``backend`` is
    "fused" (:class:`EmbeddingBagCollection`) or "torchrec" (:class:`~ctrkit.nn.embedding_torchrec.TorchrecEmbeddingCollection`,
    the tables torchrec can shard); None: the one of the model being built (:func:`embedding_backend`).
    """
    check_backend(backend := backend if backend is not None else current_backend())
    if (schema is None) == (tables is None):
        raise LayerConfigError("make_embeddings needs exactly one of schema= and tables=")
    if dim is not None and dim < 1:
        raise LayerConfigError(f"make_embeddings: dim must be >= 1, got {dim}")
    f2t: dict[str, str] | None = None
    pooling: dict[str, str] = {}
    seq: dict[str, tuple[str, int]] = {}
    if schema is not None:
        f2t, pooling, seq, tables = _schema_tables(schema, keys, sequence_keys)
    elif keys is not None or sequence_keys is not None:
        raise LayerConfigError("make_embeddings: keys= and sequence_keys= go with schema=, not tables=")
    assert tables is not None
    if dim is not None:
        tables = [replace(t, embedding_dim=int(dim)) for t in tables]
    if backend == "torchrec":
        from ctrkit.nn.embedding_torchrec import TorchrecEmbeddingCollection

        return TorchrecEmbeddingCollection(tables, f2t, pooling, sequence_keys=seq, validate=validate, init=init,
                                           std=std)
    return EmbeddingBagCollection(tables, f2t, pooling, sequence_keys=seq, sparse_grad=sparse_grad,
                                  validate=validate, init=init, std=std)
