"""Data parked on disk during preprocessing: the on-disk shuffle (:class:`ShardSpill`: scatter encoded rows into
K temporary shards, then shuffle each shard in memory) and raw rows kept until the pipeline is fitted
(:class:`RawSpill`, so a table is read once). Nothing here holds more than one chunk or one shard in memory,
so preprocessing memory does not grow with the number of rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ctrkit.data.pipeline.rows import SpillColumn, jagged_take

log = logging.getLogger(__name__)

PIECE_ROWS = 1 << 16  # rows per piece of a shard read back (ShardSpill.pieces)
_GATHER_BYTES = 1 << 18  # rows gathered and turned into columns per step: source and target stay in cache


class ShardSpill:
    """Rows of one split scattered into ``n_shards`` temporary files, read back one shard at a time.

    ``add(columns, shard)`` appends each row to the shard given by ``shard`` [n] (ints in [0, K));
    ``read(i, seed)`` loads shard i and, when ``seed`` is not None, permutes its rows. Assigning rows
    to shards uniformly at random and shuffling every shard gives a uniformly random permutation
    while holding only one shard in memory.

    An in-order spill (``n_shards=1`` with ``roll_rows``) starts a new shard once the current one
    holds ``roll_rows`` rows, so reading shards in order gives the input order back while memory
    stays bounded by one shard (not by the split's row count).
    """

    def __init__(
        self, directory: Path, n_shards: int, columns: dict[str, SpillColumn], roll_rows: int | None = None
    ) -> None:
        self.dir, self.n_shards, self.columns = Path(directory), int(n_shards), columns
        if roll_rows is not None and self.n_shards != 1:
            raise ValueError("roll_rows is for in-order spills (n_shards=1)")
        self.roll_rows = roll_rows
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rows = np.zeros(self.n_shards, np.int64)

    def _file(self, shard: int, col: str, part: str = "data") -> Path:
        return self.dir / f"{shard:05d}.{col}.{part}.bin"

    def add(self, cols: dict[str, Any], shard: np.ndarray | None = None) -> None:
        """Append rows; fixed columns are arrays [n, *inner], jagged ones (values [nnz], lengths [n])."""
        first = next(iter(cols.values()))
        n = len(first[1]) if isinstance(first, tuple) else len(first)
        if n == 0:
            return
        if self.roll_rows is not None:
            if self.rows[-1] >= self.roll_rows:  # roll over to a new in-order shard
                self.rows = np.append(self.rows, 0)
                self.n_shards += 1
            groups = [(self.n_shards - 1, None)]
        elif shard is None or self.n_shards == 1:
            groups = [(0, None)]
        else:
            order = np.argsort(shard, kind="stable")
            bounds = np.searchsorted(shard[order], np.arange(self.n_shards + 1))
            groups = [(s, order[bounds[s]:bounds[s + 1]]) for s in range(self.n_shards) if bounds[s + 1] > bounds[s]]
        for s, idx in groups:
            for name, spec in self.columns.items():
                item = cols[name]
                if spec.jagged:
                    vals, lens = item
                    if idx is not None:
                        vals, lens = jagged_take(np.asarray(vals), np.asarray(lens), idx)
                    with open(self._file(s, name, "values"), "ab") as f:
                        f.write(np.ascontiguousarray(vals, dtype=spec.dtype).tobytes())
                    with open(self._file(s, name, "lengths"), "ab") as f:
                        f.write(np.ascontiguousarray(lens, dtype=np.int64).tobytes())
                else:
                    a = np.asarray(item) if idx is None else np.asarray(item)[idx]
                    with open(self._file(s, name), "ab") as f:
                        f.write(np.ascontiguousarray(a, dtype=spec.dtype).data)  # the array's bytes, not a copy
            self.rows[s] += n if idx is None else len(idx)

    def read(self, shard: int, seed: int | None = None) -> dict[str, Any]:
        """Shard ``shard`` as a dict of columns, rows permuted by ``default_rng(seed)`` unless seed is None."""
        return next(self.pieces(shard, seed, rows=None))

    def pieces(self, shard: int, seed: int | None = None, rows: int | None = PIECE_ROWS) -> Iterator[dict[str, Any]]:
        """Shard ``shard`` as :meth:`read` gives it, in consecutive pieces of ``rows`` rows (the whole shard, at
        least one piece, when None or when a column is jagged): together the rows of :meth:`read` in its order.

        Fixed-width rows are gathered from the mapped file one piece at a time, so the arrays of a piece (a few
        MB, reused by the allocator piece after piece) and never the whole shard are held. The shard's files are
        removed once its last piece was taken."""
        n = int(self.rows[shard])
        perm = np.random.default_rng(seed).permutation(n) if seed is not None else None
        whole = rows is None or n == 0 or any(spec.jagged for spec in self.columns.values())
        step = n if whole else int(rows)  # type: ignore[arg-type]
        fixed, jagged = {}, {}
        for name, spec in self.columns.items():
            if spec.jagged:
                vals = np.fromfile(self._file(shard, name, "values"), dtype=spec.dtype) if n else np.zeros(0, spec.dtype)
                lens = np.fromfile(self._file(shard, name, "lengths"), dtype=np.int64) if n else np.zeros(0, np.int64)
                jagged[name] = jagged_take(vals, lens, perm) if perm is not None else (vals, lens)
            elif n and all(spec.inner):  # rows gathered straight from the mapped file (a column of zero width,
                # e.g. a table without dense features, has an empty file: nothing to map)
                fixed[name] = np.memmap(self._file(shard, name), dtype=spec.dtype, mode="r", shape=(n, *spec.inner))
            else:
                fixed[name] = np.zeros((n, *spec.inner), spec.dtype)
        for lo in range(0, max(n, 1), max(step, 1)):
            sel = perm[lo:lo + step] if perm is not None else slice(lo, lo + step)
            yield {name: jagged[name] if name in jagged else by_columns(fixed[name], sel) for name in self.columns}
        fixed.clear()  # drop the maps before the files go
        for name in self.columns:
            for part in ("data", "values", "lengths"):
                self._file(shard, name, part).unlink(missing_ok=True)

    def __iter__(self) -> Iterator[int]:
        return iter(s for s in range(self.n_shards) if self.rows[s] > 0)


def read_parts(parts: list[tuple[Path, int]], shard: int, columns: dict[str, SpillColumn],
               seed: Any = None) -> dict[str, Any]:
    """Shard ``shard`` of several :class:`ShardSpill` directories (``parts``: (directory, rows of the shard
    there)) concatenated in the order given, then permuted like :meth:`ShardSpill.read` with ``seed`` (one
    permutation of the whole shard): the same rows in the same order as one spill fed every part in turn."""
    n = sum(r for _, r in parts)
    perm = np.random.default_rng(seed).permutation(n) if seed is not None else None
    live = [d for d, r in parts if r > 0]
    out: dict[str, Any] = {}
    for name, spec in columns.items():
        def cat(part: str, dtype: Any, name: str = name) -> np.ndarray:
            got = [np.fromfile(d / f"{shard:05d}.{name}.{part}.bin", dtype=dtype) for d in live]
            return np.concatenate(got) if got else np.zeros(0, dtype)
        if spec.jagged:
            vals, lens = cat("values", spec.dtype), cat("lengths", np.int64)
            out[name] = jagged_take(vals, lens, perm) if perm is not None else (vals, lens)
        else:
            out[name] = by_columns(cat("data", spec.dtype).reshape(n, *spec.inner), perm)
    return out




def by_columns(a: np.ndarray, rows: np.ndarray | slice | None) -> np.ndarray:
    """Rows ``rows`` (an index array, a slice, or all when None) of ``a`` [n, w] (row-major, as a spill stores
    them, e.g. its mapped file) -> a new array of the same values [m, w] laid out column by column (Fortran
    order), so that each of its w columns, which a store writes one by one, is one contiguous run. Done a
    cache-sized block of rows at a time: the rows are gathered and transposed while they are in cache (one column
    at a time over the whole array would read every row w times). 1-d and zero-width columns: ``a[rows]``."""
    sub = a if rows is None or not isinstance(rows, slice) else a[rows]  # a slice: a view, nothing read yet
    idx = rows if isinstance(rows, np.ndarray) else None
    if a.ndim != 2 or a.shape[1] < 2 or len(sub) == 0 or (idx is not None and len(idx) == 0):
        return np.asarray(sub[idx]) if idx is not None else np.array(sub)
    m, w = (len(idx) if idx is not None else len(sub)), a.shape[1]
    out = np.empty((w, m), a.dtype)  # (w, m): column j is out[j]
    step = max(1, _GATHER_BYTES // (w * a.itemsize))
    for i in range(0, m, step):
        block = sub[i:i + step] if idx is None else sub[idx[i:i + step]]  # (b, w)
        out[:, i:i + step] = block.T
    return out.T


def shard_count(est_rows: float, row_bytes: int, target_shard_bytes: int = 256 << 20) -> int:
    """Number of shuffle shards so that one shard (est_rows * row_bytes / K bytes) stays near the target."""
    return int(min(4096, max(1, np.ceil(est_rows * row_bytes / target_shard_bytes))))


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
