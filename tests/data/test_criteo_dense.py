"""criteo_parse.dense_transform: ln(x + 3) as float32, clamped at -2, against np.log in float64 (table and log paths)."""

from __future__ import annotations

import numpy as np
import pytest

from ctrkit.data.pipeline.criteo_parse import dense_transform


def _reference(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.log((raw + 3).astype(np.float64))
    clamped = ~(v >= -2.0)  # NaN (x + 3 < 0) and -inf included
    return np.where(clamped, -2.0, v).astype(np.float32), clamped.sum(axis=0)


@pytest.mark.parametrize("low, high", [(0, 1000), (-3, 50), (-10, 2), (65530, 65540), (-5, 10**9)])
def test_dense_transform_matches_log(low: int, high: int) -> None:
    raw = np.random.default_rng(low & 0xFFFF).integers(low, high, (2000, 13))
    raw[0, :2] = low, high - 1
    out, clamped = dense_transform(raw)
    ref, ref_clamped = _reference(raw)
    assert out.dtype == np.float32 and np.array_equal(out, ref)
    assert clamped.tolist() == ref_clamped.tolist()


def test_dense_transform_empty() -> None:
    out, clamped = dense_transform(np.zeros((0, 13), np.int64))
    assert out.shape == (0, 13) and clamped.tolist() == [0] * 13
