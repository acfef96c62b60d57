"""The low-rank cross net (DCN-v2, :class:`ctrkit.nn.crossnet.LowRankCrossNet`) as one autograd node, its
element-wise work a native kernel (``csrc/cross_layer.cpp``).

Per layer ``z_l = (x_l V_l^T) W_l^T + b_l``, ``x_{l+1} = x_0 ⊙ z_l + x_l`` on (B, N) rows. Autograd runs the
element-wise part as a multiply and an add forward (a (B, N) temporary between them) and two multiplies plus the
adds of x_0's gradient parts backward, each a separate pass over (B, N) tensors: in the DLRM benchmark's DCN step
(N = 432) those were 23 of 143 ms. Here each layer's element-wise forward is one pass, and its backward one pass
writing ``dz = g ⊙ x_0`` and adding ``g ⊙ z`` (and, at layer 0, the identity path's g) to x_0's gradient. The
matmuls are the calls autograd makes (``mm`` / ``addmm`` forward; ``dz^T vx``, ``dz W``, ``dvx^T x``, ``dvx V``
backward), the bias gradient is ``dz.sum(0)``, and x_0's gradient parts are added in the order autograd's engine
adds them, so every float is the graph's, bit for bit (tests/nn/test_crossnet_native.py).

:func:`native_low_rank_cross` returns None where the node does not apply (no kernel built: no compiler or
``CTRKIT_NATIVE_KERNELS=0``; not the CPU; not float32 / float64; autocast on; no gradient needed; compiling): the
caller runs the torch ops then.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ctrkit.nn import kernels

__all__ = ["kernel_available", "native_low_rank_cross"]

_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_ASSIGN, _ADD, _ADD_IDENTITY, _IDENTITY = 0, 1, 2, 3  # how a layer's backward writes x_0's gradient (cross_layer.cpp)


@functools.lru_cache(maxsize=1)
def _entry_points() -> dict[str, ctypes._CFuncPtr] | None:
    p, i, i64 = kernels.PTR, kernels.I32, kernels.I64
    return kernels.bind("cross_layer", {"forward": ("ctrkit_cross_forward", [p, p, p, p, i64, i], None),
                                        "backward": ("ctrkit_cross_backward", [p, p, p, p, p, i64, i, i], None)},
                        ("-ffp-contract=off",))


def kernel_available() -> bool:
    """Whether the native kernel is built and loaded (building it at the first call)."""
    return kernels.enabled() and _entry_points() is not None


class _LowRankCross(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x0: Tensor, *params: Tensor) -> Tensor:  # type: ignore[override]
        fns, sfx, threads = _entry_points(), _SUFFIX[x0.dtype], torch.get_num_threads()
        x0 = x0.contiguous()
        xs, vxs, zs = [], [], []
        x = x0  # (B, N)
        for w, v, b in zip(params[0::3], params[1::3], params[2::3]):
            vx = torch.mm(x, v.t())  # (B, K)
            z = torch.addmm(b.view(-1), vx, w.t())  # (B, N)
            out = torch.empty_like(x0)
            fns[f"forward_{sfx}"](out.data_ptr(), x0.data_ptr(), z.data_ptr(), x.data_ptr(), x0.numel(),  # type: ignore[index]
                                  threads)
            xs.append(x)
            vxs.append(vx)
            zs.append(z)
            x = out
        ctx.save_for_backward(x0, *xs, *vxs, *zs, *params)
        ctx.layers = len(xs)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        L = ctx.layers
        saved = ctx.saved_tensors
        x0, xs, vxs, zs, params = saved[0], saved[1 : 1 + L], saved[1 + L : 1 + 2 * L], saved[1 + 2 * L : 1 + 3 * L], \
            saved[1 + 3 * L :]
        fns, sfx, threads = _entry_points(), _SUFFIX[x0.dtype], torch.get_num_threads()
        g = grad.contiguous()
        acc = torch.empty_like(x0)  # x_0's gradient, its parts added in autograd's order
        grads: list[Tensor | None] = [None] * (3 * L)
        for layer in reversed(range(L)):
            w, v = params[3 * layer], params[3 * layer + 1]
            dz = torch.empty_like(x0)
            mode = (_IDENTITY if L == 1 else _ADD_IDENTITY) if layer == 0 else (_ASSIGN if layer == L - 1 else _ADD)
            fns[f"backward_{sfx}"](dz.data_ptr(), acc.data_ptr(), g.data_ptr(), x0.data_ptr(),  # type: ignore[index]
                                   zs[layer].data_ptr(), x0.numel(), mode, threads)
            dvx = dz.mm(w)  # (B, K)
            grads[3 * layer] = dz.t().mm(vxs[layer])  # (N, K)
            grads[3 * layer + 1] = dvx.t().mm(xs[layer])  # (K, N)
            grads[3 * layer + 2] = dz.sum(0).view(-1, 1)  # (N, 1)
            dx = dvx.mm(v)  # (B, N): x_l's gradient through V_l
            if layer == 0:
                acc.add_(dx)
            else:
                g = dx.add_(g)  # x_l's gradient: its identity path and V_l's
        return (acc, *grads)


def native_low_rank_cross(x0: Tensor, kernels_: Sequence[tuple[Tensor, Tensor, Tensor]]) -> Tensor | None:
    """The low-rank cross net over ``x0`` (B, N) with per-layer ``(W [N, K], V [K, N], b [N, 1])`` as one node, or
    None where it does not apply."""
    params = [p for layer in kernels_ for p in layer]
    tensors = (x0, *params)
    if (x0.dim() != 2 or not kernels.eager_cpu(*tensors) or not torch.is_grad_enabled()
            or not any(t.requires_grad for t in tensors) or not kernel_available()):
        return None
    return _LowRankCross.apply(x0, *params)
