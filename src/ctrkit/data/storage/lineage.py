"""Is a vocabulary a parent of another? The check a warm start (``ctrkit train --warm-start CHECKPOINT``) makes
between the checkpoint's vocabularies and the new training store's, instead of the equality that every other reader
of a checkpoint asks (:func:`~ctrkit.data.storage.agree.check_same_vocabulary`).

A vocabulary grown from a parent (``ctrkit preprocess ... --vocab-from PARENT --grow``) keeps every id the parent
gave and appends new ids after them, so an embedding table trained on the parent's ids stays valid for its first
rows and only needs new rows. Per table, the child must:

* come from the same rule: kind (int / str), ``max_vocab``, mode, hash seed and hash function;
* hashed tables (``max_vocab`` in mode "hash": ids by formula, a fixed size): the same size, nothing else to check;
* otherwise: give every key of the parent the parent's id (checked on the keys, vectorised), and hold as many or
  more rows. Expiry (``--expire-after``) is the one exception: a parent's value the child evicted maps to id 1
  (rare), accepted only when the child records the value's id as reset (``Vocabulary.reset``); anything else (a
  known value with another id, an evicted value whose id the child does not record) is refused. The rows a warm
  start resets to their fresh initial values (:attr:`TableGrowth.reset`) are the recorded ids whose value differs
  between parent and child (so a checkpoint of the child's own version resets nothing).

This is decided on the content, not on a recorded link to the parent's fingerprint, so it holds for vocabularies
grown by any path (and a recorded link cannot vouch for content that was changed afterwards). Stores of ids
(synthetic) have no vocabularies: their tables may only keep or grow their sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ctrkit.data.pipeline.vocab import GROUP_TABLE, RARE_ID, Vocabulary
from ctrkit.data.storage.agree import Vocabularies
from ctrkit.errors import StoreError

_RULE = ("kind", "max_vocab", "mode", "hash_seed", "hash_fn", "open")


@dataclass(frozen=True)
class TableGrowth:
    """One table from the parent to the child vocabulary: rows before and after (equal: unchanged or hashed), and
    the ids whose rows start afresh (expiry: the value at that id changed)."""

    name: str
    old_rows: int
    new_rows: int
    reset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def parent_problem(parent: Vocabulary, child: Vocabulary) -> str | None:
    """Why ``child`` is not a grown version of ``parent`` (None when it is); see the module docstring."""
    rule = [f"{k} {getattr(parent, k)!r} -> {getattr(child, k)!r}" for k in _RULE
            if getattr(parent, k) != getattr(child, k)]
    if rule:
        return f"its ids come from another rule ({', '.join(rule)})"
    if parent.max_vocab is not None and parent.mode == "hash":
        return None if child.size == parent.size else f"hashed size {parent.size} -> {child.size}"
    if child.size < parent.size:
        return f"it shrank from {parent.size} to {child.size} ids"
    got = child.lookup(parent.keys) if len(parent.keys) else np.zeros(0, np.int64)
    moved = got != parent.ids
    if child.reset is not None and len(child.reset):  # evicted by expiry, its id recorded as reset
        moved &= ~((got == RARE_ID) & np.isin(parent.ids, child.reset))
    moved = np.flatnonzero(moved)
    if len(moved):
        i = int(moved[0])
        why = (f" (evicted, and the new vocabulary does not record id {int(parent.ids[i])} as reset: it is not the "
               "next version after the checkpoint's; warm-start from the checkpoint trained on its parent version)"
               if got[i] == RARE_ID else "")
        return (f"{len(moved)} of its {len(parent.keys)} known values have other ids (e.g. value "
                f"{parent.keys[i].item()!r}: id {int(parent.ids[i])} -> {int(got[i])}{why})")
    return None


def reset_rows(parent: Vocabulary, child: Vocabulary) -> np.ndarray:
    """The ids of ``child.reset`` whose value differs between ``parent`` and ``child`` (``child`` a grown version
    of ``parent``: :func:`parent_problem` is None) -> sorted int64: the rows a warm start resets."""
    ids = np.zeros(0, np.int64) if child.reset is None else np.asarray(child.reset, np.int64)
    if not len(ids) or (child.max_vocab is not None and child.mode == "hash"):
        return np.zeros(0, np.int64)
    order = np.argsort(child.ids, kind="stable")
    pos = np.searchsorted(child.ids[order], ids).clip(max=max(len(order) - 1, 0))
    held = child.ids[order][pos] == ids if len(order) else np.zeros(len(ids), bool)  # the child gives a value
    same = np.zeros(len(ids), bool)
    if held.any():
        same[held] = parent.lookup(child.keys[order][pos[held]]) == ids[held]  # the parent's value there already
    return ids[~same]


def check_grown(parent: Vocabularies, child: Vocabularies, what: str) -> list[TableGrowth]:
    """The growth of every table from ``parent`` (a checkpoint's vocabularies) to ``child`` (the new training
    store's); a StoreError naming the tables where ``child`` is not a grown version of ``parent``. ``what`` names
    the option that chose the checkpoint (e.g. "--warm-start runs/a/best.pt")."""
    problems: list[str] = []
    resets: dict[str, np.ndarray] = {}  # per table the rows a warm start resets (expiry)
    if parent.entries is None or child.entries is None:  # ids without vocabularies: sizes only
        if (parent.entries is None) != (child.entries is None):
            has = "the checkpoint" if child.entries is None else "the store"
            problems.append(f"only {has} has vocabularies (one side was preprocessed from raw values, the other holds "
                            "ids)")
        sizes = {n: (parent.sizes[n], child.sizes.get(n, 0)) for n in parent.sizes}
    else:
        old, new = _load(parent), _load(child)
        sizes = {}
        for name in (n for n in old if n != GROUP_TABLE):
            if name not in new:
                problems.append(f"table {name!r}: no vocabulary in {child.source}")
                continue
            why = parent_problem(old[name], new[name])
            if why is not None:
                problems.append(f"table {name!r}: {why}")
            else:
                resets[name] = reset_rows(old[name], new[name])
            sizes[name] = (old[name].size, new[name].size)
        problems += [f"table {n!r}: only in {child.source}" for n in new if n not in old and n != GROUP_TABLE]
    missing = [n for n in parent.sizes if n not in child.sizes]
    problems += [f"table {n!r}: not in {child.source}" for n in missing]
    problems += [f"table {n!r}: it shrank from {a} to {b} rows" for n, (a, b) in sizes.items()
                 if n in child.sizes and b < a and not any(p.startswith(f"table {n!r}") for p in problems)]
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        src = str(parent.store) if parent.store is not None else "<the checkpoint's training store>"
        raise StoreError(
            f"{what}: the vocabularies of {child.source} are not a grown version of those of {parent.source} "
            f"({shown}). A warm start needs every known value to keep its id (new values appended): preprocess "
            f"the new data with `ctrkit preprocess ... --vocab-from {src} --grow`")
    return [TableGrowth(n, a, b, resets.get(n, np.zeros(0, np.int64))) for n, (a, b) in sizes.items()
            if n in child.sizes]


def _load(v: Vocabularies) -> dict[str, Vocabulary]:
    if v.load is None:
        return {}
    try:
        return v.load()
    except (OSError, KeyError, ValueError) as e:
        raise StoreError(f"{v.source}: the vocabularies cannot be read ({type(e).__name__}: {e}); re-run the "
                         "preprocessing") from e
