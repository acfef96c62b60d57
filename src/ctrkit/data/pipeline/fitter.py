"""Streaming fit of a :class:`~ctrkit.data.pipeline.feature_pipeline.FeaturePipeline`: chunks encoded with
provisional ids, dense statistics counted, then vocabularies and statistics fitted at the end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ctrkit.data.pipeline.columns import kind_of
from ctrkit.data.pipeline.encode import CRITEO, GROUP_TABLE, RowEncoder
from ctrkit.data.pipeline.vocab import VocabBuilder, Vocabulary
from ctrkit.data.pipeline.vocab_grow import Pending, grow_vocabulary, lineage, pending_of
from ctrkit.data.pipeline.vocab_keys import CodedKeys
from ctrkit.errors import DataError

if TYPE_CHECKING:
    from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline


class PipelineFitter(RowEncoder):
    """Streaming fit of a :class:`FeaturePipeline`: :meth:`encode` chunks (provisional ids: rank of first
    appearance), :meth:`add_dense_stats` for training rows, then :meth:`finish`; ``luts`` then maps
    provisional ids to final ones (min_freq and max_vocab can only be decided at the end)."""

    def __init__(self, pipeline: FeaturePipeline) -> None:
        self.pipeline = pipeline
        self.spec, self.kind, self.table_of, self.rules = pipeline.spec, pipeline.kind, pipeline.table_of, pipeline.rules
        self._builders: dict[str, VocabBuilder | Vocabulary] = {}
        self._n = 0  # training rows counted so far, their per-column mean and sum of squared deviations
        self._mean = np.zeros(len(self.spec.dense))
        self._m2 = np.zeros(len(self.spec.dense))
        self.luts: dict[str, np.ndarray | None] = {}

    def _ids(self, table: str, values: Any, missing: np.ndarray | None = None) -> np.ndarray:
        b = self._builders.get(table)
        if isinstance(b, Vocabulary):
            raise DataError(f"vocabulary {table!r} was adopted fitted; it cannot count more values")
        if b is None:
            if self.kind == CRITEO or (isinstance(values, np.ndarray) and values.dtype.kind in "iu"):
                kind = "int"
            else:
                kind = kind_of(values) if isinstance(values, pa.Array) else "str"
            b = self._builders[table] = VocabBuilder(table, kind)
        if b.kind == "int" and isinstance(values, pa.Array) and not pa.types.is_integer(values.type):
            raise DataError(f"vocabulary {table!r} mixes integer and string columns; give them the same type")
        ids = b.add(values, missing)
        if self.kind == CRITEO and b.next_id >= 1 << 32:
            raise DataError("a categorical column has more than 2^32 - 2 distinct values")
        return ids

    def _coded_ids(self, table: str, col: CodedKeys) -> np.ndarray | None:
        b = self._builders.get(table)
        if not isinstance(b, VocabBuilder) or b.kind != "int":
            return None  # a first column, an adopted vocabulary, text keys: through _ids and its checks
        ids = b.add_coded(col)
        if self.kind == CRITEO and b.next_id >= 1 << 32:
            raise DataError("a categorical column has more than 2^32 - 2 distinct values")
        return ids

    def add_dense_stats(self, dense: np.ndarray) -> None:
        """Count training rows ``dense`` [m, Nd] (before scaling) in the mean / std of every dense column."""
        m = len(dense)
        if m == 0:
            return
        mean = dense.mean(0, dtype=np.float64)
        m2 = ((dense - mean) ** 2).sum(0)  # centred per chunk: no cancellation for large offsets (timestamps)
        delta, n = mean - self._mean, self._n  # Chan et al.'s pairwise update of (n, mean, M2)
        self._n = n + m
        self._mean += delta * (m / self._n)
        self._m2 += m2 + delta ** 2 * (n * m / self._n)

    def adopt(self, builders: dict[str, VocabBuilder] | dict[str, Vocabulary],
              pending: dict[str, Pending] | None = None) -> None:
        """Take vocabularies counted elsewhere ({table: builder}, e.g. merged from parallel count tasks) in
        place of those :meth:`encode` builds; :meth:`finish` then fits them. A :class:`Vocabulary` (fitted
        elsewhere, e.g. from counts spilled to disk) is kept as it is, with its ``pending`` counts if given."""
        self._builders.update(builders)
        self._pending = {**getattr(self, "_pending", {}), **(pending or {})}

    def finish(self) -> FeaturePipeline:
        """Fit the pipeline (vocabularies, dense statistics) and fill ``luts``; returns the pipeline. With
        ``pipeline.grow_from`` set, every vocabulary grows from its parent (:mod:`ctrkit.data.pipeline.vocab_grow`)
        and the parent's dense statistics are kept."""
        p, o, g = self.pipeline, self.pipeline.options, self.pipeline.grow_from
        vocabs: dict[str, Vocabulary] = {}
        pending: dict[str, Pending] = {}
        seen: dict[str, np.ndarray] = {}  # growing: per table the version each pending key was last seen in
        builders = dict(self._builders)
        if g is not None:  # a table of the parent that saw no values grows too (its values may expire)
            builders |= {t: VocabBuilder(t, v.kind) for t, v in g.vocabs.items()
                         if t not in builders and t in self.table_of.values()}
        for table, b in builders.items():
            if isinstance(b, Vocabulary):
                if g is not None:
                    raise DataError(f"vocabulary {table!r} was fitted elsewhere (counts spilled to disk); --grow "
                                    "needs the counts in memory: drop --vocab-memory-mb")
                vocabs[table], self.luts[table] = b, None
                if table in getattr(self, "_pending", {}):
                    pending[table] = self._pending[table]
                continue
            max_vocab, min_freq = None if table == GROUP_TABLE else o["max_vocab"], p.table_min_freq.get(table, 1)
            if g is not None and table in g.vocabs:
                vocabs[table], self.luts[table], pending[table], seen[table] = grow_vocabulary(
                    g.vocabs[table], g.pending.get(table), b, min_freq=min_freq, max_vocab=max_vocab,
                    mode=o["max_vocab_mode"], columns=", ".join(c for c, t in self.table_of.items() if t == table),
                    version=g.version + 1, expire_after=g.expire_after, pending_seen=g.pending_seen.get(table))
                continue
            vocabs[table], self.luts[table] = b.finish(min_freq, max_vocab, o["max_vocab_mode"],
                                                       hash_fn="mod" if self.kind == CRITEO else "splitmix")
            pending[table] = pending_of(b, vocabs[table])
        for table in sorted(set(self.table_of.values()) - set(vocabs)):  # a table that saw no values
            vocabs[table] = Vocabulary.build(table, "str", np.array([], str), np.array([], np.int64))
            self.luts[table] = None
        mean = self._mean
        std = np.sqrt(self._m2 / max(self._n, 1))
        p.vocabs_, p.mean_, p.std_ = vocabs, mean, np.where(std > 0, std, 1.0)
        p.pending_, p.pending_seen_, p.lineage_ = pending, (seen if g is not None else None), None
        if g is not None:
            p.mean_, p.std_, p.lineage_ = g.mean.copy(), g.std.copy(), lineage(g, vocabs)
        p._fingerprint, p._stage = None, None
        return p

