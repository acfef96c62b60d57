"""benchmarks/deepctr_compare.py --repeats: each side's fit seconds are the median of its repeated fits."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import benchmark_module
from sklearn.metrics import roc_auc_score


def _fit(cpu: float, wall: float, pred: np.ndarray) -> dict:
    return {"pred": pred, "pred_valid": pred, "fit_seconds": wall, "cpu_seconds": cpu, "params": 7}


def test_the_median_of_the_fits_is_robust_to_one_slow_fit_and_every_fit_is_kept():
    dc = benchmark_module("deepctr_compare")
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 50)
    p = rng.random(50)
    q = p.copy()
    q[:5] = rng.random(5)  # a repeat that scores otherwise (a non-deterministic side)
    fits = [_fit(5.1, 5.3, p), _fit(9.0, 9.4, p), _fit(5.4, 5.2, q)]
    out = dc.median_fit(fits, y)
    assert out["cpu_seconds"] == 5.4 and out["fit_seconds"] == 5.3  # one slow fit of three moves nothing
    assert out["cpu_seconds_repeats"] == [5.1, 9.0, 5.4] and out["fit_seconds_repeats"] == [5.3, 9.4, 5.2]
    assert out["pred"] is p and out["params"] == 7  # the first fit's scores
    assert out["repeat_auc_max_difference"] == pytest.approx(abs(roc_auc_score(y, q) - roc_auc_score(y, p)))
    assert out["repeat_auc_max_difference"] > 0
    assert "[median of 5.10 9.00 5.40 cpu s" in dc._repeats_note(out)


def test_one_fit_is_returned_as_it_is_and_identical_repeats_report_no_auc_difference():
    dc = benchmark_module("deepctr_compare")
    y = np.array([0, 1, 0, 1])
    p = np.array([0.1, 0.8, 0.3, 0.6])
    one = _fit(5.0, 5.0, p)
    assert dc.median_fit([one], y) is one and dc._repeats_note(one) == ""
    assert dc.median_fit([one, _fit(6.0, 6.0, p.copy())], y)["repeat_auc_max_difference"] == 0.0


def test_repeats_below_one_exit_2_naming_the_option(capsys):
    dc = benchmark_module("deepctr_compare")
    with pytest.raises(SystemExit) as e:
        dc.main(["--dataset", "movielens", "--repeats", "0"])
    assert e.value.code == 2 and "--repeats must be at least 1, got 0" in capsys.readouterr().err
