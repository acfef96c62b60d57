"""FTRL-Proximal vs a naive per-coordinate implementation of McMahan et al. 2013, Algorithm 1."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from ctrkit.training.ftrl import FTRL


class NaiveFTRL:
    """Algorithm 1 coordinate by coordinate on Python floats (z₀ chosen so w₀ is a fixed point)."""

    def __init__(self, w0: list[float], alpha: float, beta: float, l1: float, l2: float) -> None:
        self.a, self.b, self.l1, self.l2 = alpha, beta, l1, l2
        self.w = list(w0)
        d = beta / alpha + l2
        self.z = [-w * d - math.copysign(l1, w) if w != 0 else 0.0 for w in w0]
        self.n = [0.0] * len(w0)

    def update(self, i: int, g: float) -> None:
        sigma = (math.sqrt(self.n[i] + g * g) - math.sqrt(self.n[i])) / self.a
        self.z[i] += g - sigma * self.w[i]
        self.n[i] += g * g
        if abs(self.z[i]) <= self.l1:
            self.w[i] = 0.0
        else:
            sgn = 1.0 if self.z[i] > 0 else -1.0
            self.w[i] = -(self.z[i] - sgn * self.l1) / ((self.b + math.sqrt(self.n[i])) / self.a + self.l2)


@pytest.mark.parametrize("l1, l2, zero_init", [(0.0, 0.0, True), (0.05, 0.1, True), (0.02, 0.01, False)])
def test_dense_gradients_match_naive(l1, l2, zero_init):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.zeros(3, 4, dtype=torch.float64) if zero_init
                           else torch.randn(3, 4, dtype=torch.float64))
    ref = NaiveFTRL(w.detach().flatten().tolist(), alpha=0.1, beta=1.0, l1=l1, l2=l2)
    opt = FTRL([w], alpha=0.1, beta=1.0, l1=l1, l2=l2)
    x = torch.randn(6, 3, 4, dtype=torch.float64)
    for step in range(6):
        loss = ((x[step] * w).sum() - 1.0) ** 2
        opt.zero_grad()
        loss.backward()
        g = w.grad.flatten().tolist()
        g[5] = 0.0  # a coordinate without gradient this step
        w.grad.view(-1)[5] = 0.0
        for i, gi in enumerate(g):
            ref.update(i, gi)
        opt.step()
        torch.testing.assert_close(w.detach().flatten(), torch.tensor(ref.w, dtype=torch.float64))


def test_sparse_gradients_match_naive_and_leave_untouched_rows():
    torch.manual_seed(1)
    emb = torch.nn.Embedding(10, 3, sparse=True).double()
    w0 = emb.weight.detach().clone()
    ref = NaiveFTRL(w0.flatten().tolist(), alpha=0.2, beta=0.5, l1=0.03, l2=0.02)
    opt = FTRL(emb.parameters(), alpha=0.2, beta=0.5, l1=0.03, l2=0.02)
    batches = [torch.tensor([1, 3, 3, 7]), torch.tensor([0, 1, 1]), torch.tensor([7, 2])]
    for ids in batches:
        target = torch.randn(len(ids), 3, dtype=torch.float64)
        loss = ((emb(ids) - target) ** 2).sum()
        opt.zero_grad()
        loss.backward()
        dense_grad = emb.weight.grad.to_dense()  # duplicate ids summed
        for r in sorted(set(ids.tolist())):
            for d in range(3):
                ref.update(r * 3 + d, float(dense_grad[r, d]))
        opt.step()
        torch.testing.assert_close(emb.weight.detach().flatten(), torch.tensor(ref.w, dtype=torch.float64))
    untouched = [4, 5, 6, 8, 9]
    assert torch.equal(emb.weight.detach()[untouched], w0[untouched])


def test_l1_gives_exact_zeros_and_bad_options_rejected():
    w = torch.nn.Parameter(torch.zeros(50))
    opt = FTRL([w], alpha=0.1, l1=1.0)
    w.grad = torch.full((50,), 0.1)
    opt.step()
    assert torch.equal(w.detach(), torch.zeros(50))  # |z| = 0.1 <= λ1
    with pytest.raises(ValueError, match="alpha"):
        FTRL([w], alpha=0.0)
    with pytest.raises(ValueError, match="l1"):
        FTRL([w], l1=-1.0)


def test_group_alpha_and_state_dict_round_trip():
    w = torch.nn.Parameter(torch.ones(3))
    opt = FTRL([{"params": [w], "alpha": 0.5}], l2=0.1)
    assert opt.param_groups[0]["lr"] == 0.5
    w.grad = torch.tensor([0.1, -0.2, 0.3])
    opt.step()
    other_w = torch.nn.Parameter(w.detach().clone())
    other = FTRL([{"params": [other_w], "alpha": 0.5}], l2=0.1)
    other.load_state_dict(copy.deepcopy(opt.state_dict()))  # (as if saved to disk)
    for p in (w, other_w):
        p.grad = torch.tensor([0.3, 0.1, -0.1])
    opt.step()
    other.step()
    assert torch.equal(w, other_w)
