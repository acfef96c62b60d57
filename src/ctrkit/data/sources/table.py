"""CSV / Parquet + a YAML feature spec -> ctrkit stores (the generic counterpart of :mod:`ctrkit.data.sources.criteo`).

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
count, label not 0/1, non-numeric dense, a dense value that is not finite or beyond the float32 range,
non-UTF-8 bytes; :mod:`ctrkit.data.pipeline.encode`) are counted once each, skipped and reported with their
line numbers (CSV: the physical line where the row starts, across blank lines and quoted newlines; Parquet:
1-based row). The input file and --valid / --test must be three different files (a symlink or hard link to
the same file is the same file).
CSVs may be compressed (``.csv.gz``, by extension) and start with a UTF-8 byte-order mark. ``options:``
holds the defaults of ``min_freq``, ``max_vocab``, ``max_vocab_mode`` and ``embedding_dim``; an unknown key
there or in a feature entry is an error naming the closest valid key. The split stores are published
together (:class:`~ctrkit.data.storage.splits.SplitOutput`): a failure or Ctrl-C leaves ``out`` as it was.

These rules are :class:`~ctrkit.data.pipeline.feature_pipeline.FeaturePipeline`'s (kind ``table``): this module reads,
splits and shuffles, the pipeline fits and transforms, and every store holds the fitted pipeline in
``<store>/pipeline``. The pipeline is fitted on the train rows only: the split (fractions per line number,
or the split column) is decided before a row is parsed, valid / test rows wait raw on disk
(:class:`~ctrkit.data.storage.spill.RawSpill`) and are mapped once the pipeline is fitted (values train never
saw -> 1). Explicit ``valid`` / ``test`` files (``--valid`` / ``--test``) are mapped the same way, the whole
input being train. ``vocab_from`` reuses another store's pipeline: its vocabularies and its dense statistics
(a standardized column is scaled with the training data's mean and std).
"""

from __future__ import annotations

import argparse
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ctrkit.data.pipeline.columns import to_string
from ctrkit.data.pipeline.encode import Encoded, as_columns
from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.pipeline.rows import BadRows, assign_split, parse_split, row_uniform, stream_key
from ctrkit.data.pipeline.rules import split_codes
from ctrkit.data.pipeline.spec import SPLITS, TableSpecYaml, load_spec
from ctrkit.data.pipeline.vocab import MODES, check_vocab_options
from ctrkit.data.sources.driver import Chunk, Frontend, Input, Summary, preprocess
from ctrkit.data.sources.table_read import header, iter_batches
from ctrkit.data.storage.spill import RawSpill
from ctrkit.errors import DataError
from ctrkit.io import check_distinct_inputs
from ctrkit.typecheck import EmbeddingDim, Fraction, MaxVocab, PositiveInt, Seed, cli_type

log = logging.getLogger(__name__)

# ---- the pipeline -------------------------------------------------------------------------------------------
DEFAULT_SPLIT = "0.8,0.1,0.1"


def _raw_split(t: pa.Table, lines: np.ndarray, spec: TableSpecYaml, fractions: tuple[float, float, float],
               key_split: int) -> np.ndarray:
    """Split code of every raw row (0 train, 1 valid, 2 test) before any value is parsed, so that only train
    rows reach the vocabularies. A split-column value that is not train / valid / test reads -1 (the row goes
    with train, whose encode reports it bad). Fractions draw per line number, as after parsing."""
    if not spec.split_column:
        return assign_split(row_uniform(key_split, lines), fractions)
    col = as_columns(t.select([spec.split_column]))[spec.split_column]
    return split_codes(to_string(col, lines, np.zeros(len(lines), bool), BadRows("split", keep=0),
                                 spec.split_column))


class _Table(Frontend):
    """A table's part of a preprocess run: batches of the input (train rows first; valid / test rows wait raw
    on disk while the pipeline is fitted), explicit valid / test files, the split rule, the manifest record."""

    kind = "table"
    dense_stats = True  # standardize: mean / std of the train rows

    def __init__(self, path: Path, spec: TableSpecYaml, pipe: FeaturePipeline, files: dict[str, Path], *,
                 fractions: tuple[float, float, float], options: dict[str, Any], block_rows: int,
                 vocab_from: Any = None) -> None:
        self.path, self.spec, self.pipe, self.files, self.fractions = path, spec, pipe, files, fractions
        # vocab_from as given (a checkpoint's pipeline: FittedSource); the options hold its path
        self.options, self.block_rows, self.vocab_from = options, block_rows, vocab_from
        self.grow, self.expire_after = bool(options.get("grow")), options.get("expire_after")
        seed = options["seed"]
        self.key_split, self.key_shard, self.shuffle_key = (stream_key(seed, 11), stream_key(seed, 12),
                                                            stream_key(seed, 13))
        self.est_rows = path.stat().st_size / (8 if path.suffix == ".gz" else 32) if path.exists() else 1  # gzip: ~4x
        nd = len(spec.dense)
        self.main = Input(path, BadRows(str(path)), np.zeros(nd, np.int64))
        self.source = {s: self.main for s in SPLITS} | {
            s: Input(f, BadRows(str(f)), np.zeros(nd, np.int64), split=SPLITS.index(s)) for s, f in files.items()}
        self.held: RawSpill | None = None

    def read(self, fitting: bool, tmp: Path) -> Iterator[Chunk]:
        """The input; while fitting (and without explicit valid / test files) valid / test rows wait raw."""
        self.held = RawSpill(tmp / "held-out.arrows") if fitting and not self.files else None
        for t, lines in iter_batches(self.path, self.spec.columns(), self.block_rows, self.main.bad):
            self.main.bad.total += t.num_rows
            if self.held is not None:
                later = _raw_split(t, lines, self.spec, self.fractions, self.key_split) > 0
                if later.any():
                    self.held.add(t.filter(pa.array(later)), lines[later])
                    t, lines = t.filter(pa.array(~later)), lines[~later]
            if t.num_rows:
                yield Chunk(t, self.main, lines)

    def read_held(self) -> Iterator[Chunk]:
        """Valid / test rows held out of the fit, then the explicit valid / test files; then the bad-row checks."""
        for t, lines in self.held if self.held is not None else ():
            yield Chunk(t, self.main, lines)
        for name, f in self.files.items():
            src = self.source[name]
            for t, lines in iter_batches(f, self.spec.columns(), self.block_rows, src.bad):
                src.bad.total += t.num_rows
                yield Chunk(t, src, lines)
        for src in dict.fromkeys(self.source.values()):
            if src.bad.total == 0:
                raise DataError(f"input file {src.path} contains no rows")
            src.bad.check(self.options["max_bad_fraction"])

    def route(self, chunk: Chunk, enc: Encoded) -> np.ndarray:
        """The split column's codes, else the fractions drawn per line number."""
        return enc.split if self.spec.split_column else assign_split(row_uniform(self.key_split, enc.lines),
                                                                     self.fractions)

    def shard_keys(self, chunk: Chunk, enc: Encoded) -> np.ndarray:
        return enc.lines.astype(np.uint64) + np.uint64(self.key_shard)

    def meta(self, split: str, summary: Summary) -> dict[str, Any]:
        src, spec, pipe = self.source[split], self.spec, self.pipe
        stats = {"input_rows": src.bad.total, "bad_rows": src.bad.bad,
                 "first_bad_lines": [{"file": str(src.path), "line": n, "reason": r} for n, r in src.bad.first],
                 "clamped_dense": {e["name"]: int(src.clamped[j]) for j, e in enumerate(spec.dense)},
                 "vocab_sizes": {t: v.size for t, v in pipe.vocabs_.items()}, "split_rows": summary.rows}
        dense_stats = {e["name"]: {"transform": e["transform"], "mean": float(pipe.mean_[j]),
                                   "std": float(pipe.std_[j])} for j, e in enumerate(spec.dense)}
        return {"preprocessing": {"kind": "table", "split": split, "input": str(src.path), "options": self.options,
                                  "spec": {"label": spec.label, "label_threshold": spec.label_threshold,
                                           "dense": spec.dense, "sparse": spec.sparse, "sequence": spec.sequence},
                                  "dense_stats": dense_stats, "tables": pipe.table_of},
                "stats": {**stats, "rows": summary.rows[split], "label_rate": summary.label_rate(split)}}


def preprocess_table(
    input: str | Path,
    schema_yaml: str | Path | dict[str, Any],
    out: str | Path,
    *,
    split: str | None = None,
    valid: str | Path | None = None,
    test: str | Path | None = None,
    seed: int = 0,
    min_freq: int | None = None,
    max_vocab: int | None = None,
    max_vocab_mode: str | None = None,
    embedding_dim: int | str | None = None,
    block_rows: int = 1 << 16,
    max_bad_fraction: float = 0.001,
    vocab_from: str | Path | None = None, grow: bool = False, expire_after: int | None = None,
    overwrite: bool = False,
    shard_bytes: int = 256 << 20,
    batch_rows: int | None = None,
) -> dict[str, Path]:
    """Preprocess one CSV (plain or .csv.gz) / Parquet file with a YAML feature spec into stores
    ``out/{train,valid,test}``.

    Split: the spec's ``split_column`` if set (values train / valid / test), else ``split`` fractions
    (seeded per row; default 0.8,0.1,0.1; "1" writes only ``train``), else, with ``valid`` / ``test`` files
    (either or both), the whole input is train and those files are the valid / test stores. The pipeline
    (vocabularies, dense statistics) is fitted on the train rows only; valid / test rows are then mapped
    with it (values train never saw -> id 1, as with ``vocab_from``). Train is shuffled on disk; valid / test
    keep input order. ``min_freq`` / ``max_vocab`` / ``max_vocab_mode`` / ``embedding_dim`` given here win over
    the spec's ``options``, which win over the built-in defaults (1, none, hash, auto); a sparse entry's own
    ``min_freq`` / ``embedding_dim`` win over both. ``block_rows``: rows per read block (``batch_rows`` is
    its deprecated old name). ``grow`` / ``expire_after``: grow ``vocab_from``'s vocabularies on the train rows.
    """
    if batch_rows is not None:
        warnings.warn("preprocess_table(batch_rows=...) is deprecated; use block_rows=", DeprecationWarning, 2)
        block_rows = batch_rows
    spec, path = load_spec(schema_yaml), Path(input)
    files = {name: Path(f) for name, f in (("valid", valid), ("test", test)) if f is not None}
    check_distinct_inputs([("input", path), *((f"--{n}", f) for n, f in files.items())])
    split = _check_split(spec, split, files)
    o = spec.options
    min_freq = int(min_freq if min_freq is not None else o.get("min_freq", 1))
    max_vocab = max_vocab if max_vocab is not None else o.get("max_vocab")
    max_vocab_mode = max_vocab_mode if max_vocab_mode is not None else o.get("max_vocab_mode", "hash")
    embedding_dim = embedding_dim if embedding_dim is not None else o.get("embedding_dim", "auto")
    check_vocab_options(min_freq, max_vocab, max_vocab_mode)
    fractions = parse_split(split) if split not in ("1", "1.0") else (1.0, 0.0, 0.0)
    pipe = FeaturePipeline.table(spec, min_freq=min_freq, max_vocab=max_vocab, max_vocab_mode=max_vocab_mode,
                                 embedding_dim=embedding_dim)
    options = {"split": None if files else split, "valid": str(files["valid"]) if "valid" in files else None,
               "test": str(files["test"]) if "test" in files else None, "seed": seed, "min_freq": min_freq,
               "max_vocab": max_vocab, "max_vocab_mode": max_vocab_mode, "embedding_dim": embedding_dim,
               "max_bad_fraction": max_bad_fraction, "vocab_from": str(vocab_from) if vocab_from else None,
               "grow": grow, "expire_after": expire_after}
    front = _Table(path, spec, pipe, files, fractions=fractions, options=options, block_rows=block_rows,
                   vocab_from=vocab_from)
    result, summary = preprocess(front, out, overwrite=overwrite, shard_bytes=shard_bytes)
    log.info("table %s: %d rows (%d bad) -> %s%s", path, front.main.bad.total, front.main.bad.bad,
             {k: summary.rows[k] for k in result}, "".join(f"; {n} from {f}" for n, f in files.items()))
    return result


def _check_split(spec: TableSpecYaml, split: str | None, files: dict[str, Path]) -> str:
    """The split option in effect, after checking that it, the spec's split column and explicit valid / test
    files do not contradict each other (and that those files have the spec's columns)."""
    if files and split not in (None, "1", "1.0"):
        raise DataError(f"split={split!r} (--split) cannot be combined with explicit valid / test files "
                        "(--valid / --test): with them the whole input is the training set. Drop --split, or "
                        "drop --valid / --test to split the input by fractions")
    if files and spec.split_column:
        raise DataError(f"the spec's split_column {spec.split_column!r} cannot be combined with explicit valid / "
                        "test files (--valid / --test); remove split_column from the spec, or drop --valid / --test")
    for name, f in files.items():  # fail before the long pass over the training file
        if not f.is_file():
            raise DataError(f"{name} file {f} (--{name}) does not exist")
        have = header(f)
        missing = [c for c in spec.columns() if c not in have]
        if missing:
            raise DataError(f"{name} file {f} (--{name}): columns {missing} named in the schema are not in it; "
                            f"it has {have}")
    if spec.split_column and split is not None:
        log.warning("split=%r (--split) is not used: the spec's split_column %r decides the split", split,
                    spec.split_column)
    if split is None:
        split = "1" if files else DEFAULT_SPLIT
    return split


# ---- command line ------------------------------------------------------------------------------------------
def add_preprocess_table_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``ctrkit preprocess table``."""
    p.add_argument("input", help="CSV (with header; plain or compressed: .csv.gz) or Parquet file")
    p.add_argument("--schema", required=True, help="YAML feature spec (see examples/movielens_100k.yaml)")
    p.add_argument("--out", required=True,
                   help="output directory; stores go to OUT/train, OUT/valid, OUT/test")
    p.add_argument("--split", default=None,
                   help=f"train,valid,test fractions of INPUT (default {DEFAULT_SPLIT}; '1' = train only)")
    p.add_argument("--valid", default=None, metavar="FILE",
                   help="validation file (same columns as INPUT), mapped with the pipeline fitted on INPUT; "
                        "INPUT is then all train (not with --split or a spec split_column)")
    p.add_argument("--test", default=None, metavar="FILE", help="test file, as --valid")
    p.add_argument("--seed", type=cli_type(Seed), default=0, help="seed of the split and the shuffle")
    p.add_argument("--min-freq", type=cli_type(PositiveInt), default=None,
                   help="values seen fewer times map to id 1 (rare)")
    p.add_argument("--max-vocab", type=cli_type(MaxVocab), default=None,
                   help="cap every vocabulary at this many ids")
    p.add_argument("--max-vocab-mode", choices=MODES, default=None,
                   help="hash or cap (default: the spec's options, else hash)")
    p.add_argument("--embedding-dim", type=cli_type(EmbeddingDim), default=None,
                   help="default embedding dim, or 'auto'")
    p.add_argument("--block-rows", type=cli_type(PositiveInt), default=1 << 16,
                   help="rows per read block (memory vs speed)")
    p.add_argument("--max-bad-fraction", type=cli_type(Fraction), default=0.001,
                   help="fail above this fraction of bad rows")
    p.add_argument("--vocab-from", default=None,
                   help="store (or checkpoint) whose vocabularies to reuse (unseen values -> 1)")
    p.add_argument("--grow", action="store_true",
                   help="with --vocab-from: grow its vocabularies on the train rows (known ids kept; new values "
                        "reaching --min-freq, counted with the parent's counts, get new ids after the parent's)")
    p.add_argument("--expire-after", type=cli_type(PositiveInt), default=None, metavar="N",
                   help="with --grow: evict values not seen in the last N versions (days); their ids are reused")
    p.add_argument("--overwrite", action="store_true", help="replace existing output stores")
    return p


def run_preprocess_table(args: argparse.Namespace) -> dict[str, Path]:
    """Run :func:`preprocess_table` from parsed arguments."""
    return preprocess_table(
        args.input, args.schema, args.out, split=args.split, valid=args.valid, test=args.test, seed=args.seed,
        min_freq=args.min_freq, max_vocab=args.max_vocab, max_vocab_mode=args.max_vocab_mode,
        embedding_dim=args.embedding_dim, block_rows=args.block_rows, max_bad_fraction=args.max_bad_fraction,
        vocab_from=args.vocab_from, overwrite=args.overwrite, grow=args.grow,
        expire_after=args.expire_after,
    )
