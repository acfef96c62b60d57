"""Growing vocabularies (``ctrkit preprocess ... --vocab-from PARENT --grow``): a new vocabulary version over new data.

The contract a warm start relies on (``ctrkit train --warm-start``: tables grown behind the embedding interface):

* every value the parent vocabulary holds keeps its id: ``grown.lookup(k) == parent.lookup(k)`` for each of the
  parent's keys, and ids 0 (missing) and 1 (rare / unseen) keep their meaning;
* values the parent does not hold are admitted when their count reaches ``min_freq``, counted over the parent's
  stored counts (:attr:`GrowFrom.pending`: the values it counted but gave no id, below ``min_freq`` or past a
  ``cap``) plus the new data; admitted values get fresh ids ``parent.size, parent.size + 1, ...`` in the order
  they first appear in the new data (then, only when ``min_freq`` was lowered, pending parent values the new data
  does not hold, in key order). So rows ``[0, parent.size)`` of a grown table are the parent's rows and
  ``[parent.size, size)`` are new; the ids are a function of the parent and the new data only (not of chunking
  or of the number of workers);
* a hashed vocabulary (``max_vocab`` with mode ``hash``) keeps its size and its formula: new values take the
  formula's buckets, so a grown hashed table has no new rows;
* a vocabulary never grows silently past a cap: a grown vocabulary of sequential ids larger than ``--max-vocab``
  (or a ``cap``-mode parent's ``max_vocab``) is a :class:`~ctrkit.errors.DataError`; known ids are never re-hashed;
* the grown pipeline records its lineage (:func:`lineage`, saved as ``vocab_lineage`` in ``pipeline.json``, in
  checkpoints' pipelines and in the stores' manifests): ``version`` (the parent's + 1; a first fit is version 1),
  ``parent_fingerprint`` (the parent's vocabulary fingerprint), ``parent_source`` and per table ``parent_size``
  and ``size`` (embedding rows before and after; the GAUC group column's vocabulary, which no model reads, is
  left out).

Counts kept between versions: a fitted vocabulary holds the counts of its kept keys (``Vocabulary.counts``) and,
in ``<store>/pipeline/pending*.npy``, the keys it counted without giving them an id, with their counts
(:func:`pending_of`); they travel with the store (not with checkpoints, which hold only what serving needs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ctrkit.data.pipeline.vocab import FIRST_ID, GROUP_TABLE, RARE_ID, VocabBuilder, Vocabulary
from ctrkit.errors import DataError

log = logging.getLogger(__name__)

Pending = tuple[np.ndarray, np.ndarray]  # (keys [m], counts int64 [m]) counted without an id


@dataclass
class GrowFrom:
    """The parent a growing fit starts from: its vocabularies, their pending counts, its fingerprint, version and
    dense statistics (kept: a warm-started model reads its dense inputs scaled as before)."""

    vocabs: dict[str, Vocabulary]
    fingerprint: str
    source: str
    version: int = 1
    pending: dict[str, Pending] = field(default_factory=dict)
    mean: np.ndarray | None = None
    std: np.ndarray | None = None


def _positions(haystack: np.ndarray, needles: np.ndarray) -> np.ndarray:
    """Index of each needle in ``haystack`` (distinct keys), -1 where absent -> int64 [n]."""
    out = np.full(len(needles), -1, np.int64)
    if len(haystack) == 0 or len(needles) == 0:
        return out
    order = np.argsort(haystack, kind="stable")
    sorted_keys = haystack[order]
    pos = np.searchsorted(sorted_keys, needles)
    pos[pos == len(sorted_keys)] = 0
    hit = sorted_keys[pos] == needles
    out[hit] = order[pos[hit]]
    return out


def pending_of(builder: VocabBuilder, vocab: Vocabulary) -> Pending:
    """The keys ``builder`` counted that ``vocab`` (its fit) gives no id (count < min_freq, or past a cap), with
    their counts, in key order (what the counts merged from disk give too). No search: ``vocab`` kept the keys
    with count >= min_freq in first-appearance order (a cap: the first of them)."""
    keys, counts = builder.keys(), builder.counts()
    if vocab.open:
        return keys[:0], counts[:0]
    out = counts < vocab.min_freq
    if vocab.max_vocab is not None and vocab.mode == "cap":
        out[np.flatnonzero(~out)[len(vocab.keys):]] = True
    order = np.argsort(keys[out], kind="stable")
    return keys[out][order], counts[out][order]


def _empty(kind: str) -> Pending:
    return np.empty(0, np.int64 if kind == "int" else "<U1"), np.empty(0, np.int64)


def _check_rule(parent: Vocabulary, max_vocab: int | None, mode: str) -> None:
    if parent.max_vocab is not None and max_vocab is not None and (max_vocab, mode) != (parent.max_vocab, parent.mode):
        raise DataError(f"vocabulary {parent.name!r}: the parent was fitted with max_vocab={parent.max_vocab} "
                        f"(mode {parent.mode!r}) and a grown vocabulary keeps its parent's rule (known ids cannot "
                        f"move); drop --max-vocab or pass --max-vocab {parent.max_vocab} --max-vocab-mode "
                        f"{parent.mode}, or refit without --grow")


def grow_vocabulary(parent: Vocabulary, pending: Pending | None, builder: VocabBuilder, *, min_freq: int,
                    max_vocab: int | None = None, mode: str = "hash",
                    columns: str = "") -> tuple[Vocabulary, np.ndarray | None, Pending]:
    """``parent`` grown by the values ``builder`` counted in the new data (the module docstring's contract)
    -> (grown vocabulary, ``lut`` int64 [builder.next_id] from the builder's provisional ids to final ids (None:
    the parent is a formula of the key that holds no keys), the new pending counts). ``max_vocab`` / ``mode``:
    the run's options (None: the parent's rule); ``columns`` names the columns of the table in errors."""
    where = f"vocabulary {parent.name!r}" + (f" (columns {columns})" if columns else "")
    if builder.kind != parent.kind:
        raise DataError(f"{where}: the parent store holds {parent.kind} keys but the new data holds {builder.kind} "
                        "values (the column was retyped); give the column its parent's type, or refit without --grow")
    _check_rule(parent, max_vocab, mode)
    if parent.open:  # MLPerf's modulo without a fit: every key already has its id
        return parent, None, _empty(parent.kind)
    pkeys, pcounts = pending if pending is not None else _empty(parent.kind)
    bkeys, bcounts = builder.keys(), builder.counts()
    at_parent, at_pending = _positions(parent.keys, bkeys), _positions(pkeys, bkeys)
    total = bcounts.copy()
    total[at_pending >= 0] += pcounts[at_pending[at_pending >= 0]]
    admit = (at_parent < 0) & (total >= min_freq)  # (n,) first-appearance order of the new data
    unseen = np.ones(len(pkeys), bool)
    unseen[at_pending[at_pending >= 0]] = False
    admit_p = unseen & (pcounts >= min_freq)  # lowered min_freq: pending values absent from the new data
    counts = np.asarray(parent.counts, np.int64).copy()
    np.add.at(counts, at_parent[at_parent >= 0], bcounts[at_parent >= 0])
    new_keys = np.concatenate([bkeys[admit], pkeys[admit_p]])
    grown = _extend(parent, new_keys, np.concatenate([counts, total[admit], pcounts[admit_p]]), max_vocab, where)
    grown.min_freq, grown.missing = int(min_freq), parent.missing + builder.missing
    rest = (at_parent < 0) & ~admit
    still = unseen & ~admit_p
    left = (np.concatenate([pkeys[still], bkeys[rest]]), np.concatenate([pcounts[still], total[rest]]))
    grown.seen = len(grown.keys) + len(left[0])
    lut = np.full(builder.next_id, RARE_ID, np.int64)
    lut[0] = 0
    lut[FIRST_ID: FIRST_ID + len(bkeys)] = grown.lookup(bkeys)  # known and admitted values; the others 1
    return grown, lut, left


def _extend(parent: Vocabulary, new_keys: np.ndarray, counts: np.ndarray, max_vocab: int | None,
            where: str) -> Vocabulary:
    """``parent`` with ``new_keys`` appended (``counts``: of every key after that): by the parent's formula when
    hashed, else at ids ``parent.size, parent.size + 1, ...``; a cap exceeded is an error."""
    keys = np.concatenate([parent.keys, new_keys.astype(parent.keys.dtype if parent.kind == "int" else str)])
    if parent.max_vocab is not None and parent.mode == "hash":
        return Vocabulary.build(parent.name, parent.kind, keys, counts, min_freq=parent.min_freq,
                                max_vocab=parent.max_vocab, mode="hash", hash_seed=parent.hash_seed,
                                hash_fn=parent.hash_fn)
    size = parent.size + len(new_keys)
    cap = parent.max_vocab if parent.max_vocab is not None else max_vocab
    if cap is not None and size > cap:
        raise DataError(f"{where}: growing it gives {size} ids ({parent.size} of the parent + {len(new_keys)} new), "
                        f"over max_vocab={cap}; known ids cannot be re-hashed. Raise --max-vocab, raise --min-freq "
                        "to admit fewer new values, or refit without --grow with --max-vocab-mode hash")
    ids = np.concatenate([parent.ids, parent.size + np.arange(len(new_keys), dtype=np.int64)])
    return replace(parent, keys=keys, ids=ids, counts=counts, size=size)


def lineage(parent: GrowFrom, vocabs: dict[str, Vocabulary]) -> dict[str, Any]:
    """The ``vocab_lineage`` record of a grown pipeline (the module docstring)."""
    return {"version": parent.version + 1, "parent_fingerprint": parent.fingerprint, "parent_source": parent.source,
            "tables": {t: {"parent_size": int(parent.vocabs[t].size), "size": int(v.size)}
                       for t, v in vocabs.items() if t in parent.vocabs and t != GROUP_TABLE}}
