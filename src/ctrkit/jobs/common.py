"""What every job does the same way: seed, pick the device, read stores through the training pipeline, read a
checkpoint's config, check that a store agrees with a checkpoint (features and vocabularies)."""

from __future__ import annotations

import copy
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrkit.checkpoint import Checkpoint, scoring_batch_size
from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.storage.agree import Vocabularies
from ctrkit.data.storage.days import DayStreamLoader, is_day_spec, resolve_day_stores
from ctrkit.data.storage.fitted import pipeline_from_store
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store
from ctrkit.errors import ConfigError, JobError
from ctrkit.io import missing_path
from ctrkit.schema import Schema
from ctrkit.training.config import Config, config_from_dict

SCORING_BATCH_HELP = "rows per scoring batch (default: as the run evaluated: data.eval_batch_size, else 4 x " \
                     "data.batch_size of the checkpoint's config)"


# ---- seed and device ------------------------------------------------------------------------------------
def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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


# ---- stores ------------------------------------------------------------------------------------------------
def training_pipeline(store: Store, cfg: Config) -> FeaturePipeline:
    """The pipeline a model trained on ``store`` with ``cfg`` sees: the store's, plus the multi-hot stage
    of ``data.multi_hot_*`` (the one place these options are read; checkpoints carry the result)."""
    pipeline = pipeline_from_store(store)
    d = cfg.data
    if d.multi_hot_size:
        pipeline = pipeline.with_multi_hot(d.multi_hot_size, d.multi_hot_min_table_size, d.multi_hot_distribution)
    return pipeline


def default_run_name(cfg: Config, stamp: str | None = None) -> str:
    """The name of a run whose config sets no ``run.name``: the model and ``stamp`` (default: the time now)."""
    return f"{cfg.model.name}-{stamp or time.strftime('%Y%m%d-%H%M%S')}"


def config_loader(path: str | list[str] | None, cfg: Config, *, train: bool, what: str,
                  pipeline: FeaturePipeline | None = None, rank: int = 0,
                  world_size: int = 1) -> BatchLoader | DayStreamLoader | None:
    """Loader of the store at ``path`` (``data.<what>``), with the batch-level stage of ``pipeline`` (default: the
    store's pipeline as :func:`training_pipeline` sets it up; valid / test loaders get the training one).
    ``rank`` / ``world_size``: this process's share of a multi-process run; a training loader's batch is then
    ``data.batch_size`` split over the ranks (``train.distributed.batch: global``) or ``data.batch_size`` each
    (``per_rank``), an evaluation loader deals whole batches round robin. A training ``path`` naming day stores (a
    list, or a glob pattern) gives a :class:`DayStreamLoader` over them, the pipeline that of the first day (every
    day has its vocabularies: checked)."""
    if not path:
        return None
    d = cfg.data
    if is_day_spec(path):
        if not train:
            raise ConfigError(f"data.{what}={path!r}: day stores (a list or a pattern) are for data.train; "
                              f"data.{what} takes one store (e.g. the valid / test halves of the last day)")
        days = resolve_day_stores(path, f"data.{what}")
        pipeline = pipeline if pipeline is not None else training_pipeline(Store(days[0]), cfg)
        return DayStreamLoader(days, rank_batch_size(cfg, world_size), shuffle=d.shuffle, seed=cfg.train.seed,
                               drop_last=d.drop_last, prefetch=d.prefetch, pipeline=pipeline, rank=rank,
                               world_size=world_size, what=f"data.{what}")
    if not Path(path).exists():
        raise JobError(missing_path(path, f"data.{what}: store", f"Create it with `ctrkit preprocess ... --out DIR` "
                                    f"and set data.{what}=DIR/{what}"))
    store = Store(path)
    pipeline = pipeline if pipeline is not None else training_pipeline(store, cfg)
    if train:
        return BatchLoader(store, rank_batch_size(cfg, world_size), shuffle=d.shuffle, seed=cfg.train.seed,
                           drop_last=d.drop_last, prefetch=d.prefetch, pipeline=pipeline, rank=rank,
                           world_size=world_size)
    return BatchLoader(store, scoring_batch_size(d.batch_size, d.eval_batch_size), shuffle=False,
                       prefetch=d.prefetch, pipeline=pipeline, rank=rank, world_size=world_size, even_tail=False)


def rank_batch_size(cfg: Config, world_size: int) -> int:
    """The training batch of one of ``world_size`` processes (module docstring of :func:`config_loader`)."""
    b = cfg.data.batch_size
    if world_size == 1 or cfg.train.distributed.batch == "per_rank":
        return b
    if b % world_size:
        raise ConfigError(f"data.batch_size={b} is the global batch (train.distributed.batch=global) and does not "
                          f"split evenly over {world_size} processes: use a multiple of {world_size}, or "
                          "train.distributed.batch=per_rank to make it each process's batch")
    return b // world_size


def train_store_paths(spec: str | list[str] | None) -> list[str]:
    """The store paths ``data.train`` names (day stores resolved when they still exist; [] when unset)."""
    if not spec:
        return []
    if not is_day_spec(spec):
        return [str(spec)]
    try:
        return [str(p) for p in resolve_day_stores(spec)]
    except ConfigError:  # gone since training: the names as written
        return [spec] if isinstance(spec, str) else [str(p) for p in spec]


# ---- checkpoints -------------------------------------------------------------------------------------------
def checkpoint_config(ckpt: Checkpoint) -> Config | None:
    """The run config of ``ckpt`` as a :class:`Config`; None when it has none or this version cannot read it."""
    if ckpt.config is None:
        return None
    try:
        return config_from_dict(copy.deepcopy(ckpt.config))
    except ConfigError:
        return None


def checkpoint_vocabularies(ckpt: Checkpoint, path: str | Path) -> Vocabularies:
    """The vocabularies a checkpoint's model was trained with (to check a store against them)."""
    return Vocabularies.of_checkpoint({"arrays": ckpt.vocab_files, "path": ckpt.vocab_path}, ckpt.schema,
                                      f"checkpoint {path}", next(iter(train_store_paths(ckpt.data_config.get("train"))),
                                                                 None), pipeline=ckpt.pipeline)


def check_same_features(model_schema: Schema, store_schema: Schema, what: str, whose: str) -> None:
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
                       "Use a store preprocessed from the same kind of data with the training store's "
                       "vocabularies (`ctrkit preprocess ... --vocab-from TRAIN_STORE`)")


def _names(names: list[str], show: int = 8) -> str:
    more = f" and {len(names) - show} more" if len(names) > show else ""
    return ", ".join(names[:show]) + more


def fmt_metrics(metrics: dict[str, Any]) -> str:
    """``auc=0.74000  logloss=0.45000`` (the CLI's one-line metrics)."""
    return "  ".join(f"{k}={v:.5f}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
