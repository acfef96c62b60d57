"""Criteo TSV -> ctrkit stores, exactly as seed 000 §3.3.

Input: tab-separated lines ``label, I1..I13, C1..C26`` (40 fields; label 0/1; I* integers of at most 18
digits; C* 32-bit hashes written as 8 hex digits; any field except the label may be empty). One file, or the
day files ``day_0 .. day_23`` of the Criteo 1TB logs; plain or gzip; a UTF-8 byte-order mark at the start of
a file is ignored.

Rules (seed 000 §3.3):

1. missing (empty) fields -> 0;
2. dense ``d = ln(x + 3)`` stored as float32, where x is the raw integer (0 if missing); where
   ``x + 3 <= e^-2`` (integers: x <= -3, including ln 0 = -inf) d is clamped to -2 and counted per
   column in ``stats.clamped_dense``;
3. every categorical column is re-indexed on its own in first-appearance order over all input
   (:mod:`ctrkit.data.pipeline.vocab`): 0 = missing, 1 = rare/unseen, ids from 2;
4. day files: day_0 .. day_(D-1) shuffled -> ``train``, the last day -> ``test`` (optionally halved at
   random into ``valid`` / ``test``); otherwise a seeded ratio split (default 0.8/0.1/0.1).

Read -> fit/transform -> write: the rules above live in :class:`~ctrkit.data.pipeline.feature_pipeline.FeaturePipeline`
(kind ``criteo``); this module reads and splits the rows, the pipeline's streaming fitter gives them
provisional ids, and the stores are written through the fitted pipeline, which every store also holds
(``<store>/pipeline``, its vocabularies' one copy). ``vocab_from`` reuses another store's pipeline. The steps
(read -> fit or reuse -> transform -> spill / shuffle -> write splits -> publish) are the preprocess driver's
(:mod:`ctrkit.data.sources.driver`); this module is its Criteo front-end.

How it is fast: lines are tokenised and decoded by numpy on whole decompressed blocks
(:mod:`ctrkit.data.pipeline.criteo_parse`: SWAR bit arithmetic, no per-field Python); distinct values per chunk
are found with pyarrow's hash ``dictionary_encode``. Reading (and gunzip) runs in a background thread. The train shuffle scatters rows into temporary shards at random
(counter-based randomness, so the result does not depend on the chunk size) and shuffles each shard
in memory; memory stays bounded by one block, one shard and the vocabularies.

Malformed lines (wrong field count, label not 0/1, a dense field that is not an integer, e.g. "1e400",
a categorical not 8 hex digits, non-UTF-8 bytes) are skipped and counted once each; the first few are
logged with their 1-based line numbers and a reason naming the field, and kept in the manifest. If more
than ``max_bad_fraction`` of a file's rows are bad the run fails with :class:`~ctrkit.errors.DataError`.
The split stores are staged and published together (:class:`~ctrkit.data.storage.splits.SplitOutput`): a failure
or Ctrl-C leaves ``out`` as it was.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.background import background
from ctrkit.data.pipeline.criteo_parse import (
    NUM_DENSE,
    NUM_FIELDS,
    ParsedBlock,
    dense_transform,
    parse_block,
)
from ctrkit.data.pipeline.encode import Encoded
from ctrkit.data.pipeline.feature_pipeline import DENSE_NAMES, SPARSE_NAMES, FeaturePipeline
from ctrkit.data.pipeline.rows import BadRows, parse_split, stream_key
from ctrkit.data.pipeline.vocab import MODES, Vocabulary, check_vocab_options
from ctrkit.data.sources.criteo_parallel import preprocess_tasks
from ctrkit.data.sources.criteo_read import (
    DAY_RE,
    block_columns,
    check_day_sequence,
    day_number,
    is_gzip,
    iter_blocks,
    resolve_inputs,
)
from ctrkit.data.sources.criteo_tasks import RouteRule, file_lines
from ctrkit.data.sources.driver import Chunk, Frontend, Input, Summary, check_expiry, fit_or_reuse, preprocess
from ctrkit.errors import DataError
from ctrkit.memory import keep_freed_memory, numpy_huge_pages
from ctrkit.progress import progress_bar
from ctrkit.typecheck import EmbeddingDim, Fraction, MaxVocab, PositiveFloat, PositiveInt, Seed, cli_type

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
_AVG_LINE_BYTES = 256  # block_rows -> read block size


# ---- the front-end of the preprocess driver --------------------------------------------------------------
class _Criteo(Frontend):
    """Criteo's part of a preprocess run: blocks of parsed lines per file, the day / ratio split rule, the
    manifest record (see :func:`preprocess_criteo`)."""

    kind = "criteo"
    dense_stats = False  # ln(x + 3) needs no statistics
    row_bytes = 4 * NUM_FIELDS

    def __init__(self, files: list[Path], pipe: FeaturePipeline, *, options: dict[str, Any], day_mode: bool,
                 fractions: tuple[float, float, float] | None, shuffle: bool, progress: bool | None,
                 vocab_from: Any = None) -> None:
        self.files, self.pipe, self.options, self.day_mode, self.fractions = files, pipe, options, day_mode, fractions
        # vocab_from as given (a checkpoint's pipeline: FittedSource); the options hold its path
        self.vocab_from, self.shuffle_train, self.progress = vocab_from, shuffle, progress
        self.grow, self.expire_after = bool(options["grow"]), options["expire_after"]
        self.seed, self.valid_from_test = options["seed"], options["valid_from_test"]
        self.shuffle_key = stream_key(self.seed, 3)
        self.expected_splits = () if day_mode else tuple(n for n, f in zip(SPLITS, fractions or ()) if f > 0)
        comp = [0.25 if is_gzip(f) else 1.0 for f in files]  # gzip ratio of Criteo text is ~4
        self.est_rows = sum(f.stat().st_size / c for f, c in zip(files, comp)) / _AVG_LINE_BYTES * 1.5
        self.inputs = [Input(str(f), BadRows(str(f)), np.zeros(NUM_DENSE, np.int64), i) for i, f in enumerate(files)]
        self.rule = RouteRule(self.seed, day_mode, len(files), self.valid_from_test, fractions)
        self.empty_lines, self.t_read, self._stats = 0, 0.0, None
        self.damage: list[dict[str, Any]] = []
        self._t0 = time.perf_counter()

    def read(self, fitting: bool, tmp: Path) -> Iterator[Chunk]:
        """Every file's blocks: three stages on their own threads (read / gunzip -> tokenise / parse -> here)."""
        block_bytes = max(1 << 16, int(self.options["block_rows"]) * _AVG_LINE_BYTES)
        bar = _progress(sum(f.stat().st_size for f in self.files), self.progress)
        try:
            for path, src in zip(self.files, self.inputs):
                line0, last_pos, damage = 0, 0, []  # type: ignore[var-annotated]
                # both stages are closed (their threads stopped and joined) however this loop ends
                with closing(background(iter_blocks(path, block_bytes, damage=damage))) as blocks, \
                        closing(background((parse_block(buf), pos) for buf, pos in blocks)) as parsed:
                    for blk, pos in parsed:
                        for idx, reason in blk.bad:
                            src.bad.add(line0 + idx + 1, reason)
                        src.bad.total += blk.n_lines - blk.empty_lines
                        self.empty_lines += blk.empty_lines
                        yield Chunk(block_columns(blk), src, line0 + blk.line + 1)  # 1-based line numbers
                        line0 += blk.n_lines
                        limit = self.options["max_bad_fraction"]
                        if src.bad.bad > 10_000 and src.bad.bad / max(src.bad.total, 1) > limit:
                            src.bad.check(limit)  # stop early on a broken file
                        bar.update(pos - last_pos)
                        last_pos = pos
                for d in damage:
                    self.report_damage(d, src.bad.total)
                if src.bad.total == 0:
                    raise DataError(f"input file {path} contains no rows")
                src.bad.check(self.options["max_bad_fraction"])
        finally:
            bar.close()
        self.t_read = time.perf_counter() - self._t0

    def route(self, chunk: Chunk, enc: Encoded) -> np.ndarray:
        """Day files: the last day is test (its first and second half valid / test with ``valid_from_test``),
        the others train; else a seeded ratio split per line (:class:`RouteRule`, which the parallel tasks share)."""
        return self.rule.codes(chunk.source.index, enc.lines - 1)  # type: ignore[union-attr]

    def shard_keys(self, chunk: Chunk, enc: Encoded) -> np.ndarray:
        return self.rule.shard_keys(chunk.source.index, enc.lines - 1)  # type: ignore[union-attr]

    def report_damage(self, d: dict[str, Any], rows_kept: int) -> None:
        """A damaged (truncated / corrupt) gzip day: its rows before the damage are kept; warn and record it."""
        d = {**d, "rows_kept": int(rows_kept)}
        self.damage.append(d)
        log.warning("%s is damaged at compressed byte %d (%s): its %d rows before the damage are kept, the rest "
                    "of that day is lost%s; re-download the day to get them", d["file"], d["compressed_byte"],
                    d["reason"], rows_kept, " (with the line the damage cut)" if d.get("partial_line") else "")

    def meta(self, split: str, summary: Summary) -> dict[str, Any]:
        if self._stats is None:
            self._stats = self._common_stats(summary)
        return {"preprocessing": {"kind": "criteo", "split": split, "options": self.options,
                                  "inputs": self._inputs_meta(),
                                  "rules": "seed 000 §3.3: missing -> 0; dense ln(x+3) float32, x+3 <= e^-2 "
                                           "clamped to -2; categorical first-appearance ids, 0 missing, 1 rare"},
                "stats": {**self._stats, "rows": summary.rows[split], "label_rate": summary.label_rate(split)}}

    def _inputs_meta(self) -> list[dict[str, Any]]:
        last = self.files[-1]
        return [{"path": str(f), "bytes": f.stat().st_size,
                 "role": ("test" if f == last else "train") if self.day_mode else "split"} for f in self.files]

    def _common_stats(self, summary: Summary) -> dict[str, Any]:
        bads, vocabs = [src.bad for src in self.inputs], self.pipe.vocabs_
        return {
            "input_rows": sum(b.total for b in bads), "bad_rows": sum(b.bad for b in bads),
            "first_bad_lines": [{"file": b.file, "line": n, "reason": r} for b in bads for n, r in b.first][:20],
            "files": [b.to_dict() for b in bads], "empty_lines": self.empty_lines,
            "clamped_dense": dict(zip(DENSE_NAMES, sum(src.clamped for src in self.inputs).tolist())),
            "vocab_sizes": {c: vocabs[c].size for c in SPARSE_NAMES},
            "vocab": {c: vocabs[c].meta() for c in SPARSE_NAMES}, "split_rows": summary.rows,
            "damaged_files": self.damage,
        }


def _options(args: dict[str, Any], day_mode: bool) -> dict[str, Any]:
    """The run's options as the manifest records them, after checking them (``args``: the keyword arguments of
    :func:`preprocess_criteo`)."""
    check_vocab_options(args["min_freq"], args["max_vocab"], args["max_vocab_mode"])
    if not 0 <= args["max_bad_fraction"] <= 1:
        raise DataError(f"max_bad_fraction must be in [0, 1], got {args['max_bad_fraction']}")
    dim = args["embedding_dim"]
    if dim != "auto" and (not str(dim).isdigit() or int(dim) < 1):
        raise DataError(f"embedding_dim must be a positive integer or 'auto', got {dim!r}")
    if args["block_rows"] < 1:
        raise DataError(f"block_rows must be >= 1, got {args['block_rows']}")
    if args["task_bytes"] < 1:
        raise DataError(f"task_bytes must be >= 1, got {args['task_bytes']}")
    if args["vocab_memory_mb"] is not None and not args["vocab_memory_mb"] > 0:
        raise DataError(f"--vocab-memory-mb must be > 0 (MiB of vocabulary counts per worker), got "
                        f"{args['vocab_memory_mb']}")
    split = "days"
    if not day_mode:
        split = ",".join(f"{f:g}" for f in parse_split("0.8,0.1,0.1" if args["split"] is None else args["split"]))
        if args["valid_from_test"]:
            raise DataError("--valid-from-test applies to day files (day_0 .. day_N) without --split")
    if args["grow"] and not args["vocab_from"]:
        raise DataError("--grow grows the vocabularies of a parent: give it with --vocab-from STORE_OR_CHECKPOINT")
    if args["grow"] and args["vocab_memory_mb"] is not None:
        raise DataError("--grow counts the new values in memory: drop --vocab-memory-mb")
    check_expiry(args["grow"], args["expire_after"])
    keys = ("min_freq", "max_vocab", "max_vocab_mode", "split", "valid_from_test", "seed", "block_rows",
            "max_bad_fraction", "embedding_dim", "vocab_from", "grow", "expire_after")
    return {**{k: args[k] for k in keys}, "split": split, "embedding_dim": dim if dim == "auto" else int(dim),
            "vocab_from": str(args["vocab_from"]) if args["vocab_from"] else None}


def _pipeline(o: dict[str, Any]) -> FeaturePipeline:
    """The run's unfitted pipeline; fitted already when MLPerf's modulo ids need no fit (hash, min_freq 1)."""
    pipe = FeaturePipeline.criteo(min_freq=o["min_freq"], max_vocab=o["max_vocab"],
                                  max_vocab_mode=o["max_vocab_mode"], embedding_dim=o["embedding_dim"])
    if o["max_vocab"] is not None and o["max_vocab_mode"] == "hash" and o["min_freq"] == 1 and not o["vocab_from"]:
        pipe.vocabs_ = {c: Vocabulary.modulo(c, o["max_vocab"]) for c in SPARSE_NAMES}
    return pipe


def preprocess_criteo(
    inputs: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    min_freq: int = 1,
    max_vocab: int | None = None,
    max_vocab_mode: str = "hash",
    split: str | Sequence[float] | None = None,
    valid_from_test: bool = False,
    seed: int = 0,
    block_rows: int = 1 << 14,
    max_bad_fraction: float = 0.001,
    vocab_from: str | Path | None = None, grow: bool = False, expire_after: int | None = None,
    embedding_dim: int | str = 16,
    overwrite: bool = False,
    shard_bytes: int = 256 << 20,
    progress: bool | None = None,
    shuffle: bool = True,
    chunk_rows: int | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    task_bytes: int = 64 << 20,
    vocab_memory_mb: float | None = None,  # MiB
    resumable: bool = False,
) -> dict[str, Path]:
    """Preprocess Criteo TSV file(s) into one store per split under ``out`` -> {split: store path}.

    Splits: with ``split=None`` and day files (``day_<n>[.gz]``, at least two) the last day is the
    test set and the others are shuffled into train (``valid_from_test``: the last day's first ceil(n/2)
    lines are valid, the rest test, as torchrec and MLPerf split day_23); otherwise ``split`` (default
    "0.8,0.1,0.1", "train,valid,test" fractions) assigns rows at random (seeded, independent of chunking). Train is shuffled; valid and test keep
    input order. Empty splits are not written.

    Vocabularies are fitted on all input rows in input order (seed 000: first appearance over all data), or
    loaded from ``vocab_from`` (a store) and applied unchanged (unseen -> 1), or grown from it (``grow``:
    :mod:`ctrkit.data.pipeline.vocab_grow`; ``expire_after``: evict values not seen in that many versions); saved with the fitted pipeline in every store's ``pipeline/``.

    ``max_vocab`` (with ``max_vocab_mode`` 'hash' (default, torchrec's max_ind_range) or 'cap') and
    ``min_freq`` are described in :mod:`ctrkit.data.pipeline.vocab`. ``block_rows`` sets the read block
    (about block_rows * 256 bytes; ``chunk_rows`` is its deprecated old name); ``shard_bytes`` the size of one
    shuffle shard in memory. ``shuffle=False`` keeps train in input order too (e.g. ``predict``).
    ``workers`` (local processes), ``scheduler`` (a Dask address), ``resumable`` (one process, a task per file),
    ``vocab_memory_mb`` (spill exact counts past it, per worker): count / encode tasks, the same stores
    (:mod:`~.criteo_parallel`); ``task_bytes`` of a plain file per task.
    """
    if chunk_rows is not None:
        warnings.warn("preprocess_criteo(chunk_rows=...) is deprecated; use block_rows=", DeprecationWarning, 2)
        block_rows = chunk_rows
    files = resolve_inputs(inputs)
    day_mode = split is None and len(files) >= 2 and all(DAY_RE.match(f.name) for f in files)
    files = sorted(files, key=day_number) if day_mode else files
    if day_mode:
        check_day_sequence(files)
    options = _options(locals(), day_mode)  # checked; as the manifests record them
    fractions = None if day_mode else parse_split("0.8,0.1,0.1" if split is None else split)
    pipe = _pipeline(options)
    front = _Criteo(files, pipe, options=options, day_mode=day_mode, fractions=fractions, shuffle=shuffle,
                    progress=progress, vocab_from=vocab_from)
    return _run(front, out, overwrite=overwrite, shard_bytes=shard_bytes, workers=workers, scheduler=scheduler,
                task_bytes=task_bytes, vocab_memory_mb=vocab_memory_mb, tasks=resumable)


def _run(front: _Criteo, out: str | Path, *, overwrite: bool, shard_bytes: int, workers: int | None,
         scheduler: str | None, task_bytes: int, vocab_memory_mb: float | None = None,
         tasks: bool = False) -> dict[str, Path]:
    """One process through the driver, or count / encode tasks (``workers`` / ``scheduler``, ``tasks``, or a
    vocabulary memory budget: only the tasks spill the counts); logs a summary."""
    vocab_bytes = None if vocab_memory_mb is None else int(vocab_memory_mb * (1 << 20))
    if tasks and workers is None and scheduler is None:  # whole days: no line count to place the tasks
        task_bytes = max([task_bytes, *(f.stat().st_size for f in front.files)])
    if workers is None and scheduler is None and vocab_bytes is None and not tasks:
        if front.rule.valid_from_test:  # the halves of the last day need its length before its rows are routed
            front.rule = replace(front.rule, last_day_lines=file_lines(front.files[-1]))
        result, summary = preprocess(front, out, overwrite=overwrite, shard_bytes=shard_bytes)
    else:
        if front.vocab_from is not None:
            fit_or_reuse(front.pipe, front.vocab_from, front.grow, front.expire_after)
        result, summary = preprocess_tasks(front, out, workers=workers or 1, scheduler=scheduler,
                                           task_bytes=task_bytes, overwrite=overwrite, shard_bytes=shard_bytes,
                                           vocab_bytes=vocab_bytes)
    elapsed = time.perf_counter() - front._t0
    n_in, n_bad = sum(s.bad.total for s in front.inputs), sum(s.bad.bad for s in front.inputs)
    log.info("criteo: %d rows (%d bad) -> %s in %.1fs (read+parse %.1fs, %.0f rows/s)", n_in, n_bad,
             {k: summary.rows[k] for k in result}, elapsed, front.t_read, n_in / max(elapsed, 1e-9))
    return result


def _progress(total: int, enabled: bool | None) -> Any:
    return progress_bar(total, unit="B", unit_scale=True, desc="criteo", enabled=enabled)


# ---- command line -----------------------------------------------------------------------------------
def add_preprocess_criteo_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``ctrkit preprocess criteo``."""
    p.add_argument("inputs", nargs="+",
                   help="Criteo TSV file(s), plain or .gz; day_0 .. day_23 files or their directory")
    p.add_argument("--out", required=True,
                   help="output directory; stores go to OUT/train, OUT/valid, OUT/test")
    p.add_argument("--min-freq", type=cli_type(PositiveInt), default=1,
                   help="values seen fewer times map to id 1 (rare)")
    p.add_argument("--max-vocab", type=cli_type(MaxVocab), default=None,
                   help="cap every vocabulary at this many ids")
    p.add_argument("--max-vocab-mode", choices=MODES, default="hash",
                   help="hash: id = raw 32-bit value %% max_vocab, missing 0 (MLPerf / torchrec max_ind_range); "
                        "cap: the first values keep their ids")
    p.add_argument("--split", default=None,
                   help="train,valid,test fractions (default: last day file = test, else 0.8,0.1,0.1)")
    p.add_argument("--valid-from-test", action="store_true",
                   help="day files: the last day's first half is valid, its second half test (torchrec / MLPerf)")
    p.add_argument("--seed", type=cli_type(Seed), default=0, help="seed of the split and the shuffle")
    p.add_argument("--block-rows", type=cli_type(PositiveInt), default=1 << 14,
                   help="rows per read block (memory vs speed)")
    p.add_argument("--max-bad-fraction", type=cli_type(Fraction), default=0.001,
                   help="fail when more than this fraction of a file's rows are malformed")
    p.add_argument("--vocab-from", default=None,
                   help="store (or checkpoint) whose vocabularies to reuse (unseen values -> 1)")
    p.add_argument("--grow", action="store_true",
                   help="with --vocab-from: grow its vocabularies (known ids kept; new values reaching --min-freq, "
                        "counted with the parent's counts, get new ids after the parent's)")
    p.add_argument("--expire-after", type=cli_type(PositiveInt), default=None, metavar="N",
                   help="with --grow: evict values not seen in the last N versions (days); their ids are reused")
    p.add_argument("--embedding-dim", type=cli_type(EmbeddingDim), default="16",
                   help="embedding dim of every feature (one dim: what every model of the zoo takes), or 'auto' "
                        "(per feature, by vocabulary size: dlrm, FM-style and attention models refuse mixed dims)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output stores")
    p.add_argument("--workers", type=cli_type(PositiveInt), default=None,
                   help="run as count / encode tasks on this many local processes (same output for any number; "
                        "a stopped run resumes)")
    p.add_argument("--scheduler", default=None,
                   help="run the tasks on the Dask cluster at this address (tcp://host:8786); inputs and --out "
                        "on a path every worker sees (pip install 'ctrkit[cluster]')")
    p.add_argument("--task-mb", type=cli_type(PositiveInt), default=64,
                   help="MiB of a plain input file per task (gzip: one per file)")
    p.add_argument("--vocab-memory-mb", type=cli_type(PositiveFloat), default=None,
                   help="exact vocabularies (--min-freq): past this many MiB of counts per worker, spill them to "
                        "disk as sorted runs merged at the end (same output; runs as tasks)")
    p.add_argument("--resumable", action="store_true",
                   help="one process as one task per day file: a stopped run resumes where it stopped, finished "
                        "days are not redone (same output; slower than the plain one-process run)")
    return p


def run_preprocess_criteo(args: argparse.Namespace) -> dict[str, Path]:
    """Run :func:`preprocess_criteo` from parsed arguments; logs one summary line per store.

    The command keeps freed memory (:func:`ctrkit.memory.keep_freed_memory`, process-wide, as ``ctrkit train``):
    each block's big arrays are reused, not faulted in again; and it stops numpy advising huge pages for them
    (:func:`ctrkit.memory.numpy_huge_pages`: a 2 MB page compacted and zeroed at a first touch costs more system
    time than it saves here). :func:`preprocess_criteo` leaves the allocator and numpy be."""
    keep_freed_memory()
    numpy_huge_pages(False)
    result = preprocess_criteo(
        args.inputs, args.out, min_freq=args.min_freq, max_vocab=args.max_vocab,
        max_vocab_mode=args.max_vocab_mode, split=args.split, valid_from_test=args.valid_from_test,
        seed=args.seed, block_rows=args.block_rows, max_bad_fraction=args.max_bad_fraction,
        vocab_from=args.vocab_from, grow=args.grow, expire_after=args.expire_after, embedding_dim=args.embedding_dim, overwrite=args.overwrite,
        workers=args.workers, scheduler=args.scheduler, task_bytes=args.task_mb << 20,
        vocab_memory_mb=args.vocab_memory_mb, resumable=args.resumable,
    )
    for name, path in result.items():
        m = json.loads((path / "manifest.json").read_text())
        log.info("%s: %s rows, label rate %.4f -> %s", name, m["num_rows"], m["stats"]["label_rate"], path)
    return result


__all__ = [
    "DENSE_NAMES", "SPARSE_NAMES", "ParsedBlock", "add_preprocess_criteo_args", "block_columns", "dense_transform",
    "iter_blocks", "parse_block", "preprocess_criteo", "resolve_inputs", "run_preprocess_criteo",
]
