"""Criteo TSV preprocessing throughput: ctrkit vs torchrec's own utilities on the same file.

    python benchmarks/preprocess_throughput.py [--rows 1000000] [--workdir DIR] [--skip-torchrec]

1. writes ``--rows`` synthetic raw Criteo rows (``ctrkit.data.sources.synthetic.write_criteo_tsv``) as a plain
   TSV named ``day_0`` (torchrec's utilities expect day-file names);
2. ctrkit: ``preprocess_criteo(day_0, split="0.8,0.1,0.1")`` in a subprocess — parse, validate, ln(x+3),
   first-appearance vocabularies, seeded split, disk shuffle of train, three stores;
3. torchrec (peer venv ``~/.cache/ctrkit-peers/venv-torchrec``):
   ``BinaryCriteoUtils.tsv_to_npys`` then ``sparse_to_contiguous(frequency_threshold=1)`` — parse to .npy
   and re-index categoricals (no split, no shuffle, no validation), in a subprocess.

Each subprocess reports its own wall time of the work (imports excluded) and peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``). Prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TORCHREC_PY = Path.home() / ".cache" / "ctrkit-peers" / "venv-torchrec" / "bin" / "python"
# torchrec's dataset utilities need iopath (the `torchrec[datasets]` extra), which the peer venv lacks;
# it is installed once into this side directory and put on the child's PYTHONPATH (the venv is untouched).
TORCHREC_EXTRA = Path.home() / ".cache" / "ctrkit-peers" / "torchrec-datasets-extra"

CTRKIT_CHILD = r"""
import json, resource, sys, time
from ctrkit.data.sources.criteo import preprocess_criteo
src, out = sys.argv[1], sys.argv[2]
t = time.perf_counter()
res = preprocess_criteo(src, out, split="0.8,0.1,0.1", seed=0, overwrite=True, progress=False)
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "stores": {k: str(v) for k, v in res.items()}}))
"""

TORCHREC_CHILD = r"""
import contextlib, io, json, os, resource, sys, time
from torchrec.datasets.criteo import BinaryCriteoUtils
src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
t = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    BinaryCriteoUtils.tsv_to_npys(src, f"{out}/day_0_dense.npy", f"{out}/day_0_sparse.npy",
                                  f"{out}/day_0_labels.npy", dataset_name="criteo_1tb")
    t1 = time.perf_counter()
    BinaryCriteoUtils.sparse_to_contiguous([f"{out}/day_0_sparse.npy"], out, frequency_threshold=1)
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "tsv_to_npys_seconds": t1 - t,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_child(python: str, code: str, *args: str, env: dict | None = None) -> dict:
    p = subprocess.run([python, "-c", code, *args], check=False, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{python} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workdir", default=None, help="keep files here (default: a temporary directory)")
    ap.add_argument("--skip-torchrec", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log = logging.getLogger("bench")

    with tempfile.TemporaryDirectory(prefix="ctrkit-bench-") as tmp:
        work = Path(a.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        src = work / "day_0"
        if not src.exists() or os.environ.get("REGEN"):
            from ctrkit.data.sources.synthetic import write_criteo_tsv

            t = time.perf_counter()
            write_criteo_tsv(src, a.rows, seed=a.seed, overwrite=True)
            log.info("wrote %d rows (%.0f MB) in %.1fs", a.rows, src.stat().st_size / 1e6, time.perf_counter() - t)
        with open(src, "rb") as f:
            n = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b""))
        result = {"bench": "preprocess_throughput", "rows": n, "input_mb": round(src.stat().st_size / 1e6, 1),
                  "cpus": os.cpu_count()}
        ck = run_child(sys.executable, CTRKIT_CHILD, str(src), str(work / "ctrkit_out"))
        result.update(ctrkit_seconds=round(ck["seconds"], 2), ctrkit_rows_per_s=round(n / ck["seconds"]),
                      ctrkit_peak_rss_mb=round(ck["maxrss_mb"]))
        log.info("ctrkit:   %.2fs  %.0f rows/s  peak RSS %.0f MB", ck["seconds"], n / ck["seconds"], ck["maxrss_mb"])
        if a.skip_torchrec or not TORCHREC_PY.exists():
            result["torchrec"] = "skipped" if a.skip_torchrec else f"{TORCHREC_PY} not found"
        else:
            env = dict(os.environ)
            probe = subprocess.run([str(TORCHREC_PY), "-c", "import iopath"], check=False, capture_output=True)
            if probe.returncode != 0:
                if not (TORCHREC_EXTRA / "iopath").is_dir():
                    subprocess.run([str(TORCHREC_PY), "-m", "pip", "install", "-q", "--target", str(TORCHREC_EXTRA),
                                    "iopath"], check=True)
                env["PYTHONPATH"] = str(TORCHREC_EXTRA)
            tr = run_child(str(TORCHREC_PY), TORCHREC_CHILD, str(src), str(work / "torchrec_out"), env=env)
            result.update(torchrec_seconds=round(tr["seconds"], 2), torchrec_rows_per_s=round(n / tr["seconds"]),
                          torchrec_tsv_to_npys_seconds=round(tr["tsv_to_npys_seconds"], 2),
                          torchrec_peak_rss_mb=round(tr["maxrss_mb"]),
                          speedup=round(tr["seconds"] / ck["seconds"], 2))
            log.info("torchrec: %.2fs  %.0f rows/s  peak RSS %.0f MB  (ctrkit %.1fx faster)", tr["seconds"],
                     n / tr["seconds"], tr["maxrss_mb"], tr["seconds"] / ck["seconds"])
        print(json.dumps(result))


if __name__ == "__main__":
    main()
