"""The MLP's Linear -> ReLU stack as one autograd node (nn/mlp_native.py, csrc/relu_bias_grad.cpp) against the
layers run one by one (autograd's addmm / threshold_backward / sum), bit for bit: the kernel's mask and column sums
against torch's ops at kernel and non-kernel widths, odd batch sizes and two thread counts; whole MLPs' outputs and
gradients; gradcheck; and where the node does not apply (other dtypes and devices, autocast, no gradient, layers
other than Linear / ReLU, hooks)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ctrkit.nn import mlp_native
from ctrkit.nn.mlp import MLP

DTYPES = (torch.float32, torch.float64)
needs_kernel = pytest.mark.skipif(not mlp_native.kernel_available() or mlp_native._vector_bytes() is None,
                                  reason="no native kernel, or a CPU whose sum order the kernel does not reproduce")


@pytest.fixture(autouse=True)
def node_at_any_size(monkeypatch):
    """The node for these tests' small shapes too (it runs from MIN_KERNEL_ELEMENTS; test_size_threshold checks that)."""
    monkeypatch.setattr(mlp_native, "MIN_KERNEL_ELEMENTS", 0)


@pytest.fixture(params=[1, 2, 4], ids=["1 thread", "2 threads", "4 threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _reference(grad: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dz = torch.ops.aten.threshold_backward(grad, y, 0)
    return dz, dz.sum(0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 7, 33, 4097])
@pytest.mark.parametrize("cols", [16, 64, 100, 256, 512])
def test_relu_bias_grad_equals_torch(dtype, rows, cols, threads):
    g = torch.Generator().manual_seed(rows * cols)
    y = torch.randn(rows, cols, generator=g, dtype=dtype).relu_()
    y[0, : cols // 2] = float("nan")  # NaN lets the gradient through, as threshold_backward does
    grad = torch.randn(rows, cols, generator=g, dtype=dtype) * 100
    dz_ref, db_ref = _reference(grad, y)
    dz, db = mlp_native.relu_bias_grad(grad, y, in_place=False)
    assert torch.equal(dz, dz_ref) and torch.equal(db, db_ref)
    assert dz.data_ptr() != grad.data_ptr()
    own = grad.clone()
    dz, db = mlp_native.relu_bias_grad(own, y, in_place=True)
    assert torch.equal(dz, dz_ref) and torch.equal(db, db_ref)
    wide = torch.randn(rows, cols + 5, generator=g, dtype=dtype)  # rows cols + 5 apart: a column slice's layout
    wide[:, :cols] = grad
    dz, db = mlp_native.relu_bias_grad(wide[:, :cols], y, in_place=False)  # read with its row stride
    assert torch.equal(dz, dz_ref) and torch.equal(db, db_ref) and torch.equal(wide[:, :cols], grad)


@needs_kernel
def test_kernel_widths():
    """The kernel takes whole blocks of four AVX-512 vectors (64 floats / 32 doubles); other widths torch's ops."""
    f32, f64 = torch.empty(2, 64), torch.empty(2, 32, dtype=torch.float64)
    assert mlp_native._kernel_width_ok(f32) and mlp_native._kernel_width_ok(f64)
    assert not mlp_native._kernel_width_ok(torch.empty(2, 100)) and not mlp_native._kernel_width_ok(torch.empty(2, 16))


def _pair(in_features: int, hidden: list[int], dtype: torch.dtype, **kw) -> tuple[MLP, MLP]:
    torch.manual_seed(0)
    a = MLP(in_features, hidden, **kw).to(dtype)
    b = MLP(in_features, hidden, **kw).to(dtype)
    b.load_state_dict(a.state_dict())
    b._relu_stack = None  # the layers one by one
    return a, b


def _grads(m: nn.Module, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = x.detach().clone().requires_grad_(x.requires_grad)
    out = m(x)
    (out * weight).sum().backward()
    return out.detach(), [p.grad for p in m.parameters()] + ([x.grad] if x.requires_grad else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [5, 513])
@pytest.mark.parametrize("final_activation", [True, False])
@pytest.mark.parametrize("input_grad", [True, False])
@pytest.mark.parametrize("in_features", [13, 67, 64])  # odd and even K
def test_node_equals_layers(dtype, rows, final_activation, input_grad, in_features, threads):
    node, layers = _pair(in_features, [128, 64, 16], dtype, final_activation=final_activation)
    assert node._relu_stack == (True, True, final_activation)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=g, dtype=dtype).requires_grad_(input_grad)
    w = torch.randn(rows, 16, generator=g, dtype=dtype)
    out_n, grads_n = _grads(node, x, w)
    out_l, grads_l = _grads(layers, x, w)
    assert torch.equal(out_n, out_l)
    assert len(grads_n) == len(grads_l) and all(torch.equal(a, b) for a, b in zip(grads_n, grads_l))
    y = torch.ones(1, requires_grad=True)
    assert type(node(x * y).grad_fn).__name__ == "_ReluMLPBackward"


def test_two_threads_keep_autograds_orientation():
    """MKL sums dZ^T X and (X^T dZ)^T differently at K = 13, N = 512 (B >= 1,000) on two threads (and on one, on an
    AMD EPYC): the node gives autograd's floats there too."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        node, layers = _pair(13, [512, 64], torch.float32)
        x, w = torch.randn(2048, 13), torch.randn(2048, 64)
        res = [_grads(m, x, w)[1] for m in (node, layers)]
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*res))


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_column_major_input(threads):
    """A column-major input's gradient is computed as autograd's addmm backward computes it then, (W^T dZ^T)^T."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        node, layers = _pair(96, [128, 64], torch.float32)
        x = torch.randn(96, 1500).t().requires_grad_()  # (B, K) column-major
        w = torch.randn(1500, 64)
        res = []
        for m in (node, layers):
            x.grad = None
            (m(x) * w).sum().backward()
            res.append([x.grad, *(p.grad for p in m.parameters())])
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*res))


def test_shared_upstream_gradient_is_not_overwritten():
    """An output read twice gets one gradient tensor from autograd's add: the node must not mask it in place."""
    node, layers = _pair(8, [64, 64], torch.float32)
    x = torch.randn(9, 8, requires_grad=True)
    res = []
    for m in (node, layers):
        out = m(x)
        other = out * 1.0
        (out + other).sum().backward()
        res.append([p.grad.clone() for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*res))


def test_output_without_relu_may_change_in_place():
    node, layers = _pair(6, [64, 8], torch.float32, final_activation=False)
    x = torch.randn(4, 6)
    res = []
    for m in (node, layers):
        out = m(x)
        out.mul_(2.0)  # an in-place change of the last Linear's output: fine for autograd's layers, so here too
        out.sum().backward()
        res.append([p.grad for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*res))


def test_gradcheck():
    torch.manual_seed(1)
    m = MLP(5, [32, 32], final_activation=False).double()  # 32 doubles: a width the kernel takes
    params = [p.detach().clone().requires_grad_() for lin in m.layers if isinstance(lin, nn.Linear)
              for p in (lin.weight, lin.bias)]
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *ps: mlp_native._ReluMLP.apply(x, m._relu_stack, *ps), (x, *params))


def test_where_the_node_does_not_apply():
    m = MLP(4, [64, 64])
    lin = [x for x in m.layers if isinstance(x, nn.Linear)]
    x = torch.randn(3, 4)
    assert mlp_native.relu_mlp(x, lin, m._relu_stack) is not None  # the weights need gradients
    with torch.no_grad():
        assert mlp_native.relu_mlp(x, lin, m._relu_stack) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mlp_native.relu_mlp(x, lin, m._relu_stack) is None
    assert mlp_native.relu_mlp(x.bfloat16(), lin, m._relu_stack) is None  # dtype other than the weights'
    mb = MLP(4, [64]).bfloat16()
    assert mlp_native.relu_mlp(x.bfloat16(), [mb.layers[0]], mb._relu_stack) is None  # bf16: not float32/64
    mm = MLP(4, [64]).to("meta")  # another device
    assert mlp_native.relu_mlp(x.to("meta"), [mm.layers[0]], mm._relu_stack) is None
    for kw in ({"dropout": 0.1}, {"batch_norm": True}, {"activation": "tanh"}):
        assert MLP(4, [8], **kw)._relu_stack is None
    seen = []
    m.layers[0].register_forward_hook(lambda mod, i, o: seen.append(o.shape))
    out = m(x)
    assert seen == [(3, 64)] and type(out.grad_fn).__name__ != "_ReluMLPBackward"


@needs_kernel
def test_size_threshold_and_kernels_off(monkeypatch):
    """The node where rows x kernel widths reach MIN_KERNEL_ELEMENTS; the layers one by one below it, and with
    CTRKIT_NATIVE_KERNELS=0."""
    monkeypatch.undo()
    m = MLP(3, [64, 64, 16])  # kernel widths 64 + 64 per row (16 is not one): 128 values a row
    rows = mlp_native.MIN_KERNEL_ELEMENTS // 128
    assert type(m(torch.randn(rows, 3)).grad_fn).__name__ == "_ReluMLPBackward"
    assert type(m(torch.randn(rows - 1, 3)).grad_fn).__name__ != "_ReluMLPBackward"
    monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "0")
    assert type(m(torch.randn(rows, 3)).grad_fn).__name__ != "_ReluMLPBackward"
