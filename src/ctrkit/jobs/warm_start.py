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

from ctrkit.checkpoint import SHARDED_META, Checkpoint
from ctrkit.data.storage.agree import Vocabularies
from ctrkit.data.storage.lineage import check_grown
from ctrkit.data.storage.store import Store
from ctrkit.errors import JobError
from ctrkit.jobs.common import checkpoint_vocabularies
from ctrkit.models.base import CTRModel
from ctrkit.training.config import Config
from ctrkit.training.sharding import sharded_of
from ctrkit.training.warm_start import (
    check_warm_start,
    load_grown_optimizer,
    load_grown_weights,
    table_layout,
)

log = logging.getLogger(__name__)


@dataclass
class WarmStart:
    """A checked warm start: the checkpoint, and per table the ids whose rows start afresh (expiry reset them:
    :func:`ctrkit.data.storage.lineage.reset_rows`)."""

    ckpt: Checkpoint
    reset: dict[str, np.ndarray] = field(default_factory=dict)


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
    if (Path(path) / SHARDED_META).is_file():  # read whole as the fused backend; its dense optimizer state is here
        ckpt.optimizer = Checkpoint.load(Path(path) / SHARDED_META).optimizer
    check_warm_start(ckpt, cfg.model.name, store.schema, what(cfg))
    growth = check_grown(checkpoint_vocabularies(ckpt, path), Vocabularies.of_store(store), what(cfg))
    reset = {g.name: g.reset for g in growth if len(g.reset)}
    if reset:
        log.info("%s: rows reset by expiry (their values were evicted or their ids reused): %s", what(cfg),
                 {t: len(r) for t, r in reset.items()})
    return WarmStart(ckpt, reset)


def warm_weights(model: CTRModel, warm: WarmStart, cfg: Config) -> None:
    """``model`` (just built, on the CPU) <- the checkpoint's weights, its tables grown, the reset rows fresh."""
    load_grown_weights(model, warm.ckpt, dict(cfg.model.params), what(cfg), warm.reset)


def warm_trainer(trainer: Any, warm: WarmStart, cfg: Config) -> list[str]:
    """The Trainer's optimizer states from the checkpoint (:func:`warm_optimizer`); the fused optimizers of sharded
    tables (torchrec, several processes) start fresh, with a warning."""
    sharded = sharded_of(trainer.module) is not None
    if sharded:
        log.warning("%s: the sharded tables' fused optimizer states start fresh (their weights are the checkpoint's; "
                    "keeping the fused states through a warm start is not implemented yet)", what(cfg))
    return warm_optimizer(trainer.optimizer, None if sharded else trainer.model, warm, cfg)


def warm_optimizer(optimizer: Any, model: CTRModel | None, warm: WarmStart, cfg: Config) -> list[str]:
    """The Trainer's optimizer set <- the checkpoint's states, grown; each part ("dense", "sparse", "wide") only when
    this run uses the optimizer the checkpoint's did (and, for the tables, the same embedding backend). Returns the
    parts loaded."""
    ckpt = warm.ckpt
    old = ((ckpt.config or {}).get("train") or {}) if isinstance(ckpt.config, dict) else {}
    params = cfg.model.params
    same_backend = (ckpt.model_params.get("embedding_backend", "fused") == params.get("embedding_backend", "fused"))
    same = {"dense": old.get("dense_optimizer") == cfg.train.dense_optimizer,
            "sparse": same_backend and old.get("sparse_optimizer") == cfg.train.sparse_optimizer,
            "wide": old.get("wide_optimizer") == cfg.train.wide_optimizer}
    layout = table_layout(model, ckpt.weights, warm.reset) if model is not None else {}  # None: one-table weights
    return load_grown_optimizer(optimizer, ckpt, layout, same, what(cfg))
