"""DLRM's fp32 training step with and without the non-GEMM changes of issue 29 item 2, steps alternated in one
process (:mod:`_step_ab`), CPU seconds per step, and whether the arms' weights stay bit-identical.

    PYTHONPATH=src python benchmarks/dlrm_step_ab.py [--interaction dot dcn] [--steps 24] [--rows 45056]

The workload is dlrm_throughput.py's (same data, model, optimizers, batch 4,096). Arms, each its own model built
from one seed and trained on the same batches:

- ``before``: the step as it was: MLPs run layer by layer (autograd's addmm / threshold_backward / sum nodes), the
  dot interaction's torch-op node (index_select + cat around the matmuls), the pooled rows copied to (B, F, D)
  before the interaction's cat.
- ``mlp``: the MLPs as one node with the native ReLU-mask + bias-gradient pass (nn/mlp_native.py).
- ``interaction``: the rows passed as a (B, F, D) view (one copy instead of two); for dot the pair copies as a
  native kernel (nn/pair_dots_native.py), for DCN the low-rank cross net as one node with native element-wise
  passes (nn/crossnet_native.py).
- ``optimizer``: row-wise Adagrad's coalescing summed by the native scatter loop (nn/embedding_update.py) instead
  of ``index_add_``.
- ``all``: all three.

Reported per interaction: the median CPU ms per step of each arm, the median of the per-step ratios before / arm,
and the largest weight difference from ``before`` after the last step (0.0: the same floats). Run with one thread
(the default here) on a busy machine; state ``uptime`` with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import _step_ab
import dlrm_throughput as bench
import torch


def _before_forward(model: Any, batch: Any) -> Any:
    """DLRM.forward as it was (the pooled rows made contiguous (B, F, D) by ``stacked()``)."""
    from ctrkit.models.base import ModelOutput

    dense = model.dense_arch(batch.dense) if model.dense_arch is not None else None
    kj = batch.sparse if batch.sparse.keys == model.sparse_keys else batch.sparse.select(model.sparse_keys)
    sparse = model.sparse_arch(kj).stacked()
    z = model.interaction_arch(dense, sparse)
    return ModelOutput(model.over_arch(z).squeeze(-1), {})


def _arm(data: Path, interaction: str, name: str) -> tuple[Any, Any, Any]:
    from ctrkit.nn.mlp import MLP

    model, opt, task, _ = bench.build(data, interaction, "fp32", 0, "cpu")
    model.train()
    if name not in ("mlp", "all"):
        for m in model.modules():
            if isinstance(m, MLP):
                m._relu_stack = None
    if name not in ("interaction", "all"):
        model.forward = types.MethodType(_before_forward, model)
    return model, opt, task


def run(data: Path, interaction: str, steps: int, warmup: int) -> dict:
    import ctrkit.nn.interaction as inter
    from ctrkit.nn import crossnet, embedding_update
    from ctrkit.nn.crossnet_native import native_low_rank_cross
    from ctrkit.nn.pair_dots_native import native_pair_dots
    from ctrkit.training import optim

    names = ("before", "mlp", "interaction", "optimizer", "all")
    no_scatter = types.SimpleNamespace(scatter_rows=lambda *a: None)
    arms = {n: _arm(data, interaction, n) for n in names}
    _, _, _, batches = bench.build(data, interaction, "fp32", 0, "cpu")

    def before(name: str) -> None:  # the pair kernel and the coalescing loop only in the arms that have them
        inter.native_pair_dots = native_pair_dots if name in ("interaction", "all") else (lambda c, d: None)
        crossnet.native_low_rank_cross = native_low_rank_cross if name in ("interaction", "all") else (lambda x, k: None)
        optim.embedding_update = embedding_update if name in ("optimizer", "all") else no_scatter

    def step(arm: Any, batch: Any) -> None:
        model, opt, task = arm
        loss = task.loss(model, batch)[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    sec = _step_ab.alternate(arms, batches, steps, warmup, step=step, before=before)
    inter.native_pair_dots, optim.embedding_update = native_pair_dots, embedding_update
    crossnet.native_low_rank_cross = native_low_rank_cross
    ref = arms["before"][0]
    out = {}
    for n in names:
        ratios = [b / a for b, a in zip(sec["before"], sec[n])]
        out[n] = {"cpu_ms_per_step": round(statistics.median(sec[n]) * 1e3, 2),
                  "before_over_arm": round(statistics.median(ratios), 3),
                  "max_weight_difference": _step_ab.max_weight_difference(ref, arms[n][0])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--interaction", nargs="+", default=["dot", "dcn"], choices=["dot", "dcn"])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rows", type=int, default=45056)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from ctrkit.memory import keep_freed_memory

    keep_freed_memory()
    bench.ensure_peers_and_data(data_only=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = bench.subset(bench.DATA, args.rows, Path(tmp))
        res = {i: run(data, i, args.steps, args.warmup) for i in args.interaction}
    for i, arms in res.items():
        for n, r in arms.items():
            print(f"{i} {n:12s} {r['cpu_ms_per_step']:8.2f} ms/step  before/arm {r['before_over_arm']:.3f}  "
                  f"max |w - w_before| {r['max_weight_difference']:.3g}")
    print(json.dumps({"threads": args.threads, "steps": args.steps, "load_average": os.getloadavg(), "runs": res}))


if __name__ == "__main__":
    sys.exit(main())
