"""The search space of ``ctrkit tune``: YAML beside the config (``deepfm.search.yaml`` for ``deepfm.yaml``), every
key and value checked against the config before a trial runs (see :mod:`ctrkit.jobs.tune` for the format)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ctrkit.errors import ConfigError
from ctrkit.models.registry import check_model_params, model_params
from ctrkit.training.config import config_from_dict, set_key, walk_key
from ctrkit.typecheck import build, suggest

FLOAT_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


@dataclass
class ParamRange:
    """One searched key: a range ``low``..``high`` (``log`` scale, ``step``, ``int``) or a list of ``choices``."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    int: bool = False
    choices: list[Any] | None = None


@dataclass
class PrunerSpec:
    """``median``: stop a trial worse than the median of the finished ones at the same evaluation, once
    ``startup_trials`` finished, never before ``warmup_evals`` evaluations; ``none``: run every trial to its end."""

    kind: Literal["median", "none"] = "median"
    startup_trials: int = 3
    warmup_evals: int = 1


@dataclass
class SearchSpace:
    metric: str | None = None
    pruner: PrunerSpec = field(default_factory=PrunerSpec)
    params: dict[str, ParamRange] = field(default_factory=dict)


SPACE_SUFFIX = ".search.yaml"  # a config's search space lies beside it: deepfm.yaml -> deepfm.search.yaml


def default_space_path(config: str | Path) -> Path:
    """``configs/criteo/deepfm.yaml`` -> ``configs/criteo/deepfm.search.yaml``."""
    return Path(config).with_suffix(SPACE_SUFFIX)


# ---- the search space -------------------------------------------------------------------------------------
def load_search_space(path: str | Path, base: dict[str, Any]) -> SearchSpace:
    """The search space of ``path``, every key and value checked against ``base`` (a config's nested dict)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"search space {p} does not exist; write one (see configs/criteo/deepfm.search.yaml) "
                          "or pass --space PATH")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"search space {p} is not valid YAML: {e}") from None
    if not isinstance(raw, dict) or not raw.get("params"):
        raise ConfigError(f"search space {p} must be a mapping with a non-empty 'params' block, e.g. "
                          "params: {train.lr: {low: 1.0e-4, high: 1.0e-2, log: true}}")
    try:
        space = build(SearchSpace, raw)
        model = config_from_dict(copy.deepcopy(base)).model.name
        for key, spec in space.params.items():
            if spec.choices is not None:  # PyYAML reads 1e-3 (no dot) as text
                spec.choices = [float(c) if isinstance(c, str) and FLOAT_TEXT.fullmatch(c) else c for c in spec.choices]
            _check_range(key, spec)
            _check_key(key, model)
            ends = [int(spec.low), int(spec.high)] if spec.int else [spec.low, spec.high]  # type: ignore[arg-type]
            for value in spec.choices if spec.choices is not None else ends:
                _check_value(base, key, value)
    except ConfigError as e:
        raise ConfigError(f"search space {p}: {e}") from None
    if min(space.pruner.startup_trials, space.pruner.warmup_evals) < 0:
        raise ConfigError(f"search space {p}: pruner.startup_trials and pruner.warmup_evals must be >= 0")
    return space


def _check_range(key: str, s: ParamRange) -> None:
    ranged = s.low is not None or s.high is not None or s.log or s.step is not None or s.int
    checks = [(s.choices is None or (bool(s.choices) and not ranged), "give a non-empty 'choices' list alone"),
              (s.choices is not None or (s.low is not None and s.high is not None),
               "give 'low' and 'high' (a range) or 'choices' (a list)")]
    if s.choices is None and s.low is not None and s.high is not None:
        whole = [v for v in (s.low, s.high, s.step) if v is not None]
        checks += [(s.low <= s.high, f"low {s.low} is above high {s.high}"),
                   (not s.log or (s.low > 0 and s.step is None), "a log range needs low > 0 and no step"),
                   (s.step is None or s.step > 0, "step must be > 0"),
                   (not s.int or all(float(v).is_integer() for v in whole), f"an int range needs whole numbers: {whole}")]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(f"params {key!r}: {msg}")


def _check_key(key: str, model: str) -> None:
    """``key`` names a config value: a leaf of the config dataclasses, or ``model.params.<parameter>``."""
    parts = key.split(".")
    n, leaf = walk_key(parts, lambda here, parent, part, names: ConfigError(
        f"params {key!r}: unknown config key {here!r}{suggest(part, names)}"))
    if dataclasses.is_dataclass(leaf):
        raise ConfigError(f"params {key!r} is a block of the config; name one of its keys ({key}.<key>)")
    here, rest = ".".join(parts[:n]), parts[n:]
    if here == "model.params":
        name, valid = ".".join(rest), list(model_params(model))
        if name not in valid:
            raise ConfigError(f"params {key!r}: model {model!r} has no parameter {name!r}{suggest(name, valid)}")
    elif rest:
        raise ConfigError(f"params {key!r}: {here!r} is a value, it has no key {rest[0]!r}")


def _check_value(base: dict[str, Any], key: str, value: Any) -> None:
    try:
        cfg = config_from_dict(with_values(base, {key: value}))
        check_model_params(cfg.model.name, cfg.model.params)
    except ConfigError as e:
        hint = "; write int: true for a range of whole numbers" if "expects int" in str(e) else ""
        raise ConfigError(f"params {key!r}: the value {value!r} makes a bad config: {e}{hint}") from None


def with_values(base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of the nested config dict ``base`` with each dotted key of ``values`` set."""
    data = copy.deepcopy(base)
    for key, value in values.items():
        set_key(data, key.split("."), value, f"params {key!r}")
    return data


def suggest_value(trial: Any, key: str, s: ParamRange) -> Any:
    """The value of ``key`` that the optuna ``trial`` draws from ``s``."""
    if s.choices is not None:  # optuna's categorical values are scalars: lists travel as JSON text
        if all(c is None or isinstance(c, (bool, int, float, str)) for c in s.choices):
            return trial.suggest_categorical(key, s.choices)
        return json.loads(trial.suggest_categorical(key, [json.dumps(c) for c in s.choices]))
    if s.int:
        return trial.suggest_int(key, int(s.low), int(s.high), step=int(s.step or 1), log=s.log)
    return trial.suggest_float(key, s.low, s.high, step=s.step, log=s.log)
