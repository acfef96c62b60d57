"""DotInteraction's training node with its copies as a native kernel (``csrc/pair_dots.cpp``).

``out = [dense | flat(C C^T)[:, i < j]]`` (B, D + P), C (B, n, D), P = n(n-1)/2. The matmuls are torch's (``bmm``
forward and backward, as :class:`ctrkit.nn.interaction._PairDots` runs them); what the kernel replaces are the copies
around them. Forward: the pairs read from the Gram matrix and ``dense`` written straight into the output rows
(instead of an ``index_select`` over the (B, n²) Gram matrix and a ``cat``). Backward: the pair gradients mirrored
into both triangles of the (B, n, n) matrix G (instead of a ``cat`` with a zero column and an ``index_select``),
then ``dC = G C``; ``dense``'s gradient is the output gradient's first D columns. Copies only: every value is the
float the torch-op node gives (tests/nn/test_pair_dots_native.py checks it bit for bit).

:func:`native_pair_dots` returns None where the kernel does not apply (no kernel built: no compiler or
``CTRKIT_NATIVE_KERNELS=0``; not the CPU; not float32 / float64; autocast on): the caller takes the torch-op node.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch
from torch import Tensor

from ctrkit.nn import kernels

__all__ = ["kernel_available", "native_pair_dots"]

_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


@functools.lru_cache(maxsize=1)
def _entry_points() -> dict[str, ctypes._CFuncPtr] | None:
    p, i, i64 = kernels.PTR, kernels.I32, kernels.I64
    return kernels.bind("pair_dots", {"forward": ("ctrkit_pairs_forward", [p, i64, p, i64, p, i64, i64, i], None),
                                      "backward": ("ctrkit_pairs_backward", [p, p, i64, i64, i64, i64, i64, i], None)})


def kernel_available() -> bool:
    """Whether the native kernel is built and loaded (building it at the first call)."""
    return kernels.enabled() and _entry_points() is not None


class _PairDotsNative(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, combined: Tensor, dense: Tensor | None) -> Tensor:  # type: ignore[override]
        c = combined.contiguous()  # (B, n, D)
        B, n, D = c.shape
        gram = torch.bmm(c, c.transpose(1, 2))  # (B, n, n)
        d = 0 if dense is None else D
        out = c.new_empty(B, d + n * (n - 1) // 2)  # (B, [D +] P)
        dn = None if dense is None else dense.contiguous()
        _entry_points()[f"forward_{_SUFFIX[c.dtype]}"](  # type: ignore[index]
            out.data_ptr(), out.stride(0), None if dn is None else dn.data_ptr(), d, gram.data_ptr(), B, n,
            torch.get_num_threads())
        ctx.save_for_backward(c)
        ctx.d = d
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor | None]:  # type: ignore[override]
        (c,) = ctx.saved_tensors
        B, n, _ = c.shape
        sym = c.new_empty(B, n, n)  # (B, n, n) symmetric, zero diagonal; grad read in its own layout (row or column
        _entry_points()[f"backward_{_SUFFIX[c.dtype]}"](  # type: ignore[index]  # major: the top MLP's may be either)
            sym.data_ptr(), grad.data_ptr(), grad.stride(0), grad.stride(1), ctx.d, B, n, torch.get_num_threads())
        return torch.bmm(sym, c), (grad[:, : ctx.d] if ctx.d else None)  # (B, n, D), (B, D)


def native_pair_dots(combined: Tensor, dense: Tensor | None) -> Tensor | None:
    """``[dense | pairs]`` (B, [D +] P) of ``combined`` (B, n, D) as the native node, or None where it does not
    apply (the caller runs the torch-op node)."""
    tensors = (combined,) if dense is None else (combined, dense)
    if not kernels.eager_cpu(*tensors) or not kernel_available():
        return None
    return _PairDotsNative.apply(combined, dense)
