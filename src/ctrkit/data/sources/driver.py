"""The preprocess driver: read -> fit or reuse -> transform -> spill / shuffle -> write splits -> publish.

``ctrkit preprocess criteo``, ``table`` and ``behaviour`` all run :func:`preprocess`; each keeps only what is
its own, as a :class:`Frontend`: how to read its input into raw column chunks (:meth:`Frontend.read`, and
:meth:`Frontend.read_held` for rows that must wait for the fitted pipeline), its feature pipeline (``pipe``),
its split rule (:meth:`Frontend.route`, or one split per :class:`Input`) and what its manifests record
(:meth:`Frontend.meta`). The steps:

1. **fit or reuse**: ``vocab_from`` set -> the pipeline of that store, applied unchanged (unseen -> 1); else a
   streaming fitter (:class:`~ctrkit.data.pipeline.feature_pipeline.PipelineFitter`: provisional ids, final
   ids once every row was counted); with ``grow`` too, a fitter that grows the pipeline of ``vocab_from``
   (known ids kept, new ones appended: :mod:`ctrkit.data.pipeline.vocab_grow`).
2. **read + transform**, pass 1: every chunk of ``read(fitting)`` is encoded (by the fitter when fitting),
   routed to train / valid / test and spilled (:class:`~ctrkit.data.storage.spill.ShardSpill`: train scattered
   into shards at random by a per-row key, valid / test in input order). Train rows count in the dense
   statistics when the front-end asks (``dense_stats``). Then the fitter finishes.
3. **transform**, pass 2: chunks of ``read_held()`` (valid / test rows held out of the fit, explicit valid / test
   files, ...) are encoded by the fitted pipeline and spilled the same way. A split holds rows of one pass only.
4. **write splits**: per split, shards read back in order (train shards shuffled, seeded by ``shuffle_key``),
   provisional ids mapped to final ones, one store each, all holding the fitted pipeline (``<store>/pipeline``,
   hard links to one copy: the store's vocabularies, stored once).
5. **publish**: the stores (and the front-end's side files) move into place together
   (:class:`~ctrkit.data.storage.splits.SplitOutput`); a failure or Ctrl-C leaves ``out`` as it was.

The per-chunk step (:meth:`_Run.transform_chunk`: encode, route, spill) depends only on the chunk, the encoder
and the front-end's keys, never on how the input was cut into chunks, so the same stores come out for any
chunk size. The Criteo-1TB path (issue 30) slots in here: a count step per (day, block) and an encode step per
(day, block) run by workers, their results merged in (day, block) order by the same :class:`_Run`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.pipeline.encode import Encoded, Raw
from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline, PipelineFitter
from ctrkit.data.pipeline.persist import PIPELINE_DIR, save_pipeline
from ctrkit.data.pipeline.rows import BadRows, splitmix64
from ctrkit.data.pipeline.spec import SPLITS
from ctrkit.data.storage.fitted import prepare_grow, reuse_fitted
from ctrkit.data.storage.spill import ShardSpill, shard_count
from ctrkit.data.storage.splits import SplitOutput
from ctrkit.data.storage.store import StoreWriter
from ctrkit.errors import DataError
from ctrkit.io import link_tree

log = logging.getLogger(__name__)


@dataclass(eq=False)  # hashed by identity: several splits may share one input
class Input:
    """One input of a run (a file, or rows made in memory): its bad rows and log-clamp counts, which the stats
    of the stores it feeds report. ``split``: the split every row of it goes to (None: :meth:`Frontend.route`)."""

    path: str | Path
    bad: BadRows | None = None
    clamped: np.ndarray | None = None  # (Nd,) values clamped by the log transform
    index: int = 0  # its position among the run's inputs (per-input random streams)
    split: int | None = None


@dataclass
class Chunk:
    """Raw rows of one read block, as the pipeline takes them; ``lines`` [n] name them in errors."""

    columns: Raw
    source: Input | None = None
    lines: np.ndarray | None = None


@dataclass
class Summary:
    """Rows and positives (label 1) per split name, as spilled."""

    rows: dict[str, int] = field(default_factory=dict)
    positives: dict[str, int] = field(default_factory=dict)

    def label_rate(self, split: str) -> float:
        return float(self.positives[split] / max(self.rows[split], 1))


class Frontend:
    """What one source owns; :func:`preprocess` does the rest (the module docstring)."""

    kind: str  # "criteo", "table", "behaviour": names the run's scratch directory
    pipe: FeaturePipeline  # unfitted: the driver fits it or fills it from ``vocab_from``
    vocab_from: str | Path | None = None
    grow: bool = False  # with vocab_from: grow its vocabularies instead of reusing them unchanged
    expire_after: int | None = None  # with grow: evict values not seen in the last N versions
    shuffle_train: bool = True
    shuffle_key: int = 0  # seed of the train shuffle
    dense_stats: bool = False  # fit dense means / stds on the train rows of pass 1
    expected_splits: tuple[str, ...] = ()  # splits that should get rows (a warning when one gets none)
    est_rows: float = 1.0  # expected rows, with ``row_bytes`` (default: from the pipeline) -> shuffle shards
    row_bytes: int | None = None

    def read(self, fitting: bool, tmp: Path) -> Iterator[Chunk]:
        """Pass 1: chunks in input order (``tmp``: the run's scratch directory, for rows held out)."""
        raise NotImplementedError

    def read_held(self) -> Iterator[Chunk]:
        """Pass 2, after the fit: chunks encoded by the fitted pipeline."""
        return iter(())

    def route(self, chunk: Chunk, enc: Encoded) -> np.ndarray:
        """Split code of every encoded row [n] int8 (0 train, 1 valid, 2 test) of a chunk of no fixed split."""
        raise NotImplementedError(f"{type(self).__name__} has inputs without a split")

    def shard_keys(self, chunk: Chunk, enc: Encoded) -> np.ndarray:
        """Per-row uint64 keys [n] that scatter train rows into shuffle shards (``splitmix64(key) % K``)."""
        raise NotImplementedError(f"{type(self).__name__} does not shuffle")

    def observe(self, split: int, part: dict[str, Any], final: bool) -> None:
        """See encoded rows of ``split`` (:meth:`Encoded.parts`; ``final``: ids are final) as they are spilled."""

    def meta(self, split: str, summary: Summary) -> dict[str, Any]:
        """The manifest's ``preprocessing`` / ``stats`` of the store of ``split``."""
        raise NotImplementedError

    def side_files(self, summary: Summary) -> dict[str, str]:
        """Files published next to the stores, {name: text} (e.g. a report)."""
        return {}

    def store_meta(self, split: str, summary: Summary) -> dict[str, Any]:
        """:meth:`meta` and, for a grown vocabulary, its ``vocab_lineage`` in the ``preprocessing`` record."""
        meta = self.meta(split, summary)
        if self.pipe.lineage_:
            meta["preprocessing"] = {**meta["preprocessing"], "vocab_lineage": self.pipe.lineage_}
        return meta


def fit_or_reuse(pipe: FeaturePipeline, vocab_from: str | Path | None, grow: bool = False,
                 expire_after: int | None = None) -> PipelineFitter | None:
    """The fitter of ``pipe``, or None after filling ``pipe`` from the store ``vocab_from``; with ``grow`` the
    fitter that grows the vocabularies of ``vocab_from`` (evicting values not seen in ``expire_after`` versions)."""
    check_expiry(grow, expire_after)
    if grow:
        if vocab_from is None:
            raise DataError("--grow grows the vocabularies of a parent: give it with --vocab-from STORE_OR_CHECKPOINT")
        prepare_grow(pipe, vocab_from, expire_after)
    elif vocab_from is not None:  # the fitted pipeline of another store: its ids and its dense statistics
        reuse_fitted(pipe, vocab_from)
        return None
    return pipe.fitter()  # one streaming pass: provisional ids now, final ids when the stores are written


def check_expiry(grow: bool, expire_after: int | None) -> None:
    """``--expire-after N``: an integer >= 1, with ``--grow`` (a DataError naming the option and the fix)."""
    if expire_after is None:
        return
    if not isinstance(expire_after, (int, np.integer)) or isinstance(expire_after, bool) or expire_after < 1:
        raise DataError(f"--expire-after must be an integer >= 1 (versions), got {expire_after!r}")
    if not grow:
        raise DataError(f"--expire-after {expire_after} evicts values of a growing vocabulary: add --grow (with "
                        "--vocab-from PARENT), or drop --expire-after")


def preprocess(front: Frontend, out: str | Path, *, overwrite: bool = False,
               shard_bytes: int = 256 << 20) -> tuple[dict[str, Path], Summary]:
    """Run the steps of the module docstring for ``front`` into ``out/{train,valid,test}`` ->
    ({split: store path}, rows and positives per split)."""
    pipe = front.pipe
    fitter = None if pipe.fitted else fit_or_reuse(pipe, front.vocab_from, front.grow,
                                                          front.expire_after)  # fitted: ids by a formula
    with SplitOutput(out, SPLITS, overwrite=overwrite, prefix=f".{front.kind}-tmp-") as output:
        run = _Run(front, output.tmp, shard_bytes)
        run.transform(front.read(fitter is not None, output.tmp), fitter if fitter is not None else pipe,
                      provisional=fitter is not None)
        if fitter is not None:
            fitter.finish()
        run.transform(front.read_held(), pipe, provisional=False)
        save_pipeline(pipe, output.tmp / PIPELINE_DIR)  # the one copy of the vocabularies, linked into each store
        written = run.write(output, fitter.luts if fitter is not None else None)
        side = front.side_files(run.summary())
        for name, text in side.items():
            (output.tmp / name).write_text(text)
        result = output.publish(written)  # with overwrite, also away: a previous run's splits not written now
        for name in side:
            os.replace(output.tmp / name, Path(out) / name)
    return result, run.summary()


class _Run:
    """The spills of one run and what they hold."""

    def __init__(self, front: Frontend, tmp: Path, shard_bytes: int) -> None:
        self.front, self.tmp = front, tmp
        cols = front.pipe.spill_columns()
        row_bytes = front.row_bytes or _row_bytes(front.pipe)
        self.k_train = shard_count(front.est_rows, row_bytes, shard_bytes) if front.shuffle_train else 1
        roll = max(1, shard_bytes // row_bytes)  # in-order splits roll over to a new shard at this size
        self.spills = [ShardSpill(tmp / "train", self.k_train, cols) if front.shuffle_train
                       else ShardSpill(tmp / "train", 1, cols, roll_rows=roll)]
        self.spills += [ShardSpill(tmp / s, 1, cols, roll_rows=roll) for s in SPLITS[1:]]
        self.positives = np.zeros(len(SPLITS), np.int64)
        self.provisional: list[bool | None] = [None] * len(SPLITS)  # ids of the fitter (True) or final (False)
        self.stats: PipelineFitter | None = None

    def transform(self, chunks: Iterator[Chunk], encoder: PipelineFitter | FeaturePipeline, *,
                  provisional: bool) -> None:
        """Encode, route and spill every chunk; with ``provisional`` the encoder is the fitter."""
        self.stats = encoder if provisional and self.front.dense_stats else None  # type: ignore[assignment]
        for chunk in chunks:
            self.transform_chunk(chunk, encoder, provisional)

    def transform_chunk(self, chunk: Chunk, encoder: PipelineFitter | FeaturePipeline, provisional: bool) -> None:
        src = chunk.source
        enc = encoder.encode(chunk.columns, lines=chunk.lines, bad=src.bad if src is not None else None)
        if src is not None and src.clamped is not None:
            src.clamped += enc.clamped
        if src is not None and src.split is not None:
            code = np.full(len(enc), src.split, np.int8)
        else:
            code = self.front.route(chunk, enc)
        if self.stats is not None:
            self.stats.add_dense_stats(enc.dense[code == 0])
        uniform = len(code) > 0 and bool((code == code[0]).all())
        for s in range(len(SPLITS)):
            if uniform and code[0] != s:
                continue
            sel: Any = slice(None) if uniform else np.flatnonzero(code == s)
            if not uniform and len(sel) == 0:
                continue
            self._spill(s, chunk, enc, sel, provisional)

    def _spill(self, s: int, chunk: Chunk, enc: Encoded, sel: Any, provisional: bool) -> None:
        if self.provisional[s] is not None and self.provisional[s] != provisional:
            raise RuntimeError(f"split {SPLITS[s]!r} got rows of both passes; a front-end routes a split to one")
        self.provisional[s] = provisional
        part = enc.parts(sel)
        if "label" in part:
            self.positives[s] += int(part["label"].sum())
        shard = None
        if s == 0 and self.k_train > 1:
            keys = self.front.shard_keys(chunk, enc)[sel]
            shard = (splitmix64(keys) % np.uint64(self.k_train)).astype(np.int64)
        self.front.observe(s, part, not provisional)
        self.spills[s].add(part, shard)

    def summary(self) -> Summary:
        return Summary({n: int(sp.rows.sum()) for n, sp in zip(SPLITS, self.spills)},
                       {n: int(p) for n, p in zip(SPLITS, self.positives)})

    def write(self, output: SplitOutput, luts: dict[str, np.ndarray | None] | None) -> list[str]:
        """One store per split with rows -> the names written."""
        summary, written = self.summary(), []
        for s, (name, spill) in enumerate(zip(SPLITS, self.spills)):
            if summary.rows[name] == 0:
                if name in self.front.expected_splits:
                    log.warning("split %r received no rows (too few input rows); not written", name)
                continue
            shuffle = self.front.shuffle_key if s == 0 and self.front.shuffle_train else None
            write_split_store(output.stage(name), self.front.pipe, spill, shuffle_seed=shuffle,
                              luts=luts if self.provisional[s] else None, fitted_dir=self.tmp,
                              meta=self.front.store_meta(name, summary))
            written.append(name)
        return written


def _row_bytes(pipe: FeaturePipeline) -> int:
    """Bytes of one spilled row, roughly (sets the number of shuffle shards)."""
    n_single = sum(not e.get("multi_valued") for e in pipe.spec.sparse)
    return 8 * (len(pipe.spill_columns()) + len(pipe.spec.dense) + n_single + 8)


def write_split_store(path: Path, pipe: FeaturePipeline, spill: ShardSpill, *, shuffle_seed: int | None,
                      luts: dict[str, np.ndarray | None] | None, fitted_dir: Path, meta: dict[str, Any],
                      overwrite: bool = False) -> Path:
    """One store from the encoded rows of ``spill`` (shards read in order; each shuffled with
    ``[shuffle_seed, shard]`` unless None), finalized by ``pipe``; ``fitted_dir`` holds the ``pipeline/`` to
    link into it."""
    with StoreWriter(path, pipe.schema, pipe.column_specs(), overwrite=overwrite) as w:
        for shard in spill:  # a piece of a shard at a time: the same rows in the same order as the whole shard
            for part in spill.pieces(shard, seed=None if shuffle_seed is None else [shuffle_seed, shard]):
                w.append(pipe.finalize(part, luts))
        link_tree(fitted_dir / PIPELINE_DIR, w.tmp / PIPELINE_DIR)
        w.set_meta(**meta)
    return path
