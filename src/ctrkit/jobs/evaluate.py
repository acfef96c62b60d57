"""``ctrkit evaluate``: the metrics of a checkpoint's model on a store (its test store by default).

The store must hold the features the model was trained on, with the same ids (vocabularies); the task kind of the
model's class picks the metrics (:mod:`ctrkit.jobs.tasks`): AUC / LogLoss / accuracy / calibration for a ranking
model, full-ranking HR@K / NDCG@K / MRR over the checkpoint's catalogue for a retrieval model.
"""

from __future__ import annotations

import argparse
import sys

from ctrkit.checkpoint import Checkpoint
from ctrkit.data.storage.agree import check_same_vocabulary
from ctrkit.data.storage.store import Store
from ctrkit.errors import JobError
from ctrkit.jobs.common import check_same_features, checkpoint_config, checkpoint_vocabularies, fmt_metrics
from ctrkit.jobs.scoring import evaluate_store
from ctrkit.jobs.tasks import task_kind

__all__ = ["evaluate_checkpoint", "evaluate_store", "run_evaluate"]


def evaluate_checkpoint(checkpoint: str, data: str | None = None,
                        batch_size: int | None = None) -> tuple[str, dict]:
    """(the store evaluated, its metrics) of the model of ``checkpoint`` on ``data`` (default: the checkpoint
    config's test store), ``batch_size`` rows at a time (default: as the run evaluated,
    :attr:`Checkpoint.scoring_batch_size`)."""
    ckpt = Checkpoint.load(checkpoint)
    model, cfg = ckpt.build_model(), checkpoint_config(ckpt)
    path = data or (cfg.data.test if cfg is not None else None)
    if not path:
        raise JobError("no store to evaluate: pass --data (the checkpoint's config names no test store)")
    store = Store(path)
    assert ckpt.schema is not None  # build_model refuses a checkpoint without one
    check_same_features(ckpt.schema, store.schema, f"{'--data' if data else 'data.test'} {path}",
                        f"checkpoint {checkpoint}")
    check_same_vocabulary(checkpoint_vocabularies(ckpt, checkpoint), store,
                          "--data" if data else "the checkpoint's data.test")
    rows = ckpt.scoring_batch_size if batch_size is None else batch_size
    metrics = task_kind(model).evaluate(model, ckpt, cfg, store, ckpt.feature_pipeline(), rows)
    return path, metrics


def run_evaluate(args: argparse.Namespace) -> int:
    """``ctrkit evaluate``: one line, the store and its metrics."""
    path, metrics = evaluate_checkpoint(args.checkpoint, args.data, args.batch_size)
    sys.stdout.write(f"{path}: {fmt_metrics(metrics)}\n")
    return 0
