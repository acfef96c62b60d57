"""FiBiNET's field_interaction bilinear layers as one autograd node, grouped by left field, no gathers.

:class:`~ctrkit.nn.senet.BilinearInteraction` (``bilinear_type="field_interaction"``) computes, for every pair
``i < j`` in upper-triangle order (i outer, j inner),

    p_ij = (v_i W_ij) ⊙ v_j                                                    (B, D) per pair, (B, P, D) in all

by gathering the left and right fields of every pair into (P, B, D) copies, one batched matmul, a product and a
transposed copy to (B, P·D); its backward scatters both gathers back with ``index_add_``. FiBiNET then
concatenates two such outputs and the dense features into its DNN input, one more copy. Here the pairs of one
left field ``i`` are one block: their weights side by side are a (D, k·D) matrix ``[W_i,i+1 | ... | W_i,F-1]``
(k = F-1-i), so ``v_i [W_i,i+1 | ...]`` is one matmul whose (B, k, D) result lines up with the right fields
``E[:, i+1:]``, a strided view of the input: no gather, and the product is written straight into the DNN
input's columns. The backward of a block is a product, an ``addcmul_`` into the right fields' gradient and two
matmuls (the left field's gradient and the block's weight gradient), again on views.

The forward values are the plain layer's bit for bit (the same products in the same order); the input gradient
sums the pairs of a field in another order (rounding only). Measured at MovieLens' shape (B 1,024, F 9, D 16, one
thread): forward + backward of one layer 5.1 -> 2.7 CPU ms (tests/nn/test_bilinear_pairs.py checks values and
gradients against the plain layer and an einsum, and torch.autograd.gradcheck).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ctrkit.errors import LayerConfigError

__all__ = ["bilinear_pairs_concat"]


def bilinear_pairs_concat(embs: list[Tensor], weights: list[Tensor], tail: Tensor | None = None) -> Tensor:
    """``[flat p(embs[0], weights[0]) | flat p(embs[1], weights[1]) | ... | tail]`` -> (B, L·P·D + Nt).

    ``embs[l]`` (B, F, D); ``weights[l]`` (P, D, D), W_ij of the pairs in upper-triangle order (the
    ``field_interaction`` weight of :class:`~ctrkit.nn.senet.BilinearInteraction`); ``tail`` (B, Nt) or None.
    """
    if len(embs) != len(weights) or not embs:
        raise LayerConfigError(f"bilinear_pairs_concat needs one weight per embedding tensor, got {len(embs)} "
                         f"embeddings and {len(weights)} weights")
    args: list[Tensor] = [t for pair in zip(embs, weights) for t in pair]
    return _BilinearPairs.apply(tail, *args)


def _blocks(num_fields: int) -> list[tuple[int, int, int]]:
    """(left field i, first pair s, pairs k) of every left field with a pair, in upper-triangle order."""
    out, s = [], 0
    for i in range(num_fields - 1):
        k = num_fields - 1 - i
        out.append((i, s, k))
        s += k
    return out


def _block_weight(weight: Tensor, s: int, k: int) -> Tensor:
    """``[W_s | ... | W_{s+k-1}]`` of ``weight`` (P, D, D) -> (D, k·D)."""
    d = weight.shape[1]
    return weight[s : s + k].transpose(0, 1).reshape(d, k * d)


class _BilinearPairs(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tail: Tensor | None, *args: Tensor) -> Tensor:  # type: ignore[override]
        embs = [e.contiguous() for e in args[0::2]]
        weights = list(args[1::2])
        b, f, d = embs[0].shape
        p = f * (f - 1) // 2
        nt = 0 if tail is None else tail.shape[1]
        out = embs[0].new_empty(b, len(embs) * p * d + nt)
        lefts = []  # v_i [W_i,i+1 | ...] per layer and block, (B, k, D): the right factor's gradient
        for layer, (e, w) in enumerate(zip(embs, weights)):
            o = out[:, layer * p * d : (layer + 1) * p * d].view(b, p, d)  # (B, P, D) columns of out
            for i, s, k in _blocks(f):
                u = torch.mm(e[:, i], _block_weight(w, s, k)).view(b, k, d)  # (B, k, D): v_i W_ij, j > i
                torch.mul(u, e[:, i + 1 :], out=o[:, s : s + k])  # (B, k, D): ⊙ v_j
                lefts.append(u)
        if tail is not None:
            out[:, len(embs) * p * d :] = tail
        ctx.has_tail = tail is not None
        ctx.save_for_backward(*embs, *weights, *lefts)
        ctx.layers = len(embs)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        n = ctx.layers
        saved = ctx.saved_tensors
        embs, weights, lefts = saved[:n], saved[n : 2 * n], iter(saved[2 * n :])
        b, f, d = embs[0].shape
        p = f * (f - 1) // 2
        grads: list[Tensor | None] = [grad[:, n * p * d :] if ctx.has_tail and ctx.needs_input_grad[0] else None]
        for layer, (e, w) in enumerate(zip(embs, weights)):
            g = grad[:, layer * p * d : (layer + 1) * p * d].view(b, p, d)  # (B, P, D)
            want_e, want_w = ctx.needs_input_grad[1 + 2 * layer], ctx.needs_input_grad[2 + 2 * layer]
            de = torch.zeros_like(e) if want_e else None  # (B, F, D)
            dw = torch.empty_like(w) if want_w else None  # (P, D, D)
            for i, s, k in _blocks(f):
                u = next(lefts)
                gi = g[:, s : s + k]  # (B, k, D)
                du = torch.mul(gi, e[:, i + 1 :]).view(b, k * d)  # (B, k·D): d(v_i W_ij)
                if de is not None:
                    de[:, i + 1 :].addcmul_(gi, u)  # d v_j += dp_ij ⊙ v_i W_ij
                    de[:, i] += torch.mm(du, _block_weight(w, s, k).t())  # d v_i += Σ_j d(v_i W_ij) W_ij^T (mm: counted by FlopCounterMode)
                if dw is not None:
                    dw[s : s + k] = torch.mm(e[:, i].t(), du).view(d, k, d).transpose(0, 1)  # v_i^T d(v_i W_ij)
            grads += [de, dw]
        return tuple(grads)
