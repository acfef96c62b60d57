"""Run reports: a page of tables and matplotlib plots for one training run, or several runs side by side.

``write_report(run_dir)`` (called at the end of every training, and by ``ctrkit report RUN_DIR``) writes

    run_dir/report.html     headline (best evaluation, test metrics, s/epoch, samples/s, model size), plots,
                            data statistics from the stores' manifests, environment, resolved config
    run_dir/report/*.png    loss.png, metrics.png (valid AUC / GAUC, or HR@K / NDCG@K of a retrieval run),
                            roc.png, calibration.png, scores.png, gauc.png (rows with group ids)

The page refers to its PNGs by relative path: the run directory can be moved or copied whole, the PNGs can be
used on their own, and the page stays small. ``compare_report(run_dirs, out)`` (``ctrkit report A B ...``)
writes ONE file with the PNGs embedded as ``data:`` URIs instead: it lives outside every run, and one file is
what ``--out`` / ``--overwrite`` protect and what can be sent along.

The report reads (:mod:`ctrkit.report.run`) summary.json, metrics.jsonl, config.yaml and predictions.npz; what
is missing is said on the page, not an error. Plot data are computed in :mod:`ctrkit.report.curves` (numpy),
drawn in :mod:`ctrkit.report.plots`, chosen per run in :mod:`ctrkit.report.figures` and laid out in
:mod:`ctrkit.report.html`. matplotlib is imported only when a report is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["compare_report", "write_report"]


def write_report(run_dir: str | Path, out: str | Path | None = None, *, overwrite: bool = False) -> Path:
    """The report of one run: ``run_dir/report.html`` + ``run_dir/report/*.png``, or one self-contained file at
    ``out`` (see :func:`ctrkit.report.write.write_report`). Returns the page's path."""
    from ctrkit.report.write import write_report as write

    return write(run_dir, out, overwrite=overwrite)


def compare_report(run_dirs: Sequence[str | Path], out: str | Path, *, overwrite: bool = False) -> Path:
    """One self-contained page at ``out`` comparing ``run_dirs`` (see :func:`ctrkit.report.write.compare_report`)."""
    from ctrkit.report.write import compare_report as compare

    return compare(run_dirs, out, overwrite=overwrite)
