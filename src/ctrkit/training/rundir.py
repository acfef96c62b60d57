"""A run directory belongs to one training at a time, and its records match its checkpoints.

* :class:`RunLock`: an exclusive ``fcntl`` lock on ``<run>/.lock`` held for the whole of ``Trainer.fit``. A
  second training given the same directory is refused at once instead of interleaving its records into the
  first's metrics.jsonl and replacing its best.pt. The kernel drops the lock when its process dies, so a
  killed run never leaves a stale lock behind.
* :func:`check_fresh`: a new (not resumed) training refuses a directory that already holds a run's files,
  unless told to replace them (``run.overwrite``); a resumed one continues there.
* :func:`trim_records`: on resume, the records written after the checkpoint (steps the resumed run will train
  again) are removed from metrics.jsonl, so every step has one train record.
* :func:`open_run_dir` does all three when a training starts and writes config.yaml; :func:`append_record` adds
  one record to metrics.jsonl.
* :class:`RunRecords`: the records and the checkpoints of a training stay consistent when a write fails (disk
  full): the directory goes back to its last whole checkpoint.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from ctrkit.errors import CtrkitError, TrainingError
from ctrkit.io import atomic_file, path_exists

log = logging.getLogger(__name__)

# what a run writes: files, then folders (the report's plots, TensorBoard's events)
RUN_FILES = ("metrics.jsonl", "best.pt", "last.pt", "config.yaml", "summary.json", "predictions.npz",
             "report.html")
RUN_DIRS = ("report", "tensorboard")


class RunLock:
    """Exclusive, non-blocking lock on ``run_dir`` (see the module docstring); a context manager."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / ".lock"
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise TrainingError(
                f"run directory {self.path.parent} is in use by another training (pid {holder}); give this one "
                "another run.name, or wait for that one to finish"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None



def check_fresh(run_dir: Path, *, overwrite: bool) -> None:
    """Refuse a new training in a directory holding another run's files; with ``overwrite``, remove them."""
    found = [n for n in (*RUN_FILES, *RUN_DIRS) if (run_dir / n).exists()]
    if not any(n != "config.yaml" for n in found):  # a config alone: a run that stopped before any record
        return
    if not overwrite:
        raise TrainingError(
            f"run directory {run_dir} already holds a run ({', '.join(found)}); resume it with "
            f"--resume {run_dir / 'last.pt'}, give another run.name, or set run.overwrite=true to replace it"
        )
    for n in found:
        path = run_dir / n
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    log.warning("run.overwrite: removed %s from %s", ", ".join(found), run_dir)


def trim_records(path: Path, step: int) -> int:
    """Drop the records of ``path`` (metrics.jsonl) written after ``step``; returns how many (atomic rewrite)."""
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    keep = []
    for ln in lines:
        try:
            rec_step = json.loads(ln).get("step")
        except (json.JSONDecodeError, AttributeError):
            continue  # a line cut short by the crash the run resumes from
        if not isinstance(rec_step, int) or rec_step <= step:
            keep.append(ln)
    dropped = len(lines) - len(keep)
    if dropped:
        with atomic_file(path, option="run.name") as tmp:
            tmp.write_text("".join(keep))
        log.info("%s: removed %d records after step %d (the resumed run trains those steps again)",
                 path, dropped, step)
    return dropped


def open_run_dir(run_dir: Path, *, continues: bool, step: int, overwrite: bool, config: dict[str, Any]) -> RunLock:
    """Create and lock ``run_dir`` (one training at a time), then: a run that ``continues`` (resumed, or a second
    fit) drops the records after ``step``; a new one refuses another run's files unless ``overwrite``. Writes
    config.yaml; returns the held lock."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrainingError(f"cannot create the run directory {run_dir}: {e.strerror or e}") from None
    lock = RunLock(run_dir).acquire()
    try:
        if continues:
            trim_records(run_dir / "metrics.jsonl", step)
        else:
            check_fresh(run_dir, overwrite=overwrite)
    except BaseException:
        lock.release()
        raise
    try:
        with atomic_file(run_dir / "config.yaml", option="run.dir") as tmp:
            tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    except BaseException:
        lock.release()
        raise
    return lock


def append_record(run_dir: Path, record: dict[str, Any]) -> None:
    """One JSON line in ``run_dir``/metrics.jsonl."""
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


class RunRecords:
    """metrics.jsonl of a training and the checkpoints that go with it, kept consistent when a write fails (checkpoint
    files; the directories of sharded checkpoints are written by every rank and left to their writer).

    :meth:`append` adds a record; :meth:`checkpoints` wraps the writes of one evaluation or save (best.pt, then
    last.pt). When a write fails (disk full) the run directory goes back to what it was after the last
    checkpoint that was written whole: the checkpoints replaced in the failed block are put back (the old files
    were hard-linked aside, which takes no space) and metrics.jsonl is truncated to its length then (truncating
    needs no space either), so best.pt, last.pt and the records agree, and ``--resume last.pt`` goes on exactly.
    The failure is one :class:`TrainingError` saying so."""

    def __init__(self, run_dir: Path, step: int) -> None:
        self.run_dir, self.path, self.step = run_dir, run_dir / "metrics.jsonl", step
        self.kept = self._size()  # the length of metrics.jsonl that the checkpoints on disk cover

    def _size(self) -> int:
        return self.path.stat().st_size if self.path.is_file() else 0

    def append(self, record: dict[str, Any]) -> None:
        try:
            append_record(self.run_dir, record)
        except OSError as e:
            self._roll_back()
            raise TrainingError(self._failed(f"cannot append to {self.path} ({e.strerror or e})")) from None

    @contextmanager
    def checkpoints(self, names: tuple[str, ...], step: int) -> Iterator[None]:
        """The checkpoints ``names`` written in the block, with the records so far: all of them, or none."""
        aside, before = {}, {self.run_dir / n for n in names if path_exists(self.run_dir / n)}
        for n in names:
            path = self.run_dir / n
            if path.is_file() and not path.is_symlink():
                aside[path] = path.with_name(f".{n}.kept-{os.getpid()}")
                aside[path].unlink(missing_ok=True)
                try:
                    os.link(path, aside[path])
                except OSError:  # a file system without hard links: the old file is not kept
                    del aside[path]
        try:
            yield
        except BaseException as e:
            for path in (self.run_dir / n for n in names):
                if path in aside:  # (a rename between two links of one file does nothing: unlinked below)
                    os.replace(aside[path], path)
                elif path not in before and path.is_file():  # new in this block (a sharded directory is left)
                    path.unlink()
            self._roll_back()
            if isinstance(e, (OSError, CtrkitError)):
                raise TrainingError(self._failed(str(e))) from None
            raise
        finally:
            for kept in aside.values():
                kept.unlink(missing_ok=True)
        self.kept, self.step = self._size(), step

    def _roll_back(self) -> None:
        if self._size() > self.kept:
            os.truncate(self.path, self.kept)

    def _failed(self, what: str) -> str:
        return (f"{what}; the run directory {self.run_dir} is kept as it was after step {self.step} (best.pt, "
                f"last.pt and metrics.jsonl agree): resume with --resume {self.run_dir / 'last.pt'} once there is room")
