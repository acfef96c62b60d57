"""Reading Criteo TSV files: the input files of a run (day files by day number), blocks of whole lines
(plain or gzip, a UTF-8 byte-order mark dropped), a background thread per stage, parsed blocks as raw columns.
"""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.pipeline.criteo_parse import PAD, ParsedBlock, TextBlock
from ctrkit.data.pipeline.feature_pipeline import DENSE_NAMES, SPARSE_NAMES
from ctrkit.errors import DataError
from ctrkit.io import check_distinct_inputs, missing_path

DAY_RE = re.compile(r"^day_(\d+)(\.[A-Za-z0-9]+)*$")
_BOM = b"\xef\xbb\xbf"  # UTF-8 byte-order mark (files saved by some Windows editors)

def _gzip_pieces(path: Path, raw: Any, size: int, damage: list[dict[str, Any]] | None) -> Iterator[bytes]:
    """Decompressed pieces of a gzip file (members one after another). Damage (a truncated file, a corrupt
    stream or checksum) ends the pieces after the last good byte when ``damage`` is a list (a record is
    appended to it) and raises :class:`DataError` otherwise."""
    d = zlib.decompressobj(wbits=31)
    started, reason = False, ""
    while True:
        comp = raw.read(max(1 << 12, size // 4))  # ~4x expansion: pieces of about ``size`` bytes
        if not comp:
            if started and not d.eof:
                reason = "the gzip stream ends early (truncated file)"
            break
        try:
            while comp:
                started, before = True, d.copy()
                out = d.decompress(comp)
                if out:
                    yield out
                comp = b""
                if d.eof and d.unused_data:  # another gzip member follows (concatenated .gz files)
                    comp, d = d.unused_data, zlib.decompressobj(wbits=31)
                    started = False
        except zlib.error as e:
            yield from _salvage(before, comp)
            reason = f"corrupt gzip data ({e})"
            break
    if reason:
        if damage is None:
            raise DataError(f"{path}: cannot read past compressed byte {raw.tell()} ({reason}); re-download or "
                            "re-compress it")
        damage.append({"file": str(path), "compressed_byte": raw.tell(), "reason": reason})


def _salvage(d: Any, comp: bytes) -> Iterator[bytes]:
    """What decompressor ``d`` still decodes of ``comp`` before the damage in it: 4 KiB steps, then byte by byte
    (only on a damaged file), so the rows before the damage are kept to the byte."""
    for step in (4096, 1):
        for i in range(0, len(comp), step):
            before = d.copy()
            try:
                out = d.decompress(comp[i:i + step])
            except zlib.error:
                d, comp = before, comp[i:i + step]
                break
            if out:
                yield out
        else:
            return


def iter_blocks(path: Path, block_bytes: int, *, start: int = 0, stop: int | None = None,
                damage: list[dict[str, Any]] | None = None) -> Iterator[tuple[TextBlock, int]]:
    """Blocks of whole lines (each ending in b"\\n", as padded :class:`TextBlock` arrays the parser reads in place)
    and the compressed bytes read so far. A UTF-8 byte-order mark at the start of the (decompressed) file is
    dropped: it is no part of the first line.

    A plain file may be read over the bytes [``start``, ``stop``) (whole lines: :func:`line_ranges`). A damaged
    gzip file (see :func:`_gzip_pieces`) yields its lines before the damage when ``damage`` is a list; the
    incomplete line cut by the damage is dropped (``partial_line`` in the damage record).

    Each byte read is copied once, into its block (the line cut at a block's end is carried to the next)."""
    raw = open(path, "rb")  # noqa: SIM115  (closed below)
    try:
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        if not gz:  # read straight into the blocks' arrays
            yield from _plain_blocks(raw, block_bytes, start, stop)
            return
        pieces = _gzip_pieces(path, raw, block_bytes, damage)
        seen = len(damage) if damage is not None else 0
        carry = b""
        head = start == 0  # the start of the file: strip a BOM there
        for data in pieces:
            if head:
                data = carry + data
                if len(data) < len(_BOM) and _BOM.startswith(data):  # a read shorter than the BOM: read on
                    carry = data
                    continue
                data, head, carry = data.removeprefix(_BOM), False, b""
            cut = data.rfind(b"\n")
            if cut < 0:
                carry += data
                continue
            yield TextBlock.of(data, cut + 1, head=carry), raw.tell()
            carry = data[cut + 1:]
        if damage is not None and len(damage) > seen:
            damage[-1]["partial_line"] = bool(carry)  # cut by the damage: not a row
        elif carry:
            yield TextBlock.of(carry + b"\n"), raw.tell()
    finally:
        raw.close()


def _plain_blocks(raw: Any, block_bytes: int, start: int, stop: int | None) -> Iterator[tuple[TextBlock, int]]:
    """:func:`iter_blocks` of a plain file: each read lands in the padded array of its block (``readinto``; the
    line cut at the block's end, copied to the next block's head, is the only byte copied twice)."""
    raw.seek(start)
    left = None if stop is None else stop - start
    carry, head = b"", start == 0  # the start of the file: strip a BOM there
    while left is None or left > 0:
        want = block_bytes if left is None else min(block_bytes, left)
        buf = np.empty(len(carry) + want + PAD, np.uint8)
        buf[:len(carry)] = np.frombuffer(carry, np.uint8)
        got = raw.readinto(memoryview(buf)[len(carry):len(carry) + want])
        if not got:
            break
        if left is not None:
            left -= got
        end, lo = len(carry) + got, 0
        if head:
            if end < len(_BOM) and _BOM.startswith(buf[:end].tobytes()):  # a read shorter than the BOM: read on
                carry = buf[:end].tobytes()
                continue
            lo, head = (len(_BOM) if buf[:len(_BOM)].tobytes() == _BOM else 0), False
        cut = _last_newline(buf, lo, end)
        if cut < 0:
            carry = buf[lo:end].tobytes()
            continue
        carry = buf[cut + 1:end].tobytes()
        buf[cut + 1:cut + 1 + PAD] = 0
        yield TextBlock(buf[lo:cut + 1 + PAD]), raw.tell()
    if carry:
        yield TextBlock.of(carry + b"\n"), raw.tell()


def _last_newline(buf: np.ndarray, lo: int, end: int) -> int:
    """Index of the last b"\n" in ``buf[lo:end]`` (-1 if none): the last 64 KiB first, then the rest."""
    for a in (max(lo, end - (1 << 16)), lo):
        hits = np.flatnonzero(buf[a:end] == 10)
        if len(hits):
            return a + int(hits[-1])
        end = a
        if a == lo:
            break
    return -1


def line_ranges(path: Path, size: int) -> list[tuple[int, int]]:
    """A plain file cut into byte ranges of about ``size`` bytes, each from a line start to the next range's."""
    total = path.stat().st_size
    cuts = [0]
    with open(path, "rb") as f:
        for pos in range(size, total, size):
            if pos <= cuts[-1]:
                continue
            f.seek(pos - 1)
            f.readline()  # to the end of the line holding byte pos - 1: the next range starts a line
            if f.tell() < total and f.tell() > cuts[-1]:
                cuts.append(f.tell())
    cuts.append(total)
    return list(itertools.pairwise(cuts))


def check_day_sequence(files: Sequence[Path]) -> None:
    """Day files must be every day from the first to the last: a gap (a day missing in the middle, e.g. a
    failed download) would silently shift what is trained on."""
    days = sorted(day_number(f) for f in files)
    missing = sorted(set(range(days[0], days[-1] + 1)) - set(days))
    if missing:
        have = ", ".join(f"day_{d}" for d in days)
        raise DataError(f"day files skip {', '.join(f'day_{d}' for d in missing)} between day_{days[0]} and "
                        f"day_{days[-1]}; given: {have}. Add the missing day file(s), or pass --split to treat the "
                        "files as one table")


def block_columns(blk: ParsedBlock) -> dict[str, Any]:
    """The parser's decoded rows as the pipeline's raw columns: label, I1..I13 (integers), C1..C26 (keys, -1
    missing, factorized: :class:`~ctrkit.data.pipeline.vocab_keys.CodedKeys`)."""
    cols: dict[str, Any] = {"label": blk.label}
    dense = np.ascontiguousarray(blk.raw_dense.T)  # one copy: columns
    cols.update((n, dense[j]) for j, n in enumerate(DENSE_NAMES))  # contiguous, not strided views of rows
    cols.update(zip(SPARSE_NAMES, blk.cat))
    return cols


def resolve_inputs(inputs: str | Path | Sequence[str | Path]) -> list[Path]:
    """Input files in processing order; a directory means its ``day_*`` files (by day number)."""
    items = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    if not items:
        raise DataError("no input files given")
    files: list[Path] = []
    for it in items:
        p = Path(it)
        if p.is_dir():
            days = sorted((f for f in p.iterdir() if DAY_RE.match(f.name)), key=day_number)
            if not days:
                raise DataError(f"{p} is a directory without day_* files; pass the input files themselves")
            files.extend(days)
        else:
            files.append(p)
    for f in files:
        if not f.exists():
            raise DataError(missing_path(f, "input file"))
        if not f.is_file():
            raise DataError(f"input {f} is not a regular file")
        if f.stat().st_size == 0:
            raise DataError(f"input file {f} is empty")
    days: dict[tuple[Path, int], Path] = {}
    for f in files:  # day_3 next to day_3.gz: every row read twice, and the test day leaks into train
        if DAY_RE.match(f.name):
            twin = days.setdefault((f.parent.resolve(), day_number(f)), f)
            if twin != f:
                raise DataError(f"{twin} and {f} are both day {day_number(f)}; keep one of them (a plain "
                                "and a compressed copy of a day would both be read)")
    check_distinct_inputs((f"input {i + 1}", f) for i, f in enumerate(files))  # also through a symlink
    return files


def day_number(p: Path) -> int:
    m = DAY_RE.match(p.name)
    return int(m.group(1)) if m else -1


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"
