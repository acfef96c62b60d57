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
from ctrkit.data.sources.csv_lines import LineStream
from ctrkit.errors import DataError


def iter_batches(path: Path, columns: list[str], block_rows: int, bad: BadRows,
                 stats: Any = None) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """(batch table, 1-based line / row numbers [n]) for CSV (strings, header line 1; plain or compressed,
    by extension: .csv.gz) or Parquet. CSV rows keep their physical line numbers, the first line of a row
    whose quoted fields hold newlines (:class:`~ctrkit.data.sources.csv_lines.LineStream`, in the same pass).
    A blank CSV line is not a row, except in a one-column file, where it is a row whose only field is empty
    (missing); ``stats.blank_lines`` (when given) is set to the number of blank lines skipped so far."""
    if not path.is_file():
        raise DataError(f"input file {path} does not exist")
    if path.stat().st_size == 0:
        raise DataError(f"input file {path} is empty")
    if path.suffix == ".parquet" or path.suffixes[-2:-1] == [".parquet"]:
        yield from _parquet_batches(path, columns, block_rows)
        return
    yield from _csv_batches(path, columns, block_rows, bad, stats)


def _parquet_batches(path: Path, columns: list[str], block_rows: int) -> Iterator[tuple[pa.Table, np.ndarray]]:
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


def _csv_batches(path: Path, columns: list[str], block_rows: int, bad: BadRows,
                 stats: Any) -> Iterator[tuple[pa.Table, np.ndarray]]:
    names = header(path)
    missing = [c for c in columns if c not in names]
    if missing:
        raise DataError(f"{path}: columns {missing} named in the schema are not in the CSV header {names}")
    keep_blank = len(names) == 1  # one column: an empty line is a row whose only field is empty
    stream = LineStream(path, ",", keep_blank=keep_blank)
    skipped: list[int] = []  # pyarrow's record numbers of the rows it skipped

    def handler(r: Any) -> str:
        rec = r.number if r.number is not None else -1
        skipped.append(rec)
        bad.total += 1
        bad.add(stream.lines_of(np.array([rec])) if rec > 0 else np.array([-1]), f"wrong field count: {r.text[:80]!r}")
        return "skip"

    reader = pacsv.open_csv(
        stream,
        read_options=pacsv.ReadOptions(use_threads=False, block_size=max(1 << 20, block_rows * 64)),
        parse_options=pacsv.ParseOptions(invalid_row_handler=handler, ignore_empty_lines=not keep_blank),
        convert_options=pacsv.ConvertOptions(column_types={c: pa.binary() for c in names}, include_columns=columns,
                                             strings_can_be_null=False, quoted_strings_can_be_null=False),
    )
    record = 2  # the next data row's record number (the header is record 1)
    with stream:
        while True:
            try:
                b = reader.read_next_batch()
            except StopIteration:
                break
            except (pa.ArrowInvalid, OSError, EOFError) as e:
                line = int(stream.lines_of(np.array([record]))[0])
                raise DataError(f"{path}: cannot parse after line {line} ({e})") from None
            n = b.num_rows
            gaps = np.array(sorted(s for s in skipped if s >= record), np.int64)
            records = np.setdiff1d(np.arange(record, record + n + len(gaps)), gaps)[:n]
            lines = stream.lines_of(records)
            record = int(records[-1]) + 1 if n else record
            skipped[:] = [s for s in skipped if s >= record]
            stream.forget_before(record)
            if stats is not None:
                stats.blank_lines = stream.blank_lines
            yield pa.Table.from_batches([b]), lines
        if stats is not None:
            stats.blank_lines = stream.blank_lines


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
