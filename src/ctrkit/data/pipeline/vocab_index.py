"""Key -> payload maps of a streaming vocabulary: a hash table for integer keys, sorted arrays for strings."""

from __future__ import annotations

from typing import Any

import numpy as np
from pandas._libs import hashtable as _pd_hashtable


class HashIndex:
    """int64 key -> int64 payload map that grows in place: pandas' khash table (``Int64HashTable``, the one behind
    ``pd.factorize`` and ``Index.get_indexer``), so a lookup or an insert is one probe, whatever the size.

    pandas keeps this class in ``pandas._libs`` (not its documented API); it has held ``lookup`` and
    ``map_keys_to_values`` since pandas 1.3, and ``tests/data/test_vocab.py`` checks it against a dict. The
    documented alternative (``Index.get_indexer`` over levels rebuilt as keys arrive) costs a rebuild per insert."""

    def __init__(self) -> None:
        self._table = _pd_hashtable.Int64HashTable(1 << 10)
        self._n = 0

    def get(self, keys: np.ndarray) -> np.ndarray:
        """Payload per key [n] int64, -1 where absent (payloads are never negative)."""
        return self._table.lookup(np.ascontiguousarray(keys, np.int64))

    def insert(self, keys: np.ndarray, vals: np.ndarray) -> None:
        """Add distinct ``keys`` [m] that are absent, with payloads ``vals`` [m] >= 0."""
        self._table.map_keys_to_values(np.ascontiguousarray(keys, np.int64), np.ascontiguousarray(vals, np.int64))
        self._n += len(keys)

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        return int(self._table.sizeof())


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
    """key -> payload map over numpy arrays (any sortable dtype: the string keys): a big sorted run plus a small
    sorted delta, merged when the delta grows past 1/16 of the big run, so inserting n keys costs O(n log n)
    amortised."""

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
