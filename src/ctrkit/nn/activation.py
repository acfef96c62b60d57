"""The one activation factory: every configurable activation in ctrkit (MLP layers, the deep towers,
CIN, the DCN-Mix cross net, DLRM's projection branches) is built by :func:`make_activation`."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ctrkit.errors import LayerConfigError

__all__ = ["ACTIVATIONS", "ActivationSpec", "make_activation"]

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

# a name from ACTIVATIONS, a zero-argument module factory (e.g. nn.ReLU), or a module used as is
ActivationSpec = str | Callable[[], nn.Module] | nn.Module


def make_activation(spec: ActivationSpec, *, layer: str = "activation") -> nn.Module:
    """A new activation module from a name (case-insensitive, see :data:`ACTIVATIONS`) or a zero-argument
    factory; a module instance is returned as is (so layers built with it share it, and its parameters).

    A name that is not in :data:`ACTIVATIONS` is a :class:`LayerConfigError` naming ``layer`` and the
    valid names.
    """
    if isinstance(spec, nn.Module):
        return spec
    if isinstance(spec, str):
        factory = ACTIVATIONS.get(spec.lower())
        if factory is None:
            raise LayerConfigError(
                f"{layer}: unknown activation={spec!r}; valid: {', '.join(sorted(ACTIVATIONS))} "
                "(or a module factory such as nn.ReLU)"
            )
        return factory()
    if callable(spec):
        module = spec()
        if not isinstance(module, nn.Module):
            raise LayerConfigError(f"{layer}: activation factory {spec!r} returned {type(module).__name__}, "
                                   "not an nn.Module")
        return module
    raise LayerConfigError(f"{layer}: activation must be a name, a module factory or a module, got {spec!r}")
