"""Whole columns of an Arrow request body read at once: the server's fast path for Arrow IPC requests.

A request sent as an Arrow IPC stream (``Content-Type: application/vnd.apache.arrow.stream``) arrives as typed
columns, not Python objects. The columns whose Arrow type is the usual one for their rule and whose values are
all well-formed are read here from their buffers, with no Python object per value; any other column goes
through ``to_pylist`` and the JSON columns' path (:mod:`ctrkit.data.pipeline.json_columns`, then the per-value
readers of :mod:`ctrkit.data.pipeline.values`), which gives it the canonical values a JSON body's column of the
same values gets, or names its bad values by row and field. So a column given here is always the one the
per-value readers give for its Python values (tested: ``tests/data/test_arrow_columns.py``).

========  ===============================================  =================================
kind      read here when the column is                     canonical column
========  ===============================================  =================================
count     integers (any width) or all null, |v| < 10^18     int64 [n], null -> 0
hex       strings of 8 hex digits, "" or null               int64 keys [n], -1 = missing
id        integers in [0, table size) or null               int64 [n], null -> 0
dense     integers                                          int64 [n], null -> 0
          floats, finite and within the rule's bound        float64 [n], null -> NaN
========  ===============================================  =================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ctrkit.data.pipeline.json_columns import hex_keys, read_blocks
from ctrkit.data.pipeline.rules import COUNT, COUNT_LIMIT, DENSE, HEX, ID, ColumnRule


def _int64(a: pa.Array) -> np.ndarray | None:
    """int64 [n] of an integer (or all-null) array, null -> 0; None for another type or a uint64 beyond int64.
    Read from the values buffer (pyarrow's fill_null costs ~10 us a call)."""
    if pa.types.is_null(a.type):
        return np.zeros(len(a), np.int64)
    if not pa.types.is_integer(a.type):
        return None
    if a.type != pa.int64():
        try:
            a = a.cast(pa.int64())  # safe: refuses a uint64 value beyond int64
        except pa.ArrowInvalid:
            return None
    x = np.frombuffer(a.buffers()[1], np.int64, len(a), 8 * a.offset) if len(a) else np.zeros(0, np.int64)
    return np.where(a.is_null().to_numpy(zero_copy_only=False), 0, x) if a.null_count else x.copy()


def _joined(arrays: Sequence[pa.Array]) -> pa.Array | None:
    """The arrays one after another (one array of their type), or None when their types differ."""
    if len(arrays) == 1:
        return arrays[0]
    return pa.concat_arrays(arrays) if all(a.type == arrays[0].type for a in arrays) else None


def _counts(rules: Sequence[ColumnRule], arrays: Sequence[pa.Array]) -> np.ndarray | None:
    """(k, n) int64 of k count columns: integers with |v| < 10^18, null -> 0."""
    a = _joined(arrays)
    x = _int64(a) if a is not None else None
    return x.reshape(len(arrays), -1) if x is not None and ((x > -COUNT_LIMIT) & (x < COUNT_LIMIT)).all() else None


def _ids(rules: Sequence[ColumnRule], arrays: Sequence[pa.Array]) -> np.ndarray | None:
    """(k, n) int64 of k id columns: integers in [0, table size), null -> 0."""
    a = _joined(arrays)
    x = _int64(a) if a is not None else None
    if x is None:
        return None
    x = x.reshape(len(arrays), -1)
    size = np.array([r.table_size for r in rules], np.int64)[:, None]  # (k, 1)
    return x if ((x >= 0) & (x < size)).all() else None


def _hex(rules: Sequence[ColumnRule], arrays: Sequence[pa.Array]) -> np.ndarray | None:
    """(k, n) int64 keys of k hex columns: strings of 8 hex digits, "" or null (-1: missing)."""
    a = _joined(arrays)
    if a is None or not (pa.types.is_string(a.type) or pa.types.is_large_string(a.type)):
        return None
    keys = hex_keys(a)
    return keys.reshape(len(arrays), -1) if keys is not None else None


def _dense(rule: ColumnRule, a: pa.Array) -> np.ndarray | None:
    """int64 of an integer column (null -> 0, as a JSON body's column of integers), float64 of a float column
    (null -> NaN) whose values are finite (a NaN value is not a null) and within the rule's bound."""
    if not pa.types.is_floating(a.type):
        return _int64(a)
    x = a.cast(pa.float64()).to_numpy(zero_copy_only=False)  # null -> NaN
    with np.errstate(invalid="ignore"):
        if np.isinf(x).any() or (rule.bound < math.inf and (np.abs(x) > rule.bound).any()):
            return None
    if int(np.isnan(x).sum()) != a.null_count:  # a NaN value, not a null: refused by the per-value reader
        return None
    return x


# kinds read together: (their rules, their arrays) -> the (k, n) canonical block, or None
_BLOCKS = {COUNT: _counts, HEX: _hex, ID: _ids}


def arrow_columns(rules: Sequence[ColumnRule], columns: dict[str, pa.Array]) -> dict[str, Any]:
    """{column: canonical column} of the columns of ``rules`` (``columns``: one pyarrow array per rule's column)
    that are of the usual Arrow type and all well-formed (see the module docstring); the others are left out.
    The columns of one kind (and one Arrow type) are read together; when that fails, each alone, so only the
    columns that hold a bad value (or another type) are left out."""
    out = read_blocks(_BLOCKS, rules, columns)
    for r in rules:
        if r.kind == DENSE and (col := _dense(r, columns[r.column])) is not None:
            out[r.column] = col
    return out
