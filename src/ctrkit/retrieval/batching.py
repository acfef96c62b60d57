"""Row subsets of a batch and length groups: per-position training runs the rows of a batch in groups of similar
history length, each padded only to its own longest row.

A sequence row's query vectors depend on that row alone (causal self-attention within the row, per-token layers),
so splitting a batch into groups changes no value; it only drops the padding a short row would carry up to the
batch's longest (Beauty's rows hold 6 steps on average and up to 50: most of a (B, T) batch is padding). Groups
are powers of two of the length, ``ceil(log2(len))``, so every group is padded less than two-fold.
"""

from __future__ import annotations

import torch

from ctrkit.batch import Batch, KeyedJagged


def batch_rows(batch: Batch, rows: torch.Tensor) -> Batch:
    """The rows ``rows`` (R,) of ``batch`` (every key, weight and label), in that order."""
    kj = batch.sparse
    F, B = len(kj.keys), kj.stride
    bags = (torch.arange(F, device=rows.device).unsqueeze(1) * B + rows.unsqueeze(0)).reshape(-1)  # (F·R,) key-major
    lengths, starts = kj.lengths[bags], kj.offsets[:-1][bags]
    total = int(lengths.sum())
    first = torch.cumsum(lengths, 0) - lengths  # (F·R,) where each bag starts in the output
    pos = torch.repeat_interleave(starts - first, lengths, output_size=total) + torch.arange(total, device=rows.device)
    sub = KeyedJagged(kj.keys, kj.values[pos], lengths=lengths, stride=len(rows),
                      weights=None if kj.weights is None else kj.weights[pos])

    def take(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[rows]

    return Batch(dense=batch.dense[rows], sparse=sub, labels=batch.labels[rows], weights=take(batch.weights),
                 group_ids=take(batch.group_ids))


def length_groups(lengths: torch.Tensor) -> list[torch.Tensor]:
    """Rows (indices into ``lengths`` (B,)) grouped by ``ceil(log2(length))``, longest group first; rows of length
    0 and 1 share a group."""
    bucket = torch.ceil(torch.log2(lengths.clamp(min=1).double())).long()  # (B,)
    order = torch.argsort(bucket, descending=True, stable=True)
    counts = torch.bincount(bucket, minlength=1).flip(0)
    return [g for g in torch.split(order, counts[counts > 0].tolist()) if len(g)]
