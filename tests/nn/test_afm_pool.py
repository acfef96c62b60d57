"""AFM's fused training path (nn/afm_pool.py) against the layer's formula written out over the pairs with einsum."""

from __future__ import annotations

import pytest
import torch

from ctrkit.nn import afm_pool
from ctrkit.nn.afm_pool import fused_afm_pool
from ctrkit.nn.attention import AFMAttention

B, F, D, A = 5, 6, 4, 3


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def einsum_reference(layer: AFMAttention, e: torch.Tensor) -> torch.Tensor:
    """p^T Σ_{i<j} softmax_ij(h^T ReLU(W (e_i ⊙ e_j) + b)) e_i ⊙ e_j over the explicit (B, P, D) products."""
    rows, cols = torch.triu_indices(e.shape[1], e.shape[1], 1)
    prods = e[:, rows] * e[:, cols]  # (B, P, D)
    hidden = torch.relu(torch.einsum("bpd,ad->bpa", prods, layer.attention.weight) + layer.attention.bias)
    a = torch.softmax(torch.einsum("bpa,a->bp", hidden, layer.h), dim=1)  # (B, P)
    pooled = torch.einsum("bp,bpd->bd", a, prods)  # (B, D)
    return (pooled @ layer.projection).unsqueeze(1)  # (B, 1)


def _layer(num_fields: int | None = F) -> AFMAttention:
    layer = AFMAttention(D, attention_dim=A, num_fields=num_fields).double().train()
    with torch.no_grad():  # a non-zero bias and larger W so some ReLU units are off and the bias gradient counts
        layer.attention.bias.normal_()
        layer.attention.weight.mul_(3.0)
    return layer


def _path(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Run the matrices node ('matrix') or the feature-major pairs node ('pairs') on F fields."""
    monkeypatch.setattr(afm_pool, "PAIRS_MAX_FIELDS", F if path == "pairs" else 1)


@pytest.mark.parametrize(("num_fields", "chunk", "path"), [(F, 32, "matrix"), (None, 32, "matrix"), (F, 2, "matrix"),
                                                           (F, 32, "pairs"), (None, 32, "pairs")])
def test_fused_layer_equals_einsum_values_and_gradients(num_fields: int | None, chunk: int, path: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(afm_pool, "CHUNK_FLOATS", chunk * A * F * F)  # 2: three chunks of B = 5, the last short
    _path(monkeypatch, path)
    layer = _layer(num_fields)
    e = torch.randn(B, F, D, dtype=torch.float64, requires_grad=True)
    assert layer._fused(e)  # the path under test
    g = torch.randn(B, 1, dtype=torch.float64)
    params = [e, *layer.parameters()]
    out = layer(e)
    ref = einsum_reference(layer, e)
    torch.testing.assert_close(out, ref)
    for got, want in zip(torch.autograd.grad(out, params, g), torch.autograd.grad(ref, params, g)):
        torch.testing.assert_close(got, want)
    hidden = torch.relu(torch.einsum("bfd,ad->bfa", e, layer.attention.weight) + layer.attention.bias)
    assert 0 < int((hidden == 0).sum()) < hidden.numel()  # both sides of the ReLU were exercised


@pytest.mark.parametrize("path", ["matrix", "pairs"])
def test_fused_pool_gradcheck(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    monkeypatch.setattr(afm_pool, "CHUNK_FLOATS", 2 * A * F * F)  # three chunks
    _path(monkeypatch, path)
    layer = _layer()
    e = torch.randn(B, F, D, dtype=torch.float64, requires_grad=True)
    args = (e, layer.attention.weight, layer.attention.bias, layer.h)
    assert torch.autograd.gradcheck(fused_afm_pool, args)


@pytest.mark.parametrize("path", ["matrix", "pairs"])
def test_large_logits_stay_finite_and_match(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """Logits in the hundreds (exp overflows float32 unshifted): the softmax is the stable one."""
    _path(monkeypatch, path)
    layer = _layer().float()
    e = (torch.randn(B, F, D) * 6).requires_grad_(True)
    out, ref = layer(e), einsum_reference(layer, e)
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("path", "node"), [("matrix", "_AFMPool"), ("pairs", "_AFMPairs")])
def test_which_path_runs(monkeypatch: pytest.MonkeyPatch, path: str, node: str) -> None:
    _path(monkeypatch, path)
    calls = []
    real = getattr(afm_pool, node).apply
    monkeypatch.setattr(getattr(afm_pool, node), "apply", lambda *a: calls.append(1) or real(*a))
    layer = _layer()
    e = torch.randn(B, F, D, dtype=torch.float64)
    layer(e)
    assert calls == [1]  # training with gradients: fused
    with torch.no_grad():
        layer(e)
    layer.eval()
    layer(e)
    assert calls == [1]  # no_grad and eval: the formula
    with pytest.raises(Exception, match="AFMAttention"):
        layer.train()(torch.randn(B, F, D + 1, dtype=torch.float64))  # the input checks run on the fused path too


def test_pairs_up_to_the_bound_matrices_above(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    for node in ("_AFMPool", "_AFMPairs"):
        real = getattr(afm_pool, node).apply
        monkeypatch.setattr(getattr(afm_pool, node), "apply", lambda *a, n=node, r=real: seen.append(n) or r(*a))
    for f in (afm_pool.PAIRS_MAX_FIELDS, afm_pool.PAIRS_MAX_FIELDS + 1):
        e = torch.randn(2, f, D, dtype=torch.float64, requires_grad=True)
        fused_afm_pool(e, torch.randn(A, D, dtype=torch.float64), torch.randn(A, dtype=torch.float64),
                       torch.randn(A, dtype=torch.float64))
    assert seen == ["_AFMPairs", "_AFMPool"]
