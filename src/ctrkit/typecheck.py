"""Values checked against type annotations: the one coercion behind config keys, command-line
overrides and model parameters.

``coerce(value, tp, key)`` returns ``value`` as type ``tp`` or raises a :class:`ConfigError` that names
``key``, the expected type and the value. Supported annotations: ``bool``, ``int``, ``float`` (an int
is accepted), ``str``, ``Literal[...]`` (the choices are listed, with the closest one), ``X | None``,
``list[X]``, ``tuple[X, ...]`` / ``tuple[X, Y]`` (from a list: YAML has no tuples), ``dict[str, X]``,
dataclasses (built by ``build``, every key checked) and ``Any``.

Text typed on the command line arrives as :class:`CliValue` and is parsed for the target type
(``3e-4`` -> float, ``true`` -> bool, ``[64,32]`` -> list, ``null`` -> None where Optional).

Constraints are declared with the type, as ``Annotated[int, Bound(lo=1)]`` (:data:`PositiveInt`, :data:`Fraction`,
:data:`Delimiter`, ...), and checked by the same ``coerce``: one copy of each rule for the config dataclasses, the
table schema's keys and the command-line options (:func:`cli_type` makes an argparse ``type=`` of an annotation).
Every float must be finite (NaN and infinities are refused) and every int must fit 64 bits.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import yaml

from ctrkit.errors import ConfigError
from ctrkit.io import did_you_mean

__all__ = ["Bound", "CliValue", "Delimiter", "EmbeddingDim", "Fraction", "MaxVocab", "NonNegativeFloat",
           "NonNegativeInt", "OneChar", "Port", "PositiveFloat", "PositiveInt", "Seed", "build", "cli_type", "coerce",
           "is_supported", "suggest", "type_name"]


class CliValue(str):
    """A value typed on the command line: still text, parsed for the target field's type."""


@dataclass(frozen=True)
class Bound:
    """A declared range of a number, ``Annotated[int, Bound(lo=1)]``: ``lo`` / ``hi`` included unless
    ``lo_open`` / ``hi_open``; None is unbounded."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def ok(self, v: float) -> bool:
        above = self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)
        return above and (self.hi is None or (v < self.hi if self.hi_open else v <= self.hi))

    def allowed(self) -> str:
        lo, hi = _number(self.lo), _number(self.hi)
        if self.lo is not None and self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {lo}"
        return f"{'<' if self.hi_open else '<='} {hi}" if self.hi is not None else "any"


def _non_finite(value: Any) -> bool:
    try:
        return isinstance(value, (float, str)) and not math.isfinite(float(value))
    except (ValueError, OverflowError):
        return False


def _number(x: float | None) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else str(x)


@dataclass(frozen=True)
class OneChar:
    """A delimiter: exactly one character, not a line break or a quote (those end or enclose fields)."""

    def ok(self, v: str) -> bool:
        return len(v) == 1 and v not in "\r\n\""

    def allowed(self) -> str:
        return "of one character (not a quote or a line break), e.g. ',' or '|'"


PositiveInt = Annotated[int, Bound(lo=1)]
NonNegativeInt = Annotated[int, Bound(lo=0)]
PositiveFloat = Annotated[float, Bound(lo=0, lo_open=True)]
NonNegativeFloat = Annotated[float, Bound(lo=0)]
Fraction = Annotated[float, Bound(0, 1)]
Seed = Annotated[int, Bound(0, 2**32 - 1)]  # what numpy, torch and random all take
Delimiter = Annotated[str, OneChar()]
Port = Annotated[int, Bound(0, 65535)]  # 0: any free port
MaxVocab = Annotated[int, Bound(lo=3)]  # ids 0 (missing) and 1 (rare / unseen) are reserved
EmbeddingDim = PositiveInt | Literal["auto"]
_INT64 = (-(2**63), 2**63 - 1)


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
    if typing.get_origin(tp) is Annotated:
        inner, *rules = typing.get_args(tp)
        return " and ".join(f"{type_name(inner)} {r.allowed()}" for r in rules)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        return " | ".join("None" if a is type(None) else type_name(a) for a in args)
    if typing.get_origin(tp) is Literal:
        return f"one of {list(typing.get_args(tp))}"
    if typing.get_origin(tp) in (list, tuple, dict):
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in typing.get_args(tp))
        return f"{typing.get_origin(tp).__name__}[{inner}]" if inner else typing.get_origin(tp).__name__
    if typing.get_origin(tp) is not None:
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def is_supported(tp: Any) -> bool:
    """True when :func:`coerce` can check values of annotation ``tp``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return is_supported(args[0])
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
        where = f"{what} {key!r} " if key else ""
        if not extra and _non_finite(value):
            extra = " (NaN and infinities are refused)"
        return ConfigError(f"{where}expects {type_name(tp)}, got {value!r}{extra}")

    if origin is Annotated:
        return _annotated(value, args, key, again, bad)
    if isinstance(value, CliValue) and (dataclasses.is_dataclass(tp) or origin in (list, tuple, dict)):
        value = _yaml(value, key, what)
    if tp is Any:
        return _yaml(value, key, what) if isinstance(value, CliValue) else value
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
        if not isinstance(value, dict):
            raise bad(" (a mapping)")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): again(v, vt, f"{key}.{k}") for k, v in value.items()}
    raise TypeError(f"{what} {key!r} has unsupported type {tp!r}")  # a bug in the caller: see is_supported


def _annotated(value: Any, args: tuple[Any, ...], key: str, again: Any, bad: Any) -> Any:
    """``Annotated[T, rule, ...]``: the value as T, then every declared rule (a :class:`Bound`, ...) must hold."""
    inner, *rules = args
    try:
        out = again(value, inner, key)
    except ConfigError:
        raise bad() from None
    if out is not None and not all(r.ok(out) for r in rules):
        raise bad()
    return out


def _yaml(text: str, key: str, what: str) -> Any:
    """Command-line text parsed as YAML; text that does not parse is a ConfigError naming the key."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = f"{what} {key!r}: " if key else ""
        mark = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(f"{where}{text!r} is not valid YAML ({mark}); quote lists and mappings whole, "
                          "e.g. '--model.params.dnn_hidden=[64, 32]'") from None


def cli_type(tp: Any) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses an option's text as annotation ``tp`` (constraints included): a bad value
    is argparse's one-line error naming the option, the value and what is allowed."""
    def parse(text: str) -> Any:
        try:
            return coerce(CliValue(text), tp, "")
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = type_name(tp)
    parse.annotation = tp  # type: ignore[attr-defined]  # read by the tests that draw bad values per option
    return parse


def _as_bool(value: Any) -> tuple[bool, Any]:
    if isinstance(value, bool):
        return True, value
    if isinstance(value, CliValue) and value.lower() in _TRUE | _FALSE:
        return True, value.lower() in _TRUE
    return False, None


def _as_int(value: Any) -> tuple[bool, Any]:
    out = None
    if isinstance(value, int) and not isinstance(value, bool):
        out = value
    elif isinstance(value, str):
        try:
            out = int(value.replace("_", ""))
        except ValueError:
            pass
    ok = out is not None and _INT64[0] <= out <= _INT64[1]
    return ok, out if ok else None


def _as_float(value: Any) -> tuple[bool, Any]:
    out = None
    try:
        # PyYAML reads "3e-4" (no dot) as a string
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            out = float(value)
    except (ValueError, OverflowError):
        pass
    ok = out is not None and math.isfinite(out)  # NaN never compares, so no bound could catch it later
    return ok, out if ok else None


# scalar type -> (accepted, converted value)
_SCALARS: dict[Any, Any] = {
    bool: _as_bool, int: _as_int, float: _as_float,
    str: lambda v: (isinstance(v, str), str(v) if isinstance(v, str) else None),
    type(None): lambda v: (v is None, None),
}


def _sequence(value: Any, origin: Any, args: tuple[Any, ...], key: str, again: Any, bad: Any) -> list[Any] | tuple:
    """A list / tuple value: each item coerced to its annotation (``tuple[X, Y]``: exactly those items)."""
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
    hints = typing.get_type_hints(cls, include_extras=True)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in names:
            where = f"in '{prefix}' " if prefix else "at the top level "
            raise ConfigError(f"unknown config key {key!r} {where}{suggest(str(k), names).lstrip()}")
        kwargs[k] = coerce(v, hints[k], key)
    return cls(**kwargs)
