"""Small building helpers shared by the zoo models (dcn, dcnv2, deepfm, xdeepfm, nfm, afm, fibinet, autoint).

Every helper turns a bad option into a :class:`ConfigError` that names the model and the option, so
a model file only states its architecture. Not a model module (leading underscore: not auto-imported
by the registry).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

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


def dnn_tower(
    model: str,
    in_features: int,
    hidden: Sequence[int],
    *,
    activation: str = "relu",
    dropout: float = 0.0,
    batch_norm: bool = False,
) -> MLP | None:
    """The deep part ``MLP(in_features, hidden)`` (every layer activated) or None for ``hidden=()``.

    (B, in_features) -> (B, hidden[-1]); the model adds its own ``nn.Linear(out_features, 1)`` head.
    """
    if not hidden:
        return None
    with layer_options(model, "dnn_hidden / dnn_activation / dnn_dropout"):
        return MLP(in_features, list(hidden), activation=activation, dropout=dropout, batch_norm=batch_norm)
