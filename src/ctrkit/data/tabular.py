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
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
from ctrkit.data.tabular_read import (
    SPLITS,
    is_list_or_int,
    iter_batches,
    keep_last,
    kind_of,
    load_spec,
    numeric,
    to_string,
    tokens,
)
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
            builders[table] = VocabBuilder(table, kind_of(values) if isinstance(values, pa.Array) else "str")
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
        for t, lines in iter_batches(path, spec.columns(), batch_rows, bad):
            n = t.num_rows
            bad.total += n
            badm = np.zeros(n, bool)
            col = {c: t.column(c).combine_chunks() for c in t.column_names}
            y = numeric(col[spec.label], lines, badm, bad, f"label {spec.label!r}")
            if spec.label_threshold is not None:
                y = np.where(np.isnan(y), np.nan, (y >= spec.label_threshold).astype(np.float64))
            lab_bad = ~np.isin(y, (0.0, 1.0)) & ~badm
            if lab_bad.any():
                badm |= lab_bad
                bad.add(lines[lab_bad], f"label {spec.label!r} is not 0 or 1")
            dense = np.zeros((n, len(spec.dense)))
            for j, e in enumerate(spec.dense):
                x = np.nan_to_num(numeric(col[e["column"]], lines, badm, bad, f"dense {e['name']!r}"), nan=0.0)
                if e["transform"] == "log":
                    low = x + 3 <= math.exp(-2)
                    clamped[j] += int(low.sum())
                    with np.errstate(divide="ignore", invalid="ignore"):
                        x = np.where(low, -2.0, np.log(np.maximum(x + 3, 1e-300)))
                dense[:, j] = x
            w = None
            if spec.weight:
                w = np.nan_to_num(numeric(col[spec.weight], lines, badm, bad, f"weight {spec.weight!r}"), nan=1.0)
            if spec.split_column:
                sv = to_string(col[spec.split_column], lines, badm, bad, spec.split_column)
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
            strs = {e["column"]: to_string(col[e["column"]], lines, badm, bad, e["column"])
                    for e in (*single, *multi, *spec.sequence) if not is_list_or_int(col[e["column"]])}
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
                flat, lens = tokens(values(e["column"]), e.get("delimiter", "|"), lines[keep],
                                     np.zeros(len(keep), bool), bad, e["name"])
                table = table_of[e["shares"]] if "shares" in e else table_of[e["name"]]
                ids = ids_for(table, flat) if len(flat) else np.zeros(0, np.int64)
                if e.get("max_len"):
                    ids, lens = keep_last(ids, lens, int(e["max_len"]))
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
