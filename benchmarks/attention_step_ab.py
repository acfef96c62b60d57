"""AutoInt's training step with the plain and the fused interacting layer, alternated step by step in one process.

    python benchmarks/attention_step_ab.py --store OUT/criteo --config configs/criteo/autoint.yaml [--steps 300]

``--store``: a directory with the ``train`` store of a prepared dataset (``deepctr_compare.py --out OUT`` leaves
``OUT/criteo`` / ``OUT/movielens``). Two models are built from the same seed and config (the matched recipe's
settings: one thread, DeepCTR's L2 strength); one runs every ``MultiHeadSelfAttention`` on its plain path, the
other on the fused one (:mod:`ctrkit.nn.field_attention`). Their steps alternate (the order flips every step) on
the same batches, so drift in the machine's load reaches both; the medians of the per-step CPU seconds and
their ratio are printed, with the load average. Ends with one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
from _step_ab import alternate, build_trainer

REPO = Path(__file__).resolve().parent.parent


def build(store: Path, config: Path, plain: bool) -> tuple[object, list[object]]:
    """A Trainer of ``config`` on ``store``'s train split (the matched recipe's L2) and its full batches;
    ``plain``: the attention's plain path."""
    from ctrkit.nn.attention import MultiHeadSelfAttention

    def plain_path(model: object) -> None:
        for m in model.modules():  # type: ignore[attr-defined]
            if isinstance(m, MultiHeadSelfAttention):
                m._fused = lambda emb: False  # type: ignore[method-assign]

    trainer, loader = build_trainer(store, config, matched_l2=True, patch=plain_path if plain else None)
    return trainer, list(loader)[:-1]  # full batches only


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="directory holding the prepared 'train' store")
    ap.add_argument("--config", default=str(REPO / "configs" / "criteo" / "autoint.yaml"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args(argv)
    if not (Path(a.store) / "train").is_dir():
        ap.error(f"--store {a.store}: no 'train' store there; run benchmarks/deepctr_compare.py --out DIR first "
                 "and pass DIR/criteo or DIR/movielens")
    torch.set_num_threads(1)
    trainers = {"plain": build(Path(a.store), Path(a.config), True), "fused": build(Path(a.store), Path(a.config), False)}
    seconds = alternate({k: v[0] for k, v in trainers.items()}, trainers["plain"][1], a.steps, a.warmup)
    med = {k: statistics.median(v) * 1e3 for k, v in seconds.items()}
    load = os.getloadavg()
    sys.stdout.write(f"{a.config}: median CPU ms per step, plain {med['plain']:.2f}, fused {med['fused']:.2f}, "
                     f"ratio {med['plain'] / med['fused']:.3f} ({a.steps} steps each, load average "
                     f"{load[0]:.1f} / {load[1]:.1f})\n")
    sys.stdout.write("RESULT " + json.dumps({"config": a.config, "steps": a.steps, "median_ms": med,
                                             "ratio": med["plain"] / med["fused"], "loadavg": load}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
