"""DIEN's training step with ``nn/rnn.py`` as it is and as it was at a git revision, alternated in one process.

    python benchmarks/dien_step_ab.py --store OUT/stores [--baseline main] [--steps 200]

``--store``: a directory with the ``train`` behaviour store (``seq_compare.py --dataset taobao --out OUT`` leaves
``OUT/stores``). Two trainers are built from the same seed and ``configs/taobao/dien.yaml`` (one thread); the
baseline one runs the auxiliary network and loss of ``--baseline``'s ``src/ctrkit/nn/rnn.py`` (loaded from git),
the other this tree's. Their steps alternate (the order flips every step) on the same batches, so drift in the
machine's load reaches both; the medians of the per-step CPU seconds, their ratio, the load average and the
largest weight difference after the run (0 when the arithmetic is the same) are printed. Ends with one
``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
from _step_ab import alternate, build_trainer, module_at

REPO = Path(__file__).resolve().parent.parent


def build(store: Path, config: Path) -> tuple[object, list[object]]:
    trainer, loader = build_trainer(store, config)
    return trainer, list(loader)[:-1]  # full batches only


def main(argv: list[str] | None = None) -> int:
    import ctrkit.models.dien as dien_module

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="directory holding the behaviour 'train' store")
    ap.add_argument("--config", default=str(REPO / "configs" / "taobao" / "dien.yaml"))
    ap.add_argument("--baseline", default="main", help="git revision whose nn/rnn.py is the baseline")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args(argv)
    if not (Path(a.store) / "train").is_dir():
        ap.error(f"--store {a.store}: no 'train' store there; run benchmarks/seq_compare.py --dataset taobao "
                 "--out DIR first and pass DIR/stores")
    torch.set_num_threads(1)
    old = module_at(a.baseline, "src/ctrkit/nn/rnn.py")
    trainers = {"baseline": build(Path(a.store), Path(a.config)), "this": build(Path(a.store), Path(a.config))}
    for m in trainers["baseline"][0].model.modules():  # type: ignore[attr-defined]
        if type(m).__module__ == "ctrkit.nn.rnn":  # AttentionGRU, AuxiliaryNet: the baseline's code
            m.__class__ = getattr(old, type(m).__name__)
    losses = {"baseline": old.dien_auxiliary_loss, "this": dien_module.dien_auxiliary_loss}
    batches = trainers["this"][1]

    def swap(name: str) -> None:  # the auxiliary loss of the arm's own code
        dien_module.dien_auxiliary_loss = losses[name]  # type: ignore[attr-defined]

    seconds = alternate({k: v[0] for k, v in trainers.items()}, batches, a.steps, a.warmup, before=swap)
    dien_module.dien_auxiliary_loss = losses["this"]  # type: ignore[attr-defined]
    params = [dict(trainers[k][0].model.named_parameters()) for k in ("baseline", "this")]  # type: ignore[attr-defined]
    diff = max(float((params[0][n] - p).detach().abs().max()) for n, p in params[1].items())
    med = {k: statistics.median(v) * 1e3 for k, v in seconds.items()}
    load = os.getloadavg()
    sys.stdout.write(f"DIEN step, median CPU ms: baseline ({a.baseline}) {med['baseline']:.2f}, this tree "
                     f"{med['this']:.2f}, ratio {med['baseline'] / med['this']:.3f} ({a.steps} steps each, load "
                     f"average {load[0]:.1f} / {load[1]:.1f}); largest weight difference {diff:.3g}\n")
    sys.stdout.write("RESULT " + json.dumps({"baseline": a.baseline, "steps": a.steps, "median_ms": med,
                                             "ratio": med["baseline"] / med["this"], "max_weight_diff": diff,
                                             "loadavg": load}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
