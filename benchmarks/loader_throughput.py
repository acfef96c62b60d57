"""Loader throughput: samples/s of BatchLoader over a synthetic Criteo-shaped store (13 dense + 26 sparse).

Writes a synthetic store (default 2M rows) into a temporary directory, then times one epoch at
batch size 4096 with shuffle off and on, with torch.set_num_threads(1) and (by default) the process
pinned to one CPU core, with and without the prefetch thread. The first (untimed) pass warms the page
cache so the figures measure batch building, not the disk. Target: >= 1,000,000 samples/s on one core.
Prints one JSON line at the end.

    python benchmarks/loader_throughput.py [--rows 2000000] [--batch-size 4096] [--no-pin]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from ctrkit.data.sources.synthetic import write_synthetic_store
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store


def epoch_rate(store: Store, batch_size: int, shuffle: bool, prefetch: int, repeats: int) -> float:
    loader = BatchLoader(store, batch_size, shuffle=shuffle, prefetch=prefetch, seed=0)
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
        out["target_samples_per_s"] = 1_000_000
    print(json.dumps(out))


if __name__ == "__main__":
    main()
