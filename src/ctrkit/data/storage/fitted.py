"""The fitted pipeline of a store or checkpoint: read it (with the path for stores written before
pipelines existed), fingerprint its vocabularies, and reuse it for a new store (``--vocab-from``) or grow it
(``--vocab-from PARENT --grow``: :func:`prepare_grow`, :mod:`ctrkit.data.pipeline.vocab_grow`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ctrkit.data.pipeline.encode import GROUP_TABLE
from ctrkit.data.pipeline.feature_pipeline import CRITEO, TABLE, FeaturePipeline
from ctrkit.data.pipeline.persist import (
    PIPELINE_DIR,
    legacy_pipeline,
    load_pending,
    load_pending_seen,
    load_pipeline,
)
from ctrkit.data.pipeline.spec import TableSpecYaml
from ctrkit.data.pipeline.vocab import load_vocabularies
from ctrkit.data.pipeline.vocab_grow import GrowFrom
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FittedSource:
    """A fitted pipeline read by a layer above this one (a checkpoint's: ``ctrkit preprocess --vocab-from
    CHECKPOINT``), with the path it came from (what manifests record; ``os.fspath`` gives it)."""

    path: str
    pipeline: FeaturePipeline

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self.path


def source_stamp(source: str | Path | FittedSource) -> int:
    """Modification time (ns) of what ``--vocab-from`` names: its pipeline's ``pipeline.json`` when it has one, else
    the path itself (a checkpoint file): part of a resumable run's key."""
    p = Path(os.fspath(source))
    for f in (p / PIPELINE_DIR / "pipeline.json", p / "pipeline.json", p):
        if f.exists():
            return f.stat().st_mtime_ns
    return 0


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


def fitted_at(source: str | Path | FittedSource) -> FeaturePipeline:
    """The fitted pipeline at ``source``: a pipeline directory, a store (see :func:`pipeline_from_store`),
    or a bare vocabulary directory (vocabularies only, no dense statistics)."""
    if isinstance(source, FittedSource):
        return source.pipeline
    p = Path(source)
    if (p / "pipeline.json").is_file() or (p / PIPELINE_DIR / "pipeline.json").is_file():
        return load_pipeline(p)
    if (p / "manifest.json").is_file():
        return pipeline_from_store(p)
    bare = FeaturePipeline({"label": "label"}, kind=TABLE)
    bare.vocabs_ = load_vocabularies(p)
    return bare


def reuse_fitted(new: FeaturePipeline, source: str | Path | FittedSource) -> FeaturePipeline:
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


def _columns(spec: TableSpecYaml) -> dict[str, str]:
    """{column: what it is}: the part of a spec that decides a store's columns and their types (not their
    embedding dims, groups or poolings)."""
    cols = {spec.label: f"label (threshold {spec.label_threshold})"}
    cols |= {c: role for c, role in ((spec.weight, "weight"), (spec.group_id, "group")) if c}
    cols |= {e["name"]: f"dense ({e.get('transform')})" for e in spec.dense}
    cols |= {e["name"]: f"sparse (table {e.get('table') or e['name']}"
             f"{', multi-valued' if e.get('multi_valued') else ''})" for e in spec.sparse}
    cols |= {q["name"]: f"sequence (shares {q['shares']}, max_len {q['max_len']})" for q in spec.sequence}
    return cols


def check_same_columns(parent: FeaturePipeline, new: FeaturePipeline, source: str | Path | FittedSource) -> None:
    """A grown store has its parent's columns, of the same types: else a DataError naming the columns added,
    removed and retyped."""
    old, now = _columns(parent.spec), _columns(new.spec)
    diff = {"added": sorted(set(now) - set(old)), "removed": sorted(set(old) - set(now)),
            "retyped": [f"{c} {old[c]} -> {now[c]}" for c in sorted(set(old) & set(now)) if old[c] != now[c]]}
    if any(diff.values()):
        what = "; ".join(f"{k}: {', '.join(v)}" for k, v in diff.items() if v)
        raise DataError(f"--grow: the new data's columns differ from those of the parent {source} beyond new ids "
                        f"({what}). A grown vocabulary keeps its parent's columns; give the spec the parent's "
                        "columns, or preprocess without --grow (a new vocabulary, a model trained from scratch)")


def prepare_grow(new: FeaturePipeline, source: str | Path | FittedSource,
                 expire_after: int | None = None) -> FeaturePipeline:
    """Make ``new`` (unfitted) grow the pipeline at ``source`` when it is fitted (``--vocab-from SOURCE --grow``):
    the same columns, the parent's vocabularies with their kept counts, its dense statistics and its ``max_vocab``
    rule; returns ``new``, whose fitter then grows them (:mod:`ctrkit.data.pipeline.vocab_grow`), evicting the values
    not seen in the last ``expire_after`` versions (``--expire-after``)."""
    old = fitted_at(source)
    if old.vocabs_ is None:
        raise DataError(f"vocab_from={source} holds ids, not vocabularies; --grow needs a store written by "
                        "`ctrkit preprocess` (or a checkpoint trained on one)")
    if not (isinstance(source, FittedSource) or (Path(source) / "pipeline.json").is_file()
            or (Path(source) / PIPELINE_DIR / "pipeline.json").is_file()):
        raise DataError(f"vocab_from={source} holds bare vocabularies without a feature spec; --grow needs a store "
                        "written by `ctrkit preprocess` (its pipeline/ directory) or a checkpoint")
    check_same_columns(old, new, source)
    reuse_fitted(new, source)  # the tables' presence and the dense statistics, checked as for --vocab-from
    pending = {} if isinstance(source, FittedSource) else load_pending(source)
    seen = {} if isinstance(source, FittedSource) else load_pending_seen(source)
    short = [t for t, v in new.vocabs_.items() if t not in pending and v.min_freq > 1]
    if short:
        log.warning("--grow: %s keeps no counts of the values its vocabularies %s left below min_freq (a checkpoint or "
                    "a store of an earlier ctrkit); they count from zero", source, short)
    new.grow_from = GrowFrom(dict(new.vocabs_), old.vocab_fingerprint(), str(source),
                             int((old.lineage_ or {}).get("version", 1)), pending, new.mean_.copy(), new.std_.copy(),
                             expire_after, seen)
    if new.options["max_vocab"] is None:
        new.options.update(max_vocab=old.options["max_vocab"], max_vocab_mode=old.options["max_vocab_mode"])
    new.vocabs_ = None  # fitted by the growing fit
    return new
