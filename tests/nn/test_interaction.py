"""Seed 001 interaction arches and cross nets against per-row loops of the seed's formulas."""

from __future__ import annotations

import pytest
import torch

from ctrkit.nn.crossnet import CrossNet, LowRankCrossNet, LowRankMixtureCrossNet, VectorCrossNet
from ctrkit.nn.interaction import DCNInteraction, DotInteraction, ProjectionInteraction


@pytest.fixture(autouse=True)
def _float64():
    """float64 so the loop references compare tightly; the previous default is restored."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


# ---- dot interaction (seed 001 §2) ---------------------------------------------------------------
def test_dot_interaction_matches_loop():
    B, F, D = 3, 4, 5
    dense, sparse = torch.randn(B, D), torch.randn(B, F, D)
    layer = DotInteraction(F, D)
    out = layer(dense, sparse)
    assert out.shape == (B, layer.out_features) == (B, D + F * (F + 1) // 2)
    for b in range(B):
        c = [dense[b]] + [sparse[b, f] for f in range(F)]
        expected = list(dense[b])
        for i in range(F + 1):
            for j in range(i + 1, F + 1):
                expected.append(sum(c[i][k] * c[j][k] for k in range(D)))
        torch.testing.assert_close(out[b], torch.stack(expected))


def test_dot_interaction_output_size_seed_example():
    assert DotInteraction(26, 128).out_features == 479
    out = DotInteraction(26, 16)(torch.randn(2, 16), torch.randn(2, 26, 16))
    assert out.shape == (2, 16 + 351)


def test_dot_interaction_backward_seed_closed_form_b2_d4_f2():
    """Seed 001 §2 with B=2, D=4, F=2: Y = [d, F0=d·s0, F1=d·s1, F2=s0·s1] and
    dL/dD = dY[:, :4] + [dY4, dY5] S,  dL/dS_0 = [dY4, dY6] [d; s1],  dL/dS_1 = [dY5, dY6] [d; s0]."""
    dense = torch.randn(2, 4, requires_grad=True)
    sparse = torch.randn(2, 2, 4, requires_grad=True)
    y = DotInteraction(2, 4)(dense, sparse)
    dY = torch.randn(2, 7)
    y.backward(dY)
    d, S = dense.detach(), sparse.detach()
    dD = dY[:, :4] + torch.bmm(dY[:, 4:6].unsqueeze(1), S).squeeze(1)
    A = torch.bmm(dY[:, [4, 6]].unsqueeze(1), torch.stack([d, S[:, 1]], 1)).squeeze(1)
    Bm = torch.bmm(dY[:, [5, 6]].unsqueeze(1), torch.stack([d, S[:, 0]], 1)).squeeze(1)
    torch.testing.assert_close(dense.grad, dD)
    torch.testing.assert_close(sparse.grad, torch.stack([A, Bm], 1))


def test_dot_interaction_backward_general_closed_form():
    """The seed's derivation for any F: each pair (i, j) contributes dY_ij * c_j to c_i and
    dY_ij * c_i to c_j; the dense part also gets dY[:, :D] directly."""
    B, F, D = 3, 5, 4
    dense = torch.randn(B, D, requires_grad=True)
    sparse = torch.randn(B, F, D, requires_grad=True)
    layer = DotInteraction(F, D)
    dY = torch.randn(B, layer.out_features)
    layer(dense, sparse).backward(dY)
    c = torch.cat([dense.detach().unsqueeze(1), sparse.detach()], 1)
    grad_c = torch.zeros_like(c)
    p = D
    for i in range(F + 1):
        for j in range(i + 1, F + 1):
            grad_c[:, i] += dY[:, p : p + 1] * c[:, j]
            grad_c[:, j] += dY[:, p : p + 1] * c[:, i]
            p += 1
    torch.testing.assert_close(dense.grad, dY[:, :D] + grad_c[:, 0])
    torch.testing.assert_close(sparse.grad, grad_c[:, 1:])


@pytest.mark.parametrize("with_dense", [True, False])
def test_dot_interaction_gradcheck(with_dense):
    """The one-matmul backward (mirrored pair gradients times C) against finite differences."""
    B, F, D = 3, 4, 5
    layer = DotInteraction(F, D, with_dense=with_dense)
    dense = torch.randn(B, D, requires_grad=True) if with_dense else None
    sparse = torch.randn(B, F, D, requires_grad=True)
    inputs = (dense, sparse) if with_dense else (sparse,)
    assert torch.autograd.gradcheck(lambda *x: layer(*x) if with_dense else layer(None, *x), inputs)


def test_dot_interaction_autocast_backward_matches_autograd_reference():
    """Under bf16 autocast the products run in bf16 (as autocast's bmm), the input gradient comes back in the
    input's dtype and matches autograd through the plain ops on the same bf16 values."""
    B, F, D = 4, 6, 8
    sparse32 = torch.randn(B, F, D, dtype=torch.float32)
    dense32 = torch.randn(B, D, dtype=torch.float32)
    layer = DotInteraction(F, D)
    dY = torch.randn(B, layer.out_features, dtype=torch.float32)
    s, d = sparse32.clone().requires_grad_(), dense32.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(d, s)
    y.float().backward(dY)
    assert s.grad.dtype == torch.float32 and d.grad.dtype == torch.float32
    c = torch.cat([dense32.unsqueeze(1), sparse32], 1).bfloat16().requires_grad_()
    gram = torch.bmm(c, c.transpose(1, 2)).flatten(1)[:, layer.flat_index]
    gram.float().backward(dY[:, D:])
    torch.testing.assert_close(s.grad, c.grad[:, 1:].float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(d.grad, dY[:, :D] + c.grad[:, 0].float(), rtol=2e-2, atol=2e-2)


def test_interactions_reject_wrong_shapes():
    with pytest.raises(ValueError, match="dense arch must end in embedding_dim=8"):
        DotInteraction(3, 8)(torch.randn(2, 7), torch.randn(2, 3, 8))


# ---- cross nets (seed 001 §3), per-row column-vector references ----------------------------------
def test_crossnet_matches_seed_formula():
    N, L, B = 6, 3, 4
    net = CrossNet(N, L)
    for b in net.bias:  # non-zero bias so it is tested
        torch.nn.init.normal_(b)
    x = torch.randn(B, N)
    out = net(x)
    for r in range(B):
        x0 = x[r].unsqueeze(1)  # (N, 1)
        xl = x0
        for w, b in zip(net.kernels, net.bias):
            assert w.shape == (N, N) and b.shape == (N, 1)
            xl = x0 * (w @ xl + b) + xl
        torch.testing.assert_close(out[r], xl.squeeze(1))
    assert net.out_features == N


def test_low_rank_crossnet_matches_seed_formula():
    N, L, K, B = 7, 2, 3, 4
    net = LowRankCrossNet(N, L, low_rank=K)
    for b in net.bias:
        torch.nn.init.normal_(b)
    x = torch.randn(B, N)
    out = net(x)
    for r in range(B):
        x0 = x[r].unsqueeze(1)
        xl = x0
        for w, v, b in zip(net.W_kernels, net.V_kernels, net.bias):
            assert w.shape == (N, K) and v.shape == (K, N) and b.shape == (N, 1)
            xl = x0 * (w @ (v @ xl) + b) + xl
        torch.testing.assert_close(out[r], xl.squeeze(1))


def test_vector_crossnet_matches_seed_formula():
    N, L, B = 5, 3, 4
    net = VectorCrossNet(N, L)
    for b in net.bias:
        torch.nn.init.normal_(b)
    x = torch.randn(B, N)
    out = net(x)
    for r in range(B):
        x0 = x[r].unsqueeze(1)
        xl = x0
        for w, b in zip(net.kernels, net.bias):
            assert w.shape == (N, 1) and b.shape == (N, 1)
            s = sum(w[n, 0] * xl[n, 0] for n in range(N))  # tensordot w · x_l, a scalar
            xl = x0 * s + b + xl
        torch.testing.assert_close(out[r], xl.squeeze(1))


@pytest.mark.parametrize("num_experts", [1, 3])
def test_low_rank_mixture_crossnet_matches_seed_formula(num_experts):
    N, L, K, E, B = 6, 2, 2, num_experts, 4
    net = LowRankMixtureCrossNet(N, L, num_experts=E, low_rank=K, activation="tanh")
    for b in net.bias:
        torch.nn.init.normal_(b)
    x = torch.randn(B, N)
    out = net(x)
    f = torch.tanh
    for r in range(B):
        x0 = x[r].unsqueeze(1)  # (N, 1)
        xl = x0
        for u, v, c, b in zip(net.U_kernels, net.V_kernels, net.C_kernels, net.bias):
            assert u.shape == (E, N, K) and v.shape == (E, K, N) and c.shape == (E, K, K)
            experts = [x0 * (u[e] @ f(c[e] @ f(v[e] @ xl)) + b) for e in range(E)]  # each (N, 1)
            if E == 1:
                xl = experts[0] + xl
            else:
                # gate e is Linear(N, 1, bias=False) with weight G[e], shared by all layers
                gating = torch.stack([net.gate_weight[e] @ xl[:, 0] for e in range(E)])  # (E,)
                wts = torch.exp(gating) / torch.exp(gating).sum()
                xl = sum(wts[e] * experts[e] for e in range(E)) + xl
        torch.testing.assert_close(out[r], xl.squeeze(1))
    out.sum().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_dcn_interaction_flattens_dense_then_sparse():
    F, D, B = 3, 4, 2
    cross = LowRankCrossNet((F + 1) * D, 2, low_rank=2)
    layer = DCNInteraction(F, D, cross)
    dense, sparse = torch.randn(B, D), torch.randn(B, F, D)
    flat = torch.cat([dense] + [sparse[:, f] for f in range(F)], 1)
    torch.testing.assert_close(layer(dense, sparse), cross(flat))
    assert layer.out_features == (F + 1) * D
    with pytest.raises(ValueError, match=r"in_features=10, but \(F\+1\)\*D"):
        DCNInteraction(F, D, CrossNet(10, 1))


# ---- projection interaction (seed 001 §4) --------------------------------------------------------
def test_projection_interaction_matches_loop():
    F, D, B = 3, 4, 2
    layer = ProjectionInteraction(F, D, [10, 2 * D], [7, 3 * D])
    assert (layer.F1, layer.F2) == (2, 3) and layer.out_features == D + 6
    dense, sparse = torch.randn(B, D), torch.randn(B, F, D)
    out = layer(dense, sparse)
    flat = torch.cat([dense] + [sparse[:, f] for f in range(F)], 1)
    y, z = layer.branch1(flat), layer.branch2(flat)  # (B, 2D), (B, 3D)
    for b in range(B):
        Y = y[b].view(2, D)  # row i = y[i*D:(i+1)*D]
        Z = z[b].view(D, 3)  # seed: reshape([B, D, -1]), not a transpose
        expected = [sum(Y[i, k] * Z[k, j] for k in range(D)) for i in range(2) for j in range(3)]
        torch.testing.assert_close(out[b], torch.cat([dense[b], torch.stack(expected)]))


def test_projection_seed_example_size_and_bad_widths():
    assert ProjectionInteraction(26, 128, [512, 256], [512]).out_features == 128 + 2 * 4 == 136
    with pytest.raises(ValueError, match="interaction_branch2_layer_sizes ends in width 100.*embedding_dim=16"):
        ProjectionInteraction(26, 16, [32], [64, 100])
    with pytest.raises(ValueError, match="interaction_branch1_layer_sizes is empty"):
        ProjectionInteraction(26, 16, [], [32])
