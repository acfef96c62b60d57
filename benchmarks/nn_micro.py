"""Micro-benchmark of the DLRM hot-loop layers: forward + backward time per batch.

- EmbeddingBagCollection (fused, one embedding_bag call) vs one nn.EmbeddingBag per table (the
  torchrec / seed 000 §4 layout), 26 tables with Criteo Kaggle cardinalities capped at 100k rows,
  D = 16, single-valued ids, sparse gradients.
- DotInteraction (flat index) vs 2-D advanced indexing of the Gram matrix (torchrec's form).

Usage: python benchmarks/nn_micro.py [--batch 4096] [--dim 16] [--iters 30] [--threads N]
Ends with one JSON line of the medians (ms per batch) and samples/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

from ctrkit.batch import KeyedJagged
from ctrkit.nn.embedding import EmbeddingBagCollection
from ctrkit.nn.interaction import DotInteraction
from ctrkit.schema import TableSpec

KAGGLE = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
          5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]


def bench(fn, iters: int, warmup: int = 5) -> tuple[float, float]:
    """(median, min) milliseconds per call; the min is the less noisy one on a shared machine."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--cap", type=int, default=100_000)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, D = args.batch, args.dim
    sizes = [min(n, args.cap) for n in KAGGLE]
    keys = [f"cat_{i}" for i in range(len(sizes))]
    tables = [TableSpec(f"t_{k}", n, D, (k,)) for k, n in zip(keys, sizes)]
    F = len(keys)

    # Zipf-like ids: heavy head, like real categorical columns
    ids = torch.stack([(torch.rand(B) ** 3 * n).long().clamp(max=n - 1) for n in sizes], 1)  # (B, F)
    kj = KeyedJagged.from_dense(keys, ids)
    ebc = EmbeddingBagCollection(tables)
    grad_out = torch.randn(B, F, D)  # a realistic (dense, contiguous) upstream gradient

    def ebc_step() -> None:
        ebc.zero_grad(set_to_none=True)
        out = ebc(kj).stacked()  # (B, F, D)
        out.backward(grad_out)

    bags = nn.ModuleList([nn.EmbeddingBag(n, D, mode="sum", sparse=True) for n in sizes])
    per_key = kj.to_dict()

    def per_table_step() -> None:
        bags.zero_grad(set_to_none=True)
        outs = [bag(per_key[k][0], per_key[k][2][:-1]) for bag, k in zip(bags, keys)]
        torch.stack(outs, 1).backward(grad_out)

    dense = torch.randn(B, D, requires_grad=True)
    sparse = torch.randn(B, F, D, requires_grad=True)
    dot = DotInteraction(F, D)
    up = torch.randn(B, dot.out_features)
    tri = torch.triu_indices(F + 1, F + 1, offset=1)

    def dot_step() -> None:
        dense.grad = sparse.grad = None
        dot(dense, sparse).backward(up)

    def dot_2d_step() -> None:
        dense.grad = sparse.grad = None
        c = torch.cat((dense.unsqueeze(1), sparse), 1)
        z = torch.bmm(c, c.transpose(1, 2))
        torch.cat((dense, z[:, tri[0], tri[1]]), 1).backward(up)

    res: dict[str, object] = {
        "batch": B, "dim": D, "num_features": F, "rows_total": sum(sizes), "threads": torch.get_num_threads(),
    }
    steps = {"ebc_fused": ebc_step, "ebc_per_table": per_table_step, "dot_flat": dot_step,
             "dot_2d_index": dot_2d_step}
    for name, fn in steps.items():
        med, best = bench(fn, args.iters)
        res[f"{name}_fwd_bwd_ms_median"] = round(med, 3)
        res[f"{name}_fwd_bwd_ms_min"] = round(best, 3)
        res[f"{name}_samples_per_s_median"] = round(B / med * 1e3)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
