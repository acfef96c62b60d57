"""A matched MovieLens fit repeated in one process: how steady are its CPU seconds, and what does a slow one show?

    python benchmarks/fibinet_fit_repeats.py --out OUT [--fits 8] [--model fibinet] [--flush-denormal-ab]

OUT from ``benchmarks/deepctr_compare.py --dataset movielens --out OUT`` (its stores and exported test labels). Each
fit is deepctr_compare.py's ``run_ctrkit`` (the matched recipe, seed 0, 3 epochs, one thread: what its fit CPU
seconds time). Per fit: CPU and wall seconds, test AUC, and what a slow fit could be told by (``getrusage``: minor /
major page faults, system seconds, involuntary context switches; the host's steal jiffies from /proc/stat; the
load average). ``--flush-denormal-ab``: the fits alternate between the thread's denormal floats flushed to zero
(``torch.set_flush_denormal(True)``) and not (``--fits`` per arm). Ends with the median CPU seconds (per arm).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import deepctr_compare as dc


def _steal() -> int:
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="deepctr_compare.py's --out directory for MovieLens")
    ap.add_argument("--fits", type=int, default=8, help="fits (per arm with --flush-denormal-ab)")
    ap.add_argument("--model", default="fibinet")
    ap.add_argument("--flush-denormal-ab", action="store_true", help="alternate fits with and without FTZ/DAZ")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(a.out)
    stores = {s: str(out / "movielens" / s) for s in ("train", "valid", "test")}
    y = np.load(out / "npz" / "test.npz")["label"]
    arms = (True, False) if a.flush_denormal_ab else (False,)
    cpu: dict[bool, list[float]] = {arm: [] for arm in arms}
    for i in range(a.fits):
        for flush in arms if i % 2 == 0 else arms[::-1]:
            torch.set_flush_denormal(flush)
            s0 = _steal()
            r = dc.run_ctrkit(dc.REPO / "configs" / "movielens" / f"{a.model}.yaml", stores, 0, dc.EPOCHS["movielens"])
            torch.set_flush_denormal(False)
            cpu[flush].append(r["cpu_seconds"])
            with open("/proc/loadavg") as f:
                load = f.read().split()[0]
            sys.stdout.write(json.dumps({"fit": i, **({"flush_denormal": flush} if a.flush_denormal_ab else {}),
                                         "cpu_s": round(r["cpu_seconds"], 3), "wall_s": round(r["fit_seconds"], 3),
                                         "test_auc": round(dc.score(y, r["pred"])["auc"], 6), **r["rusage"],
                                         "steal_jiffies": _steal() - s0, "load": load}) + "\n")
            sys.stdout.flush()
    sys.stdout.write("median CPU s: " + ", ".join(
        f"{'flush_denormal ' + ('on' if arm else 'off') if a.flush_denormal_ab else 'fit'} "
        f"{statistics.median(v):.3f} (min {min(v):.3f}, max {max(v):.3f})" for arm, v in cpu.items()) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
