"""Per-column vocabularies: raw categorical values -> contiguous ids in first-appearance order.

Id convention (seed 000 §3.3, extended with a rare bucket)::

    0          missing value (empty field / null)
    1          rare (seen fewer than ``min_freq`` times), over the ``max_vocab`` cap, or unseen at serving
    2, 3, ...  kept values, numbered in the order they first appear in the input

Fitting streams: :class:`VocabBuilder.add` gives every new value a *provisional* id (its rank of first
appearance) and counts occurrences, so one pass over the data is enough. :meth:`VocabBuilder.finish`
turns counts into the final ids and returns a lookup table ``lut[provisional id] -> final id`` that
the caller applies to ids it has already written (min_freq and the cap can only be decided at the end).

``max_vocab`` bounds the vocabulary size (ids < max_vocab), like torchrec's ``max_ind_range``:

* ``mode="hash"`` (default, as torchrec): each kept value goes to bucket ``2 + h(value) % (max_vocab - 2)``
  with a fixed 64-bit hash h (SplitMix64 of the integer key, FNV-1a of a string's UTF-8 bytes). Criteo's
  columns (``hash_fn="mod"``) take MLPerf's / the DLRM reference's formula instead, ``id = key % max_vocab`` of
  the raw 32-bit value (``int(hex, 16) % max_ind_range``), missing -> 0 as there (MLPerf writes an empty
  field as "0"). That formula has no rare bucket: a present key whose value is 0 or 1 modulo ``max_vocab``
  shares id 0 with missing values or id 1, exactly as in MLPerf. With ``min_freq`` 1 it needs no fit at all
  (:meth:`Vocabulary.modulo`, an ``open`` vocabulary that holds no keys: memory independent of the data);
  with ``min_freq`` > 1 kept keys take the formula's id and the others 1;
* ``mode="cap"``: the first ``max_vocab - 2`` kept values (first-appearance order) keep their ids and
  later values map to 1.

On disk a store holds its vocabularies once, as arrays of its fitted pipeline (``<store>/pipeline``,
:mod:`ctrkit.data.pipeline.persist`). Stores of earlier releases also (or only) hold ``<store>/vocab/``, read by
:func:`load_vocabularies`: ``vocab.json`` (options and sizes per vocabulary) and one Arrow IPC file per
vocabulary with the kept raw keys in id order (column ``key``), their training counts (``count``) and, in hash
mode, their ids (``id``); :func:`save_vocabularies` writes that layout (for tests of those stores). :meth:`Vocabulary.lookup` maps new raw values with the same
rules (unseen -> 1, missing -> 0), vectorised: integer keys through a hash (``pandas.Index.get_indexer``), strings
with ``numpy.searchsorted``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ctrkit.data.pipeline.vocab_index import HashIndex, SortedIndex
from ctrkit.data.pipeline.vocab_keys import (
    CodedKeys,
    _as_key_array,
    _integer_keys_of_text,
    _one_chunk,
    hash_keys,
)
from ctrkit.errors import DataError

MISSING_ID = 0
RARE_ID = 1
FIRST_ID = 2
GROUP_TABLE = "__group__"  # the vocabulary of the group-id column (GAUC groups; no model reads it)
MODES = ("hash", "cap")
KINDS = ("int", "str")


class VocabBuilder:
    """Streaming first-appearance indexer with counts for one vocabulary.

    ``add(values)`` returns provisional ids int64 [n]: 0 for missing, else 2 + rank of first appearance
    over everything added so far. Per chunk the distinct values are found with a hash that lists them in
    first-appearance order (integers: ``pandas.factorize``; strings: ``pyarrow.compute.dictionary_encode``) and
    only those m << n values are looked up in the index of every value so far (integers: a hash table,
    :class:`~ctrkit.data.pipeline.vocab_index.HashIndex`; strings: sorted arrays).
    """

    def __init__(self, name: str, kind: str = "int") -> None:
        if kind not in KINDS:
            raise DataError(f"vocabulary {name!r}: kind {kind!r} is not one of {KINDS}")
        self.name, self.kind = name, kind
        self._index = HashIndex() if kind == "int" else SortedIndex(np.dtype("<U1"))
        self._keys: list[np.ndarray] = []  # new keys per chunk, first-appearance order
        self._counts = np.zeros(1024, np.int64)  # indexed by provisional id
        self.next_id = FIRST_ID
        self.missing = 0

    def add(self, values: Any, missing: np.ndarray | None = None) -> np.ndarray:
        """Raw values [n] (numpy or pyarrow; nulls / ``missing`` [n] bool = missing; or integer :class:`CodedKeys`)
        -> provisional ids int64 [n]."""
        if isinstance(values, CodedKeys):
            if missing is None and self.kind == "int":
                return self._add_coded(values)
            values = values.values()
        keys, miss = _as_key_array(values, self.kind)
        if missing is not None:
            miss = missing if miss is None else (miss | missing)
        if self.kind == "int":
            return self._add_int(keys, miss)
        arr = _one_chunk(pa.array(keys, mask=miss) if miss is not None else pa.array(keys))
        enc = pc.dictionary_encode(arr)
        uniq = enc.dictionary.to_numpy(zero_copy_only=False)  # (m,) first-appearance order
        if self.kind == "str":
            uniq = uniq.astype(str)
        idx = enc.indices.fill_null(-1).to_numpy(zero_copy_only=False) if miss is not None else enc.indices.to_numpy()
        pid = self._admit(uniq)
        cnt = np.bincount(idx[idx >= 0] if miss is not None else idx, minlength=len(uniq))
        self._counts[pid] += cnt
        if miss is not None:
            self.missing += int(miss.sum())
        return np.append(pid, MISSING_ID)[idx]  # idx -1 (missing) picks the appended 0

    def _add_int(self, keys: np.ndarray, miss: np.ndarray | None) -> np.ndarray:
        """:meth:`add` of integer keys [n] int64 (``miss`` [n] bool or None) -> provisional ids int64 [n]."""
        codes, uniq = pd.factorize(keys if miss is None else keys[~miss])  # (n',) (m,): first-appearance order
        pid = self._admit(uniq)
        self._counts[pid] += np.bincount(codes, minlength=len(uniq))
        if miss is None:
            return pid[codes]
        self.missing += int(miss.sum())
        out = np.zeros(len(keys), np.int64)  # MISSING_ID
        out[~miss] = pid[codes]
        return out

    def _add_coded(self, col: CodedKeys) -> np.ndarray:
        """:meth:`add` of factorized keys: the distinct ones are admitted and counted, the rows take their ids (a
        negative unique, missing, takes MISSING_ID and counts as missing)."""
        return self.add_coded(col)[col.codes]

    def add_coded(self, col: CodedKeys) -> np.ndarray:
        """Count the rows of factorized integer keys ``col`` -> the provisional id of each of its distinct keys
        [m] (``ids[col.codes]`` are the rows' ids, what :meth:`add` gives; a negative unique, missing, takes
        MISSING_ID and counts as missing)."""
        uniq = col.uniques
        cnt = np.bincount(col.codes, minlength=len(uniq))
        missing = uniq < 0
        some = bool(missing.any())
        pid = self._admit(uniq, missing if some else None)  # may grow the counts: index them after
        self._counts[pid] += cnt  # missing ones add to MISSING_ID's slot, which no count reads (FIRST_ID on)
        if some:
            self.missing += int(cnt[missing].sum())
        return pid

    def merge(self, keys: np.ndarray, counts: np.ndarray, missing: int = 0) -> None:
        """Add another builder's distinct ``keys`` [m] (its first-appearance order) with their ``counts`` [m]: merged
        in the order the parts of the input come, the ids are those one builder fed every row would give."""
        pid = self._admit(np.asarray(keys))  # may grow the counts: index them after
        self._counts[pid] += counts
        self.missing += int(missing)

    def _admit(self, uniq: np.ndarray, missing: np.ndarray | None = None) -> np.ndarray:
        """Provisional ids of distinct keys ``uniq`` [m], new ones numbered on in the order given; those of
        ``missing`` [m] (bool) take MISSING_ID and are not admitted."""
        pid = self._index.get(uniq)  # (m,)
        if missing is not None:
            pid[missing] = MISSING_ID
        new = np.flatnonzero(pid < 0)
        if len(new):
            pid[new] = self.next_id + np.arange(len(new))
            self._index.insert(uniq[new], pid[new])
            self._keys.append(uniq[new])
            self.next_id += len(new)
            if self.next_id > len(self._counts):
                grown = np.zeros(max(self.next_id, 2 * len(self._counts)), np.int64)
                grown[: len(self._counts)] = self._counts
                self._counts = grown
        return pid

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held (index, keys, counts): what a memory budget for counting compares."""
        return self._index.nbytes + sum(k.nbytes for k in self._keys) + self._counts.nbytes

    def keys(self) -> np.ndarray:
        """Every value seen, in first-appearance (provisional id) order."""
        if not self._keys:
            return np.empty(0, np.int64 if self.kind == "int" else "<U1")
        return np.concatenate(self._keys)

    def counts(self) -> np.ndarray:
        return self._counts[FIRST_ID: self.next_id].copy()

    def finish(
        self, min_freq: int = 1, max_vocab: int | None = None, mode: str = "hash", hash_seed: int = 0,
        hash_fn: str = "splitmix",
    ) -> tuple[Vocabulary, np.ndarray | None]:
        """Final vocabulary and ``lut`` int64 [next_id] mapping provisional -> final ids (None = identity).

        kept = count >= min_freq; kept values take ids 2, 3, ... in first-appearance order; with
        ``max_vocab`` the ids are capped or hashed as described in the module docstring.
        """
        check_vocab_options(min_freq, max_vocab, mode, self.name)
        keys, counts = self.keys(), self.counts()
        kept = counts >= min_freq
        vocab = Vocabulary.build(self.name, self.kind, keys[kept], counts[kept], min_freq=min_freq,
                                 max_vocab=max_vocab, mode=mode, hash_seed=hash_seed, seen=len(keys),
                                 missing=self.missing, hash_fn=hash_fn)
        if kept.all() and (max_vocab is None or (mode == "cap" and len(keys) <= max_vocab - FIRST_ID)):
            return vocab, None
        lut = np.full(self.next_id, RARE_ID, np.int64)
        lut[MISSING_ID] = MISSING_ID
        lut[FIRST_ID + np.flatnonzero(kept)[: len(vocab.ids)]] = vocab.ids  # cap: only the first ones
        return vocab, lut


def check_vocab_options(min_freq: int, max_vocab: int | None, mode: str, name: str = "") -> None:
    where = f"vocabulary {name!r}: " if name else ""
    if not isinstance(min_freq, (int, np.integer)) or min_freq < 1:
        raise DataError(f"{where}min_freq must be an integer >= 1, got {min_freq!r}")
    if max_vocab is not None and (not isinstance(max_vocab, (int, np.integer)) or max_vocab < 3):
        raise DataError(f"{where}max_vocab must be an integer >= 3 (ids 0 and 1 are reserved), got {max_vocab!r}")
    if mode not in MODES:
        raise DataError(f"{where}max_vocab mode {mode!r} is not one of {MODES}")


@dataclass
class Vocabulary:
    """A fitted vocabulary: kept raw ``keys`` [k] in first-appearance order and their final ``ids`` [k].

    ``size`` is the embedding-table row count (max id + 1, including 0 = missing and 1 = rare).
    """

    name: str
    kind: str
    keys: np.ndarray
    ids: np.ndarray
    counts: np.ndarray
    size: int
    min_freq: int = 1
    max_vocab: int | None = None
    mode: str = "hash"
    hash_seed: int = 0
    seen: int = 0
    missing: int = 0
    hash_fn: str = "splitmix"  # hash mode: "splitmix" (2 + h(key) % (max_vocab - 2)) or "mod" (key % max_vocab)
    open: bool = False  # "mod" with min_freq 1: every key has its id by the formula; no keys are held
    last_seen: np.ndarray | None = None  # int32 [k]: version each key was last seen in (None: the vocabulary's own)
    reset: np.ndarray | None = None  # int64: ids whose value changed from the parent's (expiry, :mod:`.vocab_grow`)

    @classmethod
    def build(cls, name: str, kind: str, keys: np.ndarray, counts: np.ndarray, *, min_freq: int = 1,
              max_vocab: int | None = None, mode: str = "hash", hash_seed: int = 0, seen: int | None = None,
              missing: int = 0, hash_fn: str = "splitmix") -> Vocabulary:
        """Assign final ids to kept ``keys`` [k] (first-appearance order)."""
        if max_vocab is not None and mode == "hash" and hash_fn == "mod":
            ids = np.asarray(keys, np.int64) % max_vocab
            return cls(name, kind, keys, ids, np.asarray(counts, np.int64), max_vocab, min_freq, max_vocab, mode,
                       hash_seed, len(keys) if seen is None else seen, missing, "mod")
        k = len(keys)
        if max_vocab is not None and mode == "cap" and k > max_vocab - FIRST_ID:
            keys, counts, k = keys[: max_vocab - FIRST_ID], counts[: max_vocab - FIRST_ID], max_vocab - FIRST_ID
        if max_vocab is not None and mode == "hash":
            buckets = max_vocab - FIRST_ID
            ids = (FIRST_ID + hash_keys(keys, hash_seed) % np.uint64(buckets)).astype(np.int64)
            size = max_vocab
        else:
            ids = FIRST_ID + np.arange(k, dtype=np.int64)
            size = FIRST_ID + k
        return cls(name, kind, keys, ids, np.asarray(counts, np.int64), size, min_freq, max_vocab, mode,
                   hash_seed, k if seen is None else seen, missing)

    def __post_init__(self) -> None:
        self._sorter: np.ndarray | None = None  # string keys: their sort order, built on the first lookup
        self._hash: pd.Index | None = None  # integer keys: their hash, built on the first lookup

    @classmethod
    def modulo(cls, name: str, max_vocab: int) -> Vocabulary:
        """MLPerf's ids without a fit: ``key % max_vocab`` for every present key, 0 for missing (see the module
        docstring); holds no keys, so its memory does not grow with the data."""
        empty = np.empty(0, np.int64)
        return cls(name, "int", empty, empty, empty, max_vocab, 1, max_vocab, "hash", 0, 0, 0, "mod", True)

    def __len__(self) -> int:
        return self.size

    def lookup(self, values: Any, missing: np.ndarray | None = None, *, unseen_base: int | None = None) -> np.ndarray:
        """Raw values [n] -> ids int64 [n]: kept -> id, other non-missing -> 1, missing (null/empty) -> 0.

        ``unseen_base``: a value the vocabulary does not hold gets ``unseen_base + (hash(key) >> 2)``
        instead of 1, so distinct unseen keys stay apart (GAUC groups of new users; ``unseen_base`` =
        2^62 keeps them clear of every vocabulary id). Text that cannot be an integer key stays 1."""
        if isinstance(values, CodedKeys):  # the distinct keys looked up, the rows take their ids
            if missing is None:
                return self.lookup(values.uniques, values.uniques < 0, unseen_base=unseen_base)[values.codes]
            values = values.values()
        unseen = None
        if self.open:
            keys, miss = _as_key_array(values, "int")
            out = keys % self.max_vocab  # type: ignore[operator]
            if missing is not None:
                miss = missing if miss is None else (miss | missing)
            if miss is not None:
                out[miss] = MISSING_ID
            return out
        if self.kind == "int":  # text (a CSV read as strings, dict rows) looked up in integer keys
            values, unseen = _integer_keys_of_text(values)
        keys, miss = _as_key_array(values, self.kind)
        if missing is not None:
            miss = missing if miss is None else (miss | missing)
        if self.kind == "int":  # the distinct values, looked up in a hash of the keys
            codes, uniq = pd.factorize(keys)
            out = self._lookup_int(uniq)[codes]
        elif len(keys) > 4 * max(len(self.keys), 1):  # many rows: look up the distinct values only
            enc = pc.dictionary_encode(_one_chunk(pa.array(keys)))
            out = self._lookup_unique(enc.dictionary.to_numpy(zero_copy_only=False).astype(str))[enc.indices.to_numpy()]
        else:
            out = self._lookup_unique(keys)
        if unseen_base is not None:
            new = out == RARE_ID
            if new.any():
                out[new] = (unseen_base + (hash_keys(keys[new]) >> np.uint64(2))).astype(np.int64)
        if miss is not None:
            out[miss] = MISSING_ID
        if unseen is not None:
            out[unseen] = RARE_ID
        return out

    def _lookup_int(self, keys: np.ndarray) -> np.ndarray:
        """Ids of integer ``keys`` [m] (kept -> id, else 1) through a hash of the kept keys (``pd.Index``, built once)."""
        if len(self.keys) == 0:
            return np.full(len(keys), RARE_ID, np.int64)
        if self._hash is None:
            self._hash = pd.Index(np.asarray(self.keys, np.int64))  # kept keys are distinct
        pos = self._hash.get_indexer(keys)
        return np.where(pos >= 0, self.ids[pos], RARE_ID)

    def _lookup_unique(self, keys: np.ndarray) -> np.ndarray:
        if self._sorter is None:
            self._sorter = np.argsort(self.keys, kind="stable")
            self._sorted = self.keys[self._sorter]
        out = np.full(len(keys), RARE_ID, np.int64)
        if len(self._sorted) == 0:
            return out
        pos = np.searchsorted(self._sorted, keys)
        pos[pos == len(self._sorted)] = 0
        hit = self._sorted[pos] == keys
        out[hit] = self.ids[self._sorter[pos[hit]]]
        return out

    def meta(self) -> dict[str, Any]:
        return {"kind": self.kind, "size": self.size, "num_keys": len(self.keys), "seen": self.seen,
                "missing": self.missing, "min_freq": self.min_freq, "max_vocab": self.max_vocab,
                "mode": self.mode, "hash_seed": self.hash_seed,
                **({"hash_fn": self.hash_fn, "open": self.open} if self.hash_fn != "splitmix" else {})}


def _arrow_keys(v: Vocabulary) -> pa.Array:
    if v.kind == "str":
        return pa.array(v.keys.astype(str), pa.string())
    k = v.keys
    if len(k) and k.min() >= 0 and k.max() <= np.iinfo(np.uint32).max:
        return pa.array(k.astype(np.uint32))
    return pa.array(k.astype(np.int64))


def save_vocabularies(directory: str | Path, vocabs: dict[str, Vocabulary], **meta: Any) -> Path:
    """Write ``vocab.json`` and one ``<name>.arrow`` per vocabulary into ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    entries = {}
    for i, (name, v) in enumerate(vocabs.items()):
        fname = f"{i:03d}.arrow"
        cols = {"key": _arrow_keys(v), "count": pa.array(v.counts, pa.int64())}
        if v.max_vocab is not None and v.mode == "hash":
            cols["id"] = pa.array(v.ids, pa.int64())
        with pa.OSFile(str(d / fname), "wb") as f, pa.ipc.new_file(f, pa.table(cols).schema) as w:
            w.write_table(pa.table(cols))
        entries[name] = {"file": fname, **v.meta()}
    (d / "vocab.json").write_text(json.dumps({"format": "ctrkit-vocab", "version": 1, "vocabularies": entries,
                                              **meta}, indent=2))
    return d


def load_vocabularies(directory: str | Path) -> dict[str, Vocabulary]:
    """Read vocabularies written by :func:`save_vocabularies` (``directory`` = a store or its vocab/ dir)."""
    d = Path(directory)
    if (d / "vocab").is_dir():
        d = d / "vocab"
    mpath = d / "vocab.json"
    if not mpath.is_file():
        raise DataError(f"{directory} has no vocabularies (no vocab/vocab.json); pass a store written by "
                        "`ctrkit preprocess`")
    meta = json.loads(mpath.read_text())
    out = {}
    for name, e in meta["vocabularies"].items():
        with pa.memory_map(str(d / e["file"])) as f:
            t = pa.ipc.open_file(f).read_all()
        keys = t.column("key").to_numpy()
        keys = keys.astype(str) if e["kind"] == "str" else keys.astype(np.int64)
        counts = t.column("count").to_numpy()
        ids = t.column("id").to_numpy() if "id" in t.column_names else FIRST_ID + np.arange(len(keys), dtype=np.int64)
        out[name] = Vocabulary(name, e["kind"], keys, ids.astype(np.int64), counts, e["size"], e["min_freq"],
                               e["max_vocab"], e["mode"], e["hash_seed"], e["seen"], e["missing"])
    return out
