"""``ctrkit preprocess criteo --workers N`` / ``--scheduler ADDRESS``: the Criteo run as count and encode tasks.

1. **plan**: tasks in (day, block) order (:func:`~ctrkit.data.sources.criteo_tasks.plan_tasks`: a gzip day is
   one task, a plain file is cut into ranges of ``task_bytes`` of whole lines);
2. **count** (:func:`~ctrkit.data.sources.criteo_tasks.count_task`, on the workers): lines per task and, when
   fitting, distinct values with counts; merged here in task order into the vocabularies, which are therefore
   exactly the single-process ones (first appearance over (day, row), seed 000) for any number of workers and
   any finishing order. Skipped where nothing needs it (reused or modulo vocabularies and files of one task);
3. **encode** (:func:`~ctrkit.data.sources.criteo_tasks.encode_task`, on the workers): rows encoded by the fitted
   pipeline, routed and spilled per task; bad rows, clamps and damaged days merged here in task order;
4. **write**: train shard k is the concatenation of every task's shard k in task order, permuted with the seed
   the single-process run uses ([shuffle key, k]); valid / test are the tasks' rows in order; so the stores
   are byte for byte those of ``--workers 1``, and of the single-process driver with the same shard count;
5. **publish** (:class:`~ctrkit.data.storage.splits.SplitOutput`) and remove the staging directory.

Resume: every finished task's result stays in ``<out>/.criteo-stage-<key>`` (``key``: a digest of the inputs'
paths, sizes and modification times and of every option that changes the output), written whole or not at
all; a run stopped by an error or Ctrl-C and started again with the same inputs and options redoes only the
unfinished tasks (so never a finished day). The stores are published only when complete. Disk space: the
staging directory holds about one encoded copy of the data until the stores are published.

Memory: exact vocabularies (``--min-freq``, fitted here) hold every distinct value with its count while they
are counted. With ``vocab_bytes`` (``--vocab-memory-mb``) a count task writes what it holds as a sorted run of
(key, count, first appearance) under ``<stage>/count/t<index>/`` whenever it passes that many bytes, and the
runs of every task are merged per column at the end (:mod:`ctrkit.data.storage.count_runs`): memory is then
the budget, the merge buffers and the kept keys (what the encode step looks up anyway), not every distinct
value; the vocabularies, and so the stores, are the in-memory ones.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.pipeline.feature_pipeline import SPARSE_NAMES
from ctrkit.data.pipeline.persist import PIPELINE_DIR, save_pipeline
from ctrkit.data.pipeline.spec import SPLITS
from ctrkit.data.pipeline.vocab import VocabBuilder, Vocabulary, check_vocab_options
from ctrkit.data.sources.criteo_tasks import (
    EncodeContext,
    EncodeResult,
    Task,
    count_task,
    encode_task,
    plan_tasks,
    run_paths,
    task_dir,
)
from ctrkit.data.sources.driver import Frontend, Summary
from ctrkit.data.sources.task_runner import TaskRunner
from ctrkit.data.storage.count_runs import RECORD, merge_runs
from ctrkit.data.storage.fitted import source_stamp
from ctrkit.data.storage.spill import read_parts, shard_count
from ctrkit.data.storage.splits import SplitOutput
from ctrkit.data.storage.store import StoreWriter
from ctrkit.errors import DataError, StoreError
from ctrkit.io import link_tree

log = logging.getLogger(__name__)
STAGE_PREFIX = ".criteo-stage-"


def preprocess_tasks(front: Any, out: str | Path, *, workers: int = 1, scheduler: str | None = None,
                     task_bytes: int = 64 << 20, overwrite: bool = False,
                     shard_bytes: int = 256 << 20, vocab_bytes: int | None = None) -> tuple[dict[str, Path], Summary]:
    """The steps of the module docstring for the Criteo front-end ``front`` (its files, pipeline, split rule
    and manifest record) -> ({split: store path}, rows and positives per split). ``vocab_bytes``: spill the
    counted vocabularies to disk past that many bytes per worker (see "Memory" above)."""
    row_bytes = front.row_bytes
    k_train = shard_count(front.est_rows, row_bytes, shard_bytes) if front.shuffle_train else 1
    roll = max(1, shard_bytes // row_bytes)
    tasks = plan_tasks(front.files, task_bytes)
    stage = Path(out) / (STAGE_PREFIX + _stage_key(front, task_bytes, k_train, roll, vocab_bytes))
    try:
        return _run(front, out, tasks, stage, runner_args=(workers, scheduler), overwrite=overwrite,
                    k_train=k_train, roll=roll, vocab_bytes=vocab_bytes)
    except StoreError as e:
        if stage.is_dir() and any((stage / "encode").glob("t*/result.json")):
            raise StoreError(f"{e}; finished tasks stay in {stage} so that the same command resumes (delete it "
                             "to free its space)") from e.__cause__
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _run(front: Any, out: str | Path, tasks: list[Task], stage: Path, *, runner_args: tuple[int, str | None],
         overwrite: bool, k_train: int, roll: int, vocab_bytes: int | None) -> tuple[dict[str, Path], Summary]:
    pipe = front.pipe
    with SplitOutput(out, SPLITS, overwrite=overwrite, prefix=f".{front.kind}-tmp-") as output, \
            TaskRunner(*runner_args) as runner:
        stage.mkdir(parents=True, exist_ok=True)
        done = sum((task_dir(stage, t.index) / "result.json").is_file() for t in tasks)
        if done:
            log.info("resuming from %s: %d of %d tasks already done", stage, done, len(tasks))
        block_bytes = max(1 << 16, int(front.options["block_rows"]) * 256)
        line0 = _count(runner, tasks, front, stage, block_bytes, vocab_bytes)
        _save_pipeline_once(pipe, stage / "pipeline")
        ctx = EncodeContext(str(stage), block_bytes, front.rule, k_train, roll, front.shuffle_train)
        results = _encode(runner, tasks, line0, ctx, front)
        summary = Summary({n: sum(sum(r.rows[s]) for r in results) for s, n in enumerate(SPLITS)},
                          {n: sum(r.positives[s] for r in results) for s, n in enumerate(SPLITS)})
        save_pipeline(pipe, output.tmp / PIPELINE_DIR)
        written = _write(output, front, results, stage, summary)
        side = front.side_files(summary)
        for name, text in side.items():
            (output.tmp / name).write_text(text)
        result = output.publish(written)
        for name in side:
            os.replace(output.tmp / name, Path(out) / name)
    shutil.rmtree(stage, ignore_errors=True)
    return result, summary


def _stage_key(front: Any, task_bytes: int, k_train: int, roll: int, vocab_bytes: int | None = None) -> str:
    """Digest of what decides every task's result: the inputs (path, size, mtime) and the options."""
    files = [(str(Path(f).resolve()), Path(f).stat().st_size, Path(f).stat().st_mtime_ns) for f in front.files]
    opts = {k: v for k, v in front.options.items() if k != "block_rows"}  # the read block changes no result
    if front.vocab_from:
        opts["vocab_from_mtime"] = source_stamp(front.vocab_from)
    blob = [1, files, opts, task_bytes, k_train, roll, front.shuffle_train] + ([vocab_bytes] if vocab_bytes else [])
    blob = json.dumps(blob, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _count(runner: TaskRunner, tasks: list[Task], front: Any, stage: Path, block_bytes: int,
           vocab_bytes: int | None = None) -> list[int]:
    """Run the count step where needed, fit the vocabularies when fitting -> first line (0-based) of each task."""
    pipe = front.pipe
    fitting = not pipe.fitted
    per_file = np.bincount([t.file_index for t in tasks], minlength=len(front.files))
    halves = front.rule.valid_from_test and front.rule.last_day_lines is None
    last = len(front.files) - 1
    # offsets of plain files cut in ranges; the last day's length where --valid-from-test halves it
    need = [t for t in tasks if fitting or per_file[t.file_index] > 1 or (halves and t.file_index == last)]
    builders = [VocabBuilder(c, "int") for c in SPARSE_NAMES] if fitting and vocab_bytes is None else []
    n_lines = np.zeros(len(tasks), np.int64)
    spilled, missing = [], np.zeros(len(SPARSE_NAMES), np.int64)
    for res in runner.ordered(count_task, [(t, block_bytes, fitting, str(stage), vocab_bytes) for t in need]):
        n_lines[res.index] = res.n_lines
        for j, b in enumerate(builders):
            b.merge(res.keys[j], res.counts[j], res.missing[j])
        if res.runs:
            spilled.append((res.index, res.runs))
            missing += res.missing
    if fitting:
        fitter = pipe.fitter()
        if vocab_bytes is None:
            fitter.adopt(dict(zip(SPARSE_NAMES, builders)))
        else:
            fitter.adopt(*_merge_spilled(pipe, stage, spilled, missing, vocab_bytes))
        fitter.finish()
    if halves:
        front.rule = replace(front.rule, last_day_lines=int(sum(n_lines[t.index] for t in tasks
                                                                if t.file_index == last)))
    line0, at, prev = [], 0, -1
    for t in tasks:
        at = 0 if t.file_index != prev else at
        line0.append(int(at))
        at, prev = at + n_lines[t.index], t.file_index
    return line0


def _merge_spilled(pipe: Any, stage: Path, spilled: list[tuple[int, int]], missing: np.ndarray,
                   memory_bytes: int) -> tuple[dict[str, Vocabulary], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The vocabularies of the count tasks' spilled runs ((task, runs) each): per column the runs merged in key
    order, the kept keys (count >= min_freq) put in first-appearance order -> exactly what the in-memory merge
    of :class:`VocabBuilder` fits; and the keys left below min_freq with their counts (kept for ``--grow``), in key
    order, written to disk as they come and read back memory-mapped. Memory: the merge's buffers and the kept
    keys, not every distinct key."""
    o, scratch, vocabs, pending = pipe.options, stage / "vocab-merge", {}, {}
    for j, name in enumerate(SPARSE_NAMES):
        min_freq, seen, kept = pipe.table_min_freq.get(name, 1), 0, []
        paths = [p for index, runs in spilled for p in run_paths(stage, index, j, runs)]
        shutil.rmtree(scratch, ignore_errors=True)
        left = [stage / "pending" / f"{j:03d}_{part}.bin" for part in ("key", "count")]
        left[0].parent.mkdir(parents=True, exist_ok=True)
        with open(left[0], "wb") as fk, open(left[1], "wb") as fc:
            for rec in merge_runs(paths, scratch, memory_bytes=memory_bytes):
                seen += len(rec)
                kept.append(rec[rec["count"] >= min_freq])
                low = rec[rec["count"] < min_freq]
                fk.write(np.ascontiguousarray(low["key"]).tobytes())
                fc.write(np.ascontiguousarray(low["count"]).tobytes())
        rec = np.concatenate(kept) if kept else np.empty(0, RECORD)
        rec = rec[np.argsort(rec["first"], kind="stable")]
        check_vocab_options(min_freq, o["max_vocab"], o["max_vocab_mode"], name)
        vocabs[name] = Vocabulary.build(name, "int", rec["key"].copy(), rec["count"].copy(), min_freq=min_freq,
                                        max_vocab=o["max_vocab"], mode=o["max_vocab_mode"], seen=seen,
                                        missing=int(missing[j]), hash_fn="mod")
        pending[name] = tuple(np.memmap(f, "<i8", "r") if f.stat().st_size else np.empty(0, np.int64) for f in left)
    shutil.rmtree(scratch, ignore_errors=True)
    return vocabs, pending


def _save_pipeline_once(pipe: Any, directory: Path) -> None:
    """The fitted pipeline where every worker reads it (written whole; a resumed run writes the same one)."""
    tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pipeline(pipe, tmp)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)


def _encode(runner: TaskRunner, tasks: list[Task], line0: list[int], ctx: EncodeContext,
            front: Any) -> list[EncodeResult]:
    """Run the encode step; merge each file's bad rows, clamps and damage in task order and check the file."""
    last = {t.file_index: t.index for t in tasks}
    results = []
    for res in runner.ordered(encode_task, [(t, line0[t.index], ctx) for t in tasks]):
        t = tasks[res.index]
        src = front.inputs[t.file_index]
        src.bad.total += res.total
        for line, reason in res.first_bad:
            src.bad.add(np.array([line]), reason)
        src.bad.bad += res.bad - len(res.first_bad)
        src.clamped += np.asarray(res.clamped, np.int64)
        front.empty_lines += res.empty
        for d in res.damage:
            front.report_damage(d, src.bad.total)
        if last[t.file_index] == t.index:
            if src.bad.total == 0:
                raise DataError(f"input file {t.path} contains no rows")
            src.bad.check(front.options["max_bad_fraction"])
        results.append(res)
    return results


def _write(output: SplitOutput, front: Any, results: list[EncodeResult], stage: Path,
           summary: Summary) -> list[str]:
    """One store per split with rows, from the tasks' spills (see the module docstring) -> the names written."""
    pipe, cols, written = front.pipe, front.pipe.spill_columns(), []
    for s, name in enumerate(SPLITS):
        if summary.rows[name] == 0:
            if name in front.expected_splits:
                log.warning("split %r received no rows (too few input rows); not written", name)
            continue
        with StoreWriter(output.stage(name), pipe.schema, pipe.column_specs()) as w:
            shuffled = s == 0 and front.shuffle_train
            for parts, k in _pieces(results, stage, s, shuffled):
                seed = [front.shuffle_key, k] if shuffled else None
                w.append(pipe.finalize(read_parts(parts, k, cols, seed)))
            link_tree(output.tmp / PIPELINE_DIR, w.tmp / PIPELINE_DIR)
            w.set_meta(**front.store_meta(name, summary))
        written.append(name)
    return written


def _pieces(results: list[EncodeResult], stage: Path, s: int, shuffled: bool) -> Any:
    """(parts, shard) to read in turn: shuffled train's shard k across every task (in task order); in-order
    splits each task's shards one by one."""
    split = SPLITS[s]
    if shuffled:
        for k in range(len(results[0].rows[0]) if results else 0):
            parts = [(task_dir(stage, r.index) / split, r.rows[0][k]) for r in results]
            if sum(n for _, n in parts):
                yield parts, k
        return
    for r in results:
        for k, n in enumerate(r.rows[s]):
            if n:
                yield [(task_dir(stage, r.index) / split, n)], k


__all__ = ["STAGE_PREFIX", "Frontend", "preprocess_tasks"]
