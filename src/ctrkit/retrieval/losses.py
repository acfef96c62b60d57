"""Softmax losses of retrieval training (seed 002, YoutubeDNN 召回模块 / 负采样; tf.nn.sampled_softmax_loss).

Every loss is a cross entropy over one positive and a set of candidate negatives, with logits
``s = <q, v> / τ``; ``w`` (B,) optional sample weights give ``Σ_b w_b · CE_b / Σ_b w_b``.

* **in-batch softmax** (Yi et al. 2019): the other rows' items are the negatives::

      S = Q Vᵀ / τ  (B, B);   S_ij -= log Q_j  (log-Q correction: Q_j = how often item j lands in a batch,
      its share of the training targets; frequent items are over-represented as in-batch negatives);
      S_ij = -inf for j != i with item_j == item_i (a duplicate of row i's positive is not a negative);
      CE(S_i, i)

* **sampled softmax**: k negatives drawn for the whole batch from a proposal Q (uniform, or ∝ frequency^α:
  the seed's 热门打压, popular items made negatives more often)::

      s_pos = <q_b, v_pos> / τ - log Q(pos_b);   s_neg = <q_b, v_j> / τ - log Q(j)   (B, 1 + k)
      s_neg[b, j] = -inf when neg_j == pos_b (accidental hit);  CE(s_b, 0)

  Subtracting log Q makes the sampled softmax an unbiased-in-the-limit estimate of the full softmax (the
  ``log(expected count)`` of tf.nn.sampled_softmax_loss; the k factor is common to all classes and cancels).

* **full softmax**: every catalogue item is a negative (exact, when the catalogue is small enough).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F


def _scores(q: Tensor, v: Tensor, temperature: float) -> Tensor:
    """``q vᵀ / τ`` in float32 (the division skipped at τ = 1: one pass less over a (B, N) matrix, same values)."""
    s = (q @ v.t()).float()
    return s if temperature == 1.0 else s / temperature


def _weighted_mean(ce: Tensor, weights: Tensor | None) -> Tensor:
    if weights is None:
        return ce.mean()
    w = weights.to(ce.dtype)
    return (ce * w).sum() / w.sum().clamp_min(1e-12)


def in_batch_softmax_loss(q: Tensor, v: Tensor, item_ids: Tensor, *, temperature: float = 1.0,
                          log_q: Tensor | None = None, weights: Tensor | None = None) -> Tensor:
    """In-batch softmax: ``q``, ``v`` (B, D) query / positive item vectors, ``item_ids`` (B,) the positives'
    ids (duplicates masked), ``log_q`` (B,) log sampling probability of each row's item (None: no
    correction), ``weights`` (B,) sample weights."""
    logits = _scores(q, v, temperature)  # (B, B)
    if log_q is not None:
        logits = logits - log_q.float().unsqueeze(0)
    dup = item_ids.unsqueeze(0) == item_ids.unsqueeze(1)  # (B, B)
    dup.fill_diagonal_(False)
    logits = logits.masked_fill(dup, float("-inf"))
    target = torch.arange(q.shape[0], device=q.device)
    return _weighted_mean(F.cross_entropy(logits, target, reduction="none"), weights)


def cross_batch_softmax_loss(q: Tensor, item_ids: Tensor, targets: Tensor, v: Tensor, col_ids: Tensor, *,
                             temperature: float = 1.0, log_q: Tensor | None = None,
                             weights: Tensor | None = None) -> Tensor:
    """In-batch softmax whose negatives are the items of a larger batch (e.g. every process's batch of a
    data-parallel step): ``q`` (B, D) queries with positives ``item_ids`` (B,) at columns ``targets`` (B,) of the
    candidates ``v`` (C, D) with ids ``col_ids`` (C,) (< 0: padding, never a candidate) and ``log_q`` (C,) their
    log-Q corrections. With C = B, ``targets`` = 0..B-1 and ``col_ids`` = ``item_ids`` it is
    :func:`in_batch_softmax_loss`."""
    logits = _scores(q, v, temperature)  # (B, C)
    if log_q is not None:
        logits = logits - log_q.float().unsqueeze(0)
    rows = torch.arange(q.shape[0], device=q.device)
    dup = col_ids.unsqueeze(0) == item_ids.unsqueeze(1)  # (B, C): another copy of the row's positive
    dup[rows, targets] = False
    logits = logits.masked_fill(dup | (col_ids < 0).unsqueeze(0), float("-inf"))
    return _weighted_mean(F.cross_entropy(logits, targets, reduction="none"), weights)


def sampled_softmax_loss(q: Tensor, v_pos: Tensor, pos_ids: Tensor, v_neg: Tensor, neg_ids: Tensor, *,
                         temperature: float = 1.0, log_q_pos: Tensor | None = None,
                         log_q_neg: Tensor | None = None, remove_accidental_hits: bool = True,
                         weights: Tensor | None = None) -> Tensor:
    """Sampled softmax: ``q`` (B, D), ``v_pos`` (B, D) and ``pos_ids`` (B,) the positives, ``v_neg`` (K, D)
    and ``neg_ids`` (K,) negatives shared by the batch; ``log_q_pos`` (B,) / ``log_q_neg`` (K,) the proposal's
    log probabilities (None: no correction, e.g. uniform sampling where it is a constant)."""
    pos = (q * v_pos).sum(-1, keepdim=True).float() / temperature  # (B, 1)
    neg = _scores(q, v_neg, temperature)  # (B, K)
    if log_q_pos is not None:
        pos = pos - log_q_pos.float().unsqueeze(1)
    if log_q_neg is not None:
        neg = neg - log_q_neg.float().unsqueeze(0)
    if remove_accidental_hits:
        neg = neg.masked_fill(neg_ids.unsqueeze(0) == pos_ids.unsqueeze(1), float("-inf"))
    logits = torch.cat([pos, neg], 1)  # (B, 1 + K)
    target = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
    return _weighted_mean(F.cross_entropy(logits, target, reduction="none"), weights)


def full_softmax_loss(q: Tensor, v_all: Tensor, target_rows: Tensor, *, temperature: float = 1.0,
                      weights: Tensor | None = None) -> Tensor:
    """Softmax over every catalogue item: ``v_all`` (N, D), ``target_rows`` (B,) the positives' catalogue rows."""
    logits = _scores(q, v_all, temperature)  # (B, N)
    return _weighted_mean(F.cross_entropy(logits, target_rows, reduction="none"), weights)
