"""The column rules of :mod:`ctrkit.data.pipeline.rules` applied to one JSON value at a time: what the server's
request validation (:mod:`ctrkit.serving.validation`) reads each value of a request with.

:func:`reader` gives, per :class:`~ctrkit.data.pipeline.rules.ColumnRule`, a function from one JSON value to
its canonical form (the form whose pipeline reading does not depend on the values beside it), raising
:class:`Refused` with the reason otherwise; :mod:`ctrkit.data.pipeline.json_columns` reads whole columns at
once when every value is of the usual JSON type and well-formed (the same canonical values, tested). Both take
the rules' constants (``NUMBER``, ``COUNT_TEXT``, ``F32_MAX`` through ``ColumnRule.bound``, the hex digits), so a value the server
accepts is one the encoder reads without error, and a value it refuses is a bad row there (tested by
``tests/serving/test_rules_agree.py``).

=====================  ===============================================  =========================================
column                 accepted JSON values                             canonical value
=====================  ===============================================  =========================================
dense                  number, numeric string (``"3"``, ``" 1e-3 "``),  float, NaN = missing (the pipeline reads
                       ``""`` or null (missing); finite only            it as 0 before its transform); a column
                                                                        of integers and nulls: int, null -> 0
Criteo count           an integer of at most 18 digits: a JSON number   int (missing -> 0, as the block parser
(I1..I13)              of that value, or its text (``"42"``, ``"-1"``;  reads an empty field)
                       no ``+``, point, exponent or space), ``""`` or
                       null (missing): what a Criteo file may hold
Criteo categorical     8 hex digits in a string, ``""`` or null         int key (-1 = missing): the block
                       (missing); not an integer (12345678 would not    parser's form, the pipeline's fast path
                       be the key the text ``"12345678"`` names)
table categorical      string, integer (or an integral float), null     str or None
multi-valued /         list of strings / integers, a delimited string   list[str] (tokens trimmed and empty ones
sequence               (the spec's delimiter), or null (no values)      dropped later by the pipeline)
``ids`` pipeline       integer id in [0, table size), null (= id 0);    int; list[int]
                       a list of such ids for multi-valued columns
=====================  ===============================================  =========================================
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from ctrkit.data.pipeline.rules import (
    CATEGORY,
    COUNT,
    COUNT_LIMIT,
    COUNT_TEXT,
    DENSE,
    HEX,
    ID,
    ID_TOKENS,
    NUMBER,
    TOKENS,
    ColumnRule,
)

_NUMBER = re.compile(NUMBER)
_COUNT = re.compile(COUNT_TEXT)
_HEX8 = re.compile("[0-9a-fA-F]{8}")


class NonFinite:
    """A ``NaN`` / ``Infinity`` / ``-Infinity`` token of a request body: not a number any rule accepts."""

    __slots__ = ("token",)

    def __init__(self, token: str) -> None:
        self.token = token


class Refused(Exception):
    """A value a rule refuses; the message completes "field 'x' ..." (an empty one: the caller words it)."""



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


# ---- one value -> its canonical form --------------------------------------------------------------------------------------
def _dense(v: Any) -> float:
    t = type(v)
    if t is float:
        if v - v == 0.0:  # finite (inf - inf and nan - nan are nan)
            return v
        raise Refused(f"is {describe(v)}; send a finite number, or null for a missing value")
    if t is int:
        try:
            return float(v)
        except OverflowError:
            raise Refused("is an integer too large for a 64-bit float; send a smaller number") from None
    if v is None:
        return math.nan
    if t is str:
        if not v.strip():
            return math.nan
        if _NUMBER.fullmatch(v):
            x = float(v)
            if x - x == 0.0:
                return x
            raise Refused(f"is {describe(v)}, too large for a 64-bit float; send a smaller number")
    if isinstance(v, NonFinite):
        raise Refused(f"is {v.token}, not a finite number (JSON has no NaN / Infinity); send a finite number, or "
                   "null for a missing value")
    raise Refused(f"must be a number, a numeric string, \"\" or null (missing); got {describe(v)}")


def _dense_within(bound: float) -> Callable[[Any], float]:
    if bound == math.inf:
        return _dense

    def read(v: Any) -> float:
        x = _dense(v)
        if -bound <= x <= bound or math.isnan(x):  # NaN: missing
            return x
        raise Refused(f"is {describe(v)}, beyond the float32 range the model reads (|value| <= {bound:.4g}); send "
                   "a smaller number")

    return read


def _hex(v: Any) -> int:
    if type(v) is str:
        if not v:
            return -1
        if _HEX8.fullmatch(v):
            return int(v, 16)
    elif v is None:
        return -1
    raise Refused(f"must be 8 hex digits in a string (e.g. \"68fd1e64\"), \"\" or null (missing); got {describe(v)}")


def _count(v: Any) -> int:
    """A Criteo count (``COUNT_TEXT``; a number whose value is such an integer) -> int, missing -> 0 (as the block
    parser reads an empty field)."""
    t = type(v)
    if t is str:
        if not v:
            return 0
        if _COUNT.fullmatch(v):
            return int(v)
    elif v is None:
        return 0
    elif t is int or (t is float and v - v == 0.0 and v == int(v)):
        if -COUNT_LIMIT < v < COUNT_LIMIT:
            return int(v)
        raise Refused(f"is {describe(v)}, more than 18 digits; a Criteo count has at most 18")
    raise Refused("must be an integer of at most 18 digits (a JSON integer, or its digits in a string: \"42\", "
                  f"\"-1\"), \"\" or null (missing); got {describe(v)}")


def _utf8(s: str) -> str:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise Refused(f"holds a lone UTF-16 surrogate ({describe(s)}), which is not Unicode text; "
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
    raise Refused


def _category(v: Any) -> str | None:
    try:
        return _token(v)
    except Refused as e:
        if e.args:
            raise
        raise Refused(f"must be a string, an integer or null (missing); got {describe(v)}") from None


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
                except Refused as e:
                    if e.args:
                        raise
                    raise Refused(f"item {i} must be a string or an integer; got {describe(item)}") from None
                if tok is not None:
                    out.append(tok)
            return out
        raise Refused(f"must be a list of strings / integers, a {delimiter!r}-delimited string or null (no values); "
                   f"got {describe(v)}")

    return read


def _id(size: int) -> Callable[[Any], int]:
    def read(v: Any) -> int:
        if type(v) is int and 0 <= v < size:
            return v
        if v is None:
            return 0
        raise Refused(f"must be an integer id in [0, {size}) or null (id 0, missing); got {describe(v)}")

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
                    raise Refused(f"item {i} must be an integer id in [0, {size}); got {describe(x)}")
            return out
        raise Refused(f"must be a list of integer ids in [0, {size}) or null (no values); got {describe(v)}")

    return read


def reader(rule: ColumnRule) -> Callable[[Any], Any]:
    """The per-value reader of ``rule``: one JSON value -> its canonical value, or :class:`Refused`."""
    return {DENSE: lambda: _dense_within(rule.bound), COUNT: lambda: _count, HEX: lambda: _hex,
            CATEGORY: lambda: _category,
            TOKENS: lambda: _tokens(rule.delimiter), ID: lambda: _id(rule.table_size),
            ID_TOKENS: lambda: _id_tokens(rule.table_size)}[rule.kind]()
