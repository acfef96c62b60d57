"""Item catalogue, seen items and full-ranking metrics against direct computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import write_log

from ctrkit.data.sources.behaviour import preprocess_behaviour
from ctrkit.data.storage.store import Store
from ctrkit.errors import MetricError
from ctrkit.metrics import hit_rate_at_k, mrr_at_k, ndcg_at_k
from ctrkit.retrieval.catalogue import ItemCatalogue, SeenItems, ranking_metrics, target_ranks


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("beh")
    log = write_log(d / "log.csv")
    out = preprocess_behaviour(log, d / "out", attr_cols=["cat:cate"], time_col="time", embedding_dim=4)
    return {k: Store(v) for k, v in out.items()}


def test_catalogue_from_store(stores):
    s = stores["train"]
    cat = ItemCatalogue.from_store(s)
    assert list(cat.features) == ["item", "cate"]
    assert np.all(np.diff(cat.ids) > 0) and cat.ids.min() >= 2
    pos = np.asarray(s["label"]) > 0
    item, cate = np.asarray(s["item"]), np.asarray(s["cate"])
    pairs = dict(zip(item.tolist(), cate.tolist()))
    hv = s["hist_item"][0]
    pairs.update({k: v for k, v in zip(np.asarray(hv).tolist(), np.asarray(s["hist_cate"][0]).tolist())
                  if k not in pairs})
    assert set(cat.ids.tolist()) == {k for k in pairs if k >= 2}
    for i, c, n in zip(cat.ids, cat.features["cate"], cat.counts):
        assert pairs[int(i)] == c
        assert n == int((item[pos] == i).sum())
    back = ItemCatalogue.from_payload(cat.to_payload())
    assert all(np.array_equal(back.features[k], cat.features[k]) for k in cat.features)
    rows = cat.rows_of(torch.tensor([int(cat.ids[3]), 0, 1, int(cat.ids[-1]) + 5]))
    assert rows.tolist() == [3, -1, -1, -1]
    b = cat.batch(torch.tensor([0, 2]))
    assert b.sparse.keys == ["item", "cate"] and b.sparse["item"][0].tolist() == cat.ids[[0, 2]].tolist()


def test_seen_items_against_direct(stores):
    s = stores["train"]
    seen = SeenItems.from_store(s)
    group, item, pos = np.asarray(s["group"]), np.asarray(s["item"]), np.asarray(s["label"]) > 0
    hv, ho = (np.asarray(a) for a in s["hist_item"])
    direct: dict[int, set[int]] = {}
    for r in range(len(group)):
        d = direct.setdefault(int(group[r]), set())
        if pos[r]:
            d.add(int(item[r]))
        d.update(hv[ho[r]:ho[r + 1]].tolist())
    query = np.array([*list(direct)[:5], 123456789])  # the last group is unknown: nothing seen
    rows, items = seen.pairs(query)
    for j, g in enumerate(query):
        assert set(items[rows == j].tolist()) == direct.get(int(g), set())


def _direct_rank(scores, target, excluded):
    if target < 0 or target in excluded:
        return float("inf")
    t = scores[target]
    return sum(1 for j, x in enumerate(scores) if j != target and j not in excluded and x >= t)


def test_target_ranks_and_metrics_against_direct():
    g = torch.Generator().manual_seed(0)
    B, N = 40, 30
    scores = torch.randn(B, N, generator=g).round(decimals=1)  # ties happen: they count against the target
    target = torch.randint(0, N, (B,), generator=g)
    target[3] = -1  # not in the catalogue
    ex_r = torch.randint(0, B, (60,), generator=g)
    ex_c = torch.randint(0, N, (60,), generator=g)
    ranks = target_ranks(scores, target, (ex_r, ex_c)).numpy()
    for b in range(B):
        excluded = set(ex_c[ex_r == b].tolist())
        assert ranks[b] == _direct_rank(scores[b].tolist(), int(target[b]), excluded)
    # metrics from ranks == the top-K list metrics of ctrkit.metrics on the same rankings (ties broken against)
    got = ranking_metrics(ranks, ["hr@5", "recall@10", "ndcg@10", "mrr"])
    ranked = np.full((B, N), -1)
    for b in range(B):
        if np.isfinite(ranks[b]):
            ranked[b, int(ranks[b])] = 1  # the true item (id 1) at its rank, others not relevant
    true = np.ones(B, np.int64)
    assert got["hr@5"] == pytest.approx(hit_rate_at_k(ranked, true, 5))
    assert got["recall@10"] == pytest.approx(hit_rate_at_k(ranked, true, 10))
    assert got["ndcg@10"] == pytest.approx(ndcg_at_k(ranked, true, 10))
    assert got["mrr"] == pytest.approx(mrr_at_k(ranked, true, N))


def test_unknown_ranking_metric():
    with pytest.raises(MetricError, match="hr@K"):
        ranking_metrics(np.zeros(3), ["auc"])
