"""AutoInt's interacting layers for training on the CPU with the samples in SIMD lanes (a native kernel).

The formula is the layer's (:class:`~ctrkit.nn.attention.MultiHeadSelfAttention`, H heads of size d', no mask):

    [Q | K | V | R] = E W^T                   one matmul (MKL), W = [W_Q; W_K; W_V; W_res]
    A^h = softmax_k(Q^h K^h^T)                the row maximum subtracted before the exp
    y   = ReLU([A^1 V^1; ...; A^H V^H] + R)

Why: at AutoInt's sizes (Criteo: B 256, F 26, 2 heads of 8) every per-sample product is a 26 x 8 x 26 matrix, and
ATen's batched matmul spends ~200 ns on each, ~3x its arithmetic, plus a pass over memory per elementwise step
(:mod:`ctrkit.nn.field_attention`, the torch-op node, measured that as its floor). Here the layout puts L samples
of one field side by side (one SIMD vector: L = 16 floats with AVX-512, 8 with AVX2): X^T is (D, nb, F, L) for nb = ceil(B / L) blocks
(the batch padded with zero samples), T = W X^T is (R, nb·F·L), and ``csrc/field_attention.cpp`` runs each
sample's whole attention (scores, softmax, weighted sum, residual, ReLU, and the backward) as one scalar program
over L samples at once: vertical multiply-adds from L1, no transposes, no kernel launches, a block's fields
contiguous. Only the projection and its two gradients go to MKL: T = W X^T, dX^T = W^T dT, dW = dT X.

:func:`lane_attention_stack` runs several layers with the layout converted once at each end (one copy in, one
out; between layers the output is the next layer's X^T as it is); :func:`lane_self_attention` is one layer.
Both return None where the kernel does not apply (no kernel built: no compiler or ``CTRKIT_NATIVE_KERNELS=0``;
not the CPU; not float32 / float64; d' > 64 or F > 256): the caller takes the torch-op node then. Tested against
the einsum formula, the torch-op node and with ``torch.autograd.gradcheck`` (float64).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from ctrkit.errors import LayerConfigError
from ctrkit.nn import kernels

__all__ = ["kernel_available", "lane_attention_stack", "lane_self_attention"]

_MAX_HEAD_DIM, _MAX_FIELDS = 64, 256
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


@functools.lru_cache(maxsize=1)
def _entry_points() -> dict[str, ctypes._CFuncPtr | int] | None:
    """The kernel's functions by name, and ``lanes_f32`` / ``lanes_f64``: L, the samples per vector of its build."""
    lib = kernels.load("field_attention")
    if lib is None:
        return None
    p, i, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
    fns: dict[str, ctypes._CFuncPtr | int] = {}
    lanes = lib.ctrkit_field_attention_lanes
    lanes.argtypes, lanes.restype = [i], i
    for double, sfx in enumerate(_SUFFIX.values()):
        fwd = getattr(lib, f"ctrkit_field_attention_forward_{sfx}")
        fwd.argtypes, fwd.restype = [p, p, p, p, i64, i, i, i, i, i, i], i
        bwd = getattr(lib, f"ctrkit_field_attention_backward_{sfx}")
        bwd.argtypes, bwd.restype = [p, p, p, p, p, p, i64, i, i, i, i, i, i], i
        fns[f"forward_{sfx}"], fns[f"backward_{sfx}"], fns[f"lanes_{sfx}"] = fwd, bwd, int(lanes(double))
    return fns


def kernel_available() -> bool:
    """Whether the native kernel is built and loaded (building it at the first call)."""
    return kernels.enabled() and _entry_points() is not None


LayerArgs = tuple[Tensor, int, int, bool, bool]  # (weight, num_heads, head_dim, residual, relu)


def lane_self_attention(x: Tensor, weight: Tensor, num_heads: int, head_dim: int, *, residual: bool,
                        relu: bool) -> Tensor | None:
    """Self-attention over the fields of ``x`` (B, F, D) -> (B, F, H·d'), or None where the kernel does not apply.

    ``weight`` ((3 or 4)·H·d', D): the rows of W_Q, W_K, W_V and, when ``residual``, W_res in that order (each head's
    d' rows together, as ``nn.Linear`` weights); unscaled dot products (fold 1/sqrt(d') into W_Q for the scaled form).
    """
    return lane_attention_stack(x, [(weight, num_heads, head_dim, residual, relu)])


def lane_attention_stack(x: Tensor, layers: Sequence[LayerArgs]) -> Tensor | None:
    """``x`` (B, F, D) through the layers in order (each as :func:`lane_self_attention`'s arguments) -> the last
    one's (B, F, H·d'), or None where the kernel does not apply to every layer."""
    b, f, _ = x.shape
    if (x.device.type != "cpu" or x.dtype not in _SUFFIX or b == 0 or not 1 <= f <= _MAX_FIELDS
            or any(w.dtype != x.dtype or not 1 <= dh <= _MAX_HEAD_DIM for w, _, dh, _, _ in layers)
            or not kernel_available()):
        return None
    lanes = _entry_points()[f"lanes_{_SUFFIX[x.dtype]}"]  # type: ignore[index]
    nb = -(-b // lanes)
    xp = x if nb * lanes == b else torch.nn.functional.pad(x, (0, 0, 0, 0, 0, nb * lanes - b))  # zero samples
    xt = xp.reshape(nb, lanes, f, -1).permute(3, 0, 2, 1).contiguous()  # (D, nb, F, L)
    for weight, num_heads, head_dim, residual, relu in layers:
        xt = _LaneSelfAttention.apply(xt, weight.contiguous(), num_heads, head_dim, residual, relu)
    out = xt.permute(1, 3, 2, 0).reshape(nb * lanes, f, -1)  # (B + padding, F, H·d')
    return out if nb * lanes == b else out[:b]  # a slice's backward would copy into zeros


def _ptr(t: Tensor) -> int:
    return t.data_ptr()


class _LaneSelfAttention(torch.autograd.Function):
    """X^T (D, nb, F, L) and W (R, D) -> y (H·d', nb, F, L); keeps T, the attention output, y and the softmax
    weights (H, nb, F, F, L)."""

    @staticmethod
    def forward(ctx, xt: Tensor, weight: Tensor, num_heads: int, head_dim: int, residual: bool,  # type: ignore[override]
                relu: bool) -> Tensor:
        d, nb, f, lanes = xt.shape
        t = torch.mm(weight, xt.view(d, -1))  # (R, N): [Q; K; V; Res]
        att = torch.empty(num_heads * head_dim, nb, f, lanes, dtype=xt.dtype)
        y = torch.empty_like(att)
        a = torch.empty(num_heads * nb * f * f * lanes, dtype=xt.dtype)
        rc = _entry_points()[f"forward_{_SUFFIX[xt.dtype]}"](  # type: ignore[index]
            _ptr(t), _ptr(att), _ptr(y), _ptr(a), nb, f, num_heads, head_dim, int(residual), int(relu),
            torch.get_num_threads())
        _check(rc, f, head_dim)
        ctx.shape = (num_heads, head_dim, residual, relu)
        ctx.save_for_backward(xt, weight, t, att, y, a)
        return y

    @staticmethod
    def backward(ctx, gy: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        xt, weight, t, att, y, a = ctx.saved_tensors
        num_heads, head_dim, residual, relu = ctx.shape
        d, nb, f, _ = xt.shape
        gy = gy.contiguous()  # (H·d', nb, F, L); already so but where a caller hands back another layout
        dt = torch.empty_like(t)
        rc = _entry_points()[f"backward_{_SUFFIX[xt.dtype]}"](  # type: ignore[index]
            _ptr(t), _ptr(gy), _ptr(y), _ptr(att), _ptr(a), _ptr(dt), nb, f, num_heads, head_dim, int(residual),
            int(relu), torch.get_num_threads())
        _check(rc, f, head_dim)
        dxt = torch.mm(weight.t(), dt).view(xt.shape) if ctx.needs_input_grad[0] else None
        dw = torch.mm(dt, xt.view(d, -1).t()) if ctx.needs_input_grad[1] else None
        return dxt, dw, None, None, None, None


def _check(rc: int, f: int, head_dim: int) -> None:
    if rc != 0:  # lane_attention_stack checks the limits before calling, so only a mismatched build gets here
        raise LayerConfigError(
            f"MultiHeadSelfAttention: the native kernel refused F={f}, head_dim={head_dim} (its limits: F <= "
            f"{_MAX_FIELDS}, head_dim <= {_MAX_HEAD_DIM}); set CTRKIT_NATIVE_KERNELS=0 to train on torch ops")
