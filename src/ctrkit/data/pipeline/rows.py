"""Row-level pieces shared by every reader and the encoder: bad-row accounting, counter-based row
randomness (split assignment, hashing), split fractions, jagged row selection and the spill column layout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctrkit.errors import DataError, Problem

log = logging.getLogger(__name__)


_MASK64 = 0xFFFFFFFFFFFFFFFF


@dataclass
class BadRows:
    """Counts malformed rows of one input file and keeps the first ``keep`` of them.

    ``first`` holds ``(line_number, reason)`` with 1-based physical line numbers. A row counts once however
    many reasons it has: readers that validate a chunk column by column call :meth:`flag` with the chunk's
    mask of rows already found bad, so a second reason only joins the first one's text. ``problems`` holds the
    same rows as structured :class:`~ctrkit.errors.Problem` entries, one per (row, field, reason), in row order.
    """

    file: str
    keep: int = 10
    total: int = 0
    bad: int = 0
    first: list[tuple[int, str]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def add(self, lines: np.ndarray, reason: str, column: str | None = None) -> None:
        """Record malformed rows at 1-based ``lines`` [k] that share one ``reason`` (rows not yet counted)."""
        k = len(lines)
        if k == 0:
            return
        self.bad += k
        room = self.keep - len(self.first)
        if room > 0:
            new = [int(n) for n in np.asarray(lines)[:room]]
            self.first.extend((n, reason) for n in new)
            self.first.sort()
            self.problems.extend(Problem(n, column, reason) for n in new)
            self.problems.sort(key=lambda p: p.row)  # stable: a row's problems in the order found

    def flag(self, rows: np.ndarray, lines: np.ndarray, reason: str, seen: np.ndarray,
             column: str | None = None) -> None:
        """Mark rows ``rows`` (bool mask [n] or indices) of a chunk bad for ``reason`` about raw ``column``.

        ``lines`` [n] are the chunk's line numbers and ``seen`` [n] its rows already bad (updated in place):
        those are not counted again; their reason is appended to the kept one when it is among ``first``.
        """
        idx = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows, np.int64)
        if len(idx) == 0:
            return
        again = seen[idx]
        seen[idx] = True
        lines = np.asarray(lines)
        if again.any() and self.first:  # at most ``keep`` entries to extend
            seen_lines = set(np.intersect1d(lines[idx[again]], [n for n, _ in self.first]).tolist())
            joined = {n for n, r in self.first if n in seen_lines and reason not in r}
            self.first = [(n, f"{r}; {reason}" if n in joined else r) for n, r in self.first]
            self.problems.extend(Problem(n, column, reason) for n in sorted(joined))
            self.problems.sort(key=lambda p: p.row)
        self.add(lines[idx[~again]], reason, column)

    def check(self, max_bad_fraction: float) -> None:
        """Log the bad rows; raise :class:`DataError` when ``bad / total > max_bad_fraction``."""
        if self.bad == 0:
            return
        where = "; ".join(f"line {n}: {r}" for n, r in self.first)
        frac = self.bad / max(self.total, 1)
        if frac > max_bad_fraction:
            raise DataError(
                f"{self.file}: {self.bad} of {self.total} rows are malformed ({frac:.4%}), more than "
                f"max_bad_fraction={max_bad_fraction}; first bad rows: {where}. Fix the file or raise "
                "--max-bad-fraction to skip them"
            )
        log.warning("%s: skipped %d malformed rows of %d; first: %s", self.file, self.bad, self.total, where)

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "rows": self.total, "bad_rows": self.bad,
                "first_bad_lines": [{"line": n, "reason": r} for n, r in self.first]}


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser applied elementwise to uint64 ``x`` [n] -> uint64 [n] (wrapping arithmetic).

    Used as a counter-based random generator: ``splitmix64(seed_key + row_index)`` gives the same
    draw for a row however the input is chunked.
    """
    z = np.asarray(x, dtype=np.uint64).copy()
    z += np.uint64(0x9E3779B97F4A7C15)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def stream_key(seed: int, *parts: int) -> int:
    """A 64-bit key for one random stream (seed, purpose, file index, ...), mixed by SplitMix64."""
    k = np.array([seed & _MASK64], dtype=np.uint64)
    for p in parts:
        k = splitmix64(k ^ np.uint64(p & _MASK64))
    return int(k[0])


def row_uniform(key: int, index: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) float64 [n] for rows ``index`` [n] of the random stream ``key``."""
    z = splitmix64(np.asarray(index, dtype=np.uint64) + np.uint64(key))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def parse_split(split: str | tuple[float, ...] | list[float]) -> tuple[float, float, float]:
    """``"0.8,0.1,0.1"`` (train, valid, test; two numbers = no valid) -> fractions that sum to 1."""
    try:
        parts = [float(p) for p in (split.split(",") if isinstance(split, str) else split)]
    except ValueError as e:
        raise DataError(f"split {split!r} must be comma-separated fractions like '0.8,0.1,0.1'") from e
    if len(parts) == 2:
        parts = [parts[0], 0.0, parts[1]]
    if len(parts) != 3 or any(p < 0 for p in parts) or not 0.999 <= sum(parts) <= 1.001 or parts[0] <= 0:
        raise DataError(
            f"split {split!r} must be 2 or 3 non-negative fractions (train,valid,test) that sum to 1, "
            "with train > 0, e.g. '0.8,0.1,0.1'"
        )
    s = sum(parts)
    return parts[0] / s, parts[1] / s, parts[2] / s


def assign_split(u: np.ndarray, fractions: tuple[float, float, float]) -> np.ndarray:
    """Split code per row (0 train, 1 valid, 2 test) from uniforms ``u`` [n]."""
    edges = np.array([fractions[0], fractions[0] + fractions[1]])
    return np.searchsorted(edges, u, side="right").astype(np.int8)


@dataclass
class ColumnSpec:
    """One column of a store as the pipeline produces it: name, kind (label / weight / group / dense / sparse /
    jagged), numpy dtype string and the shape of one row's value (``inner``)."""

    name: str
    kind: str
    dtype: str
    inner: tuple[int, ...] = ()


@dataclass(frozen=True)
class SpillColumn:
    """One column of a spill: fixed-width (``inner`` shape per row) or jagged (values + lengths)."""

    dtype: str
    inner: tuple[int, ...] = ()
    jagged: bool = False


def jagged_take(values: np.ndarray, lengths: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` [m] of a jagged column (values [nnz], lengths [n]) -> (values [nnz'], lengths [m]).

    Vectorised: value index = start[row] + position within the row.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    new_len = lengths[rows]
    total = int(new_len.sum())
    if total == 0:
        return values[:0], new_len
    row_of = np.repeat(np.arange(len(rows)), new_len)  # (nnz',)
    new_starts = np.cumsum(new_len) - new_len
    pos = np.arange(total) - new_starts[row_of]
    return values[starts[rows][row_of] + pos], new_len
