"""Model registry: ``@register_model("name")`` on a class, ``create_model(name, schema, **params)``.

A model's keyword-only ``__init__`` signature *is* its hyper-parameter schema: ``create_model``
rejects unknown parameters with the closest valid name, so a typo never passes silently.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from ctrkit.errors import ConfigError
from ctrkit.schema import Schema

_MODELS: dict[str, type[nn.Module]] = {}
M = TypeVar("M", bound=type[nn.Module])



def suggest(name: str, valid: list[str] | set[str] | tuple[str, ...]) -> str:
    """" (did you mean 'x'?)" for the closest valid name, or the list of valid names."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.5)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f"; valid: {sorted(valid)}"


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


def create_model(name: str, schema: Schema, **params: Any) -> nn.Module:
    cls = get_model_class(name)
    valid = model_params(name)
    for key in params:
        if key not in valid:
            raise ConfigError(f"model {name!r} has no parameter {key!r}{suggest(key, valid)}")
    return cls(schema, **params)
