"""Scores and metrics of every row of a store, as the train, evaluate and predict jobs report them."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from ctrkit.batch import Batch
from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store
from ctrkit.models.scoring import iter_scores, score_batches
from ctrkit.training.tasks import CTRTask

EVALUATE_METRICS = ("auc", "logloss", "accuracy", "calibration")


def eval_loader(store: Store, batch_size: int, pipeline: FeaturePipeline | None) -> BatchLoader:
    """The rows of ``store`` in order, through the batch-level stage of ``pipeline``."""
    return BatchLoader(store, batch_size, shuffle=False, prefetch=2, pipeline=pipeline)


def predict_store(model: torch.nn.Module, store: Store, batch_size: int = 8192,
                  pipeline: FeaturePipeline | None = None) -> np.ndarray:
    """Click probabilities for every row of ``store``, in order; ``pipeline``: the one the model was trained
    with (its batch-level stage is applied)."""
    return score_batches(model, eval_loader(store, batch_size, pipeline))


def evaluate_store(model: torch.nn.Module, store: Store, pipeline: FeaturePipeline | None,
                   batch_size: int = 8192) -> dict[str, float]:
    """AUC, LogLoss, accuracy and calibration of ``model`` on ``store`` through ``pipeline``, by the same
    :class:`~ctrkit.training.tasks.CTRTask` evaluation that training reports (GAUC too when the store has groups)."""
    metrics = [*EVALUATE_METRICS, *(["gauc"] if store.schema.group_id else [])]
    return CTRTask(metrics).evaluate(model, eval_loader(store, batch_size, pipeline))


def score_rows(model: torch.nn.Module, batches: Iterable[Batch]) -> dict[str, np.ndarray]:
    """{label, score[, group]} of every row of ``batches`` (on the model's device): click probabilities."""
    labels, scores, groups = [], [], []
    for batch, p in iter_scores(model, batches):
        scores.append(p)
        labels.append(batch.labels.cpu().numpy())
        if batch.group_ids is not None:
            groups.append(batch.group_ids.cpu().numpy())
    out = {"label": np.concatenate(labels).astype(np.float32), "score": np.concatenate(scores).astype(np.float32)}
    if groups:
        out["group"] = np.concatenate(groups).astype(np.int64)
    return out
