"""Criteo TSV preprocessing throughput: ctrkit vs torchrec's own utilities on the same file.

    python benchmarks/preprocess_throughput.py [--rows 1000000] [--days 1] [--workdir DIR] [--skip-torchrec]

1. writes ``--rows`` synthetic raw Criteo rows (``ctrkit.data.sources.synthetic.write_criteo_tsv``) as plain
   TSV day files ``day_0`` .. ``day_<days-1>`` of ``rows / days`` rows each (torchrec's utilities expect
   day-file names);
2. ctrkit: ``preprocess_criteo(day_0, split="0.8,0.1,0.1")`` with one day, else ``preprocess_criteo(days)``
   (the last day test, the others shuffled into train), in a subprocess — parse, validate, ln(x+3),
   first-appearance vocabularies, seeded split, disk shuffle of train, three stores — on one process, as count /
   encode tasks on ``--workers`` 1 and 2, and on a local Dask cluster of 2 worker processes (``--scheduler``;
   the cluster's start is not timed). The task runs read the input twice (count, then encode); on a machine
   with few cores the pool's speed-up is bounded by them (the JSON line records ``cpus``);
3. torchrec (peer venv ``~/.cache/ctrkit-peers/venv-torchrec``):
   ``BinaryCriteoUtils.tsv_to_npys`` per day then ``sparse_to_contiguous(frequency_threshold=1)`` over the days
   — parse to .npy and re-index categoricals (no split, no shuffle, no validation), in a subprocess.

Each subprocess reports its own wall time of the work (imports excluded) and peak RSS: ctrkit's main process as
VmHWM of /proc/self/status (ru_maxrss survives execve, so a child would report its parent's size), the pool
workers' largest peak from RUSAGE_CHILDREN (an upper bound: it includes the parent's size at spawn), torchrec's
``ru_maxrss``; and its CPU time (user + system, all threads: ctrkit reads and parses on background threads,
so rows per CPU-second is the per-core rate). Prints one JSON line at the end (with torch's CPU capability).
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
import json, re, resource, sys, time
from ctrkit.data.sources.criteo import preprocess_criteo
src, out, kw = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
if kw.pop("keep_freed_memory", True):  # as `ctrkit preprocess criteo` does (run_preprocess_criteo)
    from ctrkit.memory import keep_freed_memory
    keep_freed_memory()
if not kw.pop("huge_pages", False):  # as `ctrkit preprocess criteo` does (run_preprocess_criteo)
    from ctrkit.memory import numpy_huge_pages
    numpy_huge_pages(False)
cluster = None
if kw.pop("local_dask", 0):  # a local Dask cluster of that many worker processes (started before the clock)
    from distributed import LocalCluster
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    kw["scheduler"] = cluster.scheduler_address
t = time.perf_counter()
c0 = resource.getrusage(resource.RUSAGE_SELF)
res = preprocess_criteo(src if len(src) > 1 else src[0], out, seed=0, overwrite=True, progress=False, **kw)
dt = time.perf_counter() - t
c1 = resource.getrusage(resource.RUSAGE_SELF)
hwm = int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) / 1024
if cluster is not None:
    cluster.close()
print(json.dumps({"seconds": dt, "maxrss_mb": hwm, "cpu_seconds": c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime,
                  "children_maxrss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "stores": {k: str(v) for k, v in res.items()}}))
"""

TORCHREC_CHILD = r"""
import contextlib, io, json, os, resource, sys, time
from torchrec.datasets.criteo import BinaryCriteoUtils
days, out = json.loads(sys.argv[1]), sys.argv[2]
os.makedirs(out, exist_ok=True)
t = time.perf_counter()
c0 = resource.getrusage(resource.RUSAGE_SELF)
with contextlib.redirect_stdout(io.StringIO()):
    for d in days:
        name = os.path.basename(d)
        BinaryCriteoUtils.tsv_to_npys(d, f"{out}/{name}_dense.npy", f"{out}/{name}_sparse.npy",
                                      f"{out}/{name}_labels.npy", dataset_name="criteo_1tb")
    t1 = time.perf_counter()
    BinaryCriteoUtils.sparse_to_contiguous([f"{out}/{os.path.basename(d)}_sparse.npy" for d in days], out,
                                           frequency_threshold=1)
dt = time.perf_counter() - t
c1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": dt, "tsv_to_npys_seconds": t1 - t,
                  "cpu_seconds": c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


# ctrkit runs: one process (the driver), count / encode tasks on 1 and 2 local processes, a local 2-worker Dask cluster
RUNS: dict[str, dict] = {"ctrkit": {}, "ctrkit_workers1": {"workers": 1}, "ctrkit_workers2": {"workers": 2},
                         "ctrkit_dask2": {"local_dask": 2}}


def run_child(python: str, code: str, *args: str, env: dict | None = None) -> dict:
    p = subprocess.run([python, "-c", code, *args], check=False, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{python} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--days", type=int, default=1, help="day files the rows are written to (1: a ratio split)")
    ap.add_argument("--workdir", default=None, help="keep files here (default: a temporary directory)")
    ap.add_argument("--skip-torchrec", action="store_true")
    ap.add_argument("--skip-parallel", action="store_true", help="only the one-process ctrkit run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-keep-freed-memory", action="store_true",
                    help="leave glibc's allocator as is in the ctrkit runs (the CLI keeps freed memory)")
    ap.add_argument("--huge-pages", action="store_true",
                    help="leave numpy's huge-page advice on in the ctrkit runs (the CLI turns it off)")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log = logging.getLogger("bench")

    with tempfile.TemporaryDirectory(prefix="ctrkit-bench-") as tmp:
        work = Path(a.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        days = [work / f"day_{i}" for i in range(a.days)]
        for i, src in enumerate(days):
            if not src.exists() or os.environ.get("REGEN"):
                from ctrkit.data.sources.synthetic import write_criteo_tsv

                t = time.perf_counter()
                write_criteo_tsv(src, a.rows // a.days, seed=a.seed + i, overwrite=True)
                log.info("wrote %s (%.0f MB) in %.1fs", src, src.stat().st_size / 1e6, time.perf_counter() - t)
        n = 0
        for src in days:
            with open(src, "rb") as f:
                n += sum(block.count(b"\n") for block in iter(lambda f=f: f.read(1 << 24), b""))
        import torch

        result = {"bench": "preprocess_throughput", "rows": n, "days": a.days, "cpus": os.cpu_count(),
                  "input_mb": round(sum(d.stat().st_size for d in days) / 1e6, 1),
                  "cpu_capability": torch.backends.cpu.get_cpu_capability()}
        srcs = json.dumps([str(d) for d in days])
        split = {"split": "0.8,0.1,0.1"} if a.days == 1 else {}
        ck: dict = {}
        for name, kw in RUNS.items():
            if name != "ctrkit" and a.skip_parallel:
                continue
            r = run_child(sys.executable, CTRKIT_CHILD, srcs, str(work / f"{name}_out"), json.dumps({**kw, **split, "keep_freed_memory": not a.no_keep_freed_memory,
                                                  "huge_pages": a.huge_pages}))
            ck = ck or r
            result.update({f"{name}_seconds": round(r["seconds"], 2), f"{name}_rows_per_s": round(n / r["seconds"]),
                           f"{name}_cpu_seconds": round(r["cpu_seconds"], 2),
                           f"{name}_peak_rss_mb": round(r["maxrss_mb"])})
            if name != "ctrkit" and "local_dask" not in kw:  # spawned pool workers: their largest peak
                result[f"{name}_worker_peak_rss_mb"] = round(r["children_maxrss_mb"])
            log.info("%-16s %.2fs  %.0f rows/s  peak RSS %.0f MB (main process)", name + ":", r["seconds"],
                     n / r["seconds"], r["maxrss_mb"])
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
            tr = run_child(str(TORCHREC_PY), TORCHREC_CHILD, srcs, str(work / "torchrec_out"), env=env)
            result.update(torchrec_seconds=round(tr["seconds"], 2), torchrec_rows_per_s=round(n / tr["seconds"]),
                          torchrec_tsv_to_npys_seconds=round(tr["tsv_to_npys_seconds"], 2),
                          torchrec_cpu_seconds=round(tr["cpu_seconds"], 2),
                          torchrec_peak_rss_mb=round(tr["maxrss_mb"]),
                          speedup=round(tr["seconds"] / ck["seconds"], 2),  # wall time, one process each
                          speedup_per_cpu_second=round(tr["cpu_seconds"] / ck["cpu_seconds"], 2))
            log.info("torchrec: %.2fs  %.0f rows/s  peak RSS %.0f MB  (ctrkit %.1fx faster)", tr["seconds"],
                     n / tr["seconds"], tr["maxrss_mb"], tr["seconds"] / ck["seconds"])
        print(json.dumps(result))


if __name__ == "__main__":
    main()
