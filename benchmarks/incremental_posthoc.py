"""Read back a run of benchmarks/incremental.py (its ``--out`` directory) for the MovieLens gap (docs/benchmarks.md,
"Cold-start rows, fresh optimizer states and averaging over periods"):

    python benchmarks/incremental_posthoc.py split   OUT [--dataset movielens]
    python benchmarks/incremental_posthoc.py average OUT [--dataset movielens] [--betas 0.3 0.5 0.7]
    python benchmarks/incremental_posthoc.py window  OUT [--dataset movielens] [--last-tuning-period 9]
    python benchmarks/incremental_posthoc.py gap     OUT [OUT ...] [--retrain FULL [FULL ...]] [--dataset movielens]
    python benchmarks/incremental_posthoc.py rolling OUT_C0 OUT_C1 [...] --retrain OUT [--dataset movielens]
    python benchmarks/incremental_posthoc.py paired  OUT_BASE OUT_CAND [OUT_BASE OUT_CAND ...] [--dataset movielens]

* ``split``: per period t >= 1 and arm (incremental, retrain), the share of next-period rows whose user the arm's
  vocabulary does not hold (id 1, rare), how many training rows carry user id 1, and the next-period AUC within
  the rows of seen and of unseen users; means over the periods. Seen users are split further: ``recent`` (the user
  has rows among period t's new or validation rows) and ``stale`` (known from earlier periods only).
* ``window``: per arm run (incremental, retrain), the mean validation AUC and next-period AUC over the periods
  t = 1 .. K (a tuning window: a setting chosen on their next periods never sees periods K + 2 onwards) and over
  t > K (held out); also read from an ``--tune`` run (incremental alone).
* ``gap``: incremental minus retrain per period t >= 1, validation AUC and next-period AUC, means and standard
  errors over all periods and over the warm ones (a ``--refresh-every`` refresh period has no ``inc{t}`` run: its
  model is ``re{t}``, so read a run's own fresh ``--out`` directory).
* ``rolling``: a rolling-origin choice among candidate runs of one seed (docs/benchmarks.md, "seventh round"), each
  with the same refresh periods (their fits are the same run in every candidate): within each block of warm periods
  (after period 0 or a refresh, up to the next refresh), the candidate whose mean next-period AUC over the earlier
  blocks' warm periods is highest (no record or a tie: the first candidate); that arm's next-period AUC / GAUC per
  period against the retrain arm of ``--retrain`` (a full run), and its training seconds: every candidate's warm
  runs (each keeps its record) plus the refreshes (the first candidate's); also each candidate's gap to retrain by
  the position of a warm period in its block (1: the first warm run after a fit on every row so far).
* ``paired``: a candidate's runs against a base's, one (base, candidate) pair per seed, pooled: over the base's warm
  periods, the candidate's model (its warm run, or its refit where it has none, e.g. ``--refresh-every 2`` against
  4) minus the base's, next-period AUC and validation AUC, mean and standard error, overall and by the period's
  position in the base's block; and the epochs per run of each.
* ``average``: weights averaged over periods from the incremental arm's own checkpoints, a_0 = w_0 and
  a_t = beta a_{t-1} + (1 - beta) w_t (rows of ids new at t: w_t's), scored on period t's validation split (the
  figure a choice may read) and on period t + 1. The warm starts are the run's (each continues from w_t): the
  average only scores, as ``train.ema_decay`` does within a run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score


def average(prev: dict[str, torch.Tensor], new: dict[str, torch.Tensor], beta: float) -> dict[str, torch.Tensor]:
    """beta * prev + (1 - beta) * new for every float entry; an entry of ``new`` with more rows (a grown table) keeps
    its extra rows as they are; other entries (integer buffers) are ``new``'s."""
    out = {}
    for k, v in new.items():
        old = prev.get(k)
        if old is None or not torch.is_floating_point(v):
            out[k] = v
            continue
        if v.dim() == 0:
            out[k] = beta * old + (1 - beta) * v
            continue
        mixed = v.clone()
        n = old.shape[0]
        mixed[:n] = beta * old + (1 - beta) * v[:n]
        out[k] = mixed
    return out


def _store(work: Path, t: int, arm: str) -> Path:
    d = work / f"p{t}"
    return (d / "incr" if (d / "incr").exists() else d / "inc") if arm == "inc" else d / "re"


def _periods(work: Path, arm: str) -> list[int]:
    return sorted(int(p.name[len(arm):]) for p in (work / "runs").glob(f"{arm}*")
                  if p.name[len(arm):].isdigit() and (p / "predictions.npz").exists() and int(p.name[len(arm):]) >= 1)


def split(work: Path) -> None:
    for arm in ("inc", "re"):
        rec = []
        for t in _periods(work, arm):
            p, st = np.load(work / "runs" / f"{arm}{t}" / "predictions.npz"), _store(work, t, arm)
            unseen = np.load(st / "test" / "user_id.npy") == 1
            inc = work / f"p{t}" / "inc"  # recent: the user has rows among period t's new or validation rows
            now = np.r_[np.load(inc / "train" / "user_id.npy"), np.load(inc / "valid" / "user_id.npy")]
            user = np.load(inc / "test" / "user_id.npy")  # (the grown vocabulary's ids: both arms' rows in one order)
            recent = ~unseen & np.isin(user, now)
            r = {"unseen": float(unseen.mean()), "trained_on_1": int((np.load(st / "train" / "user_id.npy") == 1).sum())}
            for name, m in (("seen", ~unseen), ("unseen_auc", unseen), ("recent", recent), ("stale", ~unseen & ~recent)):
                if len(set(p["label"][m].tolist())) == 2:
                    r[name] = roc_auc_score(p["label"][m], p["score"][m])
            rec.append(r)
        mean = {k: statistics.fmean(r[k] for r in rec if k in r) for k in ("unseen", "seen", "unseen_auc", "recent",
                                                                            "stale")}
        sys.stdout.write(f"{arm}: {len(rec)} periods, next-period rows with an unseen user {mean['unseen']:.4f}, training "
                         f"rows with user id 1: {sum(r['trained_on_1'] for r in rec)}, AUC seen-user rows "
                         f"{mean['seen']:.4f} (recent users {mean['recent']:.4f}, stale users {mean['stale']:.4f}), unseen-user rows "
                         f"{mean['unseen_auc']:.4f}\n")


def averaged(work: Path, betas: list[float]) -> None:
    from ctrkit.checkpoint import Checkpoint
    from ctrkit.data.storage.store import Store
    from ctrkit.jobs.scoring import eval_loader, score_rows

    def auc(ck: Checkpoint, weights: dict[str, torch.Tensor], store: Path) -> float:
        ck.weights = weights
        p = score_rows(ck.build_model(), eval_loader(Store(store), 4096, ck.feature_pipeline()))
        return float(roc_auc_score(p["label"], p["score"]))

    acc: dict[float, dict[str, torch.Tensor]] = {}
    res: dict[float, list[tuple[float, float]]] = {b: [] for b in [0.0, *betas]}
    for t in [0, *_periods(work, "inc")]:
        ck = Checkpoint.load(work / "runs" / f"inc{t}" / "best.pt")
        w = dict(ck.weights)
        acc = {b: (average(acc[b], w, b) if b in acc else w) for b in betas}
        if t:
            st = _store(work, t, "inc")
            for b, r in res.items():
                weights = w if b == 0.0 else acc[b]
                r.append((auc(ck, weights, st / "valid"), auc(ck, weights, st / "test")))
    for b, r in res.items():
        sys.stdout.write(f"beta {b}: mean valid AUC {statistics.fmean(x[0] for x in r):.4f}, next-period AUC "
                         f"{statistics.fmean(x[1] for x in r):.4f} ({len(r)} periods)\n")


def _valid_and_next_auc(run: Path) -> tuple[float, float]:
    """A run's best validation AUC (its summary) and its next-period AUC (its predictions)."""
    import json

    p = np.load(run / "predictions.npz")
    return json.loads((run / "summary.json").read_text())["best"]["value"], roc_auc_score(p["label"], p["score"])


def window(work: Path, last: int) -> None:
    for arm in ("inc", "re"):
        per = {t: _valid_and_next_auc(work / "runs" / f"{arm}{t}") for t in _periods(work, arm)}
        for name, ts in ((f"t = 1 .. {last}", [t for t in per if t <= last]), (f"t > {last}", [t for t in per if t > last])):
            if ts:
                sys.stdout.write(f"{arm} {name} ({len(ts)} periods): mean valid AUC {statistics.fmean(per[t][0] for t in ts):.4f}"
                                 f", next-period AUC {statistics.fmean(per[t][1] for t in ts):.4f}\n")


def _model_run(work: Path, t: int, like: Path) -> Path:
    """The run of ``work`` that is its model of period t: its warm run ``inc{t}``, or where it has none its refit
    ``re{t}``; neither (with predictions) stops the reading, naming ``like``, the run it is read against."""
    for name in (f"inc{t}", f"re{t}"):
        if (work / "runs" / name / "predictions.npz").exists():
            return work / "runs" / name
    raise SystemExit(f"{work}: period {t} has neither an inc{t} nor a re{t} run with predictions.npz: "
                     f"give the --out directory of a run over the same periods as {like}")


def gap(works: list[Path], retrains: list[Path] | None = None) -> None:
    """Incremental minus retrain, per period t >= 1: validation AUC (each run's best) and next-period AUC, means with
    their standard errors over the periods (of every run given, e.g. one per seed), over all periods, the warm ones,
    and the warm ones by periods since the last refresh (a period without an ``inc{t}`` run is a ``--refresh-every``
    refresh: its model is ``re{t}``, difference 0). ``retrains``: per run, the ``--out`` of a full run whose retrain
    arm it is measured against (a ``--tune`` run has ``re{t}`` on its refresh periods only); each refresh fit must
    then score as that arm's fit of the period, or the reading stops."""
    rows = []
    for work, full in zip(works, retrains or works):
        last = None  # the last refresh period (None: none yet)
        for t in _periods(full, "re"):
            model, re = _model_run(work, t, full), full / "runs" / f"re{t}"
            warm = model.name.startswith("inc")
            a, b = _valid_and_next_auc(model), _valid_and_next_auc(re)
            if not warm and a != b:
                raise SystemExit(f"{work}: refresh period {t} scores {a}, the retrain arm of {full} {b}: "
                                 "give the full run of the same seed and code")
            rows.append((warm, a[0] - b[0], a[1] - b[1], t - last if warm and last is not None else None))
            last = last if warm else t
    groups = [("all periods", rows), ("warm periods", [r for r in rows if r[0]])]
    groups += [(f"{k} after a refresh", [r for r in rows if r[3] == k]) for k in sorted({r[3] for r in rows} - {None})]
    for name, sel in groups:
        if len(sel) < 2:
            continue
        out = [f"{name} ({len(sel)})"]
        for i, what in ((1, "valid AUC"), (2, "next-period AUC")):
            x = [r[i] for r in sel]
            out.append(f"{what} {statistics.fmean(x):+.4f} ± {statistics.stdev(x) / len(x) ** 0.5:.4f}")
        sys.stdout.write("incremental - retrain, " + ", ".join(out) + "\n")


def choose(records: list[dict[int, float]], blocks: list[list[int]]) -> list[int]:
    """Rolling origin: ``records[c][t]`` candidate c's next-period AUC of warm period t, ``blocks`` the warm periods in
    time order, cut at each refresh -> per block the index of the candidate with the highest mean over the warm
    periods of the blocks before it (their next periods are known when the block's first run is trained); no record,
    or a tie, keeps the earliest candidate (0: the default)."""
    chosen, seen = [], []
    for block in blocks:
        means = [statistics.fmean(r[t] for t in seen) if seen else 0.0 for r in records]
        chosen.append(max(range(len(records)), key=lambda c: (means[c], -c)))
        seen += block
    return chosen


def by_position(records: list[dict[int, float]], retrain: dict[int, float], blocks: list[list[int]]) -> list[list[float]]:
    """Per candidate, the mean next-period AUC minus retrain's over the k-th warm periods of the blocks (k = 1, 2, ...:
    periods since the last fit on every row so far)."""
    deep = max(len(b) for b in blocks)
    return [[statistics.fmean(r[b[k]] - retrain[b[k]] for b in blocks if len(b) > k) for k in range(deep)] for r in records]


def rolling(works: list[Path], retrain: Path) -> dict[str, object]:
    """``rolling``: the rolling-origin arm over the candidate runs ``works`` against ``retrain``'s retrain arm."""
    import json

    from ctrkit.metrics import gauc

    def read(run: Path) -> dict[str, float]:
        p = np.load(run / "predictions.npz")
        return {"auc": float(roc_auc_score(p["label"], p["score"])), "gauc": float(gauc(p["score"], p["label"], p["group"])[0]),
                "train_s": float(json.loads((run / "summary.json").read_text())["train_seconds"])}

    periods = _periods(retrain, "re")
    warm = [set(_periods(w, "inc")) & set(periods) for w in works]
    if any(w != warm[0] for w in warm):
        raise SystemExit(f"the candidates' refresh periods differ ({[sorted(set(periods) - w) for w in warm]}): "
                         "give runs with the same --refresh-every")
    re = {t: read(retrain / "runs" / f"re{t}") for t in periods}
    cand = [{t: read(w / "runs" / (f"inc{t}" if t in warm[0] else f"re{t}")) for t in periods} for w in works]
    drift = max(abs(c[t]["auc"] - re[t]["auc"]) for c in cand for t in periods if t not in warm[0])
    blocks: list[list[int]] = []
    for t in periods:
        if t in warm[0]:
            if not blocks or t - 1 not in warm[0]:
                blocks.append([])
            blocks[-1].append(t)
    warm_aucs = [{t: c[t]["auc"] for t in warm[0]} for c in cand]
    chosen = choose(warm_aucs, blocks)
    pick = {t: c for block, c in zip(blocks, chosen) for t in block}
    arm = {t: cand[pick.get(t, 0)][t] for t in periods}
    mean = {k: statistics.fmean(arm[t][k] for t in periods) for k in ("auc", "gauc")}
    out = {"blocks": [[b[0], b[-1], c] for b, c in zip(blocks, chosen)], "rolling": mean,
           "candidates_minus_retrain_by_position": by_position(warm_aucs, {t: re[t]["auc"] for t in periods}, blocks),
           "retrain": {k: statistics.fmean(re[t][k] for t in periods) for k in ("auc", "gauc")},
           "candidates": [statistics.fmean(c[t]["auc"] for t in periods) for c in cand],
           "refresh_auc_max_difference": drift, "periods": len(periods),
           "train_s": {"rolling_all_candidates": sum(c[t]["train_s"] for c in cand for t in warm[0])
                       + sum(cand[0][t]["train_s"] for t in periods if t not in warm[0]),
                       "rolling_chosen_only": sum(arm[t]["train_s"] for t in periods),
                       "retrain": sum(re[t]["train_s"] for t in periods)}}
    out["rolling_minus_retrain_auc"] = mean["auc"] - out["retrain"]["auc"]
    out["candidates_minus_retrain_auc"] = [a - out["retrain"]["auc"] for a in out["candidates"]]
    return out


def _stats(x: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(x), "se": statistics.stdev(x) / len(x) ** 0.5 if len(x) > 1 else float("nan")}


def paired(pairs: list[tuple[Path, Path]]) -> dict[str, object]:
    """``paired``: candidate minus base over the base's warm periods t (its ``inc{t}`` runs, t >= 1), pooled over
    ``pairs`` (base, candidate): next-period AUC (predictions, sklearn) and validation AUC (each run's best), overall
    and by position (k-th consecutive warm period: k - 1 periods after the last fit on every row so far); the
    candidate's model of t is its ``inc{t}`` run or, where it has none, its refit ``re{t}``."""
    import json

    rows = []  # (position, next-period difference, validation difference, candidate epochs, base epochs)
    for base, cand in pairs:
        warm, pos = set(_periods(base, "inc")), 0
        for t in sorted(warm):
            pos = pos + 1 if t - 1 in warm else 1
            runs = [base / "runs" / f"inc{t}", _model_run(cand, t, base)]
            (bv, bn), (cv, cn) = (_valid_and_next_auc(r) for r in runs)
            epochs = [json.loads((r / "summary.json").read_text()).get("epochs_trained") for r in runs]
            rows.append((pos, cn - bn, cv - bv, epochs[1], epochs[0]))

    def group(sel: list[tuple]) -> dict[str, object]:
        return {"n": len(sel), "next": _stats([r[1] for r in sel]), "valid": _stats([r[2] for r in sel])}

    out: dict[str, object] = {**group(rows), "by_position": [group([r for r in rows if r[0] == k])
                                                             for k in range(1, max(r[0] for r in rows) + 1)]}
    if all(r[3] is not None and r[4] is not None for r in rows):
        out["epochs"] = {"candidate": statistics.fmean(r[3] for r in rows), "base": statistics.fmean(r[4] for r in rows)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["split", "average", "window", "gap", "rolling", "paired"])
    ap.add_argument("out", type=Path, nargs="+", help="benchmarks/incremental.py's --out directory (gap: one or more, "
                                                      "e.g. one per seed, pooled)")
    ap.add_argument("--dataset", default="movielens", choices=["movielens", "taobao"])
    ap.add_argument("--betas", type=float, nargs="+", default=[0.3, 0.5, 0.7])
    ap.add_argument("--retrain", type=Path, nargs="+", help="rolling: the --out directory of a full run (its retrain "
                    "arm); gap: one per OUT, in the same order (e.g. --tune runs against the full runs of their seeds)")
    ap.add_argument("--last-tuning-period", type=int, default=9, metavar="K", help="window: periods 1 .. K tune")
    a = ap.parse_args(argv)
    if a.what == "rolling" and len(a.retrain or []) != 1:
        ap.error("rolling needs --retrain: the --out directory of one full run")
    if a.retrain and a.what not in ("rolling", "gap"):
        ap.error("--retrain goes with rolling or gap")
    if a.what == "gap" and a.retrain and len(a.retrain) != len(a.out):
        ap.error(f"gap --retrain takes one full run per OUT: {len(a.out)} OUT, {len(a.retrain)} --retrain")
    if a.what == "paired" and len(a.out) % 2:
        ap.error(f"paired reads (base, candidate) pairs of --out directories, got {len(a.out)}: {' '.join(map(str, a.out))}")
    if len(a.out) > 1 and a.what not in ("gap", "rolling", "paired"):
        ap.error(f"{a.what} reads one --out directory, got {len(a.out)}: {' '.join(map(str, a.out))}")
    works = [o / a.dataset for o in [*a.out, *(a.retrain or [])]]
    for w in works:
        if not (w / "runs").is_dir():
            ap.error(f"{w / 'runs'} does not exist: give the --out directory of a benchmarks/incremental.py run")
    work = works[0]
    if any(not 0 < b < 1 for b in a.betas):
        ap.error(f"--betas must lie strictly between 0 and 1, got {a.betas}")
    torch.set_num_threads(1)
    if a.what == "rolling":
        import json

        sys.stdout.write(json.dumps(rolling(works[:-1], works[-1])) + "\n")
    elif a.what == "paired":
        import json

        sys.stdout.write(json.dumps(paired(list(zip(works[::2], works[1::2])))) + "\n")
    elif a.what == "window":
        window(work, a.last_tuning_period)
    elif a.what == "gap":
        gap(works[:len(a.out)], works[len(a.out):] or None)
    else:
        split(work) if a.what == "split" else averaged(work, a.betas)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
