"""AutoInt's torch-op training node (nn/field_attention.py) against the layer's formula written with einsum, with the
native kernel off (the path on other devices and without a compiler; tests/nn/test_field_attention_lanes.py covers
the kernel)."""

from __future__ import annotations

import math

import pytest
import torch

from ctrkit.nn.attention import MultiHeadSelfAttention
from ctrkit.nn.field_attention import _attend, fused_self_attention

B, F, D = 4, 6, 8


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _torch_op_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "0")


def einsum_reference(layer: MultiHeadSelfAttention, e: torch.Tensor) -> torch.Tensor:
    """ReLU(concat_h softmax(Q^h K^h^T [/ sqrt(d')]) V^h + E W_res) with every product an einsum."""
    h, dh = layer.num_heads, layer.head_dim
    q, k, v = (torch.einsum("bfd,od->bfo", e, lin.weight).unflatten(2, (h, dh)) for lin in (layer.w_q, layer.w_k, layer.w_v))
    s = torch.einsum("bmhj,bkhj->bhmk", q, k)  # (B, H, F, F)
    if layer.scaled:
        s = s / math.sqrt(dh)
    out = torch.einsum("bhmk,bkhj->bmhj", torch.softmax(s, dim=3), v).flatten(2)  # (B, F, H*d')
    if layer.w_res is not None:
        out = out + torch.einsum("bfd,od->bfo", e, layer.w_res.weight)
    return torch.relu(out) if layer.use_relu else out


@pytest.mark.parametrize(("scaled", "use_residual", "use_relu", "heads"),
                         [(False, True, True, 2), (True, False, True, 2), (False, True, False, 2), (True, False, False, 2),
                          (False, True, True, 3), (False, True, True, 1)])
def test_fused_layer_equals_einsum_values_and_gradients(scaled: bool, use_residual: bool, use_relu: bool,
                                                        heads: int) -> None:
    layer = MultiHeadSelfAttention(D, num_heads=heads, head_dim=3, scaled=scaled, use_residual=use_residual,
                                   use_relu=use_relu).double().train()
    assert layer._fused(torch.zeros(1, 1, D, dtype=torch.float64))  # the path under test
    e = torch.randn(B, F, D, dtype=torch.float64, requires_grad=True)
    g = torch.randn(B, F, 3 * heads, dtype=torch.float64)
    params = [e, *layer.parameters()]
    out = layer(e)
    grads = torch.autograd.grad(out, params, g)
    ref = einsum_reference(layer, e)
    ref_grads = torch.autograd.grad(ref, params, g)
    torch.testing.assert_close(out, ref)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)


def test_stacked_layers_feature_major_output_and_gradients() -> None:
    """The output is a feature-major view the next layer reads in place; values and gradients through three layers
    (the last one's gradient arriving contiguous, as from AutoInt's flatten) equal the einsum stack."""
    layers = [MultiHeadSelfAttention(D, num_heads=2).double() for _ in range(3)]
    e = torch.randn(B, F, D, dtype=torch.float64, requires_grad=True)
    x, r = e, e
    for layer in layers:
        x, r = layer(x), einsum_reference(layer, r)
    assert not x.is_contiguous()  # (B, F, H*d') view of the (H*d', B*F) result
    torch.testing.assert_close(x, r)
    params = [e, *(p for layer in layers for p in layer.parameters())]
    got = torch.autograd.grad(x.flatten(1).square().sum(), params)
    want = torch.autograd.grad(r.flatten(1).square().sum(), params)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_gradcheck() -> None:
    x = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4 * 2 * 3, 4, dtype=torch.float64, requires_grad=True)  # W_Q, W_K, W_V, W_res of 2 heads of 3
    for residual, relu in ((True, True), (False, False)):
        rows = w if residual else w[:18]
        assert torch.autograd.gradcheck(
            lambda x, w, res=residual, act=relu: fused_self_attention(x, w, 2, 3, residual=res, relu=act), (x, rows))


def _finite_and_equal_to_einsum(layer: MultiHeadSelfAttention, e: torch.Tensor, grad_rtol: float) -> None:
    """The layer's output and input gradient on ``e`` are finite and equal to the einsum formula's."""
    e.requires_grad_()
    out = layer(e)
    ref = einsum_reference(layer, e)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-3)
    (gx,) = torch.autograd.grad(out.sum(), e)
    (gr,) = torch.autograd.grad(ref.sum(), e)
    assert torch.isfinite(gx).all()
    torch.testing.assert_close(gx, gr, rtol=grad_rtol, atol=1e-3)


def test_overflowing_scores_fall_back_to_the_row_maximum() -> None:
    """A row whose largest score is far above its mean (the unshifted exp overflows in float32) gets the stable
    softmax: finite, and equal to the einsum formula."""
    layer = MultiHeadSelfAttention(D, num_heads=2, use_relu=False).train()
    e = torch.randn(B, F, D)
    e[0, 2] *= 60.0  # one field's key dominates: scores ~1e3 above the row mean
    s = torch.einsum("bfd,od->bfo", e, layer.w_q.weight)[0, :, :4] @ torch.einsum(
        "bfd,od->bfo", e, layer.w_k.weight)[0, :, :4].T
    assert (s.amax(1) - s.mean(1)).max() > 100  # the mean shift alone would overflow
    _finite_and_equal_to_einsum(layer, e, grad_rtol=1e-4)


def test_eval_and_masks_keep_the_plain_path() -> None:
    layer = MultiHeadSelfAttention(D, num_heads=2)
    e = torch.randn(B, F, D)
    assert layer._fused(e)
    train_out = layer(e)
    layer.eval()
    assert not layer._fused(e)
    torch.testing.assert_close(layer(e), train_out)  # same function, another order of sums
    layer.train()
    with torch.no_grad():
        assert not layer._fused(e)
    assert not MultiHeadSelfAttention(D, dropout=0.1)._fused(e)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not layer._fused(e)


def test_underflowing_rows_fall_back_to_the_row_maximum() -> None:
    """Rows whose every score is far below 0 (every unshifted exp underflows in float32, z = 0) get the stable
    softmax too: finite, and equal to the einsum formula (near-uniform weights here)."""
    layer = MultiHeadSelfAttention(D, num_heads=2, use_relu=False).train()
    with torch.no_grad():
        layer.w_k.weight.copy_(-layer.w_q.weight)  # S_mk = -<W x_m, W x_k>
    e = torch.randn(D).expand(B, F, D) * 40.0 + 0.01 * torch.randn(B, F, D)  # all fields ~ one vector
    s = -torch.einsum("bfd,od->bfo", e, layer.w_q.weight)[..., :4].square().sum(-1)  # head 0's diagonal scores
    assert s.max() < -104  # exp(s) is 0 in float32, so z would be 0 without the fallback
    _finite_and_equal_to_einsum(layer, e, grad_rtol=1e-3)


def test_stable_path_equals_the_checked_one() -> None:
    """``stable`` (what a GPU runs: the row-maximum shift, no host read) and the checked unshifted path give the same
    normalised weights and outputs (all heads and samples batched: (H·B, d', F) operands, a row of ones on V)."""
    hb, dh = 6, 3
    q, k = torch.randn(hb, dh, F, dtype=torch.float64), torch.randn(hb, dh, F, dtype=torch.float64)
    v1 = torch.cat([torch.randn(hb, dh, F, dtype=torch.float64), torch.ones(hb, 1, F, dtype=torch.float64)], 1)
    (e0, o0), (e1, o1) = _attend(q, k, v1, stable=False), _attend(q, k, v1, stable=True)
    torch.testing.assert_close(o0[:, -1], e0.sum(2))  # the ones row gives the row sums z
    torch.testing.assert_close(e0 / o0[:, -1:].transpose(1, 2), e1 / o1[:, -1:].transpose(1, 2))
    torch.testing.assert_close(o0[:, :-1] / o0[:, -1:], o1[:, :-1] / o1[:, -1:])
    ref = torch.softmax(q.transpose(1, 2) @ k, dim=2)  # (H·B, F, F)
    torch.testing.assert_close(e1 / o1[:, -1:].transpose(1, 2), ref)
