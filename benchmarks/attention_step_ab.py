"""AutoInt's training step with the plain interacting layer, the fused one of a git revision and this tree's fused
one, alternated step by step in one process; ``--profile``: where one step's time goes.

    python benchmarks/attention_step_ab.py --store OUT/criteo --config configs/criteo/autoint.yaml \
        [--baseline main] [--no-plain] [--no-node] [--steps 300] [--profile]

``--store``: a directory with the ``train`` store of a prepared dataset (``deepctr_compare.py --out OUT`` leaves
``OUT/criteo`` / ``OUT/movielens``). Models are built from the same seed and config (the matched recipe's
settings: one thread, DeepCTR's L2 strength); one runs every ``MultiHeadSelfAttention`` on its plain path, one
(``--baseline REV``) on the fused node of REV's ``src/ctrkit/nn/field_attention.py`` (loaded from git), one on this
tree's torch-op node (``node``: :mod:`ctrkit.nn.field_attention`, the native kernel kept out), one on what this
tree trains with (``fused``: the native kernel of :mod:`ctrkit.nn.field_attention_lanes` where it builds). Their
steps alternate (the order flips every step) on the same batches, so drift in the machine's load reaches them
alike; the medians of the per-step CPU seconds, their ratios to this tree's and the load average are printed, then
the largest weight difference between the baseline and this tree (rounding only when the arithmetic is the same).
``--profile``: instead, torch.profiler over this tree's steps, per part (embedding, the interacting layers, DNN,
output unit; forward and backward), loss, optimizer and overhead.
Ends with one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from _step_ab import alternate, build_trainer, module_at

REPO = Path(__file__).resolve().parent.parent


def build(store: Path, config: Path, plain: bool) -> tuple[Any, list[Any]]:
    """A Trainer of ``config`` on ``store``'s train split (the matched recipe's L2) and its full batches;
    ``plain``: the attention's plain path."""
    from ctrkit.nn.attention import MultiHeadSelfAttention

    def plain_path(model: Any) -> None:
        for m in model.modules():
            if isinstance(m, MultiHeadSelfAttention):
                m._fused = lambda emb: False  # type: ignore[method-assign]

    trainer, loader = build_trainer(store, config, matched_l2=True, patch=plain_path if plain else None)
    return trainer, list(loader)[:-1]  # full batches only


def profile(trainer: Any, batches: list[Any], steps: int) -> dict[str, Any]:
    """Where this tree's step goes: :func:`_step_profile.profile_steps` over the model's parts."""
    from _step_profile import profile_steps

    m = trainer.model
    parts = {"embedding": m.embedding, "attention": m.attention, "DNN": m.head.tower, "output unit": m.head.out}

    def step(b: Any, scope: Any) -> None:
        with scope("loss"):
            loss, _ = trainer.module(b)
        with scope("zero_grad"):
            trainer.optimizer.zero_grad(set_to_none=True)
        with scope("backward"):
            loss.backward()
        with scope("optimizer"):
            trainer.optimizer.step()

    return profile_steps(step, [batches[i % len(batches)] for i in range(steps + 3)], parts)


def _no_lanes(*args: Any, **kwargs: Any) -> None:
    """lane_self_attention's answer where the native kernel does not apply: the arm runs the torch-op node."""


def main(argv: list[str] | None = None) -> int:
    from ctrkit.nn import attention

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="directory holding the prepared 'train' store")
    ap.add_argument("--config", default=str(REPO / "configs" / "criteo" / "autoint.yaml"))
    ap.add_argument("--baseline", default=None, help="git revision whose fused node is one more arm")
    ap.add_argument("--no-plain", action="store_true", help="leave out the plain layer's arm")
    ap.add_argument("--no-node", action="store_true", help="leave out this tree's torch-op node's arm")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--profile", action="store_true", help="profile this tree's steps instead of the A/B")
    a = ap.parse_args(argv)
    if not (Path(a.store) / "train").is_dir():
        ap.error(f"--store {a.store}: no 'train' store there; run benchmarks/deepctr_compare.py --out DIR first "
                 "and pass DIR/criteo or DIR/movielens")
    torch.set_num_threads(1)
    store, config = Path(a.store), Path(a.config)
    if a.profile:
        from _step_profile import format_table

        trainer, batches = build(store, config, False)
        res = profile(trainer, batches, a.steps)
        load = os.getloadavg()
        sys.stdout.write(format_table(res, f"{config} (this tree)") + f"\n\nload average {load[0]:.1f} / {load[1]:.1f}"
                         " (the profiler times wall clock: on shared cores the shares are what to read)\n")
        sys.stdout.write("RESULT " + json.dumps({"config": a.config, **res, "loadavg": load}) + "\n")
        return 0
    nodes = {"fused": attention.fused_self_attention}
    lanes = {"fused": (attention.lane_self_attention, attention.lane_attention_stack)}  # only this arm's kernel
    arms = {} if a.no_plain else {"plain": build(store, config, True)}
    if a.baseline:
        nodes["baseline"] = module_at(a.baseline, "src/ctrkit/nn/field_attention.py").fused_self_attention
        arms["baseline"] = build(store, config, False)
    if not a.no_node:
        arms["node"] = build(store, config, False)
    arms["fused"] = build(store, config, False)

    def swap(name: str) -> None:  # the arm's own node (the plain arm does not call it)
        attention.fused_self_attention = nodes.get(name, nodes["fused"])  # type: ignore[attr-defined]
        attention.lane_self_attention, attention.lane_attention_stack = lanes.get(  # type: ignore[attr-defined]
            name, (_no_lanes, _no_lanes))

    seconds = alternate({k: v[0] for k, v in arms.items()}, arms["fused"][1], a.steps, a.warmup, before=swap)
    swap("fused")
    med = {k: statistics.median(v) * 1e3 for k, v in seconds.items()}
    diff = None
    if "baseline" in arms:
        ps = [dict(arms[k][0].model.named_parameters()) for k in ("baseline", "fused")]
        diff = max(float((ps[0][n] - p).detach().abs().max()) for n, p in ps[1].items())
    load = os.getloadavg()
    cells = ", ".join(f"{k} {v:.2f} ({v / med['fused']:.3f}x this tree's)" for k, v in med.items())
    sys.stdout.write(f"{a.config}: median CPU ms per step: {cells} ({a.steps} steps each, load average "
                     f"{load[0]:.1f} / {load[1]:.1f})"
                     + (f"; largest weight difference baseline vs this tree {diff:.3g}" if diff is not None else "")
                     + "\n")
    sys.stdout.write("RESULT " + json.dumps({"config": a.config, "steps": a.steps, "baseline": a.baseline,
                                             "median_ms": med, "weight_diff": diff, "loadavg": load}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
