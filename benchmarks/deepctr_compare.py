"""ctrkit vs DeepCTR-Torch 0.3.0, side by side on identical data: test AUC, LogLoss, fit seconds.

    python benchmarks/deepctr_compare.py --dataset criteo|movielens [--models deepfm dcn ...] [--seeds 0 1 2]
                                         [--epochs N] [--threads 1] [--peer-python PATH] [--out DIR]

The dataset is preprocessed once by ctrkit (as in bench_models.py) and its train / test stores are
exported to .npz (dense columns, single-valued ids, multi-valued and sequence features as 0-padded id
matrices); the DeepCTR side (benchmarks/_deepctr_peer.py, run in a subprocess with the DeepCTR venv's
python, installed by /work/shared/bench/install.sh) reads exactly those arrays. Multi-valued genres and
the item-history sequence (sharing the item table) become DeepCTR VarLenSparseFeat with mean pooling.

Like for like, per model: the architecture options of configs/<dataset>/<model>.yaml translated to the
DeepCTR constructor (DNN widths, cross layers, CIN sizes, attention sizes, regions...), same embedding
dim (16), epochs, batch size and Adam learning rates (DeepCTR: one torch.optim.Adam with the embedding
tables at the config's ``embedding_lr`` and the rest at ``lr``; ctrkit: Adam on dense parameters and the
config's sparse optimizer (sparse_adam = lazy Adam) on embedding rows), no dropout, no batch norm, no
validation and no early stopping on either side (fixed epochs). Regularisation: DeepCTR keeps its
defaults (l2_reg_embedding = l2_reg_linear = 1e-5 on whole tables, added to a *summed* batch loss, i.e.
1e-5 / batch_size per row against a mean loss); ctrkit gets the same per-row strength on the rows a batch
touches, ``embedding_l2 = 2e-5 / batch_size`` (the gradient of 1e-5 ||w||^2 is 2e-5 w).

Time: the fit loop only, the same on both sides: DeepCTR's ``model.fit`` (which includes building its
TensorDataset) vs ctrkit's ``Trainer.fit`` (loader built before the clock starts). Metrics: both sides'
test probabilities scored here with sklearn (roc_auc_score, log_loss).

Target per model: ctrkit AUC >= DeepCTR AUC - 0.002 and ctrkit fit time lower. Prints the table and ends
with ONE line ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import REPO, fmt, mean_std, prepare

PEER = Path(__file__).resolve().parent / "_deepctr_peer.py"
PEER_PYTHON = Path(os.environ.get("PEERS_HOME", Path.home() / ".cache" / "ctrkit-peers")) / "venv-deepctr/bin/python"
# ctrkit model -> DeepCTR-Torch model
PEERS = {"wide_deep": "WDL", "deepfm": "DeepFM", "xdeepfm": "xDeepFM", "nfm": "NFM", "afm": "AFM", "dcn": "DCN",
         "dcnv2": "DCNMix", "pnn": "PNN", "autoint": "AutoInt", "fibinet": "FiBiNET", "mlr": "MLR"}
EPOCHS = {"criteo": 4, "movielens": 3}
AUC_SLACK = 0.002
DEEPCTR_L2 = 1e-5  # DeepCTR's default l2_reg_embedding / l2_reg_linear


def peer_params(model: str, p: dict[str, Any]) -> dict[str, Any]:
    """DeepCTR constructor arguments equivalent to ctrkit model ``model``'s config params ``p``."""
    dnn = {"dnn_hidden_units": list(p.get("dnn_hidden", [256, 128]))}
    if model == "wide_deep":
        if p.get("crosses"):
            raise SystemExit("wide_deep with crosses has no DeepCTR WDL equivalent; compare without crosses")
        return {**dnn, "dnn_dropout": p.get("dnn_dropout", 0.0), "dnn_use_bn": p.get("dnn_batch_norm", False)}
    if model == "deepfm":
        return {**dnn, "dnn_dropout": p.get("dnn_dropout", 0.0), "dnn_use_bn": p.get("dnn_batch_norm", False)}
    if model == "xdeepfm":
        act = p.get("cin_activation", "identity")
        return {**dnn, "cin_layer_size": list(p.get("cin_layer_sizes", [128, 128])),
                "cin_split_half": p.get("split_half", True), "cin_activation": "linear" if act == "identity" else act,
                "dnn_dropout": p.get("dnn_dropout", 0.0)}
    if model == "nfm":
        if p.get("bi_batch_norm", True):
            raise SystemExit("DeepCTR's NFM has no BatchNorm on the pooled vector: set bi_batch_norm=false")
        return {**dnn, "bi_dropout": p.get("bi_dropout", 0.0), "dnn_dropout": p.get("dnn_dropout", 0.0)}
    if model == "afm":
        return {"attention_factor": p.get("attention_dim", 16), "afm_dropout": p.get("attention_dropout", 0.0)}
    if model == "dcn":
        return {**dnn, "cross_num": p.get("cross_layers", 3), "cross_parameterization": "vector",
                "dnn_dropout": p.get("dnn_dropout", 0.0)}
    if model == "dcnv2":
        if p.get("cross_type") != "mix" or p.get("structure", "parallel") != "parallel":
            raise SystemExit("dcnv2 compares with DeepCTR's DCNMix: needs cross_type=mix, structure=parallel")
        return {**dnn, "cross_num": p.get("cross_layers", 3), "low_rank": p.get("rank", 32),
                "num_experts": p.get("experts", 4), "dnn_dropout": p.get("dnn_dropout", 0.0)}
    if model == "pnn":
        prod = p.get("product", "inner")
        return {"dnn_hidden_units": list(p.get("dnn_hidden", [128, 64])), "use_inner": prod in ("inner", "both"),
                "use_outter": prod in ("outer", "both"), "dnn_dropout": p.get("dnn_dropout", 0.0)}
    if model == "autoint":
        if p.get("dense_as_fields", True):
            raise SystemExit("DeepCTR's AutoInt attends over the sparse fields only: set dense_as_fields=false")
        return {**(dnn if p.get("autoint_plus") else {"dnn_hidden_units": []}),
                "att_layer_num": p.get("attention_layers", 3), "att_head_num": p.get("num_heads", 2),
                "att_res": p.get("use_residual", True), "dnn_dropout": p.get("dnn_dropout", 0.0)}
    if model == "fibinet":
        kind = {"field_all": "all", "field_each": "each", "field_interaction": "interaction"}
        return {**dnn, "bilinear_type": kind[p.get("bilinear_type", "field_interaction")],
                "reduction_ratio": int(p.get("reduction_ratio", 3)), "dnn_dropout": p.get("dnn_dropout", 0.0)}
    if model == "mlr":
        return {"region_num": p.get("regions", 12)}
    raise SystemExit(f"{model} has no DeepCTR-Torch counterpart here; choose from {sorted(PEERS)}")


def _padded(values: np.ndarray, offsets: np.ndarray, max_len: int) -> np.ndarray:
    """Jagged (values, offsets) -> (N, max_len) int64, bag i's ids left-aligned, 0-padded."""
    lengths = np.diff(offsets)
    n = len(lengths)
    out = np.zeros((n, max(int(max_len), 1)), dtype=np.int64)
    rows = np.repeat(np.arange(n), lengths)
    pos = np.arange(len(values)) - np.repeat(offsets[:-1], lengths)
    keep = pos < out.shape[1]
    out[rows[keep], pos[keep]] = values[keep]
    return out


def export(stores: dict[str, str], out: Path) -> dict[str, Any]:
    """Write ``out/{train,test}.npz`` + ``out/meta.json`` from ctrkit stores -> the meta dict."""
    from ctrkit.data.store import Store

    train = Store(stores["train"])
    schema = train.schema
    kinds = train.kinds
    dims = {t.embedding_dim for t in schema.tables().values()}
    if len(dims) != 1:
        raise SystemExit(f"the comparison needs one embedding dim for every table, got {sorted(dims)}")
    sparse, varlen = [], []
    tables = schema.tables()
    for f in schema.sparse:
        table = f.table or f.name
        entry = {"name": f.name, "vocab_size": tables[table].num_embeddings, "table": table}
        (varlen if kinds.get(f.name) == "jagged" else sparse).append(entry)
    for q in schema.sequence:
        shared = schema.feature(q.shares)
        table = shared.table or shared.name
        varlen.append({"name": q.name, "vocab_size": tables[table].num_embeddings, "table": table})
    for f in varlen:  # pad to the longest bag of any split
        f["max_len"] = max(int(np.diff(Store(p)[f["name"]][1]).max(initial=1)) for p in stores.values())
    meta = {"dense": list(schema.dense_names), "sparse": sparse, "varlen": varlen, "embedding_dim": dims.pop()}
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        s = Store(stores[split])
        arrays = {"label": np.asarray(s[schema.label], dtype=np.float32),
                  "dense": np.stack([np.asarray(s[n], dtype=np.float32) for n in meta["dense"]], 1)
                  if meta["dense"] else np.zeros((s.num_rows, 0), np.float32)}
        for f in sparse:
            arrays[f["name"]] = np.asarray(s[f["name"]], dtype=np.int64)
        for f in varlen:
            values, offsets = s[f["name"]]
            arrays[f["name"]] = _padded(np.asarray(values, np.int64), np.asarray(offsets, np.int64), f["max_len"])
        np.savez(out / f"{split}.npz", **arrays)
    (out / "meta.json").write_text(json.dumps(meta))
    return meta


def run_ctrkit(config: Path, stores: dict[str, str], seed: int, epochs: int) -> dict[str, Any]:
    """Fit ``config`` for ``epochs`` with no validation -> {pred, fit_seconds, params} (pred: test probs)."""
    from ctrkit.data.loader import BatchLoader
    from ctrkit.data.store import Store
    from ctrkit.models.registry import create_model
    from ctrkit.runner import predict_store
    from ctrkit.train.config import load_config
    from ctrkit.train.trainer import Trainer, seed_everything

    cfg = load_config(config, [f"train.seed={seed}", f"train.epochs={epochs}", "train.early_stopping.patience=0",
                               "train.progress=false"])
    b = cfg.data.batch_size
    cfg.train.embedding_l2 = 2 * DEEPCTR_L2 / b
    train = BatchLoader(Store(stores["train"]), b, shuffle=True, seed=seed, prefetch=cfg.data.prefetch)
    seed_everything(seed)
    model = create_model(cfg.model.name, train.store.schema, **cfg.model.params)
    trainer = Trainer(model, train, cfg.train)  # no valid loader, no run dir: the fit loop only
    t0 = time.perf_counter()
    trainer.fit()
    seconds = time.perf_counter() - t0
    pred = predict_store(model, Store(stores["test"]), 4096)
    return {"pred": pred, "fit_seconds": seconds, "params": sum(p.numel() for p in model.parameters())}


def run_peer(python: Path, data: Path, model: str, params: dict[str, Any], cfg: Any, seed: int, epochs: int,
             threads: int) -> dict[str, Any]:
    out = data / f"pred-{model}-{seed}.npz"
    elr = cfg.train.embedding_lr if cfg.train.embedding_lr is not None else cfg.train.lr
    cmd = [str(python), str(PEER), "--data", str(data), "--model", model, "--seed", str(seed),
           "--epochs", str(epochs), "--batch-size", str(cfg.data.batch_size), "--lr", str(cfg.train.lr),
           "--embedding-lr", str(elr), "--threads", str(threads), "--params", json.dumps(params), "--out", str(out)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEER_RESULT ")]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        sys.stderr.write(f"DeepCTR peer failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}\n")
        return {"error": err}
    res = json.loads(lines[-1].split(" ", 1)[1])
    res["pred"] = np.load(out)["pred"]
    return res


def score(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import log_loss, roc_auc_score

    p = np.clip(np.asarray(p, np.float64), 1e-7, 1 - 1e-7)
    return {"auc": float(roc_auc_score(y, p)), "logloss": float(log_loss(y, p))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", required=True, choices=["criteo", "movielens"])
    ap.add_argument("--models", nargs="*", help=f"ctrkit names (default: all of {sorted(PEERS)})")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, help=f"epochs for both sides (default {EPOCHS})")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides")
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--peer-python", default=str(PEER_PYTHON))
    ap.add_argument("--out", help="work directory (default: a temporary one)")
    a = ap.parse_args(argv)
    from ctrkit.train.config import load_config

    torch.set_num_threads(a.threads)
    models = a.models or list(PEERS)
    bad = [m for m in models if m not in PEERS]
    if bad:
        raise SystemExit(f"no DeepCTR counterpart for {bad}; choose from {sorted(PEERS)}")
    if not Path(a.peer_python).is_file():
        raise SystemExit(f"{a.peer_python} not found: install DeepCTR-Torch with /work/shared/bench/install.sh")
    epochs = a.epochs or EPOCHS[a.dataset]
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="ctrkit-deepctr-") as tmp:
        out = Path(a.out) if a.out else Path(tmp)
        stores = prepare(a.dataset, out, a.split_seed)
        data = out / "npz"
        meta = export(stores, data)
        y = np.load(data / "test.npz")["label"]
        sys.stdout.write(f"{a.dataset}: {len(meta['dense'])} dense, {len(meta['sparse'])} sparse, "
                         f"{len(meta['varlen'])} varlen features; {len(y)} test rows; epochs={epochs}; "
                         f"threads={a.threads}\n")
        for m in models:
            path = REPO / "configs" / a.dataset / f"{m}.yaml"
            cfg = load_config(path)
            params = peer_params(m, cfg.model.params)
            rows[m] = {"ctrkit": [], "deepctr": []}
            for seed in a.seeds:
                peer = run_peer(Path(a.peer_python), data, PEERS[m], params, cfg, seed, epochs, a.threads)
                if "error" in peer:  # the peer cannot run this model on this data: say so, skip the model
                    failed[m] = peer["error"]
                    sys.stdout.write(f"  {m:<10} seed {seed}: DeepCTR {PEERS[m]} failed: {peer['error']}\n")
                    del rows[m]
                    break
                ours = run_ctrkit(path, stores, seed, epochs)
                for side, r in (("ctrkit", ours), ("deepctr", peer)):
                    rows[m][side].append({**score(y, r.pop("pred")), **r})
                o, d = rows[m]["ctrkit"][-1], rows[m]["deepctr"][-1]
                sys.stdout.write(f"  {m:<10} seed {seed}: ctrkit AUC {o['auc']:.4f} {o['fit_seconds']:.1f}s | "
                                 f"DeepCTR {PEERS[m]} AUC {d['auc']:.4f} {d['fit_seconds']:.1f}s\n")
                sys.stdout.flush()
    head = (f"{'model':<11}{'ctrkit AUC':>16}{'DeepCTR AUC':>16}{'dAUC':>8}{'ctrkit LL':>9}{'DeepCTR LL':>11}"
            f"{'ctrkit s':>10}{'DeepCTR s':>11}{'speed x':>9}  target\n")
    sys.stdout.write(f"\n{a.dataset}, test split, mean±std over seeds {a.seeds}, {epochs} epochs, "
                     f"fit seconds (no validation)\n" + head)
    summary: dict[str, Any] = {}
    for m, r in rows.items():
        agg = {side: {k: mean_std([x[k] for x in r[side]]) for k in ("auc", "logloss", "fit_seconds")}
               for side in r}
        d_auc = agg["ctrkit"]["auc"][0] - agg["deepctr"]["auc"][0]
        speed = agg["deepctr"]["fit_seconds"][0] / agg["ctrkit"]["fit_seconds"][0]
        ok_auc, ok_time = d_auc >= -AUC_SLACK, speed > 1.0
        verdict = "PASS" if ok_auc and ok_time else "FAIL(" + ",".join(
            [w for w, ok in (("auc", ok_auc), ("time", ok_time)) if not ok]) + ")"
        sys.stdout.write(
            f"{m:<11}{fmt([x['auc'] for x in r['ctrkit']]):>16}{fmt([x['auc'] for x in r['deepctr']]):>16}"
            f"{d_auc:>+8.4f}{agg['ctrkit']['logloss'][0]:>10.4f}{agg['deepctr']['logloss'][0]:>11.4f}"
            f"{agg['ctrkit']['fit_seconds'][0]:>10.2f}{agg['deepctr']['fit_seconds'][0]:>11.2f}{speed:>9.2f}  {verdict}\n")
        summary[m] = {"peer": PEERS[m], "delta_auc": d_auc, "speed_ratio": speed, "verdict": verdict,
                      **{f"{side}_{k}_{w}": v[i] for side, s in agg.items() for k, v in s.items()
                         for i, w in enumerate(("mean", "std"))},
                      "runs": r}
    for m, err in failed.items():
        sys.stdout.write(f"{m:<11}DeepCTR {PEERS[m]} failed on this data: {err}\n")
    sys.stdout.write("RESULT " + json.dumps({
        "dataset": a.dataset, "seeds": a.seeds, "epochs": epochs, "threads": a.threads,
        "embedding_dim": meta["embedding_dim"], "torch": torch.__version__, "models": summary,
        "peer_failed": failed}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
