"""FMInteraction's training node against autograd through the formula and the pairwise definition."""

from __future__ import annotations

import torch

from ctrkit.nn.fm import FMInteraction, _fm_second_order


def _grads(fn, emb, g):
    x = emb.detach().clone().requires_grad_(True)
    out = fn(x)
    out.backward(g)
    return out.detach(), x.grad


def test_node_matches_autograd_through_the_formula():
    torch.manual_seed(0)
    fm = FMInteraction()
    for B, F, D in [(1, 2, 1), (7, 9, 16), (64, 26, 16)]:
        emb = torch.randn(B, F, D) * 0.3
        g = torch.randn(B, 1)
        out_a, grad_a = _grads(_fm_second_order, emb, g)
        out_b, grad_b = _grads(fm, emb, g)
        torch.testing.assert_close(out_b, out_a, rtol=1e-5, atol=1e-6)  # the same sums in another order
        torch.testing.assert_close(grad_b, grad_a, rtol=1e-6, atol=1e-7)


def test_node_matches_pairwise_definition_in_float64():
    torch.manual_seed(1)
    emb = torch.randn(5, 6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(FMInteraction(), (emb,))
    naive = sum((emb[:, i] * emb[:, j]).sum(1) for i in range(6) for j in range(i + 1, 6))
    torch.testing.assert_close(FMInteraction()(emb).squeeze(1), naive)


def test_eval_and_no_grad_take_the_formula():
    emb = torch.randn(3, 4, 2)
    with torch.no_grad():
        out = FMInteraction()(emb.requires_grad_(True))
    assert out.grad_fn is None
    torch.testing.assert_close(out, _fm_second_order(emb.detach()))
    scripted = torch.jit.script(FMInteraction())
    torch.testing.assert_close(scripted(emb.detach()), out)
