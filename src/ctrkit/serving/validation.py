"""JSON rows -> checked, canonical columns for :class:`~ctrkit.serving.predictor.Predictor`: what ``ctrkit
serve`` runs on every request before any row reaches the model.

A request holds raw rows as JSON objects (``{"I1": 3, "C1": "68fd1e64", ...}``). :class:`RowValidator` checks
every value against the rule of its column in the checkpoint's feature pipeline and gives back, per column,
one canonical value per row, plus one :class:`FieldError` per bad (row, field):

=====================  ===============================================  =========================================
column                 accepted JSON values                             canonical value
=====================  ===============================================  =========================================
dense                  number, numeric string (``"3"``, ``" 1e-3 "``),  float, NaN = missing (the pipeline reads
                       ``""`` or null (missing); finite only            it as 0 before its transform); a column
                                                                        of integers and nulls: int, null -> 0
Criteo categorical     8 hex digits, ``""`` or null (missing), or the   int key (-1 = missing): the block
                       decoded key as an integer in [0, 2^32)           parser's form, the pipeline's fast path
table categorical      string, integer (or an integral float), null     str or None
multi-valued /         list of strings / integers, a delimited string   list[str] (tokens trimmed and empty ones
sequence               (the spec's delimiter), or null (no values)      dropped later by the pipeline)
``ids`` pipeline       integer id in [0, table size), null (= id 0);    int; list[int]
                       a list of such ids for multi-valued columns
=====================  ===============================================  =========================================

Why canonical values: rows of several requests are scored together (micro-batching, :mod:`ctrkit.serving.
batching`), and the pipeline reads a column of mixed JSON types as text; one request's integers beside
another's strings would change how both are read. With one canonical type per column, a row's score does not
depend on the rows beside it. A canonical value means what the raw value means to the pipeline (tested:
scores equal :meth:`Predictor.predict` on the raw rows).

Fields a row has beyond the pipeline's input columns (label, weight, ids of the caller's own) are ignored.
JSON's non-standard ``NaN`` / ``Infinity`` tokens parse to :class:`NonFinite` markers (see :func:`loads`), so
they are reported at their row and field like any other bad value.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from ctrkit.data.pipeline.feature_pipeline import CRITEO, IDS, FeaturePipeline

log = logging.getLogger(__name__)

# the pipeline's number rule (ctrkit.data.pipeline.columns._NUMBER) with RE2's ASCII \d and \s spelled out
_NUMBER = re.compile(r"[ \t\n\f\r]*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?[ \t\n\f\r]*")
_KEY_LIMIT = 1 << 32
F32_MAX = float(np.finfo(np.float32).max)  # the largest dense value a model reads (stores hold float32)
DENSE, HEX, CATEGORY, TOKENS, ID, ID_TOKENS = "dense", "hex", "category", "tokens", "id", "id_tokens"


class NonFinite:
    """A ``NaN`` / ``Infinity`` / ``-Infinity`` token of a request body: not a number any rule accepts."""

    __slots__ = ("token",)

    def __init__(self, token: str) -> None:
        self.token = token


def loads(body: bytes) -> Any:
    """Parse a request body. Raises ValueError (bad JSON, bad UTF-8, an integer of over 4300 digits) or
    RecursionError (nesting deeper than the parser's stack)."""
    return json.loads(body, parse_constant=NonFinite)


@dataclass(frozen=True)
class FieldError:
    """One bad value: ``row`` is the 0-based index in the request, ``field`` the column (None: the row)."""

    row: int
    field: str | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row, "field": self.field, "message": self.message}


class _Bad(Exception):
    """A value a rule refuses; the message completes "field 'x' ..." ."""


_MISSING = object()  # a field the row lacks
_LACKS = "lacks"  # _Bad's message for it (compared by identity)


@dataclass
class Checked:
    """Rows after :meth:`RowValidator.check`: ``columns``, the canonical values per input column (a numpy array
    for dense, Criteo-key and id columns, else a list; complete only when there are no errors), the first
    ``errors`` in row order, and how many rows and errors there were in all."""

    columns: dict[str, Any]
    n: int
    errors: list[FieldError]
    bad_rows: int
    total_errors: int


@dataclass(frozen=True)
class FieldRule:
    """How one input column is read: ``kind`` (see the module table), the multi-valued ``delimiter``, and
    for ``ids`` pipelines the size of the table the ids index."""

    column: str
    kind: str
    delimiter: str = "|"
    table_size: int = 0
    bound: float = math.inf  # dense: the largest |value| (float32 max, unless ln(x + 3) brings it down)

    def describe(self) -> str:
        return {
            DENSE: "a number, a numeric string, \"\" or null (missing)",
            HEX: "8 hex digits (e.g. \"68fd1e64\"), \"\" or null (missing), or the key as an integer in [0, 2^32)",
            CATEGORY: "a string, an integer or null (missing)",
            TOKENS: f"a list of strings / integers, a {self.delimiter!r}-delimited string, or null (no values)",
            ID: f"an integer id in [0, {self.table_size}) or null (id 0, missing)",
            ID_TOKENS: f"a list of integer ids in [0, {self.table_size}), or null (no values)",
        }[self.kind]


def describe(v: Any) -> str:
    """A JSON value as an error message names it: 'an object', 'the string "ab"', ..."""
    if isinstance(v, NonFinite):
        return f"{v.token} (not a finite number; JSON has no NaN / Infinity)"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, str):
        s = v if len(v) <= 40 else v[:37] + "..."
        return f"the string {json.dumps(s)}"
    if isinstance(v, float) and not math.isfinite(v):
        return f"{v} (a number too large for a 64-bit float)"
    text = repr(v)
    return f"the number {text if len(text) <= 40 else text[:37] + '...'}"


# ---- one value -> its canonical form ------------------------------------------------------------------
def _dense(v: Any) -> float:
    t = type(v)
    if t is float:
        if v - v == 0.0:  # finite (inf - inf and nan - nan are nan)
            return v
        raise _Bad(f"is {describe(v)}; send a finite number, or null for a missing value")
    if t is int:
        try:
            return float(v)
        except OverflowError:
            raise _Bad("is an integer too large for a 64-bit float; send a smaller number") from None
    if v is None:
        return math.nan
    if t is str:
        if not v.strip():
            return math.nan
        if _NUMBER.fullmatch(v):
            x = float(v)
            if x - x == 0.0:
                return x
            raise _Bad(f"is {describe(v)}, too large for a 64-bit float; send a smaller number")
    if isinstance(v, NonFinite):
        raise _Bad(f"is {v.token}, not a finite number (JSON has no NaN / Infinity); send a finite number, or "
                   "null for a missing value")
    raise _Bad(f"must be a number, a numeric string, \"\" or null (missing); got {describe(v)}")


def _dense_within(bound: float) -> Callable[[Any], float]:
    if bound == math.inf:
        return _dense

    def read(v: Any) -> float:
        x = _dense(v)
        if -bound <= x <= bound or math.isnan(x):  # NaN: missing
            return x
        raise _Bad(f"is {describe(v)}, beyond the float32 range the model reads (|value| <= {bound:.4g}); send "
                   "a smaller number")

    return read


def _hex(v: Any) -> int:
    t = type(v)
    if t is str:
        if len(v) == 8 and v.isascii() and v.isalnum():
            try:
                return int(v, 16)
            except ValueError:
                pass
        elif not v:
            return -1
        raise _Bad(f"must be 8 hex digits (e.g. \"68fd1e64\"), \"\" or null (missing); got {describe(v)}")
    if v is None:
        return -1
    if t is int and 0 <= v < _KEY_LIMIT:
        return v
    raise _Bad("must be 8 hex digits (e.g. \"68fd1e64\"), \"\" or null (missing), or the key as an integer in "
               f"[0, 2^32); got {describe(v)}")


def _utf8(s: str) -> str:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise _Bad(f"holds a lone UTF-16 surrogate ({describe(s)}), which is not Unicode text; "
                       "send valid UTF-8") from None
    return s


def _token(v: Any) -> str | None:
    """One categorical value -> str (None: missing); integers and integral floats as their decimal text."""
    t = type(v)
    if t is str:
        return _utf8(v)
    if v is None:
        return None
    if t is int:
        return str(v)
    if t is float and v - v == 0.0 and v == int(v):
        return str(int(v))
    raise _Bad


def _category(v: Any) -> str | None:
    try:
        return _token(v)
    except _Bad as e:
        if e.args:
            raise
        raise _Bad(f"must be a string, an integer or null (missing); got {describe(v)}") from None


def _tokens(delimiter: str) -> Callable[[Any], list[str]]:
    def read(v: Any) -> list[str]:
        if type(v) is str:
            return _utf8(v).split(delimiter)
        if v is None:
            return []
        if type(v) is list:
            out = []
            for i, item in enumerate(v):
                try:
                    tok = _token(item)
                except _Bad as e:
                    if e.args:
                        raise
                    raise _Bad(f"item {i} must be a string or an integer; got {describe(item)}") from None
                if tok is not None:
                    out.append(tok)
            return out
        raise _Bad(f"must be a list of strings / integers, a {delimiter!r}-delimited string or null (no values); "
                   f"got {describe(v)}")

    return read


def _id(size: int) -> Callable[[Any], int]:
    def read(v: Any) -> int:
        if type(v) is int and 0 <= v < size:
            return v
        if v is None:
            return 0
        raise _Bad(f"must be an integer id in [0, {size}) or null (id 0, missing); got {describe(v)}")

    return read


def _id_tokens(size: int) -> Callable[[Any], list[int]]:
    def read(v: Any) -> list[int]:
        if v is None:
            return []
        if type(v) is list:
            out = []
            for i, x in enumerate(v):
                if type(x) is int and 0 <= x < size:
                    out.append(x)
                else:
                    raise _Bad(f"item {i} must be an integer id in [0, {size}); got {describe(x)}")
            return out
        raise _Bad(f"must be a list of integer ids in [0, {size}) or null (no values); got {describe(v)}")

    return read


# ---- rows -> columns ------------------------------------------------------------------------------
class RowValidator:
    """The field rules of a fitted pipeline's input columns, and :meth:`columns` to apply them."""

    def __init__(self, pipeline: FeaturePipeline) -> None:
        self.pipeline = pipeline
        spec, kind = pipeline.spec, pipeline.kind
        sizes = {t: s.num_embeddings for t, s in pipeline.schema.tables().items()} if kind == IDS else {}
        rules: dict[str, FieldRule] = {}

        def add(column: str, rule_kind: str, entry: dict[str, Any]) -> None:
            size = sizes.get(pipeline.feature_table(entry), 0) if kind == IDS and rule_kind != DENSE else 0
            bound = F32_MAX if rule_kind == DENSE and entry.get("transform", "none") != "log" else math.inf
            rule = rules.setdefault(column, FieldRule(column, rule_kind, entry.get("delimiter", "|"), size, bound))
            if rule.kind != rule_kind:
                log.warning("column %r is read as %s by one feature and as %s by %r; requests are checked as %s",
                            column, rule.kind, rule_kind, entry["name"], rule.kind)

        for e in spec.dense:
            add(e["column"], DENSE, e)
        for e in spec.sparse:
            if e.get("multi_valued"):
                add(e["column"], ID_TOKENS if kind == IDS else TOKENS, e)
            else:
                add(e["column"], ID if kind == IDS else HEX if kind == CRITEO else CATEGORY, e)
        for e in spec.sequence:
            add(e["column"], ID_TOKENS if kind == IDS else TOKENS, e)
        # a column that two features read in two ways keeps the first rule (validated once, read by both)
        self.rules = [rules[c] for c in pipeline.input_columns(optional=False)]
        self._readers: list[Callable[[Any], Any]] = [_reader(r) for r in self.rules]

    def fields(self) -> list[dict[str, str]]:
        """Every input field with its kind and what it accepts (for /metadata)."""
        return [{"name": r.column, "kind": r.kind, "accepts": r.describe()} for r in self.rules]

    def check(self, rows: list[Any], max_errors: int = 1000) -> Checked:
        """Check ``rows`` (see :class:`Checked`). A column whose values are all of the common well-formed kind
        is checked at once (numpy), the others value by value."""
        found: list[tuple[int, str | None, str]] = []  # (row, field, reason): formatted once sorted and cut
        bad_rows: set[int] = set()
        objects = []
        for i, r in enumerate(rows):
            if type(r) is dict:
                objects.append(r)
            else:
                bad_rows.add(i)
                found.append((i, None, f"must be an object of field: value pairs; got {describe(r)}"))
                objects.append({})
        not_objects = set(bad_rows)
        values = {r.column: [o.get(r.column, _MISSING) for o in objects] for r in self.rules}
        out: dict[str, Any] = _fast_hex_columns([r for r in self.rules if r.kind == HEX], values)
        for rule, read in zip(self.rules, self._readers):
            column = rule.column
            if column in out:
                continue
            vals = values[column]
            fast = _fast_column(rule, vals)
            if fast is not None:
                out[column] = fast
                continue
            for i, v in enumerate(vals):
                try:
                    if v is _MISSING:
                        raise _Bad(_LACKS)
                    vals[i] = read(v)
                except _Bad as e:
                    vals[i] = None
                    if i not in not_objects:
                        bad_rows.add(i)
                        found.append((i, column, e.args[0]))
            if not found:
                out[column] = np.array(vals, _NUMPY[rule.kind]) if rule.kind in _NUMPY else vals
        found.sort(key=lambda e: e[0])  # stable: per row, fields in input-column order
        errors = [FieldError(i, f, f"row {i} {reason}" if f is None else
                             f"row {i} lacks the required field {f!r}; send null for a missing value"
                             if reason is _LACKS else f"row {i}, field {f!r} {reason}")
                  for i, f, reason in found[:max_errors]]
        return Checked(out, len(rows), errors, len(bad_rows), len(found))


_NUMPY = {DENSE: np.float64, HEX: np.int64, ID: np.int64}  # kinds whose canonical column is a numpy array
_NONE = type(None)
_INTEGERS, _NUMBERS, _TEXT = {int, _NONE}, {int, float, _NONE}, {str, _NONE}
_HEX_NIBBLE = np.full(256, -1, np.int64)
for _k, _c in enumerate("0123456789abcdef"):
    _HEX_NIBBLE[ord(_c)] = _HEX_NIBBLE[ord(_c.upper())] = _k
_NIBBLE_SHIFT = 4 * np.arange(7, -1, -1)


def _fast_column(rule: FieldRule, vals: list[Any]) -> Any:
    """The canonical column of ``vals`` when every value is well-formed and of the usual JSON type (numbers
    for dense, 8-hex-digit strings or null for Criteo keys, ASCII strings or null for categories); None
    otherwise (then every value is checked on its own, which also names the bad ones)."""
    types = set(map(type, vals))
    if rule.kind == DENSE and types <= _INTEGERS:  # counts (Criteo's I1..I13): int64, null -> 0, as the pipeline
        try:  # reads null; integer columns take its ln(x + 3) lookup table
            return np.array(vals if _NONE not in types else [0 if v is None else v for v in vals], np.int64)
        except OverflowError:  # beyond int64: read as floats below
            pass
    if rule.kind == DENSE and types <= _NUMBERS:
        try:
            x = np.array(vals, np.float64)  # null -> NaN (missing)
        except OverflowError:  # an integer beyond float64
            return None
        with np.errstate(invalid="ignore"):
            if np.isinf(x).any() or (rule.bound < math.inf and (np.abs(x) > rule.bound).any()):
                return None
        return x
    if rule.kind == HEX and types <= _TEXT:
        return _fast_hex_columns([rule], {rule.column: vals}).get(rule.column)
    if rule.kind == CATEGORY and types <= _TEXT:
        strs = [v for v in vals if v is not None] if _NONE in types else vals
        return vals if "".join(strs).isascii() else None
    return None


def _fast_hex_columns(rules: list[FieldRule], values: dict[str, list[Any]]) -> dict[str, np.ndarray]:
    """Criteo keys of the columns of ``rules`` whose values are all 8-hex-digit strings, "" or null, decoded
    together (one numpy pass for all columns): {column: keys int64 [n], -1 = missing}. A column with any other
    value is left out (checked value by value), and so are all of them when any key is not hex."""
    picked, keys, present = [], [], []
    for r in rules:
        vals = values[r.column]
        types = set(map(type, vals))
        if not types <= _TEXT:
            continue
        k = [v for v in vals if v] if _NONE in types or "" in vals else vals  # "" / null: missing
        if k and set(map(len, k)) != {8}:
            continue
        picked.append(r.column)
        keys.append(k)
        present.append(None if len(k) == len(vals) else np.fromiter(map(bool, vals), bool, len(vals)))
    if not picked:
        return {}
    try:
        raw = "".join(chain.from_iterable(keys)).encode("ascii")
    except UnicodeEncodeError:
        return _each_alone(rules, values)
    nib = _HEX_NIBBLE[np.frombuffer(raw, np.uint8).reshape(-1, 8)]  # (all keys, 8) nibbles, -1 if not hex
    if (nib < 0).any():
        return _each_alone(rules, values)
    decoded = (nib << _NIBBLE_SHIFT).sum(axis=1)
    out, at = {}, 0
    for column, k, mask in zip(picked, keys, present):
        part, at = decoded[at:at + len(k)], at + len(k)
        if mask is None:
            out[column] = part
        else:
            out[column] = np.full(len(mask), -1, np.int64)
            out[column][mask] = part
    return out


def _each_alone(rules: list[FieldRule], values: dict[str, list[Any]]) -> dict[str, np.ndarray]:
    """:func:`_fast_hex_columns` column by column, keeping the columns that pass (after a joint pass failed)."""
    if len(rules) == 1:
        return {}
    return {k: v for r in rules for k, v in _fast_hex_columns([r], values).items()}


def _reader(rule: FieldRule) -> Callable[[Any], Any]:
    return {DENSE: lambda: _dense_within(rule.bound), HEX: lambda: _hex, CATEGORY: lambda: _category,
            TOKENS: lambda: _tokens(rule.delimiter), ID: lambda: _id(rule.table_size),
            ID_TOKENS: lambda: _id_tokens(rule.table_size)}[rule.kind]()


def to_arrays(rules: list[FieldRule], columns: dict[str, list[Any]]) -> dict[str, Any]:
    """Canonical values (of one or several requests, concatenated) -> the arrays the pipeline reads."""
    out: dict[str, Any] = {}
    for r in rules:
        v = columns[r.column]
        if r.kind in _NUMPY:  # dense: int64 (counts) or float64 (NaN: missing)
            out[r.column] = v if isinstance(v, np.ndarray) else np.array(v, _NUMPY[r.kind])
        elif r.kind == CATEGORY:
            out[r.column] = pa.array(v, pa.string())
        elif r.kind == TOKENS:
            out[r.column] = pa.array(v, pa.list_(pa.string()))
        else:
            out[r.column] = pa.array(v, pa.list_(pa.int64()))
    return out
