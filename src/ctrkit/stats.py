"""Statistics behind the README's seed-spread claims: pooled std over models, F tests of "more spread out",
Holm's step-down correction.

A model's spread is a (std, runs) pair: the sample std of a metric over ``runs`` seeds. ``benchmarks/
deepctr_compare.py`` reads these to compare ctrkit's zoo with DeepCTR-Torch's; they live here so that the
benchmark and the tests share one definition. scipy (F distribution) is imported only where a p value is asked
for; it is not a dependency of the library itself.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def pooled_variance(stds: Sequence[tuple[float, int]]) -> tuple[float, float]:
    """(degrees-of-freedom-weighted mean variance, Satterthwaite's effective degrees of freedom) of (std, runs)
    pairs; a pair with fewer than 2 runs has no variance to pool. (nan, 0) when none has.

    pooled = Σ (n_i - 1) s_i² / Σ (n_i - 1);  df = (Σ (n_i - 1) s_i²)² / Σ ((n_i - 1) s_i²)² / (n_i - 1)."""
    terms = [(sd * sd, n - 1) for sd, n in stds if n >= 2]
    df = sum(d for _, d in terms)
    if not df:
        return float("nan"), 0.0
    total = sum(v * d for v, d in terms)
    denominator = sum((v * d) ** 2 / d for v, d in terms)
    return total / df, (total * total / denominator if denominator > 0 else float(df))


def pooled_std(stds: Sequence[tuple[float, int]]) -> float:
    """sqrt of ``pooled_variance``: the spread of many models as one figure (nan when no pair has 2 runs)."""
    return math.sqrt(pooled_variance(stds)[0])


def _f_sf(ratio: float, df_num: float, df_den: float) -> float:
    """P(F >= ratio) for F ~ F(df_num, df_den)."""
    from scipy.stats import f  # only here: the library does not depend on scipy

    return float(f.sf(ratio, df_num, df_den))


def pooled_spread_p(ours: Sequence[tuple[float, int]], peer: Sequence[tuple[float, int]]) -> float | None:
    """One-sided test of "``ours`` is more spread out than ``peer``": the ratio of the pooled variances against F
    with Satterthwaite's degrees of freedom on each side (each model's variance has its own scale, so the pooled
    one has fewer effective degrees of freedom than the sum of the models'); None without a variance on either
    side."""
    (v_ours, df_ours), (v_peer, df_peer) = pooled_variance(ours), pooled_variance(peer)
    if not df_ours or not df_peer or v_peer == 0.0:
        return None
    return _f_sf(v_ours / v_peer, df_ours, df_peer)


def spread_p(ours: Sequence[float], peer: Sequence[float]) -> float | None:
    """P(F >= var(ours) / var(peer)) under equal variances, F ~ F(n-1, m-1); None with < 2 runs a side."""
    if len(ours) < 2 or len(peer) < 2:
        return None
    v_ours, v_peer = statistics.variance(ours), statistics.variance(peer)
    if v_peer == 0.0:
        return 0.0 if v_ours > 0.0 else 1.0
    return _f_sf(v_ours / v_peer, len(ours) - 1, len(peer) - 1)


def holm(p: dict[str, float], alpha: float = 0.05) -> list[str]:
    """The names Holm's step-down procedure rejects at family-wise ``alpha``: sorted ascending, the i-th
    smallest p (from 0) is rejected while p <= alpha / (k - i); the first that is not stops it."""
    rejected = []
    for i, (name, value) in enumerate(sorted(p.items(), key=lambda kv: kv[1])):
        if value > alpha / (len(p) - i):
            break
        rejected.append(name)
    return rejected
