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

Expiry (``--expire-after N``, :attr:`GrowFrom.expire_after`): a vocabulary keeps per key the version it was last
seen in (``Vocabulary.last_seen``; counted data of this version: ``version``), and so do the pending counts. A known
value not seen in the last ``N`` versions (this one included: ``last_seen <= version - N``) is evicted: its key and
counts are dropped (it maps to id 1, rare, as a value never seen; seen again later, it is counted from zero like
a new value) and its id is freed; pending values not seen for ``N`` versions are dropped too. New values take the
free ids first (ascending: freed now, or free since an earlier version), then ``parent.size, ...``, so the table
stops growing once the ids freed per version match the ids admitted. ``Vocabulary.reset`` records the ids below
``parent.size`` whose value changed (freed, or given to a new value): the rows a warm start resets to their fresh
initial values (:mod:`ctrkit.data.storage.lineage`), and the only ids whose known value may stop mapping to them.
Free ids are reused by a growth without expiry too. A hashed vocabulary drops its expired keys (they map to 1;
memory stays flat) but resets no row: a bucket is shared by other keys. An open one holds no keys: nothing expires.

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
    expire_after: int | None = None  # evict the values not seen in the last N versions (module docstring)
    pending_seen: dict[str, np.ndarray] = field(default_factory=dict)  # per table: version each pending key was seen


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
                    max_vocab: int | None = None, mode: str = "hash", columns: str = "", version: int = 2,
                    expire_after: int | None = None, pending_seen: np.ndarray | None = None,
                    ) -> tuple[Vocabulary, np.ndarray | None, Pending, np.ndarray]:
    """``parent`` grown by the values ``builder`` counted in the new data (the module docstring's contract)
    -> (grown vocabulary, ``lut`` int64 [builder.next_id] from the builder's provisional ids to final ids (None:
    the parent is a formula of the key that holds no keys), the new pending counts, the version each pending key was
    last seen in, int32). ``max_vocab`` / ``mode``: the run's options (None: the parent's rule); ``columns`` names the
    columns of the table in errors; ``version``: the grown vocabulary's (the parent's + 1); ``expire_after``: evict
    the values not seen in the last N versions; ``pending_seen``: the versions of ``pending``'s keys (None: the
    parent's version)."""
    where = f"vocabulary {parent.name!r}" + (f" (columns {columns})" if columns else "")
    if builder.kind != parent.kind:
        raise DataError(f"{where}: the parent store holds {parent.kind} keys but the new data holds {builder.kind} "
                        "values (the column was retyped); give the column its parent's type, or refit without --grow")
    _check_rule(parent, max_vocab, mode)
    if parent.open:  # MLPerf's modulo without a fit: every key already has its id
        return parent, None, _empty(parent.kind), np.zeros(0, np.int32)
    pkeys, pcounts = pending if pending is not None else _empty(parent.kind)
    bkeys, bcounts = builder.keys(), builder.counts()
    at_parent, at_pending = _positions(parent.keys, bkeys), _positions(pkeys, bkeys)
    seen = _seen(parent.last_seen, len(parent.keys), at_parent, version)  # (k,) parent keys
    pseen = _seen(pending_seen, len(pkeys), at_pending, version)  # (m,) pending keys
    horizon = version - expire_after if expire_after else -1  # last seen at or before it: expired
    alive, palive = seen > horizon, pseen > horizon
    total = bcounts.copy()
    total[at_pending >= 0] += pcounts[at_pending[at_pending >= 0]]
    admit = (at_parent < 0) & (total >= min_freq)  # (n,) first-appearance order of the new data
    unseen = np.ones(len(pkeys), bool)
    unseen[at_pending[at_pending >= 0]] = False
    admit_p = unseen & palive & (pcounts >= min_freq)  # lowered min_freq: pending values absent from the new data
    counts = np.asarray(parent.counts, np.int64).copy()
    np.add.at(counts, at_parent[at_parent >= 0], bcounts[at_parent >= 0])
    new_keys = np.concatenate([bkeys[admit], pkeys[admit_p]])
    grown = _extend(parent, alive, new_keys, np.concatenate([counts[alive], total[admit], pcounts[admit_p]]),
                    max_vocab, where)
    grown.last_seen = np.concatenate([seen[alive], np.full(int(admit.sum()), version, np.int32), pseen[admit_p]])
    grown.min_freq, grown.missing = int(min_freq), parent.missing + builder.missing
    rest = (at_parent < 0) & ~admit
    still = unseen & ~admit_p & palive
    left = (np.concatenate([pkeys[still], bkeys[rest]]), np.concatenate([pcounts[still], total[rest]]))
    grown.seen = len(grown.keys) + len(left[0])
    lut = np.full(builder.next_id, RARE_ID, np.int64)
    lut[0] = 0
    lut[FIRST_ID: FIRST_ID + len(bkeys)] = grown.lookup(bkeys)  # known and admitted values; the others 1
    return grown, lut, left, np.concatenate([pseen[still], np.full(int(rest.sum()), version, np.int32)])


def _seen(last: np.ndarray | None, n: int, at: np.ndarray, version: int) -> np.ndarray:
    """Version each of ``n`` keys was last seen in (``last``; None: the previous version), ``version`` for those the
    new data holds (``at``: their positions, -1 for new data keys that are not among them) -> int32 [n]."""
    out = np.full(n, version - 1, np.int32) if last is None else np.asarray(last, np.int32).copy()
    out[at[at >= 0]] = version
    return out


def _extend(parent: Vocabulary, alive: np.ndarray, new_keys: np.ndarray, counts: np.ndarray, max_vocab: int | None,
            where: str) -> Vocabulary:
    """``parent``'s ``alive`` keys [k] bool with ``new_keys`` after them (``counts``: of every key kept): by the
    parent's formula when hashed, else at the free ids (ascending), then ``parent.size, parent.size + 1, ...``; the
    ids whose value changed in ``reset``; a cap exceeded is an error."""
    keys = np.concatenate([parent.keys[alive], new_keys.astype(parent.keys.dtype if parent.kind == "int" else str)])
    if parent.max_vocab is not None and parent.mode == "hash":
        return Vocabulary.build(parent.name, parent.kind, keys, counts, min_freq=parent.min_freq,
                                max_vocab=parent.max_vocab, mode="hash", hash_seed=parent.hash_seed,
                                hash_fn=parent.hash_fn)
    held = np.zeros(parent.size, bool)
    held[parent.ids[alive]] = True
    free = FIRST_ID + np.flatnonzero(~held[FIRST_ID:])  # freed now, or free since an earlier version
    reuse = free[: len(new_keys)]
    size = parent.size + len(new_keys) - len(reuse)
    cap = parent.max_vocab if parent.max_vocab is not None else max_vocab
    if cap is not None and size > cap:
        raise DataError(f"{where}: growing it gives {size} ids ({parent.size} of the parent, {len(free)} of them free, "
                        f"+ {len(new_keys)} new), over max_vocab={cap}; known ids cannot be re-hashed. Raise "
                        "--max-vocab, raise --min-freq to admit fewer new values, evict old values with "
                        "--expire-after N, or refit without --grow with --max-vocab-mode hash")
    ids = np.concatenate([parent.ids[alive], reuse, parent.size + np.arange(len(new_keys) - len(reuse), dtype=np.int64)])
    reset = np.union1d(parent.ids[~alive], reuse).astype(np.int64)
    return replace(parent, keys=keys, ids=ids, counts=counts, size=size, reset=reset)


def lineage(parent: GrowFrom, vocabs: dict[str, Vocabulary]) -> dict[str, Any]:
    """The ``vocab_lineage`` record of a grown pipeline (the module docstring); with expiry also ``expire_after``
    and per table the values held (``keys``) and the ids reset (``reset``)."""
    def table(t: str, v: Vocabulary) -> dict[str, int]:
        out = {"parent_size": int(parent.vocabs[t].size), "size": int(v.size)}
        if parent.expire_after:
            out |= {"keys": len(v.keys), "reset": 0 if v.reset is None else len(v.reset)}
        return out

    return {"version": parent.version + 1, "parent_fingerprint": parent.fingerprint, "parent_source": parent.source,
            **({"expire_after": int(parent.expire_after)} if parent.expire_after else {}),
            "tables": {t: table(t, v) for t, v in vocabs.items() if t in parent.vocabs and t != GROUP_TABLE}}
