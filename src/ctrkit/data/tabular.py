"""CSV / Parquet + a YAML feature spec -> ctrkit stores (the generic counterpart of :mod:`ctrkit.data.criteo`).

The YAML spec (see ``examples/movielens_100k.yaml``)::

    label: label                  # a 0/1 column, or {column: rating, threshold: 4} -> rating >= 4
    weight: null                  # optional sample-weight column
    group_id: user_id             # optional group column (GAUC); stored as first-appearance ids
    split_column: null            # optional column holding train / valid / test
    dense:
      - {name: age, transform: standardize}     # none | log (ln(x+3), clamped at -2) | standardize
    sparse:
      - {name: user_id, group: user, embedding_dim: 16, min_freq: 1}
      - {name: genres, multi_valued: true, delimiter: "|", pooling: mean}
    sequence:
      - {name: hist_items, shares: item_id, max_len: 20, delimiter: "|"}

Each entry may name its source with ``column:`` (default: ``name``). Rules shared with Criteo: empty /
null -> missing (dense 0, id 0); categorical values get first-appearance ids from 2 (1 = rare / unseen),
one vocabulary per embedding table (features with the same ``table`` share it; a sequence uses the
vocabulary of the feature it ``shares``, fitted on both). Multi-valued and sequence columns are
delimited strings or Parquet lists; sequences keep their last ``max_len`` values. ``standardize`` uses
the mean / std of the train rows (kept in ``preprocessing.dense_stats``). Malformed rows (wrong field
count, label not 0/1, non-numeric dense, non-UTF-8 bytes) are counted, skipped and reported with their
line numbers (CSV: physical line, assuming no blank lines or quoted newlines; Parquet: 1-based row).
"""

from __future__ import annotations

import argparse
import io
import logging
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

from ctrkit.data.rows import (
    BadRows,
    DataError,
    ShardSpill,
    SpillColumn,
    TempDir,
    assign_split,
    jagged_take,
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
from ctrkit.schema import DenseFeature, Schema, SequenceFeature, SparseFeature

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
TRANSFORMS = ("none", "log", "standardize")
_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
_TOP_KEYS = {"label", "weight", "group_id", "split_column", "dense", "sparse", "sequence", "options"}
_DENSE_KEYS = {"name", "column", "transform", "group"}
_SPARSE_KEYS = {"name", "column", "embedding_dim", "table", "group", "min_freq", "multi_valued", "delimiter",
                "pooling", "max_len"}
_SEQ_KEYS = {"name", "column", "shares", "max_len", "delimiter", "pooling", "group"}


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
    unknown = set(d) - _TOP_KEYS
    if unknown:
        raise DataError(f"{where}: unknown keys {sorted(unknown)}; valid keys: {sorted(_TOP_KEYS)}")
    if "label" not in d:
        raise DataError(f"{where}: needs a 'label' column")
    label, thr = d["label"], None
    if isinstance(label, dict):
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
            bad = set(e) - keys
            if bad:
                raise DataError(f"{where}: {kind} feature {e['name']!r} has unknown keys {sorted(bad)}; "
                                f"valid keys: {sorted(keys)}")
            e = {"column": e["name"], **e}
            if kind == "dense" and e.setdefault("transform", "none") not in TRANSFORMS:
                raise DataError(f"{where}: dense feature {e['name']!r}: transform {e['transform']!r} is not "
                                f"one of {TRANSFORMS}")
            if kind == "sequence" and ("shares" not in e or "max_len" not in e):
                raise DataError(f"{where}: sequence feature {e['name']!r} needs 'shares' and 'max_len'")
            out.append(e)
        entries[kind] = out
    opts = d.get("options") or {}
    return TableSpecYaml(str(label), thr, d.get("weight"), d.get("group_id"), d.get("split_column"),
                         entries["dense"], entries["sparse"], entries["sequence"], opts)


# ---- reading ----------------------------------------------------------------------------------------------
def _iter_batches(path: Path, columns: list[str], batch_rows: int, bad: BadRows) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """(batch table, 1-based line / row numbers [n]) for CSV (strings, header line 1) or Parquet."""
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

    try:
        with open(path, "rb") as fh:
            first = fh.readline()
        names = pacsv.read_csv(io.BytesIO(first.rstrip(b"\r\n") + b"\n")).schema.names
    except (pa.ArrowInvalid, OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read the CSV header ({e})") from None
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


def _to_string(col: pa.Array, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows, name: str) -> pa.Array:
    """binary -> string; rows holding invalid UTF-8 are marked bad (a per-value check only on failure)."""
    if not pa.types.is_binary(col.type):
        return col if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) else pc.cast(col, pa.string())
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
        inv = np.array(invalid, np.int64)
        bad_rows[inv] = True
        bad.add(lines[inv], f"column {name!r}: non-UTF-8 bytes")
        return pc.cast(pa.array(vals, pa.binary()), pa.string())


def _numeric(col: pa.Array, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows, what: str) -> np.ndarray:
    """A column as float64 [n]; empty / null -> NaN; non-numeric strings mark the row bad."""
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
        return pc.cast(col, pa.float64()).fill_null(math.nan).to_numpy(zero_copy_only=False)
    s = _to_string(col, lines, bad_rows, bad, what)
    empty = pc.equal(pc.utf8_trim_whitespace(s.fill_null("")), "")
    ok = pc.or_(pc.match_substring_regex(s.fill_null(""), _NUMBER), empty).to_numpy(zero_copy_only=False)
    if not ok.all():
        idx = np.flatnonzero(~ok)
        bad_rows[idx] = True
        bad.add(lines[idx], f"{what} is not a number")
    clean = pc.if_else(pc.or_(empty, pa.array(~ok)), pa.scalar(None, pa.string()), s)
    return pc.cast(pc.utf8_trim_whitespace(clean), pa.float64()).fill_null(math.nan).to_numpy(zero_copy_only=False)


def _tokens(col: pa.Array, delimiter: str, lines: np.ndarray, bad_rows: np.ndarray, bad: BadRows,
            name: str) -> tuple[pa.Array, np.ndarray]:
    """A multi-valued column (delimited string or list) -> (flat values, lengths [n]); empty tokens dropped."""
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        lst = col.fill_null(pa.scalar([], col.type))
    else:
        s = _to_string(col, lines, bad_rows, bad, name).fill_null("")
        lst = pc.split_pattern(s, delimiter)
    flat = pc.list_flatten(lst)
    parent = pc.list_parent_indices(lst).to_numpy()
    if pa.types.is_string(flat.type) or pa.types.is_binary(flat.type):
        flat = pc.utf8_trim_whitespace(flat) if pa.types.is_string(flat.type) else flat
        keep = pc.not_equal(pc.utf8_length(flat) if pa.types.is_string(flat.type) else pc.binary_length(flat),
                            0).to_numpy(zero_copy_only=False)
        flat, parent = flat.filter(pa.array(keep)), parent[keep]
    lengths = np.bincount(parent, minlength=len(col)).astype(np.int64)
    return flat, lengths


def _keep_last(values: np.ndarray, lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep the last ``max_len`` values of every row of a jagged column."""
    if len(lengths) == 0 or lengths.max(initial=0) <= max_len:
        return values, lengths
    ends = np.cumsum(lengths)
    row = np.repeat(np.arange(len(lengths)), lengths)
    keep = (ends[row] - np.arange(len(values))) <= max_len
    return values[keep], np.minimum(lengths, max_len)


def _kind_of(col: pa.Array) -> str:
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    return "int" if pa.types.is_integer(t) else "str"


# ---- the pipeline -------------------------------------------------------------------------------------------
def preprocess_table(
    input: str | Path,
    schema_yaml: str | Path | dict[str, Any],
    out: str | Path,
    *,
    split: str | None = "0.8,0.1,0.1",
    seed: int = 0,
    min_freq: int | None = None,
    max_vocab: int | None = None,
    max_vocab_mode: str = "hash",
    embedding_dim: int | str | None = None,
    batch_rows: int = 1 << 16,
    max_bad_fraction: float = 0.001,
    vocab_from: str | Path | None = None,
    overwrite: bool = False,
    shard_bytes: int = 256 << 20,
) -> dict[str, Path]:
    """Preprocess one CSV / Parquet file with a YAML feature spec into stores ``out/{train,valid,test}``.

    Split: the spec's ``split_column`` if set (values train / valid / test), else ``split`` fractions
    (seeded per row); ``split=None`` or "1" writes only ``train``. Train is shuffled on disk; valid /
    test keep input order. ``min_freq`` / ``max_vocab`` / ``embedding_dim`` default to the spec's
    ``options`` (a sparse entry's own ``min_freq`` / ``embedding_dim`` win). Returns {split: path}.
    """
    spec = load_spec(schema_yaml)
    path, out = Path(input), Path(out)
    o = spec.options
    min_freq = int(min_freq if min_freq is not None else o.get("min_freq", 1))
    max_vocab = max_vocab if max_vocab is not None else o.get("max_vocab")
    max_vocab_mode = o.get("max_vocab_mode", max_vocab_mode)
    embedding_dim = embedding_dim if embedding_dim is not None else o.get("embedding_dim", "auto")
    check_vocab_options(min_freq, max_vocab, max_vocab_mode)
    fractions = parse_split(split) if split not in (None, "1", "1.0") else (1.0, 0.0, 0.0)
    for s in SPLITS:
        if (out / s).exists() and not overwrite:
            raise StoreError(f"output {out / s} already exists; choose another --out or pass --overwrite")

    # one vocabulary per embedding table
    table_of = {e["name"]: e.get("table") or e["name"] for e in spec.sparse}
    for q in spec.sequence:
        if q["shares"] not in table_of:
            raise DataError(f"sequence feature {q['name']!r} shares {q['shares']!r}, which is not a sparse feature; "
                            f"sparse features: {sorted(table_of)}")
    table_min_freq: dict[str, int] = {}
    for e in spec.sparse:
        table_min_freq.setdefault(table_of[e["name"]], int(e.get("min_freq", min_freq)))
    frozen: dict[str, Vocabulary] | None = load_vocabularies(vocab_from) if vocab_from is not None else None
    if frozen is not None:
        need = set(table_of.values()) | ({"__group__"} if spec.group_id else set())
        miss = sorted(need - set(frozen))
        if miss:
            raise DataError(f"vocab_from={vocab_from} has no vocabularies for tables {miss}")
    builders: dict[str, VocabBuilder] = {}

    def ids_for(table: str, values: Any) -> np.ndarray:
        if frozen is not None:
            return frozen[table].lookup(values)
        if table not in builders:
            builders[table] = VocabBuilder(table, _kind_of(values) if isinstance(values, pa.Array) else "str")
        b = builders[table]
        if b.kind == "int" and isinstance(values, pa.Array) and not pa.types.is_integer(values.type):
            raise DataError(f"vocabulary {table!r} mixes integer and string columns; give them the same type")
        return b.add(values)

    single = [e for e in spec.sparse if not e.get("multi_valued")]
    multi = [e for e in spec.sparse if e.get("multi_valued")]
    spill_cols: dict[str, SpillColumn] = {"label": SpillColumn("<f4"), "dense": SpillColumn("<f8", (len(spec.dense),)),
                                          "sparse": SpillColumn("<i8", (len(single),))}
    if spec.weight:
        spill_cols["weight"] = SpillColumn("<f4")
    if spec.group_id:
        spill_cols["group"] = SpillColumn("<i8")
    for e in (*multi, *spec.sequence):
        spill_cols[e["name"]] = SpillColumn("<i8", jagged=True)

    bad = BadRows(str(path))
    sums = np.zeros((2, len(spec.dense)))  # train sum, sum of squares (for standardize)
    clamped = np.zeros(len(spec.dense), np.int64)
    pos_rows = np.zeros(3, np.int64)
    key_split, key_shard = stream_key(seed, 11), stream_key(seed, 12)
    est_rows = path.stat().st_size / 32 if path.exists() else 1
    with TempDir(out, ".table-tmp-") as tmp:
        row_bytes = 8 * (len(spill_cols) + len(spec.dense) + len(single) + 8)
        k_train = shard_count(est_rows, row_bytes, shard_bytes)
        roll = max(1, shard_bytes // row_bytes)  # valid / test keep input order in shards of bounded size
        spills = [ShardSpill(tmp / "train", k_train, spill_cols)] + [
            ShardSpill(tmp / s, 1, spill_cols, roll_rows=roll) for s in SPLITS[1:]]
        for t, lines in _iter_batches(path, spec.columns(), batch_rows, bad):
            n = t.num_rows
            bad.total += n
            badm = np.zeros(n, bool)
            col = {c: t.column(c).combine_chunks() for c in t.column_names}
            y = _numeric(col[spec.label], lines, badm, bad, f"label {spec.label!r}")
            if spec.label_threshold is not None:
                y = np.where(np.isnan(y), np.nan, (y >= spec.label_threshold).astype(np.float64))
            lab_bad = ~np.isin(y, (0.0, 1.0)) & ~badm
            if lab_bad.any():
                badm |= lab_bad
                bad.add(lines[lab_bad], f"label {spec.label!r} is not 0 or 1")
            dense = np.zeros((n, len(spec.dense)))
            for j, e in enumerate(spec.dense):
                x = np.nan_to_num(_numeric(col[e["column"]], lines, badm, bad, f"dense {e['name']!r}"), nan=0.0)
                if e["transform"] == "log":
                    low = x + 3 <= math.exp(-2)
                    clamped[j] += int(low.sum())
                    with np.errstate(divide="ignore", invalid="ignore"):
                        x = np.where(low, -2.0, np.log(np.maximum(x + 3, 1e-300)))
                dense[:, j] = x
            w = None
            if spec.weight:
                w = np.nan_to_num(_numeric(col[spec.weight], lines, badm, bad, f"weight {spec.weight!r}"), nan=1.0)
            if spec.split_column:
                sv = _to_string(col[spec.split_column], lines, badm, bad, spec.split_column)
                code = np.full(n, -1, np.int8)
                for i, s in enumerate(SPLITS):
                    code[pc.equal(sv.fill_null(""), s).to_numpy(zero_copy_only=False)] = i
                unknown = (code < 0) & ~badm
                if unknown.any():
                    badm |= unknown
                    bad.add(lines[unknown], f"split column {spec.split_column!r} is not train/valid/test")
            else:
                code = assign_split(row_uniform(key_split, lines), fractions)
            # categorical columns: invalid UTF-8 marks the row bad before any value enters a vocabulary
            strs = {e["column"]: _to_string(col[e["column"]], lines, badm, bad, e["column"])
                    for e in (*single, *multi, *spec.sequence) if not _is_list_or_int(col[e["column"]])}
            good = ~badm
            keep = np.flatnonzero(good)
            take = pa.array(keep)
            kept_cols = {c: strs.get(c, a).take(take) for c, a in col.items()}

            def values(c: str, kept_cols: dict[str, pa.Array] = kept_cols) -> pa.Array:
                return kept_cols[c]

            sparse = np.zeros((len(keep), len(single)), np.int64)
            for j, e in enumerate(single):
                sparse[:, j] = ids_for(table_of[e["name"]], values(e["column"]))
            jag: dict[str, tuple[np.ndarray, np.ndarray]] = {}
            for e in (*multi, *spec.sequence):
                flat, lens = _tokens(values(e["column"]), e.get("delimiter", "|"), lines[keep],
                                     np.zeros(len(keep), bool), bad, e["name"])
                table = table_of[e["shares"]] if "shares" in e else table_of[e["name"]]
                ids = ids_for(table, flat) if len(flat) else np.zeros(0, np.int64)
                if e.get("max_len"):
                    ids, lens = _keep_last(ids, lens, int(e["max_len"]))
                jag[e["name"]] = (ids, lens)
            group = ids_for("__group__", values(spec.group_id)) if spec.group_id else None
            code, y, dense, lk = code[keep], y[keep], dense[keep], lines[keep]
            sums[0] += dense[code == 0].sum(0)
            sums[1] += (dense[code == 0] ** 2).sum(0)
            for s in range(3):
                sel = np.flatnonzero(code == s)
                if len(sel) == 0:
                    continue
                part: dict[str, Any] = {"label": y[sel], "dense": dense[sel], "sparse": sparse[sel]}
                if w is not None:
                    part["weight"] = w[keep][sel]
                if group is not None:
                    part["group"] = group[sel]
                for name, (v, ln) in jag.items():
                    part[name] = jagged_take(v, ln, sel)
                pos_rows[s] += int(y[sel].sum())
                shard = None
                if s == 0 and k_train > 1:
                    shard = (splitmix64(lk[sel].astype(np.uint64) + np.uint64(key_shard))
                             % np.uint64(k_train)).astype(np.int64)
                spills[s].add(part, shard)
        if bad.total == 0:
            raise DataError(f"input file {path} contains no rows")
        bad.check(max_bad_fraction)

        # ---- vocabularies, schema ----------------------------------------------------------------------
        luts: dict[str, np.ndarray | None] = {}
        if frozen is None:
            vocabs: dict[str, Vocabulary] = {}
            for table, b in builders.items():
                mf = table_min_freq.get(table, 1)
                vocabs[table], luts[table] = b.finish(mf, max_vocab if table != "__group__" else None,
                                                      max_vocab_mode)
        else:
            vocabs = {t: frozen[t] for t in (*table_of.values(), *(["__group__"] if spec.group_id else []))}
            luts = dict.fromkeys(vocabs)
        for table in set(table_of.values()) - set(vocabs):  # a table with no values at all
            vocabs[table] = Vocabulary.build(table, "str", np.array([], str), np.array([], np.int64))
            luts[table] = None
        save_vocabularies(tmp / "vocab", vocabs, fitted_on=str(path) if frozen is None else f"copied from {vocab_from}")
        sizes = {t: v.size for t, v in vocabs.items()}
        id_dtype = np.int32 if max(sizes.values(), default=2) <= np.iinfo(np.int32).max else np.int64
        n_train = int(spills[0].rows.sum())
        mean = sums[0] / max(n_train, 1)
        std = np.sqrt(np.maximum(sums[1] / max(n_train, 1) - mean**2, 0.0))
        std = np.where(std > 0, std, 1.0)
        stand = np.array([e["transform"] == "standardize" for e in spec.dense], bool)

        def dim(e: dict[str, Any]) -> int | str:
            d = e.get("embedding_dim", embedding_dim)
            return d if d == "auto" else int(d)

        schema = Schema(
            dense=[DenseFeature(e["name"], group=e.get("group", "context")) for e in spec.dense],
            sparse=[SparseFeature(e["name"], sizes[table_of[e["name"]]], dim(e), table=e.get("table"),
                                  group=e.get("group", "context"), pooling=e.get("pooling", "sum"),
                                  multi_valued=bool(e.get("multi_valued"))) for e in spec.sparse],
            sequence=[SequenceFeature(q["name"], int(q["max_len"]), q["shares"], q.get("pooling", "mean"),
                                      q.get("group", "user")) for q in spec.sequence],
            label="label", weight="weight" if spec.weight else None, group_id="group" if spec.group_id else None,
        )
        ids_str = np.dtype(id_dtype).str
        columns = [ColumnSpec("label", "label", "<f4")]
        if spec.weight:
            columns.append(ColumnSpec("weight", "weight", "<f4"))
        if spec.group_id:
            columns.append(ColumnSpec("group", "group", "<i8"))
        columns += [ColumnSpec(e["name"], "dense", "<f4") for e in spec.dense]
        columns += [ColumnSpec(e["name"], "sparse", ids_str) for e in single]
        columns += [ColumnSpec(e["name"], "jagged", ids_str) for e in (*multi, *spec.sequence)]
        dense_stats = {e["name"]: {"transform": e["transform"], "mean": float(mean[j]), "std": float(std[j])}
                       for j, e in enumerate(spec.dense)}
        rows = {s: int(sp.rows.sum()) for s, sp in zip(SPLITS, spills)}
        stats_common = {"input_rows": bad.total, "bad_rows": bad.bad,
                        "first_bad_lines": [{"file": str(path), "line": n, "reason": r} for n, r in bad.first],
                        "clamped_dense": {e["name"]: int(clamped[j]) for j, e in enumerate(spec.dense)},
                        "vocab_sizes": sizes, "split_rows": rows}
        options = {"split": split, "seed": seed, "min_freq": min_freq, "max_vocab": max_vocab,
                   "max_vocab_mode": max_vocab_mode, "embedding_dim": embedding_dim,
                   "max_bad_fraction": max_bad_fraction, "vocab_from": str(vocab_from) if vocab_from else None}

        def lut(table: str, ids: np.ndarray) -> np.ndarray:
            m = luts.get(table)
            return (m[ids] if m is not None else ids).astype(id_dtype)

        result: dict[str, Path] = {}
        shuffle_key = stream_key(seed, 13)
        for s, (name, spill) in enumerate(zip(SPLITS, spills)):
            if rows[name] == 0:
                continue
            with StoreWriter(out / name, schema, columns, overwrite=overwrite) as wtr:
                for shard in spill:
                    part = spill.read(shard, seed=[shuffle_key, shard] if s == 0 else None)
                    d = part["dense"]
                    d = np.where(stand, (d - mean) / std, d).astype(np.float32)
                    chunk: dict[str, Any] = {"label": part["label"]}
                    if spec.weight:
                        chunk["weight"] = part["weight"]
                    if spec.group_id:
                        chunk["group"] = lut("__group__", part["group"]).astype(np.int64)
                    for j, e in enumerate(spec.dense):
                        chunk[e["name"]] = d[:, j]
                    for j, e in enumerate(single):
                        chunk[e["name"]] = lut(table_of[e["name"]], part["sparse"][:, j])
                    for e in (*multi, *spec.sequence):
                        v, ln = part[e["name"]]
                        table = table_of[e["shares"]] if "shares" in e else table_of[e["name"]]
                        chunk[e["name"]] = (lut(table, v), ln)
                    wtr.append(chunk)
                link_tree(tmp / "vocab", wtr.tmp / "vocab")
                wtr.set_meta(
                    preprocessing={"kind": "table", "split": name, "input": str(path), "options": options,
                                   "spec": {"label": spec.label, "label_threshold": spec.label_threshold,
                                            "dense": spec.dense, "sparse": spec.sparse, "sequence": spec.sequence},
                                   "dense_stats": dense_stats, "tables": table_of},
                    stats={**stats_common, "rows": rows[name], "label_rate": float(pos_rows[s] / max(rows[name], 1))},
                )
            result[name] = out / name
    log.info("table %s: %d rows (%d bad) -> %s", path, bad.total, bad.bad, {k: rows[k] for k in result})
    return result


def _is_list_or_int(col: pa.Array) -> bool:
    t = col.type
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_integer(t)


# ---- command line ------------------------------------------------------------------------------------------
def add_preprocess_table_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``ctrkit preprocess table``."""
    p.add_argument("input", help="CSV (with header) or Parquet file")
    p.add_argument("--schema", required=True, help="YAML feature spec (see examples/movielens_100k.yaml)")
    p.add_argument("--out", required=True, help="output directory; stores go to OUT/train, OUT/valid, OUT/test")
    p.add_argument("--split", default="0.8,0.1,0.1", help="train,valid,test fractions ('1' = train only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the shuffle")
    p.add_argument("--min-freq", type=int, default=None, help="values seen fewer times map to id 1 (rare)")
    p.add_argument("--max-vocab", type=int, default=None, help="cap every vocabulary at this many ids")
    p.add_argument("--max-vocab-mode", choices=MODES, default="hash", help="hash (default) or cap")
    p.add_argument("--embedding-dim", default=None, help="default embedding dim, or 'auto'")
    p.add_argument("--batch-rows", type=int, default=1 << 16, help="rows per read batch")
    p.add_argument("--max-bad-fraction", type=float, default=0.001, help="fail above this fraction of bad rows")
    p.add_argument("--vocab-from", default=None, help="store whose vocabularies to reuse (unseen values -> 1)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output stores")
    return p


def run_preprocess_table(args: argparse.Namespace) -> dict[str, Path]:
    """Run :func:`preprocess_table` from parsed arguments."""
    return preprocess_table(
        args.input, args.schema, args.out, split=args.split, seed=args.seed, min_freq=args.min_freq,
        max_vocab=args.max_vocab, max_vocab_mode=args.max_vocab_mode, embedding_dim=args.embedding_dim,
        batch_rows=args.batch_rows, max_bad_fraction=args.max_bad_fraction, vocab_from=args.vocab_from,
        overwrite=args.overwrite,
    )
