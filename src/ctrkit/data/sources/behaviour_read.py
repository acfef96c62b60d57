"""Readers of :mod:`ctrkit.data.sources.behaviour`: CSV / Parquet behaviour logs and S3-Rec sequence files -> raw
columns (pyarrow arrays of keys, times in seconds), with malformed rows counted, skipped and reported by line.

Key columns (user, item, attributes) are integers when every value of the column is one (``" 42 "`` -> 42),
else trimmed text; an empty attribute is missing. Times: numbers (seconds, or any monotone unit matching
``--session-gap``), ISO date-times (-> seconds since the epoch) or Parquet timestamps.
"""

from __future__ import annotations

import gzip
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ctrkit.data.pipeline.columns import numeric, to_string
from ctrkit.data.pipeline.rows import BadRows
from ctrkit.data.pipeline.rules import INT_KEY, NUMBER
from ctrkit.data.sources.csv_lines import LineStream
from ctrkit.data.sources.table_read import csv_header
from ctrkit.errors import DataError

log = logging.getLogger(__name__)

_INT = f"^{INT_KEY}$"
_NUMBER = f"^{NUMBER}$"  # (on trimmed text)


@dataclass
class RawLog:
    """Rows of a behaviour log: keys (nulls only in attributes), times or None (file order)."""

    user: pa.Array  # (n,)
    item: pa.Array  # (n,)
    time: np.ndarray | None  # (n,) float64 seconds
    attrs: dict[str, pa.Array] = field(default_factory=dict)  # source column -> (n,) keys
    stats: dict[str, Any] = field(default_factory=dict)


def _open_text(path: Path) -> str:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read()
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise DataError(f"{path}: cannot read it as (gzipped) UTF-8 text ({e})") from None


def read_s3rec(path: Path) -> RawLog:
    """``user item_1 item_2 ...`` per line (time order) -> one row per (user, item)."""
    if not path.is_file():
        raise DataError(f"input file {path} does not exist")
    lines = pa.array(_open_text(path).splitlines(), pa.string())
    toks = pc.utf8_split_whitespace(pc.utf8_trim_whitespace(lines))
    flat = pc.list_flatten(toks)
    n_tok = pc.list_value_length(toks).to_numpy(zero_copy_only=False).astype(np.int64)
    line_of = np.repeat(np.arange(len(lines)), n_tok)  # (T,) 0-based line of each token
    keep = pc.not_equal(pc.utf8_length(flat), 0).to_numpy(zero_copy_only=False)
    flat, line_of = flat.filter(pa.array(keep)), line_of[keep]
    first = np.ones(len(line_of), bool)  # (T,) the line's first token: its user
    first[1:] = line_of[1:] != line_of[:-1]
    user_tok = np.flatnonzero(first)
    n_per_line = np.bincount(line_of, minlength=len(lines))
    is_item = ~first
    user = flat.take(pa.array(user_tok[np.cumsum(first)[is_item] - 1]))
    item = flat.filter(pa.array(is_item))
    if len(item) == 0:
        raise DataError(f"{path}: no behaviours; expected lines 'user item_1 item_2 ...'")
    stats = {"rows_read": len(lines), "empty_lines": int((n_per_line == 0).sum()),
             "users_without_behaviours": int((n_per_line == 1).sum())}
    return RawLog(_int_if_all(user), _int_if_all(item), None, stats=stats)


def _int_if_all(s: pa.Array) -> pa.Array:
    """Text keys -> int64 when every non-null value is an integer, else the text."""
    valid = s.drop_null()
    if len(valid) and pc.all(pc.match_substring_regex(valid, _INT)).as_py():
        return pc.cast(s, pa.int64())
    return s


def _csv_names(path: Path, delimiter: str) -> list[str]:
    """The header line's names (the file may be gzipped; later malformed lines do not matter here)."""
    try:
        return csv_header(path, delimiter)
    except (pa.ArrowInvalid, OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read the CSV header ({e}); without one pass --no-header --names") from None


def _read_table(path: Path, fmt: str, cols: list[str], *, header: bool, names: list[str] | None, delimiter: str,
                bad: BadRows) -> tuple[pa.Table, np.ndarray]:
    """(the columns ``cols`` of the file, 1-based line / row numbers [n])."""
    if not path.is_file():
        raise DataError(f"input file {path} does not exist")
    if fmt == "parquet":
        try:
            f = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{path}: not a readable Parquet file ({e})") from None
        have = f.schema_arrow.names
        missing = [c for c in cols if c not in have]
        if missing:
            raise DataError(f"{path}: columns {missing} are not in the file; it has {have}; set --user-col, "
                            "--item-col, --attr-cols, --time-col, --type-col")
        t = f.read(columns=cols)
        return t, np.arange(1, t.num_rows + 1)
    if not header and not names:
        raise DataError(f"{path}: --no-header needs --names (the column names, comma-separated)")
    have = names or _csv_names(path, delimiter)
    missing = [c for c in cols if c not in have]
    if missing:
        where = "--names" if names else "the CSV header"
        raise DataError(f"{path}: columns {missing} are not in {where} {have}; set --user-col, --item-col, "
                        "--attr-cols, --time-col, --type-col (or --no-header --names for a file without header)")
    stream = LineStream(path, delimiter)
    skipped: list[int] = []  # pyarrow's record numbers of the rows it skipped (the first line is record 1)

    def handler(r: Any) -> str:
        rec = r.number if r.number is not None else -1
        skipped.append(rec)
        bad.add(stream.lines_of(np.array([rec])) if rec > 0 else np.array([-1]), f"wrong field count: {r.text[:80]!r}")
        return "skip"

    try:
        with stream:
            t = pacsv.read_csv(
                stream,
                read_options=pacsv.ReadOptions(use_threads=False, block_size=1 << 24, column_names=names,
                                               skip_rows=1 if (names and header) else 0),
                parse_options=pacsv.ParseOptions(delimiter=delimiter, invalid_row_handler=handler),
                convert_options=pacsv.ConvertOptions(column_types={c: pa.binary() for c in cols}, include_columns=cols,
                                                     strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, OSError, EOFError) as e:
        raise DataError(f"{path}: cannot parse the CSV ({e})") from None
    first = 2 if header else 1
    gaps = np.array(sorted(skipped), np.int64)
    records = np.setdiff1d(np.arange(first, first + t.num_rows + len(gaps)), gaps)[: t.num_rows]
    bad.total = t.num_rows + len(skipped)
    return t, stream.lines_of(records)


def _keys(col: pa.Array, lines: np.ndarray, badm: np.ndarray, bad: BadRows, name: str, required: bool) -> pa.Array:
    """A key column -> int64 or trimmed text, empty -> null; an empty required key marks its row bad."""
    if pa.types.is_floating(col.type):
        try:
            col = pc.cast(col, pa.int64())
        except pa.ArrowInvalid:
            col = pc.cast(col, pa.string())
    if not pa.types.is_integer(col.type):
        s = pc.utf8_trim_whitespace(to_string(col, lines, badm, bad, name))
        col = _int_if_all(pc.if_else(pc.equal(pc.utf8_length(s), 0), pa.scalar(None, pa.string()), s))
    else:
        col = pc.cast(col, pa.int64())
    if required and col.null_count:
        miss = col.is_null().to_numpy(zero_copy_only=False) & ~badm
        badm |= miss
        bad.add(lines[miss], f"column {name!r} is empty")
    return col


def _times(col: pa.Array, lines: np.ndarray, badm: np.ndarray, bad: BadRows, name: str) -> np.ndarray:
    """Seconds float64 [n]; an empty or unreadable time marks its row bad."""
    dt = col if pa.types.is_timestamp(col.type) or pa.types.is_date(col.type) else None
    if dt is None and (pa.types.is_binary(col.type) or pa.types.is_string(col.type)):
        s = pc.utf8_trim_whitespace(to_string(col, lines, badm, bad, name))
        col = pc.if_else(pc.equal(pc.utf8_length(s), 0), pa.scalar(None, pa.string()), s)
        if not pc.any(pc.match_substring_regex(col, _NUMBER)).as_py():  # no numbers: date-times?
            try:
                dt = pc.cast(col, pa.timestamp("s"))
            except pa.ArrowInvalid:
                dt = None
    if dt is not None:
        secs = pc.cast(pc.cast(dt, pa.timestamp("s")), pa.int64())
        t = pc.cast(secs, pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    else:
        t = numeric(col, lines, badm, bad, f"time {name!r}")
    empty = np.isnan(t) & ~badm
    badm |= empty
    bad.add(lines[empty], f"time {name!r} is empty")
    return t


def read_log(path: Path, fmt: str, *, user_col: str, item_col: str, attr_cols: list[str], time_col: str | None,
             type_col: str | None, types: list[str] | None, header: bool, names: list[str] | None,
             delimiter: str, max_bad_fraction: float, rating_col: str | None = None,
             min_rating: float | None = None) -> RawLog:
    """A CSV / Parquet behaviour log -> :class:`RawLog` (bad rows skipped, ``types`` filtered, rows rated below
    ``min_rating`` in ``rating_col`` dropped: a rating turned into a click, as a table label's threshold)."""
    cols = list(dict.fromkeys(c for c in (user_col, item_col, *attr_cols, time_col, type_col, rating_col) if c))
    bad = BadRows(str(path))
    t, lines = _read_table(path, fmt, cols, header=header, names=names, delimiter=delimiter, bad=bad)
    if fmt == "parquet":
        bad.total = t.num_rows
    if t.num_rows == 0:
        raise DataError(f"input file {path} contains no rows")
    badm = np.zeros(t.num_rows, bool)

    def col(c: str) -> pa.Array:
        return t.column(c).combine_chunks()

    user = _keys(col(user_col), lines, badm, bad, user_col, True)
    item = _keys(col(item_col), lines, badm, bad, item_col, True)
    attrs = {c: _keys(col(c), lines, badm, bad, c, False) for c in attr_cols}
    time = _times(col(time_col), lines, badm, bad, time_col) if time_col else None
    kind = to_string(col(type_col), lines, badm, bad, type_col) if type_col else None
    rating = _ratings(col(rating_col), lines, badm, bad, rating_col) if rating_col else None
    bad.check(max_bad_fraction)
    keep = ~badm
    stats: dict[str, Any] = {"rows_read": bad.total, "bad_rows": bad.bad,
                             "first_bad_lines": [{"file": str(path), "line": n, "reason": r} for n, r in bad.first]}
    if kind is not None:
        counts = pc.value_counts(kind.filter(pa.array(keep))).to_pylist()
        stats["behaviour_types"] = {c["values"]: c["counts"] for c in counts}
        if types:
            unknown = [x for x in types if x not in stats["behaviour_types"]]
            if unknown:
                log.warning("%s: behaviour types %s do not occur in column %r (it has %s)", path, unknown,
                            type_col, sorted(stats["behaviour_types"]))
            keep &= pc.is_in(kind, value_set=pa.array(types, pa.string())).to_numpy(zero_copy_only=False)
            stats["rows_filtered_out"] = int((~badm).sum() - keep.sum())
            if not keep.any():
                raise DataError(f"{path}: no row has a behaviour type in {types} (column {type_col!r} holds "
                                f"{sorted(stats['behaviour_types'])}); fix --behaviour-types")
    if rating is not None:
        clicked = keep & (rating >= min_rating)
        stats["rows_below_min_rating"] = int(keep.sum() - clicked.sum())
        if not clicked.any():
            raise DataError(f"{path}: no row has {rating_col!r} >= --min-rating {min_rating:g} (the ratings read lie "
                            f"in [{np.nanmin(rating[keep]):g}, {np.nanmax(rating[keep]):g}]); lower --min-rating")
        keep = clicked
    if not keep.all():
        mask = pa.array(keep)
        user, item = user.filter(mask), item.filter(mask)
        attrs = {c: a.filter(mask) for c, a in attrs.items()}
        time = None if time is None else time[keep]
    return RawLog(user, item, time, attrs, stats)


def _ratings(col: pa.Array, lines: np.ndarray, badm: np.ndarray, bad: BadRows, name: str) -> np.ndarray:
    """Ratings float64 [n]; an empty or non-numeric rating marks its row bad."""
    if pa.types.is_binary(col.type) or pa.types.is_string(col.type):
        s = pc.utf8_trim_whitespace(to_string(col, lines, badm, bad, name))
        col = pc.if_else(pc.equal(pc.utf8_length(s), 0), pa.scalar(None, pa.string()), s)
    r = numeric(col, lines, badm, bad, f"rating {name!r}")
    empty = ~np.isfinite(r) & ~badm
    badm |= empty
    bad.add(lines[empty], f"rating {name!r} is empty or not finite")
    return r
