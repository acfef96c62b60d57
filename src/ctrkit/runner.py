"""End-to-end jobs behind the CLI: train from a config, evaluate / predict with a checkpoint, the demo.

A checkpoint is self-contained: besides config, schema and weights it carries the training store's
vocabularies (the files of ``<store>/vocab`` as bytes) and how the raw data was read, so ``predict``
maps raw rows exactly as preprocessing did, with nothing else on disk.
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrkit.data.loader import BatchLoader
from ctrkit.data.store import Store
from ctrkit.errors import JobError
from ctrkit.models.registry import create_model, get_model_class
from ctrkit.schema import Schema
from ctrkit.train.config import Config, config_to_dict, load_config

log = logging.getLogger(__name__)



# ---- building blocks -----------------------------------------------------------------------------
def _loader(path: str | None, cfg: Config, *, train: bool, what: str) -> BatchLoader | None:
    if not path:
        return None
    if not Path(path).exists():
        raise JobError(f"data.{what}: store {path} does not exist; create it with `ctrkit preprocess`")
    d = cfg.data
    multi_hot = None
    store = Store(path)
    if d.multi_hot_size:
        from ctrkit.data.multihot import MultiHot

        multi_hot = MultiHot.from_schema(store.schema, d.multi_hot_size, d.multi_hot_min_table_size,
                                         d.multi_hot_distribution)
    if train:
        return BatchLoader(store, d.batch_size, shuffle=d.shuffle, seed=cfg.train.seed, drop_last=d.drop_last,
                           prefetch=d.prefetch, multi_hot=multi_hot)
    return BatchLoader(store, d.eval_batch_size or 4 * d.batch_size, shuffle=False, prefetch=d.prefetch,
                       multi_hot=multi_hot)


def vocab_payload(store: Store) -> dict[str, np.ndarray] | None:
    """The store's vocabulary files as {relative name: uint8 bytes}, for a self-contained checkpoint."""
    vdir = store.path / "vocab"
    if not vdir.is_dir():
        return None
    return {p.name: np.frombuffer(p.read_bytes(), dtype=np.uint8).copy() for p in sorted(vdir.iterdir())}


def _write_vocab(payload: dict[str, Any], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in payload.items():
        (directory / name).write_bytes(np.asarray(data, dtype=np.uint8).tobytes())
    return directory


def train_from_config(cfg: Config, *, resume: str | None = None, progress: bool | None = None) -> dict[str, Any]:
    """Train ``cfg.model`` on ``cfg.data.train``; evaluate on valid during training and on test at the
    end. Returns the trainer's summary plus ``test`` metrics, ``run_dir`` and ``seconds``."""
    from ctrkit.train.trainer import Trainer, seed_everything

    if not cfg.data.train:
        raise JobError("data.train is not set: give the path of a training store")
    if not cfg.model.name:
        raise JobError("model.name is not set; see `ctrkit models` for the choices")
    get_model_class(cfg.model.name)  # an unknown model fails before any data is touched
    if progress is not None:
        cfg = replace(cfg, train=replace(cfg.train, progress=progress))
    t0 = time.perf_counter()
    train = _loader(cfg.data.train, cfg, train=True, what="train")
    store = train.store
    seed_everything(cfg.train.seed)
    model = create_model(cfg.model.name, store.schema, **cfg.model.params)
    valid = _loader(cfg.data.valid, cfg, train=False, what="valid")
    test = _loader(cfg.data.test, cfg, train=False, what="test")
    if hasattr(model, "prefit"):  # e.g. GBDT+LR fits its trees on the training rows first
        model.prefit(list(train))
    name = cfg.run.name or f"{cfg.model.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.run.dir) / name
    trainer = Trainer(
        model, train, cfg.train, valid_loader=valid, run_dir=run_dir, resume_from=resume, run_config=cfg,
        schema=store.schema, model_params=dict(cfg.model.params), vocab=vocab_payload(store),
        extra={"data_format": store.preprocessing.get("format", "criteo"), "preprocessing": store.preprocessing},
    )
    summary = trainer.fit()
    best = run_dir / "best.pt"
    if best.is_file():  # score the test split with the best evaluated weights, not the last ones
        from ctrkit.train.checkpoint import load_checkpoint

        model.load_state_dict(load_checkpoint(best)["model_state"])
    if test is not None:
        summary["test"] = trainer.evaluate(test)
    summary["run_dir"] = str(run_dir)
    summary["seconds"] = time.perf_counter() - t0
    summary["config"] = config_to_dict(cfg)
    return summary


def _eval_loader(store: Store, batch_size: int) -> BatchLoader:
    return BatchLoader(store, batch_size, shuffle=False, prefetch=2)


def predict_store(model: torch.nn.Module, store: Store, batch_size: int = 8192) -> np.ndarray:
    """Click probabilities for every row of ``store``, in order."""
    model.eval()
    out = []
    with torch.no_grad():
        for batch in _eval_loader(store, batch_size):
            out.append(torch.sigmoid(model(batch)).numpy())
    return np.concatenate(out) if out else np.zeros(0, np.float32)


# ---- CLI commands ----------------------------------------------------------------------------------
def run_train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, list(getattr(args, "overrides", []) or []))
    summary = train_from_config(cfg, resume=args.resume, progress=not args.quiet)
    valid = {k: v for k, v in summary.get("last_eval", {}).items() if k != "step"}
    sys.stdout.write(f"run: {summary['run_dir']}\n")
    if valid:  # the last validation metrics (the trainer's summary key "last_eval")
        sys.stdout.write("valid: " + _fmt(valid) + "\n")
    if "test" in summary:
        sys.stdout.write("test:  " + _fmt(summary["test"]) + "\n")
    return 0


def _fmt(metrics: dict[str, Any]) -> str:
    return "  ".join(f"{k}={v:.5f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


def run_evaluate(args: argparse.Namespace) -> int:
    from ctrkit.metrics import MetricSet
    from ctrkit.train.checkpoint import load_model

    model, _schema, cfg = load_model(args.checkpoint)
    path = args.data or (cfg.data.test if isinstance(cfg, Config) else None)
    if not path:
        raise JobError("no store to evaluate: pass --data (the checkpoint's config names no test store)")
    store = Store(path)
    ms = MetricSet(["auc", "logloss", "accuracy", "calibration"])
    model.eval()
    with torch.no_grad():
        for batch in _eval_loader(store, args.batch_size):
            ms.update(torch.sigmoid(model(batch)), batch.labels, batch.weights)
    sys.stdout.write(f"{path}: {_fmt(ms.compute())}\n")
    return 0


def run_predict(args: argparse.Namespace) -> int:
    from ctrkit.data.criteo import preprocess_criteo
    from ctrkit.train.checkpoint import load_checkpoint, load_model

    ckpt = load_checkpoint(args.checkpoint)
    payload = (ckpt.get("vocab") or {}).get("arrays")
    fmt = (ckpt.get("extra") or {}).get("data_format", "criteo")
    if not payload:
        raise JobError(f"{args.checkpoint} carries no vocabularies, so raw rows cannot be mapped to ids")
    if fmt != "criteo":
        raise JobError(f"predict from raw rows supports Criteo TSV checkpoints; this one was trained on {fmt!r}")
    model, schema, _ = load_model(args.checkpoint)
    with tempfile.TemporaryDirectory(prefix="ctrkit-predict-") as tmp:
        vocab_store = Path(tmp) / "vocab_store"
        _write_vocab(payload, vocab_store / "vocab")
        # every row in one split, in input order; any malformed row is an error (no score may go missing)
        stores = preprocess_criteo(args.input, Path(tmp) / "rows", split="1,0", shuffle=False, vocab_from=vocab_store,
                                   max_bad_fraction=0.0, embedding_dim=_embedding_dim(schema), progress=False)
        store = Store(stores["train"])
        scores = predict_store(model, store, args.batch_size)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row", "score"])
        w.writerows(zip(range(len(scores)), (f"{s:.6f}" for s in scores)))
    log.info("wrote %d scores to %s", len(scores), out)
    return 0


def _embedding_dim(schema: Schema) -> int | str:
    dims = {t.embedding_dim for t in schema.tables().values()}
    return dims.pop() if len(dims) == 1 else "auto"


# ---- demo -------------------------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "examples" / "data" / "criteo_sample.tsv.gz"
DEMO_CONFIG = REPO / "configs" / "criteo" / "dlrm.yaml"
DEMO_ARCHES = {
    "dot": [],
    "dcn (low-rank mixture)": ["model.params.interaction=dcn", "model.params.dcn_type=low_rank_mixture"],
    "projection": ["model.params.interaction=projection"],
}


def run_demo(args: argparse.Namespace) -> int:
    from ctrkit.data.criteo import preprocess_criteo

    if not SAMPLE.is_file() or not DEMO_CONFIG.is_file():
        raise JobError(f"the demo needs {SAMPLE} and {DEMO_CONFIG} from a ctrkit source checkout")
    out = Path(args.out)
    # The demo's batches are small (256 rows): one intra-op thread beats two, and cannot be slowed
    # down by OpenMP spin-waits when the machine is busy (measured: 3.9 s vs 19 s for one run, loaded).
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    stores = preprocess_criteo(SAMPLE, out / "criteo", split="0.8,0.1,0.1", seed=0, min_freq=8,
                               embedding_dim=16, overwrite=True)
    prep_s = time.perf_counter() - t0
    n = {k: Store(v).num_rows for k, v in stores.items()}
    sys.stdout.write(f"preprocessed {SAMPLE.name}: {n} rows in {prep_s:.1f}s -> {out / 'criteo'}\n")
    rows = []
    for label, overrides in DEMO_ARCHES.items():
        cfg = load_config(DEMO_CONFIG, [
            f"data.train={stores['train']}", f"data.valid={stores['valid']}", f"data.test={stores['test']}",
            f"train.epochs={args.epochs}", f"run.dir={out / 'runs'}",
            f"run.name=dlrm-{label.split()[0]}", *overrides,
        ])
        s = train_from_config(cfg, progress=False)
        test = s["test"]
        rows.append((label, test["auc"], test["logloss"], s["seconds"]))
    sys.stdout.write("\nDLRM on the bundled Criteo sample (test split):\n")
    sys.stdout.write(f"{'interaction':<24}{'AUC':>8}{'LogLoss':>10}{'seconds':>10}\n")
    for label, auc, ll, sec in rows:
        sys.stdout.write(f"{label:<24}{auc:>8.4f}{ll:>10.4f}{sec:>10.1f}\n")
    sys.stdout.write(f"total {time.perf_counter() - t0:.1f}s; runs and checkpoints under {out / 'runs'}\n")
    return 0
