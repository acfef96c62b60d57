"""The item catalogue a retrieval model ranks, the items each user has already seen, and full-ranking metrics.

* :class:`ItemCatalogue`: every item the training store knows (id >= 2: 0 is padding / missing, 1 the shared
  rare / unseen id, neither a real item) with its item-side features (``item``, ``cate``, ...: the
  single-valued sparse features of group "item"), sorted by item id, and its count as a training target.
  Built from a training store's targets and histories, saved inside every retrieval checkpoint.
* :class:`SeenItems`: (user group, item) pairs of the training store (targets and histories), the items a
  user's ranking excludes (DESIGN.md: full ranking over all items, excluding the user's training items).
* :func:`sequence_rows` / :func:`position_targets`: a training store in sequence form (one row per user sequence
  window, ``ctrkit preprocess behaviour --train-rows sequence``): its per-position targets are the history shifted
  by one, followed by the row's own item.
* :func:`target_ranks` / :func:`ranking_metrics`: the 0-based rank of each row's true item among all
  catalogue items not excluded for that row (ties count against the target), and HR@K / NDCG@K / MRR from
  the ranks. A true item that is excluded or not in the catalogue (cold: id 1) is a miss (rank = inf).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.data.storage.store import Store
from ctrkit.errors import MetricError, RetrievalError
from ctrkit.metrics import RANKING_METRIC
from ctrkit.schema import Schema

log = logging.getLogger(__name__)

FIRST_ITEM_ID = 2  # ids 0 (missing / padding) and 1 (rare / unseen) are not items


def item_feature_names(schema: Schema) -> list[str]:
    """The schema's item-side features: single-valued sparse features of group "item", the schema's declared
    ``item_id`` first; empty when there are none."""
    return schema.item_features()


def item_features(schema: Schema) -> list[str]:
    """:func:`item_feature_names`, an error when there are none."""
    names = item_feature_names(schema)
    if not names:
        raise RetrievalError(f"schema has no item features (single-valued sparse features of group 'item'); "
                             f"sparse features: {[(s.name, s.group) for s in schema.sparse]}")
    return names


def history_of(schema: Schema, feature: str) -> str | None:
    """The unpooled history (declared role "history") embedded by ``feature``'s table (``hist_item`` for
    ``item``), if any."""
    table = schema.table_of(feature)
    return next((q for q in schema.sequences("history") if schema.table_of(q) == table), None)


def sequence_rows(store: Store) -> bool:
    """Whether ``store`` holds sequence rows (per-position targets; its manifest's ``preprocessing.rows``)."""
    return store.preprocessing.get("rows") == "sequence"


def sequence_window(store: Store) -> tuple[int, int] | None:
    """(max_len, stride) of a store of sequence rows (which positions a row owns:
    :func:`~ctrkit.data.sources.behaviour_sequences.owned_positions`), None for per-prefix rows."""
    if not sequence_rows(store):
        return None
    w = store.preprocessing.get("sequence") or {}
    if "max_len" not in w or "stride" not in w:
        raise RetrievalError(f"store {store.path} holds sequence rows but its manifest lacks preprocessing.sequence "
                             "{max_len, stride}; rebuild it with `ctrkit preprocess behaviour --train-rows sequence`")
    return int(w["max_len"]), int(w["stride"])


def position_targets(kj: KeyedJagged, history: str, item: str, max_len: int) -> torch.Tensor:
    """Per-position targets of sequence rows -> (B, max_len) ids: position t of row b holds the item after its
    t-th history step, ``hist[b, t + 1]``, and the last step's is the row's own ``item``; 0 past the history."""
    ids, mask = kj.to_padded(history, max_len)  # (B, T) each
    nxt = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], 1)  # (B, T)
    last = mask.sum(1) - 1  # (B,); -1: an empty history has no target
    rows = torch.arange(len(ids), device=ids.device)
    has = last >= 0
    nxt[rows[has], last[has]] = kj[item][0][has].to(nxt.dtype)
    return nxt.masked_fill(~mask, 0)


def _target_ids(store: Store, item: str, hist: str | None) -> np.ndarray:
    """Item ids of ``store``'s positive targets: the label-1 rows' items; for sequence rows, the targets of the
    positions each row owns (position t's target is history step t + 1, the last one's the row's item)."""
    window = sequence_window(store) if hist is not None else None
    if window is None:
        return np.asarray(store[item], np.int64)[_positive(store)]
    max_len, stride = window
    values, offsets = store[hist]
    values, h = np.asarray(values, np.int64), np.diff(np.asarray(offsets, np.int64))
    row = np.repeat(np.arange(len(h)), h)
    t = np.arange(len(values)) - np.repeat(np.asarray(offsets[:-1], np.int64), h)  # (nnz,) position in its row
    owned = (h[row] < max_len) | (t >= h[row] - stride)
    nxt = np.append(values[1:], 0)
    last = t == h[row] - 1
    nxt[last] = np.asarray(store[item], np.int64)[row[last]]
    return nxt[owned]


def _positive(store: Store) -> np.ndarray:
    """(n,) bool: the rows whose item the user interacted with (label 1; a DIN-style store's sampled negatives
    are label 0)."""
    return np.asarray(store[store.schema.label]) > 0


@dataclass
class ItemCatalogue:
    """Items (rows sorted by item id) and their features; ``features[item_feature]`` are the item ids."""

    features: dict[str, np.ndarray]  # feature -> (N,) int64 ids, item id feature first
    counts: np.ndarray  # (N,) occurrences as a training target

    @property
    def item_feature(self) -> str:
        return next(iter(self.features))

    @property
    def ids(self) -> np.ndarray:
        return self.features[self.item_feature]

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_store(cls, store: Store) -> ItemCatalogue:
        """Every item of ``store``'s targets and histories, its features from its first occurrence (targets
        first), its count as a positive target."""
        feats = item_features(store.schema)
        hists = {f: history_of(store.schema, f) for f in feats}
        item_hist = hists[feats[0]]
        cols = {}
        for f in feats:
            parts = [np.asarray(store[f], np.int64)]
            h = hists[f]
            if item_hist is not None:  # align with the item history: the attribute's own history or missing
                n = len(store[item_hist][0])
                parts.append(np.asarray(store[h][0], np.int64) if h is not None and len(store[h][0]) == n
                             else np.zeros(n, np.int64))
            cols[f] = np.concatenate(parts)
        ids, first = np.unique(cols[feats[0]], return_index=True)
        keep = ids >= FIRST_ITEM_ID
        ids, first = ids[keep], first[keep]
        if not len(ids):
            raise RetrievalError(f"store {store.path} has no items (no item id >= {FIRST_ITEM_ID}); "
                                 "is it empty?")
        targets = _target_ids(store, feats[0], item_hist)
        counts = np.bincount(targets, minlength=int(ids.max()) + 1)[ids]
        return cls({f: cols[f][first] for f in feats}, counts.astype(np.int64))

    def rows_of(self, item_ids: torch.Tensor) -> torch.Tensor:
        """Catalogue rows of ``item_ids`` (any shape); -1 for an id that is not in the catalogue."""
        ids = torch.as_tensor(self.ids, device=item_ids.device)
        pos = torch.searchsorted(ids, item_ids).clamp(max=len(ids) - 1)
        return torch.where(ids[pos] == item_ids, pos, torch.full_like(pos, -1))

    def batch(self, rows: torch.Tensor | np.ndarray | slice | None = None,
              device: torch.device | str = "cpu") -> Batch:
        """A batch of catalogue items (item features only, no dense, labels 0) for ``encode_item``."""
        sel = slice(None) if rows is None else rows
        if isinstance(sel, torch.Tensor):
            sel = sel.cpu().numpy()
        ids = np.stack([f[sel] for f in self.features.values()], 1)  # (n, F)
        kj = KeyedJagged.from_dense(list(self.features), torch.from_numpy(np.ascontiguousarray(ids)))
        n = ids.shape[0]
        return Batch(dense=torch.zeros(n, 0), sparse=kj, labels=torch.zeros(n)).to(device)

    def to_payload(self) -> dict[str, Any]:
        return {"features": {k: v.copy() for k, v in self.features.items()}, "order": list(self.features),
                "counts": self.counts.copy()}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> ItemCatalogue:
        feats = payload["features"]
        return cls({k: np.asarray(feats[k], np.int64) for k in payload["order"]},
                   np.asarray(payload["counts"], np.int64))


@torch.no_grad()
def encode_catalogue(model: torch.nn.Module, catalogue: ItemCatalogue, device: torch.device | str = "cpu",
                     chunk: int = 65536) -> torch.Tensor:
    """Every catalogue item's vector (N, D) float32 on ``device``, ``model.encode_item`` on ``chunk`` items at a
    time (under whatever autocast the caller set)."""
    return torch.cat([model.encode_item(catalogue.batch(slice(a, a + chunk), device)).float()
                      for a in range(0, len(catalogue), chunk)])


class SeenItems:
    """The items of each user group in a training store: sorted unique (group code, item id) pairs from
    ``groups`` / ``items`` (n,) each."""

    def __init__(self, groups: np.ndarray, items: np.ndarray) -> None:
        groups, items = np.asarray(groups, np.int64), np.asarray(items, np.int64)
        self.groups, code = np.unique(groups, return_inverse=True)  # (G,), (n,)
        keys = np.unique(code.astype(np.int64) * (int(items.max(initial=0)) + 1) + items)
        width = int(items.max(initial=0)) + 1
        self._code, self._item = keys // width, keys % width
        self._start = np.searchsorted(self._code, np.arange(len(self.groups) + 1))  # (G + 1,)

    @classmethod
    def from_store(cls, store: Store) -> SeenItems:
        """The positive targets and the histories of ``store``'s rows, by its group column (the user)."""
        if not store.schema.group_id:
            raise RetrievalError(f"store {store.path} has no group (user) column, so the items each user saw in "
                                 "training cannot be excluded; build it with `ctrkit preprocess behaviour`")
        item = item_features(store.schema)[0]
        group = np.asarray(store[store.schema.group_id], np.int64)
        pos = _positive(store)
        groups, items = [group[pos]], [np.asarray(store[item], np.int64)[pos]]
        hist = history_of(store.schema, item)
        if hist is not None:  # every row's history holds only the user's own items
            values, offsets = store[hist]
            groups.append(np.repeat(group, np.diff(np.asarray(offsets))))
            items.append(np.asarray(values, np.int64))
        return cls(np.concatenate(groups), np.concatenate(items))

    @classmethod
    def from_training_store(cls, path: str | Path | None) -> SeenItems | None:
        """:meth:`from_store` of the store at ``path`` (a checkpoint's ``data.train``), or None with a warning
        when it is not on disk (then only each row's own history is excluded)."""
        if path and Path(path).is_dir():
            return cls.from_store(Store(path))
        log.warning("training store %s is not on disk: only each row's own history is excluded from its ranking",
                    path)
        return None

    def pairs(self, group_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, item id) of every item seen by the group of each row of ``group_ids`` (B,)."""
        g = np.asarray(group_ids, np.int64)
        pos = np.minimum(np.searchsorted(self.groups, g), max(len(self.groups) - 1, 0))
        known = self.groups[pos] == g if len(self.groups) else np.zeros(len(g), bool)
        lo = np.where(known, self._start[pos], 0)
        n = np.where(known, self._start[np.minimum(pos + 1, len(self.groups))] - lo, 0)
        offs = np.cumsum(n) - n
        idx = np.repeat(lo - offs, n) + np.arange(int(n.sum()))
        return np.repeat(np.arange(len(g)), n), self._item[idx]


def exclusion_pairs(catalogue: ItemCatalogue, seen: SeenItems | None, batch: Batch,
                    history: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, catalogue row) pairs a full ranking masks for ``batch``: the items ``seen`` by each row's user in
    training (by ``batch.group_ids``) and the row's own ``history`` sequence (e.g. ``hist_item``: for a test
    row it also holds the valid item). Items outside the catalogue are dropped. On the batch's device."""
    rows, items = [], []
    if seen is not None and batch.group_ids is not None:
        r, i = seen.pairs(batch.group_ids.cpu().numpy())
        rows.append(torch.from_numpy(r))
        items.append(torch.from_numpy(i))
    if history is not None:
        values, lengths, _ = batch.sparse[history]
        rows.append(torch.repeat_interleave(torch.arange(len(batch)), lengths.cpu()))
        items.append(values.cpu())
    if not rows:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    r, i = torch.cat(rows), torch.cat(items)
    c = catalogue.rows_of(i)
    keep = c >= 0
    return r[keep].to(batch.labels.device), c[keep].to(batch.labels.device)


def target_ranks(scores: torch.Tensor, target_rows: torch.Tensor, exclude: tuple[torch.Tensor, torch.Tensor]
                 ) -> torch.Tensor:
    """0-based rank of each row's target among the catalogue items not excluded (ties count against it).

    ``scores`` (B, N) over catalogue rows, ``target_rows`` (B,) (-1: not in the catalogue), ``exclude``
    (rows, catalogue rows) pairs masked out. Returns (B,) float64 ranks, inf where the target is not in the
    catalogue or is itself excluded."""
    s = scores.float().clone()
    r, c = exclude
    if r.numel():
        s[r, c] = float("-inf")
    B = s.shape[0]
    ok = target_rows >= 0
    t = s[torch.arange(B, device=s.device), target_rows.clamp(min=0)]  # (B,)
    ok &= torch.isfinite(t)
    ahead = (s >= t.unsqueeze(1)).sum(1) - 1  # items scored at least as high, the target itself not counted
    return torch.where(ok, ahead.double(), torch.full_like(ahead, float("inf"), dtype=torch.float64))


def check_ranking_metrics(names: list[str]) -> None:
    bad = [m for m in names if not RANKING_METRIC.match(m)]
    if bad:
        raise MetricError(f"unknown retrieval metric(s) {bad}: use hr@K (or hitrate@K, recall@K: the same with one true item), "
                          "ndcg@K or mrr, e.g. [hr@10, hr@50, ndcg@10, mrr]")


def ranking_metrics(ranks: np.ndarray, names: list[str]) -> dict[str, float]:
    """HR@K (= recall@K with one true item), NDCG@K = 1 / log2(rank + 2) within K, MRR = 1 / (rank + 1) over
    all items; each a mean over the rows of ``ranks`` (B,)."""
    check_ranking_metrics(names)
    if len(ranks) == 0:
        raise MetricError("no queries to rank: the evaluation data is empty")
    r = np.asarray(ranks, np.float64)
    out = {}
    for name in names:
        m = RANKING_METRIC.match(name)
        assert m is not None
        if name == "mrr":
            out[name] = float((1.0 / (r + 1.0)).mean())
            continue
        k = int(m.group(2))
        hit = r < k
        out[name] = float(hit.mean()) if m.group(1) != "ndcg" else float(
            np.where(hit, 1.0 / np.log2(np.where(hit, r, 0) + 2.0), 0.0).mean())
    return out
