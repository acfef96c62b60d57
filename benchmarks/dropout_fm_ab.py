"""A/B of two training-path layers in one process, CPU ms (median), one thread: ctrkit's Dropout (a 31-bit integer
mask, :mod:`ctrkit.nn.dropout`) against ``torch.nn.Dropout``, and FMInteraction's one-node training path against
autograd through its formula.

    python benchmarks/dropout_fm_ab.py --store OUT/movielens [--models deepfm pnn] [--steps 200]

OUT from ``benchmarks/deepctr_compare.py --dataset movielens --out OUT``.

- ``layers``: each layer alone, forward + backward: dropout p 0.1 on (1,024, 256), the FM term on (1,024, 9, 16).
- per model: two trainers of the matched recipe (seed 0) take training steps alternately on the same batches
  (:func:`_step_ab.alternate`), the ``torch`` arm with its MLP dropouts swapped for ``torch.nn.Dropout`` and its FM
  term through the plain formula, the ``ctrkit`` arm as built. Both change the arithmetic (other dropout draws;
  the FM sums in another order), so the arms' weights drift apart: the script prints how far.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import types
from pathlib import Path

import torch
from _step_ab import alternate, build_trainer, cpu_ms, max_weight_difference
from torch import nn

from ctrkit.nn import fm
from ctrkit.nn.dropout import Dropout

REPO = Path(__file__).resolve().parents[1]


def as_torch(model: nn.Module) -> None:
    """``model`` with torch's dropout layers in its Sequentials and FM terms through the formula (the ``torch`` arm)."""
    for m in model.modules():
        if isinstance(m, fm.FMInteraction):
            m._with_gradient = types.MethodType(lambda self, e: fm._fm_second_order(e), m)
        if isinstance(m, nn.Sequential):
            for i, layer in enumerate(m):
                if isinstance(layer, Dropout):
                    m[i] = nn.Dropout(layer.p)



def layers_ab() -> dict[str, float]:
    x, g = torch.randn(1024, 256, requires_grad=True), torch.randn(1024, 256)
    mine, theirs = Dropout(0.1).train(), nn.Dropout(0.1).train()
    d = a, b = cpu_ms(lambda: theirs(x).backward(g), 200), cpu_ms(lambda: mine(x).backward(g), 200)
    print(f"dropout p 0.1 (1024, 256) fwd+bwd: torch {a:.3f} ms, ctrkit {b:.3f} ms ({a / b:.2f}x)", flush=True)
    e, g1 = torch.randn(1024, 9, 16, requires_grad=True), torch.randn(1024, 1)
    term = fm.FMInteraction()
    a, b = cpu_ms(lambda: fm._fm_second_order(e).backward(g1), 200), cpu_ms(lambda: term(e).backward(g1), 200)
    print(f"FM (1024, 9, 16) fwd+bwd: formula {a:.3f} ms, one node {b:.3f} ms ({a / b:.2f}x)", flush=True)
    return {"dropout_torch_ms": d[0], "dropout_ctrkit_ms": d[1], "fm_formula_ms": a, "fm_node_ms": b}


def model_ab(name: str, store: Path, steps: int) -> dict[str, float]:
    config = REPO / "configs" / "movielens" / f"{name}.yaml"
    over = ["train.early_stopping.patience=0"]
    old, loader = build_trainer(store, config, overrides=over, matched_l2=True, patch=as_torch)
    new, _ = build_trainer(store, config, overrides=over, matched_l2=True)
    for t in (old, new):
        t.module.train()
    batches = [x for _, x in zip(range(len(loader) - 1), loader)]  # full batches
    ms = alternate({"torch": old, "ctrkit": new}, batches, steps, 10)
    a, b = (statistics.median(ms[k]) * 1e3 for k in ("torch", "ctrkit"))
    drift = max_weight_difference(old.model, new.model)
    print(f"{name}: torch layers {a:.2f} ms, ctrkit layers {b:.2f} ms per step ({a / b:.3f}x); largest weight "
          f"difference after {steps + 10} steps {drift:.2e}", flush=True)
    return {"torch_ms": a, "ctrkit_ms": b, "ratio": a / b, "max_weight_difference": drift}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True, help="OUT/movielens of deepctr_compare.py --out OUT")
    ap.add_argument("--models", nargs="*", default=["deepfm", "pnn"])
    ap.add_argument("--steps", type=int, default=200)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    load0 = os.getloadavg()[0]
    print(f"load average {load0:.1f}", flush=True)
    out = {"benchmark": "dropout_fm_ab", "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": 1,
           "precision": "fp32", "steps": a.steps, "layers": layers_ab()}
    out["models"] = {m: model_ab(m, a.store, a.steps) for m in a.models}
    out["load_average"] = [load0, os.getloadavg()[0]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
