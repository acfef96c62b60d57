"""Read a behaviour store back as raw keys: the rows the builder tests compare with hand-written or naive ones."""

from __future__ import annotations

from typing import Any

from ctrkit.data.pipeline.persist import load_pipeline
from ctrkit.data.storage.store import Store


def decode(store: Store, name: str) -> list[Any]:
    """Raw keys of a store column (a list per row for jagged columns; id 1 -> 'RARE', 0 -> None)."""
    pipe = load_pipeline(store.path / "pipeline")
    table = pipe.feature_table(next(e for e in (*pipe.spec.sparse, *pipe.spec.sequence) if e["name"] == name))
    v = pipe.vocabs_[table]
    inv = {0: None, 1: "RARE", **{int(i): k for i, k in zip(v.ids, v.keys)}}
    col = store[name]
    if isinstance(col, tuple):
        vals, offs = col
        return [[inv[int(x)] for x in vals[offs[r]:offs[r + 1]]] for r in range(len(offs) - 1)]
    return [inv[int(x)] for x in col]


def rows_of(store: Store, names: tuple[str, ...] = ("user", "label", "item", "hist_item")) -> list[tuple]:
    cols = [decode(store, n) if n != "label" else store["label"].astype(int).tolist() for n in names]
    return [tuple(tuple(c) if isinstance(c, list) else c for c in r) for r in zip(*cols)]
