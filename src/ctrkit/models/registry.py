"""Model registry: ``@register_model("name")`` on a class, ``create_model(name, schema, **params)``.

A model's keyword-only ``__init__`` signature *is* its hyper-parameter schema: ``create_model``
rejects unknown parameters with the closest valid name, so a typo never passes silently, and checks
every value against the parameter's annotation like a config value (:mod:`ctrkit.typecheck`): a
list from YAML becomes the annotated tuple, an int is accepted for a float, a ``Literal`` lists its
choices, and a wrong value is a :class:`ConfigError` naming the model, the parameter, the expected
type and the value before the model is built.

Options shared by many models (the deep tower's ``dnn_hidden / dnn_activation / dnn_dropout /
dnn_batch_norm``) are written once, as an *option group*: a ``TypedDict`` registered with its
defaults (:func:`register_option_group`) and taken as ``**dnn: Unpack[DNNOptions]`` (PEP 692). Its keys
are parameters of the model like the keyword-only ones (listed, type-checked, suggested on a typo);
a model whose defaults differ says so in its ``option_defaults`` class attribute, and reads the
resolved values with :func:`resolve_options`.

Embedding options, taken by every model (:class:`EmbeddingOptions`; applied by :func:`create_model`, so no
model file handles them): ``embedding_dim`` D of every table and ``embedding_dims`` {table: D} per table (the
store schema's dims are only the default: the same store trains at D = 8, 16 or 64), and
``embedding_backend`` (the embedding factory's backend, :func:`ctrkit.nn.embedding_factory.make_embeddings`).

Renamed options: a model lists the names (and values) it no longer takes in its ``renamed_options`` /
``renamed_values`` class attributes. A config that still uses one is a :class:`ConfigError` naming the new
name; a checkpoint written before the rename is rebuilt through :func:`upgrade_params` (old -> new), so it
keeps loading.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypedDict, TypeVar

from torch import nn
from typing_extensions import Unpack

from ctrkit.errors import ConfigError, LayerConfigError, SchemaError
from ctrkit.io import did_you_mean
from ctrkit.nn.embedding import embedding_backend
from ctrkit.schema import Schema
from ctrkit.typecheck import coerce, is_supported, suggest

__all__ = [
    "ConfigError", "check_model_params", "create_model", "get_model_class", "list_models", "model_params",
    "register_model", "register_option_group", "resolve_options", "suggest", "upgrade_params",
]

_MODELS: dict[str, type[nn.Module]] = {}
_OPTION_GROUPS: dict[type, dict[str, Any]] = {}  # TypedDict -> its defaults
_UNPACKS = {Unpack, getattr(typing, "Unpack", Unpack)}  # typing_extensions' and (Python >= 3.11) typing's
M = TypeVar("M", bound=type[nn.Module])


class EmbeddingOptions(TypedDict, total=False):
    """What every model takes about its embedding tables (see the module docstring)."""

    embedding_dim: int | None
    embedding_dims: dict[str, int] | None
    embedding_backend: Literal["fused", "torchrec"]


EMBEDDING_DEFAULTS: dict[str, Any] = {"embedding_dim": None, "embedding_dims": None, "embedding_backend": "fused"}


def register_option_group(group: type, defaults: Mapping[str, Any]) -> None:
    """Declare the TypedDict ``group`` an option group with ``defaults`` (one for each of its keys)."""
    keys = set(typing.get_type_hints(group))
    if set(defaults) != keys:
        raise ValueError(f"option group {group.__name__}: defaults {sorted(defaults)} must cover its keys {sorted(keys)}")
    _OPTION_GROUPS[group] = dict(defaults)


def _group_of(tp: Any) -> type | None:
    """The option group of a ``**kwargs`` annotation ``Unpack[Group]`` (None for anything else)."""
    if typing.get_origin(tp) in _UNPACKS:
        (group,) = typing.get_args(tp)
        if group in _OPTION_GROUPS:
            return group
    return None


def resolve_options(model: type | object, group: type, given: Mapping[str, Any]) -> dict[str, Any]:
    """Every option of ``group`` for ``model``: the group's defaults, then the model class's
    ``option_defaults``, then ``given``. A key outside the group is a ConfigError naming the model and
    the closest valid key (keys reach here unchecked when a model is built directly, not by name)."""
    cls = model if isinstance(model, type) else type(model)
    defaults = _OPTION_GROUPS[group]
    unknown = [k for k in given if k not in defaults]
    if unknown:
        name = getattr(cls, "model_name", "") or cls.__name__
        raise ConfigError(f"model {name!r} has no parameter {unknown[0]!r}{suggest(unknown[0], defaults)}")
    own = getattr(cls, "option_defaults", {})
    return {k: given[k] if k in given else own.get(k, v) for k, v in defaults.items()}


def register_model(name: str) -> Callable[[M], M]:
    def deco(cls: M) -> M:
        if name in _MODELS and _MODELS[name] is not cls:
            raise ValueError(f"model name {name!r} is already registered by {_MODELS[name].__qualname__}")
        taken = set(inspect.signature(cls.__init__).parameters) & set(EMBEDDING_DEFAULTS)
        if taken:
            raise ValueError(f"model {name!r}: {sorted(taken)} are options every model takes (create_model applies "
                             "them to the schema); do not declare them in __init__")
        cls.model_name = name  # type: ignore[attr-defined]
        _MODELS[name] = cls
        return cls

    return deco


def list_models() -> list[str]:
    """Registered model names; names starting with "_" are private (e.g. test doubles) and not listed.

    Every built-in model is registered by then: importing this module imports its package first, and
    ``ctrkit/models/__init__.py`` imports every model module (so the registry never imports the models)."""
    return sorted(n for n in _MODELS if not n.startswith("_"))


def get_model_class(name: str) -> type[nn.Module]:
    if name not in _MODELS:
        raise ConfigError(f"unknown model {name!r}{suggest(name, _MODELS)}; see `ctrkit models`")
    return _MODELS[name]


def model_params(name: str) -> dict[str, Any]:
    """Hyper-parameters of model ``name`` with their defaults: the keyword-only ones, then the keys of
    its option groups (``**dnn: Unpack[DNNOptions]``)."""
    cls = get_model_class(name)
    sig = inspect.signature(cls.__init__)
    hints = _init_hints(cls)
    out: dict[str, Any] = {}
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            out[p.name] = p.default
        elif p.kind is inspect.Parameter.VAR_KEYWORD and (group := _group_of(hints.get(p.name))) is not None:
            out.update(resolve_options(cls, group, {}))
    out.update(EMBEDDING_DEFAULTS)
    return out


def _init_hints(cls: type[nn.Module]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls.__init__)
    except (NameError, TypeError, AttributeError):  # an annotation unresolvable at runtime: unchecked
        return {}


def _param_annotations(cls: type[nn.Module]) -> dict[str, Any]:
    """Resolved annotations of ``cls.__init__``'s parameters, option groups expanded to their keys
    ({} when they cannot be resolved)."""
    out: dict[str, Any] = {}
    for key, tp in _init_hints(cls).items():
        group = _group_of(tp)
        out.update(typing.get_type_hints(group) if group is not None else {key: tp})
    out.update(typing.get_type_hints(EmbeddingOptions))
    return out


def check_model_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` checked against model ``name``'s keyword-only parameters and their annotations;
    returns them converted (lists -> tuples where annotated so, ints -> floats)."""
    cls = get_model_class(name)
    valid = model_params(name)
    hints = _param_annotations(cls)

    def choice_error(key: str, value: Any, choices: tuple[Any, ...]) -> ConfigError:
        hint = did_you_mean(str(value), [str(c) for c in choices])
        return ConfigError(f"{name}: unknown {key}={value!r}{hint}; valid: {', '.join(map(str, choices))}")

    renamed: Mapping[str, str] = getattr(cls, "renamed_options", {})
    old_values: Mapping[str, Mapping[Any, Any]] = getattr(cls, "renamed_values", {})
    out = {}
    for key, value in params.items():
        if key in renamed and key not in valid:
            raise ConfigError(f"model {name!r} has no parameter {key!r}: it was renamed; use {renamed[key]!r} "
                              f"(e.g. model.params.{renamed[key]}={value!r})")
        if key not in valid:
            raise ConfigError(f"model {name!r} has no parameter {key!r}{suggest(key, valid)}")
        if isinstance(value, str) and value in old_values.get(key, {}):
            raise ConfigError(f"{name}: {key}={value!r} was renamed; use {key}={old_values[key][value]!r}")
        tp = hints.get(key)
        if tp is None or not is_supported(tp):
            out[key] = value
        else:
            out[key] = coerce(value, tp, key, what=f"{name}: parameter", choice_error=choice_error)
    dims = {"embedding_dim": out.get("embedding_dim"), **(out.get("embedding_dims") or {})}
    bad = {k: d for k, d in dims.items() if d is not None and d < 1}
    if bad:
        raise ConfigError(f"{name}: embedding dims must be >= 1, got {bad}")
    return out


def upgrade_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as saved by an older release, with renamed options and values mapped to today's (for
    checkpoints; a user's config gets an error naming the new name instead, see :func:`check_model_params`)."""
    cls = get_model_class(name)
    renamed: Mapping[str, str] = getattr(cls, "renamed_options", {})
    old_values: Mapping[str, Mapping[Any, Any]] = getattr(cls, "renamed_values", {})
    out: dict[str, Any] = {}
    for key, value in params.items():
        key = renamed.get(key, key)
        if isinstance(value, str):
            value = old_values.get(key, {}).get(value, value)
        out[key] = value
    return out


def create_model(name: str, schema: Schema, **params: Any) -> nn.Module:
    """Model ``name`` built on ``schema`` with ``params`` (checked by :func:`check_model_params`); the
    embedding options (:class:`EmbeddingOptions`) choose the tables' dims and backend, the rest go to the
    model's constructor."""
    params = check_model_params(name, params)
    emb = {k: params.pop(k) for k in EMBEDDING_DEFAULTS if k in params}
    try:
        schema = schema.with_embedding_dims(emb.get("embedding_dim"), emb.get("embedding_dims"))
    except SchemaError as e:
        raise ConfigError(f"{name}: {e}") from None
    try:
        with embedding_backend(emb.get("embedding_backend", "fused")):
            return get_model_class(name)(schema, **params)
    except LayerConfigError as e:
        if "embedding backend" not in str(e):
            raise
        raise ConfigError(f"{name}: embedding_backend: {e}") from None
