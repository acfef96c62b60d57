"""JSON rows -> checked, canonical columns for :class:`~ctrkit.serving.predictor.Predictor`: what ``ctrkit
serve`` runs on every request before any row reaches the model.

A request holds raw rows as JSON objects (``{"I1": 3, "C1": "68fd1e64", ...}``). :class:`RowValidator` reads
every value with the rule of its column, the checkpoint pipeline's compiled
:class:`~ctrkit.data.pipeline.rules.ColumnRule` (one per input column, ``pipeline.rules.inputs``): the columns
whose values are all of the usual type and well-formed at once, in C (:mod:`ctrkit.data.pipeline.json_columns`:
all count columns in one conversion, all Criteo keys in one hex decode), any other column value by value
through the readers of :mod:`ctrkit.data.pipeline.values` (the table of accepted values is there), which give
the same canonical values and name every bad one. It gives back, per column, one canonical value per row, or
raises :class:`~ctrkit.errors.RowErrors` whose ``problems`` list every bad (row, field, reason), which the
server renders as its 422 answer (:func:`render`).

Why canonical values: rows of several requests are scored together (micro-batching, :mod:`ctrkit.serving.
batching`), and the pipeline reads a column of mixed JSON types as text; one request's integers beside
another's strings would change how both are read. With one canonical type per column, a row's score does not
depend on the rows beside it. A canonical value means what the raw value means to the pipeline (tested:
scores equal :meth:`Predictor.predict` on the raw rows).

Fields a row has beyond the pipeline's input columns (label, weight, ids of the caller's own) are ignored.
JSON's non-standard ``NaN`` / ``Infinity`` tokens parse to :class:`~ctrkit.data.pipeline.values.NonFinite`
markers (see :func:`loads`), so they are reported at their row and field like any other bad value.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ctrkit.data.pipeline.arrow_columns import arrow_columns
from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.pipeline.json_columns import NUMPY, fast_columns
from ctrkit.data.pipeline.rules import CATEGORY, TOKENS, ColumnRule
from ctrkit.data.pipeline.values import NonFinite, Refused, describe, reader
from ctrkit.errors import DataError, Problem, RowErrors

try:
    import orjson as _orjson
except ImportError:  # an optional speed-up (ctrkit[serve])
    _orjson = None

log = logging.getLogger(__name__)

__all__ = ["LACKS", "BadColumns", "Checked", "NonFinite", "RowValidator", "column_arrays", "column_lists", "describe",
           "dumps", "loads", "read_arrow", "render", "to_arrays"]


def loads(body: bytes) -> Any:
    """Parse a request body. Raises ValueError (bad JSON, bad UTF-8, an integer of over 4300 digits) or
    RecursionError (nesting deeper than the parser's stack). orjson (about 2.5x faster) parses what it can; the
    standard library's parser reads the rest (``NaN`` / ``Infinity`` tokens, integers beyond 64 bits, nesting
    deeper than orjson's limit of 1024) and names the error of a body that is not JSON."""
    if _orjson is not None:
        try:
            return _orjson.loads(body)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(body, parse_constant=NonFinite)


def dumps(obj: Any) -> bytes:
    """JSON bytes of plain data (orjson when installed: the same text as ``json.dumps`` for str, int, float,
    list and dict, without spaces)."""
    if _orjson is not None:
        return _orjson.dumps(obj)
    return json.dumps(obj, separators=(",", ":")).encode()


def _columns(objects: list[dict], names: list[str]) -> dict[str, Sequence[Any]]:
    """{name: the value of every row} (``_MISSING`` where a row lacks it). Rows that all hold the same fields in
    the same order (what a client's serializer writes) are transposed in one C pass."""
    keys = tuple(objects[0]) if objects else ()
    if objects and all(tuple(o) == keys for o in objects):
        cols = dict(zip(keys, zip(*[o.values() for o in objects])))
        return {c: cols[c] if c in cols else (_MISSING,) * len(objects) for c in names}
    return {c: [o.get(c, _MISSING) for o in objects] for c in names}


_MISSING = object()  # a field the row lacks
LACKS = "lacks the required field; send null for a missing value"  # the reason of a missing field


def render(p: Problem) -> str:
    """The message of a request's bad (row, field, reason), rows counted from 0."""
    if p.field is None:
        return f"row {p.row} {p.reason}"
    if p.reason == LACKS:
        return f"row {p.row} lacks the required field {p.field!r}; send null for a missing value"
    return f"row {p.row}, field {p.field!r} {p.reason}"


@dataclass
class Checked:
    """Rows that passed :meth:`RowValidator.check`: ``columns``, the canonical values per input column (a numpy
    array for dense, Criteo-key and id columns, else a list), and their number ``n``."""

    columns: dict[str, Any]
    n: int


class RowValidator:
    """The rules of a fitted pipeline's input columns, and :meth:`check` to apply them."""

    def __init__(self, pipeline: FeaturePipeline) -> None:
        self.pipeline = pipeline
        for kept, other in pipeline.rules.conflicts():
            log.warning("column %r is read as %s by one feature and as %s by %r; requests are checked as %s",
                        kept.column, kept.kind, other.kind, other.name, kept.kind)
        self.rules: list[ColumnRule] = list(pipeline.rules.inputs)
        self.names = [r.column for r in self.rules]  # the input fields, in order
        self._readers: list[Callable[[Any], Any]] = [reader(r) for r in self.rules]

    def fields(self) -> list[dict[str, str]]:
        """Every input field with its kind and what it accepts (for /metadata)."""
        return [{"name": r.column, "kind": r.kind, "accepts": r.accepts()} for r in self.rules]

    def check(self, rows: list[Any], max_errors: int = 1000) -> Checked:
        """The canonical columns of ``rows``, or :class:`RowErrors` listing the first ``max_errors`` bad (row,
        field, reason) in row order (``bad_rows`` and ``total`` count them all). ``rows`` as a JSON parser gives
        them (dicts of str, int, float, bool, None, lists, dicts; :class:`NonFinite`). A column whose values are
        all of the usual type and well-formed is read at once, in C (:mod:`ctrkit.data.pipeline.json_columns`);
        the others value by value, which names every bad one."""
        objects = [r if type(r) is dict else {} for r in rows]
        not_objects = {i for i, r in enumerate(rows) if type(r) is not dict}
        found = [Problem(i, None, f"must be an object of field: value pairs; got {describe(rows[i])}")
                 for i in sorted(not_objects)]
        return self._read(_columns(objects, self.names), len(rows), not_objects, found, max_errors)

    def check_columns(self, columns: dict[str, list[Any]], n: int, max_errors: int = 1000) -> Checked:
        """:meth:`check` of the same rows given column by column (``columns``: every input field's list of ``n``
        values, as :func:`column_lists` gives them): the same canonical columns, or the same :class:`RowErrors`
        (a bad value named by its row and field). No transposition: each column goes to the readers as sent."""
        return self._read(columns, n, set(), [], max_errors)

    def check_arrow(self, columns: dict[str, pa.Array], n: int, max_errors: int = 1000) -> Checked:
        """:meth:`check` of the same rows given as Arrow columns (``columns``: every input field's array of ``n``
        values, as :func:`column_arrays` gives them): the columns of the usual Arrow type and all well-formed
        are read from their buffers (:mod:`ctrkit.data.pipeline.arrow_columns`), any other through its Python
        values like a JSON body's column, so the canonical columns and the (row, field) errors are those of the
        same values sent as JSON."""
        done = arrow_columns(self.rules, columns)
        rest = {c: columns[c].to_pylist() for c in self.names if c not in done}
        return self._read(rest, n, set(), [], max_errors, done)

    def _read(self, values: dict[str, Sequence[Any]], n: int, not_objects: set[int], found: list[Problem],
              max_errors: int, done: dict[str, Any] | None = None) -> Checked:
        """Every input column of ``values`` read by its rule (see :meth:`check`), but those ``done`` holds
        already; rows in ``not_objects`` were not objects (``found`` lists them) and their refused values are
        not listed again."""
        rules = self.rules if not done else [r for r in self.rules if r.column not in done]
        out = {**(done or {}), **fast_columns(rules, values)}  # the columns whose values are all well-formed, in C
        for rule, read in zip(self.rules, self._readers):
            if rule.column in out:
                continue
            vals = _each_value(rule, read, values[rule.column], not_objects, found)
            if not found:
                out[rule.column] = np.array(vals, NUMPY[rule.kind]) if rule.kind in NUMPY else vals
        if found:
            found.sort(key=lambda p: p.row)  # stable: per row, fields in input-column order
            bad_rows = len({p.row for p in found})
            raise RowErrors(f"{bad_rows} of {n} rows are invalid: {render(found[0])}", found[:max_errors],
                            bad_rows=bad_rows, total=len(found))
        return Checked(out, n)


class BadColumns(DataError):
    """A columnar request body whose columns are not one list of n values per input field: ``problems`` lists
    (field, what is wrong), every one found."""

    def __init__(self, problems: list[tuple[str | None, str]]) -> None:
        super().__init__("; ".join(m for _, m in problems))
        self.problems = problems


def column_lists(columns: Any, fields: list[str]) -> tuple[dict[str, list[Any]], int]:
    """({field: its values}, n) of a columnar body's ``columns`` object ({"I1": [3, null, ...], "C1": [...],
    ...}: one list per input field, all of one length n; other keys are ignored), or :class:`BadColumns`
    naming every field that is missing, not a list, or of another length than most fields'."""
    if type(columns) is not dict:
        raise BadColumns([(None, f"the columns must be an object of field: list of values; got {describe(columns)}")])
    values = {f: columns.get(f, _MISSING) for f in fields}
    lengths = [len(v) for v in values.values() if type(v) is list]
    n = max(set(lengths), key=lambda k: (lengths.count(k), -k)) if lengths else 0  # the most common length
    problems = [(f, _column_problem(f, v, n)) for f, v in values.items() if type(v) is not list or len(v) != n]
    if problems:
        raise BadColumns(problems)
    return values, n


ARROW_STREAM = "application/vnd.apache.arrow.stream"  # the media type of an Arrow IPC stream body


def read_arrow(body: bytes) -> pa.RecordBatch:
    """The rows of an Arrow IPC stream body as one record batch, read in place (no copy of the values) when
    the stream holds one batch. Raises ValueError naming what is wrong when the body is not such a stream."""
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(body))
        batches = list(reader)
        if len(batches) == 1:
            return batches[0]
        return pa.Table.from_batches(batches, reader.schema).combine_chunks().to_batches(max_chunksize=None)[0] \
            if batches else pa.RecordBatch.from_pylist([], reader.schema)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(str(e).splitlines()[0][:200] if str(e) else type(e).__name__) from None


def column_arrays(batch: pa.RecordBatch, fields: list[str]) -> dict[str, pa.Array]:
    """{field: its column} of an Arrow body's ``batch`` (other columns are ignored), or :class:`BadColumns`
    naming every field that is missing or given more than once."""
    names = batch.schema.names
    where = {name: i for i, name in enumerate(names)}
    problems: list[tuple[str | None, str]] = []
    for f in fields:
        if f not in where:
            problems.append((f, _column_problem(f, _MISSING, batch.num_rows)))
        elif len(where) != len(names) and names.count(f) > 1:
            problems.append((f, f"the columns hold field {f!r} {names.count(f)} times; send it once"))
    if problems:
        raise BadColumns(problems)
    columns = batch.columns
    return {f: columns[where[f]] for f in fields}


def _column_problem(field: str, v: Any, n: int) -> str:
    if v is _MISSING:
        return f"the columns lack the required field {field!r}; send a list of {n} values (null for a missing value)"
    if type(v) is not list:
        return f"column {field!r} must be a list with one value per row; got {describe(v)}"
    return f"column {field!r} holds {len(v)} values, but the other columns hold {n}; send one value per row"


def _each_value(rule: ColumnRule, read: Callable[[Any], Any], column: Sequence[Any], skip: set[int],
                found: list[Problem]) -> list[Any]:
    """``column`` read one by one; a refused value of a row in ``skip`` (not an object) is not listed."""
    vals = list(column)
    for i, v in enumerate(vals):
        try:
            if v is _MISSING:
                raise Refused(LACKS)
            vals[i] = read(v)
        except Refused as e:
            vals[i] = None
            if i not in skip:
                found.append(Problem(i, rule.column, e.args[0]))
    return vals


def to_arrays(rules: list[ColumnRule], columns: dict[str, list[Any]]) -> dict[str, Any]:
    """Canonical values (of one or several requests, concatenated) -> the arrays the pipeline reads."""
    out: dict[str, Any] = {}
    for r in rules:
        v = columns[r.column]
        if r.kind in NUMPY:  # dense: int64 (counts) or float64 (NaN: missing)
            out[r.column] = v if isinstance(v, np.ndarray) else np.array(v, NUMPY[r.kind])
        elif r.kind == CATEGORY:
            out[r.column] = pa.array(v, pa.string())
        elif r.kind == TOKENS:
            out[r.column] = pa.array(v, pa.list_(pa.string()))
        else:
            out[r.column] = pa.array(v, pa.list_(pa.int64()))
    return out
