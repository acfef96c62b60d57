"""AutoInt's native-kernel training path (nn/field_attention_lanes.py, nn/csrc/field_attention.cpp, built by
nn/kernels.py) against the layer's formula written with einsum, gradcheck, the torch-op node, and which path runs."""

from __future__ import annotations

import logging
import math
import shutil

import pytest
import torch

from ctrkit.nn import kernels
from ctrkit.nn.attention import MultiHeadSelfAttention, SelfAttentionStack
from ctrkit.nn.field_attention import fused_self_attention
from ctrkit.nn.field_attention_lanes import kernel_available, lane_attention_stack, lane_self_attention

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and not kernel_available(),
                                reason="no C++ compiler to build the native kernel (the torch-op node runs instead)")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def formula(x: torch.Tensor, w: torch.Tensor, heads: int, dh: int, residual: bool, relu: bool) -> torch.Tensor:
    """ReLU(concat_h softmax(Q^h K^h^T) V^h + E W_res), every product an einsum; w = [W_Q; W_K; W_V; (W_res)]."""
    inner = heads * dh
    q, k, v = (torch.einsum("bfd,od->bfo", x, w[i * inner:(i + 1) * inner]).unflatten(2, (heads, dh)) for i in range(3))
    s = torch.einsum("bmhj,bkhj->bhmk", q, k)
    out = torch.einsum("bhmk,bkhj->bmhj", torch.softmax(s, dim=3), v).flatten(2)  # (B, F, H*d')
    if residual:
        out = out + torch.einsum("bfd,od->bfo", x, w[3 * inner:])
    return torch.relu(out) if relu else out


def _inputs(b: int, f: int, d: int, heads: int, dh: int, residual: bool, dtype: torch.dtype):
    x = torch.randn(b, f, d, dtype=dtype, requires_grad=True)
    w = (torch.randn((4 if residual else 3) * heads * dh, d, dtype=dtype) / math.sqrt(d)).requires_grad_()
    return x, w


@pytest.mark.parametrize(("b", "f", "d", "heads", "dh", "residual", "relu"), [
    (32, 26, 16, 2, 8, True, True),  # Criteo's AutoInt: full blocks of 16 (float32) / 8 (float64) samples
    (19, 9, 16, 2, 8, True, True),  # padded last block
    (5, 7, 6, 3, 3, False, False),  # d' without a specialisation, fewer samples than one block
    (17, 1, 4, 1, 4, True, False),  # one field: the weights are all 1
    (9, 4, 8, 2, 16, False, True),
])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kernel_equals_einsum_values_and_gradients(b, f, d, heads, dh, residual, relu, dtype) -> None:
    x, w = _inputs(b, f, d, heads, dh, residual, dtype)
    out = lane_self_attention(x, w, heads, dh, residual=residual, relu=relu)
    assert out is not None and out.shape == (b, f, heads * dh)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, w), g)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = formula(x64, w64, heads, dh, residual, relu)
    want = torch.autograd.grad(ref, (x64, w64), g.double())
    tol = {} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(out.double(), ref, **tol)
    for a, e in zip(got, want):
        torch.testing.assert_close(a.double(), e, **tol)


def test_gradcheck() -> None:
    x, w = _inputs(10, 5, 4, 2, 3, True, torch.float64)  # 10 samples: one full block of 8 and a padded one
    for residual, relu in ((True, True), (False, False)):
        rows = w if residual else w[:18]
        assert torch.autograd.gradcheck(
            lambda x, w, res=residual, act=relu: lane_self_attention(x, w, 2, 3, residual=res, relu=act), (x, rows))
    w2 = torch.randn(4 * 2 * 3, 6, dtype=torch.float64, requires_grad=True)  # a second layer on the 6-wide output
    assert torch.autograd.gradcheck(
        lambda x, w, w2: lane_attention_stack(x, [(w, 2, 3, True, True), (w2, 2, 3, True, True)]), (x, w, w2))


def test_stack_equals_the_layers_in_turn_and_the_torch_op_node() -> None:
    """Three stacked layers in the lane layout (one layout copy at each end) give the einsum stack's values and
    gradients, and the torch-op node's (the path where no kernel is built)."""
    stack = SelfAttentionStack([MultiHeadSelfAttention(16, num_heads=2) for _ in range(3)]).double().train()
    e = torch.randn(21, 26, 16, dtype=torch.float64, requires_grad=True)
    out = stack(e)
    ref = e
    for m in stack:
        ref = formula(ref, m._fused_args()[0], 2, 8, True, True)
    node = e
    for m in stack:
        node = fused_self_attention(node, m._fused_args()[0], 2, 8, residual=True, relu=True)
    params = [e, *stack.parameters()]
    got = torch.autograd.grad(out.flatten(1).square().sum(), params)
    for other in (ref, node):
        torch.testing.assert_close(out, other)
        for a, b in zip(got, torch.autograd.grad(other.flatten(1).square().sum(), params)):
            torch.testing.assert_close(a, b)


def test_large_scores_stay_finite() -> None:
    """Scores in the thousands (exp overflows without the row maximum) give the formula's softmax, finite."""
    x, w = _inputs(16, 6, 8, 2, 4, True, torch.float32)
    with torch.no_grad():
        x[0, 2] *= 60.0
        w *= 10.0
    out = lane_self_attention(x, w, 2, 4, residual=True, relu=False)
    assert torch.isfinite(out).all()
    ref = formula(x.double(), w.double(), 2, 4, True, False)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-2)
    (gx,) = torch.autograd.grad(out.sum(), x)
    assert torch.isfinite(gx).all()


def test_two_threads_give_the_same_result() -> None:
    x, w = _inputs(40, 9, 16, 2, 8, True, torch.float32)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = lane_self_attention(x, w, 2, 8, residual=True, relu=True)
            outs.append((out, *torch.autograd.grad(out.sum(), (x, w))))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)  # dW's sum runs in MKL, split by thread


def test_which_path_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel where it applies; None (so the torch-op node) where kernels are off or the input does not fit."""
    x, w = _inputs(4, 5, 8, 2, 4, True, torch.float32)
    assert lane_self_attention(x, w, 2, 4, residual=True, relu=True) is not None
    assert lane_self_attention(x.bfloat16(), w.bfloat16(), 2, 4, residual=True, relu=True) is None
    assert lane_self_attention(x, w.double(), 2, 4, residual=True, relu=True) is None
    big = torch.randn(2, 3, 8), torch.randn(4 * 65, 8)
    assert lane_self_attention(*big, 1, 65, residual=True, relu=True) is None  # d' > 64
    layer = MultiHeadSelfAttention(8, num_heads=2).train()
    with_kernel = layer(x)
    monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "0")
    assert lane_self_attention(x, w, 2, 4, residual=True, relu=True) is None
    torch.testing.assert_close(layer(x), with_kernel, rtol=1e-5, atol=1e-6)  # the node: same function


def test_build_caches_and_reports_failures(tmp_path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """A build goes to CTRKIT_KERNEL_DIR under a name hashing source, flags, compiler and CPU, and is reused; a
    missing compiler or CTRKIT_NATIVE_KERNELS=0 gives None (logged), never an exception."""
    monkeypatch.setenv("CTRKIT_KERNEL_DIR", str(tmp_path))
    lib = kernels._load.__wrapped__("field_attention")  # uncached: builds into tmp_path
    assert lib is not None and hasattr(lib, "ctrkit_field_attention_forward_f32")
    (built,) = tmp_path.glob("field_attention-*.so")
    stamp = built.stat().st_mtime_ns
    assert kernels._load.__wrapped__("field_attention") is not None
    assert [p.name for p in tmp_path.iterdir()] == [built.name] and built.stat().st_mtime_ns == stamp  # reused
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with caplog.at_level(logging.WARNING, logger="ctrkit.nn.kernels"):
        assert kernels._load.__wrapped__("field_attention") is None
    assert "no C++ compiler" in caplog.text and "no-such-compiler" in caplog.text
    monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "off")
    assert kernels.load("field_attention") is None
