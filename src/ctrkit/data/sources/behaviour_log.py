"""Reading a behaviour log into codes (``ctrkit preprocess behaviour``'s input; formats and rules in
:mod:`ctrkit.data.sources.behaviour`): users and items numbered by first appearance, rows sorted by (user, time),
item attributes from the first row of each item (CSV / Parquet) or an S3-Rec JSON.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ctrkit.data.sources.behaviour_read import read_log, read_s3rec
from ctrkit.data.sources.behaviour_samples import sort_log
from ctrkit.errors import DataError

FORMATS = ("csv", "parquet", "s3rec")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_RESERVED = {"user", "item", "label", "group"}
_PREFIXES = ("hist", "neg_hist", "sess_")


@dataclass
class BehaviourLog:
    """A behaviour log in code space, rows sorted by (user, time) (stable: ties and logs without times keep
    file order); codes number users / items by first appearance in the file."""

    user: np.ndarray  # (n,) user codes
    item: np.ndarray  # (n,) item codes
    time: np.ndarray | None  # (n,) seconds (float64) or None
    user_keys: pa.Array  # (U,) raw user keys by code
    item_keys: pa.Array  # (I,) raw item keys by code
    attrs: dict[str, tuple[pa.Array, np.ndarray]] = field(default_factory=dict)  # name -> (keys, code per item)
    stats: dict[str, Any] = field(default_factory=dict)


def parse_attr_cols(specs: list[str] | dict[str, str] | None) -> dict[str, str]:
    """``["category:cate", "brand"]`` -> {source column: feature name}; names are checked."""
    if isinstance(specs, dict):
        pairs = dict(specs)
    else:
        pairs = {}
        for s in specs or []:
            col, _, name = s.partition(":")
            pairs[col] = name or col
    for col, name in pairs.items():
        if not _NAME.match(name) or name in _RESERVED or name.startswith(_PREFIXES):
            raise DataError(f"--attr-cols {col}:{name}: the feature name must be letters, digits and '_', not "
                            f"one of {sorted(_RESERVED)} and not start with {_PREFIXES} (it names hist_<name>, "
                            "sess_<k>_<name>); pick another name after the ':'")
    if len(set(pairs.values())) != len(pairs):
        raise DataError(f"--attr-cols {pairs}: two columns map to the same feature name")
    return pairs


def read_behaviour_log(input: str | Path, *, format: str | None = None, user_col: str = "user",
                       item_col: str = "item", attr_cols: list[str] | dict[str, str] | None = None,
                       time_col: str | None = None, type_col: str | None = None,
                       behaviour_types: list[str] | str | None = None, header: bool = True,
                       names: list[str] | str | None = None, delimiter: str = ",",
                       item_attributes: str | Path | None = None, max_bad_fraction: float = 0.001,
                       rating_col: str | None = None, min_rating: float | None = None) -> BehaviourLog:
    """Read a behaviour log (see the module docstring) into codes, sorted by (user, time). Malformed rows
    (wrong field count, empty user / item, a time that is not a number) are skipped and counted; above
    ``max_bad_fraction`` of them is an error naming the first lines. ``stats`` counts rows read, bad rows,
    behaviour types, out-of-order rows (a time earlier than the user's previous row in the file) and
    attribute conflicts. ``rating_col`` / ``min_rating``: only rows rated at least ``min_rating`` are behaviours
    (clicks); the others are dropped and counted in ``rows_below_min_rating``."""
    path = Path(input)
    if (rating_col is None) != (min_rating is None):
        raise DataError("--rating-col and --min-rating go together: rows whose rating column is >= --min-rating "
                        "are the behaviours (clicks), e.g. --rating-col rating --min-rating 4")
    if min_rating is not None and not np.isfinite(min_rating):
        raise DataError(f"--min-rating {min_rating} must be a finite number")
    fmt = format or ("parquet" if ".parquet" in path.suffixes else "csv")
    if fmt not in FORMATS:
        raise DataError(f"--format {fmt!r} is not one of {FORMATS}")
    if fmt == "s3rec":
        if attr_cols or time_col or type_col or rating_col:
            raise DataError("--format s3rec has no attribute, time, type or rating columns; give item attributes "
                            "with --item-attributes JSON")
        raw = read_s3rec(path)
        attrs = {"cate": None} if item_attributes is not None else {}
    else:
        if item_attributes is not None:
            raise DataError("--item-attributes is for --format s3rec; CSV / Parquet logs carry attribute "
                            "columns (--attr-cols)")
        attrs = parse_attr_cols(attr_cols)
        types = behaviour_types.split(",") if isinstance(behaviour_types, str) else behaviour_types
        if types and not type_col:
            raise DataError("--behaviour-types needs --type-col (the column holding the behaviour type)")
        raw = read_log(path, fmt, user_col=user_col, item_col=item_col, attr_cols=list(attrs),
                       time_col=time_col, type_col=type_col, types=types, header=header,
                       names=names.split(",") if isinstance(names, str) else names, delimiter=delimiter,
                       max_bad_fraction=max_bad_fraction, rating_col=rating_col, min_rating=min_rating)
        attrs = {attrs[c]: raw.attrs[c] for c in attrs}
    u = pc.dictionary_encode(raw.user)
    i = pc.dictionary_encode(raw.item)
    user = u.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    order, out_of_order = sort_log(user, raw.time)
    item = i.indices.to_numpy(zero_copy_only=False).astype(np.int64)[order]
    out = BehaviourLog(user[order], item, None if raw.time is None else raw.time[order], u.dictionary,
                       i.dictionary, stats={"format": fmt, **raw.stats, "out_of_order_rows": out_of_order})
    if fmt == "s3rec" and item_attributes is not None:
        keys, codes, missing = _s3rec_attributes(Path(item_attributes), i.dictionary)
        out.attrs["cate"] = (keys, codes)
        out.stats["items_without_attributes"] = missing
    _attribute_columns(out, attrs, order)
    return out


def _attribute_columns(out: BehaviourLog, attrs: dict[str, pa.Array | None], order: np.ndarray) -> None:
    """Each item's attributes (those of its first row in time order; ``order``: the sorted rows) into
    ``out.attrs``; rows that disagree are counted in ``attribute_conflicts``."""
    conflicts = {}
    item, n_items = out.item, len(out.item_keys)
    for name, col in attrs.items():
        if col is None:
            continue
        a = pc.dictionary_encode(col)
        code = a.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)[order]  # (n,) sorted rows
        per_item = np.full(n_items, -1, np.int64)
        ok = code >= 0
        first_items, first = np.unique(item[ok], return_index=True)
        per_item[first_items] = code[ok][first]
        pairs = np.unique(item[ok] * (len(a.dictionary) + 1) + code[ok])
        conflicts[name] = int(len(pairs) - len(first_items))
        out.attrs[name] = (a.dictionary, per_item)
    if conflicts:
        out.stats["attribute_conflicts"] = conflicts


def _s3rec_attributes(path: Path, item_keys: pa.Array) -> tuple[pa.Array, np.ndarray, int]:
    """{item: [attribute ids]} JSON -> (attribute keys, attribute code per item code (-1 missing), missing)."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"--item-attributes {path}: not a readable JSON file ({e})") from None
    if not isinstance(d, dict) or not all(isinstance(v, list) for v in d.values()):
        raise DataError(f"--item-attributes {path}: expected a mapping {{item: [attribute ids]}}")
    keys = pa.array(list(d.keys()), pa.string())
    last = pa.array([v[-1] if v else None for v in d.values()])  # the most specific category (module docstring)
    if pa.types.is_integer(item_keys.type):
        ok = pc.match_substring_regex(keys, r"^[+-]?[0-9]{1,18}$").to_numpy(zero_copy_only=False)
        if not ok.all():
            raise DataError(f"--item-attributes {path}: item key {keys[int(np.argmin(ok))]} is not an integer "
                            "but the log's item ids are")
        keys = pc.cast(keys, pa.int64())
    enc = pc.dictionary_encode(last)
    a_code = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)  # (J,) per JSON item
    jk = keys.to_numpy(zero_copy_only=False)
    order = np.argsort(jk, kind="stable")
    want = item_keys.to_numpy(zero_copy_only=False)
    pos = np.minimum(np.searchsorted(jk[order], want), max(len(jk) - 1, 0))
    hit = (jk[order][pos] == want) if len(jk) else np.zeros(len(want), bool)
    per_item = np.where(hit, a_code[order][pos] if len(jk) else -1, -1)
    return enc.dictionary, per_item.astype(np.int64), int((per_item < 0).sum())
