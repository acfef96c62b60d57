"""Per-column value rules applied to every batch of raw rows: text, numbers, delimited tokens,
last-``max_len`` truncation and the arrow kind of a column; malformed values are counted as bad rows.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ctrkit.data.pipeline.rows import BadRows

_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"


def to_string(col: pa.Array | np.ndarray, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows, name: str) -> pa.Array:
    """A column as text: binary -> string, numbers -> their text. Rows holding invalid UTF-8, or a value
    that is no single value (a list, a mapping: rows given as dicts of nested data) are marked bad and read
    as null (a per-value check only on failure)."""
    if isinstance(col, np.ndarray):  # integers kept as numpy (encode._normal's fast path)
        col = pa.array(col)
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return col
    if not pa.types.is_binary(t):
        if not pa.types.is_nested(t):
            try:
                return pc.cast(col, pa.string())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
        what = "a list or mapping" if pa.types.is_nested(t) else f"a {t} value"
        bad.flag(col.is_valid().to_numpy(zero_copy_only=False), lines,
                 f"column {name!r} holds {what}, not a single value", bad_rows)
        return pa.nulls(len(col), pa.string())
    try:
        return pc.cast(col, pa.string())
    except pa.ArrowInvalid:
        vals = col.to_pylist()
        invalid = []
        for i, v in enumerate(vals):  # error path only
            try:
                v is None or v.decode("utf-8")
            except UnicodeDecodeError:
                invalid.append(i)
                vals[i] = b""
        bad.flag(np.array(invalid, np.int64), lines, f"column {name!r}: non-UTF-8 bytes", bad_rows)
        return pc.cast(pa.array(vals, pa.binary()), pa.string())


def numeric(col: pa.Array, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows, what: str) -> np.ndarray:
    """A column as float64 [n]; empty / null (and a float NaN, pandas' missing value) -> NaN. Non-numeric
    strings and values that are not finite (inf, or text like "1e400" beyond float64) mark the row bad and
    read as NaN."""
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
        # unsafe: an integer beyond 2^53 becomes the nearest float64 instead of an error
        x = pc.cast(col, pa.float64(), safe=False).fill_null(math.nan).to_numpy(zero_copy_only=False)
    else:
        s = to_string(col, lines, bad_rows, bad, what)
        empty = pc.equal(pc.utf8_trim_whitespace(s.fill_null("")), "")
        ok = pc.or_(pc.match_substring_regex(s.fill_null(""), _NUMBER), empty).to_numpy(zero_copy_only=False)
        if not ok.all():
            bad.flag(~ok, lines, f"{what} is not a number", bad_rows)
        clean = pc.if_else(pc.or_(empty, pa.array(~ok)), pa.scalar(None, pa.string()), s)
        x = pc.cast(pc.utf8_trim_whitespace(clean), pa.float64()).fill_null(math.nan).to_numpy(zero_copy_only=False)
    inf = np.isinf(x)
    if inf.any():
        x = np.where(inf, math.nan, x)
        bad.flag(inf, lines, f"{what} is not finite (inf, or beyond the float64 range)", bad_rows)
    return x


def tokens(col: pa.Array | np.ndarray, delimiter: str, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows,
           name: str) -> tuple[pa.Array, np.ndarray]:
    """A multi-valued column (delimited string or list) -> (flat values, lengths [n]); empty and null tokens
    dropped. Tokens are integers or text (list items of other types are read as text); a row whose list holds
    lists or mappings, or non-UTF-8 bytes, is marked bad and gets no tokens."""
    if isinstance(col, pa.Array) and (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        lst = col.fill_null(pa.scalar([], col.type))
    else:
        s = to_string(col, lines, bad_rows, bad, name).fill_null("")
        lst = pc.split_pattern(s, delimiter)
    flat = pc.list_flatten(lst)
    parent = pc.list_parent_indices(lst).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_floating(flat.type):
        try:  # integer ids that came as floats
            flat = pc.cast(flat, pa.int64())
        except pa.ArrowInvalid:
            pass
    if not (pa.types.is_integer(flat.type) or pa.types.is_string(flat.type)):
        scratch = np.zeros(len(flat), bool)
        flat = to_string(flat, parent, scratch, BadRows(name, keep=0), name)  # token-level check ...
        if scratch.any():  # ... reported per row
            bad.flag(np.unique(parent[scratch]), lines, f"column {name!r} holds nested lists or non-UTF-8 bytes",
                     bad_rows)
    keep = flat.is_valid()
    if pa.types.is_string(flat.type):
        flat = pc.utf8_trim_whitespace(flat)
        keep = pc.and_(keep, pc.not_equal(pc.utf8_length(flat), 0))
    keep = keep.fill_null(False).to_numpy(zero_copy_only=False) & ~bad_rows[parent]
    if not keep.all():
        flat, parent = flat.filter(pa.array(keep)), parent[keep]
    lengths = np.bincount(parent, minlength=len(col)).astype(np.int64)
    return flat, lengths


def keep_last(values: np.ndarray, lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the last ``max_len`` values of every row of a jagged column."""
    if len(lengths) == 0 or lengths.max(initial=0) <= max_len:
        return values, lengths
    ends = np.cumsum(lengths)
    row = np.repeat(np.arange(len(lengths)), lengths)
    keep = (ends[row] - np.arange(len(values))) <= max_len
    return values[keep], np.minimum(lengths, max_len)


def kind_of(col: pa.Array) -> str:
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return "int" if pa.types.is_integer(t) else "str"


def is_list_or_int(col: pa.Array) -> bool:
    t = col.type
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_integer(t)
