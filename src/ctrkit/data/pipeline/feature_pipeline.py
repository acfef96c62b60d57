"""Feature pipeline (DESIGN §6): raw rows -> ids and values -> :class:`~ctrkit.batch.Batch`, fitted once.

A :class:`FeaturePipeline` holds everything that turns raw rows into what a model reads, learned on
the training data and then applied unchanged by preprocessing, training, evaluate and predict:

* vocabularies, one per embedding table (:mod:`ctrkit.data.pipeline.vocab`: first-appearance ids from 2,
  0 = missing, 1 = rare / unseen, ``min_freq`` and ``max_vocab`` hash | cap), plus ``__group__`` for
  the group-id column;
* dense transforms (none / log / standardize) and the training mean and std of every dense column;
* the parsing rules of its ``kind``: ``criteo`` (label, I1..I13 integer counts with ln(x+3),
  C1..C26 8-hex-digit keys; seed 000 §3.3), ``table`` (a YAML feature spec, :mod:`ctrkit.data.sources.table`),
  or ``ids`` (rows already hold ids: stores without a pipeline, e.g. synthetic ones);
* the batch-level stage: the multi-hot expansion of seed 000 (:mod:`ctrkit.data.pipeline.multihot`), set at
  train time with :meth:`FeaturePipeline.with_multi_hot` and applied by :meth:`to_batch` and the loader.

Use::

    pipe = FeaturePipeline.criteo(min_freq=8).fit(rows)         # or FeaturePipeline.table(spec)
    columns = pipe.transform(rows)                              # {column: values}, as a store holds them
    batch = pipe.to_batch(columns)                              # Batch with a KeyedJagged

Big inputs fit in one streaming pass with bounded memory: ``fitter = pipe.fitter()``; per chunk
``enc = fitter.encode(chunk)`` gives provisional ids (spilled to disk by the preprocessors);
``fitter.finish()`` fits ``pipe`` (vocabularies, statistics) and ``pipe.finalize(part, fitter.luts)``
maps provisional ids to final ones and scales the dense columns. A fitted pipeline saves as JSON +
.npy arrays (``save`` / ``load``, read with allow_pickle=False) and as plain data inside checkpoints
(``to_payload`` / ``from_payload``); see :mod:`ctrkit.data.pipeline.persist`.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ctrkit.batch import Batch
from ctrkit.data.pipeline.collate import collate
from ctrkit.data.pipeline.criteo_parse import NUM_DENSE, NUM_SPARSE
from ctrkit.data.pipeline.encode import (
    CRITEO,
    F32_MAX,
    GROUP_TABLE,
    IDS,
    KINDS,
    TABLE,
    Encoded,
    Raw,
    RowEncoder,
    jagged_key,
)
from ctrkit.data.pipeline.fitter import PipelineFitter
from ctrkit.data.pipeline.multihot import MultiHot
from ctrkit.data.pipeline.rows import ColumnSpec, SpillColumn
from ctrkit.data.pipeline.rules import ColumnRules, compile_rules
from ctrkit.data.pipeline.spec import TableSpecYaml, load_spec
from ctrkit.data.pipeline.vocab import Vocabulary, check_vocab_options
from ctrkit.data.pipeline.vocab_arrays import vocab_fingerprint
from ctrkit.data.pipeline.vocab_grow import GrowFrom, Pending
from ctrkit.data.pipeline.vocab_joint import JointLookup
from ctrkit.data.pipeline.vocab_keys import CodedKeys
from ctrkit.errors import DataError, NotFittedError
from ctrkit.schema import DenseFeature, Schema, SequenceFeature, SparseFeature

log = logging.getLogger(__name__)

DENSE_NAMES = [f"I{i}" for i in range(1, NUM_DENSE + 1)]
UNSEEN_GROUP_BASE = 1 << 62  # group ids of keys the pipeline never saw start here (see FeaturePipeline._ids)
SPARSE_NAMES = [f"C{i}" for i in range(1, NUM_SPARSE + 1)]


def criteo_spec() -> TableSpecYaml:
    """Criteo's columns: label, I1..I13 (ln(x + 3)), C1..C26 (one table each)."""
    return load_spec({"label": "label", "dense": [{"name": n, "transform": "log"} for n in DENSE_NAMES],
                      "sparse": [{"name": c} for c in SPARSE_NAMES]})


class FeaturePipeline(RowEncoder):
    """Raw rows -> columns -> Batch (see the module docstring). Learned state ends in ``_``."""

    def __init__(self, spec: TableSpecYaml | dict[str, Any] | str | Path, *, kind: str = TABLE, min_freq: int = 1,
                 max_vocab: int | None = None, max_vocab_mode: str = "hash", embedding_dim: int | str = "auto",
                 schema: Schema | None = None) -> None:
        if kind not in KINDS:
            raise DataError(f"pipeline kind {kind!r} is not one of {KINDS}")
        check_vocab_options(min_freq, max_vocab, max_vocab_mode)
        self.spec = spec if isinstance(spec, TableSpecYaml) else load_spec(spec)
        self.kind = kind
        self.options = {"min_freq": int(min_freq), "max_vocab": max_vocab, "max_vocab_mode": max_vocab_mode,
                        "embedding_dim": embedding_dim if embedding_dim == "auto" else int(embedding_dim)}
        self.table_of = {e["name"]: e.get("table") or e["name"] for e in self.spec.sparse}
        for q in self.spec.sequence:
            if q["shares"] not in self.table_of:
                raise DataError(f"sequence feature {q['name']!r} shares {q['shares']!r}, which is not a sparse "
                                f"feature; sparse features: {sorted(self.table_of)}")
        self.table_min_freq: dict[str, int] = {}
        for e in self.spec.sparse:
            self.table_min_freq.setdefault(self.table_of[e["name"]], int(e.get("min_freq", min_freq)))
        self.vocabs_: dict[str, Vocabulary] | None = None
        self.mean_ = np.zeros(len(self.spec.dense))
        self.std_ = np.ones(len(self.spec.dense))
        self.multi_hot: dict[str, Any] | None = None
        self.grow_from: GrowFrom | None = None  # set: the fitter grows this parent (--grow, :mod:`.vocab_grow`)
        self.pending_: dict[str, Pending] | None = None  # per table: keys counted without an id, their counts
        self.pending_seen_: dict[str, np.ndarray] | None = None  # grown: per table the version each was last seen
        self.lineage_: dict[str, Any] | None = None  # a grown pipeline's vocab_lineage record
        self._schema = schema  # kind "ids" (and pipelines rebuilt from old stores): the schema as given
        self._stage: MultiHot | None = None
        self._fingerprint: str | None = None

    # ---- constructors ------------------------------------------------------------------------------
    @classmethod
    def criteo(cls, *, min_freq: int = 1, max_vocab: int | None = None, max_vocab_mode: str = "hash",
               embedding_dim: int | str = "auto") -> FeaturePipeline:
        return cls(criteo_spec(), kind=CRITEO, min_freq=min_freq, max_vocab=max_vocab,
                   max_vocab_mode=max_vocab_mode, embedding_dim=embedding_dim)

    @classmethod
    def table(cls, spec: TableSpecYaml | dict[str, Any] | str | Path, **options: Any) -> FeaturePipeline:
        return cls(spec, kind=TABLE, **options)

    @classmethod
    def from_schema(cls, schema: Schema) -> FeaturePipeline:
        """A fitted pipeline for rows that already hold ids (no vocabularies): kind ``ids``."""
        spec = {"label": schema.label, "weight": schema.weight, "group_id": schema.group_id,
                "dense": [{"name": d.name} for d in schema.dense],
                "sparse": [{"name": s.name, **({"table": s.table} if s.table else {}),
                            **({"multi_valued": True} if s.multi_valued else {})} for s in schema.sparse],
                "sequence": [{"name": q.name, "shares": q.shares, "max_len": q.max_len} for q in schema.sequence]}
        return cls(spec, kind=IDS, schema=schema)

    # ---- fitting -----------------------------------------------------------------------------------
    @property
    def rules(self) -> ColumnRules:
        """The spec compiled into typed column rules (once): what the encoder, the readers and the server's
        request validation apply (:mod:`ctrkit.data.pipeline.rules`)."""
        rules = self.__dict__.get("_rules")
        if rules is None:
            sizes = ({t: s.num_embeddings for t, s in self._schema.tables().items()}
                     if self.kind == IDS and self._schema is not None else None)
            rules = self._rules = compile_rules(self.spec, self.kind, self.table_of, sizes)
        return rules

    @property
    def fitted(self) -> bool:
        return self.kind == IDS or self.vocabs_ is not None

    def fitter(self) -> PipelineFitter:
        """A streaming fit of this pipeline (see the module docstring)."""
        if self.kind == IDS:
            raise DataError("an 'ids' pipeline has nothing to fit")
        return PipelineFitter(self)

    def fit(self, raw: Raw) -> FeaturePipeline:
        """Fit on ``raw`` rows in one chunk (all rows count for the dense statistics); returns self."""
        f = self.fitter()
        enc = f.encode(raw)
        f.add_dense_stats(enc.dense)
        return f.finish()

    def _check_fitted(self) -> None:
        if not self.fitted:
            raise NotFittedError("the feature pipeline is not fitted: call fit() or use a fitter() first")

    def _ids(self, table: str, values: Any, missing: np.ndarray | None = None) -> np.ndarray:
        if self.kind == IDS:
            a = values.to_numpy(zero_copy_only=False) if isinstance(values, pa.Array) else np.asarray(values)
            return a.astype(np.int64)
        self._check_fitted()
        # a group key training never saw keeps a group of its own (GAUC of new users), not the shared id 1
        base = UNSEEN_GROUP_BASE if table == GROUP_TABLE else None
        return self.vocabs_[table].lookup(values, missing, unseen_base=base)

    def _coded_ids(self, table: str, col: CodedKeys) -> np.ndarray | None:
        if self.kind == IDS or table == GROUP_TABLE:
            return None
        self._check_fitted()
        return self.vocabs_[table].lookup(col.uniques, col.uniques < 0)  # what lookup(col) gathers for the rows

    def _joint(self) -> JointLookup | None:
        """:class:`JointLookup` of the single-valued columns' vocabularies, built once for these vocabularies
        (None: kind ids, or a vocabulary it cannot join)."""
        if self.kind == IDS or self.vocabs_ is None:
            return None
        cached = self.__dict__.get("_joint_of")
        if cached is None or cached[0] is not self.vocabs_:
            cached = self._joint_of = (self.vocabs_, JointLookup.of([self.vocabs_[r.table] for r in self.rules.single]))
        return cached[1]

    # ---- transform ---------------------------------------------------------------------------------
    def transform(self, raw: Raw, *, lines: np.ndarray | None = None, unit: str | None = None,
                  validated: bool = False) -> dict[str, Any]:
        """Raw rows -> {column: values} as a store holds them (label / weight / group when the rows have
        them; jagged columns as (values, lengths)). A malformed row is an error naming its row / line
        (``lines``: the numbers to name, counting ``unit``s, default "line"; without them rows 1..n).
        ``validated``: the feature columns hold values already checked against :attr:`rules` in their canonical
        form (the server's requests), read without a second check (:meth:`RowEncoder.encode`)."""
        self._check_fitted()
        return self.finalize(self.encode(raw, lines=lines, unit=unit, validated=validated).parts())

    def finalize(self, part: dict[str, Any], luts: dict[str, np.ndarray | None] | None = None) -> dict[str, Any]:
        """Encoded rows (:meth:`Encoded.parts`, possibly after a spill) -> columns: ``luts`` map a fitter's
        provisional ids to final ones; standardized dense columns are scaled, saturating at +-float32 max so a
        store never holds +-inf (values beyond float32 are bad rows before this: :mod:`ctrkit.data.pipeline.encode`);
        store dtypes."""
        s, spec, luts = self.schema, self.spec, luts or {}
        id_dtype = self.id_dtype

        def ids(table: str, a: np.ndarray, dtype: Any = id_dtype) -> np.ndarray:
            m = luts.get(table)
            a = m[a] if m is not None else a
            if a.dtype.kind in "iu" and a.dtype.itemsize == np.dtype(dtype).itemsize and a.flags.c_contiguous:
                return a.view(dtype)  # the bytes astype would write (an integer cast of one width keeps them)
            return a.astype(dtype)

        out: dict[str, Any] = {}
        if "label" in part:
            out[s.label] = np.asarray(part["label"], np.float32)
        if s.weight and "weight" in part:
            out[s.weight] = np.asarray(part["weight"], np.float32)
        if s.group_id and "group" in part:
            out[s.group_id] = ids(GROUP_TABLE, part["group"], np.int64)  # unseen groups' ids pass 2^62
        d = part["dense"]
        stand = np.array([e["transform"] == "standardize" for e in spec.dense], bool)
        if stand.any():
            with np.errstate(over="ignore"):
                z = np.where(stand, (d - self.mean_) / self.std_, d)  # (n, Nd) float64
            big = ~(np.abs(z) <= F32_MAX)  # inf, or finite beyond float32 (a tiny training std): saturate
            if big.any():
                log.warning("%d standardized dense values lie beyond the float32 range (training std too small "
                            "for them); stored as +-%.4g", int(big.sum()), F32_MAX)
                z = np.clip(np.nan_to_num(z, nan=0.0), -F32_MAX, F32_MAX)
            d = z.astype(np.float32)
        else:
            d = d.astype(np.float32, copy=False)
        for j, e in enumerate(spec.dense):
            out[e["name"]] = d[:, j]
        for j, e in enumerate(e for e in spec.sparse if not e.get("multi_valued")):
            out[e["name"]] = ids(self.table_of[e["name"]], part["sparse"][:, j])
        for e in self._jagged_entries():
            v, ln = part[jagged_key(e["name"])]
            out[e["name"]] = (ids(self.feature_table(e), v), np.asarray(ln, np.int64))
        return out

    def to_batch(self, columns: dict[str, Any]) -> Batch:
        """Columns (from :meth:`transform` or a store) -> Batch (:func:`~ctrkit.data.pipeline.collate.collate`,
        as the loader builds them), with the batch-level stage (multi-hot) applied. Rows without a label get
        labels 0 (placeholders: scoring ignores them)."""
        s = self.schema
        first = columns[s.dense[0].name] if s.dense else columns[s.sparse_keys[0]]
        n = len(first[1]) if isinstance(first, tuple) else len(first)
        feats = [*s.sparse, *s.sequence]  # the order of s.sparse_keys

        def opt(name: str | None) -> np.ndarray | None:
            return columns[name] if name and name in columns else None

        return collate(n, [np.asarray(columns[d.name], np.float32).reshape(n, d.dim) for d in s.dense],
                       s.sparse_keys, [_ids(columns[k]) for k in s.sparse_keys],
                       max_len=[f.max_len if isinstance(f, SequenceFeature) else None for f in feats],
                       labels=opt(s.label), weights=opt(s.weight), groups=opt(s.group_id), stage=self.batch_stage)

    # ---- what it produces --------------------------------------------------------------------------
    def _jagged_entries(self) -> list[dict[str, Any]]:
        return [e for e in self.spec.sparse if e.get("multi_valued")] + list(self.spec.sequence)

    @property
    def schema(self) -> Schema:
        """The schema of the columns it produces (vocabulary sizes, embedding dims, tables)."""
        if self._schema is not None:
            return self._schema
        self._check_fitted()
        spec, sizes, dflt = self.spec, {t: v.size for t, v in self.vocabs_.items()}, self.options["embedding_dim"]
        key = (id(self.vocabs_), tuple(sizes.items()))  # built once per set of vocabularies (read per batch)
        cached = getattr(self, "_schema_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]

        def dim(e: dict[str, Any]) -> int | str:
            d = e.get("embedding_dim", dflt)
            return d if d == "auto" else int(d)

        schema = Schema(
            dense=[DenseFeature(e["name"], group=e.get("group", "context")) for e in spec.dense],
            sparse=[SparseFeature(e["name"], sizes[self.table_of[e["name"]]], dim(e), table=e.get("table"),
                                  group=e.get("group", "context"), pooling=e.get("pooling", "sum"),
                                  multi_valued=bool(e.get("multi_valued"))) for e in spec.sparse],
            sequence=[SequenceFeature(q["name"], int(q["max_len"]), q["shares"], q.get("pooling", "mean"),
                                      q.get("group", "user"), role=q.get("role"), of=q.get("of"),
                                      session=q.get("session")) for q in spec.sequence],
            label="label", weight="weight" if spec.weight else None, group_id="group" if spec.group_id else None,
            item_id=spec.item_id,
        )
        self._schema_cache = (key, schema)
        return schema

    @property
    def id_dtype(self) -> type:
        """Stored id dtype: int32 when every vocabulary fits, else int64."""
        if self.vocabs_ is not None:
            sizes = [v.size for v in self.vocabs_.values()]
        else:
            sizes = [t.num_embeddings for t in self.schema.tables().values()]
        return np.int32 if max(sizes, default=2) <= np.iinfo(np.int32).max else np.int64

    def column_specs(self) -> list[ColumnSpec]:
        """The store columns it writes, in store order."""
        s, ids = self.schema, np.dtype(self.id_dtype).str
        cols = [ColumnSpec(s.label, "label", "<f4")]
        if s.weight:
            cols.append(ColumnSpec(s.weight, "weight", "<f4"))
        if s.group_id:
            cols.append(ColumnSpec(s.group_id, "group", "<i8"))
        cols += [ColumnSpec(e["name"], "dense", "<f4") for e in self.spec.dense]
        cols += [ColumnSpec(e["name"], "sparse", ids) for e in self.spec.sparse if not e.get("multi_valued")]
        cols += [ColumnSpec(e["name"], "jagged", ids) for e in self._jagged_entries()]
        return cols

    def spill_columns(self) -> dict[str, SpillColumn]:
        """Layout of :meth:`Encoded.parts` in a preprocessing spill."""
        single = [e for e in self.spec.sparse if not e.get("multi_valued")]
        cols = {"label": SpillColumn("<f4"), "dense": SpillColumn(np.dtype(self._dense_dtype).str, (len(self.spec.dense),)),
                "sparse": SpillColumn(np.dtype(self._sparse_dtype).str, (len(single),))}
        if self.spec.weight:
            cols["weight"] = SpillColumn("<f4")
        if self.spec.group_id:
            cols["group"] = SpillColumn("<i8")
        for e in self._jagged_entries():
            cols[jagged_key(e["name"])] = SpillColumn("<i8", jagged=True)
        return cols

    # ---- the batch-level stage ---------------------------------------------------------------------
    def with_multi_hot(self, size: int | list[int], min_table_size: int = 200, distribution: str = "uniform",
                       pareto_a: float = 0.25) -> FeaturePipeline:
        """A copy that expands single-valued features of tables with >= ``min_table_size`` rows into
        ``size`` ids each, or ``size[i]`` for the i-th sparse feature (seed 000 §3.3; the tables are a function of
        the schema and these options)."""
        p = copy.copy(self)
        p.multi_hot = {"size": int(size) if isinstance(size, int) else [int(m) for m in size], "min_table_size": int(min_table_size), "distribution": distribution,
                       "pareto_a": float(pareto_a), "fingerprint": None}
        p._stage = None
        p.multi_hot["fingerprint"] = p.batch_stage.fingerprint()
        return p

    @property
    def batch_stage(self) -> MultiHot | None:
        """The multi-hot expansion applied to every batch, or None. Rebuilt tables are checked against the
        fingerprint of those training used (a difference is an error, never a silent change)."""
        if self.multi_hot is None:
            return None
        if self._stage is None:
            m = self.multi_hot
            stage = MultiHot.from_schema(self.schema, m["size"], m["min_table_size"], m["distribution"],
                                         pareto_a=m.get("pareto_a", 0.25))
            if m.get("fingerprint") and stage.fingerprint() != m["fingerprint"]:
                raise DataError("the multi-hot tables rebuilt from the pipeline differ from those used in "
                                f"training ({stage.fingerprint()} != {m['fingerprint']}); this numpy generates "
                                "other tables for the same seeds")
            self._stage = stage
        return self._stage

    # ---- persistence -------------------------------------------------------------------------------
    def vocab_fingerprint(self) -> str:
        """sha256 over the vocabularies (table names, sizes, modes, keys, ids): equal fingerprints mean equal
        raw -> id maps. Cheap after the first call, and stored with the pipeline."""
        if self._fingerprint is None:
            self._fingerprint = vocab_fingerprint(self.vocabs_, self.schema if self.vocabs_ is None else None)
        return self._fingerprint

    def __repr__(self) -> str:
        state = f"{len(self.vocabs_)} vocabularies" if self.vocabs_ is not None else (
            "ids" if self.kind == IDS else "not fitted")
        mh = f", multi_hot={self.multi_hot['size']}" if self.multi_hot else ""
        return (f"FeaturePipeline(kind={self.kind!r}, dense={len(self.spec.dense)}, sparse={len(self.spec.sparse)}, "
                f"sequence={len(self.spec.sequence)}, {state}{mh})")


def _ids(col: Any) -> Any:
    """A stored sparse column as collate takes it: ids int64 [n], or jagged (values int64, lengths int64)."""
    if isinstance(col, tuple):
        return np.asarray(col[0], np.int64), np.asarray(col[1], np.int64)
    return np.asarray(col, np.int64)


__all__ = [
    "CRITEO",
    "DENSE_NAMES",
    "IDS",
    "SPARSE_NAMES",
    "TABLE",
    "Encoded",
    "FeaturePipeline",
    "PipelineFitter",
    "criteo_spec",
]
