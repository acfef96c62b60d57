"""Rolling benchmark (issue 28, item 4): day-by-day incremental training vs retraining from scratch vs a frozen
first model, on real logs with time: next-period AUC / GAUC and training seconds.

    python benchmarks/incremental.py [--datasets movielens taobao] [--quick] [--seed 0] [--out DIR] [--tune] ...
                                     (every option: --help; those of the incremental arm are described below)

Data (benchmarks/_rolling_data.py): MovieLens-100K cut by week (31 weeks; label rating >= 4, the user's 20
previous items as a history) and the Taobao UserBehavior head cut by day (9 days; label: the behaviour went past
a page view, i.e. cart / fav / buy; user, item, category, hour and the user's 20 previous items and categories).
Rows are in time order; in each period the last ``--valid-fraction`` (10%) of rows is its validation split.

Periods t = 0 .. T-2 (each evaluated on period t + 1, which no choice ever sees), three arms:

* incremental: ``ctrkit preprocess table NEW --vocab-from STORE_{t-1}/train --grow`` (known ids kept, new ones
  appended) and ``ctrkit train --warm-start RUN_{t-1}/best.pt`` on the new rows only: the rows after period
  t - 1's train part, so period t - 1's validation rows are trained on the next day, and every row once;
  With ``--replay F`` (t >= 1) a seeded sample of F x the new rows, drawn from the train splits of periods
  0 .. t-1 (never a validation split, period t or the evaluated period), is appended to them: the vocabulary is
  still grown from the new rows alone (store p{t}/inc), and new + replayed rows are encoded with it (store
  p{t}/incr, ``--vocab-from p{t}/inc/train``; every replayed id is known). ``--warm-dense-lr`` /
  ``--warm-embedding-lr`` set the dense (non-embedding) / embedding rows' learning rate of the warm runs (either
  given: for every data set, the other one the config's; neither: ``WARM_LR``, chosen per data set on its
  validation AUC: MovieLens a quarter of the config's, Taobao the config's), ``--warm-new-rows rare`` starts their
  new rows from the rare row, ``--warm-optimizer fresh`` their optimizers with fresh states, ``--warm-epochs``
  caps their epochs (default ``--epochs``), ``--first-warm-epochs`` those of the first warm run after a fit on every
  row so far (period 0 or a refresh: t = 1, K + 1, 2K + 1, ...; default ``--warm-epochs``), and
  ``--first-warm-lr-scale X`` multiplies that run's dense and embedding rates by X, ``--first-warm-optimizer fresh``
  starts that run's optimizers with fresh states (default: ``--warm-optimizer``), ``--warm-lr-schedule
  type=plateau ...`` gives every warm run a ``train.lr_schedule`` (refresh fits keep none), ``--warm-ema-decay D``
  evaluates, early-stops on and saves each warm run's weight average started at its warm-start weights
  (``train.ema_decay: D``, ``train.warm_start_average: start``; the next warm run starts from that average), and
  ``--warm-window W`` trains each warm run on the new rows of periods t - W + 1 .. t (the earlier ones a second
  time; encoded in store p{t}/incr with the vocabulary grown from period t's new rows alone, never a validation
  split of period t or the evaluated period). ``--refresh-every K`` (default ``REFRESH_EVERY``, per data set; 0:
  never) makes every K-th period (t = K, 2K, ...) a refresh: the incremental arm's model of that period is a fit
  from scratch on every row so far (the retrain arm's run, store p{t}/re; its preprocess and training seconds count
  in the incremental arm's totals), and the next warm run grows its vocabulary from p{t}/re/train and starts from
  that fit; with ``--refresh-from warm`` the refresh is a warm start from the arm's own model instead, on every row
  so far (store p{t}/inca, grown from the arm's vocabulary, the config's rates; ``--shrink-perturb S P`` sets its
  train.warm_start_shrink / warm_start_perturb), and no retrain fit runs for it. ``--tune`` runs the incremental arm alone (with the retrain arm's fits of the refresh periods) and
  reports its mean validation AUC, the only figure these settings are chosen on;
* retrain: ``ctrkit preprocess table`` fitted from scratch and ``ctrkit train`` on every row up to period t's
  validation split (all periods so far);
* frozen: period 0's model, never updated; period t + 1 encoded with period 0's vocabularies
  (``--vocab-from STORE_0/train``: new ids -> 1, rare) and scored with RUN_0/best.pt.

``--ema-decay D`` sets ``train.ema_decay`` for every run of every arm: evaluation, early stopping and best.pt use
the weights' debiased moving average. The warm runs continue their checkpoint's average (``train.warm_start_average:
keep``; ``--warm-average fresh``: a new one per period): it spans periods and is what is scored and warm-started from.

``--id-dropout user_id=0.1`` sets ``train.id_dropout`` for every run of every arm: while training, each user id
becomes the rare id 1 with probability 0.1, which trains the row unseen users are scored with.

At t = 0 the three arms are the same run. Every run uses one fixed config: configs/movielens/deepfm.yaml (DeepFM,
embedding 16, MLP 256-128, Adam 2e-3 + lazy Adam 2.5e-3 on the rows; the warm runs: ``WARM_LR``) with batch 256, no
weight averaging unless ``--ema-decay``, at most ``--epochs`` epochs and early stopping on the period's validation
AUC (patience 1); the best validation checkpoint is the period's model (and the next period's warm start). Commands
run in this process through ``ctrkit.cli.main`` (no interpreter start-up).

Figures per arm and period: AUC and GAUC (per user, impression-weighted, users with one class skipped) of
period t + 1, from the run's predictions.npz (or the frozen model's scores); ``train_s`` = the fit loop (with its
per-epoch validation), ``job_s`` = the whole ``ctrkit train`` job (loaders, checkpoints, test scoring, report),
``prep_s`` = ``ctrkit preprocess``. Seconds are comparable between arms of one run only: the machine is shared
(the load average is printed; ``cpu_seconds``, the process's CPU time, does not depend on the load). Targets: incremental mean AUC >= retrain's - 0.002, at a fraction of its
training seconds, and above frozen's. Prints a table per dataset and ends with ONE line ``RESULT {json}``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rolling_args import parse
from _rolling_data import REPO, Log, load
from _rolling_report import ARMS, line, table
from bench_models import SHARED_DATA

CONFIG = REPO / "configs" / "movielens" / "deepfm.yaml"
AUC_SLACK = 0.002
QUICK = {"movielens": 4, "taobao": 4}  # periods of --quick (3 evaluated)
# the warm runs' (dense, embedding) learning rates where --warm-dense-lr / --warm-embedding-lr are not given, chosen on
# each data set's validation AUC (docs/benchmarks.md, "Warm learning rates"); None: the config's (2e-3, 2.5e-3)
WARM_LR: dict[str, tuple[float | None, float | None]] = {"movielens": (5e-4, 6.25e-4), "taobao": (None, None)}
# the incremental arm's refresh period where --refresh-every is not given (0: never): every K-th period its model is
# a fit from scratch on every row so far, the warm runs continue from it. MovieLens 2: the cheapest K whose validation
# AUC is within 0.002 of retrain's, pooled over seeds 3-5 (K = 4 -.0025, 3 -.0047, 2 -.0018; a rule written down
# before those seeds ran: docs/benchmarks.md, "The refresh period chosen on validation"); Taobao meets its target
# without one
REFRESH_EVERY: dict[str, int] = {"movielens": 2, "taobao": 0}


def ctrkit(*args: str) -> None:
    """``ctrkit ARGS`` in this process (its stdout swallowed); a non-zero exit stops the benchmark."""
    from ctrkit.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(list(args))
    if rc:
        raise SystemExit(f"`ctrkit {' '.join(args)}` exited {rc} (its error is logged above)")


def preprocess(spec: Path, csv: Path, out: Path, *, valid: Path | None = None, test: Path | None = None,
               parent: Path | None = None, grow: bool = False) -> float:
    """``ctrkit preprocess table`` -> seconds. With ``valid`` / ``test``: stores out/{train,valid,test}, else out/train."""
    args = ["preprocess", "table", str(csv), "--schema", str(spec), "--out", str(out), "--embedding-dim", "16",
            "--overwrite"]
    args += ["--valid", str(valid), "--test", str(test)] if valid else ["--split", "1"]
    args += ["--vocab-from", str(parent)] if parent else []
    args += ["--grow"] if grow else []
    t0 = time.perf_counter()
    ctrkit(*args)
    return time.perf_counter() - t0


def scores(label: np.ndarray, score: np.ndarray, group: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import roc_auc_score

    from ctrkit.metrics import gauc

    return {"auc": float(roc_auc_score(label, score)), "gauc": float(gauc(score, label, group)[0]), "rows": len(label)}


def train(store: Path, runs: Path, name: str, overrides: list[str], warm: Path | None = None) -> dict[str, Any]:
    """``ctrkit train`` on store/{train,valid,test} -> next-period scores, seconds and the best epoch."""
    ctrkit("train", "--config", str(CONFIG), "--quiet", f"--data.train={store}/train", f"--data.valid={store}/valid",
           f"--data.test={store}/test", f"--run.dir={runs}", f"--run.name={name}", *overrides,
           *(["--warm-start", str(warm)] if warm else []))
    run = runs / name
    s = json.loads((run / "summary.json").read_text())
    p = np.load(run / "predictions.npz")
    return {**scores(p["label"], p["score"], p["group"]), "train_s": s["train_seconds"], "job_s": s["seconds"],
            "valid_auc": s["best"]["value"], "best_epoch": s["best"]["epoch"] + 1, "epochs": s["epochs_trained"], "best": str(run / "best.pt")}


def frozen(ckpt: str, store: Path) -> dict[str, Any]:
    """The model of ``ckpt`` scored on ``store`` (encoded with its vocabularies) -> next-period scores."""
    from ctrkit.checkpoint import Checkpoint
    from ctrkit.data.storage.store import Store
    from ctrkit.jobs.scoring import eval_loader, score_rows

    c = Checkpoint.load(ckpt)
    p = score_rows(c.build_model().eval(), eval_loader(Store(store), 4096, c.feature_pipeline()))
    return scores(p["label"], p["score"], p["group"])


def write(log: Log, lo: int, hi: int, path: Path) -> Path:
    pacsv.write_csv(log.rows.slice(lo, hi - lo), path)
    return path


def ranges(bounds: np.ndarray, valid_fraction: float) -> list[dict[str, tuple[int, int]]]:
    """Row ranges [lo, hi) of each period t = 0 .. T-2 (``bounds``: :meth:`Log.bounds`, T + 1 offsets): ``valid`` the
    last ``valid_fraction`` of period t, ``next`` period t + 1 (evaluated), ``all`` every row before t's valid split
    (retrain), ``new`` the rows after period t - 1's train part up to t's valid split (incremental: t - 1's valid
    rows are trained on at t, so over the periods every row is trained on once), ``earlier`` the train splits
    [lo, hi) of periods 0 .. t-1 (the pool of ``--replay``), ``starts`` where the new rows of periods 0 .. t start
    (``--warm-window``)."""
    b = [int(x) for x in bounds]
    cut = [b[k] + int(np.floor((1 - valid_fraction) * (b[k + 1] - b[k]))) for k in range(len(b) - 1)]
    return [{"new": (cut[t - 1] if t else 0, cut[t]), "all": (0, cut[t]), "valid": (cut[t], b[t + 1]),
             "next": (b[t + 1], b[t + 2]), "earlier": [(b[k], cut[k]) for k in range(t)],
             "starts": [cut[k - 1] if k else 0 for k in range(t + 1)]} for t in range(len(b) - 2)]


def replay_rows(earlier: list[tuple[int, int]], new_rows: int, fraction: float, seed: int, t: int) -> np.ndarray:
    """``--replay``: a sample (without replacement, ``default_rng([seed, t])``) of ``fraction`` x ``new_rows`` rows,
    at most all of them, drawn from ``earlier`` (the train splits of periods 0 .. t-1: never a validation split,
    period t's rows or the evaluated period) -> sorted row indices."""
    pool = np.concatenate([np.arange(lo, hi) for lo, hi in earlier] or [np.empty(0, np.int64)])
    n = min(len(pool), round(fraction * new_rows))
    return np.sort(np.random.default_rng([seed, t]).choice(pool, size=n, replace=False)) if n else pool[:0]


@dataclass(frozen=True)
class Warm:
    """The incremental arm's warm runs (t >= 1): ``replay`` x the new rows drawn from earlier train splits and
    appended to its training rows (:func:`replay_rows`, seeded by ``seed``); ``dense_lr`` the dense
    (non-embedding) learning rate (None: the config's); ``new_rows``: ``train.warm_start_new_rows`` (``rare``: new
    rows start as a copy of their table's rare row 1); ``optimizer``: ``train.warm_start_optimizer``; ``only`` runs the incremental arm alone (tuning on its
    validation AUC)."""

    replay: float = 0.0
    dense_lr: float | None = None
    seed: int = 0
    only: bool = False
    new_rows: str = "fresh"
    optimizer: str = "keep"
    average: str | None = None  # train.warm_start_average (None: not set; with --ema-decay: keep)
    embedding_lr: float | None = None  # the warm runs' train.embedding_lr (None: the config's)
    epochs: int | None = None  # the warm runs' train.epochs (None: --epochs)
    refresh_every: int = 0  # every K-th period a fit from scratch (the retrain arm's run); 0: never
    shrink_perturb: tuple[str, ...] = ()  # --refresh-from warm: train.warm_start_shrink / _perturb
    refresh_from: str = "scratch"  # warm: a refresh continues from the arm's model (every row so far, config's rates)
    first_epochs: int | None = None  # the first warm run after a fit on every row so far (t = 1, K + 1, ...): epochs
    first_lr_scale: float = 1.0  # that run's dense and embedding learning rates: this times the warm runs'
    lr_schedule: tuple[str, ...] = ()  # the warm runs' --train.lr_schedule.* overrides (--warm-lr-schedule)
    ema_decay: float | None = None  # the warm runs' train.ema_decay, their average started at the warm start's weights
    window: int = 1  # the warm runs train on the new rows of the last `window` periods (1: period t's only)
    first_optimizer: str | None = None  # that first warm run's train.warm_start_optimizer (None: `optimizer`)


def first_after_fit(t: int, warm: Warm) -> bool:
    """Whether period t's warm run is the first after a fit on every row so far (period 0 or a refresh)."""
    return t == 1 or refreshes(t - 1, warm.refresh_every)


def epochs_of(t: int, warm: Warm) -> int | None:
    """The warm run of period t >= 1: its most epochs (None: ``--epochs``): ``--first-warm-epochs`` right after a fit
    on every row so far (period 0 or a refresh), else ``--warm-epochs``."""
    return warm.first_epochs or warm.epochs if first_after_fit(t, warm) else warm.epochs


def optimizer_of(t: int, warm: Warm) -> str:
    """The warm run of period t >= 1: its ``train.warm_start_optimizer``: ``--first-warm-optimizer`` right after a fit
    on every row so far (period 0 or a refresh), else ``--warm-optimizer``."""
    return (warm.first_optimizer or warm.optimizer) if first_after_fit(t, warm) else warm.optimizer


def incremental(log: Log, r: dict[str, Any], d: Path, t: int, prev: tuple[Path, str] | None, overrides: list[str],
                warm: Warm, valid: Path, test: Path) -> dict[str, Any]:
    """Period t's incremental run: the vocabulary grown from the new rows only (store d/inc), then, with a window
    or replay, the window's earlier new rows + the new rows + the replayed rows encoded with that vocabulary (store
    d/incr: their ids are known) -> its figures."""
    new = write(log, *r["new"], d / "new.csv")
    prep = preprocess(log.spec, new, d / "inc", valid=valid, test=test, parent=prev and prev[0], grow=bool(prev))
    store, extra, replayed, lo = d / "inc", [], 0, r["new"][0]
    if prev is not None:
        idx = replay_rows(r["earlier"], r["new"][1] - r["new"][0], warm.replay, warm.seed, t)
        replayed, lo = len(idx), r["starts"][max(0, t - warm.window + 1)]  # lo: the window's first row
        if replayed or lo < r["new"][0]:
            rows = pa.concat_tables([log.rows.slice(lo, r["new"][1] - lo), log.rows.take(idx)])  # time order, replay
            pacsv.write_csv(rows, d / "new_replay.csv")
            store = d / "incr"
            prep += preprocess(log.spec, d / "new_replay.csv", store, valid=valid, test=test, parent=d / "inc" / "train")
            if any(unseen(store / "train").values()):  # window / replayed rows: rows the vocabulary already holds
                raise SystemExit(f"{log.name} period {t}: window or replayed rows hold user / item ids unknown to "
                                 f"{d / 'inc'}")
        scale, epochs = (warm.first_lr_scale if first_after_fit(t, warm) else 1.0), epochs_of(t, warm)
        extra = [f"--train.lr={scale * warm.dense_lr}"] if warm.dense_lr else []
        extra += [f"--train.embedding_lr={scale * warm.embedding_lr}"] if warm.embedding_lr else []
        extra += [f"--train.epochs={epochs}"] if epochs else []
        extra += [f"--train.warm_start_new_rows={warm.new_rows}", f"--train.warm_start_optimizer={optimizer_of(t, warm)}"]
        extra += [f"--train.warm_start_average={warm.average}"] if warm.average else []
        extra += list(warm.lr_schedule)
        extra += ([f"--train.ema_decay={warm.ema_decay}", "--train.warm_start_average=start"]
                  if warm.ema_decay is not None else [])
    inc = train(store, d.parent / "runs", f"inc{t}", overrides + extra, warm=prev and Path(prev[1]))
    return {**inc, "prep_s": prep, "replayed_rows": replayed, "window_rows": r["new"][0] - lo}


def refreshes(t: int, every: int) -> bool:
    """``--refresh-every K``: period t is a refresh of the incremental arm (a fit from scratch on every row so far)
    when t >= 1 and K > 0 divides t; period 0 is a fit from scratch in every arm anyway."""
    return every > 0 and t >= 1 and t % every == 0


def roll(log: Log, periods: int, work: Path, overrides: list[str], valid_fraction: float,
         warm: Warm = Warm()) -> list[dict[str, Any]]:
    """The three arms over periods 0 .. periods-2 -> one record per period: {t, rows, new ids, arm: figures}."""
    out, prev, first = [], None, None
    for t, r in enumerate(ranges(log.bounds(periods), valid_fraction)):
        d = work / f"p{t}"
        d.mkdir(parents=True, exist_ok=True)
        valid, test = (write(log, *r[k], d / f"{k}.csv") for k in ("valid", "next"))
        rec: dict[str, Any] = {"t": t, "new_rows": r["new"][1] - r["new"][0], "all_rows": r["all"][1],
                               "next_rows": r["next"][1] - r["next"][0]}
        refresh = refreshes(t, warm.refresh_every)
        scratch = refresh and warm.refresh_from == "scratch"
        all_rows = write(log, *r["all"], d / "all.csv") if t and (refresh or not warm.only) else None
        if t and (scratch or not warm.only):
            prep = preprocess(log.spec, all_rows, d / "re", valid=valid, test=test)
            rec["retrain"] = {**train(d / "re", work / "runs", f"re{t}", overrides), "prep_s": prep}
        if scratch:  # the incremental arm's model of period t is the retrain arm's run (its seconds are counted)
            rec["incremental"] = inc = {**rec["retrain"], "replayed_rows": 0, "refresh": True}
            stores = d / "re"
        elif refresh:  # --refresh-from warm: every row so far, grown from the arm's vocabulary, from its model
            stores = d / "inca"
            prep = preprocess(log.spec, all_rows, stores, valid=valid, test=test, parent=prev[0], grow=True)
            inc = train(stores, work / "runs", f"inc{t}", overrides + list(warm.shrink_perturb), warm=Path(prev[1]))
            rec["incremental"] = inc = {**inc, "prep_s": prep, "replayed_rows": 0, "refresh": True}
        else:
            rec["incremental"] = inc = incremental(log, r, d, t, prev, overrides, warm, valid, test)
            stores = d / "inc"
        if t == 0:
            first = (d / "inc" / "train", inc["best"])
            rec["retrain"] = rec["frozen"] = rec["incremental"]
        elif not warm.only:
            prep = preprocess(log.spec, test, d / "frozen", parent=first[0])
            rec["frozen"] = {**frozen(first[1], d / "frozen" / "train"), "prep_s": prep,
                             "next_unseen": unseen(d / "frozen" / "train")}
        for arm in ARMS if not warm.only else ARMS[:1]:  # period t + 1 scored whole (else others would compare)
            if rec[arm]["rows"] != rec["next_rows"]:
                raise SystemExit(f"{log.name} period {t} {arm}: {rec[arm]['rows']} rows scored, period t + 1 holds "
                                 f"{rec['next_rows']}")
        rec["vocab"] = vocab_growth(stores)
        prev = (stores / "train", inc["best"])
        out.append(rec)
        sys.stdout.write((line(log.unit, rec) if not warm.only else
                          f"{log.unit} {t}: valid AUC {inc['valid_auc']:.4f} replayed {inc['replayed_rows']}") + "\n")
        sys.stdout.flush()
    return out


def vocab_growth(stores: Path) -> dict[str, Any]:
    """The incremental arm's vocabulary at period t: {table: [rows before, after]} of the tables that grew (the
    store's vocab_lineage), and the share of next-period rows whose user / item it does not know (id 1, rare)."""
    m = json.loads((stores / "train" / "manifest.json").read_text())
    lineage = m["preprocessing"].get("vocab_lineage") or {"tables": {}}
    grown = {k: [v["parent_size"], v["size"]] for k, v in lineage["tables"].items() if v["size"] > v["parent_size"]}
    return {"grown": grown, "next_unseen": unseen(stores / "test")}


def unseen(store: Path) -> dict[str, float]:
    """Share of ``store``'s rows whose user / item id is 1 (rare: a value its vocabulary does not hold)."""
    return {c: float(np.mean(np.load(store / f"{c}.npy") == 1)) for c in ("user_id", "item_id")}


def summarise(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the periods where the arms differ (t >= 1), totals of seconds, and the targets."""
    later = [r for r in recs if r["t"] >= 1]
    out: dict[str, Any] = {}
    for arm in ARMS:
        rs = [r[arm] for r in later]
        out[arm] = {k: statistics.fmean(x[k] for x in rs) for k in ("auc", "gauc")}
        if all("valid_auc" in x for x in rs):  # each run's own validation split (the frozen model has none)
            out[arm]["valid_auc"] = statistics.fmean(x["valid_auc"] for x in rs)
        for k in ("train_s", "job_s", "prep_s"):
            if all(k in x for x in rs):
                out[arm][f"{k}_total"] = sum(x[k] for x in rs)
    out["incremental"]["refresh_periods"] = [r["t"] for r in later if r["incremental"].get("refresh")]
    inc, re, fr = out["incremental"], out["retrain"], out["frozen"]
    out["incremental_minus_retrain_auc"] = inc["auc"] - re["auc"]
    out["incremental_minus_frozen_auc"] = inc["auc"] - fr["auc"]
    out["train_s_fraction"] = inc["train_s_total"] / re["train_s_total"]
    out["checks"] = {f"incremental_auc_within_{AUC_SLACK}_of_retrain": inc["auc"] >= re["auc"] - AUC_SLACK,
                     "incremental_faster_than_retrain": inc["train_s_total"] < re["train_s_total"],
                     "incremental_auc_above_frozen": inc["auc"] > fr["auc"]}
    return out


def tuned(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """``--tune``: the incremental arm's mean validation AUC over t >= 1 (the only figure a choice may read)."""
    later = [r["incremental"] for r in recs if r["t"] >= 1]
    return {"valid_auc": statistics.fmean(x["valid_auc"] for x in later), "refresh_periods":
            [r["t"] for r in recs if r["t"] >= 1 and r["incremental"].get("refresh")], "valid_auc_per_period":
            [x["valid_auc"] for x in later], "train_s_total": sum(x["train_s"] for x in later)}


def main(argv: list[str] | None = None) -> int:
    a, drop = parse(argv, __doc__.splitlines()[0], QUICK)
    average = (a.warm_average or "keep") if a.ema_decay is not None else None
    warm = Warm(a.replay, a.warm_dense_lr, a.seed, a.tune, a.warm_new_rows, a.warm_optimizer, average,
                a.warm_embedding_lr, a.warm_epochs, first_epochs=a.first_warm_epochs, first_lr_scale=a.first_warm_lr_scale,
                lr_schedule=a.warm_lr_schedule, ema_decay=a.warm_ema_decay, window=a.warm_window,
                first_optimizer=a.first_warm_optimizer)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(a.threads)
    epochs = 2 if a.quick else a.epochs
    overrides = [f"--train.epochs={epochs}", "--train.early_stopping.patience=1",
                 f"--train.ema_decay={'null' if a.ema_decay is None else a.ema_decay}",
                 "--data.batch_size=256", "--train.metrics=[auc,gauc,logloss]", f"--train.threads={a.threads}",
                 f"--train.seed={a.seed}", "--train.progress=false", "--run.overwrite=true"]
    overrides += [f"--train.id_dropout={json.dumps(drop)}"] if drop else []
    load0 = os.getloadavg()
    sys.stdout.write(f"threads={a.threads} cpu={torch.backends.cpu.get_cpu_capability()} (fp32) torch {torch.__version__}"
                     f" cores={os.cpu_count()} load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}\n")
    result: dict[str, Any] = {}
    t_all = time.perf_counter()
    for name in a.datasets:
        log = load(name, SHARED_DATA, Path(a.out) / name)
        periods = QUICK[name] if a.quick else (a.periods or int(log.period.max()) + 1)
        t0 = time.perf_counter()
        lrs = WARM_LR[name] if a.warm_dense_lr is None and a.warm_embedding_lr is None else (a.warm_dense_lr,
                                                                                            a.warm_embedding_lr)
        every = REFRESH_EVERY[name] if a.refresh_every is None else a.refresh_every
        if a.first_warm_lr_scale != 1.0 and None in lrs:
            raise SystemExit(f"--first-warm-lr-scale scales the warm runs' rates, and {name}'s are the config's (WARM_LR): "
                             "give --warm-dense-lr and --warm-embedding-lr with it")
        recs = roll(log, periods, Path(a.out) / name, overrides, a.valid_fraction,
                    replace(warm, dense_lr=lrs[0], embedding_lr=lrs[1], refresh_every=every,
                            refresh_from=a.refresh_from, shrink_perturb=() if not a.shrink_perturb else (
                                f"--train.warm_start_shrink={a.shrink_perturb[0]}",
                                f"--train.warm_start_perturb={a.shrink_perturb[1]}")))
        setting = {"warm_lr": {"dense": lrs[0], "embedding": lrs[1]}, "refresh_every": every,
                   "refresh_from": a.refresh_from}
        if a.tune:
            result[name] = {**tuned(recs), **setting}
            sys.stdout.write(f"{name}: incremental mean valid AUC (t>=1) {result[name]['valid_auc']:.4f}\n")
            continue
        s = summarise(recs)
        sys.stdout.write(table(name, log.unit, recs, s))
        for check, ok in s["checks"].items():
            sys.stdout.write(f"  {'PASS' if ok else 'FAIL'}  {check}\n")
        result[name] = {**setting, "periods": periods, "unit": log.unit, "seconds": time.perf_counter() - t0, "summary": s,
                        "per_period": [{k: ({kk: vv for kk, vv in v.items() if kk != "best"} if isinstance(v, dict)
                                            else v) for k, v in r.items()} for r in recs]}
    load1 = os.getloadavg()
    sys.stdout.write("RESULT " + json.dumps({
        "benchmark": "incremental", "quick": a.quick, "epochs": epochs, "threads": a.threads, "seed": a.seed,
        "valid_fraction": a.valid_fraction, "replay": a.replay, "refresh_every": a.refresh_every, "warm_dense_lr": a.warm_dense_lr,
        "warm_embedding_lr": a.warm_embedding_lr, "warm_epochs": a.warm_epochs, "first_warm_epochs": a.first_warm_epochs,
        "first_warm_lr_scale": a.first_warm_lr_scale, "warm_lr_schedule": a.warm_lr_schedule, "warm_ema_decay": a.warm_ema_decay,
        "warm_window": a.warm_window, "id_dropout": drop, "warm_new_rows": a.warm_new_rows, "warm_optimizer": a.warm_optimizer,
        "first_warm_optimizer": a.first_warm_optimizer, "ema_decay": a.ema_decay, "warm_average": average, "tune": a.tune,
        "config": str(CONFIG.relative_to(REPO)), "overrides": overrides,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "precision": "fp32", "torch": torch.__version__,
        "cores": os.cpu_count(), "load_average": {"start": load0, "end": load1},
        "seconds": time.perf_counter() - t_all, "cpu_seconds": time.process_time(), "results": result}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
