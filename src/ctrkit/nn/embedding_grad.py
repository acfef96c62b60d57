"""Lookups whose table gradient is dense and built by ``index_add_``: the path of small fused tables.

A sparse gradient costs per lookup call and per id, not per row of the table: autograd sums the sparse
gradients of every call on one weight by concatenating them, and the optimizer then coalesces the sum (a sort,
or an ``index_add_`` into a dense buffer). On a small table most rows are touched by every batch anyway, so a
dense ``[R, D]`` gradient is cheaper: one ``index_add_`` of the id rows per call, dense adds between calls, and
the optimizer reads the touched rows off it (``nonzero_rows``). torch's own dense backward of ``F.embedding`` /
``F.embedding_bag`` sorts the ids first (``embedding_dense_backward``, ``_embedding_bag_dense_backward``), which
costs more than the sparse path; the functions here skip the sort:

- :func:`gather_rows` — ``W[ids]`` as ``index_select``, whose backward is ``zeros(R, D).index_add_(0, ids, dY)``.
- :func:`bag_rows` — ``F.embedding_bag`` (sum / mean, optional per-sample weights) forward; backward
  ``dW = zeros(R, D).index_add_(0, ids, s_i * dY[bag(i)])`` with ``s_i`` the id's per-sample weight (sum) or
  ``1 / |bag|`` (mean): seed 000 §5's ``P^T dY`` without materialising P.

Both backward passes run as one native loop over the ids where it applies (:mod:`ctrkit.nn.embedding_update`:
CPU, float32 / float64, a kernel built), the same floats as the ``index_add_`` path, which stays for the rest.

Which tables take this path: :data:`DENSE_GRAD_MAX_ROWS` (EmbeddingBagCollection's ``dense_grad_max_rows``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ctrkit.nn import embedding_update

__all__ = ["DENSE_GRAD_MAX_ROWS", "bag_rows", "gather_rows"]

# A fused weight of at most this many rows gets a dense gradient: where the dense path stops winning on both
# batch shapes of the zoo comparison (benchmarks/embedding_grad_layout.py, D = 16, one thread, CPU ms per step
# of forward + backward + L2 + LazyAdam, sparse / dense): MovieLens-like (batch 1,024, ~30k ids) 1.56x at 2,048
# rows, 1.49x at 8,192, 1.42x at 16,384, 0.76x at 65,536; Criteo-like (batch 256, 6,656 ids) 1.28x at 2,048,
# 1.24x at 8,192, 0.60x at 16,384. The dense path's extra work grows with R x D (zeroing, summing, scanning and
# updating the whole gradient), the sparse path's with the ids of a batch.
DENSE_GRAD_MAX_ROWS = 1 << 13


def gather_rows(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows of ``weight`` [R, D] for ``ids`` (any shape) -> ``(*ids.shape, D)``; dense gradient, no sort."""
    flat = ids.reshape(-1)
    if (weight.requires_grad and torch.is_grad_enabled() and not torch.compiler.is_exporting()
            and embedding_update.kernel_available()):
        out = _GatherRows.apply(weight, flat)  # the native scatter in backward (index_select's is an index_add_)
    else:
        out = weight.index_select(0, flat)
    return out.view(*ids.shape, weight.shape[1])


class _GatherRows(torch.autograd.Function):
    """``weight.index_select(0, ids)`` whose backward is :func:`~ctrkit.nn.embedding_update.scatter_rows` (the
    same floats as index_select's ``zeros(R, D).index_add_(0, ids, dY)``, which it falls back to)."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        ctx.rows = weight.shape[0]
        ctx.save_for_backward(ids)
        return weight.index_select(0, ids)  # (n, D)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (ids,) = ctx.saved_tensors
        dw = embedding_update.scatter_rows(ctx.rows, grad, ids)
        if dw is None:
            dw = grad.new_zeros(ctx.rows, grad.shape[1]).index_add_(0, ids, grad)  # (R, D)
        return dw, None


class _BagRows(torch.autograd.Function):
    """``F.embedding_bag`` whose weight gradient is an ``index_add_`` of the ids' row gradients."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, mode: str,
                per_sample_weights: torch.Tensor | None) -> torch.Tensor:
        ctx.rows, ctx.mode = weight.shape[0], mode
        ctx.save_for_backward(ids, offsets, per_sample_weights)
        return F.embedding_bag(ids, weight, offsets, mode=mode, per_sample_weights=per_sample_weights,
                               include_last_offset=True)  # (n_bags, D)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        ids, offsets, psw = ctx.saved_tensors
        dw = embedding_update.scatter_bags(ctx.rows, grad, ids, offsets, ctx.mode, psw)
        if dw is not None:
            return dw, None, None, None, None
        lengths = offsets.diff()  # (n_bags,)
        if ctx.mode == "mean":
            grad = grad / lengths.clamp(min=1).unsqueeze(1).to(grad.dtype)
        bag = torch.repeat_interleave(torch.arange(lengths.numel(), device=ids.device), lengths,
                                      output_size=ids.numel())  # (n,) each id's bag
        rows = grad.index_select(0, bag)  # (n, D)
        if psw is not None:
            rows = rows * psw.unsqueeze(1)
        dw = grad.new_zeros(ctx.rows, grad.shape[1]).index_add_(0, ids, rows)  # (R, D)
        return dw, None, None, None, None


def bag_rows(weight: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, mode: str,
             per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
    """Pooled bags ``(len(offsets) - 1, D)`` of ``weight`` [R, D] (offsets include the last one), ``mode``
    "sum" | "mean"; the weight's gradient is dense, built without sorting the ids. ``per_sample_weights`` are
    data here (no gradient flows to them): a caller that learns them uses ``F.embedding_bag``."""
    return _BagRows.apply(weight, ids, offsets, mode, per_sample_weights)
