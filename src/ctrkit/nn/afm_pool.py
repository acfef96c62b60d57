"""AFM's attentional pooling of pairwise interactions for training: one autograd node, backward written out.

:class:`~ctrkit.nn.attention.AFMAttention` calls :func:`fused_afm_pool` when it trains. The formula is the
layer's (E (B, F, D), W (A, D), bias b (A,), h (A,)):

    p_ij   = e_i ⊙ e_j                                       pairs i < j      (B, P, D)
    a_ij   = softmax over the P pairs of h^T ReLU(W p_ij + b)                 (B, P)
    pooled = Σ_{i<j} a_ij p_ij                                                (B, D)

Why a hand-written node: the plain layer materialises the (B, P, D) products (P = 325 pairs on Criteo's 26
fields: 1.3M floats per batch of 256) and runs a Linear with 16 inputs and 8 outputs over them, and autograd
keeps both gathered operands, multiplies the product's gradient back into each and scatters them with
``index_add_`` along the pair dim: a dozen passes over tensors bigger than the L2 cache, and a GEMM too narrow
for the BLAS to run fast. Here nothing of size (B, P, D) exists. The attention logits are bilinear forms:

    W_a · (e_i ⊙ e_j) + b_a = Σ_k e1_i[k] w1_a[k] e1_j[k]       e1 = [e, 1] (D+1), w1_a = [W_a, b_a]

so for each of the A attention units S_a = (E1 ⊙ w1_a) E1^T is one (F, D+1) x (D+1, F) product per sample, all
of them a single batched matmul (B, A·F, D+1) x (B, D+1, F) with the bias folded in; S_a is symmetric. The
softmax runs over the full off-diagonal F x F matrix (the diagonal masked), which counts every pair twice with
weight a_ij / 2, so the pooled vector Σ_{i≠j} (a_ij / 2) e_i ⊙ e_j = Σ_i e_i ⊙ (Ã E)_i is one
(B, F, F) x (B, F, D) product, Ã the symmetric weight matrix. Symmetry keeps the backward small: with G_a = ∂L/∂S_a (symmetric,
= h_a · dscore ⊙ [S_a > 0]) and M_a = G_a E1,

    ∂L/∂e_i  = g ⊙ (Ã E)_i + (Ã (E ⊙ g))_i + 2 Σ_a h_a w_a ⊙ (M_a)_i         g = ∂L/∂pooled
    ∂L/∂w1_a = h_a Σ_{b,i} e1_i ⊙ (M_a)_i        (its last entry is ∂L/∂b_a)
    ∂L/∂h_a  = Σ_{b,i,j} dscore_ij ReLU(S_a)_ij

one batched matmul for every M_a at once. Both passes walk the batch in chunks of samples whose (A, F, F)
logits fit ``CHUNK_FLOATS`` (0.7 MB, in the L2 cache: 32 samples on Criteo's 26 fields, 267 on MovieLens' 9);
the backward recomputes them per chunk (one small batched matmul) rather than keeping (B, A, F, F) from the
forward. The same value as the plain layer up to rounding (sums in another order); tested against it in float64
and with ``torch.autograd.gradcheck``. Measured, one AFM training step (Trainer's module + optimizers, one
thread, median over epochs of steps, the variants' steps alternated in one process, load 11-14 on two cores):
Criteo sample (B 256, F 26, D 16, A 8): plain layer ~19.5 CPU ms; this node unchunked ~14.7 (16.1-16.7 when
alternated with the chunked ones, which keep nothing large for the backward); chunks of 64 / 32 / 16 samples
12.0-13.3 / 10.3-11.1 / 10.7-11.4. MovieLens (B 1024, F 9): plain 12.5-13.5; chunks of 32 / 128 / 256 / 512 /
1024 samples 14.2 / 11.3-12.5 / 11.4-11.9 / 14.2 / 17.3: hence a budget in bytes, not a count of samples.
Training only: evaluation, :meth:`~ctrkit.nn.attention.AFMAttention.pool` and TorchScript keep the plain path.

Few fields (F <= ``PAIRS_MAX_FIELDS``): the pairs, feature-major. With F small the (A, F, F) logits are small
matrices and the batched matmuls above run at a fraction of the BLAS's speed (B·A small products per pass). There
the node keeps the formula's (P, D) products but lays everything out batch-last, (F, D, B) fields and (P, D, B)
products, so every op runs over whole contiguous rows of B: the products are F-1 broadcast multiplies of a field
by the fields after it (no gathers), the attention units one batched (A, D) x (D, B) product per pair, the
softmax over P a reduction along the leading dim; the backward is the same ops transposed, the fields' gradient
F-1 reductions and ``addcmul_`` s over the same blocks. Measured (forward + backward of the pooling alone, one
thread, CPU ms, medians; A 8, D 16; load 12-13 on two cores): B 1,024 / F 9 (MovieLens) 6.7-8.8 -> 4.3-5.6; B 4,096 /
F 9 30.4 -> 22.0; B 1,024 / F 12 11.3 -> 9.2; B 256 / F 14 3.5 -> 3.1; at F 16 it depends on B (B 256 3.8 -> 3.5,
B 1,024 14.3 -> 17.2) and at F 20-26 the matrices win (B 256 / F 26: 7.6 vs 9.9), hence the bound of 12.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ctrkit.nn.fm import pair_blocks

__all__ = ["fused_afm_pool"]


def fused_afm_pool(emb: Tensor, weight: Tensor, bias: Tensor, h: Tensor) -> Tensor:
    """Σ_{i<j} a_ij e_i ⊙ e_j (B, D) of ``emb`` (B, F, D), the attention Linear's ``weight`` (A, D) and ``bias``
    (A,), and the attention vector ``h`` (A,). Feature-major pairs for F <= ``PAIRS_MAX_FIELDS``, else the
    logit matrices (module docstring)."""
    if emb.shape[1] <= PAIRS_MAX_FIELDS:
        return _AFMPairs.apply(emb, weight, bias, h)
    return _AFMPool.apply(emb, weight, bias, h)


PAIRS_MAX_FIELDS = 12  # up to this many fields the feature-major pairs node is faster (module docstring)


CHUNK_FLOATS = 173_056  # logits per pass, 0.7 MB (32 samples x 8 units x 26 x 26 fields on Criteo): stay in L2


def _chunk(a: int, f: int) -> int:
    """Samples per pass: as many as keep a chunk's (A, F, F) logits within ``CHUNK_FLOATS``."""
    return max(1, CHUNK_FLOATS // (a * f * f))


def _relu_logits(e1: Tensor, w1: Tensor) -> Tensor:
    """ReLU(S_a) (b, A, F·F) of e1 = [E, 1] (b, F, D+1) and w1 = [W, bias] (A, D+1)."""
    b, f, d1 = e1.shape
    a = w1.shape[0]
    left = (e1.unsqueeze(1) * w1.unsqueeze(1)).view(b, a * f, d1)  # (b, A·F, D+1) rows e1_i ⊙ w1_a
    return torch.bmm(left, e1.transpose(1, 2)).relu_().view(b, a, f * f)  # S_a symmetric


class _AFMPool(torch.autograd.Function):
    """Attention logits as one batched bilinear product over [E, 1]; pooling over the symmetric weight matrix.
    Both passes walk the batch in chunks of ``_chunk`` samples, so the (A, F, F) logits of a chunk stay in
    cache; the backward recomputes them (one small batched matmul) instead of keeping (B, A, F, F)."""

    @staticmethod
    def forward(ctx, emb: Tensor, weight: Tensor, bias: Tensor, h: Tensor) -> Tensor:  # type: ignore[override]
        b, f, _ = emb.shape
        a = weight.shape[0]
        e1 = torch.cat([emb, emb.new_ones(b, f, 1)], 2)  # (B, F, D+1)
        w1 = torch.cat([weight, bias.unsqueeze(1)], 1)  # (A, D+1)
        s = emb.new_empty(b, f * f)  # (B, F·F) logits h^T ReLU(S)
        n = _chunk(a, f)
        for c in range(0, b, n):
            r = _relu_logits(e1[c:c + n], w1)
            torch.bmm(h.view(1, 1, a).expand(r.shape[0], 1, a), r, out=s[c:c + n].unsqueeze(1))
        s.view(b, f, f).diagonal(dim1=1, dim2=2).fill_(float("-inf"))  # i = j is no pair
        wt = torch.softmax(s, 1).view(b, f, f)  # (B, F, F) Ã: a_ij / 2 at (i, j) and (j, i)
        t = torch.bmm(wt, emb)  # (B, F, D) Ã E
        ctx.save_for_backward(e1, w1, h, wt, t)
        return torch.linalg.vecdot(emb, t, dim=1)  # (B, D) Σ_i e_i ⊙ (Ã E)_i

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        e1, w1, h, wt, t = ctx.saved_tensors
        b, f, d1 = e1.shape
        d, a = d1 - 1, w1.shape[0]
        emb = e1[..., :d]
        eg = emb * g.unsqueeze(1)  # (B, F, D) E ⊙ g
        demb = torch.bmm(wt.transpose(1, 2), eg).addcmul_(t, g.unsqueeze(1))  # through the pooling
        dwt = torch.bmm(eg, emb.transpose(1, 2)).view(b, f * f)  # (B, F·F) ∂L/∂Ã = (e_i ⊙ e_j) · g
        w = wt.view(b, f * f)
        dscore = w * (dwt - torch.linalg.vecdot(w, dwt, dim=1).unsqueeze(1))  # (B, F·F) softmax backward
        coef = (2 * h).unsqueeze(1) * w1[:, :d]  # (A, D) 2 h_a w_a
        dh = h.new_zeros(a)
        dw1 = w1.new_zeros(a, d1)
        step = _chunk(a, f)
        for c in range(0, b, step):
            e1c, dsc = e1[c:c + step], dscore[c:c + step]
            n = e1c.shape[0]
            r = _relu_logits(e1c, w1)  # (n, A, F·F) recomputed
            dh += torch.bmm(r, dsc.unsqueeze(2)).sum(0).view(a)
            # G_a / h_a = dscore ⊙ [S_a > 0], every a at once; h_a is folded into the coefficients below
            gs = torch.ops.aten.threshold_backward(dsc.view(n, 1, f * f).expand(n, a, f * f), r, 0)
            m = torch.bmm(gs.view(n, a * f, f), e1c).view(n, a, f, d1)  # (n, A, F, D+1) (G_a / h_a) E1
            dc = demb[c:c + step]
            for i in range(a):
                dc.addcmul_(m[:, i, :, :d], coef[i])
            dw1 += m.mul_(e1c.unsqueeze(1)).sum(0).sum(1)  # sum(0) first: contiguous
        dw1.mul_(h.unsqueeze(1))  # (A, D+1)
        return demb, dw1[:, :d], dw1[:, d], dh


class _AFMPairs(torch.autograd.Function):
    """The layer's formula over explicit pairs, batch-last: fields (F, D, B), products (P, D, B), logits (P, A, B)."""

    @staticmethod
    def forward(ctx, emb: Tensor, weight: Tensor, bias: Tensor, h: Tensor) -> Tensor:  # type: ignore[override]
        e = emb.permute(1, 2, 0).contiguous()  # (F, D, B)
        f, d, b = e.shape
        a = weight.shape[0]
        p = e.new_empty(f * (f - 1) // 2, d, b)  # (P, D, B) e_i ⊙ e_j, i < j
        for i, s, k in pair_blocks(f):
            torch.mul(e[i], e[i + 1 :], out=p[s : s + k])
        n = p.shape[0]
        r = torch.baddbmm(bias.view(1, a, 1), weight.expand(n, a, d), p).relu_()  # (P, A, B) ReLU(W p + b)
        att = torch.softmax(torch.matmul(h, r), 0)  # (P, B) softmax over the pairs of h^T ReLU(.)
        ctx.save_for_backward(e, p, r, att, weight, h)
        return torch.linalg.vecdot(p, att.unsqueeze(1), dim=0).t()  # (B, D) Σ_ij a_ij p_ij

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        e, p, r, att, weight, h = ctx.saved_tensors
        f, d, _ = e.shape
        n, a = r.shape[:2]
        gt = g.t().contiguous()  # (D, B)
        datt = torch.linalg.vecdot(p, gt, dim=1)  # (P, B) <p_ij, g>
        dlogit = att * (datt - torch.linalg.vecdot(att, datt, dim=0))  # (P, B) softmax backward
        dpre = torch.ops.aten.threshold_backward(h.view(1, a, 1) * dlogit.unsqueeze(1), r, 0)  # (P, A, B)
        dh = torch.bmm(r, dlogit.unsqueeze(2)).sum(0).view(a)
        dweight = torch.bmm(dpre, p.transpose(1, 2)).sum(0)  # (A, D)
        dbias = dpre.sum((0, 2))
        dp = torch.bmm(weight.t().expand(n, d, a), dpre).addcmul_(att.unsqueeze(1), gt)  # (P, D, B)
        de = torch.zeros_like(e)  # (F, D, B)
        for i, s, k in pair_blocks(f):
            block = dp[s : s + k]  # (k, D, B) the pairs (i, j > i)
            de[i] += torch.linalg.vecdot(block, e[i + 1 :], dim=0)  # Σ_j dp_ij ⊙ e_j
            de[i + 1 :].addcmul_(block, e[i])  # dp_ij ⊙ e_i
        return de.permute(2, 0, 1), dweight, dbias, dh
