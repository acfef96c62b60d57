"""Multi-layer perceptron: the DenseArch / OverArch of DLRM (seed 000 §3.4) and every "deep" part.

Each hidden layer is ``Linear -> [BatchNorm1d] -> activation -> [Dropout]`` (:class:`ctrkit.nn.dropout.Dropout`). With
``final_activation=False`` the last layer is a plain Linear (an OverArch ending in a logit).
Init: PyTorch's default ``nn.Linear`` init (kaiming-uniform weights, U(-1/sqrt(fan_in), 1/sqrt(fan_in))
bias), which is what torchrec's ``MLP``/``Perceptron`` used by DenseArch and OverArch relies on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ctrkit.errors import LayerConfigError
from ctrkit.nn import mlp_native
from ctrkit.nn.activation import ActivationSpec, make_activation
from ctrkit.nn.dropout import Dropout


def _relu_stack(layers: list[nn.Module]) -> tuple[bool, ...] | None:
    """Per Linear, whether a ReLU follows it, where ``layers`` are Linear [-> ReLU] pairs alone; else None."""
    relu: list[bool] = []
    for m in layers:
        if type(m) is nn.Linear:
            relu.append(False)
        elif type(m) is nn.ReLU and relu and not relu[-1]:
            relu[-1] = True
        else:
            return None  # BatchNorm, dropout, another activation: the layers run one by one
    return tuple(relu) if relu else None


class MLP(nn.Module):
    """``[B, in_features] -> [B, hidden[-1]]`` (``in_features`` if ``hidden`` is empty).

    Args:
        in_features: input width.
        hidden: output width of each layer, in order.
        activation: name ("relu", "sigmoid", "tanh", "gelu", "silu", "prelu", "dice", ...) or module factory
            (:func:`~ctrkit.nn.activation.make_activation`, given each layer's width for "dice"; a factory
            gives each layer its own module).
        dropout: dropout probability after each activated layer (0 = none).
        batch_norm: BatchNorm1d between each Linear and its activation.
        final_activation: apply BN/activation/dropout after the last layer too (DenseArch: True;
            an OverArch producing a logit: False).
    """

    def __init__(
        self,
        in_features: int,
        hidden: Sequence[int],
        *,
        activation: ActivationSpec = "relu",
        dropout: float = 0.0,
        batch_norm: bool = False,
        final_activation: bool = True,
    ) -> None:
        super().__init__()
        hidden = [int(h) for h in hidden]
        if in_features < 1 or any(h < 1 for h in hidden):
            raise LayerConfigError(f"MLP sizes must be positive, got in_features={in_features}, hidden={hidden}")
        if not 0.0 <= dropout < 1.0:
            raise LayerConfigError(f"MLP dropout must be in [0, 1), got {dropout}")
        self.in_features = int(in_features)
        self.out_features = hidden[-1] if hidden else self.in_features
        layers: list[nn.Module] = []
        prev = self.in_features
        for i, h in enumerate(hidden):
            layers.append(nn.Linear(prev, h))
            if final_activation or i < len(hidden) - 1:
                if batch_norm:
                    layers.append(nn.BatchNorm1d(h))
                act = make_activation(activation, layer="MLP", num_features=h)
                if type(act) is nn.ReLU:  # in place on the Linear / BatchNorm output, which no backward reads:
                    act.inplace = True  # the same values, one (B, h) buffer less per layer and step
                layers.append(act)
                if dropout > 0:
                    layers.append(Dropout(dropout))  # torch's layer with a cheaper mask (nn/dropout.py)
            prev = h
        self.layers = nn.Sequential(*layers)
        # Linear [-> ReLU] layers alone (no BatchNorm, dropout or other activation): training runs them as one
        # autograd node with a native backward epilogue (nn/mlp_native.py), the same floats
        self._relu_stack = _relu_stack(layers)
        self._relu_width = sum(h for h, r in zip(hidden, self._relu_stack or ()) if r)  # values a row, ReLU'd

    def reset_parameters(self) -> None:
        for m in self.layers:
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the node's cheap size test first: small batches (the zoo's) skip the rest at once; never under export /
        # compile (the size test on a symbolic batch would add a guard)
        if (self._relu_stack is not None and not torch.compiler.is_compiling()
                and not torch.compiler.is_exporting()
                and x.shape[0] * self._relu_width >= mlp_native.MIN_KERNEL_ELEMENTS and torch.is_grad_enabled()
                and not any(m._forward_hooks or m._forward_pre_hooks for m in self.layers)):  # hooks see the layers
            out = mlp_native.relu_mlp(x, [m for m in self.layers if type(m) is nn.Linear], self._relu_stack)
            if out is not None:
                return out  # (B, out_features)
        return self.layers(x)  # (B, out_features)
