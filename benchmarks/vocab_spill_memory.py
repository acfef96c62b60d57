"""Peak RSS of exact Criteo vocabularies held in memory vs spilled to disk (``--vocab-memory-mb``).

    PYTHONPATH=src python benchmarks/vocab_spill_memory.py [--days 3] [--rows-per-day 300000] [--budget-mb 16]

Writes ``--days`` synthetic day files with a flat value distribution (``zipf_a`` 0.2: millions of distinct
values, most seen once, as Criteo's long tail), then preprocesses them with ``min_freq 2`` as count / encode
tasks on one in-process worker, with the counts in memory and with them spilled past ``--budget-mb``; each run in
its own subprocess, peak RSS as VmHWM of /proc/self/status. Both runs must give the same vocabularies (checked
by their fingerprints). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, re, resource, sys, time
from pathlib import Path
from ctrkit.data.pipeline.persist import load_pipeline
from ctrkit.data.sources.criteo import preprocess_criteo
src, out, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t = time.perf_counter()
res = preprocess_criteo(sorted(Path(src).glob("day_*")), out, overwrite=True, progress=False, **kw)
dt = time.perf_counter() - t
hwm = int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) / 1024
ru = resource.getrusage(resource.RUSAGE_SELF)
p = load_pipeline(res["train"])
print(json.dumps({"seconds": round(dt, 1), "cpu_seconds": round(ru.ru_utime + ru.ru_stime, 1), "peak_rss_mb": round(hwm),
                  "distinct": sum(v.seen for v in p.vocabs_.values()),
                  "kept": sum(len(v.keys) for v in p.vocabs_.values()), "fingerprint": p.vocab_fingerprint()}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--rows-per-day", type=int, default=300_000)
    ap.add_argument("--budget-mb", type=float, default=16)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args()
    from ctrkit.data.sources.synthetic import write_criteo_tsv

    with tempfile.TemporaryDirectory(prefix="ctrkit-spill-") as tmp:
        work = Path(a.workdir or tmp)
        for i in range(a.days):
            write_criteo_tsv(work / "days" / f"day_{i}", a.rows_per_day, seed=i, zipf_a=0.2, overwrite=True)
        base = {"min_freq": 2, "workers": 1, "shard_bytes": 16 << 20}
        result: dict = {"bench": "vocab_spill_memory", "rows": a.days * a.rows_per_day, "budget_mb": a.budget_mb}
        for name, kw in (("in_memory", base), ("spilled", {**base, "vocab_memory_mb": a.budget_mb})):
            p = subprocess.run([sys.executable, "-c", CHILD, str(work / "days"), str(work / name), json.dumps(kw)],
                               check=True, capture_output=True, text=True)
            result[name] = json.loads(p.stdout.strip().splitlines()[-1])
        result["same_vocabularies"] = result["in_memory"].pop("fingerprint") == result["spilled"].pop("fingerprint")
        print(json.dumps(result))


if __name__ == "__main__":
    main()
