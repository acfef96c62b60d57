"""Whole columns of JSON values read at once: the fast path of the server's request validation.

A request's values arrive as Python objects (a parsed JSON body). :mod:`ctrkit.data.pipeline.values` reads them
one at a time, which names every bad value but costs Python work per value (about 4,000 per 100-row Criteo
request). Here the columns of one kind are read together, in C: all Criteo counts of a request in one pyarrow
conversion (the type of every value checked by pyarrow's type inference), all its Criteo keys in another (the
8-hex-digit rule applied to the whole byte buffer by :func:`~ctrkit.data.pipeline.rules.decode_hex8`). When
every value is of the usual JSON type and well-formed, :func:`fast_columns` gives the canonical column; when
not, it leaves the column out, and the caller reads that column value by value, which finds and names the bad
values. So a column given here is always the one the per-value readers give (tested:
``tests/data/test_json_columns.py``), and a request with a bad value pays the slow path only for the columns
that hold one.

========  =========================================================  ==================================
kind      read together when every value is                          canonical column
========  =========================================================  ==================================
count     a JSON integer or null, |value| < 10^18                    int64 [n], null -> 0
hex       8 hex digits in a string, ``""`` or null                   int64 keys [n], -1 = missing
id        a JSON integer in [0, table size) or null                  int64 [n], null -> 0
dense     (one column at a time) numbers: integers and null only     int64 [n], null -> 0
          -> int64; otherwise finite numbers within the rule's       float64 [n], null -> NaN
          bound
category  (one column at a time) ASCII strings or null               the values as given
========  =========================================================  ==================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from ctrkit.data.pipeline.rules import CATEGORY, COUNT, COUNT_LIMIT, DENSE, HEX, ID, ColumnRule, decode_hex8

NUMPY = {DENSE: np.float64, COUNT: np.int64, HEX: np.int64, ID: np.int64}  # kinds whose canonical column is numpy
_NONE = type(None)
_INTEGERS, _NUMBERS, _TEXT = {int, _NONE}, {int, float, _NONE}, {str, _NONE}
# what pyarrow raises for a value it cannot convert (a wrong type, an integer beyond 64 bits, a lone surrogate)
_UNCONVERTIBLE = (pa.ArrowException, OverflowError, TypeError, ValueError)


def _inferred(columns: Sequence[Sequence[Any]], type: pa.DataType | None = None) -> pa.Array | None:
    """The values of ``columns`` one after another as one pyarrow array of the type pyarrow infers (int64 for
    Python ints, string for str, null when all are None; a bool, float, list, object or sentinel gives another
    type or an error) or of ``type`` (string: only str and None convert, of a JSON parser's values), or None
    when pyarrow cannot convert them."""
    flat = list(chain.from_iterable(columns))
    try:
        a = pa.array(flat, type)
    except _UNCONVERTIBLE:
        return None
    return a if isinstance(a, pa.Array) else None


def _integers(columns: Sequence[Sequence[Any]]) -> np.ndarray | None:
    """(k, n) int64 of k columns of n values when every value is a JSON integer or null (null -> 0)."""
    a = _inferred(columns)
    if a is None or a.type not in (pa.int64(), pa.null()):
        return None
    x = np.zeros(len(a), np.int64) if a.type == pa.null() else a.fill_null(0).to_numpy()
    return x.reshape(len(columns), -1)


def _counts(rules: Sequence[ColumnRule], columns: Sequence[Sequence[Any]]) -> np.ndarray | None:
    x = _integers(columns)
    return x if x is not None and ((x > -COUNT_LIMIT) & (x < COUNT_LIMIT)).all() else None


def _ids(rules: Sequence[ColumnRule], columns: Sequence[Sequence[Any]]) -> np.ndarray | None:
    x = _integers(columns)
    size = np.array([r.table_size for r in rules], np.int64)[:, None]  # (k, 1)
    return x if x is not None and ((x >= 0) & (x < size)).all() else None


def _hex_keys(rules: Sequence[ColumnRule], columns: Sequence[Sequence[Any]]) -> np.ndarray | None:
    """(k, n) int64 keys (-1: missing) when every value is 8 hex digits in a string, "" or null."""
    a = _inferred(columns, pa.string())
    keys = hex_keys(a) if a is not None else None
    return keys.reshape(len(columns), -1) if keys is not None else None


def hex_keys(a: pa.Array) -> np.ndarray | None:
    """int64 keys [n] (-1: missing) of a pyarrow string (or large_string) array whose values are all 8 hex
    digits, "" or null; None when one is not. Reads the array's byte buffer in place."""
    keys = np.full(len(a), -1, np.int64)
    if len(a):
        wide = pa.types.is_large_string(a.type)
        offsets = np.frombuffer(a.buffers()[1], np.int64 if wide else np.int32, len(a) + 1,
                                (8 if wide else 4) * a.offset)
        lengths = np.diff(offsets)  # null and "": 0 (missing)
        if a.null_count and lengths[~a.is_valid().to_numpy(zero_copy_only=False)].any():
            return None  # a null holding bytes (Arrow allows it; another writer's array): read value by value
        present = lengths == 8
        if not (present | (lengths == 0)).all():
            return None
        if present.any():  # the present values, 8 bytes each, lie one after another in the data buffer
            data = np.frombuffer(a.buffers()[2], np.uint8, int(offsets[-1] - offsets[0]), int(offsets[0]))
            decoded, ok = decode_hex8(data.reshape(-1, 8))
            if not ok.all():
                return None
            keys[present] = decoded
    return keys


# kinds read together: (their rules, their columns) -> the (k, n) canonical block, or None
_BLOCKS: dict[str, Callable[[Sequence[ColumnRule], Sequence[Sequence[Any]]], np.ndarray | None]] = {
    COUNT: _counts, HEX: _hex_keys, ID: _ids}


def read_blocks(blocks: dict[str, Callable[[Sequence[ColumnRule], Sequence[Any]], np.ndarray | None]],
                rules: Sequence[ColumnRule], columns: dict[str, Any]) -> dict[str, Any]:
    """{column: canonical column} of the kinds in ``blocks`` (kind -> a reader of that kind's rules and columns
    into a (k, n) block, or None): the columns of one kind read together; when that fails, each alone, so only
    the columns that hold a bad value (or an unusual type) are left out. Shared by the JSON and Arrow bodies."""
    out: dict[str, Any] = {}
    for kind, read in blocks.items():
        group = [r for r in rules if r.kind == kind]
        if not group:
            continue
        block = read(group, [columns[r.column] for r in group])
        if block is not None:
            out.update({r.column: block[j] for j, r in enumerate(group)})
            continue
        for r in group if len(group) > 1 else ():
            one = read([r], [columns[r.column]])
            if one is not None:
                out[r.column] = one[0]
    return out


def fast_columns(rules: Sequence[ColumnRule], values: dict[str, Sequence[Any]]) -> dict[str, Any]:
    """{column: canonical column} of the columns of ``rules`` (their ``values``: one JSON value per row) whose
    values are all of the usual JSON type and well-formed (see the module docstring); the other columns are
    left out. The columns of one kind are read together; when that fails (a bad value in one of them), each
    alone, so only the columns that hold a bad value are left out."""
    out = read_blocks(_BLOCKS, rules, values)
    for r in rules:
        if r.column not in out and r.kind in (DENSE, CATEGORY):
            col = _dense(r, values[r.column]) if r.kind == DENSE else _category(values[r.column])
            if col is not None:
                out[r.column] = col
    return out


def _dense(rule: ColumnRule, vals: Sequence[Any]) -> np.ndarray | None:
    """A dense column of JSON numbers: int64 when all are integers or null (null -> 0, as the pipeline reads a
    missing value), else float64 (null -> NaN) when every number is finite and within the rule's bound."""
    types = set(map(type, vals))
    if types <= _INTEGERS:
        x = _integers([vals])
        if x is not None:
            return x[0]
    if not types <= _NUMBERS:
        return None
    try:
        x = np.array(vals, np.float64)  # null -> NaN (missing)
    except OverflowError:  # an integer beyond float64
        return None
    with np.errstate(invalid="ignore"):
        if np.isinf(x).any() or (rule.bound < math.inf and (np.abs(x) > rule.bound).any()):
            return None
    if float in types and int(np.isnan(x).sum()) != vals.count(None):  # a float NaN (not a null) is refused
        return None
    return x


def _category(vals: Sequence[Any]) -> list[Any] | None:
    """A categorical column of ASCII strings and nulls, as given."""
    types = set(map(type, vals))
    if not types <= _TEXT:
        return None
    strs = [v for v in vals if v is not None] if _NONE in types else vals
    return list(vals) if "".join(strs).isascii() else None
