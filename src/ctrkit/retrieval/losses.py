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

* **full softmax**: every catalogue item is a negative (exact, when the catalogue is small enough). Its gradient
  is computed in the forward, a block of queries at a time, because ``∂CE_b/∂s_b = softmax(s_b) - onehot(pos_b)``
  needs nothing but the block's own logits::

      for each block of rows b (its (b, N) logits small enough to stay in cache):
          s = q_b Vᵀ / τ;  CE_b = logsumexp(s) - s[pos];  G = (softmax(s) - onehot(pos)) · c_b / τ
          ∂L/∂q_b = G V;  ∂L/∂V += Gᵀ q_b          (c_b = w_b / Σ w, or 1 / B)

  one matmul and three passes over each block instead of PyTorch's cross entropy, which writes the (B, N)
  logits, log-softmax and its gradient out to memory and reads them back (half the CPU time of a Beauty step).
"""

from __future__ import annotations

from typing import Any

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


FULL_SOFTMAX_BLOCK = 1 << 19  # logits per block of the full softmax: 2 MiB of float32, about one core's L2 cache


class _FullSoftmaxCE(torch.autograd.Function):
    """``Σ_b c_b · CE(q_b Vᵀ / τ, pos_b)`` with its gradients computed in the forward (module docstring)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, v: Tensor, target_rows: Tensor, coef: Tensor, temperature: float,
                grad_enabled: bool) -> Tensor:
        n, N = q.shape[0], v.shape[0]
        # needs_input_grad follows requires_grad even under torch.no_grad: the caller's grad mode decides too
        need_q, need_v = grad_enabled and ctx.needs_input_grad[0], grad_enabled and ctx.needs_input_grad[1]
        acc = torch.promote_types(q.dtype, torch.float32)  # float32, or float64 for float64 inputs
        grad_q = torch.empty(q.shape, dtype=acc, device=q.device) if need_q else None
        grad_v = torch.zeros(v.shape, dtype=acc, device=v.device) if need_v else None
        loss = torch.zeros((), dtype=acc, device=q.device)
        step = max(1, min(n, FULL_SOFTMAX_BLOCK // max(N, 1)))
        for a in range(0, n, step):
            qb, tb, cb = q[a:a + step], target_rows[a:a + step], coef[a:a + step]
            s = (qb @ v.t()).to(acc)  # (b, N), the input dtype's matmul (bf16 under autocast)
            if temperature != 1.0:
                s.div_(temperature)
            rows = torch.arange(len(tb), device=q.device)
            pos = s[rows, tb]  # (b,)
            top = s.amax(1, keepdim=True)  # (b, 1)
            z = s.sub_(top).exp_().sum(1, keepdim=True)  # s <- exp(s - max)
            loss += ((top.squeeze(1) + z.squeeze(1).log() - pos) * cb).sum()
            if grad_q is None and grad_v is None:
                continue
            s.mul_(cb.unsqueeze(1) / (z * temperature))  # softmax · c_b / τ
            s[rows, tb] -= cb / temperature  # (b, N): ∂L/∂(q_b vᵀ)
            g = s.to(q.dtype)
            if grad_q is not None:
                grad_q[a:a + step] = g @ v  # (b, D)
            if grad_v is not None:
                grad_v.addmm_(g.t(), qb) if g.dtype == acc else grad_v.add_(g.t() @ qb)  # (N, D)
        ctx.save_for_backward(*(t if t is not None else torch.empty(0) for t in (grad_q, grad_v)))
        ctx.dtypes = (q.dtype, v.dtype)
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        grad_q, grad_v = ctx.saved_tensors
        gq = (grad_q * grad).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
        gv = (grad_v * grad).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
        return gq, gv, None, None, None, None


def full_softmax_loss(q: Tensor, v_all: Tensor, target_rows: Tensor, *, temperature: float = 1.0,
                      weights: Tensor | None = None) -> Tensor:
    """Softmax over every catalogue item: ``v_all`` (N, D), ``target_rows`` (B,) the positives' catalogue rows;
    the gradient computed a block of rows at a time in the forward (module docstring; not twice differentiable)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    if weights is None:
        coef = torch.full((q.shape[0],), 1.0 / max(q.shape[0], 1), dtype=acc, device=q.device)
    else:
        w = weights.to(acc)
        coef = w / w.sum().clamp_min(1e-12)  # (B,): Σ_b w_b · CE_b / Σ_b w_b
    return _FullSoftmaxCE.apply(q, v_all, target_rows, coef, float(temperature), torch.is_grad_enabled())
