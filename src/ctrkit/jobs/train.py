"""``ctrkit train``: train a model from a config, evaluate it on valid during training and on test at the end.

The job checks the config and the model's parameters before any data is read, picks the device, seeds (the
model's initial weights, then the training run, so that dropout and sampling do not depend on how many draws
building the model took), picks the task from the model's class (:mod:`ctrkit.jobs.tasks`) and hands the
:class:`~ctrkit.training.trainer.Trainer` a :class:`~ctrkit.training.writer.CheckpointWriter` that makes every
checkpoint self-contained: besides config, schema and weights it carries the training data's
:class:`~ctrkit.data.pipeline.feature_pipeline.FeaturePipeline` (vocabularies, dense statistics, the multi-hot stage), so
``evaluate`` and ``predict`` apply exactly what training applied, with nothing else on disk.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrkit.checkpoint import Checkpoint
from ctrkit.data.pipeline.id_dropout import IdDropout
from ctrkit.data.pipeline.persist import to_payload
from ctrkit.data.storage.agree import check_same_vocabulary
from ctrkit.data.storage.days import DayStreamLoader
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.errors import JobError, StoreError
from ctrkit.io import atomic_file
from ctrkit.jobs.common import (
    checkpoint_vocabularies,
    config_loader,
    default_run_name,
    fmt_metrics,
    resolve_device,
    seed_everything,
    train_store_paths,
)
from ctrkit.jobs.scoring import score_rows
from ctrkit.jobs.tasks import TaskKind, task_kind
from ctrkit.jobs.warm_start import read_warm_start, warm_trainer, warm_weights
from ctrkit.memory import keep_freed_memory
from ctrkit.models.registry import check_model_params, create_model
from ctrkit.nn.embedding_torchrec import meta_tables
from ctrkit.training.config import Config, config_to_dict, load_config
from ctrkit.training.distributed import DistContext, init_distributed, shutdown
from ctrkit.training.sharding import sharded_of
from ctrkit.training.trainer import Trainer
from ctrkit.training.writer import CheckpointWriter, rng_state, set_rng_state

log = logging.getLogger(__name__)


@dataclass
class _Data:
    """The loaders of one run: train (with its store and pipeline), valid and test (None when not configured)."""

    train: BatchLoader | DayStreamLoader
    valid: BatchLoader | None
    test: BatchLoader | None


def train_from_config(cfg: Config, *, resume: str | None = None, progress: bool | None = None,
                      callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train ``cfg.model`` on ``cfg.data.train``; evaluate on valid during training and on test at the
    end, with the best validation checkpoint. ``callbacks``: :class:`~ctrkit.training.callbacks.Callback` objects
    (one that raises stops training). The run directory gets, besides metrics.jsonl and the checkpoints,
    summary.json (the returned dict, see :func:`run_summary`), predictions.npz (label, score and group of the
    test rows, else the valid rows) and report.html. Process-wide settings are the job's explicit options:
    ``train.threads`` (torch's CPU threads) and ``train.seed`` (the global RNGs) hold for the run and the caller's
    are put back afterwards; ``train.keep_freed_memory`` (glibc's allocator thresholds) stays set.

    Launched by torchrun (``ctrkit train --nproc-per-node N``), the process joins the run's process group
    (:mod:`ctrkit.training.distributed`), reads its share of every batch, and rank 0 writes the run directory;
    every rank returns the summary. After a restart by torchrun (``--max-restarts``) the run resumes from its
    last.pt."""
    threads, rng = torch.get_num_threads(), rng_state()  # the caller's, put back afterwards
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    dcfg = cfg.train.distributed
    ctx = init_distributed(dcfg.backend, cfg.train.device, dcfg.timeout_s)
    try:
        return _train(cfg, resume, progress, list(callbacks), ctx)
    finally:
        torch.set_num_threads(threads)
        set_rng_state(rng)
        if ctx is not None:
            shutdown()


def _checked(cfg: Config, progress: bool | None, ctx: DistContext | None) -> tuple[Config, torch.device]:
    """``cfg`` checked before any data is read (store set, model and parameters known, device present)."""
    if not cfg.data.train:
        raise JobError("data.train is not set: give the path of a training store")
    if not cfg.model.name:
        raise JobError("model.name is not set; see `ctrkit models` for the choices")
    check_model_params(cfg.model.name, cfg.model.params)
    if cfg.train.eval_every is not None and cfg.train.evals_per_epoch is not None:
        raise JobError(f"train.eval_every={cfg.train.eval_every} and train.evals_per_epoch="
                       f"{cfg.train.evals_per_epoch} both set the evaluation cadence; keep one (set the other to null)")
    device = ctx.device if ctx is not None else resolve_device(cfg.train.device)
    if progress is not None:
        cfg = replace(cfg, train=replace(cfg.train, progress=progress))
    return cfg, device


def _train(cfg: Config, resume: str | None, progress: bool | None, callbacks: list[Any],
           ctx: DistContext | None) -> dict[str, Any]:
    cfg, device = _checked(cfg, progress, ctx)
    t0 = time.perf_counter()
    if cfg.train.keep_freed_memory:  # process-wide: the job's choice (train.keep_freed_memory), not the Trainer's
        keep_freed_memory()
    rank, world = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    train = config_loader(cfg.data.train, cfg, train=True, what="train", rank=rank, world_size=world)
    cfg = eval_cadence(cfg, len(train))
    store = train.store
    warm = read_warm_start(cfg, resume, store)  # train.warm_start: checked before the model is built
    seed_everything(cfg.train.seed)  # the model's initial weights (a warm start's new rows)
    # torchrec tables, sharded on several processes: each rank allocates its shards (a warm start grows whole tables)
    with meta_tables(ctx is not None and warm is None):
        model = create_model(cfg.model.name, store.schema, **cfg.model.params)
    kind = task_kind(model)
    cfg = kind.configure(cfg)
    if isinstance(train, DayStreamLoader) and kind.name != "ranking":
        raise JobError(f"data.train names {len(train.stores)} day stores, which ranking models read; a "
                       f"{kind.name} model ({cfg.model.name}) takes its item catalogue from one store: give one")
    task, extra = kind.training_task(cfg, store)
    data = _Data(train, *_held_out(cfg, train, resume, rank, world))
    if warm is not None:  # the fitted parts (trees, counts) come from the checkpoint with the other weights
        warm_weights(model, warm, cfg)
    elif model.needs_prefit:  # e.g. GBDT+LR fits its trees on the training rows first, DIN counts ids
        model.prefit(train if ctx is None else config_loader(cfg.data.train, cfg, train=True, what="train"))
    # after prefit (which reads the rows as they are): the training batches' ids dropped to the rare id
    train.id_dropout = IdDropout(cfg.train.id_dropout, store.schema.sparse_keys, cfg.train.seed)
    run_dir = _run_dir(cfg, resume, ctx)
    resume = _restarted_from(run_dir, ctx) or resume  # a restarted job goes on from its own last.pt
    if "tensorboard" in cfg.run.log and (ctx is None or ctx.is_main):
        from ctrkit.training.tensorboard import TensorBoardLogger

        callbacks.append(TensorBoardLogger(run_dir / "tensorboard"))
    writer = CheckpointWriter(
        run_dir, model_name=model.model_name or cfg.model.name, model_params=dict(cfg.model.params),
        schema=store.schema, config=config_to_dict(cfg), pipeline=to_payload(train.pipeline),
        extra={"preprocessing": store.preprocessing, **extra})  # the vocabularies: the pipeline's arrays
    model.to(device)
    seed_everything(cfg.train.seed)  # the training run: dropout and sampling, whatever building the model drew
    trainer = Trainer(model, train, cfg.train, valid_loader=data.valid, run_dir=run_dir, resume_from=resume,
                      run_config=cfg, writer=writer, task=task, overwrite=cfg.run.overwrite, callbacks=callbacks,
                      dist=ctx)
    if warm is not None and resume is None:  # (a restarted torchrun job resumed from its own last.pt instead)
        warm_trainer(trainer, warm, cfg)
    try:
        fit = trainer.fit()
    finally:
        for cb in callbacks:
            if hasattr(cb, "close"):
                cb.close()
    if ctx is not None:
        ctx.barrier()  # rank 0's checkpoints are complete before every rank reads best.pt
    return _finish(cfg, trainer, kind, data, fit, run_dir, t0)


def eval_cadence(cfg: Config, steps_per_epoch: int) -> Config:
    """``cfg`` with ``train.evals_per_epoch`` = N turned into ``train.eval_every`` = max(1, steps_per_epoch // N): N
    evaluations per epoch (the last at the epoch's end, which always evaluates), as MLPerf DLRM-DCNv2's
    ``validation_freq_within_epoch = samples // (global batch x 20)``; unchanged without it."""
    n = cfg.train.evals_per_epoch
    if n is None or cfg.train.eval_every is not None:
        return cfg
    every = max(1, steps_per_epoch // n)
    log.info("train.evals_per_epoch=%d: evaluating every %d of the %d steps of an epoch", n, every, steps_per_epoch)
    return replace(cfg, train=replace(cfg.train, eval_every=every))


def _held_out(cfg: Config, train: BatchLoader | DayStreamLoader, resume: str | None, rank: int,
              world: int) -> tuple[BatchLoader | None, BatchLoader | None]:
    """The valid and test loaders (of this rank), through the training pipeline, their ids checked against the
    training store's (and a resumed run's against the ids it started with)."""
    shard = {"rank": rank, "world_size": world}
    valid = config_loader(cfg.data.valid, cfg, train=False, what="valid", pipeline=train.pipeline, **shard)
    test = config_loader(cfg.data.test, cfg, train=False, what="test", pipeline=train.pipeline, **shard)
    for what, loader in (("data.valid", valid), ("data.test", test)):  # same ids as the training store
        if loader is not None:
            check_same_vocabulary(train.store, loader.store, what)
    if resume:  # a resumed run goes on with the ids it started with
        try:
            check_same_vocabulary(checkpoint_vocabularies(Checkpoint.load(resume), resume), train.store,
                                  "data.train (--resume)")
        except StoreError as e:  # the sanctioned way onto a grown vocabulary is a new run
            raise StoreError(f"{e}; or, to train on a grown vocabulary (known ids kept, new ones appended), start a "
                             f"new run with --warm-start {resume} instead of --resume") from None
    return valid, test


def _finish(cfg: Config, trainer: Trainer, kind: TaskKind, data: _Data, fit: dict[str, Any], run_dir: Path,
            t0: float) -> dict[str, Any]:
    """Test metrics with best.pt, predictions.npz, summary.json and report.html of a trained run."""
    model = trainer.model
    best = run_dir / "best.pt"  # a directory with sharded tables (training/sharded_checkpoint.py)
    if best.exists():  # score the test split with the best evaluated weights, not the last ones
        model.load_state_dict(trainer.writer.read(best).weights)  # sharded: every rank loads its shards
    test_metrics = trainer.evaluate(data.test) if data.test is not None else None
    rows, split = (data.test, "test") if data.test is not None else (data.valid, "valid")
    if not trainer.writes:  # rank 0 scores the rows and writes predictions, summary and report
        return run_summary(cfg, trainer, fit, test_metrics, None, time.perf_counter() - t0)
    predictions = None
    if rows is not None and kind.scores_rows:
        whole = rows if rows.world_size == 1 else BatchLoader(  # rank 0 scores every row, not its share
            rows.store, rows.batch_size, shuffle=False, prefetch=rows.prefetch, pipeline=rows.pipeline)
        batches = trainer.on_device(whole)
        if sharded_of(trainer.module) is not None:  # rank 0 alone: the tables gathered, as the fused backend (CPU)
            model, batches = Checkpoint.load(best if best.exists() else run_dir / "last.pt").build_model(), iter(whole)
        scores = score_rows(model, batches)
        with atomic_file(run_dir / "predictions.npz", option="run.name") as tmp, open(tmp, "wb") as f:
            np.savez(f, **scores)
        predictions = {"split": split, "file": "predictions.npz", "rows": len(scores["score"])}
    summary = run_summary(cfg, trainer, fit, test_metrics, predictions, time.perf_counter() - t0)
    with atomic_file(run_dir / "summary.json", option="run.name") as tmp:
        tmp.write_text(json.dumps(summary, indent=1, default=_json_default) + "\n")
    _write_report(run_dir)
    return summary


def run_summary(cfg: Config, trainer: Trainer, fit: dict[str, Any], test: dict[str, float] | None,
                predictions: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
    """summary.json of a run: the best validation evaluation (the checkpoint test is scored with), test metrics,
    speed, model size, where the data came from and the resolved config."""
    model = trainer.model
    best = dict(fit.get("best_eval") or {})
    steps_per_epoch = len(trainer.train_loader)
    epochs_trained = fit["steps"] / steps_per_epoch  # fractional when train.max_steps or early stopping cut an epoch
    train_s, samples = fit["train_seconds"], fit["samples"]
    train_paths = train_store_paths(cfg.data.train) or [None]  # day stores: the first in "data", all in "train_days"
    return {
        "model": cfg.model.name,
        "task": task_kind(model).name,
        "run_dir": fit["run_dir"],
        "best": {"step": best.pop("step", None), "epoch": best.pop("epoch", None), "metric": fit["metric"],
                 "value": fit["best_metric"], "valid": best} if best else None,
        "last_valid": {k: v for k, v in fit["last_eval"].items() if k != "step"},
        **({"test": test} if test is not None else {}),
        "epochs": fit["epochs_completed"],
        "epochs_trained": round(epochs_trained, 4),
        "steps": fit["steps"],
        "steps_per_epoch": steps_per_epoch,
        "max_steps": cfg.train.max_steps,
        "stopped_early": fit["stopped_early"],
        "stopped_by": fit.get("stopped_by"),
        "seconds": seconds,
        "train_seconds": train_s,
        "seconds_per_epoch": train_s / epochs_trained if epochs_trained else None,
        "samples": samples,
        "samples_per_second": samples / train_s if train_s > 0 else None,
        "model_size": {"parameters": sum(p.numel() for p in model.parameters()),
                       "embedding_parameters": sum(p.numel() for p in model.embedding_parameters()),
                       "bytes": sum(p.numel() * p.element_size() for p in model.parameters())},
        "data": {k: str(Path(v).resolve()) if v else None  # absolute: the report reads the stores' manifests
                 for k, v in (("train", train_paths[0]), ("valid", cfg.data.valid), ("test", cfg.data.test))},
        **({"train_days": [str(Path(p).resolve()) for p in train_paths]} if len(train_paths) > 1 else {}),
        "predictions": predictions,
        "config": config_to_dict(cfg),
        "environment": {"device": str(trainer.device), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                        "processes": trainer.dist.world_size if trainer.dist is not None else 1,
                        "backend": trainer.dist.backend if trainer.dist is not None else None,
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


def _run_dir(cfg: Config, resume: str | None, ctx: DistContext | None = None) -> Path:
    """``run.dir/run.name`` (a timestamped name when unset); a resumed run continues in its checkpoint's
    directory, with that run's best.pt and metrics.jsonl. Under several processes rank 0's choice holds for all;
    a torchrun job that may restart (``--max-restarts``) names an unnamed run after its rendezvous id, so that
    every attempt finds the same directory."""
    if resume:
        run_dir = Path(resume).resolve().parent
        if cfg.run.name and (Path(cfg.run.dir) / cfg.run.name).resolve() != run_dir:
            log.warning("--resume %s: the run continues in %s, not in run.dir/run.name = %s", resume, run_dir,
                        Path(cfg.run.dir) / cfg.run.name)
        return run_dir
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    stamp = run_id if restarts > 0 and run_id != "none" else None
    run_dir = Path(cfg.run.dir) / (cfg.run.name or default_run_name(cfg, stamp))
    return ctx.broadcast_object(run_dir) if ctx is not None else run_dir


def _restarted_from(run_dir: Path, ctx: DistContext | None) -> str | None:
    """last.pt of ``run_dir`` when this process is a restart by torchrun (--max-restarts) of a run that saved one:
    the restarted job resumes there, exactly."""
    if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) == 0:
        return None
    last = run_dir / "last.pt"
    if not last.is_file():
        return None
    log.warning("restart %s of the job: resuming from %s", os.environ["TORCHELASTIC_RESTART_COUNT"], last)
    return str(last)


def run_train(args: argparse.Namespace) -> int:
    """``ctrkit train``: the run directory, the best valid evaluation, the test metrics and the speed."""
    overrides = list(getattr(args, "overrides", []) or [])
    if getattr(args, "log", None):  # --log tensorboard is the override run.log=[tensorboard], after the others
        overrides.append(f"run.log=[{','.join(dict.fromkeys(args.log))}]")
    if getattr(args, "warm_start", None):  # --warm-start X is the override train.warm_start=X
        overrides.append(f"train.warm_start={args.warm_start}")
    cfg = load_config(args.config, overrides)
    if getattr(args, "nproc_per_node", None) is not None:
        from ctrkit.jobs.launch import launch_train

        return launch_train(args, cfg)
    summary = train_from_config(cfg, resume=args.resume, progress=not args.quiet)
    if int(os.environ.get("RANK", "0") or 0) == 0:  # one process, or rank 0 of a torchrun job
        sys.stdout.write(summary_text(summary))
    return 0


def summary_text(summary: dict[str, Any]) -> str:
    """What ``ctrkit train`` prints of a run's summary: the best valid evaluation, the test metrics, the length of
    the run (in steps when it ended inside an epoch: train.max_steps or early stopping) and its speed."""
    out = [f"run: {summary['run_dir']}"]
    trained, steps = summary.get("epochs_trained", summary["epochs"]), summary["steps"]
    whole = float(trained).is_integer()
    best = summary.get("best")
    if best:  # the evaluation whose checkpoint (best.pt) scored the test split; epochs counted from 1 here
        when = (f"epoch {best['epoch'] + 1} of {int(trained)}, step {best['step']}" if whole else
                f"step {best['step']} of {steps}, in epoch {best['epoch'] + 1}")
        out.append(f"best valid ({when}): {fmt_metrics(best['valid'])}")
    if "test" in summary:
        out.append(f"test with {'best.pt' if best else 'the last weights'}: {fmt_metrics(summary['test'])}")
    if whole:  # a stop may also fall on an epoch's end (a time budget, a pruner)
        length = f"{int(trained)} epochs" + (f" (stopped by {summary['stopped_by']})" if summary.get("stopped_by")
                                             else "")
    else:
        why = ("train.max_steps" if steps == summary.get("max_steps") else
               "early stopping" if summary.get("stopped_early") else summary.get("stopped_by") or "a stop")
        length = f"{steps} steps ({trained:.2f} epochs, stopped by {why})"
    sps, spe = summary.get("samples_per_second"), summary.get("seconds_per_epoch")
    out.append(length + (f", {spe:.1f} s/epoch" if spe else "") + (f", {sps:,.0f} samples/s" if sps else "")
               + f"; report: {summary['run_dir']}/report.html")
    return "".join(line + "\n" for line in out)
