"""The reference both request-column fast paths (JSON columns and Arrow columns) are tested against: the
per-value readers' column (:mod:`ctrkit.data.pipeline.values`), and whether a fast path's column equals it."""

from __future__ import annotations

import numpy as np

from ctrkit.data.pipeline.rules import CATEGORY, DENSE, ColumnRule
from ctrkit.data.pipeline.values import Refused, reader


def slow(rule: ColumnRule, vals: list) -> list | None:
    """The per-value readers' column of the Python values ``vals``, or None when they refuse a value."""
    read = reader(rule)
    try:
        return [read(v) for v in vals]
    except Refused:
        return None


def same(fast: object, expected: list, rule: ColumnRule) -> bool:
    """Whether a fast path's column ``fast`` holds the readers' values ``expected``, in the dtype it must have."""
    if rule.kind == CATEGORY:
        return list(fast) == expected  # type: ignore[call-overload]
    a = np.asarray(fast)
    if rule.kind != DENSE:
        return a.dtype == np.int64 and a.tolist() == expected
    if a.dtype == np.int64:  # a dense column of integers and nulls: int64, null -> 0 (the pipeline reads NaN as 0)
        return np.array_equal(a.astype(np.float64), np.nan_to_num(np.array(expected, np.float64), nan=0.0))
    return a.dtype == np.float64 and np.array_equal(a, np.array(expected, np.float64), equal_nan=True)
