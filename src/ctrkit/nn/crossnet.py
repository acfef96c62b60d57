"""Cross networks of DCN / DCN-v2 (seed 001 §3), ``[B, N] -> [B, N]``.

The seed writes every layer on column vectors ``x_l [B, N, 1]`` with ``x_0 = input.unsqueeze(2)``;
we compute the same thing on row vectors ``[B, N]`` (``W x`` becomes ``x W^T``), which is one
``addmm`` per matrix. Parameter shapes are exactly the seed's (and torchrec's): per layer
``W [N, N]``, ``W [N, K]``/``V [K, N]``, ``w [N, 1]``, ``b [N, 1]``. Init as torchrec: xavier-normal
kernels, zero bias.
"""

from __future__ import annotations

import torch
from torch import nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn.activation import ActivationSpec, make_activation
from ctrkit.nn.crossnet_native import native_low_rank_cross


def _layers(num_layers: int, *shape: int) -> nn.ParameterList:
    return nn.ParameterList([nn.Parameter(torch.empty(*shape)) for _ in range(num_layers)])


def _check(in_features: int, num_layers: int, **ranks: int) -> None:
    if in_features < 1 or num_layers < 1:
        raise LayerConfigError(f"cross net needs in_features >= 1 and num_layers >= 1, got {in_features}, {num_layers}")
    for name, v in ranks.items():
        if v < 1:
            raise LayerConfigError(f"cross net {name} must be >= 1, got {v}")


class CrossNet(nn.Module):
    """Full-rank cross net: ``x_{l+1} = x_0 ⊙ (W_l x_l + b_l) + x_l``, ``W_l [N, N]``, ``b_l [N, 1]``."""

    def __init__(self, in_features: int, num_layers: int) -> None:
        super().__init__()
        _check(in_features, num_layers)
        self.in_features = self.out_features = int(in_features)
        self.num_layers = int(num_layers)
        self.kernels = _layers(num_layers, in_features, in_features)
        self.bias = _layers(num_layers, in_features, 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w, b in zip(self.kernels, self.bias):
            nn.init.xavier_normal_(w)
            nn.init.zeros_(b)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0  # (B, N)
        for w, b in zip(self.kernels, self.bias):
            x = x0 * torch.addmm(b.view(-1), x, w.t()) + x  # (B, N)
        return x


class LowRankCrossNet(nn.Module):
    """Low-rank cross net (DCN-v2, seed 001 §3):
    ``x_{l+1} = x_0 ⊙ (W_l (V_l x_l) + b_l) + x_l``, ``W_l [N, K]``, ``V_l [K, N]``, ``b_l [N, 1]``."""

    def __init__(self, in_features: int, num_layers: int, low_rank: int = 1) -> None:
        super().__init__()
        _check(in_features, num_layers, low_rank=low_rank)
        self.in_features = self.out_features = int(in_features)
        self.num_layers = int(num_layers)
        self.low_rank = int(low_rank)
        self.W_kernels = _layers(num_layers, in_features, low_rank)
        self.V_kernels = _layers(num_layers, low_rank, in_features)
        self.bias = _layers(num_layers, in_features, 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w, v, b in zip(self.W_kernels, self.V_kernels, self.bias):
            nn.init.xavier_normal_(w)
            nn.init.xavier_normal_(v)
            nn.init.zeros_(b)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        # training on the CPU: one node, its element-wise passes native (nn/crossnet_native.py), the same floats
        out = native_low_rank_cross(x0, list(zip(self.W_kernels, self.V_kernels, self.bias)))
        if out is not None:
            return out  # (B, N)
        x = x0  # (B, N)
        for w, v, b in zip(self.W_kernels, self.V_kernels, self.bias):
            vx = x @ v.t()  # (B, K)
            x = x0 * torch.addmm(b.view(-1), vx, w.t()) + x  # (B, N)
        return x


class VectorCrossNet(nn.Module):
    """Vector cross net (DCN-v1, seed 001 §3): ``x_{l+1} = x_0 (w_l · x_l) + b_l + x_l``,
    ``w_l [N, 1]`` (``w_l · x_l`` is one scalar per row), ``b_l [N, 1]``."""

    def __init__(self, in_features: int, num_layers: int) -> None:
        super().__init__()
        _check(in_features, num_layers)
        self.in_features = self.out_features = int(in_features)
        self.num_layers = int(num_layers)
        self.kernels = _layers(num_layers, in_features, 1)
        self.bias = _layers(num_layers, in_features, 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w, b in zip(self.kernels, self.bias):
            nn.init.xavier_normal_(w)
            nn.init.zeros_(b)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0  # (B, N)
        for w, b in zip(self.kernels, self.bias):
            s = x @ w  # (B, 1)
            x = x0 * s + b.view(-1) + x  # (B, N)
        return x


class LowRankMixtureCrossNet(nn.Module):
    """Mixture of low-rank experts (DCN-v2 "DCN-Mix", seed 001 §3). On layer l, for expert e:

        expert_l[e] = x_0 ⊙ (U_l[e] f(C_l[e] f(V_l[e] x_l)) + b_l)
        x_{l+1} = sum_e softmax(g(x_l))_e expert_l[e] + x_l

    with ``U_l [E, N, K]``, ``V_l [E, K, N]``, ``C_l [E, K, K]``, ``b_l [N, 1]``, f the activation
    (relu by default) and gates ``g_e(x) = G[e] · x``: the seed's E ``Linear(N, 1, bias=False)`` shared
    by all layers, stored stacked as ``gate_weight [E, N]``. With one expert the gate is skipped
    (softmax over one expert is 1), as in torchrec. Kernels are xavier-normal per expert, gates get
    nn.Linear's default init.
    """

    def __init__(
        self,
        in_features: int,
        num_layers: int,
        num_experts: int = 1,
        low_rank: int = 1,
        activation: ActivationSpec = "relu",
    ) -> None:
        super().__init__()
        _check(in_features, num_layers, num_experts=num_experts, low_rank=low_rank)
        N, E, K = int(in_features), int(num_experts), int(low_rank)
        self.in_features = self.out_features = N
        self.num_layers, self.num_experts, self.low_rank = int(num_layers), E, K
        self.U_kernels = _layers(num_layers, E, N, K)
        self.V_kernels = _layers(num_layers, E, K, N)
        self.C_kernels = _layers(num_layers, E, K, K)
        self.bias = _layers(num_layers, N, 1)
        self.gate_weight = nn.Parameter(torch.empty(E, N)) if E > 1 else None
        self.activation = make_activation(activation, layer="LowRankMixtureCrossNet")
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for u, v, c, b in zip(self.U_kernels, self.V_kernels, self.C_kernels, self.bias):
            for e in range(self.num_experts):
                nn.init.xavier_normal_(u.data[e])
                nn.init.xavier_normal_(v.data[e])
                nn.init.xavier_normal_(c.data[e])
            nn.init.zeros_(b)
        if self.gate_weight is not None:
            bound = 1.0 / self.in_features**0.5  # nn.Linear(N, 1) default
            nn.init.uniform_(self.gate_weight, -bound, bound)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        B, N = x0.shape
        E, K = self.num_experts, self.low_rank
        f = self.activation
        x = x0  # (B, N)
        for u, v, c, b in zip(self.U_kernels, self.V_kernels, self.C_kernels, self.bias):
            h = f(x @ v.reshape(E * K, N).t())  # (B, E*K): V_l[e] x_l for all e
            h = f(torch.bmm(h.view(B, E, K).transpose(0, 1), c.transpose(1, 2)))  # (E, B, K)
            if self.gate_weight is None:
                x = x0 * (h[0] @ u[0].t() + b.view(-1)) + x  # (B, N)
                continue
            # sum_e g_e x0 ⊙ (U_e h_e + b) = x0 ⊙ ([U_1 .. U_E] [g_1 h_1; ..; g_E h_E] + (sum_e g_e) b): the gates
            # scale the (B, K) codes before ONE up-projection, so no (E, B, N) expert outputs exist (same terms)
            gates = torch.softmax(x @ self.gate_weight.t(), dim=1)  # (B, E)
            gated = (h * gates.t().unsqueeze(2)).transpose(0, 1).reshape(B, E * K)  # (B, E*K)
            up = gated @ u.permute(1, 0, 2).reshape(N, E * K).t()  # (B, N)
            x = x0 * (up + gates.sum(1, keepdim=True) * b.view(-1)) + x  # (B, N)
        return x
