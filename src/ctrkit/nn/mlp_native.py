"""A stack of ``Linear -> ReLU`` layers as one autograd node, its backward epilogue a native kernel
(``csrc/relu_bias_grad.cpp``).

Autograd's graph of ``relu(addmm(b, x, W^T))`` runs, per layer and step, a ``threshold_backward`` (reads dY and Y,
writes a fresh dZ), a ``sum`` over the rows for the bias gradient (reads dZ again), two matmuls, and three nodes
between them. Here, per layer in reverse:

    dZ  = dY ⊙ [Y > 0]          one native pass: written in place where dY is this node's own matmul output,
    db  = Σ_rows dZ              and the column sums taken on the same pass
    dW  = dZ^T X                 the matmul autograd runs (``dZ.t().mm(X)``)
    dX  = dZ W                   (``dZ.mm(W)``; for a column-major X ``(W^T dZ^T)^T``, as autograd's addmm backward
                                 computes it then); skipped for the first layer when the input needs no gradient

Each product is autograd's call in autograd's orientation. Transposing them (C^T = B^T A^T) was faster for odd widths
on one thread and gave the same floats on the CPU it was measured on, but not on an AMD EPYC (2026-11-27), where MKL
sums the two orientations differently; so the node keeps autograd's orientation on every CPU.

The forward is the plain one (``F.linear`` = addmm with the bias, then ``relu_`` in place), keeping every layer's
input for the backward, as autograd does. Every value is the float the plain graph gives, bit for bit: the matmuls
are the same calls, the mask is a select, and the kernel's column sums follow ATen's cascade for a contiguous sum
over dim 0 (checked against ``torch.sum`` at several widths, batch sizes and thread counts in
tests/nn/test_mlp_native.py). The kernel sums a layer's columns only where ATen's order is the one it reproduces:
AVX-512 builds (torch's CPU capability "AVX512") and widths that are whole blocks of four vectors (64 floats /
32 doubles); other widths and CPUs run ``threshold_backward`` + ``sum`` inside the same node.

:func:`relu_mlp` returns None where the node does not apply (not the CPU; not float32 / float64; autocast on; no
gradient needed; compiling / exporting; no kernel built, or ``CTRKIT_NATIVE_KERNELS=0``) or does not pay (fewer than
``MIN_KERNEL_ELEMENTS`` rows x kernel widths: the zoo's batches of 256 through 64-32 layers ran 17 % slower as one
node): the caller runs its layers one by one then.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ctrkit.errors import LayerConfigError
from ctrkit.nn import kernels

__all__ = ["kernel_available", "relu_bias_grad", "relu_mlp"]

_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
MIN_KERNEL_ELEMENTS = 1 << 20  # rows x the kernel's widths, summed over the layers: below, the layers one by one
_VECTOR_BYTES = {"AVX512": 64}  # ATen's Vectorized<T> width per CPU capability: the sums are reproduced for these


@functools.lru_cache(maxsize=1)
def _entry_points() -> dict[str, ctypes._CFuncPtr] | None:
    p, i, i64 = kernels.PTR, kernels.I32, kernels.I64
    return kernels.bind("relu_bias_grad", {"grad": ("ctrkit_relu_bias_grad", [p, p, i64, p, i64, i64, p, i, i], i)},
                        ("-ffp-contract=off",))


def kernel_available() -> bool:
    """Whether the native kernel is built and loaded (building it at the first call)."""
    return kernels.enabled() and _entry_points() is not None


@functools.lru_cache(maxsize=1)
def _vector_bytes() -> int | None:
    return _VECTOR_BYTES.get(torch.backends.cpu.get_cpu_capability())


def _kernel_width_ok(t: Tensor) -> bool:
    return _width_ok(t.shape[1], t.element_size()) and kernel_available()


def _width_ok(width: int, element_size: int) -> bool:
    vb = _vector_bytes()
    return vb is not None and width % (4 * vb // element_size) == 0


def _pays(rows: int, linears: Sequence[torch.nn.Linear], relu: Sequence[bool], element_size: int) -> bool:
    """Whether the node is worth its Python overhead: the kernel's (rows, width) passes hold at least
    ``MIN_KERNEL_ELEMENTS`` values. Measured (one thread, forward + backward against the layers one by one): DLRM's
    13-512-256-16 at 4,096 rows 1.11x faster, 432-512-256 at 2,048 rows 1.007x, at 1,024 rows even; 208-64-32 at 256
    rows (no kernel width) 0.83x, 16-256-128 at 1,024 rows 0.98x."""
    widths = [lin.out_features for lin, r in zip(linears, relu) if r and _width_ok(lin.out_features, element_size)]
    return rows * sum(widths) >= MIN_KERNEL_ELEMENTS and kernel_available()


def relu_bias_grad(grad: Tensor, y: Tensor, *, in_place: bool) -> tuple[Tensor, Tensor]:
    """``(dZ, db)`` of ``Y = relu(Z)``, ``Z = X W^T + b``: ``dZ = grad ⊙ [Y > 0]`` (into ``grad`` itself when
    ``in_place``) and ``db = dZ.sum(0)``, both (B, N) / (N,) as torch's ``threshold_backward`` + ``sum`` give them."""
    if y.dim() != 2 or grad.shape != y.shape or not y.is_contiguous():
        raise LayerConfigError(f"relu_bias_grad needs grad and Y of one (B, N) shape, Y contiguous; got "
                               f"{tuple(grad.shape)} and {tuple(y.shape)} (contiguous {y.is_contiguous()})")
    if grad.dtype == y.dtype and grad.stride(1) == 1 and y.shape[0] > 0 and _kernel_width_ok(y):
        if in_place and not grad.is_contiguous():
            in_place = False
        dz = grad if in_place else torch.empty_like(y)
        db = y.new_empty(y.shape[1])
        rc = _entry_points()[f"grad_{_SUFFIX[y.dtype]}"](  # type: ignore[index]
            dz.data_ptr(), grad.data_ptr(), grad.stride(0), y.data_ptr(), y.shape[0], y.shape[1], db.data_ptr(),
            _vector_bytes() // y.element_size(), torch.get_num_threads())  # type: ignore[operator]
        if rc != 0:
            raise LayerConfigError(f"relu_bias_grad: the kernel refused shape {tuple(y.shape)} (code {rc})")
        return dz, db
    dz = torch.ops.aten.threshold_backward(grad, y, 0)
    return dz, dz.sum(0)


class _ReluMLP(torch.autograd.Function):
    """``h_{l+1} = act_l(h_l W_l^T + b_l)``, act_l = ReLU where ``relu[l]`` else identity; one node for the stack."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, relu: tuple[bool, ...], *params: Tensor) -> Tensor:  # type: ignore[override]
        ws, bs = params[0::2], params[1::2]
        acts = [x]
        for w, b, r in zip(ws, bs, relu):
            h = F.linear(acts[-1], w, b)  # (B, N_l): addmm, as nn.Linear
            acts.append(h.relu_() if r else h)  # in place, as MLP's nn.ReLU(inplace=True)
        # the output is kept only where its ReLU's mask needs it (autograd keeps no Linear output either): a caller
        # may change an output without a ReLU in place
        ctx.save_for_backward(*acts[:-1], acts[-1] if relu[-1] else None, *ws)
        ctx.relu = relu
        return acts[-1]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        L = len(ctx.relu)
        saved = ctx.saved_tensors
        acts, ws = saved[: L + 1], saved[L + 1 :]
        grads: list[Tensor | None] = [None] * (2 * L)
        g, owned = grad, False
        for layer in reversed(range(L)):
            if ctx.relu[layer]:
                dz, db = relu_bias_grad(g, acts[layer + 1], in_place=owned)
            else:
                dz, db = g, g.sum(0)
            x, w = acts[layer], ws[layer]
            if ctx.needs_input_grad[2 + 2 * layer]:  # (N, K)
                grads[2 * layer] = dz.t().mm(x)
            grads[2 * layer + 1] = db if ctx.needs_input_grad[3 + 2 * layer] else None
            if layer == 0 and not ctx.needs_input_grad[0]:
                g = None  # type: ignore[assignment]
                break
            # (B, K), this node's own buffer from here down; where X is column-major as (W^T dZ^T)^T, as autograd's
            # addmm backward computes it then
            colmajor = x.stride(0) == 1 and x.stride(1) == x.shape[0]
            g, owned = (w.t().mm(dz.t()).t() if colmajor else dz.mm(w)), True
        return (g, None, *grads)


def relu_mlp(x: Tensor, linears: Sequence[torch.nn.Linear], relu: Sequence[bool]) -> Tensor | None:
    """The stack ``linears`` (each followed by a ReLU where ``relu`` says so) on ``x`` (B, K) as one node, or None
    where the node does not apply (the caller runs the layers itself)."""
    params = [p for lin in linears for p in (lin.weight, lin.bias)]
    if (x.dim() != 2 or not torch.is_grad_enabled() or any(p is None for p in params)
            or not kernels.eager_cpu(x, *params)  # type: ignore[arg-type]
            or not (x.requires_grad or any(p.requires_grad for p in params))  # type: ignore[union-attr]
            or not _pays(x.shape[0], linears, relu, x.element_size())):
        return None
    return _ReluMLP.apply(x, tuple(bool(r) for r in relu), *params)
