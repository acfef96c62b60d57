"""The one activation factory: every configurable activation in ctrkit (MLP layers, the deep towers,
CIN, the DCN-Mix cross net, DLRM's projection branches, DIN's attention unit) is built by
:func:`make_activation`. Activations with per-feature state (DIN's Dice) are built with ``num_features``."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ctrkit.errors import LayerConfigError

__all__ = ["ACTIVATIONS", "SIZED_ACTIVATIONS", "ActivationSpec", "Dice", "make_activation"]

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "prelu": nn.PReLU,
    "leaky_relu": nn.LeakyReLU,
    "identity": nn.Identity,
    "linear": nn.Identity,
}


class Dice(nn.Module):
    """DIN's data-adaptive activation (paper eq. 2):

        p(s) = sigmoid( (s − E[s]) / sqrt(Var[s] + eps) )
        f(s) = p(s) · s + (1 − p(s)) · α · s                α ∈ R^H learned, init 0

    E[s], Var[s] are BatchNorm statistics without affine: in training the (biased) batch mean / variance
    over every dim but the last, with running estimates updated as ``nn.BatchNorm1d`` does (``momentum``,
    unbiased running variance); in eval the running estimates. Input (N, H) or (B, T, H) -> same shape.
    A training batch of a single row normalises to 0 (p = 1/2) and leaves the running estimates alone.
    """

    def __init__(self, num_features: int, *, eps: float = 1e-8, momentum: float = 0.1) -> None:
        super().__init__()
        if num_features < 1:
            raise LayerConfigError(f"Dice: num_features must be >= 1, got {num_features}")
        if eps <= 0 or not 0.0 <= momentum <= 1.0:
            raise LayerConfigError(f"Dice: need eps > 0 and momentum in [0, 1], got eps={eps}, momentum={momentum}")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.alpha = nn.Parameter(torch.empty(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.alpha)
        self.running_mean.zero_()
        self.running_var.fill_(1.0)

    def forward(self, s: Tensor) -> Tensor:
        if s.dim() < 2 or s.shape[-1] != self.num_features:
            raise LayerConfigError(
                f"Dice: input must be (..., {self.num_features}), got shape {list(s.shape)}"
            )
        flat = s.reshape(-1, self.num_features)  # (N, H)
        if self.training and flat.shape[0] < 2:  # BatchNorm cannot estimate a variance from one row
            z = torch.zeros_like(flat)
        else:
            z = F.batch_norm(
                flat, self.running_mean, self.running_var, None, None, self.training, self.momentum, self.eps
            )  # (N, H) standardised, no affine
        p = torch.sigmoid(z)
        out = flat * (self.alpha + p * (1.0 - self.alpha))  # p·s + (1 − p)·α·s
        return out.reshape(s.shape)

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, eps={self.eps}, momentum={self.momentum}"


# a name from ACTIVATIONS, a zero-argument module factory (e.g. nn.ReLU), or a module used as is
ActivationSpec = str | Callable[[], nn.Module] | nn.Module


# names whose module needs the width of its input (built as factory(num_features))
SIZED_ACTIVATIONS = ("dice",)


def make_activation(spec: ActivationSpec, *, layer: str = "activation", num_features: int | None = None) -> nn.Module:
    """A new activation module from a name (case-insensitive, see :data:`ACTIVATIONS` and
    :data:`SIZED_ACTIVATIONS`) or a zero-argument factory; a module instance is returned as is (so layers
    built with it share it, and its parameters).

    ``num_features`` is the width of the activated input; only the sized names ("dice":
    :class:`Dice`) need it, the others ignore it. A name that is not known is a
    :class:`LayerConfigError` naming ``layer`` and the valid names.
    """
    if isinstance(spec, nn.Module):
        return spec
    if isinstance(spec, str):
        if spec.lower() == "dice":
            if num_features is None:
                raise LayerConfigError(f"{layer}: activation='dice' needs num_features (the width it normalises)")
            return Dice(num_features)
        factory = ACTIVATIONS.get(spec.lower())
        if factory is None:
            raise LayerConfigError(
                f"{layer}: unknown activation={spec!r}; valid: {', '.join(sorted(ACTIVATIONS))}, "
                f"{', '.join(SIZED_ACTIVATIONS)} (or a module factory such as nn.ReLU)"
            )
        return factory()
    if callable(spec):
        module = spec()
        if not isinstance(module, nn.Module):
            raise LayerConfigError(f"{layer}: activation factory {spec!r} returned {type(module).__name__}, "
                                   "not an nn.Module")
        return module
    raise LayerConfigError(f"{layer}: activation must be a name, a module factory or a module, got {spec!r}")
