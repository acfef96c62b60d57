"""The numpy core of :mod:`ctrkit.data.sources.behaviour`: a behaviour log in code space -> DIN-style sample rows.

Codes: users and items are integers ``0..n-1`` here (the caller maps raw keys to codes and back). Every
step is vectorised over rows and users (stable sorts, cumulative sums, ``searchsorted``); the only Python
loops run over rejection rounds of the negative sampler and over the S session slots.

Protocol (issue 9, point 1), for a log sorted by (user, time) with user u's behaviours at positions
``p = 0..c_u - 1``:

* every behaviour with ``p >= 1`` is a positive; it gives two rows sharing one history: label 1 with the
  real item, then label 0 with a sampled negative item (with ``negatives="none"`` only the label-1 row);
  history = the user's behaviours at ``p' < p``, the most recent ``max_len`` kept, oldest first;
* negatives: ``uniform`` over the items of the log, or ``popularity`` (probability proportional to an
  item's number of rows in the log: a uniformly drawn row's item), never an item the user interacted with
  (vectorised rejection: draw, look the (user, item) key up in the sorted array of the user's keys,
  redraw the hits); or ``none``: positives only, for retrieval models (two-tower, YouTubeDNN, SASRec) that
  draw their negatives in training (in-batch or sampled softmax). The modes share the histories and the
  split: ``none`` gives exactly the label-1 rows of the others (in another train order);
* leave-last-out by user: ``p = c_u - 1`` -> test, ``p = c_u - 2`` -> valid, the rest -> train (a user
  with 2 behaviours has a test sample only, with 3 a valid and a test sample); rows come out in store
  order: train shuffled (seeded), then valid and test in user order, each positive before its negative;
* aux negatives (DIEN): one sampled negative per history step of every positive (drawn per sample, shared
  by its label-0 twin, which has the same history); not with ``negatives="none"``;
* example age (YouTubeDNN, needs times): how long before the end of the training window a row was logged,
  as a fraction of the window: ``(T_end - t) / (T_end - T_start)`` for a train row whose target behaviour has
  time ``t``, with ``T_start`` / ``T_end`` the earliest / latest target time over the train rows (so in
  [0, 1]: 0 for the latest train target, 1 for the earliest; all 0 when ``T_end == T_start``). Valid and
  test rows get 0: they are scored at the end of training, as at serving. A label-0 twin has the age of its
  positive;
* sessions (DSIN, needs times): the user's timeline is cut where the gap to the previous behaviour is
  ``>= session_gap``; a sample sees the sessions of its whole past (not only the last ``max_len``
  behaviours), the last one cut at the target. Sessions shorter than ``min_session_len`` (after the cut)
  are dropped, the most recent ``S`` kept, left-aligned: slot 0 holds the oldest kept session, empty slots
  (length 0) follow the filled ones; each session keeps its last ``session_len`` behaviours.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctrkit.errors import DataError

log = logging.getLogger(__name__)

NEGATIVES = ("uniform", "popularity", "none")
MAX_ROUNDS = 1000  # rejection rounds before the sampler gives up (users who saw nearly every item)

Jagged = tuple[np.ndarray, np.ndarray]  # (values [nnz], lengths [m])


@dataclass
class Samples:
    """Sample rows in code space, two per positive (label 1 and its label-0 twin, same history; one, label 1,
    with ``negatives="none"``), ordered by split: train (rows shuffled), then valid and test (user order,
    each positive before its negative)."""

    label: np.ndarray  # (m,) float32
    user: np.ndarray  # (m,) user codes
    item: np.ndarray  # (m,) target item codes (the real item, or the sampled negative)
    split: np.ndarray  # (m,) int8, sorted: 0 train, 1 valid, 2 test
    hist: Jagged  # item codes of the history, oldest first, <= max_len per row
    neg_hist: Jagged | None  # one sampled negative per history step (same lengths as hist)
    sessions: list[Jagged] = field(default_factory=list)  # S slots of item codes, slot 0 the oldest session
    example_age: np.ndarray | None = None  # (m,) float32 in [0, 1]: 0 in valid / test (module docstring)
    stats: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.label)

    def part(self, code: int) -> Samples:
        """The rows of split ``code`` (0 train, 1 valid, 2 test): a contiguous slice."""
        a, b = (int(x) for x in np.searchsorted(self.split, [code, code + 1]))

        def cut(j: Jagged) -> Jagged:
            off = np.concatenate([[0], np.cumsum(j[1])])
            return j[0][off[a]:off[b]], j[1][a:b]

        return Samples(self.label[a:b], self.user[a:b], self.item[a:b], self.split[a:b], cut(self.hist),
                       None if self.neg_hist is None else cut(self.neg_hist), [cut(x) for x in self.sessions],
                       None if self.example_age is None else self.example_age[a:b], self.stats)


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(starts[j], starts[j] + lengths[j])`` over j -> indices [sum(lengths)]."""
    lengths = np.asarray(lengths, np.int64)
    offs = np.cumsum(lengths) - lengths
    return np.repeat(np.asarray(starts, np.int64) - offs, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


def sort_log(user: np.ndarray, time: np.ndarray | None) -> tuple[np.ndarray, int]:
    """Stable order by (user, time) (file order within a user without times) -> (order [n], out_of_order):
    ``out_of_order`` counts rows whose time is earlier than the previous row of the same user in file order."""
    by_user = np.argsort(user, kind="stable")  # (n,) file order within each user
    if time is None:
        return by_user, 0
    t, u = time[by_user], user[by_user]
    out_of_order = int(((t[1:] < t[:-1]) & (u[1:] == u[:-1])).sum())
    by_time = np.argsort(time, kind="stable")
    return by_time[np.argsort(user[by_time], kind="stable")], out_of_order


def user_keys(user: np.ndarray, item: np.ndarray, n_items: int) -> np.ndarray:
    """Sorted distinct ``user * n_items + item`` keys [k]: the membership index of the negative sampler."""
    return np.unique(np.asarray(user, np.int64) * n_items + np.asarray(item, np.int64))


def draw_negatives(users: np.ndarray, seen: np.ndarray, n_items: int, rng: np.random.Generator,
                   pool: np.ndarray | None = None, *, user_names: Any = None) -> np.ndarray:
    """One item code per entry of ``users`` [m] that the user never interacted with (``seen``: sorted keys of
    :func:`user_keys`). Uniform over ``0..n_items-1``, or the item of a uniformly drawn entry of ``pool``
    (the log's items: popularity sampling). Vectorised rejection: hits are redrawn, round after round."""
    m = len(users)

    def draw(k: int) -> np.ndarray:
        return rng.integers(0, n_items, k) if pool is None else pool[rng.integers(0, len(pool), k)]

    out = draw(m)
    todo = np.arange(m)
    users = np.asarray(users, np.int64)
    for _ in range(MAX_ROUNDS):
        key = users[todo] * n_items + out[todo]
        pos = np.minimum(np.searchsorted(seen, key), len(seen) - 1)
        todo = todo[seen[pos] == key]
        if len(todo) == 0:
            return out
        out[todo] = draw(len(todo))
    bad = np.unique(users[todo])[:5]
    names = [str(user_names[u]) if user_names is not None else int(u) for u in bad]
    raise DataError(f"no negative item found in {MAX_ROUNDS} rounds for {len(todo)} draws of users {names}: "
                    "they interacted with nearly every item (or every popular one); drop those users from the "
                    "log or use --negatives uniform")


def check_sampleable(seen: np.ndarray, n_items: int, user_names: Any = None) -> None:
    """Raise when a user interacted with every item (no negative exists for them)."""
    per_user = np.bincount(seen // n_items)
    full = np.flatnonzero(per_user >= n_items)
    if len(full):
        names = [str(user_names[u]) if user_names is not None else int(u) for u in full[:5]]
        raise DataError(f"users {names} interacted with all {n_items} items of the log, so no negative item "
                        "can be sampled for them; drop them from the log")


def check_options(negatives: str, aux_negatives: bool, max_len: int, session_len: int, sessions: int,
                  min_session_len: int, *, has_time: bool, example_age: bool) -> None:
    """Refuse sampling options that cannot be honoured, naming the command-line option that fixes them: the one
    check, made by ``ctrkit preprocess behaviour`` before it reads the log and by :func:`build_samples`."""
    if negatives not in NEGATIVES:
        raise DataError(f"--negatives {negatives!r} is not one of {NEGATIVES}")
    if negatives == "none" and aux_negatives:
        raise DataError("--aux-negatives does not go with --negatives none: DIEN's auxiliary negatives are "
                        "for ranking samples (a positive and a sampled negative); use --negatives uniform or "
                        "popularity for DIEN, or drop --aux-negatives for positives-only (retrieval) samples")
    if max_len < 1 or session_len < 1 or sessions < 0 or min_session_len < 1:
        raise DataError("max_len, session_len and min_session_len must be >= 1 and sessions >= 0 "
                        f"(got {max_len}, {session_len}, {min_session_len}, {sessions})")
    if sessions and not has_time:
        raise DataError("DSIN sessions need timestamps: give --time-col (the s3rec format has none)")
    if example_age and not has_time:
        raise DataError("--example-age needs timestamps: give --time-col with a CSV / Parquet log (the s3rec "
                        "format has none), or drop --example-age")


def build_samples(user: np.ndarray, item: np.ndarray, time: np.ndarray | None, *, n_items: int,
                  max_len: int = 50, negatives: str = "uniform", seed: int = 0, aux_negatives: bool = False,
                  sessions: int = 0, session_len: int = 10, session_gap: float = 1800.0,
                  min_session_len: int = 1, example_age: bool = False, user_names: Any = None) -> Samples:
    """Sample rows of a log sorted by (user, time) (:func:`sort_log`): ``user``, ``item`` [n] codes,
    ``time`` [n] seconds or None. See the module docstring for the protocol; ``user_names`` [U] (raw keys by
    code) only name users in errors."""
    check_options(negatives, aux_negatives, max_len, session_len, sessions, min_session_len,
                  has_time=time is not None, example_age=example_age)
    user, item = np.asarray(user, np.int64), np.asarray(item, np.int64)
    n = len(user)
    new = np.ones(n, bool)  # (n,) first row of a user
    new[1:] = user[1:] != user[:-1]
    starts = np.flatnonzero(new)  # (U,)
    run = np.cumsum(new) - 1  # (n,) the user's index among starts
    count = np.diff(np.append(starts, n))  # (U,) behaviours per user
    pos = np.arange(n) - starts[run]  # (n,) position within the user
    k = np.flatnonzero(pos >= 1)  # (S,) rows that are positive targets
    last = count[run[k]] - 1
    split_s = np.where(pos[k] == last, 2, np.where(pos[k] == last - 1, 1, 0)).astype(np.int8)
    h = np.minimum(pos[k], max_len)  # (S,) history lengths

    seen = user_keys(user, item, n_items)
    per = 1 if negatives == "none" else 2  # rows per positive
    pool = item if negatives == "popularity" else None
    if per == 2:  # "none" draws nothing: the existing modes' random streams are untouched
        check_sampleable(seen, n_items, user_names)
        neg = draw_negatives(user[k], seen, n_items, np.random.default_rng([seed, 1]), pool,
                             user_names=user_names)

    # rows: `per` per positive, in store order (train shuffled, then valid, test); everything below is per row
    r_split = np.repeat(split_s, per)
    train = np.flatnonzero(r_split == 0)
    order = np.concatenate([train[np.random.default_rng([seed, 3]).permutation(len(train))],
                            np.flatnonzero(r_split == 1), np.flatnonzero(r_split == 2)])
    sample = order // per  # (m,) the positive each row belongs to
    label = (order % per == 0).astype(np.float32)  # a positive's first row: label 1 (its only one if per = 1)
    ks, hs = k[sample], h[sample]
    target = item[ks] if per == 1 else np.where(label == 1, item[ks], neg[sample])
    out = Samples(label, user[ks], target, r_split[order], (item[ranges(ks - hs, hs)], hs), None)
    if aux_negatives:  # drawn per positive and history step, shared by the positive's label-0 twin
        aux = draw_negatives(np.repeat(user[k], h), seen, n_items, np.random.default_rng([seed, 2]), pool,
                             user_names=user_names)
        out.neg_hist = (aux[ranges((np.cumsum(h) - h)[sample], hs)], hs)
    if sessions:
        out.sessions = [(item[v], ln) for v, ln in
                        session_slots(new, np.asarray(time), ks, sessions=sessions, session_len=session_len,
                                      session_gap=session_gap, min_session_len=min_session_len)]
    per_split = np.bincount(out.split, minlength=3)
    out.stats = {"users": len(starts), "behaviours": int(n), "items": int(n_items),
                 "single_behaviour_users": int((count == 1).sum()), "positives": len(k),
                 "samples": {s: int(c) for s, c in zip(("train", "valid", "test"), per_split)},
                 "duplicate_user_item_rows": int(n - len(seen)),
                 "mean_history_len": float(h.mean()) if len(h) else 0.0}
    if example_age:
        out.example_age, out.stats["example_age"] = example_ages(np.asarray(time, np.float64)[ks], out.split)
    return out


def example_ages(t: np.ndarray, split: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """YouTubeDNN's example age of rows whose target behaviours have times ``t`` [m] and splits ``split`` [m]
    -> (ages [m] float32, {t_start, t_end, unit}): ``(T_end - t) / (T_end - T_start)`` on train rows, with
    ``T_start`` / ``T_end`` the min / max of ``t`` over them (all 0 when equal), 0 on valid / test rows."""
    train = split == 0
    age = np.zeros(len(t), np.float32)
    info: dict[str, Any] = {"t_start": None, "t_end": None, "unit": "fraction of the training window"}
    if train.any():
        t_start, t_end = float(t[train].min()), float(t[train].max())
        info.update(t_start=t_start, t_end=t_end)
        if t_end > t_start:
            age[train] = (t_end - t[train]) / (t_end - t_start)
    return age, info


def session_slots(new: np.ndarray, time: np.ndarray, k: np.ndarray, *, sessions: int, session_len: int,
                  session_gap: float, min_session_len: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """DSIN sessions of the samples at rows ``k`` [S'] of a sorted log (``new`` [n]: first row of a user) ->
    ``sessions`` slots of (row indices [nnz], lengths [S']); see the module docstring for the rules."""
    n = len(new)
    brk = new.copy()  # (n,) first row of a session
    brk[1:] |= (time[1:] - time[:-1]) >= session_gap
    sid = np.cumsum(brk) - 1  # (n,) global session id (increasing along each user's timeline)
    s_start = np.flatnonzero(brk)
    s_end = np.append(s_start[1:], n)
    qual = (s_end - s_start) >= min_session_len  # full sessions long enough to keep
    q_before = np.concatenate([[0], np.cumsum(qual)])  # q_before[s]: qualifying sessions with id < s
    q_ids = np.append(np.flatnonzero(qual), 0)  # rank among qualifying sessions -> session id (padded)

    user_first = sid[np.maximum.accumulate(np.where(new, np.arange(n), 0))]  # (n,) the user's first session
    s_last = sid[k - 1]  # (S',) the session holding the behaviour just before the target
    last_ok = (k - s_start[s_last]) >= min_session_len  # that session cut at the target is long enough
    lo = np.maximum(q_before[s_last] - (sessions - last_ok), q_before[user_first[k]])  # first kept rank
    n_full = q_before[s_last] - lo  # (S',) complete earlier sessions kept
    slots = []
    for j in range(sessions):
        full = j < n_full
        used = full | ((j == n_full) & last_ok)
        s = np.where(full, q_ids[np.minimum(lo + j, len(q_ids) - 1)], s_last)
        end = np.where(full, s_end[s], k)
        length = np.where(used, np.minimum(end - s_start[s], session_len), 0)
        slots.append((ranges(end - length, length), length))
    return slots
