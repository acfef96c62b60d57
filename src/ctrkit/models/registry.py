"""Model registry: ``@register_model("name")`` on a class, ``create_model(name, schema, **params)``.

A model's keyword-only ``__init__`` signature *is* its hyper-parameter schema: ``create_model``
rejects unknown parameters with the closest valid name, so a typo never passes silently, and checks
every value against the parameter's annotation like a config value (:mod:`ctrkit.typecheck`): a
list from YAML becomes the annotated tuple, an int is accepted for a float, a ``Literal`` lists its
choices, and a wrong value is a :class:`ConfigError` naming the model, the parameter, the expected
type and the value before the model is built.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from ctrkit.errors import ConfigError
from ctrkit.schema import Schema
from ctrkit.typecheck import coerce, is_supported, suggest

__all__ = [
    "ConfigError", "check_model_params", "create_model", "get_model_class", "list_models", "model_params",
    "register_model", "suggest",
]

_MODELS: dict[str, type[nn.Module]] = {}
M = TypeVar("M", bound=type[nn.Module])


def register_model(name: str) -> Callable[[M], M]:
    def deco(cls: M) -> M:
        if name in _MODELS and _MODELS[name] is not cls:
            raise ValueError(f"model name {name!r} is already registered by {_MODELS[name].__qualname__}")
        cls.model_name = name  # type: ignore[attr-defined]
        _MODELS[name] = cls
        return cls

    return deco


def _load_builtin() -> None:
    # importing ctrkit.models registers every built-in model
    import ctrkit.models  # noqa: F401


def list_models() -> list[str]:
    """Registered model names; names starting with "_" are private (e.g. test doubles) and not listed."""
    _load_builtin()
    return sorted(n for n in _MODELS if not n.startswith("_"))


def get_model_class(name: str) -> type[nn.Module]:
    _load_builtin()
    if name not in _MODELS:
        raise ConfigError(f"unknown model {name!r}{suggest(name, _MODELS)}; see `ctrkit models`")
    return _MODELS[name]


def model_params(name: str) -> dict[str, Any]:
    """Keyword-only hyper-parameters of model ``name`` with their defaults."""
    sig = inspect.signature(get_model_class(name).__init__)
    return {
        p.name: p.default
        for p in sig.parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def _param_annotations(cls: type[nn.Module]) -> dict[str, Any]:
    """Resolved annotations of ``cls.__init__`` ({} when they cannot be resolved)."""
    try:
        return typing.get_type_hints(cls.__init__)
    except (NameError, TypeError, AttributeError):  # an annotation unresolvable at runtime: unchecked
        return {}


def check_model_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` checked against model ``name``'s keyword-only parameters and their annotations;
    returns them converted (lists -> tuples where annotated so, ints -> floats)."""
    cls = get_model_class(name)
    valid = model_params(name)
    hints = _param_annotations(cls)

    def choice_error(key: str, value: Any, choices: tuple[Any, ...]) -> ConfigError:
        close = suggest(str(value), [str(c) for c in choices])
        hint = close if "did you mean" in close else ""
        return ConfigError(f"{name}: unknown {key}={value!r}{hint}; valid: {', '.join(map(str, choices))}")

    out = {}
    for key, value in params.items():
        if key not in valid:
            raise ConfigError(f"model {name!r} has no parameter {key!r}{suggest(key, valid)}")
        tp = hints.get(key)
        if tp is None or not is_supported(tp):
            out[key] = value
        else:
            out[key] = coerce(value, tp, key, what=f"{name}: parameter", choice_error=choice_error)
    return out


def create_model(name: str, schema: Schema, **params: Any) -> nn.Module:
    """Model ``name`` built on ``schema`` with ``params`` (checked by :func:`check_model_params`)."""
    return get_model_class(name)(schema, **check_model_params(name, params))
