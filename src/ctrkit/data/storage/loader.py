"""Batch loader: memory-mapped store columns -> :class:`ctrkit.batch.Batch`, with no per-row Python.

A batch is built column by column from contiguous slices: of the memory-mapped columns when not
shuffling, of a shuffled window (below) when shuffling. The columns of a batch go through
:func:`~ctrkit.data.pipeline.collate.collate`, the step :meth:`FeaturePipeline.to_batch` uses too: dense
[B, Nd], a KeyedJagged over ``sparse_keys`` (schema order; a jagged column's rows gathered in one vectorised
step, a SequenceFeature keeping its last ``max_len`` ids), labels, weights and group ids, then the batch-level
stage of the data's :class:`~ctrkit.data.pipeline.feature_pipeline.FeaturePipeline` (the multi-hot expansion
of seed 000 when training set one), so training, evaluate and predict expand alike.

Shuffling (reproducible from (seed, epoch)): rows are cut into blocks of ``block_size`` contiguous
rows, the blocks are permuted with ``default_rng([seed, epoch])``, consecutive groups of
``shuffle_buffer // block_size`` permuted blocks form windows, and the rows of window w are permuted
with ``default_rng([seed, epoch, w])``. Each column of a window is gathered once into memory in
that order (reads stay within a few contiguous regions of the files, and one column's window stays
in cache while it is gathered), and the window's batches are contiguous slices of it.

Batches are built in a background thread (``prefetch`` batches ahead); an exception there is
re-raised in the consumer, and the thread stops when the iterator is exhausted, closed or dropped.
The position is exact: ``state_dict()`` records (epoch, batches consumed) and ``load_state_dict``
makes the next iteration yield exactly the remaining batches of that epoch. After an epoch is fully
consumed the loader moves to the next epoch by itself (``set_epoch`` overrides).

Data parallel (``rank`` / ``world_size``, DESIGN §8): the epoch order above is cut into batches of
``batch_size`` rows and batch i goes to rank i mod ``world_size``, so a round of ``world_size`` batches is one
global batch of ``world_size x batch_size`` rows, the same rows one process reads with that batch size. Training
loaders (``even_tail``) make every rank step equally often: the rows of the last, incomplete round are split
evenly over the ranks (fewer rows than ranks: dropped, with a warning; ``drop_last``: the round is dropped).
Evaluation loaders keep batch i on rank i mod ``world_size`` to the end (a rank may get one batch fewer), so the
gathered scores of all ranks, put back in batch order, are those of one process. The position counts rounds, so
a run resumes exactly at another world size with the same global batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ctrkit.batch import Batch
from ctrkit.data.pipeline.collate import JaggedRows, collate
from ctrkit.data.storage.shares import RoundLoader, rank_shares
from ctrkit.data.storage.store import Store
from ctrkit.schema import SequenceFeature

if TYPE_CHECKING:
    from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline

Index = slice | np.ndarray


@dataclass
class _View:
    """Columns addressed by a common row selection: the store itself (``rows`` None, selections are
    global rows) or a shuffled window gathered from it (``rows`` = the global ids of its rows)."""

    dense: list[np.ndarray]  # per dense feature
    single: list[np.ndarray | None]  # per sparse key; None for jagged keys (gathered via ``rows``)
    labels: np.ndarray
    weights: np.ndarray | None
    groups: np.ndarray | None
    rows: np.ndarray | None

    @property
    def num_rows(self) -> int:
        return int(self.labels.shape[0] if self.rows is None else self.rows.shape[0])

    def take(self, rows: np.ndarray) -> _View:
        """The rows ``rows`` (global ids) of a store view, one gather per column."""

        def g(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[rows]

        return _View([a[rows] for a in self.dense], [g(a) for a in self.single], self.labels[rows],
                     g(self.weights), g(self.groups), rows)

    @staticmethod
    def concat(parts: list[tuple[_View, slice]]) -> _View:
        """Rows ``sel`` of each window view, one after the other (a batch across a window boundary)."""

        def cat(get) -> np.ndarray | None:
            arrs = [get(v) for v, _ in parts]
            return None if arrs[0] is None else np.concatenate([a[s] for a, (_, s) in zip(arrs, parts)])

        v0 = parts[0][0]
        return _View(
            [cat(lambda v, i=i: v.dense[i]) for i in range(len(v0.dense))],
            [cat(lambda v, f=f: v.single[f]) for f in range(len(v0.single))],
            cat(lambda v: v.labels), cat(lambda v: v.weights), cat(lambda v: v.groups), cat(lambda v: v.rows),
        )


class BatchLoader(RoundLoader):
    """Iterable of :class:`Batch` over a store (see module docstring).

    ``rows`` restricts the loader to a contiguous row range (e.g. a train / validation split).
    ``dense_features`` / ``sparse_keys`` default to the schema's dense names and sparse keys.
    ``pipeline`` (the feature pipeline the model was trained with) contributes its batch-level stage.
    ``rank`` / ``world_size`` / ``even_tail``: this process's share of every epoch (module docstring).
    """

    def __init__(
        self,
        store: Store | str | Path,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        block_size: int = 8192,
        shuffle_buffer: int = 1 << 17,
        prefetch: int = 2,
        dense_features: Sequence[str] | None = None,
        sparse_keys: Sequence[str] | None = None,
        pipeline: FeaturePipeline | None = None,
        rows: slice | None = None,
        rank: int = 0,
        world_size: int = 1,
        even_tail: bool = True,
    ) -> None:
        self.store = store if isinstance(store, Store) else Store(store)
        self.schema = self.store.schema
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if int(block_size) < 1 or int(shuffle_buffer) < 1:
            raise ValueError(f"block_size and shuffle_buffer must be >= 1, got {block_size}, {shuffle_buffer}")
        if int(prefetch) < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        self.batch_size, self.shuffle, self.seed, self.drop_last = int(batch_size), shuffle, int(seed), drop_last
        self.block_size = int(block_size)
        self.blocks_per_window = max(1, int(shuffle_buffer) // self.block_size)
        self.prefetch = int(prefetch)
        rank_shares(0, 1, rank=int(rank), world_size=int(world_size))  # a rank outside 0 .. world_size - 1 fails
        self.rank, self.world_size, self.even_tail = int(rank), int(world_size), bool(even_tail)
        self.pipeline = pipeline
        self.batch_stage = pipeline.batch_stage if pipeline is not None else None  # built here, not in the thread
        start, stop, step = (rows or slice(None)).indices(self.store.num_rows)
        if step != 1:
            raise ValueError(f"rows must be a contiguous slice (step 1), got {rows}")
        self.row_start, self.row_stop = start, max(start, stop)
        self.num_rows = self.row_stop - self.row_start

        self._columns(dense_features, sparse_keys)
        self._store_view = _View(
            list(self._dense),
            [col if kind == "single" else None for kind, col, _ in self._sparse],
            self._labels, self._weights, self._groups, None,
        )
        self.epoch = 0
        self.batches_yielded = 0
        self._resume_from = 0
        self._window_cache: tuple[tuple[int, int], _View] | None = None

    def _columns(self, dense_features: Sequence[str] | None, sparse_keys: Sequence[str] | None) -> None:
        """Open the columns a batch reads: dense, sparse (single or jagged, with the max_len of sequences),
        labels, weights and groups."""
        schema, where = self.schema, f"store {self.store.path}"
        self.dense_names = list(schema.dense_names if dense_features is None else dense_features)
        self._dense: list[np.ndarray] = []  # per dense feature: (rows,) or (rows, width)
        for name in self.dense_names:
            col = self._column(name, ("dense",), where)
            self._dense.append(col.reshape(col.shape[0], -1) if col.ndim > 2 else col)  # (rows,) or (rows, width)
        self.num_dense = sum(int(np.prod(c.shape[1:], dtype=np.int64)) for c in self._dense)
        self.sparse_keys = list(schema.sparse_keys if sparse_keys is None else sparse_keys)
        # per key: ("single", column, None) or ("jagged", (values, offsets), max_len or None)
        self._sparse: list[tuple[str, Any, int | None]] = []
        for key in self.sparse_keys:
            kind = self.store.kinds.get(key)
            if kind == "sparse":
                self._sparse.append(("single", self._column(key, ("sparse",), where), None))
            elif kind == "jagged":
                values, offsets = self.store[key]
                feat = schema.feature(key) if key in schema.all_names() else None
                max_len = feat.max_len if isinstance(feat, SequenceFeature) else None
                self._sparse.append(("jagged", (np.asarray(values), np.asarray(offsets)), max_len))
            else:
                raise KeyError(
                    f"{where} has no sparse or jagged column {key!r} (kind {kind!r}); sparse columns: "
                    f"{self.store.columns('sparse') + self.store.columns('jagged')}"
                )
        self._max_len = [m for _, _, m in self._sparse]
        self._labels = self._column(schema.label, ("label",), where)
        self._weights = self._column(schema.weight, ("weight",), where) if schema.weight else None
        self._groups = self._column(schema.group_id, ("group",), where) if schema.group_id else None

    def _column(self, name: str, kinds: tuple[str, ...], where: str) -> np.ndarray:
        if name not in self.store:
            raise KeyError(f"{where} has no column {name!r}; columns: {self.store.columns()}")
        if self.store.kinds[name] not in kinds:
            raise KeyError(f"{where}: column {name!r} is of kind {self.store.kinds[name]!r}, expected {kinds}")
        return np.asarray(self.store[name])  # plain ndarray view of the memmap (cheaper indexing)

    # ---- epoch plan ----------------------------------------------------------------------------
    def _plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(permuted block ids, window start positions [W + 1], block sizes) of ``epoch``."""
        bs, n = self.block_size, self.num_rows
        nblocks = -(-n // bs)
        perm = np.random.default_rng([self.seed, epoch]).permutation(nblocks)
        sizes = np.full(nblocks, bs, dtype=np.int64)
        if nblocks:
            sizes[-1] = n - bs * (nblocks - 1)
        per_window = sizes[perm]
        k = self.blocks_per_window
        window_rows = np.add.reduceat(per_window, np.arange(0, nblocks, k)) if nblocks else per_window
        starts = np.concatenate([[0], np.cumsum(window_rows)])
        return perm, starts, sizes

    def _window(self, epoch: int, w: int, perm: np.ndarray, sizes: np.ndarray) -> _View:
        """Window ``w`` of ``epoch``: its rows in shuffled order, every column gathered once.

        Gathering one column of a whole window at a time keeps that column's window (a few hundred
        KB) in cache, and the batches are then contiguous slices of the window (as when not
        shuffling), instead of 40 scattered gathers per batch over a window that does not fit."""
        if self._window_cache is not None and self._window_cache[0] == (epoch, w):
            return self._window_cache[1]
        blocks = perm[w * self.blocks_per_window : (w + 1) * self.blocks_per_window]
        rows = np.concatenate([
            np.arange(self.row_start + b * self.block_size, self.row_start + b * self.block_size + sizes[b])
            for b in blocks
        ])
        rows = rows[np.random.default_rng([self.seed, epoch, w]).permutation(rows.size)]
        view = self._store_view.take(rows)
        self._window_cache = ((epoch, w), view)
        return view

    def _batches(self, epoch: int, start_batch: int = 0) -> Iterator[tuple[_View, Index]]:
        """(view, selection) of this rank's batches of ``epoch`` from ``start_batch`` on: a slice of the
        store without shuffling, a slice of a shuffled window with it."""
        shares = self._shares()[start_batch:]
        if not self.shuffle:
            for a, b in shares:
                yield self._store_view, slice(self.row_start + a, self.row_start + b)
            return
        perm, starts, sizes = self._plan(epoch)
        for first, b in shares:
            a, parts = first, []
            while a < b:
                w = int(np.searchsorted(starts, a, side="right")) - 1
                view = self._window(epoch, w, perm, sizes)
                s = a - int(starts[w])
                e = min(b - int(starts[w]), view.num_rows)
                parts.append((view, slice(s, e)))
                a += e - s
            yield parts[0] if len(parts) == 1 else (_View.concat(parts), slice(0, b - first))

    def batch_rows(self, epoch: int) -> np.ndarray:
        """Global row ids of ``epoch`` in the order the loader yields them (for inspection / tests)."""
        out = []
        for view, sel in self._batches(epoch):
            out.append(np.arange(sel.start, sel.stop) if view.rows is None else view.rows[sel])
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    # ---- building one batch --------------------------------------------------------------------
    def build(self, idx: Index) -> Batch:
        """The Batch of store rows ``idx`` (a slice or an array of global row ids)."""
        return self._build(self._store_view, idx)

    def _build(self, view: _View, sel: Index) -> Batch:
        B = sel.stop - sel.start if isinstance(sel, slice) else int(sel.shape[0])
        global_idx = sel if view.rows is None else view.rows[sel]  # jagged columns are read from the store
        sparse = [col[sel] if col is not None else JaggedRows(*self._sparse[f][1], global_idx)
                  for f, col in enumerate(view.single)]
        return collate(B, [col[sel] for col in view.dense], self.sparse_keys, sparse,
                       max_len=self._max_len, labels=view.labels[sel],
                       weights=None if view.weights is None else view.weights[sel],
                       groups=None if view.groups is None else view.groups[sel], stage=self.batch_stage)

    # ---- iteration (RoundLoader.__iter__) -----------------------------------------------------
    def _epoch_batches(self, epoch: int, start: int) -> Iterator[Batch]:
        return (self._build(view, sel) for view, sel in self._batches(epoch, start))

    def state_dict(self) -> dict[str, Any]:
        """Exact position: the epoch and how many of its batches the consumer has received."""
        return {
            "epoch": self.epoch,
            "batches_yielded": self.batches_yielded,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "block_size": self.block_size,
            "blocks_per_window": self.blocks_per_window,
            "row_start": self.row_start,
            "num_rows": self.num_rows,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration yields batches ``batches_yielded`` .. ``len - 1`` of ``epoch``."""
        self._resume(state, ("seed", "shuffle", "batch_size", "drop_last", "block_size", "blocks_per_window",
                             "row_start", "num_rows"), strict=False, what="loader",
                     fix="build the loader with the same options (and store) to resume exactly")

    def __repr__(self) -> str:
        return (f"BatchLoader({self.store.path}, rows={self.num_rows}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, epoch={self.epoch})")
