"""FiBiNET's shared bilinear node as a native kernel, the samples in SIMD lanes (``csrc/bilinear_pairs.cpp``).

The formula is :func:`ctrkit.nn.bilinear_pairs.bilinear_pairs_shared`'s (one ``field_interaction`` weight applied
to the raw fields and to SENET's re-weighted ones, DeepCTR-Torch's FiBiNET):

    p_ij = (v_i W_ij) ⊙ v_j,   q_ij = a_i a_j p_ij                 (B, D) per pair i < j, upper-triangle order
    X    = [flat p | flat q | dense]                               (B, 2·P·D + Nt), the first Linear's input

Why: the torch-op node runs ~8 passes over (P·D, B) tensors of 2.4 MB each way (a matmul and a product per block
of pairs, the q scaling, and in the backward the dX_p + s ⊙ dX_q sum, the products, the ``addcmul_``, the
reduction for the scale) and keeps the left products v_i W_ij for the backward. Here the layout is the node's
feature-major one, (F, D, B) fields and X^T (N, B), so L consecutive samples of one row are one vector (L = 16
floats with AVX-512) and each sample's formula is one scalar program over L samples: the forward reads the fields
and writes X^T once, the backward reads dX^T once and writes the fields' gradient, recomputing v_i W_ij (D·D
multiply-adds per pair and sample) instead of storing it. The weight gradient is summed over samples in per-lane
partial sums, per pair and thread.

:func:`native_shared_pairs` returns None where the kernel does not apply (no kernel built: no compiler or
``CTRKIT_NATIVE_KERNELS=0``; not the CPU; not float32 / float64; D > 64): the caller takes the torch-op node then.
Tested against that node, the definition and ``torch.autograd.gradcheck`` (tests/nn/test_bilinear_pairs_native.py).
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from ctrkit.errors import LayerConfigError
from ctrkit.nn import kernels

__all__ = ["kernel_available", "native_senet_shared_pairs", "native_shared_pairs"]

_MAX_DIM = 64
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


@functools.lru_cache(maxsize=1)
def _entry_points() -> dict[str, ctypes._CFuncPtr] | None:
    p, i, i64 = kernels.PTR, kernels.I32, kernels.I64
    fns = kernels.bind("bilinear_pairs", {
        "forward": ("ctrkit_bilinear_shared_forward", [p, p, p, p, i64, i, i, i], i),
        "backward": ("ctrkit_bilinear_shared_backward", [p, p, p, p, p, p, p, i64, i, i, i], i)})
    senet = None if fns is None else kernels.bind("senet_excite", {
        "senet_forward": ("ctrkit_senet_forward", [p, p, p, p, p, i64, i, i, i, i], i),
        "senet_backward": ("ctrkit_senet_backward", [p, p, p, p, p, p, p, p, p, i64, i, i, i, i], i)})
    return fns if senet is None else {**fns, **senet}  # SENET's kernel is optional: the pairs' run without it


def kernel_available() -> bool:
    """Whether the native kernel is built and loaded (building it at the first call)."""
    return kernels.enabled() and _entry_points() is not None


def applies(emb: Tensor, scale: Tensor, weight: Tensor) -> bool:
    """Whether :func:`native_shared_pairs` runs the kernel for these inputs (else it returns None)."""
    return (emb.device.type == "cpu" and emb.dtype in _SUFFIX and scale.dtype == weight.dtype == emb.dtype
            and scale.device.type == weight.device.type == "cpu" and 1 <= emb.shape[2] <= _MAX_DIM
            and emb.shape[1] >= 2 and kernel_available())


def native_shared_pairs(emb: Tensor, scale: Tensor, weight: Tensor, tail: Tensor | None = None) -> Tensor | None:
    """``[flat p | flat q | tail]`` (B, 2·P·D + Nt) as a transposed view of a contiguous X^T, or None where the
    kernel does not apply. ``emb`` (B, F, D), ``scale`` (B, F), ``weight`` (P, D, D), ``tail`` (B, Nt) or None."""
    if not applies(emb, scale, weight):
        return None
    return _NativeSharedPairs.apply(tail, emb, scale, weight)


def native_senet_shared_pairs(emb: Tensor, w1: Tensor, w2: Tensor, weight: Tensor,
                              tail: Tensor | None = None) -> Tensor | None:
    """:func:`native_shared_pairs` with SENET's field weights computed inside the node (mean squeeze, bias-free
    ``W1`` (H, F) and ``W2`` (F, H), each followed by a ReLU: :class:`~ctrkit.nn.senet.SENET`'s ``excite``), or None
    where the kernels do not apply. One node and two kernel calls each way instead of SENET's ~10 small autograd
    nodes and its (B, F, D) squeeze gradient."""
    h, f = w1.shape
    if (not applies(emb, emb.new_empty(0, f), weight) or w1.dtype != emb.dtype or w2.dtype != emb.dtype
            or w2.shape != (f, h) or not 1 <= h <= _MAX_DIM or f > _MAX_DIM):
        return None
    if f"senet_forward_{_SUFFIX[emb.dtype]}" not in _entry_points():  # type: ignore[operator]
        return None
    return _NativeSenetSharedPairs.apply(tail, emb, w1, w2, weight)


def _pairs_forward(e: Tensor, a: Tensor, w: Tensor, tail: Tensor | None) -> Tensor:
    """X^T (N, B) of the fields ``e`` (F, D, B), their weights ``a`` (F, B) and ``w`` (P, D, D), ``tail`` below."""
    f, d, b = e.shape
    pd = f * (f - 1) // 2 * d
    out_t = e.new_empty(2 * pd + (0 if tail is None else tail.shape[1]), b)
    rc = _entry_points()[f"forward_{_SUFFIX[e.dtype]}"](  # type: ignore[index]
        e.data_ptr(), a.data_ptr(), w.data_ptr(), out_t.data_ptr(), b, f, d, torch.get_num_threads())
    _check(rc, f, d)
    if tail is not None:
        out_t[2 * pd :] = tail.t()
    return out_t


def _pairs_backward(e: Tensor, a: Tensor, w: Tensor, grad: Tensor,
                    tail_wanted: bool) -> tuple[Tensor | None, Tensor, Tensor, Tensor]:
    """(the tail's gradient or None, de (F, D, B), da (F, B), dw (P, D, D)) from the gradient of X (B, N)."""
    f, d, b = e.shape
    grad_t = grad.t().contiguous()  # (N, B): no copy when it comes from a matmul's backward
    de, da, dw = torch.empty_like(e), torch.empty_like(a), torch.empty_like(w)  # the kernel zeroes them
    rc = _entry_points()[f"backward_{_SUFFIX[e.dtype]}"](  # type: ignore[index]
        e.data_ptr(), a.data_ptr(), w.data_ptr(), grad_t.data_ptr(), de.data_ptr(), da.data_ptr(),
        dw.data_ptr(), b, f, d, torch.get_num_threads())
    _check(rc, f, d)
    tail_grad = grad_t[f * (f - 1) * d :].t() if tail_wanted else None
    return tail_grad, de, da, dw


class _NativeSharedPairs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tail: Tensor | None, emb: Tensor, scale: Tensor,  # type: ignore[override]
                weight: Tensor) -> Tensor:
        e = emb.permute(1, 2, 0).contiguous()  # (F, D, B)
        a = scale.t().contiguous()  # (F, B)
        w = weight.contiguous()  # (P, D, D)
        ctx.has_tail = tail is not None
        ctx.save_for_backward(e, a, w)
        return _pairs_forward(e, a, w, tail).t()  # (B, N) view

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        e, a, w = ctx.saved_tensors
        tail_grad, de, da, dw = _pairs_backward(e, a, w, grad, ctx.has_tail and ctx.needs_input_grad[0])
        return tail_grad, de.permute(2, 0, 1), da.t(), dw


class _NativeSenetSharedPairs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tail: Tensor | None, emb: Tensor, w1: Tensor, w2: Tensor,  # type: ignore[override]
                weight: Tensor) -> Tensor:
        b, f, d = emb.shape
        hidden = w1.shape[0]
        e = emb.permute(1, 2, 0).contiguous()  # (F, D, B)
        w1, w2, w = w1.contiguous(), w2.contiguous(), weight.contiguous()
        h, a = e.new_empty(hidden, b), e.new_empty(f, b)  # SENET's hidden units and field weights, (H, B), (F, B)
        _check(_entry_points()[f"senet_forward_{_SUFFIX[e.dtype]}"](  # type: ignore[index]
            e.data_ptr(), w1.data_ptr(), w2.data_ptr(), h.data_ptr(), a.data_ptr(), b, f, d, hidden,
            torch.get_num_threads()), f, d)
        ctx.has_tail = tail is not None
        ctx.save_for_backward(e, a, w, h, w1, w2)
        return _pairs_forward(e, a, w, tail).t()  # (B, N) view

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        e, a, w, h, w1, w2 = ctx.saved_tensors
        f, d, b = e.shape
        tail_grad, de, da, dw = _pairs_backward(e, a, w, grad, ctx.has_tail and ctx.needs_input_grad[0])
        dw1, dw2 = torch.empty_like(w1), torch.empty_like(w2)
        _check(_entry_points()[f"senet_backward_{_SUFFIX[e.dtype]}"](  # type: ignore[index]
            e.data_ptr(), w1.data_ptr(), w2.data_ptr(), h.data_ptr(), a.data_ptr(), da.data_ptr(), de.data_ptr(),
            dw1.data_ptr(), dw2.data_ptr(), b, f, d, w1.shape[0], torch.get_num_threads()), f, d)  # de += squeeze's
        return tail_grad, de.permute(2, 0, 1), dw1, dw2, dw


def _check(rc: int, f: int, d: int) -> None:
    if rc != 0:  # applies() checks the limits before calling, so only a mismatched build gets here
        raise LayerConfigError(
            f"bilinear_shared_concat: the native kernel refused F={f}, D={d} (its limits: F >= 2, D <= {_MAX_DIM}); "
            "set CTRKIT_NATIVE_KERNELS=0 to train on torch ops")
