"""Columns -> :class:`~ctrkit.batch.Batch`: the one collate step of the loader
(:class:`~ctrkit.data.storage.loader.BatchLoader`) and :meth:`FeaturePipeline.to_batch`, vectorised (no per-row
Python).

* ``dense`` [B, Nd] float32: the dense columns ((B,) or (B, width) each) side by side in one array;
* ``sparse``: a KeyedJagged over the keys in order (key-major): a single-valued column gives B ids of length
  1, a jagged one (values, lengths) its rows; the rows of a feature with ``max_len`` keep their last
  ``max_len`` values (:func:`gather_jagged`, the one truncation kernel, also behind :func:`keep_last`:
  histories are stored oldest first);
* ``labels`` [B] float32 (zeros when the rows have none: placeholders for scoring), ``weights`` [B],
  ``group_ids`` [B] int64 when given;
* the batch-level stage (the multi-hot expansion of seed 000) applied last, when given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ctrkit.batch import Batch, KeyedJagged

Index = slice | np.ndarray


class JaggedRows(NamedTuple):
    """Rows ``idx`` (a slice or row ids) of a stored jagged column (``values``, ``offsets`` [rows + 1])."""

    values: np.ndarray
    offsets: np.ndarray
    idx: Index


# ids [B]; a jagged column (values [nnz], lengths [B]); or rows of a stored one, gathered here
Sparse = np.ndarray | tuple[np.ndarray, np.ndarray] | JaggedRows


def gather_jagged(values: np.ndarray, offsets: np.ndarray, idx: Index, max_len: int | None,
                  dtype: Any = np.int64) -> tuple[np.ndarray, np.ndarray]:
    """Values and lengths [B] of rows ``idx`` (a slice or row ids) of a jagged column (``values``, ``offsets``
    [rows + 1]), keeping the last ``max_len`` values of each row; one vectorised gather
    (``repeat(start - excl_cumsum(len), len) + arange(nnz)``)."""
    if isinstance(idx, slice):
        starts = np.asarray(offsets[idx.start: idx.stop], dtype=np.int64)
        ends = np.asarray(offsets[idx.start + 1: idx.stop + 1], dtype=np.int64)
    else:
        starts = np.asarray(offsets[idx], dtype=np.int64)
        ends = np.asarray(offsets[idx + 1], dtype=np.int64)
    if max_len is not None:
        starts = np.maximum(starts, ends - max_len)
    lengths = ends - starts  # (B,)
    if isinstance(idx, slice) and max_len is None:
        return np.asarray(values[starts[0]: ends[-1]] if lengths.size else values[:0], dtype), lengths
    nnz = int(lengths.sum())
    excl = np.cumsum(lengths) - lengths  # exclusive prefix sum: where each row starts in the output
    pos = np.repeat(starts - excl, lengths) + np.arange(nnz)
    return np.asarray(values[pos], dtype=dtype), lengths


def keep_last(values: np.ndarray, lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The last ``max_len`` values of every row of a jagged column (values, lengths [n]); dtype kept."""
    if len(lengths) == 0 or lengths.max(initial=0) <= max_len:
        return values, lengths
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return gather_jagged(values, offsets, slice(0, len(lengths)), max_len, values.dtype)


def collate(n: int, dense: Sequence[np.ndarray], keys: Sequence[str], sparse: Sequence[Sparse], *,
            max_len: Sequence[int | None] | None = None, labels: np.ndarray | None = None,
            weights: np.ndarray | None = None, groups: np.ndarray | None = None,
            stage: Callable[[KeyedJagged], KeyedJagged] | None = None) -> Batch:
    """The Batch of ``n`` rows given as columns (see the module docstring); ``max_len`` per key (None: all)."""
    widths = [a.shape[1] if a.ndim == 2 else 1 for a in dense]  # (B,) or (B, width) each
    out = np.empty((n, sum(widths)), np.float32)  # (B, Nd)
    c0 = 0
    for a, w in zip(dense, widths):
        if a.ndim == 1:
            out[:, c0] = a
        else:
            out[:, c0: c0 + w] = a
        c0 += w
    kj = _keyed(n, keys, sparse, max_len or [None] * len(keys))
    if stage is not None:
        kj = stage(kj)
    return Batch(dense=torch.from_numpy(out), sparse=kj,
                 labels=_tensor(labels, np.float32) if labels is not None else torch.zeros(n, dtype=torch.float32),
                 weights=_tensor(weights, np.float32), group_ids=_tensor(groups, np.int64))


def _keyed(n: int, keys: Sequence[str], sparse: Sequence[Sparse], max_len: Sequence[int | None]) -> KeyedJagged:
    F = len(keys)
    lengths = np.ones((F, n), dtype=np.int64)  # (F, B)
    jagged: dict[int, np.ndarray] = {}  # key index -> its values
    for f, (col, m) in enumerate(zip(sparse, max_len)):
        if isinstance(col, JaggedRows):
            jagged[f], lengths[f] = gather_jagged(col.values, col.offsets, col.idx, m)
        elif isinstance(col, tuple):
            v, ln = col
            if m is not None:
                v, ln = keep_last(np.asarray(v), np.asarray(ln, np.int64), m)
            jagged[f], lengths[f] = v, ln
    if not jagged:  # all single-valued: values is the [F, B] id block, key-major
        vals = np.empty((F, n), dtype=np.int64)
        for f, col in enumerate(sparse):
            vals[f] = col
        values = vals.reshape(-1)
    else:
        key_off = np.concatenate([[0], np.cumsum(lengths.sum(1))])
        values = np.empty(int(key_off[-1]), dtype=np.int64)
        for f, col in enumerate(sparse):
            values[key_off[f]: key_off[f + 1]] = jagged.get(f, col)
    offsets = np.zeros(F * n + 1, dtype=np.int64)
    np.cumsum(lengths.reshape(-1), out=offsets[1:])
    return KeyedJagged(list(keys), torch.from_numpy(values), lengths=torch.from_numpy(lengths.reshape(-1)),
                       offsets=torch.from_numpy(offsets), stride=n)


def _tensor(a: np.ndarray | None, dtype: type) -> torch.Tensor | None:
    """``a`` copied into a tensor of its own (never a view of a memmap or of the caller's array)."""
    return None if a is None else torch.from_numpy(np.array(a, dtype))
