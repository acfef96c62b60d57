"""FiBiNET on MovieLens with and without its native kernels, CPU ms (median), one thread, alternated in one process.

    python benchmarks/fibinet_native_ab.py --store OUT/movielens [--steps 200] [--fits 4]

OUT from ``benchmarks/deepctr_compare.py --dataset movielens --out OUT``. Three A/Bs, each alternating its arms:

- ``steps``: training steps of two identical trainers (deepctr_compare.py's matched recipe, seed 0: one bilinear
  layer shared by the raw and the SENET embeddings), one with the native kernels (the shared bilinear node and SENET
  in ``csrc/bilinear_pairs.cpp`` / ``senet_excite.cpp``, the lookup's ids in ``csrc/embedding_ids.cpp``, the small
  tables' gradient and LazyAdam in ``csrc/embedding_update.cpp``), one with ``CTRKIT_NATIVE_KERNELS=0`` (every
  torch-op path);
- ``senet``: the same with the kernels on, SENET inside the bilinear node against SENET as modules;
- ``fits``: ``--fits`` whole one-epoch fits per arm through deepctr_compare.py's ``run_ctrkit`` (what its fit
  CPU seconds time), kernels on / off, the order alternated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _step_ab import alternate, build_trainer, max_weight_difference, native_kernels

import ctrkit.models.fibinet as fibinet_module
from ctrkit.memory import keep_freed_memory
from ctrkit.nn.senet import bilinear_shared_concat

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "movielens" / "fibinet.yaml"
MATCHED = ["train.early_stopping.patience=0", "model.params.bilinear_shared=true"]


def step_ab(store: Path, steps: int, arms: dict[str, Callable[[], None]]) -> dict[str, float]:
    """Median CPU ms per training step of each arm (``arms[name]()`` runs untimed before each of its steps)."""
    trainers = {name: build_trainer(store, CONFIG, overrides=MATCHED, matched_l2=True)[0] for name in arms}
    _, loader = build_trainer(store, CONFIG, overrides=MATCHED, matched_l2=True)
    batches = [x for _, x in zip(range(len(loader)), loader)]
    ms = alternate(trainers, batches, steps, 10, step=lambda t, x: t._train_step(x), before=lambda n: arms[n]())
    out = {name: statistics.median(v) * 1e3 for name, v in ms.items()}
    out["max_weight_difference"] = max_weight_difference(*(t.model for t in trainers.values()))
    return out


def senet_as_modules() -> Callable[..., torch.Tensor]:
    return lambda senet, layer, emb, tail: bilinear_shared_concat(layer, emb, senet.field_weights(emb), tail)


def fit_ab(store: Path, fits: int) -> dict[str, list[float]]:
    import deepctr_compare

    stores = {s: str(store / s) for s in ("train", "valid", "test")}
    out: dict[str, list[float]] = {"native": [], "torch ops": []}
    for r in range(fits):
        for arm in ("native", "torch ops") if r % 2 == 0 else ("torch ops", "native"):
            native_kernels(arm == "native")
            out[arm].append(deepctr_compare.run_ctrkit(CONFIG, stores, 0, 1)["cpu_seconds"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="OUT/movielens of deepctr_compare.py --out OUT")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--fits", type=int, default=4, help="one-epoch fits per arm (0: none)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    keep_freed_memory()  # as ctrkit train and deepctr_compare.py
    load0 = os.getloadavg()[0]
    print(f"load average {load0:.1f}", flush=True)
    out: dict[str, Any] = {"benchmark": "fibinet_native_ab", "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                           "threads": 1, "precision": "fp32", "steps": a.steps}
    out["steps_ab"] = step_ab(a.store, a.steps, {"native": lambda: native_kernels(True),
                                                 "torch ops": lambda: native_kernels(False)})
    print("steps, kernels on / off:", {k: round(v, 3) for k, v in out["steps_ab"].items()}, flush=True)
    fused, modules = fibinet_module.senet_bilinear_shared_concat, senet_as_modules()

    def use(fn: Callable[..., torch.Tensor]) -> Callable[[], None]:
        def swap() -> None:
            native_kernels(True)
            fibinet_module.senet_bilinear_shared_concat = fn
        return swap

    out["senet_ab"] = step_ab(a.store, a.steps, {"senet in the node": use(fused), "senet as modules": use(modules)})
    fibinet_module.senet_bilinear_shared_concat = fused
    print("steps, SENET in the node / as modules:", {k: round(v, 3) for k, v in out["senet_ab"].items()}, flush=True)
    if a.fits:
        out["fits_cpu_s"] = fit_ab(a.store, a.fits)
        print("one-epoch fits, CPU s:", out["fits_cpu_s"], flush=True)
    native_kernels(True)
    out["load_average"] = [load0, os.getloadavg()[0]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
