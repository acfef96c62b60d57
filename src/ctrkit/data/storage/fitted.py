"""The fitted pipeline of a store or checkpoint: read it (with the path for stores written before
pipelines existed), fingerprint its vocabularies, and reuse it for a new store (``--vocab-from``).
"""

from __future__ import annotations

import json
from pathlib import Path

from ctrkit.data.pipeline.encode import GROUP_TABLE
from ctrkit.data.pipeline.feature_pipeline import CRITEO, TABLE, FeaturePipeline
from ctrkit.data.pipeline.persist import PIPELINE_DIR, legacy_pipeline, load_pipeline
from ctrkit.data.pipeline.vocab import load_vocabularies
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError


def store_vocab_fingerprint(store: Store | str | Path) -> str:
    """The vocabulary fingerprint of a store: read from its pipeline (cheap), else computed."""
    path = store.path if isinstance(store, Store) else Path(store)
    mpath = path / PIPELINE_DIR / "pipeline.json"
    if mpath.is_file():
        fp = json.loads(mpath.read_text()).get("vocab_fingerprint")
        if fp:
            return fp
    return pipeline_from_store(store if isinstance(store, Store) else Store(path)).vocab_fingerprint()


def pipeline_from_store(store: Store | str | Path) -> FeaturePipeline:
    """``<store>/pipeline``; for older stores rebuilt from the manifest and ``<store>/vocab``; for stores of
    ids (synthetic) an ``ids`` pipeline over the store's schema."""
    store = store if isinstance(store, Store) else Store(store)
    if (store.path / PIPELINE_DIR / "pipeline.json").is_file():
        return load_pipeline(store.path / PIPELINE_DIR)
    kind = store.preprocessing.get("kind")
    if kind in (CRITEO, TABLE) and (store.path / "vocab" / "vocab.json").is_file():
        return legacy_pipeline(kind, store.preprocessing, load_vocabularies(store.path), store.schema)
    return FeaturePipeline.from_schema(store.schema)


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
