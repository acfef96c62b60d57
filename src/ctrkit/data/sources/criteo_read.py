"""Reading Criteo TSV files: the input files of a run (day files by day number), blocks of whole lines
(plain or gzip, a UTF-8 byte-order mark dropped), a background thread per stage, parsed blocks as raw columns.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.pipeline.criteo_parse import ParsedBlock
from ctrkit.data.pipeline.feature_pipeline import DENSE_NAMES, SPARSE_NAMES
from ctrkit.errors import DataError
from ctrkit.io import missing_path

DAY_RE = re.compile(r"^day_(\d+)(\.[A-Za-z0-9]+)*$")
_BOM = b"\xef\xbb\xbf"  # UTF-8 byte-order mark (files saved by some Windows editors)

def _open(path: Path) -> tuple[Any, Any]:
    """(stream to read, raw file for the progress position); gzip is detected by its magic bytes."""
    raw = open(path, "rb")  # noqa: SIM115  (closed by iter_blocks)
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    return raw, raw


def iter_blocks(path: Path, block_bytes: int) -> Iterator[tuple[bytes, int]]:
    """Blocks of whole lines (each ending in b"\\n") and the compressed bytes read so far. A UTF-8 byte-order
    mark at the start of the (decompressed) file is dropped: it is no part of the first line."""
    stream, raw = _open(path)
    try:
        carry = b""
        head = True  # the start of the file: strip a BOM there
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
            if head:
                if len(buf) < len(_BOM) and _BOM.startswith(buf):  # a read shorter than the BOM: read on
                    carry = buf
                    continue
                buf, head = buf.removeprefix(_BOM), False
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


def block_columns(blk: ParsedBlock) -> dict[str, np.ndarray]:
    """The parser's decoded rows as the pipeline's raw columns: label, I1..I13 (integers), C1..C26 (keys, -1
    missing)."""
    cols: dict[str, np.ndarray] = {"label": blk.label}
    dense, keys = np.ascontiguousarray(blk.raw_dense.T), np.ascontiguousarray(blk.keys.T)  # one copy: columns
    cols.update((n, dense[j]) for j, n in enumerate(DENSE_NAMES))  # contiguous, not strided views of rows
    cols.update((c, keys[j]) for j, c in enumerate(SPARSE_NAMES))
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
    return files


def day_number(p: Path) -> int:
    m = DAY_RE.match(p.name)
    return int(m.group(1)) if m else -1


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"
