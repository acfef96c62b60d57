"""FTRL-Proximal (McMahan et al., "Ad Click Prediction: a View from the Trenches", KDD 2013, Algorithm 1).

Per coordinate i, with gradient g_i of the loss (no regulariser in it):

    σ_i = (sqrt(n_i + g_i²) − sqrt(n_i)) / α
    z_i ← z_i + g_i − σ_i · w_i
    n_i ← n_i + g_i²
    w_i = 0                                                   if |z_i| ≤ λ1
          −(z_i − sgn(z_i) λ1) / ((β + sqrt(n_i)) / α + λ2)    otherwise

so L1 (λ1) yields exact zeros: the sparse "wide" models of Wide & Deep / LR are trained with it.
State per parameter: ``z`` and ``n`` (same shape). α is stored in the group's ``lr`` key (so LR
schedulers scale it); β, λ1, λ2 in ``beta``, ``l1``, ``l2``.

Sparse gradients (``embedding(sparse=True)``) are coalesced (duplicate ids of a batch summed) and
only the touched rows are updated; dense gradients update every coordinate (a zero gradient leaves
z and n unchanged and w at its closed-form value).

Initial weights: the paper starts from w = 0 with z = n = 0. A parameter starting at w₀ ≠ 0 gets
``z₀ = −w₀ (β/α + λ2) − sgn(w₀) λ1`` so that w₀ is exactly the closed form of (z₀, n = 0): an
untouched coordinate keeps its initial value (and w₀ = 0 gives z₀ = 0, the paper's start).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class FTRL(torch.optim.Optimizer):
    """FTRL-Proximal with L1/L2 for dense and sparse (COO) gradients.

    Args:
        params: parameters or parameter groups (a group may set ``alpha`` or ``lr``, ``beta``, ``l1``, ``l2``).
        alpha: α, the per-coordinate learning-rate scale (stored as the group's ``lr``).
        beta: β, smoothing of the per-coordinate rate α / (β + sqrt(n)).
        l1: λ1 ≥ 0, L1 strength (exact zeros when |z| ≤ λ1).
        l2: λ2 ≥ 0, L2 strength.
    """

    def __init__(
        self, params: Iterable[Any], alpha: float = 0.05, beta: float = 1.0, l1: float = 0.0, l2: float = 0.0
    ) -> None:
        params = list(params)
        if params and isinstance(params[0], dict):
            params = [{("lr" if k == "alpha" else k): v for k, v in g.items()} for g in params]
        for name, value in (("alpha", alpha), ("beta", beta), ("l1", l1), ("l2", l2)):
            if value < 0 or (name == "alpha" and value == 0):
                raise ValueError(f"FTRL: {name} must be {'> 0' if name == 'alpha' else '>= 0'}, got {value}")
        super().__init__(params, {"lr": alpha, "beta": beta, "l1": l1, "l2": l2})

    @staticmethod
    def _weights(z: torch.Tensor, n: torch.Tensor, alpha: float, beta: float, l1: float,
                 l2: float) -> torch.Tensor:
        """Closed-form w from (z, n)."""
        denom = (beta + n.sqrt()) / alpha + l2
        w = -(z - z.sign() * l1) / denom
        return torch.where(z.abs() <= l1, torch.zeros_like(w), w)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            alpha, beta, l1, l2 = group["lr"], group["beta"], group["l1"], group["l2"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    w0 = p.detach()
                    denom = beta / alpha + l2
                    z0 = -w0 * denom - w0.sign() * l1 if denom > 0 else torch.zeros_like(w0)
                    state["z"] = z0.clone(memory_format=torch.contiguous_format)
                    state["n"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                z, n = state["z"], state["n"]
                grad = p.grad
                if grad.is_sparse:
                    g = grad.coalesce()
                    rows, gv = g.indices()[0], g.values()  # (R',), (R', ...)
                    zr, nr, wr = z[rows], n[rows], p[rows]
                    sigma = ((nr + gv * gv).sqrt() - nr.sqrt()) / alpha
                    zr = zr + gv - sigma * wr
                    nr = nr + gv * gv
                    z[rows], n[rows] = zr, nr
                    p[rows] = self._weights(zr, nr, alpha, beta, l1, l2).to(p.dtype)
                else:
                    sigma = ((n + grad * grad).sqrt() - n.sqrt()) / alpha
                    z.add_(grad - sigma * p)
                    n.add_(grad * grad)
                    p.copy_(self._weights(z, n, alpha, beta, l1, l2))
        return loss
