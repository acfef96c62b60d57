"""ctrkit vs DeepCTR-Torch 0.3.0, side by side on identical data: test AUC, LogLoss, fit seconds.

    python benchmarks/deepctr_compare.py --dataset criteo|movielens [--models deepfm dcn ...] [--seeds 0 1 2 3 4]
                                         [--recipes matched config] [--epochs N] [--threads 1]
                                         [--peer-python PATH] [--out DIR] [--repeats N]

The dataset is preprocessed once by ctrkit (as in bench_models.py) and its train / valid / test stores are
exported to .npz (dense columns, single-valued ids, multi-valued and sequence features as 0-padded id
matrices); the DeepCTR side (benchmarks/_deepctr_peer.py, run in a subprocess with the DeepCTR venv's
python, installed by ../shared/bench/install.sh) reads exactly those arrays. Multi-valued genres and
the item-history sequence (sharing the item table) become DeepCTR VarLenSparseFeat with mean pooling.

Like for like, per model: the architecture options of configs/<dataset>/<model>.yaml translated to the
DeepCTR constructor (DNN widths, cross layers, CIN sizes, attention sizes, regions...), same embedding
dim (16), epochs, batch size and Adam learning rates (DeepCTR: one torch.optim.Adam with the embedding
tables at the config's ``embedding_lr`` and the rest at ``lr``; ctrkit: Adam on dense parameters and the
config's sparse optimizer (sparse_adam = lazy Adam) on embedding rows), the config's DNN dropout on both
sides (none but MovieLens pnn's 0.1), no batch norm, no validation, no early stopping and no weight
averaging on either side (fixed epochs). Regularisation: DeepCTR keeps its
defaults (l2_reg_embedding = l2_reg_linear = 1e-5 on whole tables, added to a *summed* batch loss, i.e.
1e-5 / batch_size per row against a mean loss); ctrkit gets the same per-row strength on the rows a batch
touches, ``embedding_l2 = 2e-5 / batch_size`` (the gradient of 1e-5 ||w||^2 is 2e-5 w).

Where DeepCTR-Torch can only build one form of a model, the matched recipe builds that form on the ctrkit side
too (``MATCHED_PARAMS``): FiBiNET with one bilinear layer shared by the raw and the SENET embeddings
(``bilinear_shared``; DeepCTR-Torch's FiBiNET has one ``Bilinear``, ctrkit's default has two).

Time: the fit loop only, wall and the process's CPU seconds (``cpu x``: steadier where other work shares the
cores), the same on both sides: DeepCTR's ``model.fit`` (which includes building its
TensorDataset) vs ctrkit's ``Trainer.fit`` (loader built before the clock starts). ctrkit trains with the process
settings ``ctrkit train`` applies: glibc keeps freed memory (``train.keep_freed_memory``, default on,
:func:`ctrkit.memory.keep_freed_memory`); DeepCTR runs as installed, or with the same glibc thresholds
(``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``) under ``--peer-keep-freed-memory``. Metrics: both sides'
test probabilities scored here with sklearn (roc_auc_score, log_loss). Every run is scored on the valid
split too (``config``: its best epoch's valid AUC, as logged), and the table gives each side's valid std next
to the test figures: defaults are chosen on those, the test column only reports.

Two ctrkit recipes per seed against one DeepCTR run per seed (``--recipes``, both by default):

- ``matched``: the like-for-like recipe above (fixed epochs, no validation, DeepCTR's L2 strength).
- ``config``: configs/<dataset>/<model>.yaml as it ships (``ctrkit train``): its own epochs, regularisation
  and early stopping on valid AUC, test scored with the best-valid weights. The DeepCTR run is the one
  above (the config's learning rates, DeepCTR's default regularisation, fixed epochs: its ``model.fit``
  has no early stopping unless given callbacks), so this column is where a config default (embedding L2,
  epochs, patience) shows against DeepCTR used as documented.

Fixed epochs (``EPOCHS``): Criteo 5, the median best-valid epoch of the shipped configs' runs (seeds 0-9);
MovieLens 3.

Seed-to-seed spread: every figure is a mean ± sample std over ``--seeds`` (5 by default); a seed sets the
initialisation and the batch order on both sides, the split stays fixed (``--split-seed``), so the std is
training noise only, on the same test rows.

Targets per model: ctrkit ``matched`` AUC >= DeepCTR AUC - 0.002 and ctrkit fit time lower. The spread
target is per dataset: the zoo's pooled std of test AUC (root of the degrees-of-freedom-weighted mean
variance over the models) of each ctrkit recipe <= DeepCTR's. One model's std over 10-20 seeds is too unsteady
to judge alone (with 10 seeds a side, a std ratio of 1.5 still has p ~ 0.12, and of 11 models with truly equal
spreads about half come out wider by luck), so each model gets ``p``, a one-sided F test of "ctrkit's runs are
more spread out", the line per recipe counts the models at or under DeepCTR's std and names those wider after
Holm's correction for testing every model (family-wise 5%), and the pooled stds get their own one-sided F
test with Satterthwaite's degrees of freedom (``pooled_p``).
``--peer-cache DIR`` reuses DeepCTR runs already made with the same script, arguments and data.

``--repeats N`` (default 1): each seed's DeepCTR fit and ctrkit ``matched`` fit run N times each, alternated (DeepCTR,
ctrkit, DeepCTR, ...), and each side's fit seconds and CPU seconds are the median of its N fits (every fit's in
``cpu_seconds_repeats`` / ``fit_seconds_repeats``): one fit slowed by other work on the cores moves a median of 3
not at all. The scores are the first fit's; the repeats must score the same (both sides are deterministic per seed
at one thread), and the largest test AUC difference between a side's fits is reported (``repeat_auc_max_difference``).
Prints the table and ends with ONE line ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _roof
from bench_models import PEER_INSTALL, REPO, mean_std, prepare

from ctrkit import stats
from ctrkit.memory import freed_memory_thresholds

PEER = Path(__file__).resolve().parent / "_deepctr_peer.py"
PEER_PYTHON = Path(os.environ.get("PEERS_HOME", Path.home() / ".cache" / "ctrkit-peers")) / "venv-deepctr/bin/python"
# ctrkit model -> DeepCTR-Torch model
PEERS = {"wide_deep": "WDL", "deepfm": "DeepFM", "xdeepfm": "xDeepFM", "nfm": "NFM", "afm": "AFM", "dcn": "DCN",
         "dcnv2": "DCNMix", "pnn": "PNN", "autoint": "AutoInt", "fibinet": "FiBiNET", "mlr": "MLR"}
# fixed epochs of the like-for-like runs (see the module docstring)
EPOCHS = {"criteo": 5, "movielens": 3}
AUC_SLACK = 0.002
RECIPES = ("matched", "config")
LABEL = {"deepctr": "DeepCTR", "matched": "ctrkit matched", "config": "ctrkit config"}
DEEPCTR_L2 = 1e-5  # DeepCTR's default l2_reg_embedding / l2_reg_linear
# the matched recipe's ctrkit options where DeepCTR-Torch builds only one form of the model (module docstring)
MATCHED_PARAMS: dict[str, dict[str, Any]] = {"fibinet": {"bilinear_shared": True}}
# glibc's thresholds as ctrkit.memory.keep_freed_memory sets them (1 GiB mmap, 2 GiB - 1 trim), as environment
PEER_KEEP_FREED_MEMORY = dict(zip(("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"),
                                  map(str, freed_memory_thresholds())))


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
        return {"attention_factor": p.get("att_dim", 16), "afm_dropout": p.get("att_dropout", 0.0)}
    if model == "dcn":
        return {**dnn, "cross_num": p.get("cross_layers", 3), "cross_parameterization": "vector",
                "dnn_dropout": p.get("dnn_dropout", 0.0)}
    if model == "dcnv2":
        if p.get("cross_type") != "low_rank_mixture" or p.get("structure", "parallel") != "parallel":
            raise SystemExit("dcnv2 compares with DeepCTR's DCNMix: needs cross_type=low_rank_mixture, "
                             "structure=parallel")
        return {**dnn, "cross_num": p.get("cross_layers", 3), "low_rank": p.get("cross_rank", 32),
                "num_experts": p.get("cross_experts", 4), "dnn_dropout": p.get("dnn_dropout", 0.0)}
    if model == "pnn":
        prod = p.get("product", "inner")
        return {"dnn_hidden_units": list(p.get("dnn_hidden", [128, 64])), "use_inner": prod in ("inner", "both"),
                "use_outter": prod in ("outer", "both"), "dnn_dropout": p.get("dnn_dropout", 0.0)}
    if model == "autoint":
        if p.get("dense_as_fields", True):
            raise SystemExit("DeepCTR's AutoInt attends over the sparse fields only: set dense_as_fields=false")
        return {**(dnn if p.get("autoint_plus") else {"dnn_hidden_units": []}),
                "att_layer_num": p.get("num_layers", 3), "att_head_num": p.get("num_heads", 2),
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
    """Write ``out/{train,valid,test}.npz`` + ``out/meta.json`` from ctrkit stores -> the meta dict."""
    from ctrkit.data.storage.store import Store

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
    for split in ("train", "valid", "test"):
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


def matched_overrides(model: str) -> list[str]:
    """``model.params.<k>=<v>`` overrides of the matched recipe (``MATCHED_PARAMS``)."""
    return [f"model.params.{k}={json.dumps(v)}" for k, v in MATCHED_PARAMS.get(model, {}).items()]


def run_ctrkit(config: Path, stores: dict[str, str], seed: int, epochs: int) -> dict[str, Any]:
    """Fit ``config`` for ``epochs`` with no validation -> {pred, pred_valid, fit_seconds, params} (probs)."""
    from ctrkit.data.storage.loader import BatchLoader
    from ctrkit.data.storage.store import Store
    from ctrkit.jobs.common import seed_everything
    from ctrkit.jobs.scoring import predict_store
    from ctrkit.memory import keep_freed_memory
    from ctrkit.models.registry import create_model
    from ctrkit.training.config import load_config
    from ctrkit.training.trainer import Trainer

    cfg = load_config(config, [f"train.seed={seed}", f"train.epochs={epochs}", "train.early_stopping.patience=0",
                               "train.ema_decay=null", "train.progress=false", *matched_overrides(config.stem)])
    if cfg.train.keep_freed_memory:  # process-wide, as the train job sets it (the Trainer leaves it alone)
        keep_freed_memory()
    b = cfg.data.batch_size
    cfg.train.embedding_l2 = 2 * DEEPCTR_L2 / b
    train = BatchLoader(Store(stores["train"]), b, shuffle=True, seed=seed, prefetch=cfg.data.prefetch)
    seed_everything(seed)
    model = create_model(cfg.model.name, train.store.schema, **cfg.model.params)
    seed_everything(seed)  # the training run's draws (dropout), as the train job seeds them
    trainer = Trainer(model, train, cfg.train)  # no valid loader, no run dir: the fit loop only
    _build_native_kernels()  # a first build (once per machine, then cached) stays out of the clock
    r0, t0, c0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), time.process_time()
    trainer.fit()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    pred = predict_store(model, Store(stores["test"]), 4096)
    pred_valid = predict_store(model, Store(stores["valid"]), 4096)
    return {"pred": pred, "pred_valid": pred_valid, "fit_seconds": seconds, "cpu_seconds": cpu_seconds,
            "params": sum(p.numel() for p in model.parameters()),
            # what a slow fit can be told by: page faults, the kernel's share, preemptions (other work's cache use)
            "rusage": {"minor_faults": r1.ru_minflt - r0.ru_minflt, "major_faults": r1.ru_majflt - r0.ru_majflt,
                       "system_seconds": round(r1.ru_stime - r0.ru_stime, 3),
                       "involuntary_switches": r1.ru_nivcsw - r0.ru_nivcsw}}


def _build_native_kernels() -> None:
    """Build (or load from the cache) ctrkit's native kernels, where this src has them (an A/B may run an older one)."""
    import importlib

    for module in ("field_attention_lanes", "bilinear_pairs_native", "embedding_update", "embedding_joint"):
        try:
            importlib.import_module(f"ctrkit.nn.{module}").kernel_available()
        except (ImportError, AttributeError):  # an older src without that kernel
            continue


def median_fit(fits: list[dict[str, Any]], y: np.ndarray) -> dict[str, Any]:
    """One side's repeated fits of one seed -> the first fit's result with ``fit_seconds`` / ``cpu_seconds`` the
    median over the fits (each fit's kept in ``*_repeats``) and ``repeat_auc_max_difference``, the largest test
    AUC difference from the first fit (0 when the side is deterministic). One fit: returned as it is."""
    if len(fits) == 1:
        return fits[0]
    out = dict(fits[0])
    for key in ("fit_seconds", "cpu_seconds"):
        values = [f[key] for f in fits if f.get(key) is not None]
        if values:
            out[key], out[f"{key}_repeats"] = statistics.median(values), values
    aucs = [score(y, f["pred"])["auc"] for f in fits]  # each fit scored once
    out["repeat_auc_max_difference"] = max(abs(auc - aucs[0]) for auc in aucs)
    return out


def _repeats_note(run: dict[str, Any]) -> str:
    """' [median of 5.2 5.9 5.3 cpu s]' for a run with repeated fits, else ''."""
    if "cpu_seconds_repeats" not in run:
        return ""
    return (f" [median of {' '.join(f'{v:.2f}' for v in run['cpu_seconds_repeats'])} cpu s; "
            f"AUC spread {run['repeat_auc_max_difference']:.1e}]")


def run_ctrkit_config(config: Path, stores: dict[str, str], seed: int, run_dir: Path) -> dict[str, Any]:
    """Train ``config`` as it ships (valid early stopping, best-valid weights) -> {pred, fit_seconds, epochs, ...}."""
    from ctrkit.jobs.train import train_from_config
    from ctrkit.training.config import load_config

    name = f"{config.stem}-seed{seed}"
    cfg = load_config(config, [f"data.{k}={v}" for k, v in stores.items()] + [
        f"train.seed={seed}", "train.progress=false", f"run.dir={run_dir}", f"run.name={name}", "run.overwrite=true"])
    s = train_from_config(cfg, progress=False)
    rows = np.load(run_dir / name / "predictions.npz")
    return {"pred": rows["score"], "label": rows["label"], "fit_seconds": s["train_seconds"], "epochs": s["epochs"],
            "best_epoch": (s["best"] or {}).get("epoch"), "valid_auc": (s["best"] or {}).get("value"),
            "params": s["model_size"]["parameters"]}


def peer_cache_key(data: Path, args: list[str]) -> str:
    """What decides a DeepCTR run: the peer script, its arguments (not the paths) and the exported arrays."""
    h = hashlib.sha256(PEER.read_bytes())
    h.update(json.dumps(args).encode())
    h.update(data_digest(data).encode())
    return h.hexdigest()[:24]


@functools.cache
def data_digest(data: Path) -> str:
    """The exported arrays' digest, read once per run of this script (the export is written before any run)."""
    h = hashlib.sha256((data / "meta.json").read_bytes())
    for split in ("train", "valid", "test"):  # the arrays, not the files (a zip entry carries its write time)
        with np.load(data / f"{split}.npz") as z:
            for name in sorted(z.files):
                h.update(name.encode() + str(z[name].dtype).encode() + str(z[name].shape).encode())
                h.update(np.ascontiguousarray(z[name]).tobytes())
    return h.hexdigest()


def run_peer(python: Path, data: Path, model: str, params: dict[str, Any], cfg: Any, seed: int, epochs: int,
             threads: int, cache: Path | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One DeepCTR run -> its PEER_RESULT fields with ``pred`` / ``pred_valid``. With ``cache``, a run whose
    script, arguments and data were seen before is read back (DeepCTR-Torch's runs are deterministic per seed
    on one machine; the cached fit seconds are the earlier run's) and a new one is stored there. ``env``: extra
    environment variables of the subprocess (not part of the cache key)."""
    out = data / f"pred-{model}-{seed}.npz"
    elr = cfg.train.embedding_lr if cfg.train.embedding_lr is not None else cfg.train.lr
    args = ["--model", model, "--seed", str(seed), "--epochs", str(epochs), "--batch-size", str(cfg.data.batch_size),
            "--lr", str(cfg.train.lr), "--embedding-lr", str(elr), "--threads", str(threads),
            "--params", json.dumps(params)]
    hit = None
    if cache is not None:
        hit = cache / f"{model}-{seed}-{peer_cache_key(data, args)}"
        if hit.with_suffix(".json").is_file() and hit.with_suffix(".npz").is_file():
            res = json.loads(hit.with_suffix(".json").read_text())
            with np.load(hit.with_suffix(".npz")) as saved:
                return {**res, "pred": saved["pred"], "pred_valid": saved["pred_valid"], "cached": True}
    cmd = [str(python), str(PEER), "--data", str(data), *args, "--out", str(out)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, **(env or {})})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEER_RESULT ")]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        sys.stderr.write(f"DeepCTR peer failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}\n")
        return {"error": err}
    res = json.loads(lines[-1].split(" ", 1)[1])
    saved = np.load(out)
    if hit is not None:
        cache.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, hit.with_suffix(".npz"))
        hit.with_suffix(".json").write_text(json.dumps(res))
    res["pred"], res["pred_valid"] = saved["pred"], saved["pred_valid"]
    return res


def score(y: np.ndarray, p: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import log_loss, roc_auc_score

    p = np.clip(np.asarray(p, np.float64), 1e-7, 1 - 1e-7)
    return {"auc": float(roc_auc_score(y, p)), "logloss": float(log_loss(y, p))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=["criteo", "movielens"], help="required unless --merge")
    ap.add_argument("--models", nargs="*", help=f"ctrkit names (default: all of {sorted(PEERS)})")
    ap.add_argument("--seeds", nargs="*", type=int, default=list(range(5)))
    ap.add_argument("--recipes", nargs="*", choices=RECIPES, default=list(RECIPES),
                    help="ctrkit recipes: matched (like for like) and/or config (the config as it ships); none "
                    "(a bare --recipes): DeepCTR alone, e.g. to fill --peer-cache")
    ap.add_argument("--epochs", type=int, help=f"epochs of the fixed-epoch runs, both sides (default {EPOCHS})")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides")
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--peer-python", default=str(PEER_PYTHON))
    ap.add_argument("--out", help="work directory (default: a temporary one)")
    ap.add_argument("--peer-cache", help="directory of DeepCTR runs to reuse and add to (keyed by the peer script, "
                    "its arguments and the exported data): re-measuring ctrkit's defaults does not re-run "
                    "DeepCTR. Its fit seconds are then the cached run's, so not with the matched recipe")
    ap.add_argument("--peer-keep-freed-memory", action="store_true", help="run DeepCTR with the glibc thresholds "
                    "ctrkit train sets (MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_); default: as installed")
    ap.add_argument("--repeats", type=int, default=1, help="fits per seed and side (DeepCTR and the matched recipe), "
                    "alternated; each side's fit seconds are the median of its fits (robust to one slow fit)")
    ap.add_argument("--merge", nargs="+", metavar="LOG", help="no training: one report over the RESULT lines of "
                    "earlier runs' output (the same setup, the models split between them)")
    a = ap.parse_args(argv)
    if a.merge:
        return merge(a.merge)
    if a.peer_cache and "matched" in a.recipes:
        raise SystemExit("--peer-cache reuses DeepCTR's earlier fit seconds; the matched recipe compares speed "
                         "measured in the same run: pass --recipes config, or drop --peer-cache")
    if not a.dataset:
        ap.error("--dataset is required (criteo or movielens)")
    if a.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {a.repeats}")
    from ctrkit.training.config import load_config

    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(a.threads)
    models = a.models or list(PEERS)
    bad = [m for m in models if m not in PEERS]
    if bad:
        raise SystemExit(f"no DeepCTR counterpart for {bad}; choose from {sorted(PEERS)}")
    if not Path(a.peer_python).is_file():
        raise SystemExit(f"{a.peer_python} not found: install DeepCTR-Torch with {PEER_INSTALL}")
    epochs = a.epochs or EPOCHS[a.dataset]
    sides = ["deepctr", *a.recipes]
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    failed: dict[str, str] = {}
    cpu = torch.backends.cpu.get_cpu_capability()
    with tempfile.TemporaryDirectory(prefix="ctrkit-deepctr-") as tmp:
        out = Path(a.out) if a.out else Path(tmp)
        stores = prepare(a.dataset, out, a.split_seed)
        data = out / "npz"
        meta = export(stores, data)
        y = np.load(data / "test.npz")["label"]
        y_valid = np.load(data / "valid.npz")["label"]
        sys.stdout.write(f"{a.dataset}: {len(meta['dense'])} dense, {len(meta['sparse'])} sparse, "
                         f"{len(meta['varlen'])} varlen features; {len(y)} test rows; epochs={epochs}; "
                         f"threads={a.threads}; seeds={a.seeds}; recipes={a.recipes}; torch {torch.__version__}, "
                         f"CPU capability {cpu}; ctrkit keeps freed memory as ctrkit train does, DeepCTR "
                         f"{'with the same glibc thresholds' if a.peer_keep_freed_memory else 'as installed'}; "
                         f"matched-recipe options {MATCHED_PARAMS}\n")
        for m in models:
            path = REPO / "configs" / a.dataset / f"{m}.yaml"
            cfg = load_config(path)
            params = peer_params(m, cfg.model.params)
            rows[m] = {side: [] for side in sides}
            for seed in a.seeds:
                fits: dict[str, list[dict[str, Any]]] = {"deepctr": [], "matched": []}
                for _ in range(a.repeats):  # alternated, so both sides see the same stretch of load
                    fits["deepctr"].append(run_peer(
                        Path(a.peer_python), data, PEERS[m], params, cfg, seed, epochs, a.threads,
                        Path(a.peer_cache) if a.peer_cache else None,
                        PEER_KEEP_FREED_MEMORY if a.peer_keep_freed_memory else None))
                    if "error" in fits["deepctr"][-1] or "matched" not in a.recipes:
                        break
                    fits["matched"].append(run_ctrkit(path, stores, seed, epochs))
                peer = fits["deepctr"][0]
                if "error" in peer:  # the peer cannot run this model on this data: say so, skip the model
                    failed[m] = peer["error"]
                    sys.stdout.write(f"  {m:<10} seed {seed}: DeepCTR {PEERS[m]} failed: {peer['error']}\n")
                    del rows[m]
                    break
                runs = {"deepctr": median_fit(fits["deepctr"], y)}
                if "matched" in a.recipes:
                    runs["matched"] = median_fit(fits["matched"], y)
                if "config" in a.recipes:
                    runs["config"] = run_ctrkit_config(path, stores, seed, out / "runs")
                    if not np.array_equal(runs["config"].pop("label"), y):
                        raise SystemExit(f"{m} seed {seed}: the run's test rows are not the exported ones")
                for side, r in runs.items():
                    # valid AUC: what defaults are chosen on (config: its best epoch's, as logged)
                    va = score(y_valid, r.pop("pred_valid"))["auc"] if "pred_valid" in r else r.pop("valid_auc")
                    rows[m][side].append({**score(y, r.pop("pred")), "valid_auc": va, **r})
                line = " | ".join(f"{LABEL[side]} AUC {rows[m][side][-1]['auc']:.4f} "
                                  f"{rows[m][side][-1]['fit_seconds']:.1f}s"
                                  + (f" (cpu {rows[m][side][-1]['cpu_seconds']:.1f}s)"
                                     if rows[m][side][-1].get("cpu_seconds") is not None else "")
                                  + _repeats_note(rows[m][side][-1]) for side in sides)
                sys.stdout.write(f"  {m:<10} seed {seed}: {line}\n")
                sys.stdout.flush()
        # the matmul roof and each model's FLOPs per training sample, same run (issue 29 item 1)
        n_train = len(np.load(data / "train.npz")["label"])
        rates = {m: {s: n_train * statistics.mean(r.get("epochs", epochs) / r["fit_seconds"] for r in rs)
                     for s, rs in sides_.items()} for m, sides_ in rows.items()}
        flops = {m: _roof.model_flops_from_config(REPO / "configs" / a.dataset / f"{m}.yaml", stores["train"],
                                                  overrides=matched_overrides(m)) for m in rows}
        roof = _roof.zoo_roof(_roof.measure(a.threads), flops, rates, lambda t: sys.stdout.write(t + "\n"))
    return report(a.dataset, a.seeds, a.recipes, epochs, a.threads, meta["embedding_dim"], cpu, rows, failed,
                  roof=roof)


def report(dataset: str, seeds: list[int], recipes: list[str], epochs: int, threads: int, embedding_dim: int,
           cpu: str, rows: dict[str, dict[str, list[dict[str, Any]]]], failed: dict[str, str],
           torch_version: str = torch.__version__, roof: dict[str, Any] | None = None) -> int:
    """The table, the pooled stds, the spread verdicts and the RESULT line of per-run results ``rows``
    (model -> side -> one dict per seed)."""
    sides = ["deepctr", *recipes]
    summary = {m: summarise(r) for m, r in rows.items()}
    write_table(dataset, seeds, epochs, sides, summary)
    pooled = pooled_std(summary, sides)
    pooled_valid = pooled_std(summary, sides, "valid_auc")
    if pooled:
        sys.stdout.write("pooled std over the models (root of the mean variance, weighted by runs - 1): test AUC "
                         + "  ".join(f"{LABEL[side]} {v:.4f}" for side, v in pooled.items()) + ";  valid AUC "
                         + "  ".join(f"{LABEL[side]} {v:.4f}" for side, v in pooled_valid.items()) + "\n")
    verdicts = spread_verdicts(summary, sides)
    for side, v in verdicts.items():
        pooled_p = "n/a" if v["pooled_p"] is None else f"{v['pooled_p']:.2f}"
        sys.stdout.write(f"spread, {LABEL[side]}: target {'MET' if v['met'] else 'NOT MET'} (pooled test AUC std "
                         f"{v['pooled_std']:.5f} vs DeepCTR's {v['peer_pooled_std']:.5f}, p = {pooled_p} for "
                         f"'wider'); std <= DeepCTR's for {v['at_most_peer']} of {v['models']} models; wider after "
                         f"Holm's correction: {', '.join(v['wider_holm']) or 'none'}; at p < 0.05 uncorrected: "
                         f"{', '.join(v['wider_p05']) or 'none'}\n")
    for m, err in failed.items():
        sys.stdout.write(f"{m:<11}DeepCTR {PEERS[m]} failed on this data: {err}\n")
    sys.stdout.write("RESULT " + json.dumps({
        "dataset": dataset, "seeds": seeds, "recipes": recipes, "epochs": epochs, "threads": threads,
        "embedding_dim": embedding_dim, "torch": torch_version, "cpu_capability": cpu,
        "models": {m: {"peer": PEERS[m], **s, "runs": rows[m]} for m, s in summary.items()},
        "pooled_auc_std": pooled, "pooled_valid_auc_std": pooled_valid, "spread_verdicts": verdicts,
        "peer_failed": failed, "roof": roof}) + "\n")
    return 0


def merge(paths: list[str]) -> int:
    """One report over the RESULT lines of several runs of this script (e.g. its models split over processes):
    the same dataset, seeds, recipes, epochs and threads, each model in one of them."""
    results = []
    for path in paths:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.startswith("RESULT ")]
        if not lines:
            raise SystemExit(f"{path}: no RESULT line (did that run finish?)")
        results.append(json.loads(lines[-1].split(" ", 1)[1]))
    first = results[0]
    keys = ("dataset", "seeds", "recipes", "epochs", "threads", "embedding_dim", "cpu_capability", "torch")
    for path, r in zip(paths, results):
        differ = [k for k in keys if r.get(k) != first.get(k)]
        if differ:
            raise SystemExit(f"{path} differs from {paths[0]} in {differ}: merge only runs of one setup")
    rows: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for path, r in zip(paths, results):
        twice = sorted(set(r["models"]) & set(rows))
        if twice:
            raise SystemExit(f"{path}: {twice} also in an earlier file; each model must come from one run")
        rows.update({m: v["runs"] for m, v in r["models"].items()})
        failed.update(r.get("peer_failed", {}))
    return report(first["dataset"], first["seeds"], first["recipes"], first["epochs"], first["threads"],
                  first["embedding_dim"], first["cpu_capability"], rows, failed, first["torch"])


def summarise(r: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per model: mean / std of every side's auc, logloss, fit seconds, and the verdicts.

    ``r``: side ("deepctr", "matched", "config") -> one result per seed."""
    out: dict[str, Any] = {}
    for side, runs in r.items():
        for k in ("auc", "logloss", "fit_seconds", "valid_auc"):
            out[f"{side}_{k}_mean"], out[f"{side}_{k}_std"] = mean_std([x[k] for x in runs])
        out[f"{side}_runs"] = len(runs)
    if "matched" in r:  # the like-for-like targets: AUC within the slack, faster fit
        out["delta_auc"] = out["matched_auc_mean"] - out["deepctr_auc_mean"]
        out["speed_ratio"] = out["deepctr_fit_seconds_mean"] / out["matched_fit_seconds_mean"]
        # CPU seconds of the fit (the process's, both sides): steadier than wall time on cores shared with others
        cpu = {side: [x.get("cpu_seconds") for x in r[side]] for side in ("deepctr", "matched")}
        if all(v is not None for vs in cpu.values() for v in vs):
            out["cpu_ratio"] = mean_std(cpu["deepctr"])[0] / mean_std(cpu["matched"])[0]
        misses = [w for w, ok in (("auc", out["delta_auc"] >= -AUC_SLACK), ("time", out["speed_ratio"] > 1.0))
                  if not ok]
        out["verdict"] = "FAIL(" + ",".join(misses) + ")" if misses else "PASS"
    if "config" in r:
        out["config_delta_auc"] = out["config_auc_mean"] - out["deepctr_auc_mean"]
    # A peer whose runs do not depend on the seed has no spread to compare with (DeepCTR-Torch 0.3.0's MLR
    # drops ``seed``; _deepctr_peer.py hands it on, so this shows only if that ever breaks).
    same = len({x["auc"] for x in r["deepctr"]}) == 1 < len(r["deepctr"])
    out["spread"] = {side: "n/a" if same else "PASS" if out[f"{side}_auc_std"] <= out["deepctr_auc_std"] else "FAIL"
                     for side in r if side != "deepctr"}
    # how surprising the ratio is if both libraries had the same spread: one-sided F test of
    # var(ctrkit) > var(DeepCTR) (a small p: ctrkit's runs really are more spread out than DeepCTR's)
    out["spread_p"] = {side: stats.spread_p([x["auc"] for x in r[side]], [x["auc"] for x in r["deepctr"]])
                       for side in r if side != "deepctr"}
    return out


def pooled_std(summary: dict[str, Any], sides: list[str], metric: str = "auc") -> dict[str, float]:
    """Per side, the pooled std of ``metric`` (test "auc" or "valid_auc") over the models
    (``ctrkit.stats.pooled_std``): the zoo's spread as one figure, which five or ten seeds estimate far more steadily than any one model's std."""
    if not summary:
        return {}
    return {side: stats.pooled_std([(s[f"{side}_{metric}_std"], s[f"{side}_runs"]) for s in summary.values()])
            for side in sides}


def spread_verdicts(summary: dict[str, Any], sides: list[str], alpha: float = 0.05) -> dict[str, dict[str, Any]]:
    """Per ctrkit side, the spread target on this dataset and how each model stands.

    The target (``met``): the zoo's pooled test-AUC std (``pooled_std``) is no larger than DeepCTR's. One model's
    std over 10-20 seeds is too unsteady to judge alone (see ``ctrkit.stats.spread_p``), so beside the count of
    models at or under DeepCTR's std, ``pooled_p`` tests the whole zoo (``ctrkit.stats.pooled_spread_p``) and
    ``wider_holm`` names the models wider than DeepCTR's after Holm's correction for testing every model at
    family-wise ``alpha``; ``wider_p05`` keeps the uncorrected list."""
    out = {}
    for side in sides:
        if side == "deepctr":
            continue
        p = {m: s["spread_p"][side] for m, s in summary.items() if s["spread_p"][side] is not None}
        ours = [(s[f"{side}_auc_std"], s[f"{side}_runs"]) for s in summary.values()]
        peer = [(s["deepctr_auc_std"], s["deepctr_runs"]) for s in summary.values()]
        pooled, peer_pooled = stats.pooled_std(ours), stats.pooled_std(peer)
        out[side] = {"models": len(summary),
                     "at_most_peer": sum(s["spread"][side] == "PASS" for s in summary.values()),
                     "wider_p05": [m for m, v in p.items() if v < alpha],
                     "wider_holm": stats.holm(p, alpha),
                     "pooled_std": pooled, "peer_pooled_std": peer_pooled,
                     "pooled_p": stats.pooled_spread_p(ours, peer),
                     "met": bool(summary) and pooled <= peer_pooled}
    return out


def write_table(dataset: str, seeds: list[int], epochs: int, sides: list[str], summary: dict[str, Any]) -> None:
    """The mean ± std table of test AUC (every side), then the matched recipe's LogLoss and fit seconds."""
    w = 22
    sys.stdout.write(f"\n{dataset}, test split, test AUC mean±std over {len(seeds)} seeds {seeds}; DeepCTR and "
                     f"'matched': {epochs} epochs, no validation; 'config': the config as it ships "
                     f"(early stopping on valid)\n")
    sys.stdout.write(f"{'model':<11}" + "".join(f"{LABEL[s] + ' AUC':>{w}}" for s in sides)
                     + f"  {'valid std ' + '/'.join(sides):<{10 + 7 * len(sides)}}" + "  spread (std <= DeepCTR; p: F test of 'wider')"
                     + ("  matched: dAUC  LL ctrkit/DeepCTR  fit s ctrkit/DeepCTR  speed x  target" if "matched" in sides
                        else "") + ("  cpu x" if "matched" in sides else "") + "\n")
    for m, s in summary.items():
        cells = "".join(f"{s[f'{side}_auc_mean']:.4f}±{s[f'{side}_auc_std']:.4f}".rjust(w) for side in sides)
        cells += "  valid std " + "/".join(f"{s[f'{side}_valid_auc_std']:.4f}" for side in sides)
        spread = " ".join(f"{side} {v}" + ("" if s["spread_p"][side] is None else f" p={s['spread_p'][side]:.2f}")
                          for side, v in s["spread"].items())
        matched = ""
        if "matched" in sides:
            matched = (f"  {s['delta_auc']:+.4f}  {s['matched_logloss_mean']:.4f}/{s['deepctr_logloss_mean']:.4f}"
                       f"  {s['matched_fit_seconds_mean']:.2f}/{s['deepctr_fit_seconds_mean']:.2f}"
                       f"  {s['speed_ratio']:.2f}  {s['verdict']}"
                       + (f"  {s['cpu_ratio']:.2f}" if "cpu_ratio" in s else ""))
        sys.stdout.write(f"{m:<11}{cells}  {spread:<44}{matched}\n")


if __name__ == "__main__":
    raise SystemExit(main())
