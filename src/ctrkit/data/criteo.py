"""Criteo TSV -> ctrkit stores, exactly as seed 000 §3.3.

Input: tab-separated lines ``label, I1..I13, C1..C26`` (40 fields; label 0/1; I* integers; C* 32-bit
hashes written as 8 hex digits; any field except the label may be empty). One file, or the day files
``day_0 .. day_23`` of the Criteo 1TB logs; plain or gzip.

Rules (seed 000 §3.3):

1. missing (empty) fields -> 0;
2. dense ``d = ln(x + 3)`` stored as float32, where x is the raw integer (0 if missing); where
   ``x + 3 <= e^-2`` (integers: x <= -3, including ln 0 = -inf) d is clamped to -2 and counted per
   column in ``stats.clamped_dense``;
3. every categorical column is re-indexed on its own in first-appearance order over all input
   (:mod:`ctrkit.data.vocab`): 0 = missing, 1 = rare/unseen, ids from 2;
4. day files: day_0 .. day_(D-1) shuffled -> ``train``, the last day -> ``test`` (optionally halved at
   random into ``valid`` / ``test``); otherwise a seeded ratio split (default 0.8/0.1/0.1).

How it is fast: lines are tokenised by numpy on whole decompressed blocks (tab / newline positions ->
a [rows, 40] matrix of field starts); each 8-hex-digit field and each integer of up to 8 digits is
read as one unaligned little-endian uint64 and decoded with SWAR bit arithmetic (no per-field Python);
distinct values per chunk are found with pyarrow's hash ``dictionary_encode``. Reading (and gunzip)
runs in a background thread. The train shuffle scatters rows into temporary shards at random
(counter-based randomness, so the result does not depend on the chunk size) and shuffles each shard
in memory; memory stays bounded by one block, one shard and the vocabularies.

Malformed lines (wrong field count, label not 0/1, non-integer dense, categorical not 8 hex digits,
non-UTF-8 bytes) are skipped and counted; the first few are logged with their 1-based line numbers
and kept in the manifest. If more than ``max_bad_fraction`` of a file's rows are bad the run fails
with :class:`~ctrkit.data.rows.DataError` and no store is written.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import queue
import re
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.rows import (
    BadRows,
    DataError,
    ShardSpill,
    SpillColumn,
    TempDir,
    assign_split,
    parse_split,
    row_uniform,
    shard_count,
    splitmix64,
    stream_key,
)
from ctrkit.data.store import ColumnSpec, StoreError, StoreWriter
from ctrkit.data.vocab import (
    MODES,
    VocabBuilder,
    Vocabulary,
    check_vocab_options,
    link_tree,
    load_vocabularies,
    save_vocabularies,
)
from ctrkit.schema import DenseFeature, Schema, SparseFeature

log = logging.getLogger(__name__)

NUM_DENSE, NUM_SPARSE = 13, 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE
DENSE_NAMES = [f"I{i}" for i in range(1, NUM_DENSE + 1)]
SPARSE_NAMES = [f"C{i}" for i in range(1, NUM_SPARSE + 1)]
DENSE_CLAMP = -2.0
SPLITS = ("train", "valid", "test")
_DAY_RE = re.compile(r"^day_(\d+)(\.[A-Za-z0-9]+)*$")
_AVG_LINE_BYTES = 256  # chunk_rows -> read block size

# ---- SWAR constants (8 ASCII bytes in one little-endian uint64; byte 0 = first character) ------------
_U = np.uint64
_H = _U(0x8080808080808080)
_ONES = 0x0101010101010101
_KEEP = np.array([(1 << (8 * n)) - 1 for n in range(9)], dtype=np.uint64)  # low n bytes
_SHIFT = np.array([0] + [8 * (8 - n) for n in range(1, 9)], dtype=np.uint64)
_FILL = np.array([0x3030303030303030 if n == 0 else (0x3030303030303030 >> (8 * n)) for n in range(9)],
                 dtype=np.uint64)  # '0' in the low (8 - n) bytes
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
    x &= _KEEP[n]
    x <<= _SHIFT[n]
    x |= _FILL[n]
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


@dataclass
class ParsedBlock:
    """Good rows of one block of lines. ``line`` [n] is each row's 0-based line index in the block."""

    n_lines: int
    line: np.ndarray
    label: np.ndarray  # (n,) float32
    raw_dense: np.ndarray  # (n, 13) int64, missing -> 0
    keys: np.ndarray  # (n, 26) int64, 32-bit hash value, missing -> -1
    bad: list[tuple[np.ndarray, str]] = field(default_factory=list)  # (line indices, reason)
    empty_lines: int = 0


def parse_block(buf: bytes) -> ParsedBlock:
    """Tokenise and validate a block of whole lines (``buf`` ends with b"\\n")."""
    size = len(buf)
    b = np.empty(size + 8, np.uint8)  # + 8 so an 8-byte read at any field start stays inside
    b[:size] = np.frombuffer(buf, np.uint8)
    b[size:] = 0
    u64 = np.ndarray((size,), dtype="<u8", buffer=b, strides=(1,))  # unaligned uint64 at every byte
    body = b[:size]
    sep = np.flatnonzero((body == 9) | (body == 10))  # positions of tabs and newlines
    nl = np.flatnonzero(body[sep] == 10)  # index into sep of each line end
    n_lines = len(nl)
    nfields = np.diff(nl, prepend=-1)  # (lines,)
    line_end = sep[nl]
    line_start = np.empty(n_lines, np.int64)
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
    gi = np.flatnonzero(good)
    n = len(gi)
    ends = sep[nl[gi][:, None] + np.arange(-(NUM_FIELDS - 1), 1)]  # (n, 40) end of each field
    starts = np.empty_like(ends)
    starts[:, 0] = line_start[gi]
    starts[:, 1:] = ends[:, :-1] + 1
    ends[:, -1] -= body[np.maximum(ends[:, -1] - 1, 0)] == 13  # tolerate CRLF
    lens = ends - starts

    # label: exactly "0" or "1"
    lab = body[starts[:, 0]]
    lab_ok = (lens[:, 0] == 1) & ((lab == 48) | (lab == 49))
    label = (lab.astype(np.float32) - 48.0)

    # dense integers: optional '-', up to 8 digits by SWAR, longer ones (rare) digit by digit
    ds = starts[:, 1:1 + NUM_DENSE].ravel()
    dl = lens[:, 1:1 + NUM_DENSE].ravel()
    x = u64[ds]
    neg = ((x & _U(0xFF)) == _U(45)) & (dl >= 2)
    ni = np.flatnonzero(neg)
    if len(ni):
        ds[ni] += 1
        dl[ni] -= 1
        x[ni] = u64[ds[ni]]
    val, dok = _sliced(_swar_decimal, x, np.minimum(dl, 8))
    long_ = np.flatnonzero(dl > 8)
    if len(long_):
        lv, lok = _parse_long_ints(body, ds[long_], dl[long_])
        val[long_], dok[long_] = lv, lok
    np.negative(val, out=val, where=neg)
    dense_ok = dok.reshape(n, NUM_DENSE).all(axis=1)

    # categorical: empty or exactly 8 hex digits
    cs = starts[:, 1 + NUM_DENSE:].ravel()
    cl = lens[:, 1 + NUM_DENSE:].ravel()
    key, hok = _sliced(_swar_hex8, u64[cs])
    present = cl == 8
    cok = (hok & present) | (cl == 0)
    key[~present] = -1
    cat_ok = cok.reshape(n, NUM_SPARSE).all(axis=1)

    row_ok = lab_ok & dense_ok & cat_ok
    if not row_ok.all():
        for mask, what in ((~lab_ok, "label is not 0 or 1"), (lab_ok & ~dense_ok, "a dense field is not an integer"),
                           (lab_ok & dense_ok & ~cat_ok, "a categorical field is not empty or 8 hex digits")):
            idx = gi[mask]
            if len(idx):
                bad.extend(_with_non_ascii(body, line_start, line_end, idx, what))
        keep = np.flatnonzero(row_ok)
        gi, label = gi[keep], label[keep]
        val = val.reshape(n, NUM_DENSE)[keep]
        key = key.reshape(n, NUM_SPARSE)[keep]
    else:
        val, key = val.reshape(n, NUM_DENSE), key.reshape(n, NUM_SPARSE)
    return ParsedBlock(n_lines, gi, label, val, key, bad, int(empty.sum()))


def _parse_long_ints(body: np.ndarray, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integers of 9+ digits (rare), vectorised over fields, looping over digit positions (<= 18)."""
    ok = length <= 18  # larger would overflow int64
    width = int(min(length.max(), 18))
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
    small = (x3 >= 0) & (x3 < _DENSE_LUT_SIZE)
    out = _LOG_LUT[np.where(small, x3, 0)]
    if not small.all():
        big = ~small
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.log(x3[big].astype(np.float64))
        out[big] = np.where(np.isfinite(v) & (v >= DENSE_CLAMP), v, DENSE_CLAMP).astype(np.float32)
    clamped = (x3 <= 0).sum(axis=0)  # integers: ln(x + 3) < -2 only when x + 3 <= 0
    return out, clamped


# ---- reading -----------------------------------------------------------------------------------------
def _open(path: Path) -> tuple[Any, Any]:
    """(stream to read, raw file for the progress position); gzip is detected by its magic bytes."""
    raw = open(path, "rb")  # noqa: SIM115  (closed by iter_blocks)
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    return raw, raw


def iter_blocks(path: Path, block_bytes: int) -> Iterator[tuple[bytes, int]]:
    """Blocks of whole lines (each ending in b"\\n") and the compressed bytes read so far."""
    stream, raw = _open(path)
    try:
        carry = b""
        while True:
            try:
                data = stream.read(block_bytes)
            except (EOFError, OSError, zlib.error) as e:
                raise DataError(
                    f"{path}: cannot read past byte {raw.tell()} ({e}); the gzip file is truncated or corrupt, "
                    "re-download or re-compress it"
                ) from None
            if not data:
                break
            buf = carry + data if carry else data
            cut = buf.rfind(b"\n")
            if cut < 0:
                carry = buf
                continue
            carry = buf[cut + 1:]
            yield buf[: cut + 1], raw.tell()
        if carry:
            yield carry + b"\n", raw.tell()
    finally:
        stream.close()
        raw.close()


def _background(gen: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """Run a generator in a daemon thread (gunzip and file reads release the GIL); re-raise its errors."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def work() -> None:
        try:
            for item in gen:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # noqa: BLE001  (forwarded to the consumer)
            q.put(e)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def resolve_inputs(inputs: str | Path | Sequence[str | Path]) -> list[Path]:
    """Input files in processing order; a directory means its ``day_*`` files (by day number)."""
    items = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    if not items:
        raise DataError("no input files given")
    files: list[Path] = []
    for it in items:
        p = Path(it)
        if p.is_dir():
            days = sorted((f for f in p.iterdir() if _DAY_RE.match(f.name)), key=_day_number)
            if not days:
                raise DataError(f"{p} is a directory without day_* files; pass the input files themselves")
            files.extend(days)
        else:
            files.append(p)
    for f in files:
        if not f.exists():
            raise DataError(f"input file {f} does not exist")
        if not f.is_file():
            raise DataError(f"input {f} is not a regular file")
        if f.stat().st_size == 0:
            raise DataError(f"input file {f} is empty")
    return files


def _day_number(p: Path) -> int:
    m = _DAY_RE.match(p.name)
    return int(m.group(1)) if m else -1


# ---- the pipeline ---------------------------------------------------------------------------------------
def preprocess_criteo(
    inputs: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    min_freq: int = 1,
    max_vocab: int | None = None,
    max_vocab_mode: str = "hash",
    split: str | Sequence[float] | None = None,
    valid_from_test: bool = False,
    seed: int = 0,
    chunk_rows: int = 1 << 14,
    max_bad_fraction: float = 0.001,
    vocab_from: str | Path | None = None,
    embedding_dim: int | str = "auto",
    overwrite: bool = False,
    shard_bytes: int = 256 << 20,
    progress: bool | None = None,
    shuffle: bool = True,
) -> dict[str, Path]:
    """Preprocess Criteo TSV file(s) into one store per split under ``out`` -> {split: store path}.

    Splits: with ``split=None`` and day files (``day_<n>[.gz]``, at least two) the last day is the
    test set and the others are shuffled into train (``valid_from_test`` halves the last day at random
    into valid and test); otherwise ``split`` (default "0.8,0.1,0.1", "train,valid,test" fractions)
    assigns rows at random (seeded, independent of chunking). Train is shuffled; valid and test keep
    input order. Empty splits are not written.

    Vocabularies are fitted on all input rows in input order (seed 000: first appearance over all
    data), or loaded from ``vocab_from`` (a store) and applied unchanged (unseen -> 1). They are saved
    in ``<store>/vocab`` of every output store.

    ``max_vocab`` (with ``max_vocab_mode`` 'hash' (default, torchrec's max_ind_range) or 'cap') and
    ``min_freq`` are described in :mod:`ctrkit.data.vocab`. ``chunk_rows`` sets the read block
    (about chunk_rows * 256 bytes); ``shard_bytes`` the size of one shuffle shard in memory.
    ``shuffle=False`` keeps train in input order too (scoring raw rows in order, e.g. ``predict``).
    """
    t0 = time.perf_counter()
    files = resolve_inputs(inputs)
    out = Path(out)
    check_vocab_options(min_freq, max_vocab, max_vocab_mode)
    if not 0 <= max_bad_fraction <= 1:
        raise DataError(f"max_bad_fraction must be in [0, 1], got {max_bad_fraction}")
    if embedding_dim != "auto" and (not str(embedding_dim).isdigit() or int(embedding_dim) < 1):
        raise DataError(f"embedding_dim must be a positive integer or 'auto', got {embedding_dim!r}")
    embedding_dim = embedding_dim if embedding_dim == "auto" else int(embedding_dim)
    if chunk_rows < 1:
        raise DataError(f"chunk_rows must be >= 1, got {chunk_rows}")

    day_mode = split is None and len(files) >= 2 and all(_DAY_RE.match(f.name) for f in files)
    if day_mode:
        files = sorted(files, key=_day_number)
        test_day = files[-1]
        fractions = None
    else:
        fractions = parse_split("0.8,0.1,0.1" if split is None else split)
        if valid_from_test:
            raise DataError("--valid-from-test applies to day files (day_0 .. day_N) without --split")
    for s in SPLITS:
        if (out / s).exists() and not overwrite:
            raise StoreError(f"output {out / s} already exists; choose another --out or pass --overwrite")

    frozen: dict[str, Vocabulary] | None = None
    if vocab_from is not None:
        frozen = load_vocabularies(vocab_from)
        missing = [c for c in SPARSE_NAMES if c not in frozen]
        if missing:
            raise DataError(f"vocab_from={vocab_from} has no vocabularies for {missing}")
    builders = [VocabBuilder(c, "int") for c in SPARSE_NAMES] if frozen is None else []

    comp = [0.25 if _is_gzip(f) else 1.0 for f in files]  # gzip ratio of Criteo text is ~4
    est_rows = sum(f.stat().st_size / c for f, c in zip(files, comp)) / _AVG_LINE_BYTES * 1.5
    row_bytes = 4 * NUM_FIELDS
    spill_cols = {"label": SpillColumn("<f4"), "dense": SpillColumn("<f4", (NUM_DENSE,)),
                  "sparse": SpillColumn("<u4", (NUM_SPARSE,))}
    block_bytes = max(1 << 16, int(chunk_rows) * _AVG_LINE_BYTES)
    file_stats: list[BadRows] = []
    clamped = np.zeros(NUM_DENSE, np.int64)
    empty_lines = 0
    pos_rows = np.zeros(3, np.int64)

    with TempDir(out, ".criteo-tmp-") as tmp:
        k_train = shard_count(est_rows, row_bytes, shard_bytes) if shuffle else 1
        spills = [ShardSpill(tmp / "train", k_train, spill_cols), ShardSpill(tmp / "valid", 1, spill_cols),
                  ShardSpill(tmp / "test", 1, spill_cols)]
        total_bytes = sum(f.stat().st_size for f in files)
        bar = _progress(total_bytes, progress)
        done_bytes = 0
        try:
            for fi, path in enumerate(files):
                bad = BadRows(str(path))
                line0 = 0
                key_split, key_shard = stream_key(seed, 1, fi), stream_key(seed, 2, fi)
                last_pos = 0
                # three stages on their own threads: read/gunzip -> tokenise/parse -> vocab/spill (here)
                parsed = _background((parse_block(buf), pos) for buf, pos in _background(iter_blocks(path, block_bytes)))
                for blk, pos in parsed:
                    lines = line0 + blk.line  # 0-based line numbers in the file
                    for idx, reason in blk.bad:
                        bad.add(line0 + idx + 1, reason)
                    bad.total += blk.n_lines - blk.empty_lines
                    empty_lines += blk.empty_lines
                    line0 += blk.n_lines
                    dense, clamp = dense_transform(blk.raw_dense)
                    clamped += clamp
                    ids = np.empty(blk.keys.shape, np.uint32)  # (n, 26)
                    for j in range(NUM_SPARSE):
                        col = blk.keys[:, j]
                        miss = col < 0
                        ids[:, j] = (builders[j].add(col, miss) if frozen is None
                                     else frozen[SPARSE_NAMES[j]].lookup(col, miss))
                    if frozen is None and builders and max(b.next_id for b in builders) >= 1 << 32:
                        raise DataError("a categorical column has more than 2^32 - 2 distinct values")
                    if day_mode:
                        if path == test_day:
                            code = (np.where(row_uniform(key_split, lines) < 0.5, 1, 2).astype(np.int8)
                                    if valid_from_test else np.full(len(lines), 2, np.int8))
                        else:
                            code = np.zeros(len(lines), np.int8)
                    else:
                        code = assign_split(row_uniform(key_split, lines), fractions)
                    uniform = len(code) > 0 and bool((code == code[0]).all())
                    for s in range(3):
                        if uniform:
                            if code[0] != s:
                                continue
                            sel: Any = slice(None)
                        else:
                            sel = np.flatnonzero(code == s)
                        part = {"label": blk.label[sel], "dense": dense[sel], "sparse": ids[sel]}
                        pos_rows[s] += int(part["label"].sum())
                        shard = None
                        if s == 0 and k_train > 1:
                            shard = (splitmix64(lines[sel].astype(np.uint64) + np.uint64(key_shard))
                                     % np.uint64(k_train)).astype(np.int64)
                        spills[s].add(part, shard)
                    if bad.bad > 10_000 and bad.bad / max(bad.total, 1) > max_bad_fraction:
                        bad.check(max_bad_fraction)  # stop early on a broken file
                    bar.update(pos - last_pos)
                    last_pos = pos
                done_bytes += path.stat().st_size
                if bad.total == 0:
                    raise DataError(f"input file {path} contains no rows")
                bad.check(max_bad_fraction)
                file_stats.append(bad)
        finally:
            bar.close()
        t_read = time.perf_counter() - t0

        # ---- vocabularies --------------------------------------------------------------------------
        luts: list[np.ndarray | None] = []
        if frozen is None:
            vocabs = {}
            for b in builders:
                vocabs[b.name], lut = b.finish(min_freq, max_vocab, max_vocab_mode, hash_seed=0)
                luts.append(lut)
        else:
            vocabs = {c: frozen[c] for c in SPARSE_NAMES}
            luts = [None] * NUM_SPARSE
        save_vocabularies(tmp / "vocab", vocabs, fitted_on=[str(f) for f in files] if frozen is None
                          else f"copied from {vocab_from}")
        sizes = {c: vocabs[c].size for c in SPARSE_NAMES}
        id_dtype = np.int32 if max(sizes.values()) <= np.iinfo(np.int32).max else np.int64
        schema = Schema(
            dense=[DenseFeature(n) for n in DENSE_NAMES],
            sparse=[SparseFeature(c, sizes[c], embedding_dim) for c in SPARSE_NAMES],
            label="label",
        )
        columns = ([ColumnSpec("label", "label", "<f4")] + [ColumnSpec(n, "dense", "<f4") for n in DENSE_NAMES]
                   + [ColumnSpec(c, "sparse", np.dtype(id_dtype).str) for c in SPARSE_NAMES])
        options = {"min_freq": min_freq, "max_vocab": max_vocab, "max_vocab_mode": max_vocab_mode,
                   "split": "days" if day_mode else ",".join(f"{f:g}" for f in fractions),
                   "valid_from_test": valid_from_test, "seed": seed, "chunk_rows": chunk_rows,
                   "max_bad_fraction": max_bad_fraction, "embedding_dim": embedding_dim,
                   "vocab_from": str(vocab_from) if vocab_from else None}
        inputs_meta = [{"path": str(f), "bytes": f.stat().st_size,
                        "role": ("test" if day_mode and f == test_day else "train") if day_mode else "split"}
                       for f in files]
        rows = {s: int(sp.rows.sum()) for s, sp in zip(SPLITS, spills)}
        bad_total = sum(b.bad for b in file_stats)
        stats_common = {
            "input_rows": sum(b.total for b in file_stats), "bad_rows": bad_total,
            "first_bad_lines": [{"file": b.file, "line": n, "reason": r} for b in file_stats for n, r in b.first][:20],
            "files": [b.to_dict() for b in file_stats], "empty_lines": empty_lines,
            "clamped_dense": dict(zip(DENSE_NAMES, clamped.tolist())),
            "vocab_sizes": sizes, "vocab": {c: vocabs[c].meta() for c in SPARSE_NAMES},
            "split_rows": rows,
        }

        # ---- write one store per split -------------------------------------------------------------
        result: dict[str, Path] = {}
        shuffle_key = stream_key(seed, 3)
        for s, (name, spill) in enumerate(zip(SPLITS, spills)):
            if rows[name] == 0:
                if not day_mode and fractions[s] > 0:
                    log.warning("split %r received no rows (too few input rows); not written", name)
                continue
            path = out / name
            with StoreWriter(path, schema, columns, overwrite=overwrite) as w:
                for shard in spill:
                    part = spill.read(shard, seed=[shuffle_key, shard] if s == 0 and shuffle else None)
                    chunk: dict[str, np.ndarray] = {"label": part["label"]}
                    for j, n in enumerate(DENSE_NAMES):
                        chunk[n] = part["dense"][:, j]
                    for j, c in enumerate(SPARSE_NAMES):
                        col = part["sparse"][:, j]
                        chunk[c] = (luts[j][col] if luts[j] is not None else col).astype(id_dtype)
                    w.append(chunk)
                link_tree(tmp / "vocab", w.tmp / "vocab")
                w.set_meta(
                    preprocessing={"kind": "criteo", "split": name, "options": options, "inputs": inputs_meta,
                                   "rules": "seed 000 §3.3: missing -> 0; dense ln(x+3) float32, x+3 <= e^-2 "
                                            "clamped to -2; categorical first-appearance ids, 0 missing, 1 rare"},
                    stats={**stats_common, "rows": rows[name],
                           "label_rate": float(pos_rows[s] / max(rows[name], 1))},
                )
            result[name] = path
    elapsed = time.perf_counter() - t0
    n_in = stats_common["input_rows"]
    log.info("criteo: %d rows (%d bad) -> %s in %.1fs (read+parse %.1fs, %.0f rows/s)", n_in, bad_total,
             {k: rows[k] for k in result}, elapsed, t_read, n_in / max(elapsed, 1e-9))
    return result


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _progress(total: int, enabled: bool | None) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc="criteo", disable=None if enabled is None
                else not enabled)


# ---- command line -----------------------------------------------------------------------------------
def add_preprocess_criteo_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``ctrkit preprocess criteo``."""
    p.add_argument("inputs", nargs="+", help="Criteo TSV file(s), plain or .gz; day_0 .. day_23 files or their directory")
    p.add_argument("--out", required=True, help="output directory; stores go to OUT/train, OUT/valid, OUT/test")
    p.add_argument("--min-freq", type=int, default=1, help="values seen fewer times map to id 1 (rare)")
    p.add_argument("--max-vocab", type=int, default=None, help="cap every vocabulary at this many ids")
    p.add_argument("--max-vocab-mode", choices=MODES, default="hash",
                   help="hash: kept values hashed into [2, max_vocab) (torchrec max_ind_range); cap: first values keep ids")
    p.add_argument("--split", default=None,
                   help="train,valid,test fractions (default: last day file = test, else 0.8,0.1,0.1)")
    p.add_argument("--valid-from-test", action="store_true", help="day files: halve the last day into valid/test")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the shuffle")
    p.add_argument("--chunk-rows", type=int, default=1 << 14, help="rows per read block (memory vs speed)")
    p.add_argument("--max-bad-fraction", type=float, default=0.001,
                   help="fail when more than this fraction of a file's rows are malformed")
    p.add_argument("--vocab-from", default=None, help="store whose vocabularies to reuse (unseen values -> 1)")
    p.add_argument("--embedding-dim", default="auto", help="embedding dim of every feature, or 'auto'")
    p.add_argument("--overwrite", action="store_true", help="replace existing output stores")
    return p


def run_preprocess_criteo(args: argparse.Namespace) -> dict[str, Path]:
    """Run :func:`preprocess_criteo` from parsed arguments; logs one summary line per store."""
    result = preprocess_criteo(
        args.inputs, args.out, min_freq=args.min_freq, max_vocab=args.max_vocab,
        max_vocab_mode=args.max_vocab_mode, split=args.split, valid_from_test=args.valid_from_test,
        seed=args.seed, chunk_rows=args.chunk_rows, max_bad_fraction=args.max_bad_fraction,
        vocab_from=args.vocab_from, embedding_dim=args.embedding_dim, overwrite=args.overwrite,
    )
    for name, path in result.items():
        m = json.loads((path / "manifest.json").read_text())
        log.info("%s: %s rows, label rate %.4f -> %s", name, m["num_rows"], m["stats"]["label_rate"], path)
    return result


__all__ = [
    "DENSE_NAMES", "SPARSE_NAMES", "ParsedBlock", "add_preprocess_criteo_args", "dense_transform",
    "iter_blocks", "parse_block", "preprocess_criteo", "resolve_inputs", "run_preprocess_criteo",
]
