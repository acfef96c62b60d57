"""The column rules of :mod:`ctrkit.data.pipeline.rules` applied to whole columns of raw rows (pyarrow /
numpy, no per-row Python): text, numbers, the float32 range, Criteo's 8-hex-digit keys, delimited tokens
and the arrow kind of a column (last-``max_len`` truncation: :func:`ctrkit.data.pipeline.collate.keep_last`).
A malformed value marks its row bad in a :class:`~ctrkit.data.pipeline.rows.BadRows`, with its raw column.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ctrkit.data.pipeline.rows import BadRows
from ctrkit.data.pipeline.rules import COUNT_LIMIT, COUNT_TEXT, F32_MAX, NUMBER, decode_hex8
from ctrkit.data.pipeline.vocab_keys import CodedKeys

_NUMBER = f"^{NUMBER}$"
_COUNT_OR_EMPTY = f"^({COUNT_TEXT})?$"
NOT_A_COUNT = "is not an integer (optional '-', at most 18 digits)"  # the block parser's reason, word for word


def to_string(col: pa.Array | np.ndarray, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows, name: str,
              column: str | None = None) -> pa.Array:
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
                 f"column {name!r} holds {what}, not a single value", bad_rows, column or name)
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
        bad.flag(np.array(invalid, np.int64), lines, f"column {name!r}: non-UTF-8 bytes", bad_rows, column or name)
        return pc.cast(pa.array(vals, pa.binary()), pa.string())


def numeric(col: pa.Array, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows, what: str,
            column: str | None = None) -> np.ndarray:
    """A column as float64 [n]; empty / null (and a float NaN, pandas' missing value) -> NaN. Non-numeric
    strings (``NUMBER``) and values that are not finite (inf, or text like "1e400" beyond float64) mark the
    row bad and read as NaN. ``what`` names the column in reasons ("dense 'I1'"), ``column`` is the raw one."""
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
        # unsafe: an integer beyond 2^53 becomes the nearest float64 instead of an error
        x = pc.cast(col, pa.float64(), safe=False).fill_null(math.nan).to_numpy(zero_copy_only=False)
    else:
        s = to_string(col, lines, bad_rows, bad, what, column)
        empty = pc.equal(pc.utf8_trim_whitespace(s.fill_null("")), "")
        ok = pc.or_(pc.match_substring_regex(s.fill_null(""), _NUMBER), empty).to_numpy(zero_copy_only=False)
        if not ok.all():
            bad.flag(~ok, lines, f"{what} is not a number", bad_rows, column)
        clean = pc.if_else(pc.or_(empty, pa.array(~ok)), pa.scalar(None, pa.string()), s)
        x = pc.cast(pc.utf8_trim_whitespace(clean), pa.float64()).fill_null(math.nan).to_numpy(zero_copy_only=False)
    inf = np.isinf(x)
    if inf.any():
        x = np.where(inf, math.nan, x)
        bad.flag(inf, lines, f"{what} is not finite (inf, or beyond the float64 range)", bad_rows, column)
    return x


def counts(col: Any, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows, what: str, column: str) -> np.ndarray:
    """Criteo's dense counts (the rule ``COUNT_TEXT``) as int64 [n], missing (empty / null, a float NaN) -> 0 as
    the block parser reads an empty field. Text must be an optional '-' and 1-18 digits; a number must be such
    an integer; anything else marks the row bad (read as 0)."""
    if isinstance(col, np.ndarray) and col.dtype.kind in "iu":  # the block parser's and the server's form
        x = col.astype(np.int64, copy=False)
        wrong = (x <= -COUNT_LIMIT) | (x >= COUNT_LIMIT)
    else:
        col = col if isinstance(col, pa.Array) else pa.array(col)
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
            f = pc.cast(col, pa.float64(), safe=False).fill_null(math.nan).to_numpy(zero_copy_only=False)
            with np.errstate(invalid="ignore"):
                wrong = ~np.isnan(f) & ~((np.floor(f) == f) & (np.abs(f) < COUNT_LIMIT))
            if pa.types.is_integer(col.type):  # exact, not through float64
                x = pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64)
            else:
                x = np.where(np.isnan(f) | wrong, 0, f).astype(np.int64)
        else:
            s = to_string(col, lines, bad_rows, bad, what, column).fill_null("")
            wrong = ~pc.match_substring_regex(s, _COUNT_OR_EMPTY).to_numpy(zero_copy_only=False)
            text = pc.if_else(pa.array(wrong), "", s)
            x = pc.cast(pc.if_else(pc.equal(text, ""), "0", text), pa.int64()).to_numpy(zero_copy_only=False)
    if wrong.any():
        bad.flag(wrong, lines, f"{what} {NOT_A_COUNT}", bad_rows, column)
        x = np.where(wrong, 0, x)
    return x


def within_f32(x: np.ndarray, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows, reason: str, column: str,
               fill: float) -> np.ndarray:
    """``x`` with values beyond +-float32 max (they would be +-inf in a store) replaced by ``fill``, their rows
    marked bad for ``reason``."""
    big = np.abs(x) > F32_MAX
    if big.any():
        bad.flag(big, lines, reason, bad_rows, column)
        x = np.where(big, fill, x)
    return x


def hex_keys(col: Any, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows, name: str) -> np.ndarray | CodedKeys:
    """Criteo categoricals -> 32-bit keys int64 [n], -1 = missing. Text must be empty or 8 hex digits
    (else the row is bad); a numpy integer array (or :class:`CodedKeys`, passed as they are) is the block
    parser's decoded keys (negative = missing). Raw
    integers (a pyarrow integer column: rows given as numbers) are not keys: the integer 12345678 is not the
    key the text "12345678" names, so such a row is bad, as it is in a file and at the server."""
    if isinstance(col, CodedKeys):  # the block parser's, factorized
        return col
    if isinstance(col, np.ndarray) and col.dtype.kind in "iu":
        return col.astype(np.int64, copy=False)
    if isinstance(col, pa.Array) and (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        bad.flag(col.is_valid().to_numpy(zero_copy_only=False), lines, f"categorical {name!r} is a number, not "
                 "8 hex digits in text", bad_rows, name)
        return np.full(len(col), -1, np.int64)
    s = to_string(col if isinstance(col, pa.Array) else pa.array(col, pa.string()), lines, bad_rows, bad, name)
    s = s.cast(pa.string()).fill_null("")  # 32-bit offsets (large_string has 64-bit ones), read below
    n8 = pc.equal(pc.binary_length(s), 8).to_numpy(zero_copy_only=False)
    empty = pc.equal(pc.binary_length(s), 0).to_numpy(zero_copy_only=False)
    keys = np.full(len(s), -1, np.int64)
    idx = np.flatnonzero(n8)
    if len(idx):
        f = s.filter(pa.array(n8))  # every value 8 bytes long: the data buffer is an (m, 8) byte matrix
        offs = np.frombuffer(f.buffers()[1], np.int32)[f.offset: f.offset + len(f) + 1]
        decoded, ok = decode_hex8(np.frombuffer(f.buffers()[2], np.uint8)[offs[0]: offs[-1]].reshape(-1, 8))
        keys[idx[ok]] = decoded[ok]
        n8[idx[~ok]] = False
    bad.flag(~n8 & ~empty, lines, f"categorical {name!r} is not empty or 8 hex digits", bad_rows, name)
    return keys


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
                     bad_rows, name)
    return _kept_tokens(flat, parent, len(col), bad_rows)


def list_tokens(col: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A list column whose values were already checked against its rule (the server's canonical lists of strings
    or integers, :mod:`ctrkit.serving.validation`) -> (flat values, lengths [n]) as :func:`tokens` gives them
    (text trimmed, empty and null tokens dropped), without checking a value again."""
    lst = col.fill_null(pa.scalar([], col.type))
    parent = pc.list_parent_indices(lst).to_numpy(zero_copy_only=False).astype(np.int64)
    return _kept_tokens(pc.list_flatten(lst), parent, len(col), None)


def _kept_tokens(flat: pa.Array, parent: np.ndarray, n: int,
                 bad_rows: np.ndarray | None) -> tuple[pa.Array, np.ndarray]:
    """(tokens, their rows) -> (the non-empty tokens of the good rows, text trimmed; lengths [n])."""
    keep = flat.is_valid()
    if pa.types.is_string(flat.type):
        flat = pc.utf8_trim_whitespace(flat)
        keep = pc.and_(keep, pc.not_equal(pc.utf8_length(flat), 0))
    keep = keep.fill_null(False).to_numpy(zero_copy_only=False)
    if bad_rows is not None:
        keep = keep & ~bad_rows[parent]
    if not keep.all():
        flat, parent = flat.filter(pa.array(keep)), parent[keep]
    lengths = np.bincount(parent, minlength=n).astype(np.int64)
    return flat, lengths


def kind_of(col: pa.Array) -> str:
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return "int" if pa.types.is_integer(t) else "str"


def is_list_or_int(col: pa.Array) -> bool:
    t = col.type
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_integer(t)
