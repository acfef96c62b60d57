"""A vocabulary as plain arrays (string keys as UTF-8 bytes + offsets) and the vocabulary fingerprint that
stores and checkpoints compare (:mod:`ctrkit.data.storage.agree`): one per table, and one over all tables."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from ctrkit.data.pipeline.encode import GROUP_TABLE
from ctrkit.data.pipeline.vocab import RARE_ID, Vocabulary, _as_key_array
from ctrkit.schema import Schema


def utf8_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Strings [k] -> (UTF-8 bytes uint8 [total], offsets int64 [k + 1])."""
    a = pa.array(np.asarray(keys, str), pa.large_string())
    offs = np.frombuffer(a.buffers()[1], np.int64)[a.offset: a.offset + len(a) + 1].copy()
    data = a.buffers()[2]
    raw = np.frombuffer(data, np.uint8)[offs[0]: offs[-1]].copy() if data is not None else np.zeros(0, np.uint8)
    return raw, offs - offs[0]


def from_utf8(raw: np.ndarray, offs: np.ndarray) -> np.ndarray:
    a = pa.LargeStringArray.from_buffers(len(offs) - 1, pa.py_buffer(np.ascontiguousarray(offs, np.int64)),
                                         pa.py_buffer(np.ascontiguousarray(raw, np.uint8)))
    return a.to_numpy(zero_copy_only=False).astype(str)


def key_arrays(v: Vocabulary) -> dict[str, np.ndarray]:
    if v.kind == "str":
        raw, offs = utf8_keys(v.keys)
        return {"keys_utf8": raw, "keys_offsets": offs}
    return {"keys": np.asarray(v.keys, np.int64)}


def _formula(v: Vocabulary) -> bytes:
    """What else decides the ids of a hashed vocabulary: MLPerf's modulo (and an open one's, which holds no
    keys); nothing for the default hash, so fingerprints of earlier stores stay as they were."""
    return b"" if v.hash_fn == "splitmix" else repr((v.hash_fn, v.open)).encode()


def table_fingerprint(v: Vocabulary) -> str:
    """sha256 of what decides one vocabulary's ids (kind, size, cap / hash options, kept keys, their ids), not of
    its fitting statistics (counts, seen, min_freq): the per-table fingerprint that the store / checkpoint
    agreement compares (:mod:`ctrkit.data.storage.agree`). The same for a vocabulary read from a pipeline's
    arrays or from the ``vocab/`` files of an older store. Kept on the vocabulary once computed (a fitted
    vocabulary does not change; every checkpoint write asks again)."""
    cached = getattr(v, "_fingerprint", None)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    h.update(repr((v.kind, v.size, v.max_vocab, v.mode if v.max_vocab else None, v.hash_seed, len(v.keys))).encode())
    h.update(_formula(v))
    for a in key_arrays(v).values():
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(np.asarray(v.ids, "<i8").tobytes())
    v._fingerprint = "sha256:" + h.hexdigest()  # type: ignore[attr-defined]
    return v._fingerprint  # type: ignore[attr-defined]


def table_fingerprints(vocabs: dict[str, Vocabulary]) -> dict[str, str]:
    """{table: :func:`table_fingerprint`} of every vocabulary (``__group__`` included; the agreement skips it)."""
    return {name: table_fingerprint(v) for name, v in vocabs.items()}


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
        h.update(_formula(v))
        for a in key_arrays(v).values():
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(np.asarray(v.ids, "<i8").tobytes())
    return "sha256:" + h.hexdigest()


def with_keys(v: Vocabulary, values: Any) -> Vocabulary:
    """``v`` with the keys of ``values`` it does not hold appended, at ids ``v.size``, ``v.size + 1``, ...: every id
    it gave stays. For a vocabulary of ids in order (no max_vocab) whose ids no model reads: the group column's,
    where ``ctrkit preprocess behaviour`` names the valid / test users without train rows."""
    if v.max_vocab is not None or v.open:
        raise ValueError(f"vocabulary {v.name!r} has a max_vocab: its ids come from a formula, keys cannot be "
                         "appended")
    keys, miss = _as_key_array(values, v.kind)
    keys = keys if miss is None else keys[~miss]
    new = keys[v.lookup(keys) == RARE_ID]
    new = new[np.sort(np.unique(new, return_index=True)[1])]  # distinct, in first-appearance order
    if not len(new):
        return v
    return replace(v, keys=np.concatenate([v.keys, new]), ids=np.concatenate([v.ids, v.size + np.arange(len(new))]),
                   counts=np.concatenate([v.counts, np.zeros(len(new), np.int64)]), size=v.size + len(new))
