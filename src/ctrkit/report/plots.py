"""The report's figures, drawn by matplotlib on its Agg canvas and returned as PNG bytes.

Figures are built with :class:`matplotlib.figure.Figure` and :class:`~matplotlib.backends.backend_agg.FigureCanvasAgg`
directly, not through ``pyplot``: no global figure state, no GUI backend is selected, and a caller's own pyplot
session is left alone. Every figure is ``SIZE_PX`` pixels (``FIG_INCHES`` at ``DPI``); the page shows it at that
size, so what the browser shows is the PNG pixel for pixel.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ctrkit.report.curves import CalibrationBins

DPI = 100
FIG_INCHES = (5.6, 3.6)
SIZE_PX = (round(FIG_INCHES[0] * DPI), round(FIG_INCHES[1] * DPI))  # (width, height)
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22")


@dataclass(frozen=True)
class Line:
    """One curve of a line plot: ``x`` / ``y`` [n]; ``faint`` for the noisy per-step training loss under the
    evaluation points; ``markers`` for the (few) evaluation points."""

    label: str
    x: np.ndarray
    y: np.ndarray
    colour: str = COLOURS[0]
    faint: bool = False
    markers: bool = False


def _figure() -> tuple[Figure, object]:
    fig = Figure(figsize=FIG_INCHES, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    return fig, ax


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes of exactly ``SIZE_PX``."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def line_plot(title: str, xlabel: str, ylabel: str, lines: Sequence[Line], *, best_x: float | None = None,
              best_label: str = "best", logy: bool = False) -> Figure:
    """Curves over training (loss, AUC, HR@K ...), the best evaluation marked by a dotted vertical line."""
    fig, ax = _figure()
    for ln in lines:
        ok = np.isfinite(ln.y)
        if ln.faint:
            ax.plot(ln.x[ok], ln.y[ok], color=ln.colour, alpha=0.35, linewidth=1.0, label=ln.label)
        else:
            ax.plot(ln.x[ok], ln.y[ok], color=ln.colour, linewidth=1.8, label=ln.label,
                    marker="o" if ln.markers else None, markersize=4)
    if best_x is not None:
        ax.axvline(best_x, color="#555555", linestyle=":", linewidth=1.2, label=best_label)
    if logy:
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if lines:
        ax.legend(fontsize=8, loc="best")
    return fig


def roc_plot(curves: Sequence[tuple[str, np.ndarray, np.ndarray]], title: str = "ROC curve",
             colours: Sequence[str] | None = None) -> Figure:
    """ROC curves ``(label, fpr, tpr)`` over the chance diagonal (``colours``: one per curve)."""
    fig, ax = _figure()
    ax.plot([0, 1], [0, 1], color="#999999", linestyle="--", linewidth=1.0, label="chance")
    for i, (label, fpr, tpr) in enumerate(curves):
        ax.plot(fpr, tpr, color=colours[i] if colours else COLOURS[i % len(COLOURS)], linewidth=1.8, label=label)
    ax.set(title=title, xlabel="false positive rate", ylabel="true positive rate", xlim=(0, 1), ylim=(0, 1.01))
    ax.set_aspect("equal", adjustable="box")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def calibration_plot(bins: CalibrationBins, title: str = "Calibration") -> Figure:
    """Observed vs predicted CTR per score bin (error bars: one binomial standard error) over the diagonal;
    log-log axes when the CTRs stay below 0.5 and the predicted ones span more than a factor 20 (CTR data)."""
    fig, ax = _figure()
    lo = float(min(bins.mean_score.min(), bins.rate[bins.rate > 0].min(initial=np.inf)))
    hi = float(max(bins.mean_score.max(), bins.rate.max()))
    log_axes = bins.mean_score.min() > 0 and bins.mean_score.max() / bins.mean_score.min() > 20 and hi < 0.5
    if log_axes:
        lo = lo / 1.5
        ax.set_xscale("log")
        ax.set_yscale("log")
    else:
        lo = 0.0
    ax.plot([lo, hi * 1.05], [lo, hi * 1.05], color="#999999", linestyle="--", linewidth=1.0,
            label="perfectly calibrated")
    shown = bins.rate > 0 if log_axes else np.ones(bins.rate.shape, bool)  # a zero rate has no place on a log axis
    ax.errorbar(bins.mean_score[shown], bins.rate[shown], yerr=bins.stderr[shown], color=COLOURS[0], marker="o",
                markersize=4, linewidth=1.5, capsize=2, label=f"{bins.count.size} bin{'s' if bins.count.size > 1 else ''} of ~{int(bins.count.mean())} rows")
    ax.set(title=title, xlabel="predicted CTR (mean score of the bin)", ylabel="observed CTR (click rate of the bin)")
    ax.legend(fontsize=8, loc="upper left")
    return fig


def score_histogram_plot(edges: np.ndarray, negatives: np.ndarray, positives: np.ndarray,
                         title: str = "Scores by label") -> Figure:
    """Density of the scores of negative and positive rows (each normalised to area 1: the classes differ in size
    by orders of magnitude in CTR data)."""
    fig, ax = _figure()
    width = np.diff(edges)
    for counts, label, colour in ((negatives, "label 0", COLOURS[0]), (positives, "label 1", COLOURS[1])):
        total = counts.sum()
        if total:
            dens = counts / (total * width)
            ax.stairs(dens, edges, color=colour, fill=True, alpha=0.3)
            ax.stairs(dens, edges, color=colour, linewidth=1.5, label=f"{label} ({int(total):,} rows)")
    ax.set(title=title, xlabel="predicted click probability", ylabel="density")
    ax.legend(fontsize=8, loc="upper right")
    return fig


def group_auc_plot(auc: np.ndarray, impressions: np.ndarray, skipped: int, title: str = "AUC per group") -> Figure:
    """Histogram of the per-group AUCs, each group weighted by its rows, the GAUC (their weighted mean) marked."""
    fig, ax = _figure()
    gauc = float((auc * impressions).sum() / impressions.sum())
    ax.hist(auc, bins=np.linspace(0, 1, 21), weights=impressions, color=COLOURS[2], alpha=0.6, edgecolor="white")
    ax.axvline(gauc, color=COLOURS[1], linewidth=1.8, label=f"GAUC {gauc:.4f} ({auc.size:,} groups)")
    ax.axvline(0.5, color="#999999", linestyle="--", linewidth=1.0, label="chance")
    ax.set(title=title, xlabel=f"AUC of a group ({skipped:,} one-class groups left out)", ylabel="rows", xlim=(0, 1))
    ax.legend(fontsize=8, loc="upper left")
    return fig
