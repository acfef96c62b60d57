"""Persistence of a :class:`~ctrkit.data.pipeline.FeaturePipeline`, its vocabulary fingerprint, the pipelines
of stores and checkpoints (including those written before pipelines existed), and the store writer the
preprocessors share.

On disk (``<store>/pipeline/``): ``pipeline.json`` (kind, feature spec, options, vocabulary metadata,
multi-hot options, fingerprint, the names of the arrays) and one ``<array>.npy`` per array: per
vocabulary its keys (int64, or UTF-8 bytes + int64 offsets for strings), counts and, in hash mode, ids;
the dense means and standard deviations (float64). Arrays are read with ``allow_pickle=False``. Inside a
checkpoint the same ``{"meta": ..., "arrays": ...}`` is stored as plain data (``to_payload``).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ctrkit.data.pipeline import CRITEO, TABLE, FeaturePipeline
from ctrkit.data.pipeline_encode import GROUP_TABLE
from ctrkit.data.rows import DataError, ShardSpill
from ctrkit.data.store import Store, StoreWriter
from ctrkit.data.tabular_read import OPTION_KEYS
from ctrkit.data.vocab import FIRST_ID, Vocabulary, link_tree, load_vocabularies
from ctrkit.schema import Schema

FORMAT = "ctrkit-pipeline"
VERSION = 1
PIPELINE_DIR = "pipeline"


# ---- plain data ----------------------------------------------------------------------------------
def _utf8(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Strings [k] -> (UTF-8 bytes uint8 [total], offsets int64 [k + 1])."""
    a = pa.array(np.asarray(keys, str), pa.large_string())
    offs = np.frombuffer(a.buffers()[1], np.int64)[a.offset: a.offset + len(a) + 1].copy()
    data = a.buffers()[2]
    raw = np.frombuffer(data, np.uint8)[offs[0]: offs[-1]].copy() if data is not None else np.zeros(0, np.uint8)
    return raw, offs - offs[0]


def _from_utf8(raw: np.ndarray, offs: np.ndarray) -> np.ndarray:
    a = pa.LargeStringArray.from_buffers(len(offs) - 1, pa.py_buffer(np.ascontiguousarray(offs, np.int64)),
                                         pa.py_buffer(np.ascontiguousarray(raw, np.uint8)))
    return a.to_numpy(zero_copy_only=False).astype(str)


def _key_arrays(v: Vocabulary) -> dict[str, np.ndarray]:
    if v.kind == "str":
        raw, offs = _utf8(v.keys)
        return {"keys_utf8": raw, "keys_offsets": offs}
    return {"keys": np.asarray(v.keys, np.int64)}


def to_payload(p: FeaturePipeline) -> dict[str, Any]:
    """``{"meta": JSON-able dict, "arrays": {name: numeric numpy array}}``."""
    arrays: dict[str, np.ndarray] = {"dense_mean": np.asarray(p.mean_, np.float64),
                                     "dense_std": np.asarray(p.std_, np.float64)}
    vocabs = None
    if p.vocabs_ is not None:
        vocabs = []
        for i, (name, v) in enumerate(p.vocabs_.items()):
            for part, a in (*_key_arrays(v).items(), ("counts", np.asarray(v.counts, np.int64))):
                arrays[f"vocab{i:03d}_{part}"] = a
            if v.max_vocab is not None and v.mode == "hash":
                arrays[f"vocab{i:03d}_ids"] = np.asarray(v.ids, np.int64)
            vocabs.append({"name": name, **v.meta()})
    meta = {"format": FORMAT, "version": VERSION, "kind": p.kind, "spec": p.spec.to_dict(), "options": p.options,
            "schema": p._schema.to_dict() if p._schema is not None else None, "vocabularies": vocabs,
            "multi_hot": p.multi_hot, "vocab_fingerprint": p.vocab_fingerprint() if p.fitted else None}
    return {"meta": meta, "arrays": arrays}


def from_payload(payload: dict[str, Any]) -> FeaturePipeline:
    meta, arrays = payload.get("meta") or {}, payload.get("arrays") or {}
    if meta.get("format") != FORMAT or int(meta.get("version", 0)) > VERSION:
        raise DataError(f"not a {FORMAT} v{VERSION} pipeline (format={meta.get('format')!r}, "
                        f"version={meta.get('version')!r}); it was written by another ctrkit version")
    schema = Schema.from_dict(meta["schema"]) if meta.get("schema") else None
    spec = dict(meta["spec"])  # pipelines saved before unknown options were errors may hold a typo there
    spec["options"] = {k: v for k, v in (spec.get("options") or {}).items() if k in OPTION_KEYS}
    p = FeaturePipeline(spec, kind=meta["kind"], schema=schema, **meta["options"])
    if meta.get("vocabularies") is not None:
        p.vocabs_ = {}
        for i, e in enumerate(meta["vocabularies"]):
            pre = f"vocab{i:03d}_"
            if e["kind"] == "str":
                keys = _from_utf8(arrays[pre + "keys_utf8"], arrays[pre + "keys_offsets"])
            else:
                keys = np.asarray(arrays[pre + "keys"], np.int64)
            ids = arrays.get(pre + "ids")
            ids = FIRST_ID + np.arange(len(keys), dtype=np.int64) if ids is None else np.asarray(ids, np.int64)
            p.vocabs_[e["name"]] = Vocabulary(e["name"], e["kind"], keys, ids, np.asarray(arrays[pre + "counts"]),
                                              e["size"], e["min_freq"], e["max_vocab"], e["mode"], e["hash_seed"],
                                              e["seen"], e["missing"])
    p.mean_ = np.asarray(arrays["dense_mean"], np.float64)
    p.std_ = np.asarray(arrays["dense_std"], np.float64)
    p.multi_hot = meta.get("multi_hot")
    p._fingerprint = meta.get("vocab_fingerprint")
    return p


def save_pipeline(p: FeaturePipeline, directory: str | Path) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    payload = to_payload(p)
    for name, a in payload["arrays"].items():
        np.save(d / f"{name}.npy", np.ascontiguousarray(a), allow_pickle=False)
    meta = {**payload["meta"], "arrays": sorted(payload["arrays"])}
    (d / "pipeline.json").write_text(json.dumps(meta, indent=1))
    return d


def load_pipeline(directory: str | Path) -> FeaturePipeline:
    """Read a pipeline written by :func:`save_pipeline` (``directory`` = it, or a store holding it)."""
    d = Path(directory)
    if (d / PIPELINE_DIR / "pipeline.json").is_file():
        d = d / PIPELINE_DIR
    mpath = d / "pipeline.json"
    if not mpath.is_file():
        raise DataError(f"{directory} holds no feature pipeline (no pipeline.json)")
    try:
        meta = json.loads(mpath.read_text())
        arrays = {n: np.load(d / f"{n}.npy", allow_pickle=False) for n in meta.pop("arrays")}
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"{d}: the feature pipeline cannot be read ({e}); re-run the preprocessing") from e
    return from_payload({"meta": meta, "arrays": arrays})


# ---- fingerprints ----------------------------------------------------------------------------------
def vocab_fingerprint(vocabs: dict[str, Vocabulary] | None, schema: Schema | None = None) -> str:
    """sha256 over the feature vocabularies in name order (name, kind, size, cap / hash options, keys, ids);
    ``__group__`` (GAUC groups, not a model input) is left out. Without vocabularies (rows that are ids):
    over the schema's table names and sizes."""
    h = hashlib.sha256()
    if vocabs is None:
        tables = schema.tables() if schema is not None else {}
        h.update(repr(sorted((t.name, t.num_embeddings) for t in tables.values())).encode())
        return "sha256:" + h.hexdigest()
    for name in sorted(t for t in vocabs if t != GROUP_TABLE):
        v = vocabs[name]
        h.update(repr((name, v.kind, v.size, v.max_vocab, v.mode if v.max_vocab else None, v.hash_seed,
                       len(v.keys))).encode())
        for a in _key_arrays(v).values():
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(np.asarray(v.ids, "<i8").tobytes())
    return "sha256:" + h.hexdigest()


def store_vocab_fingerprint(store: Store | str | Path) -> str:
    """The vocabulary fingerprint of a store: read from its pipeline (cheap), else computed."""
    path = store.path if isinstance(store, Store) else Path(store)
    mpath = path / PIPELINE_DIR / "pipeline.json"
    if mpath.is_file():
        fp = json.loads(mpath.read_text()).get("vocab_fingerprint")
        if fp:
            return fp
    return pipeline_from_store(store if isinstance(store, Store) else Store(path)).vocab_fingerprint()


# ---- pipelines of stores and checkpoints -----------------------------------------------------------
def _legacy(kind: str, pre: dict[str, Any], vocabs: dict[str, Vocabulary], schema: Schema) -> FeaturePipeline:
    """The pipeline of a store / checkpoint written before pipelines existed (its manifest's record)."""
    o = pre.get("options") or {}
    opts = {"min_freq": int(o.get("min_freq") or 1), "max_vocab": o.get("max_vocab"),
            "max_vocab_mode": o.get("max_vocab_mode") or "hash", "embedding_dim": o.get("embedding_dim") or "auto"}
    if kind == CRITEO:
        p = FeaturePipeline.criteo(**opts)
    else:
        sp = pre["spec"]
        label = sp["label"] if sp.get("label_threshold") is None else {"column": sp["label"],
                                                                       "threshold": sp["label_threshold"]}
        p = FeaturePipeline({"label": label, "dense": sp["dense"], "sparse": sp["sparse"],
                             "sequence": sp["sequence"]}, kind=TABLE, **opts)
        stats = pre.get("dense_stats") or {}
        p.mean_ = np.array([stats.get(e["name"], {}).get("mean", 0.0) for e in p.spec.dense], np.float64)
        p.std_ = np.array([stats.get(e["name"], {}).get("std", 1.0) for e in p.spec.dense], np.float64)
    p.vocabs_ = dict(vocabs)
    p._schema = schema  # the manifest's: weight / group columns are not in the old record
    return p


def pipeline_from_store(store: Store | str | Path) -> FeaturePipeline:
    """``<store>/pipeline``; for older stores rebuilt from the manifest and ``<store>/vocab``; for stores of
    ids (synthetic) an ``ids`` pipeline over the store's schema."""
    store = store if isinstance(store, Store) else Store(store)
    if (store.path / PIPELINE_DIR / "pipeline.json").is_file():
        return load_pipeline(store.path / PIPELINE_DIR)
    kind = store.preprocessing.get("kind")
    if kind in (CRITEO, TABLE) and (store.path / "vocab" / "vocab.json").is_file():
        return _legacy(kind, store.preprocessing, load_vocabularies(store.path), store.schema)
    return FeaturePipeline.from_schema(store.schema)


def pipeline_from_checkpoint(ckpt: dict[str, Any]) -> FeaturePipeline:
    """The pipeline a checkpoint (``load_checkpoint``'s dict) was trained with. Checkpoints written before
    pipelines existed: rebuilt from their vocabulary files, preprocessing record and data config."""
    if ckpt.get("pipeline"):
        return from_payload(ckpt["pipeline"])
    schema = Schema.from_dict(ckpt["schema"])
    files = (ckpt.get("vocab") or {}).get("arrays")
    pre = (ckpt.get("extra") or {}).get("preprocessing") or {}
    if files and pre.get("kind") in (CRITEO, TABLE):
        with tempfile.TemporaryDirectory(prefix="ctrkit-vocab-") as tmp:
            for name, data in files.items():
                (Path(tmp) / name).write_bytes(np.asarray(data, np.uint8).tobytes())
            p = _legacy(pre["kind"], pre, load_vocabularies(tmp), schema)
    else:
        p = FeaturePipeline.from_schema(schema)
    data = (ckpt.get("config") or {}).get("data") or {}
    if data.get("multi_hot_size"):
        p = p.with_multi_hot(data["multi_hot_size"], data.get("multi_hot_min_table_size", 200),
                             data.get("multi_hot_distribution", "uniform"))
    return p


def fitted_at(source: str | Path) -> FeaturePipeline:
    """The fitted pipeline at ``source``: a pipeline directory, a store (see :func:`pipeline_from_store`),
    or a bare vocabulary directory (vocabularies only, no dense statistics)."""
    p = Path(source)
    if (p / "pipeline.json").is_file() or (p / PIPELINE_DIR / "pipeline.json").is_file():
        return load_pipeline(p)
    if (p / "manifest.json").is_file():
        return pipeline_from_store(p)
    bare = FeaturePipeline({"label": "label"}, kind=TABLE)
    bare.vocabs_ = load_vocabularies(p)
    return bare


def reuse_fitted(new: FeaturePipeline, source: str | Path) -> FeaturePipeline:
    """Fit ``new`` with the vocabularies and dense statistics of the pipeline at ``source`` (``--vocab-from``:
    the ids and the scaling of the data ``source`` was fitted on); returns ``new``."""
    old = fitted_at(source)
    if old.vocabs_ is None:
        raise DataError(f"vocab_from={source} holds ids, not vocabularies; pass a store written by "
                        "`ctrkit preprocess`")
    need = list(dict.fromkeys([*new.table_of.values(), *([GROUP_TABLE] if new.spec.group_id else [])]))
    missing = [t for t in need if t not in old.vocabs_]
    if missing:
        what = "columns" if new.kind == CRITEO else "tables"
        raise DataError(f"vocab_from={source} has no vocabularies for {what} {missing}")
    new.vocabs_ = {t: old.vocabs_[t] for t in need}
    old_pos = {e["name"]: j for j, e in enumerate(old.spec.dense)}
    for j, e in enumerate(new.spec.dense):
        if e["name"] in old_pos:
            new.mean_[j], new.std_[j] = old.mean_[old_pos[e["name"]]], old.std_[old_pos[e["name"]]]
        elif e["transform"] == "standardize":
            raise DataError(f"vocab_from={source} has no statistics for the standardized dense feature "
                            f"{e['name']!r}")
    return new


# ---- writing stores ------------------------------------------------------------------------------
def write_split_store(path: Path, pipe: FeaturePipeline, spill: ShardSpill, *, shuffle_seed: int | None,
                      luts: dict[str, np.ndarray | None] | None, fitted_dir: Path, meta: dict[str, Any],
                      overwrite: bool = False) -> Path:
    """One store from the encoded rows of ``spill`` (shards read in order; each shuffled with
    ``[shuffle_seed, shard]`` unless None), finalized by ``pipe``; ``fitted_dir`` holds ``vocab/`` and
    ``pipeline/`` to link into it."""
    with StoreWriter(path, pipe.schema, pipe.column_specs(), overwrite=overwrite) as w:
        for shard in spill:
            part = spill.read(shard, seed=None if shuffle_seed is None else [shuffle_seed, shard])
            w.append(pipe.finalize(part, luts))
        link_tree(fitted_dir / "vocab", w.tmp / "vocab")
        link_tree(fitted_dir / PIPELINE_DIR, w.tmp / PIPELINE_DIR)
        w.set_meta(**meta)
    return path


__all__ = ["fitted_at", "from_payload", "load_pipeline", "pipeline_from_checkpoint", "pipeline_from_store",
           "reuse_fitted", "save_pipeline", "store_vocab_fingerprint", "to_payload", "vocab_fingerprint",
           "write_split_store"]
