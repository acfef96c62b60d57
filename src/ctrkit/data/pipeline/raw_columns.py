"""Raw rows in any of the forms the pipeline takes (a pyarrow Table, a pandas DataFrame, a list of dicts, a dict
of columns) -> one column form the column rules read (:func:`as_columns`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ctrkit.data.pipeline.vocab_keys import CodedKeys
from ctrkit.errors import DataError

Raw = Any  # pa.Table | pandas.DataFrame | list[dict] | Mapping[str, pa.Array | np.ndarray | (values, lengths)]

_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError)


def as_columns(raw: Raw) -> dict[str, Any]:
    """Raw rows -> {column: pyarrow array | integer numpy array | (values, lengths)}, every column in the
    one form the parsers read (:func:`_normal`). A column of mixed types (rows as dicts, a pandas object
    column) is read as text, then validated like any text column."""
    if isinstance(raw, pa.RecordBatch):
        raw = pa.Table.from_batches([raw])
    if isinstance(raw, pa.Table):
        cols = {c: _normal(raw.column(c), c) for c in raw.column_names}
    elif type(raw).__module__.split(".")[0] == "pandas":
        try:
            return as_columns(pa.Table.from_pandas(raw, preserve_index=False))
        except _ARROW_ERRORS:  # an object column of mixed types: column by column, mixed ones as text
            cols = {str(c): _normal(raw[c].tolist(), c) for c in raw.columns}
    elif isinstance(raw, list):  # rows as dicts
        wrong = next((i for i, r in enumerate(raw) if not isinstance(r, Mapping)), None)
        if wrong is not None:
            raise DataError(f"row {wrong + 1} is a {type(raw[wrong]).__name__}, not a mapping of column -> value; "
                            "give rows as dicts")
        names = list(dict.fromkeys(k for r in raw for k in r))
        cols = {k: _normal([r.get(k) for r in raw], k) for k in names}
    elif isinstance(raw, Mapping):
        cols = {k: _jagged(v, k) if isinstance(v, tuple) else _normal(v, k) for k, v in raw.items()}
    else:
        raise DataError(f"cannot read rows from a {type(raw).__name__}; give a pyarrow Table, a pandas DataFrame, "
                        "a list of dicts or a dict of columns")
    sizes = {k: len(v[1]) if isinstance(v, tuple) else len(v) for k, v in cols.items()}
    if len(set(sizes.values())) > 1:
        raise DataError(f"columns have different numbers of rows: {sizes}; give every column one value per row")
    return cols


def _normal(col: Any, name: Any = "?") -> Any:
    """One column in the form the parsers read, whatever produced it (CSV reader, pandas >= 3, Polars,
    Parquet, numpy, a list): integer numpy arrays stay as they are (the Criteo block parser's fast path);
    anything else becomes one pyarrow array with 32-bit offsets (large_string -> string, large_list -> list,
    also inside lists) and no dictionary encoding (pandas categoricals); numpy NaN / None become nulls."""
    if isinstance(col, CodedKeys):  # integer keys the Criteo block parser factorized
        return col
    if isinstance(col, np.ndarray):
        if col.ndim != 1:
            raise DataError(f"column {name!r} is a {col.ndim}-d array of shape {col.shape}; give one value per row")
        if col.dtype.kind in "iu":
            return col
        col = _array(col)
    elif isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    elif not isinstance(col, pa.Array):
        col = _array(col)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    small = _small_offsets(col.type)
    return col if small == col.type else col.cast(small)


def _jagged(col: tuple, name: Any) -> tuple[Any, np.ndarray]:
    """A jagged column given as (values [nnz], lengths [n]), checked."""
    if len(col) != 2:
        raise DataError(f"column {name!r}: a tuple column is (values, lengths), got {len(col)} items")
    values, lengths = col
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or (lengths < 0).any() or lengths.sum() != len(values):
        raise DataError(f"column {name!r}: (values, lengths) needs non-negative integer lengths that sum to the "
                        f"{len(values)} values")
    return values, lengths.astype(np.int64)


def _small_offsets(t: pa.DataType) -> pa.DataType:
    """``t`` with every large (64-bit offset) string / binary / list type replaced by its 32-bit twin."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_small_offsets(t.value_type))
    if pa.types.is_dictionary(t):
        return _small_offsets(t.value_type)
    return t


def _array(values: Any) -> pa.Array:
    """Values of one column -> pyarrow; float NaN is a missing value, like None. Values of mixed types (that
    pyarrow cannot hold in one type: 1 and "a", a list and a number, an integer beyond 64 bits) -> text."""
    try:
        return pa.array(values, from_pandas=True)
    except UnicodeEncodeError:  # a str holding a lone surrogate is no text: as bytes, its row is bad (to_string)
        return _array([_surrogates_as_bytes(v) for v in values])
    except _ARROW_ERRORS:
        text = [None if v is None or (isinstance(v, float) and math.isnan(v)) else
                v if isinstance(v, bytes) else _surrogates_as_bytes(str(v)) for v in values]
        if any(isinstance(t, bytes) for t in text):
            return pa.array([t.encode() if isinstance(t, str) else t for t in text], pa.binary())
        return pa.array(text, pa.string())


def _surrogates_as_bytes(v: Any) -> Any:
    """``v`` with every str (also inside lists) that is not valid Unicode (a lone surrogate) as its bytes."""
    if isinstance(v, str) and not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return v.encode("utf-8", "surrogatepass")
    if isinstance(v, list):
        return [_surrogates_as_bytes(x) for x in v]
    return v
