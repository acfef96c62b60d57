"""The most a DLRM training step could reach of the matmul roof if everything but its GEMMs took no time.

Issue 29 item 2 asks for fp32 >= 85 % of the fp32 roof on ``dlrm_throughput.py``'s workload. ``achieved / roof``
counts only the matmul-like ops' FLOPs (``_roof``), so a step can reach 85 % only if its GEMMs themselves run at
>= 85 % of the roof's ``(4096, 512) @ (512, 512)`` rate. This script measures that ceiling on the real step:

1. builds the benchmark's model, optimizers and batches (``dlrm_throughput.build``: same data, batch 4096, D 16,
   512-256-16 / 512-256-1, dot or DCN) and runs one real training step under a dispatch mode that records every
   ``mm`` / ``addmm`` / ``bmm`` call with its operands' shapes, strides (transposed views included) and dtype;
2. replays each recorded call alone on operands of the same layout, in short windows alternating with windows of
   the roof's own matmul, and takes the best window of each (``_roof.matmul_gflops``'s rule: the best window is
   the machine, a slower one the load), so a call's share of the roof is measured under the load it ran beside;
3. prints per call that share, and the step's **GEMM-only bound**: the FLOPs of all its calls over the time they
   take at those shares of one roof, as a share of the roof. No schedule of the rest of the step (fused
   epilogues, no framework overhead, a perfect optimizer) can beat that bound with these GEMM kernels.

    python benchmarks/dlrm_gemm_bound.py [--interaction dot dcn] [--threads 2] [--windows 6] [--data PATH]

Ends with one JSON line: {"bound": {"dot": ..., "dcn": ...}, "calls": {...}, "roof": {...}}.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _roof
import dlrm_throughput
import torch
from torch.utils._python_dispatch import TorchDispatchMode

log = logging.getLogger("dlrm_gemm_bound")
aten = torch.ops.aten
GEMMS = {aten.mm.default: "mm", aten.addmm.default: "addmm", aten.bmm.default: "bmm"}


class GemmRecorder(TorchDispatchMode):
    """Records every mm / addmm / bmm of what runs under it: (name, [(shape, stride, dtype) per tensor operand])."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[tuple[tuple, tuple, torch.dtype]]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in GEMMS:
            operands = [(tuple(a.shape), tuple(a.stride()), a.dtype) for a in args if isinstance(a, torch.Tensor)]
            self.calls.append((GEMMS[func], operands))
        return func(*args, **(kwargs or {}))


def gemm_flops(name: str, operands: list[tuple[tuple, tuple, torch.dtype]]) -> int:
    """2·M·K·N (times the batch for bmm) of a recorded call; addmm's first operand is the bias."""
    a, b = (operands[1], operands[2]) if name == "addmm" else (operands[0], operands[1])
    if name == "bmm":
        (n, m, k), (_, _, cols) = a[0], b[0]
        return 2 * n * m * k * cols
    (m, k), (_, cols) = a[0], b[0]
    return 2 * m * k * cols


def replay(name: str, operands: list[tuple[tuple, tuple, torch.dtype]]) -> Callable[[], Any]:
    """A closure running the recorded call on fresh operands of the same shapes, strides and dtype."""
    g = torch.Generator().manual_seed(0)
    tensors = []
    for shape, stride, dtype in operands:  # a buffer as long as the layout spans (broadcast biases have stride 0)
        span = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
        tensors.append(torch.randn(span, generator=g).to(dtype).as_strided(shape, stride))
    op = {"mm": torch.mm, "addmm": torch.addmm, "bmm": torch.bmm}[name]
    return lambda: op(*tensors)


def window_seconds(fn: Callable[[], Any], window_s: float) -> float:
    """Seconds per call of ``fn`` over one window of about ``window_s``."""
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= window_s:
            return dt / n


def paired_best(fn: Callable[[], Any], roof_fn: Callable[[], Any], windows: int, window_s: float = 0.1
                ) -> tuple[float, float]:
    """(best seconds per call of ``fn``, best of ``roof_fn``) over alternating windows, so both see the same load."""
    for _ in range(3):
        fn()
        roof_fn()
    best, roof_best = float("inf"), float("inf")
    for _ in range(windows):
        roof_best = min(roof_best, window_seconds(roof_fn, window_s))
        best = min(best, window_seconds(fn, window_s))
    return best, roof_best


def record_step(data: Path, interaction: str) -> tuple[list, int]:
    """The GEMM calls of one real fp32 training step of the benchmark workload, and its batch size."""
    model, opt, task, batches = dlrm_throughput.build(data, interaction, "fp32", 0, "cpu")
    model.train()
    b = batches[1]
    with GemmRecorder() as rec:
        loss = task.loss(model, b)[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return rec.calls, len(b.labels)


def bound(calls: list, batch: int, windows: int) -> dict[str, Any]:
    """Per call its best rate as a share of the roof's rate in the windows beside it, and the step's GEMM-only
    bound: total FLOPs over the time the calls take at those shares of one roof."""
    M, K, N = _roof.ROOF_SHAPE
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    out = torch.empty(M, N)
    roof_flops = 2.0 * M * K * N
    rows, shares, roofs = [], [], []
    for name, ops in calls:
        f = gemm_flops(name, ops)
        t, t_roof = paired_best(replay(name, ops), lambda: torch.mm(a, b, out=out), windows)
        share = (f / t) / (roof_flops / t_roof)
        shares.append((f, share))
        roofs.append(roof_flops / t_roof / 1e9)
        rows.append({"op": name, "shapes": [list(o[0]) for o in ops], "mflop": round(f / 1e6, 2),
                     "ms": round(t * 1e3, 3), "of_roof": round(share, 3)})
    total_f = sum(f for f, _ in shares)
    return {"bound": round(total_f / sum(f / s for f, s in shares), 3), "flops_per_sample": total_f / batch,
            "roof_gflops_best": round(max(roofs), 1), "roof_gflops_median": round(statistics.median(roofs), 1),
            "calls": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--interaction", nargs="+", default=["dot", "dcn"], choices=["dot", "dcn"])
    p.add_argument("--threads", type=int, default=dlrm_throughput.THREADS)
    p.add_argument("--windows", type=int, default=6, help="timing windows per call and per roof (default 6)")
    p.add_argument("--data", default=str(dlrm_throughput.DATA), help="the benchmark's synthetic data (.npz)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not Path(args.data).exists():
        raise SystemExit(f"--data {args.data}: not found; run benchmarks/dlrm_throughput.py once (it makes the data "
                         f"with ../shared/bench/make_data.py) or pass --data")
    torch.set_num_threads(args.threads)
    roof = _roof.measure(args.threads)
    log.info(_roof.cpu_line(roof))
    out: dict[str, Any] = {"bound": {}, "calls": {}, "roof": roof}
    for inter in args.interaction:
        calls, batch = record_step(Path(args.data), inter)
        res = bound(calls, batch, args.windows)
        for r in res["calls"]:
            log.info("%-6s %-32s %8.2f MFLOP %8.3f ms %6.1f %% of the roof", r["op"], " x ".join(
                map(str, r["shapes"])), r["mflop"], r["ms"], 100 * r["of_roof"])
        log.info("%s: %d GEMM calls, %.3f MFLOP/sample: with no time outside its GEMMs the step would reach at most "
                 "%.1f %% of the fp32 roof (roof beside the calls: best %.0f, median %.0f GFLOP/s)", inter,
                 len(calls), res["flops_per_sample"] / 1e6, 100 * res["bound"], res["roof_gflops_best"],
                 res["roof_gflops_median"])
        out["bound"][inter] = res["bound"]
        out["calls"][inter] = res
    print(json.dumps(out))


if __name__ == "__main__":
    main()
