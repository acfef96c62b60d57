"""Stores and checkpoints agree: the ids in a store mean something only with the vocabularies that made them.

A valid / test store, a store to evaluate with a checkpoint, or the training store of a resumed run must
have been preprocessed with the training store's vocabularies (``ctrkit preprocess ... --vocab-from
<training store>``); :func:`check_same_vocabulary` refuses anything else with that fix.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.data.pipeline.vocab import GROUP_TABLE
from ctrkit.data.storage.store import Store
from ctrkit.errors import StoreError

# ---- stores and checkpoints agree ----------------------------------------------------------------------
# The ids in a store are only meaningful with the vocabularies that produced them: a valid/test store, or
# a store scored by a checkpoint, must have been preprocessed with the training store's vocabularies
# (`ctrkit preprocess ... --vocab-from <training store>`). A vocabulary is compared by what decides its
# ids (kind, size, max_vocab / mode / hash seed, kept keys and their ids), not by its fitting statistics.
_VOCAB_META = ("kind", "size", "max_vocab", "mode", "hash_seed")


@dataclass
class _VocabEntry:
    meta: tuple[Any, ...]  # _VOCAB_META values
    path: Path | None = None  # the .arrow file of a store, or
    data: bytes | None = None  # its bytes from a checkpoint
    _digest: str | None = None

    def raw(self) -> bytes:
        return self.data if self.data is not None else self.path.read_bytes()  # type: ignore[union-attr]

    def same_file(self, other: _VocabEntry) -> bool:
        if self.path is not None and other.path is not None:
            try:
                if os.path.samefile(self.path, other.path):  # split stores of one run share hard links
                    return True
            except OSError:
                return False
        return self.raw() == other.raw()

    def digest(self) -> str:
        """sha256 of the kept keys and their ids (independent of the Arrow file's byte layout)."""
        if self._digest is None:
            import pyarrow as pa

            src = pa.BufferReader(self.raw())
            table = pa.ipc.open_file(src).read_all()
            h = hashlib.sha256()
            for name in ("key", "id"):
                if name not in table.column_names:
                    continue
                col = table.column(name)
                h.update(name.encode())
                if pa.types.is_integer(col.type):
                    h.update(np.asarray(col.to_numpy(), dtype=np.int64).tobytes())
                else:
                    h.update("\x00".join(map(str, col.to_pylist())).encode())
            self._digest = h.hexdigest()
        return self._digest




@dataclass
class Vocabularies:
    """The vocabularies that decided a store's ids: ``entries`` {name: entry} from ``<store>/vocab``
    (or a checkpoint's copy of it), else only the embedding table ``sizes`` of a schema."""

    source: str  # "store data/criteo/train", "checkpoint runs/x/best.pt", for messages
    sizes: dict[str, int]
    entries: dict[str, _VocabEntry] | None = None
    store: Path | None = None  # the store they belong to, if any (named in the fix)

    @classmethod
    def of_store(cls, store: Store | str | Path) -> Vocabularies:
        store = store if isinstance(store, Store) else Store(store)
        vdir = store.path / "vocab"
        files = {p.name: p for p in vdir.iterdir()} if vdir.is_dir() else {}
        entries = _vocab_entries(files, lambda f: files[f].read_bytes(), lambda f: {"path": files[f]},
                                 f"{vdir}")
        sizes = {n: t.num_embeddings for n, t in store.schema.tables().items()}
        return cls(f"store {store.path}", sizes, entries, store.path)

    @classmethod
    def of_checkpoint(
        cls, vocab: Any, schema: Any, source: str, train_store: str | None = None
    ) -> Vocabularies:
        """From a checkpoint's ``"vocab"`` entry ({"arrays": {file name: bytes}, "path": ...}) and its
        schema (a :class:`Schema` or its dict); ``train_store``: the store it was trained on, if known."""
        from ctrkit.schema import Schema

        arrays = (vocab or {}).get("arrays") or {}
        files = {name: np.asarray(a, dtype=np.uint8).tobytes() for name, a in arrays.items()}
        if not files and (vocab or {}).get("path") and Path(vocab["path"]).is_dir():
            files = {p.name: p.read_bytes() for p in Path(vocab["path"]).iterdir()}
        entries = _vocab_entries(files, files.__getitem__, lambda f: {"data": files[f]}, source)
        if schema is not None and not isinstance(schema, Schema):
            schema = Schema.from_dict(schema)
        sizes = {n: t.num_embeddings for n, t in schema.tables().items()} if schema is not None else {}
        return cls(source, sizes, entries, Path(train_store) if train_store else None)

    def differences(self, other: Vocabularies) -> list[str]:
        """What differs between two sets of vocabularies ([] when their ids agree)."""
        if self.entries is not None and other.entries is not None:
            out = []
            for name in [*self.entries, *(n for n in other.entries if n not in self.entries)]:
                if name == GROUP_TABLE:  # group ids only group rows for GAUC; no model reads them
                    continue
                a, b = self.entries.get(name), other.entries.get(name)
                if a is None or b is None:
                    out.append(f"vocabulary {name!r} only in the {'second' if a is None else 'first'}")
                elif a.meta != b.meta:
                    diff = [f"{k} {x!r} vs {y!r}" for k, x, y in zip(_VOCAB_META, a.meta, b.meta) if x != y]
                    out.append(f"{name!r}: {', '.join(diff)}")
                elif not a.same_file(b) and a.digest() != b.digest():
                    out.append(f"{name!r}: other keys or ids")
            return out
        common = sorted(set(self.sizes) & set(other.sizes))
        return [f"table {n!r}: size {self.sizes[n]} vs {other.sizes[n]}" for n in common
                if self.sizes[n] != other.sizes[n]]


def _vocab_entries(
    files: dict[str, Any], read: Any, where: Any, source: str
) -> dict[str, _VocabEntry] | None:
    if "vocab.json" not in files:
        return None
    try:
        meta = json.loads(read("vocab.json"))["vocabularies"]
        return {name: _VocabEntry(tuple(e.get(k) for k in _VOCAB_META), **where(e["file"]))
                for name, e in meta.items()}
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise StoreError(
            f"{source}: vocab.json is damaged ({type(e).__name__}: {e}); re-run the preprocessing"
        ) from e


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
