"""Criteo TSV block parser: decompressed bytes -> label, raw dense integers and 32-bit categorical keys.

Lines are tokenised by numpy on whole blocks (tab / newline positions -> a [rows, 40] matrix of field
starts); each 8-hex-digit field and each integer of up to 8 digits is read as one unaligned
little-endian uint64 and decoded with SWAR bit arithmetic, so no Python runs per field or per row.
Malformed lines are reported back with their reason, not raised. Used by :mod:`ctrkit.data.sources.criteo`.
The value rules are those of :mod:`ctrkit.data.pipeline.rules` (``COUNT_TEXT`` for I1..I13, 8 hex digits for
C1..C26), which the server's validation and the in-memory encoder apply too (``tests/serving/test_rules_agree.py``
checks the three agree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from pandas._libs import hashtable as _pd_hashtable

from ctrkit.data.pipeline.rules import COUNT_DIGITS
from ctrkit.data.pipeline.vocab_keys import CodedKeys

NUM_DENSE, NUM_SPARSE = 13, 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
DENSE_CLAMP = -2.0

# ---- SWAR constants (8 ASCII bytes in one little-endian uint64; byte 0 = first character) ------------
_U = np.uint64
_H = _U(0x8080808080808080)
_ONES = 0x0101010101010101
_LOWER = _U(0x20 * _ONES)  # set in every byte of '0'..'9' and 'a'..'f'
_MISSING_RAW = np.int64(0x0A0A0A0A0A0A0A0A)  # 8 newlines: no field holds them; stands for an empty field
_DENSE_LUT_SIZE = 1 << 16
with np.errstate(divide="ignore"):
    _LOG_LUT = np.log(np.arange(_DENSE_LUT_SIZE, dtype=np.float64))  # ln(x + 3) indexed by x + 3
_LOG_LUT = np.maximum(_LOG_LUT, DENSE_CLAMP).astype(np.float32)


_SLICE = 1 << 13  # elements per SWAR pass: temporaries stay in cache (2-4x faster than whole blocks)


def _sliced(fn: Any, *arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Apply a SWAR decoder to cache-sized slices of ``arrays`` -> (int64 values [m], ok [m])."""
    m = len(arrays[0])
    if m <= _SLICE:
        return fn(*arrays)
    val, ok = np.empty(m, np.int64), np.empty(m, bool)
    for i in range(0, m, _SLICE):
        val[i:i + _SLICE], ok[i:i + _SLICE] = fn(*(a[i:i + _SLICE] for a in arrays))
    return val, ok


def _swar_decimal(x: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode decimal fields of ``n`` [m] (0..8) digits whose bytes start ``x`` [m] uint64 -> (value, ok).

    Right-aligns the digits into "000ddddd", checks every byte is '0'..'9', then combines digit
    pairs, quads and octets with multiply-add (x*10 + x>>8, x*100 + x>>16, x*10^4 + x>>32).
    """
    n8 = n.astype(np.uint64)
    n8 <<= _U(3)  # 8n bits of digits
    x <<= _U(64) - n8  # drops the bytes after the digits (numpy shifts of >= 64 bits give 0: n = 0 -> 0)
    x |= _U(0x3030303030303030) >> n8  # '0' in the low 8 - n bytes
    bad = x + _U(0x46 * _ONES)  # high bit set where byte >= '9' + 1
    bad |= x
    bad |= ~(x + _U(0x50 * _ONES))  # high bit clear where byte < '0'
    ok = (bad & _H) == 0
    x -= _U(0x30 * _ONES)
    x = x * _U(10) + (x >> _U(8))
    x &= _U(0x00FF00FF00FF00FF)
    x = x * _U(100) + (x >> _U(16))
    x &= _U(0x0000FFFF0000FFFF)
    x = x * _U(10000) + (x >> _U(32))
    x &= _U(0xFFFFFFFF)
    return x.view(np.int64), ok


def _swar_hex8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode 8 hex digits (either case) held in ``x`` [m] uint64 -> (uint32 value as int64, ok)."""
    hi = x & _H
    d = (x + _U(0x50 * _ONES)) & ~(x + _U(0x46 * _ONES))  # '0'..'9'
    y = x | _U(0x20 * _ONES)  # fold 'A'..'F' onto 'a'..'f'
    a = (y + _U(0x1F * _ONES)) & ~(y + _U(0x19 * _ONES))  # 'a'..'f'
    a &= _H
    ok = (((d & _H) | a) == _H) & (hi == 0)
    nib = (x & _U(0x0F * _ONES)) + (a >> _U(7)) * _U(9)  # one nibble per byte
    t = ((nib << _U(4)) | (nib >> _U(8))) & _U(0x00FF00FF00FF00FF)
    t = ((t << _U(8)) | (t >> _U(16))) & _U(0x0000FFFF0000FFFF)
    t = ((t << _U(16)) | (t >> _U(32))) & _U(0xFFFFFFFF)
    return t.view(np.int64), ok


PAD = 8  # zero bytes after a block's text: an 8-byte read at any byte of it stays inside the array


@dataclass(frozen=True)
class TextBlock:
    """Whole lines of text (``size`` bytes, the last one ending in b"\\n") followed by :data:`PAD` zero bytes in one
    uint8 array ``buf`` [size + PAD]: the parser reads 8 bytes at every field start in place, so a block read
    into such an array (:func:`ctrkit.data.sources.criteo_read.iter_blocks`) is not copied again to be parsed."""

    buf: np.ndarray

    @classmethod
    def of(cls, text: bytes, n: int | None = None, head: bytes = b"") -> TextBlock:
        """A block of ``head`` followed by the first ``n`` bytes of ``text`` (all by default; together whole
        lines), each byte copied once into a padded array."""
        n = len(text) if n is None else n
        buf = np.empty(len(head) + n + PAD, np.uint8)
        buf[:len(head)] = np.frombuffer(head, np.uint8)
        buf[len(head):len(head) + n] = np.frombuffer(text, np.uint8, count=n)
        buf[len(head) + n:] = 0
        return cls(buf)

    @property
    def size(self) -> int:
        return len(self.buf) - PAD

    @property
    def text(self) -> np.ndarray:
        return self.buf[:-PAD]

    def count_lines(self) -> int:
        return int(np.count_nonzero(self.text == 10))

    def tobytes(self) -> bytes:
        return self.text.tobytes()


@dataclass
class ParsedBlock:
    """Good rows of one block of lines. ``line`` [n] is each row's 0-based line index in the block; ``cat`` the
    26 categorical columns, each factorized (:class:`CodedKeys`: 32-bit keys, missing -1)."""

    n_lines: int
    line: np.ndarray
    label: np.ndarray  # (n,) float32
    raw_dense: np.ndarray  # (n, 13) int64, missing -> 0
    cat: list[CodedKeys]  # 26 x (codes [n], distinct keys [m])
    bad: list[tuple[np.ndarray, str]] = field(default_factory=list)  # (line indices, reason)
    empty_lines: int = 0

    @property
    def keys(self) -> np.ndarray:
        """(n, 26) int64 keys row by row, missing -1."""
        return np.stack([c.values() for c in self.cat], axis=1).reshape(len(self.line), NUM_SPARSE)


def parse_block(buf: bytes | TextBlock) -> ParsedBlock:
    """Tokenise and validate a block of whole lines (``buf`` ends with b"\\n"; bytes are copied into a
    :class:`TextBlock` first).

    Categorical fields are factorized on their 8 raw bytes (one hash pass per value) and only the distinct ones
    are decoded from hex; a block with a bad row (rare) is checked field by field, to name each row's first bad
    field, and its good rows factorized."""
    t = _tokenise(buf if isinstance(buf, TextBlock) else TextBlock.of(buf))
    n = len(t.gi)
    lab = t.body[t.first]
    lab_ok = (t.ends[:, 0] - t.first == 1) & ((lab == 48) | (lab == 49))  # label: exactly "0" or "1"
    label = (lab.astype(np.float32) - 48.0)
    val, dok = _dense_fields(t)
    raw, sized = _categorical_raw(t)
    cat = _factorized(raw) if sized and lab_ok.all() and dok.all() else None  # None: a bad row somewhere
    gi = t.gi
    if cat is None:
        _, cok = _categorical_fields(t)
        dense_ok = dok.reshape(n, NUM_DENSE).all(axis=1)
        cat_ok = cok.reshape(n, NUM_SPARSE).all(axis=1)
        row_ok = lab_ok & dense_ok & cat_ok
        t.bad.extend(_row_reasons(t, lab_ok, dense_ok, cat_ok, dok, cok))
        keep = np.flatnonzero(row_ok)
        gi, label = gi[keep], label[keep]
        val = val.reshape(n, NUM_DENSE)[keep]
        cat = _factorized(raw[:, keep])
        if cat is None:
            raise AssertionError("a categorical field of a good row is not hex")  # the two checks disagree
    else:
        val = val.reshape(n, NUM_DENSE)
    return ParsedBlock(t.n_lines, gi, label, val, cat, t.bad, int(t.empty.sum()))


@dataclass
class _Tokens:
    """A block cut into lines and fields: ``ends`` (rows, 40) the end of each field of the lines with 40 fields
    (``gi``: their line indices; ``first``: where each starts), the bytes (``body``) and an unaligned uint64 view
    at every byte (``u64``). :meth:`fields` gives the starts and lengths of a range of fields."""

    body: np.ndarray
    u64: np.ndarray
    n_lines: int
    line_start: np.ndarray
    line_end: np.ndarray
    empty: np.ndarray
    gi: np.ndarray
    first: np.ndarray
    ends: np.ndarray
    bad: list[tuple[np.ndarray, str]]

    def fields(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(starts, lengths) of fields ``lo`` .. ``hi - 1`` (lo >= 1) of every row, new arrays (rows, hi - lo):
        field j starts after field j - 1's end. Only the fields asked for are computed."""
        starts = self.ends[:, lo - 1:hi - 1] + 1
        return starts, self.ends[:, lo:hi] - starts


def _tokenise(block: TextBlock) -> _Tokens:
    size, b = block.size, block.buf
    u64 = np.ndarray((size,), dtype="<u8", buffer=b, strides=(1,))  # unaligned uint64 at every byte (+ PAD inside)
    body = b[:size]
    pos = np.int32 if size < (1 << 31) - 16 else np.int64  # byte positions: half the memory traffic in int32
    sep = np.flatnonzero(body <= 10)  # positions of tabs and newlines (and of bytes 0..8, dropped next)
    at = body[sep]  # gathered with the int64 positions: numpy would convert int32 ones to intp first
    sep = sep.astype(pos)
    if at.min(initial=9) < 9:  # control bytes inside fields (a bad line): not separators
        sep, at = sep[at >= 9], at[at >= 9]
    nl = np.flatnonzero(at == 10)  # index into sep of each line end
    n_lines = len(nl)
    nfields = np.diff(nl, prepend=-1)  # (lines,)
    line_end = sep[nl]
    line_start = np.empty(n_lines, pos)
    if n_lines:
        line_start[0] = 0
        line_start[1:] = line_end[:-1] + 1
    good = nfields == NUM_FIELDS
    empty = line_end == line_start
    bad: list[tuple[np.ndarray, str]] = []
    wrong = np.flatnonzero(~good & ~empty)
    if len(wrong):
        for k in np.unique(nfields[wrong]):  # few distinct counts; one reason each
            bad.append((wrong[nfields[wrong] == k], f"expected {NUM_FIELDS} tab-separated fields, found {k}"))
    if len(sep) == NUM_FIELDS * n_lines and good.all():  # every line has 40 fields: sep is the (n, 40) ends
        gi, ends = np.arange(n_lines), sep.reshape(n_lines, NUM_FIELDS)
    else:
        gi = np.flatnonzero(good)
        ends = sep[nl[gi][:, None] + np.arange(-(NUM_FIELDS - 1), 1)]  # (n, 40) end of each field
    ends[:, -1] -= body[np.maximum(ends[:, -1] - 1, 0)] == 13  # tolerate CRLF
    return _Tokens(body, u64, n_lines, line_start, line_end, empty, gi, line_start[gi], ends, bad)


def _dense_fields(t: _Tokens) -> tuple[np.ndarray, np.ndarray]:
    """(values, ok) of the dense integers, flat (rows * 13; row by row, so the reads walk the block in order):
    optional '-', up to 8 digits by SWAR, longer ones (rare) digit by digit."""
    ds, dl = (a.ravel() for a in t.fields(1, 1 + NUM_DENSE))
    x = t.u64[ds]
    neg = ((x & _U(0xFF)) == _U(45)) & (dl >= 2)
    ni = np.flatnonzero(neg)
    if len(ni):
        ds[ni] += 1
        dl[ni] -= 1
        x[ni] = t.u64[ds[ni]]
    val, dok = _sliced(_swar_decimal, x, np.minimum(dl, 8))
    long_ = np.flatnonzero(dl > 8)
    if len(long_):
        lv, lok = _parse_long_ints(t.body, ds[long_], dl[long_])
        val[long_], dok[long_] = lv, lok
    np.negative(val, out=val, where=neg)
    return val, dok


def _categorical_fields(t: _Tokens) -> tuple[np.ndarray, np.ndarray]:
    """(keys, ok) of the categorical fields, flat (rows * 26; row by row, so the reads walk the block in order):
    empty (key -1) or exactly 8 hex digits."""
    cs, cl = (a.ravel() for a in t.fields(1 + NUM_DENSE, NUM_FIELDS))
    key, hok = _sliced(_swar_hex8, t.u64[cs])
    present = cl == 8
    key[~present] = -1
    return key, (hok & present) | (cl == 0)


def _categorical_raw(t: _Tokens) -> tuple[np.ndarray, bool]:
    """(raw, sized): the 8 bytes of every categorical field as int64 (26, n), one row per column (an empty field
    -> :data:`_MISSING_RAW`); ``sized``: every field is empty or 8 bytes long."""
    cs, cl = t.fields(1 + NUM_DENSE, NUM_FIELDS)
    cl = cl.T
    raw = t.u64[cs.T].view(np.int64)  # (26, n), gathered row by row (the block's order)
    np.copyto(raw, _MISSING_RAW, where=cl != 8)
    return raw, not np.any(cl & ~8)  # lengths 0 or 8 only


def _factorized(raw: np.ndarray) -> list[CodedKeys] | None:
    """Each row of ``raw`` (26, n) factorized on its bytes, the distinct values decoded from hex (missing -1);
    None if one of them is not 8 hex digits. A value written in upper and in lower case is one key: then the
    decoded keys are factorized again (first appearance of either spelling).

    The columns are factorized by ``pd.factorize``'s own engine (``Int64HashTable.factorize``: the same codes and
    first-appearance uniques, without its per-call checks and conversions; pandas' private API, as in
    :mod:`~ctrkit.data.pipeline.vocab_index`)."""
    coded = [_pd_hashtable.Int64HashTable(max(len(r), 1)).factorize(r) for r in raw]  # pd.factorize's table, directly
    sizes = np.array([len(u) for u, _ in coded])
    uniq = np.concatenate([u for u, _ in coded])  # every column's distinct values: decoded in one pass
    x = uniq.view(np.uint64)
    key, ok = _sliced(_swar_hex8, x)
    missing = uniq == _MISSING_RAW
    if not (ok | missing).all():
        return None
    key[missing] = -1
    upper = ok & ((x & _LOWER) != _LOWER)  # an upper-case digit: 'A'..'F' lack the 0x20 bit
    cols, some_upper = [], bool(upper.any())
    for (_, codes), hi, m in zip(coded, np.cumsum(sizes).tolist(), sizes.tolist()):
        k = key[hi - m:hi]
        if some_upper and upper[hi - m:hi].any():
            again, k = pd.factorize(k)
            codes = again[codes]
        cols.append(CodedKeys(codes, k))
    return cols


def _row_reasons(t: _Tokens, lab_ok: np.ndarray, dense_ok: np.ndarray, cat_ok: np.ndarray, dok: np.ndarray,
                 cok: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """One reason per bad row: the label, else its first bad dense field, else its first bad categorical one."""
    n, gi = len(t.gi), t.gi
    groups = [(gi[~lab_ok], "label is not 0 or 1")]
    for mask, ok, names, what in (
            (lab_ok & ~dense_ok, dok, [f"I{j}" for j in range(1, NUM_DENSE + 1)],
             "is not an integer (optional '-', at most 18 digits)"),
            (lab_ok & dense_ok & ~cat_ok, cok, [f"C{j}" for j in range(1, NUM_SPARSE + 1)],
             "is not empty or 8 hex digits")):
        rows = np.flatnonzero(mask)
        if len(rows):
            col = np.argmin(ok.reshape(n, len(names))[rows], axis=1)  # first failing field of each row
            kind = "dense" if names[0][0] == "I" else "categorical"
            groups += [(gi[rows[col == j]], f"{kind} field {names[j]} {what}") for j in np.unique(col)]
    bad: list[tuple[np.ndarray, str]] = []
    for idx, what in groups:
        if len(idx):
            bad.extend(_with_non_ascii(t.body, t.line_start, t.line_end, idx, what))
    return bad


def _parse_long_ints(body: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integers of 9+ digits (rare), vectorised over fields, looping over digit positions (<= 18)."""
    ok = length <= COUNT_DIGITS  # the rule's limit (larger would overflow int64)
    width = int(min(length.max(), COUNT_DIGITS))
    val = np.zeros(len(start), np.int64)
    for k in range(width):
        live = (k < length) & ok
        d = body[np.minimum(start + k, len(body) - 1)].astype(np.int64) - 48
        ok &= ~live | ((d >= 0) & (d <= 9))
        val = np.where(live, val * 10 + d, val)
    return val, ok


def _with_non_ascii(body: np.ndarray, line_start: np.ndarray, line_end: np.ndarray, idx: np.ndarray,
                    reason: str) -> list[tuple[np.ndarray, str]]:
    """Split bad lines ``idx`` into those holding non-ASCII bytes (named as such) and the rest."""
    non = np.array([bool((body[line_start[i]:line_end[i]] >= 128).any()) for i in idx[:50]] +
                   [False] * max(0, len(idx) - 50), dtype=bool)  # only the first few are reported
    out = []
    if non.any():
        out.append((idx[non], "non-ASCII / non-UTF-8 bytes"))
    if (~non).any():
        out.append((idx[~non], reason))
    return out


def dense_transform(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ln(x + 3)`` as float32 with x + 3 <= e^-2 clamped to -2 -> (values, clamped count per column).

    ``raw`` int64 [n, k]; a lookup table serves 0 <= x + 3 < 65536, np.log the rest.
    """
    x3 = raw + 3
    lo, hi = (x3.min(), x3.max()) if x3.size else (0, 0)
    if lo >= 0 and hi < _DENSE_LUT_SIZE:  # the common case: the table serves every value, no mask
        return _LOG_LUT[x3], ((x3 == 0).sum(axis=0) if lo == 0 else np.zeros(x3.shape[1:], np.int64))
    small = (x3 >= 0) & (x3 < _DENSE_LUT_SIZE)
    out = _LOG_LUT[np.where(small, x3, 0)]
    if not small.all():
        big = ~small
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.log(x3[big].astype(np.float64))
        out[big] = np.where(np.isfinite(v) & (v >= DENSE_CLAMP), v, DENSE_CLAMP).astype(np.float32)
    clamped = (x3 <= 0).sum(axis=0)  # integers: ln(x + 3) < -2 only when x + 3 <= 0
    return out, clamped
