"""A key -> payload map over sorted numpy arrays (the index of a streaming vocabulary)."""

from __future__ import annotations

from typing import Any

import numpy as np


def _sorted_insert(a: np.ndarray, a_val: np.ndarray, b: np.ndarray, b_val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge sorted ``b`` (with payload b_val) into sorted ``a`` (payload a_val) in O(len(a) + len(b))."""
    pos = np.searchsorted(a, b) + np.arange(len(b))  # final positions of b
    n = len(a) + len(b)
    keys = np.empty(n, dtype=np.result_type(a, b))
    vals = np.empty(n, dtype=np.result_type(a_val, b_val))
    is_b = np.zeros(n, bool)
    is_b[pos] = True
    keys[pos], vals[pos] = b, b_val
    keys[~is_b], vals[~is_b] = a, a_val
    return keys, vals


class SortedIndex:
    """key -> payload map over numpy arrays: a big sorted run plus a small sorted delta, merged when the
    delta grows past 1/16 of the big run, so inserting n keys costs O(n log n) amortised."""

    def __init__(self, dtype: Any) -> None:
        self.k = [np.empty(0, dtype), np.empty(0, dtype)]
        self.v = [np.empty(0, np.int64), np.empty(0, np.int64)]

    def get(self, keys: np.ndarray) -> np.ndarray:
        """Payload per key, -1 where absent -> int64 [n]."""
        out = np.full(len(keys), -1, np.int64)
        if len(self) == 0:
            return out
        order = np.argsort(keys)  # sorted needles walk the index in order: ~3x fewer cache misses
        sk = keys[order]
        for k, v in zip(self.k, self.v):
            if len(k) == 0:
                continue
            pos = np.searchsorted(k, sk)
            pos[pos == len(k)] = 0
            hit = k[pos] == sk
            out[order[hit]] = v[pos[hit]]
        return out

    def insert(self, keys: np.ndarray, vals: np.ndarray) -> None:
        order = np.argsort(keys, kind="stable")
        self.k[1], self.v[1] = _sorted_insert(self.k[1], self.v[1], keys[order], vals[order])
        if len(self.k[1]) > max(1 << 16, len(self.k[0]) // 16):
            self.k[0], self.v[0] = _sorted_insert(self.k[0], self.v[0], self.k[1], self.v[1])
            self.k[1], self.v[1] = self.k[1][:0], self.v[1][:0]

    def __len__(self) -> int:
        return len(self.k[0]) + len(self.k[1])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.k, *self.v))
