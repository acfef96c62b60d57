"""Behaviour models on real behaviour logs, side by side with DeepCTR-Torch 0.3.0: test AUC and GAUC (by user)
selected on valid, and training samples/s.

    python benchmarks/seq_compare.py --dataset beauty|taobao [--models dnn din dien bst dsin] [--peers din dien]
                                     [--seeds 0 1 2] [--epochs 3] [--threads 1] [--out DIR]

Data: ``ctrkit preprocess behaviour`` with the options written in configs/_base/<dataset>.yaml (Amazon Beauty:
S3-Rec sequences + the item's category; Taobao UserBehavior head: timestamps, category, DSIN sessions), with
DIEN's auxiliary negatives, embedding dim 16 per table. One positive + one uniformly sampled negative per
behaviour after the first; leave-last-out by user (valid = second-to-last, test = last positive pair).

Every model, both libraries: the same samples in the same stores (DeepCTR reads them exported by
benchmarks/seq_export.py), the model sizes of configs/<dataset>/<model>.yaml (embedding 16 per attribute,
MLP 200-80 ReLU, attention MLP 80-40 with Dice; DIEN: AUGRU, softmax attention, auxiliary net 100-50, aux
weight 1), batch 256, Adam lr 1e-3, ``--epochs`` epochs, no regularisation. After every epoch valid and test
are scored; the epoch with the best valid AUC gives the reported test AUC / GAUC (never chosen on test).
ctrkit trains its embedding rows with lazy Adam (sparse_adam) and the rest with Adam; DeepCTR one Adam.
DeepCTR's DIEN adds ``alpha`` x its auxiliary loss (mean BCE over 2 x pairs) to a *summed* batch BCE, so
ctrkit's aux weight w (sum of the two terms, mean over pairs, on a mean BCE) is ``alpha = 2 w batch_size``.

Speed: training samples/s = train rows x epochs / seconds in the fit loop (scoring valid / test after each
epoch excluded on both sides), same threads, and the fit's process CPU seconds on both sides (``cpu x``, DeepCTR /
ctrkit: steadier than wall time where other work shares the cores); ctrkit's loader is built before the clock starts, DeepCTR's
fit time includes its packing of the inputs (measured alone: ``pack_seconds``).

Targets (issue 9): DIN's GAUC > the dnn baseline's; DIEN (AUGRU + aux) >= DIN; ctrkit DIN / DIEN GAUC >=
DeepCTR's - 0.001; ctrkit DIN / DIEN samples/s >= 2 x DeepCTR's. Prints a table and ends with ONE line
``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _roof
from bench_models import PEER_INSTALL, REPO, SHARED_DATA, fmt, mean_std
from seq_export import export_for_peer

SHARED = SHARED_DATA
PEER = Path(__file__).resolve().parent / "_deepctr_seq_peer.py"
PEER_PYTHON = Path(os.environ.get("PEERS_HOME", Path.home() / ".cache" / "ctrkit-peers")) / "venv-deepctr/bin/python"
PEERS = {"din": "DIN", "dien": "DIEN"}
GAUC_SLACK = 0.001
SPEED_TARGET = 2.0
S3REC = SHARED / "amazon_yelp_lastfm_sequences_s3rec"
DATASETS: dict[str, dict[str, Any]] = {
    "beauty": {"input": S3REC / "Beauty.txt.gz", "format": "s3rec",
               "item_attributes": S3REC / "Beauty_item2attributes.json.gz"},
    "taobao": {"input": SHARED / "taobao_userbehavior" / "UserBehavior_head.csv.gz", "format": "csv",
               "header": False, "names": "user,item,category,type,time", "attr_cols": ["category:cate"],
               "time_col": "time", "sessions": 5, "session_len": 10},
}
MODELS = {"beauty": ["dnn", "din", "dien", "bst"], "taobao": ["dnn", "din", "dien", "bst", "dsin"]}


def prepare(dataset: str, out: Path) -> dict[str, str]:
    """Behaviour stores of ``dataset`` under ``out/stores`` (reused when already there)."""
    from ctrkit.data.sources.behaviour import preprocess_behaviour

    stores = out / "stores"
    if not all((stores / s / "manifest.json").is_file() for s in ("train", "valid", "test")):
        preprocess_behaviour(**DATASETS[dataset], out=stores, aux_negatives=True, embedding_dim=16, seed=0,
                             overwrite=True)
    return {s: str(stores / s) for s in ("train", "valid", "test")}


def scores(y: np.ndarray, groups: np.ndarray, p: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import log_loss, roc_auc_score

    from ctrkit.metrics import gauc

    p = np.clip(np.asarray(p, np.float64), 1e-7, 1 - 1e-7)
    return {"auc": float(roc_auc_score(y, p)), "gauc": float(gauc(p, y, groups)[0]), "logloss": float(log_loss(y, p))}


def select(valid: list[np.ndarray], test: list[np.ndarray], truth: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    """The epoch with the best valid AUC, and its valid / test scores."""
    per_epoch = [scores(*truth["valid"], v)["auc"] for v in valid]
    best = int(np.argmax(per_epoch))
    return {"epoch": best + 1, "valid_auc_by_epoch": per_epoch, "valid": scores(*truth["valid"], valid[best]),
            "test": scores(*truth["test"], test[best])}


def run_ctrkit(config: Path, stores: dict[str, str], seed: int, epochs: int) -> dict[str, Any]:
    """Train ``config`` for ``epochs``, scoring valid / test after each epoch (off the clock)."""
    from ctrkit.data.storage.loader import BatchLoader
    from ctrkit.data.storage.store import Store
    from ctrkit.jobs.common import seed_everything
    from ctrkit.jobs.scoring import predict_store
    from ctrkit.models.registry import create_model
    from ctrkit.training.callbacks import Callback
    from ctrkit.training.config import load_config
    from ctrkit.training.trainer import Trainer

    cfg = load_config(config, [f"train.seed={seed}", f"train.epochs={epochs}", "train.progress=false"])
    train = BatchLoader(Store(stores["train"]), cfg.data.batch_size, shuffle=True, seed=seed, prefetch=cfg.data.prefetch)
    held = {s: Store(stores[s]) for s in ("valid", "test")}
    seed_everything(seed)
    model = create_model(cfg.model.name, train.store.schema, **cfg.model.params)
    if model.needs_prefit:
        model.prefit(train)

    class Score(Callback):
        def __init__(self) -> None:
            self.preds: dict[str, list[np.ndarray]] = {"valid": [], "test": []}
            self.seconds = self.cpu_seconds = 0.0

        def on_epoch_end(self, trainer: Trainer, epoch: int) -> None:
            t0, c0 = time.perf_counter(), time.process_time()
            for s, store in held.items():
                self.preds[s].append(predict_store(model, store, cfg.data.eval_batch_size))
            model.train()
            self.seconds += time.perf_counter() - t0
            self.cpu_seconds += time.process_time() - c0

    score = Score()
    seed_everything(seed)  # the training run's draws (dropout), as the train job seeds them
    trainer = Trainer(model, train, cfg.train, callbacks=[score])  # no valid loader / run dir: the fit loop only
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.fit()
    fit = time.perf_counter() - t0 - score.seconds
    cpu = time.process_time() - c0 - score.cpu_seconds
    rows = len(train.store)
    return {"valid": score.preds["valid"], "test": score.preds["test"], "fit_seconds": fit, "cpu_seconds": cpu,
            "samples_per_s": rows * epochs / fit, "params": sum(p.numel() for p in model.parameters())}


def peer_params(model: str, p: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """DeepCTR-Torch DIN / DIEN arguments for ctrkit config params ``p``."""
    out = {"dnn_hidden_units": list(p["dnn_hidden"]), "dnn_activation": p.get("dnn_activation", "relu"),
           "att_hidden_size" if model == "din" else "att_hidden_units": list(p["att_hidden"]),
           "att_activation": "Dice" if p.get("att_activation") == "dice" else p.get("att_activation"),
           "att_weight_normalization": bool(p.get("att_normalize", model == "dien"))}
    if model == "dien":
        w = float(p.get("aux_loss_weight", 1.0))
        out.update({"gru_type": p.get("gru_type", "AUGRU"), "use_negsampling": w > 0, "alpha": 2 * w * batch_size})
    return out


def run_peer(python: Path, data: Path, model: str, params: dict[str, Any], seed: int, epochs: int,
             batch_size: int, lr: float, threads: int) -> dict[str, Any]:
    out = data / f"pred-{model}-{seed}.npz"
    cmd = [str(python), str(PEER), "--data", str(data), "--model", PEERS[model], "--seed", str(seed),
           "--epochs", str(epochs), "--batch-size", str(batch_size), "--lr", str(lr), "--embedding-dim", "16",
           "--threads", str(threads), "--params", json.dumps(params), "--out", str(out)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEER_RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(f"DeepCTR peer failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}\n")
        return {"error": (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]}
    res = json.loads(lines[-1].split(" ", 1)[1])
    arrays = np.load(out)
    res["valid"], res["test"] = list(arrays["valid"]), list(arrays["test"])
    res["fit_seconds"] = float(np.sum(arrays["fit_seconds"]))
    res["cpu_seconds"] = float(np.sum(res["cpu_seconds"])) if "cpu_seconds" in res else None
    res["samples_per_s"] = res["mean_samples_per_s"]
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", required=True, choices=sorted(DATASETS))
    ap.add_argument("--models", nargs="*", help="ctrkit models (default: every configs/<dataset>/*.yaml)")
    ap.add_argument("--peers", nargs="*", default=list(PEERS), help=f"models also trained with DeepCTR ({list(PEERS)})")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides")
    ap.add_argument("--peer-python", default=str(PEER_PYTHON))
    ap.add_argument("--out", default=None, help="work directory (stores are reused; default /tmp/ctrkit-seq-<dataset>)")
    a = ap.parse_args(argv)
    from ctrkit.data.storage.store import Store
    from ctrkit.training.config import load_config

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(a.threads)
    models = a.models or MODELS[a.dataset]
    peers = [m for m in a.peers if m in models]
    if peers and not Path(a.peer_python).is_file():
        raise SystemExit(f"{a.peer_python} not found: install DeepCTR-Torch with {PEER_INSTALL}")
    out = Path(a.out or f"/tmp/ctrkit-seq-{a.dataset}")
    t0 = time.perf_counter()
    stores = prepare(a.dataset, out)
    truth = {}
    for s in ("valid", "test"):
        st = Store(stores[s])
        truth[s] = (np.asarray(st[st.schema.label]), np.asarray(st[st.schema.group_id]))
    npz = out / "npz"
    if peers:
        export_for_peer(stores, npz)
    n_train = len(Store(stores["train"]))
    sys.stdout.write(f"{a.dataset}: {n_train} train / {len(truth['valid'][0])} valid / {len(truth['test'][0])} test "
                     f"samples, prepared in {time.perf_counter() - t0:.1f}s; epochs={a.epochs} threads={a.threads} "
                     f"cpu={torch.backends.cpu.get_cpu_capability()} (fp32)\n")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for m in models:
        path = REPO / "configs" / a.dataset / f"{m}.yaml"
        cfg = load_config(path)
        runs[m] = {"ctrkit": []}
        if m in peers:
            runs[m]["deepctr"] = []
        for seed in a.seeds:
            sides = {"ctrkit": run_ctrkit(path, stores, seed, a.epochs)}
            if m in peers:
                sides["deepctr"] = run_peer(Path(a.peer_python), npz, m,
                                            peer_params(m, cfg.model.params, cfg.data.batch_size), seed, a.epochs,
                                            cfg.data.batch_size, cfg.train.lr, a.threads)
            line = f"  {m:<5} seed {seed}:"
            for side, r in sides.items():
                if "error" in r:
                    line += f" | {side} FAILED {r['error']}"
                    continue
                sel = select(r.pop("valid"), r.pop("test"), truth)
                runs[m][side].append({**r, **sel})
                line += (f" | {side} test AUC {sel['test']['auc']:.4f} GAUC {sel['test']['gauc']:.4f} (epoch "
                         f"{sel['epoch']}) {r['samples_per_s']:.0f} samples/s"
                         + (f" (cpu {r['cpu_seconds']:.1f}s)" if r.get("cpu_seconds") is not None else ""))
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    sys.stdout.write(f"\n{a.dataset}, test split (epoch chosen on valid AUC), mean ± std over seeds {a.seeds}\n")
    sys.stdout.write(f"{'model':<7}{'library':<9}{'test AUC':>16}{'test GAUC':>16}{'valid AUC':>16}{'samples/s':>12}"
                     f"{'fit cpu s':>11}\n")
    summary: dict[str, Any] = {}
    for m, sides in runs.items():
        for side, rs in sides.items():
            if not rs:
                continue
            sys.stdout.write(f"{m:<7}{side:<9}{fmt([r['test']['auc'] for r in rs]):>16}"
                             f"{fmt([r['test']['gauc'] for r in rs]):>16}{fmt([r['valid']['auc'] for r in rs]):>16}"
                             f"{mean_std([r['samples_per_s'] for r in rs])[0]:>12.0f}"
                             + (f"{mean_std([r['cpu_seconds'] for r in rs])[0]:>11.1f}"
                                if all(r.get("cpu_seconds") is not None for r in rs) else "") + "\n")
            summary[f"{m}/{side}"] = {
                **{f"test_{k}": mean_std([r["test"][k] for r in rs]) for k in ("auc", "gauc", "logloss")},
                "valid_auc": mean_std([r["valid"]["auc"] for r in rs]),
                "samples_per_s": mean_std([r["samples_per_s"] for r in rs]),
                "cpu_seconds": (mean_std([r["cpu_seconds"] for r in rs])
                                if all(r.get("cpu_seconds") is not None for r in rs) else None),
                "epochs_chosen": [r["epoch"] for r in rs]}
    checks = {}

    def g(key: str) -> float | None:
        return summary[key]["test_gauc"][0] if key in summary else None

    if g("din/ctrkit") is not None and g("dnn/ctrkit") is not None:
        checks["din_gauc_beats_dnn"] = g("din/ctrkit") > g("dnn/ctrkit")
    if g("dien/ctrkit") is not None and g("din/ctrkit") is not None:
        checks["dien_gauc_at_least_din"] = g("dien/ctrkit") >= g("din/ctrkit")
    for m in peers:
        if f"{m}/deepctr" in summary:
            checks[f"{m}_gauc_within_{GAUC_SLACK}_of_deepctr"] = g(f"{m}/ctrkit") >= g(f"{m}/deepctr") - GAUC_SLACK
            speed = summary[f"{m}/ctrkit"]["samples_per_s"][0] / summary[f"{m}/deepctr"]["samples_per_s"][0]
            summary[f"{m}/speed_ratio"] = speed
            checks[f"{m}_speed_at_least_{SPEED_TARGET}x"] = speed >= SPEED_TARGET
            # the fit's CPU seconds, DeepCTR / ctrkit: steadier than wall time on cores shared with other work
            cpu = [summary[f"{m}/{side}"]["cpu_seconds"] for side in ("deepctr", "ctrkit")]
            cpu_x = cpu[0][0] / cpu[1][0] if None not in cpu else None
            summary[f"{m}/cpu_ratio"] = cpu_x
            sys.stdout.write(f"{m}: ctrkit / DeepCTR samples/s = {speed:.2f}x"
                             + (f", cpu x {cpu_x:.2f} (fit CPU s {cpu[1][0]:.1f} / {cpu[0][0]:.1f})" if cpu_x else "")
                             + f"; GAUC difference {g(f'{m}/ctrkit') - g(f'{m}/deepctr'):+.4f}\n")
    for name, ok in checks.items():
        sys.stdout.write(f"  {'PASS' if ok else 'FAIL'}  {name}\n")
    roof = _roof.zoo_roof(  # the matmul roof and FLOPs per training sample, same run (issue 29 item 1)
        _roof.measure(a.threads), {m: _roof.model_flops_from_config(REPO / "configs" / a.dataset / f"{m}.yaml",
                                                                    stores["train"]) for m in runs},
        {m: {s: summary[f"{m}/{s}"]["samples_per_s"][0] for s in sides if f"{m}/{s}" in summary}
         for m, sides in runs.items()}, lambda t: sys.stdout.write(t + "\n"))
    sys.stdout.write("RESULT " + json.dumps({
        "dataset": a.dataset, "seeds": a.seeds, "epochs": a.epochs, "threads": a.threads, "train_rows": n_train,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "precision": "fp32", "torch": torch.__version__,
        "results": summary, "checks": checks, "roof": roof}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
