"""Evaluation metrics: exact AUC, LogLoss, GAUC, accuracy, calibration, and retrieval metrics @K.

Ranking (CTR) metrics take predicted probabilities ``p`` [n] and binary labels ``y`` [n] (0/1),
optionally sample weights ``w`` [n] and group ids ``g`` [n]:

- AUC (Mann-Whitney): sort by score; for each tie block b with positive weight P_b and negative
  weight N_b, ``AUC = sum_b P_b * (N_below_b + N_b / 2) / (P * N)`` -- ties count one half, exactly
  as the average-rank formula and ``sklearn.metrics.roc_auc_score`` (weighted too).
- LogLoss: ``-sum_i w_i [y_i log p_i + (1 - y_i) log(1 - p_i)] / sum_i w_i`` with p clipped to
  [eps, 1 - eps], eps = machine epsilon of the prediction dtype (as scikit-learn >= 1.5).
- GAUC: ``sum_g n_g AUC_g / sum_g n_g`` over groups that have both classes, n_g = impressions
  (rows) of group g. Groups with a single class have no AUC; they are skipped and counted
  (``gauc_skipped_groups``). One lexsort by (group, score) computes every group at once.
- accuracy: fraction (weighted) of rows with ``(p > 0.5) == y``.
- calibration: ``mean(p) / mean(y)`` (weighted); 1.0 is calibrated, > 1 over-predicts.

Degenerate inputs: :func:`roc_auc` raises :class:`MetricError` when only one class is present
(as scikit-learn does). :class:`MetricSet` instead reports ``nan`` for an undefined AUC / GAUC /
calibration and logs a warning, so an evaluation of a tiny split never kills a training run.

Retrieval metrics take ``ranked`` item ids [Q, K'] (best first) and ``true`` ids [Q] or [Q, M]
(several relevant items per query, padded with ``pad`` = -1) and return the mean over queries of
Recall@K, HitRate@K, NDCG@K (binary relevance, ``IDCG = sum_{i < min(M_q, K)} 1/log2(i + 2)``) and
MRR@K (1 / rank of the first relevant item, 0 if none in the top K).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ctrkit.errors import MetricError
from ctrkit.io import did_you_mean

log = logging.getLogger(__name__)

METRICS = ("auc", "logloss", "gauc", "accuracy", "calibration")
MAXIMISE = {"auc": True, "gauc": True, "accuracy": True, "logloss": False, "calibration": False}
# full-ranking retrieval metrics (ctrkit.retrieval.catalogue.ranking_metrics): hr@K (= hitrate@K, = recall@K with
# one true item), ndcg@K, mrr; all higher-is-better
RANKING_METRIC = re.compile(r"^(hr|hitrate|recall|ndcg)@([1-9][0-9]*)$|^mrr$")


def higher_is_better(metric: str) -> bool:
    """Whether early stopping maximises ``metric`` (AUC, GAUC, accuracy, HR@K, NDCG@K, MRR) or minimises it."""
    return MAXIMISE.get(metric, RANKING_METRIC.match(metric) is not None)

ArrayLike = Any  # np.ndarray | torch.Tensor | Sequence[float]



def _np(x: ArrayLike, dtype: Any = None) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16 or x.dtype == torch.float16:
            x = x.float()
        x = x.numpy()
    a = np.asarray(x)
    a = a.reshape(-1)
    return a if dtype is None else a.astype(dtype, copy=False)


def _check_binary(y: np.ndarray) -> None:
    if y.size and not np.all((y == 0) | (y == 1)):
        bad = y[(y != 0) & (y != 1)][:5]
        raise MetricError(f"labels must be 0 or 1 for AUC / GAUC / accuracy; found values such as {bad.tolist()}")


def _check_lengths(**arrays: np.ndarray | None) -> int:
    sizes = {k: a.size for k, a in arrays.items() if a is not None}
    if len(set(sizes.values())) > 1:
        raise MetricError(f"metric inputs have different lengths: {sizes}")
    return next(iter(sizes.values()), 0)


def grouped_auc(
    preds: ArrayLike, labels: ArrayLike, groups: ArrayLike, weights: ArrayLike | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """AUC of every group at once.

    Returns ``(group_ids [G], auc [G], impressions [G])``; ``auc`` is nan for a group with one class.
    Cost: one lexsort O(n log n) plus O(n) reductions -- no loop over groups.
    """
    s = _np(preds, np.float64)
    y = _np(labels, np.float64)
    g = _np(groups)
    w = None if weights is None else _np(weights, np.float64)
    n = _check_lengths(preds=s, labels=y, groups=g, weights=w)
    _check_binary(y)
    if n == 0:
        return np.zeros(0, dtype=g.dtype), np.zeros(0), np.zeros(0, dtype=np.int64)
    order = np.lexsort((s, g))  # primary key: group, secondary: score ascending
    s, y, g = s[order], y[order], g[order]
    w = np.ones(n) if w is None else w[order]
    pos_w = w * y
    neg_w = w - pos_w
    new_group = np.empty(n, dtype=bool)
    new_group[0] = True
    new_group[1:] = g[1:] != g[:-1]
    new_block = new_group.copy()  # a tie block: same group and same score
    new_block[1:] |= s[1:] != s[:-1]
    block_start = np.flatnonzero(new_block)
    b_pos = np.add.reduceat(pos_w, block_start)  # (nb,)
    b_neg = np.add.reduceat(neg_w, block_start)  # (nb,)
    b_group = np.cumsum(new_group)[block_start] - 1  # group index of each block, (nb,)
    cum_neg = np.cumsum(b_neg) - b_neg  # negatives in all earlier blocks, (nb,)
    first_block = np.flatnonzero(np.r_[True, b_group[1:] != b_group[:-1]])  # (G,)
    neg_below = cum_neg - cum_neg[first_block][b_group]  # negatives below, same group only
    G = first_block.size
    num = np.bincount(b_group, b_pos * (neg_below + 0.5 * b_neg), minlength=G)
    P = np.bincount(b_group, b_pos, minlength=G)
    N = np.bincount(b_group, b_neg, minlength=G)
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = np.where((P > 0) & (N > 0), num / (P * N), np.nan)
    impressions = np.diff(np.r_[np.flatnonzero(new_group), n])
    return g[new_group], auc, impressions


def roc_auc(preds: ArrayLike, labels: ArrayLike, weights: ArrayLike | None = None) -> float:
    """Exact ROC AUC with ties counted one half (= ``sklearn.metrics.roc_auc_score``).

    Raises :class:`MetricError` when the labels hold a single class (AUC undefined).
    """
    y = _np(labels)
    _, auc, _ = grouped_auc(preds, y, np.zeros(y.size, dtype=np.int64), weights)
    if auc.size == 0 or math.isnan(auc[0]):
        npos = int((y == 1).sum())
        raise MetricError(
            f"AUC is undefined with a single class: {npos} positive and {y.size - npos} negative labels"
        )
    return float(auc[0])


def gauc(
    preds: ArrayLike, labels: ArrayLike, groups: ArrayLike, weights: ArrayLike | None = None
) -> tuple[float, int]:
    """Group AUC weighted by impressions: ``sum_g n_g AUC_g / sum_g n_g`` over two-class groups.

    Returns ``(gauc, skipped)`` where ``skipped`` counts single-class groups; gauc is nan when every
    group was skipped.
    """
    _, auc, n_g = grouped_auc(preds, labels, groups, weights)
    ok = ~np.isnan(auc)
    skipped = int((~ok).sum())
    if not ok.any():
        return float("nan"), skipped
    return float((auc[ok] * n_g[ok]).sum() / n_g[ok].sum()), skipped


def log_loss(
    preds: ArrayLike, labels: ArrayLike, weights: ArrayLike | None = None, eps: float | None = None
) -> float:
    """Mean binary cross-entropy of probabilities, clipped to [eps, 1 - eps] (eps: dtype's epsilon)."""
    p_raw = _np(preds)
    if eps is None:
        eps = float(np.finfo(p_raw.dtype if p_raw.dtype.kind == "f" else np.float64).eps)
    p = np.clip(p_raw.astype(np.float64), eps, 1 - eps)
    y = _np(labels, np.float64)
    w = None if weights is None else _np(weights, np.float64)
    n = _check_lengths(preds=p, labels=y, weights=w)
    if n == 0:
        raise MetricError("log_loss of an empty set of predictions")
    ll = -(y * np.log(p) + (1 - y) * np.log1p(-p))
    return float(np.average(ll, weights=w))


def _nonempty(
    preds: ArrayLike, labels: ArrayLike, weights: ArrayLike | None, metric: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """float64 (preds, labels, weights) of equal length; a MetricError naming ``metric`` when empty."""
    p = _np(preds, np.float64)
    y = _np(labels, np.float64)
    w = None if weights is None else _np(weights, np.float64)
    if _check_lengths(preds=p, labels=y, weights=w) == 0:
        raise MetricError(f"{metric} of an empty set of predictions")
    return p, y, w


def accuracy(preds: ArrayLike, labels: ArrayLike, weights: ArrayLike | None = None) -> float:
    """Fraction (weighted) of rows with ``(p > 0.5) == y``."""
    p, y, w = _nonempty(preds, labels, weights, "accuracy")
    return float(np.average((p > 0.5) == (y > 0.5), weights=w))


def calibration(preds: ArrayLike, labels: ArrayLike, weights: ArrayLike | None = None) -> float:
    """``mean(p) / mean(y)`` (weighted); nan when no positive label was observed."""
    p, y, w = _nonempty(preds, labels, weights, "calibration")
    observed = np.average(y, weights=w)
    if observed == 0:
        return float("nan")
    return float(np.average(p, weights=w) / observed)


# ---- streaming -------------------------------------------------------------------------------------
class MetricSet:
    """Streaming, exact evaluation: ``update`` per batch, ``compute`` at the end.

    Predictions, labels (and weights / groups when given) are kept, so every metric -- AUC and
    GAUC included -- is exact, identical to the one-shot functions on the concatenated inputs.
    Memory: 4 + 4 (+ 4 + 8) bytes per row.

    >>> ms = MetricSet(["auc", "logloss"]); ms.update(p, y); ms.compute()  # {'auc': ..., 'logloss': ...}
    """

    def __init__(self, names: Sequence[str] = ("auc", "logloss")) -> None:
        names = [names] if isinstance(names, str) else list(names)
        for m in names:
            if m not in METRICS:
                raise MetricError(f"unknown metric {m!r}{did_you_mean(m, METRICS)}; valid metrics: {list(METRICS)}")
        if not names:
            raise MetricError(f"MetricSet needs at least one metric name from {list(METRICS)}")
        self.names = names
        self.reset()

    def reset(self) -> None:
        self._preds: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._weights: list[np.ndarray] = []
        self._groups: list[np.ndarray] = []
        self._rows = 0

    def __len__(self) -> int:
        return self._rows

    def update(
        self,
        preds: ArrayLike,
        labels: ArrayLike,
        weights: ArrayLike | None = None,
        groups: ArrayLike | None = None,
    ) -> None:
        """Add one batch: probabilities [B], labels [B], optional weights [B] and group ids [B]."""
        p = _np(preds)
        p = p.astype(np.float64 if p.dtype == np.float64 else np.float32, copy=True)  # keep dtype's eps
        y = _np(labels).astype(np.float32, copy=True)
        B = _check_lengths(preds=p, labels=y)
        if (weights is None) != (not self._weights) and self._rows:
            raise MetricError("MetricSet.update: pass weights for every batch or for none")
        if (groups is None) != (not self._groups) and self._rows:
            raise MetricError("MetricSet.update: pass groups for every batch or for none")
        if weights is not None:
            w = _np(weights)
            w = w.astype(np.float64 if w.dtype == np.float64 else np.float32, copy=True)
            _check_lengths(preds=p, weights=w)
            self._weights.append(w)
        if groups is not None:
            g = _np(groups).astype(np.int64, copy=True)
            _check_lengths(preds=p, groups=g)
            self._groups.append(g)
        self._preds.append(p)
        self._labels.append(y)
        self._rows += B

    def compute(self) -> dict[str, float]:
        """The metrics on everything seen since the last reset; ``gauc`` adds ``gauc_skipped_groups``."""
        if self._rows == 0:
            raise MetricError("MetricSet.compute: no predictions were added (empty evaluation data?)")
        p = np.concatenate(self._preds)
        y = np.concatenate(self._labels)
        w = np.concatenate(self._weights) if self._weights else None
        out: dict[str, float] = {}
        for name in self.names:
            if name == "auc":
                try:
                    out["auc"] = roc_auc(p, y, w)
                except MetricError as e:
                    log.warning("auc is nan: %s", e)
                    out["auc"] = float("nan")
            elif name == "logloss":
                out["logloss"] = log_loss(p, y, w)
            elif name == "accuracy":
                out["accuracy"] = accuracy(p, y, w)
            elif name == "calibration":
                out["calibration"] = calibration(p, y, w)
            elif name == "gauc":
                if not self._groups:
                    raise MetricError(
                        "gauc needs group ids: the evaluation batches carry no group_ids "
                        "(set schema.group_id to the user/session column, or drop 'gauc' from metrics)"
                    )
                value, skipped = gauc(p, y, np.concatenate(self._groups), w)
                out["gauc"] = value
                out["gauc_skipped_groups"] = skipped
        return out



def evaluate_predictions(
    names: Sequence[str],
    preds: ArrayLike,
    labels: ArrayLike,
    weights: ArrayLike | None = None,
    groups: ArrayLike | None = None,
) -> dict[str, float]:
    """One-shot version of :class:`MetricSet`."""
    ms = MetricSet(names)
    ms.update(preds, labels, weights, groups)
    return ms.compute()


# ---- retrieval ---------------------------------------------------------------------------------------
def _relevance(ranked: ArrayLike, true: ArrayLike, k: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rel [Q, K] bool: ranked item i of query q is relevant, n_true [Q])."""
    r = torch.as_tensor(np.asarray(ranked) if not isinstance(ranked, torch.Tensor) else ranked)
    t = torch.as_tensor(np.asarray(true) if not isinstance(true, torch.Tensor) else true)
    if r.dim() != 2:
        raise MetricError(f"ranked item ids must be [Q, K], got shape {tuple(r.shape)}")
    if t.dim() == 1:
        t = t[:, None]
    if t.shape[0] != r.shape[0]:
        raise MetricError(f"ranked has {r.shape[0]} queries but true has {t.shape[0]}")
    if k < 1:
        raise MetricError(f"K must be >= 1, got {k}")
    r = r[:, :k]  # (Q, K)
    valid = t != pad  # (Q, M)
    rel = ((r[:, :, None] == t[:, None, :]) & valid[:, None, :]).any(-1)  # (Q, K)
    return rel, valid.sum(1)


def recall_at_k(ranked: ArrayLike, true: ArrayLike, k: int, pad: int = -1) -> float:
    """Mean over queries of |top-K ∩ relevant| / |relevant| (queries without relevant items skipped)."""
    rel, n_true = _relevance(ranked, true, k, pad)
    ok = n_true > 0
    return float((rel.sum(1)[ok].double() / n_true[ok].double()).mean())


def hit_rate_at_k(ranked: ArrayLike, true: ArrayLike, k: int, pad: int = -1) -> float:
    """Fraction of queries with at least one relevant item in the top K."""
    rel, _ = _relevance(ranked, true, k, pad)
    return float(rel.any(1).double().mean())


def ndcg_at_k(ranked: ArrayLike, true: ArrayLike, k: int, pad: int = -1) -> float:
    """Mean NDCG@K with binary relevance: DCG = sum_i rel_i / log2(i + 2), i = 0-based rank."""
    rel, n_true = _relevance(ranked, true, k, pad)
    K = rel.shape[1]
    disc = 1.0 / torch.log2(torch.arange(K, dtype=torch.float64) + 2.0)  # (K,)
    dcg = (rel.double() * disc).sum(1)  # (Q,)
    ideal_cum = torch.cat([torch.zeros(1, dtype=torch.float64), disc.cumsum(0)])  # (K + 1,)
    idcg = ideal_cum[n_true.clamp(max=K)]  # (Q,)
    ok = n_true > 0
    return float((dcg[ok] / idcg[ok]).mean())


def mrr_at_k(ranked: ArrayLike, true: ArrayLike, k: int, pad: int = -1) -> float:
    """Mean reciprocal rank of the first relevant item within the top K (0 if none)."""
    rel, _ = _relevance(ranked, true, k, pad)
    K = rel.shape[1]
    ranks = torch.arange(1, K + 1, dtype=torch.float64)
    first = torch.where(rel, ranks, torch.full_like(ranks, float("inf"))).min(1).values  # (Q,)
    return float((1.0 / first).mean())


def retrieval_metrics(
    ranked: ArrayLike, true: ArrayLike, ks: Sequence[int] = (10, 50), pad: int = -1
) -> dict[str, float]:
    """{'recall@K', 'hitrate@K', 'ndcg@K', 'mrr@K'} for every K in ``ks``."""
    out: dict[str, float] = {}
    for k in ks:
        out[f"recall@{k}"] = recall_at_k(ranked, true, k, pad)
        out[f"hitrate@{k}"] = hit_rate_at_k(ranked, true, k, pad)
        out[f"ndcg@{k}"] = ndcg_at_k(ranked, true, k, pad)
        out[f"mrr@{k}"] = mrr_at_k(ranked, true, k, pad)
    return out
