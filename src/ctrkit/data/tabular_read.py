"""The spec and column readers of :mod:`ctrkit.data.tabular`: YAML feature spec parsing and validation,
CSV / Parquet batch reading with bad-row accounting, the per-column converters (text, numbers,
delimited tokens, last-``max_len`` truncation) the pipeline applies to every batch, and :class:`RawSpill`
(raw rows parked on disk until the pipeline is fitted)."""

from __future__ import annotations

import difflib
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import yaml

from ctrkit.data.rows import BadRows, DataError

SPLITS = ("train", "valid", "test")
TRANSFORMS = ("none", "log", "standardize")
_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
_TOP_KEYS = {"label", "weight", "group_id", "split_column", "dense", "sparse", "sequence", "options"}
_DENSE_KEYS = {"name", "column", "transform", "group"}
_SPARSE_KEYS = {"name", "column", "embedding_dim", "table", "group", "min_freq", "multi_valued", "delimiter",
                "pooling", "max_len"}
_SEQ_KEYS = {"name", "column", "shares", "max_len", "delimiter", "pooling", "group"}
_LABEL_KEYS = {"column", "threshold"}
OPTION_KEYS = {"min_freq", "max_vocab", "max_vocab_mode", "embedding_dim"}  # preprocess_table's defaults


def _check_keys(where: str, what: str, given: Any, valid: set[str]) -> None:
    """Raise :class:`DataError` naming the unknown keys of ``given`` and the closest valid ones."""
    unknown = [k for k in given if k not in valid]
    if unknown:
        near = {k: difflib.get_close_matches(str(k), sorted(valid), n=1) for k in unknown}
        hint = " ".join(f"{k!r}: did you mean {m[0]!r}?" for k, m in near.items() if m)
        raise DataError(f"{where}: unknown keys {[str(k) for k in unknown]} in {what}; {hint + ' ' if hint else ''}"
                        f"valid keys: {sorted(valid)}")


# ---- spec -------------------------------------------------------------------------------------------------
@dataclass
class TableSpecYaml:
    """The parsed YAML spec (validated; unknown keys are errors naming the entry)."""

    label: str
    label_threshold: float | None
    weight: str | None
    group_id: str | None
    split_column: str | None
    dense: list[dict[str, Any]]
    sparse: list[dict[str, Any]]
    sequence: list[dict[str, Any]]
    options: dict[str, Any] = field(default_factory=dict)

    def columns(self) -> list[str]:
        cols = [self.label, self.weight, self.group_id, self.split_column]
        cols += [e["column"] for e in (*self.dense, *self.sparse, *self.sequence)]
        return list(dict.fromkeys(c for c in cols if c))

    def to_dict(self) -> dict[str, Any]:
        """The spec as YAML-shaped data: ``load_spec(spec.to_dict())`` gives it back."""
        label: Any = self.label if self.label_threshold is None else {"column": self.label,
                                                                     "threshold": self.label_threshold}
        return {"label": label, "weight": self.weight, "group_id": self.group_id, "split_column": self.split_column,
                "dense": [dict(e) for e in self.dense], "sparse": [dict(e) for e in self.sparse],
                "sequence": [dict(e) for e in self.sequence], "options": dict(self.options)}


def load_spec(path_or_dict: str | Path | dict[str, Any]) -> TableSpecYaml:
    """Read and validate a YAML feature spec."""
    where = str(path_or_dict) if not isinstance(path_or_dict, dict) else "spec"
    if isinstance(path_or_dict, dict):
        d = path_or_dict
    else:
        p = Path(path_or_dict)
        if not p.is_file():
            raise DataError(f"schema file {p} does not exist")
        try:
            d = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise DataError(f"{p} is not valid YAML: {e}") from e
    if not isinstance(d, dict):
        raise DataError(f"{where}: top level must be a mapping with keys {sorted(_TOP_KEYS)}")
    _check_keys(where, "the top level", d, _TOP_KEYS)
    if "label" not in d:
        raise DataError(f"{where}: needs a 'label' column")
    label, thr = d["label"], None
    if isinstance(label, dict):
        _check_keys(where, "label", label, _LABEL_KEYS)
        label, thr = label.get("column"), label.get("threshold")
        if label is None or thr is None:
            raise DataError(f"{where}: label as a mapping needs 'column' and 'threshold'")
    entries: dict[str, list[dict[str, Any]]] = {}
    for kind, keys in (("dense", _DENSE_KEYS), ("sparse", _SPARSE_KEYS), ("sequence", _SEQ_KEYS)):
        out = []
        for i, e in enumerate(d.get(kind) or []):
            if isinstance(e, str):
                e = {"name": e}
            if not isinstance(e, dict) or "name" not in e:
                raise DataError(f"{where}: {kind} entry #{i} needs a 'name'")
            _check_keys(where, f"{kind} feature {e['name']!r}", e, keys)
            e = {"column": e["name"], **e}
            if kind == "dense" and e.setdefault("transform", "none") not in TRANSFORMS:
                raise DataError(f"{where}: dense feature {e['name']!r}: transform {e['transform']!r} is not "
                                f"one of {TRANSFORMS}")
            if kind == "sequence" and ("shares" not in e or "max_len" not in e):
                raise DataError(f"{where}: sequence feature {e['name']!r} needs 'shares' and 'max_len'")
            out.append(e)
        entries[kind] = out
    opts = d.get("options") or {}
    if not isinstance(opts, dict):
        raise DataError(f"{where}: options must be a mapping with keys {sorted(OPTION_KEYS)}, got {opts!r}")
    _check_keys(where, "options", opts, OPTION_KEYS)
    return TableSpecYaml(str(label), thr, d.get("weight"), d.get("group_id"), d.get("split_column"),
                         entries["dense"], entries["sparse"], entries["sequence"], opts)


# ---- reading ----------------------------------------------------------------------------------------------
def iter_batches(path: Path, columns: list[str], batch_rows: int, bad: BadRows,
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
        for b in f.iter_batches(batch_size=batch_rows, columns=columns):
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
        read_options=pacsv.ReadOptions(use_threads=False, block_size=max(1 << 20, batch_rows * 64)),
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
    try:  # pyarrow decompresses by extension (.csv.gz, .csv.bz2, ...) and drops a UTF-8 BOM
        with pa.input_stream(str(path)) as fh:
            first = fh.read(1 << 20).split(b"\n", 1)[0]
        return pacsv.read_csv(io.BytesIO(first.rstrip(b"\r") + b"\n")).schema.names
    except (pa.ArrowInvalid, OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read the CSV header ({e})") from None


def to_string(col: pa.Array | np.ndarray, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows, name: str) -> pa.Array:
    """A column as text: binary -> string, numbers -> their text. Rows holding invalid UTF-8, or a value
    that is no single value (a list, a mapping: rows given as dicts of nested data) are marked bad and read
    as null (a per-value check only on failure)."""
    if isinstance(col, np.ndarray):  # integers kept as numpy (pipeline_encode._normal's fast path)
        col = pa.array(col)
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return col
    if not pa.types.is_binary(t):
        if not pa.types.is_nested(t):
            try:
                return pc.cast(col, pa.string())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
        what = "a list or mapping" if pa.types.is_nested(t) else f"a {t} value"
        bad.flag(col.is_valid().to_numpy(zero_copy_only=False), lines,
                 f"column {name!r} holds {what}, not a single value", bad_rows)
        return pa.nulls(len(col), pa.string())
    try:
        return pc.cast(col, pa.string())
    except pa.ArrowInvalid:
        vals = col.to_pylist()
        invalid = []
        for i, v in enumerate(vals):  # error path only
            try:
                v is None or v.decode("utf-8")
            except UnicodeDecodeError:
                invalid.append(i)
                vals[i] = b""
        bad.flag(np.array(invalid, np.int64), lines, f"column {name!r}: non-UTF-8 bytes", bad_rows)
        return pc.cast(pa.array(vals, pa.binary()), pa.string())


def numeric(col: pa.Array, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows, what: str) -> np.ndarray:
    """A column as float64 [n]; empty / null (and a float NaN, pandas' missing value) -> NaN. Non-numeric
    strings and values that are not finite (inf, or text like "1e400" beyond float64) mark the row bad and
    read as NaN."""
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
        # unsafe: an integer beyond 2^53 becomes the nearest float64 instead of an error
        x = pc.cast(col, pa.float64(), safe=False).fill_null(math.nan).to_numpy(zero_copy_only=False)
    else:
        s = to_string(col, lines, bad_rows, bad, what)
        empty = pc.equal(pc.utf8_trim_whitespace(s.fill_null("")), "")
        ok = pc.or_(pc.match_substring_regex(s.fill_null(""), _NUMBER), empty).to_numpy(zero_copy_only=False)
        if not ok.all():
            bad.flag(~ok, lines, f"{what} is not a number", bad_rows)
        clean = pc.if_else(pc.or_(empty, pa.array(~ok)), pa.scalar(None, pa.string()), s)
        x = pc.cast(pc.utf8_trim_whitespace(clean), pa.float64()).fill_null(math.nan).to_numpy(zero_copy_only=False)
    inf = np.isinf(x)
    if inf.any():
        x = np.where(inf, math.nan, x)
        bad.flag(inf, lines, f"{what} is not finite (inf, or beyond the float64 range)", bad_rows)
    return x


def tokens(col: pa.Array | np.ndarray, delimiter: str, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows,
           name: str) -> tuple[pa.Array, np.ndarray]:
    """A multi-valued column (delimited string or list) -> (flat values, lengths [n]); empty and null tokens
    dropped. Tokens are integers or text (list items of other types are read as text); a row whose list holds
    lists or mappings, or non-UTF-8 bytes, is marked bad and gets no tokens."""
    if isinstance(col, pa.Array) and (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        lst = col.fill_null(pa.scalar([], col.type))
    else:
        s = to_string(col, lines, bad_rows, bad, name).fill_null("")
        lst = pc.split_pattern(s, delimiter)
    flat = pc.list_flatten(lst)
    parent = pc.list_parent_indices(lst).to_numpy(zero_copy_only=False).astype(np.int64)
    if pa.types.is_floating(flat.type):
        try:  # integer ids that came as floats
            flat = pc.cast(flat, pa.int64())
        except pa.ArrowInvalid:
            pass
    if not (pa.types.is_integer(flat.type) or pa.types.is_string(flat.type)):
        scratch = np.zeros(len(flat), bool)
        flat = to_string(flat, parent, scratch, BadRows(name, keep=0), name)  # token-level check ...
        if scratch.any():  # ... reported per row
            bad.flag(np.unique(parent[scratch]), lines, f"column {name!r} holds nested lists or non-UTF-8 bytes",
                     bad_rows)
    keep = flat.is_valid()
    if pa.types.is_string(flat.type):
        flat = pc.utf8_trim_whitespace(flat)
        keep = pc.and_(keep, pc.not_equal(pc.utf8_length(flat), 0))
    keep = keep.fill_null(False).to_numpy(zero_copy_only=False) & ~bad_rows[parent]
    if not keep.all():
        flat, parent = flat.filter(pa.array(keep)), parent[keep]
    lengths = np.bincount(parent, minlength=len(col)).astype(np.int64)
    return flat, lengths


def keep_last(values: np.ndarray, lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the last ``max_len`` values of every row of a jagged column."""
    if len(lengths) == 0 or lengths.max(initial=0) <= max_len:
        return values, lengths
    ends = np.cumsum(lengths)
    row = np.repeat(np.arange(len(lengths)), lengths)
    keep = (ends[row] - np.arange(len(values))) <= max_len
    return values[keep], np.minimum(lengths, max_len)


def kind_of(col: pa.Array) -> str:
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return "int" if pa.types.is_integer(t) else "str"


def is_list_or_int(col: pa.Array) -> bool:
    t = col.type
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_integer(t)


class RawSpill:
    """Raw rows (as read, with their line numbers) kept on disk in an Arrow IPC stream and read back in
    order: the valid / test rows of a fraction split wait here until the pipeline is fitted on train."""

    def __init__(self, path: Path) -> None:
        self.path, self.rows = Path(path), 0
        self._line_col = "__ctrkit_line__"
        self._sink: Any = None
        self._writer: Any = None
        self._schema: pa.Schema | None = None

    def add(self, t: pa.Table, lines: np.ndarray) -> None:
        """Append the rows of ``t`` read at ``lines`` [n]."""
        if t.num_rows == 0:
            return
        while self._schema is None and self._line_col in t.column_names:
            self._line_col += "_"
        t = t.append_column(self._line_col, pa.array(np.asarray(lines, np.int64)))
        if self._schema is None:
            self._schema = t.schema
            self._sink = pa.OSFile(str(self.path), "wb")
            self._writer = pa.ipc.new_stream(self._sink, t.schema)
        elif t.schema != self._schema:
            t = t.cast(self._schema)
        self._writer.write_table(t)
        self.rows += t.num_rows

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = None

    def __iter__(self) -> Iterator[tuple[pa.Table, np.ndarray]]:
        """(batch table, its line numbers [n]) in the order they were added."""
        self.close()
        if self.rows == 0:
            return
        with pa.memory_map(str(self.path)) as src:
            for b in pa.ipc.open_stream(src):
                lines = b.column(self._line_col).to_numpy(zero_copy_only=False)
                yield pa.Table.from_batches([b.drop_columns([self._line_col])]), lines
