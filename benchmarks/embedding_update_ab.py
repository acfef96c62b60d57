"""A/B of the small tables' native kernel (:mod:`ctrkit.nn.embedding_update`) in real training steps, CPU ms
(median), one thread.

    python benchmarks/embedding_update_ab.py --store OUT/movielens [--dataset movielens] [--models deepfm wide_deep pnn]
        [--steps 200]

OUT from ``benchmarks/deepctr_compare.py --dataset movielens|criteo --out OUT``.

Per model, two trainers of the matched recipe (seed 0) take training steps alternately on the same batches
(:func:`_step_ab.alternate`): the ``native`` arm with the kernel (the lookups' dense gradient scattered in C++,
LazyAdam + the touched-row L2 in one pass), the ``torch`` arm with ``CTRKIT_NATIVE_KERNELS=0`` (``index_add_``,
the masked whole-table LazyAdam). Each step is timed whole and in parts (forward, backward, optimizer step) with
``time.process_time``. The arms' arithmetic differs only in LazyAdam's sqrt (correctly rounded in the kernel, ATen's
vectorised one 1 ulp off for ~0.7 % of values), so their weights drift apart by roundings: printed. Ends with one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _step_ab import alternate, build_trainer, max_weight_difference, native_kernels

from ctrkit.nn import embedding_update

REPO = Path(__file__).resolve().parents[1]
ARMS = ("native", "torch")
PARTS = ("forward", "backward", "optimizer")


def model_ab(dataset: str, name: str, store: Path, steps: int) -> dict[str, Any]:
    config = REPO / "configs" / dataset / f"{name}.yaml"
    trainers = {}
    for arm in ARMS:
        t, loader = build_trainer(store, config, overrides=["train.early_stopping.patience=0"], matched_l2=True)
        t.module.train()
        trainers[arm] = t
    batches = [x for _, x in zip(range(len(loader) - 1), loader)]  # full batches
    parts: dict[str, dict[str, list[float]]] = {a: {p: [] for p in PARTS} for a in ARMS}
    current = {"arm": ARMS[0]}

    def before(arm: str) -> None:  # the arm's code path: the kernel on, or off
        current["arm"] = arm
        native_kernels(arm == "native")

    def step(t: Any, batch: Any) -> None:
        c0 = time.process_time()
        loss, _ = t.module(batch)
        c1 = time.process_time()
        t.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        c2 = time.process_time()
        t.optimizer.step()
        c3 = time.process_time()
        for part, sec in zip(PARTS, (c1 - c0, c2 - c1, c3 - c2)):
            parts[current["arm"]][part].append(sec)

    warmup = 10
    ms = alternate(trainers, batches, steps, warmup, step=step, before=before)
    os.environ.pop("CTRKIT_NATIVE_KERNELS", None)
    out: dict[str, Any] = {}
    for arm in ARMS:
        out[f"{arm}_ms"] = statistics.median(ms[arm]) * 1e3
        out[f"{arm}_parts_ms"] = {p: statistics.median(parts[arm][p][warmup:]) * 1e3 for p in PARTS}
    out["ratio"] = out["torch_ms"] / out["native_ms"]
    out["max_weight_difference"] = max_weight_difference(*(trainers[arm].model for arm in ARMS))
    pn, pt = out["native_parts_ms"], out["torch_parts_ms"]
    print(f"{dataset} {name}: torch {out['torch_ms']:.2f} ms, native {out['native_ms']:.2f} ms per step "
          f"({out['ratio']:.3f}x); backward {pt['backward']:.2f} -> {pn['backward']:.2f}, optimizer "
          f"{pt['optimizer']:.2f} -> {pn['optimizer']:.2f}, forward {pt['forward']:.2f} -> {pn['forward']:.2f}; "
          f"largest weight difference after {steps + warmup} steps {out['max_weight_difference']:.2e}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="OUT/<dataset> of deepctr_compare.py --out OUT")
    ap.add_argument("--dataset", choices=["movielens", "criteo"], default="movielens", help="whose configs/")
    ap.add_argument("--models", nargs="*", default=["deepfm", "wide_deep", "pnn"])
    ap.add_argument("--steps", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if not embedding_update.kernel_available():
        raise SystemExit("embedding_update_ab.py: the native kernel is not available here (no C++ compiler, or "
                         "CTRKIT_NATIVE_KERNELS=0); nothing to compare")
    load0 = os.getloadavg()[0]
    print(f"load average {load0:.1f}", flush=True)
    out: dict[str, Any] = {"benchmark": "embedding_update_ab", "dataset": a.dataset,
                           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": 1,
                           "precision": "fp32", "steps": a.steps}
    out["models"] = {m: model_ab(a.dataset, m, a.store, a.steps) for m in a.models}
    out["load_average"] = [load0, os.getloadavg()[0]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
