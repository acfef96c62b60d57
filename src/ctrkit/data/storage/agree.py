"""Stores and checkpoints agree: the ids in a store mean something only with the vocabularies that made them.

A valid / test store, a store to evaluate with a checkpoint, or the training store of a resumed run must
have been preprocessed with the training store's vocabularies (``ctrkit preprocess ... --vocab-from
<training store>``); :func:`check_same_vocabulary` refuses anything else with that fix.

A vocabulary is compared by what decides its ids (kind, size, max_vocab / mode / hash seed, kept keys and their
ids: :func:`~ctrkit.data.pipeline.vocab_arrays.table_fingerprint`), not by its fitting statistics. Where the
vocabularies come from, newest first:

* the fitted pipeline: ``<store>/pipeline/pipeline.json`` or a checkpoint's ``"pipeline"`` payload. Its
  per-table fingerprints are read from there (stores written since they are stored) or computed from its arrays
  (stores and checkpoints of the first release with pipelines); the fingerprint over all tables, when both
  sides have one, settles agreement without reading an array;
* the ``vocab/`` files of stores (and the ``"vocab"`` payload of checkpoints) written before that: read into
  the same vocabularies, so their fingerprints are the same numbers;
* neither (stores of ids, e.g. synthetic): the schema's embedding table sizes.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.pipeline.persist import PIPELINE_DIR, from_payload, load_pipeline
from ctrkit.data.pipeline.vocab import GROUP_TABLE, Vocabulary, load_vocabularies
from ctrkit.data.pipeline.vocab_arrays import table_fingerprints
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError, StoreError

_VOCAB_META = ("kind", "size", "max_vocab", "mode", "hash_seed")


@dataclass
class Vocabularies:
    """The vocabularies that decided a store's ids: ``entries`` {table: (kind, size, max_vocab, mode,
    hash_seed)} with their per-table fingerprints (read, or computed on first use by ``load``), else (``entries``
    None) only the embedding table ``sizes`` of a schema."""

    source: str  # "store data/criteo/train", "checkpoint runs/x/best.pt", for messages
    sizes: dict[str, int]
    entries: dict[str, tuple[Any, ...]] | None = None
    store: Path | None = None  # the store they belong to, if any (named in the fix)
    whole: str | None = None  # the pipeline's fingerprint over all tables, if recorded
    fingerprints_: dict[str, str] | None = None
    load: Callable[[], dict[str, Vocabulary]] | None = field(default=None, repr=False)

    @classmethod
    def of_store(cls, store: Store | str | Path) -> Vocabularies:
        store = store if isinstance(store, Store) else Store(store)
        sizes = {n: t.num_embeddings for n, t in store.schema.tables().items()}
        pdir, vdir = store.path / PIPELINE_DIR, store.path / "vocab"
        source = f"store {store.path}"
        meta = _read_json(pdir / "pipeline.json", source)
        if meta is not None and meta.get("vocabularies") is not None:
            return cls._of_pipeline(meta, lambda: load_pipeline(pdir).vocabs_, source, sizes, store.path)
        vmeta = _read_json(vdir / "vocab.json", source)
        if vmeta is not None:
            return cls(source, sizes, _entries(vmeta, source), store.path, load=lambda: load_vocabularies(vdir))
        return cls(source, sizes, None, store.path)

    @classmethod
    def of_checkpoint(cls, vocab: Any, schema: Any, source: str, train_store: str | None = None, *,
                      pipeline: dict[str, Any] | None = None) -> Vocabularies:
        """From a checkpoint's ``"pipeline"`` payload ({"meta", "arrays"}) when it holds vocabularies, else its
        ``"vocab"`` entry ({"arrays": {file name: bytes}, "path": ...}, checkpoints before pipelines); with its
        schema (a :class:`Schema` or its dict); ``train_store``: the store it was trained on, if known."""
        from ctrkit.schema import Schema

        if schema is not None and not isinstance(schema, Schema):
            schema = Schema.from_dict(schema)
        sizes = {n: t.num_embeddings for n, t in schema.tables().items()} if schema is not None else {}
        store = Path(train_store) if train_store else None
        meta = (pipeline or {}).get("meta")
        if meta is not None and meta.get("vocabularies") is not None:
            return cls._of_pipeline(meta, lambda: from_payload(pipeline).vocabs_, source, sizes, store)
        files = _vocab_files(vocab)
        if "vocab.json" not in files:
            return cls(source, sizes, None, store)
        return cls(source, sizes, _entries(json.loads(files["vocab.json"]), source), store,
                   load=lambda: _vocabularies_of_files(files))

    @classmethod
    def _of_pipeline(cls, meta: dict[str, Any], load: Callable[[], Any], source: str, sizes: dict[str, int],
                     store: Path | None) -> Vocabularies:
        entries = {e["name"]: tuple(e.get(k) for k in _VOCAB_META) for e in meta["vocabularies"]}
        return cls(source, sizes, entries, store, meta.get("vocab_fingerprint"), meta.get("table_fingerprints"),
                   load)

    def fingerprints(self) -> dict[str, str]:
        """{table: fingerprint} (computed from the vocabularies on first use when not recorded)."""
        if self.fingerprints_ is None:
            try:
                self.fingerprints_ = table_fingerprints(self.load()) if self.load is not None else {}
            except (OSError, KeyError, ValueError, DataError) as e:
                raise StoreError(f"{self.source}: the vocabularies cannot be read ({type(e).__name__}: {e}); "
                                 "re-run the preprocessing") from e
        return self.fingerprints_

    def differences(self, other: Vocabularies) -> list[str]:
        """What differs between two sets of vocabularies ([] when their ids agree)."""
        if self.entries is None or other.entries is None:
            common = sorted(set(self.sizes) & set(other.sizes))
            return [f"table {n!r}: size {self.sizes[n]} vs {other.sizes[n]}" for n in common
                    if self.sizes[n] != other.sizes[n]]
        if self.whole is not None and self.whole == other.whole:  # over every table but the groups
            return []
        out, names = [], [*self.entries, *(n for n in other.entries if n not in self.entries)]
        for name in names:
            if name == GROUP_TABLE:  # group ids only group rows for GAUC; no model reads them
                continue
            a, b = self.entries.get(name), other.entries.get(name)
            if a is None or b is None:
                out.append(f"vocabulary {name!r} only in the {'second' if a is None else 'first'}")
            elif a != b:
                diff = [f"{k} {x!r} vs {y!r}" for k, x, y in zip(_VOCAB_META, a, b) if x != y]
                out.append(f"{name!r}: {', '.join(diff)}")
            elif self.fingerprints().get(name) != other.fingerprints().get(name):
                out.append(f"{name!r}: other keys or ids")
        return out


def _read_json(path: Path, source: str) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise StoreError(f"{source}: {path.name} is damaged ({type(e).__name__}: {e}); re-run the "
                         "preprocessing") from e


def _entries(vmeta: dict[str, Any], source: str) -> dict[str, tuple[Any, ...]]:
    """{table: meta tuple} of a ``vocab.json`` (the ``vocab/`` directory of stores before pipelines)."""
    try:
        return {name: tuple(e.get(k) for k in _VOCAB_META) for name, e in vmeta["vocabularies"].items()}
    except (KeyError, TypeError, AttributeError) as e:
        raise StoreError(
            f"{source}: vocab.json is damaged ({type(e).__name__}: {e}); re-run the preprocessing"
        ) from e


def _vocab_files(vocab: Any) -> dict[str, bytes]:
    """A checkpoint's ``"vocab"`` entry as {file name: bytes}: stored inside, or the directory it names."""
    arrays = (vocab or {}).get("arrays") or {}
    files = {name: np.asarray(a, dtype=np.uint8).tobytes() for name, a in arrays.items()}
    if not files and (vocab or {}).get("path") and Path(vocab["path"]).is_dir():
        files = {p.name: p.read_bytes() for p in Path(vocab["path"]).iterdir()}
    return files


def _vocabularies_of_files(files: dict[str, bytes]) -> dict[str, Vocabulary]:
    with tempfile.TemporaryDirectory(prefix="ctrkit-vocab-") as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        return load_vocabularies(tmp)


def check_same_vocabulary(
    reference: Vocabularies | Store | str | Path, other: Store | str | Path, what: str
) -> None:
    """StoreError unless store ``other`` was preprocessed with the vocabularies of ``reference`` (the
    training store, or a checkpoint's :meth:`Vocabularies.of_checkpoint`). ``what`` names the option
    that chose ``other`` (e.g. "data.valid")."""
    ref = reference if isinstance(reference, Vocabularies) else Vocabularies.of_store(reference)
    got = Vocabularies.of_store(other)
    diff = ref.differences(got)
    if not diff:
        return
    shown = "; ".join(diff[:5]) + (f"; and {len(diff) - 5} more" if len(diff) > 5 else "")
    src = str(ref.store) if ref.store is not None else "<the training store>"
    raise StoreError(
        f"{what}: {got.source} was preprocessed with other vocabularies than {ref.source} ({shown}), so its "
        f"ids name other values. Preprocess its raw data again with "
        f"`ctrkit preprocess ... --vocab-from {src}` so both use the same ids"
    )
