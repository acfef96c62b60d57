"""CSV / Parquet batch reading with bad-row accounting (``ctrkit preprocess table`` and ``predict``):
batches of the requested columns, the physical line number of every row, and the header.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ctrkit.data.pipeline.rows import BadRows
from ctrkit.errors import DataError


def iter_batches(path: Path, columns: list[str], block_rows: int, bad: BadRows,
                 blank_lines: list[int] | None = None) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """(batch table, 1-based line / row numbers [n]) for CSV (strings, header line 1; plain or compressed,
    by extension: .csv.gz) or Parquet. A blank CSV line is not a row; with ``blank_lines`` (a list the blank
    lines' numbers are put in, costing one more pass over the file) the rows after it keep their true numbers."""
    if not path.is_file():
        raise DataError(f"input file {path} does not exist")
    if path.stat().st_size == 0:
        raise DataError(f"input file {path} is empty")
    if path.suffix == ".parquet" or path.suffixes[-2:-1] == [".parquet"]:
        try:
            f = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{path}: not a readable Parquet file ({e})") from None
        missing = [c for c in columns if c not in f.schema_arrow.names]
        if missing:
            raise DataError(f"{path}: columns {missing} named in the schema are not in the file; "
                            f"it has {f.schema_arrow.names}")
        row = 1
        for b in f.iter_batches(batch_size=block_rows, columns=columns):
            yield pa.Table.from_batches([b]), np.arange(row, row + b.num_rows)
            row += b.num_rows
        return
    skipped: list[int] = []

    def handler(r: Any) -> str:
        skipped.append(r.number if r.number is not None else -1)
        bad.total += 1
        bad.add(np.array([r.number or -1]), f"wrong field count: {r.text[:80]!r}")
        return "skip"

    names = header(path)
    missing = [c for c in columns if c not in names]
    if missing:
        raise DataError(f"{path}: columns {missing} named in the schema are not in the CSV header {names}")
    reader = pacsv.open_csv(
        path,
        read_options=pacsv.ReadOptions(use_threads=False, block_size=max(1 << 20, block_rows * 64)),
        parse_options=pacsv.ParseOptions(invalid_row_handler=handler),
        convert_options=pacsv.ConvertOptions(column_types={c: pa.binary() for c in names}, include_columns=columns,
                                             strings_can_be_null=False, quoted_strings_can_be_null=False),
    )
    line = 2
    if blank_lines is not None:  # pyarrow skips blank lines without a word: find them to number rows truly
        blanks = blank_line_numbers(path)
        blank_lines.extend(blanks.tolist())
        skipped.extend(blanks.tolist())
    while True:
        try:
            b = reader.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError, EOFError) as e:
            raise DataError(f"{path}: cannot parse after line {line} ({e})") from None
        n = b.num_rows
        gaps = np.array(sorted(s for s in skipped if s >= line), np.int64)
        lines = np.setdiff1d(np.arange(line, line + n + len(gaps)), gaps)[:n]
        line = int(lines[-1]) + 1 if n else line
        yield pa.Table.from_batches([b]), lines


def blank_line_numbers(path: Path, block: int = 1 << 24) -> np.ndarray:
    """1-based numbers of the empty lines ("" or "\\r") of a text file, plain or compressed (by extension),
    in one vectorised pass over blocks of bytes."""
    out, line0, carry = [], 0, b""
    with pa.input_stream(str(path)) as fh:
        while True:
            data = fh.read(block)
            buf = carry + data
            if not data:
                buf += b"\n" if carry else b""
            a = np.frombuffer(buf, np.uint8)
            nl = np.flatnonzero(a == 10)
            if len(nl):
                start = np.concatenate([[0], nl[:-1] + 1])  # first byte of each complete line
                length = nl - start
                blank = (length == 0) | ((length == 1) & (a[np.minimum(start, len(a) - 1)] == 13))
                out.append(line0 + 1 + np.flatnonzero(blank))
                line0 += len(nl)
                carry = buf[nl[-1] + 1:]
            else:
                carry = buf
            if not data:
                break
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def header(path: Path) -> list[str]:
    """Column names of a CSV (its header line) or Parquet file."""
    if not path.is_file():
        raise DataError(f"input file {path} does not exist")
    if path.suffix == ".parquet" or path.suffixes[-2:-1] == [".parquet"]:
        try:
            return list(pq.ParquetFile(path).schema_arrow.names)
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    try:
        return csv_header(path)
    except (pa.ArrowInvalid, OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read the CSV header ({e})") from None


def csv_header(path: Path, delimiter: str = ",") -> list[str]:
    """The names on the first line of a CSV, plain or compressed (pyarrow decompresses by extension: .csv.gz,
    .csv.bz2, ... and drops a UTF-8 BOM); pyarrow's errors pass through.

    Parsed on this thread (``use_threads=False``): a threaded read returns while Arrow's pool still holds the
    line's Python buffer, and a pool thread that releases it once the interpreter is exiting aborts the process
    (exit 134, "terminate called without an active exception") after the clean error of a failed command.
    """
    with pa.input_stream(str(path)) as fh:
        first = fh.read(1 << 20).split(b"\n", 1)[0]
    return pacsv.read_csv(pa.py_buffer(first.rstrip(b"\r") + b"\n"),
                          read_options=pacsv.ReadOptions(use_threads=False),
                          parse_options=pacsv.ParseOptions(delimiter=delimiter)).schema.names
