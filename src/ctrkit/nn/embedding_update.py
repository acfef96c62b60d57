"""The small tables' per-step work as one native kernel (``csrc/embedding_update.cpp``): the lookup's dense gradient
and LazyAdam's update with the touched-row L2.

- :func:`scatter_rows` / :func:`scatter_bags` — the dense [R, D] gradient of :mod:`ctrkit.nn.embedding_grad`'s
  lookups, ``dW[ids[i]] += s_i dY[bag(i)]`` in id order: one loop over the ids instead of ATen's ``index_add_``
  (one TensorIterator per id, ~1.6 ns per float on this CPU) and, for bags, the gather, the division and the
  product with the per-sample weights done on the way (no (n, D) temporaries).
- :func:`lazy_adam_rows_` — :class:`~ctrkit.training.optim.LazyAdam`'s update of a table with a dense gradient, the
  touched-row L2 first: the touched rows found once, each visited once (the torch path computes every row of the
  table with ~15 whole-table operations and keeps the touched ones by a 0 / 1 mask, and finds the rows twice).

Every result is the float the torch path gives, with one exception: the same operations in the same order, the
file built with ``-ffp-contract=off`` (no fused multiply-adds). The exception is LazyAdam's ``sqrt``: the kernel's is
the CPU's instruction (correctly rounded), ATen's vectorised one (torch 2.13, AVX-512) is one unit in the last place
off for ~0.7 % of values, so the weights differ from the torch path's by such roundings. Tested bit for bit against
the torch path with a correctly rounded sqrt, and within a few ulp of ATen's (tests/nn/test_embedding_update.py).
Each function returns None / False where the kernel does not apply (no kernel built: no compiler, or
``CTRKIT_NATIVE_KERNELS=0``; not the CPU; not float32 / float64; a layout other than contiguous): the caller takes
its torch path then.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import Tensor

from ctrkit.errors import LayerConfigError
from ctrkit.nn import kernels

__all__ = ["kernel_available", "lazy_adam_rows_", "scatter_bags", "scatter_rows"]

_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_FLAGS = ("-ffp-contract=off", "-fno-math-errno")  # torch's rounding; sqrt without the errno branch, vectorised


@functools.lru_cache(maxsize=1)
def _entry_points() -> dict[str, ctypes._CFuncPtr] | None:
    p, i, i64, f64 = kernels.PTR, kernels.I32, kernels.I64, ctypes.c_double
    return kernels.bind("embedding_update", {
        "rows": ("ctrkit_scatter_rows", [p, i64, i64, p, p, i64], i),
        "bags": ("ctrkit_scatter_bags", [p, i64, i64, p, p, p, i64, i, p], i),
        "adam": ("ctrkit_lazy_adam_rows", [p, p, p, p, i64, i64, f64, f64, f64, f64, f64, i, i], i64)}, _FLAGS)


def kernel_available() -> bool:
    """Whether the native kernel is built and loaded (building it at the first call)."""
    return kernels.enabled() and _entry_points() is not None


def _applies(*tensors: Tensor) -> bool:
    t0 = tensors[0]
    return (t0.dtype in _SUFFIX and all(t.device.type == "cpu" and t.dtype == t0.dtype for t in tensors)
            and kernel_available())


def _ids(ids: Tensor) -> Tensor:
    return ids.to(torch.int64).contiguous()


def _check(rc: int, what: str, rows: int) -> None:
    if rc != 0:  # the lookup's forward already checked the ids, so only a caller's bug gets here
        raise LayerConfigError(f"{what}: an id outside the table's {rows} rows; the forward lookup should have refused it")


def scatter_rows(rows: int, src: Tensor, ids: Tensor) -> Tensor | None:
    """``zeros(rows, D).index_add_(0, ids, src)`` for ``src`` (n, D), ``ids`` (n,), or None (the kernel does not
    apply)."""
    if not _applies(src):
        return None
    src, ids = src.contiguous(), _ids(ids)
    d = src.shape[1]
    dw = src.new_zeros(rows, d)
    rc = _entry_points()[f"rows_{_SUFFIX[src.dtype]}"](  # type: ignore[index]
        dw.data_ptr(), rows, d, src.data_ptr(), ids.data_ptr(), ids.numel())
    _check(rc, "scatter_rows", rows)
    return dw


def scatter_bags(rows: int, grad: Tensor, ids: Tensor, offsets: Tensor, mode: str,
                 per_sample_weights: Tensor | None) -> Tensor | None:
    """The [rows, D] gradient of ``F.embedding_bag`` (``offsets`` with the last one, ``mode`` "sum" | "mean") from
    ``grad`` (n_bags, D): ``dW[ids[i]] += (dY[bag(i)] / |bag|) * w_i`` as embedding_grad's torch path rounds it, or
    None (the kernel does not apply)."""
    psw = per_sample_weights
    if not _applies(grad, *(() if psw is None else (psw,))):
        return None
    grad, ids, offsets = grad.contiguous(), _ids(ids), _ids(offsets)
    psw = None if psw is None else psw.contiguous()
    d = grad.shape[1]
    dw = grad.new_zeros(rows, d)
    rc = _entry_points()[f"bags_{_SUFFIX[grad.dtype]}"](  # type: ignore[index]
        dw.data_ptr(), rows, d, grad.data_ptr(), ids.data_ptr(), offsets.data_ptr(), offsets.numel() - 1,
        int(mode == "mean"), None if psw is None else psw.data_ptr())
    _check(rc, "scatter_bags", rows)
    return dw


def lazy_adam_rows_(p: Tensor, grad: Tensor, m: Tensor, v: Tensor, l2: float, beta1: float, beta2: float,
                    eps: float, step_size: float, maximize: bool) -> bool:
    """LazyAdam's step on the touched rows of table ``p`` [R, D] with dense gradient ``grad`` and moments ``m``,
    ``v`` (all updated in place; ``grad`` gets the touched-row L2 ``l2 * W_r`` added first, as
    :func:`~ctrkit.training.optim.add_touched_row_l2_` leaves it). False where the kernel does not apply (nothing
    changed then)."""
    if p.dim() != 2 or not _applies(p, grad, m, v) or not all(t.is_contiguous() for t in (p, grad, m, v)):
        return False
    _entry_points()[f"adam_{_SUFFIX[p.dtype]}"](  # type: ignore[index]
        p.data_ptr(), grad.data_ptr(), m.data_ptr(), v.data_ptr(), p.shape[0], p.shape[1], float(l2),
        1 - beta1, 1 - beta2, float(eps), -step_size, int(maximize), torch.get_num_threads())
    torch.autograd.graph.increment_version([p, grad, m, v])  # as torch's in-place ops do: stale saved tensors fail
    return True
