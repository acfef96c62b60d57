"""The YAML feature spec of ``ctrkit preprocess table`` / ``behaviour``: parsing and validation
(unknown keys are errors naming the entry and the closest valid key).

Every key is declared below with its type and range (``min_freq: PositiveInt``, ``pooling: one of ...``) and
every value is checked against it by :func:`ctrkit.typecheck.coerce` before any row is read: ``embedding_dim:
eight``, ``threshold: high``, ``name: 123`` or ``multi_valued: "false"`` (a string, which is true) are errors
naming the feature, the key, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ctrkit.data.pipeline.vocab import MODES
from ctrkit.errors import ConfigError, DataError
from ctrkit.io import closest
from ctrkit.schema import GROUPS, POOLINGS, SEQUENCE_POOLINGS, SEQUENCE_ROLES
from ctrkit.typecheck import Delimiter, EmbeddingDim, MaxVocab, NonNegativeInt, PositiveInt, coerce, suggest

SPLITS = ("train", "valid", "test")


TRANSFORMS = ("none", "log", "standardize")


_TOP_KEYS = {"label", "weight", "group_id", "split_column", "dense", "sparse", "sequence", "options", "item_id"}
_COLUMNS: dict[str, Any] = {"weight": str | None, "group_id": str | None, "split_column": str | None,
                            "item_id": str | None}

_Group = Literal[GROUPS]  # type: ignore[valid-type]
# every key of an entry and the values it takes
_DENSE_KEYS: dict[str, Any] = {"name": str, "column": str, "transform": Literal[TRANSFORMS], "group": _Group}
_SPARSE_KEYS: dict[str, Any] = {
    "name": str, "column": str, "embedding_dim": EmbeddingDim, "table": str, "group": _Group,
    "min_freq": PositiveInt, "multi_valued": bool, "delimiter": Delimiter, "pooling": Literal[POOLINGS],
    "max_len": PositiveInt}
_SEQ_KEYS: dict[str, Any] = {
    "name": str, "column": str, "shares": str, "max_len": PositiveInt, "delimiter": Delimiter,
    "pooling": Literal[SEQUENCE_POOLINGS], "group": _Group, "role": Literal[SEQUENCE_ROLES] | None,
    "of": str | None, "session": NonNegativeInt | None}
_LABEL_KEYS: dict[str, Any] = {"column": str, "threshold": float}
# preprocess_table's defaults
OPTION_KEYS: dict[str, Any] = {"min_freq": PositiveInt, "max_vocab": MaxVocab | None,
                               "max_vocab_mode": Literal[MODES], "embedding_dim": EmbeddingDim}


def _choice(key: str, value: Any, choices: tuple[Any, ...]) -> ConfigError:
    return ConfigError(f"key {key!r}: {value!r} is not one of {list(choices)}{suggest(str(value), choices)}")


def _typed(where: str, what: str, given: dict[str, Any], types: dict[str, Any]) -> dict[str, Any]:
    """``given`` with every value checked against its key's declared type (``given``'s keys are known)."""
    try:
        return {k: coerce(v, types[k], str(k), what="key", choice_error=_choice) for k, v in given.items()}
    except ConfigError as e:
        hint = " (quote a name made of digits: '123')" if "expects str" in str(e) else ""
        raise DataError(f"{where}: {what}: {e}{hint}") from None


def _check_keys(where: str, what: str, given: Any, valid: set[str]) -> None:
    """Raise :class:`DataError` naming the unknown keys of ``given`` and the closest valid ones."""
    unknown = [k for k in given if k not in valid]
    if unknown:
        near = {k: closest(str(k), sorted(valid), cutoff=0.6) for k in unknown}
        hint = " ".join(f"{k!r}: did you mean {m!r}?" for k, m in near.items() if m)
        raise DataError(f"{where}: unknown keys {[str(k) for k in unknown]} in {what}; {hint + ' ' if hint else ''}"
                        f"valid keys: {sorted(valid)}")


@dataclass
class TableSpecYaml:
    """The parsed YAML spec (validated; unknown keys are errors naming the entry)."""

    label: str
    label_threshold: float | None
    weight: str | None
    group_id: str | None
    split_column: str | None
    dense: list[dict[str, Any]]
    sparse: list[dict[str, Any]]
    sequence: list[dict[str, Any]]
    options: dict[str, Any] = field(default_factory=dict)
    item_id: str | None = None  # the retrieval catalogue's item id: a sparse feature of group "item"

    def columns(self) -> list[str]:
        cols = [self.label, self.weight, self.group_id, self.split_column]
        cols += [e["column"] for e in (*self.dense, *self.sparse, *self.sequence)]
        return list(dict.fromkeys(c for c in cols if c))

    def to_dict(self) -> dict[str, Any]:
        """The spec as YAML-shaped data: ``load_spec(spec.to_dict())`` gives it back."""
        label: Any = self.label if self.label_threshold is None else {"column": self.label,
                                                                     "threshold": self.label_threshold}
        return {"label": label, "weight": self.weight, "group_id": self.group_id, "split_column": self.split_column,
                "dense": [dict(e) for e in self.dense], "sparse": [dict(e) for e in self.sparse],
                "sequence": [dict(e) for e in self.sequence], "options": dict(self.options),
                **({"item_id": self.item_id} if self.item_id is not None else {})}


def load_spec(path_or_dict: str | Path | dict[str, Any]) -> TableSpecYaml:
    """Read and validate a YAML feature spec."""
    where = str(path_or_dict) if not isinstance(path_or_dict, dict) else "spec"
    if isinstance(path_or_dict, dict):
        d = path_or_dict
    else:
        p = Path(path_or_dict)
        if not p.is_file():
            raise DataError(f"schema file {p} does not exist")
        try:
            d = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise DataError(f"{p} is not valid YAML: {e}") from e
    if not isinstance(d, dict):
        raise DataError(f"{where}: top level must be a mapping with keys {sorted(_TOP_KEYS)}")
    _check_keys(where, "the top level", d, _TOP_KEYS)
    if "label" not in d:
        raise DataError(f"{where}: needs a 'label' column")
    label, thr = d["label"], None
    if isinstance(label, dict):
        _check_keys(where, "label", label, _LABEL_KEYS)
        label = _typed(where, "label", label, _LABEL_KEYS)
        label, thr = label.get("column"), label.get("threshold")
        if label is None or thr is None:
            raise DataError(f"{where}: label as a mapping needs 'column' and 'threshold'")
    entries: dict[str, list[dict[str, Any]]] = {}
    for kind, keys in (("dense", _DENSE_KEYS), ("sparse", _SPARSE_KEYS), ("sequence", _SEQ_KEYS)):
        out = []
        for i, e in enumerate(d.get(kind) or []):
            if isinstance(e, str):
                e = {"name": e}
            if not isinstance(e, dict) or "name" not in e:
                raise DataError(f"{where}: {kind} entry #{i} needs a 'name'")
            _check_keys(where, f"{kind} feature {e['name']!r}", e, keys)
            e = _typed(where, f"{kind} feature {e['name']!r}", {**e, "column": e.get("column", e["name"])}, keys)
            if kind == "dense":
                e.setdefault("transform", "none")
            if kind == "sequence" and ("shares" not in e or "max_len" not in e):
                raise DataError(f"{where}: sequence feature {e['name']!r} needs 'shares' and 'max_len'")
            out.append(e)
        entries[kind] = out
    opts = d.get("options") or {}
    if not isinstance(opts, dict):
        raise DataError(f"{where}: options must be a mapping with keys {sorted(OPTION_KEYS)}, got {opts!r}")
    _check_keys(where, "options", opts, OPTION_KEYS)
    opts = _typed(where, "options", opts, OPTION_KEYS)
    if not isinstance(label, str):
        raise DataError(f"{where}: label must be a column name or {{column: C, threshold: t}}, got {label!r}")
    columns = _typed(where, "the top level", {k: d.get(k) for k in _COLUMNS}, _COLUMNS)
    item_id = d.get("item_id")
    if item_id is not None and item_id not in {e["name"] for e in entries["sparse"]}:
        raise DataError(f"{where}: item_id {item_id!r} is not one of the sparse features "
                        f"{[e['name'] for e in entries['sparse']]}")
    return TableSpecYaml(label, thr, columns["weight"], columns["group_id"], columns["split_column"],
                         entries["dense"], entries["sparse"], entries["sequence"], opts, item_id)
