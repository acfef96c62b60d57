"""Feature schema: what the columns are, how big their vocabularies are and which table embeds them.

A schema is data. It is saved as JSON next to every store and inside every checkpoint, so a model
can be rebuilt and a raw request can be scored with nothing else.

Roles are declared, not guessed from names: a sequence feature says what it is (``role``: a behaviour
``history``, DIEN's sampled ``negative`` of a history (``of``), DSIN's ``session`` number ``session``, a
``search`` history), the table it is embedded by says which item feature it describes (``shares``), and
the schema names the item id of a retrieval catalogue (``item_id``, a sparse feature of group "item").
Schemas written before these declarations get them once, from their feature names, in
:func:`declare_legacy_roles` (the compatibility path).

Embedding dims may be ``"auto"``: seed 002 sizes an embedding from the feature's cardinality n as
``k * n ** (1/4)`` (k <= 16; we use k = 6 and cap at 64) or ``log2(n)``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from ctrkit.errors import SchemaError

GROUPS = ("user", "item", "context")
POOLINGS = ("sum", "mean")
SEQUENCE_POOLINGS = ("sum", "mean", "none")
AUTO_RULES = ("fourth_root", "log2")
SEQUENCE_ROLES = ("history", "negative", "session", "search")


def auto_embedding_dim(vocab_size: int, rule: str = "fourth_root", k: float = 6.0, cap: int = 64) -> int:
    """Seed 002's sizing rule: ``k * n ** 0.25`` (capped) or ``log2(n)``; at least 1."""
    n = max(int(vocab_size), 2)
    if rule == "fourth_root":
        return max(1, min(cap, round(k * n**0.25)))
    if rule == "log2":
        return max(1, min(cap, math.ceil(math.log2(n))))
    raise SchemaError(f"unknown auto embedding rule {rule!r}; use one of {AUTO_RULES}")


@dataclass(frozen=True)
class DenseFeature:
    """A real-valued column (``dim`` > 1 for a fixed-width vector)."""

    name: str
    dim: int = 1
    group: str = "context"


@dataclass(frozen=True)
class SparseFeature:
    """A categorical column embedded by one table.

    ``vocab_size`` counts every id, including 0 = missing and 1 = rare/unseen. ``table`` names the
    embedding table (default: the feature's own name); features naming the same table share it.
    ``multi_valued`` marks a column whose rows hold several ids (tags, multi-hot), pooled by
    ``pooling``.
    """

    name: str
    vocab_size: int
    embedding_dim: int | Literal["auto"] = "auto"
    table: str | None = None
    group: str = "context"
    pooling: str = "sum"
    multi_valued: bool = False

    @property
    def table_name(self) -> str:
        return self.table or self.name


@dataclass(frozen=True)
class SequenceFeature:
    """A variable-length history of ids (e.g. clicked items) embedded by the table of ``shares``.

    ``pooling`` = "none" keeps the sequence for attention layers (DIN, DIEN, ...); they pad it to
    [B, T] with ``max_len`` themselves. ``role`` (one of :data:`SEQUENCE_ROLES`): "history" (the user's
    behaviours, the default), "negative" (one sampled negative per step of history ``of``), "session"
    (session number ``session``, 0 = the oldest kept, of the behaviours embedded by the same table) or
    "search" (search tokens). None: not declared (a schema of an older release; see
    :func:`declare_legacy_roles`).
    """

    name: str
    max_len: int
    shares: str
    pooling: str = "mean"
    group: str = "user"
    role: str | None = None
    of: str | None = None
    session: int | None = None


@dataclass(frozen=True)
class TableSpec:
    """One embedding table: its rows, width and the features it embeds (in schema order)."""

    name: str
    num_embeddings: int
    embedding_dim: int
    features: tuple[str, ...]


@dataclass
class Schema:
    """Dense, sparse and sequence features, a label column and optional weight / group columns."""

    dense: list[DenseFeature] = field(default_factory=list)
    sparse: list[SparseFeature] = field(default_factory=list)
    sequence: list[SequenceFeature] = field(default_factory=list)
    label: str = "label"
    weight: str | None = None
    group_id: str | None = None
    auto_dim_rule: str = "fourth_root"
    item_id: str | None = None  # the item id of a retrieval catalogue (a sparse feature of group "item")

    def __post_init__(self) -> None:
        self.dense = [d if isinstance(d, DenseFeature) else DenseFeature(**d) for d in self.dense]
        self.sparse = [s if isinstance(s, SparseFeature) else SparseFeature(**s) for s in self.sparse]
        self.sequence = [q if isinstance(q, SequenceFeature) else SequenceFeature(**q) for q in self.sequence]
        declare_legacy_roles(self)
        self.validate()

    # ---- derived views -------------------------------------------------------------------------
    @property
    def dense_names(self) -> list[str]:
        return [d.name for d in self.dense]

    @property
    def num_dense(self) -> int:
        """Width Nd of the dense block (a feature of dim k takes k columns)."""
        return sum(d.dim for d in self.dense)

    @property
    def sparse_keys(self) -> list[str]:
        """Keys of the batch's KeyedJagged, in order: sparse features, then sequences."""
        return [s.name for s in self.sparse] + [q.name for q in self.sequence]

    @property
    def pooled_keys(self) -> list[str]:
        """Keys an EmbeddingBagCollection can pool: sparse features, then sequences whose pooling is not
        "none" (those are embedded unpooled by attention layers)."""
        return [s.name for s in self.sparse] + [q.name for q in self.sequence if q.pooling != "none"]

    def feature(self, name: str) -> DenseFeature | SparseFeature | SequenceFeature:
        for f in (*self.dense, *self.sparse, *self.sequence):
            if f.name == name:
                return f
        raise SchemaError(f"no feature named {name!r}; known: {self.all_names()}")

    def all_names(self) -> list[str]:
        return self.dense_names + self.sparse_keys

    def embedding_dim(self, sparse_name: str) -> int:
        s = self.feature(sparse_name)
        if isinstance(s, SequenceFeature):
            s = self.feature(s.shares)
        assert isinstance(s, SparseFeature)
        return self.tables()[s.table_name].embedding_dim

    def table_of(self, key: str) -> str:
        """Table name that embeds sparse or sequence feature ``key``."""
        f = self.feature(key)
        if isinstance(f, SequenceFeature):
            f = self.feature(f.shares)
        if not isinstance(f, SparseFeature):
            raise SchemaError(f"feature {key!r} is dense and has no embedding table")
        return f.table_name

    def tables(self) -> dict[str, TableSpec]:
        """Embedding tables in first-use order. A shared table takes the largest vocabulary."""
        rows: dict[str, int] = {}
        dims: dict[str, int | str] = {}
        feats: dict[str, list[str]] = {}
        for s in self.sparse:
            t = s.table_name
            rows[t] = max(rows.get(t, 0), s.vocab_size)
            if s.embedding_dim != "auto" or t not in dims:
                dims[t] = s.embedding_dim
            feats.setdefault(t, []).append(s.name)
        for q in self.sequence:
            feats[self.table_of(q.name)].append(q.name)
        out = {}
        for t, n in rows.items():
            d = dims[t]
            dim = auto_embedding_dim(n, self.auto_dim_rule) if d == "auto" else int(d)
            out[t] = TableSpec(t, n, dim, tuple(feats[t]))
        return out

    def sequences(self, role: str) -> list[str]:
        """Names of the unpooled (pooling "none") sequence features of ``role``, in schema order."""
        if role not in SEQUENCE_ROLES:
            raise SchemaError(f"unknown sequence role {role!r}; use one of {SEQUENCE_ROLES}")
        return [q.name for q in self.sequence if q.role == role and q.pooling == "none"]

    def item_features(self) -> list[str]:
        """The item's features: single-valued sparse features of group "item", the item id first."""
        names = [s.name for s in self.sparse if s.group == "item" and not s.multi_valued]
        if self.item_id in names:
            names.insert(0, names.pop(names.index(self.item_id)))
        return names

    def group(self, name: str) -> list[str]:
        """Names of the features in group ``name`` (user / item / context)."""
        if name not in GROUPS:
            raise SchemaError(f"unknown feature group {name!r}; use one of {GROUPS}")
        return [f.name for f in (*self.dense, *self.sparse, *self.sequence) if f.group == name]

    def with_embedding_dims(self, dim: int | None = None, per_table: Mapping[str, int] | None = None) -> Schema:
        """This schema with the embedding dims a model chose: table t gets ``per_table[t]``, else ``dim``, else
        the schema's own dim (the store's dim is only a default). Unchanged (self) when both are None."""
        if dim is None and not per_table:
            return self
        per_table = dict(per_table or {})
        tables = {s.table_name for s in self.sparse}
        unknown = sorted(set(per_table) - tables)
        if unknown:
            raise SchemaError(f"embedding_dims names tables {unknown} the schema does not have; its tables: "
                              f"{sorted(tables)}")
        for name, d in [*(("embedding_dim", dim),) * (dim is not None), *per_table.items()]:
            if isinstance(d, bool) or not isinstance(d, int) or d < 1:
                raise SchemaError(f"embedding dim of {name!r} must be a positive integer, got {d!r}")
        sparse = [replace(s, embedding_dim=per_table.get(s.table_name, dim if dim is not None else s.embedding_dim))
                  for s in self.sparse]
        return replace(self, sparse=sparse)

    # ---- validation ----------------------------------------------------------------------------
    def validate(self) -> None:
        seen: set[str] = set()
        for f in (*self.dense, *self.sparse, *self.sequence):
            if not isinstance(f.name, str) or not f.name:
                raise SchemaError(f"feature {f!r} needs a non-empty string name")
            if f.name in seen:
                raise SchemaError(f"feature name {f.name!r} appears twice; feature names must be unique")
            if f.name in (self.label, self.weight, self.group_id):
                raise SchemaError(f"feature {f.name!r} has the same name as the label/weight/group column")
            seen.add(f.name)
            if f.group not in GROUPS:
                raise SchemaError(f"feature {f.name!r}: group {f.group!r} is not one of {GROUPS}")
        for d in self.dense:
            if not isinstance(d.dim, int) or d.dim < 1:
                raise SchemaError(f"dense feature {d.name!r}: dim must be a positive integer, got {d.dim!r}")
        dims: dict[str, int] = {}
        for s in self.sparse:
            if not isinstance(s.vocab_size, int) or s.vocab_size < 2:
                raise SchemaError(
                    f"sparse feature {s.name!r}: vocab_size must be an integer >= 2 "
                    f"(ids 0 = missing and 1 = rare are reserved), got {s.vocab_size!r}"
                )
            if s.embedding_dim != "auto":
                if not isinstance(s.embedding_dim, int) or s.embedding_dim < 1:
                    raise SchemaError(
                        f"sparse feature {s.name!r}: embedding_dim must be a positive integer or 'auto', "
                        f"got {s.embedding_dim!r}"
                    )
                prev = dims.setdefault(s.table_name, s.embedding_dim)
                if prev != s.embedding_dim:
                    raise SchemaError(
                        f"sparse feature {s.name!r} shares table {s.table_name!r} with embedding_dim "
                        f"{s.embedding_dim}, but an earlier feature of that table set {prev}; make them equal"
                    )
            if s.pooling not in POOLINGS:
                raise SchemaError(f"sparse feature {s.name!r}: pooling {s.pooling!r} is not one of {POOLINGS}")
        sparse_names = {s.name for s in self.sparse}
        other_names = {d.name for d in self.dense} | {q.name for q in self.sequence}
        for s in self.sparse:
            if s.table in other_names:
                raise SchemaError(
                    f"sparse feature {s.name!r} names table {s.table!r}, which is a dense or sequence "
                    "feature; a table is named after a sparse feature or given a name of its own"
                )
        for q in self.sequence:
            if q.shares not in sparse_names:
                raise SchemaError(
                    f"sequence feature {q.name!r} shares the table of {q.shares!r}, which is not a sparse "
                    f"feature; known sparse features: {sorted(sparse_names)}"
                )
            if not isinstance(q.max_len, int) or q.max_len < 1:
                raise SchemaError(f"sequence feature {q.name!r}: max_len must be a positive integer")
            if q.pooling not in SEQUENCE_POOLINGS:
                raise SchemaError(
                    f"sequence feature {q.name!r}: pooling {q.pooling!r} is not one of {SEQUENCE_POOLINGS}"
                )
        self._validate_roles()
        if self.auto_dim_rule not in AUTO_RULES:
            raise SchemaError(f"auto_dim_rule {self.auto_dim_rule!r} is not one of {AUTO_RULES}")

    def _validate_roles(self) -> None:
        seqs = {q.name: q for q in self.sequence}
        for q in self.sequence:
            if q.role not in SEQUENCE_ROLES:
                raise SchemaError(f"sequence feature {q.name!r}: role {q.role!r} is not one of {SEQUENCE_ROLES}")
            if q.role == "negative":
                h = seqs.get(q.of) if q.of is not None else None
                if h is None or h.role != "history":
                    raise SchemaError(f"sequence feature {q.name!r} is a negative, so 'of' must name a history "
                                      f"sequence; got of={q.of!r}")
                if self.table_of(q.name) != self.table_of(h.name):
                    raise SchemaError(f"negative {q.name!r} must share the table of its history {h.name!r}")
            elif q.of is not None:
                raise SchemaError(f"sequence feature {q.name!r}: 'of' goes with role 'negative', not {q.role!r}")
            if (q.role == "session") != (q.session is not None):
                raise SchemaError(f"sequence feature {q.name!r}: 'session' (its number, 0 = the oldest) goes with "
                                  f"role 'session' and is needed there; got role={q.role!r}, session={q.session!r}")
            if q.session is not None and (not isinstance(q.session, int) or q.session < 0):
                raise SchemaError(f"sequence feature {q.name!r}: session must be an integer >= 0, got {q.session!r}")
        if self.item_id is not None:
            items = [s.name for s in self.sparse if s.group == "item" and not s.multi_valued]
            if self.item_id not in items:
                raise SchemaError(f"item_id {self.item_id!r} is not a single-valued sparse feature of group 'item'; "
                                  f"those are {items or 'none'}")

    # ---- (de)serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "dense": [asdict(d) for d in self.dense],
            "sparse": [asdict(s) for s in self.sparse],
            "sequence": [asdict(q) for q in self.sequence],
            "label": self.label,
            "weight": self.weight,
            "group_id": self.group_id,
            "auto_dim_rule": self.auto_dim_rule,
            "item_id": self.item_id,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Schema:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise SchemaError(f"unknown schema keys {sorted(unknown)}; valid keys: {sorted(known)}")
        for kind, klass in (("dense", DenseFeature), ("sparse", SparseFeature), ("sequence", SequenceFeature)):
            valid = {f.name for f in fields(klass)}
            for i, entry in enumerate(d.get(kind, [])):
                bad = set(entry) - valid
                if bad:
                    raise SchemaError(
                        f"{kind} feature #{i} ({entry.get('name', '?')!r}) has unknown keys {sorted(bad)}; "
                        f"valid keys: {sorted(valid)}"
                    )
        return cls(**d)

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Schema:
        p = Path(text_or_path) if not str(text_or_path).lstrip().startswith("{") else None
        text = p.read_text() if p is not None else str(text_or_path)
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            where = f"file {p}" if p else "schema text"
            raise SchemaError(f"{where} is not valid JSON: {e}") from e


_LEGACY_SESSION = re.compile(r"^sess_(\d+)_(.+)$")


def declare_legacy_roles(schema: Schema) -> None:
    """Fill the role declarations a schema lacks, from its feature names: the compatibility path for stores
    and checkpoints written before roles were declared (their builder, ``ctrkit preprocess behaviour``,
    named the features ``hist_<x>``, ``neg_hist_<x>``, ``sess_<k>_<x>``, ``search_<x>`` and the item id
    ``item``). The only place where a name decides a role; declared values are kept as they are.

    - an undeclared sequence ``neg_<h>`` with a sequence ``<h>`` -> role "negative" of ``<h>``;
      ``sess_<k>_<x>`` -> "session" k; ``search_<x>`` -> "search"; any other -> "history";
    - no ``item_id``: the feature ``item`` if it is one of the item features, else the first of them (none:
      stays None).
    """
    names = {q.name for q in schema.sequence}
    out = []
    for q in schema.sequence:
        if q.role is None:
            m = _LEGACY_SESSION.match(q.name)
            if q.name.startswith("neg_") and q.name[4:] in names:
                q = replace(q, role="negative", of=q.name[4:])
            elif m:
                q = replace(q, role="session", session=int(m.group(1)))
            elif q.name.startswith("search_"):
                q = replace(q, role="search")
            else:
                q = replace(q, role="history")
        out.append(q)
    schema.sequence = out
    if schema.item_id is None:
        items = [s.name for s in schema.sparse if s.group == "item" and not s.multi_valued]
        schema.item_id = "item" if "item" in items else (items[0] if items else None)
