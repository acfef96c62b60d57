"""Which plots a run (or a set of runs) gets, from its records and predictions: the glue between
:mod:`ctrkit.report.run` (the data) and :mod:`ctrkit.report.plots` (the drawing).

One run: training loss with valid LogLoss, valid AUC (and GAUC) -- or a retrieval run's HR@K / NDCG@K / MRR --
over epochs, then from ``predictions.npz`` the ROC curve, calibration, score histogram by label and, when the
rows carry group ids, the per-group AUCs. Several runs: valid metric, loss and ROC curves overlaid.
What cannot be drawn becomes a note that says why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctrkit.errors import MetricError
from ctrkit.metrics import RANKING_METRIC, higher_is_better
from ctrkit.report import curves, plots
from ctrkit.report.plots import COLOURS, Line
from ctrkit.report.run import Run

log = logging.getLogger(__name__)

RANKING_CURVES = ("auc", "gauc")
DISPLAY = {"auc": "AUC", "gauc": "GAUC", "logloss": "LogLoss", "accuracy": "accuracy", "calibration": "calibration"}


@dataclass(frozen=True)
class Plot:
    """One figure of a page: ``name`` (file stem, unique on the page), ``caption`` and the PNG bytes."""

    name: str
    caption: str
    png: bytes


def display(metric: str) -> str:
    """A metric's name as plots and tables show it: AUC, GAUC, LogLoss; others as they are (hr@10, mrr)."""
    return DISPLAY.get(metric, metric)


def _axis(runs: list[Run]) -> tuple[str, list[float]]:
    """The x axis shared by ``runs``: epochs (step / steps per epoch) when every run knows its steps per epoch,
    else steps. Returns (axis label, per-run scale factor)."""
    spe = [r.steps_per_epoch for r in runs]
    if all(s is not None for s in spe):
        return "epoch", [1.0 / s for s in spe]  # type: ignore[operator]
    return "step", [1.0] * len(runs)


def _series(records: list[dict[str, Any]], key: str, scale: float) -> tuple[np.ndarray, np.ndarray]:
    pts = [(r["step"] * scale, r[key]) for r in records if isinstance(r.get(key), (int, float))]
    if not pts:
        return np.zeros(0), np.zeros(0)
    a = np.asarray(pts, dtype=np.float64)
    return a[:, 0], a[:, 1]


def curve_metrics(run: Run) -> list[str]:
    """The valid metrics drawn over training: AUC and GAUC of a ranking run, the @K metrics and MRR of a
    retrieval run."""
    keys = list(dict.fromkeys(k for r in run.evals for k in r))
    if run.task == "retrieval":
        return [k for k in keys if RANKING_METRIC.match(k)]
    return [k for k in RANKING_CURVES if k in keys]


def _best(run: Run) -> dict[str, Any]:
    best = run.summary.get("best")
    return best if isinstance(best, dict) else {}


def run_figures(run: Run) -> tuple[list[Plot], list[str]]:
    """The plots of one run's page and notes on what is not drawn."""
    notes: list[str] = []
    out: list[Plot] = []
    xlabel, (scale,) = _axis([run])
    best = _best(run)
    best_x = best["step"] * scale if isinstance(best.get("step"), (int, float)) else None
    best_label = f"best ({best.get('metric', '?')}, step {best.get('step')})"

    train_x, train_y = _series(run.train, "loss", scale)
    valid_x, valid_y = _series(run.evals, "logloss", scale)
    loss = [Line("train loss", train_x, train_y, colour=COLOURS[0], faint=valid_x.size > 0)] if train_x.size else []
    if valid_x.size:
        loss.append(Line("valid LogLoss", valid_x, valid_y, colour=COLOURS[1], markers=True))
    if loss:
        parts = (("training loss (per logged step)", train_x), ("valid LogLoss (per evaluation)", valid_x))
        what = " and ".join(w for w, x in parts if x.size)
        out.append(Plot("loss", what[0].upper() + what[1:], plots.png(
            plots.line_plot("Loss", xlabel, "loss", loss, best_x=best_x, best_label=best_label))))
    else:
        every, steps = (run.config.get("train") or {}).get("log_every"), run.summary.get("steps")
        why = (f" (train.log_every = {every} is more than the run's {steps} steps)"
               if isinstance(every, int) and isinstance(steps, int) and every > steps else "")
        notes.append(f"no loss curve: metrics.jsonl holds no train record{why} and no valid LogLoss")

    names = curve_metrics(run)
    if names:
        lines = [Line(f"valid {display(k)}", *_series(run.evals, k, scale),
                      colour=COLOURS[i % len(COLOURS)], markers=True) for i, k in enumerate(names)]
        what = " and ".join(display(k) for k in names) if len(names) <= 2 else ", ".join(names)
        out.append(Plot("metrics", f"Valid {what} per evaluation", plots.png(
            plots.line_plot(f"Valid {what}", xlabel, "metric", lines, best_x=best_x, best_label=best_label))))
    else:
        notes.append("no valid metric curve: metrics.jsonl holds no evaluation (was data.valid set?)")

    if run.task == "retrieval":
        notes.append("retrieval run: no ROC, calibration or score plots (its scores rank items of a catalogue; they "
                     "are not click probabilities)")
        return out, notes
    if run.predictions is None:
        if not any("predictions.npz" in n for n in run.notes):
            notes.append("no predictions.npz in the run: no ROC, calibration or score plots")
        return out, notes
    out += _prediction_figures(run, notes)
    return out, notes


def _prediction_figures(run: Run, notes: list[str]) -> list[Plot]:
    y, s = run.predictions["label"], run.predictions["score"]  # type: ignore[index]
    split, n = run.predictions_split, len(y)
    out: list[Plot] = []
    try:
        fpr, tpr, _ = curves.roc_points(s, y)
    except MetricError as e:
        notes.append(f"no ROC curve: {e}")
    else:
        auc = curves.roc_area(fpr, tpr)
        out.append(Plot("roc", f"ROC curve on the {split} split ({n:,} rows), scored by best.pt", plots.png(
            plots.roc_plot([(f"{split} AUC {auc:.4f}", *curves.thin_curve(fpr, tpr))], title=f"ROC ({split})"))))
    bins = curves.calibration_bins(s, y, bins=10)
    ratio = float(s.mean() / y.mean()) if y.mean() > 0 else float("nan")
    out.append(Plot("calibration", f"Calibration on the {split} split: observed vs predicted CTR in equal-count score "
                    f"bins; mean score / click rate = {ratio:.3f}", plots.png(
                        plots.calibration_plot(bins, title=f"Calibration ({split})"))))
    edges, neg, pos = curves.score_histograms(s, y)
    out.append(Plot("scores", f"Scores of the {split} split by label", plots.png(
        plots.score_histogram_plot(edges, neg, pos, title=f"Scores by label ({split})"))))
    if "group" in run.predictions:  # type: ignore[operator]
        auc_g, n_g, skipped = curves.group_aucs(s, y, run.predictions["group"])  # type: ignore[index]
        if auc_g.size:
            out.append(Plot("gauc", f"AUC of each group of the {split} split (GAUC: their mean weighted by rows)",
                            plots.png(plots.group_auc_plot(auc_g, n_g, skipped, title=f"AUC per group ({split})"))))
        else:
            notes.append(f"no per-group AUC: none of the {skipped:,} groups of the {split} split holds both labels")
    return out


# ---- several runs -----------------------------------------------------------------------------------
def primary_metric(runs: list[Run]) -> str | None:
    """The metric the comparison overlays: the first run's early-stopping metric when every run logged it, else
    the first curve metric every run has."""
    common = [k for k in curve_metrics(runs[0]) if all(k in curve_metrics(r) for r in runs[1:])]
    first = _best(runs[0]).get("metric")
    if first in common or (first and all(any(first in e for e in r.evals) for r in runs)):
        return str(first)
    return common[0] if common else None


def compare_figures(runs: list[Run], labels: list[str]) -> tuple[list[Plot], list[str]]:
    """Overlaid valid metric, loss and ROC curves of ``runs`` (named ``labels``), and notes."""
    notes: list[str] = []
    out: list[Plot] = []
    xlabel, scales = _axis(runs)
    colours = [COLOURS[i % len(COLOURS)] for i in range(len(runs))]
    metric = primary_metric(runs)
    if metric:
        lines = [Line(lab, *_series(r.evals, metric, sc), colour=c, markers=True)
                 for r, lab, sc, c in zip(runs, labels, scales, colours)]
        better = "higher" if higher_is_better(metric) else "lower"
        out.append(Plot("metric", f"Valid {display(metric)} per evaluation ({better} is better)", plots.png(
            plots.line_plot(f"Valid {display(metric)}", xlabel, display(metric), [ln for ln in lines if ln.x.size]))))
    else:
        notes.append("no valid metric curve: the runs logged no evaluation metric in common")
    lines = []
    for r, lab, sc, c in zip(runs, labels, scales, colours):
        x, y = _series(r.evals, "logloss", sc)
        if x.size:
            lines.append(Line(f"{lab} valid", x, y, colour=c, markers=True))
        x, y = _series(r.train, "loss", sc)
        if x.size:
            lines.append(Line(f"{lab} train", x, y, colour=c, faint=True))
    if lines:
        out.append(Plot("loss", "Training loss (faint) and valid LogLoss (markers)", plots.png(
            plots.line_plot("Loss", xlabel, "loss", lines))))
    rocs, roc_colours = [], []
    for r, lab, c in zip(runs, labels, colours):
        if r.task != "ranking" or r.predictions is None:
            continue
        try:
            fpr, tpr, _ = curves.roc_points(r.predictions["score"], r.predictions["label"])
        except MetricError as e:
            notes.append(f"{lab}: no ROC curve ({e})")
            continue
        auc = curves.roc_area(fpr, tpr)
        rocs.append((f"{lab} ({r.predictions_split}) AUC {auc:.4f}", *curves.thin_curve(fpr, tpr)))
        roc_colours.append(c)
    if rocs:
        splits = sorted({r.predictions_split for r in runs if r.predictions is not None})
        if len(splits) > 1:
            notes.append(f"the ROC curves are on different splits ({', '.join(splits)}): not comparable as they are")
        out.append(Plot("roc", "ROC curves, each run scored by its best.pt", plots.png(
            plots.roc_plot(rocs, colours=roc_colours))))
    return out, notes
