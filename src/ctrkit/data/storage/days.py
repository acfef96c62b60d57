"""Day-streamed training data: several day stores (Criteo 1TB's day_0 .. day_22) read in day order through a
shuffle buffer, with no day loaded whole and no days concatenated on disk. The same interface as
:class:`~ctrkit.data.storage.loader.BatchLoader` (``len``, ``set_epoch``, iteration, ``state_dict`` /
``load_state_dict`` with an exact position, ``rank`` / ``world_size`` sharding).

Naming the days (``data.train``, :func:`resolve_day_stores`): a list of store paths, in day order, or one glob
pattern (``days/day_*/train``) whose matches are put in natural order (``day_2`` before ``day_10``). All of them
must hold the same features and vocabularies (:func:`~ctrkit.data.storage.agree.check_same_vocabulary`): per-day
stores are written with ``ctrkit preprocess criteo day_K --vocab-from <store fitted on all days>`` (docs/criteo1tb.md).

Epoch order (reproducible from (seed, epoch)): day d's rows are cut into blocks of ``block_size`` contiguous rows,
the blocks permuted with ``default_rng([seed, epoch, d])``, consecutive groups of ``shuffle_buffer // block_size``
permuted blocks form windows, and the rows of window w of day d are permuted with ``default_rng([seed, epoch, d,
w])``; the days follow each other in order (day 0's windows, then day 1's, ...). Without shuffling the order is
every row of every day in order. Memory: one window of row ids (``shuffle_buffer`` int64) and one batch of
columns; the columns stay memory-mapped. Batches are cut from this order by
:func:`~ctrkit.data.storage.shares.rank_shares` (the loaders' one sharding rule); a batch may span two windows
or two days. The position is exact: ``state_dict()`` records (epoch, batches consumed) and ``load_state_dict``
makes the next iteration yield exactly the remaining batches of that epoch.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ctrkit.batch import Batch
from ctrkit.data.pipeline.collate import collate, gather_jagged
from ctrkit.data.storage.agree import check_same_vocabulary
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.shares import RoundLoader
from ctrkit.data.storage.store import Store
from ctrkit.errors import ConfigError, StoreError
from ctrkit.io import missing_path

if TYPE_CHECKING:
    from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline

GLOB_CHARS = re.compile(r"[*?\[]")
Part = tuple[int, "slice | np.ndarray"]  # (day, its rows: a slice or row ids of that day's store)


def _natural(path: str) -> list[Any]:
    """Sort key: digit runs compared as numbers (day_2 < day_10)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def is_day_spec(spec: str | Sequence[str] | None) -> bool:
    """True when ``spec`` names several day stores (a list, or a glob pattern) rather than one store."""
    return spec is not None and (not isinstance(spec, str) or bool(GLOB_CHARS.search(spec)))


def resolve_day_stores(spec: str | Sequence[str], what: str = "data.train") -> list[Path]:
    """The day stores ``spec`` names (module docstring), in day order; a ConfigError names what is wrong."""
    if isinstance(spec, str):
        paths = sorted(glob.glob(spec), key=_natural)
        if not paths:
            raise ConfigError(f"{what}={spec!r}: the pattern matches nothing (relative to the working directory "
                              f"{Path.cwd()}); write day stores with `ctrkit preprocess criteo day_K --vocab-from "
                              "STORE --split 1,0,0 --out days/day_K` and set it to 'days/day_*/train'")
        shown = f"{what}={spec!r} matches"
    else:
        paths = [str(p) for p in spec]
        if not paths:
            raise ConfigError(f"{what} is an empty list; give the day stores in day order, or one store")
        shown = f"{what} lists"
        if dup := sorted({p for p in paths if paths.count(p) > 1}):
            raise ConfigError(f"{what} lists {dup} more than once; each day store once, in day order")
    out = []
    for p in paths:
        if not Path(p).exists():
            raise ConfigError(missing_path(p, f"{what}: day store"))
        if not (Path(p) / "manifest.json").is_file():
            raise ConfigError(f"{shown} {p}, which is not a ctrkit store (no manifest.json); name the day stores "
                              "themselves (e.g. days/day_*/train)")
        out.append(Path(p))
    return out


class DayStreamLoader(RoundLoader):
    """Iterable of :class:`Batch` over day stores in day order (module docstring); the options are those of
    :class:`~ctrkit.data.storage.loader.BatchLoader`. ``what`` names the option that chose the stores."""

    _prefetch_thread = "ctrkit-day-prefetch"

    def __init__(
        self, stores: Sequence[Store | str | Path], batch_size: int, *, shuffle: bool = True, seed: int = 0,
        drop_last: bool = False, block_size: int = 8192, shuffle_buffer: int = 1 << 17, prefetch: int = 2,
        dense_features: Sequence[str] | None = None, sparse_keys: Sequence[str] | None = None,
        pipeline: FeaturePipeline | None = None, rank: int = 0, world_size: int = 1, even_tail: bool = True,
        what: str = "data.train",
    ) -> None:
        if not stores:
            raise ConfigError(f"{what}: no day stores given")
        if int(block_size) < 1 or int(shuffle_buffer) < 1:
            raise ValueError(f"block_size and shuffle_buffer must be >= 1, got {block_size}, {shuffle_buffer}")
        if int(prefetch) < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        # per day: its columns opened (and checked) by a BatchLoader; only its build machinery is used here
        self.days = [BatchLoader(s, batch_size, shuffle=False, prefetch=0, dense_features=dense_features,
                                 sparse_keys=sparse_keys, pipeline=pipeline) for s in stores]
        self.stores = [d.store for d in self.days]
        self.store, self.schema = self.stores[0], self.stores[0].schema  # the reference: schema and vocabularies
        self._check_days(what)
        self.batch_size, self.shuffle, self.seed, self.drop_last = int(batch_size), shuffle, int(seed), drop_last
        self.block_size = int(block_size)
        self.blocks_per_window = max(1, int(shuffle_buffer) // self.block_size)
        self.prefetch = int(prefetch)
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.rank, self.world_size, self.even_tail = int(rank), int(world_size), bool(even_tail)
        self.pipeline = pipeline
        self.batch_stage = pipeline.batch_stage if pipeline is not None else None
        self.day_rows = np.array([s.num_rows for s in self.stores], dtype=np.int64)
        self.day_start = np.concatenate([[0], np.cumsum(self.day_rows)])
        self.num_rows = int(self.day_start[-1])
        self.epoch, self.batches_yielded, self._resume_from = 0, 0, 0
        self._plan_cache: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        self._window_cache: dict[tuple[int, int, int], np.ndarray] = {}

    def _check_days(self, what: str) -> None:
        """Every day store holds the reference store's features and vocabularies."""
        ref = self.schema.to_dict()
        for i, s in enumerate(self.stores[1:], 1):
            if s.schema.to_dict() != ref:
                raise StoreError(f"{what}: day store {i} ({s.path}) has another schema than day store 0 "
                                 f"({self.store.path}); preprocess every day the same way with "
                                 f"`ctrkit preprocess criteo DAY --vocab-from {self.store.path}`")
            check_same_vocabulary(self.store, s, f"{what} (day store {i})")

    # ---- epoch plan ----------------------------------------------------------------------------
    def _plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(day of each window [W], its index within the day [W], window start positions [W + 1]) of ``epoch``."""
        if self._plan_cache is not None and self._plan_cache[0] == epoch:
            return self._plan_cache[1]
        k = self.blocks_per_window
        days, index, rows = [], [], []
        for d, n in enumerate(self.day_rows.tolist()):
            perm = self._block_perm(epoch, d)
            sizes = self._block_sizes(n)[perm]
            per_window = np.add.reduceat(sizes, np.arange(0, len(perm), k)) if len(perm) else sizes
            days.append(np.full(len(per_window), d, np.int64))
            index.append(np.arange(len(per_window), dtype=np.int64))
            rows.append(per_window)
        plan = (np.concatenate(days), np.concatenate(index), np.concatenate([[0], np.cumsum(np.concatenate(rows))]))
        self._plan_cache = (epoch, plan)
        return plan

    def _block_sizes(self, n: int) -> np.ndarray:
        nblocks = -(-n // self.block_size)
        sizes = np.full(nblocks, self.block_size, dtype=np.int64)
        if nblocks:
            sizes[-1] = n - self.block_size * (nblocks - 1)
        return sizes

    def _block_perm(self, epoch: int, day: int) -> np.ndarray:
        nblocks = -(-int(self.day_rows[day]) // self.block_size)
        return np.random.default_rng([self.seed, epoch, day]).permutation(nblocks)

    def _window_rows(self, epoch: int, day: int, w: int) -> np.ndarray:
        """Row ids (of day ``day``'s store) of window ``w`` of that day, in shuffled order; the last two kept."""
        key = (epoch, day, w)
        if key not in self._window_cache:
            k, bs, n = self.blocks_per_window, self.block_size, int(self.day_rows[day])
            blocks = self._block_perm(epoch, day)[w * k: (w + 1) * k]
            rows = np.concatenate([np.arange(b * bs, min((b + 1) * bs, n)) for b in blocks])
            rows = rows[np.random.default_rng([self.seed, epoch, day, w]).permutation(rows.size)]
            if len(self._window_cache) >= 2:
                self._window_cache.pop(next(iter(self._window_cache)))
            self._window_cache[key] = rows
        return self._window_cache[key]

    def _parts(self, epoch: int, a: int, b: int) -> list[Part]:
        """Positions [a, b) of ``epoch``'s order as (day, rows of that day) pieces, in order."""
        parts: list[Part] = []
        if not self.shuffle:
            while a < b:
                d = int(np.searchsorted(self.day_start, a, side="right")) - 1
                e = min(b, int(self.day_start[d + 1]))
                parts.append((d, slice(a - int(self.day_start[d]), e - int(self.day_start[d]))))
                a = e
            return parts
        win_day, win_index, starts = self._plan(epoch)
        while a < b:
            g = int(np.searchsorted(starts, a, side="right")) - 1
            e = min(b, int(starts[g + 1]))
            d, rows = int(win_day[g]), self._window_rows(epoch, int(win_day[g]), int(win_index[g]))
            rows = rows[a - int(starts[g]): e - int(starts[g])]
            if parts and parts[-1][0] == d:  # across two windows of one day: one gather from that day
                rows = np.concatenate([parts.pop()[1], rows])
            parts.append((d, rows))
            a = e
        return parts

    def batch_rows(self, epoch: int) -> np.ndarray:
        """(day, row id) pairs [n, 2] of this rank's rows of ``epoch`` in the order it yields them (tests)."""
        out = [np.stack([np.full(_size(r), d), np.arange(r.start, r.stop) if isinstance(r, slice) else r], 1)
               for a, b in self._shares(warn=False) for d, r in self._parts(epoch, a, b)]
        return np.concatenate(out) if out else np.zeros((0, 2), np.int64)

    # ---- building one batch --------------------------------------------------------------------
    def _build(self, parts: list[Part]) -> Batch:
        if len(parts) == 1:  # within one day: that day's own build (one gather per column)
            day, rows = parts[0]
            return self.days[day].build(rows)
        ref = self.days[0]
        views = [self.days[d]._store_view for d, _ in parts]

        def cat(get) -> np.ndarray | None:
            arrs = [get(v) for v in views]
            return None if arrs[0] is None else np.concatenate([a[r] for a, (_, r) in zip(arrs, parts)])

        dense = [cat(lambda v, i=i: v.dense[i]) for i in range(len(ref.dense_names))]
        sparse: list[Any] = []
        for f, (kind, _, max_len) in enumerate(ref._sparse):
            if kind == "single":
                sparse.append(cat(lambda v, f=f: v.single[f]))
                continue
            got = [gather_jagged(*self.days[d]._sparse[f][1], r, max_len) for d, r in parts]
            sparse.append((np.concatenate([v for v, _ in got]), np.concatenate([ln for _, ln in got])))
        n = sum(_size(r) for _, r in parts)
        return collate(n, dense, ref.sparse_keys, sparse, labels=cat(lambda v: v.labels),
                       weights=cat(lambda v: v.weights), groups=cat(lambda v: v.groups), stage=self.batch_stage)

    # ---- iteration -----------------------------------------------------------------------------
    def _epoch_batches(self, epoch: int, start: int) -> Iterator[Batch]:  # iterated by RoundLoader.__iter__
        return (self._build(self._parts(epoch, a, b)) for a, b in self._shares()[start:])

    def state_dict(self) -> dict[str, Any]:
        """Exact position: the epoch and how many of its batches (rounds) the consumer has received."""
        return {"epoch": self.epoch, "batches_yielded": self.batches_yielded, "seed": self.seed,
                "shuffle": self.shuffle, "batch_size": self.batch_size, "drop_last": self.drop_last,
                "block_size": self.block_size, "blocks_per_window": self.blocks_per_window,
                "num_rows": self.num_rows, "day_rows": self.day_rows.tolist(), "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields batches ``batches_yielded`` .. ``len - 1`` of ``epoch``; a state
        saved at another world size resumes when the global batch is the same."""
        self._resume(state, ("seed", "shuffle", "batch_size", "drop_last", "block_size", "blocks_per_window",
                             "num_rows", "day_rows"), strict=True, what="day-stream loader",
                     fix="build it with the same options and the same day stores to resume exactly")

    def __repr__(self) -> str:
        return (f"DayStreamLoader({len(self.stores)} days from {self.store.path}, rows={self.num_rows}, "
                f"batch_size={self.batch_size}, shuffle={self.shuffle}, epoch={self.epoch})")


def _size(rows: slice | np.ndarray) -> int:
    return rows.stop - rows.start if isinstance(rows, slice) else int(rows.shape[0])
