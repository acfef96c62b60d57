"""criteo_parse dense fields: the SWAR decimal decoder against int(); dense_transform (ln(x + 3) as float32, clamped at -2) against np.log in float64."""

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


def test_swar_decimal_matches_int() -> None:
    """The 8-byte decimal decoder against int() over every digit count 0..8, with some non-digit bytes."""
    from ctrkit.data.pipeline.criteo_parse import _swar_decimal

    rng = np.random.default_rng(1)
    m = 4000
    n = rng.integers(0, 9, m)
    digits = rng.integers(48, 58, (m, 8)).astype(np.uint8)
    bad = rng.random((m, 8)) < 0.03
    digits[bad] = rng.integers(0, 256, int(bad.sum()))
    val, ok = _swar_decimal(digits.view("<u8").ravel().copy(), n.astype(np.int32))
    for i in range(m):
        s = bytes(digits[i, :n[i]])
        good = all(48 <= c <= 57 for c in s)
        assert ok[i] == good, s
        if good:
            assert val[i] == (int(s) if s else 0), s
