"""The low-rank cross net's native training node (nn/crossnet_native.py, csrc/cross_layer.cpp) against the torch
ops it replaces (LowRankCrossNet's loop under autograd), bit for bit: output, x_0's gradient and every parameter's,
for one to three layers, fp32 and fp64, odd batch sizes, one and two threads; gradcheck; and where it does not
apply."""

from __future__ import annotations

import pytest
import torch

from ctrkit.nn import crossnet, crossnet_native
from ctrkit.nn.crossnet import LowRankCrossNet

pytestmark = pytest.mark.skipif(not crossnet_native.kernel_available(), reason="no native kernel on this machine")


def _run(m: LowRankCrossNet, x: torch.Tensor, weight: torch.Tensor, native: bool, monkeypatch) -> list[torch.Tensor]:
    monkeypatch.setattr(crossnet, "native_low_rank_cross",
                        crossnet_native.native_low_rank_cross if native else (lambda x0, k: None))
    m.zero_grad(set_to_none=True)
    xi = x.detach().clone().requires_grad_()
    out = m(xi)
    assert (type(out.grad_fn).__name__ == "_LowRankCrossBackward") == native
    (out * weight).sum().backward()
    return [out.detach(), xi.grad, *(p.grad for p in m.parameters())]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("batch", [1, 9, 700])
@pytest.mark.parametrize("threads", [1, 2])
def test_native_node_equals_torch_ops(dtype, layers, batch, threads, monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(layers)
        m = LowRankCrossNet(40, layers, low_rank=4).to(dtype)
        with torch.no_grad():
            for b in m.bias:
                b.normal_()  # zero-initialised: give the bias gradient's path non-zero values to carry
        g = torch.Generator().manual_seed(batch)
        x = torch.randn(batch, 40, generator=g, dtype=dtype)
        weight = torch.randn(batch, 40, generator=g, dtype=dtype)
        native = _run(m, x, weight, True, monkeypatch)
        plain = _run(m, x, weight, False, monkeypatch)
    finally:
        torch.set_num_threads(before)
    assert len(native) == len(plain) and all(torch.equal(a, b) for a, b in zip(native, plain))


def test_gradcheck():
    torch.manual_seed(0)
    m = LowRankCrossNet(6, 2, low_rank=2).double()
    params = [p.detach().clone().requires_grad_() for layer in zip(m.W_kernels, m.V_kernels, m.bias) for p in layer]
    x = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, *ps: crossnet_native._LowRankCross.apply(x, *ps), (x, *params))


def test_where_it_does_not_apply(monkeypatch):
    m = LowRankCrossNet(8, 2, low_rank=2)
    layers = list(zip(m.W_kernels, m.V_kernels, m.bias))
    x = torch.randn(3, 8)
    assert crossnet_native.native_low_rank_cross(x, layers) is not None
    with torch.no_grad():
        assert crossnet_native.native_low_rank_cross(x, layers) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert crossnet_native.native_low_rank_cross(x, layers) is None
    assert crossnet_native.native_low_rank_cross(x.double(), layers) is None  # dtypes differ
    mb = LowRankCrossNet(8, 1, low_rank=2).bfloat16()
    assert crossnet_native.native_low_rank_cross(x.bfloat16(), list(zip(mb.W_kernels, mb.V_kernels, mb.bias))) is None
    mm = LowRankCrossNet(8, 1, low_rank=2).to("meta")
    assert crossnet_native.native_low_rank_cross(x.to("meta"), list(zip(mm.W_kernels, mm.V_kernels, mm.bias))) is None
    monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "0")
    assert crossnet_native.native_low_rank_cross(x, layers) is None
