"""The numbers behind the report's plots, in numpy only (no plotting here, so each is testable on its own).

Inputs are the scores ``s`` [n] (click probabilities of the best checkpoint) and labels ``y`` [n] (0/1) of
``predictions.npz``, and optionally group ids ``g`` [n].

- ROC: for every distinct score t, taken from the highest down, ``TPR(t) = #{y=1, s>=t} / #{y=1}`` and
  ``FPR(t) = #{y=0, s>=t} / #{y=0}``, starting at (0, 0) with threshold +inf -- the points of
  ``sklearn.metrics.roc_curve(y, s, drop_intermediate=False)``. The area under them (trapezoids) is the AUC of
  :func:`ctrkit.metrics.roc_auc`, ties counting one half.
- Calibration: rows cut into ``bins`` bins of (about) equal count by score quantile -- CTR scores crowd near
  0, so equal-width bins would put almost every row in the first one; per bin the mean score, the observed
  click rate and its binomial standard error ``sqrt(r (1 - r) / n)``.
- Score histogram: counts of positives and negatives over shared bins spanning the scores.
- Per-group AUC: :func:`ctrkit.metrics.grouped_auc`; groups with one class have none and are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ctrkit.errors import MetricError
from ctrkit.metrics import grouped_auc


def _scores_labels(score: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(score, np.float64).reshape(-1)
    y = np.asarray(label, np.float64).reshape(-1)
    if s.shape != y.shape:
        raise MetricError(f"{s.size} scores but {y.size} labels")
    if s.size == 0:
        raise MetricError("no predictions")
    return s, y


def roc_points(score: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(fpr, tpr, thresholds)``, each [distinct scores + 1] (see the module docstring); a MetricError when the
    labels hold one class only (the curve is undefined)."""
    s, y = _scores_labels(score, label)
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    last_of_block = np.r_[np.flatnonzero(np.diff(s)), s.size - 1]  # the last row of each tie block
    tps = np.cumsum(y)[last_of_block]
    fps = (last_of_block + 1) - tps
    if tps[-1] == 0 or fps[-1] == 0:
        raise MetricError(f"the ROC curve needs both classes: {int(tps[-1])} positive and {int(fps[-1])} "
                          "negative labels")
    fpr = np.r_[0.0, fps / fps[-1]]
    tpr = np.r_[0.0, tps / tps[-1]]
    return fpr, tpr, np.r_[np.inf, s[last_of_block]]


def roc_area(fpr: np.ndarray, tpr: np.ndarray) -> float:
    """Area under ROC points by trapezoids: the AUC, a tie block counting one half (no second sort of the rows)."""
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1])) / 2)


def thin_curve(x: np.ndarray, y: np.ndarray, max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """At most about ``max_points`` points of a monotone curve (x, y both non-decreasing), spaced evenly along
    ``x + y``, first and last point kept: a million-row ROC drawn with no visible difference."""
    if x.size <= max_points:
        return x, y
    progress = x + y
    grid = np.linspace(progress[0], progress[-1], max_points)
    keep = np.unique(np.r_[0, np.searchsorted(progress, grid).clip(0, x.size - 1), x.size - 1])
    return x[keep], y[keep]


@dataclass(frozen=True)
class CalibrationBins:
    """Per bin (bins that received no row are left out): ``lo`` / ``hi`` score edges, ``count`` rows,
    ``mean_score`` (predicted CTR), ``rate`` (observed CTR) and ``stderr`` of the rate."""

    lo: np.ndarray
    hi: np.ndarray
    count: np.ndarray
    mean_score: np.ndarray
    rate: np.ndarray
    stderr: np.ndarray


def calibration_bins(score: np.ndarray, label: np.ndarray, bins: int = 10) -> CalibrationBins:
    """Predicted vs observed CTR in ``bins`` equal-count score bins; a row lands in bin k when
    ``edges[k] <= s < edges[k + 1]`` (the top bin includes its upper edge). Tied scores never straddle a bin edge,
    so heavy ties merge bins."""
    s, y = _scores_labels(score, label)
    if bins < 1:
        raise MetricError(f"calibration needs at least one bin, got {bins}")
    edges = np.unique(np.quantile(s, np.linspace(0.0, 1.0, bins + 1)))
    if edges.size == 1:  # every score equal: one bin
        edges = np.r_[edges, edges]
    k = np.searchsorted(edges[1:-1], s, side="right")  # (n,) bin of each row
    m = edges.size - 1
    count = np.bincount(k, minlength=m)
    keep = count > 0
    n = count[keep].astype(np.float64)
    mean_score = np.bincount(k, s, minlength=m)[keep] / n
    rate = np.bincount(k, y, minlength=m)[keep] / n
    return CalibrationBins(lo=edges[:-1][keep], hi=edges[1:][keep], count=count[keep], mean_score=mean_score,
                           rate=rate, stderr=np.sqrt(rate * (1 - rate) / n))


def score_histograms(score: np.ndarray, label: np.ndarray, bins: int = 50) -> tuple[np.ndarray, np.ndarray,
                                                                                     np.ndarray]:
    """``(edges [bins + 1], negatives [bins], positives [bins])``: row counts per score bin, one shared set of
    edges from the lowest to the highest score."""
    s, y = _scores_labels(score, label)
    lo, hi = float(s.min()), float(s.max())
    if hi <= lo:
        lo, hi = lo - 0.5e-3, hi + 0.5e-3
    edges = np.linspace(lo, hi, bins + 1)
    pos = y > 0.5
    return edges, np.histogram(s[~pos], edges)[0], np.histogram(s[pos], edges)[0]


def group_aucs(score: np.ndarray, label: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """``(auc [G'], impressions [G'], skipped)`` of the G' groups holding both classes; ``skipped`` counts the
    others. ``sum(auc * impressions) / sum(impressions)`` is the GAUC."""
    _, auc, n = grouped_auc(score, label, group)
    ok = ~np.isnan(auc)
    return auc[ok], n[ok], int((~ok).sum())
