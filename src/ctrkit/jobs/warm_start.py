"""``ctrkit train --warm-start CHECKPOINT`` (``train.warm_start``): the job's side of a warm start
(:mod:`ctrkit.training.warm_start`). Before the model is built, the checkpoint is read and checked against the run
(same model, same schema but for vocabulary sizes, the training store's vocabularies a grown version of the
checkpoint's: :mod:`ctrkit.data.storage.lineage`); after, the model's tables are grown and loaded, and once the
Trainer has its optimizers, their states.

This is the sanctioned way past the vocabulary agreement that ``--resume``, ``evaluate`` and ``predict`` keep
(:func:`~ctrkit.data.storage.agree.check_same_vocabulary`): those continue or read a checkpoint on its own ids; a
warm start begins a new run (its own run directory, progress from step 0) on the ids of a newer vocabulary.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrkit.checkpoint import SHARDED_META, Checkpoint
from ctrkit.data.storage.agree import Vocabularies
from ctrkit.data.storage.lineage import check_grown
from ctrkit.data.storage.store import Store
from ctrkit.errors import ConfigError, JobError
from ctrkit.jobs.common import checkpoint_vocabularies
from ctrkit.models.base import CTRModel
from ctrkit.training.config import Config
from ctrkit.training.sharded_warm import load_grown_sharded
from ctrkit.training.sharding import sharded_of
from ctrkit.training.warm_start import (
    check_warm_start,
    load_grown_average,
    load_grown_optimizer,
    load_grown_weights,
    new_rows_from_rare,
    table_layout,
)

log = logging.getLogger(__name__)


@dataclass
class WarmStart:
    """A checked warm start: the checkpoint, and per table the ids whose rows start afresh (expiry reset them:
    :func:`ctrkit.data.storage.lineage.reset_rows`)."""

    ckpt: Checkpoint
    reset: dict[str, np.ndarray] = field(default_factory=dict)
    sharded: bool = False  # a sharded checkpoint's directory (torchrec tables on several processes), read whole


def what(cfg: Config) -> str:
    return f"--warm-start {cfg.train.warm_start}"


def read_warm_start(cfg: Config, resume: str | None, store: Store) -> WarmStart | None:
    """The checkpoint of ``train.warm_start``, checked against the run (module docstring); None without one."""
    path = cfg.train.warm_start
    if not path:
        return None
    if resume:
        raise JobError(f"--resume {resume} and --warm-start {path} (train.warm_start) both say where the run starts: "
                       "--resume continues a run on its own vocabulary, --warm-start begins a new run on a grown one; "
                       "keep one")
    ckpt = Checkpoint.load(path)
    sharded = (Path(path) / SHARDED_META).is_file()
    if sharded:  # read whole as the fused backend; its dense and replicated tables' optimizer states are here
        ckpt.optimizer = Checkpoint.load(Path(path) / SHARDED_META).optimizer
    check_warm_start(ckpt, cfg.model.name, store.schema, what(cfg))
    growth = check_grown(checkpoint_vocabularies(ckpt, path), Vocabularies.of_store(store), what(cfg))
    reset = {g.name: g.reset for g in growth if len(g.reset)}
    if reset:
        log.info("%s: rows reset by expiry (their values were evicted or their ids reused): %s", what(cfg),
                 {t: len(r) for t, r in reset.items()})
    return WarmStart(ckpt, reset, sharded)


def warm_weights(model: CTRModel, warm: WarmStart, cfg: Config) -> None:
    """``model`` (just built, on the CPU) <- the checkpoint's weights, its tables grown, the reset rows fresh; then
    shrunk and perturbed where ``train.warm_start_shrink`` / ``warm_start_perturb`` say so."""
    lam, sigma = cfg.train.warm_start_shrink, cfg.train.warm_start_perturb
    fresh = {n: p.detach().clone() for n, p in model.named_parameters()} if sigma else {}
    grown = load_grown_weights(model, warm.ckpt, dict(cfg.model.params), what(cfg), warm.reset)
    if lam != 1 or sigma:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.mul_(lam)
                if sigma:
                    p.add_(fresh[n], alpha=sigma)
        log.info("%s: weights shrunk by %g and perturbed by %g x their fresh initial values (train.warm_start_shrink, "
                 "warm_start_perturb)", what(cfg), lam, sigma)
    if cfg.train.warm_start_new_rows == "rare":
        log.info("%s: %d new rows start from their table's rare row (train.warm_start_new_rows: rare)", what(cfg),
                 new_rows_from_rare(model, grown, warm.reset))


def warm_trainer(trainer: Any, warm: WarmStart, cfg: Config) -> list[str]:
    """The Trainer's optimizer states from the checkpoint: :func:`warm_optimizer`, or, from a sharded checkpoint into
    a sharded run, :func:`~ctrkit.training.sharded_warm.load_grown_sharded` (the fused optimizers' states of the
    sharded tables too, any world size and plan); none with ``train.warm_start_optimizer: fresh``. Between a sharded
    and an unsharded run the table states start fresh, with a warning. First, with ``train.warm_start_average: keep``,
    the checkpoint's weight average (:func:`warm_average`). Returns the parts loaded ("average", "dense", ...)."""
    sm = sharded_of(trainer.module)
    loaded = warm_average(trainer, warm, cfg, sm is not None)
    if cfg.train.warm_start_optimizer == "fresh":
        log.info("%s: the optimizers start with fresh states (train.warm_start_optimizer: fresh)", what(cfg))
        return loaded
    same = same_optimizers(warm, cfg)
    if sm is not None and warm.sharded:
        return loaded + load_grown_sharded(trainer.module, sm.replicated, trainer.optimizer, warm.ckpt,
                                           cfg.train.warm_start, same, warm.reset, what(cfg))
    if (sm is not None) != warm.sharded:
        log.warning("%s: the tables' optimizer states start fresh: the checkpoint's tables were %s, this run's are %s "
                    "(their weights are the checkpoint's)", what(cfg), _kind(warm.sharded), _kind(sm is not None))
        same["sparse"] = False
    return loaded + warm_optimizer(trainer.optimizer, None if sm is not None else trainer.model, warm, cfg, same)


def warm_average(trainer: Any, warm: WarmStart, cfg: Config, sharded: bool) -> list[str]:
    """``train.warm_start_average: keep``: the checkpoint's weight average continued in the Trainer's
    (:func:`~ctrkit.training.warm_start.load_grown_average`) -> ["average"]; ``start``: a new average whose past is
    the warm-start weights (:meth:`~ctrkit.training.averaging.WeightAverage.start_at_weights`) -> ["average"]; []
    with ``fresh``."""
    mode = cfg.train.warm_start_average
    if mode == "fresh":
        return []
    if getattr(trainer, "average", None) is None:
        does, hint = ((f"continues the weight average of {what(cfg)}", " (the checkpoint's value)") if mode == "keep"
                      else (f"starts a weight average at the weights of {what(cfg)}", ""))
        raise ConfigError(f"train.warm_start_average={mode} {does}, and this run trains without one: set "
                          f"train.ema_decay{hint} or train.warm_start_average=fresh")
    if mode == "start":
        trainer.average.start_at_weights()  # the model holds the warm-start weights (grown, shrunk if asked)
        log.info("%s: the weight average starts at the warm-start weights (train.warm_start_average: start)", what(cfg))
        return ["average"]
    if cfg.train.warm_start_shrink != 1 or cfg.train.warm_start_perturb:
        raise ConfigError("train.warm_start_average=keep goes on from the checkpoint's trained weights, and "
                          f"train.warm_start_shrink={cfg.train.warm_start_shrink} / warm_start_perturb="
                          f"{cfg.train.warm_start_perturb} change them: keep one (warm_start_average=fresh, or "
                          "shrink 1 and perturb 0)")
    if sharded:
        raise ConfigError("train.warm_start_average=keep is not supported with sharded (torchrec, several processes) "
                          "tables; set train.warm_start_average=fresh")
    n = load_grown_average(trainer.average, trainer.model, warm.ckpt, warm.reset, what(cfg))
    log.info("%s: the weight average goes on from the checkpoint's (%d updates; train.warm_start_average: keep)",
             what(cfg), n)
    return ["average"]


def _kind(sharded: bool) -> str:
    return "sharded (torchrec, several processes)" if sharded else "in one process"


def same_optimizers(warm: WarmStart, cfg: Config) -> dict[str, bool]:
    """Part ("dense", "sparse", "wide") -> whether this run trains it with the optimizer the checkpoint's run did
    (for the tables, also with the same embedding backend)."""
    ckpt = warm.ckpt
    old = ((ckpt.config or {}).get("train") or {}) if isinstance(ckpt.config, dict) else {}
    then = "torchrec" if warm.sharded else ckpt.model_params.get("embedding_backend", "fused")
    same_backend = then == cfg.model.params.get("embedding_backend", "fused")
    return {"dense": old.get("dense_optimizer") == cfg.train.dense_optimizer,
            "sparse": same_backend and old.get("sparse_optimizer") == cfg.train.sparse_optimizer,
            "wide": old.get("wide_optimizer") == cfg.train.wide_optimizer}


def warm_optimizer(optimizer: Any, model: CTRModel | None, warm: WarmStart, cfg: Config,
                   same: dict[str, bool] | None = None) -> list[str]:
    """The Trainer's optimizer set <- the checkpoint's states, grown; each part ("dense", "sparse", "wide") only when
    ``same`` (default :func:`same_optimizers`) says this run uses the optimizer the checkpoint's did. Returns the
    parts loaded."""
    same = same if same is not None else same_optimizers(warm, cfg)
    layout = table_layout(model, warm.ckpt.weights, warm.reset) if model is not None else {}  # None: one-table weights
    return load_grown_optimizer(optimizer, warm.ckpt, layout, same, what(cfg))
