"""``ctrkit recall``: top-K candidates per query row from a retrieval checkpoint and a faiss index.

    item vectors = model.encode_item(the checkpoint's catalogue)        (N, D)  -> VectorIndex (flat / ivf / hnsw)
    query vectors = model.encode_query(rows of --data)                  (Q, D)  -> top-K, seen items excluded

Seen items: the row's own history and, when the checkpoint's training store is still on disk, every item the
row's user has there (the same exclusion as evaluation). Cold start, per row, said in the ``source`` column:

* ``model``: the user is known (its user id features are ids >= 2) -> the model's query vector;
* ``cold_start_features``: an unknown user (every user id feature is 0 / 1, the shared rare row) who has a
  history or other features -> the model's query vector built from them, the user id being the rare id;
* ``popular``: an unknown user with an empty history, or any row of a model that reads no user feature and
  has no history to read -> the most popular training items, seen ones excluded.

The query store must also hold the checkpoint's vocabularies (as ``ctrkit evaluate`` checks): ids of other
vocabularies would name other users and items, and their candidates would be wrong.
An index saved with ``--index-path`` carries the checkpoint's checksum; reusing it with another checkpoint or
a model of another dimension is refused. Output CSV (LF line ends): ``row, user, rank, item, score, source``
(raw user and item keys through the checkpoint's vocabularies; K rows per query row). The user is the store's
group column: ``ctrkit preprocess behaviour`` gives the valid / test users without train rows group ids of their
own, so they are named too; only a user first met in a store preprocessed later (``--vocab-from``) is
``<unknown>``, the checkpoint holding no key for it. --data must hold the checkpoint's features (a ranking
store is refused, naming the features that differ).
"""

from __future__ import annotations

import argparse
import csv
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrkit.checkpoint import Checkpoint
from ctrkit.data.pipeline.vocab import GROUP_TABLE
from ctrkit.data.storage.agree import check_same_vocabulary
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store
from ctrkit.errors import JobError
from ctrkit.io import atomic_file, file_checksum
from ctrkit.jobs.common import (
    SCORING_BATCH_HELP,
    check_same_features,
    checkpoint_config,
    checkpoint_vocabularies,
)
from ctrkit.models.base import TwoTowerModel
from ctrkit.retrieval.catalogue import ItemCatalogue, SeenItems, encode_catalogue, exclusion_pairs, history_of
from ctrkit.serving.index import INDEX_KINDS, VectorIndex
from ctrkit.typecheck import PositiveInt, cli_type

log = logging.getLogger(__name__)
SOURCES = ("model", "cold_start_features", "popular")


def raw_keys(vocab: Any, ids: np.ndarray) -> np.ndarray:
    """Raw keys (as text) of ``ids`` through a fitted vocabulary; "" for 0 (missing), "<unknown>" for 1 or an id
    the vocabulary does not hold (hashed vocabularies give the first key of a bucket)."""
    ids = np.asarray(ids, np.int64)
    order = np.argsort(vocab.ids, kind="stable")
    sid, skeys = vocab.ids[order], vocab.keys[order].astype(str)
    pos = np.searchsorted(sid, ids).clip(max=max(len(sid) - 1, 0))
    hit = (sid[pos] == ids) if len(sid) else np.zeros(len(ids), bool)
    out = np.where(hit, skeys[pos] if len(sid) else "", "<unknown>").astype(object)
    out[ids == 0] = ""
    return out


def row_sources(model: TwoTowerModel, schema: Any, batch: Any) -> np.ndarray:
    """(B,) index into SOURCES of each row (see the module docstring)."""
    f = model.fields
    B = len(batch)
    user_keys = [s.name for s in schema.sparse if s.group == "user" and s.name in f.query_pooled]
    known = np.zeros(B, bool)
    for k in user_keys:  # a user id (or user attribute) the vocabulary knows: id >= 2
        values, lengths, _ = batch.sparse[k]
        row = torch.repeat_interleave(torch.arange(B), lengths)
        top = torch.zeros(B, dtype=torch.int64).scatter_reduce(0, row, values, "amax")
        known |= (top >= 2).numpy()
    has_hist = np.zeros(B, bool)
    for h in f.histories:
        has_hist |= (batch.sparse[h][1] > 0).numpy()
    other = bool(f.dense) or any(k not in user_keys for k in f.query_pooled)  # context / user attributes
    return np.where(known, 0, np.where(has_hist | other, 1, 2))


def recall(checkpoint: str | Path, data: str | Path | None, out: str | Path, *, k: int = 50,
           index_kind: str = "flat_ip", index_path: str | Path | None = None, nprobe: int | None = None,
           ef_search: int | None = None, batch_size: int | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Write ``out`` (see the module docstring); returns counts per source and the index used. ``batch_size``:
    query rows per batch (default: the checkpoint's, :attr:`Checkpoint.scoring_batch_size`)."""
    if index_kind not in INDEX_KINDS:
        raise JobError(f"--index {index_kind!r} is not one of {INDEX_KINDS}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise JobError(f"--out {out} already exists; choose another path or pass --overwrite")
    ckpt = Checkpoint.load(checkpoint)
    model, schema, cfg = ckpt.build_model(), ckpt.schema, checkpoint_config(ckpt)
    if not isinstance(model, TwoTowerModel) or ckpt.catalogue is None:
        raise JobError(f"{checkpoint} holds a {ckpt.model_name!r} model without an item catalogue; `ctrkit "
                       "recall` needs a retrieval model (two_tower, youtube_dnn, sasrec)")
    catalogue = ItemCatalogue.from_payload(ckpt.catalogue)
    if k > len(catalogue):
        raise JobError(f"--k {k} is larger than the {len(catalogue)} items of the catalogue; lower --k")
    train_store = cfg.data.train if cfg is not None else None
    store = _query_store(ckpt, checkpoint, data, cfg)
    seen = SeenItems.from_training_store(train_store)
    index = _item_index(model, catalogue, Path(checkpoint), index_kind, index_path, overwrite)
    index.set_search_params(nprobe=nprobe, ef_search=ef_search)
    pipeline = ckpt.feature_pipeline()
    vocabs = pipeline.vocabs_ or {}
    item_table, user_table = schema.table_of(catalogue.item_feature), GROUP_TABLE  # the group column: the user
    popular = catalogue.ids[np.argsort(-catalogue.counts, kind="stable")]  # (N,) most popular first
    hist = history_of(schema, catalogue.item_feature)
    rows = ckpt.scoring_batch_size if batch_size is None else batch_size
    loader = BatchLoader(store, rows, shuffle=False, prefetch=0, pipeline=pipeline)
    counts = dict.fromkeys(SOURCES, 0)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with atomic_file(out, option="--out") as tmp, open(tmp, "w", newline="") as fh, torch.no_grad():
        w = csv.writer(fh, lineterminator="\n")  # csv's default is CRLF
        w.writerow(["row", "user", "rank", "item", "score", "source"])
        for batch in loader:
            B = len(batch)
            r, c = exclusion_pairs(catalogue, seen, batch, hist)  # the same exclusion as evaluation
            exclude = (r.numpy(), catalogue.ids[c.numpy()])  # (query row, item id) pairs
            scores, ids = index.search(model.encode_query(batch).float().numpy(), k, exclude)
            source = row_sources(model, schema, batch)
            _popular_fallback(np.flatnonzero(source == 2), popular, exclude, scores, ids)
            users = (raw_keys(vocabs[user_table], batch.group_ids.numpy())
                     if user_table in vocabs and batch.group_ids is not None else np.full(B, ""))
            items_raw = raw_keys(vocabs[item_table], ids.reshape(-1)) if item_table in vocabs else ids.reshape(-1)
            for c in range(3):
                counts[SOURCES[c]] += int((source == c).sum())
            row = np.repeat(np.arange(n, n + B), k)
            w.writerows(zip(row, np.repeat(users, k), np.tile(np.arange(1, k + 1), B), items_raw,
                            (f"{s:.6f}" for s in scores.reshape(-1)), np.repeat(np.array(SOURCES)[source], k)))
            n += B
    log.info("recall: %d query rows x %d candidates -> %s (%s; index %s)", n, k, out, counts, index.meta["kind"])
    if counts["cold_start_features"] or counts["popular"]:
        log.warning("%d rows of unknown users were served from their features, %d from the popular items (column "
                    "'source')", counts["cold_start_features"], counts["popular"])
    return {"rows": n, "sources": counts, "index": index.meta["kind"], "output": str(out)}


def _query_store(ckpt: Checkpoint, checkpoint: str | Path, data: str | Path | None, cfg: Any) -> Store:
    """The store of query rows (``--data``, else the checkpoint's test store), holding the checkpoint's features (a
    ranking (Criteo) store is refused, naming the features that differ) with its vocabularies."""
    path = data or (cfg.data.test if cfg is not None else None)
    if not path:
        raise JobError("no query rows: pass --data STORE (the checkpoint's config names no test store)")
    store = Store(path)
    check_same_features(ckpt.schema, store.schema, f"{'--data' if data else 'data.test'} {path}",
                        f"checkpoint {checkpoint}")
    check_same_vocabulary(checkpoint_vocabularies(ckpt, checkpoint), store,  # as `ctrkit evaluate`: other ids
                          "--data" if data else "the checkpoint's data.test")  # name other users and items
    return store


def _item_index(model: TwoTowerModel, catalogue: ItemCatalogue, checkpoint: Path, kind: str,
                index_path: str | Path | None, overwrite: bool) -> VectorIndex:
    """The index of the catalogue's item vectors: the one saved at ``index_path`` when it was built from this
    checkpoint (and ``overwrite`` is off), else a new one (saved there when given)."""
    vectors = encode_catalogue(model, catalogue).numpy()  # (N, D), the model in eval mode (build_model)
    fingerprint = file_checksum(checkpoint, full=True)
    if index_path is not None and Path(index_path).exists() and not overwrite:
        index = VectorIndex.load(index_path, expect_dim=vectors.shape[1], expect_fingerprint=fingerprint)
        log.info("loaded the %s index at %s", index.meta["kind"], index_path)
        return index
    index = VectorIndex.build(vectors, catalogue.ids, kind=kind, fingerprint=fingerprint)
    if index_path is not None:
        index.save(index_path, overwrite=overwrite)
    return index


def _popular_fallback(rows: np.ndarray, popular: np.ndarray, exclude: tuple[np.ndarray, np.ndarray],
                      scores: np.ndarray, ids: np.ndarray) -> None:
    """Give ``rows`` the most popular items they have not seen (score NaN), in place; a few rows per batch, so a
    per-row lookup is fine."""
    k = ids.shape[1]
    for j in rows:
        mine = set(exclude[1][exclude[0] == j].tolist())
        pick = [x for x in popular[: k + len(mine)] if x not in mine][:k]
        ids[j] = np.pad(pick, (0, k - len(pick)), constant_values=-1)
        scores[j] = np.nan


def add_recall_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="a retrieval model's checkpoint (best.pt)")
    p.add_argument("--data", help="store of query rows (default: the checkpoint's test store)")
    p.add_argument("--k", type=cli_type(PositiveInt), default=50, help="candidates per query row")
    p.add_argument("--out", required=True, help="CSV: row, user, rank, item, score, source")
    p.add_argument("--index", choices=INDEX_KINDS, default="flat_ip", help="exact (flat_*) or approximate")
    p.add_argument("--index-path", help="save the index here (or reuse it, when built from this checkpoint)")
    p.add_argument("--nprobe", type=cli_type(PositiveInt), help="ivf: lists scanned per query")
    p.add_argument("--ef-search", type=cli_type(PositiveInt), help="hnsw: candidates kept in the graph walk")
    p.add_argument("--batch-size", type=cli_type(PositiveInt), default=None, help=SCORING_BATCH_HELP)
    p.add_argument("--overwrite", action="store_true", help="replace --out / --index-path if they exist")


def run_recall(args: argparse.Namespace) -> int:
    if args.k < 1:
        raise JobError(f"--k must be >= 1, got {args.k}")
    recall(args.checkpoint, args.data, args.out, k=args.k, index_kind=args.index, index_path=args.index_path,
           nprobe=args.nprobe, ef_search=args.ef_search, batch_size=args.batch_size, overwrite=args.overwrite)
    return 0
