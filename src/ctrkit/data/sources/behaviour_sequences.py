"""Sequence rows of a behaviour log: one train row per user sequence, its loss at every position (SASRec's
training, Kang & McAuley 2018), beside :mod:`ctrkit.data.sources.behaviour_samples`' per-prefix rows.

For a log sorted by (user, time), user u's train behaviours are positions ``0..L_u - 1`` with
``L_u = c_u - 2`` (the last two go to valid / test, as in the per-prefix form). The per-prefix form writes one
row per target ``p = 1..L_u - 1`` (history = positions ``max(0, p - max_len)..p - 1``). The sequence form
writes the same targets as windows of at most ``max_len`` inputs, tiled back from the last train target
``K = L_u - 1`` with a ``stride`` (1 <= stride <= max_len)::

    window j = 0, 1, ... (0: the most recent):  e = K - j · stride            (its last target)
                                                s = max(0, e - max_len)     (its first input)
    hist_<f> = behaviours s .. e - 1      (the inputs, oldest first; h = e - s of them)
    <f>      = behaviour  e               (the last target)
    targets  = behaviours s + 1 .. e      (= hist[1:] followed by the row's own item: one per input position)

until a window starts at the user's first behaviour. A window's loss is on the targets it owns: a full window
(h = max_len) owns its last ``stride`` positions, a shorter one (which starts at position 0) all of them, so
every target is owned by exactly one row (:func:`owned_positions`), and an owned target of a full window sees
at least ``max_len - stride + 1`` steps. ``stride = max_len`` (the default) tiles without overlap: the fewest
rows, but a target early in a window sees few steps; a smaller stride gives the targets of long users more
context for more rows. A user with ``L_u <= max_len`` has one row holding exactly the union of their
per-prefix rows (under a causal mask, position t of the row sees the history of target t+1). The targets are not
a column: they are the history shifted by one plus the row's item, so the schema is the per-prefix one and the
store declares its form (``preprocessing.rows = "sequence"`` and ``preprocessing.sequence = {max_len, stride}``,
:func:`ctrkit.retrieval.catalogue.sequence_rows`).
"""

from __future__ import annotations

import numpy as np
import torch

from ctrkit.data.sources.behaviour_samples import Samples, ranges
from ctrkit.errors import DataError

ROWS = ("prefix", "sequence")


def sequence_windows(user: np.ndarray, item: np.ndarray, *, max_len: int, stride: int | None = None,
                     seed: int = 0) -> Samples:
    """Train rows in sequence form (module docstring) of a log sorted by (user, time): ``user``, ``item`` [n]
    codes -> :class:`Samples` of split 0, label 1, shuffled with the per-prefix train rows' seed stream;
    ``stride`` None: ``max_len``."""
    stride = max_len if stride is None else stride
    user, item = np.asarray(user, np.int64), np.asarray(item, np.int64)
    n = len(user)
    new = np.ones(n, bool)
    new[1:] = user[1:] != user[:-1]
    starts = np.flatnonzero(new)  # (U,)
    count = np.diff(np.append(starts, n))  # (U,)
    targets = np.maximum(count - 3, 0)  # (U,) K: train targets per user, positions 1 .. L - 1, L = count - 2
    full = np.where(targets >= max_len, (targets - max_len) // stride + 1, 0)  # (U,) windows with e >= max_len
    n_win = full + (targets - full * stride > 0)  # (U,) and the one from position 0, if targets are left
    u = np.repeat(np.arange(len(starts)), n_win)  # (R,) the user of each window
    j = np.arange(len(u)) - np.repeat(np.cumsum(n_win) - n_win, n_win)  # (R,) 0 = the most recent window
    e = targets[u] - j * stride  # (R,) last target, a position within the user
    s = np.maximum(0, e - max_len)  # (R,) first input
    h = e - s  # (R,) inputs = targets
    rows = np.random.default_rng([seed, 3]).permutation(len(u))
    u, e, s, h = u[rows], e[rows], s[rows], h[rows]
    base = starts[u]  # (R,) the user's first log row
    m = len(u)
    out = Samples(np.ones(m, np.float32), user[base], item[base + e], np.zeros(m, np.int8),
                  (item[ranges(base + s, h)], h), None)
    out.stats = {"rows": m, "targets": int(targets.sum()), "positions": int(h.sum()), "stride": int(stride),
                 "users_with_several_rows": int((n_win > 1).sum())}
    return out


def owned_positions(lengths: torch.Tensor, T: int, *, max_len: int, stride: int) -> torch.Tensor:
    """(B, T) bool: the positions whose targets rows of ``lengths`` (B,) inputs own (module docstring): the last
    ``stride`` of a full row (``max_len`` inputs), every real one of a shorter row."""
    t = torch.arange(T, device=lengths.device)
    h = lengths.unsqueeze(1)  # (B, 1)
    return (t < h) & ((h < max_len) | (t >= h - stride))


def with_sequence_train(samples: Samples, windows: Samples) -> Samples:
    """``samples`` (per-prefix rows of every split) with its train rows replaced by ``windows``."""
    held = samples.part(1), samples.part(2)
    parts = [windows, *held]
    cat = np.concatenate
    return Samples(cat([p.label for p in parts]), cat([p.user for p in parts]), cat([p.item for p in parts]),
                   cat([p.split for p in parts]), (cat([p.hist[0] for p in parts]), cat([p.hist[1] for p in parts])),
                   None, stats=samples.stats)


def check_rows(train_rows: str, *, negatives: str, aux_negatives: bool, sessions: int, example_age: bool,
               max_len: int = 50, stride: int | None = None) -> int | None:
    """Refuse a train row form that cannot be honoured, naming the option that fixes it; -> the windows' stride
    (``max_len`` when None) of sequence rows, None for per-prefix rows."""
    if train_rows not in ROWS:
        raise DataError(f"--train-rows {train_rows!r} is not one of {ROWS}")
    if stride is not None and not 1 <= stride <= max_len:
        raise DataError(f"--sequence-stride {stride} must be between 1 and --max-len {max_len}")
    if train_rows == "prefix":
        return None
    clash = [opt for opt, on in (("--negatives " + negatives, negatives != "none"), ("--aux-negatives", aux_negatives),
                                 ("--sessions", sessions > 0), ("--example-age", example_age)) if on]
    if clash:
        raise DataError(f"--train-rows sequence writes positives-only rows for per-position retrieval training "
                        f"(SASRec); it does not go with {', '.join(clash)}: use --negatives none without "
                        "--aux-negatives / --sessions / --example-age, or --train-rows prefix")
    return max_len if stride is None else stride
