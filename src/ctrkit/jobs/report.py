"""``ctrkit report RUN_DIR [RUN_DIR ...] [--out PATH] [--overwrite]``: one run's report, or several runs compared.

One RUN_DIR re-renders ``RUN_DIR/report.html`` (or, with ``--out``, one self-contained page there); several
write a comparison page at ``--out`` (default ``report-compare.html``). An existing ``--out`` file is replaced
only with ``--overwrite``.
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_COMPARE_OUT = "report-compare.html"


def add_report_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="run directory (run.dir/run.name of a training: summary.json, metrics.jsonl, ...)")
    p.add_argument("--out", help="HTML file to write: for one run, a self-contained copy of its report (default: "
                                 f"RUN_DIR/report.html); for several, the comparison (default: {DEFAULT_COMPARE_OUT})")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    return p


def run_report(args: argparse.Namespace) -> int:
    """``ctrkit report``: the path of the page written."""
    from ctrkit.report import compare_report, write_report

    if len(args.run_dirs) == 1:
        path = write_report(args.run_dirs[0], args.out, overwrite=args.overwrite)
    else:
        path = compare_report(args.run_dirs, args.out or DEFAULT_COMPARE_OUT, overwrite=args.overwrite)
    sys.stdout.write(f"report: {path}\n")
    return 0
