"""Sparse or dense table gradients: one training step's embedding work per layout, by table size.

    python benchmarks/embedding_grad_layout.py [--rows 4096 16384 65536 262144 1048576] [--shape movielens|criteo]
                                               [--batch N] [--steps 30] [--threads 1]

One fused dim-16 weight of R rows, batches shaped like the zoo comparison's (ids drawn uniformly from the
table): ``movielens`` (batch 1024: 7 single-valued fields and two mean-pooled bags of ~2 and 20 ids) or
``criteo`` (batch 256: 26 single-valued fields); the fused EmbeddingBagCollection's
forward, a backward from a random upstream gradient, the touched-row L2 and a LazyAdam step through
OptimizerSet, as the Trainer runs them. Layouts: ``sparse`` (``dense_grad_max_rows=0``: sparse COO gradients,
summed by autograd, coalesced) and ``dense`` (``index_add_`` into an [R, D] gradient, masked optimizer pass).
Times are the process's CPU seconds per step (median of ``--steps``), steadier than wall time on shared cores.
This is what chose ``DENSE_GRAD_MAX_ROWS`` (src/ctrkit/nn/embedding_grad.py). Prints a table and ends with ONE
line ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from ctrkit.batch import KeyedJagged
from ctrkit.nn.embedding import EmbeddingBagCollection
from ctrkit.schema import TableSpec
from ctrkit.training.optim import LazyAdam, OptimizerSet

# shape -> (single-valued fields, mean-pooled bags and their mean lengths, batch size)
SHAPES: dict[str, tuple[int, dict[str, int], int]] = {"movielens": (7, {"genres": 2, "hist": 20}, 1024),
                                                      "criteo": (26, {}, 256)}


def batch(rows: int, B: int, shape: str, gen: torch.Generator) -> KeyedJagged:
    single, bags, _ = SHAPES[shape]
    per_key = {f"f{i}": (torch.randint(0, rows, (B,), generator=gen), torch.ones(B, dtype=torch.int64))
               for i in range(single)}
    for k, n in bags.items():
        lengths = torch.randint(1, 2 * n, (B,), generator=gen)
        per_key[k] = (torch.randint(0, rows, (int(lengths.sum()),), generator=gen), lengths)
    return KeyedJagged.from_per_key(per_key)


def step_seconds(rows: int, layout: str, shape: str, B: int, steps: int) -> float:
    single, bags, _ = SHAPES[shape]
    keys = [f"f{i}" for i in range(single)] + list(bags)
    ebc = EmbeddingBagCollection([TableSpec("t", rows, 16, tuple(keys))], feature_pooling=dict.fromkeys(bags, "mean"),
                                 dense_grad_max_rows=0 if layout == "sparse" else rows)
    opt = OptimizerSet(None, LazyAdam(list(ebc.embedding_parameters()), lr=1e-3), embedding_l2=1e-5)
    gen = torch.Generator().manual_seed(0)
    batches = [batch(rows, B, shape, gen) for _ in range(4)]
    upstream = torch.randn(B, len(keys), 16, generator=gen)
    times = []
    for s in range(steps + 3):
        kj = batches[s % len(batches)]
        c = time.process_time()
        opt.zero_grad()
        (ebc(kj).stacked() * upstream).sum().backward()
        opt.step()
        if s >= 3:  # the first steps allocate the optimizer state
            times.append(time.process_time() - c)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="*", type=int, default=[1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="movielens")
    ap.add_argument("--batch", type=int, help="rows per batch (default: the shape's)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    a.batch = a.batch or SHAPES[a.shape][2]
    sys.stdout.write(f"{a.shape} batch {a.batch}, D 16, threads {a.threads}; CPU ms per step (median of {a.steps})\n")
    sys.stdout.write(f"{'rows':>9}{'sparse':>10}{'dense':>10}{'sparse/dense':>14}\n")
    out = {}
    for r in a.rows:
        ms = {layout: 1e3 * step_seconds(r, layout, a.shape, a.batch, a.steps) for layout in ("sparse", "dense")}
        out[r] = ms
        sys.stdout.write(f"{r:>9}{ms['sparse']:>10.2f}{ms['dense']:>10.2f}{ms['sparse'] / ms['dense']:>14.2f}\n")
    sys.stdout.write("RESULT " + json.dumps({"shape": a.shape, "batch": a.batch, "threads": a.threads, "ms_per_step": out}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
