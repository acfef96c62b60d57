"""Behaviour logs -> DIN-style sample stores (``ctrkit preprocess behaviour``; issue 9, point 1).

Input, one of:

* ``csv`` / ``parquet``: one behaviour per row with a user column, an item column, optional attribute
  columns (``--attr-cols category:cate`` reads column ``category`` as feature ``cate``), an optional time
  column (seconds, any number, or ISO date-times; without one the file order within a user is the time
  order), an optional behaviour-type column to filter on (``--type-col type --behaviour-types pv,buy``) and
  an optional rating column that turns ratings into clicks (``--rating-col rating --min-rating 4``: rows rated
  at least 4 are the behaviours, as a table label's ``threshold`` makes value >= threshold a 1; the others are
  dropped and counted in ``rows_below_min_rating``).
  CSVs may be gzipped and may lack a header (``--no-header --names user,item,...``: Taobao UserBehavior).
  An item's attributes are those of its first row in time order (rows that disagree are counted in
  ``attribute_conflicts``), so an item has the same attributes as a target, in a history and as a negative.
* ``s3rec``: one user per line, ``user item_1 item_2 ...`` in time order (no timestamps), with
  ``--item-attributes`` a JSON ``{item: [attribute ids]}`` (plain or gzipped). The item's attribute ``cate``
  is the LAST id of its list: in the S3-Rec Amazon files the brand comes first and the categories follow
  from coarse to fine, so the last id is the most specific category. Items missing from the JSON have a
  missing ``cate`` (id 0).

Samples follow :mod:`ctrkit.data.sources.behaviour_samples` (histories, negatives, leave-last-out split, DIEN's
auxiliary negatives, DSIN's sessions, YouTubeDNN's example age). ``--negatives uniform`` (DIN) or
``popularity`` (DIEN) write two rows per positive, label 1 and a sampled label 0; ``--negatives none`` writes
the label-1 rows only (retrieval models: two-tower, YouTubeDNN, SASRec, which draw negatives in training).
The rows become stores ``out/{train,valid,test}`` through a table
:class:`~ctrkit.data.pipeline.feature_pipeline.FeaturePipeline` fitted on the TRAIN rows only (targets, histories and sampled
negatives of train), so an item or user first seen in valid / test maps to id 1 (rare). Store columns: label,
group (the user, for GAUC), sparse ``user`` / ``item`` / one per attribute, sequences ``hist_item`` /
``hist_<attr>`` (sharing the item / attribute tables, pooling none), with aux negatives ``neg_hist_*``, with
sessions ``sess_<k>_*``, with ``--example-age`` the dense user feature ``example_age`` (transform none:
neither logged nor standardised; in [0, 1] on train, 0 on valid / test; needs ``--time-col``). Train rows are
shuffled (seeded); valid / test keep user order, each positive followed by its negative (if any).

Report (logged, in every store's ``stats.behaviour`` and in ``out/report.json``): ``rows_read``, ``bad_rows``
and ``first_bad_lines`` (CSV / Parquet), ``behaviour_types`` (rows per type) and ``rows_filtered_out``,
``empty_lines`` / ``users_without_behaviours`` / ``items_without_attributes`` (s3rec), ``attribute_conflicts``
(per attribute: distinct (item, value) pairs beyond one per item), ``users``, ``behaviours``, ``items``,
``single_behaviour_users`` (no sample), ``users_without_train_rows`` (valid / test users with no train row:
also in the summary line; their keys get group ids of their own, so ``ctrkit recall`` names them),
``out_of_order_rows`` (sorted), ``duplicate_user_item_rows`` (rows
repeating a (user, item) pair; kept), ``positives``, ``samples`` {train, valid, test} (rows: two per
positive, one with ``--negatives none``), ``mean_history_len``, ``example_age`` (with ``--example-age``:
``t_start`` / ``t_end``, the first / last target time of the train rows in the time column's units, and the
``unit`` of the feature), ``vocab_sizes``, ``unseen_in_train`` (valid / test rows whose user / item is id 1),
``cold_positives`` (valid / test positives whose item is in no train positive or history: it may still have
an id, from train's sampled negatives, which draw from every item of the log; with ``--negatives none`` it is
id 1) and ``seconds``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time as _time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.pipeline.spec import SPLITS
from ctrkit.data.pipeline.vocab import GROUP_TABLE, RARE_ID
from ctrkit.data.pipeline.vocab_arrays import with_keys
from ctrkit.data.sources.behaviour_log import FORMATS, BehaviourLog, parse_attr_cols, read_behaviour_log
from ctrkit.data.sources.behaviour_samples import NEGATIVES, Samples, build_samples, check_options
from ctrkit.data.sources.behaviour_sequences import ROWS, check_rows, sequence_windows, with_sequence_train
from ctrkit.data.sources.driver import Chunk, Frontend, Input, Summary, check_expiry, preprocess
from ctrkit.data.storage.store import check_replaceable
from ctrkit.errors import DataError
from ctrkit.io import check_distinct_inputs
from ctrkit.typecheck import (
    Delimiter,
    EmbeddingDim,
    Fraction,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Seed,
    cli_type,
)

log = logging.getLogger(__name__)

# ---- samples -> stores -------------------------------------------------------------------------------------
def behaviour_spec(attrs: list[str], *, max_len: int, aux_negatives: bool, sessions: int,
                   session_len: int, example_age: bool = False) -> dict[str, Any]:
    """The table spec of the sample rows (every column named like its feature)."""
    feats = ["item", *attrs]
    sequence = [{"name": f"hist_{f}", "shares": f, "max_len": max_len, "pooling": "none", "group": "user",
                 "role": "history"} for f in feats]
    if aux_negatives:
        sequence += [{"name": f"neg_hist_{f}", "shares": f, "max_len": max_len, "pooling": "none",
                      "group": "user", "role": "negative", "of": f"hist_{f}"} for f in feats]
    sequence += [{"name": f"sess_{k}_{f}", "shares": f, "max_len": session_len, "pooling": "none",
                  "group": "user", "role": "session", "session": k} for k in range(sessions) for f in feats]
    spec: dict[str, Any] = {
        "label": "label", "group_id": "user",
        "sparse": [{"name": "user", "group": "user"}, {"name": "item", "group": "item", "table": "item"},
                   *({"name": a, "group": "item", "table": a} for a in attrs)],
        "sequence": sequence}
    if example_age:  # already in [0, 1]: neither logged nor standardised
        spec["dense"] = [{"name": "example_age", "group": "user", "transform": "none"}]
    return spec


def _keys(keys: pa.Array, codes: np.ndarray) -> pa.Array:
    """Raw keys of ``codes`` [m] (-1 -> null)."""
    miss = codes < 0
    return keys.take(pa.array(codes, mask=miss if miss.any() else None))


def sample_columns(blog: BehaviourLog, s: Samples) -> dict[str, Any]:
    """Sample rows -> raw columns for the pipeline (keys, jagged columns as (values, lengths))."""
    cols: dict[str, Any] = {"label": s.label, "user": _keys(blog.user_keys, s.user)}
    tables = {"item": (blog.item_keys, None), **{a: (k, c) for a, (k, c) in blog.attrs.items()}}

    def of(name: str, items: np.ndarray) -> pa.Array:
        keys, per_item = tables[name]
        return _keys(keys, items if per_item is None else per_item[items])

    for f in tables:
        cols[f] = of(f, s.item)
        cols[f"hist_{f}"] = (of(f, s.hist[0]), s.hist[1])
        if s.neg_hist is not None:
            cols[f"neg_hist_{f}"] = (of(f, s.neg_hist[0]), s.neg_hist[1])
        for k, (v, ln) in enumerate(s.sessions):
            cols[f"sess_{k}_{f}"] = (of(f, v), ln)
    if s.example_age is not None:
        cols["example_age"] = s.example_age
    return cols


class _Behaviour(Frontend):
    """A behaviour log's part of a preprocess run: the sample rows of each split (train fits the pipeline; valid
    / test are mapped with it), no shuffle at write time (the samples are already in their order), the report."""

    kind = "behaviour"
    shuffle_train = False

    def __init__(self, blog: BehaviourLog, samples: Samples, pipe: FeaturePipeline, *, meta: dict[str, Any],
                 report: dict[str, Any], t0: float, train_rows: str = "prefix",
                 window: dict[str, int] | None = None) -> None:
        self.blog, self.pipe, self.base_meta, self.report, self.t0 = blog, pipe, meta, report, t0
        self.train_rows, self.window = train_rows, window
        self.parts = {name: samples.part(code) for code, name in enumerate(SPLITS)}
        self.positives_, self.unseen = {}, {name: {"user": 0, "item": 0} for name in SPLITS[1:]}
        # the columns of user / item among the single-valued sparse features of an encoded part
        single = [e["name"] for e in pipe.spec.sparse if not e.get("multi_valued")]
        self._ui = {f: single.index(f) for f in ("user", "item")}

    def read(self, fitting: bool, tmp: Path) -> Iterator[Chunk]:
        yield Chunk(sample_columns(self.blog, self.parts["train"]), Input("train samples", split=0))

    def read_held(self) -> Iterator[Chunk]:
        self._name_held_out_users()
        for code, name in enumerate(SPLITS[1:], 1):
            if len(self.parts[name]):
                yield Chunk(sample_columns(self.blog, self.parts[name]), Input(f"{name} samples", split=code))

    def _name_held_out_users(self) -> None:
        """After the fit: the valid / test users without train rows get ids of their own in the group column's
        vocabulary (GAUC groups; no model reads it, so nothing leaks), so their keys stay known downstream
        (``ctrkit recall``'s user column) instead of a hashed unseen id; counted in the report."""
        train = np.unique(self.parts["train"].user)
        held = [np.unique(self.parts[name].user) for name in SPLITS[1:]]
        self.report["users_without_train_rows"] = {
            name: len(np.setdiff1d(u, train)) for name, u in zip(SPLITS[1:], held) if len(self.parts[name])}
        users = np.unique(np.concatenate(held))
        vocabs = self.pipe.vocabs_
        vocabs[GROUP_TABLE] = with_keys(vocabs[GROUP_TABLE], _keys(self.blog.user_keys, users))

    def observe(self, split: int, part: dict[str, Any], final: bool) -> None:
        if split > 0:  # valid / test rows whose user / item train never saw (id 1)
            for f, j in self._ui.items():
                self.unseen[SPLITS[split]][f] += int((part["sparse"][:, j] == RARE_ID).sum())

    def meta(self, split: str, summary: Summary) -> dict[str, Any]:
        if "vocab_sizes" not in self.report:
            self.report["vocab_sizes"] = {t: v.size for t, v in self.pipe.vocabs_.items()}
            self.report["unseen_in_train"] = {n: self.unseen[n] for n in SPLITS[1:] if summary.rows[n]}
        n = summary.rows[split]
        rate = float(np.float32(summary.positives[split]) / np.float32(n)) if n else 0.0  # float32 mean of labels
        m = self.base_meta
        rows = self.train_rows if split == "train" else "prefix"  # the store's form (behaviour_sequences)
        form = {"rows": rows, **({"sequence": self.window} if rows == "sequence" else {})}
        return {"preprocessing": {"kind": "table", "builder": "behaviour", "split": split, **form,
                                  "input": m["input"], "options": m["options"], "spec": m["spec"],
                                  "tables": self.pipe.table_of},
                "stats": {"rows": n, "label_rate": rate, "behaviour": self.report}}

    def side_files(self, summary: Summary) -> dict[str, str]:
        self.report["seconds"] = round(_time.perf_counter() - self.t0, 3)
        return {"report.json": json.dumps(self.report, indent=1, default=str)}


def preprocess_behaviour(input: str | Path, out: str | Path, *, format: str | None = None,
                         user_col: str = "user", item_col: str = "item",
                         attr_cols: list[str] | dict[str, str] | None = None, time_col: str | None = None,
                         type_col: str | None = None, behaviour_types: list[str] | str | None = None,
                         header: bool = True, names: list[str] | str | None = None, delimiter: str = ",",
                         item_attributes: str | Path | None = None, max_len: int = 50,
                         negatives: str = "uniform", seed: int = 0, aux_negatives: bool = False,
                         sessions: int = 0, session_len: int = 10, session_gap: float = 1800.0,
                         min_session_len: int = 1, example_age: bool = False, min_freq: int = 1,
                         embedding_dim: int | str = "auto", max_bad_fraction: float = 0.001,
                         rating_col: str | None = None, min_rating: float | None = None,
                         train_rows: str = "prefix", sequence_stride: int | None = None,
                         overwrite: bool = False, vocab_from: str | Path | None = None,
                         grow: bool = False, expire_after: int | None = None) -> dict[str, Path]:
    """Behaviour log -> stores ``out/{train,valid,test}`` + ``out/report.json``; returns {split: path}.
    ``vocab_from``: the pipeline of that store (or checkpoint) applied unchanged, or with ``grow`` its
    vocabularies grown by the train samples (:mod:`ctrkit.data.pipeline.vocab_grow`), evicting values not seen in
    the last ``expire_after`` versions. ``train_rows`` "sequence": :mod:`~ctrkit.data.sources.behaviour_sequences`."""
    t0 = _time.perf_counter()
    _check_before_reading(input, out, item_attributes, overwrite, grow, expire_after)
    check_options(negatives, aux_negatives, max_len, session_len, sessions, min_session_len,
                  has_time=time_col is not None and format != "s3rec", example_age=example_age)
    stride = check_rows(train_rows, negatives=negatives, aux_negatives=aux_negatives, sessions=sessions,  # None: prefix
                        example_age=example_age, max_len=max_len, stride=sequence_stride)
    blog = read_behaviour_log(input, format=format, user_col=user_col, item_col=item_col, attr_cols=attr_cols,
                              time_col=time_col, type_col=type_col, behaviour_types=behaviour_types,
                              header=header, names=names, delimiter=delimiter, item_attributes=item_attributes,
                              max_bad_fraction=max_bad_fraction, rating_col=rating_col, min_rating=min_rating)
    samples = build_samples(blog.user, blog.item, blog.time, n_items=len(blog.item_keys), max_len=max_len,
                            negatives=negatives, seed=seed, aux_negatives=aux_negatives, sessions=sessions,
                            session_len=session_len, session_gap=session_gap, min_session_len=min_session_len,
                            example_age=example_age, user_names=blog.user_keys)
    samples = _sequence_train(blog, samples, max_len=max_len, stride=stride, seed=seed) if stride else samples
    report = {"input": str(input), **blog.stats, **samples.stats}
    if samples.stats["samples"]["train"] == 0:
        raise DataError(f"{input}: no training samples: every user has fewer than 4 behaviours (a user's last "
                        "two positives go to valid / test); use a longer log")
    options = {"format": report["format"], "user_col": user_col, "item_col": item_col, "attr_cols": attr_cols,
               "time_col": time_col, "type_col": type_col, "behaviour_types": behaviour_types,
               "item_attributes": str(item_attributes) if item_attributes else None, "max_len": max_len,
               "negatives": negatives, "seed": seed, "aux_negatives": aux_negatives, "sessions": sessions,
               "session_len": session_len, "session_gap": session_gap, "min_session_len": min_session_len,
               "example_age": example_age, "min_freq": min_freq, "embedding_dim": embedding_dim,
               "rating_col": rating_col, "min_rating": min_rating,
               "vocab_from": str(vocab_from) if vocab_from else None, "grow": grow,
               "expire_after": expire_after, "train_rows": train_rows, "sequence_stride": sequence_stride}
    spec = behaviour_spec(list(blog.attrs), max_len=max_len, aux_negatives=aux_negatives, sessions=sessions,
                          session_len=session_len, example_age=example_age)
    pipe = FeaturePipeline.table(spec, min_freq=min_freq, embedding_dim=embedding_dim)
    front = _Behaviour(blog, samples, pipe, meta={"input": str(input), "options": options, "spec": spec},
                       report=report, t0=t0, train_rows=train_rows, window={"max_len": max_len, "stride": stride})
    front.vocab_from, front.grow, front.expire_after = vocab_from, grow, expire_after
    report["cold_positives"] = _cold_positives(front.parts, len(blog.item_keys))
    result, _ = preprocess(front, out, overwrite=overwrite)
    log.info("behaviour %s: %d users, %d behaviours (%d single-behaviour users dropped, %d out-of-order rows "
             "sorted, %d repeated user-item rows kept) -> samples %s; users without train rows %s in %.1fs",
             input, report["users"], report["behaviours"], report["single_behaviour_users"],
             report["out_of_order_rows"], report["duplicate_user_item_rows"], report["samples"],
             report.get("users_without_train_rows", {}), report["seconds"])
    return result


def _check_before_reading(input: str | Path, out: str | Path, item_attributes: str | Path | None, overwrite: bool,
                          grow: bool, expire_after: int | None) -> None:
    """Expiry options, distinct inputs and replaceable outputs, before the work (SplitOutput checks the outputs
    again)."""
    check_expiry(grow, expire_after)
    if item_attributes is not None:
        check_distinct_inputs([("input", Path(input)), ("--item-attributes", Path(item_attributes))])
    for s in SPLITS:
        check_replaceable(Path(out) / s, overwrite)


def _sequence_train(blog: BehaviourLog, samples: Samples, *, max_len: int, stride: int, seed: int) -> Samples:
    """``samples`` with sequence rows for train (:mod:`ctrkit.data.sources.behaviour_sequences`), reported."""
    windows = sequence_windows(blog.user, blog.item, max_len=max_len, stride=stride, seed=seed)
    out = with_sequence_train(samples, windows)
    out.stats = {**samples.stats, "samples": {**samples.stats["samples"], "train": len(windows)},
                 "sequence_rows": windows.stats}
    return out


def _cold_positives(parts: dict[str, Samples], n_items: int) -> dict[str, int]:
    """Valid / test positives whose item is in no train positive or history."""
    tr = parts["train"]
    warm = np.zeros(n_items, bool)  # items of train positives and histories
    warm[tr.item[tr.label == 1]] = True
    warm[tr.hist[0]] = True
    return {name: int((~warm[p.item[p.label == 1]]).sum()) for name, p in parts.items() if name != "train"}


# ---- command line ------------------------------------------------------------------------------------------
def add_preprocess_behaviour_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``ctrkit preprocess behaviour``."""
    p.add_argument("input", nargs="?", help="behaviour log: CSV (.gz), Parquet, or S3-Rec sequences")
    p.add_argument("--input", dest="input_opt", default=None, help="the log (instead of the positional)")
    p.add_argument("--out", required=True, help="output directory: OUT/{train,valid,test}, OUT/report.json")
    p.add_argument("--format", choices=FORMATS, default=None, help="default: parquet by extension, else csv")
    p.add_argument("--item-attributes", default=None,
                   help="s3rec: JSON {item: [attribute ids]} (last id = cate)")
    p.add_argument("--user-col", default="user")
    p.add_argument("--item-col", default="item")
    p.add_argument("--attr-cols", nargs="*", default=[], help="item attribute columns, COLUMN[:FEATURE] each")
    p.add_argument("--time-col", default=None, help="timestamp column (none: file order within a user)")
    p.add_argument("--type-col", default=None, help="behaviour type column, for --behaviour-types")
    p.add_argument("--behaviour-types", default=None, help="keep only these types, e.g. pv,buy")
    p.add_argument("--rating-col", default=None, help="rating column: with --min-rating, turns ratings into clicks")
    p.add_argument("--min-rating", type=cli_type(float), default=None,
                   help="rows rated at least this are the behaviours (clicks); the others are dropped (as a table "
                        "label's threshold: value >= threshold is 1)")
    p.add_argument("--no-header", dest="header", action="store_false", help="the CSV has no header line")
    p.add_argument("--names", default=None, help="column names, comma-separated (with --no-header)")
    p.add_argument("--delimiter", type=cli_type(Delimiter), default=",", help="CSV field delimiter")
    p.add_argument("--max-len", type=cli_type(PositiveInt), default=50,
                   help="history length kept (the most recent)")
    p.add_argument("--negatives", choices=NEGATIVES, default="uniform",
                   help="uniform (DIN) or popularity (DIEN): a sampled label-0 row per positive; none: "
                        "positives only (retrieval: two-tower, YouTubeDNN, SASRec)")
    p.add_argument("--seed", type=cli_type(Seed), default=0,
                   help="seed of the negatives and the train shuffle")
    p.add_argument("--aux-negatives", action="store_true", help="DIEN: neg_hist_* (one negative per step)")
    p.add_argument("--sessions", type=cli_type(NonNegativeInt), default=0,
                   help="DSIN: keep this many sessions (sess_<k>_*)")
    p.add_argument("--session-len", type=cli_type(PositiveInt), default=10,
                   help="behaviours kept per session (the last ones)")
    p.add_argument("--session-gap", type=cli_type(PositiveFloat), default=1800.0,
                   help="seconds of inactivity that start a session")
    p.add_argument("--min-session-len", type=cli_type(PositiveInt), default=1,
                   help="drop sessions with fewer behaviours")
    p.add_argument("--example-age", action="store_true",
                   help="YouTubeDNN: dense example_age = (T_end - t) / (T_end - T_start) on train, 0 on "
                        "valid / test (needs --time-col)")
    p.add_argument("--min-freq", type=cli_type(PositiveInt), default=1,
                   help="keys seen fewer times in train map to id 1")
    p.add_argument("--embedding-dim", type=cli_type(EmbeddingDim), default="auto",
                   help="embedding dim of every table, or 'auto'")
    p.add_argument("--max-bad-fraction", type=cli_type(Fraction), default=0.001,
                   help="fail above this fraction of bad rows")
    p.add_argument("--vocab-from", default=None,
                   help="store (or checkpoint) whose pipeline to reuse (unseen values -> 1)")
    p.add_argument("--grow", action="store_true",
                   help="with --vocab-from: grow its vocabularies on the train samples (known ids kept; new values "
                        "reaching --min-freq, counted with the parent's counts, get new ids after the parent's)")
    p.add_argument("--expire-after", type=cli_type(PositiveInt), default=None, metavar="N",
                   help="with --grow: evict values not seen in the last N versions (days); their ids are reused")
    _add_sequence_args(p)
    p.add_argument("--overwrite", action="store_true", help="replace existing output stores")
    return p


def _add_sequence_args(p: argparse.ArgumentParser) -> None:
    """The train row form (:mod:`ctrkit.data.sources.behaviour_sequences`)."""
    p.add_argument("--train-rows", choices=ROWS, default="prefix",
                   help="prefix: one train row per positive (its history before it); sequence: one row per user "
                        "sequence (windows of --max-len targets), the loss at every position (SASRec; with "
                        "--negatives none)")
    p.add_argument("--sequence-stride", type=cli_type(PositiveInt), default=None,
                   help="with --train-rows sequence: a new window every this many targets (default --max-len: no "
                        "overlap); smaller gives the targets of long users more context, for more rows")


def run_preprocess_behaviour(args: argparse.Namespace) -> dict[str, Path]:
    """Run :func:`preprocess_behaviour` from parsed arguments."""
    if (args.input is None) == (args.input_opt is None):
        raise DataError("give the behaviour log once: as the positional INPUT or as --input")
    return preprocess_behaviour(
        args.input or args.input_opt, args.out, format=args.format, user_col=args.user_col,
        item_col=args.item_col, attr_cols=args.attr_cols, time_col=args.time_col, type_col=args.type_col,
        behaviour_types=args.behaviour_types, header=args.header, names=args.names, delimiter=args.delimiter,
        item_attributes=args.item_attributes, max_len=args.max_len, negatives=args.negatives, seed=args.seed,
        aux_negatives=args.aux_negatives, sessions=args.sessions, session_len=args.session_len,
        session_gap=args.session_gap, min_session_len=args.min_session_len, example_age=args.example_age,
        min_freq=args.min_freq, embedding_dim=args.embedding_dim, max_bad_fraction=args.max_bad_fraction,
        rating_col=args.rating_col, min_rating=args.min_rating, overwrite=args.overwrite,
        vocab_from=args.vocab_from, grow=args.grow, expire_after=args.expire_after,
        train_rows=args.train_rows, sequence_stride=args.sequence_stride,
    )


__all__ = [
    "FORMATS", "BehaviourLog", "add_preprocess_behaviour_args", "behaviour_spec", "parse_attr_cols",
    "preprocess_behaviour", "read_behaviour_log", "run_preprocess_behaviour", "sample_columns",
]
