"""FiBiNET's field_interaction bilinear layers as one autograd node, grouped by left field, in a feature-major layout.

:class:`~ctrkit.nn.senet.BilinearInteraction` (``bilinear_type="field_interaction"``) computes, for every pair
``i < j`` in upper-triangle order (i outer, j inner),

    p_ij = (v_i W_ij) ⊙ v_j                                                    (B, D) per pair, (B, P, D) in all

by gathering the left and right fields of every pair into (P, B, D) copies, one batched matmul, a product and a
transposed copy to (B, P·D); its backward scatters both gathers back with ``index_add_``. FiBiNET then
concatenates two such outputs and the dense features into its DNN input, one more copy. Here the pairs of one
left field ``i`` are one block: their weights side by side are a (D, k·D) matrix ``[W_i,i+1 | ... | W_i,F-1]``
(k = F-1-i), so ``v_i [W_i,i+1 | ...]`` is one matmul, and its result lines up with the right fields
``v_{i+1..F-1}``: no gather, and the product is written straight into the DNN input.

Layout: the node works feature-major, the batch in the last (contiguous) dim. The fields are (F, D, B), a block's
left product is ``[W_i,i+1 | ...]^T v_i^T`` (k·D, B), the right fields ``v_{i+1..}`` are the contiguous rows
(k·D, B) below field i, and the DNN input is written as X^T (N, B), one contiguous row block per block of pairs;
the node returns X as the (B, N) transposed view of it. Every elementwise pass then reads and writes whole
contiguous rows (in the batch-major layout they were (B, k, D) views strided by N). The next layer loses
nothing: a matmul reads a transposed operand at the same speed, and torch's matmul backward returns the gradient
of a transposed input in the same transposed layout, so the backward here gets dX^T (N, B) contiguous from the
DNN's first Linear without a copy. The backward of a block is a product, an ``addcmul_`` into the right fields'
gradient and two matmuls (the left field's gradient and the block's weight gradient), all on contiguous rows.

One layer shared by the raw and the re-weighted fields (:func:`bilinear_pairs_shared`, DeepCTR-Torch's FiBiNET):
``q_ij = a_i a_j p_ij`` exactly, so the second half of X is the first scaled per (pair, sample), one pass, and its
backward adds ``s ⊙ dX_q`` to dX_p and reduces ``<dX_q, p>`` for the scale.

The forward values are the plain layer's bit for bit in the tests (the same length-D dot products and products);
the input gradient sums the pairs of a field in another order (rounding only). Measured at MovieLens' shape
(B 1,024, F 9, D 16, both layers and the dense column, one thread, CPU ms of forward + backward, medians, load
7-12): plain layers 9.7, this node batch-major 6.3, feature-major 5.1-5.5 (alone; 1.2 ms less per FiBiNET training
step with the DNN after it, steps alternated), shared 4.1-4.5 (tests/nn/test_bilinear_pairs.py checks values and
gradients against the plain layer, the definition and an einsum, and torch.autograd.gradcheck).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ctrkit.errors import LayerConfigError
from ctrkit.nn.bilinear_pairs_native import native_shared_pairs
from ctrkit.nn.fm import pair_blocks

__all__ = ["bilinear_pairs_concat", "bilinear_pairs_shared"]


def bilinear_pairs_concat(embs: list[Tensor], weights: list[Tensor], tail: Tensor | None = None) -> Tensor:
    """``[flat p(embs[0], weights[0]) | flat p(embs[1], weights[1]) | ... | tail]`` -> (B, L·P·D + Nt).

    ``embs[l]`` (B, F, D); ``weights[l]`` (P, D, D), W_ij of the pairs in upper-triangle order (the
    ``field_interaction`` weight of :class:`~ctrkit.nn.senet.BilinearInteraction`); ``tail`` (B, Nt) or None.
    The result is a transposed view of a contiguous (L·P·D + Nt, B) tensor (see the module docstring).
    """
    if len(embs) != len(weights) or not embs:
        raise LayerConfigError(f"bilinear_pairs_concat needs one weight per embedding tensor, got {len(embs)} "
                         f"embeddings and {len(weights)} weights")
    args: list[Tensor] = [t for pair in zip(embs, weights) for t in pair]
    return _BilinearPairs.apply(tail, *args)


def bilinear_pairs_shared(emb: Tensor, scale: Tensor, weight: Tensor, tail: Tensor | None = None, *,
                          native: bool = True) -> Tensor:
    """``[flat p | flat q | tail]`` -> (B, 2·P·D + Nt) for ONE bilinear weight applied to ``emb`` and to the
    re-weighted fields ``scale ⊙ emb``: with ``v'_i = a_i v_i`` (``scale`` a (B, F)),

        q_ij = (v'_i W_ij) ⊙ v'_j = a_i a_j p_ij                                       (exact algebra)

    so the second layer is the first one's output scaled per (sample, pair): one pass instead of a second
    bilinear layer, and no (B, F, D) re-weighted tensor. ``emb`` (B, F, D), ``scale`` (B, F), ``weight``
    (P, D, D) as :func:`bilinear_pairs_concat`'s. The same transposed-view layout as that function's result.

    On the CPU in float32 / float64 the native kernel runs it (:mod:`ctrkit.nn.bilinear_pairs_native`: one pass each
    way); elsewhere, with ``native=False`` or where no kernel is built, the torch-op node below.
    """
    out = native_shared_pairs(emb, scale, weight, tail) if native else None
    return _SharedBilinearPairs.apply(tail, emb, scale, weight) if out is None else out


def _weights_t(weight: Tensor) -> Tensor:
    """``[W_0 | W_1 | ... | W_{P-1}]^T`` of ``weight`` (P, D, D) -> (P·D, D), one copy: row (j, c) is column c of
    W_j, so the rows s·D .. (s+k)·D are the block ``[W_s | ... | W_{s+k-1}]^T`` (k·D, D), a view."""
    p, d, _ = weight.shape
    return weight.transpose(1, 2).reshape(p * d, d)


def _feature_major(emb: Tensor) -> Tensor:
    """(B, F, D) -> (F, D, B) contiguous."""
    return emb.permute(1, 2, 0).contiguous()


def _pairs_forward(e: Tensor, w: Tensor, out_t: Tensor) -> list[Tensor]:
    """p_ij of fields ``e`` (F, D, B) and weight ``w`` (P, D, D) written into ``out_t`` (P·D, B) rows, block by
    block -> the blocks' left products ``[W_i,i+1 | ...]^T v_i^T`` (k·D, B), which the backward needs."""
    f, d, b = e.shape
    lefts = []
    wt = _weights_t(w)  # (P·D, D)
    for i, s, k in pair_blocks(f):
        u = torch.mm(wt[s * d : (s + k) * d], e[i])  # (k·D, B): v_i W_ij, j > i
        torch.mul(u, e[i + 1 :].view(k * d, b), out=out_t[s * d : (s + k) * d])  # (k·D, B): ⊙ v_j
        lefts.append(u)
    return lefts


def _pairs_backward(e: Tensor, w: Tensor, lefts: list[Tensor], grad_t: Tensor, want_e: bool,
                    want_w: bool) -> tuple[Tensor | None, Tensor | None]:
    """(d fields (F, D, B), d weight (P, D, D)) of :func:`_pairs_forward` given ``grad_t`` (P·D, B) = dp^T."""
    f, d, b = e.shape
    de = torch.zeros_like(e) if want_e else None  # (F, D, B)
    dw = torch.empty_like(w) if want_w else None  # (P, D, D)
    wt = _weights_t(w) if want_e else None  # (P·D, D)
    for (i, s, k), u in zip(pair_blocks(f), lefts):
        g = grad_t[s * d : (s + k) * d]  # (k·D, B)
        du = torch.mul(g, e[i + 1 :].view(k * d, b))  # (k·D, B): d(v_i W_ij)
        if de is not None and wt is not None:
            de[i + 1 :].view(k * d, b).addcmul_(g, u)  # d v_j += dp_ij ⊙ v_i W_ij
            de[i] += torch.mm(wt[s * d : (s + k) * d].t(), du)  # d v_i += Σ_j W_ij d(v_i W_ij)
        if dw is not None:  # dW_ij = v_i^T d(v_i W_ij)
            dw[s : s + k] = torch.mm(du, e[i].t()).view(k, d, d).transpose(1, 2)
    return de, dw


class _BilinearPairs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tail: Tensor | None, *args: Tensor) -> Tensor:  # type: ignore[override]
        fields = [_feature_major(e) for e in args[0::2]]  # (F, D, B) per layer
        weights = list(args[1::2])
        f, d, b = fields[0].shape
        pd = f * (f - 1) // 2 * d
        nt = 0 if tail is None else tail.shape[1]
        out_t = fields[0].new_empty(len(fields) * pd + nt, b)  # X^T (N, B)
        lefts = [_pairs_forward(e, w, out_t[i * pd : (i + 1) * pd]) for i, (e, w) in enumerate(zip(fields, weights))]
        if tail is not None:
            out_t[len(fields) * pd :] = tail.t()
        ctx.has_tail, ctx.layers, ctx.blocks = tail is not None, len(fields), len(lefts[0])
        ctx.save_for_backward(*fields, *weights, *(u for block in lefts for u in block))
        return out_t.t()  # (B, N) view

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        n, nb = ctx.layers, ctx.blocks
        saved = ctx.saved_tensors
        fields, weights, lefts = saved[:n], saved[n : 2 * n], saved[2 * n :]
        f, d, _ = fields[0].shape
        pd = f * (f - 1) // 2 * d
        grad_t = grad.t().contiguous()  # (N, B): no copy when it comes from a matmul's backward (see above)
        grads: list[Tensor | None] = [grad_t[n * pd :].t() if ctx.has_tail and ctx.needs_input_grad[0] else None]
        for layer, (e, w) in enumerate(zip(fields, weights)):
            de, dw = _pairs_backward(e, w, list(lefts[layer * nb : (layer + 1) * nb]),
                                     grad_t[layer * pd : (layer + 1) * pd],
                                     ctx.needs_input_grad[1 + 2 * layer], ctx.needs_input_grad[2 + 2 * layer])
            grads += [None if de is None else de.permute(2, 0, 1), dw]
        return tuple(grads)


class _SharedBilinearPairs(torch.autograd.Function):
    """[p | q | tail]^T with q_ij = a_i a_j p_ij (see :func:`bilinear_pairs_shared`). Backward, with s_ij = a_i a_j:
    dp_ij = dX_p,ij + s_ij dX_q,ij;  ds_ij = <dX_q,ij, p_ij>;  da_i = Σ_j ds_ij a_j (both orders of each pair)."""

    @staticmethod
    def forward(ctx: Any, tail: Tensor | None, emb: Tensor, scale: Tensor,  # type: ignore[override]
                weight: Tensor) -> Tensor:
        e = _feature_major(emb)  # (F, D, B)
        f, d, b = e.shape
        p = f * (f - 1) // 2
        rows, cols = torch.triu_indices(f, f, 1, device=e.device)
        a = scale.t().contiguous()  # (F, B)
        s = a.index_select(0, rows).mul_(a.index_select(0, cols))  # (P, B): a_i a_j
        nt = 0 if tail is None else tail.shape[1]
        out_t = e.new_empty(2 * p * d + nt, b)  # X^T (N, B)
        pairs = out_t[: p * d]
        lefts = _pairs_forward(e, weight, pairs)
        torch.mul(pairs.view(p, d, b), s.unsqueeze(1), out=out_t[p * d : 2 * p * d].view(p, d, b))  # q
        if tail is not None:
            out_t[2 * p * d :] = tail.t()
        ctx.has_tail = tail is not None
        ctx.save_for_backward(e, weight, a, s, pairs, rows, cols, *lefts)
        return out_t.t()  # (B, N) view

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        e, weight, a, s, pairs, rows, cols, *lefts = ctx.saved_tensors
        f, d, b = e.shape
        p = f * (f - 1) // 2
        grad_t = grad.t().contiguous()  # (N, B): no copy when it comes from a matmul's backward
        gq = grad_t[p * d : 2 * p * d].view(p, d, b)
        dp = torch.addcmul(grad_t[: p * d].view(p, d, b), gq, s.unsqueeze(1)).view(p * d, b)  # dX_p + s ⊙ dX_q
        want_e, want_a, want_w = ctx.needs_input_grad[1:4]
        de, dw = _pairs_backward(e, weight, lefts, dp, want_e, want_w)
        da = None
        if want_a:
            ds = torch.linalg.vecdot(gq, pairs.view(p, d, b), dim=1)  # (P, B)
            da = torch.zeros_like(a).index_add_(0, rows, ds * a.index_select(0, cols))
            da = da.index_add_(0, cols, ds.mul_(a.index_select(0, rows))).t()  # (B, F)
        tail_grad = grad_t[2 * p * d :].t() if ctx.has_tail and ctx.needs_input_grad[0] else None
        return tail_grad, None if de is None else de.permute(2, 0, 1), da, dw
