"""fp32 vs bf16 training: the same test AUC? DLRM on the real Criteo sample and on planted-signal synthetic data.

    python benchmarks/bf16_auc.py [--seeds 0 1 2] [--data criteo synthetic] [--synthetic-rows 60000]
                                  [--interaction dot] [--out DIR]

The question (issue 29 item 2): may ``train.precision=bf16`` (autocast of the forward, float32 master weights,
loss and optimizer states) become the default where the CPU has fast bf16? Only if fp32 and bf16 reach the same
test AUC within ``TOLERANCE`` (0.001) on both data sets, over ``--seeds``.

- criteo: the Criteo sample of the shared data (examples/data/criteo_sample.tsv.gz, 8,184 rows, split 0.8/0.1/0.1
  as bench_models.py), ``configs/criteo/dlrm.yaml`` as it ships (``ctrkit train``: early stopping on valid AUC, test
  scored with the best checkpoint).
- synthetic: ``ctrkit.data.sources.synthetic`` stores with a planted logit (Bayes AUC about 0.82), train / valid /
  test drawn with seeds 1 / 2 / 3 of one world, cardinalities scaled (scale 0.001, at most 20,000 rows a table),
  the same config, 3 epochs at batch 1024 with the benchmark's arch (dense 512-256, over 512-256).

Each (data, seed) trains twice, fp32 and bf16, everything else equal. Prints per-seed AUCs, the mean difference and
the verdict, and ends with ONE line ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _roof
from bench_models import REPO, prepare

TOLERANCE = 0.001
CONFIG = REPO / "configs" / "criteo" / "dlrm.yaml"
SYNTHETIC_OVERRIDES = ["train.epochs=3", "data.batch_size=1024", "model.params.dense_arch=[512,256]",
                       "model.params.over_arch=[512,256]"]


def synthetic_stores(out: Path, rows: int) -> dict[str, str]:
    from ctrkit.data.sources.synthetic import write_synthetic_store

    sizes = {"train": rows, "valid": rows // 6, "test": rows // 6}
    return {split: str(write_synthetic_store(out / "synthetic" / split, n, seed=i + 1, scale=0.001,
                                             max_cardinality=20_000, embedding_dim=16, overwrite=True))
            for i, (split, n) in enumerate(sizes.items())}


def train(stores: dict[str, str], seed: int, precision: str, interaction: str, extra: list[str],
          run_dir: Path) -> dict[str, Any]:
    from ctrkit.jobs.train import train_from_config
    from ctrkit.training.config import load_config

    name = f"{Path(stores['train']).parent.name}-{precision}-seed{seed}"
    cfg = load_config(CONFIG, [f"data.{k}={v}" for k, v in stores.items()] + [
        f"train.seed={seed}", f"train.precision={precision}", f"model.params.interaction={interaction}",
        "train.progress=false", f"run.dir={run_dir}", f"run.name={name}", "run.overwrite=true", *extra])
    s = train_from_config(cfg, progress=False)
    return {"auc": s["test"]["auc"], "logloss": s["test"]["logloss"], "train_seconds": s["train_seconds"],
            "samples_per_s": s["samples_per_second"], "best_step": (s["best"] or {}).get("step")}


def compare(name: str, stores: dict[str, str], seeds: list[int], interaction: str, extra: list[str],
            run_dir: Path) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"fp32": [], "bf16": []}
    for seed in seeds:
        for precision, done in runs.items():
            done.append(train(stores, seed, precision, interaction, extra, run_dir))
        a, b = runs["fp32"][-1], runs["bf16"][-1]
        print(f"  {name} seed {seed}: test AUC fp32 {a['auc']:.4f}  bf16 {b['auc']:.4f}  (bf16 - fp32 "
              f"{b['auc'] - a['auc']:+.4f}); {a['samples_per_s']:,.0f} vs {b['samples_per_s']:,.0f} samples/s",
              flush=True)
    diffs = [b["auc"] - a["auc"] for a, b in zip(runs["fp32"], runs["bf16"])]
    mean = {p: statistics.fmean(r["auc"] for r in rs) for p, rs in runs.items()}
    return {"runs": runs, "auc_mean": mean, "auc_diff_per_seed": diffs, "auc_diff_mean": statistics.fmean(diffs),
            "within_tolerance": abs(statistics.fmean(diffs)) <= TOLERANCE}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--synthetic-rows", type=int, default=60_000)
    ap.add_argument("--data", nargs="+", default=["criteo", "synthetic"], choices=("criteo", "synthetic"))
    ap.add_argument("--interaction", default="dot", choices=("dot", "dcn"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="work directory (default: a temporary one)")
    a = ap.parse_args()
    import torch

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(a.threads)
    roof = _roof.measure(a.threads)
    print(_roof.cpu_line(roof), flush=True)
    with tempfile.TemporaryDirectory(prefix="ctrkit-bf16-") as tmp:
        out = Path(a.out) if a.out else Path(tmp)
        results = {}
        if "criteo" in a.data:
            results["criteo"] = compare("criteo", prepare("criteo", out), a.seeds, a.interaction, [], out / "runs")
        if "synthetic" in a.data:
            results["synthetic"] = compare("synthetic", synthetic_stores(out, a.synthetic_rows), a.seeds,
                                           a.interaction, SYNTHETIC_OVERRIDES, out / "runs")
    for name, r in results.items():
        print(f"{name}: mean test AUC fp32 {r['auc_mean']['fp32']:.4f} bf16 {r['auc_mean']['bf16']:.4f}, "
              f"mean difference {r['auc_diff_mean']:+.4f} (per seed "
              + ", ".join(f"{d:+.4f}" for d in r["auc_diff_per_seed"])
              + f"): {'within' if r['within_tolerance'] else 'OUTSIDE'} {TOLERANCE}")
    same = all(r["within_tolerance"] for r in results.values())
    print(f"verdict: bf16 {'may' if same else 'may NOT'} become the default (same test AUC within {TOLERANCE} "
          "on both data sets: " + ("yes" if same else "no") + ")")
    print("RESULT " + json.dumps({"seeds": a.seeds, "interaction": a.interaction, "tolerance": TOLERANCE,
                                  "roof": roof, "results": results, "bf16_same_auc": same}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
