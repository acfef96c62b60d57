"""Every model of the zoo on one real dataset, same split, several seeds: test AUC, LogLoss, seconds.

    python benchmarks/bench_models.py --dataset criteo|movielens [--models deepfm dcn ...] [--seeds 0 1 2]
                                      [--epochs N] [--threads 1] [--set train.lr=3e-3 ...] [--out DIR]

Data (preprocessed once, then every model trains on the same stores):

- criteo: the bundled Criteo sample (examples/data/criteo_sample.tsv.gz, 8,184 rows, the same file as
  criteo_dac/criteo_kaggle_merged_unique.tsv.gz of the shared data), ratio split 0.8/0.1/0.1 seeded with
  ``--split-seed``, ``min_freq`` 8 (as in ``ctrkit demo``), embedding dim 16.
- movielens: MovieLens-100K (movielens_100k of the shared data: the folder ``$CTRKIT_SHARED_DATA``, else
  shared/data beside the checkout) via examples/make_movielens_csv.py (label = rating >= 4; user age, gender,
  occupation, zip prefix; item genres (multi-valued, mean-pooled) and year; the user's 20 previous items
  as a mean-pooled sequence sharing the item table) and examples/movielens_100k.yaml, random 80/10/10
  split seeded with ``--split-seed``, embedding dim 16.

Each model runs ``configs/<dataset>/<model>.yaml`` through ``ctrkit.jobs.train.train_from_config`` (early
stopping on valid AUC, test scored with the best checkpoint); only ``train.seed``, the store paths and
the run directory are overridden (plus ``--epochs`` / ``--set``). "seconds" is the whole job as
``train_from_config`` reports it: loaders, GBDT prefit, the fit loop with its per-epoch valid
evaluation and checkpoints, and the test evaluation.

Prints a table (mean ± std over seeds) and ends with ONE line ``RESULT {json}`` holding every figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _roof

REPO = Path(__file__).resolve().parents[1]
CRITEO_SAMPLE = REPO / "examples" / "data" / "criteo_sample.tsv.gz"
# the shared data sets, as the tests find them (tests/conftest.py): $CTRKIT_SHARED_DATA, else ../shared/data
SHARED_DATA = Path(os.environ.get("CTRKIT_SHARED_DATA") or REPO.parent / "shared" / "data")
# installs the peer libraries (DeepCTR-Torch, ...) that the comparison benchmarks run against
PEER_INSTALL = REPO.parent / "shared" / "bench" / "install.sh"
MOVIELENS_RAW = SHARED_DATA / "movielens_100k"
MOVIELENS_SPEC = REPO / "examples" / "movielens_100k.yaml"
EMBEDDING_DIM = 16
CRITEO_MIN_FREQ = 8  # as in `ctrkit demo`
SPLIT = "0.8,0.1,0.1"


def prepare(dataset: str, out: Path, split_seed: int = 0) -> dict[str, str]:
    """Preprocess ``dataset`` into ``out/<dataset>/{train,valid,test}`` -> {split: store path}."""
    if dataset == "criteo":
        from ctrkit.data.sources.criteo import preprocess_criteo

        stores = preprocess_criteo(CRITEO_SAMPLE, out / "criteo", split=SPLIT, seed=split_seed,
                                   min_freq=CRITEO_MIN_FREQ, embedding_dim=EMBEDDING_DIM, overwrite=True,
                                   progress=False)
    elif dataset == "movielens":
        sys.path.insert(0, str(REPO / "examples"))
        from make_movielens_csv import make_movielens_csv

        from ctrkit.data.sources.table import preprocess_table

        csv = make_movielens_csv(MOVIELENS_RAW, out / "ml100k.csv")
        stores = preprocess_table(csv, MOVIELENS_SPEC, out / "movielens", split=SPLIT, seed=split_seed,
                                  embedding_dim=EMBEDDING_DIM, overwrite=True)
    else:
        raise SystemExit(f"--dataset must be criteo or movielens, got {dataset!r}")
    return {k: str(v) for k, v in stores.items()}


def config_paths(dataset: str, models: list[str] | None) -> dict[str, Path]:
    """{model: configs/<dataset>/<model>.yaml} for ``models`` (default: every config of the dataset)."""
    from ctrkit.jobs.tune_space import SPACE_SUFFIX

    folder = REPO / "configs" / dataset
    found = {p.stem: p for p in sorted(folder.glob("*.yaml")) if not p.name.endswith(SPACE_SUFFIX)}
    if not models:
        return found
    missing = [m for m in models if m not in found]
    if missing:
        raise SystemExit(f"no config for {missing} in {folder}; available: {sorted(found)}")
    return {m: found[m] for m in models}


def run_one(config: Path, stores: dict[str, str], seed: int, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """Train one config on ``stores`` with ``train.seed=seed`` -> {auc, logloss, seconds, steps, best_step}."""
    from ctrkit.jobs.train import train_from_config
    from ctrkit.training.config import load_config

    cfg = load_config(config, [
        f"data.train={stores['train']}", f"data.valid={stores['valid']}", f"data.test={stores['test']}",
        f"train.seed={seed}", f"run.dir={run_dir}", f"run.name={config.stem}-seed{seed}", *overrides,
    ])
    s = train_from_config(cfg, progress=False)
    return {"auc": s["test"]["auc"], "logloss": s["test"]["logloss"], "seconds": s["seconds"],
            "steps": s["steps"], "best_step": s["best"]["step"], "samples_per_s": s["samples_per_second"]}


def mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt(xs: list[float], digits: int = 4) -> str:
    m, s = mean_std(xs)
    return f"{m:.{digits}f}±{s:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", required=True, choices=["criteo", "movielens"])
    ap.add_argument("--models", nargs="*", help="model names (default: every configs/<dataset>/*.yaml)")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, help="override train.epochs")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 is faster here, see report)")
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config override for every model, e.g. --set train.lr=3e-3")
    ap.add_argument("--out", help="work directory (default: a temporary one, removed at the end)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(a.threads)
    configs = config_paths(a.dataset, a.models)
    overrides = list(a.set) + ([f"train.epochs={a.epochs}"] if a.epochs else [])
    with tempfile.TemporaryDirectory(prefix="ctrkit-bench-") as tmp:
        out = Path(a.out) if a.out else Path(tmp)
        t0 = time.perf_counter()
        stores = prepare(a.dataset, out, a.split_seed)
        prep_s = time.perf_counter() - t0
        sys.stdout.write(f"{a.dataset}: preprocessed in {prep_s:.1f}s -> {out}; threads={a.threads}; "
                         f"seeds={a.seeds}; overrides={overrides}\n")
        results: dict[str, list[dict[str, Any]]] = {}
        for name, path in configs.items():
            results[name] = []
            for seed in a.seeds:
                r = run_one(path, stores, seed, out / "runs", overrides)
                results[name].append(r)
                sys.stdout.write(f"  {name:<10} seed {seed}: AUC {r['auc']:.4f}  LogLoss {r['logloss']:.4f}  "
                                 f"{r['seconds']:.1f}s  (best step {r['best_step']} of {r['steps']})\n")
                sys.stdout.flush()
        # the matmul roof and FLOPs per training sample (fit loop's samples/s), same run (issue 29 item 1)
        roof = _roof.zoo_roof(_roof.measure(a.threads),
                              {n: _roof.model_flops_from_config(p, stores["train"]) for n, p in configs.items()},
                              {n: {"ctrkit": statistics.mean(r["samples_per_s"] for r in rs)}
                               for n, rs in results.items()}, lambda t: sys.stdout.write(t + "\n"))
    sys.stdout.write(f"\n{a.dataset} test split, mean ± std over seeds {a.seeds}\n")
    sys.stdout.write(f"{'model':<11}{'AUC':>16}{'LogLoss':>16}{'seconds':>14}\n")
    for name, rs in sorted(results.items(), key=lambda kv: -mean_std([r["auc"] for r in kv[1]])[0]):
        sys.stdout.write(f"{name:<11}{fmt([r['auc'] for r in rs]):>16}{fmt([r['logloss'] for r in rs]):>16}"
                         f"{fmt([r['seconds'] for r in rs], 1):>14}\n")
    summary = {
        "dataset": a.dataset, "seeds": a.seeds, "threads": a.threads, "overrides": overrides,
        "torch": torch.__version__, "roof": roof,
        "models": {
            name: {
                **{f"{k}_mean": mean_std([r[k] for r in rs])[0] for k in ("auc", "logloss", "seconds")},
                **{f"{k}_std": mean_std([r[k] for r in rs])[1] for k in ("auc", "logloss", "seconds")},
                "runs": rs,
            }
            for name, rs in results.items()
        },
    }
    sys.stdout.write("RESULT " + json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
