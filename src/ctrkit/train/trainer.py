"""The training loop: epochs or steps, periodic evaluation, early stopping, checkpoints, exact resume.

One optimizer step reads top to bottom::

    loss, logs = task.loss(module, batch)      # CTRTask: BCE + the model's aux losses + penalties
    zero_grad(set_to_none) -> backward -> NaN/Inf guard -> clip dense grads -> optimizer step
    -> fold the weights into their moving average (train.ema_decay only)

Decisions worth knowing:

- Model and module: ``self.model`` is the unwrapped :class:`~ctrkit.models.base.CTRModel`
  (checkpoints, parameter groups, embedding tables); ``self.module`` is what the loop calls and
  steps. They are the same object today; a DDP / torchrec wrapper goes into ``self.module`` in
  ``__init__`` and nothing else changes.
- The :class:`~ctrkit.train.tasks.Task` owns loss and evaluation (default: a
  :class:`~ctrkit.train.tasks.CTRTask` with the config's metrics and precision). Every named part
  of the loss it returns (aux losses, ``penalty/<group>``, ``bce``) is averaged over ``log_every``
  steps like ``loss`` and written to the train records; the sums stay on the device (no extra
  host synchronisation per step).

- NaN/Inf guard: the loss is checked every step *before* the optimizer step (one scalar read of
  the host; on CPU this costs no synchronisation). A non-finite loss raises :class:`TrainingError`
  naming the step, the epoch and the first parameter whose gradient is non-finite; the weights and
  ``last.pt`` are left as they were after the previous step.
- Gradient clipping (``grad_clip``) is the global L2 norm over *dense* parameters only. Embedding
  rows are not clipped: their sparse gradients are per-row and the adaptive sparse optimizers
  (Adagrad, row-wise Adagrad) already normalise each row's step.
- Exact resume: a checkpoint stores model, optimizer states, epoch, step, the loader's mid-epoch
  position (``loader.state_dict()``), early-stopping state and the python / numpy / torch RNG
  states. Resuming from it and running on gives bit-identical weights to a run that never stopped
  (dropout and shuffling included), provided the loader's order depends only on (seed, epoch).
- Weight averaging (``ema_decay``, :mod:`ctrkit.train.averaging`): after each optimizer step the
  weights enter a debiased moving average; evaluation and every checkpoint's ``model_state`` use the
  average (the trained weights ride in the trainer state for resume) and ``fit`` leaves it in the model.
- bf16 (``precision="bf16"``) runs the forward pass under CPU/CUDA autocast; the loss is computed
  in float32 and the parameters and optimizer states stay float32.
- Run directory (locked while training, :mod:`ctrkit.train.rundir`): ``config.yaml`` (resolved), ``metrics.jsonl`` (one JSON object per log step,
  ``{"kind": "train", "loss": ..., <each logged part>: ...}``, and per evaluation,
  ``{"kind": "eval", ...}``), ``last.pt`` (every evaluation, every ``checkpoint_every`` steps and at
  the end) and ``best.pt`` (best evaluation).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import yaml
from torch import nn

from ctrkit.batch import Batch
from ctrkit.errors import ConfigError, TrainingError
from ctrkit.metrics import higher_is_better
from ctrkit.models.base import CTRModel
from ctrkit.progress import progress_bar
from ctrkit.train.averaging import WeightAverage
from ctrkit.train.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from ctrkit.train.config import TrainConfig, config_to_dict
from ctrkit.train.memory import keep_freed_memory
from ctrkit.train.optim import OptimizerSet, build_optimizers
from ctrkit.train.rundir import RunLock, check_fresh, trim_records
from ctrkit.train.tasks import CTRTask, Task

log = logging.getLogger(__name__)

RECORD_FIELDS = ("kind", "step", "epoch", "loss")  # of a train record in metrics.jsonl; parts of the loss join them


class Loader(Protocol):
    """What the trainer needs from a data loader (``ctrkit.data.storage.loader.BatchLoader`` has it)."""

    def __iter__(self) -> Any: ...
    def __len__(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Callback:
    """Hooks called by :class:`Trainer`; override what you need. ``trainer.stop(reason)`` ends the run the way
    early stopping does (checkpoints, summary and report written); raising aborts it."""

    def on_step(self, trainer: Trainer, step: int, loss: torch.Tensor) -> None: ...
    def on_eval(self, trainer: Trainer, metrics: dict[str, float]) -> None: ...
    def on_epoch_end(self, trainer: Trainer, epoch: int) -> None: ...
    def on_record(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """Every record written to metrics.jsonl (train and eval), as written; called without a run dir too."""


def resolve_device(spec: str) -> torch.device:
    """``train.device`` as a torch device that this machine has; otherwise a ConfigError saying what to use."""
    try:
        device = torch.device(spec)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"train.device={spec!r} is not a device name (cpu, cuda, cuda:1): {e}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"train.device={spec} but this machine has no usable CUDA GPU (torch "
                              f"{torch.__version__}); use train.device=cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"train.device={spec} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type not in ("cpu", "mps", "xpu"):
        raise ConfigError(f"train.device={spec}: ctrkit trains on cpu or cuda")
    return device


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """Fit a :class:`~ctrkit.models.base.CTRModel` through a :class:`~ctrkit.train.tasks.Task` on a
    loader of :class:`~ctrkit.batch.Batch`.

    ``config`` is the train block of the run config; ``run_config`` (optional, the whole
    :class:`~ctrkit.train.config.Config`) is what gets saved as config.yaml and inside checkpoints.
    ``schema`` / ``model_params`` / ``vocab`` / ``pipeline`` make the checkpoints self-contained for
    ``load_model`` and prediction. ``task`` defaults to ``CTRTask(metrics, precision=config.precision)``
    with ``metrics`` (default ``config.metrics``) plus the early-stopping metric.
    """

    def __init__(
        self,
        model: CTRModel,
        train_loader: Loader,
        config: TrainConfig,
        *,
        valid_loader: Loader | None = None,
        run_dir: str | Path | None = None,
        metrics: Sequence[str] | None = None,
        task: Task | None = None,
        callbacks: Iterable[Callback] | None = None,
        resume_from: str | Path | None = None,
        run_config: Any = None,
        schema: Any = None,
        model_params: dict[str, Any] | None = None,
        vocab: dict[str, Any] | str | Path | None = None,
        pipeline: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        if not isinstance(model, CTRModel):
            raise ConfigError(f"the Trainer trains a ctrkit CTRModel; got {type(model).__name__} "
                              "(derive it from ctrkit.models.base.CTRModel)")
        self.config = config
        self.device = resolve_device(config.device)
        self.model: CTRModel = model.to(self.device)  # unwrapped: checkpoints, param groups, tables
        self.module: nn.Module = self.model  # what the loop calls and steps (a DDP wrapper goes here)
        self.train_loader = train_loader
        self.valid_loader = valid_loader
        self.callbacks = list(callbacks or [])
        self.run_config = run_config
        self.schema = schema
        if model_params is None and run_config is not None:
            model_params = dict(run_config.model.params)
        self.model_params = model_params or {}
        self.model_name = model.model_name or (run_config.model.name if run_config is not None else None)
        self.vocab = vocab
        self.pipeline = pipeline  # FeaturePipeline.to_payload() of the training data, stored in every checkpoint
        self.extra = dict(extra or {})  # stored in every checkpoint (e.g. how raw data was read)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.overwrite = overwrite  # a new run may replace the files of an old run in run_dir
        self._continues_run = resume_from is not None  # its run_dir's records are this run's own
        self._lock: RunLock | None = None

        es = config.early_stopping
        if task is None:
            names = list(metrics if metrics is not None else config.metrics)
            if es.patience > 0 and es.metric not in names:
                names.append(es.metric)
            task = CTRTask(names, precision=config.precision, sample_weight=config.sample_weight)
        elif metrics is not None:
            raise ConfigError("give the Trainer metrics= or task= (whose metric_names are evaluated), not both")
        elif es.patience > 0 and es.metric not in task.metric_names:
            raise ConfigError(f"train.early_stopping.metric {es.metric!r} is not one of the task's metrics "
                              f"{task.metric_names}")
        self.task = task.bind(self.model)
        self.metric_names = list(task.metric_names)
        self._maximise = higher_is_better(es.metric) if es.mode == "auto" else es.mode == "max"

        seed_everything(config.seed)
        self.optimizer: OptimizerSet = build_optimizers(self.model, config)
        # train.ema_decay: evaluation, checkpoints and the model fit() leaves hold the weights' moving average
        self.average = (WeightAverage(self.model, config.ema_decay, self.optimizer.embedding_params)
                        if config.ema_decay is not None else None)
        # progress state (all restored on resume)
        self.epoch = 0
        self.step = 0
        self.epoch_complete = False
        self.best_metric: float | None = None
        self.best_step: int | None = None
        self.bad_evals = 0
        self.stopped_early = False
        self.stop_reason: str | None = None  # set by stop(); not saved: a resumed run trains on
        self.last_eval: dict[str, float] = {}
        self.best_eval: dict[str, float] = {}  # the best evaluation's record: step, epoch and valid metrics
        self.train_seconds = 0.0  # time in training steps (evaluation and checkpoints excluded), over resumes
        self.samples = 0  # training rows seen, over resumes
        self._loader_state: dict[str, Any] | None = None
        self._pbar: Any = None
        if resume_from is not None:
            self._resume(Path(resume_from))

    # ---- public API ------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        """Train until ``epochs`` / ``max_steps`` / early stopping; return a summary dict."""
        n_batches = len(self.train_loader)
        if n_batches == 0:
            raise TrainingError(
                "training data is empty: the train loader yields no batches (empty store, or "
                "batch_size larger than the data with drop_last=True)"
            )
        if self.average is not None and self.average.finalized:
            raise TrainingError("fit() already ran with train.ema_decay and left the averaged weights in the model; "
                                "to train on, resume a new Trainer from the run's last.pt")
        self._prepare_run_dir()
        try:
            summary = self._fit(n_batches)
            if self.average is not None:
                self.average.finalize()  # the trained model is the average (as evaluated and checkpointed)
            return summary
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _fit(self, n_batches: int) -> dict[str, Any]:
        cfg = self.config
        if cfg.keep_freed_memory:
            keep_freed_memory()
        total = cfg.epochs * n_batches if cfg.max_steps is None else min(cfg.max_steps, cfg.epochs * n_batches)
        self._pbar = progress_bar(total, initial=min(self.step, total), enabled=cfg.progress, desc="train",
                                  dynamic_ncols=True, leave=False)
        running = torch.zeros((), dtype=torch.float64, device=self.device)  # sum of losses since the last log
        running_parts: dict[str, torch.Tensor] = {}  # sum of each logged part of the loss
        part_n: dict[str, int] = {}  # steps that logged it (a part may come and go, e.g. a warm-up aux loss)
        running_n = 0
        try:
            start_epoch = self.epoch + 1 if self.epoch_complete else self.epoch
            for epoch in range(start_epoch, cfg.epochs):
                if self._done():
                    break
                self.epoch, self.epoch_complete = epoch, False
                self.train_loader.set_epoch(epoch)
                if self._loader_state is not None:  # resume mid-epoch
                    self.train_loader.load_state_dict(self._loader_state)
                    self._loader_state = None
                self.module.train()
                seen = 0
                tick = time.perf_counter()
                for batch in self.train_loader:
                    seen += 1
                    loss, logs = self._train_step(batch)
                    self.step += 1
                    self.samples += len(batch)
                    running += loss.detach().double()
                    for k, v in logs.items():
                        part = running_parts.get(k)
                        if part is None and k in RECORD_FIELDS:
                            raise TrainingError(f"the task logs a loss part named {k!r}, which is a field of the "
                                                f"metrics record {RECORD_FIELDS}; rename it (e.g. 'aux/{k}')")
                        running_parts[k] = v.to(torch.float64, copy=True) if part is None else part.add_(v)
                        part_n[k] = part_n.get(k, 0) + 1
                    running_n += 1
                    self._pbar.update(1)
                    if self.step % cfg.log_every == 0:
                        avg = float(running) / running_n
                        parts = {k: float(v) / part_n[k] for k, v in running_parts.items()}  # over its steps
                        running.zero_()
                        running_parts.clear()
                        part_n.clear()
                        running_n = 0
                        self._pbar.set_postfix(self._postfix(avg), refresh=False)
                        self._log({"kind": "train", "step": self.step, "epoch": epoch, "loss": avg, **parts})
                    paused = False  # evaluated or checkpointed: not training time
                    if cfg.eval_every is not None and self.step % cfg.eval_every == 0:
                        self._clock(tick)
                        self._evaluate_and_checkpoint()
                        paused = True
                    elif cfg.checkpoint_every is not None and self.step % cfg.checkpoint_every == 0:
                        self._clock(tick)
                        self._save("last.pt")
                        paused = True
                    for cb in self.callbacks:
                        cb.on_step(self, self.step, loss)
                    if paused:  # the clock restarts after the evaluation / checkpoint and the callbacks
                        tick = time.perf_counter()
                    if self._done():
                        break
                self._clock(tick)
                if seen == 0 and self.step == 0:
                    raise TrainingError(f"training data is empty: epoch {epoch} produced no batches")
                if self._done():  # a run stopped by max_steps / early stopping / stop() ends mid-epoch
                    break
                self.epoch_complete = True
                if cfg.eval_every is None:
                    self._evaluate_and_checkpoint()
                for cb in self.callbacks:
                    cb.on_epoch_end(self, epoch)
            if not self.last_eval or self.last_eval.get("step") != self.step:
                self._evaluate_and_checkpoint()
            else:
                self._save("last.pt")
        finally:
            self._pbar.close()
            self._pbar = None
        return self.summary()

    def stop(self, reason: str) -> None:
        """End the run after the current step or evaluation, as early stopping would: fit() evaluates if the
        last step was not evaluated, writes the checkpoints and returns (and train_from_config writes
        summary.json, with ``stopped_by`` = ``reason``, and the report). For callbacks, e.g. a tuner's pruner."""
        if self.stop_reason is None:
            log.info("stopping at step %d: %s", self.step, reason)
            self.stop_reason = str(reason)

    def evaluate(self, loader: Iterable[Batch]) -> dict[str, float]:
        """The task's metrics of the model on ``loader`` (its train/eval mode restored afterwards); during
        training with ``train.ema_decay``, of the averaged weights."""
        with self._averaged_weights():
            return self.task.evaluate(self.module, self._on_device(loader))

    def _averaged_weights(self) -> AbstractContextManager[None]:
        """The model holds the moving average inside the block while training with train.ema_decay."""
        if self.average is None or self.average.finalized:
            return nullcontext()
        return self.average.applied_weights()

    def _clock(self, since: float) -> None:
        """Add the time since ``since`` (a ``time.perf_counter()``) to the training time."""
        self.train_seconds += time.perf_counter() - since

    def _on_device(self, loader: Iterable[Batch]) -> Iterator[Batch]:
        for batch in loader:
            yield batch.to(self.device) if self.device.type != "cpu" else batch

    def summary(self) -> dict[str, Any]:
        return {
            "steps": self.step,
            "epoch": self.epoch,
            "stopped_early": self.stopped_early,
            "stopped_by": self.stop_reason,
            "best_metric": self.best_metric,
            "best_step": self.best_step,
            "metric": self.config.early_stopping.metric,
            "last_eval": dict(self.last_eval),
            "best_eval": dict(self.best_eval),
            "train_seconds": self.train_seconds,
            "samples": self.samples,
            "epochs_completed": self.epoch + 1 if self.epoch_complete else self.epoch,
            "run_dir": str(self.run_dir) if self.run_dir else None,
        }

    # ---- one step ----------------------------------------------------------------------------------
    def _train_step(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self.device.type != "cpu":
            batch = batch.to(self.device, non_blocking=True)
        loss, logs = self.task.loss(self.module, batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if not torch.isfinite(loss):
            self._raise_non_finite(loss)
        if self.config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.optimizer.dense_params, self.config.grad_clip)
        if self.average is not None:
            self.average.before_step()
        self.optimizer.step()
        if self.average is not None:
            self.average.after_step()
        return loss, logs

    def _raise_non_finite(self, loss: torch.Tensor) -> None:
        culprit = None
        for name, p in self.model.named_parameters():
            g = p.grad
            if g is None:
                continue
            vals = g.coalesce().values() if g.is_sparse else g
            if not torch.isfinite(vals).all():
                culprit = name
                break
        where = f" first parameter with a non-finite gradient: {culprit!r}." if culprit else ""
        raise TrainingError(
            f"loss is {float(loss.detach())} at step {self.step + 1} (epoch {self.epoch}); training stopped "
            f"before applying it.{where} Lower train.lr, set train.grad_clip, or check the input "
            f"features for inf/NaN; resume from last.pt once fixed."
        )

    # ---- evaluation, early stopping, checkpoints ------------------------------------------------------
    def _evaluate_and_checkpoint(self) -> None:
        with self._averaged_weights():  # evaluated and saved: the same (averaged) weights
            self._evaluate_and_checkpoint_now()

    def _evaluate_and_checkpoint_now(self) -> None:
        if self.valid_loader is None:
            self._save("last.pt")
            return
        metrics = self.evaluate(self.valid_loader)
        self.last_eval = {"step": self.step, **metrics}
        es = self.config.early_stopping
        value = metrics.get(es.metric)
        improved = False
        if value is not None and not math.isnan(value):
            if self.best_metric is None:
                improved = True
            elif self._maximise:
                improved = value > self.best_metric + es.min_delta
            else:
                improved = value < self.best_metric - es.min_delta
        if improved:
            self.best_metric, self.best_step, self.bad_evals = float(value), self.step, 0
            self.best_eval = {"step": self.step, "epoch": self.epoch, **metrics}
        else:
            self.bad_evals += 1
        if es.patience > 0 and self.bad_evals >= es.patience:
            self.stopped_early = True
            log.info("early stopping at step %d: %s did not improve for %d evaluations (best %.6g at %s)",
                     self.step, es.metric, self.bad_evals, self.best_metric or float("nan"), self.best_step)
        self._log({"kind": "eval", "step": self.step, "epoch": self.epoch, **metrics,
                   "best": self.best_metric, "stopped_early": self.stopped_early,
                   "train_seconds": round(self.train_seconds, 4), "samples": self.samples})
        if self._pbar is not None:
            self._pbar.set_postfix({**self._postfix(None), **{k: round(v, 4) for k, v in metrics.items()}},
                                   refresh=False)
        if improved:
            self._save("best.pt")
        self._save("last.pt")
        for cb in self.callbacks:  # after the checkpoints: a callback that stops the run leaves them written
            cb.on_eval(self, metrics)

    def _done(self) -> bool:
        return (self.stopped_early or self.stop_reason is not None
                or (self.config.max_steps is not None and self.step >= self.config.max_steps))

    def _postfix(self, loss: float | None) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step}
        if loss is not None:
            out["loss"] = f"{loss:.4f}"
        if "auc" in self.last_eval:
            out["auc"] = f"{self.last_eval['auc']:.4f}"
        return out

    def trainer_state(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "epoch_complete": self.epoch_complete,
            "loader": self.train_loader.state_dict(),
            "best_metric": self.best_metric,
            "best_step": self.best_step,
            "bad_evals": self.bad_evals,
            "stopped_early": self.stopped_early,
            "last_eval": dict(self.last_eval),
            "best_eval": dict(self.best_eval),
            "train_seconds": self.train_seconds,
            "samples": self.samples,
            "rng": rng_state(),
            "weight_average": self.average.state_dict() if self.average is not None else None,
        }

    def save_checkpoint(self, path: str | Path) -> Path:
        """Model weights (the moving average with train.ema_decay; the trained weights then go in the
        trainer state), optimizer and trainer state, config, schema and vocabulary."""
        with self._averaged_weights():
            return save_checkpoint(
                path, model=self.model, model_name=self.model_name, model_params=self.model_params,
                schema=self.schema, config=self._config_dict(), optimizer=self.optimizer,
                trainer_state=self.trainer_state(), vocab=self.vocab, pipeline=self.pipeline,
                extra=self.extra,
            )

    def _save(self, name: str) -> None:
        if self.run_dir is not None:
            self.save_checkpoint(self.run_dir / name)

    def _resume(self, path: Path) -> None:
        ckpt = load_checkpoint(path, map_location=self.device)
        state = ckpt.get("trainer")
        if state is None or ckpt.get("optimizer") is None:
            raise TrainingError(f"cannot resume from {path}: it holds no trainer/optimizer state "
                                "(an exported model, not a training checkpoint)")
        try:
            self.model.load_state_dict(ckpt["model_state"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise TrainingError(f"cannot resume from {path}: it does not match this model: {e}") from e
        averaging = state.get("weight_average")
        if (averaging is None) != (self.average is None):
            raise TrainingError(
                f"cannot resume from {path}: it was trained "
                + (f"with train.ema_decay={averaging['decay']}; resume with that value" if averaging is not None
                   else "without weight averaging; resume with train.ema_decay=null (or start a new run)"))
        if self.average is not None:
            self.average.load_state_dict(averaging)  # the model gets its trained weights back
        self.epoch = int(state["epoch"])
        self.step = int(state["step"])
        self.epoch_complete = bool(state["epoch_complete"])
        self.best_metric = state["best_metric"]
        self.best_step = state["best_step"]
        self.bad_evals = int(state["bad_evals"])
        self.stopped_early = bool(state.get("stopped_early", False))
        self.last_eval = dict(state.get("last_eval") or {})
        self.best_eval = dict(state.get("best_eval") or {})
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.samples = int(state.get("samples", 0))
        self._loader_state = None if self.epoch_complete else state["loader"]
        set_rng_state(state["rng"])
        log.info("resumed from %s at epoch %d, step %d", path, self.epoch, self.step)

    # ---- run directory -------------------------------------------------------------------------------
    def _config_dict(self) -> dict[str, Any]:
        if self.run_config is not None:
            return config_to_dict(self.run_config)
        return {"train": config_to_dict(self.config)}

    def _prepare_run_dir(self) -> None:
        """Lock the run directory (one training at a time), then: a resumed run drops the records of the
        steps it trains again; a new one refuses another run's files unless ``overwrite``."""
        if self.run_dir is None:
            return
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TrainingError(f"cannot create the run directory {self.run_dir}: {e.strerror or e}") from None
        self._lock = RunLock(self.run_dir).acquire()
        try:
            if self._continues_run:
                trim_records(self.run_dir / "metrics.jsonl", self.step)
            else:
                check_fresh(self.run_dir, overwrite=self.overwrite)
        except BaseException:
            self._lock.release()
            self._lock = None
            raise
        self._continues_run = True  # a second fit() of this trainer goes on in the same run
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(self._config_dict(), sort_keys=False))

    def _log(self, record: dict[str, Any]) -> None:
        if self.run_dir is not None:
            with open(self.run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
        for cb in self.callbacks:
            cb.on_record(self, record)
