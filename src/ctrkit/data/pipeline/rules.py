"""Typed column rules: a pipeline's spec compiled once into one :class:`ColumnRule` per raw column it reads.

Every reader of raw values applies these and no other rules: the encoder (:mod:`ctrkit.data.pipeline.encode`,
whole columns at a time, via :mod:`ctrkit.data.pipeline.columns`), the per-value reader of JSON requests
(:mod:`ctrkit.data.pipeline.values`, used by the server's validation) and the file readers. The constants
below are the value rules themselves:

==============  ==========================================================================================
``NUMBER``      what text is a number: optional sign, digits with an optional point (or a point and digits),
                an optional exponent, ASCII whitespace around; empty / blank text is a missing value
``F32_MAX``     the largest |dense value| or |weight| a store holds (float32); beyond it the row is bad
``COUNT_TEXT``  Criteo's dense counts: an integer of at most 18 digits, as text an optional '-' and the digits
                and nothing else (no '+', point, exponent or space: the block parser's rule); a number (JSON,
                numpy) whose value is such an integer; "" / null missing
``KEY_LIMIT``   Criteo categoricals: 8 hex digits (either case) in text, nothing else; "" / null missing. The
                decoded key (an integer in [0, 2^32)) is the internal form of the block parser and the
                server's canonical columns, never a raw value: the integer 12345678 would not be the key that
                the text "12345678" names
``SPLITS``      split-column codes: "train" -> 0, "valid" -> 1, "test" -> 2; anything else is a bad row
==============  ==========================================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ctrkit.data.pipeline.spec import SPLITS, TableSpecYaml
from ctrkit.data.pipeline.vocab import GROUP_TABLE

# kinds of feature columns (what the server's /metadata reports as "kind") and of the other roles
DENSE, COUNT, HEX, CATEGORY = "dense", "count", "hex", "category"
TOKENS, ID, ID_TOKENS = "tokens", "id", "id_tokens"
LABEL, WEIGHT, GROUP, SPLIT = "label", "weight", "group", "split"
FEATURE_KINDS = (DENSE, COUNT, HEX, CATEGORY, TOKENS, ID, ID_TOKENS)
CRITEO, TABLE, IDS = "criteo", "table", "ids"  # pipeline kinds: how categorical values are read

# the number rule, in the syntax both RE2 (pyarrow) and Python's re read alike (ASCII \d and \s spelled out)
NUMBER = r"[ \t\n\f\r]*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?[ \t\n\f\r]*"
COUNT_DIGITS = 18  # Criteo counts: at most 18 digits (int64)
COUNT_TEXT = r"-?[0-9]{1,18}"  # the text of a Criteo count (RE2 and Python's re alike)
COUNT_LIMIT = 10 ** COUNT_DIGITS  # |count| < COUNT_LIMIT
INT_KEY = r"[+-]?[0-9]{1,18}"  # a key column of a behaviour log is read as int64 when every value is one
F32_MAX = float(np.finfo(np.float32).max)
KEY_LIMIT = 1 << 32
LOG_FLOOR = math.exp(-2)  # ln(x + 3) is clamped at -2 where x + 3 <= e^-2
SPLIT_CODES = {name: i for i, name in enumerate(SPLITS)}
HEX_DIGITS = b"0123456789abcdefABCDEF"
HEX_NIBBLE = np.full(256, 16, np.uint8)  # byte -> its hex digit's value, 16 if not a hex digit
for _k, _c in enumerate(HEX_DIGITS[:16].decode()):
    HEX_NIBBLE[ord(_c)] = HEX_NIBBLE[ord(_c.upper())] = _k
_NOT_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)  # 8 nibbles in a uint64: a byte >= 16 is not a hex digit


def decode_hex8(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keys of 8-hex-digit values given as an (m, 8) uint8 byte matrix -> (keys int64 [m], -1 where not hex;
    ok bool [m]). All hex (the common case): one pass of ``bytes.fromhex``; else byte by byte in numpy."""
    b = np.ascontiguousarray(raw, np.uint8).tobytes()
    if not b.translate(None, HEX_DIGITS):  # nothing left once the hex digits are deleted
        keys = np.frombuffer(bytes.fromhex(b.decode("ascii")), ">u4").astype(np.int64)
        return keys, np.ones(len(keys), bool)
    nib = HEX_NIBBLE[raw]  # (m, 8) the value of each digit, 16 where not hex
    ok = (np.ascontiguousarray(nib).view(np.uint64).reshape(-1) & _NOT_NIBBLES) == 0
    packed = np.ascontiguousarray((nib[:, 0::2] << 4) | nib[:, 1::2])  # (m, 4) the key's bytes, big-endian
    return np.where(ok, packed.view(">u4").reshape(-1).astype(np.int64), -1), ok


@dataclass(frozen=True)
class ColumnRule:
    """How one raw column is read for one feature (or role).

    ``name`` the feature (``label`` / ``weight`` / ``group`` / ``split`` for the roles), ``column`` the raw
    column, ``kind`` one of the kinds above, ``dtype`` the numpy dtype of its encoded values (before the
    pipeline's final id lookup and scaling), ``delimiter`` of a multi-valued text value, ``max_len`` the last
    values kept (sequences, capped multi-valued features), ``transform`` of a dense value (none / log /
    standardize), ``threshold`` of a numeric label (value >= threshold -> 1), ``table`` the vocabulary the
    values index, ``table_size`` its size when the rows hold ids (kind ``ids``)."""

    name: str
    column: str
    kind: str
    dtype: str
    delimiter: str = "|"
    max_len: int | None = None
    transform: str = "none"
    threshold: float | None = None
    table: str | None = None
    table_size: int = 0

    @property
    def bound(self) -> float:
        """The largest |raw value| a dense or weight column takes: float32 max, unless ln(x + 3) brings every
        finite value below it (then inf: any finite number)."""
        if self.kind in (DENSE, WEIGHT):  # counts: ln(x + 3) of any integer of 18 digits is finite
            return math.inf if self.transform == "log" else F32_MAX
        return math.inf

    @property
    def jagged(self) -> bool:
        return self.kind in (TOKENS, ID_TOKENS)

    def accepts(self) -> str:
        """What a JSON request may send for this column (the server's /metadata)."""
        return {
            DENSE: "a number, a numeric string, \"\" or null (missing)",
            COUNT: "an integer of at most 18 digits (a JSON integer, or its digits in a string: \"42\", \"-1\"), "
                   "\"\" or null (missing)",
            HEX: "8 hex digits in a string (e.g. \"68fd1e64\"), \"\" or null (missing)",
            CATEGORY: "a string, an integer or null (missing)",
            TOKENS: f"a list of strings / integers, a {self.delimiter!r}-delimited string, or null (no values)",
            ID: f"an integer id in [0, {self.table_size}) or null (id 0, missing)",
            ID_TOKENS: f"a list of integer ids in [0, {self.table_size}), or null (no values)",
        }[self.kind]


@dataclass(frozen=True)
class ColumnRules:
    """All rules of a pipeline: the roles (label always, the others when the spec names them) and the
    features in spec order."""

    label: ColumnRule
    weight: ColumnRule | None
    group: ColumnRule | None
    split: ColumnRule | None
    dense: tuple[ColumnRule, ...]
    single: tuple[ColumnRule, ...]  # single-valued sparse features
    multi: tuple[ColumnRule, ...]  # multi-valued sparse features
    sequence: tuple[ColumnRule, ...]
    inputs: tuple[ColumnRule, ...] = field(default=())  # one per input column (see compile_rules)

    @property
    def jagged(self) -> tuple[ColumnRule, ...]:
        return self.multi + self.sequence

    @property
    def features(self) -> tuple[ColumnRule, ...]:
        return self.dense + self.single + self.multi + self.sequence

    def conflicts(self) -> list[tuple[ColumnRule, ColumnRule]]:
        """(kept input rule, another feature's rule of another kind) for columns read in two ways."""
        kept = {r.column: r for r in self.inputs}
        return [(kept[r.column], r) for r in self.features if r.kind != kept[r.column].kind]


def compile_rules(spec: TableSpecYaml, kind: str, table_of: dict[str, str],
                  table_sizes: dict[str, int] | None = None) -> ColumnRules:
    """The rules of ``spec`` read as a ``kind`` pipeline (criteo / table / ids); ``table_of`` maps each sparse
    feature to its vocabulary, ``table_sizes`` (ids pipelines) gives the size of each table."""
    sizes = table_sizes or {}
    single_kind = {CRITEO: HEX, IDS: ID}.get(kind, CATEGORY)
    multi_kind = ID_TOKENS if kind == IDS else TOKENS
    id_dtype = "<u4" if kind == CRITEO else "<i8"

    def sparse(e: dict[str, Any], k: str, table: str) -> ColumnRule:
        max_len = int(e["max_len"]) if e.get("max_len") else None
        return ColumnRule(e["name"], e["column"], k, id_dtype if k in (HEX, CATEGORY, ID) else "<i8",
                          delimiter=e.get("delimiter", "|"), max_len=max_len, table=table,
                          table_size=sizes.get(table, 0) if kind == IDS else 0)

    dense_kind = COUNT if kind == CRITEO else DENSE  # Criteo's I1..I13: the block parser's integers
    dense = tuple(ColumnRule(e["name"], e["column"], dense_kind, "<f8" if e["transform"] == "standardize" else "<f4",
                             transform=e["transform"]) for e in spec.dense)
    sparse_rules = [sparse(e, multi_kind if e.get("multi_valued") else single_kind, table_of[e["name"]])
                    for e in spec.sparse]
    sequence = tuple(sparse(e, multi_kind, table_of[e["shares"]]) for e in spec.sequence)
    return ColumnRules(
        label=ColumnRule(LABEL, spec.label, LABEL, "<f4", threshold=spec.label_threshold),
        weight=ColumnRule(WEIGHT, spec.weight, WEIGHT, "<f4") if spec.weight else None,
        group=ColumnRule(GROUP, spec.group_id, GROUP, "<i8", table=GROUP_TABLE) if spec.group_id else None,
        split=ColumnRule(SPLIT, spec.split_column, SPLIT, "|i1") if spec.split_column else None,
        dense=dense, single=tuple(r for r in sparse_rules if not r.jagged),
        multi=tuple(r for r in sparse_rules if r.jagged), sequence=sequence,
        inputs=_inputs([*dense, *sparse_rules, *sequence]))


def _inputs(rules: list[ColumnRule]) -> tuple[ColumnRule, ...]:
    """One rule per input column, in input-column order (dense, sparse, sequence columns as the spec lists
    them). A column that two features read in two ways keeps the first rule (validated once, read by both)."""
    first: dict[str, ColumnRule] = {}
    for r in rules:
        first.setdefault(r.column, r)
    return tuple(first.values())


def split_codes(text: pa.Array) -> np.ndarray:
    """Split code (int8) of every split-column value: its index in ``SPLITS``, -1 for anything else (null
    included): the one reading of a split column, for the encoder and for the table reader's early split."""
    text = text.fill_null("")
    code = np.full(len(text), -1, np.int8)
    for name, i in SPLIT_CODES.items():
        code[pc.equal(text, name).to_numpy(zero_copy_only=False)] = i
    return code
