"""The count and encode steps of a parallel Criteo run, as plain picklable functions over one task (a day file,
or a byte range of whole lines of a plain one): a process pool and a Dask cluster call these same functions
(:mod:`ctrkit.data.sources.criteo_parallel` runs them and merges their results in task order).

* :func:`count_task` -> :class:`CountResult`: the task's physical lines and, when the vocabularies are fitted,
  every categorical column's distinct values in first-appearance order with their counts. Merged in task
  order (:meth:`~ctrkit.data.pipeline.vocab.VocabBuilder.merge`), they give the ids one process reading every
  row in (day, row) order gives: a value's first appearance is in the first task that holds it, and within
  that task at the position the task's own order says.
* :func:`encode_task` -> :class:`EncodeResult`: the task's rows parsed, encoded by the fitted pipeline (saved in
  the staging directory, so workers on other machines read the same one), routed to train / valid / test
  (:class:`RouteRule`: a function of the file and the line number only) and written as the task's own spill
  files under ``<stage>/encode/t<index>``, renamed into place when complete. Nothing depends on which worker
  ran a task or when it finished.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.pipeline.criteo_parse import NUM_DENSE, parse_block
from ctrkit.data.pipeline.feature_pipeline import SPARSE_NAMES, FeaturePipeline
from ctrkit.data.pipeline.persist import load_pipeline
from ctrkit.data.pipeline.rows import BadRows, assign_split, row_uniform, splitmix64, stream_key
from ctrkit.data.pipeline.spec import SPLITS
from ctrkit.data.pipeline.vocab import VocabBuilder
from ctrkit.data.sources.criteo_read import block_columns, is_gzip, iter_blocks, line_ranges
from ctrkit.data.storage.count_runs import write_run
from ctrkit.data.storage.spill import ShardSpill
from ctrkit.errors import DataError


@dataclass(frozen=True)
class Task:
    """One unit of work: file ``path`` (the ``file_index``-th input) over the bytes [start, stop) of whole lines;
    a gzip file is one task (stop None: to its end). ``index``: its place in (day, block) order."""

    index: int
    file_index: int
    path: str
    start: int = 0
    stop: int | None = None


def plan_tasks(files: list[Path], task_bytes: int) -> list[Task]:
    """Tasks in (file, byte) order: plain files cut into ranges of about ``task_bytes``, gzip files whole."""
    tasks: list[Task] = []
    for i, f in enumerate(files):
        ranges = [(0, None)] if is_gzip(f) else line_ranges(f, task_bytes)
        tasks += [Task(len(tasks) + j, i, str(f), a, b) for j, (a, b) in enumerate(ranges)]
    return tasks


@dataclass(frozen=True)
class RouteRule:
    """Which split each row goes to and its shuffle key, from its file and 0-based line number only (so the
    same for any task cut): day files -> the last one test, the others train; else a seeded ratio split per
    line. ``valid_from_test`` halves the last day as torchrec and MLPerf do: its first ceil(n / 2) lines are
    valid, the rest test, with ``last_day_lines`` = n, the physical lines of that day (:func:`file_lines`)."""

    seed: int
    day_mode: bool
    n_files: int
    valid_from_test: bool = False
    fractions: tuple[float, float, float] | None = None
    last_day_lines: int | None = None

    def codes(self, file_index: int, lines0: np.ndarray) -> np.ndarray:
        """Split code per row [n] int8 (0 train, 1 valid, 2 test)."""
        key = stream_key(self.seed, 1, file_index)
        if not self.day_mode:
            return assign_split(row_uniform(key, lines0), self.fractions)
        if file_index != self.n_files - 1:
            return np.zeros(len(lines0), np.int8)
        if self.valid_from_test:
            if self.last_day_lines is None:
                raise RuntimeError("RouteRule.valid_from_test needs last_day_lines (count the last day first)")
            return np.where(np.asarray(lines0) < (self.last_day_lines + 1) // 2, 1, 2).astype(np.int8)
        return np.full(len(lines0), 2, np.int8)

    def shard_keys(self, file_index: int, lines0: np.ndarray) -> np.ndarray:
        """uint64 keys [n] that scatter train rows into shuffle shards (``splitmix64(key) % K``)."""
        return np.asarray(lines0).astype(np.uint64) + np.uint64(stream_key(self.seed, 2, file_index))


# ---- count -------------------------------------------------------------------------------------------
@dataclass
class CountResult:
    """What :func:`count_task` found: physical lines, and per categorical column (``SPARSE_NAMES`` order) the
    distinct keys in first-appearance order, their counts and the missing count (empty lists: not counted).
    ``runs`` > 0: the keys were spilled instead, as that many sorted runs per column (:func:`run_paths`)."""

    index: int
    n_lines: int
    keys: list[np.ndarray] = field(default_factory=list)
    counts: list[np.ndarray] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    runs: int = 0

    def save(self, path: Path) -> None:
        arrays = {f"k{j}": k for j, k in enumerate(self.keys)} | {f"c{j}": c for j, c in enumerate(self.counts)}
        np.savez(path, n_lines=np.int64(self.n_lines), missing=np.asarray(self.missing, np.int64),
                 runs=np.int64(self.runs), **arrays)

    @classmethod
    def load(cls, index: int, path: Path) -> CountResult:
        with np.load(path, allow_pickle=False) as z:
            m, runs = z["missing"].tolist(), int(z["runs"])
            n = 0 if runs else len(m)
            return cls(index, int(z["n_lines"]), [z[f"k{j}"] for j in range(n)], [z[f"c{j}"] for j in range(n)], m,
                       runs)


FIRST_BITS = 40  # a spilled key's first appearance: task index << FIRST_BITS | its rank in the task


def run_paths(stage: str | Path, index: int, column: int, runs: int) -> list[Path]:
    """The sorted runs (:mod:`ctrkit.data.storage.count_runs`) of column ``column`` spilled by task ``index``."""
    return [Path(stage) / "count" / f"t{index:06d}" / f"c{column:02d}-r{r:04d}.bin" for r in range(runs)]


class _RunSpill:
    """A count task's vocabularies written as sorted runs whenever they pass the memory budget."""

    def __init__(self, stage: str, index: int) -> None:
        self.stage, self.index, self.runs = stage, index, 0
        shutil.rmtree(run_paths(stage, index, 0, 1)[0].parent, ignore_errors=True)  # left by a stopped run
        self.pos = [0] * len(SPARSE_NAMES)
        self.missing = [0] * len(SPARSE_NAMES)

    def flush(self, builders: list[VocabBuilder]) -> list[VocabBuilder]:
        """Write every column's keys, counts and first appearances as one more run -> fresh builders."""
        for j, b in enumerate(builders):
            keys = b.keys()
            if self.pos[j] + len(keys) >= 1 << FIRST_BITS:
                raise DataError(f"{SPARSE_NAMES[j]}: more than 2^{FIRST_BITS} distinct values in one task")
            first = (self.index << FIRST_BITS) + self.pos[j] + np.arange(len(keys), dtype=np.int64)
            write_run(run_paths(self.stage, self.index, j, self.runs + 1)[-1], keys, b.counts(), first)
            self.pos[j] += len(keys)
            self.missing[j] += b.missing
        self.runs += 1
        return [VocabBuilder(c, "int") for c in SPARSE_NAMES]


def file_lines(path: str | Path, block_bytes: int = 1 << 24) -> int:
    """Physical lines of a Criteo file as the readers see them (a last line without a newline counts; a damaged
    gzip day counts its lines before the damage), without parsing them."""
    return sum(buf.count_lines() for buf, _ in iter_blocks(Path(path), block_bytes, damage=[]))


def count_task(task: Task, block_bytes: int, vocab: bool, stage: str, vocab_bytes: int | None = None) -> CountResult:
    """Count step of ``task`` (``vocab``: also count the categorical values; ``vocab_bytes``: spill them as
    sorted runs whenever they hold more bytes); saved to ``stage`` for a resumed run, and loaded from there
    when an earlier run finished it."""
    path = Path(stage) / "count" / f"t{task.index:06d}.npz"
    if path.is_file():
        return CountResult.load(task.index, path)
    res = CountResult(task.index, 0)
    builders = [VocabBuilder(c, "int") for c in SPARSE_NAMES] if vocab else []
    spill = _RunSpill(stage, task.index) if vocab and vocab_bytes is not None else None
    blocks = iter_blocks(Path(task.path), block_bytes, start=task.start, stop=task.stop, damage=[])
    for buf, _ in blocks:
        if not builders:
            res.n_lines += buf.count_lines()
            continue
        blk = parse_block(buf)
        res.n_lines += blk.n_lines
        for b, col in zip(builders, blk.cat):
            b.add(col)
        if spill is not None and sum(b.nbytes for b in builders) > vocab_bytes:  # type: ignore[operator]
            builders = spill.flush(builders)
    if spill is not None:
        spill.flush(builders)
        res.runs, res.missing = spill.runs, spill.missing
    else:
        for b in builders:
            res.keys.append(b.keys())
            res.counts.append(b.counts())
            res.missing.append(b.missing)
    _atomic(path, res.save)  # after the runs: a result on disk means its runs are complete
    return res


# ---- encode ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EncodeContext:
    """What every encode task shares: the staging directory (on a path all workers see), the read block size,
    the split rule, the number of train shuffle shards, the rows after which an in-order spill (valid, test,
    train without ``shuffle``) starts a new shard."""

    stage: str
    block_bytes: int
    rule: RouteRule
    k_train: int
    roll: int
    shuffle: bool = True


@dataclass
class EncodeResult:
    """Rows an encode task wrote: ``rows[s]`` per shard of split s, positives per split, values clamped by
    ln(x + 3) per dense column, its input rows (non-empty lines), bad rows (count, the first few as
    (line, reason)), empty lines and damage records (a truncated / corrupt gzip day)."""

    index: int
    rows: list[list[int]]
    positives: list[int]
    clamped: list[int]
    total: int = 0
    bad: int = 0
    first_bad: list[tuple[int, str]] = field(default_factory=list)
    empty: int = 0
    damage: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, index: int, path: Path) -> EncodeResult:
        d = json.loads(path.read_text())
        d["first_bad"] = [tuple(x) for x in d["first_bad"]]
        return cls(**{**d, "index": index})


def task_dir(stage: str | Path, index: int) -> Path:
    return Path(stage) / "encode" / f"t{index:06d}"


@lru_cache(maxsize=2)
def _pipeline(directory: str, mtime_ns: int) -> FeaturePipeline:
    return load_pipeline(directory)  # once per worker process and fitted pipeline


def encode_task(task: Task, line0: int, ctx: EncodeContext) -> EncodeResult:
    """Encode step of ``task`` whose first line is line ``line0`` (0-based) of its file (see the module
    docstring); a task finished by an earlier run is not redone."""
    out = task_dir(ctx.stage, task.index)
    if (out / "result.json").is_file():
        return EncodeResult.load(task.index, out / "result.json")
    pdir = str(Path(ctx.stage) / "pipeline")
    pipe = _pipeline(pdir, os.stat(Path(pdir) / "pipeline.json").st_mtime_ns)
    work = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        res = _encode_rows(task, line0, ctx, pipe, work)
        (work / "result.json").write_text(json.dumps(asdict(res)))
        os.replace(work, out)  # complete, or not there at all
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return res


def _encode_rows(task: Task, line0: int, ctx: EncodeContext, pipe: FeaturePipeline, work: Path) -> EncodeResult:
    cols = pipe.spill_columns()
    spills = [ShardSpill(work / SPLITS[0], ctx.k_train, cols) if ctx.shuffle
              else ShardSpill(work / SPLITS[0], 1, cols, roll_rows=ctx.roll)]
    spills += [ShardSpill(work / s, 1, cols, roll_rows=ctx.roll) for s in SPLITS[1:]]
    bad, damage = BadRows(task.path), []  # type: ignore[var-annotated]
    positives, clamped, empty = np.zeros(len(SPLITS), np.int64), np.zeros(NUM_DENSE, np.int64), 0
    at = line0  # 0-based file line of the block's first line
    for buf, _ in iter_blocks(Path(task.path), ctx.block_bytes, start=task.start, stop=task.stop, damage=damage):
        blk = parse_block(buf)
        for idx, reason in blk.bad:
            bad.add(at + idx + 1, reason)
        bad.total += blk.n_lines - blk.empty_lines
        empty += blk.empty_lines
        enc = pipe.encode(block_columns(blk), lines=at + blk.line + 1, bad=BadRows(task.path))
        at += blk.n_lines
        clamped += enc.clamped
        code = ctx.rule.codes(task.file_index, enc.lines - 1)
        for s in range(len(SPLITS)):
            sel = np.flatnonzero(code == s)
            if len(sel) == 0:
                continue
            part = enc.parts(sel if len(sel) < len(code) else None)
            positives[s] += int(part["label"].sum())
            shard = None
            if s == 0 and ctx.shuffle and ctx.k_train > 1:
                keys = ctx.rule.shard_keys(task.file_index, enc.lines[sel] - 1)
                shard = (splitmix64(keys) % np.uint64(ctx.k_train)).astype(np.int64)
            spills[s].add(part, shard)
    return EncodeResult(task.index, [sp.rows.tolist() for sp in spills], positives.tolist(), clamped.tolist(),
                        bad.total, bad.bad, list(bad.first), empty, damage)


def _atomic(path: Path, write: Any) -> None:
    """``write(tmp)`` then rename onto ``path``: a reader (a resumed run) sees a whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.npz")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
