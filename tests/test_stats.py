"""ctrkit.stats, the statistics behind the README's seed-spread claims (issue 12): Holm's correction, the
pooled std, and the pooled F test with Satterthwaite's degrees of freedom, against scipy and a simulation
under equal spreads; and benchmarks/deepctr_compare.py's spread target built on them."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import benchmark_module
from scipy.stats import f

from ctrkit import stats


def test_holm_rejects_step_down_and_stops_at_the_first_kept():
    p = {"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005}
    # sorted: d .005 <= .05/4, a .01 <= .05/3, c .03 > .05/2 -> stop (b, though under .05, is kept too)
    assert stats.holm(p) == ["d", "a"]
    assert stats.holm({"x": 0.2, "y": 0.001}) == ["y"]
    assert stats.holm({"x": 0.04}) == ["x"] and stats.holm({"x": 0.06}) == []
    assert stats.holm({}) == []


def test_pooled_std_weights_each_model_by_its_degrees_of_freedom():
    stds = [(0.001, 10), (0.003, 4), (0.002, 1)]  # a model with one run has no variance to pool
    want = np.sqrt((9 * 0.001**2 + 3 * 0.003**2) / 12)
    assert stats.pooled_std(stds) == pytest.approx(want, rel=1e-12)


def test_pooled_p_is_the_plain_f_test_when_every_model_has_the_same_spread():
    ours, peer = [(0.002, 10)] * 11, [(0.001, 10)] * 11
    assert stats.pooled_spread_p(ours, peer) == pytest.approx(f.sf(4.0, 99, 99), rel=1e-9)
    assert stats.pooled_spread_p(peer, ours) > 0.999  # narrower: no evidence of 'wider'


def test_pooled_p_holds_its_level_when_the_models_spreads_differ():
    """Equal spreads on both sides but per-model scales 10x apart (as between DeepCTR's MLR and DCN): the test
    rejects at about its nominal 5%, where treating the pooled variance as F(99, 99) would not."""
    rng = np.random.default_rng(0)
    scales = np.geomspace(0.0003, 0.003, 11)
    sims, hits, naive = 3000, 0, 0
    for _ in range(sims):
        ours = [(float(np.std(rng.normal(0, s, 10), ddof=1)), 10) for s in scales]
        peer = [(float(np.std(rng.normal(0, s, 10), ddof=1)), 10) for s in scales]
        hits += stats.pooled_spread_p(ours, peer) < 0.05
        naive += f.sf(stats.pooled_std(ours) ** 2 / stats.pooled_std(peer) ** 2, 99, 99) < 0.05
    assert 0.035 <= hits / sims <= 0.065, hits / sims
    assert naive / sims > 0.08  # the uncorrected degrees of freedom reject too often


def _summary(stds_ours, stds_peer, runs=10):
    out = {}
    for i, (a, b) in enumerate(zip(stds_ours, stds_peer)):
        out[f"m{i}"] = {"config_auc_std": a, "deepctr_auc_std": b, "config_runs": runs, "deepctr_runs": runs,
                        "spread": {"config": "PASS" if a <= b else "FAIL"},
                        "spread_p": {"config": stats.spread_p(list(np.arange(runs) * a / 3.03),
                                                          list(np.arange(runs) * b / 3.03))}}
    return out


def test_one_model_spread_p_is_the_f_test_of_its_runs():
    ours, peer = [0.0, 0.3, 0.6, 0.9], [0.0, 0.1, 0.2]
    assert stats.spread_p(ours, peer) == pytest.approx(f.sf(np.var(ours, ddof=1) / np.var(peer, ddof=1), 3, 2))
    assert stats.spread_p([1.0], peer) is None
    assert stats.spread_p(ours, [0.5, 0.5]) == 0.0 and stats.spread_p([0.5, 0.5], [0.5, 0.5]) == 1.0


def test_no_variance_to_pool_is_nan_and_no_p():
    assert np.isnan(stats.pooled_std([(0.001, 1)]))
    assert stats.pooled_spread_p([(0.001, 1)], [(0.002, 5)]) is None


def test_the_target_is_the_pooled_std_and_holm_names_the_clearly_wider_model():
    DC = benchmark_module("deepctr_compare")
    # the zoo narrower overall, one model at 3x DeepCTR's spread
    v = DC.spread_verdicts(_summary([0.003, 0.001, 0.001, 0.001], [0.001, 0.003, 0.003, 0.003]), ["deepctr", "config"])
    c = v["config"]
    assert c["met"] and c["pooled_std"] < c["peer_pooled_std"] and c["at_most_peer"] == 3
    assert c["wider_holm"] == ["m0"] and c["wider_p05"] == ["m0"]
    v = DC.spread_verdicts(_summary([0.002, 0.002], [0.001, 0.0019]), ["deepctr", "config"])["config"]
    assert not v["met"] and v["pooled_p"] < 0.5
