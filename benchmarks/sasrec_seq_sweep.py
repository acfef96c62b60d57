"""Settings of sasrec on sequence rows compared on valid NDCG@10: named sets of config overrides, a few seeds each.

    PYTHONPATH=src python benchmarks/sasrec_seq_sweep.py --dataset ml100k [--store DIR] [--seeds 0 1 2]
        [--workers 2] [--epochs 60] [--patience 10] --arm NAME[:KEY=VALUE,KEY=VALUE...] [--arm ...] [--out DIR]

Each arm is configs/<dataset>_retrieval_seq/sasrec.yaml plus its overrides, trained by
``retrieval_compare.train_one`` (one thread per run, best.pt on valid NDCG@10, test once with it) on the sequence
store ``--store`` (default: the one ``retrieval_compare.py`` builds for the dataset's default stride). Every
finished run is appended to OUT/sweep.jsonl at once (with its valid NDCG@10 per evaluation, so a shorter patience
can be read off afterwards: :func:`stopped_at`); the end prints each arm's valid mean over the seeds (the figure
to choose by) beside its test means (to report, not to choose by).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import retrieval_compare as rc


def parse_arm(text: str) -> tuple[str, list[str]]:
    """"NAME:K=V,K=V" -> (NAME, ["K=V", ...]); a bare NAME has no overrides (the config as it is)."""
    name, _, rest = text.partition(":")
    return name, [kv for kv in rest.split(",") if kv]


def valid_curve(run_dir: Path) -> list[float]:
    """The valid NDCG@10 of each evaluation of a run, in order, from its metrics.jsonl."""
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        value = rec.get("valid", {}).get("ndcg@10") if isinstance(rec.get("valid"), dict) else rec.get("ndcg@10")
        if value is not None and rec.get("split", "valid") == "valid":
            out.append(float(value))
    return out


def stopped_at(curve: list[float], patience: int) -> tuple[int, float]:
    """(index, value) of the best evaluation early stopping with ``patience`` would keep on ``curve``."""
    best, best_i = -1.0, 0
    for i, v in enumerate(curve):
        if v > best:
            best, best_i = v, i
        elif i - best_i >= patience:
            break
    return best_i, best


def run(job: dict[str, Any]) -> dict[str, Any]:
    try:
        r = rc.train_one(job)
    except Exception as e:  # noqa: BLE001 -- one failed setting is reported, the other runs go on
        return {"name": job["name"], "seed": job["seed"], "error": f"{type(e).__name__}: {e}",
                "overrides": job["overrides"]}
    try:
        r["valid_curve"] = valid_curve(Path(job["out"]) / "runs" / f"{job['name']}-{job['seed']}")
    except (OSError, ValueError) as e:  # the summary still stands without the curve
        r["valid_curve_error"] = str(e)
    r["overrides"] = job["overrides"]
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=("beauty", "ml100k"), default="ml100k")
    p.add_argument("--store", default=None, help="sequence store (train / valid / test under it)")
    p.add_argument("--arm", action="append", required=True, help="NAME[:KEY=VALUE,...]")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--patience", type=int, default=10)
    p.add_argument("--out", default="bench_out/sweep")
    a = p.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if a.store is None:
        k = rc.SEQ_STRIDE[a.dataset]
        stride = 50 // k if k else None
        a.store = str(Path("bench_out/retrieval") / f"{a.dataset}_seq_store{'' if stride is None else f'_stride{stride}'}")
    store = Path(a.store).resolve()
    stores = {s: str(store / s) for s in ("train", "valid", "test")}
    arms = [parse_arm(t) for t in a.arm]
    jobs = [{"dataset": a.dataset, "model": "sasrec_seq", "name": name, "seed": s, "stores": stores,
             "device": a.device, "threads": 1, "epochs": a.epochs, "out": str(out), "patience": a.patience,
             "overrides": ov} for name, ov in arms for s in a.seeds]
    runs: list[dict[str, Any]] = []
    log = (out / "sweep.jsonl").open("a")
    with ProcessPoolExecutor(max_workers=a.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for fut in as_completed([pool.submit(run, j) for j in jobs]):
            r = fut.result()
            log.write(json.dumps(r) + "\n")
            log.flush()
            if "error" in r:
                print(f"{r['name']} seed {r['seed']}: FAILED {r['error']}", flush=True)
                continue
            runs.append(r)
            print(f"{r['name']} seed {r['seed']}: valid {r['valid_ndcg@10']:.4f}, test hr@10 {r['test']['hr@10']:.4f} "
                  f"ndcg@10 {r['test']['ndcg@10']:.4f}, epochs {r['epochs']}, cpu {r['cpu_seconds_per_epoch'] or float('nan'):.1f}s/epoch",
                  flush=True)
    print(f"\n{'arm':<28}{'valid ndcg@10':>14}{'test hr@10':>12}{'test ndcg@10':>14}{'hr@50':>8}{'cpu s/ep':>10}")
    for name, _ in arms:
        rs = [r for r in runs if r["name"] == name]
        if rs:
            m = {k: float(np.mean([r["test"][k] for r in rs])) for k in ("hr@10", "ndcg@10", "hr@50")}
            print(f"{name:<28}{np.mean([r['valid_ndcg@10'] for r in rs]):>14.4f}{m['hr@10']:>12.4f}"
                  f"{m['ndcg@10']:>14.4f}{m['hr@50']:>8.4f}{np.mean([r['cpu_seconds_per_epoch'] or np.nan for r in rs]):>10.1f}")


if __name__ == "__main__":
    main()
