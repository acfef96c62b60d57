"""End-to-end jobs behind the CLI: train from a config, evaluate / predict with a checkpoint, the demo.

A checkpoint is self-contained: besides config, schema and weights it carries the training data's
:class:`~ctrkit.data.pipeline.feature_pipeline.FeaturePipeline` (vocabularies, dense statistics, the multi-hot stage
when training used one), so ``evaluate`` and ``predict`` apply exactly what training applied, with
nothing else on disk.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.pipeline.persist import pipeline_from_checkpoint, to_payload
from ctrkit.data.storage.agree import Vocabularies, check_same_vocabulary
from ctrkit.data.storage.fitted import pipeline_from_store
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store, check_replaceable
from ctrkit.errors import JobError
from ctrkit.io import atomic_file, make_dir, missing_path
from ctrkit.models.base import logits_of
from ctrkit.models.registry import check_model_params, create_model
from ctrkit.train.config import Config, config_to_dict, load_config

log = logging.getLogger(__name__)



# ---- building blocks -----------------------------------------------------------------------------
def _loader(path: str | None, cfg: Config, *, train: bool, what: str,
            pipeline: FeaturePipeline | None = None) -> BatchLoader | None:
    """Loader of the store at ``path``, with the batch-level stage of ``pipeline`` (default: the store's
    pipeline as :func:`training_pipeline` sets it up; valid / test loaders get the training one)."""
    if not path:
        return None
    if not Path(path).exists():
        raise JobError(missing_path(path, f"data.{what}: store", f"Create it with `ctrkit preprocess ... --out DIR` "
                                    f"and set data.{what}=DIR/{what}"))
    d = cfg.data
    store = Store(path)
    pipeline = pipeline if pipeline is not None else training_pipeline(store, cfg)
    if train:
        return BatchLoader(store, d.batch_size, shuffle=d.shuffle, seed=cfg.train.seed, drop_last=d.drop_last,
                           prefetch=d.prefetch, pipeline=pipeline)
    return BatchLoader(store, d.eval_batch_size or 4 * d.batch_size, shuffle=False, prefetch=d.prefetch,
                       pipeline=pipeline)


def training_pipeline(store: Store, cfg: Config) -> FeaturePipeline:
    """The pipeline a model trained on ``store`` with ``cfg`` sees: the store's, plus the multi-hot stage
    of ``data.multi_hot_*`` (the one place these options are read; checkpoints carry the result)."""
    pipeline = pipeline_from_store(store)
    d = cfg.data
    if d.multi_hot_size:
        pipeline = pipeline.with_multi_hot(d.multi_hot_size, d.multi_hot_min_table_size, d.multi_hot_distribution)
    return pipeline


def vocab_payload(store: Store) -> dict[str, np.ndarray] | None:
    """The store's vocabulary files as {relative name: uint8 bytes}, for a self-contained checkpoint."""
    vdir = store.path / "vocab"
    if not vdir.is_dir():
        return None
    return {p.name: np.frombuffer(p.read_bytes(), dtype=np.uint8).copy() for p in sorted(vdir.iterdir())}


RETRIEVAL_METRICS = ["hr@10", "hr@50", "ndcg@10", "mrr"]
RANKING_DEFAULTS = (["auc", "logloss"], "auc")  # TrainConfig's metrics / early-stopping metric defaults


def retrieval_config(cfg: Config) -> Config:
    """``cfg`` with retrieval metrics where it kept the ranking defaults (metrics [auc, logloss], early stopping on
    auc): full-ranking HR@10 / HR@50 / NDCG@10 / MRR, early stopping (and best.pt) on NDCG@10."""
    t = cfg.train
    metrics = list(RETRIEVAL_METRICS) if t.metrics == RANKING_DEFAULTS[0] else list(t.metrics)
    es = t.early_stopping
    if es.metric == RANKING_DEFAULTS[1]:
        es = replace(es, metric="ndcg@10")
    if es.metric not in metrics:
        metrics.append(es.metric)
    return replace(cfg, train=replace(t, metrics=metrics, early_stopping=es))


def retrieval_task(cfg: Config, catalogue: Any, seen: Any) -> Any:
    """The :class:`~ctrkit.train.tasks.RetrievalTask` of ``cfg.train.retrieval`` over ``catalogue``, excluding the
    items ``seen`` (:class:`~ctrkit.retrieval.catalogue.SeenItems`; None: only the rows' own histories)."""
    from ctrkit.train.tasks import RetrievalTask

    r = cfg.train.retrieval
    return RetrievalTask(catalogue, seen=seen, loss=r.loss, log_q=r.log_q, num_negatives=r.num_negatives,
                         sampling=r.sampling, alpha=r.alpha, metrics=cfg.train.metrics, precision=cfg.train.precision)


def train_from_config(cfg: Config, *, resume: str | None = None, progress: bool | None = None,
                      callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train ``cfg.model`` on ``cfg.data.train``; evaluate on valid during training and on test at the
    end, with the best validation checkpoint. ``callbacks``: :class:`~ctrkit.train.trainer.Callback` objects
    (one that raises stops training). The run directory gets, besides metrics.jsonl and the checkpoints,
    summary.json (the returned dict, see :func:`run_summary`), predictions.npz (label, score and group of the
    test rows, else the valid rows) and report.html. ``train.threads`` sets torch's CPU threads for the run."""
    threads = torch.get_num_threads()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    try:
        return _train(cfg, resume, progress, list(callbacks))
    finally:
        torch.set_num_threads(threads)


def _train(cfg: Config, resume: str | None, progress: bool | None, callbacks: list[Any]) -> dict[str, Any]:
    from ctrkit.train.trainer import Trainer, resolve_device, seed_everything

    if not cfg.data.train:
        raise JobError("data.train is not set: give the path of a training store")
    if not cfg.model.name:
        raise JobError("model.name is not set; see `ctrkit models` for the choices")
    check_model_params(cfg.model.name, cfg.model.params)  # a bad model or parameter: before any data is read
    resolve_device(cfg.train.device)  # a device this machine lacks: before any data is read
    if progress is not None:
        cfg = replace(cfg, train=replace(cfg.train, progress=progress))
    t0 = time.perf_counter()
    train = _loader(cfg.data.train, cfg, train=True, what="train")
    store = train.store
    seed_everything(cfg.train.seed)
    model = create_model(cfg.model.name, store.schema, **cfg.model.params)
    task, extra = None, {"preprocessing": store.preprocessing}
    if model.task_kind == "retrieval":  # ranked against every item of the training store's catalogue
        from ctrkit.retrieval.catalogue import ItemCatalogue, SeenItems

        cfg = retrieval_config(cfg)
        catalogue = ItemCatalogue.from_store(store)
        task = retrieval_task(cfg, catalogue, SeenItems.from_store(store))
        extra["catalogue"] = catalogue.to_payload()
        log.info("retrieval: %d items in the catalogue; loss %s; metrics %s", len(catalogue),
                 cfg.train.retrieval.loss, cfg.train.metrics)
    valid = _loader(cfg.data.valid, cfg, train=False, what="valid", pipeline=train.pipeline)
    test = _loader(cfg.data.test, cfg, train=False, what="test", pipeline=train.pipeline)
    for what, loader in (("data.valid", valid), ("data.test", test)):  # same ids as the training store
        if loader is not None:
            check_same_vocabulary(store, loader.store, what)
    if resume:  # a resumed run goes on with the ids it started with
        check_same_vocabulary(_checkpoint_vocabularies(resume), store, "data.train (--resume)")
    if model.needs_prefit:  # e.g. GBDT+LR fits its trees on the training rows first, DIN counts ids
        model.prefit(train)
    run_dir = _run_dir(cfg, resume)
    if "tensorboard" in cfg.run.log:
        from ctrkit.train.tensorboard import TensorBoardLogger

        callbacks.append(TensorBoardLogger(run_dir / "tensorboard"))
    trainer = Trainer(
        model, train, cfg.train, valid_loader=valid, run_dir=run_dir, resume_from=resume, run_config=cfg,
        schema=store.schema, model_params=dict(cfg.model.params), vocab=vocab_payload(store),
        pipeline=to_payload(train.pipeline), extra=extra, task=task, overwrite=cfg.run.overwrite,
        callbacks=callbacks,
    )
    try:
        fit = trainer.fit()
    finally:
        for cb in callbacks:
            if hasattr(cb, "close"):
                cb.close()
    best = run_dir / "best.pt"
    if best.is_file():  # score the test split with the best evaluated weights, not the last ones
        from ctrkit.train.checkpoint import load_checkpoint

        model.load_state_dict(load_checkpoint(best)["model_state"])
    test_metrics = trainer.evaluate(test) if test is not None else None
    rows, split = (test, "test") if test is not None else (valid, "valid")
    predictions = None
    if rows is not None and model.task_kind != "retrieval":
        scores = score_rows(trainer, rows)
        with atomic_file(run_dir / "predictions.npz", option="run.name") as tmp, open(tmp, "wb") as f:
            np.savez(f, **scores)
        predictions = {"split": split, "file": "predictions.npz", "rows": len(scores["score"])}
    summary = run_summary(cfg, trainer, fit, test_metrics, predictions, time.perf_counter() - t0)
    with atomic_file(run_dir / "summary.json", option="run.name") as tmp:
        tmp.write_text(json.dumps(summary, indent=1, default=_json_default) + "\n")
    _write_report(run_dir)
    return summary


def score_rows(trainer: Any, loader: BatchLoader) -> dict[str, np.ndarray]:
    """{label, score[, group]} of every row of ``loader``: the click probabilities of the trainer's model."""
    model = trainer.model
    model.eval()
    labels, scores, groups = [], [], []
    with torch.no_grad():
        for batch in trainer._on_device(loader):
            scores.append(torch.sigmoid(logits_of(model(batch)).float()).cpu().numpy())
            labels.append(batch.labels.cpu().numpy())
            if batch.group_ids is not None:
                groups.append(batch.group_ids.cpu().numpy())
    out = {"label": np.concatenate(labels).astype(np.float32), "score": np.concatenate(scores).astype(np.float32)}
    if groups:
        out["group"] = np.concatenate(groups).astype(np.int64)
    return out


def run_summary(cfg: Config, trainer: Any, fit: dict[str, Any], test: dict[str, float] | None,
                predictions: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
    """summary.json of a run: the best validation evaluation (the checkpoint test is scored with), test metrics,
    speed, model size, where the data came from and the resolved config."""
    model = trainer.model
    best = dict(fit.get("best_eval") or {})
    params = sum(p.numel() for p in model.parameters())
    emb = sum(p.numel() for p in model.embedding_parameters())
    epochs = fit["epochs_completed"]
    train_s, samples = fit["train_seconds"], fit["samples"]
    return {
        "model": cfg.model.name,
        "task": "retrieval" if model.task_kind == "retrieval" else "ranking",
        "run_dir": fit["run_dir"],
        "best": {"step": best.pop("step", None), "epoch": best.pop("epoch", None), "metric": fit["metric"],
                 "value": fit["best_metric"], "valid": best} if best else None,
        "last_valid": {k: v for k, v in fit["last_eval"].items() if k != "step"},
        **({"test": test} if test is not None else {}),
        "epochs": epochs,
        "steps": fit["steps"],
        "stopped_early": fit["stopped_early"],
        "stopped_by": fit.get("stopped_by"),
        "seconds": seconds,
        "train_seconds": train_s,
        "seconds_per_epoch": train_s / epochs if epochs else None,
        "samples": samples,
        "samples_per_second": samples / train_s if train_s > 0 else None,
        "model_size": {"parameters": params, "embedding_parameters": emb,
                       "bytes": sum(p.numel() * p.element_size() for p in model.parameters())},
        "data": {k: str(Path(v).resolve()) if v else None  # absolute: the report reads the stores' manifests
                 for k, v in (("train", cfg.data.train), ("valid", cfg.data.valid), ("test", cfg.data.test))},
        "predictions": predictions,
        "config": config_to_dict(cfg),
        "environment": {"device": str(trainer.device), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                        "threads": torch.get_num_threads(), "torch": torch.__version__,
                        "ctrkit": _version()},
    }


def _version() -> str:
    from ctrkit.version import __version__

    return __version__


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _write_report(run_dir: Path) -> None:
    """report.html of the run; a report that cannot be drawn is a warning, the training stands."""
    try:
        from ctrkit.report import write_report
    except ImportError as e:  # the report package is part of ctrkit; only a broken install lacks it
        log.warning("no report for %s: %s", run_dir, e)
        return
    try:
        write_report(run_dir)
    except Exception as e:  # noqa: BLE001 - a plot failing must not lose a finished training
        log.warning("could not write the report of %s (%s: %s); run `ctrkit report %s` to retry", run_dir,
                    type(e).__name__, e, run_dir)


def _run_dir(cfg: Config, resume: str | None) -> Path:
    """``run.dir/run.name`` (a timestamped name when unset); a resumed run continues in its checkpoint's
    directory, with that run's best.pt and metrics.jsonl."""
    if resume:
        run_dir = Path(resume).resolve().parent
        if cfg.run.name and (Path(cfg.run.dir) / cfg.run.name).resolve() != run_dir:
            log.warning("--resume %s: the run continues in %s, not in run.dir/run.name = %s", resume, run_dir,
                        Path(cfg.run.dir) / cfg.run.name)
        return run_dir
    return Path(cfg.run.dir) / (cfg.run.name or f"{cfg.model.name}-{time.strftime('%Y%m%d-%H%M%S')}")


def check_same_features(model_schema: Any, store_schema: Any, what: str, whose: str) -> None:
    """A store read by a model must hold the features the model was trained on, each of the same kind; an error
    names the features that differ."""
    def kinds(s: Any) -> dict[str, str]:
        out = {d.name: "dense" for d in s.dense}
        out.update({f.name: "multi-valued sparse" if f.multi_valued else "sparse" for f in s.sparse})
        out.update({q.name: f"sequence of {q.shares}" for q in s.sequence})
        return out

    want, have = kinds(model_schema), kinds(store_schema)
    problems = []
    if missing := [n for n in want if n not in have]:
        problems.append(f"missing from the store: {_names(missing)}")
    if extra := [n for n in have if n not in want]:
        problems.append(f"not read by the model: {_names(extra)}")
    if changed := [f"{n} ({want[n]} in the model, {have[n]} in the store)" for n in want
                   if n in have and have[n] != want[n]]:
        problems.append(f"of another kind: {_names(changed)}")
    if problems:
        raise JobError(f"{what} has other features than {whose} was trained on; features {'; '.join(problems)}. "
                       "Evaluate on a store preprocessed from the same kind of data with the training store's "
                       "vocabularies (`ctrkit preprocess ... --vocab-from TRAIN_STORE`)")


def _names(names: list[str], show: int = 8) -> str:
    more = f" and {len(names) - show} more" if len(names) > show else ""
    return ", ".join(names[:show]) + more


def _checkpoint_vocabularies(path: str | Path, ckpt: dict[str, Any] | None = None) -> Vocabularies:
    """The vocabularies a checkpoint's model was trained with (to check a store against them); ``ckpt``: the
    checkpoint at ``path`` when already read."""
    from ctrkit.train.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path) if ckpt is None else ckpt
    cfg = ckpt.get("config") or {}
    train_store = (cfg.get("data") or {}).get("train") if isinstance(cfg, dict) else None
    return Vocabularies.of_checkpoint(ckpt.get("vocab"), ckpt.get("schema"), f"checkpoint {path}",
                                      train_store, pipeline=ckpt.get("pipeline"))


def _eval_loader(store: Store, batch_size: int, pipeline: FeaturePipeline | None) -> BatchLoader:
    return BatchLoader(store, batch_size, shuffle=False, prefetch=2, pipeline=pipeline)


def predict_store(model: torch.nn.Module, store: Store, batch_size: int = 8192,
                  pipeline: FeaturePipeline | None = None) -> np.ndarray:
    """Click probabilities for every row of ``store``, in order; ``pipeline``: the one the model was trained
    with (its batch-level stage is applied)."""
    model.eval()
    out = []
    with torch.no_grad():
        for batch in _eval_loader(store, batch_size, pipeline):
            out.append(torch.sigmoid(logits_of(model(batch))).numpy())
    return np.concatenate(out) if out else np.zeros(0, np.float32)


EVALUATE_METRICS = ("auc", "logloss", "accuracy", "calibration")


def evaluate_store(model: torch.nn.Module, store: Store, pipeline: FeaturePipeline | None,
                   batch_size: int = 8192) -> dict[str, float]:
    """AUC, LogLoss, accuracy and calibration of ``model`` on ``store`` through ``pipeline``, by the same
    :class:`~ctrkit.train.tasks.CTRTask` evaluation that training reports (GAUC too when the store has groups)."""
    from ctrkit.train.tasks import CTRTask

    metrics = [*EVALUATE_METRICS, *(["gauc"] if store.schema.group_id else [])]
    return CTRTask(metrics).evaluate(model, _eval_loader(store, batch_size, pipeline))


def evaluate_retrieval(model: torch.nn.Module, ckpt: dict[str, Any], cfg: Any, store: Store,
                       pipeline: FeaturePipeline | None, batch_size: int = 8192) -> dict[str, float]:
    """Full-ranking metrics of a retrieval checkpoint on ``store``: its catalogue, the training items of its
    training store excluded when that store is still on disk (else only each row's own history, with a warning)."""
    from ctrkit.retrieval.catalogue import ItemCatalogue, SeenItems

    if not isinstance(cfg, Config):
        raise JobError("the checkpoint's config cannot be read; retrain with this ctrkit version")
    task = retrieval_task(retrieval_config(cfg), ItemCatalogue.from_payload(ckpt["extra"]["catalogue"]),
                          SeenItems.from_training_store(cfg.data.train))
    return task.bind(model).evaluate(model, _eval_loader(store, batch_size, pipeline))


def predict_file(model: torch.nn.Module, pipeline: FeaturePipeline, path: str | Path,
                 batch_size: int = 8192) -> Iterator[np.ndarray]:
    """Click probabilities of the raw rows of ``path`` (the format the pipeline was fitted on), in input
    order, one array per chunk of about ``batch_size`` rows; a malformed row is an error naming its line."""
    from ctrkit.serving.predictor import Predictor

    for _, scores in Predictor(model, pipeline, batch_size=batch_size).predict_file(path):
        yield scores


# ---- CLI commands ----------------------------------------------------------------------------------
def run_train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, list(getattr(args, "overrides", []) or []))
    summary = train_from_config(cfg, resume=args.resume, progress=not args.quiet)
    sys.stdout.write(f"run: {summary['run_dir']}\n")
    best = summary.get("best")
    if best:  # the evaluation whose checkpoint (best.pt) scored the test split
        sys.stdout.write(f"best valid (epoch {best['epoch'] + 1} of {summary['epochs']}, step {best['step']}): "
                         f"{_fmt(best['valid'])}\n")  # epochs counted from 1 here, from 0 in the records
    if "test" in summary:
        sys.stdout.write(f"test with {'best.pt' if best else 'the last weights'}: {_fmt(summary['test'])}\n")
    sps = summary.get("samples_per_second")
    sys.stdout.write(f"{summary['epochs']} epochs, {summary['seconds_per_epoch'] or 0:.1f} s/epoch"
                     + (f", {sps:,.0f} samples/s" if sps else "") + f"; report: {summary['run_dir']}/report.html\n")
    return 0


def _fmt(metrics: dict[str, Any]) -> str:
    return "  ".join(f"{k}={v:.5f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


def run_evaluate(args: argparse.Namespace) -> int:
    from ctrkit.train.checkpoint import load_checkpoint, load_model

    ckpt = load_checkpoint(args.checkpoint)
    model, schema, cfg = load_model(args.checkpoint, ckpt=ckpt)
    path = args.data or (cfg.data.test if isinstance(cfg, Config) else None)
    if not path:
        raise JobError("no store to evaluate: pass --data (the checkpoint's config names no test store)")
    store = Store(path)
    check_same_features(schema, store.schema, f"{'--data' if args.data else 'data.test'} {path}",
                        f"checkpoint {args.checkpoint}")
    check_same_vocabulary(_checkpoint_vocabularies(args.checkpoint, ckpt), store,
                          "--data" if args.data else "the checkpoint's data.test")
    if model.task_kind == "retrieval":  # full ranking over the checkpoint's catalogue
        metrics = evaluate_retrieval(model, ckpt, cfg, store, pipeline_from_checkpoint(ckpt), args.batch_size)
    else:
        metrics = evaluate_store(model, store, pipeline_from_checkpoint(ckpt), args.batch_size)
    sys.stdout.write(f"{path}: {_fmt(metrics)}\n")
    return 0


def run_predict(args: argparse.Namespace) -> int:
    """``ctrkit predict``: one ``line,score`` row per input row, the line number being the row's line in the
    input (CSV: the header is line 1; Parquet: the row number), written only once every row is scored."""
    from ctrkit.data.sources.raw_rows import ReadStats
    from ctrkit.serving.predictor import Predictor

    out, src = Path(args.output), Path(args.input)
    if src.exists() and out.exists() and out.resolve() == src.resolve() and not args.overwrite:
        raise JobError(f"--output {out} is the --input file; write the scores elsewhere (or pass --overwrite)")
    if out.is_dir():
        raise JobError(f"--output {out} is a directory; give a file path")
    check_replaceable(out, args.overwrite, option="--output")
    make_dir(out.parent, option="--output")
    predictor = Predictor.from_checkpoint(args.checkpoint, batch_size=args.batch_size)
    stats, n = ReadStats(), 0
    with atomic_file(out, option="--output") as tmp, open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["line", "score"])
        for lines, scores in predictor.predict_file(src, stats):
            w.writerows(zip(lines.tolist(), (f"{s:.6f}" for s in scores)))
            n += len(scores)
    if stats.blank_lines:
        log.warning("%s: skipped %d blank lines (not rows); every score keeps its input line number",
                    src, stats.blank_lines)
    log.info("wrote %d scores to %s", n, out)
    return 0


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
    from ctrkit.data.sources.criteo import preprocess_criteo

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
            f"run.name=dlrm-{label.split()[0]}", "run.overwrite=true", *overrides,
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
