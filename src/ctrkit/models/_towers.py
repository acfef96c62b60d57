"""Small building helpers shared by the zoo models: option checks and the deep tower + output unit.

Every helper turns a bad option into a :class:`ConfigError` that names the model and the option, so
a model file only states its architecture. Not a model module (leading underscore: not auto-imported
by the registry).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from ctrkit.models.registry import ConfigError, suggest
from ctrkit.nn.mlp import MLP


def check_choice(model: str, option: str, value: str, valid: Sequence[str]) -> None:
    """ConfigError ``"<model>: unknown <option>=<value> (did you mean ..?); valid: ..."`` unless valid."""
    if value not in valid:
        close = suggest(str(value), tuple(valid))
        hint = close if "did you mean" in close else ""
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

    ``MLP(x)``: ``in_features`` -> ``hidden`` widths, every layer activated (the model's
    ``dnn_hidden / dnn_activation / dnn_dropout / dnn_batch_norm``); ``hidden=()`` keeps x as it is,
    so the unit reads x directly. ``side_features`` > 0: another branch's output (B, S) joins in front
    of the tower's (DCN's cross net, NCF's GMF, AutoInt's attention). ``bias=False`` where the model's
    one bias lives elsewhere. Parameters are created tower first, then the unit.
    """

    def __init__(
        self,
        model: str,
        in_features: int,
        hidden: Sequence[int],
        *,
        activation: str = "relu",
        dropout: float = 0.0,
        batch_norm: bool = False,
        side_features: int = 0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.tower: MLP | None = None
        if hidden:
            with layer_options(model, "dnn_hidden / dnn_activation / dnn_dropout / dnn_batch_norm"):
                self.tower = MLP(in_features, list(hidden), activation=activation, dropout=dropout,
                                 batch_norm=batch_norm)
        width = self.tower.out_features if self.tower is not None else in_features
        self.out = nn.Linear(side_features + width, 1, bias=bias)

    def forward(self, x: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        h = self.tower(x) if self.tower is not None else x  # (B, H)
        if side is not None:
            h = torch.cat([side, h], dim=1)  # (B, S + H)
        return self.out(h).squeeze(-1)  # (B,)
