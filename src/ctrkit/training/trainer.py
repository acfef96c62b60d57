"""The training loop: epochs or steps, periodic evaluation, early stopping, checkpoints, exact resume.

One optimizer step reads top to bottom::

    loss, logs = task.loss(module, batch)      # CTRTask: BCE + the model's aux losses + penalties
    zero_grad(set_to_none) -> backward -> NaN/Inf guard -> clip dense grads -> scheduled rates -> optimizer step
    -> fold the weights into their moving average (train.ema_decay only)
Decisions worth knowing:

- Model and module: ``self.model`` is the unwrapped :class:`~ctrkit.models.base.CTRModel` (checkpoints, tables,
  evaluation); ``self.module`` is what the loop calls and steps: the task's loss of the model as a module
  (:class:`~ctrkit.training.distributed.TaskStep`), wrapped in DDP or sharded by torchrec under ``dist``. The
  model trains on the device it is on: the job picks the device, seeds and checks the parameters.
- Several processes (``dist``): each rank trains on its share of every global batch, gradients are averaged,
  the logged loss is the ranks' mean, evaluations gather all scores (exact metrics, one early-stopping decision)
  and only rank 0 writes the run directory, unless the writer is collective (sharded checkpoints).
- Progress lives in one :class:`~ctrkit.checkpoint.TrainProgress` (``self.progress``); checkpoints go through one
  :class:`~ctrkit.training.writer.CheckpointWriter`, which a distributed trainer replaces.
- The :class:`~ctrkit.training.tasks.Task` owns loss and evaluation (default: :class:`~ctrkit.training.tasks.CTRTask`).
  Every named part of its loss (aux losses, ``penalty/<group>``, ``bce``) is averaged over ``log_every`` steps
  like ``loss`` and written to the train records (the sums stay on the device).
- NaN/Inf guard: a non-finite loss raises :class:`TrainingError` (step, epoch, first non-finite gradient) before
  the optimizer step. ``grad_clip``: the global L2 norm over *dense* parameters only (embedding rows: per row).
- ``lr_schedule`` (:mod:`ctrkit.training.lr_schedule`): rates set before each step (linear) or after evaluations
  (plateau, which early stopping waits for), checkpointed and resumed; the train records carry them.
- Exact resume: weights, optimizer states, progress, the loader's position and the RNG states are checkpointed; a
  resumed run's weights equal an unbroken run's bit for bit (the loader's order a function of (seed, epoch)).
- Weight averaging (``ema_decay``, :mod:`ctrkit.training.averaging`): evaluation and every checkpoint use the weights'
  debiased moving average and ``fit`` leaves it in the model. bf16 (``precision="bf16"``): autocast forward.
- Run directory (locked while training, :mod:`ctrkit.training.rundir`): ``config.yaml``, ``metrics.jsonl`` (train
  and eval records), ``last.pt`` (every evaluation, every ``checkpoint_every`` steps, at the end) and ``best.pt``;
  a failed write (disk full) puts it back as it was after the last whole checkpoint (``RunRecords``).
- Stops: ``epochs``, ``max_steps``, early stopping, ``max_seconds`` or :meth:`Trainer.stop`: all but the first
  end with an evaluation and the checkpoints; the summary says which (``stopped_by``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ctrkit.batch import Batch
from ctrkit.checkpoint import TrainerState, TrainProgress
from ctrkit.errors import ConfigError, TrainingError
from ctrkit.metrics import higher_is_better
from ctrkit.models.base import CTRModel
from ctrkit.progress import progress_bar
from ctrkit.training.averaging import WeightAverage
from ctrkit.training.callbacks import (
    Callback,
    Loader,
    RunningLoss,
    non_finite_error,
    stopped_by,
    track_evaluation,
)
from ctrkit.training.config import TrainConfig, config_to_dict
from ctrkit.training.distributed import DistContext, model_device, wrap_for_training
from ctrkit.training.lr_schedule import lr_schedule, restore_schedule
from ctrkit.training.optim import OptimizerSet, build_optimizers
from ctrkit.training.rundir import RunLock, RunRecords, open_run_dir
from ctrkit.training.sharding import even_forwards, sharded_of, sharded_optimizers, sharded_writer
from ctrkit.training.tasks import Task, ranking_task
from ctrkit.training.writer import CheckpointWriter, restore_training, rng_state

log = logging.getLogger(__name__)


class Trainer:
    """Fit a :class:`~ctrkit.models.base.CTRModel` through a :class:`~ctrkit.training.tasks.Task` on a
    loader of :class:`~ctrkit.batch.Batch`, on the device the model is on.

    ``config`` is the train block of the run config; ``run_config`` (optional, the whole
    :class:`~ctrkit.training.config.Config`) is what gets saved as config.yaml and inside checkpoints.
    ``writer`` writes the checkpoints (default: a :class:`~ctrkit.training.writer.CheckpointWriter` of ``run_dir``
    with the model's name and the run config; the job gives one that also holds schema, pipeline and vocabularies,
    made sharded for sharded tables). ``task`` defaults to ``CTRTask(metrics, precision=config.precision)``
    with ``metrics`` (default ``config.metrics``) plus the early-stopping metric.
    """

    def __init__(self, model: CTRModel, train_loader: Loader, config: TrainConfig, *,
                 valid_loader: Loader | None = None, run_dir: str | Path | None = None,
                 metrics: Sequence[str] | None = None, task: Task | None = None,
                 callbacks: Iterable[Callback] | None = None, resume_from: str | Path | None = None,
                 run_config: Any = None, writer: CheckpointWriter | None = None, overwrite: bool = False,
                 dist: DistContext | None = None) -> None:
        if not isinstance(model, CTRModel):
            raise ConfigError(f"the Trainer trains a ctrkit CTRModel; got {type(model).__name__} "
                              "(derive it from ctrkit.models.base.CTRModel)")
        self.config = config
        self.model: CTRModel = model  # unwrapped: checkpoints, param groups, tables
        self.device = model_device(model)
        self.dist = dist
        self.train_loader, self.valid_loader = train_loader, valid_loader
        self.callbacks = list(callbacks or [])
        self.run_config = run_config
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.writer = writer or CheckpointWriter(
            self.run_dir, model_name=model.model_name or (run_config.model.name if run_config is not None else None),
            model_params=dict(run_config.model.params) if run_config is not None else None,
            config=self._config_dict())
        self.overwrite = overwrite  # a new run may replace the files of an old run in run_dir
        self._continues_run = resume_from is not None  # its run_dir's records are this run's own
        self._lock: RunLock | None = None
        self._records: RunRecords | None = None  # metrics.jsonl while fit() runs (this process writes it)
        self.task = self._bind_task(task, metrics)
        self.module: nn.Module = wrap_for_training(self.model, self.task, dist, config)  # the loop's forward
        self.writer = sharded_writer(self.writer, self.module)  # sharded tables: every rank writes its shards
        self.metric_names = list(self.task.metric_names)
        es = config.early_stopping
        self._maximise = higher_is_better(es.metric) if es.mode == "auto" else es.mode == "max"
        self.optimizer: OptimizerSet = sharded_optimizers(self.module, config) or build_optimizers(self.model, config)
        self.schedule = lr_schedule(config, self.optimizer, sharded_of(self.module) is not None)
        # train.ema_decay: evaluation, checkpoints and the model fit() leaves hold the weights' moving average
        self.average = (WeightAverage(self.model, config.ema_decay, self.optimizer.embedding_params)
                        if config.ema_decay is not None else None)
        self.progress = TrainProgress()  # all restored on resume
        self.stop_reason: str | None = None  # set by stop(); not saved: a resumed run trains on
        self._started: float | None = None  # time.monotonic() when fit() began (train.max_seconds)
        self._loader_state: dict[str, Any] | None = None
        self._pbar: Any = None
        if resume_from is not None:
            self._resume(Path(resume_from))

    def _bind_task(self, task: Task | None, metrics: Sequence[str] | None) -> Task:
        es = self.config.early_stopping
        if task is None:
            task = ranking_task(self.config, metrics)
        elif metrics is not None:
            raise ConfigError("give the Trainer metrics= or task= (whose metric_names are evaluated), not both")
        elif es.patience > 0 and es.metric not in task.metric_names:
            raise ConfigError(f"train.early_stopping.metric {es.metric!r} is not one of the task's metrics "
                              f"{task.metric_names}")
        return task.bind(self.model)

    @property
    def step(self) -> int:  # for callbacks: the steps trained so far
        return self.progress.step

    @property
    def epoch(self) -> int:
        return self.progress.epoch

    # ---- public API ------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train until ``epochs`` / ``max_steps`` / early stopping; return a summary dict."""
        n_batches = len(self.train_loader)
        if n_batches == 0:
            raise TrainingError("training data is empty: the train loader yields no batches (empty store, or "
                                "batch_size larger than the data with drop_last=True)")
        if self.average is not None and self.average.finalized:
            raise TrainingError("fit() already ran with train.ema_decay and left the averaged weights in the model; "
                                "to train on, resume a new Trainer from the run's last.pt")
        if self.run_dir is not None and self.writes:
            self._lock = open_run_dir(self.run_dir, continues=self._continues_run, step=self.progress.step,
                                      overwrite=self.overwrite, config=self._config_dict())
            self._records = RunRecords(self.run_dir, self.progress.step)
            self._continues_run = True  # a second fit() of this trainer goes on in the same run
        self._started = time.monotonic()
        try:
            summary = self._fit(n_batches)
            if self.average is not None:
                self.average.finalize()  # the trained model is the average (as evaluated and checkpointed)
            return summary
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            self._records = None

    def _fit(self, n_batches: int) -> dict[str, Any]:
        cfg, p = self.config, self.progress
        total = cfg.epochs * n_batches if cfg.max_steps is None else min(cfg.max_steps, cfg.epochs * n_batches)
        self._pbar = progress_bar(total, initial=min(p.step, total), enabled=cfg.progress and self.writes, desc="train",
                                  dynamic_ncols=True, leave=False)
        self.schedule.start(total)
        running = RunningLoss(self.device)  # losses since the last train record
        try:
            for epoch in range(p.epoch + 1 if p.epoch_complete else p.epoch, cfg.epochs):
                if self._done() or not self._train_epoch(epoch, running):
                    break  # a run stopped by max_steps / early stopping / stop() ends mid-epoch
                p.epoch_complete = True
                if cfg.eval_every is None:
                    self._evaluate_and_checkpoint()
                for cb in self.callbacks:
                    cb.on_epoch_end(self, epoch)
            if not p.last_eval or p.last_eval.get("step") != p.step:
                self._evaluate_and_checkpoint()
            else:
                self._save("last.pt")
        finally:
            self._pbar.close()
            self._pbar = None
        return self.summary()

    def _train_epoch(self, epoch: int, running: RunningLoss) -> bool:
        """One epoch (or what is left of it after a resume); False when the run stopped before its end."""
        p = self.progress
        p.epoch, p.epoch_complete = epoch, False
        self.train_loader.set_epoch(epoch)
        if self._loader_state is not None:  # resume mid-epoch
            self.train_loader.load_state_dict(self._loader_state)
            self._loader_state = None
        self.module.train()
        seen = 0
        tick = time.perf_counter()
        for batch in self.train_loader:
            seen += 1
            loss, logs, rows = self._train_step(batch)
            p.step += 1
            p.samples += rows
            running.add(loss, logs)
            self._pbar.update(1)
            if p.step % self.config.log_every == 0:
                avg, parts = running.pop()
                self._pbar.set_postfix(self._postfix(avg), refresh=False)
                rates = self.schedule.record()  # under a schedule: the rates this step used
                self._log({"kind": "train", "step": p.step, "epoch": epoch, "loss": avg, **parts, **rates})
            if self._after_step(tick, loss):  # the clock restarts after an evaluation / checkpoint
                tick = time.perf_counter()
            if self._done():
                break
        self._clock(tick)
        if seen == 0 and p.step == 0:
            raise TrainingError(f"training data is empty: epoch {epoch} produced no batches")
        return not self._done()

    def _after_step(self, tick: float, loss: torch.Tensor) -> bool:
        """Periodic evaluation or checkpoint, then the callbacks; True when it evaluated or checkpointed (not
        training time: the clock stops at ``tick``'s interval)."""
        cfg, step = self.config, self.progress.step
        paused = False
        if cfg.eval_every is not None and step % cfg.eval_every == 0:
            self._clock(tick)
            self._evaluate_and_checkpoint()
            paused = True
        elif cfg.checkpoint_every is not None and step % cfg.checkpoint_every == 0:
            self._clock(tick)
            self._save("last.pt")
            paused = True
        for cb in self.callbacks:
            cb.on_step(self, self.progress.step, loss)
        return paused

    def stop(self, reason: str) -> None:
        """End the run after the current step or evaluation, as early stopping would: fit() evaluates if the
        last step was not evaluated, writes the checkpoints and returns (and the train job writes
        summary.json, with ``stopped_by`` = ``reason``, and the report). For callbacks, e.g. a tuner's pruner."""
        if self.stop_reason is None:
            log.info("stopping at step %d: %s", self.progress.step, reason)
            self.stop_reason = str(reason)

    def evaluate(self, loader: Iterable[Batch]) -> dict[str, float]:
        """The task's metrics of the model on ``loader`` (its train/eval mode restored afterwards); during
        training with ``train.ema_decay``, of the averaged weights."""
        with self._averaged_weights():
            if self.dist is None:
                return self.task.evaluate(self.model, self.on_device(loader))
            world = getattr(loader, "world_size", None)
            if world != self.dist.world_size or getattr(loader, "even_tail", True):
                raise ConfigError(f"a {self.dist.world_size}-process evaluation needs each rank's round-robin share "
                                  "of the batches: BatchLoader(..., rank=r, world_size=W, even_tail=False)")
            return self.task.evaluate(self.model, self.on_device(loader), self.dist.gather_batches)

    def _averaged_weights(self) -> AbstractContextManager[None]:
        """The model holds the moving average inside the block while training with train.ema_decay."""
        if self.average is None or self.average.finalized:
            return nullcontext()
        return self.average.applied_weights()

    def _clock(self, since: float) -> None:
        """Add the time since ``since`` (a ``time.perf_counter()``) to the training time."""
        self.progress.train_seconds += time.perf_counter() - since

    def on_device(self, loader: Iterable[Batch]) -> Iterator[Batch]:
        """The batches of ``loader`` on the model's device (sharded tables: as many forwards on every rank)."""
        batches = (batch.to(self.device) if self.device.type != "cpu" else batch for batch in loader)
        return even_forwards(self.module, batches, loader, self.model)

    def summary(self) -> dict[str, Any]:
        p = self.progress
        return {
            "steps": p.step, "epoch": p.epoch, "stopped_early": p.stopped_early, "stopped_by": stopped_by(self.stop_reason, p, self.config.early_stopping),
            "best_metric": p.best_metric, "best_step": p.best_step, "metric": self.config.early_stopping.metric,
            "last_eval": dict(p.last_eval), "best_eval": dict(p.best_eval), "train_seconds": p.train_seconds,
            "samples": p.samples, "epochs_completed": p.epoch + 1 if p.epoch_complete else p.epoch,
            "run_dir": str(self.run_dir) if self.run_dir else None}

    # ---- one step ----------------------------------------------------------------------------------
    def _train_step(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        if self.device.type != "cpu":
            batch = batch.to(self.device, non_blocking=True)
        loss, logs = self.module(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        rows = len(batch)
        if self.dist is not None:  # what every rank logs and checks: the mean over the ranks
            loss, rows = self.dist.step_totals(loss, rows)
        if not torch.isfinite(loss):
            raise non_finite_error(self.model, loss, self.progress.step + 1, self.progress.epoch)
        if self.config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.optimizer.dense_params, self.config.grad_clip)
        if self.average is not None:
            self.average.before_step()
        self.schedule.before_step(self.progress.step)
        self.optimizer.step()
        if self.average is not None:
            self.average.after_step()
        return loss, logs, rows

    # ---- evaluation, early stopping, checkpoints ------------------------------------------------------
    def _evaluate_and_checkpoint(self) -> None:
        with self._averaged_weights():  # evaluated and saved: the same (averaged) weights
            self._evaluate_and_checkpoint_now()

    def _evaluate_and_checkpoint_now(self) -> None:
        if self.valid_loader is None:
            self._save("last.pt")
            return
        metrics = self.evaluate(self.valid_loader)
        counts = self.schedule.counts_for_early_stopping  # plateau: only evaluations with the rates at their floor
        improved = track_evaluation(self.progress, self.config.early_stopping, self._maximise, metrics, counts)
        self.schedule.on_eval(improved)
        p = self.progress
        self._log({"kind": "eval", "step": p.step, "epoch": p.epoch, **metrics,
                   "best": p.best_metric, "stopped_early": p.stopped_early,
                   "train_seconds": round(p.train_seconds, 4), "samples": p.samples})
        if self._pbar is not None:
            self._pbar.set_postfix({**self._postfix(None), **{k: round(v, 4) for k, v in metrics.items()}},
                                   refresh=False)
        self._save(*(("best.pt",) if improved else ()), "last.pt")  # best first: see RunRecords
        for cb in self.callbacks:  # after the checkpoints: a callback that stops the run leaves them written
            cb.on_eval(self, metrics)

    def _done(self) -> bool:
        cfg, p = self.config, self.progress
        if p.stopped_early or self.stop_reason is not None or (cfg.max_steps is not None and p.step >= cfg.max_steps):
            return True
        spent = time.monotonic() - (self._started or time.monotonic())
        if cfg.max_seconds is not None and spent >= cfg.max_seconds:  # the time budget: stop, evaluate, checkpoint
            self.stop(f"train.max_seconds={cfg.max_seconds:g} (time budget spent after {spent:.1f}s)")
        return self.stop_reason is not None

    def _postfix(self, loss: float | None) -> dict[str, Any]:
        last = self.progress.last_eval
        return {"step": self.progress.step, **({"loss": f"{loss:.4f}"} if loss is not None else {}),
                **({"auc": f"{last['auc']:.4f}"} if "auc" in last else {})}

    def trainer_state(self) -> TrainerState:
        """What a checkpoint needs to resume this run exactly (a snapshot of the progress)."""
        return TrainerState(replace(self.progress), loader=self.train_loader.state_dict(), rng=rng_state(),
                            weight_average=self.average.state_dict() if self.average is not None else None,
                            lr_schedule=self.schedule.state_dict())

    def save_checkpoint(self, path: str | Path) -> Path:
        """Model weights (the moving average with train.ema_decay; the trained weights then go in the
        trainer state), optimizer and trainer state, through the writer."""
        with self._averaged_weights():
            return self.writer.write_to(path, self.model, self.optimizer, self.trainer_state())

    @property
    def writes(self) -> bool:
        """Whether this process writes the run directory: one process, or rank 0 of several."""
        return self.dist is None or self.dist.is_main

    def _save(self, *names: str) -> None:
        """Write the checkpoints ``names``, all or none (a failed write: :class:`~.rundir.RunRecords`)."""
        if not (self.writes or getattr(self.writer, "collective", False)):
            return
        together = self._records.checkpoints(names, self.progress.step) if self._records else nullcontext()
        with self._averaged_weights(), together:
            for name in names:
                self.writer.write(name, self.model, self.optimizer, self.trainer_state())

    def _resume(self, path: Path) -> None:
        state = restore_training(self.writer, path, self.model, self.optimizer, self.average, self.device)
        restore_schedule(self.schedule, state.lr_schedule, path)
        self.progress = state.progress
        self._loader_state = None if self.progress.epoch_complete else state.loader
        log.info("resumed from %s at epoch %d, step %d", path, self.progress.epoch, self.progress.step)

    # ---- run directory -------------------------------------------------------------------------------
    def _config_dict(self) -> dict[str, Any]:
        if self.run_config is not None:
            return config_to_dict(self.run_config)
        return {"train": config_to_dict(self.config)}

    def _log(self, record: dict[str, Any]) -> None:
        if self._records is not None:
            self._records.append(record)
        for cb in self.callbacks:
            cb.on_record(self, record)
