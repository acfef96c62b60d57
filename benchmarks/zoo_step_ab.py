"""A/B of two MovieLens-zoo speedups in one process, CPU ms (median), one thread.

    python benchmarks/zoo_step_ab.py --store OUT/movielens [--models wide_deep deepfm] [--steps 200]

OUT from ``benchmarks/deepctr_compare.py --dataset movielens --out OUT``.

- ``joint``: per model, two identical trainers (the matched recipe of deepctr_compare.py, seed 0) take training
  steps alternately on the same batches, one with the linear term and the field embeddings looked up together
  (:func:`ctrkit.nn.embedding_joint.pooled_pair`), one with each looked up on its own; prints both medians and
  whether the two models' weights are still identical at the end (they should be: the same arithmetic).
- ``bilinear``: FiBiNET's two field_interaction layers + the dense column, forward + backward, the plain layers
  and concat against :func:`ctrkit.nn.bilinear_pairs.bilinear_pairs_concat`, at MovieLens' (B 1,024, 9 fields)
  and Criteo's (B 256, 26 fields) shapes, D 16.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

import torch
from _step_ab import alternate, build_trainer, cpu_ms

from ctrkit.data.storage.loader import BatchLoader
from ctrkit.nn import inputs
from ctrkit.nn.bilinear_pairs import bilinear_pairs_concat
from ctrkit.nn.senet import BilinearInteraction
from ctrkit.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]


def trainer(name: str, store: Path) -> tuple[Trainer, BatchLoader]:
    t, loader = build_trainer(store, REPO / "configs" / "movielens" / f"{name}.yaml",
                              overrides=["train.early_stopping.patience=0"], matched_l2=True)
    t.module.train()
    return t, loader


def joint_ab(name: str, store: Path, steps: int) -> dict[str, Any]:
    joint_fn = inputs.pooled_pair
    (a, loader), (b, _) = trainer(name, store), trainer(name, store)
    batches = [x for _, x in zip(range(len(loader)), loader)]
    fns = {"joint": joint_fn, "separate": lambda *_: None}

    def swap(arm: str) -> None:  # the joint lookup on, or off (each collection looked up on its own)
        inputs.pooled_pair = fns[arm]

    ms = alternate({"joint": a, "separate": b}, batches, steps - 10, 10, step=lambda t, x: t._train_step(x),
                   before=swap)
    inputs.pooled_pair = joint_fn
    same = all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    j, sep = (statistics.median(ms[k]) * 1e3 for k in ("joint", "separate"))
    print(f"{name}: separate {sep:.2f} ms, joint {j:.2f} ms per step ({sep / j:.3f}x); weights identical after "
          f"{steps} steps: {same}", flush=True)
    return {"separate_ms": sep, "joint_ms": j, "ratio": sep / j, "weights_identical": same}



def bilinear_case(b: int, f: int, nd: int) -> tuple[float, float]:
    """(plain, one node) CPU ms of both layers + the dense column, forward + backward, at (B, F, Nd)."""
    layers = [BilinearInteraction(f, 16) for _ in range(2)]
    embs = [torch.randn(b, f, 16, requires_grad=True) for _ in range(2)]
    dense = torch.randn(b, nd)
    up = torch.randn(b, 2 * layers[0].out_features + nd)

    def plain() -> None:
        torch.cat([layers[0](embs[0]).flatten(1), layers[1](embs[1]).flatten(1), dense], 1).backward(up)

    def fused() -> None:
        bilinear_pairs_concat(embs, [m.weight for m in layers], dense).backward(up)

    return cpu_ms(plain), cpu_ms(fused)


def bilinear_ab() -> dict[str, dict[str, float]]:
    out = {}
    for b, f, nd in ((1024, 9, 1), (256, 26, 13)):
        plain, fused = bilinear_case(b, f, nd)
        print(f"bilinear B {b}, F {f}: plain {plain:.2f} ms, one node {fused:.2f} ms ({plain / fused:.2f}x)",
              flush=True)
        out[f"B{b}_F{f}"] = {"plain_ms": plain, "one_node_ms": fused}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="OUT/movielens of deepctr_compare.py --out OUT")
    ap.add_argument("--models", nargs="*", default=["wide_deep", "deepfm"])
    ap.add_argument("--steps", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(1)
    load0 = os.getloadavg()[0]
    print(f"load average {load0:.1f}", flush=True)
    out: dict[str, Any] = {"benchmark": "zoo_step_ab", "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                           "threads": 1, "precision": "fp32", "steps": a.steps}
    out["joint_lookup"] = {m: joint_ab(m, a.store, a.steps) for m in a.models}
    out["bilinear"] = bilinear_ab()
    out["load_average"] = [load0, os.getloadavg()[0]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
