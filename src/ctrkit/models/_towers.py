"""Small building helpers shared by the zoo models: option checks, the deep tower's option group and the
deep tower + output unit.

Every helper turns a bad option into a :class:`ConfigError` that names the model and the option, so
a model file only states its architecture. Not a model module (leading underscore: not auto-imported
by the registry).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypedDict

import torch
from torch import nn

from ctrkit.io import did_you_mean
from ctrkit.models.registry import ConfigError, register_option_group, resolve_options
from ctrkit.nn.mlp import MLP


class DNNOptions(TypedDict, total=False):
    """The deep tower's options, taken as ``**dnn: Unpack[DNNOptions]`` by every model that has one:
    ``dnn_hidden`` widths (``()``: no tower), ``dnn_activation`` (:func:`ctrkit.nn.activation.make_activation`),
    ``dnn_dropout`` after each layer, ``dnn_batch_norm`` before each activation."""

    dnn_hidden: tuple[int, ...]
    dnn_activation: str
    dnn_dropout: float
    dnn_batch_norm: bool


register_option_group(DNNOptions, {"dnn_hidden": (256, 128), "dnn_activation": "relu", "dnn_dropout": 0.0,
                                   "dnn_batch_norm": False})


def dnn_options(model: object, given: Mapping[str, Any]) -> dict[str, Any]:
    """``model``'s deep-tower options, every key present (group defaults < the model's
    ``option_defaults`` < ``given``); a key outside the group is a ConfigError with a suggestion."""
    return resolve_options(model, DNNOptions, given)


def check_choice(model: str, option: str, value: str, valid: Sequence[str]) -> None:
    """ConfigError ``"<model>: unknown <option>=<value> (did you mean ..?); valid: ..."`` unless valid."""
    if value not in valid:
        hint = did_you_mean(str(value), tuple(valid))
        raise ConfigError(f"{model}: unknown {option}={value!r}{hint}; valid: {', '.join(valid)}")


def check_min(model: str, option: str, value: float, minimum: float) -> None:
    """ConfigError unless ``value >= minimum``."""
    if value < minimum:
        raise ConfigError(f"{model}: option {option} must be >= {minimum}, got {value}")


@contextmanager
def layer_options(model: str, options: str) -> Iterator[None]:
    """Re-raise a layer's ValueError (LayerConfigError, MLP size errors...) as a ConfigError naming
    the model and the options that built the layer."""
    try:
        yield
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(f"{model}: bad {options}: {e}") from e


class TowerHead(nn.Module):
    """The deep tower and the output unit over it: ``logit = w^T [side; MLP(x)] + b`` -> (B,).

    ``MLP(x)``: ``in_features`` -> ``dnn_hidden`` widths, every layer activated, as ``model``'s deep-tower
    options ``dnn`` say (:class:`DNNOptions`, completed by :func:`dnn_options`); no ``dnn`` or
    ``dnn_hidden=()`` keeps x as it is, so the unit reads x directly. ``side_features`` > 0: another
    branch's output (B, S) joins in front of the tower's (DCN's cross net, NCF's GMF, AutoInt's
    attention). ``bias=False`` where the model's one bias lives elsewhere. Parameters are created tower
    first, then the unit.
    """

    def __init__(
        self,
        model: nn.Module,
        in_features: int,
        dnn: Mapping[str, Any] | None = None,
        *,
        side_features: int = 0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.tower: MLP | None = None
        opts = dnn_options(model, dnn) if dnn is not None else None
        if opts is not None and opts["dnn_hidden"]:
            name = getattr(model, "model_name", "") or type(model).__name__
            with layer_options(name, "dnn_hidden / dnn_activation / dnn_dropout / dnn_batch_norm"):
                self.tower = MLP(in_features, list(opts["dnn_hidden"]), activation=opts["dnn_activation"],
                                 dropout=opts["dnn_dropout"], batch_norm=opts["dnn_batch_norm"])
        width = self.tower.out_features if self.tower is not None else in_features
        self.out = nn.Linear(side_features + width, 1, bias=bias)

    def forward(self, x: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        h = self.tower(x) if self.tower is not None else x  # (B, H)
        if side is not None:
            h = torch.cat([side, h], dim=1)  # (B, S + H)
        return self.out(h).squeeze(-1)  # (B,)
