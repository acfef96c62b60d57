"""What ``train.ema_decay`` (weight averaging) costs in training time, on MovieLens-100K.

    python benchmarks/weight_average_cost.py [--model deepfm] [--epochs 3] [--reps 3] [--threads 1] [--out DIR]

The MovieLens store is built as in bench_models.py; ``configs/movielens/<model>.yaml`` trains for
``--epochs`` (no early stopping) with ``train.ema_decay`` null and 0.99, alternating, ``--reps`` times each.
Figure: the trainer's ``train_seconds`` (the steps only: evaluation and checkpoints excluded). Ends with ONE
line ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import REPO, prepare


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepfm")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="work directory (default: a temporary one)")
    a = ap.parse_args(argv)
    from ctrkit.jobs.train import train_from_config
    from ctrkit.training.config import load_config

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(a.threads)
    cpu = torch.backends.cpu.get_cpu_capability()
    seconds: dict[str, list[float]] = {"none": [], "0.99": []}
    with tempfile.TemporaryDirectory(prefix="ctrkit-ema-") as tmp:
        out = Path(a.out) if a.out else Path(tmp)
        stores = prepare("movielens", out, 0)
        for rep in range(a.reps):
            for decay, runs in seconds.items():
                cfg = load_config(REPO / "configs" / "movielens" / f"{a.model}.yaml", [
                    *(f"data.{k}={v}" for k, v in stores.items()), f"train.epochs={a.epochs}",
                    "train.early_stopping.patience=0", f"train.ema_decay={'null' if decay == 'none' else decay}",
                    "train.progress=false", f"run.dir={out / 'runs'}", f"run.name={decay}-{rep}", "run.overwrite=true"])
                runs.append(train_from_config(cfg, progress=False)["train_seconds"])
                sys.stdout.write(f"rep {rep} ema_decay={decay}: {runs[-1]:.2f} s\n")
    med = {k: statistics.median(v) for k, v in seconds.items()}
    sys.stdout.write(f"{a.model}, {a.epochs} epochs, {a.threads} thread(s), CPU capability {cpu}: median train seconds "
                     f"{med['none']:.2f} without averaging, {med['0.99']:.2f} with ({med['0.99'] / med['none']:.2f}x)\n")
    sys.stdout.write("RESULT " + json.dumps({"model": a.model, "epochs": a.epochs, "threads": a.threads,
                                             "cpu_capability": cpu, "train_seconds": seconds, "median": med,
                                             "ratio": med["0.99"] / med["none"]}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
