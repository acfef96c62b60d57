"""Which task a job trains and evaluates a model with: chosen from the model class's ``task_kind``, here only.

==============  ==================================================  ===========================================
``task_kind``   training task                                       ``ctrkit evaluate``
==============  ==================================================  ===========================================
``"ranking"``   :class:`~ctrkit.training.tasks.CTRTask` of the config  AUC / LogLoss / accuracy / calibration
``"retrieval"`` :class:`~ctrkit.training.tasks.RetrievalTask` over     full ranking over the checkpoint's catalogue
                the training store's item catalogue                 (HR@K, NDCG@K, MRR)
==============  ==================================================  ===========================================

A new kind of model adds one :class:`TaskKind` to :data:`TASK_KINDS`; the jobs ask it, never the kind's name.
The name is the one users see: the run summary's ``"task"`` and export.json's ``"task_kind"``. ``"ctr"``, the
ranking kind's former name (export.json files written with 0.1.0 hold it), is read as ``"ranking"``.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, ClassVar

import torch

from ctrkit.checkpoint import Checkpoint
from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.storage.store import Store
from ctrkit.errors import JobError
from ctrkit.jobs.scoring import eval_loader, evaluate_store
from ctrkit.training.config import Config
from ctrkit.training.tasks import Task, ranking_task

log = logging.getLogger(__name__)

RETRIEVAL_METRICS = ["hr@10", "hr@50", "ndcg@10", "mrr"]
RANKING_DEFAULTS = (["auc", "logloss"], "auc")  # TrainConfig's metrics / early-stopping metric defaults


class TaskKind:
    """What the jobs do differently for one ``task_kind``: the config, the training task, the evaluation."""

    name: ClassVar[str]  # the run summary's "task"
    scores_rows: ClassVar[bool]  # the train job writes predictions.npz (click probabilities) of the test rows

    def configure(self, cfg: Config) -> Config:
        """``cfg`` with this kind's defaults (e.g. its metrics)."""
        return cfg

    def training_task(self, cfg: Config, store: Store) -> tuple[Task, dict[str, Any]]:
        """(the task to train with, extras every checkpoint of the run stores) for training on ``store``."""
        raise NotImplementedError

    def evaluate(self, model: torch.nn.Module, ckpt: Checkpoint, cfg: Config | None, store: Store,
                 pipeline: FeaturePipeline, batch_size: int) -> dict[str, float]:
        """The metrics ``ctrkit evaluate`` prints for the model of ``ckpt`` on ``store``."""
        raise NotImplementedError


class RankingKind(TaskKind):
    name, scores_rows = "ranking", True

    def training_task(self, cfg: Config, store: Store) -> tuple[Task, dict[str, Any]]:
        return ranking_task(cfg.train), {}

    def evaluate(self, model: torch.nn.Module, ckpt: Checkpoint, cfg: Config | None, store: Store,
                 pipeline: FeaturePipeline, batch_size: int) -> dict[str, float]:
        return evaluate_store(model, store, pipeline, batch_size)


class RetrievalKind(TaskKind):
    """Ranked against every item of the training store's catalogue; the catalogue rides in the checkpoints."""

    name, scores_rows = "retrieval", False

    def configure(self, cfg: Config) -> Config:
        """``cfg`` with retrieval metrics where it kept the ranking defaults (metrics [auc, logloss], early stopping
        on auc): full-ranking HR@10 / HR@50 / NDCG@10 / MRR, early stopping (and best.pt) on NDCG@10."""
        t = cfg.train
        metrics = list(RETRIEVAL_METRICS) if t.metrics == RANKING_DEFAULTS[0] else list(t.metrics)
        es = t.early_stopping
        if es.metric == RANKING_DEFAULTS[1]:
            es = replace(es, metric="ndcg@10")
        if es.metric not in metrics:
            metrics.append(es.metric)
        return replace(cfg, train=replace(t, metrics=metrics, early_stopping=es))

    def training_task(self, cfg: Config, store: Store) -> tuple[Task, dict[str, Any]]:
        from ctrkit.retrieval.catalogue import ItemCatalogue, SeenItems, sequence_window

        catalogue = ItemCatalogue.from_store(store)
        window = sequence_window(store)
        per_position = window is not None
        task = self.task(cfg, catalogue, SeenItems.from_store(store), window=window)
        log.info("retrieval: %d items in the catalogue; loss %s%s; metrics %s", len(catalogue),
                 cfg.train.retrieval.loss, " at every position of the sequence rows" if per_position else "",
                 cfg.train.metrics)
        return task, {"catalogue": catalogue.to_payload()}

    def evaluate(self, model: torch.nn.Module, ckpt: Checkpoint, cfg: Config | None, store: Store,
                 pipeline: FeaturePipeline, batch_size: int) -> dict[str, float]:
        """Full-ranking metrics on ``store``: the checkpoint's catalogue, the training items of its training store
        excluded when that store is still on disk (else only each row's own history, with a warning)."""
        from ctrkit.retrieval.catalogue import ItemCatalogue, SeenItems

        if cfg is None:
            raise JobError("the checkpoint's config cannot be read; retrain with this ctrkit version")
        if ckpt.catalogue is None:
            raise JobError(f"{ckpt.source} holds no item catalogue; retrain with this ctrkit version")
        task = self.task(self.configure(cfg), ItemCatalogue.from_payload(ckpt.catalogue),
                         SeenItems.from_training_store(cfg.data.train))
        return task.bind(model).evaluate(model, eval_loader(store, batch_size, pipeline))

    @staticmethod
    def task(cfg: Config, catalogue: Any, seen: Any, *, window: tuple[int, int] | None = None) -> Task:
        """The :class:`~ctrkit.training.tasks.RetrievalTask` of ``cfg.train.retrieval`` over ``catalogue``, excluding
        the items ``seen`` (:class:`~ctrkit.retrieval.catalogue.SeenItems`; None: only the rows' own histories);
        ``window``: (max_len, stride) of a training store of sequence rows (per-position training; the loss on the
        targets each row owns, or on every position with ``train.retrieval.sequence_targets: all``)."""
        from ctrkit.training.tasks import RetrievalTask

        r = cfg.train.retrieval
        return RetrievalTask(catalogue, seen=seen, loss=r.loss, log_q=r.log_q, num_negatives=r.num_negatives,
                             sampling=r.sampling, alpha=r.alpha, metrics=cfg.train.metrics,
                             precision=cfg.train.precision, per_position=window is not None,
                             window=window if r.sequence_targets == "owned" else None)


TASK_KINDS: dict[str, TaskKind] = {kind.name: kind for kind in (RankingKind(), RetrievalKind())}
OLD_NAMES = {"ctr": "ranking"}  # former names of task kinds


def task_kind(model: torch.nn.Module) -> TaskKind:
    """The :class:`TaskKind` of ``model``'s class attribute ``task_kind`` (an old name read as the new one)."""
    kind = getattr(type(model), "task_kind", None)
    kind = OLD_NAMES.get(kind, kind)
    if kind not in TASK_KINDS:
        raise JobError(f"{type(model).__name__} declares task_kind={kind!r}; the jobs know {list(TASK_KINDS)}")
    return TASK_KINDS[kind]
