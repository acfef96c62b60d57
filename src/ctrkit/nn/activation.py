"""The one activation factory: every configurable activation in ctrkit (MLP layers, the deep towers,
CIN, the DCN-Mix cross net, DLRM's projection branches, DIN's attention unit) is built by
:func:`make_activation`. Activations with per-feature state (DIN's Dice) are built with ``num_features``."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ctrkit.errors import LayerConfigError

__all__ = ["ACTIVATIONS", "SIZED_ACTIVATIONS", "ActivationSpec", "make_activation"]

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


# names whose module needs the width of its input (built as factory(num_features))
SIZED_ACTIVATIONS = ("dice",)


def make_activation(spec: ActivationSpec, *, layer: str = "activation", num_features: int | None = None) -> nn.Module:
    """A new activation module from a name (case-insensitive, see :data:`ACTIVATIONS` and
    :data:`SIZED_ACTIVATIONS`) or a zero-argument factory; a module instance is returned as is (so layers
    built with it share it, and its parameters).

    ``num_features`` is the width of the activated input; only the sized names ("dice":
    :class:`~ctrkit.nn.sequence.Dice`) need it, the others ignore it. A name that is not known is a
    :class:`LayerConfigError` naming ``layer`` and the valid names.
    """
    if isinstance(spec, nn.Module):
        return spec
    if isinstance(spec, str):
        if spec.lower() == "dice":
            if num_features is None:
                raise LayerConfigError(f"{layer}: activation='dice' needs num_features (the width it normalises)")
            from ctrkit.nn.sequence import Dice  # deferred: nn.sequence builds MLPs, which import this module

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
