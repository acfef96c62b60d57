"""Loader throughput: samples/s of BatchLoader over a synthetic Criteo-shaped store (13 dense + 26 sparse).

Writes a synthetic store (default 2M rows) into a temporary directory, then times one epoch at
batch size 4096 with shuffle off and on, with torch.set_num_threads(1) and (by default) the process
pinned to one CPU core, with and without the prefetch thread. The first (untimed) pass warms the page
cache so the figures measure batch building, not the disk. Target: >= 1,000,000 samples/s on one core.
With ``--days D`` (default 8) the same rows are also written as D day stores and read by the day-streamed
loader (DayStreamLoader, shuffled, as ``data.train`` naming day stores trains), without and with MLPerf's
multi-hot expansion (per-table sizes, the batch stage of the Criteo 1TB config). Prints one JSON line at the end.

    python benchmarks/loader_throughput.py [--rows 2000000] [--batch-size 4096] [--days 8] [--no-pin]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.sources.synthetic import write_synthetic_store
from ctrkit.data.storage.days import DayStreamLoader
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store

MLPERF_MULTI_HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]


def epoch_rate(store: Store, batch_size: int, shuffle: bool, prefetch: int, repeats: int) -> float:
    return loader_rate(BatchLoader(store, batch_size, shuffle=shuffle, prefetch=prefetch, seed=0), repeats)


def day_rates(tmp: Path, rows: int, days: int, batch_size: int, repeats: int) -> dict[str, int]:
    """Samples/s of the day-streamed loader over ``days`` synthetic day stores of ``rows`` rows in all."""
    paths = [write_synthetic_store(tmp / f"day_{d}", rows // days, seed=d) for d in range(days)]
    out = {}
    pipe = FeaturePipeline.from_schema(Store(paths[0]).schema).with_multi_hot(MLPERF_MULTI_HOT, 1)
    for name, pipeline in (("days", None), ("days_mlperf_multi_hot", pipe)):
        for prefetch in (0, 2):
            loader = DayStreamLoader(paths, batch_size, shuffle=True, seed=0, prefetch=prefetch, pipeline=pipeline)
            if prefetch == 0 and pipeline is None:
                loader_rate(loader, 1)  # warm the page cache
            key = f"samples_per_s_{name}_shuffle_prefetch{prefetch}"
            out[key] = round(loader_rate(loader, repeats))
            print(f"{key:45s} {out[key]:>14,.0f}", flush=True)
    return out


def loader_rate(loader, repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        n = 0
        for batch in loader:
            n += len(batch)
        best = max(best, n / (time.perf_counter() - t))
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=2, help="epochs per setting; the best is reported")
    p.add_argument("--days", type=int, default=8, help="day stores for the day-streamed loader (0: skip)")
    p.add_argument("--no-pin", action="store_true", help="do not pin the process to one core")
    args = p.parse_args()
    torch.set_num_threads(1)
    pinned = None
    if not args.no_pin and hasattr(os, "sched_setaffinity"):
        pinned = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {pinned})
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        path = write_synthetic_store(Path(tmp) / "synth", args.rows, seed=0)
        write_s = time.perf_counter() - t
        store = Store(path)
        epoch_rate(store, args.batch_size, True, 0, 1)  # warm the page cache
        out = {"bench": "loader_throughput", "rows": args.rows, "batch_size": args.batch_size,
               "torch_threads": 1, "pinned_core": pinned, "store_write_s": round(write_s, 2)}
        for shuffle in (False, True):
            for prefetch in (0, 2):
                rate = epoch_rate(store, args.batch_size, shuffle, prefetch, args.repeats)
                key = f"samples_per_s_{'shuffle' if shuffle else 'sequential'}_prefetch{prefetch}"
                out[key] = round(rate)
                print(f"{key:45s} {rate:>14,.0f}", flush=True)
        if args.days > 0:
            out["days"] = args.days
            out.update(day_rates(Path(tmp), args.rows, args.days, args.batch_size, args.repeats))
        out["target_samples_per_s"] = 1_000_000
    print(json.dumps(out))


if __name__ == "__main__":
    main()
