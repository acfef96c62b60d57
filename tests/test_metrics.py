"""Metrics against scikit-learn and naive loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

from ctrkit import metrics as M


def _data(seed: int, n: int = 2000, tied: bool = False, weighted: bool = False):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(np.float64)
    if tied:  # few distinct scores -> heavy ties across classes
        p = rng.integers(0, 5, n) / 4.0 * 0.9 + 0.05 + 0.02 * y * rng.integers(0, 2, n)
    else:
        p = 1 / (1 + np.exp(-(rng.normal(size=n) + y)))
    w = rng.random(n) + 0.1 if weighted else None
    return p, y, w


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_auc_equals_sklearn(tied, weighted, seed):
    p, y, w = _data(seed, tied=tied, weighted=weighted)
    assert M.roc_auc(p, y, w) == pytest.approx(roc_auc_score(y, p, sample_weight=w), abs=1e-12)


def test_auc_all_tied_is_half_and_torch_input():
    y = np.array([0, 1, 0, 1, 1.0])
    assert M.roc_auc(np.full(5, 0.3), y) == pytest.approx(0.5)
    p = torch.rand(100)
    yt = (torch.rand(100) < 0.5).float()
    assert M.roc_auc(p, yt) == pytest.approx(roc_auc_score(yt.numpy(), p.numpy()), abs=1e-12)


def test_auc_single_class_raises():
    with pytest.raises(M.MetricError, match="single class"):
        M.roc_auc([0.1, 0.2], [1, 1])
    with pytest.raises(M.MetricError, match="0 or 1"):
        M.roc_auc([0.1, 0.2], [0, 2])


@pytest.mark.parametrize("weighted", [False, True])
def test_logloss_and_accuracy_equal_sklearn(weighted):
    p, y, w = _data(3, weighted=weighted)
    p[:3] = [0.0, 1.0, 1e-300]  # clipping
    assert M.log_loss(p, y, w) == pytest.approx(log_loss(y, p, sample_weight=w), rel=1e-12)
    assert M.accuracy(p, y, w) == pytest.approx(accuracy_score(y, p > 0.5, sample_weight=w), abs=1e-12)


def test_calibration_against_formula():
    p, y, w = _data(4, weighted=True)
    assert M.calibration(p, y, w) == pytest.approx(np.sum(p * w) / np.sum(y * w), rel=1e-12)
    assert math.isnan(M.calibration([0.2, 0.3], [0, 0]))


def _naive_gauc(p, y, g):
    num = den = 0.0
    skipped = 0
    for gid in np.unique(g):
        m = g == gid
        if len(np.unique(y[m])) < 2:
            skipped += 1
            continue
        num += m.sum() * roc_auc_score(y[m], p[m])
        den += m.sum()
    return num / den, skipped


@pytest.mark.parametrize("tied", [False, True])
def test_gauc_equals_naive_loop(tied):
    p, y, _ = _data(5, n=3000, tied=tied)
    g = np.random.default_rng(5).integers(0, 600, p.size) * 7 - 300  # unsorted, negative ids, ~5 rows
    value, skipped = M.gauc(p, y, g)
    ref, ref_skipped = _naive_gauc(p, y, g)
    assert skipped == ref_skipped and skipped > 0
    assert value == pytest.approx(ref, abs=1e-12)


def test_gauc_per_group_auc_and_all_skipped():
    p, y, _ = _data(6, n=500)
    g = np.arange(500) % 3
    gids, auc, n = M.grouped_auc(p, y, g)
    for i, gid in enumerate(gids):
        assert auc[i] == pytest.approx(roc_auc_score(y[g == gid], p[g == gid]), abs=1e-12)
        assert n[i] == (g == gid).sum()
    value, skipped = M.gauc([0.1, 0.2, 0.3], [1, 1, 0], [0, 0, 1])
    assert math.isnan(value) and skipped == 2


def test_streaming_equals_one_shot():
    p, y, w = _data(7, n=3001, tied=True, weighted=True)
    g = np.random.default_rng(7).integers(0, 40, p.size)
    names = ["auc", "logloss", "gauc", "accuracy", "calibration"]
    ms = M.MetricSet(names)
    for s in range(0, p.size, 256):
        ms.update(torch.from_numpy(p[s : s + 256]), torch.from_numpy(y[s : s + 256]),
                  w[s : s + 256], g[s : s + 256])
    got = ms.compute()
    one = M.evaluate_predictions(names, p, y, w, g)
    assert got.keys() == one.keys() == {*names, "gauc_skipped_groups"}
    for k in one:  # streaming stores float32 predictions; one-shot float64
        assert got[k] == pytest.approx(one[k], rel=1e-6), k
    assert got["auc"] == pytest.approx(roc_auc_score(y, p.astype(np.float32), sample_weight=w), abs=1e-12)


def test_metricset_errors_and_degenerate():
    with pytest.raises(M.MetricError, match="did you mean 'auc'"):
        M.MetricSet(["acu"])
    ms = M.MetricSet(["auc", "logloss"])
    with pytest.raises(M.MetricError, match="no predictions"):
        ms.compute()
    ms.update([0.2, 0.4], [1, 1])
    out = ms.compute()
    assert math.isnan(out["auc"]) and out["logloss"] > 0
    ms2 = M.MetricSet(["gauc"])
    ms2.update([0.2, 0.4], [1, 0])
    with pytest.raises(M.MetricError, match="group ids"):
        ms2.compute()


# ---- retrieval ----------------------------------------------------------------------------------------
def _naive_retrieval(ranked, true, k):
    rec, hit, ndcg, mrr = [], [], [], []
    for r, t in zip(ranked, true):
        rel_set = {x for x in t if x != -1}
        top = list(r[:k])
        rels = [1.0 if x in rel_set else 0.0 for x in top]
        hit.append(float(any(rels)))
        mrr.append(next((1.0 / (i + 1) for i, v in enumerate(rels) if v), 0.0))
        if rel_set:
            rec.append(sum(rels) / len(rel_set))
            dcg = sum(v / math.log2(i + 2) for i, v in enumerate(rels))
            idcg = sum(1 / math.log2(i + 2) for i in range(min(len(rel_set), k)))
            ndcg.append(dcg / idcg)
    return np.mean(rec), np.mean(hit), np.mean(ndcg), np.mean(mrr)


@pytest.mark.parametrize("multi", [False, True])
def test_retrieval_metrics_equal_naive(multi):
    rng = np.random.default_rng(8)
    Q, K, items = 200, 20, 60
    ranked = np.stack([rng.permutation(items)[:K] for _ in range(Q)])
    if multi:
        true = rng.integers(0, items, (Q, 4))
        true[rng.random((Q, 4)) < 0.3] = -1
        true = np.stack([np.where(np.r_[True, t[1:] != t[:-1]], t, -1) for t in np.sort(true, 1)])
    else:
        true = rng.integers(0, items, Q)
    t2 = true if multi else true[:, None]
    for k in (1, 5, 20):
        ref = _naive_retrieval(ranked, t2, k)
        got = (M.recall_at_k(ranked, true, k), M.hit_rate_at_k(ranked, true, k),
               M.ndcg_at_k(ranked, true, k), M.mrr_at_k(ranked, true, k))
        np.testing.assert_allclose(got, ref, rtol=1e-12)
    out = M.retrieval_metrics(torch.from_numpy(ranked), torch.from_numpy(true), ks=(5,))
    assert out["ndcg@5"] == pytest.approx(M.ndcg_at_k(ranked, true, 5))
