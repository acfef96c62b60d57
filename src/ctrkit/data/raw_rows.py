"""Raw files -> transformed columns through a fitted :class:`~ctrkit.data.pipeline.FeaturePipeline`, in
input order and in chunks of bounded size: what ``ctrkit predict`` scores.

The file is read in the format the pipeline was fitted on: Criteo TSV (plain or gzip; the block parser of
:mod:`ctrkit.data.criteo_parse`) for ``criteo`` pipelines, CSV with a header or Parquet for the others.
The label column is optional (Criteo lines of 39 fields, or a table without it). Every row is scored or
the run fails: a malformed row is an error naming its file and line, never a row silently left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ctrkit.data.criteo import block_columns, iter_blocks
from ctrkit.data.criteo_parse import NUM_FIELDS, parse_block
from ctrkit.data.pipeline import CRITEO, FeaturePipeline
from ctrkit.data.rows import BadRows, DataError
from ctrkit.data.tabular_read import header, iter_batches

_AVG_LINE_BYTES = 256
_NON_EMPTY_LINE = re.compile(rb"(?m)^(?=[^\n])")


def iter_transformed(pipe: FeaturePipeline, path: str | Path, rows: int = 8192) -> Iterator[dict[str, Any]]:
    """Columns of about ``rows`` raw rows at a time (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"input file {path} does not exist")
    if pipe.kind == CRITEO:
        yield from _criteo(pipe, path, rows)
        return
    have = set(header(path))
    s = pipe.spec
    optional = {s.label, s.weight, s.group_id, s.split_column}
    columns = [c for c in pipe.input_columns() if c in have or c not in optional]
    bad = BadRows(str(path), keep=5)
    for t, lines in iter_batches(path, columns, rows, bad):
        if bad.bad:
            _refuse(path, bad.first)
        try:
            yield pipe.transform(t, lines=lines)
        except DataError as e:
            raise DataError(f"{path}: {e}; predict scores every row, so fix or remove the malformed rows") from None


def _criteo(pipe: FeaturePipeline, path: Path, rows: int) -> Iterator[dict[str, Any]]:
    labelled: bool | None = None
    line0 = 0
    for buf, _ in iter_blocks(path, max(1 << 16, rows * _AVG_LINE_BYTES)):
        if labelled is None:  # the first non-empty line decides: 40 fields with a label, 39 without
            first = next((ln for ln in buf.split(b"\n") if ln.strip()), None)
            if first is None:
                line0 += buf.count(b"\n")
                continue
            labelled = first.count(b"\t") + 1 != NUM_FIELDS - 1
        if not labelled:  # a placeholder label before every non-empty line: 40 fields for the block parser
            buf = _NON_EMPTY_LINE.sub(b"0\t", buf)
        blk = parse_block(buf)
        if blk.bad:
            note = "" if labelled else f" (counting a label: the file's first line has {NUM_FIELDS - 1} fields)"
            _refuse(path, sorted((int(line0 + i + 1), reason + note) for idx, reason in blk.bad for i in idx[:5]))
        cols = block_columns(blk)
        if not labelled:
            del cols["label"]
        yield pipe.transform(cols, lines=line0 + blk.line + 1)
        line0 += blk.n_lines


def _refuse(path: Path, first: list[tuple[int, str]]) -> None:
    where = "; ".join(f"line {n}: {r}" for n, r in first[:5])
    raise DataError(f"{path}: malformed rows ({where}); predict scores every row, so fix or remove them")

