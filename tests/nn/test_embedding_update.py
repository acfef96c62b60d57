"""The small tables' native kernel (nn/embedding_update.py, csrc/embedding_update.cpp) against the torch path it
replaces, bit for bit: the lookups' dense gradients (index_add_) and LazyAdam with the touched-row L2 over several
steps; and the torch path where the kernel does not apply."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ctrkit.nn import embedding_update
from ctrkit.nn.embedding_grad import bag_rows, gather_rows
from ctrkit.training.optim import LazyAdam, OptimizerSet

pytestmark = pytest.mark.skipif(not embedding_update.kernel_available(), reason="no native kernel on this machine")
DTYPES = (torch.float32, torch.float64)


@pytest.fixture
def torch_path(monkeypatch):
    """A context that runs its body with native kernels off (CTRKIT_NATIVE_KERNELS=0)."""
    class Off:
        def __enter__(self):
            monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "0")

        def __exit__(self, *exc):
            monkeypatch.delenv("CTRKIT_NATIVE_KERNELS")
    return Off()


def _node(out: torch.Tensor) -> str:
    """The name of the autograd node under ``out``'s view."""
    return type(out.grad_fn.next_functions[0][0]).__name__


def _ids(g: torch.Generator, n: int, rows: int) -> torch.Tensor:
    ids = torch.randint(0, rows, (n,), generator=g)
    ids[: n // 4] = ids[0]  # many repeats of one id (a padding-like hot row)
    return ids


def _bags(g: torch.Generator, bags: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.randint(0, 5, (bags,), generator=g)  # empty bags included
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return _ids(g, int(offsets[-1]), rows), offsets


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_rows_is_index_add(dtype):
    g = torch.Generator().manual_seed(0)
    ids, src = _ids(g, 700, 50), torch.randn(700, 17, generator=g, dtype=dtype)
    want = torch.zeros(50, 17, dtype=dtype).index_add_(0, ids, src)
    assert torch.equal(embedding_update.scatter_rows(50, src, ids), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("mode", "weighted"), [("sum", False), ("sum", True), ("mean", False)])
def test_bag_gradient_same_floats_as_torch_path(dtype, mode, weighted, torch_path):
    g = torch.Generator().manual_seed(1)
    ids, offsets = _bags(g, 300, 40)
    psw = torch.rand(ids.numel(), generator=g, dtype=dtype) if weighted else None
    up = torch.randn(300, 16, generator=g, dtype=dtype)
    grads = []
    for native in (True, False):
        w = torch.randn(40, 16, generator=torch.Generator().manual_seed(2), dtype=dtype, requires_grad=True)
        if native:
            bag_rows(w, ids, offsets, mode, psw).backward(up)
        else:
            with torch_path:
                bag_rows(w, ids, offsets, mode, psw).backward(up)
        grads.append(w.grad)
    assert torch.equal(grads[0], grads[1])
    ref = torch.randn(40, 16, generator=torch.Generator().manual_seed(2), dtype=dtype, requires_grad=True)
    F.embedding_bag(ids, ref, offsets, mode=mode, per_sample_weights=psw, include_last_offset=True).backward(up)
    torch.testing.assert_close(grads[0], ref.grad)  # and the function torch differentiates (summed in another order)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_gradient_same_floats_as_index_select(dtype):
    g = torch.Generator().manual_seed(3)
    ids, up = _ids(g, 2 * 256, 30).view(2, 256), torch.randn(2, 256, 17, generator=g, dtype=dtype)
    w = torch.randn(30, 17, generator=g, dtype=dtype, requires_grad=True)
    out = gather_rows(w, ids)
    assert "GatherRows" in _node(out)
    out.backward(up)
    ref = w.detach().clone().requires_grad_()
    ref.index_select(0, ids.reshape(-1)).view(2, 256, 17).backward(up)
    assert torch.equal(w.grad, ref.grad)
    assert torch.equal(out, ref.detach()[ids])


def _lazy_adam_run(dtype, l2: float, maximize: bool, steps: int, layout: str = "dense") -> list[torch.Tensor]:
    """Weights, moments and last gradient after ``steps`` LazyAdam steps behind an OptimizerSet with embedding L2:
    batches of repeated ids over 60 of 80 rows (rows 60..79 never touched), one step whose batch misses row 0."""
    g = torch.Generator().manual_seed(4)
    w = torch.nn.Parameter(torch.randn(80, 16, generator=g, dtype=dtype) * 0.1)
    opt = OptimizerSet(None, LazyAdam([w], lr=0.05, maximize=maximize), embedding_l2=l2)
    for step in range(steps):
        ids, offsets = _bags(g, 64, 60)
        if step == 1:
            ids = ids.clamp(min=1)  # row 0 not touched in this step, touched in others
        up = torch.randn(64, 16, generator=g, dtype=dtype)
        opt.zero_grad()
        out = bag_rows(w, ids, offsets, "mean") if layout == "dense" else F.embedding_bag(
            ids, w, offsets, mode="mean", include_last_offset=True, sparse=True)
        out.backward(up)
        opt.step()
    state = opt.sparse.state[w]
    return [w.detach().clone(), state["exp_avg"].clone(), state["exp_avg_sq"].clone(), w.grad.to_dense().clone()]


@pytest.fixture
def ieee_sqrt(monkeypatch):
    """``Tensor.sqrt_`` correctly rounded (numpy's, the CPU's instruction) in place of ATen's vectorised sqrt, which
    is off by one unit in the last place for ~0.7 % of values (the kernel uses the instruction)."""
    def sqrt_(self: torch.Tensor) -> torch.Tensor:
        return self.copy_(torch.from_numpy(np.sqrt(self.numpy())))
    monkeypatch.setattr(torch.Tensor, "sqrt_", sqrt_)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("l2", [0.0, 3e-3])
@pytest.mark.parametrize("maximize", [False, True])
def test_lazy_adam_with_l2_same_floats_as_torch_path(dtype, l2, maximize, torch_path, ieee_sqrt, monkeypatch):
    """Bit for bit against the torch path with a correctly rounded sqrt; within rounding of the unchanged one."""
    for steps in (1, 5):  # bias correction at step 1 and later
        native = _lazy_adam_run(dtype, l2, maximize, steps)
        with torch_path:
            ref = _lazy_adam_run(dtype, l2, maximize, steps)
        for a, b in zip(native, ref):
            assert torch.equal(a, b)
        w0 = torch.randn(80, 16, generator=torch.Generator().manual_seed(4), dtype=dtype) * 0.1
        assert torch.equal(native[0][60:], w0[60:]) and not native[1][60:].any()  # never touched: unchanged
        assert not torch.equal(native[0][:60], w0[:60])
    monkeypatch.undo()  # ATen's sqrt again: the same up to its last-place errors
    with torch_path:
        aten = _lazy_adam_run(dtype, l2, maximize, 5)
    eps = torch.finfo(dtype).eps  # a few units in the last place of the values, or of the updates (lr 0.05) near 0
    for a, b in zip(native, aten):
        torch.testing.assert_close(a, b, rtol=4 * eps, atol=5 * 0.05 * 4 * eps)


def test_lazy_adam_dense_kernel_matches_sparse_gradient_path():
    """The dense gradient through the kernel and a sparse one through the row-gather path: the same weights up to
    the order the row gradients are summed in."""
    dense = _lazy_adam_run(torch.float64, 3e-3, False, 4, "dense")
    sparse = _lazy_adam_run(torch.float64, 3e-3, False, 4, "sparse")
    for a, b in zip(dense[:3], sparse[:3]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_kernels_off_takes_the_torch_path(torch_path):
    src, ids = torch.randn(5, 4), torch.tensor([0, 1, 1, 2, 0])
    p = torch.zeros(3, 4)
    with torch_path:
        assert not embedding_update.kernel_available()
        assert embedding_update.scatter_rows(3, src, ids) is None
        assert not embedding_update.lazy_adam_rows_(p, src[:3].clone(), p.clone(), p.clone(), l2=0.0, beta1=0.9,
                                                    beta2=0.999, eps=1e-8, step_size=0.1, maximize=False)
        w = torch.randn(3, 4, requires_grad=True)
        assert _node(gather_rows(w, ids)) == "IndexSelectBackward0"
    assert embedding_update.scatter_rows(3, src.half(), ids) is None  # other dtypes: the torch path
    grad = torch.randn(4, 3).t()  # not contiguous: the torch path, the tensors untouched
    assert not embedding_update.lazy_adam_rows_(p, grad, p.clone(), p.clone(), l2=0.0, beta1=0.9, beta2=0.999,
                                                eps=1e-8, step_size=0.1, maximize=False)
    assert not p.any()
