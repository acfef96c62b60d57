"""Writing the report files (see :mod:`ctrkit.report` for what they hold and why the PNGs are where they are)."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from ctrkit.data.storage.store import check_replaceable
from ctrkit.errors import JobError, StoreError
from ctrkit.io import atomic_dir, atomic_file, make_dir
from ctrkit.report import html
from ctrkit.report.figures import Plot, compare_figures, run_figures
from ctrkit.report.run import Run, load_run

log = logging.getLogger(__name__)

PAGE = "report.html"
FOLDER = "report"  # the run page's PNGs, next to it


def _data_uri(p: Plot) -> str:
    return "data:image/png;base64," + base64.b64encode(p.png).decode("ascii")


def _check_out(out: Path, overwrite: bool) -> None:
    """``out`` may take the page: not a directory, absent or replaceable (``--overwrite``), its folder creatable."""
    if out.is_dir():
        raise JobError(f"--out {out} is a directory; give the path of the HTML file to write")
    check_replaceable(out, overwrite, option="--out")
    make_dir(out.parent, what="folder of the report", option="--out")


def write_report(run_dir: str | Path, out: str | Path | None = None, *, overwrite: bool = False) -> Path:
    """Render the report of the run in ``run_dir``; returns the page's path.

    Without ``out``: ``run_dir/report.html`` with its plots in ``run_dir/report/*.png`` (both replaced when they
    exist: they are the run's own). With ``out``: one self-contained HTML file there (plots embedded), refused if
    it exists unless ``overwrite``."""
    t0 = time.perf_counter()
    run = load_run(run_dir)
    if out is not None:
        out = Path(out)
        _check_out(out, overwrite)
    plots, notes = run_figures(run)
    if out is None:
        out = _write_in_run(run, plots, notes)
    else:
        with atomic_file(out, option="--out") as tmp:
            tmp.write_text(html.run_page(run, plots, notes, _data_uri), encoding="utf-8")
    log.info("report of %s: %s (%d plots, %.1f s)", run.path, out, len(plots), time.perf_counter() - t0)
    return out


def _write_in_run(run: Run, plots: Sequence[Plot], notes: Sequence[str]) -> Path:
    """report/ is written whole in a temporary sibling, then swapped in; report.html is written last."""
    folder = run.path / FOLDER
    if folder.is_symlink() or folder.exists() and not folder.is_dir():
        raise JobError(f"{folder} is not a folder of report plots; move it away so the report can be written")
    if folder.is_dir():
        foreign = [p.name for p in folder.iterdir() if p.suffix != ".png" or not p.is_file()]
        if foreign:
            raise JobError(f"{folder} holds files the report did not write ({', '.join(sorted(foreign)[:5])}); "
                           "move them away so the report's plots can be replaced")
    try:
        with atomic_dir(folder, option="the run directory") as tmp:
            for p in plots:
                (tmp / f"{p.name}.png").write_bytes(p.png)
        page = run.path / PAGE
        with atomic_file(page, option="the run directory") as t:
            t.write_text(html.run_page(run, plots, notes, lambda p: f"{FOLDER}/{p.name}.png"), encoding="utf-8")
    except StoreError as e:  # the helpers name the file and the cause
        raise JobError(f"cannot write the report in {run.path}: {e}") from None
    return page


def run_labels(runs: Sequence[Run]) -> list[str]:
    """Short names of ``runs``: the directory name, with its parent's when two runs share a name."""
    names = [r.name for r in runs]
    return [f"{r.path.resolve().parent.name}/{r.name}" if names.count(r.name) > 1 else r.name for r in runs]


def compare_report(run_dirs: Sequence[str | Path], out: str | Path, *, overwrite: bool = False) -> Path:
    """Write one self-contained HTML page at ``out`` comparing the runs of ``run_dirs`` side by side (plots
    embedded: the page lives outside every run); refused if ``out`` exists unless ``overwrite``."""
    t0 = time.perf_counter()
    if not run_dirs:
        raise JobError("no run directory to compare; give one or more RUN_DIR")
    seen: dict[Path, str] = {}
    for d in run_dirs:
        key = Path(d).resolve()
        if key in seen:
            raise JobError(f"run directory {d} is given twice (also as {seen[key]}); give each run once")
        seen[key] = str(d)
    runs = [load_run(d) for d in run_dirs]
    out = Path(out)
    _check_out(out, overwrite)
    labels = run_labels(runs)
    plots, notes = compare_figures(runs, labels)
    with atomic_file(out, option="--out") as tmp:
        tmp.write_text(html.compare_page(runs, labels, plots, notes, _data_uri), encoding="utf-8")
    log.info("comparison of %d runs: %s (%.1f s)", len(runs), out, time.perf_counter() - t0)
    return out
