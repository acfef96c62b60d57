"""A fabricated run directory with the files a training writes (summary.json, metrics.jsonl, config.yaml,
predictions.npz) and small stores, for unit tests of the report's rendering only. The end-to-end tests use
real training runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from ctrkit.data.storage.store import write_store
from ctrkit.schema import DenseFeature, Schema, SparseFeature

SCHEMA = Schema(dense=[DenseFeature("d0")], sparse=[SparseFeature("user", 50, 8), SparseFeature("item", 40, 8)],
                group_id="group")


def make_store(path: Path, n: int, seed: int, *, stats: dict | None = None) -> Path:
    rng = np.random.default_rng(seed)
    arrays = {"label": (rng.random(n) < 0.3).astype(np.float32), "d0": rng.normal(size=n).astype(np.float32),
              "user": rng.integers(0, 50, n).astype(np.int32), "item": rng.integers(0, 40, n).astype(np.int32),
              "group": rng.integers(0, 20, n).astype(np.int64)}
    kinds = {"label": "label", "d0": "dense", "user": "sparse", "item": "sparse", "group": "group"}
    meta = {} if stats is None else {"stats": stats}
    return write_store(path, SCHEMA, arrays, kinds, **meta)


def make_fake_run(root: Path, name: str = "fake", *, task: str = "ranking", seed: int = 0, n_test: int = 3000,
                  epochs: int = 3, steps_per_epoch: int = 20) -> Path:
    """A run directory ``root/runs/name`` whose stores live in ``root/stores-name``."""
    rng = np.random.default_rng(seed)
    stores = root / f"stores-{name}"
    train = make_store(stores / "train", 800, seed, stats={
        "rows": 800, "label_rate": 0.3, "input_rows": 1010, "bad_rows": 10,
        "first_bad_lines": [{"file": "raw.csv", "line": 7, "reason": "dense 'd0' is <not> a number"}]})
    valid = make_store(stores / "valid", 200, seed + 1)  # no stats: the label rate is read from the column
    test = make_store(stores / "test", 200, seed + 2, stats={"rows": 200, "label_rate": 0.25})
    run = root / "runs" / name
    run.mkdir(parents=True)
    metric_names = ("auc", "logloss", "gauc") if task == "ranking" else ("hr@10", "ndcg@10", "mrr")
    records, evals = [], []
    for step in range(1, epochs * steps_per_epoch + 1):
        if step % 5 == 0:
            records.append({"kind": "train", "step": step, "epoch": (step - 1) // steps_per_epoch,
                            "loss": 0.6 * np.exp(-step / 30) + 0.3 + 0.02 * rng.normal(), "bce": 0.5})
        if step % steps_per_epoch == 0:
            e = step // steps_per_epoch
            d = 0.01 * seed
            m = {"auc": 0.70 + 0.03 * e + d, "logloss": 0.55 - 0.02 * e - d, "gauc": 0.66 + 0.025 * e + d,
                 "gauc_skipped_groups": 2} if task == "ranking" else \
                {"hr@10": 0.1 * e + d, "ndcg@10": 0.05 * e + d, "mrr": 0.03 * e + d}
            rec = {"kind": "eval", "step": step, "epoch": e, **m, "best": m[metric_names[0]], "stopped_early": False,
                   "train_seconds": 1.5 * e, "samples": 800 * e}
            records.append(rec)
            evals.append(rec)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = {"model": {"name": "dlrm" if task == "ranking" else "two_tower", "params": {"over_arch": [16]}},
              "data": {"train": str(train), "valid": str(valid), "test": str(test), "batch_size": 40},
              "train": {"epochs": epochs, "lr": 0.001 * (seed + 1), "metrics": list(metric_names)},
              "run": {"dir": str(root / "runs"), "name": name}}
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    best = evals[-1]
    valid_m = {k: best[k] for k in metric_names}
    summary = {
        "model": config["model"]["name"], "task": task, "run_dir": str(run),
        "best": {"step": best["step"], "epoch": best["epoch"], "metric": metric_names[0],
                 "value": best[metric_names[0]], "valid": valid_m},
        "last_valid": valid_m, "test": {k: v - 0.01 for k, v in valid_m.items()},
        "epochs": float(epochs), "steps": epochs * steps_per_epoch, "stopped_early": False, "seconds": 6.0,
        "train_seconds": 4.5, "seconds_per_epoch": 1.5, "samples": 800 * epochs, "samples_per_second": 533.3,
        "model_size": {"parameters": 1234, "embedding_parameters": 720, "bytes": 4936},
        "data": {"train": str(train), "valid": str(valid), "test": str(test)},
        "predictions": None, "config": config,
        "environment": {"device": "cpu", "cpu_capability": "AVX2", "threads": 1, "torch": "2.13.0",
                        "ctrkit": "0.1.0"},
    }
    if task == "ranking":
        x = rng.normal(size=n_test)
        label = (rng.random(n_test) < 1 / (1 + np.exp(-(2 * x - 1.5)))).astype(np.float32)
        score = (1 / (1 + np.exp(-(1.6 * x - 1.2)))).astype(np.float32)
        np.savez(run / "predictions.npz", label=label, score=score,
                 group=rng.integers(0, 60, n_test).astype(np.int64))
        summary["predictions"] = {"split": "test", "file": "predictions.npz", "rows": n_test}
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    return run
