"""The raw -> values step of :mod:`ctrkit.data.pipeline.feature_pipeline`: the one copy of the parsing rules.

:class:`RowEncoder.encode` takes one chunk of raw rows (a pyarrow Table, a pandas DataFrame, a list of
dicts, or a dict of columns: pyarrow arrays or numpy arrays, e.g. Criteo's block parser output) and
returns :class:`Encoded` rows: the well-formed rows only, with

* label: the label column as 0 / 1 (``label_threshold``: value >= threshold); anything else is a bad row;
* dense [n, Nd]: numbers (empty / null, and a float NaN (pandas' missing value) -> 0; text that is not a
  number, e.g. "nan" or "inf", -> bad row), then ``none`` / ``log`` (ln(x + 3), clamped at -2 where
  x + 3 <= e^-2, counted) / ``standardize`` (scaled later by :meth:`FeaturePipeline.finalize` with the
  training mean and std);
* non-finite and out-of-range dense values are bad rows, so a store never holds +-inf or NaN: a value that
  is not finite once parsed (inf in a float column, text beyond float64 such as "1e400"), or whose value
  after the encode-time transform (``none``: x, ``log``: ln(x + 3), ``standardize``: x, before scaling) has
  |v| > float32 max (3.4e38), makes its row bad with a reason naming the column; the same holds for the
  weight. ``finalize`` then saturates standardized values at +-float32 max ((x - mean) / std can only pass it
  when the training std is tiny against the value) and logs how many it saturated;
* sparse [n, Ns] and jagged columns: ids from the vocabularies (how ``_ids`` gets them is the subclass's
  business: provisional ids while fitting, final ids once fitted). Criteo's categoricals are 8 hex digits
  (32-bit keys; anything else is a bad row); other tables' are strings or integers; multi-valued and
  sequence columns are delimited strings or lists, sequences keeping their last ``max_len`` tokens;
* weight (empty -> 1), group ids, and the split code of the spec's ``split_column`` when present.

Bad rows are counted in a :class:`~ctrkit.data.pipeline.rows.BadRows` with their line numbers and dropped; without
one (``bad=None``) the first bad row is an error naming its line. Label, weight, group and split columns
are optional: a chunk without them encodes fine (e.g. rows to score).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ctrkit.data.pipeline.collate import keep_last
from ctrkit.data.pipeline.columns import counts, hex_keys, list_tokens, numeric, to_string, tokens, within_f32
from ctrkit.data.pipeline.criteo_parse import dense_transform
from ctrkit.data.pipeline.raw_columns import Raw, as_columns
from ctrkit.data.pipeline.rows import BadRows, jagged_take
from ctrkit.data.pipeline.rules import (
    COUNT,
    CRITEO,
    F32_MAX,
    HEX,
    IDS,
    LOG_FLOOR,
    TABLE,
    ColumnRules,
    split_codes,
)
from ctrkit.data.pipeline.spec import TableSpecYaml
from ctrkit.data.pipeline.vocab import GROUP_TABLE
from ctrkit.data.pipeline.vocab_joint import JointLookup
from ctrkit.data.pipeline.vocab_keys import CodedKeys
from ctrkit.errors import DataError, RowErrors

KINDS = (CRITEO, TABLE, IDS)
# chunks of at most this many rows (a served request, a micro-batch) look up all single-valued columns at once;
# larger ones column by column, where Vocabulary.lookup first reduces each column to its distinct values
JOINT_MAX_ROWS = 1 << 16
__all__ = ["CRITEO", "F32_MAX", "IDS", "KINDS", "TABLE", "Encoded", "Raw", "RowEncoder", "as_columns", "jagged_key"]

@dataclass
class Encoded:
    """Well-formed rows of one chunk after parsing and id lookup, before :meth:`FeaturePipeline.finalize`."""

    keep: np.ndarray  # (n,) index of each kept row in the chunk
    lines: np.ndarray  # (n,) its 1-based line / row number
    label: np.ndarray | None  # (n,) 0/1; None when the chunk has no label column
    dense: np.ndarray  # (n, Nd) float32, float64 when a column is standardized later
    sparse: np.ndarray  # (n, Ns) ids of the single-valued sparse features
    jagged: dict[str, tuple[np.ndarray, np.ndarray]]  # multi-valued / sequence: (ids [nnz], lengths [n])
    weight: np.ndarray | None  # (n,)
    group: np.ndarray | None  # (n,) group ids
    split: np.ndarray | None  # (n,) int8 0 train / 1 valid / 2 test from the spec's split_column
    clamped: np.ndarray  # (Nd,) values clamped by the log transform, over all rows of the chunk

    def __len__(self) -> int:
        return len(self.keep)

    def parts(self, sel: slice | np.ndarray | None = None) -> dict[str, Any]:
        """Rows ``sel`` (all by default) as the flat dict a spill stores and ``finalize`` takes."""
        whole = sel is None or (isinstance(sel, slice) and sel == slice(None))

        def take(a: np.ndarray | None) -> np.ndarray | None:
            return a if a is None or whole else a[sel]

        out: dict[str, Any] = {"dense": take(self.dense), "sparse": take(self.sparse)}
        for k in ("label", "weight", "group"):
            if getattr(self, k) is not None:
                out[k] = take(getattr(self, k))
        for name, (v, ln) in self.jagged.items():
            out[jagged_key(name)] = (v, ln) if whole else jagged_take(v, ln, np.asarray(sel))
        return out


def jagged_key(name: str) -> str:
    """Key of a jagged feature in :meth:`Encoded.parts` (apart from the fixed keys label, dense, ...)."""
    return f"jagged:{name}"


def log_transform(x: np.ndarray) -> tuple[np.ndarray, int]:
    """``ln(x + 3)`` with x + 3 <= e^-2 clamped to -2 -> (float64 values, clamped count)."""
    low = x + 3 <= LOG_FLOOR
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(low, -2.0, np.log(np.maximum(x + 3, 1e-300))), int(low.sum())


def _num_rows(cols: dict[str, Any]) -> int:
    for v in cols.values():
        return len(v[1]) if isinstance(v, tuple) else len(v)
    return 0


def _numbers(col: Any, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows, what: str, column: str) -> np.ndarray:
    """A column as float64 [n], NaN = missing; not a number / not finite -> a bad row (:func:`numeric`)."""
    if isinstance(col, np.ndarray) and col.dtype.kind in "biu":  # integers: always finite
        return col.astype(np.float64)
    return numeric(col if isinstance(col, pa.Array) else pa.array(col), lines, bad_rows, bad, what, column)


def _take(a: Any, keep: np.ndarray) -> Any:
    """Rows ``keep`` of a column: an array, or a jagged (values, lengths) whose values stay pyarrow or numpy."""
    if isinstance(a, tuple):
        v, lens = a
        if isinstance(v, (pa.Array, pa.ChunkedArray)):
            idx, new_len = jagged_take(np.arange(len(v)), np.asarray(lens, np.int64), keep)
            return v.take(pa.array(idx)), new_len
        return jagged_take(np.asarray(v), np.asarray(lens, np.int64), keep)
    if isinstance(a, CodedKeys):
        return a.take(keep)
    return a.take(pa.array(keep)) if isinstance(a, pa.Array) else a[keep]


class RowEncoder:
    """Shared by the fitted pipeline and its fitter; subclasses say how a table maps values to ids."""

    spec: TableSpecYaml
    kind: str
    table_of: dict[str, str]  # sparse feature -> its vocabulary (= embedding table)
    rules: ColumnRules  # the spec compiled (:mod:`ctrkit.data.pipeline.rules`): what every reader applies

    def _ids(self, table: str, values: Any, missing: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError

    @property
    def _sparse_dtype(self) -> type:
        return np.uint32 if self.kind == CRITEO else np.int64  # Criteo's ids are < 2^32 (checked)

    @property
    def _dense_dtype(self) -> type:
        return np.float64 if any(e["transform"] == "standardize" for e in self.spec.dense) else np.float32

    def feature_table(self, e: dict[str, Any]) -> str:
        return self.table_of[e["shares"]] if "shares" in e else self.table_of[e["name"]]

    def input_columns(self, *, optional: bool = True) -> list[str]:
        """Raw columns the rows need (feature columns), plus label / weight / group / split with ``optional``."""
        r = self.rules
        need = [x.column for x in r.inputs]
        extra = [x.column for x in (r.label, r.weight, r.group, r.split) if x is not None] if optional else []
        return list(dict.fromkeys((*extra, *need)))

    def _single_keys(self, a: Any, lines: np.ndarray, badm: np.ndarray, bad: BadRows, c: str, *,
                     hexed: bool) -> Any:
        """A single-valued categorical column -> integers (Criteo: 32-bit keys of 8 hex digits) or text."""
        if isinstance(a, tuple):
            raise DataError(f"column {c!r} is given as (values, lengths) but its feature takes one value per row")
        if isinstance(a, pa.Array) and pa.types.is_floating(a.type):
            try:  # integer ids read as floats (a DataFrame column with NaN): keys are the integers
                a = pc.cast(a, pa.int64())
            except pa.ArrowInvalid:
                pass
        if hexed:
            return hex_keys(a, lines, badm, bad, c)
        if isinstance(a, pa.Array) and not pa.types.is_integer(a.type):
            return to_string(a, lines, badm, bad, c)
        return a

    def encode(self, raw: Raw, *, lines: np.ndarray | None = None, bad: BadRows | None = None,
               unit: str | None = None, validated: bool = False) -> Encoded:
        """Parse, validate and look up one chunk of raw rows (see the module docstring). Without ``bad``, a
        malformed row raises :class:`~ctrkit.errors.RowErrors` naming its row, field and reason.

        ``validated``: the feature columns (``rules.inputs``) were already checked against these rules and hold
        their canonical values (the server's requests: :func:`ctrkit.serving.validation.to_arrays`), so they are
        read without checking a value again, to the same ids and values; label / weight / group / split
        columns, which that check does not cover, are checked as always."""
        cols = as_columns(raw)
        if isinstance(raw, list) and not raw:  # no rows, so no column names to read: zero rows of each column
            cols = {c: pa.array([], pa.string()) for c in self.input_columns(optional=False)}
        missing = [c for c in self.input_columns(optional=False) if c not in cols]
        if missing:
            raise DataError(f"rows lack the columns {missing} that the pipeline reads; they have {sorted(cols)}")
        n = _num_rows(cols)
        where = unit or ("line" if lines is not None else "row")  # what the numbers in an error count
        lines = np.arange(1, n + 1) if lines is None else np.asarray(lines)
        strict = bad is None
        chunk = _Chunk(cols, n, lines, BadRows("rows") if bad is None else bad, np.zeros(n, bool))
        y = self._label(chunk)
        dense, clamped = self._dense(chunk, validated)
        w = self._weight(chunk)
        split = self._split(chunk)
        # categorical columns are validated (hex, UTF-8, single values) and multi-valued ones split into tokens
        # before any value enters a vocabulary, so a bad row found there is dropped like any other
        cat = self._categorical(chunk, validated)
        if strict and chunk.bad.bad:
            first = "; ".join(f"{where} {k}: {r}" for k, r in chunk.bad.first)
            raise RowErrors(f"{chunk.bad.bad} of {n} rows are malformed: {first}", chunk.bad.problems)
        whole = not chunk.badm.any()
        keep = np.arange(n) if whole else np.flatnonzero(~chunk.badm)

        def rows(a: np.ndarray | None) -> np.ndarray | None:
            return a if a is None or whole else a[keep]

        kept = {k: v if whole else _take(v, keep) for k, v in cat.items()}
        sparse, jagged, group = self._lookup(kept, len(keep))
        return Encoded(keep, rows(lines), rows(y), rows(dense), sparse, jagged, rows(w), group, rows(split),
                       clamped)

    # ---- one rule each: raw column -> values, bad rows flagged -----------------------------------------
    def _label(self, c: _Chunk) -> np.ndarray | None:
        rule = self.rules.label
        if rule.column not in c.cols:
            return None
        y = _numbers(c.cols[rule.column], c.lines, c.badm, c.bad, f"label {rule.column!r}", rule.column)
        if rule.threshold is not None:
            y = np.where(np.isnan(y), np.nan, (y >= rule.threshold).astype(np.float64))
        c.bad.flag(~np.isin(y, (0.0, 1.0)) & ~c.badm, c.lines, f"label {rule.column!r} is not 0 or 1", c.badm,
                   rule.column)
        return y

    def _dense(self, c: _Chunk, validated: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(dense [n, Nd] after the encode-time transform, values clamped by ln(x + 3) per column [Nd]);
        ``validated``: the columns are checked numpy numbers already (finite, within the rule's bound, NaN =
        missing)."""
        rules = self.rules.dense
        dense = np.zeros((c.n, len(rules)), self._dense_dtype, order="F")  # filled column by column
        clamped = np.zeros(len(rules), np.int64)
        logged, ints = [], []  # int64 counts under ln(x + 3): transformed together below
        for j, r in enumerate(rules):
            col = c.cols[r.column]
            if r.kind == COUNT and not validated:  # Criteo's integer counts, by the block parser's rule
                col = counts(col, c.lines, c.badm, c.bad, f"dense {r.name!r}", r.column)
            if r.transform == "log" and isinstance(col, np.ndarray) and col.dtype.kind in "iu":
                if col.dtype == np.int64:
                    logged.append(j)
                    ints.append(col)
                else:
                    dense[:, j], clamped[j] = dense_transform(col)  # integer counts: lookup-table fast path
                continue
            x = np.nan_to_num(np.asarray(col, np.float64) if validated
                              else _numbers(col, c.lines, c.badm, c.bad, f"dense {r.name!r}", r.column), nan=0.0)
            if r.transform == "log":
                x, clamped[j] = log_transform(x)
            if not validated:
                after = " after ln(x + 3)" if r.transform == "log" else ""
                x = within_f32(x, c.lines, c.badm, c.bad, f"dense {r.name!r} is beyond the float32 range "
                               f"(|value| > {F32_MAX:.4g}{after})", r.column, 0.0)
            dense[:, j] = x
        if logged:  # one lookup-table pass over all integer count columns (elementwise: as one by one)
            vals, clamped[logged] = dense_transform(np.stack(ints).T)  # (n, k) column by column, as ``dense``
            if len(logged) == len(rules) and vals.dtype == dense.dtype:
                return vals, clamped  # every column: the transform's output is the dense block
            dense[:, logged] = vals
        return dense, clamped

    def _weight(self, c: _Chunk) -> np.ndarray | None:
        rule = self.rules.weight
        if rule is None or rule.column not in c.cols:
            return None
        w = np.nan_to_num(_numbers(c.cols[rule.column], c.lines, c.badm, c.bad, f"weight {rule.column!r}",
                                   rule.column), nan=1.0)
        return within_f32(w, c.lines, c.badm, c.bad, f"weight {rule.column!r} is beyond the float32 range",
                          rule.column, 1.0)

    def _split(self, c: _Chunk) -> np.ndarray | None:
        rule = self.rules.split
        if rule is None or rule.column not in c.cols:
            return None
        split = split_codes(to_string(c.cols[rule.column], c.lines, c.badm, c.bad, rule.column))
        c.bad.flag((split < 0) & ~c.badm, c.lines, f"split column {rule.column!r} is not train/valid/test", c.badm,
                   rule.column)
        return split

    def _categorical(self, c: _Chunk, validated: bool = False) -> dict[Any, Any]:
        """{column: keys or text} of the single-valued columns (and the group column), {(column, delimiter):
        (flat tokens, lengths [n])} of the multi-valued and sequence ones; ``validated``: the feature columns
        hold checked canonical values (Criteo keys and ids as integers, text as strings, lists of tokens)."""
        cat: dict[Any, Any] = {}
        group = self.rules.group if self.rules.group and self.rules.group.column in c.cols else None
        for r in (*self.rules.single, *([group] if group else [])):
            if validated and r is not group:
                cat[r.column] = c.cols[r.column]
            elif r.column not in cat:
                cat[r.column] = self._single_keys(c.cols[r.column], c.lines, c.badm, c.bad, r.column,
                                                  hexed=r.kind == HEX)
        for r in self.rules.jagged:
            key = (r.column, r.delimiter)
            if key not in cat:
                a = c.cols[r.column]
                if isinstance(a, tuple):
                    cat[key] = a
                elif validated:
                    cat[key] = list_tokens(a)
                else:
                    cat[key] = tokens(a, r.delimiter, c.lines, c.badm, c.bad, r.column)
        return cat

    def _lookup(self, kept: dict[Any, Any], n: int) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]],
                                                              np.ndarray | None]:
        """Ids of the kept rows: (sparse [n, Ns], jagged {feature: (ids, lengths)}, group ids or None)."""
        sparse = self._single_ids(kept, n)
        jagged: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for r in self.rules.jagged:
            flat, lens = kept[(r.column, r.delimiter)]
            lens = np.asarray(lens, np.int64)
            ids = self._ids(r.table, flat) if len(flat) else np.zeros(0, np.int64)
            if r.max_len:
                ids, lens = keep_last(ids, lens, r.max_len)
            jagged[r.name] = (ids, lens)
        g = self.rules.group
        group = self._ids(GROUP_TABLE, kept[g.column]) if g is not None and g.column in kept else None
        return sparse, jagged, group


    def _single_ids(self, kept: dict[Any, Any], n: int) -> np.ndarray:
        """Ids [n, Ns] of the single-valued columns: in one lookup (:meth:`_joint`) when every column holds
        integer keys and the chunk is small, else column by column (the same ids)."""
        single = self.rules.single
        cols = [kept[r.column] for r in single]
        joint = self._joint() if single and n <= JOINT_MAX_ROWS else None
        if joint is not None and all(isinstance(v, np.ndarray) and v.dtype.kind in "iu" for v in cols):
            keys = np.stack(cols)  # (Ns, n)
            hexed = np.array([r.kind == HEX for r in single])[:, None]  # Criteo keys: negative = missing
            return joint.lookup(keys, (keys < 0) & hexed).T.astype(self._sparse_dtype)  # (n, Ns)
        sparse = np.empty((n, len(single)), self._sparse_dtype, order="F")  # filled column by column
        for j, (r, v) in enumerate(zip(single, cols)):  # CodedKeys carry their missing values (negative uniques)
            coded = self._coded_ids(r.table, v) if isinstance(v, CodedKeys) else None
            if coded is not None:  # the distinct keys' ids, gathered for the rows straight into the column
                np.take(coded.astype(self._sparse_dtype), v.codes, out=sparse[:, j])
                continue
            missing = v < 0 if r.kind == HEX and not isinstance(v, CodedKeys) else None
            sparse[:, j] = self._ids(r.table, v, missing)
        return sparse

    def _coded_ids(self, table: str, col: CodedKeys) -> np.ndarray | None:
        """Ids [m] of the distinct keys of ``col`` (``ids[col.codes]`` being what :meth:`_ids` gives its rows), or
        None: then :meth:`_ids` takes the rows."""
        return None

    def _joint(self) -> JointLookup | None:
        """One id lookup for all single-valued columns, or None (ids come column by column)."""
        return None


@dataclass
class _Chunk:
    """One chunk under validation: its columns, size, line numbers, bad-row record and mask of bad rows."""

    cols: dict[str, Any]
    n: int
    lines: np.ndarray
    bad: BadRows
    badm: np.ndarray
