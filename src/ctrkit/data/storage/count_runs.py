"""An on-disk count store for exact vocabularies larger than memory: sorted runs of (key, count, first), merged.

A counter that outgrows its memory budget writes what it holds as a *run*: one file of records
``(key int64, count int64, first int64)`` sorted by key with every key once, where ``first`` orders the
first appearances (any int64 that increases with (day, row): the merge keeps the smallest). :func:`merge_runs`
reads any number of runs a block at a time and yields the totals in key order, every key once with its
summed count and its smallest ``first``, so memory is bounded by ``block_rows`` per run, not by the distinct
keys. More runs than ``fan_in`` are first merged in groups into bigger runs (in ``scratch``).

Records are read with ``numpy.fromfile`` at an offset (not memory-mapped: mapped pages would count in the
process's resident memory as the merge walks the files).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

RECORD = np.dtype([("key", "<i8"), ("count", "<i8"), ("first", "<i8")])


def write_run(path: Path, keys: np.ndarray, counts: np.ndarray, first: np.ndarray) -> None:
    """Write distinct ``keys`` [m] with their ``counts`` [m] and ``first`` [m] as one run (sorted by key)."""
    order = np.argsort(keys, kind="stable")
    rec = np.empty(len(keys), RECORD)
    rec["key"], rec["count"], rec["first"] = keys[order], counts[order], first[order]
    _write(path, rec, "wb")


def _write(path: Path, rec: np.ndarray, mode: str = "ab") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode) as f:  # "ab": a merge writes a bigger run block by block
        rec.tofile(f)


def run_length(path: Path) -> int:
    return os.path.getsize(path) // RECORD.itemsize


class _Reader:
    """A run read ``block_rows`` records at a time; ``buf`` holds the records read and not yet taken."""

    def __init__(self, path: Path, block_rows: int) -> None:
        self.path, self.block, self.at, self.n = path, block_rows, 0, run_length(path)
        self.buf = np.empty(0, RECORD)

    @property
    def more_on_disk(self) -> bool:
        return self.at < self.n

    def fill(self) -> None:
        if len(self.buf) == 0 and self.more_on_disk:
            take = min(self.block, self.n - self.at)
            self.buf = np.fromfile(self.path, RECORD, count=take, offset=self.at * RECORD.itemsize)
            self.at += take

    def take_upto(self, key: int | None) -> np.ndarray:
        """Records with key <= ``key`` (all of the buffer when None), removed from the buffer."""
        cut = len(self.buf) if key is None else int(np.searchsorted(self.buf["key"], key, side="right"))
        out, self.buf = self.buf[:cut], self.buf[cut:]
        return out


def _reduce(rec: np.ndarray) -> np.ndarray:
    """Records of several runs -> one per key (sorted): counts summed, the smallest ``first``."""
    rec = rec[np.argsort(rec["key"], kind="stable")]
    starts = np.flatnonzero(np.r_[True, rec["key"][1:] != rec["key"][:-1]])
    out = np.empty(len(starts), RECORD)
    out["key"] = rec["key"][starts]
    out["count"] = np.add.reduceat(rec["count"], starts)
    out["first"] = np.minimum.reduceat(rec["first"], starts)
    return out


def _merge_flat(paths: list[Path], block_rows: int) -> Iterator[np.ndarray]:
    """One k-way pass: every step takes, from every run, the records up to the smallest last key still
    buffered by a run with more on disk; every later record of every run has a larger key, so each key's
    records are all in that step."""
    readers = [_Reader(p, block_rows) for p in paths]
    while True:
        for r in readers:
            r.fill()
        live = [r for r in readers if len(r.buf)]
        if not live:
            return
        bounds = [int(r.buf["key"][-1]) for r in live if r.more_on_disk]
        upto = min(bounds) if bounds else None
        parts = [r.take_upto(upto) for r in live]
        yield _reduce(np.concatenate(parts))


def merge_runs(paths: list[Path], scratch: Path, *, memory_bytes: int = 64 << 20,
               fan_in: int = 64) -> Iterator[np.ndarray]:
    """Records of every run in ``paths``, one per key in key order, in blocks (arrays of :data:`RECORD`).

    About ``memory_bytes`` of records are buffered at a time (split over the runs of one pass); more than
    ``fan_in`` runs are merged in groups of ``fan_in`` into runs under ``scratch`` first (removed as they are
    read)."""
    paths, level = list(paths), 0
    while len(paths) > fan_in:
        merged = []
        for g in range(0, len(paths), fan_in):
            out = scratch / f"m{level}-{g // fan_in:06d}.bin"
            out.unlink(missing_ok=True)
            for block in _merge_flat(paths[g: g + fan_in], _block_rows(memory_bytes, fan_in)):
                _write(out, block)
            if level:  # only our own intermediate runs are removed
                for p in paths[g: g + fan_in]:
                    p.unlink()
            merged.append(out)
        paths, level = merged, level + 1
    yield from _merge_flat(paths, _block_rows(memory_bytes, max(len(paths), 1)))


def _block_rows(memory_bytes: int, runs: int) -> int:
    # buffers, their concatenation and the sorted copy: ~4 records' worth per buffered record
    return max(1024, memory_bytes // (4 * RECORD.itemsize * runs))
