"""Raw files -> transformed columns through a fitted :class:`~ctrkit.data.pipeline.feature_pipeline.FeaturePipeline`, in
input order and in chunks of bounded size: what ``ctrkit predict`` scores.

The file is read in the format the pipeline was fitted on: Criteo TSV (plain or gzip; the block parser of
:mod:`ctrkit.data.pipeline.criteo_parse`) for ``criteo`` pipelines, CSV with a header or Parquet for the others.
The label column is optional (Criteo lines of 39 fields, or a table without it). Every row is scored or
the run fails: a malformed row is an error naming its file and line, never a row silently left out. Blank
lines are not rows: they are counted (:class:`ReadStats`) and each row keeps its own (physical) line number.
A line whose fields are all empty is a row of missing values: in a one-column CSV that is an empty line, and
a Criteo line of tabs only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.pipeline.criteo_parse import NUM_FIELDS, TextBlock, parse_block
from ctrkit.data.pipeline.feature_pipeline import CRITEO, FeaturePipeline
from ctrkit.data.pipeline.rows import BadRows
from ctrkit.data.sources.criteo_read import block_columns, iter_blocks
from ctrkit.data.sources.table_read import header, iter_batches
from ctrkit.errors import DataError
from ctrkit.io import missing_path

_AVG_LINE_BYTES = 256
_NON_EMPTY_LINE = re.compile(rb"(?m)^(?=[^\n])")


@dataclass
class RawChunk:
    """About ``rows`` raw rows of a file, as columns the pipeline reads, with their 1-based line numbers
    (CSV: physical lines, the header being line 1; Parquet: row numbers)."""

    columns: Any
    lines: np.ndarray


@dataclass
class ReadStats:
    """What a pass over a file skipped without scoring: blank lines (never rows)."""

    blank_lines: int = 0


def iter_raw(pipe: FeaturePipeline, path: str | Path, rows: int = 8192,
             stats: ReadStats | None = None) -> Iterator[RawChunk]:
    """Raw chunks of ``path`` in input order (see the module docstring); malformed rows are an error."""
    path = Path(path)
    if not path.is_file():
        raise DataError(missing_path(path, "input file"))
    stats = stats if stats is not None else ReadStats()
    if pipe.kind == CRITEO:
        yield from _criteo(path, rows, stats)
        return
    have = set(header(path))
    s = pipe.spec
    optional = {s.label, s.weight, s.group_id, s.split_column}
    columns = [c for c in pipe.input_columns() if c in have or c not in optional]
    bad = BadRows(str(path), keep=5)
    for t, lines in iter_batches(path, columns, rows, bad, stats):
        if bad.bad:
            _refuse(path, bad.first)
        yield RawChunk(t, lines)


def iter_transformed(pipe: FeaturePipeline, path: str | Path, rows: int = 8192) -> Iterator[dict[str, Any]]:
    """Transformed columns of about ``rows`` raw rows at a time, in input order."""
    for chunk in iter_raw(pipe, path, rows):
        yield transform_chunk(pipe, path, chunk)


def transform_chunk(pipe: FeaturePipeline, path: str | Path, chunk: RawChunk) -> dict[str, Any]:
    """``chunk`` through ``pipe``; a malformed row is an error naming ``path`` and its line."""
    try:
        return pipe.transform(chunk.columns, lines=chunk.lines)
    except DataError as e:
        raise DataError(f"{path}: {e}; predict scores every row, so fix or remove the malformed rows") from None


def _criteo(path: Path, rows: int, stats: ReadStats) -> Iterator[RawChunk]:
    labelled: bool | None = None
    line0 = 0
    for buf, _ in iter_blocks(path, max(1 << 16, rows * _AVG_LINE_BYTES)):
        if labelled is None:  # the first non-empty line decides: 40 fields with a label, 39 without
            first = next((ln for ln in buf.tobytes().split(b"\n") if ln.rstrip(b"\r")), None)  # tabs only: a row
            if first is None:
                n = buf.count_lines()
                line0 += n
                stats.blank_lines += n
                continue
            labelled = first.count(b"\t") + 1 != NUM_FIELDS - 1
        if not labelled:  # a placeholder label before every non-empty line: 40 fields for the block parser
            buf = TextBlock.of(_NON_EMPTY_LINE.sub(b"0\t", buf.tobytes()))
        blk = parse_block(buf)
        if blk.bad:
            note = "" if labelled else f" (counting a label: the file's first line has {NUM_FIELDS - 1} fields)"
            _refuse(path, sorted((int(line0 + i + 1), reason + note) for idx, reason in blk.bad for i in idx[:5]))
        cols = block_columns(blk)
        if not labelled:
            del cols["label"]
        stats.blank_lines += blk.empty_lines
        yield RawChunk(cols, line0 + blk.line + 1)
        line0 += blk.n_lines


def _refuse(path: Path, first: list[tuple[int, str]]) -> None:
    where = "; ".join(f"line {n}: {r}" for n, r in first[:5])
    raise DataError(f"{path}: malformed rows ({where}); predict scores every row, so fix or remove them")

