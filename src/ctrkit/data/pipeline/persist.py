"""Persistence of a :class:`~ctrkit.data.pipeline.feature_pipeline.FeaturePipeline`, its vocabulary fingerprint, the pipelines
of stores and checkpoints (including those written before pipelines existed), and the store writer the
preprocessors share.

On disk (``<store>/pipeline/``, the one copy of a store's vocabularies): ``pipeline.json`` (kind, feature
spec, options, vocabulary metadata, multi-hot options, the vocabulary fingerprint over all tables and one per
table, the names of the arrays) and one ``<array>.npy`` per array: per
vocabulary its keys (int64, or UTF-8 bytes + int64 offsets for strings), counts and, in hash mode, ids;
the dense means and standard deviations (float64). Arrays are read with ``allow_pickle=False``. Inside a
checkpoint the same ``{"meta": ..., "arrays": ...}`` is stored as plain data (``to_payload``). A pipeline also
keeps, in ``pending<i>_*.npy`` (:func:`save_pending`; not in checkpoints), the keys its fit counted without giving
them an id, with their counts, so that ``--grow`` admits them later; a grown pipeline's ``vocab_lineage``
(:mod:`ctrkit.data.pipeline.vocab_grow`) is in its metadata, and per vocabulary the version each key was last
seen in (``_last_seen``; ``pending<i>_seen``), the ids reset by expiry (``_reset``) and, when expiry left ids
that are not ``2, 3, ...`` in key order, the ids.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.pipeline.feature_pipeline import CRITEO, TABLE, FeaturePipeline
from ctrkit.data.pipeline.spec import OPTION_KEYS
from ctrkit.data.pipeline.vocab import FIRST_ID, Vocabulary, load_vocabularies
from ctrkit.data.pipeline.vocab_arrays import from_utf8, key_arrays, table_fingerprints, utf8_keys
from ctrkit.data.pipeline.vocab_grow import Pending
from ctrkit.errors import DataError
from ctrkit.schema import Schema

FORMAT = "ctrkit-pipeline"


VERSION = 1


PIPELINE_DIR = "pipeline"
PENDING = "pending"  # file prefix in PIPELINE_DIR: counts kept for growing the vocabularies (not in checkpoints)


def to_payload(p: FeaturePipeline) -> dict[str, Any]:
    """``{"meta": JSON-able dict, "arrays": {name: numeric numpy array}}``."""
    arrays: dict[str, np.ndarray] = {"dense_mean": np.asarray(p.mean_, np.float64),
                                     "dense_std": np.asarray(p.std_, np.float64)}
    vocabs = None
    if p.vocabs_ is not None:
        vocabs = []
        for i, (name, v) in enumerate(p.vocabs_.items()):
            for part, a in (*key_arrays(v).items(), ("counts", np.asarray(v.counts, np.int64))):
                arrays[f"vocab{i:03d}_{part}"] = a
            if (v.max_vocab is not None and v.mode == "hash") or not _sequential(v.ids):
                arrays[f"vocab{i:03d}_ids"] = np.asarray(v.ids, np.int64)
            if v.last_seen is not None:  # a grown vocabulary's per key version (expiry: :mod:`.vocab_grow`)
                arrays[f"vocab{i:03d}_last_seen"] = np.asarray(v.last_seen, np.int32)
            if v.reset is not None and len(v.reset):
                arrays[f"vocab{i:03d}_reset"] = np.asarray(v.reset, np.int64)
            vocabs.append({"name": name, **v.meta()})
    meta = {"format": FORMAT, "version": VERSION, "kind": p.kind, "spec": p.spec.to_dict(), "options": p.options,
            "schema": p._schema.to_dict() if p._schema is not None else None, "vocabularies": vocabs,
            "multi_hot": p.multi_hot, "vocab_fingerprint": p.vocab_fingerprint() if p.fitted else None,
            "table_fingerprints": table_fingerprints(p.vocabs_) if p.vocabs_ is not None else None,
            **({"vocab_lineage": p.lineage_} if p.lineage_ else {})}
    return {"meta": meta, "arrays": arrays}


def _sequential(ids: np.ndarray) -> bool:
    """Ids 2, 3, ... in key order (what a vocabulary without an ``_ids`` array holds); expiry leaves others."""
    return bool(np.array_equal(ids, FIRST_ID + np.arange(len(ids))))


def _array(arrays: dict[str, Any], name: str, dtype: Any) -> np.ndarray | None:
    return None if arrays.get(name) is None else np.asarray(arrays[name], dtype)


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
                keys = from_utf8(arrays[pre + "keys_utf8"], arrays[pre + "keys_offsets"])
            else:
                keys = np.asarray(arrays[pre + "keys"], np.int64)
            ids = arrays.get(pre + "ids")
            ids = FIRST_ID + np.arange(len(keys), dtype=np.int64) if ids is None else np.asarray(ids, np.int64)
            p.vocabs_[e["name"]] = Vocabulary(e["name"], e["kind"], keys, ids, np.asarray(arrays[pre + "counts"]),
                                              e["size"], e["min_freq"], e["max_vocab"], e["mode"], e["hash_seed"],
                                              e["seen"], e["missing"], e.get("hash_fn", "splitmix"),
                                              bool(e.get("open", False)), _array(arrays, pre + "last_seen", np.int32),
                                              _array(arrays, pre + "reset", np.int64))
    p.mean_ = np.asarray(arrays["dense_mean"], np.float64)
    p.std_ = np.asarray(arrays["dense_std"], np.float64)
    p.multi_hot = meta.get("multi_hot")
    p.lineage_ = meta.get("vocab_lineage")
    p._fingerprint = meta.get("vocab_fingerprint")
    return p


def save_pipeline(p: FeaturePipeline, directory: str | Path) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    payload = to_payload(p)
    for name, a in payload["arrays"].items():
        np.save(d / f"{name}.npy", np.ascontiguousarray(a), allow_pickle=False)
    meta = {**payload["meta"], "arrays": sorted(payload["arrays"])}
    if p.pending_ is not None:
        meta["pending_counts"] = save_pending(p.pending_, d, p.pending_seen_)
    (d / "pipeline.json").write_text(json.dumps(meta, indent=1))
    return d


def save_pending(pending: dict[str, Pending], directory: Path, seen: dict[str, np.ndarray] | None = None) -> list[str]:
    """Per table the keys counted without an id and their counts (:mod:`ctrkit.data.pipeline.vocab_grow`), as
    ``pending<i>_keys.npy`` (int64, or ``_keys_utf8`` + ``_keys_offsets``) and ``pending<i>_counts.npy`` in table
    order, and of a grown pipeline (``seen``) the version each key was last seen in (``pending<i>_seen.npy``) -> the
    tables, in that order (what ``pipeline.json`` records as ``pending_counts``)."""
    for i, (table, (keys, counts)) in enumerate(pending.items()):
        parts = {"keys": np.asarray(keys, np.int64)} if keys.dtype.kind in "iu" else dict(
            zip(("keys_utf8", "keys_offsets"), utf8_keys(keys)))
        if seen is not None and table in seen:
            parts["seen"] = np.asarray(seen[table], np.int32)
        for part, a in (*parts.items(), ("counts", np.asarray(counts, np.int64))):
            np.save(directory / f"{PENDING}{i:03d}_{part}.npy", np.ascontiguousarray(a), allow_pickle=False)
    return list(pending)


def load_pending(directory: str | Path) -> dict[str, Pending]:
    """What :func:`save_pending` wrote for the pipeline at ``directory`` (a pipeline directory or a store): {} for a
    pipeline written without them (before ctrkit kept them)."""
    return _read_pending(directory)[0]


def load_pending_seen(directory: str | Path) -> dict[str, np.ndarray]:
    """The versions :func:`save_pending` wrote with the pending keys of a grown pipeline ({} for a first fit: every
    pending key was seen in its version)."""
    return _read_pending(directory)[1]


def _read_pending(directory: str | Path) -> tuple[dict[str, Pending], dict[str, np.ndarray]]:
    d = Path(directory)
    if (d / PIPELINE_DIR / "pipeline.json").is_file():
        d = d / PIPELINE_DIR
    try:
        tables = json.loads((d / "pipeline.json").read_text()).get("pending_counts") or []
        out, seen = {}, {}
        for i, t in enumerate(tables):
            pre = d / f"{PENDING}{i:03d}_"
            if Path(f"{pre}keys.npy").is_file():
                keys = np.load(f"{pre}keys.npy", allow_pickle=False)
            else:
                keys = from_utf8(np.load(f"{pre}keys_utf8.npy", allow_pickle=False),
                                 np.load(f"{pre}keys_offsets.npy", allow_pickle=False))
            out[t] = (keys, np.load(f"{pre}counts.npy", allow_pickle=False))
            if Path(f"{pre}seen.npy").is_file():
                seen[t] = np.load(f"{pre}seen.npy", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"{d}: the counts kept for growing its vocabularies cannot be read ({e}); re-run the "
                        "preprocessing that wrote it") from e
    return out, seen


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


def legacy_pipeline(kind: str, pre: dict[str, Any], vocabs: dict[str, Vocabulary], schema: Schema) -> FeaturePipeline:
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


def pipeline_from_parts(*, payload: dict[str, Any] | None, schema: Schema | None,
                        vocab_files: dict[str, Any] | None, preprocessing: dict[str, Any],
                        data_config: dict[str, Any]) -> FeaturePipeline:
    """The pipeline a checkpoint (:meth:`ctrkit.checkpoint.Checkpoint.feature_pipeline`) was trained with: its
    ``payload``; for checkpoints written before pipelines existed, rebuilt from their vocabulary files, the
    preprocessing record and the data config."""
    if payload:
        return from_payload(payload)
    if schema is None:
        raise DataError("a checkpoint without a pipeline needs its schema to rebuild one")
    files, pre = vocab_files, preprocessing
    if files and pre.get("kind") in (CRITEO, TABLE):
        with tempfile.TemporaryDirectory(prefix="ctrkit-vocab-") as tmp:
            for name, data in files.items():
                (Path(tmp) / name).write_bytes(np.asarray(data, np.uint8).tobytes())
            p = legacy_pipeline(pre["kind"], pre, load_vocabularies(tmp), schema)
    else:
        p = FeaturePipeline.from_schema(schema)
    if data_config.get("multi_hot_size"):
        p = p.with_multi_hot(data_config["multi_hot_size"], data_config.get("multi_hot_min_table_size", 200),
                             data_config.get("multi_hot_distribution", "uniform"))
    return p
