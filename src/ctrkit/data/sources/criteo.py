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
(``<store>/pipeline``, next to ``<store>/vocab``). ``vocab_from`` reuses another store's pipeline.

How it is fast: lines are tokenised and decoded by numpy on whole decompressed blocks
(:mod:`ctrkit.data.pipeline.criteo_parse`: SWAR bit arithmetic, no per-field Python); distinct values per chunk
are found with pyarrow's hash ``dictionary_encode``. Reading (and gunzip) runs in a background thread. The train shuffle scatters rows into temporary shards at random
(counter-based randomness, so the result does not depend on the chunk size) and shuffles each shard
in memory; memory stays bounded by one block, one shard and the vocabularies.

Malformed lines (wrong field count, label not 0/1, a dense field that is not an integer, e.g. "1e400",
a categorical not 8 hex digits, non-UTF-8 bytes) are skipped and counted once each; the first few are
logged with their 1-based line numbers and a reason naming the field, and kept in the manifest. If more
than ``max_bad_fraction`` of a file's rows are bad the run fails with :class:`~ctrkit.errors.DataError`.
The split stores are staged and published together (:class:`~ctrkit.data.storage.store.SplitOutput`): a failure
or Ctrl-C leaves ``out`` as it was.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import queue
import re
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.pipeline.criteo_parse import (
    NUM_DENSE,
    NUM_FIELDS,
    ParsedBlock,
    dense_transform,
    parse_block,
)
from ctrkit.data.pipeline.feature_pipeline import DENSE_NAMES, SPARSE_NAMES, FeaturePipeline
from ctrkit.data.pipeline.persist import PIPELINE_DIR, save_pipeline
from ctrkit.data.pipeline.rows import (
    BadRows,
    assign_split,
    parse_split,
    row_uniform,
    splitmix64,
    stream_key,
)
from ctrkit.data.pipeline.vocab import MODES, check_vocab_options, save_vocabularies
from ctrkit.data.sources.driver import write_split_store
from ctrkit.data.storage.fitted import reuse_fitted
from ctrkit.data.storage.spill import ShardSpill, shard_count
from ctrkit.data.storage.store import SplitOutput
from ctrkit.errors import DataError
from ctrkit.io import missing_path
from ctrkit.progress import progress_bar

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
_DAY_RE = re.compile(r"^day_(\d+)(\.[A-Za-z0-9]+)*$")
_AVG_LINE_BYTES = 256  # chunk_rows -> read block size
_BOM = b"\xef\xbb\xbf"  # UTF-8 byte-order mark (files saved by some Windows editors)

# ---- reading -----------------------------------------------------------------------------------------
def _open(path: Path) -> tuple[Any, Any]:
    """(stream to read, raw file for the progress position); gzip is detected by its magic bytes."""
    raw = open(path, "rb")  # noqa: SIM115  (closed by iter_blocks)
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    return raw, raw


def iter_blocks(path: Path, block_bytes: int) -> Iterator[tuple[bytes, int]]:
    """Blocks of whole lines (each ending in b"\\n") and the compressed bytes read so far. A UTF-8 byte-order
    mark at the start of the (decompressed) file is dropped: it is no part of the first line."""
    stream, raw = _open(path)
    try:
        carry = b""
        head = True  # the start of the file: strip a BOM there
        while True:
            try:
                data = stream.read(block_bytes)
            except (EOFError, OSError, zlib.error) as e:
                raise DataError(
                    f"{path}: cannot read past byte {raw.tell()} ({e}); the gzip file is truncated or corrupt, "
                    "re-download or re-compress it"
                ) from None
            if not data:
                break
            buf = carry + data if carry else data
            if head:
                if len(buf) < len(_BOM) and _BOM.startswith(buf):  # a read shorter than the BOM: read on
                    carry = buf
                    continue
                buf, head = buf.removeprefix(_BOM), False
            cut = buf.rfind(b"\n")
            if cut < 0:
                carry = buf
                continue
            carry = buf[cut + 1:]
            yield buf[: cut + 1], raw.tell()
        if carry:
            yield carry + b"\n", raw.tell()
    finally:
        stream.close()
        raw.close()


def _background(gen: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """Run a generator in a daemon thread (gunzip and file reads release the GIL); re-raise its errors."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def work() -> None:
        try:
            for item in gen:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # noqa: BLE001  (forwarded to the consumer)
            q.put(e)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def block_columns(blk: ParsedBlock) -> dict[str, np.ndarray]:
    """The parser's decoded rows as the pipeline's raw columns: label, I1..I13 (integers), C1..C26 (keys, -1
    missing)."""
    cols: dict[str, np.ndarray] = {"label": blk.label}
    dense, keys = np.ascontiguousarray(blk.raw_dense.T), np.ascontiguousarray(blk.keys.T)  # one copy: columns
    cols.update((n, dense[j]) for j, n in enumerate(DENSE_NAMES))  # contiguous, not strided views of rows
    cols.update((c, keys[j]) for j, c in enumerate(SPARSE_NAMES))
    return cols


def resolve_inputs(inputs: str | Path | Sequence[str | Path]) -> list[Path]:
    """Input files in processing order; a directory means its ``day_*`` files (by day number)."""
    items = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    if not items:
        raise DataError("no input files given")
    files: list[Path] = []
    for it in items:
        p = Path(it)
        if p.is_dir():
            days = sorted((f for f in p.iterdir() if _DAY_RE.match(f.name)), key=_day_number)
            if not days:
                raise DataError(f"{p} is a directory without day_* files; pass the input files themselves")
            files.extend(days)
        else:
            files.append(p)
    for f in files:
        if not f.exists():
            raise DataError(missing_path(f, "input file"))
        if not f.is_file():
            raise DataError(f"input {f} is not a regular file")
        if f.stat().st_size == 0:
            raise DataError(f"input file {f} is empty")
    days: dict[tuple[Path, int], Path] = {}
    for f in files:  # day_3 next to day_3.gz: every row read twice, and the test day leaks into train
        if _DAY_RE.match(f.name):
            twin = days.setdefault((f.parent.resolve(), _day_number(f)), f)
            if twin != f:
                raise DataError(f"{twin} and {f} are both day {_day_number(f)}; keep one of them (a plain "
                                "and a compressed copy of a day would both be read)")
    return files


def _day_number(p: Path) -> int:
    m = _DAY_RE.match(p.name)
    return int(m.group(1)) if m else -1


# ---- the pipeline ---------------------------------------------------------------------------------------
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
    chunk_rows: int = 1 << 14,
    max_bad_fraction: float = 0.001,
    vocab_from: str | Path | None = None,
    embedding_dim: int | str = 16,
    overwrite: bool = False,
    shard_bytes: int = 256 << 20,
    progress: bool | None = None,
    shuffle: bool = True,
) -> dict[str, Path]:
    """Preprocess Criteo TSV file(s) into one store per split under ``out`` -> {split: store path}.

    Splits: with ``split=None`` and day files (``day_<n>[.gz]``, at least two) the last day is the
    test set and the others are shuffled into train (``valid_from_test`` halves the last day at random
    into valid and test); otherwise ``split`` (default "0.8,0.1,0.1", "train,valid,test" fractions)
    assigns rows at random (seeded, independent of chunking). Train is shuffled; valid and test keep
    input order. Empty splits are not written.

    Vocabularies are fitted on all input rows in input order (seed 000: first appearance over all
    data), or loaded from ``vocab_from`` (a store) and applied unchanged (unseen -> 1). They are saved
    in ``<store>/vocab`` of every output store.

    ``max_vocab`` (with ``max_vocab_mode`` 'hash' (default, torchrec's max_ind_range) or 'cap') and
    ``min_freq`` are described in :mod:`ctrkit.data.pipeline.vocab`. ``chunk_rows`` sets the read block
    (about chunk_rows * 256 bytes); ``shard_bytes`` the size of one shuffle shard in memory.
    ``shuffle=False`` keeps train in input order too (scoring raw rows in order, e.g. ``predict``).
    """
    t0 = time.perf_counter()
    files = resolve_inputs(inputs)
    out = Path(out)
    check_vocab_options(min_freq, max_vocab, max_vocab_mode)
    if not 0 <= max_bad_fraction <= 1:
        raise DataError(f"max_bad_fraction must be in [0, 1], got {max_bad_fraction}")
    if embedding_dim != "auto" and (not str(embedding_dim).isdigit() or int(embedding_dim) < 1):
        raise DataError(f"embedding_dim must be a positive integer or 'auto', got {embedding_dim!r}")
    embedding_dim = embedding_dim if embedding_dim == "auto" else int(embedding_dim)
    if chunk_rows < 1:
        raise DataError(f"chunk_rows must be >= 1, got {chunk_rows}")

    day_mode = split is None and len(files) >= 2 and all(_DAY_RE.match(f.name) for f in files)
    if day_mode:
        files = sorted(files, key=_day_number)
        test_day = files[-1]
        fractions = None
    else:
        fractions = parse_split("0.8,0.1,0.1" if split is None else split)
        if valid_from_test:
            raise DataError("--valid-from-test applies to day files (day_0 .. day_N) without --split")

    pipe = FeaturePipeline.criteo(min_freq=min_freq, max_vocab=max_vocab, max_vocab_mode=max_vocab_mode,
                                  embedding_dim=embedding_dim)
    fitter = None
    if vocab_from is not None:  # the fitted pipeline of another store, applied unchanged (unseen -> 1)
        reuse_fitted(pipe, vocab_from)
    else:
        fitter = pipe.fitter()  # one streaming pass: provisional ids now, final ids when the stores are written
    encoder = fitter if fitter is not None else pipe

    comp = [0.25 if _is_gzip(f) else 1.0 for f in files]  # gzip ratio of Criteo text is ~4
    est_rows = sum(f.stat().st_size / c for f, c in zip(files, comp)) / _AVG_LINE_BYTES * 1.5
    row_bytes = 4 * NUM_FIELDS
    spill_cols = pipe.spill_columns()
    block_bytes = max(1 << 16, int(chunk_rows) * _AVG_LINE_BYTES)
    file_stats: list[BadRows] = []
    clamped = np.zeros(NUM_DENSE, np.int64)
    empty_lines = 0
    pos_rows = np.zeros(3, np.int64)

    with SplitOutput(out, SPLITS, overwrite=overwrite, prefix=".criteo-tmp-") as output:  # nothing published on failure
        tmp = output.tmp
        k_train = shard_count(est_rows, row_bytes, shard_bytes) if shuffle else 1
        roll = max(1, shard_bytes // row_bytes)  # in-order splits roll over to a new shard at this size
        spills = [ShardSpill(tmp / "train", k_train, spill_cols) if shuffle
                  else ShardSpill(tmp / "train", 1, spill_cols, roll_rows=roll),
                  ShardSpill(tmp / "valid", 1, spill_cols, roll_rows=roll),
                  ShardSpill(tmp / "test", 1, spill_cols, roll_rows=roll)]
        total_bytes = sum(f.stat().st_size for f in files)
        bar = _progress(total_bytes, progress)
        done_bytes = 0
        try:
            for fi, path in enumerate(files):
                bad = BadRows(str(path))
                line0 = 0
                key_split, key_shard = stream_key(seed, 1, fi), stream_key(seed, 2, fi)
                last_pos = 0
                # three stages on their own threads: read/gunzip -> tokenise/parse -> vocab/spill (here)
                parsed = _background((parse_block(buf), pos) for buf, pos in _background(iter_blocks(path, block_bytes)))
                for blk, pos in parsed:
                    lines = line0 + blk.line  # 0-based line numbers in the file
                    for idx, reason in blk.bad:
                        bad.add(line0 + idx + 1, reason)
                    bad.total += blk.n_lines - blk.empty_lines
                    empty_lines += blk.empty_lines
                    line0 += blk.n_lines
                    enc = encoder.encode(block_columns(blk), lines=lines + 1, bad=bad)
                    clamped += enc.clamped
                    if day_mode:
                        if path == test_day:
                            code = (np.where(row_uniform(key_split, lines) < 0.5, 1, 2).astype(np.int8)
                                    if valid_from_test else np.full(len(lines), 2, np.int8))
                        else:
                            code = np.zeros(len(lines), np.int8)
                    else:
                        code = assign_split(row_uniform(key_split, lines), fractions)
                    uniform = len(code) > 0 and bool((code == code[0]).all())
                    for s in range(3):
                        if uniform:
                            if code[0] != s:
                                continue
                            sel: Any = slice(None)
                        else:
                            sel = np.flatnonzero(code == s)
                        part = enc.parts(sel)
                        pos_rows[s] += int(part["label"].sum())
                        shard = None
                        if s == 0 and k_train > 1:
                            shard = (splitmix64(lines[sel].astype(np.uint64) + np.uint64(key_shard))
                                     % np.uint64(k_train)).astype(np.int64)
                        spills[s].add(part, shard)
                    if bad.bad > 10_000 and bad.bad / max(bad.total, 1) > max_bad_fraction:
                        bad.check(max_bad_fraction)  # stop early on a broken file
                    bar.update(pos - last_pos)
                    last_pos = pos
                done_bytes += path.stat().st_size
                if bad.total == 0:
                    raise DataError(f"input file {path} contains no rows")
                bad.check(max_bad_fraction)
                file_stats.append(bad)
        finally:
            bar.close()
        t_read = time.perf_counter() - t0

        # ---- the fitted pipeline: vocabularies (store/vocab, as Arrow) and the whole pipeline -----------
        if fitter is not None:
            fitter.finish()
        vocabs = pipe.vocabs_
        save_vocabularies(tmp / "vocab", vocabs, fitted_on=[str(f) for f in files] if fitter is not None
                          else f"copied from {vocab_from}")
        save_pipeline(pipe, tmp / PIPELINE_DIR)
        sizes = {c: vocabs[c].size for c in SPARSE_NAMES}
        options = {"min_freq": min_freq, "max_vocab": max_vocab, "max_vocab_mode": max_vocab_mode,
                   "split": "days" if day_mode else ",".join(f"{f:g}" for f in fractions),
                   "valid_from_test": valid_from_test, "seed": seed, "chunk_rows": chunk_rows,
                   "max_bad_fraction": max_bad_fraction, "embedding_dim": embedding_dim,
                   "vocab_from": str(vocab_from) if vocab_from else None}
        inputs_meta = [{"path": str(f), "bytes": f.stat().st_size,
                        "role": ("test" if day_mode and f == test_day else "train") if day_mode else "split"}
                       for f in files]
        rows = {s: int(sp.rows.sum()) for s, sp in zip(SPLITS, spills)}
        bad_total = sum(b.bad for b in file_stats)
        stats_common = {
            "input_rows": sum(b.total for b in file_stats), "bad_rows": bad_total,
            "first_bad_lines": [{"file": b.file, "line": n, "reason": r} for b in file_stats for n, r in b.first][:20],
            "files": [b.to_dict() for b in file_stats], "empty_lines": empty_lines,
            "clamped_dense": dict(zip(DENSE_NAMES, clamped.tolist())),
            "vocab_sizes": sizes, "vocab": {c: vocabs[c].meta() for c in SPARSE_NAMES},
            "split_rows": rows,
        }

        # ---- write one store per split -------------------------------------------------------------
        written: list[str] = []
        shuffle_key = stream_key(seed, 3)
        for s, (name, spill) in enumerate(zip(SPLITS, spills)):
            if rows[name] == 0:
                if not day_mode and fractions[s] > 0:
                    log.warning("split %r received no rows (too few input rows); not written", name)
                continue
            meta = {"preprocessing": {"kind": "criteo", "split": name, "options": options, "inputs": inputs_meta,
                                      "rules": "seed 000 §3.3: missing -> 0; dense ln(x+3) float32, x+3 <= e^-2 "
                                               "clamped to -2; categorical first-appearance ids, 0 missing, 1 rare"},
                    "stats": {**stats_common, "rows": rows[name],
                              "label_rate": float(pos_rows[s] / max(rows[name], 1))}}
            written.append(name)
            write_split_store(
                output.stage(name), pipe, spill, shuffle_seed=shuffle_key if s == 0 and shuffle else None,
                luts=fitter.luts if fitter is not None else None, fitted_dir=tmp, meta=meta)
        result = output.publish(written)  # with overwrite, also away: a previous run's splits not written now
    elapsed = time.perf_counter() - t0
    n_in = stats_common["input_rows"]
    log.info("criteo: %d rows (%d bad) -> %s in %.1fs (read+parse %.1fs, %.0f rows/s)", n_in, bad_total,
             {k: rows[k] for k in result}, elapsed, t_read, n_in / max(elapsed, 1e-9))
    return result


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _progress(total: int, enabled: bool | None) -> Any:
    return progress_bar(total, unit="B", unit_scale=True, desc="criteo", enabled=enabled)


# ---- command line -----------------------------------------------------------------------------------
def add_preprocess_criteo_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``ctrkit preprocess criteo``."""
    p.add_argument("inputs", nargs="+", help="Criteo TSV file(s), plain or .gz; day_0 .. day_23 files or their directory")
    p.add_argument("--out", required=True, help="output directory; stores go to OUT/train, OUT/valid, OUT/test")
    p.add_argument("--min-freq", type=int, default=1, help="values seen fewer times map to id 1 (rare)")
    p.add_argument("--max-vocab", type=int, default=None, help="cap every vocabulary at this many ids")
    p.add_argument("--max-vocab-mode", choices=MODES, default="hash",
                   help="hash: kept values hashed into [2, max_vocab) (torchrec max_ind_range); cap: first values keep ids")
    p.add_argument("--split", default=None,
                   help="train,valid,test fractions (default: last day file = test, else 0.8,0.1,0.1)")
    p.add_argument("--valid-from-test", action="store_true", help="day files: halve the last day into valid/test")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the shuffle")
    p.add_argument("--chunk-rows", type=int, default=1 << 14, help="rows per read block (memory vs speed)")
    p.add_argument("--max-bad-fraction", type=float, default=0.001,
                   help="fail when more than this fraction of a file's rows are malformed")
    p.add_argument("--vocab-from", default=None, help="store whose vocabularies to reuse (unseen values -> 1)")
    p.add_argument("--embedding-dim", default="16",
                   help="embedding dim of every feature (one dim: what every model of the zoo takes), or 'auto' "
                        "(per feature, by vocabulary size: dlrm, FM-style and attention models refuse mixed dims)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output stores")
    return p


def run_preprocess_criteo(args: argparse.Namespace) -> dict[str, Path]:
    """Run :func:`preprocess_criteo` from parsed arguments; logs one summary line per store."""
    result = preprocess_criteo(
        args.inputs, args.out, min_freq=args.min_freq, max_vocab=args.max_vocab,
        max_vocab_mode=args.max_vocab_mode, split=args.split, valid_from_test=args.valid_from_test,
        seed=args.seed, chunk_rows=args.chunk_rows, max_bad_fraction=args.max_bad_fraction,
        vocab_from=args.vocab_from, embedding_dim=args.embedding_dim, overwrite=args.overwrite,
    )
    for name, path in result.items():
        m = json.loads((path / "manifest.json").read_text())
        log.info("%s: %s rows, label rate %.4f -> %s", name, m["num_rows"], m["stats"]["label_rate"], path)
    return result


__all__ = [
    "DENSE_NAMES", "SPARSE_NAMES", "ParsedBlock", "add_preprocess_criteo_args", "block_columns", "dense_transform",
    "iter_blocks", "parse_block", "preprocess_criteo", "resolve_inputs", "run_preprocess_criteo",
]
