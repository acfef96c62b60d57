"""ctrkit behaviour stores -> the arrays DeepCTR-Torch's DIN / DIEN train on (benchmarks/_deepctr_seq_peer.py).

    python benchmarks/seq_export.py --stores DIR --out NPZ_DIR        # DIR/{train,valid,test} = ctrkit stores
    python benchmarks/seq_export.py --fake-stores DIR [--rows 4000]    # a small fake behaviour store to try it on

Runs under ctrkit's python. ``export_for_peer`` reads the stores written by ``ctrkit preprocess behaviour``
(schema in the module docstring of ctrkit.data.sources.behaviour) and writes ``out/meta.json`` and
``out/{train,valid,test}.npz``, so the peer trains on exactly the rows ctrkit trains on, in the same order.

npz, per split (N rows; every id array int64, 0 = padding, ids exactly the store's ids):
- ``label`` float32 [N], ``group`` int64 [N] (the user key, for GAUC; absent if the schema has no group_id)
- one array per single-valued sparse feature, [N]; one per dense feature, float32 [N] or [N, dim]
- one array per sequence feature, [N, T] with T = the schema's ``max_len``: oldest first, left-aligned,
  0-padded (a row longer than T keeps its most recent T ids; counted in meta ``truncated``)
- length vectors int64 [N], one per group of sequences that must have equal lengths row by row:
  ``hist_length`` for every ``hist_<x>`` and ``neg_hist_<x>``; ``sess_<k>_length`` for ``sess_<k>_<x>``;
  ``<name>_length`` for any other sequence; plus ``sess_length`` = number of non-empty sessions when the
  store has sessions (DeepCTR's DSIN convention). A group whose members disagree on a row is an error.

meta.json::

    {"format": "ctrkit-seq-peer", "version": 1, "label": "label", "group": "group" | null,
     "rows": {"train": N, ...}, "tables": {"item": {"vocab_size": V, "embedding_dim": D}, ...},
     "dense": [{"name", "dim"}], "sparse": [{"name", "table", "vocab_size", "embedding_dim", "group"}],
     "sequences": [{"name", "shares", "table", "vocab_size", "embedding_dim", "max_len",
                    "family": "hist" | "neg_hist" | "session" | "other", "target": x | null,
                    "session": k | null, "length": "hist_length" | ...}],
     "history_features": ["item", "cate"],      # x with both sparse x and sequence hist_x, schema order
     "neg_history": true | false,               # every hist_x has neg_hist_x
     "sessions": {"count": S, "max_len": T, "features": ["item", "cate"]} | null,
     "max_id": 12345, "truncated": {"hist_item": 0, ...}}
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

SPLITS = ("train", "valid", "test")
_SESSION = re.compile(r"^sess_(\d+)_(.+)$")


def pad_recent(values: np.ndarray, offsets: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Jagged rows (values [nnz], offsets [N + 1]) -> (ids [N, max_len] int64, lengths [N] int64, truncated).

    Row i's ids ``values[offsets[i]:offsets[i + 1]]`` are oldest first; the most recent ``max_len`` of them
    land left-aligned in ``ids[i, :length_i]``, the rest of the row is 0. ``truncated`` counts cut rows.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    full = np.diff(offsets)  # (N,)
    lengths = np.minimum(full, max_len)
    n = len(full)
    out = np.zeros((n, max_len), dtype=np.int64)
    rows = np.repeat(np.arange(n), lengths)
    pos = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # j within the row
    start = offsets[1:] - lengths  # (N,) first kept value of each row
    out[rows, pos] = values[np.repeat(start, lengths) + pos]
    return out, lengths, int((full > max_len).sum())


def _family(name: str, sparse: set[str], sequences: set[str]) -> tuple[str, str | None, int | None, str]:
    """(family, target, session, length key) of sequence feature ``name``."""
    if name.startswith("neg_hist_") and name[len("neg_"):] in sequences:
        return "neg_hist", name[len("neg_hist_"):], None, "hist_length"
    if name.startswith("hist_") and name[len("hist_"):] in sparse:
        return "hist", name[len("hist_"):], None, "hist_length"
    m = _SESSION.match(name)
    if m and m.group(2) in sparse:
        return "session", m.group(2), int(m.group(1)), f"sess_{m.group(1)}_length"
    return "other", None, None, f"{name}_length"


def export_for_peer(store_dirs: dict[str, str | Path], out_dir: str | Path) -> dict[str, Any]:
    """Write ``out_dir/meta.json`` + ``out_dir/{split}.npz`` (format in the module docstring) -> the meta dict.

    ``store_dirs`` maps split name ("train", "valid", "test"; at least "train") to a ctrkit store path.
    Every split must have the train store's schema.
    """
    from ctrkit.data.storage.store import Store

    stores = {split: Store(p) for split, p in store_dirs.items()}
    if "train" not in stores:
        raise SystemExit(f"export_for_peer needs a 'train' store, got splits {sorted(stores)}")
    schema = stores["train"].schema
    for split, s in stores.items():
        if s.schema.to_dict() != schema.to_dict():
            raise SystemExit(f"the {split} store ({s.path}) has another schema than the train store")
    tables = schema.tables()
    sparse_names = {f.name for f in schema.sparse}
    seq_names = {q.name for q in schema.sequence}
    kinds = stores["train"].kinds
    multi = [f.name for f in schema.sparse if kinds.get(f.name) == "jagged"]
    if multi:
        raise SystemExit(f"multi-valued sparse features {multi} have no DIN/DIEN peer input; drop them")

    def table_entry(table: str) -> dict[str, Any]:
        return {"table": table, "vocab_size": tables[table].num_embeddings,
                "embedding_dim": tables[table].embedding_dim}

    sparse = [{"name": f.name, **table_entry(f.table_name), "group": f.group} for f in schema.sparse]
    sequences = []
    for q in schema.sequence:
        family, target, session, length = _family(q.name, sparse_names, seq_names)
        sequences.append({"name": q.name, "shares": q.shares, **table_entry(schema.table_of(q.name)),
                          "max_len": q.max_len, "family": family, "target": target, "session": session,
                          "length": length})
    hist = [q["target"] for q in sequences if q["family"] == "hist"]
    negs = {q["target"] for q in sequences if q["family"] == "neg_hist"}
    sess = sorted({q["session"] for q in sequences if q["family"] == "session"})
    sess_feats = list(dict.fromkeys(q["target"] for q in sequences if q["family"] == "session"))
    meta: dict[str, Any] = {
        "format": "ctrkit-seq-peer", "version": 1, "label": "label",
        "group": "group" if schema.group_id else None,
        "rows": {}, "tables": {t: {"vocab_size": s.num_embeddings, "embedding_dim": s.embedding_dim}
                               for t, s in tables.items()},
        "dense": [{"name": d.name, "dim": d.dim} for d in schema.dense], "sparse": sparse, "sequences": sequences,
        "history_features": hist, "neg_history": bool(hist) and negs == set(hist),
        "sessions": {"count": len(sess), "max_len": max(q["max_len"] for q in sequences if q["family"] == "session"),
                     "features": sess_feats} if sess else None,
        "max_id": 0, "truncated": {q["name"]: 0 for q in sequences},
    }
    if sess and sess != list(range(len(sess))):
        raise SystemExit(f"session features are numbered {sess}; expected 0..{len(sess) - 1}")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split, s in stores.items():
        arrays: dict[str, np.ndarray] = {"label": np.asarray(s[schema.label], dtype=np.float32)}
        if schema.group_id:
            arrays["group"] = np.asarray(s[schema.group_id], dtype=np.int64)
        for d in schema.dense:
            arrays[d.name] = np.asarray(s[d.name], dtype=np.float32)
        for f in sparse:
            arrays[f["name"]] = np.asarray(s[f["name"]], dtype=np.int64)
            meta["max_id"] = max(meta["max_id"], int(arrays[f["name"]].max(initial=0)))
        owner: dict[str, str] = {}  # length key -> the first sequence that set it
        for q in sequences:
            values, offsets = s[q["name"]]
            ids, lengths, cut = pad_recent(values, offsets, q["max_len"])
            arrays[q["name"]] = ids
            meta["truncated"][q["name"]] += cut
            meta["max_id"] = max(meta["max_id"], int(ids.max(initial=0)))
            key = q["length"]
            if key not in arrays:
                arrays[key], owner[key] = lengths, q["name"]
            elif not np.array_equal(arrays[key], lengths):
                row = int(np.flatnonzero(arrays[key] != lengths)[0])
                raise SystemExit(
                    f"{split}: {q['name']} and {owner[key]} should have equal lengths row by row ({key}), "
                    f"but row {row} has {lengths[row]} vs {arrays[key][row]}")
        if sess:
            arrays["sess_length"] = sum((arrays[f"sess_{k}_length"] > 0).astype(np.int64) for k in sess)
        np.savez(out / f"{split}.npz", **arrays)
        meta["rows"][split] = s.num_rows
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def write_fake_stores(out_dir: str | Path, *, users: int = 200, items: int = 500, cates: int = 20,
                      max_len: int = 20, sessions: int = 3, session_len: int = 5, embedding_dim: int = 8,
                      seed: int = 0) -> dict[str, Path]:
    """A small random behaviour log turned into ``out_dir/{train,valid,test}`` stores with the behaviour
    builder's schema (user, item, cate; hist_*, neg_hist_*, sess_<k>_*; label; group = user), for trying the
    export and the peer before real stores exist. Samples per user: every positive after the first gives a
    positive and a sampled negative with the same history; leave-last-out by user. -> {split: path}."""
    from ctrkit.data.storage.store import write_store
    from ctrkit.schema import Schema, SequenceFeature, SparseFeature

    rng = np.random.default_rng(seed)
    cate_of = rng.integers(2, cates + 2, size=items + 2)  # item id -> cate id (ids 0, 1 reserved)
    cate_of[:2] = 0
    feats = ("item", "cate")
    seqs = [SequenceFeature(f"hist_{x}", max_len, x, pooling="none") for x in feats]
    seqs += [SequenceFeature(f"neg_hist_{x}", max_len, x, pooling="none") for x in feats]
    seqs += [SequenceFeature(f"sess_{k}_{x}", session_len, x, pooling="none") for k in range(sessions) for x in feats]
    schema = Schema(sparse=[SparseFeature("user", users + 2, embedding_dim, group="user"),
                            SparseFeature("item", items + 2, embedding_dim, table="item", group="item"),
                            SparseFeature("cate", cates + 2, embedding_dim, table="cate", group="item")],
                    sequence=seqs, group_id="group")
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}

    def negative(seen: set[int]) -> int:
        while True:
            j = int(rng.integers(2, items + 2))
            if j not in seen:
                return j

    for u in range(2, users + 2):
        n = int(rng.integers(2, 2 * max_len))
        liked = np.flatnonzero(np.isin(cate_of, rng.choice(cate_of[2:], size=2)))  # a signal for DIN to find
        pos = np.where(rng.random(n) < 0.8, rng.choice(liked, size=n), rng.integers(2, items + 2, size=n))
        ts = np.cumsum(np.where(rng.random(n) < 0.2, 4000, rng.integers(10, 600, size=n)))
        seen = set(pos.tolist())
        negs = np.array([negative(seen) for _ in range(n)])
        for i in range(1, n):
            lo = max(0, i - max_len)
            gaps = np.flatnonzero(np.diff(ts[:i]) >= 1800) + 1
            bounds = np.split(np.arange(i), gaps)[-sessions:]
            split = "test" if i == n - 1 else "valid" if i == n - 2 else "train"
            for item in (int(pos[i]), negative(seen)):
                r = {"label": float(item == pos[i]), "group": u, "user": u, "item": item, "cate": cate_of[item],
                     "hist_item": pos[lo:i], "neg_hist_item": negs[lo:i]}
                for k in range(sessions):
                    idx = bounds[k][-session_len:] if k < len(bounds) else np.zeros(0, np.int64)
                    r[f"sess_{k}_item"] = pos[idx]
                for name in [q.name for q in seqs if q.name.endswith("_item")]:
                    r[name[: -len("item")] + "cate"] = cate_of[r[name]]
                rows[split].append(r)
    paths = {}
    for split, rs in rows.items():
        arrays: dict[str, Any] = {"label": np.array([r["label"] for r in rs], np.float32),
                                  "group": np.array([r["group"] for r in rs], np.int64)}
        kinds = {"label": "label", "group": "group"}
        for f in schema.sparse:
            arrays[f.name], kinds[f.name] = np.array([r[f.name] for r in rs], np.int64), "sparse"
        for q in seqs:
            parts = [np.asarray(r[q.name], np.int64) for r in rs]
            arrays[q.name] = (np.concatenate(parts) if parts else np.zeros(0, np.int64), [len(p) for p in parts])
            kinds[q.name] = "jagged"
        paths[split] = write_store(Path(out_dir) / split, schema, arrays, kinds, overwrite=True)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stores", help="directory holding the train / valid / test ctrkit stores")
    ap.add_argument("--out", help="directory for meta.json and the .npz files")
    ap.add_argument("--fake-stores", help="write a small fake behaviour store here (and export it if --out)")
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.fake_stores:
        write_fake_stores(a.fake_stores, users=a.users, seed=a.seed)
        a.stores = a.stores or a.fake_stores
    if a.out:
        if not a.stores:
            ap.error("--out needs --stores (or --fake-stores)")
        dirs = {s: Path(a.stores) / s for s in SPLITS if (Path(a.stores) / s / "manifest.json").is_file()}
        meta = export_for_peer(dirs, a.out)
        sys.stdout.write(json.dumps({"rows": meta["rows"], "history_features": meta["history_features"],
                                     "neg_history": meta["neg_history"], "sessions": meta["sessions"],
                                     "truncated": meta["truncated"]}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
