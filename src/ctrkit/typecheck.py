"""Values checked against type annotations: the one coercion behind config keys, command-line
overrides and model parameters.

``coerce(value, tp, key)`` returns ``value`` as type ``tp`` or raises a :class:`ConfigError` that names
``key``, the expected type and the value. Supported annotations: ``bool``, ``int``, ``float`` (an int
is accepted), ``str``, ``Literal[...]`` (the choices are listed, with the closest one), ``X | None``,
``list[X]``, ``tuple[X, ...]`` / ``tuple[X, Y]`` (from a list: YAML has no tuples), ``dict[str, X]``,
dataclasses (built by ``build``, every key checked) and ``Any``.

Text typed on the command line arrives as :class:`CliValue` and is parsed for the target type
(``3e-4`` -> float, ``true`` -> bool, ``[64,32]`` -> list, ``null`` -> None where Optional).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

import yaml

from ctrkit.errors import ConfigError
from ctrkit.io import did_you_mean

__all__ = ["CliValue", "build", "coerce", "is_supported", "suggest", "type_name"]


class CliValue(str):
    """A value typed on the command line: still text, parsed for the target field's type."""


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NONE = {"null", "none", "~", ""}
_SCALARS = (bool, int, float, str)


# what users of DeepCTR / FuxiCTR / Keras call some of ctrkit's options (too far apart for a spelling match)
ALIASES = {"learning_rate": "lr", "lr_rate": "lr", "num_epochs": "epochs", "n_epochs": "epochs", "epoch": "epochs",
           "optimizer": "dense_optimizer", "l2_reg": "weight_decay", "l2": "weight_decay",
           "embedding_regularizer": "embedding_l2", "emb_lr": "embedding_lr", "patience": "early_stopping",
           "ema": "ema_decay", "ema_momentum": "ema_decay", "model_ema_decay": "ema_decay",
           "bs": "batch_size", "batchsize": "batch_size", "model_name": "name", "model": "name"}


def suggest(name: str, valid: list[str] | set[str] | tuple[str, ...] | dict[str, Any]) -> str:
    """" (did you mean 'x'?)" for the closest valid name (a known alias, else by spelling), or the list of
    valid names."""
    hint = did_you_mean(name, valid, aliases=ALIASES)
    if hint:
        return hint
    return f"; valid: {sorted(valid)}"


def type_name(tp: Any) -> str:
    """An annotation as a reader writes it: ``tuple[int, ...]``, ``int | None``, ``one of ['a', 'b']``."""
    if typing.get_origin(tp) is Literal:
        return f"one of {list(typing.get_args(tp))}"
    if typing.get_origin(tp) is not None:
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def is_supported(tp: Any) -> bool:
    """True when :func:`coerce` can check values of annotation ``tp``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp in _SCALARS or tp is type(None) or origin is Literal or dataclasses.is_dataclass(tp):
        return True
    if origin in (typing.Union, types.UnionType, list, tuple, dict):
        return all(a is Ellipsis or is_supported(a) for a in args)
    return False


def _choice_error(key: str, value: Any, choices: tuple[Any, ...]) -> ConfigError:
    return ConfigError(f"config key {key!r}: {value!r} is not one of {list(choices)}"
                       f"{suggest(str(value), [str(a) for a in choices])}")


def coerce(
    value: Any, tp: Any, key: str, *, what: str = "config key",
    choice_error: Callable[[str, Any, tuple[Any, ...]], ConfigError] = _choice_error,
) -> Any:
    """``value`` checked / converted to type ``tp``, else a ConfigError
    ``"<what> '<key>' expects <type>, got <value>"``.

    ``choice_error(key, value, choices)`` builds the error for a value outside a ``Literal``.
    """
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)

    def again(v: Any, t: Any, k: str) -> Any:
        return coerce(v, t, k, what=what, choice_error=choice_error)

    def bad(extra: str = "") -> ConfigError:
        return ConfigError(f"{what} {key!r} expects {type_name(tp)}, got {value!r}{extra}")

    if tp is Any:
        return yaml.safe_load(value) if isinstance(value, CliValue) else value
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and (value is None or (isinstance(value, CliValue) and value.lower() in _NONE)):
            return None
        rest = [a for a in args if a is not type(None)]
        for a in rest:
            try:
                return again(value, a, key)
            except ConfigError:
                pass
        raise bad()
    if origin is Literal:
        if value not in args:
            raise choice_error(key, value, args)
        return str(value) if isinstance(value, CliValue) else value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, CliValue):
            value = yaml.safe_load(value)
        if not isinstance(value, dict):
            raise bad(" (a mapping)")
        return build(tp, value, key)  # type: ignore[arg-type]
    scalar = _SCALARS.get(tp)
    if scalar is not None:
        ok, out = scalar(value)
        if ok:
            return out
        raise bad()
    if origin in (list, tuple):
        return _sequence(value, origin, args, key, again, bad)
    if origin is dict:
        if isinstance(value, CliValue):
            value = yaml.safe_load(value)
        if not isinstance(value, dict):
            raise bad(" (a mapping)")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): again(v, vt, f"{key}.{k}") for k, v in value.items()}
    raise TypeError(f"{what} {key!r} has unsupported type {tp!r}")  # a bug in the caller: see is_supported


def _as_bool(value: Any) -> tuple[bool, Any]:
    if isinstance(value, bool):
        return True, value
    if isinstance(value, CliValue) and value.lower() in _TRUE | _FALSE:
        return True, value.lower() in _TRUE
    return False, None


def _as_int(value: Any) -> tuple[bool, Any]:
    if isinstance(value, int) and not isinstance(value, bool):
        return True, value
    if isinstance(value, str):
        try:
            return True, int(value.replace("_", ""))
        except ValueError:
            pass
    return False, None


def _as_float(value: Any) -> tuple[bool, Any]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return True, float(value)
    if isinstance(value, str):  # PyYAML reads "3e-4" (no dot) as a string
        try:
            return True, float(value)
        except ValueError:
            pass
    return False, None


# scalar type -> (accepted, converted value)
_SCALARS: dict[Any, Any] = {
    bool: _as_bool, int: _as_int, float: _as_float,
    str: lambda v: (isinstance(v, str), str(v) if isinstance(v, str) else None),
    type(None): lambda v: (v is None, None),
}


def _sequence(value: Any, origin: Any, args: tuple[Any, ...], key: str, again: Any, bad: Any) -> list[Any] | tuple:
    """A list / tuple value: each item coerced to its annotation (``tuple[X, Y]``: exactly those items)."""
    if isinstance(value, CliValue):
        value = yaml.safe_load(value)
    if not isinstance(value, (list, tuple)):
        raise bad(" (give a list, e.g. [64, 32])")
    if origin is tuple and args and args[-1] is not Ellipsis:  # fixed length: tuple[str, str]
        if len(value) != len(args):
            raise bad(f" (give a list of {len(args)} items)")
        inner = list(args)
    else:
        inner = [args[0] if args else Any] * len(value)
    items = []
    for i, (v, t) in enumerate(zip(value, inner)):
        try:
            items.append(again(v, t, f"{key}[{i}]"))
        except ConfigError:
            raise bad(f" (item {i}: {v!r} is not {type_name(t)})") from None
    return tuple(items) if origin is tuple else items


def build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Dataclass ``cls`` from ``data``: every key must be a field (else a ConfigError with the closest
    field), every value is coerced to its field's annotation."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in names:
            where = f"in '{prefix}' " if prefix else "at the top level "
            raise ConfigError(f"unknown config key {key!r} {where}{suggest(str(k), names).lstrip()}")
        kwargs[k] = coerce(v, hints[k], key)
    return cls(**kwargs)
