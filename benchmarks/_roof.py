"""The machine's roof, shared by every benchmark: what the CPU can do, measured in the same run.

A benchmark's samples/s alone does not say how close it is to the hardware; this module gives it three
numbers to print beside the ratio against its peer:

- the CPU: torch's dispatch capability (``torch.backends.cpu.get_cpu_capability()``: DEFAULT, AVX2, AVX512,
  AVX512_BF16...) and the /proc/cpuinfo flags that decide bf16 speed: ``avx512_bf16`` (bf16 dot products in
  AVX-512) and ``amx_bf16`` / ``amx_tile`` (Intel AMX tiles). A hypervisor may hide flags the chip has.
- the matmul roof: GFLOP/s of a ``(4096, 512) @ (512, 512)`` matmul in fp32 and in bf16 on the benchmark's
  threads, the best of a few short timing windows (about 0.2 s each), measured in the same run as the
  benchmark (a roof taken on another day, or another load, is not the same machine).
- FLOPs per sample of the workload: counted by ``torch.utils.flop_counter.FlopCounterMode`` over one forward
  (and backward, for training) pass of the real model on a real batch, divided by the batch size. It counts
  the matmul-like ops (mm, addmm, bmm, convolutions, attention) and nothing else: embedding gathers, element-wise
  ops and the optimizer are free by this count, so ``achieved / roof`` is the share of the matmul roof the whole
  step reaches, overheads included. The count runs with ctrkit's native kernels off (``CTRKIT_NATIVE_KERNELS=0``,
  :mod:`ctrkit.nn.kernels`): the counter cannot see inside them, so a model keeps one count whichever path it
  trains on (the torch-op path's products).

``achieved / roof = samples_per_s * flops_per_sample / (roof GFLOP/s * 1e9)``, against the fp32 roof for an
fp32 run and the bf16 roof for a bf16 run.

Use::

    roof = measure(threads)                        # {"cpu": {...}, "threads": 2, "fp32_gflops": .., "bf16_gflops": ..}
    f = training_flops(model, batch, loss_fn)      # FLOPs per sample, forward + backward
    print(roof_line(roof, f, samples_per_s, "fp32", peer_ratio=1.3))
    result["roof"] = roof_summary(roof, f, samples_per_s, "fp32")
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

log = logging.getLogger(__name__)

ROOF_SHAPE = (4096, 512, 512)  # (M, K, N): the DLRM MLPs' widest layers at batch 4096
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")


def cpu_flags(path: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU flags of the first processor listed in ``path`` (empty when it cannot be read: not Linux)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_info() -> dict[str, Any]:
    """The CPU as a benchmark reports it: capability, bf16 / AMX flags, model name, cores and torch threads."""
    flags = cpu_flags()
    name = ""
    try:
        name = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"capability": torch.backends.cpu.get_cpu_capability(), "model_name": name,
            "avx512_bf16": "avx512_bf16" in flags, "amx": {"amx_bf16", "amx_tile"} <= flags,
            "flags": sorted(flags & set(CPU_FLAGS)), "cores": os.cpu_count(), "torch": torch.__version__}


def matmul_gflops(dtype: torch.dtype, threads: int | None = None, shape: Sequence[int] = ROOF_SHAPE,
                  windows: int = 5, window_s: float = 0.2) -> float:
    """GFLOP/s of ``(M, K) @ (K, N)`` in ``dtype``: the best of ``windows`` timing windows of ``window_s``.

    The best window, not the mean: a roof is what the hardware can do, and a window slowed by another process is
    the load, not the machine. ``threads`` sets torch's intra-op threads for the measurement and restores them.
    """
    M, K, N = shape
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randn(M, K, generator=g).to(dtype)
        b = torch.randn(K, N, generator=g).to(dtype)
        out = torch.empty(M, N, dtype=dtype)
        for _ in range(3):  # warm-up: kernel selection, page faults
            torch.mm(a, b, out=out)
        best = 0.0
        for _ in range(windows):
            n, t0 = 0, time.perf_counter()
            while True:
                torch.mm(a, b, out=out)
                n += 1
                dt = time.perf_counter() - t0
                if dt >= window_s:
                    break
            best = max(best, 2.0 * M * K * N * n / dt / 1e9)
        return best
    finally:
        torch.set_num_threads(before)


def measure(threads: int | None = None) -> dict[str, Any]:
    """The CPU and its fp32 / bf16 matmul roofs on ``threads`` (default: torch's current setting)."""
    threads = threads or torch.get_num_threads()
    return {"cpu": cpu_info(), "threads": threads, "shape": list(ROOF_SHAPE),
            "fp32_gflops": round(matmul_gflops(torch.float32, threads), 1),
            "bf16_gflops": round(matmul_gflops(torch.bfloat16, threads), 1)}


def median_roof(roofs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One roof from several measured in the same run (e.g. one per interleaved repetition): the medians."""
    if not roofs:
        raise ValueError("median_roof needs at least one measured roof")
    out = dict(roofs[-1])
    for k in ("fp32_gflops", "bf16_gflops"):
        out[k] = round(statistics.median(r[k] for r in roofs), 1)
        out[f"{k}_each"] = [r[k] for r in roofs]
    return out


def training_flops(model: torch.nn.Module, batch: Any, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
                   batch_size: int, backward: bool = True) -> float:
    """FLOPs per sample of one training step's forward (+ backward) of ``model`` on ``batch``.

    ``loss_fn(model, batch)`` returns the scalar loss. The gradients it leaves are cleared, so the model is as
    it was (no optimizer step is taken). Native kernels are off while it counts (the module docstring)."""
    before = os.environ.get("CTRKIT_NATIVE_KERNELS")
    os.environ["CTRKIT_NATIVE_KERNELS"] = "0"
    try:
        with FlopCounterMode(display=False) as counter:
            if backward:
                loss_fn(model, batch).backward()
            else:
                with torch.no_grad():
                    loss_fn(model, batch)
    finally:
        if before is None:
            del os.environ["CTRKIT_NATIVE_KERNELS"]
        else:
            os.environ["CTRKIT_NATIVE_KERNELS"] = before
    if backward:
        model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / batch_size


def model_flops_from_config(config: str | Path, store: str | Path, batch_size: int = 256,
                            backward: bool = True, overrides: list[str] | None = None) -> float:
    """FLOPs per training sample of the model of a ctrkit config (with ``overrides``, ``key=value`` as on the command
    line), on the first ``batch_size`` rows of ``store``."""
    from ctrkit.data.storage.loader import BatchLoader
    from ctrkit.data.storage.store import Store
    from ctrkit.models.registry import create_model
    from ctrkit.training.config import load_config
    from ctrkit.training.tasks import ranking_task

    cfg = load_config(config, overrides or [])
    loader = BatchLoader(Store(store), batch_size, shuffle=False)
    model = create_model(cfg.model.name, loader.store.schema, **cfg.model.params)
    if model.needs_prefit:
        model.prefit(loader)
    batch = next(iter(loader))
    task = ranking_task(cfg.train, None).bind(model)
    model.train()
    return training_flops(model, batch, lambda m, b: task.loss(m, b)[0], len(batch.labels), backward)


def achieved(samples_per_s: float, flops_per_sample: float, roof: dict[str, Any], precision: str = "fp32") -> float:
    """Share of the matmul roof (fp32 or bf16, as ``precision``) that ``samples_per_s`` reaches."""
    return samples_per_s * flops_per_sample / (roof[_roof_key(precision)] * 1e9)


def _roof_key(precision: str) -> str:
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision {precision!r} is not fp32 or bf16")
    return f"{precision}_gflops"


def cpu_line(roof: dict[str, Any]) -> str:
    """``cpu AVX512 (avx512_bf16 yes, amx no), 2 threads; matmul roof fp32 147 GFLOP/s, bf16 397 GFLOP/s``."""
    c = roof["cpu"]
    return (f"cpu {c['capability']} ({c['model_name'] or 'unknown model'}; avx512_bf16 "
            f"{'yes' if c['avx512_bf16'] else 'no'}, amx {'yes' if c['amx'] else 'no'}), {roof['threads']} threads; "
            f"matmul roof {'x'.join(map(str, roof['shape']))} fp32 {roof['fp32_gflops']:.0f} GFLOP/s, "
            f"bf16 {roof['bf16_gflops']:.0f} GFLOP/s (same run)")


def roof_line(roof: dict[str, Any], flops_per_sample: float, samples_per_s: float, precision: str = "fp32",
              peer_ratio: float | None = None, label: str = "") -> str:
    """One line: FLOPs per sample, achieved GFLOP/s, achieved / roof and the ratio against the peer."""
    a = achieved(samples_per_s, flops_per_sample, roof, precision)
    peer = f" | {peer_ratio:.2f}x the peer" if peer_ratio is not None else ""
    return (f"{label + ': ' if label else ''}{flops_per_sample / 1e6:.3f} MFLOP/sample x {samples_per_s:,.0f} "
            f"samples/s = {samples_per_s * flops_per_sample / 1e9:.1f} GFLOP/s = {a:.1%} of the {precision} "
            f"roof{peer}")


def roof_summary(roof: dict[str, Any], flops_per_sample: float | None, samples_per_s: float | None,
                 precision: str = "fp32") -> dict[str, Any]:
    """The JSON part: the roof, FLOPs per sample, achieved GFLOP/s and achieved / roof."""
    out: dict[str, Any] = {**roof, "precision": precision, "flops_per_sample": flops_per_sample}
    if flops_per_sample and samples_per_s:
        out["achieved_gflops"] = round(samples_per_s * flops_per_sample / 1e9, 2)
        out["achieved_over_roof"] = round(achieved(samples_per_s, flops_per_sample, roof, precision), 4)
    return out


def zoo_roof(roof: dict[str, Any], flops: dict[str, float], rates: dict[str, dict[str, float]],
             write: Callable[[str], Any] = print) -> dict[str, Any]:
    """Roof lines for several models and sides (a zoo benchmark) -> the JSON part.

    ``flops``: model -> FLOPs per training sample; ``rates``: model -> side (library / recipe) -> samples/s (fp32).
    Writes the CPU line, then one line per model and side; returns ``{"roof": ..., "models": {model: {side:
    {"samples_per_s", "achieved_gflops", "achieved_over_roof"}, "flops_per_sample": ...}}}``.
    """
    write(cpu_line(roof))
    models: dict[str, Any] = {}
    for m, sides in rates.items():
        f = flops.get(m)
        models[m] = {"flops_per_sample": f}
        for side, sps in sides.items():
            if f is None or not sps:
                continue
            write(roof_line(roof, f, sps, "fp32", label=f"{m} {side}"))
            models[m][side] = {"samples_per_s": round(sps, 1), "achieved_gflops": round(sps * f / 1e9, 3),
                               "achieved_over_roof": round(achieved(sps, f, roof), 5)}
    return {**roof, "models": models}


def predict_flops(predictor: Any, rows: Sequence[dict[str, Any]]) -> float:
    """FLOPs per row of ``predictor.predict(rows)`` (a serving benchmark's forward pass, no backward)."""
    with FlopCounterMode(display=False) as counter:
        predictor.predict(list(rows))
    return counter.get_total_flops() / max(len(rows), 1)
