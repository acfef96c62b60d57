"""DLRM training speed on one GPU, NVIDIA DeepLearningExamples' "small" configuration, synthetic Criteo-1TB shapes.

    python benchmarks/dlrm_gpu.py [--batch 65536] [--steps 200] [--max-rows 4000000] [--mode graph|compile|eager]
                                  [--precision bf16|fp32] [--smoke]

The model is ctrkit's DLRM (``create_model("dlrm", ...)``): embedding dim 128 for the 26 tables, dense arch
13-512-256-128, dot interaction, over arch 1024-1024-512-256-1 (NVIDIA's "small" DLRM, the one their published
4.02M samples/s on one A100-80GB is for), batch 65,536, bf16 autocast with float32 weights. Tables have the
Criteo-1TB cardinalities (MLPerf's day-0..23 counts), each capped at ``--max-rows`` to fit the GPU (the full
tables are ~116 GB in fp32).

The step is written for the GPU; what differs from ``Trainer``'s generic step, and why:

- no host synchronisation anywhere in the step: the ids are drawn in range (the table's id check, a
  device-to-host read, is off), no sparse COO gradients (their coalescing needs the unique-row count on the
  host): the embedding rows are gathered from the fused table (``index_select``), their gradient comes back
  as a dense ``[B*F, D]`` tensor and SGD adds it into the table with one ``index_add_`` (duplicates summed by
  atomics: the same update as sparse SGD);
- the dense parameters: torch's fused SGD (NVIDIA's small config trains everything with SGD);
- the whole step (forward, backward, both updates) captured once as a CUDA graph (``--mode graph``) and replayed,
  so the CPU launches one graph per step instead of ~100 kernels; ``--mode compile`` uses ``torch.compile``
  (mode "max-autotune-no-cudagraphs") on the dense arches instead, ``--mode eager`` neither;
- data: ``--pool`` batches generated on the device beforehand (untimed), copied into the graph's static inputs
  each step (a device-to-device copy, timed).

Prints samples/s, achieved TFLOP/s (FLOPs per sample counted by ``torch.utils.flop_counter``), achieved / the
GPU's datasheet dense bf16 peak and / a bf16 matmul measured in the same run, and NVIDIA's published figure for
comparison. ``--smoke``: tiny tables and batch, a few eager steps; runs on the CPU, so it is known to work
where no GPU is (tests/test_dlrm_gpu_smoke.py).

Ends with ONE line ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

# Criteo-1TB (24 days) categorical cardinalities, as in MLPerf's DLRM reference (--max-ind-range 40M)
TB_CARDINALITIES = (39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208,
                    11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36)
NVIDIA_A100_SAMPLES_PER_S = 4.02e6  # DeepLearningExamples DLRM "small", 1x A100-80GB, AMP, batch 65,536
# dense (no sparsity) bf16 tensor-core peaks from the vendor's datasheets, TFLOP/s
BF16_PEAK_TFLOPS = {"H200": 989.4, "H100 SXM": 989.4, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.4,
                    "A100": 312.0, "L40S": 362.0, "A10": 125.0}


def bf16_peak(name: str) -> float | None:
    """The datasheet dense bf16 peak (TFLOP/s) of a GPU named ``name`` (torch.cuda.get_device_name), if known."""
    for key in sorted(BF16_PEAK_TFLOPS, key=len, reverse=True):
        if key in name:
            return BF16_PEAK_TFLOPS[key]
    return None


def build(max_rows: int, dim: int, device: torch.device) -> tuple[Any, list[int]]:
    from ctrkit.models.registry import create_model
    from ctrkit.schema import DenseFeature, Schema, SparseFeature

    cards = [min(c, max_rows) for c in TB_CARDINALITIES]
    schema = Schema(dense=[DenseFeature(f"I{i + 1}") for i in range(13)],
                    sparse=[SparseFeature(f"C{j + 1}", c, dim) for j, c in enumerate(cards)])
    model = create_model("dlrm", schema, dense_arch=(512, 256), over_arch=(1024, 1024, 512, 256),
                         interaction="dot").to(device)
    return model, cards


def make_pool(n: int, batch: int, cards: list[int], offsets: torch.Tensor, device: torch.device) -> list[tuple]:
    """``n`` batches on the device: dense (B, 13), ids (B, F) already shifted into the fused table, labels (B,)."""
    g = torch.Generator(device=device).manual_seed(0)
    hi = torch.tensor(cards, device=device, dtype=torch.float64)
    pool = []
    for _ in range(n):
        u = torch.rand(batch, len(cards), generator=g, device=device, dtype=torch.float64)
        ids = (u * hi).long() + offsets  # (B, F) uniform within each table
        dense = torch.rand(batch, 13, generator=g, device=device).mul_(5.0)
        labels = (torch.rand(batch, generator=g, device=device) < 0.25).float()
        pool.append((dense, ids, labels))
    return pool


class Step:
    """One training step on static inputs: forward, loss, backward, row SGD on the table, fused SGD on the rest."""

    def __init__(self, model: Any, precision: str, lr: float, batch: int, dim: int, device: torch.device) -> None:
        self.model, self.lr, self.dim = model, lr, dim
        self.table = next(model.sparse_arch.embedding_parameters())  # the fused [sum of rows, D] weight
        self.table.requires_grad_(False)  # updated by hand below
        dense = [p for n, p in model.named_parameters() if not n.startswith("sparse_arch")]
        self.opt = torch.optim.SGD(dense, lr=lr, fused=device.type in ("cuda", "cpu"))
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16",
                                       cache_enabled=False)  # no weight-cast cache across a CUDA graph's capture
        F = len(model.sparse_keys)
        self.dense = torch.zeros(batch, 13, device=device)
        self.ids = torch.zeros(batch, F, dtype=torch.long, device=device)
        self.labels = torch.zeros(batch, device=device)

    def loss(self) -> tuple[torch.Tensor, torch.Tensor]:
        m, B = self.model, self.ids.shape[0]
        flat = self.ids.view(-1)
        rows = self.table.index_select(0, flat).view(B, -1, self.dim).requires_grad_()  # (B, F, D)
        with self.autocast:
            d = m.dense_arch(self.dense)  # (B, D)
            z = m.interaction_arch(d, rows)  # (B, N)
            logits = m.over_arch(z).squeeze(-1)  # (B,)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), self.labels), rows

    def __call__(self) -> torch.Tensor:
        loss, rows = self.loss()
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        self.opt.step()
        with torch.no_grad():  # sparse SGD: every looked-up row gets its (summed) gradient
            self.table.index_add_(0, self.ids.view(-1), rows.grad.view(-1, self.dim), alpha=-self.lr)
        return loss.detach()


def flops_per_sample(step: Step) -> float:
    with FlopCounterMode(display=False) as counter:
        loss, _ = step.loss()
        loss.backward()
    step.opt.zero_grad(set_to_none=False)
    return counter.get_total_flops() / step.ids.shape[0]


def measured_matmul_tflops(device: torch.device, n: int = 8192) -> float | None:
    """bf16 ``n x n x n`` matmul TFLOP/s on the GPU (best of 5 timings of 10), None on the CPU."""
    if device.type != "cuda":
        return None
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    best = 0.0
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            a @ b
        end.record()
        end.synchronize()
        best = max(best, 2 * n**3 * 10 / (start.elapsed_time(end) / 1e3) / 1e12)
    return best


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.mode == "graph" and device.type != "cuda":
        raise SystemExit("--mode graph needs a CUDA device (CUDA graphs); use --mode eager on the CPU (--smoke does)")
    torch.manual_seed(0)
    model, cards = build(args.max_rows, args.dim, device)
    sa = model.sparse_arch
    offsets = torch.tensor([sa.row_offset[sa.feature_to_table[k]] for k in model.sparse_keys], device=device)
    pool = make_pool(args.pool, args.batch, cards, offsets, device)
    step = Step(model, args.precision, args.lr, args.batch, args.dim, device)
    if args.mode == "compile":
        model.dense_arch = torch.compile(model.dense_arch, mode="max-autotune-no-cudagraphs")
        model.over_arch = torch.compile(model.over_arch, mode="max-autotune-no-cudagraphs")
    fps = flops_per_sample(step)

    def load(i: int) -> None:
        d, ids, y = pool[i % len(pool)]
        step.dense.copy_(d, non_blocking=True)
        step.ids.copy_(ids, non_blocking=True)
        step.labels.copy_(y, non_blocking=True)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t_setup = time.perf_counter()
    run_step = step
    if args.mode == "graph":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks before capture
            for i in range(3):
                load(i)
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = step()
        run_step = lambda: (graph.replay(), static_loss)[1]
    else:
        for i in range(args.warmup):
            load(i)
            step()
    sync()
    setup_s = time.perf_counter() - t_setup
    losses = []
    t0 = time.perf_counter()
    for i in range(args.steps):
        load(i)
        loss = run_step()
        if i in (0, args.steps - 1):
            losses.append(loss.clone())
    sync()
    dt = time.perf_counter() - t0
    sps = args.steps * args.batch / dt
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = bf16_peak(name) if device.type == "cuda" else None
    mm = measured_matmul_tflops(device)
    return {"device": name, "mode": args.mode, "precision": args.precision, "batch": args.batch, "steps": args.steps,
            "max_rows": args.max_rows, "table_rows": sum(cards), "embedding_dim": args.dim,
            "samples_per_s": round(sps, 1), "seconds": round(dt, 4), "setup_seconds": round(setup_s, 2),
            "flops_per_sample": fps, "achieved_tflops": round(sps * fps / 1e12, 3),
            "bf16_peak_tflops": peak, "achieved_over_peak": round(sps * fps / 1e12 / peak, 4) if peak else None,
            "matmul_bf16_tflops_measured": round(mm, 1) if mm else None,
            "achieved_over_measured_matmul": round(sps * fps / 1e12 / mm, 4) if mm else None,
            "nvidia_a100_samples_per_s": NVIDIA_A100_SAMPLES_PER_S,
            "ratio_to_nvidia_a100": round(sps / NVIDIA_A100_SAMPLES_PER_S, 3),
            "first_loss": round(float(losses[0]), 4), "last_loss": round(float(losses[-1]), 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before the clock (eager / compile)")
    ap.add_argument("--pool", type=int, default=8, help="distinct batches generated on the device")
    ap.add_argument("--max-rows", type=int, default=4_000_000, help="rows per table at most (fit the GPU)")
    ap.add_argument("--dim", type=int, default=128, help="embedding dim (NVIDIA small: 128)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--mode", default="graph", choices=("graph", "compile", "eager"))
    ap.add_argument("--device", help="default: cuda when available, else cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny tables and batch, 3 eager steps (any device)")
    a = ap.parse_args(argv)
    if a.smoke:
        a.batch, a.steps, a.warmup, a.pool, a.max_rows, a.dim, a.mode = 64, 2, 1, 2, 1000, 16, "eager"
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    r = run(a)
    print(f"{r['device']} {r['mode']} {r['precision']} batch {r['batch']}: {r['samples_per_s']:,.0f} samples/s, "
          f"{r['flops_per_sample'] / 1e6:.2f} MFLOP/sample -> {r['achieved_tflops']:.1f} TFLOP/s"
          + (f" = {r['achieved_over_peak']:.1%} of the {r['bf16_peak_tflops']} TFLOP/s bf16 peak" if r["bf16_peak_tflops"]
             else "")
          + (f", {r['achieved_over_measured_matmul']:.1%} of a measured bf16 matmul ({r['matmul_bf16_tflops_measured']}"
             " TFLOP/s)" if r["matmul_bf16_tflops_measured"] else "")
          + f"; NVIDIA's A100-80GB figure {NVIDIA_A100_SAMPLES_PER_S / 1e6:.2f}M -> ratio {r['ratio_to_nvidia_a100']:.3f};"
          f" loss {r['first_loss']} -> {r['last_loss']}", flush=True)
    print("RESULT " + json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
